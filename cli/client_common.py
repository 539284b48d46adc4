"""What every `rmp` command that talks to the daemon shares: finding the socket, running trio, one-line errors.

Data goes to stdout (JSON with --json), diagnostics to stderr; a refused request or an unreachable daemon is one
line on stderr and exit status 1.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio
import typer
from rich.console import Console

from rmpd.client import Client, RmpdError, connect

T = TypeVar("T")

err = Console(stderr=True, soft_wrap=True)


def socket_path(ctx: typer.Context) -> Path | None:
    """The --socket given to `rmp` (or $RMPD_SOCKET), if any; the library's default otherwise."""
    obj = ctx.find_root().obj
    return obj.get("socket") if isinstance(obj, dict) else None


def run_with_client(ctx: typer.Context, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect, run ``body``, and turn any refusal into one line and exit 1."""

    async def main() -> T:
        async with connect(socket_path(ctx)) as client:
            return await body(client)

    try:
        return trio.run(main)
    except RmpdError as exc:
        err.print(f"[red]error:[/red] {exc.code}: {exc.message}", highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def bytes_json(name: str, data: bytes) -> dict[str, str]:
    """``data`` as one JSON field that gives back its exact bytes: ``name`` holds the text when the bytes are valid
    UTF-8, ``name_b64`` (standard base64) holds them otherwise; never both."""
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}


def emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, separators=(",", ":")))


JsonOption = typer.Option("--json", help="Print JSON on stdout instead of text.")
