"""The daemon's translator bound to its trio loop: the process loop's application, the metrics' collector, and
the wait for the last client at shutdown.

What the daemon does with requests and events is the sans-IO :class:`~rmpd.daemon.translator.Translator`; this
adds only what needs trio.
"""

from __future__ import annotations

import trio

from rmpd.runtime.loop import ProcessLoop

from .memberships import MembershipFile
from .ports import Outlet
from .status import client_metrics
from .translator import Translator


class Hub(Translator):
    def __init__(self, loop: ProcessLoop, socket_path: str, overrun_frames: int = 5000,
                 kept: MembershipFile | None = None) -> None:
        super().__init__(loop, clock=trio.current_time, socket_path=socket_path, overrun_frames=overrun_frames,
                         kept=kept)
        self.loop = loop
        loop.application = self
        loop.metrics.extra.append(lambda: client_metrics(self))
        self._sessions_changed = trio.Event()
        """Set when a client goes away (replaced by whoever waits for the next one: :meth:`sessions_gone`)."""

    def remove(self, session: Outlet) -> None:
        super().remove(session)
        self._sessions_changed.set()

    async def sessions_gone(self) -> None:
        """Return once no client is connected (after :meth:`close_sessions`, when each has been sent its last
        frame)."""
        while self.sessions:
            self._sessions_changed = trio.Event()
            await self._sessions_changed.wait()


__all__ = ["Hub"]
