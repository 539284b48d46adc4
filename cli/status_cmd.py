"""`rmp status`: what the local daemon is, which groups it is in, and its counters (drops, malformed input)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import trio
import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rmpd.client import Client
from rmpd.daemon.group_status import DEFAULT_GATHER_TIMEOUT, MAX_GATHER_TIMEOUT

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
    group: Annotated[str | None, typer.Argument(help="Show this group only.")] = None,
    every_member: Annotated[bool, typer.Option(
        "--all", help="Every member's status of GROUP, gathered through the group.")] = False,
    timeout: Annotated[float, typer.Option(
        min=0.1, max=MAX_GATHER_TIMEOUT, help="With --all: seconds to wait for the members' answers.")]
    = DEFAULT_GATHER_TIMEOUT,
    json_out: Annotated[bool, JsonOption] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Keep showing groups, members and rates; Ctrl-C ends.")]
    = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes with --watch.")] = 1.0,
    count: Annotated[int, typer.Option(min=0, help="With --watch: stop after this many refreshes (0: never).")] = 0,
) -> None:
    """Show the daemon's process ID, groups, clients and counters (with --all, every member's status of GROUP)."""
    if every_member:
        if group is None:
            raise typer.BadParameter("--all needs a GROUP", param_hint="--all")
        _every_member(ctx, group, timeout, json_out)
        return
    if watch:
        _watch(ctx, interval, count)
        return
    fields = {} if group is None else {"group": group}
    reply = run_with_client(ctx, lambda client: client.request("status", **fields))
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
    other_form = "signed but not encrypted" if auth.get("encrypt") else "encrypted"
    for source, count in (auth.get("mismatched_sources") or {}).items():
        console.print(f"[yellow]{count} datagram(s) from {source} refused: {other_form} under this key, and every "
                      f"member of a group must have the same encrypt setting[/yellow]")
    for g in reply["groups"]:
        console.print(_group_block(g))
    if not reply["groups"]:
        console.print("in no group" if group is None else f"not in {group}", highlight=False)
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
    if g.get("address"):
        block.add_row("address", g["address"])
    block.add_row("view", g["view"] or "(joining)")
    if g.get("quorum"):
        block.add_row("quorum", _quorum(g["quorum"]))
    block.add_row(f"members ({len(g['members'])})", "\n".join(g["members"]) or "-")
    if g.get("min_partition") is not None:
        block.add_row("min partition", str(g["min_partition"]))
    block.add_row("local clients", f"{g['clients']}, {'persistent' if g['persistent'] else 'not persistent'}"
                  + "".join(f"\n{_client(c)}" for c in g.get("local_clients", ())))
    block.add_row("locks held", ", ".join(map(str, g["locks"])) or "-")
    if g.get("scmp"):
        block.add_row("calls (SCMP)", _scmp(g["scmp"]))
    block.add_row("", "")
    return block


QUORUM_WORDS = {
    "operational": "quorate",
    "reforming": "quorate, reforming (nothing delivered until the next view)",
    "below-minimum": "NOT QUORATE: the reformation found {members} member(s), the minimum partition needs {needed}",
    "blocked": "BLOCKED below the minimum partition: {members} member(s) of the last view asking, {needed} needed",
    "rejoining": "not in a view: rejoining",
    "joining": "not in a view yet: joining",
    "leaving": "leaving",
}
"""``rmp status``'s words for each quorum state (rmpd.protocol.quorum)."""


def _quorum(quorum: dict) -> Text:
    """A group's quorum in words: quorate (and how many of its members a next view needs), or why not."""
    words = QUORUM_WORDS.get(str(quorum.get("state")), str(quorum.get("state")))
    text = words.format(members=quorum.get("members"), needed=quorum.get("needed"))
    if quorum.get("state") in ("operational", "reforming"):
        text += f"; a next view needs {quorum.get('needed')} of its {quorum.get('members')}"
    return Text(text, style="" if quorum.get("quorate") else "bold red")


def _client(client: dict) -> str:
    """One local client: its connection number, process ID and user (as the client socket reported them)."""
    pid = "?" if client.get("pid") is None else client["pid"]
    uid = "?" if client.get("uid") is None else client["uid"]
    return f"client {client.get('client')}: pid {pid}, uid {uid}"


def _every_member(ctx: typer.Context, group: str, timeout: float, json_out: bool) -> None:
    """``rmp status G --all``: one row per member of the daemon's view of G, as each member answered through the
    group; a member that did not answer within ``timeout`` says so, and the command exits 1."""
    reply = run_with_client(ctx, lambda client: client.request("status", group=group, all=True,
                                                               timeout=float(timeout)))
    reply.pop("id", None)
    reply.pop("ok", None)
    if json_out:
        emit_json(reply)
    else:
        console = Console()
        views = Counter(str(row.get("view")) for row in reply["members"] if row.get("answered") and row.get("view"))
        common = views.most_common(1)[0][0] if views else None
        console.print(f"{reply['group']}: {reply['answered']} of {reply['asked']} member(s) answered"
                      + (f"; view {common}" if common else ""), highlight=False)
        console.print(_members_table(reply, common))
    if reply["answered"] < reply["asked"]:
        raise typer.Exit(1)


def _members_table(reply: dict, common_view: str | None) -> Table:
    """One row per member: its quorum state, its view (``same`` when it is the one most members are in), how many
    members it sees, its local clients and its deliveries in this membership."""
    table = Table(box=None, pad_edge=False)
    for column in ("member", "quorum", "view", "seen", "local clients", "delivered"):
        table.add_column(column, overflow="fold", justify="right" if column in ("seen", "delivered") else "left")
    for row in reply["members"]:
        if not row.get("answered") or row.get("error"):
            table.add_row(str(row["pid"]), Text(str(row.get("error") or "no answer"), style="bold red"))
            continue
        quorum = row.get("quorum") if isinstance(row.get("quorum"), dict) else {}
        members = row.get("members") if isinstance(row.get("members"), list) else []
        clients = row.get("local_clients") if isinstance(row.get("local_clients"), list) else []
        counters = row.get("counters") if isinstance(row.get("counters"), dict) else {}
        view = row.get("view")
        table.add_row(
            str(row["pid"]),
            Text(str(quorum.get("state", "?")), style="" if quorum.get("quorate") else "bold red"),
            "same" if view is not None and str(view) == common_view else str(view or "-"),
            str(row.get("member_count", len(members))),
            "\n".join(f"pid {c.get('pid', '?')} uid {c.get('uid', '?')}" for c in clients if isinstance(c, dict))
            or "-",
            str(counters.get("delivered", "?")),
        )
    return table


def _scmp(scmp: dict) -> str:
    """The group's SCMP filters in a few words: the calls' lifetime estimate, what it accepted and refused, and the
    join requests refused here."""
    joins = scmp.get("joins_refused", 0) + scmp.get("joins_too_early", 0)
    return (f"lifetime {scmp['lifetime_ms']} ms ({scmp['estimator']}); accepted {scmp['new']}, duplicate "
            f"{scmp['duplicate']}, summary-rejected {scmp['summary_rejected']}, too early {scmp['too_early']}; "
            f"joins refused {joins}")


def _watch(ctx: typer.Context, interval: float, count: int) -> None:
    """One connection, a status request every ``interval``, redrawn in place; rates from the counters' change."""
    from rich.live import Live

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
    for column in ("group", "members", "view", "quorum"):
        groups.add_column(column, overflow="fold")
    for g in reply["groups"]:
        quorum = g.get("quorum") or {}
        groups.add_row(g["group"], "\n".join(g["members"]) or "-", g["view"] or "(joining)",
                       Text(str(quorum.get("state", "-")), style="" if quorum.get("quorate") else "bold red"))
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
