"""`rmp status`: what the local daemon is, which groups it is in, and its counters (drops, malformed input)."""

from __future__ import annotations

from typing import Annotated

import trio
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rmpd.client import Client

from .client_common import JsonOption, emit_json, run_with_client

status_app = typer.Typer()


RATES = (
    ("delivered", ("delivered",)),
    ("datagrams in", ("datagrams_received_multicast", "datagrams_received_unicast")),
    ("datagrams out", ("datagrams_sent",)),
    ("retransmissions", ("data_retransmits", "ack_retransmits")),
    ("NACKs sent", ("nacks_sent", "gap_nacks_sent", "tail_nacks_sent")),
    ("dropped", ("malformed", "other_view", "auth_rejected", "send_dropped")),
)
"""What ``--watch`` shows per second: a label and the counters summed for it."""


@status_app.command("status")
def status(
    ctx: typer.Context,
    json_out: Annotated[bool, JsonOption] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Keep showing groups, members and rates; Ctrl-C ends.")]
    = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes with --watch.")] = 1.0,
    count: Annotated[int, typer.Option(min=0, help="With --watch: stop after this many refreshes (0: never).")] = 0,
) -> None:
    """Show the daemon's process ID, groups, clients and counters."""
    if watch:
        _watch(ctx, interval, count)
        return
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


def _watch(ctx: typer.Context, interval: float, count: int) -> None:
    """One connection, a status request every ``interval``, redrawn in place; rates from the counters' change."""
    console = Console()

    async def body(client: Client) -> None:
        previous: tuple[float, dict[str, int]] | None = None
        shown = 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                reply = await client.status()
                now = trio.current_time()
                live.update(_watch_view(reply, previous, now), refresh=True)
                previous = (now, reply["counters"])
                shown += 1
                if count and shown >= count:
                    return
                await trio.sleep(interval)

    run_with_client(ctx, body)


def _watch_view(reply: dict, previous: tuple[float, dict[str, int]] | None, now: float) -> Group:
    head = Text(f"rmpd {reply['pid']}  clients {reply['clients']}", style="bold")
    groups = Table(box=None, pad_edge=False)
    for column in ("group", "members", "view"):
        groups.add_column(column, overflow="fold")
    for g in reply["groups"]:
        groups.add_row(g["group"], "\n".join(g["members"]) or "-", g["view"] or "(joining)")
    rates = Table(box=None, pad_edge=False)
    rates.add_column("per second")
    rates.add_column("", justify="right")
    counters = reply["counters"]
    for label, names in RATES:
        total = sum(counters.get(n, 0) for n in names)
        if previous is None or now <= previous[0]:
            shown = "..."
        else:
            before = sum(previous[1].get(n, 0) for n in names)
            shown = f"{(total - before) / (now - previous[0]):,.1f}/s"
        rates.add_row(label, shown)
    return Group(head, groups if reply["groups"] else Text("in no group"), Text(""), rates)
