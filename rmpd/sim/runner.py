"""Runs one seeded simulation: RMP processes, a workload, a faulty network, faults, and the checker.

One seed derives every random choice (network faults, send times, QoS picks, payloads, crash and partition times,
joins, leaves, lock requests), so ``run_seed(config, seed)`` always returns the same result; a failure carries the
``rmp sim`` command that replays it.

A run has two phases, as in TigerBeetle's VOPR: while the workload runs, faults are injected (crashes with restarts,
a partition that heals, joins, leaves, lock traffic) and safety is checked on every event; then faults stop, and the
survivors must converge: every member of the surviving view delivers every reliable message its members sent.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..journal import JournalWriter
from ..protocol.config import EngineConfig
from ..protocol.engine import GroupEngine
from ..protocol.events import CallAnswered, CallRequest, Delivered, Left, Transmit, ViewInstalled
from ..protocol.ids import ViewId
from ..protocol.limits import MessageTooLarge
from ..protocol.packets import PacketType
from ..protocol.process import NotMember, RmpProcess
from ..protocol.qos import Level, QoS
from ..protocol.reformation import MIN_PARTITION_MAJORITY
from ..protocol.status import GroupStatus
from ..protocol.view import View
from . import QOS_CHOICES
from .checker import InvariantChecker, SentMessage
from .detection import CrashDetections
from .network import EventQueue, LinkFaults, SimNetwork

MIXED = tuple(QoS.parse(name) for name in QOS_CHOICES[:-1])
SIM_EPOCH = 1_700_000_000.0
"""Wall-clock time journaled for virtual time 0."""
GROUP = "sim"
SETTLE_INTERVAL = 1.0
"""Virtual seconds between checks whether a run has nothing left to do (Alives go on for ever)."""
SETTLE_CHECKS = 3
"""Checks in a row that find nothing to do before a run ends: views that can hear each other only learn it from
the Alives exchanged meanwhile, and then have a merge to make."""


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
    crash: int = 0
    partition: bool = False
    joins: int = 0
    leaves: int = 0
    locks: bool = False
    calls: int = 0
    """Calls from a non-member process to handler 0, held by the first member (multi-RPC with SCMP)."""
    restarts: int = 0
    """Members that crash and start again on the same process ID (a new incarnation), which rejoin at once."""
    simultaneous: bool = False
    """The first members found the group by all joining at time 0, instead of in one view made out of band."""
    call_dup: int = 1
    """Copies of every Non Member Data datagram the caller puts on the wire."""
    send_interval: float = 0.002
    """Mean gap between one sender's messages (exponentially distributed), in virtual seconds."""
    max_time: float = 900.0
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
        if self.crash < 0 or self.joins < 0 or self.leaves < 0 or self.restarts < 0:
            raise ValueError("--crash, --restarts, --joins and --leaves must not be negative")
        if self.leaves >= self.members:
            raise ValueError("--leaves must leave at least one member")
        if self.calls < 0 or self.call_dup < 1:
            raise ValueError("--calls must not be negative and --call-dup must be at least 1")
        LinkFaults(loss=self.loss, dup=self.dup, reorder=self.reorder)

    @property
    def membership_faults(self) -> bool:
        return bool(self.crash or self.restarts or self.partition or self.joins or self.leaves or self.locks
                    or self.simultaneous)

    def cli_args(self) -> list[str]:
        """The ``rmp sim`` flags that reproduce this configuration."""
        args = [
            "--members", str(self.members), "--senders", str(self.senders), "--messages", str(self.messages),
            "--size", str(self.size), "--loss", str(self.loss), "--dup", str(self.dup),
            "--reorder", str(self.reorder), "--qos", self.qos,
        ]
        if self.crash:
            args += ["--crash", str(self.crash)]
        if self.restarts:
            args += ["--restarts", str(self.restarts)]
        if self.simultaneous:
            args.append("--simultaneous")
        if self.partition:
            args.append("--partition")
        if self.joins:
            args += ["--joins", str(self.joins)]
        if self.leaves:
            args += ["--leaves", str(self.leaves)]
        if self.locks:
            args.append("--locks")
        if self.calls:
            args += ["--calls", str(self.calls), "--call-dup", str(self.call_dup)]
        return args

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
    liveness: bool
    sim_time: float
    datagrams: int
    views_installed: int = 0
    one_view: bool = True
    """At the end every live process is a member of one and the same view, which holds all of them."""
    convergence_seconds: float = 0.0
    """From the last fault (a restart, a join, a heal) to the last view installed anywhere."""
    reformations: int = 0
    detection_seconds: float = 0.0
    detections: list[float] = field(default_factory=list)
    """Seconds from each crash to the first view without the crashed process installed by one of its fellow
    members (the processes whose view held it when it crashed)."""
    crashes_untimed: int = 0
    """Crashes no fellow member ever installed a view without: a partition had cut the process off and its side
    stopped (below the minimum partition) while the majority had already removed it, or the fellows crashed too."""
    stats: dict[str, int] = field(default_factory=dict)
    max_ack_slots: int = 0
    calls: int = 0
    calls_replied: int = 0
    calls_failed: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Membership = tuple[str, float]
"""One membership of the simulated group: the process ID and the ``now`` it began (``GroupStatus.started_at``).
A process that rejoins after a partition stopped it keeps its ID but begins a new membership."""


@dataclass
class Sent:
    """A message an application handed to its process, and the membership that took it: only messages of a
    membership still running at the end are owed to the survivors."""

    src: str
    seq: int
    membership: Membership
    at: float


class Simulation:
    """A set of RMP process slots (each pid may crash and restart) wired to the network and the checker."""

    def __init__(self, config: SimConfig, seed: int, *, journal_dir: Path | None = None,
                 engine_factory: type[GroupEngine] = GroupEngine,
                 engine_config: EngineConfig | None = None,
                 network_factory: Callable[..., SimNetwork] = SimNetwork) -> None:
        self.config = config
        self.seed = seed
        self.queue = EventQueue()
        self.fault_rng = random.Random(seed * 8 + 5)
        self.work_rng = random.Random(seed * 8 + 2)
        self.engine_factory = engine_factory
        total = config.members + config.joins + (1 if config.calls else 0)
        self.hosts = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(total)]
        self.caller = total - 1 if config.calls else None
        """The slot of the non-member that calls the group (never joins it)."""
        self.calls_run: Counter[bytes] = Counter()
        """Runs per call, by its payload (each call's is unique): a call sent again under a fresh stamp (after a
        probe) is still one call."""
        self.call_answers: Counter[int] = Counter()
        self.calls_replied = 0
        self.calls_failed: Counter[str] = Counter()
        self.port = [7000] * total
        self.pids = [f"{host}:7000" for host in self.hosts]
        """The current process ID on each host: a restarted process takes a new port (paper 3.1: a process ID is
        never reused)."""
        self.index = {pid: i for i, pid in enumerate(self.pids)}
        faults = LinkFaults(loss=config.loss, dup=config.dup, reorder=config.reorder)
        self.network = network_factory(self.queue, faults, random.Random(seed * 8 + 1), total)
        self.checker = InvariantChecker()
        self.writer = JournalWriter(journal_dir) if journal_dir is not None else None
        base = engine_config or EngineConfig()
        self.engine_config = EngineConfig(**{**asdict(base), "journal": True})
        self.procs: list[RmpProcess | None] = [None] * total
        self.incarnation = [0] * total
        self.crashes = CrashDetections()
        self.side: list[int] = [0] * total
        self.partitioned = False
        self.timer_at: list[float | None] = [None] * total
        self.timer_version = [0] * total
        self.to_send = [config.messages if i < config.senders else 0 for i in range(total)]
        if self.caller is not None:
            self.to_send[self.caller] = 0
        self.sent: list[Sent] = []
        self.refused_sends = 0
        self.views: set[str] = set()
        self.recoveries: set[str] = set()
        self.max_ack_slots = 0
        self.send_interval = config.send_interval
        if config.membership_faults:
            # Spread the workload over ~20 s so crashes and partitions strike while messages flow.
            self.send_interval = max(config.send_interval, 20.0 / max(config.messages, 1))
        self.faults_until = min(15.0, config.messages * self.send_interval * 0.75) + 0.05
        # With faults the group asks for a majority partition: only then do majority and safe messages keep one
        # order when a member is cut off (an excluded member could otherwise go on alone).
        self.min_partition = MIN_PARTITION_MAJORITY if config.membership_faults else 1
        self.victims: list[int] = []
        self.last_fault_at = 0.0
        self.last_view_at = 0.0
        self.departures: list[tuple[float, str, str]] = []

    # --------------------------------------------------------------------------------------------------------------

    def _spawn(self, i: int, same_id: bool = False) -> RmpProcess:
        """Start the process of slot ``i``: after a crash on a new port, or (``same_id``) on the same one, a new
        incarnation whose sequence numbers start above its predecessor's, as a daemon's do."""
        self.incarnation[i] += 1
        if self.incarnation[i] > 1 and not same_id:
            self.port[i] += 1
            self.pids[i] = f"{self.hosts[i]}:{self.port[i]}"
            self.index[self.pids[i]] = i
        if same_id:
            self.checker.new_incarnation(self.pids[i])  # a new application, and a new membership
        wall_ms = int((SIM_EPOCH + self.queue.now) * 1000) + self.incarnation[i] * 7
        proc = RmpProcess(pid=self.pids[i], config=self.engine_config,
                          rng=random.Random(self.seed * 8 + 3 + i * 1000 + self.incarnation[i]), now=self.queue.now,
                          wall_ms=wall_ms, engine_factory=self.engine_factory,
                          seq_base=wall_ms * 1000 if same_id else 0)
        self.procs[i] = proc
        return proc

    def _node(self, i: int) -> str:
        return self.pids[i]

    def _blocked(self, src: int, dst: int) -> bool:
        return self.procs[dst] is None or self.procs[src] is None or self.side[src] != self.side[dst]

    def _schedule_faults(self) -> None:
        cfg, rng, window = self.config, self.fault_rng, self.faults_until
        initial = list(range(cfg.members))
        for j in range(cfg.joins):
            self.queue.push(rng.uniform(0.0, window), "join", cfg.members + j)
        for i in rng.sample(initial[1:] or initial, min(cfg.leaves, max(len(initial) - 1, 0))):
            self.queue.push(rng.uniform(0.0, window), "leave", i)
        self.victims = rng.sample(initial, min(cfg.crash, len(initial)))
        for i in self.victims:
            at = rng.uniform(0.0, window)
            self.queue.push(at, "crash", i)
            self.queue.push(at + rng.uniform(2.0, 10.0), "restart", i)
        for i in rng.sample(initial, min(cfg.restarts, len(initial))):
            at = rng.uniform(0.0, window)
            self.queue.push(at, "crash", i)
            self.queue.push(at + rng.uniform(0.0, 3.0), "restart_same_id", i)
        if cfg.partition:
            at = rng.uniform(0.0, window)
            self.queue.push(at, "partition", None)
            self.queue.push(at + rng.uniform(1.0, 12.0), "heal", None)
        if cfg.locks:
            for _ in range(3 * cfg.members):
                self.queue.push(rng.uniform(0.0, window), "lock", rng.randrange(cfg.members))

    def run(self) -> SeedResult:
        cfg = self.config
        view = View(ViewId(self.pids[0], int(SIM_EPOCH * 1000)), tuple(self.pids[: cfg.members]),
                    min_partition=self.min_partition)
        for i in range(cfg.members):
            proc = self._spawn(i)
            if cfg.simultaneous:  # nobody answers at first: each founds a group of its own, and the views merge
                proc.join(GROUP, 0.0, min_partition=self.min_partition)
            else:
                if i == 0:
                    proc.view_counter.next_view_id(0.0)  # the founder's counter made the first view
                proc.found(GROUP, view, 0.0)
            self._drain(i)
            if self.to_send[i]:
                self.queue.push(self.work_rng.expovariate(1 / self.send_interval), "send", i)
        self._schedule_faults()
        self._schedule_calls()
        queue = self.queue
        queue.push(self.faults_until + SETTLE_INTERVAL, "settle", None)
        quiet_checks = 0
        timed_out = False
        same_time, last_time = 0, -1.0
        while len(queue):
            kind, payload = queue.pop()
            if queue.now > cfg.max_time:
                timed_out = True
                break
            if queue.now == last_time:
                same_time += 1
                if same_time > 100_000:
                    self.checker.fail("livelock", f"100000 events at simulated time {queue.now} without progress")
                    timed_out = True
                    break
            else:
                same_time, last_time = 0, queue.now
            if kind == "datagram":
                dst, src, data = payload
                self.network.arrived()
                proc = self.procs[dst]
                if proc is not None and not self._blocked(src, dst):
                    proc.receive_datagram(data, self.pids[src], queue.now)
                    self._drain(dst)
            elif kind == "timer":
                i, version = payload
                proc = self.procs[i]
                if version == self.timer_version[i] and proc is not None:
                    self.timer_at[i] = None
                    proc.handle_timer(queue.now)
                    self._drain(i)
            elif kind == "send":
                self._app_send(payload)
            elif kind == "call":
                self._call(payload)
            elif kind == "settle":
                quiet_checks = quiet_checks + 1 if self._settled() else 0
                if quiet_checks >= SETTLE_CHECKS:
                    break
                queue.push(queue.now + SETTLE_INTERVAL, "settle", None)
            else:
                self._fault(kind, payload)
        self.checker.finish()
        quiescent = not timed_out
        if self.writer is not None:
            self.writer.close()
        return self._result(quiescent)

    # --------------------------------------------------------------------------------------------------------------

    def _settled(self) -> bool:
        """Nothing left to happen but Alives: no datagram but Alives in flight, no work or fault to come, and every
        live process with nothing to do (``RmpProcess.quiet``)."""
        for kind, payload in self.queue.pending():
            if kind not in ("timer", "settle", "datagram") or (
                    kind == "datagram" and payload[2][3:4] != bytes((PacketType.ALIVE,))):
                return False
        return all(p.quiet() for p in self.procs if p is not None)

    def _fault(self, kind: str, i: Any) -> None:
        now = self.queue.now
        if kind in ("restart", "restart_same_id", "join", "heal"):
            self.last_fault_at = now
        if kind == "crash" and self.procs[i] is not None:
            self.procs[i] = None
            self.timer_version[i] += 1
            pid = self.pids[i]
            fellows = {p.pid for p in self.procs if p is not None and pid in (p.view(GROUP) or ())}
            self.crashes.no_longer_fellow(pid)
            self.crashes.crashed(pid, now, fellows)
        elif (kind == "restart" and self.procs[i] is None) or (kind == "join" and self.procs[i] is None):
            self._spawn(i).join(GROUP, now, min_partition=self.min_partition)
            self._drain(i)
        elif kind == "restart_same_id" and self.procs[i] is None:
            # As a daemon rejoins what it recorded: a plain join, which founds a view if nobody answers (the views
            # merge once they hear each other).
            self._spawn(i, same_id=True).join(GROUP, now, min_partition=self.min_partition)
            self._drain(i)
        elif kind == "leave" and self.procs[i] is not None:
            try:
                self.procs[i].leave(GROUP, now)
            except NotMember:
                return
            self.to_send[i] = 0
            self._drain(i)
        elif kind == "partition":
            # Cut off a minority small enough that the rest still holds a majority of the current view.
            view = next((p.view(GROUP) for p in self.procs if p is not None and p.view(GROUP) is not None), None)
            if view is None:
                return
            # Processes about to crash go to the minority side, so the crashes cannot take the majority too.
            alive = [j for j, p in enumerate(self.procs) if p is not None and p.pid in view]
            doomed = [j for j in alive if j in self.victims and self.procs[j] is not None]
            steady = [j for j in alive if j not in doomed]
            room = len(steady) - (view.size // 2 + 1)
            if room < 1:
                return
            minority = doomed + self.fault_rng.sample(steady, self.fault_rng.randint(0 if doomed else 1, room))
            for j in minority:
                self.side[j] = 1
            self.partitioned = True
        elif kind == "heal":
            self.side = [0] * len(self.side)
            self.partitioned = False
        elif kind == "lock" and self.procs[i] is not None:
            proc = self.procs[i]
            view = proc.view(GROUP)
            if view is None:
                return
            lock = self.fault_rng.randrange(8)
            try:
                if view.lock_holder(lock) == proc.pid:
                    proc.unlock(GROUP, lock, now)
                else:
                    proc.lock(GROUP, lock, now)
            except NotMember:
                return
            self._drain(i)

    def _schedule_calls(self) -> None:
        """The first member takes handler lock 0 at once; calls start once every member's SCMP floor (about 2 s
        after it started, multirpc.start_upper) has passed, and spread over the fault window."""
        if self.caller is None:
            return
        self._spawn(self.caller)
        holder = self.procs[0]
        assert holder is not None
        holder.lock(GROUP, 0, self.queue.now)
        self._drain(0)
        start = 2.5
        for n in range(self.config.calls):
            self.queue.push(start + self.work_rng.uniform(0.0, max(self.faults_until, 1.0)), "call", n)

    def _call(self, n: int) -> None:
        proc = self.procs[self.caller] if self.caller is not None else None
        if proc is None:
            return
        proc.call(GROUP, f"call {n}".encode(), self.queue.now, handler=0, timeout=20.0)
        self._drain(self.caller)  # type: ignore[arg-type]

    def _on_call_events(self, i: int, events: list[Any]) -> None:
        """Serve calls (the handler's holder answers at once) and check each ran at most once, answered once."""
        proc = self.procs[i]
        assert proc is not None
        for event in events:
            if isinstance(event, CallRequest):
                key = event.payload
                self.calls_run[key] += 1
                if self.calls_run[key] > 1:
                    self.checker.fail("call-at-most-once", f"{key} ran {self.calls_run[key]} times, the last at "
                                                           f"{proc.pid}")
                with contextlib.suppress(NotMember):
                    proc.reply(GROUP, event.caller, event.conn, event.stamp, event.payload.upper(), self.queue.now)
            elif isinstance(event, CallAnswered):
                self.call_answers[event.call_id] += 1
                if self.call_answers[event.call_id] > 1:
                    self.checker.fail("call-one-answer", f"call {event.call_id} answered twice")
                if event.error is None:
                    self.calls_replied += 1
                    if not event.reply or not event.reply.startswith(b"CALL "):
                        self.checker.fail("call-reply", f"call {event.call_id} got reply {event.reply!r}")
                else:
                    self.calls_failed[event.error] += 1

    def _app_send(self, i: int) -> None:
        cfg = self.config
        rng = self.work_rng
        qos = rng.choice(MIXED) if cfg.qos == "mixed" else QoS.parse(cfg.qos)
        payload = rng.randbytes(cfg.size)
        proc = self.procs[i]
        status = proc.status(GROUP) if proc is not None else None
        if status is not None and not status.departed and not status.leaving and not status.reforming:
            self._send_one(i, status, qos, payload)
        self.to_send[i] -= 1
        if self.to_send[i] > 0:
            self.queue.push(self.queue.now + rng.expovariate(1 / self.send_interval), "send", i)

    def _send_one(self, i: int, status: GroupStatus, qos: QoS, payload: bytes) -> None:
        """Hand one message to process ``i`` (whose membership ``status`` describes) and tell the checker what it
        will have to deliver."""
        proc = self.procs[i]
        assert proc is not None
        first = status.next_seq
        try:
            seq = proc.send(GROUP, payload, qos, self.queue.now)
        except MessageTooLarge:  # unreliable messages must fit one packet: --size says more
            self.refused_sends += 1
            return
        assert seq is not None
        if qos.level != Level.UNRELIABLE and seq > first:
            # Fragmented: the pieces before the last deliver nothing; unordered ones travel source ordered.
            qos = QoS(Level.SOURCE) if qos.level == Level.UNORDERED else qos
            for piece in range(first, seq):
                self.checker.on_send(SentMessage(proc.pid, piece, qos, ()))
        self.checker.on_send(SentMessage(proc.pid, seq, qos, payload))
        if qos.level != Level.UNRELIABLE:  # one entry per message: packed ones share their packet's seq
            self.sent.append(Sent(proc.pid, seq, (proc.pid, status.started_at), self.queue.now))
        self._drain(i)

    def _drain(self, i: int) -> None:
        """Move a process's outputs to the network, the checker and the journal, and re-arm its timer."""
        proc = self.procs[i]
        if proc is None:
            return
        out = proc.take_outputs()
        self._transmit(i, out.datagrams)
        events, records = out.events, out.records
        if self.caller is not None:
            self._on_call_events(i, events)
            out = proc.take_outputs()  # what replying produced
            self._transmit(i, out.datagrams)
            events, records = events + out.events, records + out.records
        deliveries = iter([e for e in events if isinstance(e, Delivered)])  # one per packet, as the records
        node = self._node(i)
        for rec in records:
            payloads = None
            if rec["event"] == "deliver":
                payloads = next(deliveries).payloads if rec.get("parts", 1) else ()
            self.checker.on_record(node, rec, payloads)
            if rec["event"] == "view":
                self.views.add(rec["view"])
                self.crashes.view_installed(node, set(rec["members"]), self.queue.now)
            elif rec["event"] == "recovery" and rec.get("role") == "commit":
                self.recoveries.add(rec["view"] + "/" + str(rec.get("version")))
        if self.writer is not None and records:
            for rec in records:
                rec["wall"] = SIM_EPOCH + rec["mono"]
            self.writer.write(proc.pid, records)
        for event in events:
            if isinstance(event, Left):
                self.checker.forget_views(node)  # whatever this process joins next is a new membership
                self.crashes.no_longer_fellow(node)
                self.departures.append((self.queue.now, node, event.reason))
            elif isinstance(event, ViewInstalled):
                self.last_view_at = self.queue.now
        status = proc.status(GROUP)
        if status is not None and status.ack_slots > self.max_ack_slots:
            self.max_ack_slots = status.ack_slots
        deadline = out.deadline
        if deadline != self.timer_at[i]:
            self.timer_at[i] = deadline
            self.timer_version[i] += 1
            if deadline is not None:
                self.queue.push(max(deadline, self.queue.now), "timer", (i, self.timer_version[i]))

    def _transmit(self, i: int, datagrams: list[Transmit]) -> None:
        copies = self.config.call_dup if i == self.caller else 1
        for tx in datagrams:
            if tx.dest is None:
                for _ in range(copies):  # the caller's calls are duplicated on the wire (--call-dup)
                    self.network.multicast(i, tx.data)
            else:
                self.network.unicast(i, self.index[tx.dest], tx.data)

    @staticmethod
    def _joining(proc: RmpProcess) -> bool:
        """``proc`` is joining the group: it lists the group and holds no membership of it yet."""
        return GROUP in proc.groups() and proc.status(GROUP) is None

    # --------------------------------------------------------------------------------------------------------------

    def _result(self, quiescent: bool) -> SeedResult:
        delivered, expected = self._liveness()
        stats: Counter[str] = Counter()
        for proc in self.procs:
            if proc is not None:
                stats.update(proc.counters())
        stats["network_lost"] = self.network.lost
        stats["network_duplicated"] = self.network.duplicated
        return SeedResult(
            seed=self.seed,
            violations=[asdict(v) for v in self.checker.violations],
            violation_count=self.checker.violation_count,
            delivered=delivered,
            expected=expected,
            quiescent=quiescent,
            liveness=delivered == expected,
            sim_time=round(self.queue.now, 6),
            datagrams=self.network.sent,
            views_installed=len(self.views),
            one_view=self._one_view(),
            convergence_seconds=round(max(self.last_view_at - self.last_fault_at, 0.0), 3),
            reformations=len(self.recoveries),
            detection_seconds=round(max(self.crashes.detections, default=0.0), 3),
            detections=[round(d, 3) for d in self.crashes.detections],
            crashes_untimed=self.crashes.untimed,
            stats=dict(stats),
            max_ack_slots=self.max_ack_slots,
            calls=self.config.calls,
            calls_replied=self.calls_replied,
            calls_failed=dict(self.calls_failed),
        )

    def _one_view(self) -> bool:
        """Every live process that wants the group (not the caller, not one that left) is a member of the same
        view, and that view is exactly those processes."""
        live = {p.pid: p.view(GROUP) for p in self.procs if p is not None and GROUP in p.groups()}
        views = {v.view_id if v is not None else None for v in live.values()}
        if len(views) != 1 or None in views:
            return False
        view = next(v for v in live.values() if v is not None)
        return set(view.members) == set(live)

    def _liveness(self) -> tuple[int, int]:
        """Deliveries owed and made among the members of the surviving view (the view most live processes hold).

        Member m owes delivery of every reliable message sent by a member s of that view in the membership s
        still runs, after m's membership began.
        """
        members: dict[str, GroupStatus] = {}
        holders: Counter[str] = Counter()
        for i, proc in enumerate(self.procs):
            status = proc.status(GROUP) if proc is not None else None
            if status is not None and not status.departed:
                members[self._node(i)] = status
                holders[str(status.view.view_id)] += 1
        if not holders:
            return 0, 0
        surviving_view = holders.most_common(1)[0][0]
        survivors = {node: s for node, s in members.items() if str(s.view.view_id) == surviving_view}
        current: dict[str, Membership] = {node: (node, s.started_at) for node, s in survivors.items()}
        owed = [m for m in self.sent if current.get(m.src) == m.membership]
        expected = delivered = 0
        for node, status in survivors.items():
            got = self.checker.delivered[node]
            for m in owed:
                if m.at > status.started_at:
                    expected += 1
                    delivered += (m.src, m.seq) in got
        return delivered, expected


def run_seed(config: SimConfig, seed: int, journal_dir: Path | None = None,
             engine_factory: type[GroupEngine] = GroupEngine) -> SeedResult:
    """Run one seed; with ``journal_dir`` its journals go to ``journal_dir/seed-<seed>/``."""
    seed_dir = journal_dir / f"seed-{seed}" if journal_dir is not None else None
    return Simulation(config, seed, journal_dir=seed_dir, engine_factory=engine_factory).run()
