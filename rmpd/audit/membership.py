"""Membership invariants: virtual synchrony, atomicity within a partition, unique view IDs.

RMP gives virtual synchrony to packets of at least totally ordered QoS (paper section 3.2): unordered and
source-ordered packets are delivered on receipt, before the token site orders them, so they may fall on either side
of a view change at different members.  Both set invariants therefore judge totally ordered deliveries only.

Both set invariants compare members that installed the same view and then the same next view: those stayed
together through the change (one partition), so they must agree on what the view delivered.  Members that went to
different next views (a partition) or installed no next view (a crash, or the end of the trace) are not compared.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import is_ordered, member_list
from .delivered import MEMBER, MESSAGE, deliveries
from .schema import POS
from .shared import shared


def view_changes(records: DataFrame) -> DataFrame:
    """``node, group, v1, v2``: the member installed view ``v1`` and then, as its next install, ``v2``."""
    w = Window.partitionBy(*MEMBER).orderBy(POS)
    return (
        records.where(F.col("event") == "view")
        .select(*MEMBER, F.col("view").alias("v1"), F.lead("view").over(w).alias("v2"))
        .where(F.col("v2").isNotNull())
        .distinct()
    )


def _disagreements(name: str, records: DataFrame, in_view: Column, detail: Column) -> Check:
    """Every ordered message one member of a (v1, v2) change delivered in v1 is expected from every member of it.

    ``in_view`` names, for each delivery, the view it counts for.  Expected (member, change, message) triples are
    counted, not built: each message delivered in a change counts once per member of the change, and is missing at
    as many as did not deliver it.  Only the messages some member missed are expanded into rows, and only when
    examples are wanted.
    """
    changes = shared(records, "view changes", view_changes)
    delivered = (
        deliveries(records).where(is_ordered(F.col("qos")) & in_view.isNotNull())
        .select(*MEMBER, in_view.alias("v1"), *MESSAGE).distinct()
    )
    mine = delivered.join(changes, [*MEMBER, "v1"])
    # A message with a null field matches no delivery, its own included, so every member misses it.
    unmatched = F.col("src").isNull() | F.col("seq").isNull() | F.col("qos").isNull()
    per_message = (
        mine.groupBy("group", "v1", "v2", *MESSAGE).agg(F.count(F.lit(1)).alias("k"))
        .withColumn("k", F.when(unmatched, F.lit(0)).otherwise(F.col("k")))
    )
    sizes = changes.groupBy("group", "v1", "v2").agg(F.count(F.lit(1)).alias("m"))
    counted = per_message.join(sizes, ["group", "v1", "v2"])
    short = counted.where(F.col("k") < F.col("m")).select("group", "v1", "v2", *MESSAGE)
    missing = changes.join(short, ["group", "v1", "v2"]).join(mine, [*MEMBER, "v1", "v2", *MESSAGE], "left_anti")
    return Check(
        name,
        changes.join(per_message, ["group", "v1", "v2"]),
        example(missing, F.col("node"), F.col("v1"), None, F.col("src"), F.col("seq"), detail),
        counted.select(F.col("m").alias("c"), (F.col("m") - F.col("k")).alias("x")),
    )


def virtual_synchrony(records: DataFrame) -> Check:
    """``virtual-synchrony``: members installing v1 then v2 delivered the same ordered set between the two installs.

    "Between" is by position in each member's journal: a delivery belongs to the last view installed before it.
    """
    return _disagreements(
        "virtual-synchrony", records, F.col("epoch"),
        F.concat(F.lit("not delivered between views "), F.col("v1"), F.lit(" and "), F.col("v2"),
                 F.lit(" though other members that installed both did")),
    )


def atomicity(records: DataFrame) -> Check:
    """``atomicity``: an ordered message delivered in view v1 by one member is delivered in v1 by its whole partition.

    "In v1" is by the view the delivery record names; the partition is the members that installed v1 and then the
    same next view.
    """
    return _disagreements(
        "atomicity", records, F.col("view"),
        F.concat(F.lit("not delivered in view "), F.col("v1"), F.lit(" though others moving to "), F.col("v2"),
                 F.lit(" did")),
    )


def unique_view_id(records: DataFrame) -> Check:
    """``unique-view-id``: a view ID names one ordered member list, in every record and every group."""
    installs = records.where((F.col("event") == "view") & F.col("members").isNotNull()).select(
        "node", "group", F.col("view").alias("vid"), member_list(F.col("members")).alias("ml")
    )
    announced = records.where(
        F.col("event").isin("send", "recv") & (F.col("packet") == "new_list") & F.col("members").isNotNull()
    ).select("node", "group", F.col("new_view").alias("vid"), member_list(F.col("members")).alias("ml"))
    per_view = (
        installs.unionByName(announced)
        .where(F.col("vid").isNotNull())
        .groupBy("vid")
        .agg(F.count_distinct("group", "ml").alias("n"), F.min(F.struct("group", "ml", "node")).alias("a"),
             F.max(F.struct("group", "ml")).alias("b"))
    )
    bad = per_view.where(F.col("n") > 1)
    return Check(
        "unique-view-id",
        per_view,
        example(bad, F.col("a.node"), F.col("vid"), group=F.col("a.group"), detail=F.concat(
            F.lit("names ["), F.col("a.ml"), F.lit("] in "), F.col("a.group"), F.lit(" and ["), F.col("b.ml"),
            F.lit("] in "), F.col("b.group"))),
    )
