"""``exactly-once``: a key takes one position of its group's order, and no member delivers it twice.

A keyed message's position is its packet's slot and its index among the packet's delivered messages: the delivery
record's ``view`` and ``ts`` and the index in ``keys``.  A key at two positions is a key delivered as two messages:
two sends (``src``, ``seq``) carrying it, both delivered, which is what exactly-once forbids.  One message at two
slots is not counted twice: a token site cut off in the instant it ordered and delivered a message leaves the
others to order it again in their next view (docs/protocol.md, "Total order across a partition"), so the same
send can sit at two slots, once in each member's order; whether those orders agree is ``one-order``'s question.
Copies the group dropped (``duplicates``) are not deliveries and take no position.

Both halves are answered by one aggregation per (group, key): every delivery of a key is collected (a handful, one
per member, in a sound trace), and the distinct sends and the members named more than once are read from that
list.  Journals without keys have nothing to aggregate; the invariant then holds over 0 keyed messages, which the
report says.
"""

from __future__ import annotations

from .check import Check, example
from .columns import items
from .tables import Tables

SHOWN_POSITIONS = 4
"""Positions named in an example's detail; the count names them all."""

_DELIVERY = "{'ts': ts, 'view': view, 'i': i, 'src': src, 'seq': seq, 'node': node}"
_IN_ORDER = "ts NULLS FIRST, view NULLS FIRST, i, src NULLS FIRST, seq NULLS FIRST, node NULLS FIRST"


def per_key(v: Tables) -> str:
    """``group, key, n, ds, sends, firsts, twice``: per key delivered in a group, how many deliveries (``n``), each
    of them in order (``ds``: ``ts, view, i, src, seq, node``), the messages that carried it in the order they were
    first delivered (``sends``: ``src, seq``), the first delivery of each of them (``firsts``) and the members that
    delivered it more than once (``twice``)."""
    return v.table("exactly-once: per key", lambda v: f"""
        SELECT *, list_sort(list_distinct(list_filter(nodes, lambda m, j: j > 1 AND nodes[j - 1] = m))) AS twice,
            list_filter(messages, lambda s, j: list_position(messages, s) = j) AS sends,
            list_filter(ds, lambda d, j: list_position(messages, messages[j]) = j) AS firsts
        FROM (
            SELECT "group", key, n, ds, list_transform(ds, lambda d: {{'src': d.src, 'seq': d.seq}}) AS messages,
                list_sort(list_transform(ds, lambda d: d.node)) AS nodes
            FROM (
                SELECT "group", key, count(1) AS n, list({_DELIVERY} ORDER BY {_IN_ORDER}) AS ds
                FROM (SELECT node, "group", view, ts, src, seq, unnest(range(len(l))) AS i, unnest(l) AS key
                      FROM (SELECT *, {items('keys')} AS l FROM {v.base}
                            WHERE event = 'deliver' AND keys IS NOT NULL))
                GROUP BY "group", key))""", cache=True)


def _place(d: str) -> str:
    """A delivery's position and message as text: ``ts T #I in VIEW (SRC seq SEQ)``."""
    def field(name: str) -> str:
        return f"struct_extract({d}, '{name}')"
    return (f"concat('ts ', coalesce(CAST({field('ts')} AS STRING), '?'), ' #', CAST({field('i')} AS STRING), "
            f"' in ', coalesce({field('view')}, '?'), ' (', coalesce({field('src')}, '?'), ' seq ', "
            f"coalesce(CAST({field('seq')} AS STRING), '?'), ')')")


def exactly_once(v: Tables) -> Check:
    """Per key: more than one message carrying it is one violation, and each member that delivered it more than
    once is one.

    Counted: every keyed delivery (a member's delivery of one keyed message); noted: the keyed messages (positions)
    in the groups' order, so an audit of journals without keys says it judged none.
    """
    keys = per_key(v)
    shown = f"array_to_string(list_transform(firsts[1:{SHOWN_POSITIONS}], lambda f: {_place('f')}), ', ')"
    positions = example(
        f"(SELECT *, firsts[2] AS d FROM {keys} WHERE len(sends) > 1)",
        "d.node", "d.view", "d.ts", "d.src", "d.seq",
        f"concat('key ', key, ' at ', CAST(len(sends) AS STRING), ' positions of the order: ', {shown}, "
        f"CASE WHEN len(sends) > {SHOWN_POSITIONS} THEN ', ...' ELSE '' END)",
    )
    members = example(
        "(SELECT *, list_filter(ds, lambda d: d.node = m)[2] AS d, len(list_filter(ds, lambda d: d.node = m)) AS times "
        f"FROM (SELECT *, unnest(twice) AS m FROM {keys}))",
        "m", "d.view", "d.ts", "d.src", "d.seq",
        "concat('delivered key ', key, ' ', CAST(times AS STRING), ' times')",
    )
    return Check(
        "exactly-once", None, f"{positions} UNION ALL {members}",
        f"SELECT n AS c, CASE WHEN len(sends) > 1 THEN 1 ELSE 0 END + len(twice) AS x, len(sends) AS k "
        f"FROM {keys}",
        noun="keyed messages",
    )
