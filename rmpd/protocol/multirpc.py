"""Multi-RPC for non-members (RMP section 4.5) decided by SCMP: one group's server side.

A non-member's Non Member Data reaches every member; one member, the *relay* (the holder of the handler lock the
call names, else the first member of the view), runs its SCMP filter on the call and carries it into the total
order as a Data packet with a :class:`~rmpd.protocol.packets.Relayed` body that records the relay's clock and its
verdict.  Every member follows that verdict where the call is delivered, so all members deliver a call or none
(each member's own filter starts at its own floor, so theirs could differ); the *responder* (the handler lock
holder, or the relay for calls without a handler) acts on it: it runs a new call, answers a copy with an ACK while
computing or with the stored reply after, and tells the caller when a copy's fate is unknown.  See
docs/protocol.md, "Non-members and SCMP", for why this keeps at-most-once across failures.
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
    ordered: dict[tuple[ProcessId, int], int] = field(default_factory=dict)
    """The last stamp delivered as new per connection (kept ``keep_ms`` of order clock): a second relay of one
    call, made while the relay changed and the first was still on its way, is a duplicate at every member."""
    _pruned_at: int = 0

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

    def judge(self, caller: ProcessId, conn: int, stamp: int, wall_ms: int) -> Verdict:
        """The relay's verdict on a call it is about to carry into the order, by its own clock: the one every
        member follows (``decide``)."""
        return self.filter.decide((caller, conn), stamp, wall_ms, wall_ms + self.settings.ahead_ms)

    def floor(self) -> int:
        """Calls stamped after this are judged on their merits by this member's filter (what a probe is told)."""
        return self.filter.upper

    def decide(self, call: Relayed, relayed_here: bool, responder: bool,
               has_handler: bool) -> tuple[Verdict, Action, Answer | None]:
        """A delivered call: every member takes the verdict the relay carried in the order, so all deliver it or
        none; the answer is for the responder to send (None otherwise).

        Two exceptions keep a call at most once when the relay changed while a call was on its way: a call
        already delivered as new on its connection is a duplicate (the same at every member that saw both), and a
        handler's holder that did not relay the call runs it only if its own filter accepts it too (a newcomer's
        floor refuses what the group may have run before it came; only the holder runs a handler's calls)."""
        self.in_flight.discard((call.caller, call.conn, call.stamp))
        self.clock = max(self.clock, call.clock)
        conn = (call.caller, call.conn)
        carried = verdict = Verdict(call.verdict)
        if verdict is Verdict.NEW and self.ordered.get(conn, -1) >= call.stamp:
            verdict = Verdict.DUPLICATE
        if verdict is Verdict.NEW and responder and has_handler and not relayed_here:
            verdict = self.filter.decide(conn, call.stamp, self.clock)
        elif not relayed_here or verdict is not carried:  # the relay's filter judged it when relaying
            self.filter.learn(conn, call.stamp, self.clock, verdict)
        if verdict is Verdict.NEW:
            self.ordered[conn] = call.stamp
        self._prune_ordered()
        action, stored = self.server.act(conn, call.stamp, verdict)
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


    def _prune_ordered(self) -> None:
        if self.clock - self._pruned_at < 1000:
            return
        self._pruned_at = self.clock
        horizon = self.clock - self.settings.keep_ms
        self.ordered = {conn: stamp for conn, stamp in self.ordered.items() if stamp >= horizon}


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
