"""Multi-RPC for non-members (RMP section 4.5) decided by SCMP at delivery time: one group's server side.

A non-member's Non Member Data reaches every member; one member, the *relay* (the holder of the handler lock the
call names, else the first member of the view), carries it into the total order as a Data packet with a
:class:`~rmpd.protocol.packets.Relayed` body that also records the relay's clock.  Every member then runs the same
SCMP filter on the same calls, in the same order, with the same clock, so they decide alike; the *responder* (the
handler lock holder, or the relay for calls without a handler) acts on the decision: it runs a new call, answers a
copy with an ACK while computing or with the stored reply after, and tells the caller when a copy's fate is
unknown.  See docs/protocol.md, "Non-members and SCMP", for why this keeps at-most-once across failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rmpd.scmp.filter import ScmpFilter, Verdict
from rmpd.scmp.lifetime import LifetimeEstimator, make_estimator
from rmpd.scmp.rpc import Action, RpcServer

from .ids import ProcessId
from .packets import CallStatus, Relayed
from .view import View


@dataclass(frozen=True)
class ScmpSettings:
    """How a group's SCMP filter starts: ``upper`` (crash recovery and the joiner floor, see ``start_upper``) and
    ``latest`` (None: no stable storage, the non-resilient server of figure 2-1)."""

    upper: int = 0
    latest: int | None = None
    estimator: str = "limited"
    lifetime_ms: int = 2000
    window: int = 64
    spikes: int = 2
    p: int | None = None
    ahead_ms: int = 1000
    """A call stamped more than this after the relay's clock is refused as too early (the caller's clock runs
    ahead); this bounds every accepted stamp by a member's clock, which is what a joiner's floor relies on."""
    skew_ms: int = 1000
    """The largest clock difference between members that the joiner floor allows for."""
    keep_ms: int = 300_000
    """The K of SCMP figure 3-1: a stored reply is kept at least this long."""
    persist_ahead_ms: int = 3000
    """With stable storage: ``latest`` is kept this far ahead of the clock, rewritten when half of it is used up
    (a write every ``persist_ahead_ms / 2`` at most, whatever the traffic)."""

    def make_estimator(self) -> LifetimeEstimator:
        return make_estimator(self.estimator, lifetime=self.lifetime_ms, window=self.window, spikes=self.spikes,
                              p=self.p)


def start_upper(settings: ScmpSettings, wall_ms: int) -> int:
    """``upper`` for a member that starts now: above every stamp the group may have accepted before it arrived.

    Every accepted stamp was at most a relay's clock plus ``ahead_ms``, and a relay's clock is at most our clock
    plus ``skew_ms``; a persisted ``latest`` (after a crash) bounds what we accepted ourselves.
    """
    return max(settings.upper, wall_ms + settings.ahead_ms + settings.skew_ms)


def relay_of(view: View, handler: int | None) -> ProcessId:
    """The member that carries a call into the order: the handler's holder, else the view's first member."""
    holder = view.lock_holder(handler) if handler is not None else None
    return holder if holder is not None else view.members[0]


@dataclass
class Answer:
    """What the responder sends the caller about one delivered call (None: nothing)."""

    status: CallStatus
    reply: bytes | None = None


@dataclass
class GroupCalls:
    settings: ScmpSettings
    server: RpcServer = field(init=False)
    clock: int = 0
    """The order clock: the largest relay clock delivered so far (the same at every member)."""
    in_flight: set[tuple[ProcessId, int, int]] = field(default_factory=set)
    """Calls this member relayed that are not yet delivered: further copies are not relayed again."""

    def __post_init__(self) -> None:
        s = self.settings
        self.server = RpcServer(ScmpFilter(s.make_estimator(), upper=s.upper, latest=s.latest), keep=s.keep_ms)

    @property
    def filter(self) -> ScmpFilter:
        return self.server.filter

    def should_relay(self, caller: ProcessId, conn: int, stamp: int) -> bool:
        key = (caller, conn, stamp)
        if key in self.in_flight or len(self.in_flight) >= 4096:
            return False
        self.in_flight.add(key)
        return True

    def decide(self, call: Relayed, responder: bool, has_handler: bool) -> tuple[Verdict, Action, Answer | None]:
        """Run the filter on a delivered call; the answer is for the responder to send (None otherwise)."""
        self.in_flight.discard((call.caller, call.conn, call.stamp))
        self.clock = max(self.clock, call.clock)
        conn = (call.caller, call.conn)
        action, verdict, stored = self.server.call(conn, call.stamp, self.clock, self.clock + self.settings.ahead_ms)
        if action is Action.START and not has_handler:
            self.server.complete(conn, call.stamp, b"", self.clock)  # delivered is done: copies get an ACK
        elif action is Action.START and not responder:
            self.server.abandon(conn, call.stamp)  # only the responder computes; the filter entry stays
        self.server.collect(self.clock)
        if not responder:
            return verdict, action, None
        status = RESPONDER_ANSWERS.get((action, has_handler))
        if status is None:
            return verdict, action, None
        if action is Action.REFUSE and verdict is Verdict.TOO_EARLY:
            status = CallStatus.TOO_EARLY
        return verdict, action, Answer(status, stored if status is CallStatus.REPLY else None)


RESPONDER_ANSWERS: dict[tuple[Action, bool], CallStatus] = {
    (Action.START, False): CallStatus.ACK,
    (Action.ACK, False): CallStatus.ACK,
    (Action.ACK, True): CallStatus.ACK,
    (Action.RESEND, False): CallStatus.ACK,
    (Action.RESEND, True): CallStatus.REPLY,
    (Action.REFUSE, False): CallStatus.UNKNOWN,
    (Action.REFUSE, True): CallStatus.UNKNOWN,
}
"""The call decisions (SCMP figure 3-1) as a table: what the responder tells the caller, by the server's action
and whether the call names a handler.  A new call with a handler is answered by the handler's reply; one without
is done once delivered, so it and its copies get an ACK.  A refused call's fate is unknown, or, when its stamp is
after ``latest``, it is too early (``TOO_EARLY`` replaces ``UNKNOWN``).  An ignored copy gets nothing."""
