"""One process of a benchmark run: ``python -m rmpd.bench.worker ROLE ...``.

Goodput is counted where applications receive it: in client processes connected to a daemon through the client
library (or running the embedded engine), never inside the daemon.  Each worker sets itself up, prints one JSON
line ``{"joined": true}`` once in the group (raw roles skip it), one ``{"ready": true}`` once the whole group is
there, then waits for one line on stdin, ``BEGIN END`` (wall-clock seconds), counts what happens
inside that window, and prints one JSON line with its result.  All workers of a run share the host's clock.

Roles:
  raw-send / raw-recv    the baseline: UDP multicast datagrams through the daemon's own socket layer, no protocol
  member                 rmpd goodput through the client library (``--socket``) or an embedded node (``--embedded``):
                         sends (``--send``) and/or counts deliveries (``--count``)
  ping / pong            latency at light load: one message out, the answer back, one at a time
  transfer               a transfer of a given size (the RMP paper's section 5 test): sends ``--send-count``
                         messages from BEGIN, and/or reads until ``--expect`` deliveries arrived or END passed;
                         with ``--probes``, also times the probe's messages it delivers
  probe                  a light stream beside a transfer: ``--probe-rate`` small messages a second from BEGIN,
                         each stamped with its send time, until stdin closes or END passed
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

import rmpd
from rmpd.client.group import Group
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.qos import QoS
from rmpd.runtime.net import packet_limits_for
from rmpd.runtime.sockets import MAX_DATAGRAM, open_multicast, open_unicast

RAW_BATCH = 64
"""Datagrams read or sent between checks of the clock, as the daemon's receive loop batches them."""
PING_PREFIX, PONG_PREFIX = b"P", b"R"
LAST_PING = (0).to_bytes(8, "big")
"""The tag of the message the ping sends after its last ping (numbered from 1): the pong stops at it instead of
waiting out its grace time."""
PROBE_PREFIX = b"Q"
PROBE_STAMP = struct.Struct("!d")
"""A probe message: PROBE_PREFIX, its wall-clock send time, padding.  A transfer's own messages are b"x"s."""
DRAIN_QUIET, DRAIN_LIMIT = 1.0, 20.0
"""After the window a member keeps reading until no delivery came for DRAIN_QUIET seconds (at most DRAIN_LIMIT),
so that what it received in all can be set against what was sent: losses still being repaired arrive then."""
JOIN_INTERVAL, JOIN_RETRIES = 0.1, 3
"""A benchmark's group is new: its first member looks for an existing one only briefly before founding it."""


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


async def wait_for_window() -> tuple[float, float]:
    line = await trio.to_thread.run_sync(sys.stdin.readline)
    begin, end = (float(x) for x in line.split())
    return begin, end


# ----------------------------------------------------------------------------------------------------------------
# Baseline: raw UDP multicast


async def raw_send(args: argparse.Namespace) -> None:
    sock = open_unicast(args.bind, 0, 1)
    payload = b"x" * args.size
    emit({"ready": True})
    _begin, end = await wait_for_window()
    sent = dropped = lost = 0
    while time.time() < end:
        for _ in range(RAW_BATCH):
            try:
                sock.sendto(payload, (args.address, args.port))
                sent += 1
            except BlockingIOError:
                dropped += 1
                await trio.lowlevel.wait_writable(sock)
            except OSError:  # e.g. EPERM from an iptables DROP on the way out: a lost datagram, as for rmpd
                lost += 1
        await trio.lowlevel.checkpoint()
    sock.close()
    emit({"sent": sent, "send_blocked": dropped, "send_failed": lost})


async def raw_recv(args: argparse.Namespace) -> None:
    sock = open_multicast(args.address, args.port, args.bind)
    emit({"ready": True})
    begin, end = await wait_for_window()
    counted = 0
    with trio.move_on_at(trio.current_time() + (end - time.time())):
        while True:
            await trio.lowlevel.wait_readable(sock)
            now = time.time()
            for _ in range(RAW_BATCH):
                try:
                    sock.recvfrom(MAX_DATAGRAM)
                except BlockingIOError:
                    break
                if begin <= now < end:
                    counted += 1
    sock.close()
    emit({"delivered": counted, "seconds": end - begin})


# ----------------------------------------------------------------------------------------------------------------
# rmpd through the client library or an embedded node


@asynccontextmanager
async def joined(args: argparse.Namespace) -> AsyncIterator[Group]:
    """Join the group through the local daemon, or as an embedded node of its own."""
    if args.embedded:
        config = EngineConfig(request_interval=JOIN_INTERVAL, join_retries=JOIN_RETRIES,
                              **packet_limits_for(args.bind))
        async with rmpd.Node(bind=args.bind, port=0, auth_key=args.auth_key, encrypt=args.encrypt,
                             config=config) as node:
            group = await node.join(args.group)
            emit({"joined": True})
            yield group
    else:
        async with rmpd.connect(Path(args.socket)) as client:
            group = await client.join(args.group)
            emit({"joined": True})
            yield group


KEYED_SUFFIX = "+key"
"""A bench QoS ending so (``total+key``) sends every message with a key of its own (exactly-once sends)."""


def parse_qos(text: str) -> tuple[QoS, bool]:
    """A bench QoS: (the QoS, whether each message carries a key)."""
    keyed = text.endswith(KEYED_SUFFIX)
    return QoS.parse(text.removesuffix(KEYED_SUFFIX)), keyed


async def wait_members(group: Group, count: int) -> None:
    while len(await group.members()) < count:
        await trio.sleep(0.05)


async def member(args: argparse.Namespace) -> None:
    """Send as fast as the group takes messages (``--send``) and/or count deliveries (``--count``).

    Reports ``sent``, ``delivered`` (inside the window) and ``received`` (every delivery, window or not, read until
    the group has been quiet for ``DRAIN_QUIET``): the bench checks that each member received everything sent."""
    qos, keyed = parse_qos(args.qos)
    payload = b"x" * args.size
    async with joined(args) as group:
        await wait_members(group, args.members)
        emit({"ready": True})
        begin, end = await wait_for_window()
        sent = counted = received = 0
        last_delivery = time.time()

        async def sender() -> None:
            # One task streaming with post(), as a program using Spread's or Corosync's multicast call would.
            nonlocal sent
            if keyed:  # each message its own key, as a program sending exactly once would
                prefix = f"{os.getpid()}:{time.time_ns()}:".encode()
                while time.time() < end:
                    await group.post(payload, qos=qos, key=prefix + str(sent).encode())
                    sent += 1
                return
            while time.time() < end:
                await group.post(payload, qos=qos)
                sent += 1

        async def reader() -> None:
            # A sender reads its group's events too, so its daemon never cuts it off as a slow consumer.  Read in
            # batches, as a program reading a busy group would (one clock read per batch, as raw-recv does).
            nonlocal counted, received, last_delivery
            async for batch in group.batches():
                n = list(map(type, batch)).count(rmpd.Delivery)  # deliveries are exactly Delivery: counted in C
                if n:
                    received += n
                    last_delivery = time.time()
                    if args.count and begin <= last_delivery < end:
                        counted += n

        async def drained(cancel_scope: trio.CancelScope) -> None:
            await trio.sleep(max(0.0, end - time.time()))
            while time.time() - last_delivery < DRAIN_QUIET and time.time() < end + DRAIN_LIMIT:
                await trio.sleep(0.1)
            cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            nursery.start_soon(drained, nursery.cancel_scope)
            if args.send:
                nursery.start_soon(sender)
    emit({"sent": sent, "delivered": counted, "received": received, "seconds": end - begin})


async def ping(args: argparse.Namespace) -> None:
    qos, _ = parse_qos(args.qos)  # keys only where a member streams or transfers (member, transfer)
    pad = b"x" * max(0, args.size - 9)
    async with joined(args) as group:
        await wait_members(group, args.members)
        emit({"ready": True})
        _begin, end = await wait_for_window()
        rtts: list[float] = []
        events = group.__aiter__()
        with trio.move_on_at(trio.current_time() + (end - time.time()) + 5.0):
            n = 0
            while time.time() < end:
                n += 1
                tag = n.to_bytes(8, "big")
                started = time.perf_counter()
                await group.send(PING_PREFIX + tag + pad, qos=qos)
                async for event in events:
                    if isinstance(event, rmpd.Delivery) and event.payload[:9] == PONG_PREFIX + tag:
                        rtts.append(time.perf_counter() - started)
                        break
        with trio.move_on_after(5.0):
            await group.send(PING_PREFIX + LAST_PING, qos=qos)
    emit({"rtts": rtts})


async def pong(args: argparse.Namespace) -> None:
    qos, _ = parse_qos(args.qos)  # keys only where a member streams or transfers (member, transfer)
    async with joined(args) as group:
        emit({"ready": True})
        _begin, end = await wait_for_window()
        with trio.move_on_at(trio.current_time() + (end - time.time()) + 5.0):
            async for event in group:
                if isinstance(event, rmpd.Delivery) and event.payload[:1] == PING_PREFIX:
                    if event.payload[1:9] == LAST_PING:
                        break
                    await group.send(PONG_PREFIX + event.payload[1:], qos=qos)
    emit({"done": True})


@asynccontextmanager
async def from_begin(args: argparse.Namespace) -> AsyncIterator[tuple[Group, float, float]]:
    """Join, wait for the whole group, say so, and enter at BEGIN: the group and the window (BEGIN, END)."""
    async with joined(args) as group:
        await wait_members(group, args.members)
        emit({"ready": True})
        begin, end = await wait_for_window()
        await trio.sleep(max(0.0, begin - time.time()))
        yield group, begin, end


async def transfer(args: argparse.Namespace) -> None:
    """One member of a transfer: a sender posts ``--send-count`` messages from BEGIN as fast as the group takes
    them; a destination counts deliveries until it has ``--expect`` of them, or END (the bench's deadline) passed.

    A destination's result line comes when it is done: ``received`` and the wall-clock times of its first and last
    delivery.  A sender's comes once the group accepted all it posted (``sent``, ``first_send``, ``send_done``,
    ``undelivered``).  Each says the CPU seconds it used from BEGIN (``cpu_s``).  A sender stays in the group,
    reading, until its stdin closes, so that its leaving is no part of the transfer.

    With ``--probes`` a destination tells the probe's messages (``probe`` role) from the transfer's, counts only the
    transfer's, and reports each probe's send time and latency (``probes``: pairs of seconds).  Once its transfer
    is complete it reads on until it delivers a probe sent after its last delivery (or END): the probe comes from
    one sender in total order, so every earlier probe has been delivered by then."""
    qos, keyed = parse_qos(args.qos)  # keys only where a member streams or transfers (member, transfer)
    payload = b"x" * args.size
    async with from_begin(args) as (group, _begin, end):
        cpu_at_begin = time.process_time()
        received = undelivered = sent = 0
        reported = False
        first_send = first_delivery = last_delivery = None
        probes: list[tuple[float, float]] = []
        done = trio.Event()

        def sender_result() -> dict[str, Any]:
            return {"sent": sent, "complete": sent == args.send_count, "first_send": first_send,
                    "send_done": time.time(), "undelivered": undelivered,
                    "cpu_s": time.process_time() - cpu_at_begin}

        async def sender() -> None:
            nonlocal sent, first_send, reported
            first_send = time.time()
            prefix = f"{os.getpid()}:{time.time_ns()}:".encode()
            while sent < args.send_count:
                await group.post(payload, qos=qos, key=prefix + str(sent).encode() if keyed else None)
                sent += 1
            await group.flush()
            emit(sender_result())
            reported = True
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # until the bench closes it
            done.set()

        def timed_probes(batch: list[Any], now: float) -> int:
            """Record the batch's probes; returns how many deliveries in it were probes."""
            count = 0
            for event in batch:
                if type(event) is rmpd.Delivery and event.payload[:1] == PROBE_PREFIX:
                    (sent_at,) = PROBE_STAMP.unpack_from(event.payload, 1)
                    probes.append((sent_at, now - sent_at))
                    count += 1
            return count

        def finished() -> bool:
            if not args.expect or received < args.expect:
                return False
            return not args.probes or (bool(probes) and last_delivery is not None and probes[-1][0] > last_delivery)

        async def reader() -> None:
            nonlocal received, undelivered, first_delivery, last_delivery
            async for batch in group.batches():
                n = list(map(type, batch)).count(rmpd.Delivery)
                if n:
                    now = time.time()
                    if args.probes:
                        n -= timed_probes(batch, now)
                    if n:
                        received += n
                        last_delivery = now
                        first_delivery = first_delivery or last_delivery
                    if finished():
                        done.set()
                undelivered += sum(len(e.seqs) for e in batch if isinstance(e, rmpd.Undelivered))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            if args.send_count:
                nursery.start_soon(sender)
            with trio.move_on_at(trio.current_time() + (end - time.time())):
                await done.wait()
            nursery.cancel_scope.cancel()
    if args.send_count and not reported:  # the deadline came first: what was sent by then
        emit(sender_result())
    if args.expect:
        emit({"received": received, "complete": received >= args.expect, "first_delivery": first_delivery,
              "last_delivery": last_delivery, "cpu_s": time.process_time() - cpu_at_begin,
              **({"probes": probes} if args.probes else {})})


async def probe(args: argparse.Namespace) -> None:
    """Send ``--probe-rate`` messages a second of ``--size`` bytes from BEGIN, on a fixed schedule (a late send
    does not shift the ones after it), each stamped with the wall-clock time it is handed to the client library,
    until stdin closes or END passed.  Reads the group's events meanwhile, as any member must.  Reports the send
    times (``sent_at``) and its CPU seconds."""
    qos, _ = parse_qos(args.qos)  # keys only where a member streams or transfers (member, transfer)
    pad = b"x" * max(0, args.size - 1 - PROBE_STAMP.size)
    interval = 1.0 / args.probe_rate
    async with from_begin(args) as (group, begin, end):
        cpu_at_begin = time.process_time()
        sent_at: list[float] = []

        async def sender() -> None:
            while (due := begin + len(sent_at) * interval) < end:
                await trio.sleep(max(0.0, due - time.time()))
                now = time.time()
                await group.post(PROBE_PREFIX + PROBE_STAMP.pack(now) + pad, qos=qos)
                sent_at.append(now)

        async def reader() -> None:
            async for _batch in group.batches():
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(reader)
            with trio.move_on_at(trio.current_time() + (end - time.time())):
                await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # until the bench closes it
            nursery.cancel_scope.cancel()
    emit({"sent_at": sent_at, "cpu_s": time.process_time() - cpu_at_begin})


ROLES = {"raw-send": raw_send, "raw-recv": raw_recv, "member": member, "ping": ping, "pong": pong,
         "transfer": transfer, "probe": probe}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rmpd.bench.worker")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--socket", help="the daemon's client socket")
    parser.add_argument("--embedded", action="store_true", help="run the engine in this process instead")
    parser.add_argument("--bind", default="127.0.0.1", help="interface address (raw roles and --embedded)")
    parser.add_argument("--group", default="bench")
    parser.add_argument("--members", type=int, default=1, help="wait for a view this large before starting")
    parser.add_argument("--qos", default="total")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--address", help="multicast address (raw roles)")
    parser.add_argument("--port", type=int, default=0, help="multicast port (raw roles)")
    parser.add_argument("--send", action="store_true", help="member: send as fast as the group takes messages")
    parser.add_argument("--count", action="store_true", help="member: count deliveries inside the window")
    parser.add_argument("--send-count", type=int, default=0, help="transfer: messages to send")
    parser.add_argument("--expect", type=int, default=0, help="transfer: deliveries to wait for")
    parser.add_argument("--probes", action="store_true", help="transfer: time the probe's messages it delivers")
    parser.add_argument("--probe-rate", type=float, default=10.0, help="probe: messages per second")
    parser.add_argument("--auth-key", help="group key file (--embedded)")
    parser.add_argument("--encrypt", action="store_true", help="encrypt bodies too (--embedded)")
    args = parser.parse_args(argv)
    trio.run(ROLES[args.role], args)


if __name__ == "__main__":
    main()
