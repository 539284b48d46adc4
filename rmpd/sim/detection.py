"""How long a group takes to remove a crashed member, as the simulator times it.

A crash is timed from the moment the process stops to the first view without it that one of its *fellows* installs:
the processes whose view held it when it crashed.  Views installed by anybody else say nothing about detection (a
joiner's group of its own never held the crashed process; the crashed process's own restart forms a new group), so
they are ignored.  A fellow that crashes or leaves in turn stops being a witness; a crash whose fellows all stopped
before removing it stays untimed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


class CrashDetections:
    """Crashes still waiting for a fellow to remove them, and the detection times of those already removed."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[float, set[str]]] = {}
        """Crashed process ID -> (when it crashed, its fellows then that have neither removed it nor stopped)."""
        self.detections: list[float] = []
        """Seconds from each timed crash to its removal, in the order the removals happened."""

    @property
    def untimed(self) -> int:
        """Crashes no fellow has removed (yet): at the end of a run, the ones that are never timed."""
        return len(self.pending)

    def crashed(self, pid: str, at: float, fellows: Iterable[str]) -> None:
        """``pid`` stopped at ``at``; ``fellows`` are the live processes whose view then held it."""
        self.pending[pid] = (at, set(fellows))

    def no_longer_fellow(self, node: str) -> None:
        """``node`` crashed or left: no view it installs from now on can time an earlier crash."""
        for _, fellows in self.pending.values():
            fellows.discard(node)

    def view_installed(self, node: str, members: Collection[str], at: float) -> None:
        """``node`` installed a view of ``members`` at ``at``: it times every crash it witnessed and left out."""
        for pid, (crashed_at, fellows) in list(self.pending.items()):
            if pid not in members and node in fellows:
                self.detections.append(at - crashed_at)
                del self.pending[pid]
