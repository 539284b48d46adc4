"""A process's journal: the shared JSON Lines writer, flushed after every drain.

A daemon can die by ``kill -9`` at any moment; flushing once per drain keeps what it wrote up to its last step on
disk, so the journals of the surviving hosts and of the killed one can still be checked together.
"""

from __future__ import annotations

import time
from typing import Any

from rmpd.journal import JournalWriter


class FlushingJournal(JournalWriter):
    def write_drained(self, node: str, records: list[dict[str, Any]]) -> None:
        """Write one drain's records, stamped with the wall clock of the drain (what lines up the journals of
        several hosts), and flush them."""
        wall = time.time()
        for rec in records:
            rec["wall"] = wall
        self.write(node, records)
        self.flush()

    def flush(self) -> None:
        for handle, _, _ in self._files.values():
            handle.flush()
