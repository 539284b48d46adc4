"""Fixtures for tests that run real rmpd processes on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .harness import Daemon, ensure_loopback_multicast

FAST_JOIN = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\n"
"""A first member forms its group after about 0.7 s instead of 3 s: tests start many groups from scratch."""


@pytest.fixture(scope="session")
def loopback_multicast() -> None:
    ensure_loopback_multicast()


@pytest.fixture
def daemons(tmp_path: Path, loopback_multicast: None) -> Iterator[Callable[..., Daemon]]:
    """A factory of daemons on loopback; every daemon started is stopped (SIGTERM) at the end of the test."""
    started: list[Daemon] = []
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
    for daemon in started:
        daemon.stop()
