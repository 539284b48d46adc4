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

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .check import Check, example
from .columns import is_resilient, qos_name, required_holders
from .schema import ORDER


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


def _evidence_views(records: DataFrame, d: DataFrame) -> DataFrame:
    """``ORDER, group, node, ts, view``: the views whose holdings count for each delivery of ``d``.

    They are the delivery view, the view the writer was ordering in, and the next ``LATER_VIEWS`` views the writer
    installed.  Only views on the writer's own line count: timestamps run on across its New Lists and reformations,
    so a process holding a later slot there holds this one, which is not true of another partition's views.
    """
    per_node = Window.partitionBy("node", "group").orderBy(*ORDER).rowsBetween(Window.unboundedPreceding,
                                                                               Window.currentRow)
    numbered = records.where(F.col("event").isin("view", "deliver")).withColumn(
        "vidx", F.sum(F.when(F.col("event") == "view", 1).otherwise(0)).over(per_node)
    )
    installs = numbered.where(F.col("event") == "view").select("node", "group", "vidx", "view")
    at = numbered.where(F.col("event") == "deliver").select("node", "group", "vidx", *ORDER).join(
        d.select("node", "group", "ts", "view", "order_view", *ORDER), list(ORDER)
    ).drop(numbered["node"]).drop(numbered["group"])
    keys = ("node", "group", "ts", *ORDER)
    later = (
        at.select(*keys, F.explode(F.sequence(F.col("vidx") + 1, F.col("vidx") + LATER_VIEWS)).alias("vidx"))
        .join(installs, ["node", "group", "vidx"])
        .select(*keys, "view")
    )
    own = at.select(*keys, F.explode(F.array_distinct(F.array("view", "order_view"))).alias("view"))
    return own.unionByName(later)


def k_resilience(records: DataFrame) -> Check:
    """Check both tests on every resilient delivery."""
    sizes = (
        records.where((F.col("event") == "view") & F.col("members").isNotNull())
        .groupBy("group", "view")
        .agg(F.max(F.size("members")).alias("gsize"))
    )
    d = (
        records.where(F.col("event") == "deliver")
        .withColumn("qos", qos_name(F.col("qos")))
        .where(is_resilient(F.col("qos")))
        .join(sizes, ["group", "view"], "left")
        .withColumn("order_view", F.coalesce(F.col("order_view"), F.col("view")))
        .withColumn("need", _need(F.col("qos"), F.col("gsize"), F.col("need"), F.col("view") != F.col("order_view")))
        .select("node", "group", "view", "order_view", "ts", "src", "seq", "qos", "holders", "need", *ORDER)
    )
    h = holdings(records)
    views_seen = h.select("group", "view").distinct().withColumn("has_evidence", F.lit(True))
    shown = (
        _evidence_views(records, d).join(h, ["group", "view"])
        .where((F.col("upto") >= F.col("ts")) & (F.col("p") != F.col("node")))
        .groupBy(*ORDER)
        .agg((F.count_distinct("p") + 1).alias("shown"))
    )
    evidence = (
        d.join(shown, list(ORDER), "left")
        .withColumn("shown", F.coalesce(F.col("shown"), F.lit(1)))
        .join(views_seen, ["group", "view"], "left")
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
