"""The journal writer keeps every run of a process that restarts under the same ID, in time order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmpd.journal import JournalWriter


@pytest.mark.parametrize("compress", [False, True])
def test_a_restarted_process_appends_after_its_earlier_files(tmp_path: Path, compress: bool) -> None:
    for run in range(3):
        writer = JournalWriter(tmp_path, compress=compress, rotate_bytes=200)
        writer.write("10.0.0.1:7000", [{"run": run, "i": i, "pad": "x" * 50} for i in range(5)])
        writer.close()
    suffix = ".jsonl.gz" if compress else ".jsonl"
    files = sorted(tmp_path.glob(f"*{suffix}"), key=lambda p: int(p.name.split(".")[-3 if compress else -2]))
    assert len(files) >= 6  # three runs, each rotated at least once
    opener = __import__("gzip").open if compress else open
    rows = [json.loads(line) for f in files for line in opener(f, "rt")]
    assert [(r["run"], r["i"]) for r in rows] == [(run, i) for run in range(3) for i in range(5)]
