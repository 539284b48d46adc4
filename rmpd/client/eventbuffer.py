"""A bounded FIFO of events between one backend and the program reading a group, cheaper per event than a trio
memory channel.

The group's inbox (:class:`rmpd.client.group.GroupInbox`) holds one and feeds it; the Group reads it.  It is its own
module because its contract (the bound, the three ways to put, the reader's fairness) stands apart from what a group
does with the events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import trio

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
