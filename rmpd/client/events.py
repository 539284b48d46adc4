"""What iterating a Group yields: deliveries and view changes, in the order the group delivered them."""

from __future__ import annotations

from dataclasses import dataclass

from rmpd.protocol.qos import QoS


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


@dataclass(frozen=True, slots=True)
class ViewChange:
    """A new membership view was installed (in order with the messages around it)."""

    view: str
    members: tuple[str, ...]
    group: str = ""


Event = Delivery | ViewChange
