"""The SCMP at-most-once filter: connection table, ``upper`` and ``latest`` (SCMP paper, figures 2-1 and 2-2).

A message carries its connection (chosen by the sender, no handshake) and its sender's clock as a timestamp.  The
filter accepts a message only if its timestamp is above the last one accepted on its connection, or, for a
connection it holds no entry for, above ``upper``: the largest timestamp ever collected from the table.  Entries
older than the lifetime estimate are collected, so the table stays small and ``upper`` only grows.  No message is
accepted twice, whatever the estimate (adaptive paper, theorem 2); a late fresh message may be rejected (lost).

A resilient server also refuses messages stamped after ``latest``, a bound it has written to stable storage
before using it.  After a crash the table is gone and ``upper`` starts at the persisted ``latest``, which is above
every timestamp accepted before the crash, so no duplicate of those is accepted afterwards.
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum

from .lifetime import LifetimeEstimator


class Verdict(Enum):
    NEW = "new"
    """Accepted: never seen before."""
    DUPLICATE = "duplicate"
    """Table-rejected: at or below the last timestamp accepted on its connection (a copy, or out of order)."""
    SUMMARY = "summary-rejected"
    """No entry for its connection and at or below ``upper``: maybe a copy of a collected message, maybe a late
    fresh one; the two cannot be told apart, so it is rejected."""
    TOO_EARLY = "too-early"
    """Stamped after ``latest``: refused for now, the sender may retry (its clock runs ahead)."""


class ScmpFilter:
    """One server's filter.  ``latest=None`` makes a non-resilient server (figure 2-1: no rule 1)."""

    def __init__(self, estimator: LifetimeEstimator, *, upper: int = 0, latest: int | None = None) -> None:
        self.estimator = estimator
        self.table: dict[Hashable, int] = {}
        self.upper = upper
        self.latest = latest
        self.pinned: set[Hashable] = set()
        """Connections whose entries garbage collection must keep (calls being computed, figure 3-1)."""
        self.start_floor = upper
        """``upper`` as the filter started (after a crash, the persisted ``latest``): rejections at or below it are
        the price of starting without a table, not a sign that the lifetime estimate is too small, so the
        estimator does not count them against lowering it."""
        self.counts = {v: 0 for v in Verdict}

    @classmethod
    def recovered(cls, estimator: LifetimeEstimator, persisted_latest: int) -> ScmpFilter:
        """Crash recovery (figure 2-2): an empty table and ``upper`` at the ``latest`` found on stable storage.
        ``latest`` stays at the same value (nothing is accepted) until a new one is persisted and raised."""
        return cls(estimator, upper=persisted_latest, latest=persisted_latest)

    def decide(self, conn: Hashable, stamp: int, clock: int, bound: int | None = None) -> Verdict:
        """Process one message (rules 1-3), record it with the estimator, and collect the table when due.

        ``bound`` tightens rule 1 for this message: it is refused as too early when stamped after ``bound`` too.
        """
        if (self.latest is not None and stamp > self.latest) or (bound is not None and stamp > bound):
            verdict = Verdict.TOO_EARLY
        else:
            last = self.table.get(conn)
            if last is not None:
                verdict = Verdict.NEW if stamp > last else Verdict.DUPLICATE
            else:
                verdict = Verdict.NEW if stamp > self.upper else Verdict.SUMMARY
            if verdict is Verdict.NEW:
                self.table[conn] = stamp
            lost = verdict is Verdict.SUMMARY and stamp > self.start_floor
            self.estimator.observe(clock - stamp, verdict is Verdict.NEW, lost)
        self.counts[verdict] += 1
        if self.estimator.due(clock):
            self.collect(clock)
        return verdict

    def learn(self, conn: Hashable, stamp: int, clock: int, verdict: Verdict) -> None:
        """Another server's verdict on a message, followed here (a group whose relay decides for every member):
        counted, and an accepted message recorded as if accepted here, so that this filter, should it decide
        later, refuses its copies too.  Collects the table when due, as ``decide`` does."""
        if verdict is Verdict.NEW:
            self.table[conn] = max(stamp, self.table.get(conn, stamp))
        if verdict is not Verdict.TOO_EARLY:
            self.estimator.observe(clock - stamp, verdict is Verdict.NEW, False)
        self.counts[verdict] += 1
        if self.estimator.due(clock):
            self.collect(clock)

    def collect(self, clock: int) -> list[tuple[Hashable, int]]:
        """Garbage collection: drop entries at or below ``clock - p`` (unless pinned) into ``upper``."""
        horizon = clock - self.estimator.update(clock)
        removed = [(conn, ts) for conn, ts in self.table.items() if ts <= horizon and conn not in self.pinned]
        for conn, ts in removed:
            del self.table[conn]
            self.upper = max(self.upper, ts)
        return removed

    def raise_latest(self, value: int) -> None:
        """``value`` is now on stable storage: messages stamped up to it may be accepted.  Never lowers."""
        if self.latest is not None and value > self.latest:
            self.latest = value

    def describe(self) -> dict[str, object]:
        """What ``rmp status`` shows: the estimate, table size, bounds and verdict counts (keys with underscores,
        as every other key of the status: ``new``, ``duplicate``, ``summary_rejected``, ``too_early``)."""
        verdicts = {v.value.replace("-", "_"): n for v, n in self.counts.items()}
        return {**self.estimator.describe(), "connections": len(self.table), "upper": self.upper,
                "latest": self.latest, **verdicts}
