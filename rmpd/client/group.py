"""The Group API shared by a daemon connection and an embedded node, and the inbox its backend feeds.

A Group only knows its name, its inbox (:class:`GroupInbox`: what the process hands it), and a backend that carries
out requests; the two backends (:class:`rmpd.client.connection.Client` and :class:`rmpd.client.node.Node`)
implement the same few methods (:class:`rmpd.client.backend.Backend`) and feed the inbox alike, so programs can
switch between talking to the local daemon and being an RMP process themselves.

A backend (the daemon connection's reader task, or the embedded node's drain) holds one inbox per joined group and
feeds it: a batch of deliveries, a view change, what the program is told about its membership (``Undelivered``,
``Rejoining``), a non-member's call, the end.  Each feeding call comes in two kinds: one that waits while the
program is behind (the connection: the socket then fills and the daemon applies its overrun rule), and one that
never waits (``*_now``: the node, which runs inside the process's drain and slows the group itself instead).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

from rmpd.localapi import MAX_KEY
from rmpd.protocol.qos import Level, QoS
from rmpd.protocol.view import LIBRARY_HANDLER

from .backend import Backend
from .errors import RmpdError, check_key_here
from .events import AlreadyDelivered, CallRequest, Delivery, Event, MessageId, Rejoining, Undelivered, ViewChange
from .state import CHUNK_SIZE, STATE_QOS, StateTransfer

EVENT_BUFFER = 10_000
"""Events a group holds for its program before the backend waits (or, on a node, slows the group)."""

CallPair = tuple[trio.MemorySendChannel[CallRequest], trio.MemoryReceiveChannel[CallRequest]]

YIELD_EVERY = 64
"""Events ``get`` returns from the buffer before it lets other tasks run."""

T = TypeVar("T")


class EventBuffer(Generic[T]):
    """Bounded FIFO between one producer (a backend) and the application: a group's events waiting to be read.

    A busy group hands the application tens of thousands of deliveries a second.  A trio memory channel costs two
    scheduling steps per item (one to put, one to take), which was most of what the client library spent per
    delivery; here the backend puts a whole frame's events at once, and ``get`` takes a buffered event without giving
    up the CPU.  ``get`` stays a cancellation point on every call, and still yields to other tasks once every
    :data:`YIELD_EVERY` events, so a reader of a flooded group cannot starve the rest of the program.

    The bound is in events: a backend that may wait (:meth:`put_many`) waits while the buffer holds ``limit`` or
    more, so a slow reader slows the connection (and, through the daemon's overrun rule, the ring); one that may not
    (:meth:`put_nowait`) is told the buffer is full, or queues past the bound (:meth:`put_over`) and slows the ring
    itself (asking, with :meth:`when_down_to`, to hear when the reader has caught up).
    """

    __slots__ = ("_closed", "_down_to", "_getters", "_items", "_limit", "_low_water", "_putters", "_reader_parked",
                 "_since_yield")

    def __init__(self, limit: int) -> None:
        self._items: deque[T] = deque()
        self._limit = limit
        self._closed = False
        self._getters = trio.lowlevel.ParkingLot()
        self._putters = trio.lowlevel.ParkingLot()
        self._since_yield = 0
        self._reader_parked = False
        """A reader waits in ``get``: putting must wake it (checked per event; trio's ParkingLot.__bool__ is a
        Python call)."""
        self._down_to: Callable[[], None] | None = None
        self._low_water = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put_nowait(self, item: T) -> bool:
        """Queue one event; False when the buffer is full or closed."""
        if self._closed or len(self._items) >= self._limit:
            return False
        self._items.append(item)
        if self._reader_parked:
            self._wake_readers()
        return True

    def put_over(self, items: Sequence[T]) -> int:
        """Queue events even past the bound (dropped once closed); the number of events queued.  For a backend
        that cannot wait and must not drop what the group delivered: it slows the group itself once the buffer is
        long (the embedded node's overrun rule), and the protocol bounds what still arrives meanwhile."""
        if not self._closed:
            self._items.extend(items)
            if self._reader_parked:
                self._wake_readers()
        return len(self._items)

    async def put_many(self, items: Sequence[T]) -> None:
        """Queue events in order, waiting while the buffer is full (dropped once it is closed)."""
        start = 0
        while start < len(items):
            while len(self._items) >= self._limit and not self._closed:
                await self._putters.park()
            if self._closed:
                return
            room = self._limit - len(self._items)
            self._items.extend(items[start:start + room])
            start += room
            if self._reader_parked:
                self._wake_readers()

    def _wake_readers(self) -> None:
        """Readers parked in ``get`` run again (a busy reader is rarely parked, so puts check the flag first)."""
        self._reader_parked = False
        self._getters.unpark_all()

    def close(self, last: T | None = None) -> None:
        """No more events; ``last`` (an error for the reader) goes after the queued ones, whatever the bound."""
        if self._closed:
            return
        self._closed = True
        if last is not None:
            self._items.append(last)
        self._getters.unpark_all()
        self._putters.unpark_all()

    def when_down_to(self, backlog: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, from the reader, when a take leaves no more than ``backlog`` events."""
        self._low_water, self._down_to = backlog, callback

    async def get(self) -> T:
        """The next event; raises trio.EndOfChannel once the buffer is closed and empty."""
        await self._wait_for_items(1)
        item = self._items.popleft()
        self._taken()
        return item

    async def get_many(self, limit: int) -> list[T]:
        """Every queued event up to ``limit``, at least one (waiting for it); raises trio.EndOfChannel once the
        buffer is closed and empty.  One call, one list: a reader of a busy group pays its per-event overhead once
        per batch instead of once per event."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        await self._wait_for_items(limit)
        items = self._items
        batch = [items.popleft() for _ in range(min(limit, len(items)))]
        self._taken()
        return batch

    async def _wait_for_items(self, taking: int) -> None:
        """A cancellation point; returns once something is queued, yielding to other tasks after every
        YIELD_EVERY events taken without waiting."""
        await trio.lowlevel.checkpoint_if_cancelled()
        items = self._items
        if items:
            self._since_yield += min(taking, len(items))
            if self._since_yield >= YIELD_EVERY:
                self._since_yield = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
        while not items:
            if self._closed:
                raise trio.EndOfChannel
            self._since_yield = 0
            self._reader_parked = True
            try:
                await self._getters.park()
            finally:
                self._reader_parked = bool(self._getters)

    def _taken(self) -> None:
        if self._putters and len(self._items) < self._limit:
            self._putters.unpark_all()
        if self._down_to is not None and len(self._items) <= self._low_water:
            callback, self._down_to = self._down_to, None
            callback()


class GroupInbox:
    """One joined group's events and calls on their way to the program, and the view they leave it in.

    The backend feeds it; the Group reads ``events`` and ``requests_for``.  The Group hears through ``attach`` of
    the two things it acts on itself: deliveries of the client library's own messages arrived (state transfer
    runs from then on), and the inbox ended.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.view = ""
        self.members: tuple[str, ...] = ()
        self.state_peers = 0
        """Other programs taking part in the state transfer through this backend's process when this one joined
        (clients of one daemon): with any, the program is not alone with the state, whatever the view."""
        self.events: EventBuffer[Event | RmpdError] = EventBuffer(EVENT_BUFFER)
        self.unread_calls_dropped = 0
        """Calls that arrived while EVENT_BUFFER calls for their handler were already waiting to be read."""
        self._calls: dict[int, CallPair] = {}
        self._on_library: Callable[[], object] = _nothing
        self._on_end: Callable[[], None] = _nothing

    def attach(self, on_library: Callable[[], object], on_end: Callable[[], None]) -> None:
        """The reader's two hooks: ``on_library`` when deliveries carry the client library's own messages,
        ``on_end`` once the inbox ends."""
        self._on_library, self._on_end = on_library, on_end

    # What the backend hands over

    def joined(self, view: str, members: Sequence[str], state_peers: int = 0) -> None:
        """The view the join answered with (no event for the program), and the state transfer's peers then."""
        self.set_view(view, members)
        self.state_peers = state_peers

    def set_view(self, view: str, members: Sequence[str]) -> None:
        """The view as the process last told it outside the events (a join, a members request)."""
        self.view, self.members = view, tuple(members)

    async def deliver(self, deliveries: list[Delivery], library: bool = False) -> None:
        """Queue a batch of deliveries (a frame's), waiting while the buffer is full; ``library``: some are the
        client library's own messages."""
        if library:
            self._on_library()
        await self.events.put_many(deliveries)

    def deliver_now(self, deliveries: list[Delivery], library: bool = False) -> int:
        """Queue a batch of deliveries even past EVENT_BUFFER; the number of events unread (the node then slows
        the group)."""
        if library:
            self._on_library()
        return self.events.put_over(deliveries)

    async def tell(self, event: ViewChange | Undelivered | AlreadyDelivered | Rejoining) -> None:
        """Queue a view change or what the program is told about its membership, waiting while the buffer is
        full."""
        if type(event) is ViewChange:
            self.view, self.members = event.view, event.members
        await self.events.put_many((event,))

    def tell_now(self, event: ViewChange | Undelivered | AlreadyDelivered | Rejoining) -> None:
        """Queue it even past EVENT_BUFFER: a reader behind still sees every view and every word about its
        membership, in its place among the deliveries (the embedded node slows the group meanwhile)."""
        if type(event) is ViewChange:
            self.view, self.members = event.view, event.members
        self.events.put_over((event,))

    def call(self, request: CallRequest) -> None:
        """A non-member's call for the program to answer; dropped (counted) while EVENT_BUFFER calls for its
        handler are unread: the caller times out, and the call is never run."""
        try:
            self.requests_for(request.handler)[0].send_nowait(request)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.unread_calls_dropped += 1

    def end(self, error: RmpdError | None = None) -> None:
        """No more events; iteration ends (or raises ``error`` once the queued events are read)."""
        if self.events.closed:
            return
        self.events.close(error)
        for tx, _ in self._calls.values():
            tx.close()
        self._on_end()

    # What the backend reads

    @property
    def ended(self) -> bool:
        return self.events.closed

    def unread(self) -> int:
        return len(self.events)

    def when_caught_up(self, backlog: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, from the reader, when no more than ``backlog`` events are left to read."""
        self.events.when_down_to(backlog, callback)

    # What the Group reads

    def requests_for(self, handler: int) -> CallPair:
        """The channel of ``handler``'s calls (made on first use; closed at once after the end, so that iterating
        it ends)."""
        pair = self._calls.get(handler)
        if pair is None:
            pair = self._calls[handler] = trio.open_memory_channel[CallRequest](EVENT_BUFFER)
            if self.events.closed:
                pair[0].close()
        return pair


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class GroupStatistics:
    """What a group holds for the program at one moment (``Group.statistics``), as trio's channels report theirs."""

    events_queued: int
    """Deliveries, view changes and the rest received and not yet read."""
    posts_pending: int
    """Messages posted to the group and not yet accepted or refused."""
    unread_calls_dropped: int
    """Calls that arrived while EVENT_BUFFER calls for their handler were already waiting to be read."""
    state_chunks_sent: int = 0
    """Chunks of this program's state sent to joiners (``provide_state``)."""


class Group:
    """A joined group: send to it, iterate its deliveries and view changes, inspect and lock, leave.

    Iterating also yields :class:`Undelivered` (messages this program sent that it will not see delivered: the
    membership ended first), :class:`AlreadyDelivered` (a keyed message of this program's that the group dropped,
    having delivered its key already) and :class:`Rejoining` (the membership ended by itself and the process joins
    again; the Group goes on with the next ViewChange).  A backend makes one with the group's inbox, which it feeds."""

    def __init__(self, backend: Backend, inbox: GroupInbox) -> None:
        self._backend = backend
        self.name = inbox.name
        self._inbox = inbox
        self._events = inbox.events
        self._state: StateTransfer | None = None
        self._looking = False
        """Events are looked at one by one as the program reads them (the client library's own messages were
        delivered, or state transfer is in use); otherwise they are handed over as queued."""
        self._ready: deque[Event] = deque()
        """Looked at, for the program to read next (a state, and the deliveries held back behind it)."""
        self._backlog: deque[Event | RmpdError] = deque()
        """Taken from the queue and not yet looked at: a batch ends before an event that needs the program to
        have handled every event before it."""
        inbox.attach(self._transfer, self._close_state)

    @property
    def view(self) -> str:
        """The ID of the last view this group saw (``creator-ip:port/counter``)."""
        return self._inbox.view

    @property
    def unread_calls_dropped(self) -> int:
        """Calls that arrived while EVENT_BUFFER calls for their handler were already waiting to be read."""
        return self._inbox.unread_calls_dropped

    def _transfer(self) -> StateTransfer:
        """This group's state transfers; from now on events are looked at as the program reads them."""
        if self._state is None:
            who = self._backend.participant()
            self._state = StateTransfer(self.name, who.process_id, self._send_library, who.spawn,
                                        who.largest_message, who.number)
        self._looking = True
        return self._state

    def _close_state(self) -> None:
        if self._state is not None:
            self._state.close()

    async def _send_library(self, payload: bytes) -> int:
        return await self._backend.send(self.name, payload, STATE_QOS, LIBRARY_HANDLER)

    async def _ask_state(self) -> None:
        """Ask for the group's state (the program joined with ``state=True``): the program's first event."""
        inbox = self._inbox
        self._ready.extend(await self._transfer().ask_first(inbox.view, list(inbox.members), inbox.state_peers))

    # The API

    async def send(self, payload: bytes, *, qos: QoS = QoS.TOTAL, handler: int | None = None,
                   key: bytes | None = None) -> int:
        """Multicast ``payload`` to the group; returns its per-source sequence number once the process accepted
        and numbered it.  From then on it is either delivered in the group (this program sees its own Delivery) or
        named by an :class:`Undelivered` event, with the reason; unreliable messages promise neither.  Refused
        with RmpdError instead: ``not-member`` while the process is between memberships (rejoining: retry after
        the next ViewChange), ``send-refused`` while it leaves, ``message-too-large``.  A connection to the daemon
        lost first (ConnectionLost, which also ends the iteration) leaves unknown what became of the messages not
        yet seen delivered.

        ``key`` (1..255 bytes, total order and above, else ``bad-key``): the group delivers the key at most once.
        A program that sends the same payload with the same key again after an Undelivered, a lost connection or
        a refusal sees either its Delivery (``Delivery.key``) or an :class:`AlreadyDelivered` for a copy the group
        dropped: either way the message is done (README, "Exactly once")."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        if handler == LIBRARY_HANDLER:  # compared here, not in a function: this runs once per message
            raise _library_handler()
        if key is not None:
            key = _checked_key(key, qos)
        return await self._backend.send(self.name, bytes(payload), qos, handler, key)

    async def post(self, payload: bytes, *, qos: QoS = QoS.TOTAL, handler: int | None = None,
                   key: bytes | None = None) -> MessageId:
        """Multicast ``payload`` without waiting for the group to accept it, as Spread's and Corosync's multicast
        calls do: for a program that streams messages from one task.  Posts to a group go in the order made,
        before any later send.  Returns the message's identity, what an :class:`Undelivered` names it by in its
        ``ids``: its ``key`` (as for ``send``), or, without one, the number the library gave it (1 for the first
        message posted to the group, then 2, ...).  Waits only while many posted messages are not yet accepted
        (the ring's pace).  A refusal (message too large for the daemon, the group being left, the connection
        lost) is raised by the next ``post``, ``send`` or ``flush`` to this group."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        if handler == LIBRARY_HANDLER:
            raise _library_handler()
        if key is not None:
            key = _checked_key(key, qos)
        return await self._backend.post(self.name, bytes(payload), qos, handler, key)

    async def flush(self) -> None:
        """Wait until every message posted to this group is accepted; raises the first refusal, if any."""
        await self._backend.flush(self.name)

    @property
    def known_members(self) -> list[str]:
        """The member list of the last view this group saw (no round trip; ``members()`` asks afresh)."""
        return list(self._inbox.members)

    async def members(self) -> list[str]:
        """The current view's ordered member list (process IDs)."""
        view, members = await self._backend.members(self.name)
        self._inbox.set_view(view, members)
        return list(members)

    async def lock(self, n: int) -> bool:
        """Take lock ``n`` in the group's view (0..5 are handler locks); RmpdError if refused."""
        return await self._backend.lock(self.name, n, "lock")

    async def unlock(self, n: int) -> bool:
        return await self._backend.lock(self.name, n, "unlock")

    async def requests(self, handler: int = 0) -> AsyncIterator[CallRequest]:
        """Calls from non-members to ``handler``, while this program holds that handler lock (``await
        group.lock(handler)`` first): ``async for request in group.requests(0): await request.reply(b"...")``."""
        rx = self._inbox.requests_for(handler)[1]
        async for request in rx:
            yield request

    async def leave(self) -> None:
        """Leave the group; its iteration ends, also when this call is cancelled after asking (the backend may
        then have left already, and nothing would end the readers)."""
        try:
            await self._backend.leave(self.name)
        finally:
            self._inbox.end()

    def provide_state(self, snapshot: Callable[[], bytes], *, chunk_size: int = CHUNK_SIZE) -> None:
        """Offer this program's state to programs that join with ``state=True`` (rmpd.client.state).

        ``snapshot()`` is called, from the task reading the group, when the program has read every event before
        a joiner's request and not the events after it: it must return the state as it stands then, with every
        delivery read so far applied.  A program that itself joined with ``state=True`` offers once its own
        :class:`State` is in.  Its snapshot travels in ``chunk_size`` byte messages, totally ordered."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        state = self._transfer()
        state.provider, state.chunk_size = snapshot, chunk_size

    def statistics(self) -> GroupStatistics:
        """A snapshot of what this group holds unread and unsent; for monitoring, and for tests to assert on."""
        return GroupStatistics(len(self._events) + len(self._ready) + len(self._backlog),
                               self._backend.posts_pending(self.name), self._inbox.unread_calls_dropped,
                               self._state.chunks_sent if self._state is not None else 0)

    def __aiter__(self) -> Group:
        return self

    async def __anext__(self) -> Event:
        if self._looking:
            return await self._next_looked_at()
        try:
            item = await self._events.get()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if self._looking:  # the client library's own messages arrived meanwhile
            self._backlog.append(item)
            return await self._next_looked_at()
        if isinstance(item, RmpdError):
            raise item
        return item

    async def _next_looked_at(self) -> Event:
        state = self._transfer()
        backlog = self._backlog
        while not self._ready:
            if not backlog:
                backlog.extend(await self._take(YIELD_EVERY))
            item = backlog.popleft()
            if isinstance(item, RmpdError):
                raise item
            self._ready.extend(state.look_at(item))
        return self._ready.popleft()

    async def _take(self, limit: int) -> list[Event | RmpdError]:
        """Up to ``limit`` queued events, at least one; while the program waits for its state, until the state's
        deadline (then the group is left and ``state-unavailable`` raised).  StopAsyncIteration at the end."""
        state = self._transfer()
        with trio.move_on_at(state.deadline if state.waiting else math.inf):
            try:
                return await self._events.get_many(limit)
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
        error = state.timed_out()
        with contextlib.suppress(RmpdError):
            await self.leave()
        raise error

    async def _looked_at_batch(self, max_events: int) -> list[Event]:
        """The next batch on the looked-at path: it ends before an event that needs the program to have handled
        every event before it (a joiner's request, where a snapshot is taken)."""
        state = self._transfer()
        ready = self._ready
        while not ready:
            if self._backlog:
                items = list(self._backlog)
                self._backlog.clear()
            else:
                items = await self._take(max_events)
            for at, item in enumerate(items):
                if ready and (isinstance(item, RmpdError) or state.needs_caught_up(item)):
                    self._backlog.extend(items[at:])
                    break
                if isinstance(item, RmpdError):
                    raise item
                ready.extend(state.look_at(item))
        return [ready.popleft() for _ in range(min(max_events, len(ready)))]

    async def batches(self, max_events: int = 1024) -> AsyncIterator[list[Event]]:
        """The same events as iterating the group, as lists of what has arrived (at most ``max_events``, at least
        one): ``async for batch in group.batches(): ...``.  For a program that reads a busy group, as JGroups'
        ``receive(MessageBatch)``: one wake-up per list instead of per event.  Ends, or raises the error that ended
        the group, after the events before it."""
        while True:
            if self._looking:
                try:
                    yield await self._looked_at_batch(max_events)
                except StopAsyncIteration:
                    return
                continue
            try:
                items = await self._events.get_many(max_events)
            except trio.EndOfChannel:
                return
            if self._looking:  # the client library's own messages arrived meanwhile
                self._backlog.extend(items)
                continue
            error = items.pop() if isinstance(items[-1], RmpdError) else None  # an error is always the last event
            if items:
                yield items
            if error is not None:
                raise error


_TOTAL = Level.TOTAL
"""Read once: an enum member looked up on its class costs more than the rest of the check below."""


def _checked_key(key: bytes, qos: QoS) -> bytes:
    """``key`` as bytes, or RmpdError ``bad-key`` (TypeError for a key that is no bytes)."""
    if type(key) is bytes and 0 < len(key) <= MAX_KEY and qos.level >= _TOTAL:
        return key  # the common case, checked inline: a streaming sender passes here for every message
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError("key must be bytes")
    key = bytes(key)
    check_key_here(key, qos)
    return key


def _library_handler() -> RmpdError:
    return RmpdError("bad-request", f"handler {LIBRARY_HANDLER} carries the client library's own messages; "
                                    f"a program's are 0..{LIBRARY_HANDLER - 1}")
