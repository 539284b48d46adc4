"""A progress line on stderr while the audit runs: what it is doing, records read, Spark stages done and running.

Spark's own console bar shows one stage at a time with no context; an audit runs dozens of short stages, so the
bar flickers without saying how far along the audit is.  This line is redrawn in place on a terminal and, when
stderr is a file or a pipe, written as a plain line now and then, so a log of a long audit shows it advancing.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

from pyspark.sql import SparkSession

POLL_SECONDS = 0.5
"""How often Spark's status tracker is read (each read is a few calls into the JVM)."""

PLAIN_LINE_SECONDS = 15.0
"""Where stderr is not a terminal, a progress line is written this often (none for an audit quicker than this)."""


class Progress:
    """Reports on ``stream`` while in a ``with`` block; the audit sets ``phase`` and ``records`` as it goes."""

    def __init__(self, spark: SparkSession, stream: TextIO, enabled: bool = True) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._stream = stream
        self._enabled = enabled
        self._terminal = stream.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: set[int] = set()
        self._drawn = 0
        self.phase = "starting"
        self.records: int | None = None

    def __enter__(self) -> Progress:
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="rmp-audit-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._drawn:
            self._stream.write("\r" + " " * self._drawn + "\r")
            self._stream.flush()

    def line(self) -> str:
        """The current progress as one line."""
        active = sorted(self._tracker.getActiveStageIds())
        self._seen.update(active)
        done = len(self._seen) - len(active)
        parts = [f"rmp audit: {self.phase}"]
        if self.records is not None:
            parts.append(f"{self.records:,} records")
        parts.append(f"{done} stages done")
        for stage_id in active[:2]:
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
        return ", ".join(parts)

    def _run(self) -> None:
        last_plain = time.monotonic()
        while not self._stop.wait(POLL_SECONDS):
            try:
                text = self.line()
            except Exception:  # the JVM going away mid-poll ends the reports, never the audit
                return
            if self._terminal:
                self._stream.write("\r" + text.ljust(self._drawn)[:200])
                self._drawn = min(max(self._drawn, len(text)), 200)
                self._stream.flush()
            elif time.monotonic() - last_plain >= PLAIN_LINE_SECONDS:
                last_plain = time.monotonic()
                self._stream.write(text + "\n")
                self._stream.flush()
