"""What a Group's backend is: a daemon connection (:class:`rmpd.client.connection.Client`) or an embedded
:class:`rmpd.client.node.Node`.

A Group asks its backend for what it cannot do itself (:class:`Backend`: send, lock, leave, ...); what the process
hands the Group back goes through the group's :class:`rmpd.client.group.GroupInbox`, which the backend holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from rmpd.protocol.qos import QoS


@dataclass(frozen=True, slots=True)
class Participant:
    """Who the program is in its group's state transfers (rmpd.client.state), as its backend knows it."""

    process_id: str
    """The process's ID: the state transfer tells its own requests apart by it."""
    number: int
    """The program's number in its process (a daemon's number for its client; 0 on a node)."""
    largest_message: int
    spawn: Callable[[Callable[[], Awaitable[None]]], None]
    """Runs a task in the backend's nursery (offers and chunks are sent in the background)."""


class Backend(Protocol):
    """What a Group asks of the process it reaches its group through: a daemon connection
    (:class:`rmpd.client.connection.Client`) or an embedded :class:`rmpd.client.node.Node`.  What the process hands
    the Group back goes through the group's :class:`rmpd.client.group.GroupInbox`, which the backend holds."""

    def participant(self) -> Participant: ...
    def posts_pending(self, group: str) -> int: ...
    async def send(self, group: str, payload: bytes, qos: QoS, handler: int | None,
                   key: bytes | None = None) -> int: ...
    async def post(self, group: str, payload: bytes, qos: QoS, handler: int | None,
                   key: bytes | None = None) -> bytes | int: ...
    async def flush(self, group: str) -> None: ...
    async def members(self, group: str) -> tuple[str, list[str]]: ...
    async def lock(self, group: str, lock: int, op: str) -> bool: ...
    async def leave(self, group: str) -> None: ...
