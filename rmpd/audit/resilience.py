"""``k-resilience``: K-resilient, majority and safe messages are delivered only once enough members hold them.

Two sound tests, both necessary for a correct delivery:

1. the delivery record's own ``holders`` is at least the required count (K clamped to the view's size, a strict
   majority, or every member; the record's own ``need`` when lower and members had already left), as the engine
   must have checked;
2. the trace itself shows that many holders of the slot in that view, or in the later view the writer was already
   ordering in (``order_view``; timestamps run on across New Lists): the delivering member, every process that
   accepted the token at or past the slot (a ``token`` record's ``ts`` is the last slot it holds) and every sender
   of an ACK or New List whose last ordered slot is at or past it, and every process that voted in or committed a
   reformation with a sync point at or past it.  Test 2 runs only for views with token or ACK
   records, so journals that do not log them are not condemned; it does not compare times across hosts, whose
   clocks differ, so it proves the holders existed, not that they existed before the delivery.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import is_resilient, required_holders
from .delivered import MEMBER, deliveries
from .schema import POS
from .shared import keep


def holdings(records: DataFrame) -> DataFrame:
    """``group, view, p, upto``: process ``p`` is shown to hold every slot up to ``upto`` in the view.

    Evidence is a token acceptance, an ACK or New List sent or received, a reformation vote ``p`` sent (its ``ts``
    is ``p``'s sync point), or a reformation committed at ``p`` (its ``ts`` is the sync point ``p`` reached; it
    counts for the old view and the new one).
    """
    token = records.where(F.col("event") == "token").select("group", "view", F.col("node").alias("p"),
                                                            F.col("ts").alias("upto"))
    acks = records.where(
        F.col("event").isin("send", "recv") & F.col("packet").isin("ack", "new_list")
    ).select("group", "view", F.col("src").alias("p"),
             (F.col("ts") + F.coalesce(F.size("orders"), F.lit(0))).alias("upto"))
    votes = records.where(
        (F.col("event") == "send") & (F.col("packet") == "recovery_vote")
    ).select("group", "view", F.col("src").alias("p"), F.col("ts").alias("upto"))
    commits = records.where((F.col("event") == "recovery") & (F.col("role") == "commit"))
    committed = commits.select("group", "view", F.col("node").alias("p"), F.col("ts").alias("upto")).unionByName(
        commits.select("group", F.col("new_view").alias("view"), F.col("node").alias("p"), F.col("ts").alias("upto"))
    )
    return (
        token.unionByName(acks).unionByName(votes).unionByName(committed)
        .where(F.col("p").isNotNull() & F.col("upto").isNotNull())
        .groupBy("group", "view", "p")
        .agg(F.max("upto").alias("upto"))
    )


def _need(qos: Column, group_size: Column, recorded: Column, ordering_later: Column) -> Column:
    """Holders required: the QoS rule over the delivery view, lowered to the writer's own ``need`` only when it was
    already ordering in a later view (members had left or been removed before the delivery; docs/protocol.md)."""
    rule = required_holders(qos, group_size)
    return F.when(ordering_later & recorded.isNotNull(), F.least(rule, recorded)).otherwise(rule)


LATER_VIEWS = 8
"""How many views the deliverer installed after a delivery still count as evidence for it.  A resilient packet is
delivered once the token has gone round its holders; lock and membership New Lists can install a view at each of
those token passes, so evidence can sit in the next few views."""

CONTEXT = (*MEMBER, "vidx", "view", "order_view")
"""What decides which views count as evidence for a delivery: its writer, how many views the writer had installed
before it, its view and the view the writer was ordering in.  Deliveries share a handful of contexts."""


def _installs(records: DataFrame) -> DataFrame:
    """``node, group, vidx, view``: the member's ``vidx``-th install (counting from 1) was ``view``."""
    w = Window.partitionBy(*MEMBER).orderBy(POS)
    return records.where(F.col("event") == "view").select(*MEMBER, F.row_number().over(w).alias("vidx"), "view")


def _evidence(records: DataFrame, d: DataFrame, h: DataFrame) -> DataFrame:
    """``CONTEXT, uptos``: for each context of ``d``, how far each other process is shown to hold (one entry each).

    The views that count are the delivery view, the view the writer was ordering in, and the next ``LATER_VIEWS``
    views the writer installed.  Only views on the writer's own line count: timestamps run on across its New Lists
    and reformations, so a process holding a later slot there holds this one, which is not true of another
    partition's views.  A process counts for a delivery at ``ts`` when the furthest it is shown to hold, over those
    views, is at or past ``ts``; working that out per context instead of per delivery keeps it small.
    """
    ctx = d.select(*CONTEXT).distinct()
    own = ctx.select(*CONTEXT, F.explode(F.array_distinct(F.array("view", "order_view"))).alias("ev"))
    later = (
        ctx.select(*CONTEXT, F.explode(F.sequence(F.col("vidx") + 1, F.col("vidx") + LATER_VIEWS)).alias("i"))
        .join(_installs(records).withColumnRenamed("vidx", "i").withColumnRenamed("view", "ev"), [*MEMBER, "i"])
        .select(*CONTEXT, "ev")
    )
    return (
        own.unionByName(later)
        .join(h.withColumnRenamed("view", "ev"), ["group", "ev"])
        .where(F.col("p") != F.col("node"))
        .groupBy(*CONTEXT, "p").agg(F.max("upto").alias("upto"))
        .groupBy(*CONTEXT).agg(F.collect_list("upto").alias("uptos"))
    )


def _same_context(prefix: str) -> Column:
    """Rows that agree on every ``CONTEXT`` column and its ``prefix``-ed copy, nulls included."""
    return reduce(lambda a, b: a & b, [F.col(c).eqNullSafe(F.col(prefix + c)) for c in CONTEXT])


def k_resilience(records: DataFrame) -> Check:
    """Check both tests on every resilient delivery."""
    sizes = (
        records.where((F.col("event") == "view") & F.col("members").isNotNull())
        .groupBy("group", "view")
        .agg(F.max(F.size("members")).alias("gsize"))
    )
    d = (
        deliveries(records)
        .where(is_resilient(F.col("qos")))
        .join(F.broadcast(sizes), ["group", "view"], "left")
        .withColumn("order_view", F.coalesce(F.col("order_view"), F.col("view")))
        .withColumn("need", _need(F.col("qos"), F.col("gsize"), F.col("need"), F.col("view") != F.col("order_view")))
        .select(*MEMBER, "view", "order_view", "vidx", "ts", "src", "seq", "qos", "holders", "need")
    )
    h = keep(records, "k-resilience: holdings", holdings(records))
    views_seen = h.select("group", "view").distinct().withColumn("has_evidence", F.lit(True))
    ev = _evidence(records, d, h).select(*[F.col(c).alias("ev_" + c) for c in CONTEXT], "uptos")
    held = F.filter(F.coalesce(F.col("uptos"), F.array().cast("array<long>")), lambda u: u >= F.col("ts"))
    evidence = (
        d.join(F.broadcast(ev), _same_context("ev_"), "left")
        .select(*d.columns, (F.size(held) + 1).alias("shown"))
        .join(F.broadcast(views_seen), ["group", "view"], "left")
    )
    low_claim = F.col("need").isNotNull() & (F.col("holders").isNull() | (F.col("holders") < F.col("need")))
    low_shown = (
        F.coalesce(F.col("has_evidence"), F.lit(False)) & F.col("need").isNotNull() & F.col("ts").isNotNull()
        & (F.col("shown") < F.col("need"))
    )
    bad = evidence.where(low_claim | low_shown)
    detail = F.concat(
        F.col("qos"), F.lit(" needs "), F.col("need").cast("string"), F.lit(" holders; record says "),
        F.coalesce(F.col("holders").cast("string"), F.lit("nothing")), F.lit(", trace shows "),
        F.when(F.col("has_evidence"), F.col("shown").cast("string")).otherwise(F.lit("no token records")),
    )
    return Check(
        "k-resilience",
        d,
        example(bad, F.col("node"), F.col("view"), F.col("ts"), F.col("src"), F.col("seq"), detail),
    )
