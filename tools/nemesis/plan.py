"""The fault schedule of a run: one fault at a time, drawn from the seed alone, with gaps of base loss between."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

KILL = "kill"
PARTITION_ONE = "partition-one"
PARTITION_SPLIT = "partition-split"
PARTITION_ALL = "partition-all"
LOSS_BURST = "loss-burst"
RESTART_ALL = "restart-all"
KINDS = (KILL, PARTITION_ONE, PARTITION_SPLIT, PARTITION_ALL, LOSS_BURST, RESTART_ALL)
WEIGHTS = {KILL: 3, PARTITION_ONE: 2, PARTITION_SPLIT: 2, PARTITION_ALL: 1, LOSS_BURST: 2}
"""How often each repeated kind is drawn; the restart of every host happens exactly once per run."""
WHOLE_GROUP = (PARTITION_ALL, RESTART_ALL)
"""The kinds that stop every member at once under a majority minimum partition (every host killed, or every host
alone below the majority): the group's life ends there, and with it what the group keeps only while it lives (the
key table of exactly-once sends, docs/protocol.md "Exactly once: keys")."""

GAP = (4.0, 8.0)
"""Seconds of plain (base) loss between two faults: long enough for the group to heal under the base loss in most
gaps, which gives the per-fault recovery times."""
PAUSE = (1.0, 4.0)
"""Seconds a killed daemon stays down."""
HOLD = (3.0, 8.0)
"""Seconds a partition or a loss burst lasts."""
BURST_LOSS = 0.3


@dataclass(frozen=True)
class Fault:
    """One fault: what, when (seconds after the faults began) and for how long, on which hosts."""

    kind: str
    at: float
    hold: float
    """Seconds until the heal (partitions, loss bursts) or the restart (kills)."""
    hosts: tuple[int, ...] = ()
    """The host killed, or the hosts on one side of a partition (every host alone: all of them)."""

    @property
    def end(self) -> float:
        return self.at + self.hold

    def describe(self, n: int) -> str:
        if self.kind == KILL:
            return f"kill -9 h{self.hosts[0]}, restart after {self.hold:.1f} s"
        if self.kind == RESTART_ALL:
            return f"kill -9 every host, restart all at once after {self.hold:.1f} s"
        if self.kind == LOSS_BURST:
            return f"loss burst {BURST_LOSS:.0%} for {self.hold:.1f} s"
        if self.kind == PARTITION_ALL:
            return f"partition: every host alone for {self.hold:.1f} s"
        rest = [i for i in range(1, n + 1) if i not in self.hosts]
        return f"partition {list(self.hosts)} | {rest} for {self.hold:.1f} s"


def plan(seed: int, hosts: int, seconds: float, *, whole_group: bool = True) -> list[Fault]:
    """The faults of one run, one after another with a gap of base loss between them, drawn from ``seed`` alone.

    The last fault ends exactly at ``seconds`` (where the final heal happens), so every run measures convergence
    after a real fault, and the restart of every host falls once in the middle third.  ``whole_group=False``
    leaves out the kinds that end the group's life (``WHOLE_GROUP``): a run that judges what the group promises
    while it lives."""
    rng = random.Random(seed)
    kinds = [k for k in WEIGHTS if (hosts >= 3 or k != PARTITION_SPLIT) and (whole_group or k not in WHOLE_GROUP)]
    faults: list[Fault] = []
    cursor = 0.0
    while True:
        kind = rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
        gap = rng.uniform(*GAP)
        hold = rng.uniform(*(PAUSE if kind == KILL else HOLD))
        if cursor + gap + hold > seconds:
            break
        faults.append(Fault(kind, cursor + gap, hold, _victims(rng, kind, hosts)))
        cursor += gap + hold
    if not faults:
        return [Fault(KILL, max(0.0, seconds - 2.0), min(2.0, seconds), (1,))]
    if whole_group:
        _restart_all_once(rng, faults, hosts, seconds)
    last = faults[-1]
    faults[-1] = Fault(last.kind, seconds - last.hold, last.hold, last.hosts)
    return faults


def _restart_all_once(rng: random.Random, faults: list[Fault], hosts: int, seconds: float) -> None:
    # The restart of all hosts replaces one fault in the middle third (or the middle one).
    middle = [i for i, f in enumerate(faults) if seconds / 3 <= f.at <= 2 * seconds / 3] or [len(faults) // 2]
    index = rng.choice(middle)
    old = faults[index]
    faults[index] = Fault(RESTART_ALL, old.at, min(old.hold, PAUSE[1]), tuple(range(1, hosts + 1)))


def _victims(rng: random.Random, kind: str, hosts: int) -> tuple[int, ...]:
    everyone = list(range(1, hosts + 1))
    if kind in (KILL, PARTITION_ONE):
        return (rng.choice(everyone),)
    if kind == PARTITION_SPLIT:
        return tuple(sorted(rng.sample(everyone, hosts // 2)))
    if kind == PARTITION_ALL:
        return tuple(everyone)
    return ()


def hop_loss(loss: float) -> float:
    """The drop probability of each iptables rule for ``loss`` end to end: scripts/netns drops on the way out of
    the sender and again on the way into the receiver, so each rule takes 1 - sqrt(1 - loss)."""
    return round(1 - math.sqrt(1 - loss), 4)

