"""Process and membership view identifiers (RMP paper, section 3.1).

A process ID is the ``ip:port`` of the process's unicast UDP socket: unique across the internetwork and constant for
the life of the process.  A membership view ID is the creator's process ID plus a counter that starts at the
creator's clock in milliseconds and grows by one per view created, never faster than one per millisecond of uptime,
so view IDs stay unique even when two groups hash to the same multicast address.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import NamedTuple

ProcessId = str
"""``ip:port`` of a process's unicast socket, e.g. ``"127.0.0.1:7001"``."""


@functools.lru_cache(maxsize=256)
def process_id_of(address: tuple[str, int]) -> ProcessId:
    """The process ID of a socket address, remembered: a receiver names the source of every datagram, and a group
    has few members."""
    return f"{address[0]}:{address[1]}"


@functools.lru_cache(maxsize=256)
def split_process_id(pid: ProcessId) -> tuple[str, int]:
    """Return ``(ip, port)`` of a process ID; raises ValueError when it is not ``ip:port``.  Remembered: the
    daemon turns the same few destinations into addresses for every unicast it sends."""
    ip, sep, port_text = pid.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"not a process ID (ip:port): {pid!r}")
    port = int(port_text)
    ipaddress.IPv4Address(ip)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in process ID: {pid!r}")
    return ip, port


class ViewId(NamedTuple):
    """Membership view ID: creator process ID and the creator's view counter."""

    creator: ProcessId
    counter: int

    def __str__(self) -> str:
        return f"{self.creator}/{self.counter}"

    @classmethod
    def parse(cls, text: str) -> ViewId:
        creator, sep, counter = text.rpartition("/")
        if not sep or not counter.isdigit():
            raise ValueError(f"not a view ID (ip:port/counter): {text!r}")
        split_process_id(creator)
        return cls(creator, int(counter))


@functools.lru_cache(maxsize=64)
def view_name(view: ViewId) -> str:
    """``str(view)``, remembered: every delivery handed to an application names its view, and a group is in one
    view at a time."""
    return str(view)


class ViewCounter:
    """Hands out view IDs for one process.

    The counter is seeded with the process's wall clock in ms at start; a new ID is refused (``None``) when it
    would run ahead of one per millisecond of uptime.  Time is passed in: this module reads no clock.
    """

    def __init__(self, pid: ProcessId, start_wall_ms: int, start_now: float) -> None:
        self.pid = pid
        self._start_counter = start_wall_ms
        self._start_now = start_now
        self._next = start_wall_ms

    def next_view_id(self, now: float) -> ViewId | None:
        uptime_ms = int((now - self._start_now) * 1000)
        if self._next > self._start_counter + uptime_ms:
            return None
        view = ViewId(self.pid, self._next)
        self._next += 1
        return view


class RequestIds:
    """List Change Request IDs for one process: strictly increasing across its groups, and stamps.

    An ID is a clock reading in ms times 1000 plus a counter, so ``id // 1000`` is when it was issued (give or take
    the counter's carry, which needs over a thousand requests in one ms) and a restarted process never reuses an
    ID.  Join requests take a fresh reading (:meth:`stamped`): they are first-contact packets, filtered by SCMP
    at the token site (docs/protocol.md, "Join requests and SCMP").  Lock and unlock requests only need to grow.
    """

    def __init__(self, wall_ms: int) -> None:
        self.last = wall_ms * 1000

    def __iter__(self) -> RequestIds:
        return self

    def __next__(self) -> int:
        self.last += 1
        return self.last

    def stamped(self, wall_ms: int) -> int:
        """A new ID stamped with ``wall_ms`` (or just above the last one, if the clock has not moved past it)."""
        self.last = max(self.last + 1, wall_ms * 1000)
        return self.last
