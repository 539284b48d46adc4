"""`rmp audit` answers what it can before Spark starts, and says in one line how to install Spark when it is absent;
the daemon's package does not pull Spark in (only the ``audit`` extra does)."""

from __future__ import annotations

import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

WITHOUT_SPARK = (
    "import sys; sys.modules['pyspark'] = None; sys.modules['py4j'] = None; "
    "from cli.rmp_main import main; sys.argv = ['rmp', *sys.argv[1:]]; main()"
)
"""``rmp`` in an interpreter where importing PySpark fails, as in an install without the ``audit`` extra."""


def rmp_without_spark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_SPARK, *args], capture_output=True, text=True, timeout=60)


def test_a_missing_path_is_answered_without_spark(tmp_path: Path) -> None:
    result = rmp_without_spark("audit", str(tmp_path / "nowhere"))
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'nowhere'}: no such file or directory" in result.stderr
    assert "pip install" not in result.stderr  # answered before anything tried to import Spark


def test_a_directory_without_journals_and_a_missing_capture_are_answered_without_spark(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a journal\n")
    result = rmp_without_spark("audit", str(tmp_path))
    assert result.returncode == 2 and "no journal files" in result.stderr, result.stderr
    result = rmp_without_spark("audit", "--pcap", str(tmp_path / "none.pcap"))
    assert result.returncode == 2 and "no such capture file" in result.stderr, result.stderr


def test_without_spark_audit_says_how_to_install_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"v":1,"node":"10.0.0.1:7000","event":"view","view":"x/1","ts":0}\n')
    result = rmp_without_spark("audit", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: rmp audit needs PySpark (and Java 17): pip install "
                                                  "'rmpd[audit]'"]
    assert rmp_without_spark("sim", "--seeds", "1", "--messages", "5").returncode == 0  # the rest runs without it


def test_only_the_audit_extra_requires_pyspark() -> None:
    requires = metadata.requires("rmpd") or []
    spark = [r for r in requires if r.lower().startswith("pyspark")]
    assert spark and all('extra == "audit"' in r for r in spark), requires
    assert any(r.startswith("prometheus") and "extra" not in r for r in requires), requires


def test_a_master_spark_cannot_use_is_answered_in_one_line_before_spark_starts(tmp_path: Path) -> None:
    journal = tmp_path / "a.jsonl"
    journal.write_text('{"v":1,"node":"10.0.0.1:7000","event":"view","view":"x/1","ts":0}\n')
    result = rmp_without_spark("audit", str(journal), "--master", "bogus://x")
    assert result.returncode == 2
    assert result.stderr.startswith("error: Spark master bogus://x: not a master URL Spark takes"), result.stderr
    with socket.socket() as unused:  # a port nobody listens on: bound, never listening
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        result = rmp_without_spark("audit", str(journal), "--master", f"spark://127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: Spark master spark://127.0.0.1:{port}: cannot connect (127.0.0.1:{port} Connection refused)"
    )
