"""`rmpd`: the daemon entry point.  One RMP process per host; clients reach it over a Unix socket.

``rmpd [OPTIONS]`` runs the daemon; ``rmpd keygen FILE`` writes a group key for ``--auth-key``.
"""

from __future__ import annotations

import errno
import logging
from collections import Counter
from pathlib import Path
from typing import Annotated

import trio
import typer

from cli.version import version_callback
from rmpd.daemon.config import ConfigError, DaemonConfig, load_config
from rmpd.daemon.daemon import run_daemon
from rmpd.daemon.memberships import MembershipFileError
from rmpd.daemon.metrics_http import MetricsAddressError
from rmpd.daemon.server import SocketInUse
from rmpd.runtime.auth import generate_key_file
from rmpd.scmp.latest import LatestStoreError

app = typer.Typer(name="rmpd", help="The RMP daemon: one RMP process per host.", add_completion=False)


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=version_callback("rmpd"),
                                          help="Print the installed version and exit.")] = False,
    config: Annotated[Path | None, typer.Option("--config", envvar="RMPD_CONFIG",
                                                help="TOML file; flags override its keys.")] = None,
    interface: Annotated[str | None, typer.Option(help="Interface name (e.g. lo, eth0) to bind and join on.")] = None,
    bind: Annotated[str | None, typer.Option(help="IPv4 address to bind and join on, instead of --interface.")] = None,
    port: Annotated[int | None, typer.Option(help="Unicast UDP port (default 7000; 0: any free port).")] = None,
    socket: Annotated[Path | None, typer.Option(
        "--socket", help="Unix socket for local clients [default: $XDG_RUNTIME_DIR/rmpd.sock or /tmp].")] = None,
    journal: Annotated[Path | None, typer.Option(help="Write the journal (docs/trace-format.md) into DIR.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    auth_key: Annotated[Path | None, typer.Option(
        help="Group key file (rmpd keygen): sign every datagram, drop every one that is not signed with it.")] = None,
    encrypt: Annotated[bool | None, typer.Option(
        "--encrypt/--no-encrypt", help="Also encrypt datagrams (ChaCha20-Poly1305) under --auth-key.")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        help="Where SCMP's latest and the groups to rejoin are kept across restarts [default: $STATE_DIRECTORY, "
             "/var/lib/rmpd as root, ~/.local/state/rmpd].")] = None,
    metrics: Annotated[str | None, typer.Option(
        help="Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 [default: off].")] = None,
    multicast: Annotated[bool | None, typer.Option(
        "--multicast/--no-multicast",
        help="--no-multicast: this host cannot receive multicast; members send it unicast copies.")] = None,
    via: Annotated[str | None, typer.Option(
        help="A member's process ID (ip:port) that multicasts for this daemon, for a host whose multicasts do not "
             "reach the group.")] = None,
) -> None:
    """Run the daemon until SIGTERM, which leaves every group and exits 0.  With no options: loopback."""
    if ctx.invoked_subcommand is not None:
        return
    overrides = {"interface": interface, "bind": bind, "port": port, "socket": socket, "journal": journal,
                 "log_level": log_level, "auth_key": auth_key, "encrypt": encrypt, "state_dir": state_dir,
                 "metrics": metrics, "multicast": multicast, "via": via}
    try:
        settings = load_config(config, overrides)
        settings.address()
        logging.basicConfig(level=settings.log_level.upper(), format="rmpd %(levelname)s %(message)s")
        guard = settings.guard(Counter())
    except ConfigError as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        trio.run(run_daemon, settings, guard)
    except (SocketInUse, LatestStoreError, MembershipFileError, MetricsAddressError) as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"rmpd: {start_error(exc, settings)}", err=True)
        raise typer.Exit(1) from None


def start_error(exc: OSError, settings: DaemonConfig) -> str:
    """One line saying what could not be had at start, naming the address, and what usually causes it."""
    where = f"UDP {settings.address()}:{settings.port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot bind {where}: address already in use (another rmpd, or another program, on that port? "
                f"stop it, or give this one another --port)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot bind {where}: no such address on this host (check --bind or --interface)"
    return f"cannot start: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")


@app.command()
def keygen(file: Annotated[Path, typer.Argument(help="Where to write the key (must not exist).")]) -> None:
    """Write a fresh 32-byte group key (mode 0400).  Copy it to every host of the group; use it with --auth-key."""
    try:
        made = generate_key_file(file)
    except FileExistsError:
        typer.echo(f"rmpd: {file} exists; refusing to overwrite a key", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"rmpd: cannot write {file}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    if made:
        typer.echo(f"made directory {made[-1]} (mode 0700)")
    typer.echo(f"wrote a new group key to {file} (mode 0400)")


def main() -> None:
    app()
