"""Real rmpd processes started from Python: ``--port 0``, ready once they send READY=1 to our NOTIFY_SOCKET.

Shared by ``rmp bench`` and the test suite, so both run the installed ``rmpd`` command exactly as an operator would.
What a benchmark reports about a daemon (CPU seconds, peak resident memory) is read from /proc, outside it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack

from rmpd.localapi import HEADER, encode_frame

BIN = Path(sys.executable).parent
RMPD = str(BIN / "rmpd")
RMP = str(BIN / "rmp")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def recv_frame(conn: socket.socket, buffer: bytes) -> tuple[dict[str, Any], bytes]:
    """The next whole local-API frame from a blocking socket, after what ``buffer`` already holds; returns it and
    what is left over.  ConnectionError if the daemon closes the connection first."""
    while len(buffer) < HEADER.size or len(buffer) < HEADER.size + HEADER.unpack_from(buffer)[0]:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        buffer += chunk
    end = HEADER.size + HEADER.unpack_from(buffer)[0]
    return msgpack.unpackb(buffer[HEADER.size:end], raw=False), buffer[end:]


class DaemonProcess:
    """One rmpd process; ``pid`` is its RMP process ID (ip:port), ``socket`` its client socket."""

    def __init__(self, workdir: Path, name: str, *, bind: str = "127.0.0.1", journal: Path | None = None,
                 extra: list[str] | None = None, netns: str | None = None, config: Path | None = None,
                 socket_path: Path | None = None, log_level: str | None = "info", ready_timeout: float = 15.0,
                 port: int = 0) -> None:
        """``port``: 0 for any free one; a restart on the same port keeps the process ID.  SCMP's ``latest`` and
        the recorded memberships go to ``workdir/NAME.state`` (one per name, so a restarted daemon finds its own), and
        a restarted daemon's log follows its earlier runs' in ``workdir/NAME.log``."""
        self.name = name
        self.socket = socket_path or workdir / f"{name}.sock"
        self.notify_path = workdir / f"{name}.notify"
        self.log_path = workdir / f"{name}.log"
        self.notify_path.unlink(missing_ok=True)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.state_dir = workdir / f"{name}.state"
        args = [RMPD, "--bind", bind, "--port", str(port), "--socket", str(self.socket), "--state-dir",
                str(self.state_dir)]
        if log_level is not None:  # None: the config's, which a reload may change
            args += ["--log-level", log_level]
        if journal is not None:
            args += ["--journal", str(journal)]
        if config is not None:
            args += ["--config", str(config)]
        args += extra or []
        if netns is not None:
            args = ["ip", "netns", "exec", netns, *args]  # ip execs rmpd: the child keeps this process ID
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify_path)}
        self.log = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the process; a restart appends
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.ready_message = self._wait_ready(ready_timeout)
        self.pid = self.status()["pid"]

    def _wait_ready(self, timeout: float) -> str:
        self.notify.settimeout(timeout)
        try:
            while True:
                message = self.notify.recv(4096).decode()
                if "READY=1" in message:
                    return message
        except TimeoutError:
            self.proc.kill()
            raise RuntimeError(f"{self.name} never sent READY=1; log:\n{self.log_path.read_text()}") from None

    def rmp(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the ``rmp`` command against this daemon."""
        result = subprocess.run([RMP, "--socket", str(self.socket), *args], input=input, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"rmp {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def rmp_json(self, *args: str) -> Any:
        return json.loads(self.rmp(*args, "--json").stdout)

    def request(self, op: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """One request over the daemon's client socket, as ``rmp`` sends it, without starting a process (tests poll
        status and members many times).  The reply's fields, or ``{"error": code, "message": ...}``."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(self.socket))
            conn.sendall(encode_frame({"op": op, "id": 1, **fields}))
            buffer = b""
            while True:
                frame, buffer = recv_frame(conn, buffer)
                if frame.get("id") == 1 and "event" not in frame:
                    frame.pop("id")
                    frame.pop("ok", None)  # as the client library returns it
                    return frame

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def counters(self) -> dict[str, int]:
        return self.status()["counters"]

    def members(self, group: str) -> list[str]:
        """The daemon's current view's members, or none when it has no view of ``group``."""
        reply = self.request("members", group=group)
        return [] if "error" in reply else reply["members"]

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def peak_rss_kib(self) -> int:
        return process_peak_rss_kib(self.proc.pid)

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


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a running process (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_peak_rss_kib(pid: int) -> int:
    """Peak resident memory (VmHWM) of a running process, in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
