"""Ordering invariants: one packet per (view, timestamp), total order without gaps, no duplicates, source order.

Each member's deliveries are taken in the order it wrote them (``pos``), which is the order it handed them to the
application.  A message delivered more than once is judged by its first delivery everywhere but in
``no-duplicate``, so that one fault is reported by one invariant.
"""

from __future__ import annotations

from .check import Check, example
from .columns import data_id, is_ordered, is_reliable, is_source_ordered, items, order_field, split_id
from .delivered import MEMBER, deliveries
from .ranges import short_ranges, skipped
from .tables import Tables

_ACKS = "event IN ('send', 'recv') AND packet = 'ack'"
_NEW_LISTS = "event IN ('send', 'recv') AND packet = 'new_list'"


def claims(v: Tables) -> str:
    """Every claim of what data or ACK occupies a (group, view, ts) slot: ``node, group, view, ts, what, qos``.

    Claims come from deliveries that carry a timestamp, from ACKs sent or received (the ACK itself takes ``ts``,
    the data it orders ``ts+1``, ``ts+2``, ...) and from New Lists that name their own view (a change of the lock
    table, which installs no view and is placed by the token site like an ACK).  One token per view means one of
    these per slot, so the claims must agree across every process, whichever side of a later partition it ended
    on.  New Lists of new views are judged apart (``past_new_list``): a reformation's New List takes the slot after
    its sync point, which an ACK nobody in the new view delivered may have claimed before.

    Identical claims by several processes (every member delivers each slot; an ACK is journaled by its sender and
    each receiver) are one row, with the least claimant as ``node``: the claims' text is then built once per slot,
    not once per member.
    """
    return v.table("claims", lambda v: f"""
        SELECT * FROM (
            SELECT min(node) AS node, "group", view, ts, {data_id('src', 'seq', 'qos')} AS what, qos
            FROM {v.base} WHERE event = 'deliver' AND ts IS NOT NULL GROUP BY "group", view, ts, src, seq, qos
            UNION ALL SELECT min(node), "group", view, ts, concat_ws('|', 'ack', src), CAST(NULL AS STRING)
            FROM {v.base} WHERE {_ACKS} GROUP BY "group", view, ts, src
            UNION ALL SELECT min(node), "group", view, ts + i + 1,
                {data_id(order_field('o', 0), order_field('o', 1), 'oqos')}, oqos
            FROM (SELECT *, {order_field('o', 2)} AS oqos FROM (
                SELECT node, "group", view, ts, unnest(range(len(l))) AS i, unnest(l) AS o
                FROM (SELECT min(node) AS node, "group", view, ts, {items('orders')} AS l FROM {v.base}
                      WHERE {_ACKS} GROUP BY "group", view, ts, orders)))
            GROUP BY "group", view, ts + i + 1, o, oqos
            UNION ALL SELECT min(node), "group", view, ts, concat_ws('|', 'new_list', new_view), CAST(NULL AS STRING)
            FROM {v.base} WHERE {_NEW_LISTS} AND new_view = view GROUP BY "group", view, ts, new_view
        ) WHERE ts IS NOT NULL""")


def past_new_list(v: Tables) -> str:
    """Deliveries of a view at or past the slot of a New List their member then installed (a FROM clause):
    ``node, group, view, ts, src, seq``, and ``nl_ts`` and ``new_view`` of the New List.

    A New List nobody installed was a reformation's proposal that aborted, not an ordering decision, and a
    different New List may follow it at the same timestamp; a process that only received a New List (from the other
    side of a partition) did not take it (a ``view`` record carries the timestamp of the New List that installed
    it).  A member installs a New List once it has delivered every slot before it and nothing after it (delivery
    takes a consecutive prefix, and committing a reformation drops every slot past its sync point), so everyone who
    installs one view agrees that its New List holds that slot.  Processes that went on to different views (the
    two sides of a partition, or a token site cut off right after its ACK) may each have filled the slot
    differently: the paper's total order promises one order to the processes that stay together, and the
    resilient QoS levels with a majority minimum partition promise more, which k-resilience checks.
    """
    return f"""(
        SELECT * FROM (SELECT node, "group", view, ts, src, seq FROM {v.base}
                       WHERE event = 'deliver' AND ts IS NOT NULL)
        JOIN (SELECT node, "group", view, ts AS nl_ts, new_view
              FROM (SELECT DISTINCT "group", view, ts, new_view FROM {v.base} WHERE {_NEW_LISTS} AND view <> new_view)
              JOIN (SELECT DISTINCT node, "group", view AS new_view, ts FROM {v.base} WHERE event = 'view')
              USING ("group", new_view, ts))
        USING (node, "group", view)
        WHERE ts >= nl_ts)"""


def slots(v: Tables) -> str:
    """One row per claimed (group, view, ts) slot (materialized): ``a`` and ``b`` the least and greatest claim,
    ``node`` the least claimant, ``ordered`` whether some claim is of a totally ordered message.

    The claims agree exactly when ``a == b``.  One aggregation serves both one-order and total order's gaps.
    """
    return v.table("slots", lambda v: f"""
        SELECT "group", view, ts, min(what) AS a, max(what) AS b, min(node) AS node,
            max({is_ordered('qos')}) AS ordered
        FROM {claims(v)} GROUP BY "group", view, ts""", cache=True)


def one_order(v: Tables) -> Check:
    """``one-order``: every process agrees on the data and ACK each (view, timestamp) holds, and no process
    installs a New List at a slot it delivered something else at (or past)."""
    per_slot = slots(v)
    is_data = f"{split_id('a', 0)} = 'data'"
    clashes = example(
        f"{per_slot} WHERE a <> b", node="node", view="view", ts="ts",
        src=f"CASE WHEN {is_data} THEN {split_id('a', 1)} END", seq=f"CASE WHEN {is_data} THEN {split_id('a', 2)} END",
        detail="concat('slot holds ', a, ' and ', b)",
    )
    overruns = example(
        past_new_list(v), node="node", view="view", ts="ts", src="src", seq="seq",
        detail="concat('delivered at or past ts ', CAST(nl_ts AS STRING), ', the New List of ', new_view, "
               "' it installed')",
    )
    return Check("one-order", f"SELECT * FROM {per_slot}", f"{clashes} UNION ALL {overruns}")


def first_deliveries(v: Tables, name: str, qos_class: str) -> str:
    """Each member's first delivery of each message whose QoS is in ``qos_class`` (with ``n``, how often it
    delivered it)."""
    return v.table(f"{name}: first deliveries",
                   lambda v: f"SELECT * FROM {deliveries(v)} WHERE first AND {qos_class}")


def total_order(v: Tables) -> Check:
    """``total-order``: each member delivers ordered traffic in timestamp order, skipping no ordered slot.

    Order: within one member and view, each ordered delivery has a larger timestamp than the one before.  Gaps:
    between a member's first and last ordered delivery in a view, every slot known (from any process's ACKs or
    deliveries) to hold an ordered message was delivered by that member.
    """
    firsts = first_deliveries(v, "total-order", is_ordered("qos"))
    no_ts = example(f"{firsts} WHERE ts IS NULL", "node", "view", "NULL", "src", "seq",
                    "'ordered delivery without a timestamp'")
    backwards = example(
        f"(SELECT *, lag(ts) OVER (PARTITION BY {MEMBER}, view ORDER BY pos) AS prev FROM {firsts} "
        "WHERE ts IS NOT NULL) WHERE ts < prev",
        "node", "view", "ts", "src", "seq", "concat('delivered after ts ', CAST(prev AS STRING))",
    )
    known = v.table("total-order: known", lambda v: f'SELECT "group", view, ts FROM {slots(v)} WHERE ordered')
    # Every ordered delivery with a timestamp is itself a claim of its slot, so its position is known.
    delivered = v.table("total-order: delivered",
                        lambda _: f"SELECT {MEMBER}, view, ts FROM {firsts} WHERE ts IS NOT NULL")
    ordered_claims = v.table(
        "total-order: claims", lambda v: f'SELECT "group", view, ts, what FROM {claims(v)} WHERE {is_ordered("qos")}'
    )
    key, scope = f"{MEMBER}, view", '"group", view'
    ranges = short_ranges(v, "total-order", delivered, known, key, scope, "ts", all_known=True)
    gaps = example(
        skipped(ranges, ordered_claims, delivered, key, scope, "ts"), "node", "view", "ts",
        split_id("what", 1), split_id("what", 2),
        "concat('skipped between ts ', CAST(lo AS STRING), ' and ', CAST(hi AS STRING))",
    )
    return Check("total-order", f"SELECT * FROM {firsts}", f"{no_ts} UNION ALL {backwards} UNION ALL {gaps}")


def no_duplicate(v: Tables) -> Check:
    """``no-duplicate``: no member delivers a reliable message twice."""
    firsts = first_deliveries(v, "no-duplicate", is_reliable("qos"))
    return Check(
        "no-duplicate",
        f"SELECT * FROM {firsts}",
        example(f"{firsts} WHERE n > 1", "node", "view", "ts", "src", "seq",
                "concat('delivered ', CAST(n AS STRING), ' times')"),
    )


def source_order(v: Tables) -> Check:
    """``source-order``: per member, view and source, source-ordered (and above) messages go in sequence order.

    Order: each delivery's sequence number is larger than the previous one from that source.  Gaps: a message the
    source journaled sending with QoS >= source, numbered between two that the member delivered, was delivered too.
    """
    firsts = first_deliveries(v, "source-order", is_source_ordered("qos"))
    backwards = example(
        f"(SELECT *, lag(seq) OVER (PARTITION BY {MEMBER}, view, src ORDER BY pos) AS prev FROM {firsts}) "
        "WHERE seq < prev",
        "node", "view", "ts", "src", "seq", "concat('delivered after seq ', CAST(prev AS STRING))",
    )
    sent = v.table("source-order: sent", lambda v: f"""
        SELECT DISTINCT "group", src, seq FROM {v.base}
        WHERE event = 'send' AND packet = 'data' AND src = node AND {is_source_ordered('qos')}""", cache=True)
    delivered = v.table("source-order: delivered", lambda _: f"SELECT {MEMBER}, view, src, seq FROM {firsts}")
    key, scope = f"{MEMBER}, view, src", '"group", src'
    ranges = short_ranges(v, "source-order", delivered, sent, key, scope, "seq")
    gaps = example(
        skipped(ranges, sent, delivered, key, scope, "seq"), "node", "view", "NULL", "src", "seq",
        "concat('skipped between seq ', CAST(lo AS STRING), ' and ', CAST(hi AS STRING))",
    )
    return Check("source-order", f"SELECT * FROM {firsts}", f"{backwards} UNION ALL {gaps}")
