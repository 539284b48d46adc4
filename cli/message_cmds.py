"""`rmp send` and `rmp listen`: put messages into a group and watch what it delivers, in delivery order."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import trio
import typer

import rmpd
from rmpd.client import Client
from rmpd.client.errors import single_error
from rmpd.protocol.limits import check_keyed
from rmpd.protocol.qos import QoS

from .client_common import JsonOption, bytes_json, emit_json, err, run_with_client, socket_path
from .keyed_send import GaveUp, check_prefix, key_of, send_keyed

message_app = typer.Typer()


def _qos(value: str) -> str:
    try:
        QoS.parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _payloads(message: str | None, count: int, size: int | None) -> list[bytes]:
    if message is None and size is None:
        raise typer.BadParameter("give MESSAGE, --stdin, or --size", param_hint="MESSAGE")
    out = []
    for i in range(count):
        # A command-line argument that is not valid UTF-8 reaches Python with its bytes kept as surrogates
        # (surrogateescape); os.fsencode gives those bytes back, so any argument is sent as the bytes typed.
        body = os.fsencode(message) if message is not None else f"{i}".encode()
        if size is not None:
            body = (body + b" " * size)[:size] if len(body) < size else body[:size]
        out.append(body)
    return out


@message_app.command("send")
def send(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group name.")],
    message: Annotated[str | None, typer.Argument(help="Message text.")] = None,
    stdin: Annotated[bool, typer.Option("--stdin", help="Send one message per input line.")] = False,
    qos: Annotated[str, typer.Option(callback=_qos, help="unreliable, unordered, source, total, k1..k65535 "
                                                         "(K-resilient), majority, safe.")] = "total",
    count: Annotated[int, typer.Option(min=1, help="Send the message (or a numbered one) N times.")] = 1,
    size: Annotated[int | None, typer.Option(min=0, max=60000, help="Pad or cut each message to B bytes.")] = None,
    handler: Annotated[int | None, typer.Option(min=0, max=5, help="Handler number carried by the message.")] = None,
    key_prefix: Annotated[str | None, typer.Option(
        "--key-prefix", help="Send line (or message) N with the key NAME:N, again until the group confirms it: run "
                             "the same command again after any failure and each line is delivered exactly once.",
        metavar="NAME")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="With --key-prefix: give up (exit 1) after this many "
                                                        "seconds with lines unconfirmed and none newly confirmed.")]
    = 60.0,
    json_out: Annotated[bool, JsonOption] = False,
) -> None:
    """Multicast messages to GROUP through the local daemon (joining it for the duration if needed).

    Each message counts as sent once the daemon accepted and numbered it.  Messages the daemon reports it will not
    deliver (its membership ended first, see docs/operations.md) are named on stderr, and the exit status is 1.
    With --key-prefix, each is sent until the group confirms it (reconnecting to a daemon that restarted), and the
    exit status is 0 once all are."""
    payloads = [] if stdin else _payloads(message, count, size)
    level = QoS.parse(qos)
    if key_prefix is not None:
        _send_keyed(ctx, group, key_prefix, level, handler, timeout, None if stdin else payloads, json_out)
        return

    async def body(client: Client) -> tuple[list[int], list[int]]:
        group_handle = await client.join(group)
        undelivered: list[int] = []

        async def watch() -> None:
            # Read the group's events while sending: a long stream is never cut off as a slow reader, and what the
            # daemon reports undelivered is seen.
            async for event in group_handle:
                if isinstance(event, rmpd.Undelivered):
                    undelivered.extend(event.seqs)
                    err.print(f"not delivered: {len(event.seqs)} message(s) to {group} ({event.reason}): seqs "
                              f"{_seq_list(event.seqs)}", highlight=False)
                elif isinstance(event, rmpd.Rejoining):
                    err.print(f"the daemon is rejoining {group} ({event.reason})", highlight=False)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                if stdin:  # each line goes out as it is read, so `tail -f log | rmp send G --stdin` streams
                    seqs = [await group_handle.send(line.rstrip(b"\n"), qos=level, handler=handler)
                            async for line in trio.wrap_file(sys.stdin.buffer)]
                else:
                    seqs = [await group_handle.send(p, qos=level, handler=handler) for p in payloads]
                await group_handle.leave()  # ends the group's events, and with them the watch
        except BaseExceptionGroup as errors:
            raise single_error(errors) from None  # a refusal prints as one line, as without the watch
        return seqs, undelivered

    seqs, undelivered = run_with_client(ctx, body)
    if json_out:
        emit_json({"group": group, "sent": len(seqs), "qos": level.name(), "first_seq": seqs[0] if seqs else None,
                   "last_seq": seqs[-1] if seqs else None, "undelivered": undelivered})
    else:
        err.print(f"sent {len(seqs)} message(s) to {group} ({level.name()})", highlight=False)
    if undelivered:
        raise typer.Exit(1)


def _send_keyed(ctx: typer.Context, group: str, key_prefix: str, level: QoS, handler: int | None, timeout: float,
                payloads: list[bytes] | None, json_out: bool) -> None:
    """`rmp send --key-prefix`: every line sent until confirmed (cli.keyed_send); one line and exit 1 when that
    cannot be done."""
    try:
        prefix = check_prefix(key_prefix)
        check_keyed(level, (key_of(prefix, 1),))
    except ValueError as exc:
        err.print(f"[red]error:[/red] bad-key: {exc}", highlight=False)
        raise typer.Exit(1) from None
    try:
        lines = trio.run(send_keyed, socket_path(ctx), group, prefix, level, handler, timeout, payloads)
    except (GaveUp, rmpd.RmpdError) as exc:
        err.print(f"[red]error:[/red] {exc.code}: {exc.message}", highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if json_out:
        emit_json({"group": group, "sent": lines.read, "qos": level.name(), "key_prefix": key_prefix,
                   "delivered": lines.delivered, "already_delivered": lines.already, "resent": lines.resent})
    else:
        err.print(f"sent {lines.read} message(s) to {group} ({level.name()}) with keys {key_prefix}:1.."
                  f"{key_prefix}:{lines.read}, all confirmed: {lines.delivered} delivered, {lines.already} "
                  f"delivered before ({lines.resent} sent again)", highlight=False)


def _seq_list(seqs: tuple[int, ...], shown: int = 20) -> str:
    text = ", ".join(map(str, seqs[:shown]))
    return text + (f" and {len(seqs) - shown} more" if len(seqs) > shown else "")


def _delivery_json(event: rmpd.Delivery) -> dict[str, Any]:
    """One delivery as JSON that gives back its exact bytes: ``payload`` holds the text when the bytes are valid
    UTF-8, ``payload_b64`` (standard base64) holds them otherwise; never both.  (src, seq, index) names the
    message: packed messages share their packet's ``seq``."""
    shown = {"src": event.source, "seq": event.seq, "index": event.index, "ts": event.timestamp,
             "qos": event.qos.name(), "view": event.view, **bytes_json("payload", event.payload)}
    if event.key is not None:
        shown.update(bytes_json("key", event.key))  # ``key``, or ``key_b64`` for a key that is not UTF-8
    return shown


@message_app.command("listen")
def listen(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group name.")],
    count: Annotated[int | None, typer.Option(min=0, help="Exit after N deliveries.")] = None,
    json_out: Annotated[bool, JsonOption] = False,
) -> None:
    """Print what GROUP delivers here, in delivery order (one JSON object per line with --json)."""

    async def body(client: Client) -> int:
        handle = await client.join(group)
        err.print(f"listening on {group}: view {handle.view}, {len(handle.known_members)} member(s)", highlight=False)
        seen = 0
        if count == 0:
            return 0
        async for event in handle:
            if isinstance(event, rmpd.ViewChange):
                err.print(f"view {event.view}: {', '.join(event.members)}", highlight=False)
                continue
            if isinstance(event, rmpd.Rejoining):
                err.print(f"membership ended ({event.reason}); the daemon is rejoining {group}", highlight=False)
                continue
            if not isinstance(event, rmpd.Delivery):
                continue  # an Undelivered: this command sends nothing
            seen += 1
            if json_out:
                emit_json(_delivery_json(event))
            else:
                key = "" if event.key is None else f" [{event.key.decode('utf-8', 'backslashreplace')}]"
                typer.echo(f"[{event.timestamp}] {event.source}#{event.seq} ({event.qos.name()}){key}: "
                           f"{event.payload.decode('utf-8', 'backslashreplace')}")
            sys.stdout.flush()
            if count is not None and seen >= count:
                break
        return seen

    run_with_client(ctx, body)
