"""One run of a process under its ID, and the one thing that run keeps on stable storage for the next.

A daemon restarts on the same port, so under the same process ID.  Two things keep a new incarnation from being
taken for the old one: its sequence numbers start from the wall clock, so its messages never look like duplicates
of the old one's; and SCMP's ``latest`` (figure 2-2) is read back from stable storage at start (crash recovery) and
written durably, off the loop, whenever the process asks, the process hearing of a value only once it is durable.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.multirpc import ScmpSettings
from rmpd.protocol.process import RmpProcess
from rmpd.scmp.latest import LatestStore

log = logging.getLogger("rmpd")

LATEST_RETRY_AFTER = 1.0
"""Seconds to wait after a failed write of ``latest`` before the process may ask for the next one."""


class Incarnation:
    """Starts the process of one :class:`ProcessLoop` and keeps its ``latest`` on stable storage."""

    def __init__(self, pid: str, config: EngineConfig, *, multicast: bool, scmp: ScmpSettings | None,
                 latest_path: Callable[[str], Any] | None, stats: Counter[str]) -> None:
        """``latest_path(pid)``: where ``latest`` lives (None: no stable storage).  Raises LatestStoreError for a
        corrupt file.  ``stats``: the loop's counters, where a failed write is counted."""
        self.stats = stats
        wall_ms = int(time.time() * 1000)
        self.latest_store = LatestStore(latest_path(pid)) if latest_path is not None else None
        scmp = scmp or ScmpSettings()
        if self.latest_store is not None:
            # Crash recovery (SCMP figure 2-2): upper starts at the persisted latest, 0 when this is the first run.
            found = self.latest_store.load() or 0
            scmp = replace(scmp, upper=found, latest=found)
        # A daemon restarts on the same port, so the same process ID: start sequence numbers from the clock so
        # the new incarnation's messages never look like duplicates of the old one's.
        self.process = RmpProcess(pid=pid, config=config, rng=random.Random(), now=trio.current_time(),
                                  wall_ms=wall_ms, multicast_capable=multicast, seq_base=wall_ms * 1000, scmp=scmp)
        """The process of this incarnation, which the loop drives; told here when a ``latest`` is durable."""

    def persist(self, value: int, nursery: trio.Nursery | None, taken: Callable[[], None]) -> None:
        """Write ``latest`` durably off the loop in ``nursery``, then tell the process (which only then accepts up
        to it) and have the loop drain that (``taken``); with no nursery (the loop not running), at once."""
        store = self.latest_store
        if store is None:
            return

        async def write() -> None:
            try:
                durable = await trio.to_thread.run_sync(store.write, value)
            except OSError as exc:
                # Without a durable latest the process keeps refusing calls stamped beyond the old one: safe.
                self.stats["latest_write_failed"] += 1
                log.error("cannot write %s: %s", store.path, exc)
                durable = store.value or 0
                await trio.sleep(LATEST_RETRY_AFTER)
            self.process.persisted(durable, trio.current_time())
            taken()

        if nursery is None:
            self.process.persisted(store.write(value), trio.current_time())
        else:
            nursery.start_soon(write)
