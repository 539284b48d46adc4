"""Engines wired together in memory with a scripted clock, for engine-level tests.

Datagrams go into one FIFO; ``flush`` hands them out until none are left, asking ``drop(src, dst, packet)``
whether to lose each copy.  Time only moves when a test calls ``advance``, which fires due timers.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.engine import GroupEngine
from rmpd.protocol.events import Delivery, Event, messages_of
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import Packet, decode
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import View

DropRule = Callable[[str, str, Packet], bool]


class Ring:
    def __init__(self, size: int, config: EngineConfig | None = None, engine_cls: type[GroupEngine] = GroupEngine):
        self.pids = [f"10.0.0.{i + 1}:7000" for i in range(size)]
        self.view = View(ViewId(self.pids[0], 1000), tuple(self.pids))
        self.now = 0.0
        cfg = config or EngineConfig(journal=True)
        self.engines = {
            pid: engine_cls(pid=pid, group="g", view=self.view, config=cfg, rng=random.Random(i), now=0.0)
            for i, pid in enumerate(self.pids)
        }
        self.wire: deque[tuple[str, str, bytes]] = deque()
        self.log: list[tuple[str, str, Packet]] = []
        """Every datagram handed to a receiver: (src, dst, packet)."""
        self.log_times: list[float] = []
        self.events: dict[str, list[Event]] = {pid: [] for pid in self.pids}
        self.drop: DropRule = lambda src, dst, packet: False
        for pid in self.pids:
            self._collect(pid)

    def __getitem__(self, i: int) -> GroupEngine:
        return self.engines[self.pids[i]]

    def _collect(self, pid: str) -> None:
        engine = self.engines[pid]
        for tx in engine.datagrams_to_send():
            dests = [p for p in self.pids if p != pid] if tx.dest is None else [tx.dest]
            for dst in dests:
                self.wire.append((pid, dst, tx.data))
        self.events[pid].extend(engine.events())
        engine.journal_records()

    def send(self, i: int, payload: bytes, qos: QoS = QoS.TOTAL) -> int | None:
        pid = self.pids[i]
        seq = self.engines[pid].send(payload, qos, self.now)
        self._collect(pid)
        return seq

    def flush(self, limit: int = 100_000) -> None:
        while self.wire and limit:
            limit -= 1
            src, dst, data = self.wire.popleft()
            packet = decode(data)
            if self.drop(src, dst, packet):
                continue
            self.log.append((src, dst, packet))
            self.log_times.append(self.now)
            self.engines[dst].receive_datagram(data, src, self.now)
            self._collect(dst)

    def advance(self, seconds: float, step: float = 0.005) -> None:
        """Move the clock forward in steps, firing due timers and flushing the wire after each."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for pid, engine in self.engines.items():
                deadline = engine.get_timer()
                if deadline is not None and deadline <= self.now:
                    engine.handle_timer(self.now)
                    self._collect(pid)
            self.flush()

    def advance_until(self, condition: Callable[[], bool], limit: float, step: float = 0.001) -> float | None:
        """Advance in ``step``s until ``condition()`` holds; the time it first held, or None after ``limit`` s."""
        end = self.now + limit
        while not condition():
            if self.now >= end:
                return None
            self.advance(step, step=step)
        return self.now

    def delivered(self, i: int) -> list[bytes]:
        return [d.payload for d in messages_of(self.events[self.pids[i]])]

    def deliveries(self, i: int) -> list[Delivery]:
        return messages_of(self.events[self.pids[i]])

    def sent_types(self, src: str | None = None) -> list[str]:
        return [type(p).__name__ for s, _, p in self.log if src is None or s == src]
