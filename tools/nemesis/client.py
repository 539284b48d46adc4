"""The client on every host (``python -m tools.nemesis client ...``, run inside its namespace): it streams
messages into the group through the client library across daemon restarts, and its log of what each send returned
and what the group delivered is all the report's message counts come from."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TextIO

import trio


class ClientLog:
    """What one client saw, one JSON object per line, flushed as it goes: the run's report is computed from these
    files alone, so a client killed in the middle still counts what it wrote."""

    def __init__(self, path: Path) -> None:
        self.out: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def write(self, **record: Any) -> None:
        record["t"] = round(time.time(), 3)
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.out.close()


class Stream:
    """One client's state across connections: message numbers, and the messages still waiting for an outcome
    on the current connection (what the drain waits for)."""

    def __init__(self, host: int, log: ClientLog) -> None:
        self.host = host
        self.log = log
        self.count = 0
        self.conn = 0
        self.waiting: dict[str, int] = {}
        """Messages of the current connection whose send returned a seq, with no outcome yet: id -> seq."""
        self.reported: set[int] = set()
        """Seqs of the current connection an Undelivered event named (it may come before the send's seq is
        recorded here: the reader and the sender are two tasks)."""
        self.delivered_early: set[str] = set()
        """Own messages delivered before their send's seq was recorded here."""
        self.sending = False
        """A send is on its way: the drain waits for its answer too."""
        self.down = False
        """The daemon could not be reached at the last attempt (it was killed and has not started again)."""
        self.stop = trio.Event()
        self.settled = trio.Event()

    def next_id(self) -> str:
        self.count += 1
        return f"h{self.host}-{self.count}"

    def outcome(self, message: str) -> None:
        self.waiting.pop(message, None)
        self.check_settled()

    def check_settled(self) -> None:
        if self.stop.is_set() and not self.waiting and not self.sending:
            self.settled.set()


class Settling(Protocol):
    """A client's messages: made until ``stop``, ``settled`` once each has an outcome (``check_settled``)."""

    stop: trio.Event
    settled: trio.Event

    def check_settled(self) -> None: ...


async def stop_on_signal(signals: AsyncIterator[int], nursery: trio.Nursery, state: Settling, drain: float,
                         log_stop: Callable[[], None]) -> None:
    """At SIGTERM or SIGINT the client makes no new message (``log_stop`` says so once) and settles when every
    message has its outcome, or after ``drain`` seconds at the latest."""
    async for _ in signals:
        if not state.stop.is_set():
            log_stop()
            state.stop.set()
            state.check_settled()
            nursery.start_soon(_settle_after, state, drain)


async def _settle_after(state: Settling, drain: float) -> None:
    await trio.sleep(drain)
    state.settled.set()


async def client_main(host: int, socket_path: Path, group_name: str, rate: float, out: Path,
                      drain: float) -> None:
    """Stream messages into the group at ``rate`` per second until SIGTERM, across daemon restarts; then wait up
    to ``drain`` seconds for the outcome of every message still in flight."""
    import rmpd

    log = ClientLog(out)
    stream = Stream(host, log)
    log.write(e="start", host=host, rate=rate, undelivered_event=getattr(rmpd, "Undelivered", None) is not None)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            nursery.start_soon(stop_on_signal, signals, nursery, stream, drain,
                               lambda: log.write(e="stop", waiting=len(stream.waiting)))
            while not stream.settled.is_set():
                await _one_connection(stream, socket_path, group_name, rate)
                if not stream.settled.is_set():
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    log.write(e="end", waiting=len(stream.waiting), sent=stream.count)
    log.close()


async def _one_connection(stream: Stream, socket_path: Path, group_name: str, rate: float) -> None:
    """Connect, wait until the daemon is in a view of the group (it rejoins by itself), attach, and stream until
    the connection or the group ends, or the drain is over."""
    import rmpd

    log = stream.log
    conn: int | None = None
    try:
        async with rmpd.connect(socket_path) as client:
            stream.conn += 1
            conn = stream.conn
            stream.waiting.clear()
            stream.reported = set()
            if stream.down:
                log.write(e="up", conn=conn)
                stream.down = False
            pid = str((await client.status())["pid"])
            while not await member_of(client, group_name, pid):
                if stream.settled.is_set():
                    return
                await trio.sleep(0.2)
            # existing_only: the daemon is a member already, so this only attaches the connection; it never
            # founds a group or asks the daemon to join anything.
            group = await client.join(group_name, existing_only=True)
            log.write(e="attach", conn=conn, pid=pid, view=group.view, members=group.known_members)
            await read_and_send(partial(_read, stream, group, pid, conn), partial(_send, stream, group, conn, rate),
                                stream.settled)
    except (rmpd.RmpdError, OSError) as exc:  # ConnectionLost is an RmpdError
        code = str(getattr(exc, "code", type(exc).__name__))
        if conn is None:
            if not stream.down:
                log.write(e="down", error=code)
                stream.down = True
            return
        log.write(e="lost", conn=conn, error=code, message=str(exc)[:200], waiting=len(stream.waiting))
        if stream.waiting:
            # The program was told (ConnectionLost): these messages' fate is unknown to it from now on.
            stream.waiting.clear()
            stream.check_settled()


async def read_and_send(read: Callable[[], Awaitable[None]], send: Callable[[], Awaitable[None]],
                        settled: trio.Event) -> None:
    """Run a connection's reader and sender until ``settled``.  The first error of either (the library's, or the
    socket's) ends both and is raised: one exception leaves, never a group of two."""
    import rmpd

    failures: list[BaseException] = []
    async with trio.open_nursery() as nursery:

        async def guarded(task: Callable[[], Awaitable[None]]) -> None:
            try:
                await task()
            except (rmpd.RmpdError, OSError) as exc:
                failures.append(exc)
                nursery.cancel_scope.cancel()

        nursery.start_soon(guarded, read)
        nursery.start_soon(guarded, send)
        await settled.wait()
        nursery.cancel_scope.cancel()
    if failures:
        raise failures[0]


async def member_of(client: Any, group_name: str, pid: str) -> bool:
    status = await client.status()
    return any(g["group"] == group_name and g["view"] and not g["joining"] and pid in g["members"]
               for g in status["groups"])


async def _send(stream: Stream, group: Any, conn: int, rate: float) -> None:
    """Send one message at a time, at most ``rate`` a second; record what each send returned."""
    import rmpd

    interval = 1.0 / rate
    due = trio.current_time()
    while not stream.stop.is_set():
        message = stream.next_id()
        seq: int | None = None
        stream.sending = True
        try:
            seq = await group.send(message.encode())
        except trio.Cancelled:
            # The send never returned: the drain's deadline passed, or the connection ended, while it waited.
            stream.log.write(e="unanswered", id=message, conn=conn)
            raise
        except rmpd.ConnectionLost:
            stream.log.write(e="refused", id=message, conn=conn, error="connection-lost")
            raise
        except rmpd.RmpdError as exc:
            stream.log.write(e="refused", id=message, conn=conn, error=exc.code)
            if exc.code in ("left", "not-joined"):
                raise
        finally:
            stream.sending = False
        if seq is None:
            stream.check_settled()
            await trio.sleep(0.5)  # not a member for now (rejoining): it says so at once, every time
            due = trio.current_time()
            continue
        stream.log.write(e="sent", id=message, conn=conn, seq=seq)
        if seq not in stream.reported and message not in stream.delivered_early:
            stream.waiting[message] = seq
        stream.check_settled()
        due = max(due + interval, trio.current_time())
        await trio.sleep_until(due)


async def _read(stream: Stream, group: Any, pid: str, conn: int) -> None:
    """Every delivery (by message id), view change and Undelivered event of the group, as it comes."""
    import rmpd

    undelivered_type = getattr(rmpd, "Undelivered", None)
    rejoining_type = getattr(rmpd, "Rejoining", None)
    log = stream.log
    async for batch in group.batches():
        for event in batch:
            if isinstance(event, rmpd.Delivery):
                message = event.payload.decode(errors="replace")
                log.write(e="d", id=message, src=event.source, seq=event.seq, view=event.view, conn=conn)
                if event.source == pid:
                    if message in stream.waiting:
                        stream.outcome(message)
                    else:
                        stream.delivered_early.add(message)  # the send's answer is still on its way
            elif isinstance(event, rmpd.ViewChange):
                log.write(e="view", conn=conn, view=event.view, members=list(event.members))
            elif undelivered_type is not None and isinstance(event, undelivered_type):
                seqs = [int(s) for s in event.seqs]
                log.write(e="undelivered", conn=conn, seqs=seqs, reason=str(getattr(event, "reason", "")))
                stream.reported.update(seqs)
                for message, seq in list(stream.waiting.items()):
                    if seq in stream.reported:
                        stream.outcome(message)
            elif rejoining_type is not None and isinstance(event, rejoining_type):
                log.write(e="rejoining", conn=conn, reason=str(getattr(event, "reason", "")))
    log.write(e="group-ended", conn=conn)
