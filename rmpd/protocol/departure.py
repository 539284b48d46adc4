"""Leaving a group: after its leave is ordered (or a failure it cannot repair stops it), a member answers NACKs
and confirms passes until everything it held is stable everywhere, or until ``leave_linger`` passes, then it is
finished (its ``Left`` event).
"""

from __future__ import annotations

from .context import GroupContext
from .events import Left
from .ordering import Ordering
from .packets import Ack, NewList
from .stability import Holdings
from .timers import TimerRegistry
from .token import Token


class Departure:
    """Whether this member is out of the group, why, and whether it is finished."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, holdings: Holdings, token: Token,
                 timers: TimerRegistry) -> None:
        self.group, self.linger, self.views, self.outbox = ctx.group, ctx.config.leave_linger, ctx.views, ctx.outbox
        self.ordering, self.holdings, self.token, self.timers = ordering, holdings, token, timers
        self.departed = False
        self.departed_at: float | None = None
        self.reason = "left"
        self.rejoin = False
        """The process joins the group again by itself once this membership ends (a merge, or a stop after a
        failure this member could not repair): its ``Left`` says so."""
        self.finished = False

    @property
    def deadline(self) -> float | None:
        """When a departed member stops waiting for what it held to become stable (the timer registry's)."""
        if self.departed_at is None or self.finished:
            return None
        return self.departed_at + self.linger

    def stop(self) -> None:
        """Lingering ends only by finishing."""

    def depart(self, now: float, reason: str | None = None) -> None:
        """Out of the group: nothing more is ordered or delivered here; only what was held is served.  Without a
        ``reason`` the one given when the leave was asked for stands."""
        self.departed = True
        if reason is not None:
            self.reason = reason
        self.departed_at = now
        self.token.depart()
        self.timers.stop(departed=True)
        self.check_finished(now)

    def removed(self, now: float, leaving: bool) -> None:
        """A New List without this member is ordered.  Unless it asked to leave, another member removed it (taken
        for failed, or for an earlier incarnation of this process): it is alive and wants the group, so it joins
        again."""
        if not leaving:
            self.rejoin = True
            self.reason = "removed from the view by another member"
        self.depart(now)

    def leave_for(self, reason: str) -> None:
        """The leave asked for now gives ``reason`` when the membership ends."""
        self.reason = reason

    def rejoin_when_done(self) -> None:
        """The process joins the group again by itself once this membership ends (its view merges away)."""
        self.rejoin = True

    def cut_short(self, now: float, reason: str) -> None:
        """Out after a failure this member cannot repair: the process joins again, as new.  Nobody will ask a
        stopped member for anything, so it finishes at once instead of lingering."""
        self.rejoin = True
        self.depart(now, reason)
        if not self.finished:
            self.finish()

    def pass_seen(self, packet: Ack | NewList, now: float) -> None:
        """A departed member still learns what others hold, and that its last pass was confirmed."""
        self.holdings.learn(packet.src, packet.last_ts)
        pending = self.token.pass_pending
        if pending is not None and packet.ts > pending.ts:
            self.token.confirmed()

    def check_finished(self, now: float) -> None:
        if self.finished:
            return
        stable = self.holdings.all_hold(self.ordering.q.high, self.views.current)
        linger_end = self.deadline
        lingered = linger_end is not None and now >= linger_end
        if (stable and self.token.pass_pending is None) or lingered:
            self.finish()

    def finish(self) -> None:
        self.finished = True
        self.token.pass_timer.stop()
        self.outbox.event(Left(self.group, self.reason, self.rejoin))
