"""The calling side of multi-RPC: a process sending calls to groups it is not a member of (section 4.5).

A call needs no handshake: it is one Non Member Data packet to the group's multicast address, stamped with a
connection number (the lowest one free among this process's outstanding calls) and this process's clock in ms,
strictly increasing per connection, so (connection, stamp) names the call for the group's SCMP filter.  It is
resent with back-off until answered: the reply (then a REPLY-ACK frees the server's copy), an ACK (a call without
handler is delivered; with one, it is being computed and resent more slowly), or a refusal.  Every copy carries
the same stamp, so the group runs it at most once however many copies arrive.

To a group this process has not heard from, the call goes first as a *probe*, which no member ever runs: a group
that has just formed refuses every call stamped before its floor (it cannot tell them from calls an earlier
incarnation ran), and a call first sent before the group was there would be stamped so.  The probe's answer gives
the floor; the call is then stamped afresh above it, and since no acceptable copy of it was ever sent before, the
fresh stamp cannot make it run twice (SCMP's answer to a rejected message: set the state up first, then send).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from .events import CallAnswered, Event, Transmit
from .ids import ProcessId, ViewId
from .packets import CallStatus, NonMemberAck, NonMemberData, encode
from .qos import Level, QoS
from .timers import Backoff

CALL_ERRORS = {
    "timeout": "no answer from the group in time",
    "unknown": "the group cannot tell whether this call ran before (a copy of a forgotten or pre-restart call)",
    "too-early": "the call is stamped ahead of the group's clocks (this host's clock runs ahead)",
    "no-handler": "no member of the group holds the handler lock the call names",
}
"""Error codes a call can end with, and what they mean."""

DEFAULT_CALL_TIMEOUT = 10.0
"""Seconds a call waits for its answer unless told otherwise: enough for a group that is just forming to answer
(3 s to form with the default join settings, then about 1 s until a new group's floor lets a fresh stamp in)."""

CALL_GRACE = 0.5
"""Seconds a caller's library waits past a call's timeout for the answer before it reports the timeout itself: the
process answers every call by its deadline, and this bounds the wait if that answer is lost on the way."""

NO_HANDLER_GRACE = 3.0
"""Seconds a first call keeps asking a group where nobody holds its handler yet, before it ends ``no-handler``:
``rmp serve`` joins, then takes the lock, and on a busy host the lock can come seconds after the group formed.
Asking again is safe: a call nobody holds the handler of is neither judged nor run."""

RETRY_INITIAL = 0.05
RETRY_MAX = 1.0


@dataclass
class OutgoingCall:
    call_id: int
    group: str
    conn: int
    stamp: int
    packet: NonMemberData
    """What is sent: the call, or while ``probing`` the probe (no payload)."""
    deadline: float
    timer: Backoff
    payload: bytes = b""
    probing: bool = False
    acked: bool = False
    too_early: bool = False
    no_handler_by: float | None = None
    """A probe was answered that nobody holds the handler: the group exists, its server may be about to take the
    lock (``rmp serve`` joins, then locks); unless it is ready by then, the call ends ``no-handler`` at this time."""
    answered: bool = False


class Caller:
    def __init__(self, pid: ProcessId) -> None:
        self.pid = pid
        self.calls: dict[int, OutgoingCall] = {}
        self._by_key: dict[tuple[int, int], int] = {}
        self._last_stamp: dict[int, int] = {}
        self._ids = itertools.count(1)
        self.views: dict[str, ViewId] = {}
        """The last view each group answered from: later calls name it (section 4.5)."""
        self.floors: dict[str, int] = {}
        """The floor each group answered a probe with: later calls are stamped above it without asking again, until
        a call is refused as unknown or meets silence (then the next one probes)."""
        self.datagrams: list[Transmit] = []
        self.events: list[Event] = []

    def take_outputs(self) -> tuple[list[Transmit], list[Event]]:
        """The datagrams and events made since the last take, handed over once (the process drains them after every
        input, so an empty take makes no new lists)."""
        datagrams, events = self.datagrams, self.events
        if datagrams:
            self.datagrams = []
        if events:
            self.events = []
        return datagrams, events

    def call(self, group: str, payload: bytes, handler: int | None, timeout: float, now: float, wall_ms: int,
             qos: QoS | None = None) -> int:
        busy = {c.conn for c in self.calls.values()}
        conn = next(i for i in itertools.count() if i not in busy)
        probing = group not in self.floors
        stamp = max(wall_ms, self._last_stamp.get(conn, 0) + 1, self.floors.get(group, 0) + 1)
        self._last_stamp[conn] = stamp
        flags = NonMemberData.FLAG_ACK | (NonMemberData.FLAG_REPEAT_REPLY if handler is not None else 0)
        packet = NonMemberData(group, self.views.get(group), self.pid, conn, stamp, qos or QoS(Level.TOTAL), flags,
                               handler, payload)
        data = encode(packet)  # first: a call that cannot be encoded must not be kept for its timer to resend
        if probing:
            packet = replace(packet, flags=flags | NonMemberData.FLAG_PROBE, payload=b"")
            data = encode(packet)
        call = OutgoingCall(next(self._ids), group, conn, stamp, packet, now + timeout,
                            Backoff(RETRY_INITIAL, RETRY_MAX), payload, probing)
        self.calls[call.call_id] = call
        self._by_key[(conn, stamp)] = call.call_id
        call.timer.start(now)
        self.datagrams.append(Transmit(None, data, group))
        return call.call_id

    def cancel(self, call_id: int) -> None:
        call = self.calls.pop(call_id, None)
        if call is not None:
            del self._by_key[(call.conn, call.stamp)]

    def receive(self, ack: NonMemberAck, now: float, wall_ms: int) -> None:
        call_id = self._by_key.get((ack.conn, ack.stamp))
        if ack.status is CallStatus.REPLY:
            # Acknowledge every reply, also a late copy for a call already answered, so the server frees it.
            self.datagrams.append(Transmit(ack.src, encode(
                NonMemberAck(ack.view, self.pid, ack.conn, ack.stamp, CallStatus.REPLY_ACK, None))))
        if call_id is None:
            return
        call = self.calls[call_id]
        self.views[call.group] = ack.view
        call.answered = True
        if call.probing:
            if ack.status is CallStatus.READY:
                self._send_after_probe(call, ack.reply or b"", now, wall_ms)
            elif ack.status is CallStatus.NO_HANDLER and call.no_handler_by is None:
                call.no_handler_by = min(call.deadline, now + NO_HANDLER_GRACE)
                if ack.reply is not None and ack.reply.isdigit() and len(ack.reply) <= 20:
                    self.floors[call.group] = int(ack.reply)  # the group is there: later calls need not ask
            return
        if ack.status is CallStatus.REPLY:
            self._finish(call, ack.reply or b"")
        elif ack.status is CallStatus.ACK:
            if call.packet.handler is None:
                self._finish(call, None)
            elif not call.acked:
                call.acked = True
                call.timer.interval = RETRY_MAX
        elif ack.status is CallStatus.TOO_EARLY:
            call.too_early = True  # keep sending the same call, often: the group's clocks catch up
            call.timer.interval = RETRY_INITIAL
        elif ack.status is CallStatus.UNKNOWN:
            self.floors.pop(call.group, None)  # the group's floor moved (it restarted?): the next call asks
            self._finish(call, None, "unknown")
        elif ack.status is CallStatus.NO_HANDLER:
            self._finish(call, None, "no-handler")

    def _send_after_probe(self, call: OutgoingCall, floor_text: bytes, now: float, wall_ms: int) -> None:
        """The group can take calls stamped after ``floor``: stamp the call afresh above it and send it."""
        if not floor_text.isdigit() or len(floor_text) > 20:
            return  # not an answer we understand: keep probing until the deadline
        floor = self.floors[call.group] = int(floor_text)
        stamp = max(wall_ms, self._last_stamp.get(call.conn, 0) + 1, floor + 1)
        self._last_stamp[call.conn] = stamp
        del self._by_key[(call.conn, call.stamp)]
        self._by_key[(call.conn, stamp)] = call.call_id
        probe = call.packet
        call.stamp, call.probing, call.no_handler_by = stamp, False, None  # the handler is held: no grace to run out
        call.packet = replace(probe, view=self.views.get(call.group), stamp=stamp,
                              flags=probe.flags & ~NonMemberData.FLAG_PROBE, payload=call.payload)
        call.timer.start(now)
        self.datagrams.append(Transmit(None, encode(call.packet), call.group))

    def handle_timer(self, now: float) -> None:
        for call in list(self.calls.values()):
            if call.probing and call.no_handler_by is not None and now >= call.no_handler_by:
                self._finish(call, None, "no-handler")
            elif now >= call.deadline:
                if not call.answered:
                    self.floors.pop(call.group, None)  # nobody answered: ask the group afresh next time
                self._finish(call, None, "too-early" if call.too_early else "timeout")
            elif call.timer.expired(now):
                call.timer.back_off(now)
                packet = call.packet
                if self.views.get(call.group) != packet.view:
                    packet = call.packet = replace(packet, view=self.views.get(call.group))
                self.datagrams.append(Transmit(None, encode(packet), call.group))

    def get_timer(self) -> float | None:
        # ``no_handler_by`` counts only while probing, as in ``handle_timer``: a deadline it would not act on comes
        # back at once, again and again, without the clock moving.
        deadlines = [min(c.deadline, c.timer.deadline or c.deadline,
                         c.no_handler_by if c.probing and c.no_handler_by is not None else c.deadline)
                     for c in self.calls.values()]
        return min(deadlines) if deadlines else None

    def _finish(self, call: OutgoingCall, reply: bytes | None, error: str | None = None) -> None:
        self.cancel(call.call_id)
        reason = CALL_ERRORS.get(error, "") if error else ""
        if error == "timeout" and call.acked:
            reason = "the group accepted the call, but no reply came in time"
        self.events.append(CallAnswered(call.call_id, call.group, reply, error, reason))
