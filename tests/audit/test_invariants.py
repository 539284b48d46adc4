"""Every invariant, broken alone in its own hand-made trace, is named, and only it; clean traces pass.

All cases are audited in one run (each case is its own group with its own view IDs, and every invariant is judged
per group), which keeps the suite fast; each case's verdict is read back from the violations of its group.  A clean
trace audited alone, with its JSON report, is tested through the CLI (``test_cli.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmpd.audit import job
from rmpd.audit.job import run_audit
from rmpd.audit.report import AuditReport
from rmpd.audit.schema import INVARIANTS

from .cases import BREAKERS, MORE_BREAKERS, VARIANTS, A, B, C, write_case

CLEAN = ("clean", "clean-gz-rotated", *VARIANTS)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case in one directory."""
    root = tmp_path_factory.mktemp("cases")
    for n, name in enumerate(BREAKERS):
        write_case(root, name, base=1000 * (n + 1))
    write_case(root, "clean", base=50_000)
    write_case(root, "clean-gz-rotated", base=60_000, gz=True, rotate=17)
    for n, name in enumerate([*VARIANTS, *MORE_BREAKERS]):
        write_case(root, name, base=70_000 + 1000 * n)
    (root / "README.txt").write_text("not a journal; directories only take *.jsonl[.gz]\n")
    return root


@pytest.fixture(scope="module")
def combined(spark: SparkSession, cases: Path) -> AuditReport:
    return run_audit(spark, [str(cases)], examples=1000)


def violated_in(report: AuditReport, group: str) -> set[str]:
    return {r.name for r in report.results for e in r.examples if e["group"] == group}


def test_every_invariant_is_checked(combined: AuditReport) -> None:
    assert [r.name for r in combined.results] == list(INVARIANTS)
    assert all(r.checked > 0 for r in combined.results), [(r.name, r.checked) for r in combined.results]
    assert combined.exit_code == 1


@pytest.mark.parametrize("invariant", list(BREAKERS))
def test_breaking_one_invariant_names_only_it(combined: AuditReport, invariant: str) -> None:
    assert violated_in(combined, invariant) == {invariant}


@pytest.mark.parametrize("case", list(MORE_BREAKERS))
def test_each_further_breaker_names_only_its_invariant(combined: AuditReport, case: str) -> None:
    assert violated_in(combined, case) == {MORE_BREAKERS[case][0]}


def test_examples_name_the_culprit(combined: AuditReport) -> None:
    by_name = {r.name: r for r in combined.results}
    k = by_name["k-resilience"]
    assert k.violations == 1
    (ex,) = k.examples
    assert ex["node"] == "10.0.0.3:7000" and ex["group"] == "k-resilience" and ex["seq"] is not None
    assert "needs 3 holders; record says 1" in ex["detail"]
    dup = by_name["no-duplicate"]
    assert dup.violations == 1 and dup.examples[0]["node"] == "10.0.0.1:7000"
    assert by_name["scmp-at-most-once"].violations == 1
    assert by_name["unique-view-id"].violations == 1


def test_exactly_once_names_each_key_and_member(combined: AuditReport) -> None:
    """A key at two positions is one example naming both; each member that delivered a key twice is one more.  One
    message ordered again after a cut is at two slots but one position of each member's order: no violation."""
    (result,) = [r for r in combined.results if r.name == "exactly-once"]
    found: dict[str, list[tuple[str, str]]] = {}
    for e in result.examples:
        found.setdefault(e["group"], []).append((e["node"], e["detail"].split()[0]))
    two_positions = re.compile(r"^key [0-9a-f]+ at 2 positions of the order: "
                               rf"ts 2 #0 in \S+ \({A} seq 1\), ts 9 #0 in \S+ \({A} seq 3\)$")
    assert all(two_positions.match(e["detail"]) or e["detail"].endswith(" 2 times") for e in result.examples)
    assert sorted(found) == ["exactly-once", "exactly-once-one-member", "exactly-once-two-positions"]
    assert sorted(found["exactly-once"]) == sorted([(A, "key"), (A, "delivered"), (B, "delivered"), (C, "delivered")])
    assert sorted(found["exactly-once-one-member"]) == sorted([(C, "key"), (C, "delivered")])
    assert found["exactly-once-two-positions"] == [(B, "key")]
    assert result.violations == len(result.examples) == 7
    # 12 keyed messages in each of the five keyed cases, one more where a key is delivered twice or C's message is
    # keyed: counted once, though it sits at two slots
    assert result.note == "64 keyed messages"


@pytest.mark.parametrize("group", CLEAN)
def test_clean_traces_pass(combined: AuditReport, group: str) -> None:
    assert violated_in(combined, group) == set()



def test_columnar_copies_give_the_verdict_of_spark_s_json_reader(
    spark: SparkSession, cases: Path, combined: AuditReport, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read from columnar copies (``rmpd.audit.columnar``, which a small input takes only when told to), every case
    gives the report Spark's own reader of the JSON lines gives: every count, note and example."""
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", "on")
    from_copies = run_audit(spark, [str(cases)], examples=1000)
    journals = [p for p in cases.rglob("*.jsonl*") if p.suffix != ".parquet"]
    copies = sorted(cases.rglob(".rmp-audit/*.parquet"))
    assert len(copies) == len(journals) > 30

    assert shown(from_copies) == shown(combined)


@pytest.mark.parametrize("columnar", ["on", "off"])
def test_groups_spread_over_several_tasks_give_the_report_of_one_task(
    spark: SparkSession, cases: Path, combined: AuditReport, monkeypatch: pytest.MonkeyPatch, columnar: str,
) -> None:
    """Audited as a large input (its groups spread over several tasks: read from the columnar copies by each task,
    or shuffled by group from Spark's reader), the cases give the report of the one task a small input gets."""
    monkeypatch.setenv("RMP_AUDIT_COLUMNAR", columnar)
    monkeypatch.setattr(job, "SMALL_INPUT_BYTES", 0)
    assert spark.sparkContext.defaultParallelism > 1
    assert shown(run_audit(spark, [str(cases)], examples=1000)) == shown(combined)


def shown(report: AuditReport) -> dict:
    """A report's dict with each invariant's examples in one order (tasks list them in any)."""
    data = report.to_dict()
    for entry in data["invariants"]:
        entry["examples"] = sorted(json.dumps(e, sort_keys=True) for e in entry["examples"])
    return data
