"""The token of one member (section 4.2): who holds it, who it was passed to, and the pass awaiting confirmation.

Each ACK (or New List) passes the token to the next member, which accepts it only once it holds every packet
through the last one the ACK ordered, then confirms (with a Confirm, or its own ACK).  The passing site resends its
pass until it is confirmed.  An idle token site passes the token with a NULL ACK; a quiet ring passes it once round
after the last ordered packet and stops.

A member is in one of four token states (``TokenState``), read off the fields that carry each state's data: it
holds the token, it passed it and awaits the confirmation (``pass_pending``), it is named next and waits until it
may accept (``accept_target``), or it is idle.
"""

from __future__ import annotations

from bisect import bisect_left
from enum import Enum

from .context import GroupContext
from .flow import RttEstimator
from .ids import ProcessId
from .packets import Ack, Nack, NewList
from .timers import Backoff, Deadline

STEADY_PASS_RESENDS = 2
"""Resends of a pass at the pass timer's first interval before it doubles: under random loss an unconfirmed pass
is most often a lost pass or a lost confirmation, and the whole ring waits on it (as ``Repair.nack_retry_after``
keeps a NACK's timeout)."""

LOST_PASS_GAIN = 1 / 16
"""Weight of each pass in ``Token.lost_passes``, the moving share of our passes that needed a resend."""

PASS_COPY_ABOVE = 0.1
"""A pass goes out twice while more than this share of our passes needed a resend (``Token.pass_on``)."""

ROTATION_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds (seconds) of the token rotation time buckets: a loopback ring turns in well under a millisecond,
one under load or loss in tens to hundreds."""


class Rotations:
    """Token rotation times at one member, as histogram buckets: from passing the token on until accepting it
    again.  A token away longer than ``fail_after`` stopped on a quiet ring meanwhile (it rests at one site until
    something is sent), so that wait is not a rotation and is not counted."""

    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(ROTATION_BOUNDS) + 1)
        """Per bucket (the last: above every bound), not cumulative."""
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(ROTATION_BOUNDS, seconds)] += 1
        self.total += seconds
        self.count += 1


class TokenState(Enum):
    HOLDING = "holding"
    PASSING = "passing"
    """Passed, awaiting the next site's confirmation."""
    NAMED = "named"
    """Named next site by an ACK; accepts once it holds everything that ACK orders."""
    IDLE = "idle"


class Token:
    """The token's state at one member."""

    def __init__(self, ctx: GroupContext, *, first: ProcessId, start_ts: int, joined_by: NewList | None,
                 ring_size: int) -> None:
        """A founded view starts with its first member holding the token and the ring quiet; a joiner starts named
        as next token site by the New List that admitted it."""
        pid, config = ctx.pid, ctx.config
        self.pid, self.config, self.outbox, self.stats = pid, config, ctx.outbox, ctx.stats
        self.latest_ack_ts = start_ts
        """Timestamp of the newest ACK or New List known."""
        self.last_ack_sender: ProcessId = first
        self.token_site: ProcessId = first if joined_by is None else joined_by.next_site
        """The member the newest pass named."""
        self.have_token = pid == first
        self.accepted_ts = start_ts if self.have_token else -1
        self.incoming_quiet = ring_size - 1
        """How many passes in a row before ours ordered nothing (a quiet ring stops after one round)."""
        self.accept_target: tuple[int, int, ProcessId, int] | None = None
        """(ACK ts, last ts it orders, passing site, its quiet count) of the pass naming us, not yet accepted."""
        if joined_by is not None and joined_by.next_site == pid:
            self.accept_target = (start_ts, start_ts, joined_by.src, 0)
        self.pass_pending: Ack | None = None
        """Our pass not yet confirmed by the site it names (an Ack or a New List)."""
        self.pass_bytes = b""
        self.pass_timer = Backoff(config.rto_initial, config.rto_max, config.fail_after, STEADY_PASS_RESENDS)
        self.pass_rtt = RttEstimator(config.rto_initial, config.rto_min, config.rto_max)
        """Token pass -> confirmation time: the ACK retransmission timer."""
        self.pass_sent_at: float | None = None
        self.lost_passes = 0.0
        """Moving share of our passes that were resent before the next site confirmed or was heard from."""
        self.pass_resent: bool | None = None
        """Whether the pending pass was resent (None: counted in ``lost_passes`` already)."""
        self.null = Deadline()
        """When an idle token site passes the token on with a NULL ACK."""
        self.overrun = False
        """The application cannot take more deliveries for now: do not accept the token (section 4.6)."""
        self.rotations = Rotations()
        self._passed_at: float | None = None
        """When this member last passed the token to another: the rotation it starts ends at the next accept."""

    @property
    def state(self) -> TokenState:
        if self.have_token:
            return TokenState.HOLDING
        if self.pass_pending is not None:
            return TokenState.PASSING
        if self.accept_target is not None:
            return TokenState.NAMED
        return TokenState.IDLE

    def moved(self, sender: ProcessId, ts: int, last_ts: int, next_site: ProcessId, quiet: int, view_size: int,
              now: float) -> bool:
        """An ACK or New List at ``ts`` passed the token from ``sender`` to ``next_site``; False when it is not
        newer than what is known."""
        if ts <= self.latest_ack_ts:
            return False
        self.latest_ack_ts = ts
        self.last_ack_sender = sender
        self.token_site = next_site
        if self.pass_pending is not None and ts > self.pass_pending.ts:
            self.confirmed(now)
        if next_site == self.pid and (sender != self.pid or view_size == 1):
            self.accept_target = (ts, last_ts, sender, quiet)
        else:
            self.accept_target = None
        return True

    def accept(self, now: float, view: str) -> tuple[int, ProcessId]:
        """Take the token we were named for (the caller checked the acceptance rule); returns (ACK ts, passer)."""
        target = self.accept_target
        assert target is not None
        ack_ts, last_ts, prev, quiet = target
        self.accept_target = None
        self.have_token = True
        self.accepted_ts = ack_ts
        self.incoming_quiet = quiet
        self.stats["token_accepts"] += 1
        if self._passed_at is not None and now - self._passed_at <= self.config.fail_after:
            self.rotations.observe(now - self._passed_at)
        self._passed_at = None
        self.outbox.record("token", now, ts=last_ts, prev=prev, view=view)
        return ack_ts, prev

    def take(self, ts: int, quiet: int) -> None:
        """Hold the token without a pass (a reformation's initiator commits its new view)."""
        self.have_token = True
        self.accepted_ts = ts
        self.incoming_quiet = quiet

    def hold_back(self, overrun: bool) -> bool:
        """Stop accepting the token while the application cannot take more deliveries (section 4.6), or accept it
        again; False when that was so already."""
        if overrun == self.overrun:
            return False
        self.overrun = overrun
        return True

    def null_due(self) -> bool:
        """The NULL ACK deadline passed: it is spent; True when this member holds the token to pass on."""
        self.null.stop()
        return self.have_token

    def null_at(self, at: float) -> None:
        """Pass the token on with a NULL ACK at ``at`` (an idle token site, or a New List to retry)."""
        self.null.deadline = at

    def prompt_null(self, at: float) -> None:
        """Pass the token on with a NULL ACK by ``at`` when holding it (sooner than planned, never later)."""
        if self.have_token and (self.null.deadline is None or self.null.deadline > at):
            self.null.deadline = at

    def forget_beyond(self, ts: int) -> None:
        """A reformation drops every order beyond its sync point ``ts``: no ACK beyond it is known any more."""
        self.latest_ack_ts = min(self.latest_ack_ts, ts)

    def give_up(self) -> None:
        """Stop holding the token: it was passed on, or this member is no longer in the view."""
        self.have_token = False
        self.null.stop()

    def pass_on(self, passing: Ack | NewList, data: bytes, now: float) -> None:
        """We passed the token with ``passing`` (encoded as ``data``): resend it until the next site confirms.  A
        pass to ourselves (a group of one, or a New List that leaves only us) has nothing to wait for."""
        self.pass_bytes = data
        if passing.next_site == self.pid:
            self.confirmed()
        else:
            self._passed_at = now
            self.pass_pending = passing  # type: ignore[assignment]
            self.pass_sent_at = now
            self.pass_resent = False
            self.pass_timer.initial = self.pass_rtt.rto
            self.pass_timer.start(now)
            if self.lost_passes > PASS_COPY_ABOVE:
                # Where passes are often lost, a second copy at once makes a lost pass (a resend timeout with the
                # whole ring waiting) as rare as two losses; it costs one small datagram per pass.
                self.stats["ack_copies"] += 1
                self.outbox.resend(data)
                self.outbox.record_packet("send", passing, now)

    def _count_pass(self) -> None:
        """The pending pass arrived (confirmed, or its site heard from): count whether it needed a resend."""
        if self.pass_resent is not None:
            self.lost_passes += (float(self.pass_resent) - self.lost_passes) * LOST_PASS_GAIN
            self.pass_resent = None

    def confirmed(self, now: float | None = None) -> None:
        if now is not None and self.pass_sent_at is not None and self.pass_timer.retries == 0:
            self.pass_rtt.sample(now - self.pass_sent_at)
        self._count_pass()
        self.pass_sent_at = None
        self.pass_pending = None
        self.pass_timer.stop()

    def heard_of(self, nack: Nack, now: float) -> bool:
        """A NACK from the member our pending pass names, sent knowing of the pass: the pass arrived, and that member
        is fetching what it needs before it can accept.  Its confirmation will come after those repairs, so it is no
        sample of the round trip: one slow repair would otherwise make every lost pass wait that long to be resent.
        The member is alive, so failure detection counts from here.  True when ``nack`` showed the pass arrived."""
        pending = self.pass_pending
        if pending is None or nack.src != pending.next_site or nack.known < pending.ts:
            return False
        self.pass_sent_at = None
        self._count_pass()
        self.pass_timer.heard(now)
        return True

    def resend_pass(self, now: float) -> bool:
        """The pass timer expired: resend the pass; False when it is exhausted (the next site is taken for failed)."""
        if self.pass_timer.exhausted(self.config.fail_retries, now):
            self.pass_timer.stop()
            return False
        self.stats["ack_retransmits"] += 1
        if self.pass_resent is False:
            self.pass_resent = True
        self.outbox.resend(self.pass_bytes)
        self.outbox.record_packet("send", self.pass_pending, now)  # type: ignore[arg-type]
        self.pass_timer.back_off(now)
        return True

    def freeze(self) -> None:
        """A reformation: nobody holds, passes or accepts the token until the new view is committed."""
        self.have_token = False
        self.accept_target = None
        self.pass_pending = None

    def depart(self) -> None:
        """Out of the group: keep only a pending pass (its confirmation shows what the next site holds)."""
        self.have_token = False
        self.accept_target = None
