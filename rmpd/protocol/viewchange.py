"""Membership changes at one member (section 4.3): List Change Requests, the New Lists that answer them, join
admission (SCMP) and leaving.

A member asks the token site for a change with a List Change Request, resent until a New List answers it.  The
token site answers the oldest pending request with a New List made by the rules of ``membership.py`` and passes the
token with it.  A join request is a first-contact packet: the group's connection table (``requests_done``, carried
in every New List) and its join floor decide it, as SCMP's filter decides a call (docs/protocol.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from .context import GroupContext
from .events import LockResult
from .ids import ProcessId, ViewCounter
from .keys import KeyTable
from .membership import Op, apply_change
from .ordering import Ordering
from .packets import CallStatus, ListChangeRequest, NewList, NonMemberAck
from .relay import CallRelay
from .timers import Backoff


class ViewChanges:
    """Requests waiting at a token site, this member's own requests, and its leave."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, relay: CallRelay, keys: KeyTable, *,
                 view_counter: ViewCounter, request_ids: Iterator[int] | None, join_floor: int,
                 joined_by: NewList | None) -> None:
        """``join_floor``: this member's own bound for join requests from processes the group has no entry for
        (see ``join_admissible``); the group's, carried in every New List, is taken too when it is higher.
        ``keys``: whether the group carried keyed messages, which a New List that admits a process says."""
        config = ctx.config
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, config, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.ordering, self.relay, self.view_counter, self.keys = ordering, relay, view_counter, keys
        self.apply_change = apply_change
        """The membership rules (membership.py) a token site applies."""
        self.pending: dict[tuple[ProcessId, int], ListChangeRequest] = {}
        """Requests waiting for the token site, oldest first."""
        self.requests_done: dict[ProcessId, int] = {}
        """The highest request ID served per requester: the join requests' SCMP connection table."""
        self.mine: dict[int, ListChangeRequest] = {}
        """This process's own requests not yet answered by a New List (resent on ``timer``)."""
        self.answered: dict[int, ListChangeRequest] = {}
        """This process's own requests whose New List is not yet delivered."""
        self.request_ids = request_ids or itertools.count(1)
        """Shared with the process: request IDs only grow, across joins and groups."""
        self.timer = Backoff(config.request_interval, config.rto_max)
        self.leaving = False
        self.merging = False
        """This member's view merges into another (``Liveness``): joiners are left to that view."""
        self.join_floor = max(join_floor, joined_by.join_floor if joined_by is not None else 0)
        """SCMP ``upper`` for join requests: ``requests_done`` is their connection table (docs/protocol.md)."""
        if joined_by is not None:
            self.requests_done.update(joined_by.done)

    # ------------------------------------------------------------------------------------------------------------
    # At the token site

    def on_request(self, request: ListChangeRequest, now: float) -> bool:
        """Keep a request for when this member holds the token.  True for a join from a member of the view: a new
        incarnation of that process (a process ID is never reused by a live membership, so its old membership
        ended; docs/protocol.md, "Incarnations")."""
        view = self.views.current
        if request.request_id <= self.requests_done.get(request.src, 0):
            self.stats["requests_repeated"] += 1
            self._answer_repeated(request, now)
            return False
        if request.op == Op.JOIN and self.merging:
            self.stats["joins_left_to_merge"] += 1
            return False
        if request.op != Op.JOIN and request.src not in view:
            self.stats["non_member"] += 1
            return False
        if request.op == Op.JOIN:  # only a joiner's newest request counts: it may have given the older ones up
            for key in [k for k, r in self.pending.items() if r.src == request.src and r.op == Op.JOIN
                        and r.request_id < request.request_id]:
                del self.pending[key]
            if any(r.src == request.src and r.op == Op.JOIN for r in self.pending.values()):
                return False  # a newer one is waiting already
        self.pending.setdefault((request.src, request.request_id), request)
        return request.op == Op.JOIN and request.src in view

    def _answer_repeated(self, request: ListChangeRequest, now: float) -> None:
        """A joiner that missed its New List asks again: the New List's sender unicasts it once more."""
        for slot in self.ordering.q.slots.values():
            nl = slot.packet
            if (isinstance(nl, NewList) and nl.src == self.pid and nl.request_src == request.src
                    and nl.request_id == request.request_id):
                self.outbox.unicast(request.src, nl, now)
                return

    def next_new_list(self, now: float) -> NewList | bool | None:
        """As token site, the New List answering the oldest pending request: None when no request is pending,
        False when one is but no new view ID may be made yet (at most one per ms of uptime: try on the next tick).
        """
        view = self.views.current
        while self.pending:
            key, request = next(iter(self.pending.items()))
            if request.request_id <= self.requests_done.get(request.src, 0) or (
                    request.op != Op.JOIN and request.src not in view):
                del self.pending[key]
                continue
            self._collect_requests_done(now)
            if request.op == Op.JOIN and not self.join_admissible(request, now):
                del self.pending[key]
                continue
            replaces = request.op == Op.JOIN and request.src in view
            if replaces:  # a new incarnation: remove the old one first; the join is answered at a later pass
                self.stats["incarnations_replaced"] += 1
                change = self.apply_change(view, replace(request, op=Op.LEAVE), self.pid)
            else:
                change = self.apply_change(view, request, self.pid)
            view_id = view.view_id
            if change.changed:
                fresh = self.view_counter.next_view_id(now)
                if fresh is None:
                    return False
                view_id = fresh
            members = change.members
            # Removing an old incarnation admits nobody: the token stays within the view this New List makes (the
            # new incarnation, not yet a member, would never confirm a pass to its process ID).
            admits = request.op == Op.JOIN and change.changed and not replaces
            if admits:
                next_site = request.src
            elif self.pid in members:
                next_site = members[(members.index(self.pid) + 1) % len(members)]
            else:  # the token site itself leaves: the token goes to the member after it
                old = view.members
                i = old.index(self.pid)
                next_site = next(old[(i + k) % len(old)] for k in range(1, len(old)) if old[(i + k) % len(old)]
                                 in members)
            done = dict(self.requests_done)
            if not replaces:
                done[request.src] = request.request_id
            seqs = dict(self.ordering.ordered_upto)
            if admits:
                seqs[request.src] = request.arg or 0  # a (re)joiner's messages start after this
            brings_keys = admits and request.keys_position > 0
            if brings_keys:
                self.keys.carry()  # this view's later joiners wait for the group's table, with these keys
            return NewList(
                view.view_id, self.pid, self.ordering.q.high + 1, next_site, self.group, view_id,
                tuple((m, m not in change.unicast_only) for m in members),
                tuple(seqs.items()), tuple(done.items()), change.locks, change.min_partition,
                None if replaces else request.src, None if replaces else request.request_id, change.granted, None,
                self.join_floor, change.ttls, self.keys.in_use, brings_keys,
            )
        return None

    def join_admissible(self, request: ListChangeRequest, now: float) -> bool:
        """SCMP for a join request at the token site; a refused joiner is told, and asks again under a new ID.

        A join request is a first-contact packet: its request ID is its sender's clock in ms times 1000 (plus a
        counter), and ``requests_done`` is the connection table, carried in every New List.  A requester the table
        knows is judged by it (``next_new_list``).  One it does not know is refused when stamped at or below the
        group's join floor (a replay of a join some earlier incarnation of the group accepted, or a late one) or
        more than ``ahead_ms`` after this site's clock or, with stable storage, after its ``latest`` (so every
        accepted stamp is bounded by some member's clock, which is what the floor relies on).
        """
        stamp = request.request_id // 1000
        if stamp > self.relay.newest_stamp(now):
            self.stats["joins_refused_too_early"] += 1
        elif stamp <= self.join_floor:
            self.stats["joins_refused_summary"] += 1
        else:
            return True
        self.outbox.unicast(request.src, NonMemberAck(self.views.current.view_id, self.pid, 0, request.request_id,
                                                      CallStatus.JOIN_REFUSED, None), now)
        return False

    def _collect_requests_done(self, now: float) -> None:
        """SCMP garbage collection of the join table: a process outside the view whose last request is older than
        the lifetime estimate leaves ``requests_done``, and the join floor rises to that request's stamp, so its
        old requests stay refused while the table (carried in every New List) stays the size of the group."""
        horizon = self.relay.lifetime_horizon(now)
        for src, request_id in list(self.requests_done.items()):
            if request_id // 1000 <= horizon and src not in self.views.current:
                del self.requests_done[src]
                self.join_floor = max(self.join_floor, request_id // 1000)

    # ------------------------------------------------------------------------------------------------------------
    # New Lists

    def new_list_placed(self, nl: NewList) -> None:
        """A New List entered the OrderingQ: the request it answers is served."""
        self.join_floor = max(self.join_floor, nl.join_floor)
        if nl.request_src is None or nl.request_id is None:
            return
        if nl.request_id > self.requests_done.get(nl.request_src, 0):
            self.requests_done[nl.request_src] = nl.request_id
        self.pending.pop((nl.request_src, nl.request_id), None)
        answered_mine = nl.request_src == self.pid and self.mine.pop(nl.request_id, None) is not None
        if answered_mine and not self.mine:
            self.timer.stop()

    def new_list_delivered(self, nl: NewList) -> None:
        """The New List is delivered: a lock or unlock of ours gets its answer, in order."""
        if nl.request_src != self.pid or nl.request_id is None:
            return
        request = self.answered.pop(nl.request_id, None)
        if request is not None and request.op in (Op.LOCK, Op.UNLOCK) and request.arg is not None:
            self.outbox.event(LockResult(self.group, request.arg, request.op, nl.granted))

    # ------------------------------------------------------------------------------------------------------------
    # This member's own requests

    def issue(self, op: str, arg: int | None, now: float) -> int:
        request_id = next(self.request_ids)
        request = ListChangeRequest(self.group, self.views.current.view_id, self.pid, request_id, op, arg, True, 1,
                                    1)
        self.mine[request_id] = request
        self.answered[request_id] = request
        if self.timer.deadline is None:
            self.timer.start(now)
        self.outbox.multicast(request, now)
        self.on_request(request, now)
        return request_id

    def ask_again_if_lost(self, now: float) -> None:
        """Ask again, under a fresh number, for every change of ours that no New List will ever answer.

        A token site takes every request numbered at or below the highest it served from a process as done, so a
        request overtaken by a later one (lost, then resent after the later one was served) would be skipped; and a
        New List that answered us can be dropped by a reformation (it lay beyond the sync point).  Either way the
        request is neither waiting in ``mine`` under a live number nor answered by a New List in the OrderingQ.
        """
        placed = {slot.packet.request_id for slot in self.ordering.q.slots.values()
                  if isinstance(slot.packet, NewList) and slot.packet.request_src == self.pid}
        done = self.requests_done.get(self.pid, 0)
        lost = [request for request_id, request in self.answered.items()
                if request_id not in placed and (request_id not in self.mine or request_id <= done)]
        for request in lost:
            del self.answered[request.request_id]
            self.mine.pop(request.request_id, None)
            self.stats["requests_reissued"] += 1
            self.issue(request.op, request.arg, now)

    def begin_leaving(self) -> None:
        """The application asked to leave (or the view merges away): no more sends or calls are taken, and the
        leave is asked for once everything sent is ordered (``leave_wanted``)."""
        self.leaving = True

    def begin_merging(self) -> None:
        """This member's view merges into another: join requests are left to that view from now on."""
        self.merging = True

    def leave_wanted(self, sender_idle: bool) -> bool:
        """Leaving, everything sent is ordered, and no leave request is out yet: time to ask for it (so nothing
        this process accepted is lost)."""
        return self.leaving and sender_idle and not any(r.op == Op.LEAVE for r in self.answered.values())

    def resend(self, now: float) -> bool:
        """The request timer expired: resend what is unanswered; False when the timer is exhausted."""
        if self.timer.exhausted(self.config.fail_retries, now):
            self.timer.stop()
            return False
        if not self.mine:
            self.timer.stop()
            return True
        view_id = self.views.current.view_id
        for request in self.mine.values():
            self.stats["request_retransmits"] += 1
            resent = ListChangeRequest(request.group, view_id, request.src, request.request_id,
                                       request.op, request.arg, request.multicast_capable, request.min_partition,
                                       request.ttl)
            self.outbox.multicast(resent, now)
        self.timer.back_off(now)
        return True

    def unfreeze(self, now: float) -> None:
        if self.mine:
            self.timer.start(now)
