"""The simulated hosts: the RMP process each one runs (none while it is crashed), under which process ID, on which
side of a partition, and the one deadline each process asked for.

A host's slot number never changes; its process ID does when it restarts as a new process (paper 3.1: a process ID
is never reused), so the network and the timeline name slots, and the process IDs are looked up here.
"""

from __future__ import annotations

import random

from ..protocol.config import EngineConfig
from ..protocol.engine import GroupEngine
from ..protocol.process import RmpProcess
from ..protocol.view import View
from .config import GROUP, SIM_EPOCH
from .schedule import Timeline, TimerDue


class Cluster:
    """Process slots, each of which may crash and start again, and the partition sides they are on."""

    def __init__(self, size: int, seed: int, clock: Timeline, engine_config: EngineConfig,
                 engine_factory: type[GroupEngine]) -> None:
        self.seed = seed
        self.clock = clock
        self.engine_config = engine_config
        self.engine_factory = engine_factory
        self.hosts = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(size)]
        self.port = [7000] * size
        self.pids = [f"{host}:7000" for host in self.hosts]
        """The current process ID on each host: a restarted process takes a new port."""
        self.index = {pid: i for i, pid in enumerate(self.pids)}
        self.procs: list[RmpProcess | None] = [None] * size
        self.incarnation = [0] * size
        self.side = [0] * size
        """Which side of the partition each slot is on (all 0 while none is in force)."""
        self.timer_at: list[float | None] = [None] * size
        self.timer_version = [0] * size

    def spawn(self, i: int, same_id: bool = False) -> RmpProcess:
        """Start the process of slot ``i``: after a crash on a new port, or (``same_id``) on the same one, a new
        incarnation whose sequence numbers start above its predecessor's, as a daemon's do."""
        self.incarnation[i] += 1
        if self.incarnation[i] > 1 and not same_id:
            self.port[i] += 1
            self.pids[i] = f"{self.hosts[i]}:{self.port[i]}"
            self.index[self.pids[i]] = i
        now = self.clock.now
        wall_ms = int((SIM_EPOCH + now) * 1000) + self.incarnation[i] * 7
        proc = RmpProcess(pid=self.pids[i], config=self.engine_config,
                          rng=random.Random(self.seed * 8 + 3 + i * 1000 + self.incarnation[i]), now=now,
                          wall_ms=wall_ms, engine_factory=self.engine_factory,
                          seq_base=wall_ms * 1000 if same_id else 0)
        self.procs[i] = proc
        return proc

    def crash(self, i: int) -> None:
        """Slot ``i``'s process stops: it takes nothing more, and its deadline is forgotten."""
        self.procs[i] = None
        self.timer_version[i] += 1

    def blocked(self, src: int, dst: int) -> bool:
        """A datagram from ``src`` cannot reach ``dst``: either is down, or a partition lies between them."""
        return self.procs[dst] is None or self.procs[src] is None or self.side[src] != self.side[dst]

    def live(self) -> list[tuple[int, RmpProcess]]:
        return [(i, proc) for i, proc in enumerate(self.procs) if proc is not None]

    def some_view(self) -> View | None:
        """The view of the group held by the first live process that holds one."""
        return next((p.view(GROUP) for p in self.procs if p is not None and p.view(GROUP) is not None), None)

    def rearm(self, i: int, deadline: float | None) -> None:
        """Slot ``i``'s process wants ``handle_timer`` at ``deadline``: a changed deadline replaces the one before."""
        if deadline != self.timer_at[i]:
            self.timer_at[i] = deadline
            self.timer_version[i] += 1
            if deadline is not None:
                self.clock.push(max(deadline, self.clock.now), TimerDue(i, self.timer_version[i]))

    def due(self, timer: TimerDue) -> RmpProcess | None:
        """The process whose deadline ``timer`` is, when that deadline still stands (it is then used up)."""
        proc = self.procs[timer.slot]
        if timer.version != self.timer_version[timer.slot] or proc is None:
            return None
        self.timer_at[timer.slot] = None
        return proc
