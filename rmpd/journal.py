"""Writes journal records (docs/trace-format.md) as JSON Lines, one file set per process, rotated by size."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, Any


class JournalWriter:
    """Appends records to ``<dir>/<node>.<n>.jsonl[.gz]``, starting file n+1 once file n passes ``rotate_bytes``.

    A process that restarts with the same ID (a daemon on a fixed port) starts after the highest existing file, so
    the journal of its earlier run is kept and file numbers stay in time order."""

    def __init__(self, directory: Path, *, compress: bool = False, rotate_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compress = compress
        self.rotate_bytes = rotate_bytes
        self._files: dict[str, tuple[IO[str], int, int]] = {}

    def _path(self, node: str, index: int) -> Path:
        return self.directory / (f"{node.replace(':', '_')}.{index}.jsonl" + (".gz" if self.compress else ""))

    def _first_free(self, node: str) -> int:
        index = 0
        while self._path(node, index).exists():
            index += 1
        return index

    def _open(self, node: str, index: int) -> IO[str]:
        path = self._path(node, index)
        if self.compress:
            return gzip.open(path, "wt", encoding="utf-8")
        return path.open("w", encoding="utf-8")

    def write(self, node: str, records: list[dict[str, Any]]) -> None:
        if node not in self._files:
            first = self._first_free(node)
            self._files[node] = (self._open(node, first), first, 0)
        handle, index, written = self._files[node]
        for rec in records:
            line = json.dumps(rec, separators=(",", ":")) + "\n"
            if written and written + len(line) > self.rotate_bytes:
                handle.close()
                index += 1
                handle, written = self._open(node, index), 0
            handle.write(line)
            written += len(line)
        self._files[node] = (handle, index, written)

    def close(self) -> None:
        for handle, _, _ in self._files.values():
            handle.close()
        self._files.clear()
