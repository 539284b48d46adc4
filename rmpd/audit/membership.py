"""Membership invariants: virtual synchrony, atomicity within a partition, unique view IDs.

RMP gives virtual synchrony to packets of at least totally ordered QoS (paper section 3.2): unordered and
source-ordered packets are delivered on receipt, before the token site orders them, so they may fall on either side
of a view change at different members.  Both set invariants therefore judge totally ordered deliveries only.

Both set invariants compare members that installed the same view and then the same next view: those stayed
together through the change (one partition), so they must agree on what the view delivered.  Members that went to
different next views (a partition) or installed no next view (a crash, or the end of the trace) are not compared.
"""

from __future__ import annotations

from .check import Check, example
from .columns import is_ordered
from .delivered import MEMBER, MESSAGE, deliveries
from .tables import Tables


def view_changes(v: Tables) -> str:
    """``node, group, v1, v2``: the member installed view ``v1`` and then, as its next install, ``v2``."""
    return v.table("view changes", lambda v: f"""
        SELECT DISTINCT * FROM (
            SELECT {MEMBER}, view AS v1, lead(view) OVER (PARTITION BY {MEMBER} ORDER BY pos) AS v2
            FROM {v.base} WHERE event = 'view'
        ) WHERE v2 IS NOT NULL""", cache=True)


def _disagreements(v: Tables, name: str, in_view: str, detail: str) -> Check:
    """Every ordered message one member of a (v1, v2) change delivered in v1 is expected from every member of it.

    ``in_view`` names, for each delivery, the view it counts for.  Expected (member, change, message) triples are
    counted, not built: each message delivered in a change counts once per member of the change, and is missing at
    as many as did not deliver it.  Only the messages some member missed are expanded into rows, and only when
    examples are wanted.
    """
    changes = view_changes(v)
    mine = v.table(f"{name}: delivered", lambda v: f"""
        SELECT * FROM (SELECT DISTINCT {MEMBER}, {in_view} AS v1, {MESSAGE} FROM {deliveries(v)}
                       WHERE {is_ordered('qos')} AND {in_view} IS NOT NULL)
        JOIN {changes} USING ({MEMBER}, v1)""")
    # A message with a null field matches no delivery, its own included, so every member misses it.
    counted = v.table(f"{name}: counted", lambda _: f"""
        SELECT * FROM (
            SELECT "group", v1, v2, {MESSAGE},
                CASE WHEN src IS NULL OR seq IS NULL OR qos IS NULL THEN 0 ELSE count(1) END AS k
            FROM {mine} GROUP BY "group", v1, v2, {MESSAGE})
        JOIN (SELECT "group", v1, v2, count(1) AS m FROM {changes} GROUP BY "group", v1, v2) USING ("group", v1, v2)""")
    missing = f"""(
        SELECT * FROM {changes}
        JOIN (SELECT "group", v1, v2, {MESSAGE} FROM {counted} WHERE k < m) USING ("group", v1, v2)
        ANTI JOIN {mine} USING ({MEMBER}, v1, v2, {MESSAGE}))"""
    return Check(
        name, None, example(missing, "node", "v1", "NULL", "src", "seq", detail),
        f"SELECT m AS c, m - k AS x FROM {counted}",
    )


def virtual_synchrony(v: Tables) -> Check:
    """``virtual-synchrony``: members installing v1 then v2 delivered the same ordered set between the two installs.

    "Between" is by position in each member's journal: a delivery belongs to the last view installed before it.
    """
    return _disagreements(
        v, "virtual-synchrony", "epoch",
        "concat('not delivered between views ', v1, ' and ', v2, ' though other members that installed both did')",
    )


def atomicity(v: Tables) -> Check:
    """``atomicity``: an ordered message delivered in view v1 by one member is delivered in v1 by its whole partition.

    "In v1" is by the view the delivery record names; the partition is the members that installed v1 and then the
    same next view.
    """
    return _disagreements(
        v, "atomicity", "view", "concat('not delivered in view ', v1, ' though others moving to ', v2, ' did')",
    )


def view_names(v: Tables) -> str:
    """``vid, group, ml, node``: each member list (``ml``) a view ID names in a group, from view installs and New
    Lists, with the least process that wrote it.  A task finds these for its groups; ``unique_view_id`` judges
    them over every group together."""
    return v.table("unique-view-id: names", lambda v: f"""
        SELECT vid, "group", ml, min(node) AS node FROM (
            SELECT node, "group", view AS vid, ml FROM {v.base} WHERE event = 'view' AND msize IS NOT NULL
            UNION ALL SELECT node, "group", new_view AS vid, ml FROM {v.base}
            WHERE event IN ('send', 'recv') AND packet = 'new_list' AND msize IS NOT NULL
        ) WHERE vid IS NOT NULL GROUP BY vid, "group", ml""")


def unique_view_id(v: Tables) -> Check:
    """``unique-view-id``: a view ID names one ordered member list, in every record and every group.

    ``v.base`` holds the ``view_names`` of every group (each (view ID, group, member list) once).
    """
    per_view = v.table("unique-view-id: per view", lambda v: f"""
        SELECT vid, count(1) AS n, min({{'group': "group", 'ml': ml, 'node': node}}) AS a,
            max({{'group': "group", 'ml': ml}}) AS b
        FROM {v.base} GROUP BY vid""")
    return Check(
        "unique-view-id",
        f"SELECT * FROM {per_view}",
        example(f"{per_view} WHERE n > 1", "a.node", "vid", group='a."group"',
                detail="concat('names [', a.ml, '] in ', a.\"group\", ' and [', b.ml, '] in ', b.\"group\")"),
    )
