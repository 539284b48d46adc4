"""Ordering invariants: one packet per (view, timestamp), total order without gaps, no duplicates, source order.

Each member's deliveries are taken in the order it wrote them (``schema.POS``), which is the order it handed them
to the application.  A message delivered more than once is judged by its first delivery everywhere but in
``no-duplicate``, so that one fault is reported by one invariant.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import data_id, is_ordered, is_reliable, is_source_ordered, qos_name
from .delivered import MEMBER, deliveries
from .schema import POS
from .shared import keep, shared

__all__ = ["MEMBER", "no_duplicate", "one_order", "source_order", "total_order"]


def claims(records: DataFrame) -> DataFrame:
    """Every claim of what data or ACK occupies a (group, view, ts) slot: ``node, group, view, ts, what, qos``.

    Claims come from deliveries that carry a timestamp, from ACKs sent or received (the ACK itself takes ``ts``,
    the data it orders ``ts+1``, ``ts+2``, ...) and from New Lists that name their own view (a change of the lock
    table, which installs no view and is placed by the token site like an ACK).  One token per view means one of
    these per slot, so the claims must agree across every process, whichever side of a later partition it ended
    on.  New Lists of new views are judged apart (``past_new_list``): a reformation's New List takes the slot after
    its sync point, which an ACK nobody in the new view delivered may have claimed before.
    """
    delivered = records.where((F.col("event") == "deliver") & F.col("ts").isNotNull()).select(
        "node", "group", "view", "ts", data_id(F.col("src"), F.col("seq"), F.col("qos")).alias("what"), "qos"
    )
    acks = records.where(F.col("event").isin("send", "recv") & (F.col("packet") == "ack"))
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
    same_view = records.where(
        F.col("event").isin("send", "recv") & (F.col("packet") == "new_list") & (F.col("new_view") == F.col("view"))
    ).select(
        "node", "group", "view", "ts", F.concat_ws("|", F.lit("new_list"), "new_view").alias("what"),
        F.lit(None).alias("qos"),
    )
    return (
        delivered.unionByName(ack_itself).unionByName(ordered).unionByName(same_view).where("ts IS NOT NULL")
    )


def installed_new_lists(records: DataFrame) -> DataFrame:
    """``node, group, view, ts, new_view``: each New List some process installed, once per process that did.

    ``view`` and ``ts`` are the slot of the old view the New List took (a ``view`` record carries the timestamp of
    the New List that installed it).  A New List nobody installed was a reformation's proposal that aborted, not an
    ordering decision, and a different New List may follow it at the same timestamp; a process that only received
    a New List (from the other side of a partition) did not take it.
    """
    new_lists = (
        records.where(
            F.col("event").isin("send", "recv") & (F.col("packet") == "new_list") & (F.col("view") != F.col("new_view"))
        )
        .select("group", "view", "ts", "new_view").distinct()
    )
    installs = records.where(F.col("event") == "view").select("node", "group", F.col("view").alias("new_view"), "ts")
    return new_lists.join(installs.distinct(), ["group", "new_view", "ts"])


def past_new_list(records: DataFrame) -> DataFrame:
    """Deliveries of a view at or past the slot of a New List their member then installed (example rows).

    A member installs a New List once it has delivered every slot before it and nothing after it (delivery takes
    a consecutive prefix, and committing a reformation drops every slot past its sync point), so everyone who
    installs one view agrees that its New List holds that slot.  Processes that went on to different views (the
    two sides of a partition, or a token site cut off right after its ACK) may each have filled the slot
    differently: the paper's total order promises one order to the processes that stay together, and the
    resilient QoS levels with a majority minimum partition promise more, which k-resilience checks.
    """
    new_lists = installed_new_lists(records).withColumnRenamed("ts", "nl_ts")
    delivered = records.where((F.col("event") == "deliver") & F.col("ts").isNotNull()).select(
        "node", "group", "view", "ts", "src", "seq"
    )
    return delivered.join(new_lists, ["node", "group", "view"]).where(F.col("ts") >= F.col("nl_ts"))


def slots(records: DataFrame) -> DataFrame:
    """One row per claimed (group, view, ts) slot (cached per audit): ``a`` and ``b`` the least and greatest claim,
    ``node`` the least claimant, ``ordered`` whether some claim is of a totally ordered message.

    The claims agree exactly when ``a == b``.  One aggregation serves both one-order and total order's gaps.
    """
    return shared(records, "slots", _slots)


def _slots(records: DataFrame) -> DataFrame:
    # The hash leads the grouping keys, so the sort under the aggregation compares rows on one long.
    return (
        claims(records)
        .groupBy(F.xxhash64("group", "view", "ts").alias("h"), "group", "view", "ts")
        .agg(F.min("what").alias("a"), F.max("what").alias("b"), F.min("node").alias("node"),
             F.max(is_ordered(F.col("qos"))).alias("ordered"))
        .drop("h")
    )


def short_ranges(
    records: DataFrame, name: str, delivered: DataFrame, known: DataFrame, scope: list[str], pos: str,
    all_known: bool = False,
) -> DataFrame:
    """The (member, view[, source]) ranges ``[lo, hi]`` of ``delivered`` positions that skip a ``known`` position.

    ``delivered`` has the member, view and scope columns and ``pos``; ``known`` has the scope columns and ``pos``,
    distinct.  Whether a range skips anything is decided by counting, with equi-joins only: the known positions up
    to ``hi`` minus those below ``lo``, against the delivered positions that are known.  ``all_known`` says every
    delivered position is known (where a delivery is itself a claim of its slot), which spares joining them.
    Only the ranges that come up short are then expanded position by position (by the caller) to name what was
    skipped, so the costly range join runs on a handful of rows instead of every member's every view.  The range
    ends and the marks are each read several times, so they are kept (``shared.keep``) under ``name``.
    """
    key = [c for c in delivered.columns if c != pos]
    w = Window.partitionBy(*scope).orderBy(pos).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    distinct = delivered.distinct()
    ends = distinct.groupBy(*key).agg(F.min(pos).alias("lo"), F.max(pos).alias("hi"), F.count(F.lit(1)).alias("m"))
    if not all_known:
        seen = distinct.join(known, [*scope, pos], "left_semi").groupBy(*key).agg(F.count(F.lit(1)).alias("m"))
        ends = ends.drop("m").join(seen, key, "left")
    ends = keep(records, f"{name}: range ends", ends)
    # Known positions plus every range end, each with the count of known positions at or below it.
    marks = (
        known.select(*scope, pos, F.lit(1).alias("k"))
        .unionByName(ends.select(*scope, F.col("lo").alias(pos), F.lit(0).alias("k")))
        .unionByName(ends.select(*scope, F.col("hi").alias(pos), F.lit(0).alias("k")))
        .groupBy(*scope, pos).agg(F.max("k").alias("k"))
        .withColumn("upto", F.sum("k").over(w))
    )
    marks = keep(records, f"{name}: marks", marks)
    lo = marks.select(*scope, F.col(pos).alias("lo"), (F.col("upto") - F.col("k")).alias("below"))
    hi = marks.select(*scope, F.col(pos).alias("hi"), F.col("upto").alias("atmost"))
    return (
        F.broadcast(ends).join(lo, [*scope, "lo"]).join(hi, [*scope, "hi"])
        .where(F.col("atmost") - F.col("below") > F.coalesce(F.col("m"), F.lit(0)))
        .select(*key, "lo", "hi")
    )


def skipped(ranges: DataFrame, known: DataFrame, delivered: DataFrame, scope: list[str], pos: str) -> DataFrame:
    """The ``known`` positions (not necessarily distinct) inside short ``ranges`` that the member did not deliver.

    Both joins run against the few short ranges only: the member's deliveries are first narrowed to the members
    and views that have one, so the full delivery table is never shuffled for them.
    """
    key = [c for c in ranges.columns if c not in ("lo", "hi")]
    # Joined before deduplicating: the few rows inside a short range are made distinct, not all of ``known``.
    expected = (
        F.broadcast(ranges).join(known, scope).where(F.col(pos).between(F.col("lo"), F.col("hi"))).distinct()
    )
    mine = delivered.join(F.broadcast(ranges.select(*key).distinct()), key, "left_semi")
    return expected.join(mine, [*key, pos], "left_anti")


def one_order(records: DataFrame) -> Check:
    """``one-order``: every process agrees on the data and ACK each (view, timestamp) holds, and no process
    installs a New List at a slot it delivered something else at (or past)."""
    per_slot = slots(records)
    bad = per_slot.where(F.col("a") != F.col("b"))
    parts = F.split(F.col("a"), r"\|")
    is_data = parts[0] == "data"
    overrun = past_new_list(records)
    return Check(
        "one-order",
        per_slot,
        example(
            bad, node=F.col("node"), view=F.col("view"), ts=F.col("ts"),
            src=F.when(is_data, parts[1]), seq=F.when(is_data, parts[2]),
            detail=F.concat(F.lit("slot holds "), F.col("a"), F.lit(" and "), F.col("b")),
        ).unionByName(
            example(
                overrun, node=F.col("node"), view=F.col("view"), ts=F.col("ts"), src=F.col("src"),
                seq=F.col("seq"),
                detail=F.concat(F.lit("delivered at or past ts "), F.col("nl_ts").cast("string"),
                                F.lit(", the New List of "), F.col("new_view"), F.lit(" it installed")),
            )
        ),
    )


def first_deliveries(records: DataFrame) -> DataFrame:
    """Each member's first delivery of each message (with ``n``, how often it delivered it)."""
    return deliveries(records).where(F.col("first"))


def total_order(records: DataFrame) -> Check:
    """``total-order``: each member delivers ordered traffic in timestamp order, skipping no ordered slot.

    Order: within one member and view, each ordered delivery has a larger timestamp than the one before.  Gaps:
    between a member's first and last ordered delivery in a view, every slot known (from any process's ACKs or
    deliveries) to hold an ordered message was delivered by that member.
    """
    firsts = first_deliveries(records).where(is_ordered(F.col("qos")))
    no_ts = firsts.where(F.col("ts").isNull())
    stamped = firsts.where(F.col("ts").isNotNull())
    w = Window.partitionBy(*MEMBER, "view").orderBy(POS)
    backwards = stamped.withColumn("prev", F.lag("ts").over(w)).where(F.col("ts") < F.col("prev"))
    known = slots(records).where(F.col("ordered")).select("group", "view", "ts")
    # Every ordered delivery with a timestamp is itself a claim of its slot, so its position is known.
    delivered = stamped.select(*MEMBER, "view", "ts")
    ranges = keep(records, "total-order: short ranges",
                  short_ranges(records, "total-order", delivered, known, ["group", "view"], "ts", all_known=True))
    ordered_claims = claims(records).where(is_ordered(F.col("qos"))).select("group", "view", "ts", "what")
    gaps = skipped(ranges, ordered_claims, delivered, ["group", "view"], "ts")
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
    w = Window.partitionBy(*MEMBER, "view", "src").orderBy(POS)
    backwards = firsts.withColumn("prev", F.lag("seq").over(w)).where(F.col("seq") < F.col("prev"))
    sent = (
        records.where((F.col("event") == "send") & (F.col("packet") == "data") & (F.col("src") == F.col("node")))
        .where(is_source_ordered(F.col("qos")))
        .select("group", "src", "seq")
        .distinct()
    )
    sent = keep(records, "source-order: sent", sent)
    delivered = firsts.select(*MEMBER, "view", "src", "seq")
    ranges = keep(records, "source-order: short ranges",
                  short_ranges(records, "source-order", delivered, sent, ["group", "src"], "seq"))
    gaps = skipped(ranges, sent, delivered, ["group", "src"], "seq")
    violations = example(
        backwards, F.col("node"), F.col("view"), F.col("ts"), F.col("src"), F.col("seq"),
        F.concat(F.lit("delivered after seq "), F.col("prev").cast("string")),
    ).unionByName(
        example(gaps, F.col("node"), F.col("view"), None, F.col("src"), F.col("seq"),
                F.concat(F.lit("skipped between seq "), F.col("lo").cast("string"), F.lit(" and "),
                         F.col("hi").cast("string")))
    )
    return Check("source-order", firsts, violations)
