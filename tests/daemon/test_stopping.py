"""Stopping and reloading a daemon: SIGTERM tells its clients ``shutting-down``; SIGHUP reloads what it can and
says what it could not, and leaves the daemon and its groups running."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from .harness import RMP, Daemon, unique, wait_for


def clients_of(daemon: Daemon, group: str) -> int:
    return next((g["clients"] for g in daemon.status()["groups"] if g["group"] == group), 0)


def test_sigterm_tells_a_listening_client_shutting_down_in_one_line(daemons, tmp_path: Path) -> None:
    d = daemons("stopping")
    group = unique("chat")
    out, err = tmp_path / "listen.out", tmp_path / "listen.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        listen = subprocess.Popen([RMP, "--socket", str(d.socket), "listen", group], stdout=stdout, stderr=stderr)
    try:
        wait_for(lambda: clients_of(d, group) == 1 and d.members(group) == [d.pid], 20, "rmp listen in a view")
        d.rmp("send", group, "before the stop")
        wait_for(lambda: "before the stop" in out.read_text(), 10, "rmp listen to print the message")
        assert d.stop(signal.SIGTERM) == 0
        assert listen.wait(10) == 1
    finally:
        if listen.poll() is None:
            listen.kill()
    lines = err.read_text().splitlines()
    assert lines[-1] == "error: shutting-down: the daemon is shutting down (SIGTERM)", lines
    assert [line for line in lines if "error" in line] == lines[-1:], lines
