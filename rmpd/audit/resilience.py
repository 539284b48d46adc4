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

from .check import Check, example
from .columns import is_resilient, required_holders
from .delivered import MEMBER, deliveries
from .tables import Tables


def holdings(v: Tables) -> str:
    """``group, view, p, upto``: process ``p`` is shown to hold every slot up to ``upto`` in the view.

    Evidence is a token acceptance, an ACK or New List sent or received, a reformation vote ``p`` sent (its ``ts``
    is ``p``'s sync point), or a reformation committed at ``p`` (its ``ts`` is the sync point ``p`` reached; it
    counts for the old view and the new one).
    """
    return v.table("k-resilience: holdings", lambda v: f"""
        SELECT "group", view, p, max(upto) AS upto FROM (
            SELECT "group", view, node AS p, ts AS upto FROM {v.base} WHERE event = 'token'
            UNION ALL SELECT "group", view, src, ts + norders FROM {v.base}
            WHERE event IN ('send', 'recv') AND packet IN ('ack', 'new_list')
            UNION ALL SELECT "group", view, src, ts FROM {v.base} WHERE event = 'send' AND packet = 'recovery_vote'
            UNION ALL SELECT "group", view, node, ts FROM {v.base} WHERE event = 'recovery' AND role = 'commit'
            UNION ALL SELECT "group", new_view, node, ts FROM {v.base} WHERE event = 'recovery' AND role = 'commit'
        ) WHERE p IS NOT NULL AND upto IS NOT NULL GROUP BY "group", view, p""", cache=True)


def _need(qos: str, group_size: str, recorded: str, ordering_later: str) -> str:
    """Holders required: the QoS rule over the delivery view, lowered to the writer's own ``need`` only when it was
    already ordering in a later view (members had left or been removed before the delivery; docs/protocol.md)."""
    rule = required_holders(qos, group_size)
    return f"CASE WHEN ({ordering_later}) AND {recorded} IS NOT NULL THEN least({rule}, {recorded}) ELSE {rule} END"


LATER_VIEWS = 8
"""How many views the deliverer installed after a delivery still count as evidence for it.  A resilient packet is
delivered once the token has gone round its holders; lock and membership New Lists can install a view at each of
those token passes, so evidence can sit in the next few views."""

CONTEXT = f"{MEMBER}, vidx, view, order_view"
"""What decides which views count as evidence for a delivery: its writer, how many views the writer had installed
before it, its view and the view the writer was ordering in.  Deliveries share a handful of contexts."""


def _evidence(v: Tables, d: str, h: str) -> str:
    """``CONTEXT, uptos``: for each context of ``d``, how far each other process is shown to hold (one entry each).

    The views that count are the delivery view, the view the writer was ordering in, and the next ``LATER_VIEWS``
    views the writer installed.  Only views on the writer's own line count: timestamps run on across its New Lists
    and reformations, so a process holding a later slot there holds this one, which is not true of another
    partition's views.  A process counts for a delivery at ``ts`` when the furthest it is shown to hold, over those
    views, is at or past ``ts``; working that out per context instead of per delivery keeps it small.
    """
    return v.table("k-resilience: evidence", lambda v: f"""
        WITH ctx AS (SELECT DISTINCT {CONTEXT} FROM {d}),
        installs AS (
            SELECT {MEMBER}, row_number() OVER (PARTITION BY {MEMBER} ORDER BY pos) AS i, view AS ev
            FROM {v.base} WHERE event = 'view'
        ), evidence_views AS (
            SELECT {CONTEXT}, unnest(list_distinct([view, order_view])) AS ev FROM ctx
            UNION ALL
            SELECT {CONTEXT}, ev FROM (
                SELECT {CONTEXT}, unnest(range(vidx + 1, vidx + {LATER_VIEWS + 1})) AS i FROM ctx
            ) JOIN installs USING ({MEMBER}, i)
        )
        SELECT {CONTEXT}, list(upto) AS uptos FROM (
            SELECT {CONTEXT}, p, max(upto) AS upto
            FROM evidence_views JOIN (SELECT "group", view AS ev, p, upto FROM {h}) USING ("group", ev)
            WHERE p <> node GROUP BY {CONTEXT}, p
        ) GROUP BY {CONTEXT}""")


def k_resilience(v: Tables) -> Check:
    """Check both tests on every resilient delivery."""
    d = v.table("k-resilience: deliveries", lambda v: f"""
        SELECT {MEMBER}, view, order_view, vidx, ts, src, seq, qos, holders,
            {_need('qos', 'gsize', 'need', 'view <> order_view')} AS need
        FROM (
            SELECT {MEMBER}, view, coalesce(order_view, view) AS order_view, vidx, ts, src, seq, qos, holders, need,
                gsize
            FROM {deliveries(v)}
            LEFT JOIN (SELECT "group", view, max(msize) AS gsize FROM {v.base}
                       WHERE event = 'view' AND msize IS NOT NULL GROUP BY "group", view) USING ("group", view)
            WHERE {is_resilient('qos')}
        )""")
    h = holdings(v)
    ev = _evidence(v, d, h)
    same_context = " AND ".join(f"d.{c} IS NOT DISTINCT FROM e.{c}" for c in CONTEXT.split(", "))
    evidence = f"""(
        SELECT * FROM (
            SELECT d.*, len(list_filter(coalesce(e.uptos, []::BIGINT[]), lambda u: u >= d.ts)) + 1 AS shown
            FROM {d} AS d LEFT JOIN {ev} AS e ON {same_context}
        ) LEFT JOIN (SELECT DISTINCT "group", view, true AS has_evidence FROM {h}) USING ("group", view)
        WHERE (need IS NOT NULL AND (holders IS NULL OR holders < need))
            OR (coalesce(has_evidence, false) AND need IS NOT NULL AND ts IS NOT NULL AND shown < need))"""
    detail = (
        "concat(qos, ' needs ', CAST(need AS STRING), ' holders; record says ', "
        "coalesce(CAST(holders AS STRING), 'nothing'), ', trace shows ', "
        "CASE WHEN has_evidence THEN CAST(shown AS STRING) ELSE 'no token records' END)"
    )
    return Check(
        "k-resilience", f"SELECT * FROM {d}", example(evidence, "node", "view", "ts", "src", "seq", detail),
    )
