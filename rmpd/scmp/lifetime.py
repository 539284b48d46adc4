"""Estimates of the maximum message lifetime ``p`` that garbage collection of the connection table uses.

A message's lifetime is the receiver's clock when it is processed minus the sender's timestamp: delivery time plus
clock skew.  Entries older than the estimate are collected into ``upper``; a fresh message older than ``upper`` is
*summary-rejected* (lost).  Too small an estimate loses messages, too large a one keeps connection state long.
The adaptive estimators follow Ezhilchelvan et al., "Adaptive timeouts for at-most-once delivery" (figures 2 and
3): the estimate is a power of two, raised at once to cover the lifetimes seen, and lowered only while accepted
messages sufficiently outnumber summary-rejected ones.  Any estimate is safe (no duplicate is ever accepted,
whatever it is); the estimate only trades lost messages against memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def power_of_two_at_least(value: int) -> int:
    """``2**j`` for the least ``j`` with ``2**j >= value`` (1 for values up to 1)."""
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


class LifetimeEstimator:
    """What the filter asks of an estimator; the base class is a fixed lifetime collected every ``interval``."""

    name = "fixed"

    def __init__(self, lifetime: int, interval: int | None = None) -> None:
        if lifetime < 1:
            raise ValueError("the lifetime must be at least 1 ms")
        self.estimate = lifetime
        self.interval = interval if interval is not None else max(1, lifetime // 4)
        self.accepted = 0
        self.summary_rejected = 0
        self._last_collect: int | None = None

    def observe(self, lifetime: int, accepted: bool, summary_rejected: bool) -> None:
        """One message processed: its lifetime (clamped to at least 1, assumption 5) and its verdict."""
        self.accepted += accepted
        self.summary_rejected += summary_rejected

    def due(self, clock: int) -> bool:
        """Time to garbage-collect the connection table."""
        if self._last_collect is None:
            self._last_collect = clock
        return clock - self._last_collect >= self.interval

    def update(self, clock: int) -> int:
        """Called at each garbage collection: the estimate to collect with."""
        self._last_collect = clock
        return self.estimate

    def describe(self) -> dict[str, int | str]:
        """The estimator and its estimate; the filter's verdict counts (``new``, ``summary_rejected``) say how many
        lifetimes it observed."""
        return {"estimator": self.name, "lifetime_ms": self.estimate}


@dataclass
class _Adaptive:
    """State both adaptive algorithms keep: the counts since the last decrease and the lifetimes seen."""

    numacc: int = 0
    numrej: int = 0
    ltimes: list[int] = field(default_factory=list)


class AdaptiveEstimator(LifetimeEstimator):
    """What figures 2 and 3 share: every message's lifetime is recorded, with the accepted and summary-rejected
    counts that decide whether the estimate may come down."""

    def __init__(self, initial: int, interval: int) -> None:
        super().__init__(initial, interval)
        self.state = _Adaptive()

    def observe(self, lifetime: int, accepted: bool, summary_rejected: bool) -> None:
        super().observe(lifetime, accepted, summary_rejected)
        self.state.ltimes.append(max(1, lifetime))
        self.state.numacc += accepted
        self.state.numrej += summary_rejected


class UnlimitedHorizon(AdaptiveEstimator):
    """Figure 2: raise to cover the largest lifetime since the last collection; lower only when accepted messages
    outnumber ``p`` times the summary-rejected ones, with ``p`` growing by one per decrease.  Collections happen
    every ``interval`` ms."""

    name = "unlimited-horizon"

    def __init__(self, initial: int = 1, interval: int = 1000) -> None:
        super().__init__(initial, interval)
        self.p = 1

    def update(self, clock: int) -> int:
        self._last_collect = clock
        s = self.state
        maxltime = max(s.ltimes, default=0)
        if maxltime > self.estimate:
            self.estimate = power_of_two_at_least(maxltime)
        elif s.numacc > self.p * s.numrej and self.estimate > maxltime > 0:
            self.estimate = power_of_two_at_least(maxltime)
            s.numacc -= self.p * s.numrej
            s.numrej = 0
            self.p += 1
        s.ltimes = []
        return self.estimate


class LimitedHorizon(AdaptiveEstimator):
    """Figure 3: collect after every ``window`` (S) messages, judging by the (``spikes`` + 1)-st largest lifetime
    (H transient spikes per S are tolerated); lower while accepted messages outnumber ``p`` times the
    summary-rejected ones, ``p`` fixed (at most (S - H) / H), taking one extra accepted message as reserve."""

    name = "limited-horizon"

    def __init__(self, window: int = 64, spikes: int = 2, p: int | None = None, initial: int = 1) -> None:
        if window < 1 or not 0 <= spikes < window:
            raise ValueError("need S >= 1 and 0 <= H < S")
        bound = (window - spikes) // spikes if spikes else window
        p = bound if p is None else p
        if not 1 <= p <= bound:
            raise ValueError(f"p must be in 1..(S-H)/H = {bound}")
        super().__init__(initial, 1)
        self.window = window
        self.spikes = spikes
        self.p = p

    def due(self, clock: int) -> bool:
        return len(self.state.ltimes) >= self.window

    def update(self, clock: int) -> int:
        self._last_collect = clock
        s = self.state
        ordered = sorted(s.ltimes, reverse=True)
        maxltime = ordered[self.spikes] if len(ordered) > self.spikes else 0
        s.ltimes = []
        if maxltime > self.estimate:
            self.estimate = power_of_two_at_least(maxltime)
        elif s.numacc > self.p * s.numrej and self.estimate > maxltime > 0:
            self.estimate = power_of_two_at_least(maxltime)
            s.numacc -= self.p * s.numrej + 1
            s.numrej = 0
        return self.estimate


def make_estimator(kind: str, *, lifetime: int = 2000, window: int = 64, spikes: int = 2, p: int | None = None,
                   interval: int = 1000) -> LifetimeEstimator:
    """Build the estimator a config names: ``fixed`` (``lifetime`` ms), ``unlimited`` or ``limited``."""
    if kind == "fixed":
        return LifetimeEstimator(lifetime)
    if kind == "unlimited":
        return UnlimitedHorizon(interval=interval)
    if kind == "limited":
        return LimitedHorizon(window, spikes, p)
    raise ValueError(f"unknown lifetime estimator {kind!r} (fixed, unlimited, limited)")
