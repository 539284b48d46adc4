"""Every delivery, with what the member had installed before it and whether it is the message's first delivery.

Five invariants judge deliveries against each member's own journal order: total and source order (first
deliveries, in order), no-duplicate (how often), virtual synchrony (the view installed before each delivery) and
k-resilience (the views installed after it).  One table gives all of them: each delivery takes the last view its
member installed before it (an as-of join on the journal position against the member's few installs, numbered by
a window over them alone, instead of a running window over every delivery), and an aggregation per member and
message finds the position of the first delivery and counts them (joined back on the position, one number,
which is unique).  It is materialized for the audit.
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
    and, on a first delivery, ``n`` how many times the member delivered the message.
    """
    return v.table("deliveries", _deliveries, cache=True)


def _same(columns: str, left: str, right: str) -> str:
    """``left`` and ``right`` agree on every one of ``columns`` (nulls equal, as a window's partition takes them)."""
    return " AND ".join(f"{left}.{c} IS NOT DISTINCT FROM {right}.{c}" for c in columns.split(", "))


def _deliveries(v: Tables) -> str:
    return f"""
        WITH installs AS (
            SELECT {MEMBER}, pos,
                last_value(view IGNORE NULLS) OVER so_far AS epoch,
                count(1) OVER so_far AS vidx
            FROM {v.base} WHERE event = 'view'
            WINDOW so_far AS (PARTITION BY {MEMBER} ORDER BY pos ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        ), placed AS (
            SELECT d.*, i.epoch, coalesce(i.vidx, 0) AS vidx
            FROM (SELECT {MEMBER}, view, ts, {MESSAGE}, holders, need, order_view, pos FROM {v.base}
                  WHERE event = 'deliver') AS d
            ASOF LEFT JOIN installs AS i ON {_same(MEMBER, 'd', 'i')} AND d.pos >= i.pos
        )
        SELECT p.*, c.first_pos IS NOT NULL AS first, c.n
        FROM placed AS p
        LEFT JOIN (SELECT min(pos) AS first_pos, count(1) AS n FROM placed GROUP BY {MEMBER}, {MESSAGE}) AS c
            ON p.pos = c.first_pos"""
