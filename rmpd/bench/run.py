"""Run benchmark cases: real rmpd daemons, worker processes (rmpd.bench.worker), and the raw-multicast baseline.

Every case is measured beside its baseline in the same run: the baseline is raw UDP multicast, one sender and one
receiving process per member, through the same socket layer the daemon uses, with the same message size.  Rates
are messages received per second per member, counted inside a common window after a warm-up; CPU seconds per
delivered message add up every process of the case (daemons and clients), read from /proc, which is steadier than
wall-clock rates on a shared machine.  After the window every member reads on until its group is quiet, and a case
is ``complete`` when each received every message sent: goodput counts nothing that was then lost.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from rmpd.keyfile import generate_key_file

from .daemons import DaemonProcess, process_cpu_seconds
from .worker import JOIN_INTERVAL, JOIN_RETRIES

WARMUP = 1.0
"""Seconds of traffic before the counting window opens (slow start, joins settling)."""
READY_TIMEOUT = 30.0
BASELINE_ADDRESS = "239.255.91.1"
BASELINE_PORT = 45001
LATENCY_SECONDS = 2.0
STOP_GRACE = 2.0
"""Seconds the daemons have to exit on SIGTERM at the end of a run before they are killed."""


class BenchError(RuntimeError):
    """A worker or daemon failed; the message says which and shows its output."""


@dataclass(frozen=True)
class Case:
    members: int
    senders: int
    size: int
    qos: str
    embedded: bool = False

    def label(self) -> str:
        where = "embedded" if self.embedded else "daemons"
        return f"{self.members} members, {self.senders} sender(s), {self.size} B, {self.qos}, {where}"


class Hosts:
    """Where member ``i`` (0-based) runs: all on one address (loopback by default), or each in a network
    namespace of its own (``scripts/netns``: 10.77.0.<i+1> on one bridge, optional random loss by iptables and
    a rate on every link, both ways, by tbf)."""

    NETNS = Path(__file__).resolve().parents[2] / "scripts" / "netns"
    PREFIX = os.environ.get("RMP_BENCH_NETNS_PREFIX", f"rmpb{os.getpid() % 10000}x")
    """The namespaces' names (scripts/netns's RMP_NETNS_PREFIX), this process's own: ``scripts/netns up`` first
    removes every host of its prefix, so two runs at once on one machine must not share one."""

    def __init__(self, *, bind: str = "127.0.0.1", netns: int = 0, loss: float = 0.0,
                 rate: str | None = None) -> None:
        self.bind = bind
        self.netns = netns
        self.loss = loss
        self.rate = rate if netns else None
        if netns:
            self._netns("up", str(netns))
            if self.rate is not None:
                self._netns("rate", self.rate)
            if loss > 0:
                per_side = 1 - (1 - loss) ** 0.5  # iptables drops on the way out and on the way in
                self._netns("loss", f"{per_side:.6f}")

    def _netns(self, *args: str) -> None:
        env = {**os.environ, "RMP_NETNS_PREFIX": self.PREFIX}
        result = subprocess.run([str(self.NETNS), *args], capture_output=True, text=True, env=env)
        if result.returncode != 0 and args[0] != "down":
            raise BenchError(f"scripts/netns {' '.join(args)} failed: {result.stderr.strip()}")

    def address(self, i: int) -> str:
        return f"10.77.0.{i + 1}" if self.netns else self.bind

    def namespace(self, i: int) -> str | None:
        return f"{self.PREFIX}{i + 1}" if self.netns else None

    def prefix(self, i: int) -> list[str]:
        ns = self.namespace(i)
        return ["ip", "netns", "exec", ns] if ns else []

    def link_counters(self, i: int) -> dict[str, dict[str, int]] | None:
        """What the links of host ``i`` carried so far, as tbf counts it: ``up`` (the host's eth0, what it sends)
        and ``down`` (its bridge port, what it receives), each ``bytes`` and ``packets`` sent on and ``drops``
        (the queue was full).  None without a rate."""
        if self.rate is None:
            return None
        ns = self.namespace(i)
        links = {"up": ["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev", "eth0"],
                 "down": ["ip", "netns", "exec", f"{self.PREFIX}br", "tc", "-s", "-j", "qdisc", "show", "dev",
                          f"v{ns}"]}
        counters = {}
        for way, command in links.items():
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise BenchError(f"{' '.join(command)} failed: {result.stderr.strip()}")
            [root] = [q for q in json.loads(result.stdout) if q.get("root")]
            counters[way] = {name: int(root[name]) for name in ("bytes", "packets", "drops")}
        return counters

    def close(self) -> None:
        if self.netns:
            self._netns("down")


class Worker:
    """A ``python -m rmpd.bench.worker`` process: ready line, window line on stdin, result line."""

    def __init__(self, workdir: Path, name: str, role: str, *args: str, prefix: list[str] | None = None) -> None:
        self.name = name
        self.err_path = workdir / f"{name}.err"
        self._err = open(self.err_path, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "rmpd.bench.worker", role, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()

    def _read_lines(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _line(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise BenchError(f"worker {self.name} gave no answer in {timeout:.0f} s:\n{self._errors()}") from None
        if not line:
            self.proc.wait()
            raise BenchError(f"worker {self.name} exited ({self.proc.returncode}):\n{self._errors()}")
        return json.loads(line)

    def ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait for the ready line (skipping the joined line, if not read yet)."""
        while "ready" not in self._line(timeout):
            pass

    def joined(self, timeout: float = READY_TIMEOUT) -> None:
        self._line(timeout)

    def start(self, begin: float, end: float) -> None:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(f"{begin} {end}\n")
        stdin.flush()

    def close_input(self) -> None:
        """Close the worker's stdin: a transfer's sender, done, stays in its group until then."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def result(self, timeout: float) -> dict[str, Any]:
        result = self._line(timeout)
        self.proc.wait(timeout=10)
        self._err.close()
        return result

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()

    def _errors(self) -> str:
        return self.err_path.read_text()[-4000:]


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Bench:
    """Daemons started afresh for each case, in a group of its own; baselines cached per (size, members)."""

    def __init__(self, workdir: Path, *, seconds: float, guard: str = "none", hosts: Hosts | None = None,
                 progress: Callable[[str], None] = lambda text: None, daemon_config: Path | None = None,
                 daemon_args: list[str] | None = None) -> None:
        """``daemon_config``: the daemons' config file (the bench's join timers override its own);
        ``daemon_args``: further rmpd flags."""
        self.workdir = workdir
        self.daemon_config = daemon_config
        self.daemon_args = daemon_args or []
        self.seconds = seconds
        self.guard = guard
        self.hosts = hosts or Hosts()
        self.progress = progress
        self.daemons: list[DaemonProcess] = []
        self._baselines: dict[tuple[int, int], dict[str, Any]] = {}
        self._groups = itertools.count(1)
        self.run_id = os.getpid()
        """Part of every group name this run's cases use: a group is known by its name alone, and two benches at once
        on one network (or one host) must not join each other's groups."""
        self._workers = itertools.count(1)
        self._daemon_sets = itertools.count(1)
        self.key_path: Path | None = None
        if guard != "none":
            self.key_path = workdir / "group.key"
            generate_key_file(self.key_path)

    def close(self) -> None:
        """Stop the daemons and take the hosts down."""
        self.stop_daemons()
        self.hosts.close()

    def stop_daemons(self) -> None:
        """Stop the daemons, all at once, and kill those still leaving their groups after ``STOP_GRACE``: the
        figures are taken, and daemons that all leave together have nobody left to commit their leaves."""
        for daemon in self.daemons:
            if daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for daemon in self.daemons:
            daemon.stop(timeout=max(0.1, deadline - time.monotonic()))
        self.daemons.clear()

    def _daemon_args(self) -> list[str]:
        """A benchmark's group is new: its first member looks for an existing one only briefly."""
        return ["--timers", f"request_interval={JOIN_INTERVAL}", "--timers", f"join_retries={JOIN_RETRIES}",
                *self._guard_args(), *self.daemon_args]

    def _guard_args(self) -> list[str]:
        if self.key_path is None:
            return []
        return ["--auth-key", str(self.key_path)] + (["--encrypt"] if self.guard == "encrypt" else [])

    def fresh_daemons(self, count: int) -> list[DaemonProcess]:
        """``count`` daemons started for one case, after those of the case before are stopped.  A case shares no
        daemon with an earlier one: the groups of a case whose members all leave at once are still leaving (a
        member lingers until what it held is stable everywhere, or the engine's ``leave_linger``), and their
        memory and timers would be charged to the case that follows."""
        self.stop_daemons()
        started = next(self._daemon_sets)
        for i in range(count):
            self.progress(f"starting daemon {i + 1}")
            self.daemons.append(DaemonProcess(self.workdir, f"s{started}d{i + 1}", bind=self.hosts.address(i),
                                              netns=self.hosts.namespace(i), extra=self._daemon_args(),
                                              log_level="warning", config=self.daemon_config))
        return list(self.daemons)

    def _member_args(self, i: int, embedded: bool) -> list[str]:
        """How member ``i`` takes part: through daemon ``i``'s socket, or as an embedded node."""
        if embedded:
            return ["--embedded", *self._guard_args()]
        return ["--socket", str(self.daemons[i].socket)]

    def worker(self, role: str, host: int, args: list[str]) -> Worker:
        """A worker process on host ``host`` (0-based)."""
        return Worker(self.workdir, f"w{next(self._workers)}-{role}", role, *args, "--bind",
                      self.hosts.address(host), prefix=self.hosts.prefix(host))

    def group_workers(self, specs: list[tuple[str, int, list[str]]]) -> list[Worker]:
        """Start the group's workers: the first founds the group, the rest join it once it exists (members
        that all start a new group at once would each found one of their own)."""
        first = self.worker(*specs[0])
        try:
            first.joined()
        except BaseException:
            first.kill()
            raise
        return [first, *(self.worker(*spec) for spec in specs[1:])]

    def _measure(self, workers: list[Worker], processes: list[Callable[[], float]],
                 seconds: float) -> tuple[float, float, list[dict[str, Any]]]:
        """Wait until every worker is ready, open the common window, collect the results; returns (window
        seconds, CPU seconds of ``processes`` inside it, results in worker order)."""
        try:
            for w in workers:
                w.ready()
            begin = time.time() + WARMUP
            end = begin + seconds
            for w in workers:
                w.start(begin, end)
            time.sleep(max(0.0, begin - time.time()))
            cpu_before = sum(f() for f in processes)
            time.sleep(max(0.0, end - time.time()))
            cpu_after = sum(f() for f in processes)
            results = [w.result(timeout=seconds + 30) for w in workers]
        finally:
            for w in workers:
                w.kill()
        return end - begin, cpu_after - cpu_before, results

    # ------------------------------------------------------------------------------------------------------------

    def baseline(self, size: int, members: int) -> dict[str, Any]:
        """Raw multicast: one sending process, one receiving process per member."""
        key = (size, members)
        if key in self._baselines:
            return self._baselines[key]
        self.progress(f"baseline: raw UDP multicast, {size} B, {members} receivers")
        common = ["--address", BASELINE_ADDRESS, "--port", str(BASELINE_PORT)]
        workers = [self.worker("raw-recv", i, common) for i in range(members)]
        workers.append(self.worker("raw-send", 0, [*common, "--size", str(size)]))
        window, cpu, results = self._measure(workers, [w.cpu_seconds for w in workers], self.seconds)
        delivered = [r["delivered"] for r in results[:-1]]
        total = sum(delivered)
        baseline = {
            "baseline_msgs_per_s": statistics.fmean(delivered) / window,
            "baseline_sent_per_s": results[-1]["sent"] / window,
            "baseline_cpu_s_per_msg": cpu / total if total else None,
        }
        self._baselines[key] = baseline
        return baseline

    def run(self, case: Case) -> dict[str, Any]:
        baseline = self.baseline(case.size, case.members)
        group = f"bench-{self.run_id}-{next(self._groups)}"
        common = ["--group", group, "--members", str(case.members), "--qos", case.qos, "--size", str(case.size)]
        daemons: list[DaemonProcess] = [] if case.embedded else self.fresh_daemons(case.members)
        # One application process per member (an embedded node, or a client of that member's daemon) counts what
        # it receives; the first ones also send, as in Spread's and JGroups' throughput tests.  Senders beyond
        # the members are clients of their own, spread over the daemons.
        specs = [("member", i, [*common, *self._member_args(i, case.embedded), "--count",
                                *(["--send"] if i < case.senders else [])]) for i in range(case.members)]
        if not case.embedded:
            specs += [("member", i % case.members, [*common, *self._member_args(i % case.members, False), "--send"])
                      for i in range(case.members, case.senders)]
        self.progress(f"{case.label()}: joining")
        workers = self.group_workers(specs)
        self.progress(f"{case.label()}: measuring {self.seconds:g} s, then until every member is quiet")
        window, cpu, results = self._measure(
            workers, [w.cpu_seconds for w in workers] + [d.cpu_seconds for d in daemons], self.seconds)
        delivered = [r["delivered"] for r in results[:case.members]]
        total = sum(delivered)
        msgs_per_s = statistics.fmean(delivered) / window
        sent = sum(r["sent"] for r in results)
        received = [r["received"] for r in results[:case.members]]
        self.progress(f"{case.label()}: latency")
        one_way_ms = [rtt / 2 * 1000 for rtt in self._latency(case, group)]
        return {
            **asdict(case), "guard": self.guard, "netns": bool(self.hosts.netns),
            "loss": self.hosts.loss, "seconds": round(window, 3),
            "msgs_per_s": msgs_per_s,
            **baseline,
            "ratio": msgs_per_s / baseline["baseline_msgs_per_s"] if baseline["baseline_msgs_per_s"] else None,
            "sent": sent,
            "delivered": delivered,
            "received": received,
            "complete": all(n == sent for n in received),
            "cpu_s_per_msg": cpu / total if total else None,
            "p50_ms": percentile(one_way_ms, 0.5),
            "p99_ms": percentile(one_way_ms, 0.99),
            "latency_samples": len(one_way_ms),
            "peak_rss_kib": [d.peak_rss_kib() for d in daemons],
        }

    def _latency(self, case: Case, group: str) -> list[float]:
        """Ping-pong between two members at light load: one message in flight; returns round trips (s)."""
        if case.members == 1:
            return []
        common = ["--group", f"{group}-ping", "--qos", case.qos, "--size", str(min(case.size, 1000))]
        workers = self.group_workers([
            ("pong", 1, [*common, *self._member_args(1, case.embedded)]),
            *(("member", i, [*common, *self._member_args(i, case.embedded)])  # the rest of the group, idle
              for i in range(2, case.members)),
            ("ping", 0, [*common, *self._member_args(0, case.embedded), "--members", str(case.members)]),
        ])
        _, _, results = self._measure(workers, [], min(LATENCY_SECONDS, self.seconds))
        return list(results[-1]["rtts"])
