"""RMP processes on an in-memory network with a scripted clock (every process hears every multicast)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import Event, ViewInstalled, messages_of
from rmpd.protocol.packets import Packet, decode
from rmpd.protocol.process import RmpProcess
from rmpd.protocol.qos import QoS


class Net:
    def __init__(self, size: int, config: EngineConfig | None = None) -> None:
        self.pids = [f"10.0.1.{i + 1}:7000" for i in range(size)]
        self.now = 0.0
        cfg = config or EngineConfig(journal=True)
        self.procs = {pid: RmpProcess(pid=pid, config=cfg, rng=random.Random(i), now=0.0,
                                      wall_ms=1_700_000_000_000 + i) for i, pid in enumerate(self.pids)}
        self.events: dict[str, list[Event]] = {pid: [] for pid in self.pids}
        self.wire: deque[tuple[str, str, bytes]] = deque()
        self.drop: Callable[[str, str, Packet], bool] = lambda src, dst, p: False
        self.copies: Callable[[str, str, Packet], int] = lambda src, dst, p: 1
        """How many copies of a datagram the network delivers (duplication)."""
        self.down: set[str] = set()

    def __getitem__(self, i: int) -> RmpProcess:
        return self.procs[self.pids[i]]

    def do(self, i: int, action: Callable[[RmpProcess, float], object]) -> object:
        pid = self.pids[i]
        result = action(self.procs[pid], self.now)
        self._collect(pid)
        return result

    def _collect(self, pid: str) -> None:
        proc = self.procs[pid]
        for tx in proc.datagrams_to_send():
            dests = [p for p in self.pids if p != pid] if tx.dest is None else [tx.dest]
            self.wire.extend((pid, d, tx.data) for d in dests)
        self.events[pid].extend(proc.events())
        proc.journal_records()

    def flush(self) -> None:
        while self.wire:
            src, dst, data = self.wire.popleft()
            packet = decode(data)
            if dst in self.down or src in self.down or self.drop(src, dst, packet):
                continue
            for _ in range(self.copies(src, dst, packet)):
                self.procs[dst].receive_datagram(data, src, self.now)
                self._collect(dst)

    def advance(self, seconds: float, step: float = 0.01) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            for pid, proc in self.procs.items():
                deadline = proc.get_timer()
                if pid not in self.down and deadline is not None and deadline <= self.now:
                    proc.handle_timer(self.now)
                    self._collect(pid)
            self.flush()

    def send(self, i: int, payload: bytes, qos: QoS = QoS.TOTAL) -> None:
        self.do(i, lambda p, now: p.send("g", payload, qos, now))

    def delivered(self, i: int) -> list[bytes]:
        return [d.payload for d in messages_of(self.events[self.pids[i]])]

    def views(self, i: int) -> list[tuple[str, ...]]:
        return [e.members for e in self.events[self.pids[i]] if isinstance(e, ViewInstalled)]

    def of_type(self, i: int, cls: type) -> list:
        return [e for e in self.events[self.pids[i]] if isinstance(e, cls)]
