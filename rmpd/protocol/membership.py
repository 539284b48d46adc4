"""Membership changes the token site makes for List Change Requests (RMP paper, section 4.3).

Pure rules, one table: given the current view and a request, what the New List holds and whether the request was
granted.  A join puts the newcomer directly after the token site (so it takes the token next and proves it is
there) and the view keeps the stricter minimum partition of the group's and the newcomer's, and the newcomer's
multicast TTL; a leave removes the member with its TTL and frees its locks; a lock is granted only when nobody else
holds it, and a denied request still yields a New List, with the member list unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .ids import ProcessId
from .packets import ListChangeRequest
from .reformation import required_partition
from .view import MAX_LOCK, View


class Op(StrEnum):
    """The membership operations a List Change Request asks for (on the wire: their names)."""

    JOIN = "join"
    LEAVE = "leave"
    LOCK = "lock"
    UNLOCK = "unlock"


OPS = tuple(op.value for op in Op)


@dataclass(frozen=True)
class Change:
    members: tuple[ProcessId, ...]
    unicast_only: frozenset[ProcessId]
    locks: tuple[tuple[int, ProcessId], ...]
    min_partition: int
    granted: bool
    changed: bool
    ttls: tuple[tuple[ProcessId, int], ...] = ()


@dataclass
class _Draft:
    """The view being made for one request: the rules below edit it."""

    members: list[ProcessId]
    unicast_only: set[ProcessId]
    locks: dict[int, ProcessId]
    min_partition: int
    ttls: dict[ProcessId, int]
    granted: bool = False
    changed: bool = False


def _join(draft: _Draft, view: View, request: ListChangeRequest, token_site: ProcessId) -> None:
    """A newcomer goes directly after the token site, so it takes the token next and proves it is there; a member
    asking again is granted without a change."""
    src = request.src
    draft.granted = True
    if src not in view:
        draft.members.insert(draft.members.index(token_site) + 1, src)
        if not request.multicast_capable:
            draft.unicast_only.add(src)
        draft.min_partition = _stricter(draft.min_partition, request.min_partition, len(draft.members))
        draft.ttls[src] = request.ttl
        draft.changed = True


def _stricter(group: int, joiner: int, new_size: int) -> int:
    """The group's minimum partition or the joiner's, whichever requires more members at the view's new size; the
    group's on a tie.  Majority (0) and a fixed N are not ordered as numbers (a max kept 1 over majority, so a
    member joining with the default dropped the group's majority), and neither is safe to lose: compare what each
    demands of the view being made."""
    if required_partition(joiner, new_size) > required_partition(group, new_size):
        return joiner
    return group


def _leave(draft: _Draft, view: View, request: ListChangeRequest, token_site: ProcessId) -> None:
    """A member leaves and its locks are freed; the last member cannot leave by a New List."""
    src = request.src
    if src in view and len(draft.members) > 1:
        draft.members.remove(src)
        draft.unicast_only.discard(src)
        draft.ttls.pop(src, None)
        draft.locks = {n: holder for n, holder in draft.locks.items() if holder != src}
        draft.granted = draft.changed = True


def _lock(draft: _Draft, view: View, request: ListChangeRequest, token_site: ProcessId) -> None:
    """Granted only when nobody else holds the lock (asking for one's own lock again is granted, unchanged)."""
    arg = request.arg
    if arg is not None and arg <= MAX_LOCK and request.src in view:
        holder = draft.locks.get(arg)
        draft.granted = holder in (None, request.src)
        if holder is None:
            draft.locks[arg] = request.src
            draft.changed = True


def _unlock(draft: _Draft, view: View, request: ListChangeRequest, token_site: ProcessId) -> None:
    """Only the holder frees a lock."""
    arg = request.arg
    if arg is not None and request.src in view and draft.locks.get(arg) == request.src:
        del draft.locks[arg]
        draft.granted = draft.changed = True


RULES: dict[str, Callable[[_Draft, View, ListChangeRequest, ProcessId], None]] = {
    Op.JOIN: _join, Op.LEAVE: _leave, Op.LOCK: _lock, Op.UNLOCK: _unlock,
}
"""Section 4.3 as a table: what each operation does to the view.  An unknown operation changes nothing and is not
granted; a denied request still yields a New List, with the member list unchanged."""


def apply_change(view: View, request: ListChangeRequest, token_site: ProcessId) -> Change:
    """The view that answers ``request``, made at ``token_site``."""
    draft = _Draft(list(view.members), set(view.unicast_only), dict(view.locks), view.min_partition, dict(view.ttls))
    rule = RULES.get(request.op)
    if rule is not None:
        rule(draft, view, request, token_site)
    return Change(tuple(draft.members), frozenset(draft.unicast_only), tuple(sorted(draft.locks.items())),
                  draft.min_partition, draft.granted, draft.changed, tuple(sorted(draft.ttls.items())))
