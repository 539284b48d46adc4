"""Every delivery, with what the member had installed before it and whether it is the message's first delivery.

Five invariants judge deliveries against each member's own journal order: total and source order (first
deliveries, in order), no-duplicate (how often), virtual synchrony (the view installed before each delivery) and
k-resilience (the views installed after it).  One table gives all of them: a running window over each member's
view and delivery records in journal order numbers its installs and carries the last installed view forward; a
second window, one message at a time, marks the first delivery and counts them.  It is materialized for the audit.
"""

from __future__ import annotations

from .tables import Tables

MEMBER = 'node, "group"'
"""A member is one process in one group: a process may belong to several groups, each with its own views."""

MESSAGE = "src, seq, qos"
"""A data message's identity."""


def deliveries(v: Tables) -> str:
    """``node, group, view, ts, src, seq, qos, holders, need, order_view, pos`` of every delivery, plus:

    ``epoch`` the view the member installed last before it (null before its first install), ``vidx`` how many
    views the member had installed by then, ``first`` whether it is the member's first delivery of the message,
    and ``n`` how many times the member delivered the message.
    """
    return v.table("deliveries", _deliveries, cache=True)


def _deliveries(v: Tables) -> str:
    return f"""
        WITH placed AS (
            SELECT {MEMBER}, event, view, ts, {MESSAGE}, holders, need, order_view, pos,
                last_value(CASE WHEN event = 'view' THEN view END IGNORE NULLS) OVER so_far AS epoch,
                CAST(sum(CASE WHEN event = 'view' THEN 1 ELSE 0 END) OVER so_far AS BIGINT) AS vidx
            FROM {v.base} WHERE event IN ('view', 'deliver')
            WINDOW so_far AS (PARTITION BY {MEMBER} ORDER BY pos ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        )
        SELECT {MEMBER}, view, ts, {MESSAGE}, holders, need, order_view, pos, epoch, vidx,
            row_number() OVER (PARTITION BY {MEMBER}, {MESSAGE} ORDER BY pos) = 1 AS first,
            count(1) OVER (PARTITION BY {MEMBER}, {MESSAGE}) AS n
        FROM placed WHERE event = 'deliver'"""
