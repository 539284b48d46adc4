"""Columnar copies of journals (``rmpd.audit.columnar``): made once, made again when a journal changes, and never
made for a journal Spark's own reader would read differently, which is then read by Spark with the same verdict.
These inputs are small, which the audit reads with Spark unless ``RMP_AUDIT_COLUMNAR=on``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmpd.audit.columnar import CACHE_DIR
from rmpd.audit.job import run_audit
from rmpd.audit.report import AuditReport

from .cases import write_case


def copies_of(path: Path) -> list[Path]:
    return sorted((path / CACHE_DIR).glob("*.parquet"))


def verdict(report: AuditReport) -> list[tuple[str, int, int]]:
    return [(r.name, r.checked, r.violations) for r in report.results]


def test_a_changed_journal_is_copied_again(spark: SparkSession, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "on")  # a small input too
    path = write_case(tmp_path / "a directory", "clean", base=84_000)  # a space, which a URI would escape
    first = run_audit(spark, [str(path)])
    made = copies_of(path)
    assert first.ok and len(made) == 3
    stamps = [p.stat().st_mtime_ns for p in made]
    assert verdict(run_audit(spark, [str(path)])) == verdict(first)
    assert [p.stat().st_mtime_ns for p in copies_of(path)] == stamps  # read, not written again
    victim = sorted(path.glob("*.jsonl"))[0]
    lines = victim.read_text().splitlines()
    delivery = next(line for line in lines if json.loads(line)["event"] == "deliver")
    victim.write_text("\n".join([*lines, delivery]) + "\n")  # a delivery repeated at the end
    again = run_audit(spark, [str(path)])
    assert again.violated() == ["no-duplicate"] and again.records == first.records + 1
    assert len(copies_of(path)) == 3  # the copy of the journal's earlier content is gone


def _unusual(line: str) -> str:
    """The same record written as other writers may: member pairs, and a QoS as its wire code."""
    record = json.loads(line)
    if record["event"] == "view":
        record["members"] = [[m, True] for m in record["members"]]
    if record["event"] == "deliver" and record["qos"] == "total":
        record["qos"] = 3
    return json.dumps(record)


@pytest.mark.parametrize("change", ["unusual records", "a blank line"])
def test_journals_a_copy_cannot_hold_are_read_by_spark(spark: SparkSession, tmp_path: Path, change: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_case(tmp_path, "source-order", base=85_000)
    victim = sorted(path.glob("*.jsonl"))[1]
    lines = victim.read_text().splitlines()
    lines = [_unusual(line) for line in lines] if change == "unusual records" else [*lines[:5], "", *lines[5:]]
    victim.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "on")
    report = run_audit(spark, [str(path)], examples=100)
    assert copies_of(path) == [] or victim.name not in " ".join(p.name for p in copies_of(path))
    assert report.violated() == ["source-order"]
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "off")
    read_by_spark = run_audit(spark, [str(path)], examples=100)
    assert report.to_dict() == read_by_spark.to_dict()


def test_copies_started_before_spark_are_the_ones_the_audit_reads(spark: SparkSession, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``rmp audit`` starts copying a large local input while Spark starts; the audit waits for those copies and
    reads them (each journal copied once), with the verdict of Spark's own reader."""
    from rmpd.audit import columnar
    from rmpd.audit.inputs import JOURNAL_SUFFIXES

    path = write_case(tmp_path, "no-duplicate", base=86_000)
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "off")
    by_spark = run_audit(spark, [str(path)])
    assert copies_of(path) == []
    started = columnar.copy_early([str(path)], JOURNAL_SUFFIXES)
    assert started is not None
    started.join(timeout=60)
    made = copies_of(path)
    assert len(made) == 3
    stamps = [p.stat().st_mtime_ns for p in made]
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "on")
    from_copies = run_audit(spark, [str(path)])
    assert [p.stat().st_mtime_ns for p in copies_of(path)] == stamps  # read, not written again
    assert verdict(from_copies) == verdict(by_spark) and from_copies.violated() == ["no-duplicate"]
