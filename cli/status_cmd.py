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
    for g in reply["groups"]:
        console.print(_group_block(g))
    if not reply["groups"]:
        console.print("in no group")
    counters = Table(title="counters")
    counters.add_column("counter")
    counters.add_column("value", justify="right")
    for name, value in reply["counters"].items():
        counters.add_row(name, str(value))
    console.print(counters)


def _group_block(g: dict) -> Table:
    """One group as label/value rows: a process ID never cut, long values wrapped between words, so the whole of
    it reads at 80 columns."""
    block = Table.grid(padding=(0, 2))
    block.add_column(style="bold", no_wrap=True)
    block.add_column(overflow="fold")
    block.add_row("group", g["group"])
    block.add_row("view", g["view"] or "(joining)")
    block.add_row(f"members ({len(g['members'])})", "\n".join(g["members"]) or "-")
    if g.get("min_partition") is not None:
        block.add_row("min partition", str(g["min_partition"]))
    block.add_row("local clients", f"{g['clients']}, {'persistent' if g['persistent'] else 'not persistent'}")
    block.add_row("locks held", ", ".join(map(str, g["locks"])) or "-")
    if g.get("scmp"):
        block.add_row("calls (SCMP)", _scmp(g["scmp"]))
    block.add_row("", "")
    return block


def _scmp(scmp: dict) -> str:
    """The group's SCMP filters in a few words: the calls' lifetime estimate, what it accepted and refused, and the
    join requests refused here."""
    joins = scmp.get("joins_refused", 0) + scmp.get("joins_too_early", 0)
    return (f"lifetime {scmp['lifetime_ms']} ms ({scmp['estimator']}); accepted {scmp['new']}, duplicate "
            f"{scmp['duplicate']}, summary-rejected {scmp['summary_rejected']}, too early {scmp['too_early']}; "
            f"joins refused {joins}")
