"""`rmp audit` through typer's CliRunner: exit codes, the table on stdout, errors naming file and line."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
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


UNKEYED_CLEAN = {"one-order": 33, "total-order": 45, "no-duplicate": 63, "source-order": 54, "virtual-synchrony": 21,
                 "atomicity": 21, "k-resilience": 27, "unique-view-id": 2, "scmp-at-most-once": 6}
"""What the clean case (no keys, as every journal before keyed messages) was checked for before ``exactly-once``."""


def test_clean_trace_exits_0_with_table(spark: SparkSession, tmp_path: Path) -> None:
    """A clean trace without keys: the report is the one it had before keys, plus ``exactly-once`` holding over
    nothing, which the table and the JSON say."""
    path = write_case(tmp_path, "clean", base=80_000)
    out = tmp_path / "r.json"
    result = runner.invoke(audit_app, [str(path), "--master", "local[2]", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "one-order" in result.stdout and "scmp-at-most-once" in result.stdout
    assert "VIOLATED" not in result.stdout
    assert re.search(r"exactly-once +│ +0 │ +0 │ holds \(0 keyed messages\)", result.stdout), result.stdout
    data = json.loads(out.read_text())
    assert data["ok"] is True
    assert data["records"] == 159
    assert [i["name"] for i in data["invariants"]] == list(INVARIANTS)
    *before, keyed = data["invariants"]
    assert {i["name"]: i["checked"] for i in before} == UNKEYED_CLEAN
    assert all("note" not in i for i in before)
    assert keyed == {"name": "exactly-once", "checked": 0, "violations": 0, "examples": [],
                     "note": "0 keyed messages", "holds": True}
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


def test_a_corrupt_gzip_journal_exits_2_in_one_line_naming_the_file(spark: SparkSession, tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl.gz"
    with gzip.open(whole, "wt") as f:
        for i in range(5000):
            f.write(json.dumps({"v": 1, "node": "10.0.0.1:7000", "group": "g", "event": "view",
                                "view": f"10.0.0.1:7000/{i}", "ts": i, "members": ["10.0.0.1:7000"]}) + "\n")
    cut = tmp_path / "n.0.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    whole.unlink()
    result = runner.invoke(audit_app, [str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"unreadable input: {cut}: cannot be read: Unexpected end of input stream"
    assert result.stdout == ""


def test_journals_without_records_exit_2(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("")
    result = runner.invoke(audit_app, [str(tmp_path / "a.jsonl")])  # told before Spark starts
    assert result.exit_code == 2 and "no records" in result.stderr, result.output
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:  # empty, though the file is not
        f.write("")
    result = runner.invoke(audit_app, [str(tmp_path)])  # told by Spark's reading
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"unreadable input: {tmp_path}: no records (every journal file is empty)"


def test_a_spark_failure_exits_3_in_one_line_naming_the_log(tmp_path: Path) -> None:
    """Spark failing for a reason of its own (here: no memory to run a task) is exit 3, not a verdict on the input."""
    path = write_case(tmp_path, "clean", base=83_000)
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": "--conf spark.memory.fraction=0.0000001 pyspark-shell"}
    result = subprocess.run([str(Path(sys.executable).with_name("rmp")), "audit", str(path), "--master", "local[1]"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: Spark failed: ") and "SparkOutOfMemoryError" in last, result.stderr
    log = re.search(r"\(Spark's log: (\S+)\)$", last)
    assert log is not None, last
    assert "SparkOutOfMemoryError" in Path(log.group(1)).read_text()
    assert "Traceback" not in result.stderr and "\tat org.apache" not in result.stderr
    Path(log.group(1)).unlink()
