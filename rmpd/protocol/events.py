"""What the engine hands to its caller: datagrams to transmit and events for the application."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .ids import ProcessId, ViewId
from .qos import QoS
from .records import positional_maker


@dataclass(frozen=True, slots=True)
class Transmit:
    """A datagram to send: to ``group``'s multicast address when ``dest`` is None, else unicast to ``dest``."""

    dest: ProcessId | None
    data: bytes
    group: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """A message handed to the application, in the order its QoS requires."""

    group: str
    src: ProcessId
    seq: int
    qos: QoS
    ts: int | None
    view: ViewId
    payload: bytes
    handler: int | None
    index: int = 0
    """Position in its packet: messages packed under load share the packet's sequence number."""
    key: bytes | None = None
    """The key it was sent with (exactly-once sends), or None."""


make_delivered_message = positional_maker(DeliveredMessage)
"""DeliveredMessage(...) with every field given in order, built faster."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """The messages of one packet, handed to the application together, in the order its QoS requires.

    One event per packet, not per message: under load a packet carries tens of messages, which are always
    delivered one after the other, and the daemon forwards them to its clients as one run.  An object per message
    made on the way was a tenth of a receiving daemon's time.  ``messages()`` gives them one by one."""

    group: str
    src: ProcessId
    seq: int
    qos: QoS
    ts: int | None
    view: ViewId
    handler: int | None
    payloads: tuple[bytes, ...]
    answer: bool = False
    """This process holds the lock of the packet's handler in the view it is delivered in: it is the member to
    answer the messages (paper 3.3, handlers)."""
    keys: tuple[bytes, ...] | None = None
    """The messages' keys, one per payload, for keyed messages (exactly-once sends); None for messages sent
    without.  A keyed message the group had delivered already is not among the payloads."""

    def messages(self) -> list[DeliveredMessage]:
        make = make_delivered_message
        keys = self.keys or (None,) * len(self.payloads)
        return [make(self.group, self.src, self.seq, self.qos, self.ts, self.view, payload, self.handler, index,
                     key) for index, (payload, key) in enumerate(zip(self.payloads, keys, strict=True))]


make_delivered = positional_maker(Delivered)
"""Delivered(...) with every field given in order, built faster: the engine makes one per delivered packet."""


def messages_of(events: Iterable[object]) -> list[DeliveredMessage]:
    """The messages delivered in ``events``, one DeliveredMessage each, in delivery order."""
    return [message for event in events if isinstance(event, Delivered) for message in event.messages()]


@dataclass(frozen=True, slots=True)
class ViewInstalled:
    """A membership view was installed (delivered in order with the messages around it)."""

    group: str
    view: ViewId
    members: tuple[ProcessId, ...]
    ts: int


@dataclass(frozen=True, slots=True)
class SendRefused:
    """An application send could not be accepted; ``reason`` says why."""

    group: str
    reason: str


@dataclass(frozen=True, slots=True)
class LockResult:
    """The answer to this process's lock or unlock request, delivered in order with the view change."""

    group: str
    lock: int
    op: str
    granted: bool


@dataclass(frozen=True, slots=True)
class Left:
    """This process left the group (its leave was committed and what it held is stable), or was removed."""

    group: str
    reason: str
    rejoining: bool = False
    """The process joins the group again by itself, as a new member (it was cut off, or its view merged into
    another): the application's membership goes on, in the view that follows."""


@dataclass(frozen=True, slots=True)
class UndeliveredSends:
    """Own messages this member will not see delivered: its membership stopped before they were ordered.  ``seqs``
    are the sequence numbers ``send`` returned; the members that went on without this one may still have ordered
    those that reached them before it was cut off (docs/protocol.md, "Nothing lost in silence")."""

    group: str
    seqs: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class AlreadyDelivered:
    """A keyed message of this process was not delivered: the group had delivered its key already, at ``ts`` in
    ``view`` (rmpd.protocol.keys).  ``seq`` is the sequence number ``send`` returned for this copy.  Told only at
    the process that sent the copy; for its sender, the message is done as if delivered."""

    group: str
    src: ProcessId
    seq: int
    key: bytes
    ts: int
    view: ViewId


@dataclass(frozen=True, slots=True)
class JoinFailed:
    """A join could not complete: ``reason`` says why (for example no existing group answered)."""

    group: str
    reason: str


@dataclass(frozen=True, slots=True)
class CallToAnswer:
    """A non-member's call, accepted as new, for this member to answer (it holds the call's handler lock).

    Answer with ``reply(group, caller, conn, stamp, payload)``; the reply is kept for copies of the call.
    """

    group: str
    caller: ProcessId
    conn: int
    stamp: int
    handler: int
    payload: bytes
    view: ViewId


@dataclass(frozen=True, slots=True)
class CallAnswered:
    """The outcome of this process's own call to a group: ``reply`` (None for a call without handler, once
    delivered), or ``error`` (a code from ``rmpd.protocol.calls.CALL_ERRORS``) with ``reason``."""

    call_id: int
    group: str
    reply: bytes | None
    error: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StatusAsked:
    """``asker`` (this process itself, or another that sent a Status Query) asks for this process's status of
    ``group``: answer with ``answer_status(asker, group, query, report)``, or not at all."""

    group: str
    asker: ProcessId
    query: int


@dataclass(frozen=True, slots=True)
class StatusGathered:
    """The end of this process's ``ask_status``: every member asked answered, or the timeout passed.  ``reports``
    holds the answers by member, in ``members`` order; a member missing from it did not answer in time."""

    group: str
    query: int
    members: tuple[ProcessId, ...]
    reports: tuple[tuple[ProcessId, bytes], ...]


Event = (Delivered | ViewInstalled | SendRefused | LockResult | Left | UndeliveredSends | JoinFailed | CallToAnswer
         | CallAnswered | StatusAsked | StatusGathered | AlreadyDelivered)
