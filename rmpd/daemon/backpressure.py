"""Local clients that fall behind their groups (section 4.6).

A group with a client more than ``overrun_frames`` (or OVERRUN_BYTES) behind stops accepting the token until the
client catches up, rather than letting the client fall further behind.  A client still behind after
OVERRUN_GRACE seconds is cut off as a slow consumer: one stuck reader must not stall the ring until the others
declare this daemon failed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, MutableMapping

from rmpd import localapi
from rmpd.runtime.adapter import OVERRUN_GRACE, ProcessAdapter

from .attachments import Attachments
from .ports import Outlet

OVERRUN_BYTES = 4 * 1024 * 1024
"""A client with more than this queued (or more than half of client_queue frames) is behind: what the daemon
buffers for a client is bounded in bytes, not only in frames of any size."""


class Backpressure:
    """Which groups hold the token back for a client behind (kept by ``app``, the overrun rule the embedded node
    has too), and the cut of a client that stays behind."""

    def __init__(self, app: ProcessAdapter, attachments: Attachments, clients: Collection[Outlet], overrun_frames: int,
                 stats: MutableMapping[str, int], clock: Callable[[], float]) -> None:
        self.app = app
        self.attachments = attachments
        self.clients = clients
        """Every client connected (the translator's)."""
        self.overrun_frames = overrun_frames
        self.stats = stats
        self.clock = clock

    def holding(self) -> bool:
        """Some group holds the token back for a client behind."""
        return bool(self.app.overrun)

    def check(self) -> None:
        """After each drain, and after a write while a group holds back: hold back, let go, or cut."""
        frames = self.overrun_frames
        if not self.app.overrun and all(c.queued_frames <= frames and c.queued_bytes <= OVERRUN_BYTES
                                        for c in self.clients):
            return  # nobody is behind and no group holds the token back: the common case, checked cheaply
        self.app.check_overrun(list(set(self.attachments.groups()) | self.app.overrun.keys()),
                               lambda group: bool(self.behind(group)), self._cut, self.clock())

    def behind(self, group: str) -> list[Outlet]:
        return [c for c in self.attachments.clients(group) if not c.closed and (
            c.queued_frames > self.overrun_frames or c.queued_bytes > OVERRUN_BYTES)]

    def _cut(self, group: str) -> None:
        for client in self.behind(group):
            client.cut(localapi.SLOW_CONSUMER, f"held the group {group!r} back for {OVERRUN_GRACE:g} s")
            self.stats["overrun_cut"] += 1


__all__ = ["OVERRUN_BYTES", "Backpressure"]
