"""The README's multi-RPC lines, as written: `rmp serve calc --handler 0 -- bc &` and then at once
`echo '6*7' | rmp call calc`, on a fresh daemon with the default settings, ten times: 42 each time.

The call reaches the daemon before `rmp serve` has formed the group; a group that has just formed refuses calls
stamped before its floor, so the call asks first and is stamped afresh (docs/protocol.md, "Non-members and SCMP").
The group name is made unique per run (daemons on loopback hear every run's groups of one name)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from .harness import unique
from .test_readme import BIN, README


def readme_call_lines() -> tuple[str, str]:
    """The `rmp serve` and `rmp call` lines of the README's block on calling a group without joining it."""
    block = re.search(r"Calling a group without joining it.*?```sh\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    [serve] = [line for line in lines if " serve " in line]
    [call] = [line for line in lines if " call " in line]
    return serve, call


RUNS, AT_ONCE = 10, 10
"""Ten runs, all at once (each on its own daemon and group): the runs share nothing but the host."""


def test_the_readme_serve_and_call_lines_back_to_back_print_42_ten_times(daemons) -> None:
    serve_line, call_line = readme_call_lines()
    assert serve_line.endswith("&") and "calc" in serve_line and "calc" in call_line
    for wave in range(RUNS // AT_ONCE):
        fresh = [daemons(f"w{wave}d{i}", config=None) for i in range(AT_ONCE)]  # the defaults, as a new user's
        servers: list[subprocess.Popen[bytes]] = []
        calls: list[tuple[subprocess.Popen[str], float]] = []
        try:
            for daemon in fresh:
                group = unique("calc")
                serve_cmd = re.sub(r"\bcalc\b", group, serve_line.replace(".venv/bin/", f"{BIN}/")).rstrip("& ")
                call_cmd = re.sub(r"\bcalc\b", group, call_line.replace(".venv/bin/", f"{BIN}/"))
                env = {**os.environ, "RMPD_SOCKET": str(daemon.socket)}
                servers.append(subprocess.Popen(serve_cmd, shell=True, env=env, stderr=subprocess.DEVNULL,
                                                start_new_session=True))
                calls.append((subprocess.Popen(call_cmd, shell=True, env=env, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True), time.monotonic()))
            for run, (call, started) in enumerate(calls):
                out, errs = call.communicate(timeout=60)
                took = time.monotonic() - started
                assert (call.returncode, out.strip()) == (0, "42"), (wave, run, round(took, 2), errs)
        finally:
            for server in servers:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(10)
        for daemon in fresh:
            daemon.stop(timeout=2)
