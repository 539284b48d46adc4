"""The audit job: read, check, report.  Also runnable with ``spark-submit rmpd/audit/job.py PATH...``.

Under ``spark-submit`` the master and resources come from spark-submit's own options; the ``rmpd`` package must be
importable by the driver (installed, or shipped with ``--py-files``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from rich.console import Console

from rmpd.runtime.auth import AuthKeyError, GroupKey, load_key_file

from .inputs import EXIT_UNREADABLE
from .invariants import journal_checks
from .read import UnreadableInput, read_journals
from .report import AuditReport, InvariantResult, evaluate, render
from .shared import release


def run_audit(
    spark: SparkSession, paths: list[str], pcaps: list[str] | None = None, examples: int = 5,
    key: GroupKey | None = None,
) -> AuditReport:
    """Audit journals at ``paths`` and captures at ``pcaps`` (of a keyed group: ``key`` opens and checks its
    datagrams); raises :class:`UnreadableInput`."""
    results: list[InvariantResult] = []
    records = 0
    inputs: list[str] = []
    if paths:
        journals = read_journals(spark, paths)
        try:
            _, results = evaluate(journal_checks(journals.records), examples)
        finally:
            release(journals.records)
            journals.release()
        records = journals.count
        inputs += paths
    if pcaps:
        from .pcap import wire_checks

        packets, checks = wire_checks(spark, pcaps, key)
        try:
            n, wire = evaluate(checks, examples, packets)
        finally:
            packets.unpersist()
        records += n
        results += wire
        inputs += pcaps
    return AuditReport(inputs, records, results)


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
    spark = SparkSession.builder.appName("rmp-audit").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    try:
        key = load_key_file(Path(args.auth_key)) if args.auth_key else None
        report = run_audit(spark, args.paths, args.pcap, args.examples, key)
    except AuthKeyError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_UNREADABLE
    except UnreadableInput as exc:
        err.print(f"[red]unreadable input:[/red] {exc}")
        return EXIT_UNREADABLE
    render(report, Console())
    if args.json_out:
        report.write_json(args.json_out)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
