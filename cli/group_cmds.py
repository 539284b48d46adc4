"""`rmp join`, `leave`, `members`, `lock`, `unlock`: the daemon's membership and locks, as a person types them.

A join taken here is persistent: the daemon stays in the group after the command exits, and rejoins it when it starts
again, until `rmp leave`.  A lock
taken here belongs to the daemon (not to this short-lived command) until `rmp unlock`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rmpd.client import Client
from rmpd.localapi import min_partition_name, parse_min_partition

from .client_common import JsonOption, emit_json, err, run_with_client

group_app = typer.Typer()


def _min_partition(value: str | None) -> int | str | None:
    """The option in the local API's public form, checked before the daemon is asked: a typo is one line on
    stderr (exit 2), in the words the daemon would use, not a usage box wrapped over several."""
    if value is None:
        return None
    try:
        return min_partition_name(parse_min_partition(value))
    except ValueError as exc:
        err.print(f"[red]error:[/red] --min-partition: {exc}", highlight=False)
        raise typer.Exit(2) from None


@group_app.command("join")
def join(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group name.")],
    ttl: Annotated[int | None, typer.Option(min=0, max=255, help="Multicast TTL this member asks for.")] = None,
    min_partition: Annotated[str | None, typer.Option(
        metavar="majority|all|N",
        help="Smallest partition that may go on: a majority of the old view, all of it, or N members.")] = None,
    existing_only: Annotated[bool, typer.Option(
        "--existing", "--existing-only", help="Join only an existing group; fail rather than form one.")] = False,
    via: Annotated[str | None, typer.Option(
        metavar="IP:PORT", help="Join through this member, which multicasts for this daemon in GROUP.")] = None,
    json_out: Annotated[bool, JsonOption] = False,
) -> None:
    """Make the daemon join GROUP; returns once it is in a view of the group."""
    wanted = _min_partition(min_partition)

    async def body(client: Client) -> dict[str, Any]:
        fields: dict[str, Any] = {"group": group, "persist": True, "existing_only": existing_only}
        if ttl is not None:
            fields["ttl"] = ttl
        if wanted is not None:
            fields["min_partition"] = wanted
        if via is not None:
            fields["via"] = via
        return await client.request("join", **fields)

    reply = run_with_client(ctx, body)
    if json_out:
        emit_json({"group": group, "view": reply["view"], "members": reply["members"]})
    else:
        typer.echo(f"joined {group}: view {reply['view']}, {len(reply['members'])} member(s)")


@group_app.command("leave")
def leave(ctx: typer.Context, group: Annotated[str, typer.Argument(help="Group name.")],
          json_out: Annotated[bool, JsonOption] = False) -> None:
    """Undo `rmp join GROUP`: the daemon leaves once no local client uses the group."""
    reply = run_with_client(ctx, lambda client: client.request("leave", group=group, persist=True))
    if json_out:
        emit_json({"group": group, "daemon_left": reply["daemon_left"]})
    else:
        typer.echo(f"left {group}" if reply["daemon_left"] else f"{group}: still used by other local clients")


@group_app.command("members")
def members(ctx: typer.Context, group: Annotated[str, typer.Argument(help="Group name.")],
            json_out: Annotated[bool, JsonOption] = False) -> None:
    """The daemon's current view of GROUP: view ID and members in token order."""
    reply = run_with_client(ctx, lambda client: client.request("members", group=group))
    if json_out:
        emit_json({"view": reply["view"], "members": reply["members"]})
        return
    typer.echo(f"view {reply['view']}")
    for member in reply["members"]:
        typer.echo(f"  {member}" + ("  (unicast only)" if member in reply.get("unicast_only", []) else ""))


def _lock_command(ctx: typer.Context, group: str, n: int, op: str, json_out: bool) -> None:
    reply = run_with_client(ctx, lambda client: client.request(op, group=group, lock=n, persist=True))
    if json_out:
        emit_json({"group": group, "lock": n, "op": op, "granted": reply["granted"]})
    else:
        typer.echo(f"{'locked' if op == 'lock' else 'unlocked'} {n} in {group}")


@group_app.command("lock")
def lock(ctx: typer.Context, group: Annotated[str, typer.Argument(help="Group name.")],
         n: Annotated[int, typer.Argument(min=0, help="Lock number (0-5 are handler locks).")],
         json_out: Annotated[bool, JsonOption] = False) -> None:
    """Take lock N in GROUP for this daemon (until `rmp unlock`)."""
    _lock_command(ctx, group, n, "lock", json_out)


@group_app.command("unlock")
def unlock(ctx: typer.Context, group: Annotated[str, typer.Argument(help="Group name.")],
           n: Annotated[int, typer.Argument(min=0, help="Lock number.")],
           json_out: Annotated[bool, JsonOption] = False) -> None:
    """Release lock N taken with `rmp lock`."""
    _lock_command(ctx, group, n, "unlock", json_out)
