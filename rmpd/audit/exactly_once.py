"""``exactly-once``: a key takes one position of its group's order, and no member delivers it twice.

A keyed message's position is its packet's slot and its index among the packet's delivered messages: the delivery
record's ``view`` and ``ts`` and the index in ``keys``.  A key at two positions is a key delivered as two messages:
two sends (``src``, ``seq``) carrying it, both delivered, which is what exactly-once forbids.  One message at two
slots is not counted twice: a token site cut off in the instant it ordered and delivered a message leaves the
others to order it again in their next view (docs/protocol.md, "Total order across a partition"), so the same
send can sit at two slots, once in each member's order; whether those orders agree is ``one-order``'s question.
Copies the group dropped (``duplicates``) are not deliveries and take no position.

Both halves are answered by one aggregation per (group, key), so the check adds one shuffle, of the keyed
deliveries only: every delivery of a key is collected (a handful, one per member, in a sound trace), and the
distinct sends and the members named more than once are read from that list.  Journals without keys have nothing
to shuffle; the invariant then holds over 0 keyed messages, which the report says.
"""

from __future__ import annotations

from .check import Check, example
from .views import Views

SHOWN_POSITIONS = 4
"""Positions named in an example's detail; the count names them all."""


def per_key(v: Views) -> str:
    """``group, key, n, ds, sends, twice``: per key delivered in a group, how many deliveries (``n``), each of
    them in order (``ds``: ``ts, view, i, src, seq, node``), the messages that carried it in the order they were
    first delivered (``sends``: ``src, seq``) and the members that delivered it more than once (``twice``)."""
    return v.table("exactly-once: per key", lambda v: f"""
        SELECT *, array_distinct(filter(nodes, (m, j) -> {_repeated('nodes', 'm', 'j')})) AS twice FROM (
            SELECT `group`, key, n, ds,
                array_distinct(transform(ds, d -> named_struct('src', d.src, 'seq', d.seq))) AS sends,
                array_sort(transform(ds, d -> d.node)) AS nodes
            FROM (
                SELECT `group`, key, count(1) AS n, array_sort(collect_list(
                    named_struct('ts', ts, 'view', view, 'i', i, 'src', src, 'seq', seq, 'node', node))) AS ds
                FROM (SELECT node, `group`, view, ts, src, seq, i, key
                      FROM {v.base} LATERAL VIEW posexplode(keys) AS i, key
                      WHERE event = 'deliver' AND keys IS NOT NULL)
                GROUP BY `group`, key)
        )""")


def _repeated(sorted_list: str, element: str, index: str) -> str:
    """Whether ``element`` at 0-based ``index`` of ``sorted_list`` equals the one before it (the index is 1-based
    for ``try_element_at``, which gives null, not an error, out of range)."""
    return f"CASE WHEN {index} > 0 THEN try_element_at({sorted_list}, {index}) = {element} ELSE false END"


def _first_delivery(send: str) -> str:
    """The first delivery (of ``ds``) of message ``send``."""
    return f"try_element_at(filter(ds, d -> d.src <=> {send}.src AND d.seq <=> {send}.seq), 1)"


def _place(d: str) -> str:
    """A delivery's position and message as text: ``ts T #I in VIEW (SRC seq SEQ)``."""
    return (f"concat('ts ', coalesce(CAST({d}.ts AS STRING), '?'), ' #', CAST({d}.i AS STRING), ' in ', "
            f"coalesce({d}.view, '?'), ' (', coalesce({d}.src, '?'), ' seq ', coalesce(CAST({d}.seq AS STRING), '?'), "
            f"')')")


def exactly_once(v: Views) -> Check:
    """Per key: more than one message carrying it is one violation, and each member that delivered it more than
    once is one.

    Counted: every keyed delivery (a member's delivery of one keyed message); noted: the keyed messages (positions)
    in the groups' order, so an audit of journals without keys says it judged none.
    """
    keys = per_key(v)
    shown = f"array_join(transform(slice(sends, 1, {SHOWN_POSITIONS}), s -> {_place(_first_delivery('s'))}), ', ')"
    positions = example(
        f"(SELECT *, {_first_delivery('try_element_at(sends, 2)')} AS d FROM {keys} WHERE size(sends) > 1)",
        "d.node", "d.view", "d.ts", "d.src", "d.seq",
        f"concat('key ', key, ' at ', CAST(size(sends) AS STRING), ' positions of the order: ', {shown}, "
        f"CASE WHEN size(sends) > {SHOWN_POSITIONS} THEN ', ...' ELSE '' END)",
    )
    mine = "filter(ds, d -> d.node = m)"
    members = example(
        f"(SELECT *, try_element_at({mine}, 2) AS d, size({mine}) AS times "
        f"FROM {keys} LATERAL VIEW explode(twice) AS m)",
        "m", "d.view", "d.ts", "d.src", "d.seq",
        "concat('delivered key ', key, ' ', CAST(times AS STRING), ' times')",
    )
    return Check(
        "exactly-once", None, f"{positions} UNION ALL {members}",
        f"SELECT n AS c, CASE WHEN size(sends) > 1 THEN 1 ELSE 0 END + size(twice) AS x, size(sends) AS k "
        f"FROM {keys}",
        noun="keyed messages",
    )
