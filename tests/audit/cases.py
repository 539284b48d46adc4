"""Hand-made traces: a clean synthetic run per case, then one targeted change that breaks exactly one invariant.

Each case lives in its own group with its own view IDs, so many cases can sit side by side in one directory and
still be judged independently (every invariant is judged per group, view IDs are distinct).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rmpd.audit import synth

Records = list[dict]

NODES = synth.Plan().members()
A, B, C = NODES


def clean(group: str, base: int, keyed: bool = False) -> Records:
    return list(synth.records(synth.Plan(group=group, view_base=base, keyed=keyed)))


def _find(recs: Records, node: str, **match: object) -> int:
    """Index of the first record of ``node`` whose fields equal ``match``."""
    for i, r in enumerate(recs):
        if r["node"] == node and all(r.get(k) == v for k, v in match.items()):
            return i
    raise LookupError(f"no record of {node} with {match}")


def _move_after(recs: Records, i: int, j: int) -> None:
    """Move record ``i`` to just after record ``j`` (``i < j``)."""
    rec = recs.pop(i)
    recs.insert(j, rec)


def break_one_order(recs: Records) -> None:
    """C hears the second ACK ordering a different packet at the slot everyone else delivers."""
    i = [k for k, r in enumerate(recs) if r["node"] == C and r.get("packet") == "ack" and r["orders"]][1]
    recs[i] = recs[i] | {"orders": [[A, 99, "total"], *recs[i]["orders"][1:]]}


def break_total_order(recs: Records) -> None:
    """B delivers message 5 (safe, from C) before message 4 (majority, from B): timestamps go backwards."""
    i = _find(recs, B, event="deliver", src=B, seq=2, qos="majority")
    j = _find(recs, B, event="deliver", src=C, seq=2, qos="safe")
    _move_after(recs, i, j)


def break_no_duplicate(recs: Records) -> None:
    """A delivers an unordered message twice."""
    i = _find(recs, A, event="deliver", qos="unordered")
    recs.insert(i + 1, dict(recs[i]))


def break_source_order(recs: Records) -> None:
    """C delivers B's source-ordered seq 1 after B's seq 2 (majority); timestamps of ordered traffic unaffected."""
    i = _find(recs, C, event="deliver", src=B, seq=1, qos="source")
    j = _find(recs, C, event="deliver", src=B, seq=2)
    _move_after(recs, i, j)


def break_virtual_synchrony(recs: Records) -> None:
    """A delivers the last ordered message of the first view only after installing the second (tagged the first)."""
    first_view = recs[0]["view"]
    last = max(k for k, r in enumerate(recs)
               if r["node"] == A and r["event"] == "deliver" and r["view"] == first_view and r.get("ts") is not None)
    install = next(k for k, r in enumerate(recs) if r["node"] == A and r["event"] == "view" and r["view"] != first_view)
    _move_after(recs, last, install)


def break_atomicity(recs: Records) -> None:
    """B tags an ordered delivery of the first view with the second view, though it is delivered in place."""
    second_view = next(r["view"] for r in recs if r["event"] == "view" and r["view"] != recs[0]["view"])
    first_view = recs[0]["view"]
    mine = [k for k, r in enumerate(recs) if r["node"] == B and r["event"] == "deliver" and r["view"] == first_view]
    ordered = [k for k in mine if recs[k].get("ts") is not None]
    # The last ordered delivery, and the last of its source in the view, so total and source order stay whole.
    i = next(k for k in reversed(ordered) if all(recs[j]["src"] != recs[k]["src"] for j in mine if j > k))
    recs[i] = recs[i] | {"view": second_view}


def break_k_resilience(recs: Records) -> None:
    """C delivers a safe message claiming only one holder."""
    i = _find(recs, C, event="deliver", qos="safe")
    recs[i] = recs[i] | {"holders": 1}


def break_unique_view_id(recs: Records) -> None:
    """B installs the second view with the members in another order."""
    i = next(k for k, r in enumerate(recs) if r["node"] == B and r["event"] == "view" and r["ts"] != 0)
    recs[i] = recs[i] | {"members": list(reversed(recs[i]["members"]))}


def break_scmp(recs: Records) -> None:
    """A accepts the same (connection, message timestamp) twice."""
    i = _find(recs, A, event="scmp")
    recs.insert(i + 1, dict(recs[i]))


def _first_resent(recs: Records, node: str) -> int:
    """Index of ``node``'s first delivery record of a copy the group dropped as a duplicate."""
    return next(k for k, r in enumerate(recs) if r["node"] == node and r["event"] == "deliver" and r.get("duplicates"))


def _deliver_resent(recs: Records, node: str) -> str:
    """``node`` delivers the first copy the group dropped (its record names the key as delivered); returns the key."""
    i = _first_resent(recs, node)
    (key,) = recs[i]["duplicates"]
    recs[i] = {k: v for k, v in recs[i].items() if k not in ("duplicates", "parts")} | {"keys": [key]}
    return key


def break_exactly_once(recs: Records) -> None:
    """Every member delivers a resent copy of a key it delivered before: the key is at two positions of the order,
    and each member delivered it twice."""
    for node in NODES:
        _deliver_resent(recs, node)


def one_member_delivers_a_key_twice(recs: Records) -> None:
    """C alone delivers a resent copy the others dropped."""
    _deliver_resent(recs, C)


def key_at_two_positions(recs: Records) -> None:
    """A delivers a key's first copy and drops its resent one; B and C drop the first and deliver the resent one.
    Nobody delivers the key twice, but the group's order holds it at two positions."""
    for node in (B, C):
        key = _deliver_resent(recs, node)
        i = next(k for k, r in enumerate(recs) if r["node"] == node and r.get("keys") == [key])
        recs[i] = recs[i] | {"keys": [], "duplicates": [key], "parts": 0}


def abort_a_proposal(recs: Records) -> None:
    """Before the view change, another New List was proposed at the same timestamp and aborted: a proposal nobody
    installed is not an ordering decision (a reformation may abort after members acknowledged it), so all holds."""
    real = next(r for r in recs if r.get("packet") == "new_list")
    creator, _, counter = real["new_view"].rpartition("/")
    ghost = {"new_view": f"{creator}/{int(counter) + 7}", "members": real["members"][:-1]}
    first = next(k for k, r in enumerate(recs) if r.get("packet") == "new_list")
    proposals = [r | ghost for r in recs if r.get("packet") == "new_list" and r["new_view"] == real["new_view"]]
    recs[first:first] = proposals


def split_after_an_ack(recs: Records) -> None:
    """The last view splits: C, its token site, orders and delivers a message of its own with an ACK nobody else
    hears, and reforms alone; A and B reform without it and put their New List at the slot C's ACK took.  The
    slot holds two things, but for processes that went on to different views, which the paper's total order
    allows: A and B agree with each other, and C delivered nothing they delivered in another order."""
    a, b, c = NODES
    view = recs[-1]["view"]
    group = recs[-1]["group"]
    last = max(r["ts"] for r in recs if r["view"] == view and r["event"] == "token")
    seq = 1 + max(r["seq"] for r in recs if r["event"] == "send" and r.get("packet") == "data" and r["src"] == c)
    counter = view.rpartition("/")[2]
    ours, theirs = f"{a}/{int(counter) + 1}", f"{c}/{int(counter) + 2}"
    base = recs[-1] | {"ts": None, "src": None, "seq": None, "qos": None}
    for key in ("conn", "msg_ts", "accepted"):
        base.pop(key, None)
    recs += [
        base | {"node": c, "event": "send", "packet": "data", "src": c, "seq": seq, "qos": "total"},
        base | {"node": c, "event": "send", "packet": "ack", "ts": last + 1, "src": c, "next": a,
                "orders": [[c, seq, "total"]]},
        base | {"node": c, "event": "deliver", "ts": last + 2, "src": c, "seq": seq, "qos": "total", "size": 100,
                "holders": 1},
        base | {"node": c, "event": "send", "packet": "new_list", "ts": last + 3, "src": c, "next": c,
                "orders": [], "members": [c], "new_view": theirs},
        base | {"node": c, "event": "view", "view": theirs, "ts": last + 3, "members": [c]},
    ]
    new_list = {"packet": "new_list", "ts": last + 1, "src": a, "next": b, "orders": [], "members": [a, b],
                "new_view": ours}
    recs += [
        base | {"node": a, "event": "send"} | new_list,
        base | {"node": b, "event": "recv"} | new_list,
        base | {"node": a, "event": "view", "view": ours, "ts": last + 1, "members": [a, b]},
        base | {"node": b, "event": "view", "view": ours, "ts": last + 1, "members": [a, b]},
    ]
    assert all(r["group"] == group for r in recs)


def ordered_again_after_a_cut(recs: Records) -> None:
    """As ``split_after_an_ack``, with C's message keyed; A and B, who hold it, order and deliver it again in their
    new view (a survivor's message is ordered again after the New List).  One send at two slots, each member
    delivering it once: the key is delivered once, at one position of each member's order."""
    before = len(recs)
    split_after_an_ack(recs)
    key = f"{recs[-1]['group']}:cut".encode().hex()
    sent, delivered = before, before + 2  # C's data send and its delivery, as split_after_an_ack appends them
    assert recs[sent]["packet"] == "data" and recs[delivered]["event"] == "deliver"
    recs[sent] = recs[sent] | {"keys": [key]}
    recs[delivered] = recs[delivered] | {"keys": [key]}
    ours, at = recs[-1]["view"], recs[-1]["ts"] + 1
    recs += [recs[delivered] | {"node": node, "view": ours, "ts": at, "order_view": ours} for node in (A, B)]


def new_list_on_a_delivered_slot(recs: Records) -> None:
    """The first New List is placed at the last slot that ordered data, which every member delivered before
    installing it: a member would take one slot for two things."""
    first_view = recs[0]["view"]
    last_data = max(r["ts"] for r in recs if r["event"] == "deliver" and r["view"] == first_view and r.get("ts"))
    new_view = next(r["new_view"] for r in recs if r.get("packet") == "new_list")
    for i, r in enumerate(recs):
        if r.get("new_view") == new_view or (r["event"] == "view" and r["view"] == new_view):
            recs[i] = r | {"ts": last_data}


VARIANTS: dict[str, Callable[[Records], None]] = {
    "clean-aborted-proposal": abort_a_proposal,
    "clean-split-after-an-ack": split_after_an_ack,
    "clean-keyed": lambda _: None,
    "clean-keyed-ordered-again-after-a-cut": ordered_again_after_a_cut,
}
"""Clean traces with something unusual in them that breaks nothing."""

BREAKERS: dict[str, Callable[[Records], None]] = {
    "one-order": break_one_order,
    "total-order": break_total_order,
    "no-duplicate": break_no_duplicate,
    "source-order": break_source_order,
    "virtual-synchrony": break_virtual_synchrony,
    "atomicity": break_atomicity,
    "k-resilience": break_k_resilience,
    "unique-view-id": break_unique_view_id,
    "scmp-at-most-once": break_scmp,
    "exactly-once": break_exactly_once,
}


MORE_BREAKERS: dict[str, tuple[str, Callable[[Records], None]]] = {
    "one-order-new-list": ("one-order", new_list_on_a_delivered_slot),
    "exactly-once-one-member": ("exactly-once", one_member_delivers_a_key_twice),
    "exactly-once-two-positions": ("exactly-once", key_at_two_positions),
}
"""Further ways to break an invariant: case name -> (the invariant broken, the change)."""

KEYED = ("clean-keyed", "clean-keyed-ordered-again-after-a-cut", "exactly-once", "exactly-once-one-member",
         "exactly-once-two-positions")
"""Cases written with keyed messages (``synth.Plan.keyed``); the others have none, as journals before keys."""


def write_case(root: Path, name: str, base: int, gz: bool = False, rotate: int = 0) -> Path:
    """Write case ``name`` (an invariant to break, a further breaker, or a clean variant) into ``root/name`` as
    group ``name``."""
    recs = clean(name, base, keyed=name in KEYED)
    change = BREAKERS.get(name) or VARIANTS.get(name) or MORE_BREAKERS.get(name, (None, None))[1]
    if change is not None:
        change(recs)
    out = root / name
    synth.write(str(out), iter(recs), gz=gz, rotate=rotate)
    return out
