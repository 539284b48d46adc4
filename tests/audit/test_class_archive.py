"""`rmp audit` in a process of its own writes the JVM's class-data archive once, whole, and an archive that does
not fit (a Java or Spark upgrade, a damaged file) changes nothing but the start's speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmpd.audit.job import SMALL_INPUT_BYTES
from rmpd.audit.jvm import ARCHIVE_ENV, KEPT_ARCHIVES, archive_path, is_small_local_input, plan_launch

from .cases import write_case

RMP = str(Path(sys.executable).with_name("rmp"))

START_SPARK = """
from rmpd.audit.jvm import plan_launch
from rmpd.audit.session import get_session
jvm = plan_launch(small=True)
print(get_session("local[1]", jvm=jvm).range(3).count())
jvm.finish()
"""


def _audit(path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RMP, "audit", str(path), "--master", "local[2]"], capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache)}, timeout=300)


@pytest.fixture(autouse=True)
def archive_allowed(no_class_archive: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the archive: take away the setting the rest of the audit suite runs with."""
    monkeypatch.delenv(ARCHIVE_ENV)


def test_the_first_audit_writes_the_archive_and_a_damaged_one_is_ignored(tmp_path: Path) -> None:
    trace = write_case(tmp_path / "trace", "clean", base=84_000)
    cache = tmp_path / "cache"
    first = _audit(trace, cache)
    assert first.returncode == 0, first.stderr
    assert "one-order" in first.stdout and "VIOLATED" not in first.stdout
    archive = archive_path(str(cache))
    assert archive.is_file() and archive.stat().st_size > 1_000_000, list(cache.rglob("*"))
    assert [entry.name for entry in archive.parent.iterdir()] == [archive.name]  # nothing half-written left
    archive.chmod(0o600)
    archive.write_bytes(b"not an archive" * 1000)
    # A JVM started the same way over a damaged archive runs Spark as before and says nothing of it.
    started = subprocess.run([sys.executable, "-c", START_SPARK], capture_output=True, text=True,
                             env={**os.environ, "XDG_CACHE_HOME": str(cache)}, timeout=300)
    assert started.returncode == 0, started.stderr
    assert started.stdout == "3\n"
    assert "cds" not in started.stderr.lower()


def test_the_launch_maps_an_archive_writes_a_missing_one_or_neither(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()
    archive_path().parent.mkdir(parents=True)
    abandoned = archive_path().with_name(f"{archive_path().name}.{ended.pid}.tmp")  # its audit was interrupted
    abandoned.write_bytes(b"half an archive")
    writes = plan_launch(small=False)
    assert not abandoned.exists()
    assert writes.writing is not None and writes.writing.parent == archive_path().parent
    assert f"-XX:ArchiveClassesAtExit={writes.writing}" in writes.options
    assert not any("TieredStopAtLevel" in option for option in writes.options)  # a large input keeps the defaults
    archive_path().write_bytes(b"archive")
    maps = plan_launch(small=True)
    assert maps.writing is None
    assert f"-XX:SharedArchiveFile={archive_path()}" in maps.options and "-XX:TieredStopAtLevel=1" in maps.options
    monkeypatch.setenv(ARCHIVE_ENV, "off")
    assert not any("Archive" in option for option in plan_launch(small=True).options)


def test_writing_an_archive_keeps_only_the_newest_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every install (a clone's virtual environment, an upgrade) writes an archive of its own: writing one removes
    all but the newest KEPT_ARCHIVES of the others, and leaves what is not an archive alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = archive_path().parent
    cache.mkdir(parents=True)
    others = [cache / f"spark-classes-{i:016x}.jsa" for i in range(KEPT_ARCHIVES + 3)]
    for age, path in enumerate(reversed(others)):
        path.write_bytes(b"archive")
        os.utime(path, (1_700_000_000 - age * 3600, 1_700_000_000 - age * 3600))
    unrelated = cache / "notes.txt"
    unrelated.write_text("kept")
    writes = plan_launch(small=True)
    assert writes.writing is not None
    assert sorted(cache.glob("spark-classes-*.jsa")) == others[-KEPT_ARCHIVES:]
    assert unrelated.exists()


def test_small_local_input_is_measured_before_spark_starts(tmp_path: Path) -> None:
    trace = write_case(tmp_path / "trace", "clean", base=86_000)
    assert is_small_local_input([str(trace)])
    large = tmp_path / "large.jsonl"
    with large.open("wb") as out:
        out.truncate(SMALL_INPUT_BYTES)  # sparse: measured by length, never read
    assert not is_small_local_input([str(trace), str(large)])
    assert not is_small_local_input([str(tmp_path / "missing")])
    assert not is_small_local_input(["hdfs://namenode/journals"])
    assert not is_small_local_input([])


def test_an_install_made_again_at_the_same_path_gets_an_archive_of_its_own(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Java maps an archive only over the jars it was written from: Spark installed again at the same path (a
    virtual environment made again) must not keep the old archive's name, or no audit would ever write a new one."""
    import os

    import pyspark

    install = tmp_path / "pyspark"
    (install / "jars").mkdir(parents=True)
    monkeypatch.setattr(pyspark, "__file__", str(install / "__init__.py"))
    first = archive_path(str(tmp_path / "cache"))
    assert archive_path(str(tmp_path / "cache")) == first
    os.utime(install / "jars", ns=(1, 1))  # the jars installed again
    assert archive_path(str(tmp_path / "cache")) != first
