"""Non-members' calls at one member (section 4.5, decided by SCMP: multirpc.py).

The relay judges a non-member's call with its SCMP filter and carries the call and the verdict into the total
order; every member follows that verdict where the call is delivered, so all decide alike; the responder acts on
it.  A probe is answered by the relay at once, outside the order.
"""

from __future__ import annotations

from typing import Any

from rmpd.scmp.filter import Verdict

from .context import GroupContext
from .events import CallToAnswer, Delivered
from .fieldkinds import RELAYED_TAG, CallStatus, Relayed
from .ids import ProcessId
from .limits import check_one_packet
from .multirpc import GroupCalls, ScmpSettings, relay_of
from .packets import Data, NonMemberAck, NonMemberData
from .qos import Level, QoS
from .view import HANDLER_LOCKS


class CallRelay:
    """The group's side of non-members' calls: relaying them, deciding them, answering them."""

    def __init__(self, ctx: GroupContext, scmp: ScmpSettings, wall_offset: float = 0.0) -> None:
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, ctx.config, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.calls = GroupCalls(scmp)
        """The SCMP filter and the RPC server states (multirpc.py)."""
        self.wall_offset = wall_offset
        """Seconds to add to ``now`` for this process's wall clock (the process's; SCMP stamps use it)."""

    def wall_ms(self, now: float) -> int:
        """This process's clock in ms (the caller passes ``now``; ``wall_offset`` maps it to wall-clock time)."""
        return int((now + self.wall_offset) * 1000)

    def newest_stamp(self, now: float) -> int:
        """The newest stamp (ms) a first-contact packet may carry now: ``ahead_ms`` after this member's clock and,
        with stable storage, no later than ``latest``."""
        calls = self.calls
        bound = self.wall_ms(now) + calls.settings.ahead_ms
        if calls.filter.latest is not None:
            bound = min(bound, calls.filter.latest)
        return bound

    def lifetime_horizon(self, now: float) -> int:
        """Stamps (ms) at or below this are older than the filter's estimate of a request's lifetime."""
        return self.wall_ms(now) - self.calls.filter.estimator.estimate

    def raise_latest(self, value: int) -> None:
        """SCMP ``latest`` reached stable storage: calls stamped up to ``value`` may be accepted."""
        self.calls.filter.raise_latest(value)

    def relay(self, packet: NonMemberData, now: float) -> tuple[Relayed, QoS] | None:
        """A non-member's call or message: what this member carries into the order (None: not this member's to
        relay, or not acceptable), with this member's verdict on it.  Calls travel at least totally ordered, so every
        member follows the verdicts in one order.  Probes, calls to a handler nobody holds and calls stamped too early
        are answered at once instead."""
        if packet.handler is not None and not 0 <= packet.handler < HANDLER_LOCKS:
            self.stats["call_bad_handler"] += 1
            return None
        view = self.views.current
        if relay_of(view, packet.handler) != self.pid:
            self.stats["call_not_relay"] += 1
            return None
        probe = bool(packet.flags & NonMemberData.FLAG_PROBE)
        floor = str(self.calls.floor()).encode("ascii") if probe else None
        if packet.handler is not None and view.lock_holder(packet.handler) is None:
            # Nothing is judged or ordered: the caller may send the same call again once someone holds it.
            self._answer_packet(packet, CallStatus.NO_HANDLER, floor, now)
            return None
        if probe:
            self.stats["call_probes_answered"] += 1
            self._answer_packet(packet, CallStatus.READY, floor, now)
            return None
        if len(packet.payload) > self.config.max_packet:
            self.stats["call_too_large"] += 1
            return None
        if not self.calls.should_relay(packet.src, packet.conn, packet.stamp):
            self.stats["call_copy_in_flight"] += 1
            return None
        qos = packet.qos if packet.qos.level >= Level.TOTAL else QoS(Level.TOTAL)
        wall_ms = self.wall_ms(now)
        verdict = self.calls.judge(packet.src, packet.conn, packet.stamp, wall_ms)
        if verdict is Verdict.TOO_EARLY:
            # Refused for now, and nothing kept: told at once, not ordered (the caller retries it often meanwhile).
            self.calls.in_flight.discard((packet.src, packet.conn, packet.stamp))
            self._answer_packet(packet, CallStatus.TOO_EARLY, None, now)
            return None
        body = Relayed(RELAYED_TAG, packet.src, packet.conn, packet.stamp, packet.flags, wall_ms, packet.payload,
                       verdict.value)
        self.stats["calls_relayed"] += 1
        return body, qos

    def deliver(self, packet: Data, call: Relayed, ts: int | None, now: float) -> tuple[bytes, ...]:
        """Every member takes the relay's verdict on the call here, in total order; the responder acts on it.
        Returns what was handed to the application as a delivery (the call, for a new call without handler)."""
        view = self.views.current
        handler = packet.handler
        holder = view.lock_holder(handler) if handler is not None else None
        if handler is not None and holder is None:
            # Every member sees the same lock table here, so every member skips the filter alike: the call is not
            # taken, and the caller may send it again once someone holds the handler.
            self.calls.in_flight.discard((call.caller, call.conn, call.stamp))
            if packet.src == self.pid:
                self._answer(call, CallStatus.NO_HANDLER, None, now)
            return ()
        responder = holder if holder is not None else packet.src
        verdict, _, answer = self.calls.decide(call, packet.src == self.pid, responder == self.pid,
                                               holder is not None)
        accepted = verdict is Verdict.NEW
        self.stats[f"calls_{verdict.value}"] += 1
        self.outbox.record("scmp", now, conn=f"{call.caller}/{call.conn}", msg_ts=call.stamp, accepted=accepted,
                           ts=ts, src=call.caller, qos=packet.qos.name())
        delivered: tuple[bytes, ...] = ()
        if accepted and holder is None:
            self.outbox.event(Delivered(self.group, call.caller, call.stamp, packet.qos, ts, view.view_id, None,
                                        (call.payload,)))
            delivered = (call.payload,)
        elif accepted and holder == self.pid:
            self.outbox.event(CallToAnswer(self.group, call.caller, call.conn, call.stamp, handler or 0,
                                          call.payload, view.view_id))
        if answer is not None and (holder is not None or answer.status is not CallStatus.ACK
                                   or call.flags & NonMemberData.FLAG_ACK):
            self._answer(call, answer.status, answer.reply, now)
        return delivered

    def _answer(self, call: Relayed, status: CallStatus, reply: bytes | None, now: float) -> None:
        self.stats[f"call_answer_{status.name.lower()}"] += 1
        self.outbox.unicast(call.caller, NonMemberAck(self.views.current.view_id, self.pid, call.conn, call.stamp,
                                                      status, reply), now)

    def _answer_packet(self, packet: NonMemberData, status: CallStatus, reply: bytes | None, now: float) -> None:
        """Answer a call (or probe) straight from its packet, before (and instead of) ordering it."""
        self._answer(Relayed(RELAYED_TAG, packet.src, packet.conn, packet.stamp, packet.flags, 0, b""), status,
                     reply, now)

    def reply(self, caller: ProcessId, conn: int, stamp: int, payload: bytes, now: float) -> bool:
        """The application's answer to a :class:`CallToAnswer`; kept for copies of the call.  False when the call
        is no longer this member's to answer.  MessageTooLarge, before anything is kept, for a reply over one
        packet: a kept reply is sent again for every copy of the call."""
        check_one_packet(self.config, payload, "a reply")
        if not self.calls.server.complete((caller, conn), stamp, payload, self.calls.clock):
            self.stats["reply_stale"] += 1
            return False
        self.stats["call_answer_reply"] += 1
        self.outbox.unicast(caller, NonMemberAck(self.views.current.view_id, self.pid, conn, stamp,
                                                 CallStatus.REPLY, payload), now)
        return True

    def reply_acked(self, packet: NonMemberAck) -> None:
        """The caller got our reply: it need not be kept (figure 3-1, REPLY-ACK)."""
        self.calls.server.reply_acked((packet.src, packet.conn), packet.stamp)

    def describe(self, join_floor: int) -> dict[str, Any]:
        """What ``rmp status`` shows of SCMP: the call filter, and the join floor with the joins it refused here."""
        return {**self.calls.filter.describe(), "join_floor": join_floor,
                "joins_refused": self.stats["joins_refused_summary"],
                "joins_too_early": self.stats["joins_refused_too_early"]}
