"""Engines or processes wired together in memory with a scripted clock, for engine-level tests.

``Ring`` wires the engines of one group's founding members; ``Net`` wires whole RMP processes (joins, calls, many
groups).  Both put datagrams into one FIFO: ``flush`` hands them out until none are left, asking ``drop(src, dst,
packet)`` whether to lose each copy and ``copies(src, dst, packet)`` how many to deliver.  Time only moves when a
test calls ``advance``, which fires due timers.  Every multicast reaches every other node.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.engine import GroupEngine
from rmpd.protocol.events import DeliveredMessage, Event, ViewInstalled, messages_of
from rmpd.protocol.ids import ViewId
from rmpd.protocol.outbox import Outputs
from rmpd.protocol.packets import Packet, decode
from rmpd.protocol.process import RmpProcess
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import View

DropRule = Callable[[str, str, Packet], bool]


class SansIo(Protocol):
    """What the wire drives: a GroupEngine or an RmpProcess."""

    def take_outputs(self, *, deadline: bool = True) -> Outputs: ...
    def get_timer(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def receive_datagram(self, data: bytes, addr: str | None, now: float) -> None: ...


Node = TypeVar("Node", bound=SansIo)


class Wire(Generic[Node]):
    """Nodes on an in-memory network with a scripted clock."""

    def __init__(self, nodes: dict[str, Node], step: float, *, keep_log: bool) -> None:
        self.pids = list(nodes)
        self.nodes = nodes
        self.now = 0.0
        self.step = step
        self.wire: deque[tuple[str, str, bytes]] = deque()
        self.keep_log = keep_log
        self.log: list[tuple[str, str, Packet]] = []
        """With ``keep_log``, every datagram handed to a receiver: (src, dst, packet)."""
        self.log_times: list[float] = []
        self.events: dict[str, list[Event]] = {pid: [] for pid in self.pids}
        self.drop: DropRule = lambda src, dst, packet: False
        self.copies: Callable[[str, str, Packet], int] = lambda src, dst, packet: 1
        """How many copies of a datagram the network delivers (duplication)."""
        self.down: set[str] = set()
        """Nodes that neither send nor receive nor run timers (crashed or cut off)."""
        self.persist_wanted: dict[str, int] = {}
        """Per process, the value of SCMP ``latest`` it asked to persist and has not been told is durable."""
        for pid in self.pids:
            self.collect(pid)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[self.pids[i]]

    def collect(self, pid: str) -> None:
        """Take what node ``pid`` produced: datagrams onto the wire, events into ``events``."""
        out = self.nodes[pid].take_outputs(deadline=False)  # ``advance`` polls the timers itself
        for tx in out.datagrams:
            dests = [p for p in self.pids if p != pid] if tx.dest is None else [tx.dest]
            self.wire.extend((pid, dst, tx.data) for dst in dests)
        self.events[pid].extend(out.events)
        if out.persist is not None:
            self.persist_wanted[pid] = out.persist

    def do(self, i: int, action: Callable[[Node, float], object]) -> object:
        """Run ``action(node, now)`` at node ``i`` and collect what it produced."""
        pid = self.pids[i]
        result = action(self.nodes[pid], self.now)
        self.collect(pid)
        return result

    def flush(self, limit: int = 1_000_000) -> None:
        while self.wire and limit:
            limit -= 1
            src, dst, data = self.wire.popleft()
            packet = decode(data)
            if dst in self.down or src in self.down or self.drop(src, dst, packet):
                continue
            for _ in range(self.copies(src, dst, packet)):
                if self.keep_log:
                    self.log.append((src, dst, packet))
                    self.log_times.append(self.now)
                self.nodes[dst].receive_datagram(data, src, self.now)
                self.collect(dst)

    def advance(self, seconds: float, step: float | None = None) -> None:
        """Move the clock forward in steps, firing due timers and flushing the wire after each."""
        step = self.step if step is None else step
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            for pid, node in self.nodes.items():
                deadline = node.get_timer()
                if pid not in self.down and deadline is not None and deadline <= self.now:
                    node.handle_timer(self.now)
                    self.collect(pid)
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

    def deliveries(self, i: int) -> list[DeliveredMessage]:
        return messages_of(self.events[self.pids[i]])

    def views(self, i: int) -> list[tuple[str, ...]]:
        return [e.members for e in self.events[self.pids[i]] if isinstance(e, ViewInstalled)]

    def of_type(self, i: int, cls: type) -> list:
        return [e for e in self.events[self.pids[i]] if isinstance(e, cls)]

    def sent_types(self, src: str | None = None) -> list[str]:
        return [type(p).__name__ for s, _, p in self.log if src is None or s == src]


class Ring(Wire[GroupEngine]):
    """The engines of one group ``g`` whose members founded it together (the first holds the token)."""

    def __init__(self, size: int, config: EngineConfig | None = None,
                 engine_cls: type[GroupEngine] = GroupEngine) -> None:
        pids = [f"10.0.0.{i + 1}:7000" for i in range(size)]
        self.view = View(ViewId(pids[0], 1000), tuple(pids))
        cfg = config or EngineConfig(journal=True)
        engines = {pid: engine_cls(pid=pid, group="g", view=self.view, config=cfg, rng=random.Random(i), now=0.0)
                   for i, pid in enumerate(pids)}
        super().__init__(engines, step=0.005, keep_log=True)
        self.engines = engines

    def send(self, i: int, payload: bytes, qos: QoS = QoS.TOTAL) -> int | None:
        return self.do(i, lambda engine, now: engine.send(payload, qos, now))  # type: ignore[return-value]


class Net(Wire[RmpProcess]):
    """Whole RMP processes, in no group until a test makes them join or found one (group ``g`` by default)."""

    def __init__(self, size: int, config: EngineConfig | None = None) -> None:
        pids = [f"10.0.1.{i + 1}:7000" for i in range(size)]
        cfg = config or EngineConfig(journal=True)
        procs = {pid: RmpProcess(pid=pid, config=cfg, rng=random.Random(i), now=0.0,
                                 wall_ms=1_700_000_000_000 + i) for i, pid in enumerate(pids)}
        super().__init__(procs, step=0.01, keep_log=False)
        self.procs = procs

    def send(self, i: int, payload: bytes, qos: QoS = QoS.TOTAL) -> None:
        self.do(i, lambda proc, now: proc.send("g", payload, qos, now))
