"""How the auditor starts Spark's JVM: with a class-data archive of the classes Spark loads, and, for a small input,
with the compiler that starts quickest.

A local audit starts a JVM that loads some twenty thousand classes before it reads a record: on two cores that is
most of a small audit's time.  A class-data sharing archive (JDK 13 and later: ``-XX:ArchiveClassesAtExit``, then
``-XX:SharedArchiveFile``) maps those classes, already parsed and verified, instead of loading them again.  The
first local audit writes the archive when its JVM exits; every later one maps it.  The JVM checks an archive
against itself and its class path and ignores one that does not match (a Java or Spark upgrade), silently: the
archive is a cache, never a condition.  A small input is audited in seconds, before the optimising compiler would
pay for itself, so its JVM compiles with the first tier only and uses the serial collector; a large one keeps the
JVM's defaults, whose compiled code and parallel collector its minutes need.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

import pyspark
from py4j.java_gateway import JavaGateway
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway

from .job import SMALL_INPUT_BYTES

ARCHIVE_ENV = "RMP_AUDIT_CLASS_ARCHIVE"
"""``off`` starts the JVM without a class-data archive (neither mapping nor writing one)."""

_QUIET_ARCHIVE = "-Xlog:cds*=off"
"""The JVM tells on stdout which classes it could not archive; stdout is the verdict's."""

_QUICK_START = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

ARCHIVE_GENERATION = 3
"""Part of the archive's name: raised when the audit changes what Spark loads (generation 2: checks as SQL text,
which loads Spark's SQL parser; 3: checks in Python tasks, which load Spark's Arrow and Python runners instead of
most SQL operators), so that an upgraded auditor writes an archive of its own classes instead of mapping one that
lacks them."""


class JvmLaunch:
    """Starts the JVM of one audit with its options and, if it writes the archive, puts the archive in place once
    the JVM has exited."""

    def __init__(self, options: tuple[str, ...], writing: Path | None = None, archive: Path | None = None) -> None:
        self.options = options
        self.writing = writing
        """The file the JVM writes the archive to as it exits; renamed to ``archive`` once the JVM is gone."""
        self.archive = archive
        self.gateway: JavaGateway | None = None

    def launch(self, conf: SparkConf) -> JavaGateway:
        """Start the JVM (PySpark's gateway) for a SparkContext made with ``conf``, with this launch's options."""
        given = conf.get("spark.driver.extraJavaOptions", "") or ""
        conf.set("spark.driver.extraJavaOptions", " ".join((given, *self.options)).strip())
        self.gateway = launch_gateway(conf)
        return self.gateway

    def finish(self, timeout: float = 120.0) -> None:
        """Once the audit is over: if this JVM writes the archive, stop Spark, end the JVM, wait for the archive and
        put it in place whole (an audit must never map half a file); else let the JVM exit with this process."""
        if self.writing is None or self.archive is None:
            return
        proc = getattr(self.gateway, "proc", None)
        try:
            # An archive not written only makes the next start slower: nothing here may fail the audit.
            with contextlib.suppress(Exception):
                if proc is not None:
                    SparkContext.getOrCreate().stop()
                    proc.stdin.close()  # the gateway ends its JVM when its stdin closes; the JVM writes as it exits
                    proc.wait(timeout=timeout)
                    if self.writing.is_file():
                        os.replace(self.writing, self.archive)
        finally:
            self.writing.unlink(missing_ok=True)


def is_small_local_input(paths: list[str]) -> bool:
    """Whether ``paths`` are local files and directories that hold, together, less than the auditor's small input
    (``SMALL_INPUT_BYTES``): known before Spark starts.  A path this cannot measure (another file system's URL, a
    missing file) makes the input large: the reader says what is wrong with it."""
    total = 0
    try:
        for path in map(Path, paths):
            if path.is_dir():
                total += sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())
            else:
                total += path.stat().st_size
    except OSError:
        return False
    return bool(paths) and total < SMALL_INPUT_BYTES


def archive_path(cache_home: str | None = None) -> Path:
    """Where the archive of this Java and this Spark lives: a cache file (under ``cache_home``, by default the
    XDG cache directory), named for both and for when Spark's jars were installed, so that an upgrade of either, or
    an environment made again at the same path, writes a new one instead of each start trying the stale one (Java
    silently declines an archive whose jars changed)."""
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    spark_home = Path(pyspark.__file__).parent
    try:  # Java maps an archive only over the very jars it was written from; a reinstall replaces them
        jars = (spark_home / "jars").stat().st_mtime_ns
    except OSError:
        jars = 0
    identity = f"{java.resolve()}|{pyspark.__version__}|{spark_home}|{jars}|{ARCHIVE_GENERATION}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cache = Path(cache_home or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rmpd" / f"spark-classes-{digest}.jsa"


def plan_launch(small: bool) -> JvmLaunch:
    """How to start the JVM: map the archive if there is one, else write it at exit (when the cache directory can be
    made); start quickly for a small input."""
    options = list(_QUICK_START) if small else []
    if os.environ.get(ARCHIVE_ENV, "").lower() == "off":
        return JvmLaunch(tuple(options))
    archive = archive_path()
    if archive.is_file():
        return JvmLaunch((*options, f"-XX:SharedArchiveFile={archive}", _QUIET_ARCHIVE))
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return JvmLaunch(tuple(options))
    _remove_abandoned(archive)
    _remove_oldest(archive)
    writing = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    return JvmLaunch((*options, f"-XX:ArchiveClassesAtExit={writing}", _QUIET_ARCHIVE), writing, archive)


KEPT_ARCHIVES = 4
"""Archives of other installs kept in the cache directory when a new one is written: one is written per Java, Spark
and install of rmpd (every virtual environment has a PySpark path of its own), some 170 MB each, and one that an
upgrade or a removed install left behind would otherwise stay for ever."""


def _remove_oldest(archive: Path) -> None:
    """Remove all but the ``KEPT_ARCHIVES`` newest archives beside ``archive`` (about to be written): an install
    whose archive goes only writes it again at its next audit (the archive is a cache), and a JVM that maps one
    keeps its mapping."""
    others = []
    for path in archive.parent.glob("spark-classes-*.jsa"):
        with contextlib.suppress(OSError):
            others.append((path.stat().st_mtime, path))
    for _, path in sorted(others, reverse=True)[KEPT_ARCHIVES:]:
        with contextlib.suppress(OSError):
            path.unlink()


def _remove_abandoned(archive: Path) -> None:
    """Remove archives being written by audits that are gone (interrupted before their JVM finished): each is the
    size of an archive, and none will ever be complete."""
    for partial in archive.parent.glob(f"{archive.name}.*.tmp"):
        writer = partial.suffixes[-2].lstrip(".")
        with contextlib.suppress(ValueError, OSError):
            try:
                os.kill(int(writer), 0)
            except ProcessLookupError:
                partial.unlink()
