"""Real rmpd processes for tests: started with --port 0, ready when they send READY=1 to our NOTIFY_SOCKET.

Nothing here mocks a socket or a process: each daemon is the installed ``rmpd`` command; tests talk to it with the
``rmp`` command or the client library, and wait for conditions with deadlines instead of sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
RMPD = str(BIN / "rmpd")
RMP = str(BIN / "rmp")


class Daemon:
    """One rmpd process; ``pid`` is its RMP process ID (ip:port), ``socket`` its client socket."""

    def __init__(self, workdir: Path, name: str, *, bind: str = "127.0.0.1", journal: Path | None = None,
                 extra: list[str] | None = None, netns: str | None = None, config: Path | None = None,
                 socket_path: Path | None = None) -> None:
        self.name = name
        self.socket = socket_path or workdir / f"{name}.sock"
        self.notify_path = workdir / f"{name}.notify"
        self.log_path = workdir / f"{name}.log"
        self.notify_path.unlink(missing_ok=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        args = [RMPD, "--bind", bind, "--port", "0", "--socket", str(self.socket), "--log-level", "info"]
        if journal is not None:
            args += ["--journal", str(journal)]
        if config is not None:
            args += ["--config", str(config)]
        args += extra or []
        if netns is not None:
            args = ["ip", "netns", "exec", netns, *args]
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path)}
        self.log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.ready_message = self._wait_ready(15.0)
        self.pid = self.status()["pid"]

    def _wait_ready(self, timeout: float) -> str:
        self.notify.settimeout(timeout)
        try:
            while True:
                message = self.notify.recv(4096).decode()
                if "READY=1" in message:
                    return message
        except TimeoutError:
            raise AssertionError(f"{self.name} never sent READY=1; log:\n{self.log_path.read_text()}") from None

    def rmp(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([RMP, "--socket", str(self.socket), *args], input=input, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"rmp {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def rmp_json(self, *args: str) -> Any:
        return json.loads(self.rmp(*args, "--json").stdout)

    def status(self) -> dict[str, Any]:
        return self.rmp_json("status")

    def counters(self) -> dict[str, int]:
        return self.status()["counters"]

    def members(self, group: str) -> list[str]:
        result = self.rmp("members", group, "--json", check=False)
        return json.loads(result.stdout)["members"] if result.returncode == 0 else []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        self.notify.close()
        return code


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def ensure_loopback_multicast() -> None:
    """Make multicast loop back on 127.0.0.1, adding the route as root if the host needs it; else skip."""
    import pytest

    from rmpd.daemon.probe import multicast_loops

    if multicast_loops("127.0.0.1"):
        return
    if os.geteuid() == 0:
        subprocess.run(["ip", "route", "add", "224.0.0.0/4", "dev", "lo"], check=False, capture_output=True)
        if multicast_loops("127.0.0.1"):
            return
    pytest.skip("multicast does not loop back on 127.0.0.1 (as root: ip route add 224.0.0.0/4 dev lo)")
