"""Runs one seeded simulation: RMP processes, a workload, a faulty network, faults, and the checker.

One seed derives every random choice (network faults, send times, QoS picks, payloads, crash and partition times,
joins, leaves, lock requests), so ``run_seed(config, seed)`` always returns the same result; a failure carries the
``rmp sim`` command that replays it.

A run has two phases, as in TigerBeetle's VOPR: while the workload runs, faults are injected (crashes with restarts,
a partition that heals, joins, leaves, lock traffic) and safety is checked on every event; then faults stop, and the
survivors must converge: every member of the surviving view delivers every reliable message its members sent.

Everything that happens is a typed event on one timeline (schedule.py, faults.py), handed to its handler through
one table; after every input the process's outputs are taken once (``RmpProcess.take_outputs``, as the runtime
does): datagrams to the network, what the process did to the checker as typed observations (observations.py),
records to the journal, and its next deadline to the timeline.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..journal import JournalWriter
from ..protocol.config import EngineConfig
from ..protocol.engine import GroupEngine
from ..protocol.events import Transmit, ViewInstalled
from ..protocol.ids import ViewId
from ..protocol.packets import PacketType, packet_type_of
from ..protocol.reformation import MIN_PARTITION_MAJORITY
from ..protocol.status import GroupStatus
from ..protocol.view import View
from . import QOS_CHOICES
from .checker import InvariantChecker
from .cluster import Cluster
from .config import GROUP, SIM_EPOCH, SeedResult, SimConfig
from .detection import CrashDetections
from .faults import FaultInjector, plan_faults
from .network import LinkFaults, SimNetwork
from .observations import MembershipEnded, Observation, ReformationCommitted, ViewEntered, observe_step
from .schedule import Arrival, SettleCheck, Timeline, TimerDue
from .workload import Membership, Workload

__all__ = ["GROUP", "QOS_CHOICES", "SeedResult", "SimConfig", "Simulation", "run_seed"]

SETTLE_INTERVAL = 1.0
"""Virtual seconds between checks whether a run has nothing left to do (Alives go on for ever)."""
SETTLE_CHECKS = 3
"""Checks in a row that find nothing to do before a run ends: views that can hear each other only learn it from
the Alives exchanged meanwhile, and then have a merge to make."""
LIVELOCK_EVENTS = 100_000
"""Events at one moment of virtual time after which a run counts as stuck."""


class Simulation:
    """A set of RMP process slots wired to the network, the workload, the faults and the checker."""

    def __init__(self, config: SimConfig, seed: int, *, journal_dir: Path | None = None,
                 engine_factory: type[GroupEngine] = GroupEngine,
                 engine_config: EngineConfig | None = None,
                 network_factory: Callable[..., SimNetwork] = SimNetwork) -> None:
        self.config = config
        self.seed = seed
        self.clock = Timeline()
        total = config.members + config.joins + (1 if config.calls else 0)
        base = engine_config or EngineConfig()
        if config.congestion is not None:
            base = replace(base, congestion=config.congestion)
        self.cluster = Cluster(total, seed, self.clock, EngineConfig(**{**asdict(base), "journal": True}),
                               engine_factory)
        faults = LinkFaults(loss=config.loss, dup=config.dup, reorder=config.reorder)
        self.network = network_factory(self.clock, faults, random.Random(seed * 8 + 1), total)
        self.checker = InvariantChecker()
        self.writer = JournalWriter(journal_dir) if journal_dir is not None else None
        self.crashes = CrashDetections()
        send_interval = config.send_interval
        if config.membership_faults:
            # Spread the workload over ~20 s so crashes and partitions strike while messages flow.
            send_interval = max(config.send_interval, 20.0 / max(config.messages, 1))
        self.faults_until = min(15.0, config.messages * send_interval * 0.75) + 0.05
        # With faults the group asks for a majority partition: only then do majority and safe messages keep one
        # order when a member is cut off (an excluded member could otherwise go on alone).
        self.min_partition = MIN_PARTITION_MAJORITY if config.membership_faults else 1
        self.workload = Workload(config, self.cluster, self.clock, random.Random(seed * 8 + 2), self.checker,
                                 send_interval=send_interval, call_window=self.faults_until,
                                 caller=total - 1 if config.calls else None, drain=self._drain)
        fault_rng = random.Random(seed * 8 + 5)
        self.faults = FaultInjector(plan_faults(config, fault_rng, self.faults_until), fault_rng, self.cluster,
                                    self.clock, crashes=self.crashes, min_partition=self.min_partition,
                                    drain=self._drain, stop_sending=self.workload.stop_sending,
                                    observe=self.checker.observe, process_lost=self.workload.process_lost)
        self.views: set[str] = set()
        self.recoveries: set[str] = set()
        self.max_ack_slots = 0
        self.last_view_at = 0.0
        self.quiet_checks = 0
        """Settle checks in a row that found nothing left to do."""
        self.handlers: dict[type, Callable[[Any], None]] = {
            Arrival: self._on_arrival, TimerDue: self._on_timer, SettleCheck: self._on_settle_check,
            **self.workload.handlers(), **self.faults.handlers(),
        }
        """What each kind of event on the timeline does."""

    @property
    def hosts(self) -> list[str]:
        return self.cluster.hosts

    # --------------------------------------------------------------------------------------------------------------

    def run(self) -> SeedResult:
        self._start()
        clock, checker = self.clock, self.checker
        timed_out = False
        same_time, last_time = 0, -1.0
        while len(clock) and self.quiet_checks < SETTLE_CHECKS:
            event = clock.pop()
            if clock.now > self.config.max_time:
                timed_out = True
                break
            if clock.now == last_time:
                same_time += 1
                if same_time > LIVELOCK_EVENTS:
                    checker.fail("livelock", f"{LIVELOCK_EVENTS} events at simulated time {clock.now} without "
                                             "progress")
                    timed_out = True
                    break
            else:
                same_time, last_time = 0, clock.now
            self.handlers[type(event)](event)
        checker.finish()
        self._check_keys_delivered()
        if self.writer is not None:
            self.writer.close()
        return self._result(quiescent=not timed_out)

    def _start(self) -> None:
        """The first members form the group (in one view made out of band, or each joining at time 0), the
        workload and the faults are scheduled, and the first settle check."""
        cfg, cluster = self.config, self.cluster
        view = View(ViewId(cluster.pids[0], int(SIM_EPOCH * 1000)), tuple(cluster.pids[: cfg.members]),
                    min_partition=self.min_partition)
        for i in range(cfg.members):
            proc = cluster.spawn(i)
            if cfg.simultaneous:  # nobody answers at first: each founds a group of its own, and the views merge
                proc.join(GROUP, 0.0, min_partition=self.min_partition)
            else:
                proc.found(GROUP, view, 0.0)
            self._drain(i)
            self.workload.start(i)
        self.faults.schedule()
        self.workload.start_calls()
        self.clock.push(self.faults_until + SETTLE_INTERVAL, SettleCheck())

    def _on_arrival(self, arrival: Arrival) -> None:
        self.network.arrived()
        proc = self.cluster.procs[arrival.dst]
        if proc is not None and not self.cluster.blocked(arrival.src, arrival.dst):
            proc.receive_datagram(arrival.data, self.cluster.pids[arrival.src], self.clock.now)
            self._drain(arrival.dst)

    def _on_timer(self, timer: TimerDue) -> None:
        proc = self.cluster.due(timer)
        if proc is not None:
            proc.handle_timer(self.clock.now)
            self._drain(timer.slot)

    def _on_settle_check(self, check: SettleCheck) -> None:
        self.quiet_checks = self.quiet_checks + 1 if self._settled() else 0
        if self.quiet_checks < SETTLE_CHECKS:
            self.clock.push(self.clock.now + SETTLE_INTERVAL, check)

    def _settled(self) -> bool:
        """Nothing left to happen but Alives: no datagram but Alives in flight, no work or fault to come, and every
        live process with nothing to do (``RmpProcess.quiet``)."""
        for event in self.clock.pending():
            if not isinstance(event, TimerDue | SettleCheck | Arrival) or (
                    isinstance(event, Arrival) and packet_type_of(event.data) != PacketType.ALIVE):
                return False
        return all(p.quiet() for _, p in self.cluster.live())

    # --------------------------------------------------------------------------------------------------------------

    def _drain(self, i: int) -> None:
        """Take a process's outputs: datagrams to the network, what it did to the checker, records to the journal,
        its deadline to the timeline.  The member holding the call handler answers the calls it got at once."""
        proc = self.cluster.procs[i]
        if proc is None:
            return
        out = proc.take_outputs()
        self._transmit(i, out.datagrams)
        events, records = out.events, out.records
        if self.workload.has_calls:
            self.workload.serve_calls(i, events)
            out = proc.take_outputs()  # what replying produced
            self._transmit(i, out.datagrams)
            events, records = events + out.events, records + out.records
        for observation in observe_step(self.cluster.pids[i], records, events):
            self.checker.observe(observation)
            self._note(observation)
        self.workload.told(i, events)
        if self.writer is not None and records:
            for rec in records:
                rec["wall"] = SIM_EPOCH + rec["mono"]
            self.writer.write(proc.pid, records)
        if any(isinstance(event, ViewInstalled) for event in events):
            self.last_view_at = self.clock.now
        status = proc.status(GROUP)
        if status is not None and status.ack_slots > self.max_ack_slots:
            self.max_ack_slots = status.ack_slots
        self.cluster.rearm(i, out.deadline)

    def _note(self, observation: Observation) -> None:
        """What the run's summary counts: views installed, crash detections, reformations."""
        if isinstance(observation, ViewEntered):
            self.views.add(observation.view)
            self.crashes.view_installed(observation.node, set(observation.members), self.clock.now)
        elif isinstance(observation, ReformationCommitted):
            self.recoveries.add(f"{observation.view}/{observation.version}")
        elif isinstance(observation, MembershipEnded):
            self.crashes.no_longer_fellow(observation.node)

    def _transmit(self, i: int, datagrams: list[Transmit]) -> None:
        copies = self.config.call_dup if i == self.workload.caller else 1
        for tx in datagrams:
            if tx.dest is None:
                for _ in range(copies):  # the caller's calls are duplicated on the wire (--call-dup)
                    self.network.multicast(i, tx.data)
            else:
                self.network.unicast(i, self.cluster.index[tx.dest], tx.data)

    # --------------------------------------------------------------------------------------------------------------

    def _result(self, quiescent: bool) -> SeedResult:
        delivered, expected = self._liveness()
        stats: Counter[str] = Counter()
        for _, proc in self.cluster.live():
            stats.update(proc.counters())
        stats["network_lost"] = self.network.lost
        stats["network_duplicated"] = self.network.duplicated
        workload = self.workload
        return SeedResult(
            seed=self.seed,
            violations=[asdict(v) for v in self.checker.violations],
            violation_count=self.checker.violation_count,
            delivered=delivered,
            expected=expected,
            quiescent=quiescent,
            liveness=delivered == expected,
            sim_time=round(self.clock.now, 6),
            datagrams=self.network.sent,
            views_installed=len(self.views),
            one_view=self._one_view(),
            convergence_seconds=round(max(self.last_view_at - self.faults.last_fault_at, 0.0), 3),
            reformations=len(self.recoveries),
            detection_seconds=round(max(self.crashes.detections, default=0.0), 3),
            detections=[round(d, 3) for d in self.crashes.detections],
            crashes_untimed=self.crashes.untimed,
            stats=dict(stats),
            max_ack_slots=self.max_ack_slots,
            calls=self.config.calls,
            calls_replied=workload.calls_replied,
            calls_failed=dict(workload.calls_failed),
            **self._key_counts(),
        )

    def _key_counts(self) -> dict[str, int]:
        keyed = self.workload.keyed
        if keyed is None:
            return {}
        return {"keys_sent": keyed.keys_made, "keys_delivered": self.checker.exactly_once.keys_delivered,
                "keys_resent": keyed.resent, "keys_already_delivered": keyed.already_delivered,
                "keys_abandoned": len(keyed.abandoned)}

    def _check_keys_delivered(self) -> None:
        """The end of ``exactly-once``: every key made was delivered somewhere (its application resent it until
        it was), but those its application gave up when it left the group."""
        keyed = self.workload.keyed
        if keyed is None:
            return
        delivered = self.checker.exactly_once.first
        missing = [key for key in keyed.all_keys() if key not in delivered and key not in keyed.abandoned]
        if missing:
            shown = ", ".join(key.decode() for key in missing[:5])
            self.checker.fail("exactly-once", f"{len(missing)} of {keyed.keys_made} keys delivered nowhere: {shown}"
                                              f"{', ...' if len(missing) > 5 else ''}")

    def _one_view(self) -> bool:
        """Every live process that wants the group (not the caller, not one that left) is a member of the same
        view, and that view is exactly those processes."""
        live = {p.pid: p.view(GROUP) for _, p in self.cluster.live() if GROUP in p.groups()}
        views = {v.view_id if v is not None else None for v in live.values()}
        if len(views) != 1 or None in views:
            return False
        view = next(v for v in live.values() if v is not None)
        return set(view.members) == set(live)

    def _liveness(self) -> tuple[int, int]:
        """Deliveries owed and made among the members of the surviving view (the view most live processes hold).

        Member m owes delivery of every reliable message sent by a member s of that view in the membership s
        still runs, after m's membership began, but for keyed copies the group left out as delivered already.
        """
        members: dict[str, GroupStatus] = {}
        holders: Counter[str] = Counter()
        for _, proc in self.cluster.live():
            status = proc.status(GROUP)
            if status is not None and not status.departed:
                members[proc.pid] = status
                holders[str(status.view.view_id)] += 1
        if not holders:
            return 0, 0
        surviving_view = holders.most_common(1)[0][0]
        survivors = {node: s for node, s in members.items() if str(s.view.view_id) == surviving_view}
        current: dict[str, Membership] = {node: (node, s.started_at) for node, s in survivors.items()}
        left_out = self.checker.exactly_once
        owed = [m for m in self.workload.sent
                if current.get(m.src) == m.membership and left_out.owed(m.src, m.seq, m.key)]
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
