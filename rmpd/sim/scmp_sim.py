"""SCMP under skewed clocks, drifting lifetimes, duplicates and server crashes: one seeded, virtual-time run.

Clients stamp messages with their own clock (each off the server's by up to ``offset_ms`` either way); the
network delays each message by a base delay that drifts during the first half of the run (a random walk between
``min_delay_ms`` and ``max_delay_ms``) and then stays put, with rare spikes and duplicated copies.  The server is
a resilient SCMP filter (``latest`` rewritten ahead of its clock) with the chosen lifetime estimator; it crashes
at random times and recovers from the persisted ``latest`` alone.

What a run reports: duplicates accepted (must be 0), fresh messages wrongly rejected (summary-rejected or refused
as too early: lost, in the adaptive paper's terms), out-of-order ones, and the final estimate against the true
lifetime bound X of the settled second half: the lifetime that at most H of every S copies received exceed, the
bound the limited horizon algorithm is proved to converge below 2X for.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import asdict, dataclass

from rmpd.scmp.filter import ScmpFilter, Verdict
from rmpd.scmp.lifetime import LifetimeEstimator, make_estimator


@dataclass(frozen=True)
class ScmpSimConfig:
    clients: int = 20
    seconds: float = 240.0
    offset_ms: int = 2000
    """Client clocks are off the server's by a fixed amount in [-offset_ms, offset_ms]."""
    min_delay_ms: int = 5
    max_delay_ms: int = 400
    spike: float = 0.01
    """Probability that a message is delayed ten times more (the transient spikes of the limited horizon)."""
    dup: float = 0.2
    """Probability that a message has 1-5 extra copies, each delayed further."""
    interval_ms: int = 100
    """Mean time between two messages of one client."""
    crashes: int = 2
    estimator: str = "limited"
    persist_ahead_ms: int = 5000


@dataclass
class ScmpSimResult:
    seed: int
    sent: int
    accepted: int
    duplicates_accepted: int
    fresh_rejected: int
    fresh_rejected_fraction: float
    out_of_order: int
    crashes: int
    true_lifetime_ms: int
    estimate_ms: int
    estimate_ratio: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


WINDOW, SPIKES = 64, 2
"""S and H of the default limited horizon estimator."""


def bounded_lifetime(lifetimes: list[int], window: int, spikes: int) -> int:
    """The least X such that in every ``window`` consecutive lifetimes at most ``spikes`` exceed X: the largest
    (H+1)-st largest lifetime of any window (the (t, X, S, H)-bound of the adaptive paper)."""
    if len(lifetimes) <= spikes:
        return 1
    worst = 0
    for start in range(0, max(1, len(lifetimes) - window + 1)):
        worst = max(worst, heapq.nlargest(spikes + 1, lifetimes[start:start + window])[-1])
    return max(1, worst)


def run_scmp_seed(config: ScmpSimConfig, seed: int) -> ScmpSimResult:
    rng = random.Random(seed)
    end = int(config.seconds * 1000)
    settle = end // 2
    offsets = [rng.randint(-config.offset_ms, config.offset_ms) for _ in range(config.clients)]
    events: list[tuple[int, int, str, tuple[int, int, bool]]] = []
    order = 0

    def push(at: int, kind: str, data: tuple[int, int, bool]) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, data))

    # Every message: when it is sent, its stamp, and when each copy arrives.
    delay = float(config.min_delay_ms)
    last_stamp = [0] * config.clients
    sent = 0
    settled: list[tuple[int, int]] = []
    t = 0
    while t < end - 2000:
        t += max(1, int(rng.expovariate(config.clients / config.interval_ms)))
        if t < settle:
            delay = min(config.max_delay_ms, max(config.min_delay_ms, delay + rng.gauss(0, 5)))
        client = rng.randrange(config.clients)
        stamp = max(t + offsets[client], last_stamp[client] + 1)
        last_stamp[client] = stamp
        sent += 1
        base = delay * (10 if rng.random() < config.spike else 1) * (0.5 + rng.random())
        arrive = t + int(base) + 1
        copies = [arrive]
        if rng.random() < config.dup:
            copies += [arrive + rng.randint(0, int(base) * 3 + 10) for _ in range(rng.randint(1, 5))]
        for i, at in enumerate(copies):
            push(at, "msg", (client, stamp, i == 0))
            if t >= settle:  # every copy the server receives has a lifetime (adaptive paper, section 2)
                settled.append((at, at - stamp))
    true_lifetime = bounded_lifetime([lt for _, lt in sorted(settled)], WINDOW, SPIKES)
    for _ in range(config.crashes):
        push(rng.randint(end // 10, end - 5000), "crash", (0, 0, False))

    stored_latest = 0

    def persist(now: int) -> int:
        nonlocal stored_latest
        stored_latest = max(stored_latest, now + config.persist_ahead_ms)
        return stored_latest

    def estimator() -> LifetimeEstimator:  # a fresh one per incarnation: its state is volatile
        return make_estimator(config.estimator, lifetime=1000)

    server = ScmpFilter(estimator(), upper=0, latest=persist(0))
    accepted: dict[tuple[int, int], int] = {}
    highest_fresh: dict[int, int] = {}
    fresh_rejected = out_of_order = dup_accepted = crashes = 0
    next_persist = config.persist_ahead_ms // 2
    while events:
        now, _, kind, (client, stamp, first) = heapq.heappop(events)
        while now >= next_persist:
            server.raise_latest(persist(next_persist))
            next_persist += config.persist_ahead_ms // 2
        if kind == "crash":
            crashes += 1
            server = ScmpFilter.recovered(estimator(), stored_latest)
            server.raise_latest(persist(now))
            continue
        verdict = server.decide(client, stamp, now)
        if verdict is Verdict.NEW:
            key = (client, stamp)
            accepted[key] = accepted.get(key, 0) + 1
            if accepted[key] > 1:
                dup_accepted += 1
        elif first:
            if stamp < highest_fresh.get(client, 0):
                out_of_order += 1
            else:
                fresh_rejected += 1
        if first:
            highest_fresh[client] = max(highest_fresh.get(client, 0), stamp)
    estimate = server.estimator.estimate
    return ScmpSimResult(
        seed=seed, sent=sent, accepted=len(accepted), duplicates_accepted=dup_accepted,
        fresh_rejected=fresh_rejected, fresh_rejected_fraction=round(fresh_rejected / max(1, sent), 5),
        out_of_order=out_of_order, crashes=crashes, true_lifetime_ms=true_lifetime, estimate_ms=estimate,
        estimate_ratio=round(estimate / true_lifetime, 3),
    )
