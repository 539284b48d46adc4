"""Every delivery, with what the member had installed before it and whether it is the message's first delivery.

Five invariants judge deliveries against each member's own journal order: total and source order (first
deliveries, in order), no-duplicate (how often), virtual synchrony (the view installed before each delivery) and
k-resilience (the views installed after it).  One table gives all of them, built with one shuffle of the view and
delivery records by member: a running window over each member's records in journal order numbers its installs and
carries the last installed view forward; the deliveries are then shuffled by message, and a second window, one
message at a time, marks the first delivery and counts them.  That second shuffle costs less than it saves: left
partitioned by member, the table and every check reading it ran one task per member (three in a three-process
trace, or two when two members hashed to the same partition) however many cores there were.  It is cached for the
audit (``shared``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .schema import POS
from .shared import shared

MEMBER = ("node", "group")
"""A member is one process in one group: a process may belong to several groups, each with its own views."""

MESSAGE = ("src", "seq", "qos")
"""A data message's identity."""


def deliveries(records: DataFrame) -> DataFrame:
    """``node, group, view, ts, src, seq, qos, holders, need, order_view, pos`` of every delivery, plus:

    ``epoch`` the view the member installed last before it (null before its first install), ``vidx`` how many
    views the member had installed by then, ``first`` whether it is the member's first delivery of the message,
    and ``n`` how many times the member delivered the message.
    """
    return shared(records, "deliveries", _deliveries)


def _deliveries(records: DataFrame) -> DataFrame:
    installed = F.col("event") == "view"
    so_far = Window.partitionBy(*MEMBER).orderBy(POS).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # The hash leads the sort of each message's deliveries, so rows of different messages compare on one long.
    by_message = ["h", *MEMBER, *MESSAGE]
    return (
        records.where(F.col("event").isin("view", "deliver"))
        .select(
            *MEMBER, "event", "view", "ts", *MESSAGE, "holders", "need", "order_view", POS,
            F.last(F.when(installed, F.col("view")), ignorenulls=True).over(so_far).alias("epoch"),
            F.sum(F.when(installed, 1).otherwise(0)).over(so_far).alias("vidx"),
        )
        .where(F.col("event") == "deliver")
        .withColumn("h", F.xxhash64(*MEMBER, *MESSAGE))
        # Spread by message before the second window: partitioned by member, the table (and every check reading it)
        # ran on as many tasks as there are members, three in a three-process trace, on two cores.
        .repartition("h")
        .select(
            *MEMBER, "view", "ts", *MESSAGE, "holders", "need", "order_view", POS, "epoch", "vidx",
            (F.row_number().over(Window.partitionBy(*by_message).orderBy(POS)) == 1).alias("first"),
            F.count(F.lit(1)).over(Window.partitionBy(*by_message)).alias("n"),
        )
    )
