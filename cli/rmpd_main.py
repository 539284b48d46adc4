"""`rmpd`: the daemon entry point.  One RMP process per host; clients reach it over a Unix socket."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import trio
import typer

from rmpd.daemon.config import ConfigError, load_config
from rmpd.daemon.daemon import run_daemon
from rmpd.daemon.server import SocketInUse

app = typer.Typer(name="rmpd", help="The RMP daemon: one RMP process per host.", add_completion=False)


@app.command()
def run(
    config: Annotated[Path | None, typer.Option("--config", envvar="RMPD_CONFIG",
                                                help="TOML file; flags override its keys.")] = None,
    interface: Annotated[str | None, typer.Option(help="Interface name (e.g. lo, eth0) to bind and join on.")] = None,
    bind: Annotated[str | None, typer.Option(help="IPv4 address to bind and join on, instead of --interface.")] = None,
    port: Annotated[int | None, typer.Option(help="Unicast UDP port (default 7000; 0: any free port).")] = None,
    socket: Annotated[Path | None, typer.Option(
        "--socket", help="Unix socket for local clients [default: $XDG_RUNTIME_DIR/rmpd.sock or /tmp].")] = None,
    journal: Annotated[Path | None, typer.Option(help="Write the journal (docs/trace-format.md) into DIR.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
) -> None:
    """Run the daemon until SIGTERM, which leaves every group and exits 0.  With no options: loopback."""
    overrides = {"interface": interface, "bind": bind, "port": port, "socket": socket, "journal": journal,
                 "log_level": log_level}
    try:
        settings = load_config(config, overrides)
        settings.address()
    except ConfigError as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(level=settings.log_level.upper(), format="rmpd %(levelname)s %(message)s")
    try:
        trio.run(run_daemon, settings)
    except SocketInUse as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"rmpd: cannot start: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    app()
