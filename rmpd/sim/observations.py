"""What the invariant checker is told a process did, as typed observations.

A process states what it did in its journal records (``Outbox.record``; a packet's fields by
``rmpd/protocol/journalschema.py``) and hands its application the messages themselves in ``Delivered`` events.
This module reads both once, into the observations the checker takes: a record becomes an observation by its event
(and packet) name; a ``deliver`` record is paired with the ``Delivered`` event of the same packet by the packet's
identity (source, sequence number, QoS), not by position, so a delivery journaled without its event (or the
reverse) shows as a mismatch instead of shifting every pairing after it.  Journals read back from disk carry no
payloads: their deliveries are observed without them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.events import Delivered, Left
from ..protocol.qos import QoS

PacketKey = tuple[str, int, str]
"""A packet's identity as journaled: source, sequence number, QoS name (reliable and unreliable numbers differ)."""


@dataclass(frozen=True, slots=True)
class Observation:
    """Something one process (``node``) was seen to do."""

    node: str


@dataclass(frozen=True, slots=True)
class DataHeld(Observation):
    """``node`` sent or received reliable data packet ``src``#``seq``: it holds it."""

    src: str
    seq: int


@dataclass(frozen=True, slots=True)
class AckHeld(Observation):
    """``node`` sent or received the ACK at ``ts`` of ``view`` from ``src``, which orders ``orders`` after it."""

    view: str
    ts: int
    src: str
    orders: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class TokenAccepted(Observation):
    """``node`` accepted the token of ``view``, claiming to hold everything ordered through ``through``."""

    view: str
    through: int


@dataclass(frozen=True, slots=True)
class ViewEntered(Observation):
    """``node`` installed ``view`` (its application sees it) at timestamp ``ts``."""

    view: str
    ts: int
    members: tuple[str, ...]
    locks: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class ReformationCommitted(Observation):
    """``node`` committed reformation ``version`` of ``view``: ``new_view`` holds ``members``."""

    view: str
    version: int | None
    new_view: str
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MessageDelivered(Observation):
    """``node`` handed packet ``src``#``seq`` to its application.

    ``payloads``: the messages the application got, or None when they are not to be compared (a relayed call,
    the last piece of a message this member joined in the middle of, a journal read back from disk)."""

    src: str
    seq: int
    qos: QoS
    ts: int | None
    view: str
    mono: float
    parts: int
    payloads: tuple[bytes, ...] | None
    relayed: bool = False
    order_view: str | None = None
    """The view the packet was ordered in, when a member delivers it in a later one."""
    need: int | None = None
    """How many holders the engine required (fewer than K when members left before delivery)."""
    keys: tuple[bytes, ...] | None = None
    """The delivered messages' keys, one per message, when the packet is keyed."""
    duplicates: tuple[bytes, ...] = ()
    """Keys of the packet's messages left out: the group had delivered them already."""
    keytable: bool = False
    """A packet of the engine's own key-table transfer: ordered like any other, handed to no application."""


@dataclass(frozen=True, slots=True)
class MembershipEnded(Observation):
    """``node`` left its group or was removed: whatever it joins next is a new membership."""

    reason: str


@dataclass(frozen=True, slots=True)
class Reincarnated(Observation):
    """``node`` restarted under the same process ID: a new application, which holds and delivered nothing yet."""


def payloads_by_packet(events: Iterable[object]) -> dict[PacketKey, list[tuple[bytes, ...]]]:
    """The payloads of each ``Delivered`` event, by the identity of its packet (in order, should one repeat)."""
    found: dict[PacketKey, list[tuple[bytes, ...]]] = defaultdict(list)
    for event in events:
        if isinstance(event, Delivered):
            found[(event.src, event.seq, event.qos.name())].append(event.payloads)
    return found


def observe_step(node: str, records: Iterable[dict[str, Any]], events: Iterable[object]) -> list[Observation]:
    """What one step of process ``node`` shows: its records' observations in order, then the memberships it ended."""
    events = list(events)
    payloads = payloads_by_packet(events)
    seen = [obs for rec in records if (obs := from_record(node, rec, payloads)) is not None]
    seen += [MembershipEnded(node, event.reason) for event in events if isinstance(event, Left)]
    return seen


def from_record(node: str, rec: dict[str, Any],
                payloads: Mapping[PacketKey, list[tuple[bytes, ...]]] | None = None) -> Observation | None:
    """The observation one journal record makes, if the checker has a use for it.  ``payloads``: what the
    application got, by packet (``payloads_by_packet``); None when unknown, and then nothing is compared."""
    event = rec["event"]
    if event in ("send", "recv"):
        packet = rec.get("packet")
        if packet == "data" and rec["qos"] != "unreliable":
            return DataHeld(node, rec["src"], rec["seq"])
        if packet == "ack":
            orders = tuple((src, seq) for src, seq, *_ in rec["orders"])
            return AckHeld(node, rec["view"], rec["ts"], rec["src"], orders)
        return None
    if event == "deliver":
        return _delivered(node, rec, payloads)
    if event == "token":
        return TokenAccepted(node, rec["view"], rec["ts"])
    if event == "view":
        locks = tuple((n, holder) for n, holder in rec.get("locks") or [])
        return ViewEntered(node, rec["view"], rec["ts"], tuple(rec["members"]), locks)
    if event == "recovery" and rec.get("role") == "commit":
        return ReformationCommitted(node, rec["view"], rec.get("version"), rec["new_view"], tuple(rec["members"]))
    return None


def _delivered(node: str, rec: dict[str, Any],
               payloads: Mapping[PacketKey, list[tuple[bytes, ...]]] | None) -> MessageDelivered:
    parts = rec.get("parts", 1)
    relayed = bool(rec.get("relayed"))
    got: tuple[bytes, ...] | None = None
    if payloads is not None and not relayed and not rec.get("incomplete"):
        # A packet journaled as delivered with messages but handed over without them shows as no messages.
        same_packet = payloads.get((rec["src"], rec["seq"], rec["qos"]))
        got = same_packet.pop(0) if parts and same_packet else ()
    keys = rec.get("keys")
    keytable = bool(rec.get("keytable"))
    return MessageDelivered(node, rec["src"], rec["seq"], QoS.parse(rec["qos"]), rec["ts"], rec["view"], rec["mono"],
                            parts, None if keytable else got, relayed, rec.get("order_view"), rec.get("need"),
                            None if keys is None else tuple(bytes.fromhex(key) for key in keys),
                            tuple(bytes.fromhex(key) for key in rec.get("duplicates") or ()), keytable)
