"""Records keep their writer's order when Spark reads a journal in many small splits, across rotated files too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmpd.audit.job import run_audit
from rmpd.audit.read import read_journals

from .cases import write_case


@contextmanager
def small_splits(spark: SparkSession) -> Iterator[None]:
    """Split every file every 2 KB, so one journal is read by many tasks in many partitions."""
    keys = ("spark.sql.files.maxPartitionBytes", "spark.sql.files.openCostInBytes")
    old = {k: spark.conf.get(k) for k in keys}
    spark.conf.set(keys[0], "2048")
    spark.conf.set(keys[1], "0")
    try:
        yield
    finally:
        for k, v in old.items():
            spark.conf.set(k, v)


@pytest.mark.parametrize("columnar", ["on", "off"])
def test_positions_follow_each_file(spark: SparkSession, tmp_path: Path, columnar: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from columnar copies, or by Spark in many splits."""
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", columnar)
    path = write_case(tmp_path, "clean", base=96_000, rotate=13)
    with small_splits(spark):
        journals = read_journals(spark, [str(path)])
        try:
            rows = journals.records.select("node", "event", "ts", "seq", "pos").orderBy("pos").collect()
        finally:
            journals.release()
    assert len({r.pos for r in rows}) == len(rows) == journals.count
    for node in {r.node for r in rows}:
        files = sorted(path.glob(f"{node.replace(':', '_')}.*.jsonl"), key=lambda p: int(p.name.split(".")[-2]))
        written = [json.loads(line) for f in files for line in f.read_text().splitlines()]
        read = [r for r in rows if r.node == node]
        assert [(r.event, r.ts, r.seq) for r in read] == [(w["event"], w["ts"], w["seq"]) for w in written]


def test_small_splits_give_the_same_verdict(spark: SparkSession, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "off")  # splits are Spark's reader's
    path = write_case(tmp_path, "source-order", base=97_000)
    whole = run_audit(spark, [str(path)], examples=100).to_dict()
    with small_splits(spark):
        split = run_audit(spark, [str(path)], examples=100).to_dict()
    assert split["records"] == whole["records"]
    for a, b in zip(split["invariants"], whole["invariants"], strict=True):
        key = json.dumps
        assert (a["name"], a["checked"], a["violations"]) == (b["name"], b["checked"], b["violations"])
        assert sorted(map(key, a["examples"])) == sorted(map(key, b["examples"]))
