"""`rmp audit` through typer's CliRunner: exit codes, the table on stdout, errors naming file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from cli.audit_cmd import audit_app
from rmpd.audit.job import run_audit
from rmpd.audit.read import UnreadableInput
from rmpd.audit.schema import INVARIANTS

from .cases import write_case

runner = CliRunner()


def test_clean_trace_exits_0_with_table(spark: SparkSession, tmp_path: Path) -> None:
    path = write_case(tmp_path, "clean", base=80_000)
    out = tmp_path / "r.json"
    result = runner.invoke(audit_app, [str(path), "--master", "local[2]", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "one-order" in result.stdout and "scmp-at-most-once" in result.stdout
    assert "VIOLATED" not in result.stdout
    data = json.loads(out.read_text())
    assert data["ok"] is True
    assert data["records"] == 159
    assert [i["name"] for i in data["invariants"]] == list(INVARIANTS)
    assert all(i["checked"] > 0 for i in data["invariants"])
    assert all(i["violations"] == 0 and i["examples"] == [] and i["holds"] for i in data["invariants"])


def test_violation_exits_1_and_names_the_invariant(spark: SparkSession, tmp_path: Path) -> None:
    path = write_case(tmp_path, "k-resilience", base=81_000)
    out = tmp_path / "r.json"
    result = runner.invoke(audit_app, [str(path), "--json", str(out), "--examples", "1"])
    assert result.exit_code == 1, result.output
    assert "VIOLATED" in result.stdout and "examples: k-resilience" in result.stdout
    data = json.loads(out.read_text())
    bad = [i["name"] for i in data["invariants"] if not i["holds"]]
    assert bad == ["k-resilience"]
    (ex,) = data["invariants"][6]["examples"]
    assert set(ex) >= {"node", "view", "ts", "src", "seq"}


def test_malformed_line_exits_2_naming_file_and_line(spark: SparkSession, tmp_path: Path) -> None:
    path = write_case(tmp_path, "clean", base=82_000)
    victim = sorted(path.glob("*.jsonl"))[1]
    lines = victim.read_text().splitlines()
    lines[4] = lines[4][:-7]  # truncated JSON object
    lines.insert(2, "")  # a blank line still counts as a line
    victim.write_text("\n".join(lines) + "\n")
    result = runner.invoke(audit_app, [str(path)])
    assert result.exit_code == 2, result.output
    assert f"{victim}:6:" in result.stderr
    assert result.stdout == ""


def test_unreadable_variants_are_reported(spark: SparkSession, tmp_path: Path) -> None:
    gz = tmp_path / "n.0.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write('{"v":1,"node":"10.0.0.1:7000","group":"g","event":"view","view":"10.0.0.1:7000/1","ts":0}\n')
        f.write('{"v":1,"node":"10.0.0.1:7000","group":"g","event":"deliver","ts":"soon"}\n')
    with pytest.raises(UnreadableInput) as info:
        run_audit(spark, [str(gz)])
    assert (info.value.file, info.value.line) == (str(gz), 2)
    bad_version = tmp_path / "v.jsonl"
    bad_version.write_text('{"v":9,"node":"x","event":"view"}\n')
    with pytest.raises(UnreadableInput, match="unsupported schema version 9"):
        run_audit(spark, [str(bad_version)])
    result = runner.invoke(audit_app, [str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such file or directory" in result.stderr
