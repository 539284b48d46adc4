"""How one membership of a group ends (sans-IO, part of ``GroupEngine``): a leave the application asks for, a merge
into a larger view of the group, a New List that removes this member, or a stop after a failure it cannot repair
(the last two are what a reformation asks of it, ``ReformationHost``).  ``Departure`` (departure.py) keeps the state;
this is the engine's side, which crosses parts.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .events import UndeliveredSends
from .ids import ViewId
from .membership import Op

if TYPE_CHECKING:
    from .departure import Departure
    from .outbox import Outbox
    from .reformation import Reformation
    from .sender import Sender
    from .viewchange import ViewChanges
    from .views import Views


class MembershipEnding:
    """The part of ``GroupEngine`` that ends its membership."""

    group: str
    stats: Counter[str]
    views: Views
    outbox: Outbox
    sender: Sender
    changes: ViewChanges
    reformation: Reformation
    departure: Departure

    if TYPE_CHECKING:
        leaving: bool

        def request_change(self, op: str, arg: int | None, now: float) -> int: ...

    def leave(self, now: float, reason: str = "left") -> None:
        """Leave once every message this process sent has been ordered, so nothing it accepted is lost."""
        if self.leaving:
            return
        self.changes.begin_leaving()
        self.departure.leave_for(reason)
        if self.views.current.size == 1:
            self.departure.depart(now)
            return
        self._maybe_request_leave(now)

    def _cut_off(self, now: float, reason: str) -> None:
        """The group went on in a view without this member: stop (and rejoin, ``Left.rejoining``)."""
        self.reformation.stop()
        self.stop(now, reason)

    def _merge(self, into: ViewId, now: float) -> None:
        """Our view merges into the larger view ``into``: leave in order (everything this member sent is ordered
        first, and every member delivers the same messages of this view) and join that view as a new member.  No
        join is admitted here meanwhile: joiners belong in the surviving view."""
        if self.leaving:
            return
        self.changes.begin_merging()
        self.departure.rejoin_when_done()
        self.leave(now, reason=f"merging into view {into}")

    def _last_to_leave(self) -> bool:
        """Leaving, alone in the view the application has, with nothing of ours unordered: the last member
        cannot leave by a New List (nobody would be left to pass the token to), so it simply goes."""
        views = self.views
        return views.app.size == 1 and views.current.view_id == views.app.view_id and self.sender.idle

    def _maybe_request_leave(self, now: float) -> None:
        if self.changes.leave_wanted(self.sender.idle):
            self.request_change(Op.LEAVE, None, now)

    def depart(self, now: float) -> None:
        """A New List without this member is ordered (``Departure.removed``)."""
        self.departure.removed(now, self.changes.leaving)

    def stop(self, now: float, reason: str) -> None:
        """Leave the group after a failure this process cannot repair; its process joins again, as new, once it
        hears the group (``Left.rejoining``).  Own messages not yet ordered are reported (``UndeliveredSends``): this
        member will not see them delivered.  Nobody will ask a stopped member for anything: no need to linger."""
        unordered = self.sender.unordered_seqs()
        if unordered:
            self.outbox.event(UndeliveredSends(self.group, unordered, reason))
        self.departure.cut_short(now, reason)
