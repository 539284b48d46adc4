"""One RMP process: its groups, its joins, and the routing of datagrams to them (sans-IO, like the engine).

This is what the daemon, an embedded node and the simulator drive.  Inputs: application requests (join, leave,
send, lock, unlock), datagrams, timer expiries, each with the current time.  Outputs: datagrams (a multicast names
its group, whose address the runtime derives with :func:`rmpd.protocol.naming.group_address`), events, journal
records, the next deadline.

Joins under way and wishes to rejoin are joins.py's (``Joining``, the part of ``RmpProcess`` that joins); where
each received datagram goes is routing.py's (``PacketRouting``, the part that routes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from .calls import DEFAULT_CALL_TIMEOUT, Caller
from .config import EngineConfig
from .engine import GroupEngine
from .events import JoinFailed, Left
from .ids import ProcessId, RequestIds, ViewCounter
from .joins import JoinAttempt, Joining, RejoinWish
from .keys import KeyTable
from .limits import check_call
from .multirpc import ScmpSettings, start_upper
from .ordering import DeliveredBefore
from .outbox import OutputLists, Outputs
from .packets import NewList
from .qos import QoS
from .quorum import BELOW_MINIMUM, BLOCKED, JOINING, LEAVING, OPERATIONAL, REFORMING, REJOINING, Quorum
from .reformation import Rng
from .routing import PacketRouting
from .status import GroupStatus
from .statusquery import StatusQueries
from .view import View


class NotMember(Exception):
    """The process is not a member of that group (yet)."""


class RmpProcess(PacketRouting, Joining):
    def __init__(self, *, pid: ProcessId, config: EngineConfig | None = None, rng: Rng, now: float,
                 wall_ms: int, multicast_capable: bool = True,
                 engine_factory: type[GroupEngine] = GroupEngine, seq_base: int = 0,
                 scmp: ScmpSettings | None = None) -> None:
        """``seq_base``: where sequence numbers start in a group this process has not been in before.  A process
        that may restart under the same process ID (a daemon on a fixed port) passes its start time in ms times
        1000, so a restarted incarnation's messages always number above the ones it sent before.

        ``scmp``: how non-members' calls are filtered; with ``latest`` set (the value found on stable storage, 0
        when there was none) the process is a resilient SCMP server: it asks for ``latest`` to be persisted
        (:meth:`persist_request`) and accepts calls stamped up to what the runtime reports durable
        (:meth:`persisted`)."""
        self.pid = pid
        self.scmp = scmp or ScmpSettings()
        self.wall_offset = wall_ms / 1000 - now
        """Seconds from the caller's ``now`` to this process's wall clock."""
        self.latest = self.scmp.latest
        self._persist_wanted: int | None = None
        self._persist_outstanding: int | None = None
        if self.latest is not None:
            self._persist_wanted = wall_ms + self.scmp.persist_ahead_ms
        self.caller = Caller(pid)
        self.engine_factory = engine_factory
        self.config = config or EngineConfig()
        self.rng = rng
        self.multicast_capable = multicast_capable
        self.view_counter = ViewCounter(pid, wall_ms, now)
        self._request_ids = RequestIds(wall_ms)
        self.engines: dict[str, GroupEngine] = {}
        self._last_seqs: dict[str, tuple[int, int]] = {}
        self._seq_base = seq_base
        """Per group, the last (reliable, unreliable) sequence numbers used by an earlier membership: a rejoin goes
        on from there, so old and new messages never share an identity."""
        self.joining: dict[str, JoinAttempt] = {}
        self.rejoin_wishes: dict[str, RejoinWish] = {}
        self._delivered_before: dict[str, DeliveredBefore] = {}
        """Per group, what this process delivered in its last membership of it (``GroupEngine`` never delivers
        it again in the next)."""
        self._kept_keys: dict[str, KeyTable] = {}
        """Per group, the key table of this process's last membership of it, when that membership ended by itself
        (the process rejoins) while holding the group's table: if the process founds the group anew (every
        membership ended, and nobody answers its join), the keys the group delivered are still kept; as a joiner
        it takes the group's table instead.  A leave drops it."""
        self._join_settings: dict[str, tuple[int, int]] = {}
        """Per group, the (min_partition, ttl) its join asked for: a rejoin asks for the same."""
        self._group_heard_at: dict[str, float] = {}
        """When an Alive of each group this process holds no membership of was last heard: a join unanswered while
        its group is heard is not answered yet (the token is on its way back), not a group nobody is in."""
        self._reformation_heard_at: dict[str, float] = {}
        """Per group being joined, when a reformation was last heard where it listens (``_maybe_our_group``)."""
        self._longer_history_heard_at: dict[str, float] = {}
        """Per group, when a process asking to join it last said it kept a key table of a longer history than
        this process's (``Joining``: a join does not found the group beside it)."""
        self._join_ids: dict[str, set[int]] = {}
        """Per group, every join request ID issued since the last membership of it began: a New List answering any
        of them admits this process, whichever attempt (a rejoin makes one after another) is running now."""
        self.stats: Counter[str] = Counter()
        self._out = OutputLists()
        self.status_queries = StatusQueries(pid, self._out, self.stats)
        """``rmp status G --all``: queries asked here, and the rate of answering others' (outside the order)."""

    # ------------------------------------------------------------------------------------------------------------
    # Application requests

    def create(self, group: str, now: float, *, min_partition: int = 1, ttl: int = 1) -> GroupEngine:
        """Form a new group with this process as its only member (asking for multicast TTL ``ttl``)."""
        view_id = self.view_counter.next_view_id(now)
        while view_id is None:  # at most one view per ms of uptime: the caller's clock moved too little
            now += 0.001
            view_id = self.view_counter.next_view_id(now)
        view = View(view_id, (self.pid,), frozenset() if self.multicast_capable else frozenset({self.pid}),
                    min_partition=min_partition, ttls=((self.pid, ttl),))
        return self._install(group, view, now)

    def found(self, group: str, view: View, now: float) -> GroupEngine:
        """Start as a founding member of a view made out of band (the simulator's fixed groups).  When the view is
        made in this process's name, making it takes one view ID from this process's counter, as ``create`` does."""
        if view.view_id.creator == self.pid:
            self.view_counter.next_view_id(now)
        return self._install(group, view, now)

    def leave(self, group: str, now: float) -> None:
        self._kept_keys.pop(group, None)  # kept only to found the group again on a rejoin
        if group in self.joining:
            attempt = self.joining.pop(group)
            self.rejoin_wishes.pop(group, None)
            self._out.events.append(Left(group, "left") if attempt.rejoin
                                    else JoinFailed(group, "join cancelled by leave"))
            return
        if group in self.rejoin_wishes and group not in self.engines:
            del self.rejoin_wishes[group]
            self._out.events.append(Left(group, "left"))
            return
        self._engine(group).leave(now)
        self._collect(now)

    def send(self, group: str, payload: bytes, qos: QoS, now: float, handler: int | None = None,
             key: bytes | None = None) -> int | None:
        seq = self._engine(group).send(payload, qos, now, handler, key)
        self._collect(now)
        return seq

    def send_batch(self, group: str, payloads: Sequence[bytes], qos: QoS, now: float,
                   handler: int | None = None, keys: Sequence[bytes] | None = None) -> list[int] | None:
        """Several messages at once, packed together (GroupEngine.send_batch); None when the group refuses them.
        ``keys``: one per message, for exactly-once sends (BadKey for keys the group cannot keep)."""
        seqs = self._engine(group).send_batch(payloads, qos, now, handler, keys)
        self._collect(now)
        return seqs

    def call(self, group: str, payload: bytes, now: float, *, handler: int | None = 0,
             timeout: float = DEFAULT_CALL_TIMEOUT,
             qos: QoS | None = None) -> int:
        """Call ``group`` as a non-member (no join needed); a :class:`CallAnswered` event with this ID follows.
        BadArgument (MessageTooLarge for a payload over one packet) before anything is sent or kept."""
        check_call(self.config, payload, handler, timeout)
        call_id = self.caller.call(group, payload, handler, timeout, now, self.wall_ms(now), qos)
        self._collect(now)
        return call_id

    def cancel_call(self, call_id: int) -> None:
        """Forget this process's own call ``call_id`` (its caller gave up): no answer for it is reported."""
        self.caller.cancel(call_id)

    def reply(self, group: str, caller: ProcessId, conn: int, stamp: int, payload: bytes, now: float) -> bool:
        """Answer a :class:`CallToAnswer` this process received."""
        ok = self._engine(group).reply(caller, conn, stamp, payload, now)
        self._collect(now)
        return ok

    def wall_ms(self, now: float) -> int:
        return int((now + self.wall_offset) * 1000)

    def persist_request(self) -> int | None:
        """A value of ``latest`` to write to stable storage (then report it with :meth:`persisted`), or None."""
        want, self._persist_wanted = self._persist_wanted, None
        if want is not None:
            self._persist_outstanding = want
        return want

    def persisted(self, value: int, now: float) -> None:
        """``value`` is durable: calls stamped up to it may be accepted (SCMP figure 2-2: write first, then use)."""
        self._persist_outstanding = None
        if self.latest is None or value <= self.latest:
            return
        self.latest = value
        for engine in self.engines.values():
            engine.raise_latest(value)
        self._collect(now)

    def _latest_refresh_at(self) -> float | None:
        """When ``latest`` must be pushed ahead again (None without stable storage or while a write is asked for)."""
        if self.latest is None or self._persist_wanted is not None or self._persist_outstanding is not None:
            return None
        return (self.latest - self.scmp.persist_ahead_ms / 2) / 1000 - self.wall_offset

    def set_overrun(self, group: str, overrun: bool, now: float) -> None:
        """The application of ``group`` is behind (or caught up): see GroupEngine.set_overrun."""
        engine = self.engines.get(group)
        if engine is not None:
            engine.set_overrun(overrun, now)
            self._collect(now)

    def set_link_busy(self, busy: bool, now: float) -> None:
        """The socket every group's datagrams leave from is full (or drained): back-pressure for every group's
        sender (``Sender.set_link_busy``)."""
        for engine in self.engines.values():
            engine.set_link_busy(busy, now)
        self._collect(now)

    def lock(self, group: str, lock: int, now: float) -> int:
        request_id = self._engine(group).lock(lock, now)
        self._collect(now)
        return request_id

    def unlock(self, group: str, lock: int, now: float) -> int:
        request_id = self._engine(group).unlock(lock, now)
        self._collect(now)
        return request_id

    def view(self, group: str) -> View | None:
        engine = self.engines.get(group)
        return None if engine is None or engine.departed else engine.app_view

    # ------------------------------------------------------------------------------------------------------------
    # Inspection: what callers may know of the groups, without reading engine state

    def groups(self) -> list[str]:
        """Groups this process is in (departed ones until they finish), is joining or will rejoin, sorted."""
        return sorted(set(self.engines) | set(self.joining) | set(self.rejoin_wishes))

    def status(self, group: str) -> GroupStatus | None:
        """A snapshot of ``group`` here, or None when this process holds no membership of it."""
        engine = self.engines.get(group)
        return None if engine is None else engine.status()

    def quorum(self, group: str, now: float) -> Quorum | None:
        """Whether ``group`` goes on here (``rmpd.protocol.quorum``), or None when this process is not in it, not
        joining it and not waiting to rejoin it."""
        engine = self.engines.get(group)
        if engine is not None:
            status = engine.status()
            if status.leaving or status.departed:
                return Quorum(LEAVING, status.view.size, status.needed)
            if status.below_minimum is not None:
                return Quorum(BELOW_MINIMUM, status.below_minimum, status.needed)
            return Quorum(REFORMING if status.reforming else OPERATIONAL, status.view.size, status.needed)
        wish = self.rejoin_wishes.get(group)
        if wish is not None:
            asking = self._asking(group, wish, now)
            heard = wish.group_heard or self._heard_lately(self._group_heard_at, group, now)
            return Quorum(REJOINING if heard or len(asking) >= wish.needed else BLOCKED, len(asking), wish.needed)
        if group in self.joining:
            return Quorum(JOINING, 0, 0)
        return None

    def ask_status(self, group: str, now: float, timeout: float) -> int:
        """Ask every member of this process's view of ``group`` (of its last view while it waits to rejoin) for
        its status: ``StatusAsked`` events at each, then one ``StatusGathered`` here with the answers, within
        ``timeout``.  Returns the query's number.  NotMember when this process has no view of the group to ask."""
        engine = self.engines.get(group)
        wish = self.rejoin_wishes.get(group)
        if engine is not None:
            members = engine.app_view.members
        elif wish is not None:
            members = wish.last_view
        else:
            raise NotMember(f"not a member of {group!r}")
        return self.status_queries.ask(group, members, now, timeout)

    def answer_status(self, asker: ProcessId, group: str, query: int, report: bytes) -> None:
        """Answer a ``StatusAsked`` with the application's snapshot ``report``."""
        self.status_queries.answer(asker, group, query, report)

    def send_backlog(self, group: str) -> int:
        """Packets of ``group`` accepted and not yet sent (0 when not a member): cheap, for back-pressure."""
        engine = self.engines.get(group)
        return 0 if engine is None else engine.send_backlog()

    def is_leaving(self, group: str) -> bool:
        """A leave of ``group`` was asked for, or the membership ended and is not yet finished."""
        engine = self.engines.get(group)
        return engine is not None and engine.leaving

    def counters(self) -> Counter[str]:
        """This process's counters plus those of every group it is in (counters of groups left are kept)."""
        total: Counter[str] = Counter(self.stats)
        for engine in self.engines.values():
            total.update(engine.stats)
        return total

    def quiet(self) -> bool:
        """Nothing to do until new input but say this process is alive: no join or rejoin under way, no call
        waiting, and every group quiet (``GroupEngine.quiet``)."""
        if self.joining or self.rejoin_wishes or self.caller.get_timer() is not None or self.status_queries.asked:
            return False
        return all(engine.quiet for engine in self.engines.values())

    def settled(self) -> bool:
        """Nothing left to do for others: no join under way, and every group left or departed from a view of one.

        A process that leaves a one-member group whose last New List passed the token to itself waits for a
        confirmation nobody will send (until ``leave_linger``); there is nobody left to serve, so it counts here."""
        if self.joining:
            return False
        return all(engine.settled for engine in self.engines.values())

    # ------------------------------------------------------------------------------------------------------------
    # Time

    def handle_timer(self, now: float) -> None:
        self._join_timers(now)
        refresh = self._latest_refresh_at()
        if refresh is not None and now >= refresh:
            self._persist_wanted = self.wall_ms(now) + self.scmp.persist_ahead_ms
        self.caller.handle_timer(now)
        self.status_queries.handle_timer(now)
        for engine in list(self.engines.values()):
            deadline = engine.get_timer()
            if deadline is not None and deadline <= now:
                engine.handle_timer(now)
        self._collect(now)

    def get_timer(self) -> float | None:
        deadlines = [a.timer.deadline for a in self.joining.values() if a.timer.deadline is not None]
        deadlines += [w.not_before for g, w in self.rejoin_wishes.items() if g not in self.joining
                      and g not in self.engines]
        deadlines += [d for d in (e.get_timer() for e in self.engines.values()) if d is not None]
        deadlines += [d for d in (self.caller.get_timer(), self._latest_refresh_at(), self.status_queries.get_timer())
                      if d is not None]
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------------------------------------------------
    # Outputs

    def take_outputs(self, *, deadline: bool = True) -> Outputs:
        """Everything this process produced since the last call, and when to call ``handle_timer`` next: the one
        output contract its callers (the trio runtime, the simulator) drain after every input.  ``deadline=False``
        leaves the deadline out (None), for a caller that polls ``get_timer`` on its own schedule (a scripted
        clock)."""
        out = self._out
        taken = Outputs(out.datagrams, out.events, out.records,
                        self.persist_request() if self._persist_wanted is not None else None,
                        self.get_timer() if deadline else None)
        out.datagrams, out.events, out.records = [], [], []
        return taken

    # ------------------------------------------------------------------------------------------------------------

    def _engine(self, group: str) -> GroupEngine:
        engine = self.engines.get(group)
        if engine is None or engine.departed:
            raise NotMember(f"not a member of group {group!r}")
        return engine

    def _install(self, group: str, view: View, now: float, joined_by: NewList | None = None) -> GroupEngine:
        self._join_ids.pop(group, None)  # a new membership: requests made before it answer nothing any more
        last_seq, last_unreliable = self._last_seqs.get(group, (self._seq_base, self._seq_base))
        # A founder that recovered ``latest`` from stable storage (it ran before) bounds the joins an earlier
        # incarnation of the group may have accepted, as its call filter bounds calls; a joiner takes the group's
        # floor from its New List, and the group's table (``done``) covers the joins made since.
        floor = start_upper(self.scmp, self.wall_ms(now))
        scmp = replace(self.scmp, upper=floor, latest=self.latest)
        engine = self.engine_factory(
            pid=self.pid, group=group, view=view, config=self.config, rng=self.rng, now=now,
            view_counter=self.view_counter, request_ids=self._request_ids, joined_by=joined_by,
            first_seq=last_seq + 1, first_unreliable_seq=last_unreliable + 1, scmp=scmp,
            join_floor=floor if joined_by is None and self.scmp.upper > 0 else 0,
            wall_offset=self.wall_offset,
            **({"delivered_before": self._delivered_before.pop(group)} if group in self._delivered_before else {}),
            **({"kept_keys": kept} if (kept := self._kept_keys.pop(group, None)) is not None else {}),
        )
        self.engines[group] = engine
        engine.handle_timer(now)  # a joiner accepts the token it was named for at once
        self._collect(now)
        return engine

    def _collect(self, now: float) -> None:
        """Move every part's outputs into the process's, in order.

        Multi-RPC between this process and a group it is a member of stays inside as well: a host does not hear its
        own multicast, so its own call also goes to its own group engine, and a datagram to itself (the answer to
        its call, the REPLY-ACK of its own reply) is handed over instead of sent.  A member calls its own group as
        anyone else does, and runs the call at most once the same way.
        """
        looped: list[bytes] = []
        datagrams, events = self.caller.take_outputs()
        for tx in datagrams:
            if tx.dest == self.pid or (tx.dest is None and tx.group in self.engines):
                looped.append(tx.data)
            if tx.dest != self.pid:
                self._out.datagrams.append(tx)
        self._out.events.extend(events)
        loop_back = self.pid if self.caller.calls else None
        for group, engine in list(self.engines.items()):
            looped += engine.hand_over(self._out, loop_back)
            if engine.finished:  # set whenever the engine says Left, in the same step
                end = engine.membership_end()
                if end.rejoin:
                    last = end.last_view
                    min_partition, ttl = self._join_settings.get(group, (last.min_partition, 1))
                    self.rejoin_wishes[group] = RejoinWish(min_partition, ttl, last.members, end.needed,
                                                           not_before=now)
                self._last_seqs[group] = end.last_seqs
                self._delivered_before[group] = end.delivered
                kept = engine.table_to_keep() if end.rejoin else None
                if kept is not None:
                    self._kept_keys[group] = kept
                self.stats.update(engine.stats)  # counters never go back when a group is left
                del self.engines[group]
        for data in looped:
            self.stats["calls_looped_back"] += 1
            self.receive_datagram(data, self.pid, now)


__all__ = ["NotMember", "RmpProcess"]
