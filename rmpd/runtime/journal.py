"""A process's journal: the shared JSON Lines writer, flushed after every drain.

A daemon can die by ``kill -9`` at any moment; flushing once per drain keeps what it wrote up to its last step on
disk, so the journals of the surviving hosts and of the killed one can still be checked together.
"""

from __future__ import annotations

from rmpd.journal import JournalWriter


class FlushingJournal(JournalWriter):
    def flush(self) -> None:
        for handle, _, _ in self._files.values():
            handle.flush()
