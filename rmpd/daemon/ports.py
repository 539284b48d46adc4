"""What the daemon's translator is given: a client's end (``Outlet``) and the process it speaks for (``Runtime``).

The translator awaits nothing and owns no socket: the trio side hands it each client's connection as an
:class:`Outlet` (rmpd.daemon.session.Session) and the process loop as a :class:`Runtime`
(rmpd.runtime.loop.ProcessLoop).  Its tests hand it in-memory ones instead, and read what it pushed to each
client and asked of the process.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from rmpd.protocol.qos import QoS
from rmpd.protocol.view import View


class Outlet(Protocol):
    """One local client as the translator sees it: frames go in, in order, to a bounded queue; a client too far
    behind is cut off."""

    id: int
    """The client's number at this daemon (what its ``hello`` is answered with)."""
    peer: tuple[int, int, int] | None
    """(pid, uid, gid) of the client process, when the socket says."""
    closed: bool
    """No more frames are taken (the client went away, was cut off, or is being sent its last ones)."""
    queued_frames: int
    queued_bytes: int
    dropped: int
    """Frames pushed that the client will not get: pushed once it was closed, or the one its full queue refused."""
    on_written: Callable[[], None]
    """Called after frames were written to the client: the translator checks whether it caught up."""

    def push(self, message: dict[str, Any]) -> bool: ...

    def push_encoded(self, frame: bytes) -> bool: ...

    def cut(self, code: str, message: str) -> None: ...

    def finish(self) -> None: ...


class Runtime(Protocol):
    """The process loop as the translator uses it: requests into the process, and what the process holds now.
    A request made inside :meth:`one_step` is drained when the block ends; its events come back through the
    translator's ``handle_events``."""

    pid: str

    def one_step(self) -> AbstractContextManager[None]: ...

    def join(self, group: str, *, ttl: int | None = None, min_partition: int = 1, existing_only: bool = False,
             via: str | None = None) -> None: ...

    def leave(self, group: str) -> None: ...

    def send_many(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None = None,
                  keys: list[bytes] | None = None) -> list[int] | None: ...

    def has_room(self, group: str) -> bool: ...

    def set_overrun(self, group: str, overrun: bool) -> None: ...

    def call(self, group: str, payload: bytes, *, handler: int | None, timeout: float,
             qos: QoS | None = None) -> int: ...

    def cancel_call(self, call_id: int) -> None: ...

    def reply(self, group: str, caller: str, conn: int, stamp: int, payload: bytes) -> bool: ...

    def lock(self, group: str, lock: int) -> None: ...

    def unlock(self, group: str, lock: int) -> None: ...

    def is_member(self, group: str) -> bool: ...

    def is_leaving(self, group: str) -> bool: ...

    def groups(self) -> list[str]: ...

    def view(self, group: str) -> View | None: ...


__all__ = ["Outlet", "Runtime"]
