"""``latest`` on stable storage: the one part of SCMP that does I/O (the runtime's loop calls it, never the engine).

The paper's order is: write ``latest`` to stable storage, then use it.  ``write`` returns only once the value is
durable (``rmpd.durable.replace_durably``): a crash at any point leaves either the old value or the new one,
never a torn file.  The stored value never goes
down: a lower value is ignored, since crash recovery relies on ``latest`` covering everything accepted.
"""

from __future__ import annotations

import os
from pathlib import Path

from rmpd.durable import replace_durably


class LatestStoreError(Exception):
    """The stored value is unreadable: refusing to guess, since a wrong guess could accept a duplicate."""


class LatestStore:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.value: int | None = None
        self.writes = 0

    def load(self) -> int | None:
        """The persisted value, or None when there is none yet (a server that never ran)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise LatestStoreError(f"{self.path}: {exc}") from exc
        if not text.isdigit():
            raise LatestStoreError(f"{self.path}: not a timestamp: {text[:40]!r}")
        self.value = int(text)
        return self.value

    def write(self, value: int) -> int:
        """Make ``max(value, stored)`` durable and return it."""
        if self.value is None:
            self.load()
        if self.value is not None and value <= self.value:
            return self.value
        replace_durably(self.path, f"{value}\n".encode("ascii"))
        self.value = value
        self.writes += 1
        return value
