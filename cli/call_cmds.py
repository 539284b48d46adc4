"""`rmp call` and `rmp serve`: multi-RPC to a group without joining it, and serving such calls with a command.

A call is filtered by the group's SCMP at-most-once filter, so however often the network duplicates it or the
caller resends it, the serving command runs at most once; the caller gets the one reply.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import trio
import typer

from rmpd.client import Client
from rmpd.protocol.calls import DEFAULT_CALL_TIMEOUT
from rmpd.protocol.qos import QoS

from .client_common import JsonOption, bytes_json, emit_json, err, run_with_client

call_app = typer.Typer()


@call_app.command("call")
def call(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group name (no need to be a member).")],
    message: Annotated[str | None, typer.Argument(help="The request; read from stdin when omitted.")] = None,
    handler: Annotated[int, typer.Option(min=0, max=5, help="Handler lock whose holder answers.")] = 0,
    no_handler: Annotated[bool, typer.Option(
        "--no-handler", help="Deliver the message to every member instead (no reply; waits for delivery).")] = False,
    timeout: Annotated[float, typer.Option(min=0.001, max=3600,
                                           help="Seconds to wait for the answer.")] = DEFAULT_CALL_TIMEOUT,
    json_out: Annotated[bool, JsonOption] = False,
) -> None:
    """Call GROUP once and print the reply (exit 1 with the reason when the call fails)."""
    # An argument that is not valid UTF-8 reaches Python as surrogates; os.fsencode gives its bytes back.
    payload = os.fsencode(message) if message is not None else sys.stdin.buffer.read()

    async def body(client: Client) -> bytes | None:
        return await client.call(group, payload, handler=None if no_handler else handler, timeout=timeout,
                                 qos=QoS.TOTAL)

    reply = run_with_client(ctx, body)
    if json_out:
        emit_json({"group": group, **({"reply": None} if reply is None else bytes_json("reply", reply))})
    elif reply is None:
        err.print(f"delivered to {group}", highlight=False)
    else:
        sys.stdout.buffer.write(reply)
        if not reply.endswith(b"\n") and sys.stdout.isatty():
            sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()


@call_app.command("serve", context_settings={"allow_extra_args": False})
def serve(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group to serve (joined for the duration).")],
    command: Annotated[list[str], typer.Argument(help="Run once per call: the request on stdin, the reply is "
                                                      "its stdout (put it after --).")],
    handler: Annotated[int, typer.Option(min=0, max=5, help="Handler lock to take and serve.")] = 0,
    count: Annotated[int | None, typer.Option(min=1, help="Stop after serving N calls.")] = None,
    command_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a run of COMMAND may take.")] = 60.0,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per line on stdout: when serving "
                                                          "starts, then one per call served.")] = False,
) -> None:
    """Join GROUP, take handler lock N, and answer every call to it by running COMMAND."""
    if not command:
        raise typer.BadParameter("give the command to run after --", param_hint="COMMAND")

    async def body(client: Client) -> int:
        member = await client.join(group)
        await member.lock(handler)
        if json_out:
            emit_json({"event": "serving", "group": group, "handler": handler, "view": member.view,
                       "command": command})
        else:
            err.print(f"serving {group} handler {handler} with: {' '.join(command)}", highlight=False)
        served = 0
        async for request in member.requests(handler):
            result, ok = await trio.to_thread.run_sync(_run, command, request.payload, command_timeout)
            await request.reply(result)
            served += 1
            if json_out:
                emit_json({"event": "served", "group": group, "served": served, "caller": request.caller,
                           "conn": request.conn, "stamp": request.stamp, "request_bytes": len(request.payload),
                           "reply_bytes": len(result), "ok": ok})
            else:
                err.print(f"served call {served} from {request.caller} ({len(request.payload)} B in, "
                          f"{len(result)} B out)", highlight=False)
            if count is not None and served >= count:
                break
        await member.leave()
        return served

    run_with_client(ctx, body)


def _run(command: list[str], payload: bytes, timeout: float) -> tuple[bytes, bool]:
    """Run ``command`` with ``payload`` on stdin; its stdout is the reply, and whether it exited 0 (a failure is
    reported on stderr)."""
    try:
        done = subprocess.run(command, input=payload, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        err.print(f"[red]command failed:[/red] {exc}", highlight=False)
        return b"", False
    if done.returncode != 0:
        err.print(f"[yellow]command exited {done.returncode}[/yellow]: "
                  f"{done.stderr.decode('utf-8', 'replace').strip()[:200]}", highlight=False)
    return done.stdout, done.returncode == 0
