"""Ordering invariants: one packet per (view, timestamp), total order without gaps, no duplicates, source order.

Each member's deliveries are taken in the order it wrote them (``schema.ORDER``), which is the order it handed them
to the application.  A message delivered more than once is judged by its first delivery everywhere but in
``no-duplicate``, so that one fault is reported by one invariant.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import data_id, is_ordered, is_reliable, is_source_ordered, qos_name
from .schema import ORDER
from .shared import shared

MEMBER = ("node", "group")
"""A member is one process in one group: a process may belong to several groups, each with its own views."""


def slots(records: DataFrame) -> DataFrame:
    """Every claim of what occupies a (group, view, ts) slot (cached per audit: see ``_slots``)."""
    return shared(records, "slots", _slots)


def _slots(records: DataFrame) -> DataFrame:
    """Every claim of what occupies a (group, view, ts) slot: ``node, group, view, ts, what, qos``.

    Claims come from deliveries that carry a timestamp, from ACKs sent or received (the ACK itself takes ``ts``, the
    data it orders ``ts+1``, ``ts+2``, ...) and from New Lists of views some process installed (at their ``ts``).
    """
    r = records.withColumn("qos", qos_name(F.col("qos")))
    delivered = r.where((F.col("event") == "deliver") & F.col("ts").isNotNull()).select(
        "node", "group", "view", "ts", data_id(F.col("src"), F.col("seq"), F.col("qos")).alias("what"), "qos"
    )
    packets = r.where(F.col("event").isin("send", "recv"))
    acks = packets.where(F.col("packet") == "ack")
    ack_itself = acks.select(
        "node", "group", "view", "ts", F.concat_ws("|", F.lit("ack"), "src").alias("what"), F.lit(None).alias("qos")
    )
    ordered = (
        acks.select("node", "group", "view", "ts", F.posexplode("orders").alias("i", "o"))
        .withColumn("oqos", qos_name(F.col("o")[2]))
        .select(
            "node", "group", "view", (F.col("ts") + F.col("i") + 1).alias("ts"),
            data_id(F.col("o")[0], F.col("o")[1], F.col("oqos")).alias("what"), F.col("oqos").alias("qos"),
        )
    )
    # A reformation's New List is a proposal until committed: an aborted one may be followed by a different New
    # List at the same timestamp.  Only New Lists whose view some process installed are ordering decisions.
    installed = r.where(F.col("event") == "view").select("group", F.col("view").alias("new_view")).distinct()
    new_lists = packets.where(F.col("packet") == "new_list").join(installed, ["group", "new_view"], "left_semi").select(
        "node", "group", "view", "ts", F.concat_ws("|", F.lit("new_list"), "new_view").alias("what"),
        F.lit(None).alias("qos"),
    )
    return delivered.unionByName(ack_itself).unionByName(ordered).unionByName(new_lists).where("ts IS NOT NULL")


def first_deliveries(records: DataFrame) -> DataFrame:
    """One row per message each member delivered: where it first delivered it, and how often (``n``)."""
    return shared(records, "first_deliveries", _first_deliveries)


def _first_deliveries(records: DataFrame) -> DataFrame:
    first = F.min(F.struct(*ORDER, "view", "ts", "holders"))
    return (
        records.where(F.col("event") == "deliver")
        .withColumn("qos", qos_name(F.col("qos")))
        .groupBy(*MEMBER, "src", "seq", "qos")
        .agg(first.alias("f"), F.count(F.lit(1)).alias("n"))
        .select(*MEMBER, "src", "seq", "qos", "n", "f.*")
    )


def short_ranges(delivered: DataFrame, known: DataFrame, scope: list[str], pos: str) -> DataFrame:
    """The (member, view[, source]) ranges ``[lo, hi]`` of ``delivered`` positions that skip a ``known`` position.

    ``delivered`` has the member, view and scope columns and ``pos``; ``known`` has the scope columns and ``pos``,
    distinct.  Whether a range skips anything is decided by counting, with equi-joins only:
    the known positions up to ``hi`` minus those below ``lo``, against the delivered positions that are known.
    Only the ranges that come up short are then expanded position by position (by the caller) to name what was
    skipped, so the costly range join runs on a handful of rows instead of every member's every view.
    """
    key = [c for c in delivered.columns if c != pos]
    w = Window.partitionBy(*scope).orderBy(pos).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # Known positions plus every range end, each with the count of known positions at or below it.
    ends = delivered.groupBy(*key).agg(F.min(pos).alias("lo"), F.max(pos).alias("hi"))
    marks = (
        known.select(*scope, pos, F.lit(1).alias("k"))
        .unionByName(ends.select(*scope, F.col("lo").alias(pos), F.lit(0).alias("k")))
        .unionByName(ends.select(*scope, F.col("hi").alias(pos), F.lit(0).alias("k")))
        .groupBy(*scope, pos).agg(F.max("k").alias("k"))
        .withColumn("upto", F.sum("k").over(w))
    )
    lo = marks.select(*scope, F.col(pos).alias("lo"), (F.col("upto") - F.col("k")).alias("below"))
    hi = marks.select(*scope, F.col(pos).alias("hi"), F.col("upto").alias("atmost"))
    seen = delivered.join(known, [*scope, pos], "left_semi").groupBy(*key).agg(F.count_distinct(pos).alias("m"))
    return (
        ends.join(lo, [*scope, "lo"]).join(hi, [*scope, "hi"])
        .join(seen, key, "left")
        .where(F.col("atmost") - F.col("below") > F.coalesce(F.col("m"), F.lit(0)))
        .select(*key, "lo", "hi")
    )


def one_order(records: DataFrame) -> Check:
    """``one-order``: every process agrees on what each (view, timestamp) holds."""
    per_slot = (
        slots(records)
        .groupBy("group", "view", "ts")
        .agg(
            F.count_distinct("what").alias("n"), F.min("what").alias("a"), F.max("what").alias("b"),
            F.min("node").alias("node"),
        )
    )
    bad = per_slot.where(F.col("n") > 1)
    parts = F.split(F.col("a"), r"\|")
    is_data = parts[0] == "data"
    return Check(
        "one-order",
        per_slot,
        example(
            bad, node=F.col("node"), view=F.col("view"), ts=F.col("ts"),
            src=F.when(is_data, parts[1]), seq=F.when(is_data, parts[2]),
            detail=F.concat(F.lit("slot holds "), F.col("a"), F.lit(" and "), F.col("b")),
        ),
    )


def total_order(records: DataFrame) -> Check:
    """``total-order``: each member delivers ordered traffic in timestamp order, skipping no ordered slot.

    Order: within one member and view, each ordered delivery has a larger timestamp than the one before.  Gaps:
    between a member's first and last ordered delivery in a view, every slot known (from any process's ACKs or
    deliveries) to hold an ordered message was delivered by that member.
    """
    firsts = first_deliveries(records).where(is_ordered(F.col("qos")))
    no_ts = firsts.where(F.col("ts").isNull())
    stamped = firsts.where(F.col("ts").isNotNull())
    w = Window.partitionBy(*MEMBER, "view").orderBy(*ORDER)
    backwards = stamped.withColumn("prev", F.lag("ts").over(w)).where(F.col("ts") < F.col("prev"))
    ordered_slots = (
        slots(records).where(is_ordered(F.col("qos"))).select("group", "view", "ts", "what").distinct()
    )
    ranges = short_ranges(
        stamped.select(*MEMBER, "view", "ts"), ordered_slots.select("group", "view", "ts"), ["group", "view"], "ts"
    )
    expected = ranges.join(ordered_slots, ["group", "view"]).where(F.col("ts").between(F.col("lo"), F.col("hi")))
    gaps = expected.join(stamped.select(*MEMBER, "view", "ts"), [*MEMBER, "view", "ts"], "left_anti")
    gap_parts = F.split(F.col("what"), r"\|")
    violations = (
        example(no_ts, F.col("node"), F.col("view"), None, F.col("src"), F.col("seq"),
                F.lit("ordered delivery without a timestamp"))
        .unionByName(
            example(backwards, F.col("node"), F.col("view"), F.col("ts"), F.col("src"), F.col("seq"),
                    F.concat(F.lit("delivered after ts "), F.col("prev").cast("string")))
        )
        .unionByName(
            example(gaps, F.col("node"), F.col("view"), F.col("ts"), gap_parts[1], gap_parts[2],
                    F.concat(F.lit("skipped between ts "), F.col("lo").cast("string"), F.lit(" and "),
                             F.col("hi").cast("string")))
        )
    )
    return Check("total-order", firsts, violations)


def no_duplicate(records: DataFrame) -> Check:
    """``no-duplicate``: no member delivers a reliable message twice."""
    firsts = first_deliveries(records).where(is_reliable(F.col("qos")))
    twice = firsts.where(F.col("n") > 1)
    return Check(
        "no-duplicate",
        firsts,
        example(twice, F.col("node"), F.col("view"), F.col("ts"), F.col("src"), F.col("seq"),
                F.concat(F.lit("delivered "), F.col("n").cast("string"), F.lit(" times"))),
    )


def source_order(records: DataFrame) -> Check:
    """``source-order``: per member, view and source, source-ordered (and above) messages go in sequence order.

    Order: each delivery's sequence number is larger than the previous one from that source.  Gaps: a message the
    source journaled sending with QoS >= source, numbered between two that the member delivered, was delivered too.
    """
    firsts = first_deliveries(records).where(is_source_ordered(F.col("qos")))
    w = Window.partitionBy(*MEMBER, "view", "src").orderBy(*ORDER)
    backwards = firsts.withColumn("prev", F.lag("seq").over(w)).where(F.col("seq") < F.col("prev"))
    sent = (
        records.where((F.col("event") == "send") & (F.col("packet") == "data") & (F.col("src") == F.col("node")))
        .where(is_source_ordered(qos_name(F.col("qos"))))
        .select("group", "src", "seq")
        .distinct()
    )
    ranges = short_ranges(firsts.select(*MEMBER, "view", "src", "seq"), sent, ["group", "src"], "seq")
    expected = ranges.join(sent, ["group", "src"]).where(F.col("seq").between(F.col("lo"), F.col("hi")))
    gaps = expected.join(firsts.select(*MEMBER, "view", "src", "seq"), [*MEMBER, "view", "src", "seq"], "left_anti")
    violations = example(
        backwards, F.col("node"), F.col("view"), F.col("ts"), F.col("src"), F.col("seq"),
        F.concat(F.lit("delivered after seq "), F.col("prev").cast("string")),
    ).unionByName(
        example(gaps, F.col("node"), F.col("view"), None, F.col("src"), F.col("seq"),
                F.concat(F.lit("skipped between seq "), F.col("lo").cast("string"), F.lit(" and "),
                         F.col("hi").cast("string")))
    )
    return Check("source-order", firsts, violations)
