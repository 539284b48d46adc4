"""Membership invariants: virtual synchrony, atomicity within a partition, unique view IDs.

RMP gives virtual synchrony to packets of at least totally ordered QoS (paper section 3.2): unordered and
source-ordered packets are delivered on receipt, before the token site orders them, so they may fall on either side
of a view change at different members.  Both set invariants therefore judge totally ordered deliveries only.

Both set invariants compare members that installed the same view and then the same next view: those stayed
together through the change (one partition), so they must agree on what the view delivered.  Members that went to
different next views (a partition) or installed no next view (a crash, or the end of the trace) are not compared.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import is_ordered, member_list, qos_name
from .ordering import MEMBER
from .schema import ORDER

_MSG = ("src", "seq", "qos")


def view_changes(records: DataFrame) -> DataFrame:
    """``node, group, v1, v2``: the member installed view ``v1`` and then, as its next install, ``v2``."""
    w = Window.partitionBy(*MEMBER).orderBy(*ORDER)
    return (
        records.where(F.col("event") == "view")
        .select(*MEMBER, F.col("view").alias("v1"), F.lead("view").over(w).alias("v2"))
        .where(F.col("v2").isNotNull())
        .distinct()
    )


def _ordered_deliveries(records: DataFrame) -> DataFrame:
    return (
        records.where(F.col("event") == "deliver")
        .withColumn("qos", qos_name(F.col("qos")))
        .where(is_ordered(F.col("qos")))
    )


def _disagreements(changes: DataFrame, delivered: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Expected (member, change, message) rows and the missing ones.

    ``delivered`` has ``node, group, v1`` and the message columns.  Every message one member of a (v1, v2) change
    delivered in v1 is expected from every member of that change.
    """
    d = delivered.select(*MEMBER, "v1", *_MSG).distinct().join(changes, [*MEMBER, "v1"])
    messages = d.select("group", "v1", "v2", *_MSG).distinct()
    expected = changes.join(messages, ["group", "v1", "v2"])
    missing = expected.join(d, [*MEMBER, "v1", "v2", *_MSG], "left_anti")
    return expected, missing


def virtual_synchrony(records: DataFrame) -> Check:
    """``virtual-synchrony``: members installing v1 then v2 delivered the same ordered set between the two installs.

    "Between" is by position in each member's journal: a delivery belongs to the last view installed before it.
    """
    w = Window.partitionBy(*MEMBER).orderBy(*ORDER).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    epochs = (
        records.where(F.col("event").isin("view", "deliver"))
        .withColumn("v1", F.last(F.when(F.col("event") == "view", F.col("view")), ignorenulls=True).over(w))
        .where(F.col("event") == "deliver")
        .withColumn("qos", qos_name(F.col("qos")))
        .where(is_ordered(F.col("qos")) & F.col("v1").isNotNull())
    )
    expected, missing = _disagreements(view_changes(records), epochs)
    return Check(
        "virtual-synchrony",
        expected,
        example(missing, F.col("node"), F.col("v1"), None, F.col("src"), F.col("seq"),
                F.concat(F.lit("not delivered between views "), F.col("v1"), F.lit(" and "), F.col("v2"),
                         F.lit(" though other members that installed both did"))),
    )


def atomicity(records: DataFrame) -> Check:
    """``atomicity``: an ordered message delivered in view v1 by one member is delivered in v1 by its whole partition.

    "In v1" is by the view the delivery record names; the partition is the members that installed v1 and then the
    same next view.
    """
    tagged = _ordered_deliveries(records).withColumnRenamed("view", "v1")
    expected, missing = _disagreements(view_changes(records), tagged)
    return Check(
        "atomicity",
        expected,
        example(missing, F.col("node"), F.col("v1"), None, F.col("src"), F.col("seq"),
                F.concat(F.lit("not delivered in view "), F.col("v1"), F.lit(" though others moving to "),
                         F.col("v2"), F.lit(" did"))),
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
