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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from rmpd.keyfile import load_key_file
from rmpd.localapi import BAD_REQUEST, DEFAULT_MIN_PARTITION, parse_min_partition
from rmpd.protocol.calls import DEFAULT_CALL_TIMEOUT
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import AlreadyDelivered as EngineAlreadyDelivered
from rmpd.protocol.events import (
    Delivered,
    JoinFailed,
    Left,
    LockResult,
    UndeliveredSends,
    ViewInstalled,
)
from rmpd.protocol.events import Event as EngineEvent
from rmpd.protocol.ids import view_name
from rmpd.protocol.limits import check_message_size
from rmpd.protocol.naming import DEFAULT_RANGE
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER
from rmpd.runtime.adapter import JoinEnd, LockRequests, OwnMessages, ProcessAdapter
from rmpd.runtime.auth import DatagramGuard
from rmpd.runtime.journal import FlushingJournal
from rmpd.runtime.loop import ProcessLoop
from rmpd.runtime.net import interface_address, loopback_interface, packet_limits_for
from rmpd.told import JOIN_END_CODES, TOLD, Told, ending, lock_refusal, view_of

from .backend import Participant
from .batching import Coalescer, Poster, SendBatch
from .calls import NodeCalls
from .errors import RmpdError, check_group_name_here, refused, single_error
from .events import AlreadyDelivered, Rejoining, Undelivered, ViewChange, deliveries_of
from .group import EVENT_BUFFER, Group, GroupInbox
from .joinonce import JoinOnce


class _Wait:
    """A task waiting for the process to answer its join or lock: done, with ``error`` None when granted."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: RmpdError | None = None

    def ok(self, fields: dict[str, Any]) -> None:
        del fields
        self.done.set()

    def fail(self, reason: JoinEnd, message: str) -> None:
        self.error = RmpdError(JOIN_END_CODES[reason], message)
        self.done.set()

    def end(self, error: RmpdError | None) -> None:
        """Answered by the group: granted, or refused with ``error``."""
        self.error = error
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
        self._config = config or EngineConfig(journal=journal is not None, **packet_limits_for(self._ip))
        self._loop: ProcessLoop | None = None
        self._nursery_manager: trio.Nursery | None = None
        self._groups: dict[str, tuple[Group, GroupInbox]] = {}
        """Each joined group, with its inbox (the drain feeds it)."""
        self._locks: LockRequests[_Wait] | None = None
        self._calls = NodeCalls(self._require, self._groups)
        """The program's calls to groups, and the calls its groups hand it to answer."""
        self._poster = Poster(self._send_batch)
        self._coalescer = Coalescer(self._poster, self._hand_over_batch, self._wait_for_room)
        self._app: ProcessAdapter | None = None
        self._pace: ReaderPace | None = None
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
        self._handlers = self._handlers_by_type()

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
        self._app = ProcessAdapter(self._loop, self.stats)
        self._pace = ReaderPace(self._loop, self._app, self._groups)
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
            for _, inbox in self._groups.values():
                inbox.end(stopped)
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
        return await self._join_once.run(name, lambda: self._join(name, ttl, wanted, existing_only, via), state)

    async def _join(self, name: str, ttl: int | None, min_partition: int, existing_only: bool,
                    via: str | None) -> Group:
        loop = self._require()
        if name in self._groups and loop.is_member(name):
            return self._groups[name][0]
        inbox = GroupInbox(name)
        group = Group(self, inbox)
        self._groups[name] = group, inbox
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
            inbox.joined(str(view.view_id), view.members)
        return group

    # Backend of Group (rmpd.client.backend.Backend): what a Group of this node calls

    def participant(self) -> Participant:
        # One program per node and group: the process is the participant (number 0).
        return Participant(self._me, 0, self._config.max_message, self._spawn)

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self._nursery_manager is not None
        self._nursery_manager.start_soon(task)

    async def send(self, group: str, payload: bytes, qos: QoS, handler: int | None, key: bytes | None = None) -> int:
        """Sends from concurrent tasks are coalesced (rmpd.client.batching) and handed to the engine in one call,
        which packs them into as few packets as they fit.  A message the group cannot carry is refused alone,
        before it joins a batch, so it never costs the other senders theirs."""
        self._require()
        self._check_size(payload, qos)
        return await self._coalescer.send(group, payload, qos, handler, key)

    async def _hand_over_batch(self, group: str, batch: SendBatch, qos: QoS, handler: int | None) -> None:
        batch.seqs = self._hand_over(group, batch.payloads, qos, handler, batch.keys)

    async def _wait_for_room(self, group: str) -> None:
        await self._require().wait_for_room(group)

    def _check_size(self, payload: bytes, qos: QoS) -> None:
        if len(payload) <= self._config.max_packet and len(payload) <= self._config.max_message:
            return  # the common case, on every send and post: fits whatever the QoS
        with refused():
            check_message_size(self._config, payload, qos)

    def _hand_over(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None,
                   keys: list[bytes] | None = None, post_id: int | None = None) -> list[int]:
        """Give the engine ``payloads`` in order (with their ``keys``, or the ``post_id`` of the first); their
        sequence numbers, or RmpdError.  One step: the messages are kept as the program's before the drain can
        deliver them (a group of one delivers at once)."""
        loop = self._require()
        ids: list[bytes] | range | None = keys
        if keys is None and post_id is not None:
            ids = range(post_id, post_id + len(payloads))
        try:
            with refused(), loop.one_step():
                if keys is None:
                    seqs = loop.send_many(group, payloads, qos, handler)
                else:
                    seqs = loop.send_many(group, payloads, qos, handler, keys)
                if seqs is not None:
                    self._own.sent(group, seqs, qos, self, ids)
        except NotMember:
            assert self._app is not None
            raise RmpdError("not-member", f"this node is {self._app.not_member(group, attached=group in self._groups)}"
                            ) from None
        if seqs is None:
            raise RmpdError("send-refused", f"this node is leaving {group!r}")
        return seqs

    async def _send_batch(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None,
                          keys: list[bytes] | None, post_id: int | None) -> list[int]:
        """A posted batch: once the group's backlog has room, as a leading sender does."""
        await self._require().wait_for_room(group)
        return self._hand_over(group, payloads, qos, handler, keys, post_id)

    async def post(self, group: str, payload: bytes, qos: QoS, handler: int | None,
                   key: bytes | None = None) -> bytes | int:
        self._require()
        self._check_size(payload, qos)
        return await self._poster.post(group, payload, qos, handler, key)

    async def flush(self, group: str) -> None:
        await self._poster.flush(group)

    def posts_pending(self, group: str) -> int:
        return self._poster.pending(group)

    async def call(self, group: str, payload: bytes, *, handler: int | None = 0,
                   timeout: float = DEFAULT_CALL_TIMEOUT,
                   qos: QoS = QoS.TOTAL) -> bytes | None:
        """Call ``group`` without joining it (see :meth:`rmpd.client.Client.call`)."""
        return await self._calls.call(group, payload, handler=handler, timeout=timeout, qos=qos)

    async def members(self, group: str) -> tuple[str, list[str]]:
        await trio.lowlevel.checkpoint()
        view = self._require().view(group)
        if view is None:
            raise RmpdError("not-member", f"not in a view of {group!r}")
        return str(view.view_id), list(view.members)

    async def lock(self, group: str, lock: int, op: str) -> bool:
        self._require()
        assert self._locks is not None
        wait = _Wait()
        try:
            with refused():
                self._locks.request(group, lock, op, wait, self)  # one owner: this program's tasks share a request
        except NotMember as exc:
            raise RmpdError("not-member", str(exc)) from None
        await wait.done.wait()
        if wait.error is not None:
            raise wait.error
        return True

    async def leave(self, group: str) -> None:
        """Posts made before the leave go first (as before a send); a refusal among them is raised once left."""
        refused = await self._poster.settle(group)
        try:
            self._require().leave(group)
        except NotMember as exc:
            raise RmpdError("not-joined", str(exc)) from None
        joined = self._groups.pop(group, None)
        if joined is not None:
            joined[1].end()
        await trio.lowlevel.checkpoint()
        if refused is not None:
            raise refused

    # Engine events, each to what the program is told of it (rmpd.told)

    def handle_events(self, events: list[EngineEvent]) -> None:
        """One drain's events, in order; then whether a reader fell behind."""
        handlers = self._handlers
        for event in events:
            handlers[type(event)](event)
        if self._pace is not None:
            self._pace.check()

    def _handlers_by_type(self) -> dict[type, Callable[[Any], None]]:
        """The handler of each kind of engine event: the one for what a program is told of it (rmpd.told.TOLD)."""
        by_told: dict[Told, Callable[[Any], None]] = {
            Told.DELIVERIES: self._delivered, Told.VIEW: self._view_installed, Told.UNDELIVERED: self._undelivered,
            Told.ALREADY_DELIVERED: self._already_delivered,
            Told.ENDED: self._ended, Told.CALL: self._calls.requested, Told.LOCK_ANSWER: self._lock_answered,
            Told.CALL_ANSWER: self._calls.answered, Told.NOTHING: _not_told}
        return {kind: by_told[told] for kind, told in TOLD.items()}

    def _delivered(self, event: Delivered) -> None:
        """The common case: one per delivered packet."""
        name = event.group
        if event.src == self._me:
            self._own.delivered(name, event.seq, event.qos)
        joined = self._groups.get(name)
        if joined is not None:
            handler = event.handler
            joined[1].deliver_now(deliveries_of(name, event.src, event.seq, event.qos, event.ts, view_name(event.view),
                                                handler, event.payloads, 0, event.answer, event.keys),
                                  handler == LIBRARY_HANDLER)

    def _already_delivered(self, event: EngineAlreadyDelivered) -> None:
        """A keyed message of the program's that the group dropped as a copy: done, as if delivered, and the
        program is told where the group delivered the key."""
        self._own.already_delivered(event.group, event.seq, event.key)
        joined = self._groups.get(event.group)
        if joined is not None:
            joined[1].tell_now(AlreadyDelivered(event.key, event.ts, view_name(event.view), event.group))

    def _view_installed(self, event: ViewInstalled) -> None:
        joined = self._groups.get(event.group)
        if joined is not None:
            joined[1].tell_now(ViewChange(*view_of(event), event.group))
        if self._app is not None:
            self._app.view_installed(event)

    def _undelivered(self, event: UndeliveredSends) -> None:
        self._report_undelivered(event.group, event.reason, event)

    def _report_undelivered(self, name: str, reason: str, named: UndeliveredSends | None = None) -> None:
        """The membership of ``name`` ended: the program's messages not delivered here, in one event (``named`` by
        the engine as never ordered, or ordered and not delivered here yet)."""
        per_sender, unclaimed = self._own.ended_named(name, named)
        self.stats["undelivered_unclaimed"] += unclaimed  # a non-member's calls this node relayed
        lost = per_sender.get(self)
        joined = self._groups.get(name)
        if lost is not None and joined is not None:
            self.stats["undelivered_reported"] += len(lost.seqs)
            joined[1].tell_now(Undelivered(lost.seqs, reason, name, lost.ids))

    def _ended(self, event: Left | JoinFailed) -> None:
        """The membership (or the join) ended: the process rejoins by itself, or the group is over."""
        end, name = ending(event), event.group
        if isinstance(event, Left):
            self._report_undelivered(name, end.reason)
        if end.rejoining:
            # Cut off or merged: the process joins again by itself and the group goes on in the view that follows
            # (the program is told now); locks do not survive the membership that held them.
            if self._app is not None:
                self._app.membership_ended(event)
            joined = self._groups.get(name)
            if joined is not None:
                joined[1].tell_now(Rejoining(end.reason, name))
        elif self._app is not None and self._app.ended(event):
            return  # asked to join again while still leaving: joined again (the group waiting is the new one)
        error = RmpdError(end.code, end.reason)
        for wait in self._locks.ended(name) if self._locks is not None else ():
            wait.end(error)
        if not end.rejoining:
            joined = self._groups.pop(name, None)
            if joined is not None:
                joined[1].end(None if end.asked else error)

    def _lock_answered(self, event: LockResult) -> None:
        refusal = lock_refusal(event)
        error = RmpdError(*refusal) if refusal is not None else None
        for wait, _owner in self._locks.answered(event) if self._locks is not None else ():
            wait.end(error)


class ReaderPace:
    """A reader behind on an embedded node (section 4.6): checked after each drain, a group whose reader has
    EVENT_BUFFER events unread stops accepting the token until the reader is down to half of that (as the daemon
    does for its clients), instead of dropping deliveries; a reader still behind after OVERRUN_GRACE is cut off as
    a slow consumer, since the ring waits for it."""

    def __init__(self, loop: ProcessLoop, app: ProcessAdapter, groups: dict[str, tuple[Group, GroupInbox]]) -> None:
        self._loop = loop
        self._app = app
        self._groups = groups
        """The node's joined groups (the node adds and removes them)."""

    def check(self) -> None:
        app = self._app
        if not app.overrun and all(len(inbox.events) < EVENT_BUFFER for _, inbox in self._groups.values()):
            return  # nobody is behind and no group holds the token back: the common case
        app.check_overrun(list(self._groups.keys() | app.overrun.keys()), self._behind, self._cut)

    def _behind(self, name: str) -> bool:
        joined = self._groups.get(name)
        if joined is None or joined[1].ended:
            return False
        inbox = joined[1]
        if name in self._app.overrun:
            return inbox.unread() > EVENT_BUFFER // 2
        if inbox.unread() < EVENT_BUFFER:
            return False
        inbox.when_caught_up(EVENT_BUFFER // 2, self._caught_up)
        return True

    def _cut(self, name: str) -> None:
        joined = self._groups.get(name)
        if joined is not None:
            joined[1].end(RmpdError("slow-consumer", f"the reader of {name!r} fell too far behind"))

    def _caught_up(self) -> None:
        """From the reader, outside any step: what it asks is drained as one step."""
        with self._loop.one_step():
            self.check()


def _not_told(event: EngineEvent) -> None:
    """An event of the process's own (rmpd.told.Told.NOTHING): an embedded node answers no status queries, and a
    send the engine refuses is refused to its caller at once."""
    del event
