"""Gaps: the ranges of a member's deliveries that skip a position known to hold something, and what they skip.

Total order (timestamps of ordered slots, per view) and source order (sequence numbers a source sent, per source)
ask the same question: between a member's first and last delivery in a scope, did it deliver every known position?
Whether a range skips anything is decided by counting, with equi-joins only: the known positions up to its last
delivery minus those below its first, against the delivered positions that are known.  Only the ranges that come
up short are then expanded position by position to name what was skipped, so the costly range join runs on a
handful of rows instead of every member's every view.
"""

from __future__ import annotations

from .tables import Tables


def short_ranges(v: Tables, name: str, delivered: str, known: str, key: str, scope: str, pos: str,
                 all_known: bool = False) -> str:
    """The view of ``key`` ranges ``[lo, hi]`` of ``delivered`` positions that skip a ``known`` position.

    ``delivered`` has the ``key`` columns (which include ``scope``) and ``pos``; ``known`` has ``scope`` and ``pos``,
    distinct.  ``all_known`` says every delivered position is known (where a delivery is itself a claim of its
    slot), which spares joining them.  The range ends and the marks are each read several times, so they are
    cached.
    """
    distinct = f"(SELECT DISTINCT {key}, {pos} FROM {delivered})"
    if all_known:
        ends_sql = f"SELECT {key}, min({pos}) AS lo, max({pos}) AS hi, count(1) AS m FROM {distinct} GROUP BY {key}"
    else:
        ends_sql = (
            f"SELECT * FROM (SELECT {key}, min({pos}) AS lo, max({pos}) AS hi FROM {distinct} GROUP BY {key}) "
            f"LEFT JOIN (SELECT {key}, count(1) AS m FROM {distinct} SEMI JOIN {known} USING ({scope}, {pos}) "
            f"GROUP BY {key}) USING ({key})"
        )
    ends = v.table(f"{name}: range ends", lambda _: ends_sql, cache=True)
    # Known positions plus every range end, each with the count of known positions at or below it.
    marks = v.table(f"{name}: marks", lambda _: f"""
        SELECT {scope}, {pos}, k,
            sum(k) OVER (PARTITION BY {scope} ORDER BY {pos} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto
        FROM (SELECT {scope}, {pos}, max(k) AS k FROM (
            SELECT {scope}, {pos}, 1 AS k FROM {known}
            UNION ALL SELECT {scope}, lo AS {pos}, 0 AS k FROM {ends}
            UNION ALL SELECT {scope}, hi AS {pos}, 0 AS k FROM {ends}
        ) GROUP BY {scope}, {pos})""", cache=True)
    return v.table(f"{name}: short ranges", lambda _: f"""
        SELECT {key}, lo, hi FROM {ends}
        JOIN (SELECT {scope}, {pos} AS lo, upto - k AS below FROM {marks}) USING ({scope}, lo)
        JOIN (SELECT {scope}, {pos} AS hi, upto AS atmost FROM {marks}) USING ({scope}, hi)
        WHERE atmost - below > coalesce(m, 0)""", cache=True)


def skipped(ranges: str, known: str, delivered: str, key: str, scope: str, pos: str) -> str:
    """SQL of the ``known`` rows inside short ``ranges`` that the member did not deliver (a FROM clause).

    Both joins run against the few short ranges only: the member's deliveries are first narrowed to the members
    and scopes that have one.  The rows inside a short range are made distinct, not all of ``known``.
    """
    return f"""(
        SELECT * FROM (SELECT DISTINCT * FROM {ranges} JOIN {known} USING ({scope}) WHERE {pos} BETWEEN lo AND hi)
        ANTI JOIN (SELECT * FROM {delivered} SEMI JOIN (SELECT DISTINCT {key} FROM {ranges}) USING ({key}))
        USING ({key}, {pos}))"""
