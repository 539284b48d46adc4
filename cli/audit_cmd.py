"""`rmp audit`: check captured journals (and wire captures) against the RMP invariants with PySpark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

audit_app = typer.Typer()


@audit_app.command("audit")
def audit(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Journal files or directories (searched recursively); any Spark URI.")
    ] = None,
    master: Annotated[
        str, typer.Option(envvar="RMP_AUDIT_MASTER", help="Spark master: local[*], spark://host:7077, ...")
    ] = "local[*]",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report, with examples, as JSON here.")
    ] = None,
    examples: Annotated[int, typer.Option(min=0, help="Example violations kept per invariant.")] = 5,
    pcap: Annotated[
        list[str] | None, typer.Option(help="tcpdump capture (classic libpcap) to check on the wire; repeatable.")
    ] = None,
    auth_key: Annotated[
        Path | None, typer.Option(help="The group key file (rmpd keygen) of a keyed group's --pcap captures: opens "
                                       "encrypted datagrams and checks every MAC.")
    ] = None,
    spark_log: Annotated[
        str, typer.Option(help="Also show Spark's own log on stderr at this level: off, error, warn, info or debug "
                               "(it is always kept in a file, named when Spark fails).")
    ] = "off",
) -> None:
    """Audit journals from many hosts: one verdict per invariant.

    Exit status: 0 every invariant holds, 1 some invariant is violated, 2 the input could not be read (or the
    master cannot be used), 3 Spark failed for another reason.
    """
    from rmpd.audit.inputs import (
        EXIT_UNREADABLE,
        INSTALL_HINT,
        JOURNAL_SUFFIXES,
        SPARK_LOG_LEVELS,
        UnreadableInput,
        UnusableMaster,
        check_local,
        check_master,
    )
    from rmpd.keyfile import load_key_file
    from rmpd.wire.sealing import AuthKeyError

    err = Console(stderr=True)
    if not paths and not pcap:
        err.print("[red]error:[/red] give at least one journal PATH or --pcap FILE")
        raise typer.Exit(EXIT_UNREADABLE)
    if spark_log not in SPARK_LOG_LEVELS:
        err.print(f"[red]error:[/red] --spark-log must be off, error, warn, info or debug, got {escape(spark_log)!r}")
        raise typer.Exit(EXIT_UNREADABLE)
    key = None
    if auth_key is not None:
        try:
            key = load_key_file(auth_key)
        except AuthKeyError as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(EXIT_UNREADABLE) from None
    try:
        check_local(list(paths or []), list(pcap or []))
    except UnreadableInput as exc:  # answered before Spark starts, which takes seconds
        err.print(f"[red]unreadable input:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_UNREADABLE) from None
    try:
        check_master(master)
    except UnusableMaster as exc:  # Spark would print pages of Java, after a minute for an unreachable master
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(EXIT_UNREADABLE) from None
    try:
        # Spark is imported here so that `rmp --help` and the other commands start fast, and run without it.
        from rmpd.audit import columnar
        from rmpd.audit.job import audit_and_report
        from rmpd.audit.jvm import is_small_local_input, plan_launch
        from rmpd.audit.session import get_session
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("pyspark", "py4j"):
            raise
        err.print(f"[red]error:[/red] {escape(INSTALL_HINT)}", soft_wrap=True)
        raise typer.Exit(EXIT_UNREADABLE) from None
    small = is_small_local_input([*(paths or []), *(pcap or [])])
    if columnar.wanted(small):
        columnar.copy_early(list(paths or []), JOURNAL_SUFFIXES)
    jvm = plan_launch(small=small)
    status = audit_and_report(
        lambda: get_session(master, spark_log=spark_log, jvm=jvm), list(paths or []), list(pcap or []), examples,
        key, None if json_out is None else str(json_out), Console(soft_wrap=True), err,
    )
    jvm.finish()
    raise typer.Exit(status)
