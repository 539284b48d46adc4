"""Fault recovery: the reformation protocol (RMP paper, section 4.4).

A member that retries an acknowledged action ``fail_retries`` times suspects a failure and becomes an initiator.
Phase one polls the old view's members with Recovery Start (repeated) and collects Recovery Votes carrying each
member's sync point: its highest consecutive timestamp and, per source, its highest consecutive sequence number.
The highest sync point seen is forwarded in later polls, and members behind it NACK until they reach it.  Once every
candidate (or all but one, or every one that can make progress) is at the shared sync point, the initiator checks
the minimum partition size and, phase two, commits the new view with a two-phase commit: the New List goes to every
member of the new list, each answers Recovery ACK New List, and only then the initiator commits, takes the token and
passes it with an ACK in the new view; the members commit the New List they hold when they see that ACK (or any
packet of the new view).  Everything beyond the sync point is dropped and ordered again, so members that stay
never deliver two orders.

Versions order competing reformations: (version, initiator) pairs, compared lexicographically; a member joins only
a reformation higher than any it has seen, one at a time, and answers lower ones with Recovery Abort.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .context import GroupContext
from .ids import ProcessId, ViewCounter, ViewId
from .packets import (
    NewList,
    Packet,
    RecoveryAbort,
    RecoveryAckNewList,
    RecoveryStart,
    RecoveryVote,
)

SUPERSEDED = "superseded"
SUPERSEDED_REASON = "superseded by a higher reformation"
"""Reason a member gives when it rejects a reformation because it has seen a higher one."""

MIN_PARTITION_MAJORITY = 0
"""``min_partition`` value meaning: a majority of the old view must remain."""
MIN_PARTITION_ALL = 0xFFFF
"""``min_partition`` value meaning: every member of the old view must remain (any failure stops the group)."""


def required_partition(min_partition: int, old_size: int) -> int:
    if min_partition == MIN_PARTITION_MAJORITY:
        return old_size // 2 + 1
    if min_partition >= MIN_PARTITION_ALL:
        return old_size
    return min(min_partition, old_size)


SyncPoint = tuple[int, dict[ProcessId, int]]


def at_least(point: SyncPoint, target: SyncPoint) -> bool:
    ts, seqs = point
    target_ts, target_seqs = target
    return ts >= target_ts and all(seqs.get(src, 0) >= seq for src, seq in target_seqs.items())


def merge(a: SyncPoint, b: SyncPoint) -> SyncPoint:
    seqs = dict(a[1])
    for src, seq in b[1].items():
        if seq > seqs.get(src, 0):
            seqs[src] = seq
    return max(a[0], b[0]), seqs


@dataclass
class Participation:
    """This member takes part in someone's reformation."""

    initiator: ProcessId
    version: int
    target: SyncPoint
    deadline: float
    new_list: NewList | None = None


@dataclass
class Initiation:
    """This member runs a reformation."""

    version: int
    candidates: tuple[ProcessId, ...]
    shared: SyncPoint
    votes: dict[ProcessId, SyncPoint] = field(default_factory=dict)
    deadline: float = 0.0
    rounds: int = 0
    stale_rounds: int = 0
    new_list: NewList | None = None
    acks: set[ProcessId] = field(default_factory=set)
    commit_rounds: int = 0
    progress: object = None


class Rng(Protocol):
    """The randomness the engine needs, passed in (a ``random.Random`` will do)."""

    def random(self) -> float: ...


class ReformationHost(Protocol):
    """What a reformation needs from the member it runs at."""

    departed: bool

    def sync_point(self) -> SyncPoint: ...

    def catch_up(self, target: SyncPoint, now: float) -> None:
        """NACK, to anyone, whatever separates this member from ``target``."""

    def freeze(self) -> None:
        """Stop the token and the timers that would suspect failures: the view is being reformed."""

    def unfreeze(self, now: float) -> None: ...

    def depart(self, now: float) -> None:
        """Out of the group (a New List removing this member is ordered)."""

    def stop(self, now: float, reason: str) -> None:
        """Leave the group for good after a failure this member cannot repair."""

    def reformed(self, nl: NewList, initiator: bool, now: float) -> None:
        """Install a reformation's New List: drop what lies beyond its sync point, go on in the new view."""

    def new_list_fields(self) -> tuple[tuple[tuple[ProcessId, int], ...], int]:
        """What a reformation's New List carries of the group's join admission: (requests done, join floor)."""

    def recently_heard(self, member: ProcessId, now: float) -> bool:
        """``member`` spoke in a view we know lately: it is alive, though it has not voted (yet)."""


class Reformation:
    """Suspecting failures and reforming the view, at one member."""

    def __init__(self, ctx: GroupContext, rng: Rng, view_counter: ViewCounter, host: ReformationHost) -> None:
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, ctx.config, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.rng, self.view_counter, self.host = rng, view_counter, host
        self.version_seen: tuple[int, ProcessId] = (0, "")
        self.version_view: ViewId | None = None
        """The view ``version_seen`` was counted in."""
        self.participation: Participation | None = None
        self.initiation: Initiation | None = None
        self.restart_deadline: float | None = None
        self.minority_attempts = 0
        self.minority_found: int | None = None
        """The members the last proposal found when it fell below the minimum partition; None once one did not."""
        self.failed_reformations = 0

    @property
    def frozen(self) -> bool:
        """While a reformation runs (or waits to restart) the token stands still."""
        return self.participation is not None or self.initiation is not None or self.restart_deadline is not None

    @property
    def awaiting_commit(self) -> bool:
        """This member acknowledged a reformation's New List and waits for a packet of the new view to show that the
        initiator committed it (``committed_by``)."""
        return self.participation is not None and self.participation.new_list is not None

    @property
    def deadline(self) -> float | None:
        if self.participation is None and self.initiation is None:
            return self.restart_deadline  # the common case: no reformation under way
        deadlines = [d for d in (
            self.participation.deadline if self.participation else None,
            self.initiation.deadline if self.initiation else None,
            self.restart_deadline,
        ) if d is not None]
        return min(deadlines) if deadlines else None

    def stop(self) -> None:
        """This member leaves the group: no reformation runs here any more."""
        self.restart_deadline = None
        self.initiation = None
        self.participation = None

    def _multicast(self, packet: Packet, now: float) -> None:
        self.outbox.multicast(packet, now)

    def _unicast(self, dest: ProcessId, packet: Packet, now: float) -> None:
        self.outbox.unicast(dest, packet, now)

    def _record(self, event: str, now: float, **fields: object) -> None:
        self.outbox.record(event, now, **fields)

    @property
    def _view_id(self) -> ViewId:
        return self.views.current.view_id

    # ------------------------------------------------------------------------------------------------------------

    def suspect_failure(self, now: float, why: str) -> None:
        """Retries ran out: someone is gone.  Start a reformation unless one is already running."""
        if self.frozen or self.host.departed:
            return
        if self.pid not in self.views.current:
            # A New List removing us is ordered (we asked to leave); what we sent is ordered too.  Go.
            self.host.depart(now)
            return
        self.stats["failures_suspected"] += 1
        self.stats["suspected_" + why] += 1
        self._start(now)

    def _seen(self) -> tuple[int, ProcessId]:
        """The highest reformation (version, initiator) seen in the current view.  Versions order the reformations
        of one view, and a Recovery Start counts only in its own view; a view installed since starts them afresh,
        so a member that joined later, whose count starts at zero, is not refused for counts the others kept."""
        if self.version_view != self._view_id:
            self.version_view = self._view_id
            self.version_seen = (0, "")
        return self.version_seen

    def _start(self, now: float) -> None:
        version = self._seen()[0] + 1
        self.version_seen = (version, self.pid)
        self.participation = None
        self.restart_deadline = None
        point = self.host.sync_point()
        self.initiation = Initiation(version, self.views.current.members, point, {self.pid: point})
        self.host.freeze()
        self.stats["reformations_started"] += 1
        self._record("recovery", now, version=version, role="initiator")
        self._round(now)

    def _round(self, now: float) -> None:
        init = self.initiation
        assert init is not None
        interval = self.config.recovery_interval
        init.deadline = now + interval
        patience = self.config.recovery_patience
        if init.new_list is not None:  # phase two: waiting for Recovery ACK New List from every new member
            init.commit_rounds += 1
            if init.commit_rounds > patience:
                self._abort_initiation(now, "members did not acknowledge the new list")
                return
            self._multicast(init.new_list, now)
            return
        mine = self.host.sync_point()
        init.votes[self.pid] = mine
        shared = init.shared
        for point in init.votes.values():
            shared = merge(shared, point)
        synced = [m for m in init.candidates if m in init.votes and at_least(init.votes[m], shared)]
        progress = (shared, len(synced), len(init.votes))
        if progress != init.progress:  # a higher sync point, or more members at it, or more voters
            init.progress = progress
            init.shared = shared
            init.stale_rounds = 0
        else:
            init.stale_rounds += 1
        init.rounds += 1
        me_synced = self.pid in synced
        if not me_synced:
            self.host.catch_up(shared, now)
            if init.stale_rounds >= patience:
                self._abort_initiation(now, "initiator cannot reach the shared sync point")
                return
        complete = len(synced) == len(init.candidates)
        # Every voter at the sync point and the other candidates silent through three Recovery Starts: they are
        # gone.  One silent candidate is the common case (a crash); with more, two quiet rounds first.  A voter
        # still behind is alive and catching up: it is waited for, until recovery_patience runs out.
        silent = len(init.candidates) - len(init.votes)
        # A candidate that has not voted but was heard lately is alive (a busy or lossy path): never settle without
        # it, and rather than propose without it when stuck, give this reformation up and try again.
        alive_silent = any(self.host.recently_heard(m, now) for m in init.candidates if m not in init.votes)
        settled = (len(synced) == len(init.votes) and init.rounds >= 3 and (silent <= 1 or init.stale_rounds >= 2)
                   and not alive_silent)
        stuck = init.stale_rounds >= patience
        if me_synced and stuck and alive_silent and not complete:
            self._abort_initiation(now, "members heard lately did not vote")
            return
        if me_synced and (complete or settled or stuck):
            self._propose(synced, now)
            return
        self._multicast(RecoveryStart(self._view_id, self.pid, init.version, init.candidates, shared[0],
                                      tuple(shared[1].items())), now)

    def _propose(self, synced: list[ProcessId], now: float) -> None:
        init = self.initiation
        assert init is not None
        old = self.views.current
        needed = self.minimum_partition()
        if len(synced) < needed:
            self._abort_initiation(now, f"partition of {len(synced)} is below the minimum of {needed}")
            self.minority_attempts += 1
            self.minority_found = len(synced)
            if self.minority_attempts >= self.config.minority_attempts:
                self.stats["minority_stops"] += 1
                self._stop(now, f"partition of {len(synced)} below the minimum of {needed}")
            return
        self.minority_attempts = 0
        self.minority_found = None
        self.failed_reformations = 0
        view_id = self.view_counter.next_view_id(now)
        if view_id is None:
            init.deadline = now + 0.001
            return
        members = tuple(m for m in old.members if m in synced)
        locks = tuple((n, holder) for n, holder in old.locks if holder in members)
        sync_ts = init.shared[0]
        done, join_floor = self.host.new_list_fields()
        init.new_list = NewList(
            old.view_id, self.pid, sync_ts + 1, self.pid, self.group, view_id,
            tuple((m, m not in old.unicast_only) for m in members), (), done,
            locks, old.min_partition, None, init.version, True, None, join_floor,
            tuple((m, ttl) for m, ttl in old.ttls if m in members),
        )
        init.acks = {self.pid}
        self._record("recovery", now, version=init.version, role="propose", members=list(members))
        if len(members) == 1:
            self.commit(init.new_list, now)
            return
        self._multicast(init.new_list, now)

    def names(self, src: ProcessId, seq: int) -> bool:
        """Does the sync point of the reformation under way (the one this member runs, or takes part in) name
        packet ``seq`` of ``src``: a packet some member holds, which every member must hold to reach it."""
        point = self.initiation.shared if self.initiation is not None else (
            self.participation.target if self.participation is not None else None)
        return point is not None and seq <= point[1].get(src, 0)

    def minimum_partition(self) -> int:
        """How many members of the old view a new view needs (the group's ``min_partition`` rule)."""
        view = self.views.current
        return required_partition(view.min_partition, view.size)

    def _abort_initiation(self, now: float, reason: str) -> None:
        init = self.initiation
        assert init is not None
        self.stats["reformations_aborted"] += 1
        self._record("recovery", now, version=init.version, role="abort", reason=reason)
        self._multicast(RecoveryAbort(self._view_id, self.pid, init.version, reason[:200]), now)
        self.initiation = None
        self.failed_reformations += 1
        if self.failed_reformations >= self.config.reformation_attempts and reason != SUPERSEDED_REASON:
            self._stop(now, f"no reformation succeeded in {self.failed_reformations} attempts ({reason})")
            return
        self._schedule_restart(now)

    def _schedule_restart(self, now: float) -> None:
        low, high = self.config.recovery_backoff
        self.restart_deadline = now + low + (high - low) * self.rng.random()

    def _stop(self, now: float, reason: str) -> None:
        """Leave the group for good after a failure this process cannot repair; it may join again as new.  A
        partition smaller than the group's minimum stops this way: it must not order anything on its own."""
        self.stop()
        self.host.stop(now, reason)

    # ------------------------------------------------------------------------------------------------------------
    # Packets

    def on_packet(self, packet: Packet, now: float) -> None:
        handler = self._HANDLERS.get(type(packet))
        if handler is not None:
            handler(self, packet, now)

    def _on_vote(self, vote: RecoveryVote, now: float) -> None:
        init = self.initiation
        if init is not None and vote.version == init.version and vote.src in init.candidates:
            init.votes[vote.src] = (vote.sync_ts, dict(vote.sync_seqs))

    def _on_ack_new_list(self, ack: RecoveryAckNewList, now: float) -> None:
        init = self.initiation
        if init is not None and init.new_list is not None and ack.version == init.version and (
                ack.new_view == init.new_list.new_view):
            init.acks.add(ack.src)
            if init.acks >= {m for m, _ in init.new_list.members}:
                self.commit(init.new_list, now)

    def _on_start(self, start: RecoveryStart, now: float) -> None:
        if start.view != self._view_id or self.pid not in start.members or self.host.departed:
            return
        key = (start.version, start.src)
        if key < self._seen():
            self._unicast(start.src, RecoveryAbort(self._view_id, self.pid, start.version, SUPERSEDED), now)
            return
        if key > self.version_seen:
            if self.initiation is not None:
                self._abort_initiation(now, SUPERSEDED_REASON)
            self.version_seen = key
            self.restart_deadline = None
            self.participation = Participation(start.src, start.version, (start.sync_ts, dict(start.sync_seqs)),
                                               now)
            self.host.freeze()
            self._record("recovery", now, version=start.version, role="member", initiator=start.src)
        part = self.participation
        if part is None or (part.initiator, part.version) != (start.src, start.version):
            return
        part.target = (start.sync_ts, dict(start.sync_seqs))
        part.deadline = now + self.config.recovery_interval * self.config.recovery_patience
        mine = self.host.sync_point()
        if not at_least(mine, part.target):
            self.host.catch_up(part.target, now)
        self._unicast(start.src, RecoveryVote(self._view_id, self.pid, start.version, mine[0],
                                              tuple(mine[1].items())), now)

    def on_new_list(self, nl: NewList, now: float) -> bool:
        """A reformation's New List (phase one of the commit): hold it and acknowledge.  True when handled."""
        part = self.participation
        if part is None or nl.src != part.initiator or nl.request_id != part.version:
            return False
        if self.pid not in (m for m, _ in nl.members):
            return True
        part.new_list = nl
        part.deadline = now + self.config.recovery_interval * self.config.recovery_patience
        self._unicast(nl.src, RecoveryAckNewList(self._view_id, self.pid, part.version, nl.new_view), now)
        return True

    def _on_abort(self, abort: RecoveryAbort, now: float) -> None:
        """An initiator gave its reformation up, or (``SUPERSEDED``) a member refused ours.  The second kind is no
        news about the refusing member's own reformation, even under the same version number: a member taking
        part in it must not drop out on it."""
        part = self.participation
        if (part is not None and abort.src == part.initiator and abort.version == part.version
                and abort.reason != SUPERSEDED):
            self.participation = None
            self._schedule_restart(now)
        init = self.initiation
        if init is not None and abort.version == init.version and abort.reason == SUPERSEDED:
            self._abort_initiation(now, "a member saw a higher reformation")

    _HANDLERS: dict[type, Callable[[Reformation, Any, float], None]] = {
        RecoveryStart: _on_start, RecoveryVote: _on_vote, RecoveryAckNewList: _on_ack_new_list,
        RecoveryAbort: _on_abort,
    }

    def committed_by(self, view: ViewId | None) -> NewList | None:
        """The New List we acknowledged, when a packet of its new view shows the initiator committed it."""
        part = self.participation
        if part is not None and part.new_list is not None and view == part.new_list.new_view:
            return part.new_list
        return None

    def on_timer(self, now: float) -> None:
        init = self.initiation
        if init is not None and now >= init.deadline:
            self._round(now)
        part = self.participation
        if part is not None and now >= part.deadline:
            self.participation = None  # the initiator went quiet: try ourselves
            self._start(now)
        if self.restart_deadline is not None and now >= self.restart_deadline:
            self.restart_deadline = None
            if self.initiation is None and self.participation is None:
                self._start(now)

    def commit(self, nl: NewList, now: float) -> None:
        """Phase two: the new view is agreed; the member installs it (``ReformationHost.reformed``)."""
        self.initiation = None
        self.participation = None
        self.restart_deadline = None
        self.stats["reformations"] += 1
        self.host.reformed(nl, nl.src == self.pid, now)
