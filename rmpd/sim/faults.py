"""The faults of a simulated run: a schedule drawn from the run's seed before it starts, and what each fault does.

``plan_faults`` draws every fault of the run, and when it strikes, from one generator seeded by the run's seed
(joins, leaves, crashes with their restarts, restarts on the same process ID, one partition and its heal, lock
traffic), all within the fault window: after it the run must converge with no fault left to come.  The few
choices that depend on the state a fault finds (which members a partition cuts off, which lock a member asks for)
are drawn, when it strikes, from the same generator, so the seed still decides them all.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.process import NotMember
from .cluster import Cluster
from .config import GROUP, SimConfig
from .detection import CrashDetections
from .observations import Observation, Reincarnated
from .schedule import SimEvent, SlotEvent, Timeline


class Crash(SlotEvent):
    """The process of ``slot`` stops at once, saying nothing."""

    __slots__ = ()


class Restart(SlotEvent):
    """A crashed slot starts a new process, on a new process ID, which joins the group."""

    __slots__ = ()


class RestartSameId(SlotEvent):
    """A crashed slot starts again on the same process ID (a new incarnation, as a daemon on a fixed port)."""

    __slots__ = ()


class Join(SlotEvent):
    """A slot that was never a member starts a process that joins the group."""

    __slots__ = ()


class Leave(SlotEvent):
    """The member of ``slot`` leaves the group (and sends nothing more)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Partition(SimEvent):
    """A minority of the current view is cut off from the rest until the heal."""


@dataclass(frozen=True, slots=True)
class Heal(SimEvent):
    """The partition ends: every slot hears every other again."""


class LockToggle(SlotEvent):
    """The member of ``slot`` asks for a lock, or gives it back when it holds it."""

    __slots__ = ()


CONVERGENCE_FAULTS = (Restart, RestartSameId, Join, Heal)
"""Faults after which the group has to come together again: convergence is timed from the last of them."""


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of one run, with when it strikes, in the order drawn."""

    faults: tuple[tuple[float, SimEvent], ...]
    victims: tuple[int, ...]
    """The slots that crash and come back as new processes (a partition puts them on its minority side)."""


def plan_faults(config: SimConfig, rng: random.Random, window: float) -> FaultPlan:
    """Draw the run's faults from ``rng``, each striking within ``window`` seconds of the start (a restart or a heal
    follows its crash or partition, possibly after the window)."""
    faults: list[tuple[float, SimEvent]] = []
    initial = list(range(config.members))
    for j in range(config.joins):
        faults.append((rng.uniform(0.0, window), Join(config.members + j)))
    for i in rng.sample(initial[1:] or initial, min(config.leaves, max(len(initial) - 1, 0))):
        faults.append((rng.uniform(0.0, window), Leave(i)))
    victims = rng.sample(initial, min(config.crash, len(initial)))
    for i in victims:
        at = rng.uniform(0.0, window)
        faults += [(at, Crash(i)), (at + rng.uniform(2.0, 10.0), Restart(i))]
    for i in rng.sample(initial, min(config.restarts, len(initial))):
        at = rng.uniform(0.0, window)
        faults += [(at, Crash(i)), (at + rng.uniform(0.0, 3.0), RestartSameId(i))]
    if config.partition:
        at = rng.uniform(0.0, window)
        faults += [(at, Partition()), (at + rng.uniform(1.0, 12.0), Heal())]
    if config.locks:
        for _ in range(3 * config.members):
            at = rng.uniform(0.0, window)
            faults.append((at, LockToggle(rng.randrange(config.members))))
    return FaultPlan(tuple(faults), tuple(victims))


class FaultInjector:
    """Makes each fault of a plan happen to the cluster when the timeline reaches it."""

    def __init__(self, plan: FaultPlan, rng: random.Random, cluster: Cluster, clock: Timeline, *,
                 crashes: CrashDetections, min_partition: int, drain: Callable[[int], None],
                 stop_sending: Callable[[int], None], observe: Callable[[Observation], None],
                 process_lost: Callable[[int], None] = lambda slot: None) -> None:
        """``rng``: the generator the plan was drawn from, for the choices made when a fault strikes.  ``drain``
        takes a slot's outputs after a fault made some; ``observe`` tells the checker of a new incarnation;
        ``process_lost`` tells the slot's application that its process crashed."""
        self.plan, self.rng, self.cluster, self.clock = plan, rng, cluster, clock
        self.crashes, self.min_partition = crashes, min_partition
        self.drain, self.stop_sending, self.observe = drain, stop_sending, observe
        self.process_lost = process_lost
        self.last_fault_at = 0.0
        """When the last fault the group has to converge after struck (``CONVERGENCE_FAULTS``)."""

    def schedule(self) -> None:
        for at, fault in self.plan.faults:
            self.clock.push(at, fault)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {Crash: self.crash, Restart: self.restart, Join: self.restart, RestartSameId: self.restart_same_id,
                Leave: self.leave, Partition: self.partition, Heal: self.heal, LockToggle: self.toggle_lock}

    def _converging(self, fault: SimEvent) -> None:
        if isinstance(fault, CONVERGENCE_FAULTS):
            self.last_fault_at = self.clock.now

    def crash(self, fault: Crash) -> None:
        cluster, i = self.cluster, fault.slot
        if cluster.procs[i] is None:
            return
        cluster.crash(i)
        self.process_lost(i)
        pid = cluster.pids[i]
        fellows = {p.pid for _, p in cluster.live() if pid in (p.view(GROUP) or ())}
        self.crashes.no_longer_fellow(pid)
        self.crashes.crashed(pid, self.clock.now, fellows)

    def restart(self, fault: Restart | Join) -> None:
        self._converging(fault)
        if self.cluster.procs[fault.slot] is None:
            self.cluster.spawn(fault.slot).join(GROUP, self.clock.now, min_partition=self.min_partition)
            self.drain(fault.slot)

    def restart_same_id(self, fault: RestartSameId) -> None:
        """As a daemon rejoins what it recorded: a plain join, which founds a view if nobody answers (the views
        merge once they hear each other)."""
        self._converging(fault)
        i = fault.slot
        if self.cluster.procs[i] is None:
            self.observe(Reincarnated(self.cluster.pids[i]))  # a new application, and a new membership
            self.cluster.spawn(i, same_id=True).join(GROUP, self.clock.now, min_partition=self.min_partition)
            self.drain(i)

    def leave(self, fault: Leave) -> None:
        proc = self.cluster.procs[fault.slot]
        if proc is None:
            return
        try:
            proc.leave(GROUP, self.clock.now)
        except NotMember:
            return
        self.stop_sending(fault.slot)
        self.drain(fault.slot)

    def partition(self, fault: Partition) -> None:
        """Cut off a minority small enough that the rest still holds a majority of the current view."""
        cluster = self.cluster
        view = cluster.some_view()
        if view is None:
            return
        # Processes about to crash go to the minority side, so the crashes cannot take the majority too.
        alive = [j for j, p in cluster.live() if p.pid in view]
        doomed = [j for j in alive if j in self.plan.victims]
        steady = [j for j in alive if j not in doomed]
        room = len(steady) - (view.size // 2 + 1)
        if room < 1:
            return
        minority = doomed + self.rng.sample(steady, self.rng.randint(0 if doomed else 1, room))
        for j in minority:
            cluster.side[j] = 1

    def heal(self, fault: Heal) -> None:
        self._converging(fault)
        self.cluster.side = [0] * len(self.cluster.side)

    def toggle_lock(self, fault: LockToggle) -> None:
        proc = self.cluster.procs[fault.slot]
        view = proc.view(GROUP) if proc is not None else None
        if proc is None or view is None:
            return
        lock = self.rng.randrange(8)
        try:
            if view.lock_holder(lock) == proc.pid:
                proc.unlock(GROUP, lock, self.clock.now)
            else:
                proc.lock(GROUP, lock, self.clock.now)
        except NotMember:
            return
        self.drain(fault.slot)
