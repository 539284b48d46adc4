"""The Group API shared by a daemon connection and an embedded node.

A Group only knows its name, its event stream, and a backend that carries out requests; the two backends
(:class:`rmpd.client.connection.Client` and :class:`rmpd.client.node.Node`) implement the same few coroutines,
so programs can switch between talking to the local daemon and being an RMP process themselves.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import trio

from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER

from .errors import RmpdError
from .events import CallRequest, Delivery, Event, Rejoining, Undelivered, ViewChange
from .state import CHUNK_SIZE, STATE_QOS, StateTransfer

EVENT_BUFFER = 10_000

T = TypeVar("T")

YIELD_EVERY = 64
"""Events ``get`` returns from the buffer before it lets other tasks run."""


class EventQueue(Generic[T]):
    """Bounded FIFO between one producer (a backend) and the application: a group's events waiting to be read.

    A busy group hands the application tens of thousands of deliveries a second.  A trio memory channel costs two
    scheduling steps per item (one to put, one to take), which was most of what the client library spent per
    delivery; here the backend puts a whole frame's events at once, and ``get`` takes a buffered event without giving
    up the CPU.  ``get`` stays a cancellation point on every call, and still yields to other tasks once every
    :data:`YIELD_EVERY` events, so a reader of a flooded group cannot starve the rest of the program.

    The bound is in events: a backend that may wait (:meth:`put_many`) waits while the queue holds ``limit`` or more,
    so a slow reader slows the connection (and, through the daemon's overrun rule, the ring); one that may not
    (:meth:`put_nowait`) is told the queue is full, or queues past the bound (:meth:`put_over`) and slows the ring
    itself.
    """

    __slots__ = ("_closed", "_getters", "_items", "_limit", "_putters", "_reader_parked", "_since_yield")

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

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put_nowait(self, item: T) -> bool:
        """Queue one event; False when the queue is full or closed."""
        if self._closed or len(self._items) >= self._limit:
            return False
        self._items.append(item)
        if self._reader_parked:
            self._wake_readers()
        return True

    def put_over(self, items: Sequence[T]) -> int:
        """Queue events even past the bound (dropped once closed); the number of events queued.  For a backend
        that cannot wait and must not drop what the group delivered: it slows the group itself once the queue is
        long (the embedded node's overrun rule), and the protocol bounds what still arrives meanwhile."""
        if not self._closed:
            self._items.extend(items)
            if self._reader_parked:
                self._wake_readers()
        return len(self._items)

    async def put_many(self, items: Sequence[T]) -> None:
        """Queue events in order, waiting while the queue is full (dropped once it is closed)."""
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

    async def get(self) -> T:
        """The next event; raises trio.EndOfChannel once the queue is closed and empty."""
        await self._wait_for_items(1)
        item = self._items.popleft()
        self._taken()
        return item

    async def get_many(self, limit: int) -> list[T]:
        """Every queued event up to ``limit``, at least one (waiting for it); raises trio.EndOfChannel once the
        queue is closed and empty.  One call, one list: a reader of a busy group pays its per-event overhead once
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


class Backend(Protocol):
    def _process_id(self) -> str: ...
    def _client_number(self) -> int: ...
    def _largest_message(self) -> int: ...
    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None: ...
    def _posts_pending(self, group: str) -> int: ...
    async def _send(self, group: str, payload: bytes, qos: QoS, handler: int | None) -> int: ...
    async def _post(self, group: str, payload: bytes, qos: QoS, handler: int | None) -> None: ...
    async def _flush(self, group: str) -> None: ...
    async def _members(self, group: str) -> tuple[str, list[str]]: ...
    async def _lock(self, group: str, lock: int, op: str) -> bool: ...
    async def _leave(self, group: str) -> None: ...


class Group:
    """A joined group: send to it, iterate its deliveries and view changes, inspect and lock, leave.

    Iterating also yields :class:`Undelivered` (messages this program sent that it will not see delivered: the
    membership ended first) and :class:`Rejoining` (the membership ended by itself and the process joins again;
    the Group goes on with the next ViewChange)."""

    def __init__(self, backend: Backend, name: str, view: str, members: list[str]) -> None:
        self._backend = backend
        self.name = name
        self.view = view
        self._members = list(members)
        self._events: EventQueue[Event | RmpdError] = EventQueue(EVENT_BUFFER)
        self._closed = False
        self._calls: dict[int, tuple[trio.MemorySendChannel[CallRequest], trio.MemoryReceiveChannel[CallRequest]]] = {}
        self.unread_calls_dropped = 0
        """Calls that arrived while EVENT_BUFFER calls for their handler were already waiting to be read."""
        self._caught_up: Callable[[], None] | None = None
        self._caught_up_at = 0
        self._state: StateTransfer | None = None
        self._state_peers = 0
        """Other programs taking part in the state transfer through this backend's process when this one joined
        (clients of one daemon): with any, the program is not alone with the state, whatever the view."""
        self._looking = False
        """Events are looked at one by one as the program reads them (the client library's own messages were
        delivered, or state transfer is in use); otherwise they are handed over as queued."""
        self._ready: deque[Event] = deque()
        """Looked at, for the program to read next (a state, and the deliveries held back behind it)."""
        self._backlog: deque[Event | RmpdError] = deque()
        """Taken from the queue and not yet looked at: a batch ends before an event that needs the program to
        have handled every event before it."""

    # Feeding (by the backend)

    def _feed_view(self, event: ViewChange) -> None:
        """Queue a view change even past EVENT_BUFFER: a reader behind still sees every view, in its place
        among the deliveries (the embedded node slows the group meanwhile)."""
        self.view, self._members = event.view, list(event.members)
        self._events.put_over((event,))

    def _feed_event(self, event: Undelivered | Rejoining) -> None:
        """Queue what the program must be told about its membership even past EVENT_BUFFER, as a view change."""
        self._events.put_over((event,))

    async def _feed_wait(self, event: Event) -> None:
        if isinstance(event, ViewChange):
            self.view, self._members = event.view, list(event.members)
        await self._events.put_many((event,))

    def _feed_over(self, events: list[Delivery], library: bool = False) -> int:
        """Queue a packet's deliveries even past EVENT_BUFFER; the number queued (the embedded node then slows the
        group).  ``library``: they are the client library's own messages."""
        if library:
            self._transfer()
        return self._events.put_over(events)

    def _transfer(self) -> StateTransfer:
        """This group's state transfers; from now on events are looked at as the program reads them."""
        if self._state is None:
            backend = self._backend
            self._state = StateTransfer(self.name, backend._process_id(), self._send_library, backend._spawn,
                                        backend._largest_message(), backend._client_number())
        self._looking = True
        return self._state

    async def _send_library(self, payload: bytes) -> int:
        return await self._backend._send(self.name, payload, STATE_QOS, LIBRARY_HANDLER)

    async def _ask_state(self) -> None:
        """Ask for the group's state (the backend joined with ``state=True``): the program's first event."""
        self._ready.extend(await self._transfer().ask_first(self.view, self._members, self._state_peers))

    def _when_caught_up(self, backlog: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, from the reader, when no more than ``backlog`` events are left to read."""
        self._caught_up_at, self._caught_up = backlog, callback

    async def _feed_deliveries(self, deliveries: list[Delivery], library: bool = False) -> None:
        """Queue a frame's deliveries at once, waiting while the buffer is full; ``library``: some are the client
        library's own messages."""
        if library:
            self._transfer()
        await self._events.put_many(deliveries)

    def _calls_of(self, handler: int) -> tuple[trio.MemorySendChannel[CallRequest],
                                                trio.MemoryReceiveChannel[CallRequest]]:
        pair = self._calls.get(handler)
        if pair is None:
            pair = self._calls[handler] = trio.open_memory_channel[CallRequest](EVENT_BUFFER)
            if self._closed:  # asked for after the group ended: nothing more will come, so iteration ends
                pair[0].close()
        return pair

    def _feed_call(self, request: CallRequest) -> None:
        try:
            self._calls_of(request.handler)[0].send_nowait(request)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self.unread_calls_dropped += 1  # the caller times out; the call is never run

    def _end(self, error: RmpdError | None = None) -> None:
        """No more events; iteration ends (or raises ``error`` once the queued events are read)."""
        if self._closed:
            return
        self._closed = True
        self._events.close(error)
        for tx, _ in self._calls.values():
            tx.close()
        if self._state is not None:
            self._state.close()

    # The API

    async def send(self, payload: bytes, *, qos: QoS = QoS.TOTAL, handler: int | None = None) -> int:
        """Multicast ``payload`` to the group; returns its per-source sequence number once the process accepted
        and numbered it.  From then on it is either delivered in the group (this program sees its own Delivery) or
        named by an :class:`Undelivered` event, with the reason; unreliable messages promise neither.  Refused
        with RmpdError instead: ``not-member`` while the process is between memberships (rejoining: retry after
        the next ViewChange), ``send-refused`` while it leaves, ``message-too-large``.  A connection to the daemon
        lost first (ConnectionLost, which also ends the iteration) leaves unknown what became of the messages not
        yet seen delivered."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        if handler == LIBRARY_HANDLER:  # compared here, not in a function: this runs once per message
            raise _library_handler()
        return await self._backend._send(self.name, bytes(payload), qos, handler)

    async def post(self, payload: bytes, *, qos: QoS = QoS.TOTAL, handler: int | None = None) -> None:
        """Multicast ``payload`` without waiting for the group to accept it, as Spread's and Corosync's multicast
        calls do: for a program that streams messages from one task.  Posts to a group go in the order made,
        before any later send; no sequence number is returned.  Waits only while many posted messages are not
        yet accepted (the ring's pace).  A refusal (message too large for the daemon, the group being left, the
        connection lost) is raised by the next ``post``, ``send`` or ``flush`` to this group."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        if handler == LIBRARY_HANDLER:
            raise _library_handler()
        await self._backend._post(self.name, bytes(payload), qos, handler)

    async def flush(self) -> None:
        """Wait until every message posted to this group is accepted; raises the first refusal, if any."""
        await self._backend._flush(self.name)

    @property
    def known_members(self) -> list[str]:
        """The member list of the last view this group saw (no round trip; ``members()`` asks afresh)."""
        return list(self._members)

    async def members(self) -> list[str]:
        """The current view's ordered member list (process IDs)."""
        self.view, self._members = await self._backend._members(self.name)
        return list(self._members)

    async def lock(self, n: int) -> bool:
        """Take lock ``n`` in the group's view (0..5 are handler locks); RmpdError if refused."""
        return await self._backend._lock(self.name, n, "lock")

    async def unlock(self, n: int) -> bool:
        return await self._backend._lock(self.name, n, "unlock")

    async def requests(self, handler: int = 0) -> AsyncIterator[CallRequest]:
        """Calls from non-members to ``handler``, while this program holds that handler lock (``await
        group.lock(handler)`` first): ``async for request in group.requests(0): await request.reply(b"...")``."""
        rx = self._calls_of(handler)[1]
        async for request in rx:
            yield request

    async def leave(self) -> None:
        """Leave the group; its iteration ends, also when this call is cancelled after asking (the backend may
        then have left already, and nothing would end the readers)."""
        try:
            await self._backend._leave(self.name)
        finally:
            self._end()

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
                               self._backend._posts_pending(self.name), self.unread_calls_dropped,
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
        self._check_caught_up()
        return item

    async def _next_looked_at(self) -> Event:
        state = self._transfer()
        backlog = self._backlog
        while not self._ready:
            if not backlog:
                backlog.extend(await self._take(YIELD_EVERY))
                self._check_caught_up()  # also while a joiner's state is on its way and nothing is handed out
            item = backlog.popleft()
            if isinstance(item, RmpdError):
                raise item
            self._ready.extend(state.look_at(item))
        self._check_caught_up()
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
                self._check_caught_up()
            for at, item in enumerate(items):
                if ready and (isinstance(item, RmpdError) or state.needs_caught_up(item)):
                    self._backlog.extend(items[at:])
                    break
                if isinstance(item, RmpdError):
                    raise item
                ready.extend(state.look_at(item))
        batch = [ready.popleft() for _ in range(min(max_events, len(ready)))]
        self._check_caught_up()
        return batch

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
            self._check_caught_up()
            if items:
                yield items
            if error is not None:
                raise error

    def _check_caught_up(self) -> None:
        if self._caught_up is not None and len(self._events) <= self._caught_up_at:
            callback, self._caught_up = self._caught_up, None
            callback()


def _library_handler() -> RmpdError:
    return RmpdError("bad-request", f"handler {LIBRARY_HANDLER} carries the client library's own messages; "
                                    f"a program's are 0..{LIBRARY_HANDLER - 1}")


class _Joining:
    __slots__ = ("done", "error", "group")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.group: Group | None = None
        self.error: BaseException | None = None


class JoinOnce:
    """One join per group name in flight, for both backends: a task that asks while another's join of the same
    group is on its way gets the same Group once it is in a view (or the same error), not a second Group that no
    event would reach, nor one returned before the group was joined."""

    def __init__(self) -> None:
        self._joining: dict[str, _Joining] = {}

    async def run(self, name: str, join: Callable[[], Awaitable[Group]]) -> Group:
        joining = self._joining.get(name)
        if joining is not None:
            await joining.done.wait()
            if joining.group is None:
                raise joining.error or RmpdError("join-failed", f"the join of {name!r} asked first was cancelled")
            return joining.group
        joining = self._joining[name] = _Joining()
        try:
            joining.group = await join()
            return joining.group
        except RmpdError as exc:
            joining.error = exc
            raise
        finally:
            del self._joining[name]
            joining.done.set()
