"""What iterating a Group yields: deliveries and view changes, in the order the group delivered them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rmpd.protocol.qos import QoS
from rmpd.protocol.records import positional_maker


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message delivered to this member, with its identity, QoS, global timestamp and view."""

    payload: bytes
    source: str
    """Sender's process ID (``ip:port``)."""
    seq: int
    """Per-source sequence number of the packet that carried the message (see ``index``)."""
    qos: QoS
    timestamp: int | None
    """Global timestamp (always set for totally ordered levels and above)."""
    view: str
    """Membership view ID, ``creator-ip:port/counter``."""
    group: str = ""
    handler: int | None = None
    index: int = 0
    """Position in its packet: under load small messages are packed, and share the packet's ``seq``; (source,
    seq, index) identifies a message."""


make_delivery = positional_maker(Delivery)
"""Delivery(...) with every field given in order, built faster: the client library makes one per delivered
message."""


@dataclass(frozen=True, slots=True)
class ViewChange:
    """A new membership view was installed (in order with the messages around it)."""

    view: str
    members: tuple[str, ...]
    group: str = ""


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A non-member's call, for this member to answer because it holds the call's handler lock.

    The group ran it through its SCMP filter first: it is new, and will not be handed out again, however many
    copies the caller sends.  ``await request.reply(data)`` answers it (the reply is kept for the caller's
    retries)."""

    payload: bytes
    caller: str
    """The calling process's ID (``ip:port``)."""
    conn: int
    stamp: int
    """The caller's connection number and timestamp (ms): together they name the call."""
    handler: int
    group: str
    view: str
    _reply: Callable[[CallRequest, bytes], Awaitable[None]] = field(repr=False, compare=False)

    async def reply(self, payload: bytes) -> None:
        """Send the answer to the caller; RmpdError ``stale-call`` when this call is no longer ours to answer."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        await self._reply(self, bytes(payload))


Event = Delivery | ViewChange
