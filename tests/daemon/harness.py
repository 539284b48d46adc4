"""Real rmpd processes for tests: started with --port 0, ready when they send READY=1 to our NOTIFY_SOCKET.

Nothing here mocks a socket or a process: each daemon is the installed ``rmpd`` command; tests talk to it with the
``rmp`` command or the client library, and wait for conditions with deadlines instead of sleeping.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import rmpd
from rmpd.bench.daemons import RMP, RMPD, DaemonProcess

__all__ = ["RMP", "RMPD", "Daemon", "ensure_loopback_multicast", "read_deliveries", "unique", "wait_for"]


Daemon = DaemonProcess
"""A test's rmpd process: the same class ``rmp bench`` starts its daemons with."""


async def read_deliveries(group: rmpd.Group, count: int, into: list[rmpd.Delivery]) -> None:
    """Append ``group``'s deliveries to ``into`` until it holds ``count`` (view changes are skipped)."""
    async for event in group:
        if isinstance(event, rmpd.Delivery):
            into.append(event)
            if len(into) == count:
                return


_names = itertools.count()


def unique(name: str) -> str:
    """A group name no other test run on this host uses: daemons on loopback hear every run's groups of one name
    (they share the multicast address), so a concurrent run's daemons would join this test's view."""
    return f"{name}-{os.getpid()}-{next(_names)}"


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
