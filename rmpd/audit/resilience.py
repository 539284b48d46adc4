"""``k-resilience``: K-resilient, majority and safe messages are delivered only once enough members hold them.

Two sound tests, both necessary for a correct delivery:

1. the delivery record's own ``holders`` is at least the required count (K clamped to the view's size, a strict
   majority, or every member), as the engine must have checked;
2. the trace itself shows that many holders of the slot in that view: the delivering member, every process that
   accepted the token at or past the slot (a ``token`` record's ``ts`` is the last slot it holds) and every sender
   of an ACK or New List whose last ordered slot is at or past it.  Test 2 runs only for views with token or ACK
   records, so journals that do not log them are not condemned; it does not compare times across hosts, whose
   clocks differ, so it proves the holders existed, not that they existed before the delivery.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .check import Check, example
from .columns import is_resilient, qos_name, required_holders
from .schema import ORDER


def holdings(records: DataFrame) -> DataFrame:
    """``group, view, p, upto``: process ``p`` is shown to hold every slot up to ``upto`` in the view."""
    token = records.where(F.col("event") == "token").select("group", "view", F.col("node").alias("p"),
                                                            F.col("ts").alias("upto"))
    acks = records.where(
        F.col("event").isin("send", "recv") & F.col("packet").isin("ack", "new_list")
    ).select("group", "view", F.col("src").alias("p"),
             (F.col("ts") + F.coalesce(F.size("orders"), F.lit(0))).alias("upto"))
    return (
        token.unionByName(acks)
        .where(F.col("p").isNotNull() & F.col("upto").isNotNull())
        .groupBy("group", "view", "p")
        .agg(F.max("upto").alias("upto"))
    )


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
        .withColumn("need", required_holders(F.col("qos"), F.col("gsize")))
        .select("node", "group", "view", "ts", "src", "seq", "qos", "holders", "need", *ORDER)
    )
    h = holdings(records)
    views_seen = h.select("group", "view").distinct().withColumn("has_evidence", F.lit(True))
    cond = (
        (F.col("d.group") == F.col("h.group")) & (F.col("d.view") == F.col("h.view"))
        & (F.col("h.upto") >= F.col("d.ts")) & (F.col("h.p") != F.col("d.node"))
    )
    keys = [F.col(f"d.{c}") for c in d.columns]
    evidence = (
        d.alias("d").join(h.alias("h"), cond, "left")
        .groupBy(*keys)
        .agg((F.count_distinct(F.col("h.p")) + 1).alias("shown"))
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
