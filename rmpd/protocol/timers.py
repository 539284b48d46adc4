"""The engine's timers: a retransmission back-off, a plain deadline, and the one registry the engine runs them from.

Every timer of a group lives in the registry, in the order they fire when several are due at once.  ``get_timer``,
``handle_timer``, a reformation's freeze and a departure all iterate it, so a new timer is one line in one place
and cannot be forgotten by any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Timer(Protocol):
    """Anything with a deadline (None: not armed) that a freeze or a departure can stop."""

    @property
    def deadline(self) -> float | None: ...

    def stop(self) -> None: ...


class Deadline:
    """A one-shot deadline."""

    __slots__ = ("deadline",)

    def __init__(self) -> None:
        self.deadline: float | None = None

    def stop(self) -> None:
        self.deadline = None


class Backoff:
    """A retransmission timer: doubles on each expiry, clamped, reset on progress.

    ``patience``: how long after the first transmission a failure may be declared at the earliest; an expiry is
    placed at that moment so that declaring one does not wait for the next doubling.  ``steady``: how many expiries
    in a row keep the first interval before doubling starts (under random loss a missing answer is most often a
    lost datagram, and doubling at once would make two losses in a row cost three intervals)."""

    __slots__ = ("deadline", "initial", "interval", "maximum", "patience", "retries", "started", "steady")

    def __init__(self, initial: float, maximum: float, patience: float = 0.0, steady: int = 0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.patience = patience
        self.steady = steady
        self.interval = initial
        self.deadline: float | None = None
        self.retries = 0
        self.started = 0.0

    def start(self, now: float) -> None:
        self.interval = self.initial
        self.retries = 0
        self.started = now
        self.deadline = now + self.interval

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def exhausted(self, limit: int, now: float) -> bool:
        """This expiry is the ``limit``-th in a row without an answer, the first transmission's included, and
        ``patience`` has passed since that transmission.

        The paper allows "up to N retransmissions (currently 10)" and says that this detects failures in nearby
        sites "within 5 seconds": ten doubling waits from a nearby site's 5 ms, clamped at 2 s, take 4.6 s;
        waiting out an eleventh would make it 6.6 s.  So N counts the expiries (docs/protocol.md).  A timer that
        starts lower (a round trip measured on a fast network) reaches N expiries sooner; ``patience`` keeps
        detection at the paper's time instead of making it quicker and jumpier.
        """
        return self.retries + 1 >= limit and now - self.started >= self.patience

    def back_off(self, now: float) -> None:
        self.retries += 1
        if self.retries > self.steady:
            self.interval = min(self.interval * 2, self.maximum)
        self.deadline = now + self.interval
        if now < self.started + self.patience < self.deadline:
            self.deadline = self.started + self.patience

    def heard(self, now: float) -> None:
        """The other side is alive but not done yet: count expiries and ``patience`` from now, keep the interval."""
        self.retries = 0
        self.started = now

    def stop(self) -> None:
        self.deadline = None
        self.retries = 0


@dataclass(frozen=True, slots=True)
class Entry:
    """One timer: what fires it, and whether a reformation's freeze or a departure stops it."""

    name: str
    timer: Timer
    fire: Callable[[float], None] | None
    """Called when the deadline is reached (None: the timer is only waited for, its owner acts on it)."""
    frozen_stops: bool = False
    departed_stops: bool = False


class TimerRegistry:
    """Every timer of one group, in firing order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def add(self, name: str, timer: Timer, fire: Callable[[float], None] | None, *, frozen_stops: bool = False,
            departed_stops: bool = False) -> None:
        self.entries.append(Entry(name, timer, fire, frozen_stops, departed_stops))

    def next_deadline(self, ignore: Timer | None = None) -> float | None:
        """The soonest deadline, leaving ``ignore`` out (a timer that is always armed)."""
        soonest: float | None = None
        for entry in self.entries:  # a plain loop: asked for after every input
            d = entry.timer.deadline
            if d is not None and (soonest is None or d < soonest) and entry.timer is not ignore:
                soonest = d
        return soonest

    def fire_due(self, now: float) -> None:
        """Run each due timer once, in registry order; a timer an earlier one stopped is not run."""
        for entry in self.entries:
            deadline = entry.timer.deadline
            if entry.fire is not None and deadline is not None and now >= deadline:
                entry.fire(now)

    def stop(self, *, frozen: bool = False, departed: bool = False) -> None:
        """Stop the timers a freeze (``frozen``) or a departure (``departed``) ends."""
        for entry in self.entries:
            if (frozen and entry.frozen_stops) or (departed and entry.departed_stops):
                entry.timer.stop()
