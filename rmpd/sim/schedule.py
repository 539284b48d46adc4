"""The simulator's clock: virtual time and the typed events still to happen on it, in time order.

Events with equal times leave in the order they were scheduled, so a run that schedules the same events in the same
order (everything it draws comes from seeded generators) replays exactly.  Each kind of event is a small frozen
dataclass; the runner hands each to its handler through one table keyed by the event's type.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass


class SimEvent:
    """Something that happens at one moment of virtual time (the base of every event the timeline holds)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Arrival(SimEvent):
    """A datagram sent by slot ``src`` reaches slot ``dst`` (unless a crash or a partition stands between)."""

    dst: int
    src: int
    data: bytes


@dataclass(frozen=True, slots=True)
class TimerDue(SimEvent):
    """The deadline slot ``slot`` asked for comes; ``version`` tells a deadline still wanted from one replaced."""

    slot: int
    version: int


@dataclass(frozen=True, slots=True)
class SlotEvent(SimEvent):
    """Something that happens to the host of one slot (the subclasses say what)."""

    slot: int


class AppSend(SlotEvent):
    """The application on slot ``slot`` sends its next message."""

    __slots__ = ()


class AppResend(SlotEvent):
    """The application on slot ``slot`` sends again the keyed messages it has to (once its process is in a view)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class AppCall(SimEvent):
    """The non-member calls the group for the ``number``-th time."""

    number: int


@dataclass(frozen=True, slots=True)
class SettleCheck(SimEvent):
    """Time to check whether the run has anything left to do."""


class Timeline:
    """Virtual time plus a heap of (time, order, event)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, SimEvent]] = []
        self._order = 0

    def push(self, at: float, event: SimEvent) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, event))

    def pop(self) -> SimEvent:
        at, _, event = heapq.heappop(self._heap)
        self.now = max(self.now, at)
        return event

    def __len__(self) -> int:
        return len(self._heap)

    def pending(self) -> Iterator[SimEvent]:
        """The events still to come, in no particular order."""
        return (event for _, _, event in self._heap)
