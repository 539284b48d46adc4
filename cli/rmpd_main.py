"""`rmpd`: the daemon entry point.  One RMP process per host; clients reach it over a Unix socket.

``rmpd [OPTIONS]`` runs the daemon; ``rmpd keygen FILE`` writes a group key for ``--auth-key``.
"""

from __future__ import annotations

import errno
import inspect
import logging
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import trio
import typer

from cli.version import version_callback
from rmpd.daemon.config import KEYS, ConfigError, DaemonConfig, Key, default_of, load_config
from rmpd.daemon.daemon import run_daemon
from rmpd.daemon.memberships import MembershipFileError
from rmpd.daemon.metrics_http import MetricsAddressError
from rmpd.daemon.server import SocketInUse
from rmpd.keyfile import generate_key_file
from rmpd.scmp.latest import LatestStoreError

app = typer.Typer(name="rmpd", help="The RMP daemon: one RMP process per host.", add_completion=False)


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=version_callback("rmpd"),
                                          help="Print the installed version and exit.")] = False,
    config: Annotated[Path | None, typer.Option("--config", envvar="RMPD_CONFIG",
                                                help="TOML file; flags override its keys.")] = None,
    **flags: Any,
) -> None:
    """Run the daemon until SIGTERM, which leaves every group and exits 0; SIGHUP reloads the config (log level,
    kept groups, metrics).  With no options: loopback."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        settings = load_settings(ctx.params)
        settings.address()
        logging.basicConfig(level=settings.log_level.upper(), format="rmpd %(levelname)s %(message)s")
        guard = settings.guard(Counter())
    except ConfigError as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        trio.run(run_daemon, settings, guard, partial(load_settings, dict(ctx.params)))
    except (SocketInUse, LatestStoreError, MembershipFileError, MetricsAddressError) as exc:
        typer.echo(f"rmpd: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"rmpd: {start_error(exc, settings)}", err=True)
        raise typer.Exit(1) from None


FLAG_TYPES: dict[str, Any] = {"text": str, "path": Path, "int": int, "number": float, "switch": bool, "mode": str,
                              "entries": list[str], "table": list[str]}
"""The type click reads each kind of key's flag as (rmpd.daemon.config.Key.kind); the config does the rest."""


def key_option(key: Key) -> inspect.Parameter:
    """The flag of one config key: not given (None) unless typed, so the file's key or the default stands."""
    decls = [f"{key.flag}/--no-{key.flag[2:]}"] if key.kind == "switch" else [key.flag]
    default = default_of(key)
    shown = f" (default: {default})" if default is not None else ""
    metavar = {"table": "NAME=VALUE", "entries": "GROUP", "mode": "MODE"}.get(key.kind)
    option = typer.Option(*decls, help=key.help + shown, metavar=metavar, show_default=False)
    annotation = Annotated[FLAG_TYPES[key.kind] | None, option]
    return inspect.Parameter(key.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


_declared = inspect.signature(run, eval_str=True)
run.__signature__ = _declared.replace(  # type: ignore[attr-defined]
    parameters=[p for p in _declared.parameters.values() if p.kind != p.VAR_KEYWORD] + [key_option(k) for k in KEYS])


def load_settings(params: dict[str, Any]) -> DaemonConfig:
    """The daemon's settings from its parsed command line: the ``--config`` file, then the flags on top."""
    return load_config(params.get("config"), {key.name: params.get(key.name) for key in KEYS})


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
