"""A simulated datagram network on a virtual clock, with seeded per-link faults.

Every multicast is copied to each other member independently: each copy may be lost, duplicated, delayed by jitter,
or held back extra long (reordering).  All randomness comes from one ``random.Random`` seeded by the caller, and
the timeline keeps events with equal times in order, so a run is a pure function of its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .schedule import Arrival, Timeline


@dataclass(frozen=True)
class LinkFaults:
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    latency: float = 0.001
    jitter: float = 0.0005
    reorder_delay: float = 0.01
    """A reordered copy is held back by up to this much more."""

    def __post_init__(self) -> None:
        for name in ("loss", "dup", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
        if self.loss >= 1.0:
            raise ValueError("loss 1.0 would drop every datagram; nothing could be delivered")


class SimNetwork:
    """Carries datagrams between slots as :class:`Arrival` events on the run's ``clock`` (its :class:`Timeline`)."""

    def __init__(self, clock: Timeline, faults: LinkFaults, rng: random.Random, size: int) -> None:
        self.clock = clock
        self.faults = faults
        self.rng = rng
        self.size = size
        self.sent = 0
        self.lost = 0
        self.duplicated = 0
        self.in_flight = 0

    def multicast(self, src: int, data: bytes) -> None:
        for dst in range(self.size):
            if dst != src:
                self.unicast(src, dst, data)

    def unicast(self, src: int, dst: int, data: bytes) -> None:
        f = self.faults
        rng = self.rng
        self.sent += 1
        if f.loss and rng.random() < f.loss:
            self.lost += 1
            return
        copies = 1
        if f.dup and rng.random() < f.dup:
            copies = 2
            self.duplicated += 1
        for _ in range(copies):
            delay = f.latency + rng.random() * f.jitter
            if f.reorder and rng.random() < f.reorder:
                delay += rng.random() * f.reorder_delay
            self.in_flight += 1
            self.clock.push(self.clock.now + delay, Arrival(dst, src, data))

    def arrived(self) -> None:
        self.in_flight -= 1
