"""One local client connection: its bounded outgoing queue and the groups it is attached to.

Replies and pushed events share one queue, so a client sees them in the order the daemon produced them.  The
queue is bounded; when it is full the client is cut off with a ``slow-consumer`` error instead of letting one slow
reader stall the ring or grow the daemon's memory without limit.

A frame pushed while nothing is queued or being written goes straight into the socket when it has room (a
non-blocking write): a client that keeps up costs no wake-up of the writer task per frame.  What does not fit
waits in the queue, so the order stays that of :meth:`Session.push`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import trio

from rmpd.localapi import SLOW_CONSUMER, encode_frame

_ids = itertools.count(1)

WRITE_BATCH = 256 * 1024
"""Bytes of queued frames joined into one write to a client at most."""
CUT_GRACE = 10.0
"""Seconds a cut client gets to take its final error frame before the connection is dropped."""


class Session:
    def __init__(self, stream: trio.abc.Stream, queue_size: int) -> None:
        self.id = next(_ids)
        self.stream = stream
        self._tx, self._rx = trio.open_memory_channel[bytes](queue_size)
        self.closed = False
        self.cut_reason: dict[str, Any] | None = None
        self.scope = trio.CancelScope()
        self.dropped = 0
        """Frames this client will not get: pushed once it was closed (gone, cut off, or finishing), or refused by
        its full queue (which cuts it off)."""
        self.queued_bytes = 0
        """Bytes of frames queued and not yet written: what a slow client costs the daemon in memory."""
        self.queued_frames = 0
        """Frames queued and not yet taken by the writer (counted here: the channel's statistics cost more)."""
        self.on_written: Callable[[], None] = lambda: None
        """Called after each write: the hub checks whether this client caught up."""
        self.peer: tuple[int, int, int] | None = None
        """(pid, uid, gid) of the client process, from SO_PEERCRED."""
        socket = getattr(stream, "socket", None)
        self._fd: int | None = socket.fileno() if socket is not None else None
        """The socket written to directly when nothing waits before the frame (None: always through the queue)."""
        self._writing = False
        """The writer task is in the middle of sending: frames must queue behind what it sends."""

    def push(self, message: dict[str, Any]) -> bool:
        """Queue one frame; False if the client is gone or was just cut off for being slow."""
        if self.closed:
            self.dropped += 1
            return False
        return self.push_encoded(encode_frame(message))

    def push_encoded(self, frame: bytes) -> bool:
        """Queue a frame already encoded (the hub encodes a group's events once for all its clients)."""
        if self.closed:
            self.dropped += 1
            return False
        if self._fd is not None and not self.queued_frames and not self._writing:
            try:
                written = os.write(self._fd, frame)
            except OSError:  # full (BlockingIOError) or broken: the writer finds out which and ends the connection
                written = 0
            if written == len(frame):
                return True
            frame = frame[written:]
        try:
            self._tx.send_nowait(frame)
            self.queued_bytes += len(frame)
            self.queued_frames += 1
        except trio.WouldBlock:
            self.dropped += 1
            self.cut(SLOW_CONSUMER, f"client fell {self._rx.statistics().current_buffer_used} frames behind")
            return False
        return True

    def cut(self, code: str, message: str) -> None:
        """Stop queueing, send one final error frame, then drop the connection."""
        if self.closed:
            return
        self.closed = True
        self.cut_reason = {"error": code, "message": message}
        self._tx.close()
        self.scope.deadline = min(self.scope.deadline, trio.current_time() + CUT_GRACE)

    def finish(self) -> None:
        """No more frames: the writer sends what is queued and the connection ends."""
        if not self.closed:
            self.closed = True
            self._tx.close()

    async def writer(self) -> None:
        """Send queued frames; whatever queued up meanwhile goes in one write, so a busy group costs one
        system call per batch of deliveries instead of one per frame."""
        async for frame in self._rx:
            self.queued_frames -= 1
            if self.cut_reason is not None:
                break
            batch = [frame]
            size = len(frame)
            while size < WRITE_BATCH:
                try:
                    more = self._rx.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self.queued_frames -= 1
                batch.append(more)
                size += len(more)
            self._writing = True
            try:
                await self.stream.send_all(b"".join(batch) if len(batch) > 1 else frame)
            finally:
                self._writing = False
            self.queued_bytes -= size
            self.on_written()
        if self.cut_reason is not None:
            await self.stream.send_all(encode_frame(self.cut_reason))

    @property
    def queued(self) -> int:
        return self.queued_frames


__all__ = ["Session"]
