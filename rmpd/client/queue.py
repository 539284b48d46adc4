"""A group's events waiting for the application: a bounded deque that is filled a frame at a time.

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

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

import trio

T = TypeVar("T")

YIELD_EVERY = 64
"""Events ``get`` returns from the buffer before it lets other tasks run."""


class EventQueue(Generic[T]):
    """Bounded FIFO between one producer (a backend) and the application; see the module docstring."""

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
