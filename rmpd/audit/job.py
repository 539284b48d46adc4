"""The audit job: read, check, report.  Also runnable with ``spark-submit rmpd/audit/job.py PATH...``.

Under ``spark-submit`` the master and resources come from spark-submit's own options; the ``rmpd`` package must be
importable by the driver (installed, or shipped with ``--py-files``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from pyspark.sql import SparkSession
from rich.console import Console
from rich.markup import escape

from rmpd.keyfile import load_key_file
from rmpd.wire.sealing import AuthKeyError, GroupKey

from . import grouped
from .inputs import EXIT_SPARK_FAILED, EXIT_UNREADABLE
from .progress import Progress
from .read import UnreadableInput, read_journals
from .report import AuditReport, InvariantResult, render
from .session import log_file


def run_audit(
    spark: SparkSession, paths: list[str], pcaps: list[str] | None = None, examples: int = 5,
    key: GroupKey | None = None, progress: Progress | None = None,
) -> AuditReport:
    """Audit journals at ``paths`` and captures at ``pcaps`` (of a keyed group: ``key`` opens and checks its
    datagrams), telling ``progress`` what it is doing; raises :class:`UnreadableInput`."""
    with sized_for_input(spark, [*paths, *(pcaps or [])]) as small:
        return _run_audit(spark, paths, pcaps, examples, key, progress, small)


SMALL_INPUT_BYTES = 16 * 1024 * 1024
"""Input below this (about sixty thousand journal records) is audited with the settings of ``SMALL_INPUT``."""

SMALL_INPUT = {
    # Compiling generated Java for every operator costs more than it saves on a few thousand rows; the results are
    # the same.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # Planning once, without adaptive re-planning, is faster when every stage is a few rows.
    "spark.sql.adaptive.enabled": "false",
    # What is shuffled (the splits' counts) is a few rows: one task does it.
    "spark.sql.shuffle.partitions": "1",
}
"""Session settings for a small input (set for the audit, then put back: a session may be shared)."""


@contextlib.contextmanager
def sized_for_input(spark: SparkSession, paths: list[str]) -> Iterator[bool]:
    """Run the audit with settings that suit the input's size, yielding whether it is small: a small input gets
    ``SMALL_INPUT``, and as many read partitions as worker threads (a few per thread only pay off when each has
    much to do)."""
    if not paths or input_bytes(spark, paths) >= SMALL_INPUT_BYTES:
        yield False
        return
    threads = str(spark.sparkContext.defaultParallelism)
    wanted = {**SMALL_INPUT, "spark.sql.files.minPartitionNum": threads}
    before = {name: spark.conf.get(name, None) for name in wanted}
    for name, value in wanted.items():
        spark.conf.set(name, value)
    try:
        yield True
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def input_bytes(spark: SparkSession, paths: list[str]) -> int:
    """Bytes under ``paths`` (files, or directories counted whole), through Hadoop's FileSystem like the reader;
    a path that cannot be measured counts as large (the reader then says what is wrong with it)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    total = 0
    for text in paths:
        try:
            path = jvm.org.apache.hadoop.fs.Path(text)
            total += path.getFileSystem(conf).getContentSummary(path).getLength()
        except Exception:  # py4j wraps every JVM error; any of them means "unknown size"
            return SMALL_INPUT_BYTES
    return total


def _run_audit(spark: SparkSession, paths: list[str], pcaps: list[str] | None, examples: int,
               key: GroupKey | None, progress: Progress | None, small: bool) -> AuditReport:
    results: list[InvariantResult] = []
    records = 0
    inputs: list[str] = []
    if paths:
        if progress is not None:
            progress.phase = "reading journals"
        journals = read_journals(spark, paths, one_partition=small)
        if progress is not None:
            progress.phase, progress.records = "checking invariants", journals.count
        try:
            results = [t.result() for t in grouped.audit(spark, journals, examples, small)]
        finally:
            journals.release()
        records = journals.count
        inputs += paths
    if pcaps:
        from .pcap import wire_audit

        if progress is not None:
            progress.phase = "checking captures"
        n, wire = wire_audit(spark, pcaps, key, examples)
        records += n
        results += [t.result() for t in wire]
        inputs += pcaps
    return AuditReport(inputs, records, results)


def audit_and_report(
    start_session: Callable[[], SparkSession], paths: list[str], pcaps: list[str], examples: int,
    key: GroupKey | None, json_out: str | None, out: Console, err: Console,
) -> int:
    """Start Spark, audit, print the verdict on ``out`` and return the exit status; every failure is one line on
    ``err``: unreadable input or an unusable master (``EXIT_UNREADABLE``, naming the file or the master), or Spark
    failing for a reason of its own (``EXIT_SPARK_FAILED``, naming Spark's log file)."""
    spark: SparkSession | None = None
    try:
        spark = start_session()
        with Progress(spark, err.file) as progress:
            report = run_audit(spark, paths, pcaps, examples, key, progress)
    except UnreadableInput as exc:
        err.print(f"[red]unreadable input:[/red] {escape(str(exc))}", soft_wrap=True)
        _drop_log(spark)
        return EXIT_UNREADABLE
    except Exception as exc:  # py4j and PySpark raise many types; each is told in one line, with the log's path
        log = log_file(spark) if spark is not None else None
        where = f" (Spark's log: {log})" if log else ""
        err.print(f"[red]error:[/red] Spark failed: {escape(summary(exc))}{where}", soft_wrap=True)
        return EXIT_SPARK_FAILED
    render(report, out)
    if json_out:
        report.write_json(json_out)
    _drop_log(spark)
    return report.exit_code


def _drop_log(spark: SparkSession | None) -> None:
    """Remove Spark's log file once the audit has ended without Spark failing: it is kept only to be read then."""
    log = log_file(spark) if spark is not None else None
    if log:
        Path(log).unlink(missing_ok=True)


_WRAPPERS = ("Exception thrown in awaitResult",)
"""Java exceptions whose message names no cause of their own: the summary gives the cause they wrap instead."""


def summary(exc: BaseException) -> str:
    """The line of a (usually Java) exception's text that says what went wrong, without its stack trace."""
    lines = [line.strip(" :\t") for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("An error occurred while calling", "at "))]
    named = [line for line in lines if "Exception" in line or "Error" in line]
    # A failure inside a broadcast or a subquery is wrapped in one that says only where it was awaited.
    while len(named) > 1 and named[0].rstrip(" :").endswith(_WRAPPERS):
        named = [line for line in named[1:] if line.startswith("Caused by")] or named[1:]
    text = named[0].removeprefix("Caused by").strip(" :") if named else (lines[0] if lines else "")
    text = text or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit``: same verdict, exit codes and output as ``rmp audit``."""
    parser = argparse.ArgumentParser(prog="rmpd.audit.job", description=__doc__)
    parser.add_argument("paths", nargs="*", help="journal files or directories (any URI Spark reads)")
    parser.add_argument("--json", dest="json_out", help="write the JSON report here")
    parser.add_argument("--examples", type=int, default=5, help="example violations kept per invariant")
    parser.add_argument("--pcap", nargs="+", default=[], help="tcpdump captures (classic libpcap)")
    parser.add_argument("--auth-key", help="the group key file of a keyed group's captures")
    args = parser.parse_args(argv)
    err = Console(stderr=True)
    if not args.paths and not args.pcap:
        parser.error("give at least one journal path or --pcap file")
    try:
        key = load_key_file(Path(args.auth_key)) if args.auth_key else None
    except AuthKeyError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_UNREADABLE
    return audit_and_report(
        lambda: SparkSession.builder.appName("rmp-audit").config("spark.sql.session.timeZone", "UTC").getOrCreate(),
        args.paths, args.pcap, args.examples, key, args.json_out, Console(), err,
    )


if __name__ == "__main__":
    sys.exit(main())
