"""Runs one seeded simulation: N engines, a workload of random senders, a faulty network, the checker.

One seed derives every random choice (network faults, send times, QoS picks, payloads), so ``run_seed(config,
seed)`` always returns the same result; a failure carries the ``rmp sim`` command that replays it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..journal import JournalWriter
from ..protocol.config import EngineConfig
from ..protocol.engine import GroupEngine
from ..protocol.events import Delivery
from ..protocol.ids import ViewId
from ..protocol.qos import QoS
from ..protocol.view import View
from .checker import InvariantChecker, SentMessage
from .network import EventQueue, LinkFaults, SimNetwork

QOS_CHOICES = ("unreliable", "unordered", "source", "total", "k2", "k3", "majority", "safe", "mixed")
MIXED = tuple(QoS.parse(name) for name in QOS_CHOICES[:-1])
SIM_EPOCH = 1_700_000_000.0
"""Wall-clock time journaled for virtual time 0."""


@dataclass(frozen=True)
class SimConfig:
    members: int = 5
    senders: int = 3
    messages: int = 100
    size: int = 100
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    qos: str = "total"
    send_interval: float = 0.002
    """Mean gap between one sender's messages (exponentially distributed), in virtual seconds."""
    max_time: float = 600.0
    """Virtual seconds after which a run that has not fallen silent counts as not quiescent."""

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ValueError("--members must be at least 1")
        if not 0 <= self.senders <= self.members:
            raise ValueError("--senders must be between 0 and --members")
        if self.messages < 0 or self.size < 0:
            raise ValueError("--messages and --size must not be negative")
        if self.qos not in QOS_CHOICES:
            raise ValueError(f"--qos must be one of {', '.join(QOS_CHOICES)}")
        LinkFaults(loss=self.loss, dup=self.dup, reorder=self.reorder)

    def cli_args(self) -> list[str]:
        """The ``rmp sim`` flags that reproduce this configuration."""
        return [
            "--members", str(self.members), "--senders", str(self.senders), "--messages", str(self.messages),
            "--size", str(self.size), "--loss", str(self.loss), "--dup", str(self.dup),
            "--reorder", str(self.reorder), "--qos", self.qos,
        ]

    def replay_command(self, seed: int) -> str:
        return " ".join(["rmp", "sim", *self.cli_args(), "--seed", str(seed)])


@dataclass
class SeedResult:
    seed: int
    violations: list[dict[str, str]]
    violation_count: int
    delivered: int
    expected: int
    quiescent: bool
    sim_time: float
    datagrams: int
    stats: dict[str, int] = field(default_factory=dict)
    max_ack_slots: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Simulation:
    """The cluster of engines wired to the network and the checker."""

    def __init__(self, config: SimConfig, seed: int, *, journal_dir: Path | None = None,
                 engine_factory: type[GroupEngine] = GroupEngine,
                 engine_config: EngineConfig | None = None) -> None:
        self.config = config
        self.seed = seed
        self.queue = EventQueue()
        net_rng = random.Random(seed * 4 + 1)
        self.work_rng = random.Random(seed * 4 + 2)
        self.pids = [f"10.0.{i // 250}.{i % 250 + 1}:7000" for i in range(config.members)]
        self.index = {pid: i for i, pid in enumerate(self.pids)}
        view = View(ViewId(self.pids[0], int(SIM_EPOCH * 1000)), tuple(self.pids))
        faults = LinkFaults(loss=config.loss, dup=config.dup, reorder=config.reorder)
        self.network = SimNetwork(self.queue, faults, net_rng, config.members)
        self.checker = InvariantChecker(self.pids, config.members)
        self.writer = JournalWriter(journal_dir) if journal_dir is not None else None
        ecfg = engine_config or EngineConfig()
        if not ecfg.journal:
            ecfg = EngineConfig(**{**asdict(ecfg), "journal": True})
        self.engines = [
            engine_factory(pid=pid, group="sim", view=view, config=ecfg, rng=random.Random(seed * 4 + 3 + i * 1000),
                           now=0.0)
            for i, pid in enumerate(self.pids)
        ]
        self.timer_at: list[float | None] = [None] * config.members
        self.timer_version = [0] * config.members
        self.to_send = [config.messages if i < config.senders else 0 for i in range(config.members)]
        self.expected = 0
        self.last_send_time = 0.0
        self.max_ack_slots = 0

    # --------------------------------------------------------------------------------------------------------------

    def run(self) -> SeedResult:
        for i in range(self.config.members):
            self._drain(i)
            if self.to_send[i]:
                self.queue.push(self.work_rng.expovariate(1 / self.config.send_interval), "send", i)
        max_time = self.config.max_time
        queue = self.queue
        while len(queue):
            kind, payload = queue.pop()
            if queue.now > max_time:
                break
            if kind == "datagram":
                dst, src, data = payload
                self.network.arrived()
                self.engines[dst].receive_datagram(data, self.pids[src], queue.now)
                self._drain(dst)
            elif kind == "timer":
                i, version = payload
                if version == self.timer_version[i]:
                    self.timer_at[i] = None
                    self.engines[i].handle_timer(queue.now)
                    self._drain(i)
            else:
                self._app_send(payload)
        self.checker.finish()
        quiescent = not len(queue) and all(e.quiet for e in self.engines)
        if self.writer is not None:
            self.writer.close()
        stats: Counter[str] = Counter()
        for engine in self.engines:
            stats.update(engine.stats)
        stats["network_lost"] = self.network.lost
        stats["network_duplicated"] = self.network.duplicated
        return SeedResult(
            seed=self.seed,
            violations=[asdict(v) for v in self.checker.violations],
            violation_count=self.checker.violation_count,
            delivered=self.checker.delivered_count,
            expected=self.expected,
            quiescent=quiescent,
            sim_time=round(queue.now, 6),
            datagrams=self.network.sent,
            stats=dict(stats),
            max_ack_slots=self.max_ack_slots,
        )

    def _app_send(self, i: int) -> None:
        cfg = self.config
        rng = self.work_rng
        qos = rng.choice(MIXED) if cfg.qos == "mixed" else QoS.parse(cfg.qos)
        payload = rng.randbytes(cfg.size)
        engine = self.engines[i]
        seq = engine.next_unreliable_seq if qos.level == 0 else engine.next_seq
        self.checker.on_send(SentMessage(engine.pid, seq, qos, payload))
        if qos.level != 0:
            self.expected += cfg.members
        engine.send(payload, qos, self.queue.now)
        self.last_send_time = self.queue.now
        self._drain(i)
        self.to_send[i] -= 1
        if self.to_send[i]:
            self.queue.push(self.queue.now + rng.expovariate(1 / cfg.send_interval), "send", i)

    def _drain(self, i: int) -> None:
        """Move an engine's outputs to the network, the checker and the journal, and re-arm its timer."""
        engine = self.engines[i]
        for tx in engine.datagrams_to_send():
            if tx.dest is None:
                self.network.multicast(i, tx.data)
            else:
                self.network.unicast(i, self.index[tx.dest], tx.data)
        deliveries = [e for e in engine.events() if isinstance(e, Delivery)]
        records = engine.journal_records()
        if records:
            pending = iter(deliveries)
            for rec in records:
                payload = next(pending).payload if rec["event"] == "deliver" else None
                self.checker.on_record(rec, payload)
            if self.writer is not None:
                for rec in records:
                    rec["wall"] = SIM_EPOCH + rec["mono"]
                self.writer.write(engine.pid, records)
        if engine.q.ack_slots > self.max_ack_slots:
            self.max_ack_slots = engine.q.ack_slots
        deadline = engine.get_timer()
        if deadline != self.timer_at[i]:
            self.timer_at[i] = deadline
            self.timer_version[i] += 1
            if deadline is not None:
                self.queue.push(max(deadline, self.queue.now), "timer", (i, self.timer_version[i]))


def run_seed(config: SimConfig, seed: int, journal_dir: Path | None = None,
             engine_factory: type[GroupEngine] = GroupEngine) -> SeedResult:
    """Run one seed; with ``journal_dir`` its journals go to ``journal_dir/seed-<seed>/``."""
    seed_dir = journal_dir / f"seed-{seed}" if journal_dir is not None else None
    return Simulation(config, seed, journal_dir=seed_dir, engine_factory=engine_factory).run()
