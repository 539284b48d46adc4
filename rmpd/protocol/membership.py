"""Membership changes the token site makes for List Change Requests (RMP paper, section 4.3).

Pure rules, one table: given the current view and a request, what the New List holds and whether the request was
granted.  A join puts the newcomer directly after the token site (so it takes the token next and proves it is
there); a leave removes the member and frees its locks; a lock is granted only when nobody else holds it, and a
denied request still yields a New List, with the member list unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ids import ProcessId
from .packets import ListChangeRequest
from .view import View

OPS = ("join", "leave", "lock", "unlock")
MAX_LOCK = 1023
"""Locks 0-5 are the handler locks; 6..MAX_LOCK are general mutual-exclusion locks."""


@dataclass(frozen=True)
class Change:
    members: tuple[ProcessId, ...]
    unicast_only: frozenset[ProcessId]
    locks: tuple[tuple[int, ProcessId], ...]
    min_partition: int
    granted: bool
    changed: bool


def apply_change(view: View, request: ListChangeRequest, token_site: ProcessId) -> Change:
    """The view that answers ``request``, made at ``token_site``."""
    members = list(view.members)
    unicast_only = set(view.unicast_only)
    locks = dict(view.locks)
    min_partition = view.min_partition
    src, op, arg = request.src, request.op, request.arg
    granted = changed = False
    if op == "join":
        granted = True
        if src not in view:
            members.insert(members.index(token_site) + 1, src)
            if not request.multicast_capable:
                unicast_only.add(src)
            min_partition = max(min_partition, request.min_partition)
            changed = True
    elif op == "leave":
        if src in view and len(members) > 1:
            members.remove(src)
            unicast_only.discard(src)
            locks = {n: holder for n, holder in locks.items() if holder != src}
            granted = changed = True
    elif op == "lock" and arg is not None and arg <= MAX_LOCK and src in view:
        holder = locks.get(arg)
        granted = holder in (None, src)
        if holder is None:
            locks[arg] = src
            changed = True
    elif op == "unlock" and arg is not None and src in view and locks.get(arg) == src:
        del locks[arg]
        granted = changed = True
    return Change(tuple(members), frozenset(unicast_only), tuple(sorted(locks.items())), min_partition,
                  granted, changed)
