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
    """Per-source sequence number."""
    qos: QoS
    timestamp: int | None
    """Global timestamp (always set for totally ordered levels and above)."""
    view: str
    """Membership view ID, ``creator-ip:port/counter``."""
    group: str = ""
    handler: int | None = None


@dataclass(frozen=True, slots=True)
class ViewChange:
    """A new membership view was installed (in order with the messages around it)."""

    view: str
    members: tuple[str, ...]
    group: str = ""


Event = Delivery | ViewChange
