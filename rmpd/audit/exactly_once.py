"""``exactly-once``: a key is delivered at one position of its group's order, and by no member twice.

A keyed message's place in the order is its packet's slot and its index among the packet's delivered messages:
(view, ts, index in ``keys``).  The slot's view is the ``view`` of the delivery record, which every member that
delivers the slot names alike (``atomicity``); ``order_view`` is not used, as it says how far each writer had
ordered, which differs between members.  Copies the group dropped (``duplicates``) are not deliveries and take no
position.

Both halves are answered by one aggregation per (group, key), so the check adds one shuffle, of the keyed
deliveries only: every delivery of a key is collected (a handful, one per member, in a sound trace), and the
distinct positions and the members named more than once are read from that list.  Journals without keys have
nothing to shuffle; the invariant then holds over 0 keyed messages, which the report says.
"""

from __future__ import annotations

from .check import Check, example
from .views import Views

SHOWN_POSITIONS = 4
"""Positions named in an example's detail; the count names them all."""


def per_key(v: Views) -> str:
    """``group, key, n, ds, places, twice``: per key delivered in a group, how many deliveries (``n``), each of
    them (``ds``: ``ts, view, i, src, seq, node``), its distinct positions in order (``places``: ``ts, view, i``)
    and the members that delivered it more than once (``twice``)."""
    return v.table("exactly-once: per key", lambda v: f"""
        SELECT *, array_distinct(filter(nodes, (m, j) -> {_repeated('nodes', 'm', 'j')})) AS twice FROM (
            SELECT `group`, key, n, ds,
                array_sort(array_distinct(transform(ds, d -> named_struct('ts', d.ts, 'view', d.view, 'i', d.i))))
                    AS places,
                array_sort(transform(ds, d -> d.node)) AS nodes
            FROM (
                SELECT `group`, key, count(1) AS n,
                    collect_list(named_struct('ts', ts, 'view', view, 'i', i, 'src', src, 'seq', seq, 'node', node))
                        AS ds
                FROM (SELECT node, `group`, view, ts, src, seq, i, key
                      FROM {v.base} LATERAL VIEW posexplode(keys) AS i, key
                      WHERE event = 'deliver' AND keys IS NOT NULL)
                GROUP BY `group`, key)
        )""")


def _repeated(sorted_list: str, element: str, index: str) -> str:
    """Whether ``element`` at 0-based ``index`` of ``sorted_list`` equals the one before it (the index is 1-based
    for ``try_element_at``, which gives null, not an error, out of range)."""
    return f"CASE WHEN {index} > 0 THEN try_element_at({sorted_list}, {index}) = {element} ELSE false END"


def _place(p: str) -> str:
    """A position as text: ``ts T #I in VIEW``."""
    return (f"concat('ts ', coalesce(CAST({p}.ts AS STRING), '?'), ' #', CAST({p}.i AS STRING), ' in ', "
            f"coalesce({p}.view, '?'))")


def exactly_once(v: Views) -> Check:
    """Per key: more than one position is one violation, and each member that delivered it more than once is one.

    Counted: every keyed delivery (a member's delivery of one keyed message); noted: the keyed messages in the
    group's order (positions), so an audit of journals without keys says it judged none.
    """
    keys = per_key(v)
    second = "try_element_at(places, 2)"
    same = f"d.ts <=> {second}.ts AND d.view <=> {second}.view AND d.i = {second}.i"
    at_second = f"try_element_at(array_sort(filter(ds, d -> {same})), 1)"
    shown = f"array_join(transform(slice(places, 1, {SHOWN_POSITIONS}), p -> {_place('p')}), ', ')"
    positions = example(
        f"(SELECT *, {at_second} AS d FROM {keys} WHERE size(places) > 1)",
        "d.node", "d.view", "d.ts", "d.src", "d.seq",
        f"concat('key ', key, ' at ', CAST(size(places) AS STRING), ' positions of the order: ', {shown}, "
        f"CASE WHEN size(places) > {SHOWN_POSITIONS} THEN ', ...' ELSE '' END)",
    )
    mine = "array_sort(filter(ds, d -> d.node = m))"
    members = example(
        f"(SELECT *, try_element_at({mine}, 2) AS d, size({mine}) AS times "
        f"FROM {keys} LATERAL VIEW explode(twice) AS m)",
        "m", "d.view", "d.ts", "d.src", "d.seq",
        "concat('delivered key ', key, ' ', CAST(times AS STRING), ' times')",
    )
    return Check(
        "exactly-once", None, f"{positions} UNION ALL {members}",
        f"SELECT n AS c, CASE WHEN size(places) > 1 THEN 1 ELSE 0 END + size(twice) AS x, size(places) AS k "
        f"FROM {keys}",
        noun="keyed messages",
    )
