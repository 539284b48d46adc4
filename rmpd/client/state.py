"""State transfer: a program that joins a group gets the group's state from a member, cut at one point of the
group's total order, so that the state plus the deliveries that follow it equal what every old member has.

It is a protocol of the client library, carried by the group's own totally ordered messages (handler
:data:`rmpd.protocol.view.LIBRARY_HANDLER`, kept out of what programs read), so the daemon connection and the
embedded node give it alike, and every member sees its steps in the same order:

1. The joiner multicasts a *request*.  The request's place in the total order is the cut: the joiner drops what
   it is delivered before its request (the state holds it) and holds back what follows until the state is in.
2. Every member that provides state (``Group.provide_state``) and has it complete takes a snapshot when its
   program has read everything before the request, and multicasts an *offer*.
3. The first offer delivered, from a member still in the view, wins; its member multicasts the snapshot in
   *chunks*.  Every member sees the same offers, views and chunks in the same order, so all agree on who sends.
4. If that member leaves the view before its last chunk (or the program leaves the group while its daemon stays:
   the daemon says so in the order), the next offer's member (whose snapshot is of the same cut) sends again from
   the start; the joiner drops the partial state.  With no offer left and none arriving within ``timeout`` the
   joiner's Group ends with ``state-unavailable``.

Each program is a participant, also where several share one daemon (one process ID). A joiner alone in its view,
with no other program of its daemon that joined with ``state``, starts with no state (``State.data`` None). A
membership that ends by itself (``Rejoining``) asks again once the process is in a view: it takes the state of the
view it joins, as the paper has cut-off members rejoin as new ones. Messages below TOTAL order are not cut: one sent
near the cut may be in the state and delivered after it too, or in neither.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import trio

from rmpd.localapi import STATE_GONE
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER

from .errors import RmpdError
from .events import Delivery, Event, Rejoining, State, ViewChange

CHUNK_SIZE = 256 * 1024
"""Bytes of state per chunk message: large enough that a 64 MiB state is 256 messages, small enough that the
chunks of a transfer interleave with the group's other traffic."""

STATE_TIMEOUT = 30.0
"""Seconds a joiner waits for an offer it can use (after its request is delivered, or after the member sending
its state left) before its Group ends with ``state-unavailable``."""

STATE_QOS = QoS.TOTAL

REQUEST, OFFER, CHUNK, GONE = "req", "offer", "chunk", STATE_GONE
SHAPES: dict[str, tuple[type, ...]] = {
    REQUEST: (str, str, int),  # kind, requester, request number
    OFFER: (str, str, int, int),  # ..., offer number: the offering program's number in its process
    CHUNK: (str, str, int, int, int, int, bytes),  # ..., chunk index, chunk count, bytes
    GONE: (str, str, int),  # kind, member, program number: a daemon's client that took part left the group
}


def encode(*fields: Any) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def decode(payload: bytes) -> list[Any] | None:
    """A control message's fields, or None for one that is not well formed (dropped and counted)."""
    try:
        fields = msgpack.unpackb(payload, raw=False, max_array_len=8, max_map_len=0, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(fields, list) or not fields or fields[0] not in SHAPES:
        return None
    shape = SHAPES[fields[0]]
    if len(fields) != len(shape) or not all(type(value) is kind for value, kind in zip(fields, shape, strict=True)):
        return None
    return fields


Offerer = tuple[str, int]
"""An offer's member (process ID) and the offering program's number in it (the daemon's number for its client; 0
on an embedded node): several programs on one daemon share a process ID."""


@dataclass(slots=True)
class Transfer:
    """One request, as every member follows it: its offers in delivery order and the one whose member sends."""

    requester: str
    offers: list[Offerer] = field(default_factory=list)
    sender: Offerer | None = None
    left: set[Offerer] = field(default_factory=set)
    """Offers whose member left the view: never picked again."""
    snapshot: tuple[int, bytes] | None = None
    """This program's own offer number and snapshot, while it may be asked to send it."""
    streaming: trio.CancelScope | None = None


@dataclass(slots=True)
class Asking:
    """This program's own request, from the join until its state is in."""

    rid: int
    cut: bool = False
    """The request was delivered: what follows is held back until the state is in."""
    held: list[Event] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    deadline: float = math.inf


SendControl = Callable[[bytes], Awaitable[int]]
Spawn = Callable[[Callable[[], Awaitable[None]]], None]


class StateTransfer:
    """One Group's part in its state transfers: asking, offering and sending, driven by the events its program
    reads, in the order the group delivered them (``look_at``)."""

    def __init__(self, group: str, me: str, send: SendControl, spawn: Spawn, largest_message: int,
                 number: int = 0) -> None:
        self.group = group
        self.me = me
        self.number = number
        """This program's number in its process: with ``me``, what names its offers."""
        self._send = send
        self._spawn = spawn
        self._largest = largest_message
        self.provider: Callable[[], bytes] | None = None
        self.chunk_size = CHUNK_SIZE
        self.timeout = STATE_TIMEOUT
        self.wanted = False
        """The program asked for state on joining: a membership that ends by itself asks again."""
        self.complete = True
        """This program's state is whole (not waiting for a transfer): it may offer."""
        self.asking: Asking | None = None
        self._ask_after_view = False
        self.transfers: dict[int, Transfer] = {}
        self.members: tuple[str, ...] = ()
        self.view = ""
        self.chunks_sent = 0
        self.dropped = 0
        """Control messages that were not well formed."""

    # Asking

    async def ask_first(self, view: str, members: list[str], peers: int) -> list[Event]:
        """Ask for the group's state on joining (in ``view``); the events to hand the program now.  Returns once
        the process accepted the request: what the program sends next is ordered after its cut, so the program
        sees it delivered, as any message it sends.  ``peers``: other programs of this process that took part in
        the transfer when this one joined (clients of one daemon), each holding the state as another member
        would; with none, and no other member, the program starts the state."""
        request = self._request_for(view, members, peers)
        if request is None:
            return [self._arrived(None, None)]
        await self._send_quietly(request)
        return []

    def ask(self, view: str, members: list[str]) -> list[Event]:
        """Ask again, in the view the process joined after its membership ended by itself (the request goes out
        in the background); the events to hand the program now.  Every program of the process rejoins with it,
        so only the view says whether another holds the state."""
        request = self._request_for(view, members, 0)
        if request is None:
            return [self._arrived(None, None)]
        self._spawn(lambda: self._send_quietly(request))
        return []

    def _request_for(self, view: str, members: list[str], peers: int) -> bytes | None:
        """Start asking: the request to send, or None when nobody else can hold the state."""
        self.wanted, self.complete = True, False
        self.view, self.members = view, tuple(members)
        if list(members) == [self.me] and not peers:
            return None
        rid = secrets.randbits(62)
        self.asking = Asking(rid, deadline=trio.current_time() + self.timeout)
        return encode(REQUEST, self.me, rid)

    @property
    def waiting(self) -> bool:
        """The program waits for its state: reading must give up at ``deadline``."""
        return self.asking is not None

    @property
    def deadline(self) -> float:
        return self.asking.deadline if self.asking is not None else math.inf

    def timed_out(self) -> RmpdError:
        return RmpdError("state-unavailable", f"no member of {self.group!r} sent its state within "
                                              f"{self.timeout:g} s (members offer it with Group.provide_state)")

    def _arrived(self, data: bytes | None, provider: str | None) -> State:
        self.complete = True
        return State(data, provider, self.view, self.members, self.group)

    # Reading

    def needs_caught_up(self, event: Event) -> bool:
        """Whether looking at ``event`` may take a snapshot: the program must have handled every event before it
        (a batch stops in front of it)."""
        return (self.provider is not None and type(event) is Delivery and event.handler == LIBRARY_HANDLER
                and self.complete)

    def look_at(self, event: Event) -> list[Event]:
        """The events to hand the program for ``event`` (delivered next), after acting on it."""
        if type(event) is Delivery:
            if event.handler == LIBRARY_HANDLER:
                return self._control(event)
            return self._pass(event)
        if isinstance(event, ViewChange):
            return self._view_changed(event)
        if isinstance(event, Rejoining):
            return [*self._membership_ended(), event]
        return self._pass(event)

    def _pass(self, event: Event) -> list[Event]:
        asking = self.asking
        if asking is None:
            return [event]
        if not asking.cut:
            # Before the cut: deliveries are in the state, and the state's event names the view; what is about
            # the program's own messages is told at once.
            return [] if type(event) is Delivery or isinstance(event, ViewChange) else [event]
        asking.held.append(event)
        return []

    def _view_changed(self, event: ViewChange) -> list[Event]:
        self.view, self.members = event.view, event.members
        members = set(event.members)
        for rid, transfer in list(self.transfers.items()):
            if transfer.requester not in members and (self.asking is None or rid != self.asking.rid):
                self._forget(rid)
            elif transfer.sender is not None and transfer.sender[0] not in members:
                self._next_sender(rid, transfer)
        if self._ask_after_view:
            self._ask_after_view = False
            return self.ask(event.view, list(event.members))
        return self._pass(event)

    def _membership_ended(self) -> list[Event]:
        """The process is out of its view: every transfer it followed ended with it, and it asks again in the
        next.  Held deliveries are dropped (the next state holds what the group went on with); what was held about
        the program's own messages is handed over."""
        for rid in list(self.transfers):
            self._forget(rid)
        held = self.asking.held if self.asking is not None else []
        self.asking = None
        if self.wanted:
            self.complete = False
            self._ask_after_view = True
        return [event for event in held if not (type(event) is Delivery or isinstance(event, ViewChange))]

    def _control(self, event: Delivery) -> list[Event]:
        fields = decode(event.payload)
        if fields is None:
            self.dropped += 1
            return []
        kind, requester, rid = fields[0], fields[1], fields[2]
        if kind == REQUEST:
            return self._request(event.source, requester, rid)
        if kind == GONE:
            return self._participant_gone(event.source, (requester, rid))
        transfer = self.transfers.get(rid)
        if transfer is None:
            return []
        if kind == OFFER:
            transfer.offers.append((event.source, fields[3]))
            if transfer.sender is None:
                self._next_sender(rid, transfer)
            return []
        return self._chunk(rid, transfer, (event.source, fields[3]), fields[4], fields[5], fields[6])

    def _request(self, source: str, requester: str, rid: int) -> list[Event]:
        if source != requester or rid in self.transfers:
            self.dropped += 1
            return []
        self.transfers[rid] = transfer = Transfer(requester)
        asking = self.asking
        if asking is not None and rid == asking.rid:
            asking.cut = True
            asking.deadline = trio.current_time() + self.timeout
        elif self.provider is not None and self.complete:
            offer = self.number
            transfer.snapshot = (offer, bytes(self.provider()))
            self._spawn(lambda: self._send_quietly(encode(OFFER, requester, rid, offer)))
        return []

    def _participant_gone(self, source: str, gone: Offerer) -> list[Event]:
        """A program of another member's process left the group while its process stays in the view: its offers
        are never picked, and a transfer it was sending goes on from the next offer, as when a member leaves."""
        if source != gone[0]:
            self.dropped += 1
            return []
        for rid, transfer in list(self.transfers.items()):
            if transfer.sender == gone:
                self._next_sender(rid, transfer)
            else:
                transfer.left.add(gone)
        return []

    def _next_sender(self, rid: int, transfer: Transfer) -> None:
        """The first offer whose member is in the view and never left it sends (from its first chunk); every
        member picks the same."""
        members = set(self.members)
        sent_before = transfer.sender
        if sent_before is not None:
            transfer.left.add(sent_before)
        if transfer.streaming is not None:
            transfer.streaming.cancel()
            transfer.streaming = None
        transfer.sender = next((offerer for offerer in transfer.offers
                                if offerer[0] in members and offerer not in transfer.left), None)
        asking = self.asking
        if asking is not None and rid == asking.rid:
            asking.chunks.clear()
            if transfer.sender is None and sent_before is not None:
                asking.deadline = trio.current_time() + self.timeout
            elif transfer.sender is not None:
                asking.deadline = math.inf
        if transfer.sender is not None and transfer.snapshot is not None \
                and transfer.sender == (self.me, transfer.snapshot[0]):
            self._start_sending(rid, transfer)

    def _start_sending(self, rid: int, transfer: Transfer) -> None:
        assert transfer.snapshot is not None
        offer, data = transfer.snapshot
        scope = transfer.streaming = trio.CancelScope()
        size = max(1, min(self.chunk_size, self._largest - 1024))
        count = max(1, math.ceil(len(data) / size))

        async def send_chunks() -> None:
            with scope:
                for index in range(count):
                    await self._send(encode(CHUNK, transfer.requester, rid, offer, index, count,
                                            data[index * size:(index + 1) * size]))
                    self.chunks_sent += 1

        self._spawn(lambda: self._quietly(send_chunks))

    def _chunk(self, rid: int, transfer: Transfer, offerer: Offerer, index: int, count: int,
               chunk: bytes) -> list[Event]:
        if offerer != transfer.sender:
            return []  # from a member that stopped sending (it left the view): its successor starts again
        asking = self.asking
        if asking is not None and rid == asking.rid:
            if index != len(asking.chunks):
                self.dropped += 1
                return []
            asking.chunks.append(chunk)
        if index + 1 < count:
            return []
        self._forget(rid)
        if asking is None or rid != asking.rid:
            return []
        self.asking = None
        return [self._arrived(b"".join(asking.chunks), offerer[0]), *asking.held]

    def _forget(self, rid: int) -> None:
        transfer = self.transfers.pop(rid, None)
        if transfer is not None and transfer.streaming is not None:
            transfer.streaming.cancel()

    def close(self) -> None:
        for rid in list(self.transfers):
            self._forget(rid)

    async def _send_quietly(self, payload: bytes) -> None:
        await self._quietly(lambda: self._send(payload))

    async def _quietly(self, step: Callable[[], Awaitable[Any]]) -> None:
        """A control message the group refuses (the membership ended, the group is left) is not sent: the
        membership's end restarts the transfer, or the program has left."""
        with contextlib.suppress(RmpdError):
            await step()

