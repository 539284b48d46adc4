"""The README's "Using it" examples, as written, against one daemon: each shell command and the library example.

The commands name ``.venv/bin/...`` (the README runs from a clone); here they run with this interpreter's
``bin`` directory in its place, and find the daemon through ``$RMPD_SOCKET``, as a shell on that host would.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from .harness import Daemon

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent


def using_it(kind: str) -> str:
    """The first ``kind`` code block of the README's "Using it" section."""
    section = README.read_text().split("## Using it", 1)[1]
    return re.search(rf"```{kind}\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def shell_commands() -> list[str]:
    commands = []
    for line in using_it("sh").splitlines():
        command = line.split("  #", 1)[0].strip()  # the README comments each command after two spaces
        if command:
            commands.append(command.replace(".venv/bin/", f"{BIN}/"))
    return commands


def read_until(proc: subprocess.Popen[bytes], wanted: str, timeout: float, stream: str = "stdout") -> str:
    """What ``proc`` printed on ``stream`` up to ``wanted`` (failing after ``timeout`` seconds, or when it exits)."""
    pipe = getattr(proc, stream)
    assert pipe is not None
    fd = pipe.fileno()
    seen = ""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} within {timeout} s; got: {seen[-2000:]}"
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"exited {proc.wait()} before {wanted!r}; got: {seen[-2000:]}")
            seen += chunk.decode(errors="replace")
    return seen


def test_the_readme_commands_and_library_example_work_against_one_daemon(daemons, tmp_path: Path) -> None:
    daemon: Daemon = daemons()
    env = {**os.environ, "RMPD_SOCKET": str(daemon.socket)}
    commands = shell_commands()
    assert commands[0].endswith("/rmpd") or " rmpd" in commands[0].split("#")[0], commands[0]  # started above
    join, listen, send, show, show_all = commands[1:]
    subprocess.run(join, shell=True, env=env, check=True, timeout=60)
    listener = subprocess.Popen(listen, shell=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # As a user would, in another terminal: the listener is in the group before anything is sent to it (a
        # listener that joins later starts at its own view, after what was sent before it).
        read_until(listener, "listening on chat", 60, "stderr")
        example = tmp_path / "example.py"
        example.write_text(using_it("python"))
        program = subprocess.Popen([sys.executable, str(example)], env=env, stdout=subprocess.PIPE)
        try:
            printed = read_until(program, "payload=b'c'", 60)
            assert "payload=b'hello'" in printed and "payload=b'a'" in printed and "payload=b'b'" in printed
            subprocess.run(send, shell=True, env=env, check=True, timeout=60)
            heard = read_until(listener, '"qos":"safe"', 60)  # the shell's send (the example's are total)
            if not heard.endswith("\n"):
                heard += read_until(listener, "\n", 10)
            [line] = [line for line in heard.splitlines() if '"qos":"safe"' in line]
            assert json.loads(line)["payload"] == "hello"
        finally:
            program.kill()
        shown = subprocess.run(show, shell=True, env=env, check=True, timeout=60, capture_output=True, text=True)
        assert daemon.pid in shown.stdout
        # Other daemons on this host may be in "chat" too (and exit 1 when one of them does not answer): this
        # daemon's own row is what is checked.
        shown = subprocess.run(show_all, shell=True, env=env, timeout=60, capture_output=True, text=True)
        [own] = [line for line in shown.stdout.splitlines() if line.startswith(daemon.pid)]
        assert "operational" in own and shown.returncode in (0, 1), shown.stdout + shown.stderr
    finally:
        listener.kill()
