"""The I/O loop around one sans-IO :class:`RmpProcess`: input -> process -> drain -> application -> follow-ups.

The daemon and the embedded :class:`rmpd.Node` both run one ``ProcessLoop``; they differ only in the application
that takes its events.  Every input (a datagram batch, the timer, an application request) is one step: the
process takes it, :meth:`ProcessLoop.drain` sends what the process asked to send, writes its journal records, moves
the single timer and returns the events, and the application handles them.  What the application asks while it
handles them (a rejoin, holding the token back) goes into the process at once but is drained only after the
application returns, as the next round of the same step: the drain never runs inside itself, so events reach the
application in exactly the order the process produced them.
"""

from __future__ import annotations

import contextlib
import math
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import trio

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import Delivered, Event, JoinFailed, Left, ViewInstalled
from rmpd.protocol.ids import process_id_of
from rmpd.protocol.multirpc import ScmpSettings
from rmpd.protocol.naming import DEFAULT_RANGE, group_address
from rmpd.protocol.packets import packet_type_of
from rmpd.protocol.qos import QoS
from rmpd.protocol.quorum import Quorum
from rmpd.protocol.status import GroupStatus
from rmpd.protocol.view import View
from rmpd.wire.forwarding import FORWARD_TAG
from rmpd.wire.sealing import SEALED_TAGS

from .auth import DatagramGuard
from .incarnation import Incarnation
from .journal import FlushingJournal
from .metrics import LoopMetrics
from .routes import GroupRoutes
from .sockets import MAX_DATAGRAM, DatagramSender, Listener, MulticastListeners, open_unicast

RECEIVE_BATCH = 64
"""Datagrams read from one socket before draining, so a flood cannot starve the timer or the clients."""

ENDED = (Left, JoinFailed)
"""Events after which the group's multicast socket may close (a tuple: cheaper per event than ``Left | JoinFailed``)."""

SEND_BACKLOG = 1024
"""Messages a group's engine may hold queued behind its send window before senders are made to wait: a sender
faster than the ring is slowed to the ring's pace instead of growing the daemon's memory without bound."""


class EventHandler(Protocol):
    """What takes a process's events: the application that owns the loop (the daemon's, or an embedded node)."""

    def handle_events(self, events: list[Event]) -> None:
        """The events of one drain, in order (often none: the application also does its after-step work here).
        Requests made from here are taken at once and their outputs drained once this returns."""


class _NoHandler:
    def handle_events(self, events: list[Event]) -> None:
        del events


class ProcessLoop:
    """Owns the process, its sockets, its timer and its journal; see the module docstring."""

    def __init__(self, *, ip: str, port: int, engine_config: EngineConfig | None = None,
                 address_range: str = DEFAULT_RANGE, ttl: int = 1, multicast: bool = True,
                 journal: FlushingJournal | None = None, guard: DatagramGuard | None = None,
                 scmp: ScmpSettings | None = None, latest_path: Callable[[str], Any] | None = None,
                 via: str | None = None) -> None:
        """``latest_path(pid)``: where SCMP's ``latest`` lives on stable storage (None: no stable storage, so calls
        are filtered by the non-resilient server of figure 2-1).  Raises LatestStoreError for a corrupt file.
        ``via``: a member's process ID that multicasts for this process (rmpd.wire.forwarding), for every group
        not joined with a ``via`` of its own."""
        self.ip, self.address_range, self.multicast = ip, address_range, multicast
        self.journal = journal
        self.stats: Counter[str] = Counter()
        self.guard = guard if guard is not None else DatagramGuard(stats=self.stats)
        self.guard.stats = self.stats
        self.sock = open_unicast(ip, port, ttl)
        self.port = self.sock.getsockname()[1]
        self.pid = f"{ip}:{self.port}"
        self.incarnation = Incarnation(self.pid, engine_config or EngineConfig(), multicast=multicast, scmp=scmp,
                                       latest_path=latest_path, stats=self.stats)
        """Where this run's sequence numbers start, and its SCMP ``latest`` on stable storage."""
        self.process = self.incarnation.process
        self.application: EventHandler = _NoHandler()
        self.metrics = LoopMetrics(self)
        self.datagrams = DatagramSender(self.sock, self.stats)
        """Sends from the process's socket, holding what a full socket refuses (``flush_forever``)."""
        self.datagrams.on_busy = self._link_busy
        self.routes = GroupRoutes(self.datagrams, self.guard, self.stats,
                                  self.metrics.datagrams_out, address_range=address_range, default_ttl=ttl, via=via)
        self.listeners = MulticastListeners(ip)
        self._nursery: trio.Nursery | None = None
        self._timer_scope: trio.CancelScope | None = None
        self._deadline = math.inf
        self._idle = trio.Event()
        self._room = trio.Event()
        self._stepping = False
        """A step is under way: a request drains with it instead of draining inside it."""
        self._requested = False
        """A request came in while the application handled a drain's events: the step drains once more."""
        self.refusal_watch: Callable[[set[str], Counter[tuple[str, str]]], None] | None = None
        """Told, after each batch read from a group's multicast socket, what the group key's check dropped there:
        (the socket's groups, count per (reason, source)).  A join learns from it that its group speaks in a form
        this process cannot take (``ProcessAdapter.refused``)."""

    # ------------------------------------------------------------------------------------------------------------
    # Running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the sockets and the timer until cancelled; ``started`` once the unicast socket is being read."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._receive_loop, self.sock, "unicast")
                nursery.start_soon(self.datagrams.flush_forever)
                nursery.start_soon(self._timer_loop)
                task_status.started()
        finally:
            self._nursery = None
            self.listeners.close()
            self.sock.close()
            if self.journal is not None:
                self.journal.close()

    async def _receive_loop(self, sock: socket.socket, kind: str, listener: Listener | None = None) -> None:
        where = "{}:{}".format(*sock.getsockname()[:2])
        own = (self.ip, self.port)
        counter = f"datagrams_received_{kind}"
        stats, guard, process = self.stats, self.guard, self.process
        by_type = self.metrics.datagrams_in
        refused: Counter[tuple[str, str]] = Counter()
        keyless = not guard.keyed
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = trio.current_time()
            for _ in range(RECEIVE_BATCH):
                try:
                    data, addr = sock.recvfrom(MAX_DATAGRAM)
                except BlockingIOError:
                    break
                except OSError:
                    self.stats["receive_errors"] += 1
                    break
                stats[counter] += 1
                if addr == own:  # our own multicast, looped back so other processes on this host hear it
                    stats["own_echo"] += 1
                    continue
                source = process_id_of(addr)
                if data[:2] == FORWARD_TAG:
                    data = self.routes.forward(data, source, self._forwarding_view, self.pid)
                    if data is None:
                        continue
                if keyless and data[:2] not in SEALED_TAGS:
                    packet: bytes | None = data  # no key, a plain packet: nothing to open
                else:
                    packet = guard.open(data, source, where)
                    if packet is None:
                        if listener is not None:
                            refused[guard.last_refusal or "", source] += 1
                        continue
                kind = packet_type_of(packet)
                if kind is not None:
                    by_type[kind] += 1
                process.receive_datagram(packet, source, now)
            if refused:
                if self.refusal_watch is not None and listener is not None:
                    self.refusal_watch(listener.groups, refused)
                refused = Counter()
            self.step()
            if sock.fileno() == -1:  # the drain left the last group on this socket and closed it
                return

    async def _timer_loop(self) -> None:
        while True:
            with trio.CancelScope(deadline=self._deadline) as scope:
                self._timer_scope = scope
                await trio.sleep_forever()
            self._timer_scope = None
            now = trio.current_time()
            if now >= self._deadline:
                self.process.handle_timer(now)
                self.step()

    # ------------------------------------------------------------------------------------------------------------
    # Application requests: each one step (or a round of the step under way)

    def join(self, group: str, *, ttl: int | None = None, min_partition: int = 1,
             existing_only: bool = False, via: str | None = None) -> None:
        """Start joining; the owner hears ViewInstalled or JoinFailed.  Raises ValueError for a bad name or a
        ``via`` that is no process ID (``ip:port``): with one, every multicast of this group goes through that
        member."""
        address = group_address(group, self.address_range)
        wanted = self.routes.joining(group, ttl, via)
        if group in self.process.groups():
            return  # a member, joining, or leaving: a leaving group is joined again once it is left (the owner asks
            # on the Left event)
        self._listen(group, address)
        self.process.join(group, trio.current_time(), min_partition=min_partition, ttl=wanted,
                          existing_only=existing_only)
        self._taken()

    def leave(self, group: str) -> None:
        self.process.leave(group, trio.current_time())
        self._taken()

    def keep_from_founding(self, group: str) -> bool:
        """The join of ``group`` fails rather than founds a view if nobody answers (``RmpProcess.keep_from_founding``):
        the runtime heard the group where the process cannot."""
        return self.process.keep_from_founding(group)

    def send(self, group: str, payload: bytes, qos: QoS, handler: int | None = None) -> int | None:
        now = trio.current_time()
        seq = self.process.send(group, payload, qos, now, handler)
        if seq is not None:
            self.metrics.sent(group, seq, qos, now)
        self._taken()
        return seq

    def send_many(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None = None,
                  keys: list[bytes] | None = None) -> list[int] | None:
        """Send several messages in order with one drain, packed together into as few packets as they fit
        (GroupEngine.send_batch), with one key each or none; None when the group refuses them (it is being left)."""
        now = trio.current_time()
        if keys is None:
            seqs = self.process.send_batch(group, payloads, qos, now, handler)
        else:
            seqs = self.process.send_batch(group, payloads, qos, now, handler, keys=keys)
        if seqs:
            self.metrics.sent(group, seqs[-1], qos, now)
        self._taken()
        return seqs

    def set_overrun(self, group: str, overrun: bool) -> None:
        """Stop (or resume) accepting ``group``'s token because its reader is behind (section 4.6)."""
        self.process.set_overrun(group, overrun, trio.current_time())
        self._taken()

    def has_room(self, group: str) -> bool:
        """May another message be queued for ``group`` without exceeding SEND_BACKLOG?"""
        return self.process.send_backlog(group) < SEND_BACKLOG

    async def wait_for_room(self, group: str) -> None:
        """Wait until ``group``'s send backlog is below SEND_BACKLOG (checked after every drain)."""
        while not self.has_room(group):
            if self._room.is_set():
                self._room = trio.Event()
            await self._room.wait()

    def call(self, group: str, payload: bytes, *, handler: int | None, timeout: float, qos: QoS | None = None) -> int:
        """Call ``group`` as a non-member; a CallAnswered event with the returned ID follows."""
        call_id = self.process.call(group, payload, trio.current_time(), handler=handler, timeout=timeout, qos=qos)
        self._taken()
        return call_id

    def cancel_call(self, call_id: int) -> None:
        """Nobody waits for this call's answer any more: stop retrying it."""
        self.process.cancel_call(call_id)

    def reply(self, group: str, caller: str, conn: int, stamp: int, payload: bytes) -> bool:
        ok = self.process.reply(group, caller, conn, stamp, payload, trio.current_time())
        self._taken()
        return ok

    def ask_status(self, group: str, timeout: float) -> int:
        """Ask every member of ``group`` for its status (``RmpProcess.ask_status``); NotMember without a view."""
        query = self.process.ask_status(group, trio.current_time(), timeout)
        self._taken()
        return query

    def answer_status(self, asker: str, group: str, query: int, report: bytes) -> None:
        self.process.answer_status(asker, group, query, report)
        self._taken()

    def lock(self, group: str, lock: int) -> None:
        self.process.lock(group, lock, trio.current_time())
        self._taken()

    def unlock(self, group: str, lock: int) -> None:
        self.process.unlock(group, lock, trio.current_time())
        self._taken()

    def is_member(self, group: str) -> bool:
        """In a view of the group and not on the way out of it."""
        return self.process.view(group) is not None and not self.is_leaving(group)

    def is_leaving(self, group: str) -> bool:
        return self.process.is_leaving(group)

    def groups(self) -> list[str]:
        return self.process.groups()

    def view(self, group: str) -> View | None:
        """The view of ``group`` the application has seen installed; None when not in one."""
        return self.process.view(group)

    def status(self, group: str) -> GroupStatus | None:
        return self.process.status(group)

    def quorum(self, group: str) -> Quorum | None:
        """Whether ``group`` goes on here, as ``rmp status`` shows it (``RmpProcess.quorum``)."""
        return self.process.quorum(group, trio.current_time())

    @property
    def group_ttl(self) -> dict[str, int]:
        """Per group, the TTL its multicasts go out with (``GroupRoutes.group_ttl``; read it, do not change it)."""
        return self.routes.group_ttl

    def group_address(self, group: str) -> tuple[str, int]:
        """The multicast address and port ``group`` uses (its name hashed into this process's address range)."""
        return group_address(group, self.address_range)

    def counters(self) -> dict[str, int]:
        """The loop's own counters (sockets, keys, forwarding) plus the process's and every engine's (malformed,
        other_view, duplicates, ...)."""
        total: Counter[str] = Counter(self.stats)
        total.update(self.process.counters())
        return dict(sorted(total.items()))

    async def wait_idle(self) -> None:
        """Wait until this process is in no group and joins none (after leaving them all)."""
        while not self.process.settled():
            self._idle = trio.Event()
            await self._idle.wait()

    # ------------------------------------------------------------------------------------------------------------
    # Steps and the drain: the only place outputs leave the process

    def _taken(self) -> None:
        """A request went into the process: drain it now, or, when the application made it while handling a
        drain's events, as the next round of that step."""
        if self._stepping:
            self._requested = True
        else:
            self.step()

    @contextlib.contextmanager
    def one_step(self) -> Iterator[None]:
        """Requests made inside go into the process at once and are drained together when the block ends, so the
        application's handling never runs inside a request it made from outside a step (a reader catching up)."""
        if self._stepping:
            yield
            return
        self._stepping, self._requested = True, False
        try:
            yield
        finally:
            self._stepping = False
            if self._requested:
                self.step()

    def step(self) -> None:
        """Drain, hand the events to the application, and again while it asked for more meanwhile."""
        self._stepping = True
        try:
            while True:
                self._requested = False
                self.application.handle_events(self.drain())
                if not self._requested:
                    break
        finally:
            self._stepping = False

    def drain(self) -> list[Event]:
        """Send the process's datagrams, write its journal, store what it asks to persist, re-arm the timer;
        the events, for the application."""
        process = self.process
        out = process.take_outputs()
        transmit = self.routes.transmit
        for tx in out.datagrams:
            transmit(tx)
        records = out.records
        if records and self.journal is not None:
            self.journal.write_drained(self.pid, records)
        events = out.events
        metrics, pid, now = self.metrics, self.pid, trio.current_time()
        for event in events:
            if isinstance(event, Delivered):
                metrics.delivered(event.group, event.qos, len(event.payloads), event.seq if event.src == pid else None,
                                  now)
            elif isinstance(event, ViewInstalled):
                metrics.view_installed(event.group)
                view = process.view(event.group)
                if view is not None:
                    self.routes.view_installed(event.group, view)
            elif isinstance(event, ENDED) and not (isinstance(event, Left) and event.rejoining):
                self._unlisten(event.group)  # a process that rejoins by itself listens for its group meanwhile
        if out.persist is not None:
            self.incarnation.persist(out.persist, self._nursery, self._taken)
        deadline = out.deadline
        self._deadline = math.inf if deadline is None else deadline
        if self._timer_scope is not None and self._timer_scope.deadline != self._deadline:
            # Setting a cancel scope's deadline costs trio more than comparing it: most drains leave it as it was.
            self._timer_scope.deadline = self._deadline
        if process.settled():
            self._idle.set()
        self._room.set()
        return events

    def _link_busy(self, busy: bool) -> None:
        """The socket holds data it could not send yet (or has sent the last of it): the process's senders wait
        (or fill their windows again, in a step of their own)."""
        self.process.set_link_busy(busy, trio.current_time())
        self._taken()

    # ------------------------------------------------------------------------------------------------------------
    # Multicast sockets, opened before a join (to hear the answer) and closed once the group is left

    def _listen(self, group: str, address: tuple[str, int]) -> None:
        if self.multicast:
            nursery = self._nursery
            self.listeners.listen(group, address, None if nursery is None else
                                  lambda listener: nursery.start_soon(self._listen_loop, listener))

    async def _listen_loop(self, listener: Listener) -> None:
        with listener.scope, contextlib.suppress(trio.ClosedResourceError):
            await self._receive_loop(listener.sock, "multicast", listener)

    def _forwarding_view(self, group: str) -> View | None:
        """The view of ``group`` when this process multicasts for others in it: a member, not leaving, that can."""
        return self.view(group) if self.multicast and self.is_member(group) else None

    def _unlisten(self, group: str) -> None:
        self.routes.forget(group)
        self.listeners.unlisten(group)

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "multicast": self.multicast, "address_range": self.address_range,
                **self.routes.describe(), "auth": self.guard.describe()}
