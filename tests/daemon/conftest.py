"""Fixtures for tests that run real rmpd processes on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import Daemon, ensure_loopback_multicast

FAST_JOIN = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\n"
"""A first member forms its group after about 0.7 s instead of 3 s: tests start many groups from scratch."""


@pytest.fixture(scope="session")
def loopback_multicast() -> None:
    ensure_loopback_multicast()


TEARDOWN_GRACE = 1.0
"""Seconds the daemons of a finished test have, all together, to leave their groups before they are killed."""

LOG_TAIL = 80
"""Lines of each daemon's log shown with a failed test."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that started daemons shows the end of each one's log (a restarted daemon's runs in order):
    what a failed wait for a view needs to be understood."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    started: list[Daemon] | None = getattr(item, "rmpd_daemons", None)
    if report.when != "call" or not report.failed or not started:
        return
    for path in dict.fromkeys(d.log_path for d in started):  # one section per log, in the order first started
        try:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        except OSError as exc:
            lines = [f"(cannot read {path}: {exc})"]
        report.sections.append((f"rmpd log {path.name}", "\n".join(lines)))


@pytest.fixture
def daemons(tmp_path: Path, loopback_multicast: None,
            request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemon]]:
    """A factory of daemons on loopback; every daemon started is stopped (SIGTERM) at the end of the test, and a
    failed test shows their logs."""
    started: list[Daemon] = []
    request.node.rmpd_daemons = started
    fast = tmp_path / "fast-join.toml"
    fast.write_text(FAST_JOIN)

    def start(name: str | None = None, **kwargs: object) -> Daemon:
        kwargs.setdefault("config", fast)
        daemon = Daemon(tmp_path, name or f"d{len(started) + 1}", **kwargs)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:  # all at once: each leaves its groups in parallel with the others
        if daemon.proc.poll() is None:
            daemon.proc.terminate()
    # A leave that cannot commit (a member was killed, or every member leaves at once) holds a daemon up to its
    # 5 s leave timeout; tests that judge the clean leave stop their daemons themselves, so teardown waits less.
    grace_ends = time.monotonic() + TEARDOWN_GRACE
    for daemon in started:
        daemon.stop(timeout=max(0.1, grace_ends - time.monotonic()))
