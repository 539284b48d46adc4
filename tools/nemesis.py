"""A nemesis for real daemons: namespace hosts, no supervisor, seeded faults, and what every message became.

``scripts/nemesis`` starts N network-namespace hosts (``scripts/netns``), one ``rmpd`` on each with a fixed port,
its own state directory and its own journal, joins them all to one group with ``rmp join`` (kept across restarts),
and runs a client on every host that streams messages into the group through the client library and records each
one's outcome.  Meanwhile it injects faults from a schedule drawn from ``--seed``: kill -9 of one daemon and a
restart on the same port and state directory, partitions (one host cut off, a minority/majority split, every host
alone), loss bursts, and once all daemons killed and started again at the same moment.  Nothing rejoins anything:
a restarted daemon rejoins what ``rmp join`` recorded, a cut-off one rejoins by itself, and the clients only attach
to the membership their daemon already has.

At the end it heals everything, waits for one view of all hosts (the convergence time, counted from the last heal
or restart), lets the clients drain, stops the daemons, audits every journal with ``rmp audit``, and reports.

The same module is the per-host client (``python -m tools.nemesis client ...``, run inside its namespace):
its log of what each send returned and what the group delivered is all the report's message counts come from.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TextIO

import trio
import typer
from rich.console import Console
from rich.table import Table

from rmpd.bench.daemons import RMP, DaemonProcess

ROOT = Path(__file__).resolve().parents[1]
NETNS = str(ROOT / "scripts" / "netns")
SUBNET = "10.77.0"
PORT = 7000
GROUP = "nemesis"

KILL = "kill"
PARTITION_ONE = "partition-one"
PARTITION_SPLIT = "partition-split"
PARTITION_ALL = "partition-all"
LOSS_BURST = "loss-burst"
RESTART_ALL = "restart-all"
KINDS = (KILL, PARTITION_ONE, PARTITION_SPLIT, PARTITION_ALL, LOSS_BURST, RESTART_ALL)
WEIGHTS = {KILL: 3, PARTITION_ONE: 2, PARTITION_SPLIT: 2, PARTITION_ALL: 1, LOSS_BURST: 2}
"""How often each repeated kind is drawn; the restart of every host happens exactly once per run."""

GAP = (4.0, 8.0)
"""Seconds of plain (base) loss between two faults: long enough for the group to heal under the base loss in most
gaps, which gives the per-fault recovery times."""
PAUSE = (1.0, 4.0)
"""Seconds a killed daemon stays down."""
HOLD = (3.0, 8.0)
"""Seconds a partition or a loss burst lasts."""
BURST_LOSS = 0.3
POLL = 0.25
"""Seconds between two looks at every host's view."""


# ----------------------------------------------------------------------------------------------------------------
# The schedule


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


def plan(seed: int, hosts: int, seconds: float) -> list[Fault]:
    """The faults of one run, one after another with a gap of base loss between them, drawn from ``seed`` alone.

    The last fault ends exactly at ``seconds`` (where the final heal happens), so every run measures convergence
    after a real fault, and the restart of every host falls once in the middle third."""
    rng = random.Random(seed)
    kinds = [k for k in WEIGHTS if hosts >= 3 or k != PARTITION_SPLIT]
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
    # The restart of all hosts replaces one fault in the middle third (or the middle one).
    middle = [i for i, f in enumerate(faults) if seconds / 3 <= f.at <= 2 * seconds / 3] or [len(faults) // 2]
    index = rng.choice(middle)
    old = faults[index]
    faults[index] = Fault(RESTART_ALL, old.at, min(old.hold, PAUSE[1]), tuple(range(1, hosts + 1)))
    last = faults[-1]
    faults[-1] = Fault(last.kind, seconds - last.hold, last.hold, last.hosts)
    return faults


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


# ----------------------------------------------------------------------------------------------------------------
# The client on every host


class ClientLog:
    """What one client saw, one JSON object per line, flushed as it goes: the run's report is computed from these
    files alone, so a client killed in the middle still counts what it wrote."""

    def __init__(self, path: Path) -> None:
        self.out: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def write(self, **record: Any) -> None:
        record["t"] = round(time.time(), 3)
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.out.close()


class Stream:
    """One client's state across connections: message numbers, and the messages still waiting for an outcome
    on the current connection (what the drain waits for)."""

    def __init__(self, host: int, log: ClientLog) -> None:
        self.host = host
        self.log = log
        self.count = 0
        self.conn = 0
        self.waiting: dict[str, int] = {}
        """Messages of the current connection whose send returned a seq, with no outcome yet: id -> seq."""
        self.reported: set[int] = set()
        """Seqs of the current connection an Undelivered event named (it may come before the send's seq is
        recorded here: the reader and the sender are two tasks)."""
        self.delivered_early: set[str] = set()
        """Own messages delivered before their send's seq was recorded here."""
        self.sending = False
        """A send is on its way: the drain waits for its answer too."""
        self.down = False
        """The daemon could not be reached at the last attempt (it was killed and has not started again)."""
        self.stop = trio.Event()
        self.settled = trio.Event()

    def next_id(self) -> str:
        self.count += 1
        return f"h{self.host}-{self.count}"

    def outcome(self, message: str) -> None:
        self.waiting.pop(message, None)
        self._check_settled()

    def _check_settled(self) -> None:
        if self.stop.is_set() and not self.waiting and not self.sending:
            self.settled.set()


async def client_main(host: int, socket_path: Path, group_name: str, rate: float, out: Path,
                      drain: float) -> None:
    """Stream messages into the group at ``rate`` per second until SIGTERM, across daemon restarts; then wait up
    to ``drain`` seconds for the outcome of every message still in flight."""
    import rmpd

    log = ClientLog(out)
    stream = Stream(host, log)
    log.write(e="start", host=host, rate=rate, undelivered_event=getattr(rmpd, "Undelivered", None) is not None)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                async for _ in signals:
                    if not stream.stop.is_set():
                        log.write(e="stop", waiting=len(stream.waiting))
                        stream.stop.set()
                        stream._check_settled()
                        nursery.start_soon(deadline)

            async def deadline() -> None:
                await trio.sleep(drain)
                stream.settled.set()

            nursery.start_soon(on_signal)
            while not stream.settled.is_set():
                await _one_connection(stream, socket_path, group_name, rate)
                if not stream.settled.is_set():
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    log.write(e="end", waiting=len(stream.waiting), sent=stream.count)
    log.close()


async def _one_connection(stream: Stream, socket_path: Path, group_name: str, rate: float) -> None:
    """Connect, wait until the daemon is in a view of the group (it rejoins by itself), attach, and stream until
    the connection or the group ends, or the drain is over."""
    import rmpd

    log = stream.log
    conn: int | None = None
    try:
        async with rmpd.connect(socket_path) as client:
            stream.conn += 1
            conn = stream.conn
            stream.waiting.clear()
            stream.reported = set()
            if stream.down:
                log.write(e="up", conn=conn)
                stream.down = False
            pid = str((await client.status())["pid"])
            while not await _member(client, group_name, pid):
                if stream.settled.is_set():
                    return
                await trio.sleep(0.2)
            # existing_only: the daemon is a member already, so this only attaches the connection; it never
            # founds a group or asks the daemon to join anything.
            group = await client.join(group_name, existing_only=True)
            log.write(e="attach", conn=conn, pid=pid, view=group.view, members=group.known_members)
            failures: list[BaseException] = []
            async with trio.open_nursery() as nursery:

                async def guarded(task: Any, *args: Any) -> None:
                    # The first error of either task ends both; one exception leaves, never a group of two.
                    try:
                        await task(*args)
                    except (rmpd.RmpdError, OSError) as exc:
                        failures.append(exc)
                        nursery.cancel_scope.cancel()

                nursery.start_soon(guarded, _read, stream, group, pid, conn)
                nursery.start_soon(guarded, _send, stream, group, conn, rate)
                await stream.settled.wait()
                nursery.cancel_scope.cancel()
            if failures:
                raise failures[0]
    except (rmpd.RmpdError, OSError) as exc:  # ConnectionLost is an RmpdError
        code = str(getattr(exc, "code", type(exc).__name__))
        if conn is None:
            if not stream.down:
                log.write(e="down", error=code)
                stream.down = True
            return
        log.write(e="lost", conn=conn, error=code, message=str(exc)[:200], waiting=len(stream.waiting))
        if stream.waiting:
            # The program was told (ConnectionLost): these messages' fate is unknown to it from now on.
            stream.waiting.clear()
            stream._check_settled()


async def _member(client: Any, group_name: str, pid: str) -> bool:
    status = await client.status()
    return any(g["group"] == group_name and g["view"] and not g["joining"] and pid in g["members"]
               for g in status["groups"])


async def _send(stream: Stream, group: Any, conn: int, rate: float) -> None:
    """Send one message at a time, at most ``rate`` a second; record what each send returned."""
    import rmpd

    interval = 1.0 / rate
    due = trio.current_time()
    while not stream.stop.is_set():
        message = stream.next_id()
        seq: int | None = None
        stream.sending = True
        try:
            seq = await group.send(message.encode())
        except trio.Cancelled:
            # The send never returned: the drain's deadline passed, or the connection ended, while it waited.
            stream.log.write(e="unanswered", id=message, conn=conn)
            raise
        except rmpd.ConnectionLost:
            stream.log.write(e="refused", id=message, conn=conn, error="connection-lost")
            raise
        except rmpd.RmpdError as exc:
            stream.log.write(e="refused", id=message, conn=conn, error=exc.code)
            if exc.code in ("left", "not-joined"):
                raise
        finally:
            stream.sending = False
        if seq is None:
            stream._check_settled()
            await trio.sleep(0.5)  # not a member for now (rejoining): it says so at once, every time
            due = trio.current_time()
            continue
        stream.log.write(e="sent", id=message, conn=conn, seq=seq)
        if seq not in stream.reported and message not in stream.delivered_early:
            stream.waiting[message] = seq
        stream._check_settled()
        due = max(due + interval, trio.current_time())
        await trio.sleep_until(due)


async def _read(stream: Stream, group: Any, pid: str, conn: int) -> None:
    """Every delivery (by message id), view change and Undelivered event of the group, as it comes."""
    import rmpd

    undelivered_type = getattr(rmpd, "Undelivered", None)
    rejoining_type = getattr(rmpd, "Rejoining", None)
    log = stream.log
    async for batch in group.batches():
        for event in batch:
            if isinstance(event, rmpd.Delivery):
                message = event.payload.decode(errors="replace")
                log.write(e="d", id=message, src=event.source, seq=event.seq, view=event.view, conn=conn)
                if event.source == pid:
                    if message in stream.waiting:
                        stream.outcome(message)
                    else:
                        stream.delivered_early.add(message)  # the send's answer is still on its way
            elif isinstance(event, rmpd.ViewChange):
                log.write(e="view", conn=conn, view=event.view, members=list(event.members))
            elif undelivered_type is not None and isinstance(event, undelivered_type):
                seqs = [int(s) for s in event.seqs]
                log.write(e="undelivered", conn=conn, seqs=seqs, reason=str(getattr(event, "reason", "")))
                stream.reported.update(seqs)
                for message, seq in list(stream.waiting.items()):
                    if seq in stream.reported:
                        stream.outcome(message)
            elif rejoining_type is not None and isinstance(event, rejoining_type):
                log.write(e="rejoining", conn=conn, reason=str(getattr(event, "reason", "")))
    log.write(e="group-ended", conn=conn)


# ----------------------------------------------------------------------------------------------------------------
# The hosts


@dataclass
class Options:
    """One run's settings (the command line's)."""

    hosts: int = 3
    seconds: float = 180.0
    seed: int = 1
    loss: float = 0.10
    rate: float = 10.0
    """Messages per second from each host's client."""
    workdir: Path | None = None
    config: Path | None = None
    min_partition: str | None = None
    converge_timeout: float = 120.0
    drain: float = 30.0
    audit: bool = True
    master: str = "local[2]"
    prefix: str = field(default_factory=lambda: f"rmpn{os.getpid() % 1000}x")


class Cluster:
    """The namespace hosts, their daemons and their clients: started, killed and restarted here, and all of it
    torn down by ``close`` whatever happened."""

    def __init__(self, options: Options, workdir: Path, say: Any) -> None:
        self.options = options
        self.workdir = workdir
        self.say = say
        self.n = options.hosts
        self.env = {**os.environ, "RMP_NETNS_PREFIX": options.prefix}
        self.daemons: dict[int, DaemonProcess | None] = dict.fromkeys(self.hosts)
        self.clients: dict[int, subprocess.Popen[bytes]] = {}
        self.up = False

    @property
    def hosts(self) -> range:
        return range(1, self.n + 1)

    def pid(self, host: int) -> str:
        return f"{SUBNET}.{host}:{PORT}"

    def socket(self, host: int) -> Path:
        return self.workdir / f"h{host}.sock"

    def journal(self, host: int) -> Path:
        return self.workdir / "journal" / f"h{host}"

    def client_log(self, host: int) -> Path:
        return self.workdir / f"client-h{host}.jsonl"

    def netns(self, *args: str) -> None:
        subprocess.run([NETNS, *args], check=True, env=self.env, capture_output=True, timeout=60)

    def create(self) -> None:
        self.up = True
        self.netns("up", str(self.n))

    def start(self, host: int) -> None:
        """Start (or start again) the daemon of ``host`` on its fixed port, state directory and journal."""
        self.journal(host).mkdir(parents=True, exist_ok=True)
        self.daemons[host] = DaemonProcess(self.workdir, f"h{host}", bind=f"{SUBNET}.{host}", port=PORT,
                                           journal=self.journal(host), netns=f"{self.options.prefix}{host}",
                                           config=self.options.config, socket_path=self.socket(host),
                                           ready_timeout=60.0)

    def kill(self, host: int) -> None:
        daemon = self.daemons[host]
        if daemon is not None:
            daemon.stop(signal.SIGKILL, timeout=10)
            self.daemons[host] = None

    def join(self) -> None:
        """``rmp join`` on every host at once: recorded in each state directory, so every restart rejoins."""
        extra = ["--min-partition", self.options.min_partition] if self.options.min_partition else []
        joins = [subprocess.Popen([RMP, "--socket", str(self.socket(h)), "join", GROUP, *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for h in self.hosts]
        for host, join in zip(self.hosts, joins, strict=True):
            out, _ = join.communicate(timeout=180)
            if join.returncode != 0:
                raise RuntimeError(f"rmp join on h{host} failed: {out.strip()}")

    def start_clients(self) -> None:
        for host in self.hosts:
            err = (self.workdir / f"client-h{host}.err").open("ab")
            self.clients[host] = subprocess.Popen(
                ["ip", "netns", "exec", f"{self.options.prefix}{host}", sys.executable, "-m", "tools.nemesis",
                 "client", "--host", str(host), "--socket", str(self.socket(host)), "--group", GROUP,
                 "--rate", str(self.options.rate), "--out", str(self.client_log(host)),
                 "--drain", str(self.options.drain)],
                stdout=err, stderr=subprocess.STDOUT, cwd=ROOT)
            err.close()

    def stop_clients(self) -> dict[int, int | None]:
        """SIGTERM every client; each stops sending and waits up to ``drain`` for its messages' outcomes."""
        for client in self.clients.values():
            if client.poll() is None:
                client.send_signal(signal.SIGTERM)
        codes: dict[int, int | None] = {}
        deadline = time.monotonic() + self.options.drain + 20
        for host, client in self.clients.items():
            try:
                codes[host] = client.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                client.kill()
                codes[host] = None
        return codes

    def stop_daemons(self) -> None:
        for host in self.hosts:
            daemon = self.daemons[host]
            if daemon is not None:
                daemon.stop(signal.SIGTERM, timeout=20)
                self.daemons[host] = None

    def close(self) -> None:
        """Kill whatever still runs and remove the namespaces; safe to call twice, and after any failure."""
        for client in self.clients.values():
            if client.poll() is None:
                client.kill()
                with suppress(subprocess.TimeoutExpired):
                    client.wait(5)
        for host in self.hosts:
            with suppress(Exception):
                self.kill(host)
        if self.up:
            subprocess.run([NETNS, "down"], env=self.env, check=False, capture_output=True)
            self.up = False

    # Faults

    def partition(self, fault: Fault) -> None:
        if fault.kind == PARTITION_ALL:
            for a in self.hosts:
                for b in self.hosts:
                    if a < b:
                        self.netns("partition", str(a), "--", str(b))
            return
        rest = [str(h) for h in self.hosts if h not in fault.hosts]
        self.netns("partition", *map(str, fault.hosts), "--", *rest)

    def set_loss(self, loss: float) -> None:
        self.netns("loss", str(hop_loss(loss)))

    def heal(self, loss: float) -> None:
        """Remove partitions and loss, then put back ``loss`` (0: none at all)."""
        self.netns("heal")
        if loss > 0:
            self.set_loss(loss)


# ----------------------------------------------------------------------------------------------------------------
# Watching the views


@dataclass(frozen=True)
class Look:
    """One round of asking every host for its view of the group."""

    start: float
    end: float
    views: tuple[tuple[str, tuple[str, ...]] | None, ...]
    one_view: bool


class Monitor:
    """Asks every daemon for its view of the group every POLL seconds, through its local socket, and keeps every
    round: when the hosts were one view of all of them is read from this history afterwards."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.looks: list[Look] = []
        self.everyone = tuple(sorted(cluster.pid(h) for h in cluster.hosts))

    async def run(self) -> None:
        while True:
            await self.look()
            await trio.sleep(POLL)

    async def look(self) -> Look:
        start = trio.current_time()
        views: list[tuple[str, tuple[str, ...]] | None] = [None] * self.cluster.n

        async def ask(index: int, host: int) -> None:
            views[index] = await view_of(self.cluster.socket(host), GROUP)

        async with trio.open_nursery() as nursery:
            for index, host in enumerate(self.cluster.hosts):
                nursery.start_soon(ask, index, host)
        one = (all(v is not None for v in views) and len({v[0] for v in views if v is not None}) == 1
               and all(v is not None and tuple(sorted(v[1])) == self.everyone for v in views))
        look = Look(start, trio.current_time(), tuple(views), one)
        self.looks.append(look)
        return look

    def first_one_view(self, after: float, before: float = math.inf) -> float | None:
        """When a round begun at or after ``after`` first saw one view of all hosts (its end), if before
        ``before``."""
        for look in self.looks:
            if look.start >= after and look.one_view and look.end <= before:
                return look.end
        return None

    def split(self, start: float, end: float) -> bool:
        """Whether a look begun between ``start`` and ``end`` found the hosts not in one view of all of them."""
        return any(not look.one_view for look in self.looks if start <= look.start <= end)

    async def wait_one_view(self, after: float, timeout: float) -> float | None:
        with trio.move_on_after(timeout):
            while True:
                seen = self.first_one_view(after)
                if seen is not None:
                    return seen
                await trio.sleep(POLL / 2)
        return None


async def view_of(socket_path: Path, group: str) -> tuple[str, tuple[str, ...]] | None:
    """A daemon's view of ``group`` (view ID, members), or None: not running, not a member, or no answer in 2 s."""
    import rmpd

    with trio.move_on_after(2.0):
        try:
            async with rmpd.connect(socket_path) as client:
                reply = await client.request("members", group=group)
                return str(reply["view"]), tuple(reply["members"])
        except (rmpd.RmpdError, OSError):
            return None
    return None


# ----------------------------------------------------------------------------------------------------------------
# A run


@dataclass
class FaultRecord:
    """One fault as it happened (seconds since the faults began)."""

    kind: str
    hosts: list[int]
    began: float
    healed: float
    recovered_after: float | None = None
    """Seconds from the heal (or restart) to one view of all hosts, when seen before the next fault began."""
    split: bool = False
    """Some look between the fault's start and that one view found the hosts not in one view of all of them: the
    fault broke the view (a partition or loss burst shorter than ``fail_after`` often does not)."""


async def run_faults(cluster: Cluster, monitor: Monitor, faults: list[Fault], say: Any) -> tuple[list[FaultRecord],
                                                                                                float, float]:
    """Inject ``faults``, each after its gap of base loss counted from the previous one's heal; the records, the
    moment the faults began, and the moment of the last heal (trio clock)."""
    options = cluster.options
    t0 = trio.current_time()
    records: list[FaultRecord] = []
    previous_end = 0.0
    for fault in faults:
        gap = fault.at - previous_end
        await trio.sleep(gap)
        began = trio.current_time()
        if records:
            last = records[-1]
            seen = monitor.first_one_view(t0 + last.healed, began)
            last.recovered_after = None if seen is None else round(seen - t0 - last.healed, 2)
            last.split = monitor.split(t0 + last.began, began if seen is None else seen)
        say(f"{began - t0:6.1f}s  {fault.describe(cluster.n)}")
        if fault.kind in (KILL, RESTART_ALL):
            await trio.to_thread.run_sync(lambda f=fault: [cluster.kill(h) for h in f.hosts])
        elif fault.kind == LOSS_BURST:
            await trio.to_thread.run_sync(cluster.set_loss, BURST_LOSS)
        else:
            await trio.to_thread.run_sync(cluster.partition, fault)
        await trio.sleep(fault.hold)
        if fault.kind in (KILL, RESTART_ALL):
            async with trio.open_nursery() as nursery:  # all at once for restart-all
                for host in fault.hosts:
                    nursery.start_soon(trio.to_thread.run_sync, cluster.start, host)
            what = "restarted"
        else:
            await trio.to_thread.run_sync(cluster.heal, options.loss)
            what = "healed"
        healed = trio.current_time()
        say(f"{healed - t0:6.1f}s    {what} ({', '.join(f'h{h}' for h in fault.hosts) or 'all links'})")
        records.append(FaultRecord(fault.kind, list(fault.hosts), round(began - t0, 2), round(healed - t0, 2)))
        previous_end = fault.end
    return records, t0, trio.current_time()


async def orchestrate(cluster: Cluster, options: Options, say: Any) -> dict[str, Any]:
    """Everything from the empty namespaces to the stopped daemons; what the report needs besides the logs."""
    result: dict[str, Any] = {}
    await trio.to_thread.run_sync(cluster.create)
    begun = trio.current_time()
    async with trio.open_nursery() as nursery:
        for host in cluster.hosts:
            nursery.start_soon(trio.to_thread.run_sync, cluster.start, host)
    await trio.to_thread.run_sync(cluster.join)
    monitor = Monitor(cluster)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        formed = await monitor.wait_one_view(begun, 120.0)
        if formed is None:
            raise RuntimeError("the hosts never formed one view of all of them at the start")
        result["initial_view_seconds"] = round(formed - begun, 2)
        say(f"one view of {cluster.n} hosts after {formed - begun:.1f} s; base loss {options.loss:.0%}, clients on")
        await trio.to_thread.run_sync(cluster.set_loss, options.loss)
        cluster.start_clients()
        faults = plan(options.seed, cluster.n, options.seconds)
        records, t0, last_fault = await run_faults(cluster, monitor, faults, say)
        await trio.to_thread.run_sync(cluster.heal, 0.0)
        last_heal = trio.current_time()
        say(f"{last_heal - t0:6.1f}s  faults over: everything healed, waiting for one view")
        seen = await monitor.wait_one_view(last_heal, options.converge_timeout)
        if records:
            records[-1].recovered_after = None if seen is None else round(seen - last_fault, 2)
            records[-1].split = monitor.split(t0 + records[-1].began, trio.current_time() if seen is None else seen)
        result["convergence_seconds"] = None if seen is None else round(seen - last_heal, 2)
        say(f"{trio.current_time() - t0:6.1f}s  " + (f"one view of all {cluster.n} hosts {seen - last_heal:.2f} s "
                                                    f"after the last heal" if seen is not None else
                                                    f"no one view within {options.converge_timeout:.0f} s"))
        await trio.sleep(2.0)  # the clients go on a little in the healed group
        say("stopping the clients (drain)")
        result["client_exits"] = await trio.to_thread.run_sync(cluster.stop_clients)
        end = await monitor.look()
        result["one_view_at_end"] = end.one_view
        result["views_at_end"] = [None if v is None else {"view": v[0], "members": list(v[1])} for v in end.views]
        result["fault_seconds"] = round(last_heal - t0, 1)
        nursery.cancel_scope.cancel()
    result["faults"] = records
    await trio.to_thread.run_sync(cluster.stop_daemons)
    return result


# ----------------------------------------------------------------------------------------------------------------
# What every message became


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """A client log's records; a last line cut short by a kill is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            with suppress(json.JSONDecodeError):
                yield json.loads(line)


def tally(logs: dict[int, Path]) -> dict[str, Any]:
    """Each message's outcome from every client's log.

    A message whose ``send`` returned a seq is *delivered* when its sender's client saw it delivered, else
    *reported undelivered* when an Undelivered event of its connection named its seq, else *connection lost* when
    its connection to the daemon ended before either (the daemon was killed: the program was told, by
    ConnectionLost, that it cannot know), else *lost without a report*.  A send that raised is *refused*: no seq
    was returned, and the program knows."""
    sent: dict[str, tuple[int, int, int]] = {}
    refused: Counter[str] = Counter()
    delivered: dict[int, Counter[str]] = {}
    delivered_seq: dict[tuple[int, str], int] = {}
    undelivered: set[tuple[int, int, int]] = set()
    ended: dict[tuple[int, int], str] = {}
    unanswered = 0
    events: Counter[str] = Counter()
    sent_at: dict[str, float] = {}
    latency: list[float] = []
    undelivered_event = False
    for host, path in logs.items():
        seen: Counter[str] = Counter()
        delivered[host] = seen
        for record in read_log(path):
            kind = record["e"]
            if kind == "d":
                seen[record["id"]] += 1
                if record["id"].startswith(f"h{host}-"):
                    delivered_seq.setdefault((host, record["id"]), int(record["seq"]))
                    if record["id"] in sent_at and seen[record["id"]] == 1:
                        latency.append(record["t"] - sent_at[record["id"]])
            elif kind == "sent":
                sent[record["id"]] = (host, int(record["conn"]), int(record["seq"]))
                sent_at[record["id"]] = record["t"]
            elif kind == "unanswered":
                unanswered += 1
            elif kind == "refused":
                refused[str(record["error"])] += 1
            elif kind in ("rejoining", "view", "attach", "down"):
                events[kind] += 1
            elif kind == "undelivered":
                events[kind] += 1
                undelivered.update((host, int(record["conn"]), int(s)) for s in record["seqs"])
            elif kind == "lost":
                ended[(host, int(record["conn"]))] = str(record["error"])
            elif kind == "start":
                undelivered_event = undelivered_event or bool(record.get("undelivered_event"))
    outcome: Counter[str] = Counter()
    cut_by: Counter[str] = Counter()
    elsewhere: Counter[str] = Counter()
    lost_examples: list[dict[str, Any]] = []
    mismatched = 0
    for message, (host, conn, seq) in sent.items():
        if delivered[host][message]:
            outcome["delivered"] += 1
            mismatched += delivered_seq.get((host, message), seq) != seq
            continue
        if (host, conn, seq) in undelivered:
            kind = "reported_undelivered"
        elif (host, conn) in ended:
            kind = "connection_lost"
            cut_by[ended[(host, conn)]] += 1
        else:
            kind = "lost_unreported"
            if len(lost_examples) < 20:
                lost_examples.append({"id": message, "host": host, "conn": conn, "seq": seq})
        outcome[kind] += 1
        if any(delivered[h][message] for h in delivered if h != host):
            elsewhere[kind] += 1
    duplicates = sum(count - 1 for seen in delivered.values() for count in seen.values() if count > 1)
    return {
        "attempted": len(sent) + sum(refused.values()) + unanswered,
        "refused": sum(refused.values()),
        "refused_by_error": dict(refused),
        "sent": len(sent),
        "delivered": outcome["delivered"],
        "reported_undelivered": outcome["reported_undelivered"],
        "connection_lost": outcome["connection_lost"],
        "connection_lost_by_error": dict(cut_by),
        "unanswered": unanswered,
        "reported_failed": outcome["reported_undelivered"] + outcome["connection_lost"],
        "lost_unreported": outcome["lost_unreported"],
        "delivered_elsewhere": dict(elsewhere),
        "duplicates": duplicates,
        "seq_mismatches": mismatched,
        "delivery_seconds_p50": _rounded(percentile(latency, 50)),
        "delivery_seconds_p99": _rounded(percentile(latency, 99)),
        "lost_examples": lost_examples,
        "undelivered_event": undelivered_event,
        "client_events": dict(events),
    }


def audit(journals: list[Path], workdir: Path, master: str) -> dict[str, Any]:
    """``rmp audit`` over every host's journal: its exit status and, per invariant, the violations."""
    report = workdir / "audit.json"
    with (workdir / "audit.log").open("w") as out:
        done = subprocess.run([RMP, "audit", *map(str, journals), "--master", master, "--json", str(report)],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    verdict: dict[str, Any] = {"exit": done.returncode, "ok": done.returncode == 0}
    if report.exists():
        data = json.loads(report.read_text())
        verdict["records"] = data.get("records")
        verdict["violations"] = {i["name"]: i["violations"] for i in data.get("invariants", []) if i["violations"]}
    return verdict


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run(options: Options, console: Console) -> dict[str, Any]:
    """One whole run; the report (also written to the working directory as report.json)."""
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="rmp-nemesis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def say(message: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}", highlight=False)

    say(f"nemesis: {options.hosts} hosts, {options.seconds:.0f} s, seed {options.seed}, loss {options.loss:.0%} "
        f"between faults; files in {workdir}")
    cluster = Cluster(options, workdir, say)
    load_before = os.getloadavg()
    try:
        result = trio.run(orchestrate_until_told, cluster, options, say)
    finally:
        cluster.close()
    load_after = os.getloadavg()
    messages = tally({h: cluster.client_log(h) for h in cluster.hosts})
    verdict: dict[str, Any] = {"exit": None, "ok": None}
    if options.audit:
        say("auditing the journals")
        verdict = audit([cluster.journal(h) for h in cluster.hosts], workdir, options.master)
    records: list[FaultRecord] = result.pop("faults")
    recoveries = [r.recovered_after for r in records[:-1] if r.recovered_after is not None]
    split = [r.recovered_after for r in records[:-1] if r.recovered_after is not None and r.split]
    convergence = result["convergence_seconds"]
    one_view = convergence is not None and result["one_view_at_end"]
    report = {
        "seed": options.seed, "hosts": options.hosts, "seconds": options.seconds, "loss": options.loss,
        "rate": options.rate, "faults": dict(Counter(r.kind for r in records)),
        "one_view": one_view, **result,
        "recovery_between_faults": {"faults": len(records) - 1, "recovered": len(recoveries),
                                    "p50": percentile(recoveries, 50), "max": max(recoveries, default=None),
                                    "split": len([r for r in records[:-1] if r.split]), "split_recovered": len(split),
                                    "split_p50": percentile(split, 50), "split_max": max(split, default=None)},
        "last_fault": {"kind": records[-1].kind, "split": records[-1].split} if records else None,
        "messages": messages, "audit": verdict,
        "fault_log": [asdict(r) for r in records],
        "elapsed_seconds": round(time.monotonic() - started, 1), "workdir": str(workdir),
        "netns_prefix": options.prefix,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after],
                         "cores": os.cpu_count()},
    }
    report["ok"] = bool(one_view and messages["lost_unreported"] == 0 and verdict["ok"] is not False)
    (workdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


class Interrupted(Exception):
    """The run was told to stop (SIGTERM or SIGINT) before it was over."""


async def orchestrate_until_told(cluster: Cluster, options: Options, say: Any) -> dict[str, Any]:
    """``orchestrate``, ended by SIGTERM or SIGINT as by an error: the caller's cleanup then removes the daemons,
    the clients and the namespaces.  (Raised from a trio task, not from a signal handler that would interrupt trio
    itself wherever it is.)"""
    result: dict[str, Any] = {}
    try:
        async with trio.open_nursery() as nursery:

            async def told() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        raise Interrupted(signal.Signals(signum).name)

            nursery.start_soon(told)
            result = await orchestrate(cluster, options, say)
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None
    return result


def single_error(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside nested groups of one, else the group itself."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def summary(report: dict[str, Any]) -> Table:
    """The run at a glance."""
    messages, verdict = report["messages"], report["audit"]
    table = Table(title=f"nemesis: seed {report['seed']}, {report['hosts']} hosts, {report['seconds']:.0f} s, "
                        f"{report['loss']:.0%} loss between faults", show_header=False)
    table.add_column("what")
    table.add_column("value")
    convergence = report["convergence_seconds"]
    between = report["recovery_between_faults"]
    audit_text = ("not run" if verdict["ok"] is None else "clean" if verdict["ok"] else
                  f"VIOLATED {verdict.get('violations') or ''} (exit {verdict['exit']})")
    rows = [
        ("faults", ", ".join(f"{k} x{v}" for k, v in sorted(report["faults"].items()))),
        ("one view of all hosts", "yes" if report["one_view"] else "NO"),
        ("convergence after the last heal", ("never" if convergence is None else f"{convergence:.2f} s")
         + (f" (last fault {report['last_fault']['kind']}, "
            f"{'broke the view' if report['last_fault']['split'] else 'view never broken'})"
            if report["last_fault"] else "")),
        ("recovered between faults", f"{between['recovered']} of {between['faults']}"
                                     + (f", p50 {between['p50']:.2f} s, max {between['max']:.2f} s"
                                        if between["recovered"] else "")),
        ("  of those that broke the view", f"{between['split_recovered']} of {between['split']}"
                                           + (f", p50 {between['split_p50']:.2f} s, max {between['split_max']:.2f} s"
                                              if between["split_recovered"] else "")),
        ("messages sent (seq returned)", str(messages["sent"])),
        ("  delivered to the sender", str(messages["delivered"])),
        ("  reported: Undelivered", str(messages["reported_undelivered"])),
        ("  reported: connection lost", str(messages["connection_lost"])),
        ("  lost without a report", str(messages["lost_unreported"])),
        ("sends refused (raised) / unanswered", f"{messages['refused']} / {messages['unanswered']}"),
        ("delivery to the sender p50 / p99", f"{messages['delivery_seconds_p50']} s / "
                                             f"{messages['delivery_seconds_p99']} s"),
        ("duplicates / seq mismatches", f"{messages['duplicates']} / {messages['seq_mismatches']}"),
        ("audit", audit_text),
        ("load average (1 min) before / after", f"{report['load_average']['before'][0]} / "
                                                f"{report['load_average']['after'][0]} on "
                                                f"{report['load_average']['cores']} cores"),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
        ("files", report["workdir"]),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table


# ----------------------------------------------------------------------------------------------------------------
# Command lines


app = typer.Typer(add_completion=False, help="Faults on namespace hosts running rmpd, and what became of every "
                                            "message (needs root).")


@app.command()
def main(
    hosts: Annotated[int, typer.Option(min=2, max=20, help="Namespace hosts, one rmpd each.")] = 3,
    seconds: Annotated[float, typer.Option(min=5, help="Seconds of faults.")] = 180.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 1,
    loss: Annotated[float, typer.Option(min=0, max=0.9, help="Loss end to end between faults.")] = 0.10,
    rate: Annotated[float, typer.Option(min=0.1, help="Messages a second from each host's client.")] = 10.0,
    workdir: Annotated[Path | None, typer.Option("--dir", help="Working directory (default: a new temporary "
                                                               "one, kept).")] = None,
    config: Annotated[Path | None, typer.Option(help="rmpd TOML config for every daemon.")] = None,
    min_partition: Annotated[str | None, typer.Option(help="rmp join --min-partition.")] = None,
    converge_timeout: Annotated[float, typer.Option(help="Seconds to wait for one view at the end.")] = 120.0,
    drain: Annotated[float, typer.Option(help="Seconds the clients wait for outcomes after they stop.")] = 30.0,
    no_audit: Annotated[bool, typer.Option("--no-audit", help="Skip rmp audit.")] = False,
    master: Annotated[str, typer.Option(help="Spark master for rmp audit.")] = "local[2]",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout (the table goes to "
                                                         "stderr).")] = False,
) -> None:
    """Run the nemesis once; exit 0 when the hosts end in one view, nothing was lost without a report and the
    audit is clean."""
    if os.geteuid() != 0:
        Console(stderr=True).print("nemesis: network namespaces need root")
        raise typer.Exit(2)
    options = Options(hosts=hosts, seconds=seconds, seed=seed, loss=loss, rate=rate, workdir=workdir,
                      config=config, min_partition=min_partition, converge_timeout=converge_timeout, drain=drain,
                      audit=not no_audit, master=master)
    errors = Console(stderr=True)
    try:
        report = run(options, errors)
    except Interrupted as exc:
        errors.print(f"nemesis: stopped by {exc}; daemons, clients and namespaces removed")
        raise typer.Exit(130) from None
    if as_json:
        errors.print(summary(report))
        print(json.dumps(report))
    else:
        Console().print(summary(report))
    raise typer.Exit(0 if report["ok"] else 1)


client_app = typer.Typer(add_completion=False)


@client_app.command()
def client(
    host: Annotated[int, typer.Option()],
    socket: Annotated[Path, typer.Option()],
    out: Annotated[Path, typer.Option()],
    group: Annotated[str, typer.Option()] = GROUP,
    rate: Annotated[float, typer.Option()] = 10.0,
    drain: Annotated[float, typer.Option()] = 30.0,
) -> None:
    """One host's client (run inside its namespace by the nemesis)."""
    trio.run(client_main, host, socket, group, rate, out, drain)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_app(sys.argv[2:], prog_name="nemesis client")
    else:
        app()
