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

from dataclasses import dataclass, field
from itertools import islice

from .events import Left
from .ids import ProcessId
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
NACK_LIST = 256
"""Timestamps, and (source, sequence) pairs, one catch-up NACK asks for at most."""

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


class Reformation:
    """Mixin for GroupEngine: everything about suspecting failures and reforming the view."""

    # Set by GroupEngine.__init__: version_seen, participation, initiation, restart_deadline.

    @property
    def frozen(self) -> bool:
        """While a reformation runs (or waits to restart) the token stands still."""
        return self.participation is not None or self.initiation is not None or self.restart_deadline is not None

    def recovery_deadline(self) -> float | None:
        deadlines = [d for d in (
            self.participation.deadline if self.participation else None,
            self.initiation.deadline if self.initiation else None,
            self.restart_deadline,
        ) if d is not None]
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------------------------------------------------

    def suspect_failure(self, now: float, why: str) -> None:
        """Retries ran out: someone is gone.  Start a reformation unless one is already running."""
        if self.frozen or self.departed:
            return
        if self.pid not in self.view:
            # A New List removing us is ordered (we asked to leave); what we sent is ordered too.  Go.
            self._depart(now)
            return
        self.stats["failures_suspected"] += 1
        self.stats["suspected_" + why] += 1
        self._start_reformation(now)

    def sync_point(self) -> SyncPoint:
        seqs: dict[ProcessId, int] = {}
        sources = set(self.src_next) | set(self.ordered_upto) | {src for src, _ in self.data}
        for src in sorted(sources):  # sorted: set order of strings changes from run to run
            seq = self.src_next.get(src, 1) - 1
            while (src, seq + 1) in self.data:
                seq += 1
            if seq > 0:
                seqs[src] = seq
        return self.q.contig, seqs

    def _freeze(self) -> None:
        self.have_token = False
        self.accept_target = None
        self.pass_pending = None
        self.pass_timer.stop()
        self.null_deadline = None
        self.rto.stop()
        self.stall_deadline = None
        self.hint_deadline = None
        self.request_timer.stop()

    def _unfreeze(self, now: float) -> None:
        if self.outstanding:
            self.rto.start(now)
        if self.my_requests:
            self.request_timer.start(now)

    def _start_reformation(self, now: float) -> None:
        version = self.version_seen[0] + 1
        self.version_seen = (version, self.pid)
        self.participation = None
        self.restart_deadline = None
        point = self.sync_point()
        self.initiation = Initiation(version, self.view.members, point, {self.pid: point})
        self._freeze()
        self.stats["reformations_started"] += 1
        self._record("recovery", now, version=version, role="initiator")
        self._recovery_round(now)

    def _recovery_round(self, now: float) -> None:
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
        mine = self.sync_point()
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
            self._catch_up(shared, now)
            if init.stale_rounds >= patience:
                self._abort_initiation(now, "initiator cannot reach the shared sync point")
                return
        complete = len(synced) == len(init.candidates)
        # Every voter at the sync point and the other candidates silent through three Recovery Starts: they are
        # gone.  One silent candidate is the common case (a crash); with more, two quiet rounds first.  A voter
        # still behind is alive and catching up: it is waited for, until recovery_patience runs out.
        silent = len(init.candidates) - len(init.votes)
        settled = len(synced) == len(init.votes) and init.rounds >= 3 and (silent <= 1 or init.stale_rounds >= 2)
        stuck = init.stale_rounds >= patience
        if me_synced and (complete or settled or stuck):
            self._propose(synced, now)
            return
        self._multicast(RecoveryStart(self.view.view_id, self.pid, init.version, init.candidates, shared[0],
                                      tuple(shared[1].items())), now)

    def _propose(self, synced: list[ProcessId], now: float) -> None:
        init = self.initiation
        assert init is not None
        old = self.view
        needed = self._minimum_partition()
        if len(synced) < needed:
            self._abort_initiation(now, f"partition of {len(synced)} is below the minimum of {needed}")
            self.minority_attempts += 1
            if self.minority_attempts >= self.config.minority_attempts:
                self._stop_minority(now, len(synced), needed)
            return
        self.minority_attempts = 0
        self.failed_reformations = 0
        view_id = self.view_counter.next_view_id(now)
        if view_id is None:
            init.deadline = now + 0.001
            return
        members = tuple(m for m in old.members if m in synced)
        locks = tuple((n, holder) for n, holder in old.locks if holder in members)
        sync_ts = init.shared[0]
        init.new_list = NewList(
            old.view_id, self.pid, sync_ts + 1, self.pid, self.group, view_id,
            tuple((m, m not in old.unicast_only) for m in members), (), tuple(self.requests_done.items()),
            locks, old.min_partition, None, init.version, True, None, self.join_floor,
        )
        init.acks = {self.pid}
        self._record("recovery", now, version=init.version, role="propose", members=list(members))
        if len(members) == 1:
            self._commit_recovery(init.new_list, now)
            return
        self._multicast(init.new_list, now)

    def _minimum_partition(self) -> int:
        """How many members of the old view a new view needs (the group's ``min_partition`` rule)."""
        return required_partition(self.view.min_partition, self.view.size)

    def _abort_initiation(self, now: float, reason: str) -> None:
        init = self.initiation
        assert init is not None
        self.stats["reformations_aborted"] += 1
        self._record("recovery", now, version=init.version, role="abort", reason=reason)
        self._multicast(RecoveryAbort(self.view.view_id, self.pid, init.version, reason[:200]), now)
        self.initiation = None
        self.failed_reformations += 1
        if self.failed_reformations >= self.config.reformation_attempts and reason != SUPERSEDED_REASON:
            self._stop(now, f"no reformation succeeded in {self.failed_reformations} attempts ({reason})")
            return
        self._schedule_restart(now)

    def _schedule_restart(self, now: float) -> None:
        low, high = self.config.recovery_backoff
        self.restart_deadline = now + low + (high - low) * self.rng.random()

    def _stop_minority(self, now: float, size: int, needed: int) -> None:
        """A partition smaller than the group's minimum stops: it must not order anything on its own."""
        self.stats["minority_stops"] += 1
        self._stop(now, f"partition of {size} below the minimum of {needed}")

    def _stop(self, now: float, reason: str) -> None:
        """Leave the group for good after a failure this process cannot repair; it may join again as new."""
        self.restart_deadline = None
        self.initiation = None
        self.participation = None
        self._depart(now, reason=reason)
        if not self.finished:  # nobody will ask a stopped member for anything: no need to linger
            self.finished = True
            self.pass_timer.stop()
            self._events.append(Left(self.group, self.depart_reason))

    def _catch_up(self, target: SyncPoint, now: float) -> None:
        """NACK, to anyone, whatever separates this member from ``target``."""
        ts, seqs = target
        # Lazily, and only as many as one NACK carries: a sync point far ahead must not build huge lists.
        missing = list(islice((t for t in range(self.q.contig + 1, ts + 1)
                               if (s := self.q.get(t)) is None or not s.have), NACK_LIST))
        wanted = list(islice(((src, n) for src, high in seqs.items()
                              for n in range(self.src_next.get(src, 1), high + 1) if (src, n) not in self.data),
                             NACK_LIST))
        if missing or wanted:
            self.stats["recovery_nacks"] += 1
            from .packets import Nack  # local import keeps the module list short at the top

            self._multicast(Nack(self.view.view_id, self.pid, None, self.q.contig, self.q.high, False,
                                 tuple(missing), tuple(wanted)), now)

    # ------------------------------------------------------------------------------------------------------------
    # Packets

    def _on_recovery_packet(self, packet: Packet, now: float) -> None:
        if isinstance(packet, RecoveryStart):
            self._on_recovery_start(packet, now)
        elif isinstance(packet, RecoveryVote):
            init = self.initiation
            if init is not None and packet.version == init.version and packet.src in init.candidates:
                init.votes[packet.src] = (packet.sync_ts, dict(packet.sync_seqs))
        elif isinstance(packet, RecoveryAckNewList):
            init = self.initiation
            if init is not None and init.new_list is not None and packet.version == init.version and (
                    packet.new_view == init.new_list.new_view):
                init.acks.add(packet.src)
                if init.acks >= {m for m, _ in init.new_list.members}:
                    self._commit_recovery(init.new_list, now)
        elif isinstance(packet, RecoveryAbort):
            self._on_recovery_abort(packet, now)

    def _on_recovery_start(self, start: RecoveryStart, now: float) -> None:
        if start.view != self.view.view_id or self.pid not in start.members or self.departed:
            return
        key = (start.version, start.src)
        if key < self.version_seen:
            self._unicast(start.src, RecoveryAbort(self.view.view_id, self.pid, start.version, SUPERSEDED), now)
            return
        if key > self.version_seen:
            if self.initiation is not None:
                self._abort_initiation(now, SUPERSEDED_REASON)
            self.version_seen = key
            self.restart_deadline = None
            self.participation = Participation(start.src, start.version, (start.sync_ts, dict(start.sync_seqs)),
                                               now)
            self._freeze()
            self._record("recovery", now, version=start.version, role="member", initiator=start.src)
        part = self.participation
        if part is None or (part.initiator, part.version) != (start.src, start.version):
            return
        part.target = (start.sync_ts, dict(start.sync_seqs))
        part.deadline = now + self.config.recovery_interval * self.config.recovery_patience
        mine = self.sync_point()
        if not at_least(mine, part.target):
            self._catch_up(part.target, now)
        self._unicast(start.src, RecoveryVote(self.view.view_id, self.pid, start.version, mine[0],
                                              tuple(mine[1].items())), now)

    def _on_recovery_new_list(self, nl: NewList, now: float) -> bool:
        """A reformation's New List (phase one of the commit): hold it and acknowledge.  True when handled."""
        part = self.participation
        if part is None or nl.src != part.initiator or nl.request_id != part.version:
            return False
        if self.pid not in (m for m, _ in nl.members):
            return True
        part.new_list = nl
        part.deadline = now + self.config.recovery_interval * self.config.recovery_patience
        self._unicast(nl.src, RecoveryAckNewList(self.view.view_id, self.pid, part.version, nl.new_view), now)
        return True

    def _on_recovery_abort(self, abort: RecoveryAbort, now: float) -> None:
        part = self.participation
        if part is not None and abort.src == part.initiator and abort.version == part.version:
            self.participation = None
            self._schedule_restart(now)
        init = self.initiation
        if init is not None and abort.version == init.version and abort.reason == SUPERSEDED:
            self._abort_initiation(now, "a member saw a higher reformation")

    def _recovery_timer(self, now: float) -> None:
        init = self.initiation
        if init is not None and now >= init.deadline:
            self._recovery_round(now)
        part = self.participation
        if part is not None and now >= part.deadline:
            self.participation = None  # the initiator went quiet: try ourselves
            self._start_reformation(now)
        if self.restart_deadline is not None and now >= self.restart_deadline:
            self.restart_deadline = None
            if self.initiation is None and self.participation is None:
                self._start_reformation(now)

    def _commit_recovery(self, nl: NewList, now: float) -> None:
        """Phase two: drop everything beyond the sync point, install the New List, go on in the new view."""
        initiator = nl.src == self.pid
        self.initiation = None
        self.participation = None
        self.restart_deadline = None
        for slot in self.q.truncate(nl.ts - 1):
            if slot.key is None:
                continue
            src, seq = slot.key
            self.unordered.setdefault(src, set()).add(seq)
            if self.ordered_upto.get(src, 0) >= seq:
                self.ordered_upto[src] = seq - 1
            packet = self.data.get(slot.key)
            if src == self.pid and packet is not None:
                self._add_outstanding(packet)
        self.latest_ack_ts = min(self.latest_ack_ts, nl.ts - 1)
        self.stats["reformations"] += 1
        self._on_new_list(nl, now)
        # Every member of the new view reached the sync point: all it holds is stable in the new view, and
        # views the failed members were part of no longer count towards MaxN.
        for member in self.holds:
            self.holds[member] = max(self.holds[member], nl.ts)
        self.view_sizes = [(nl.ts, len(nl.members))]
        self._record("recovery", now, ts=nl.ts - 1, version=nl.request_id, role="commit",
                     members=[m for m, _ in nl.members], new_view=str(nl.new_view))
        if initiator:
            self.have_token = True
            self.accepted_ts = nl.ts
            self.incoming_quiet = 0
        self._unfreeze(now)
        self._progress(now)
        if initiator and self.have_token:
            self._send_ack((), 1, now)  # pass the token at once: the members commit on this ACK
            self._progress(now)
