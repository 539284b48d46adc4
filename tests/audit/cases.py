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


def clean(group: str, base: int) -> Records:
    return list(synth.records(synth.Plan(group=group, view_base=base)))


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


def abort_a_proposal(recs: Records) -> None:
    """Before the view change, another New List was proposed at the same timestamp and aborted: a proposal nobody
    installed is not an ordering decision (a reformation may abort after members acknowledged it), so all holds."""
    real = next(r for r in recs if r.get("packet") == "new_list")
    creator, _, counter = real["new_view"].rpartition("/")
    ghost = {"new_view": f"{creator}/{int(counter) + 7}", "members": real["members"][:-1]}
    first = next(k for k, r in enumerate(recs) if r.get("packet") == "new_list")
    proposals = [r | ghost for r in recs if r.get("packet") == "new_list" and r["new_view"] == real["new_view"]]
    recs[first:first] = proposals


VARIANTS: dict[str, Callable[[Records], None]] = {"clean-aborted-proposal": abort_a_proposal}
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
}


def write_case(root: Path, name: str, base: int, gz: bool = False, rotate: int = 0) -> Path:
    """Write case ``name`` (an invariant to break, or ``clean``) into ``root/name`` as group ``name``."""
    recs = clean(name, base)
    change = BREAKERS.get(name) or VARIANTS.get(name)
    if change is not None:
        change(recs)
    out = root / name
    synth.write(str(out), iter(recs), gz=gz, rotate=rotate)
    return out
