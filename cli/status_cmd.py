"""`rmp status`: what the local daemon is, which groups it is in, and its counters (drops, malformed input)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .client_common import JsonOption, emit_json, run_with_client

status_app = typer.Typer()


@status_app.command("status")
def status(ctx: typer.Context, json_out: Annotated[bool, JsonOption] = False) -> None:
    """Show the daemon's process ID, groups, clients and counters."""
    reply = run_with_client(ctx, lambda client: client.status())
    reply.pop("id", None)
    reply.pop("ok", None)
    if json_out:
        emit_json(reply)
        return
    console = Console()
    console.print(f"rmpd {reply['pid']}  socket {reply['socket']}  clients {reply['clients']}", highlight=False)
    if reply.get("metrics"):
        console.print(f"metrics on http://{reply['metrics']}/metrics", highlight=False)
    auth = reply.get("auth") or {}
    if auth.get("keyed"):
        mode = "encrypted" if auth.get("encrypt") else "signed"
        console.print(f"group traffic {mode} with key {auth['key_id']}", highlight=False)
    for source, count in (auth.get("unverified_sources") or {}).items():
        console.print(f"[yellow]{count} datagram(s) from {source} could not be verified[/yellow]")
    table = Table(title="groups")
    for column in ("group", "view", "members", "local clients", "persistent", "locks", "calls (SCMP)"):
        table.add_column(column)
    for g in reply["groups"]:
        # The minimum partition goes under the group's name: one more column squeezes the SCMP one in 80 columns.
        name = g["group"] + (f"\nmin partition {g['min_partition']}" if g.get("min_partition") is not None else "")
        table.add_row(name, g["view"] or "(joining)", "\n".join(g["members"]), str(g["clients"]),
                      "yes" if g["persistent"] else "no", ", ".join(map(str, g["locks"])), _scmp(g.get("scmp")))
    console.print(table)
    counters = Table(title="counters")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in reply["counters"].items():
        counters.add_row(name, str(value))
    console.print(counters)


def _scmp(scmp: dict | None) -> str:
    """The group's SCMP filters in a few words: the calls' lifetime estimate, what it accepted and refused, and the
    join requests refused here."""
    if not scmp:
        return ""
    joins = scmp.get("joins_refused", 0) + scmp.get("joins_too_early", 0)
    return (f"lifetime {scmp['lifetime_ms']} ms ({scmp['estimator']})\n"
            f"accepted {scmp['new']}, duplicate {scmp['duplicate']}\n"
            f"summary-rejected {scmp['summary-rejected']}, too early {scmp['too-early']}\n"
            f"joins refused {joins}")
