"""`rmp send --key-prefix NAME`: each line (or message) N goes with the key ``NAME:N`` and is sent again until the
group confirms it, so the same command run again after any failure delivers each line exactly once.

A line is confirmed when the group delivers its key (this command's copy or an earlier run's: a Delivery with the
key) or says it had delivered it already (``rmpd.AlreadyDelivered``).  Anything else sent and not confirmed is
sent again: what the daemon reports undelivered at once, and, after a lost connection (the daemon stopped or was
killed), everything, once the command has reconnected to the daemon (started again, maybe) and joined the group.
The group drops the copies of keys it delivered, so resending never delivers a line twice.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

import rmpd
from rmpd.client import connect
from rmpd.localapi import MAX_KEY
from rmpd.protocol.qos import QoS

RECONNECT_EVERY = 0.2
"""Seconds between attempts to reach a daemon that is not there (restarting)."""

FATAL = frozenset({"bad-key", "bad-request", "message-too-large", "auth-required", "encryption-mismatch",
                   "join-failed", "frame-too-large"})
"""Refusals that sending again cannot change: the command stops with them."""


class GaveUp(Exception):
    """The lines could not all be confirmed: ``code`` and a message for one line of stderr."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def key_of(prefix: bytes, number: int) -> bytes:
    return prefix + b":%d" % number


def check_prefix(prefix: str) -> bytes:
    """The prefix as bytes (as typed), or ValueError when line keys made from it could not be carried."""
    raw = os.fsencode(prefix)
    if not raw:
        raise ValueError("the key prefix must not be empty")
    if len(raw) + 12 > MAX_KEY:
        raise ValueError(f"the key prefix must leave room for ':N' in a key of at most {MAX_KEY} bytes "
                         f"(at most {MAX_KEY - 12} bytes); it has {len(raw)}")
    return raw


@dataclass
class KeyedLines:
    """The lines read so far, which of them are not confirmed yet, and which are to be sent (again)."""

    prefix: bytes
    unconfirmed: dict[bytes, bytes] = field(default_factory=dict)
    """Key -> payload of every line read and not yet confirmed."""
    to_send: deque[bytes] = field(default_factory=deque)
    """Keys to send, in order: lines new from the input, and lines reported undelivered or lost with a
    connection."""
    read = 0
    """Lines read from the input."""
    all_read = False
    delivered = 0
    """Lines confirmed by a delivery seen here."""
    already = 0
    """Lines confirmed by ``AlreadyDelivered`` (the group had delivered the key: an earlier run, or a copy)."""
    resent = 0
    changed: trio.Event = field(default_factory=trio.Event)
    last_progress: float = 0.0

    def add(self, payload: bytes) -> None:
        self.read += 1
        key = key_of(self.prefix, self.read)
        self.unconfirmed[key] = payload
        self.to_send.append(key)
        self._changed()

    def finish_reading(self) -> None:
        self.all_read = True
        self._changed()

    def confirm(self, key: bytes | None, *, already: bool) -> None:
        if key is None or self.unconfirmed.pop(key, None) is None:
            return
        if already:
            self.already += 1
        else:
            self.delivered += 1
        self.last_progress = trio.current_time()
        self._changed()

    def send_again(self, keys: tuple[bytes | int, ...] | list[bytes]) -> None:
        """``keys`` were lost (reported undelivered, or a connection ended with them unconfirmed): sent again."""
        queued = set(self.to_send)
        again = [k for k in keys if type(k) is bytes and k in self.unconfirmed and k not in queued]
        self.resent += len(again)
        self.to_send.extend(again)
        self._changed()

    def lost_connection(self) -> None:
        """Every line sent and not confirmed may or may not have been delivered: all go again, in order."""
        queued = set(self.to_send)
        again = [k for k in self.unconfirmed if k not in queued]
        self.resent += len(again)
        self.to_send = deque([*again, *(k for k in self.to_send if k in self.unconfirmed)])

    @property
    def done(self) -> bool:
        return self.all_read and not self.unconfirmed

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_changed(self) -> None:
        await self.changed.wait()


async def _lines(payloads: list[bytes] | None) -> AsyncIterator[bytes]:
    if payloads is not None:
        for payload in payloads:
            yield payload
        return
    async for line in trio.wrap_file(sys.stdin.buffer):
        yield line.rstrip(b"\n")


async def send_keyed(socket: Path | None, group: str, prefix: bytes, qos: QoS, handler: int | None,
                     timeout: float, payloads: list[bytes] | None = None) -> KeyedLines:
    """Send every line (or each of ``payloads``) with its key until all are confirmed; the tally.  GaveUp when
    ``timeout`` seconds pass with lines unconfirmed and none newly confirmed, or on a refusal resending cannot
    change."""
    lines = KeyedLines(prefix, last_progress=trio.current_time())

    async def read() -> None:
        async for payload in _lines(payloads):
            lines.add(payload)
        lines.finish_reading()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(_watchdog, lines, timeout)
            while not lines.done:
                try:
                    await _session(socket, group, lines, qos, handler)
                except rmpd.RmpdError as exc:
                    if exc.code in FATAL:
                        raise GaveUp(exc.code, exc.message) from None
                    lines.lost_connection()  # the daemon went away (or is not back yet): reconnect, send again
                    await trio.sleep(RECONNECT_EVERY)
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as errors:
        raise _one_error(errors) from None
    return lines


def _one_error(errors: BaseExceptionGroup) -> BaseException:
    """What ended a session's tasks, as one exception: the command's own giving up first, then a refusal that
    resending cannot change, then any other refusal (a lost connection ends the watch and the send alike)."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [errors]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        else:
            leaves.append(error)
    for wanted in (lambda e: isinstance(e, GaveUp), lambda e: isinstance(e, rmpd.RmpdError) and e.code in FATAL,
                   lambda e: isinstance(e, rmpd.RmpdError)):
        for error in leaves:
            if wanted(error):
                return error
    return errors


async def _watchdog(lines: KeyedLines, timeout: float) -> None:
    """Give up once lines wait unconfirmed for ``timeout`` seconds with none confirmed meanwhile."""
    while True:
        if not lines.unconfirmed:
            lines.last_progress = trio.current_time()
        deadline = lines.last_progress + timeout
        if trio.current_time() >= deadline:
            first = next(iter(lines.unconfirmed), b"").decode("utf-8", "backslashreplace")
            raise GaveUp("timeout", f"{len(lines.unconfirmed)} line(s) not confirmed after {timeout:g} s without "
                                    f"progress (the first: {first}); run the same command again to send them")
        with trio.move_on_at(deadline):
            await lines.wait_changed()


async def _session(socket: Path | None, group: str, lines: KeyedLines, qos: QoS, handler: int | None) -> None:
    """One connection to the daemon: join, send what is to be sent, watch for confirmations; returns once every
    line is confirmed (RmpdError when the connection is lost or the daemon refuses)."""
    async with connect(socket) as client:
        handle = await client.join(group)
        in_view = trio.Event()
        in_view.set()

        async def watch() -> None:
            nonlocal in_view
            async for event in handle:
                if isinstance(event, rmpd.Delivery):
                    lines.confirm(event.key, already=False)
                elif isinstance(event, rmpd.AlreadyDelivered):
                    lines.confirm(event.key, already=True)
                elif isinstance(event, rmpd.Undelivered):
                    lines.send_again(event.ids)
                elif isinstance(event, rmpd.Rejoining):
                    in_view = trio.Event()
                elif isinstance(event, rmpd.ViewChange):
                    in_view.set()

        async def send() -> None:
            while not lines.done:
                if not lines.to_send:
                    await lines.wait_changed()
                    continue
                key = lines.to_send[0]
                payload = lines.unconfirmed.get(key)
                if payload is None:  # confirmed while it waited (an earlier copy got through)
                    lines.to_send.popleft()
                    continue
                try:
                    await handle.send(payload, qos=qos, handler=handler, key=key)
                except rmpd.RmpdError as exc:
                    if exc.code != "not-member":
                        raise
                    await trio.sleep(RECONNECT_EVERY)  # the daemon is rejoining: again once it is in a view
                    await in_view.wait()
                    continue
                if lines.to_send and lines.to_send[0] == key:
                    lines.to_send.popleft()
            await handle.leave()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await send()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as errors:
            raise _one_error(errors) from None
