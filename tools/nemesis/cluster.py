"""The namespace hosts of a run: one rmpd on each at a fixed address, port, state directory and journal, and the
clients; the faults are done to them here (kill, restart, partition, loss, heal) through ``scripts/netns``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmpd.bench.daemons import RMP, DaemonProcess

from .plan import PARTITION_ALL, Fault, hop_loss

ROOT = Path(__file__).resolve().parents[2]
NETNS = str(ROOT / "scripts" / "netns")
SUBNET = "10.77.0"
PORT = 7000
GROUP = "nemesis"


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
    exactly_once: bool = False
    """Keyed clients that send every message until confirmed (``keyed``), and no fault that stops the group."""
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
                 "--drain", str(self.options.drain), *(["--exactly-once"] if self.options.exactly_once else [])],
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
