"""``rmpd.Node``: an RMP process inside the program's own trio run, with the same join/Group API as a client.

For programs that are group members themselves (no daemon in between): the node owns the UDP sockets and runs the
same :class:`rmpd.runtime.loop.ProcessLoop` the daemon runs.  Engine events are turned into Group events here;
requests that wait for the protocol (join, lock) park a trio.Event until the matching event arrives.  As through a
daemon, a membership that ends first reports the messages the program sent and will not see delivered
(:class:`rmpd.Undelivered`), and one that ends by itself is rejoined (:class:`rmpd.Rejoining`, then the next view).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from rmpd.keyfile import load_key_file
from rmpd.localapi import BAD_REQUEST, DEFAULT_MIN_PARTITION, parse_min_partition
from rmpd.protocol.calls import CALL_ERRORS, CALL_GRACE, DEFAULT_CALL_TIMEOUT
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import CallAnswered, Delivered, JoinFailed, Left, LockResult, ViewInstalled
from rmpd.protocol.events import CallRequest as EngineCallRequest
from rmpd.protocol.events import Event as EngineEvent
from rmpd.protocol.events import Undelivered as EngineUndelivered
from rmpd.protocol.ids import view_name
from rmpd.protocol.limits import BadArgument, check_message_size
from rmpd.protocol.naming import DEFAULT_RANGE
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER
from rmpd.runtime.adapter import Application, LockRequests, OwnMessages
from rmpd.runtime.auth import DatagramGuard
from rmpd.runtime.journal import FlushingJournal
from rmpd.runtime.loop import ProcessLoop
from rmpd.runtime.net import interface_address, loopback_interface, max_packet_for

from .batching import Coalescer, Poster, SendBatch
from .errors import RmpdError, check_group_name_here, single_error
from .events import CallRequest, Rejoining, Undelivered, ViewChange, make_delivery
from .group import EVENT_BUFFER, Group, JoinOnce


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """The engine's refusal of an argument as the RmpdError a daemon would answer with (same code, same text)."""
    try:
        yield
    except BadArgument as exc:
        raise RmpdError(exc.code, str(exc)) from None


class _Wait:
    """A task waiting for the process to answer its join or lock."""

    __slots__ = ("done", "error", "granted")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.granted = False
        self.error: RmpdError | None = None

    def ok(self, fields: dict[str, Any]) -> None:
        del fields
        self.granted = True
        self.done.set()

    def fail(self, code: str, message: str) -> None:
        self.error = RmpdError(code, message)
        self.done.set()


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """What a node does for its readers at one moment (``Node.statistics``)."""

    groups_held_back: frozenset[str]
    """Groups whose ring waits (the node refuses the token) because their reader fell EVENT_BUFFER events behind."""


class Node:
    """``async with rmpd.Node(interface="lo", port=0) as node: group = await node.join("g")``."""

    def __init__(self, *, interface: str | None = None, port: int = 0, bind: str | None = None,
                 address_range: str = DEFAULT_RANGE, ttl: int = 1, multicast: bool = True,
                 journal: str | Path | None = None, config: EngineConfig | None = None,
                 auth_key: str | Path | None = None, encrypt: bool = False, via: str | None = None) -> None:
        """``auth_key``: a group key file (``rmpd keygen``), as for the daemon's ``--auth-key``; raises
        :class:`rmpd.wire.sealing.AuthKeyError` when it cannot be used."""
        key = load_key_file(Path(auth_key)) if auth_key is not None else None
        self._guard = DatagramGuard(key, encrypt=encrypt)
        self._ip = bind or interface_address(interface or loopback_interface())
        self._port = port
        self._range = address_range
        self._ttl = ttl
        self._multicast = multicast
        self._via = via
        self._journal = Path(journal) if journal is not None else None
        self._config = config or EngineConfig(journal=journal is not None, max_packet=max_packet_for(self._ip))
        self._loop: ProcessLoop | None = None
        self._nursery_manager: trio.Nursery | None = None
        self._groups: dict[str, Group] = {}
        self._locks: LockRequests[_Wait] | None = None
        self._calls: dict[int, tuple[trio.Event, list[CallAnswered]]] = {}
        self._poster = Poster(self._send_batch)
        self._coalescer = Coalescer(self._poster, self._hand_over_batch, self._wait_for_room)
        self._app: Application | None = None
        """Join waiters, rejoin on Left and the overrun rule, as the daemon's hub has them too."""
        self._me = ""
        """This node's process ID, once it runs: own deliveries are told apart by it."""
        self._own: OwnMessages[Node] = OwnMessages()
        """The messages this program sent and has not seen delivered, as the hub keeps its clients' (one sender
        here: the program)."""
        self.stats: Counter[str] = Counter()
        self._cm = None
        self._stopped: RmpdError | None = None
        """Set once the node has stopped: every later request raises it."""
        self._join_once = JoinOnce()

    @property
    def pid(self) -> str:
        """This node's process ID (``ip:port``), known once the node runs."""
        return self._require().pid

    @property
    def metrics(self) -> CollectorRegistry:
        """The node's Prometheus metrics (the families a daemon serves at ``/metrics``, bar its local clients'), in
        a ``prometheus_client`` registry of its own.  Read it from a trio task of the node's loop (for instance
        ``prometheus_client.generate_latest(node.metrics)`` in an HTTP handler): its collector reads the engine,
        which belongs to that loop."""
        return self._require().metrics.registry

    def statistics(self) -> NodeStatistics:
        """A snapshot for monitoring, and for tests to assert on."""
        return NodeStatistics(frozenset(self._app.overrun) if self._app is not None else frozenset())

    async def __aenter__(self) -> Node:
        journal = FlushingJournal(self._journal) if self._journal is not None else None
        self._loop = ProcessLoop(ip=self._ip, port=self._port, engine_config=self._config,
                                 address_range=self._range, ttl=self._ttl, multicast=self._multicast,
                                 journal=journal, guard=self._guard, via=self._via)
        self._loop.application = self
        self._me = self._loop.pid
        self._app = Application(self._loop, self.stats)
        self._locks = LockRequests(self._loop)
        self._cm = trio.open_nursery()
        nursery = await self._cm.__aenter__()
        await nursery.start(self._loop.run)
        self._nursery_manager = nursery
        self._poster.nursery = nursery
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        assert self._cm is not None and self._nursery_manager is not None
        unflushed: BaseException | None = None
        if exc is None:
            try:
                await self._poster.flush_all()  # posts made must not vanish with the node
            except RmpdError as error:
                unflushed = error
            await self._leave_all()
        # Stopped before the nursery closes: a post from another task meanwhile is refused, not started there.
        stopped = self._stopped = RmpdError("stopped", "the node has stopped")
        self._poster.fail(stopped)
        self._nursery_manager.cancel_scope.cancel()
        try:
            handled = await self._cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
        finally:
            if self._app is not None:
                self._app.stopping = True
            for group in self._groups.values():
                group._end(stopped)
            self._groups.clear()
        if unflushed is not None:
            raise unflushed
        return handled

    async def _leave_all(self, timeout: float = 5.0) -> None:
        loop = self._require()
        for group in loop.groups():
            with contextlib.suppress(NotMember):
                loop.leave(group)
        with trio.move_on_after(timeout):
            await loop.wait_idle()

    def _require(self) -> ProcessLoop:
        if self._loop is None:
            raise RuntimeError("use the Node inside `async with`")
        if self._stopped is not None:
            raise self._stopped
        return self._loop

    # The join/Group API

    async def join(self, name: str, *, ttl: int | None = None, min_partition: int | str | None = None,
                   persist: bool = False, existing_only: bool = False, state: bool = False,
                   via: str | None = None) -> Group:
        """Join ``name``; returns once this node is in a view of the group.  ``min_partition``: ``"majority"``,
        ``"all"`` or a whole number, as through a daemon (:func:`rmpd.localapi.parse_min_partition`; default 1).
        ``persist`` is taken so that code written for a daemon connection runs unchanged; a node's memberships end
        with the node either way.  ``state``: the group's state from a member that provides it is the first event
        (:class:`State`)."""
        check_group_name_here(name)
        try:
            wanted = DEFAULT_MIN_PARTITION if min_partition is None else parse_min_partition(min_partition)
        except ValueError as exc:
            raise RmpdError(BAD_REQUEST, str(exc)) from None
        group = await self._join_once.run(name, lambda: self._join(name, ttl, wanted, existing_only, via))
        if state:
            await group._ask_state()
        return group

    async def _join(self, name: str, ttl: int | None, min_partition: int, existing_only: bool,
                    via: str | None) -> Group:
        loop = self._require()
        if name in self._groups and loop.is_member(name):
            return self._groups[name]
        group = self._groups[name] = Group(self, name, "", [])
        wait = _Wait()
        assert self._app is not None
        try:
            view = self._app.join(name, wait, ttl=ttl, min_partition=min_partition, existing_only=existing_only,
                                  via=via)
        except ValueError as exc:
            self._groups.pop(name, None)
            raise RmpdError("bad-request", str(exc)) from None
        if view is None:
            await wait.done.wait()
        if wait.error is not None:
            self._groups.pop(name, None)
            raise wait.error
        view = loop.view(name)
        if view is not None:
            group.view, group._members = str(view.view_id), list(view.members)
        return group

    def _process_id(self) -> str:
        return self._me

    def _client_number(self) -> int:
        return 0  # one program per node and group: the process is the participant

    def _largest_message(self) -> int:
        return self._config.max_message

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self._nursery_manager is not None
        self._nursery_manager.start_soon(task)

    async def _send(self, group: str, payload: bytes, qos: QoS, handler: int | None) -> int:
        """Sends from concurrent tasks are coalesced (rmpd.client.batching) and handed to the engine in one call,
        which packs them into as few packets as they fit.  A message the group cannot carry is refused alone,
        before it joins a batch, so it never costs the other senders theirs."""
        self._require()
        self._check_size(payload, qos)
        return await self._coalescer.send(group, payload, qos, handler)

    async def _hand_over_batch(self, group: str, batch: SendBatch, qos: QoS, handler: int | None) -> None:
        batch.seqs = self._hand_over(group, batch.payloads, qos, handler)

    async def _wait_for_room(self, group: str) -> None:
        await self._require().wait_for_room(group)

    def _check_size(self, payload: bytes, qos: QoS) -> None:
        if len(payload) <= self._config.max_packet and len(payload) <= self._config.max_message:
            return  # the common case, on every send and post: fits whatever the QoS
        with _refused():
            check_message_size(self._config, payload, qos)

    def _hand_over(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None) -> list[int]:
        """Give the engine ``payloads`` in order; their sequence numbers, or RmpdError.  One step: the messages are
        kept as the program's before the drain can deliver them (a group of one delivers at once)."""
        loop = self._require()
        try:
            with _refused(), loop.one_step():
                seqs = loop.send_many(group, payloads, qos, handler)
                if seqs is not None:
                    self._own.sent(group, seqs, qos, self)
        except NotMember:
            assert self._app is not None
            raise RmpdError("not-member", f"this node is {self._app.not_member(group, attached=group in self._groups)}"
                            ) from None
        if seqs is None:
            raise RmpdError("send-refused", f"this node is leaving {group!r}")
        return seqs

    async def _send_batch(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None) -> list[int]:
        """A posted batch: once the group's backlog has room, as a leading sender does."""
        await self._require().wait_for_room(group)
        return self._hand_over(group, payloads, qos, handler)

    async def _post(self, group: str, payload: bytes, qos: QoS, handler: int | None) -> None:
        self._require()
        self._check_size(payload, qos)
        await self._poster.post(group, payload, qos, handler)

    async def _flush(self, group: str) -> None:
        await self._poster.flush(group)

    def _posts_pending(self, group: str) -> int:
        return self._poster.pending(group)

    async def call(self, group: str, payload: bytes, *, handler: int | None = 0,
                   timeout: float = DEFAULT_CALL_TIMEOUT,
                   qos: QoS = QoS.TOTAL) -> bytes | None:
        """Call ``group`` without joining it (see :meth:`rmpd.client.Client.call`)."""
        check_group_name_here(group)
        loop = self._require()
        done, answer = trio.Event(), list[CallAnswered]()
        with _refused(), loop.one_step():  # the answer can come at once (our own one-member group)
            call_id = loop.call(group, bytes(payload), handler=handler, timeout=timeout, qos=qos)
            self._calls[call_id] = (done, answer)
        try:
            with trio.move_on_after(timeout + CALL_GRACE):
                await done.wait()
        finally:
            if self._calls.pop(call_id, None) is not None and not answer:
                loop.cancel_call(call_id)
        if not answer:
            raise RmpdError("call-timeout", CALL_ERRORS["timeout"])
        event = answer[0]
        if event.error is not None:
            raise RmpdError("call-" + event.error, event.reason)
        return event.reply

    async def _reply(self, request: CallRequest, payload: bytes) -> None:
        await trio.lowlevel.checkpoint()
        try:
            with _refused():
                ok = self._require().reply(request.group, request.caller, request.conn, request.stamp, payload)
        except NotMember as exc:
            raise RmpdError("not-member", str(exc)) from None
        if not ok:
            raise RmpdError("stale-call", "that call is not waiting for a reply from this node")

    async def _members(self, group: str) -> tuple[str, list[str]]:
        await trio.lowlevel.checkpoint()
        view = self._require().view(group)
        if view is None:
            raise RmpdError("not-member", f"not in a view of {group!r}")
        return str(view.view_id), list(view.members)

    async def _lock(self, group: str, lock: int, op: str) -> bool:
        self._require()
        assert self._locks is not None
        wait = _Wait()
        try:
            with _refused():
                self._locks.request(group, lock, op, wait, self)  # one owner: this program's tasks share a request
        except NotMember as exc:
            raise RmpdError("not-member", str(exc)) from None
        await wait.done.wait()
        if wait.error is not None:
            raise wait.error
        if not wait.granted:
            raise RmpdError("lock-denied", f"{op} of lock {lock} was refused by the group")
        return True

    async def _leave(self, group: str) -> None:
        """Posts made before the leave go first (as before a send); a refusal among them is raised once left."""
        refused = await self._poster.settle(group)
        try:
            self._require().leave(group)
        except NotMember as exc:
            raise RmpdError("not-joined", str(exc)) from None
        self._groups.pop(group, None)
        await trio.lowlevel.checkpoint()
        if refused is not None:
            raise refused

    # A reader behind: section 4.6

    def _report_undelivered(self, name: str, reason: str, named: EngineUndelivered | None = None) -> None:
        """The membership of ``name`` ended: the program's messages not delivered here, in one event (``named`` by
        the engine as never ordered, or ordered and not delivered here yet)."""
        per_sender, unclaimed = self._own.ended(name, named)
        self.stats["undelivered_unclaimed"] += unclaimed  # a non-member's calls this node relayed
        seqs = per_sender.get(self)
        group = self._groups.get(name)
        if seqs and group is not None:
            self.stats["undelivered_reported"] += len(seqs)
            group._feed_event(Undelivered(seqs, reason, name))

    def _check_overrun(self) -> None:
        """After each drain: a group whose reader has EVENT_BUFFER events unread stops accepting the token until the
        reader is down to half of that (as the daemon does for its clients), instead of dropping deliveries; a
        reader still behind after OVERRUN_GRACE is cut off as a slow consumer, since the ring waits for it."""
        app = self._app
        if app is None or (not app.overrun and all(len(g._events) < EVENT_BUFFER for g in self._groups.values())):
            return  # nobody is behind and no group holds the token back: the common case
        app.check_overrun(list(self._groups.keys() | app.overrun.keys()), self._reader_behind, self._cut_reader)

    def _reader_behind(self, name: str) -> bool:
        group = self._groups.get(name)
        if group is None or group._events.closed:
            return False
        if self._app is not None and name in self._app.overrun:
            return len(group._events) > EVENT_BUFFER // 2
        if len(group._events) < EVENT_BUFFER:
            return False
        group._when_caught_up(EVENT_BUFFER // 2, self._reader_caught_up)
        return True

    def _cut_reader(self, name: str) -> None:
        group = self._groups.get(name)
        if group is not None:
            group._end(RmpdError("slow-consumer", f"the reader of {name!r} fell too far behind"))

    def _reader_caught_up(self) -> None:
        """From the reader, outside any step: what it asks is drained as one step."""
        if self._loop is not None:
            with self._loop.one_step():
                self._check_overrun()

    def handle_events(self, events: list[EngineEvent]) -> None:
        """One drain's events, in order; then whether a reader fell behind."""
        for event in events:
            self._on_event(event)
        self._check_overrun()

    def _on_event(self, event: EngineEvent) -> None:
        if type(event) is Delivered:  # the common case first: one per delivered packet
            if event.src == self._me:
                self._own.delivered(event.group, event.seq, event.qos)
            group = self._groups.get(event.group)
            if group is not None:
                make, src, seq, qos, ts, view, name, handler, answer = (
                    make_delivery, event.src, event.seq, event.qos, event.ts, view_name(event.view), event.group,
                    event.handler, event.answer)
                group._feed_over([make(payload, src, seq, qos, ts, view, name, handler, index, answer)
                                  for index, payload in enumerate(event.payloads)], handler == LIBRARY_HANDLER)
            return
        if isinstance(event, CallAnswered):
            entry = self._calls.get(event.call_id)
            if entry is not None:
                entry[1].append(event)
                entry[0].set()
            return
        group = self._groups.get(event.group)
        if isinstance(event, EngineCallRequest):
            if group is not None:
                group._feed_call(CallRequest(event.payload, event.caller, event.conn, event.stamp, event.handler,
                                             event.group, str(event.view), self._reply))
            return
        if isinstance(event, ViewInstalled):
            if group is not None:
                group._feed_view(ViewChange(str(event.view), tuple(event.members), event.group))
            if self._app is not None:
                self._app.view_installed(event)
        elif isinstance(event, LockResult):
            for wait, _owner in self._locks.answered(event) if self._locks is not None else ():
                wait.granted = event.granted
                wait.done.set()
        elif isinstance(event, EngineUndelivered):
            self._report_undelivered(event.group, event.reason, event)
        elif isinstance(event, Left) and event.rejoining:
            # Cut off or merged: the process joins again by itself and the group goes on in the view that follows
            # (the program is told now); locks do not survive the membership that held them.
            self._report_undelivered(event.group, event.reason)
            if self._app is not None:
                self._app.membership_ended(event)
            if group is not None:
                group._feed_event(Rejoining(event.reason, event.group))
            for wait in self._locks.ended(event.group) if self._locks is not None else ():
                wait.error = RmpdError("left", event.reason)
                wait.done.set()
        elif isinstance(event, Left | JoinFailed):
            if isinstance(event, Left):
                self._report_undelivered(event.group, event.reason)
            if self._app is not None and self._app.ended(event):
                return  # asked to join again while still leaving: joined again (the group waiting is the new one)
            error = RmpdError("join-failed" if isinstance(event, JoinFailed) else "left", event.reason)
            for wait in self._locks.ended(event.group) if self._locks is not None else ():
                wait.error = error
                wait.done.set()
            if group is not None:
                self._groups.pop(event.group, None)
                group._end(error if isinstance(event, JoinFailed) or event.reason != "left" else None)
