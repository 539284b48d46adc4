"""``scmp-at-most-once``: no member accepts an SCMP (connection, message timestamp) twice, across restarts too.

A restarted process keeps its process ID, so its journals before and after the restart share ``node``; counting
acceptances per (node, group, conn, msg_ts) over all of them covers restarts.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .check import Check, example


def scmp_at_most_once(records: DataFrame) -> Check:
    """Count acceptances of each (conn, msg_ts) per member; more than one is a violation."""
    accepted = (
        records.where((F.col("event") == "scmp") & F.col("accepted"))
        .groupBy("node", "group", "conn", "msg_ts")
        .agg(F.count(F.lit(1)).alias("n"), F.min("view").alias("view"))
    )
    bad = accepted.where(F.col("n") > 1)
    return Check(
        "scmp-at-most-once",
        accepted,
        example(bad, F.col("node"), F.col("view"), F.col("msg_ts"), detail=F.concat(
            F.lit("connection "), F.col("conn"), F.lit(" message ts "), F.col("msg_ts").cast("string"),
            F.lit(" accepted "), F.col("n").cast("string"), F.lit(" times"))),
    )
