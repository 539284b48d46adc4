"""What iterating a Group yields: deliveries and view changes, in the order the group delivered them, what the
program is told when its membership ends without a leave: the messages it sent that it will not see delivered
(Undelivered), and that the process joins the group again (Rejoining); and the group's state (State) for a
program that asked for it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
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
    answer: bool = False
    """This program holds the lock of the message's ``handler`` (``Group.lock``): it is the member to answer it
    (paper 3.3); every member delivers the message, one answers."""
    key: bytes | None = None
    """The key the sender gave the message (``send(..., key=...)``): the group delivers each key at most once."""


make_delivery = positional_maker(Delivery)
"""Delivery(...) with every field given in order, built faster: the client library makes one per delivered
message."""


def deliveries_of(group: str, source: str, seq: int, qos: QoS, timestamp: int | None, view: str,
                  handler: int | None, payloads: Sequence[bytes], first: int = 0,
                  answer: bool = False, keys: Sequence[bytes] | None = None) -> list[Delivery]:
    """One Delivery per message of a delivered packet (its messages share every field but the payload, the index
    and the key; ``first`` is the index of the first; ``keys``: one per payload, or None): the one place the client
    library builds them, from a daemon's frame and from the embedded engine alike."""
    make = make_delivery
    if keys is not None:
        return [make(payload, source, seq, qos, timestamp, view, group, handler, index, answer, key)
                for index, (payload, key) in enumerate(zip(payloads, keys, strict=True), first)]
    if len(payloads) == 1:  # a packet of one message, common with large ones: no comprehension to run
        return [make(payloads[0], source, seq, qos, timestamp, view, group, handler, first, answer, None)]
    return [make(payload, source, seq, qos, timestamp, view, group, handler, index, answer, None)
            for index, payload in enumerate(payloads, first)]


@dataclass(frozen=True, slots=True)
class ViewChange:
    """A new membership view was installed (in order with the messages around it)."""

    view: str
    members: tuple[str, ...]
    group: str = ""


@dataclass(frozen=True, slots=True)
class Undelivered:
    """Messages this program sent to the group that it will not see delivered: the process's membership ended
    first (it was cut off, its side fell below the minimum partition, reformations kept failing).

    ``seqs`` are the sequence numbers ``send`` returned (posted messages have theirs too, though ``post`` does not
    return them); messages sent together may share one number (they travel in one packet), and then the number
    stands for all of them.  Every number ``send`` returned (at any QoS but unreliable) ends up either in a Delivery
    of this program's own message, an :class:`AlreadyDelivered`, or an Undelivered.  Not delivered *here*: the
    members that went on without this process may still have delivered some of them (those that reached them
    before the cut), so a program that sends one again may have it delivered twice, unless it sends it with the
    same key (docs/protocol.md, "Nothing lost in silence"; README, "Exactly once")."""

    seqs: tuple[int, ...]
    reason: str
    """Why the membership ended, as the protocol says it (e.g. the partition below the minimum)."""
    group: str = ""
    ids: tuple[bytes | int, ...] = ()
    """The same messages by what ``post`` returned for them: each keyed message's key (sent or posted), and each
    message posted without a key by its number."""


@dataclass(frozen=True, slots=True)
class AlreadyDelivered:
    """A keyed message this program sent that the group dropped: it had delivered that key already (an earlier
    copy, this program's or another's), at ``timestamp`` in ``view``.  Like the program's own Delivery, it says the
    message is done: sending it again is not needed."""

    key: bytes
    timestamp: int
    """The global timestamp at which the group delivered the key."""
    view: str
    """The view (``creator-ip:port/counter``) in which the group delivered the key."""
    group: str = ""


@dataclass(frozen=True, slots=True)
class Rejoining:
    """The process's membership of the group ended without the program leaving (cut off, below the minimum
    partition, or its view merged into another), and it joins the group again by itself.  The Group goes on:
    until the next ViewChange, ``send`` and ``post`` are refused with ``not-member`` (the message says the process
    is rejoining); an Undelivered before this event names what the ended membership did not deliver."""

    reason: str
    group: str = ""


@dataclass(frozen=True, slots=True)
class State:
    """The group's state, for a program that joined with ``state=True``: its first event, and again after each
    ``Rejoining``.  ``data`` is what a member's ``Group.provide_state`` callback returned at the cut (the place of
    this program's request in the group's total order); every event after it follows the cut.  None when this
    process was alone in its view: the program starts the state."""

    data: bytes | None
    provider: str | None
    """The process ID of the member that sent it (None with no state)."""
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


Event = Delivery | ViewChange | Undelivered | AlreadyDelivered | Rejoining | State

MessageId = bytes | int
"""What ``Group.post`` returns for a message, and ``Undelivered.ids`` names it by: its key, or the number the
library gave a message posted without one."""
