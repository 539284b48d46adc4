"""The command lines: the nemesis itself (``scripts/nemesis``) and, with ``client`` first, one host's client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import trio
import typer
from rich.console import Console

from .client import client_main
from .cluster import GROUP, Options
from .keyed import keyed_client_main
from .report import summary
from .run import Interrupted, run

app = typer.Typer(add_completion=False, help="Faults on namespace hosts running rmpd, and what became of every "
                                            "message (needs root).")


@app.command()
def main(
    hosts: Annotated[int, typer.Option(min=2, max=20, help="Namespace hosts, one rmpd each.")] = 3,
    seconds: Annotated[float, typer.Option(min=5, help="Seconds of faults.")] = 180.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 1,
    loss: Annotated[float, typer.Option(min=0, max=0.9, help="Loss end to end between faults.")] = 0.10,
    rate: Annotated[float, typer.Option(min=0.1, help="Messages a second from each host's client.")] = 10.0,
    workdir: Annotated[Path | None, typer.Option("--dir", help="Working directory (default: a new temporary "
                                                               "one, kept).")] = None,
    config: Annotated[Path | None, typer.Option(help="rmpd TOML config for every daemon.")] = None,
    min_partition: Annotated[str | None, typer.Option(help="rmp join --min-partition.")] = None,
    converge_timeout: Annotated[float, typer.Option(help="Seconds to wait for one view at the end.")] = 120.0,
    drain: Annotated[float, typer.Option(help="Seconds the clients wait for outcomes after they stop.")] = 30.0,
    no_audit: Annotated[bool, typer.Option("--no-audit", help="Skip rmp audit.")] = False,
    master: Annotated[str, typer.Option(help="Spark master for rmp audit.")] = "local[2]",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout (the table goes to "
                                                         "stderr).")] = False,
    exactly_once: Annotated[bool, typer.Option("--exactly-once", help="Keyed messages, each sent again until "
                                               "confirmed, min partition majority unless given; no fault that "
                                               "stops every host at once.")] = False,
) -> None:
    """Run the nemesis once; exit 0 when the hosts end in one view, nothing was lost without a report and the
    audit is clean."""
    if os.geteuid() != 0:
        Console(stderr=True).print("nemesis: network namespaces need root")
        raise typer.Exit(2)
    if exactly_once and min_partition is None:
        min_partition = "majority"  # each key delivered at most once holds with a majority (or all) minimum
    options = Options(hosts=hosts, seconds=seconds, seed=seed, loss=loss, rate=rate, workdir=workdir,
                      config=config, min_partition=min_partition, converge_timeout=converge_timeout, drain=drain,
                      audit=not no_audit, master=master, exactly_once=exactly_once)
    errors = Console(stderr=True)
    try:
        report = run(options, errors)
    except Interrupted as exc:
        errors.print(f"nemesis: stopped by {exc}; daemons, clients and namespaces removed")
        raise typer.Exit(130) from None
    if as_json:
        errors.print(summary(report))
        print(json.dumps(report))
    else:
        Console().print(summary(report))
    raise typer.Exit(0 if report["ok"] else 1)


client_app = typer.Typer(add_completion=False)


@client_app.command()
def client(
    host: Annotated[int, typer.Option()],
    socket: Annotated[Path, typer.Option()],
    out: Annotated[Path, typer.Option()],
    group: Annotated[str, typer.Option()] = GROUP,
    rate: Annotated[float, typer.Option()] = 10.0,
    drain: Annotated[float, typer.Option()] = 30.0,
    exactly_once: Annotated[bool, typer.Option("--exactly-once")] = False,
) -> None:
    """One host's client (run inside its namespace by the nemesis)."""
    trio.run(keyed_client_main if exactly_once else client_main, host, socket, group, rate, out, drain)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_app(sys.argv[2:], prog_name="nemesis client")
    else:
        app()
