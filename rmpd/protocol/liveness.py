"""Failure detection that does not wait for traffic, and the discovery of other views of the same group.

The paper detects a failure only when an acknowledged action goes unanswered, so a quiet ring never notices a dead
member.  Every member therefore multicasts an :class:`Alive` once per ``alive_interval``: members of its view learn
that it lives (any packet from a member counts), and a member not heard from for ``fail_after`` is suspected,
which starts a reformation as a lost token pass would.

An Alive also carries its view's member list, so a member hearing one of a view of its group that is disjoint from
its own learns that two views of one group can hear each other (a healed partition, simultaneous founders, a
restarted process that founded alone).  The smaller view merges into the larger one (ties: the view ID that sorts
higher wins): each of its members leaves in order and joins the other view as a new member (docs/protocol.md,
"Healing").
"""

from __future__ import annotations

from collections.abc import Callable

from .context import GroupContext
from .ids import ProcessId, ViewId
from .packets import Alive
from .timers import Deadline
from .view import View

CUT_OFF_SILENCE = 2.0
"""Alive intervals without a word in our view from a member that speaks in a view leaving us out, before this
member takes itself for cut off (a shorter silence is a New List on its way)."""
SUSPECT_STAGGER = 0.5
"""Seconds of extra patience per live member ahead in view order (``Liveness._patience``)."""


def merge_key(size: int, view_id: ViewId) -> tuple[int, ViewId]:
    """Which of two disjoint views of a group survives a merge: the larger, then the higher view ID.  Both sides
    compute the same answer from what an Alive carries."""
    return size, view_id


class Liveness:
    """Who was heard from when, this member's own Alive, and the merge it decided on."""

    def __init__(self, ctx: GroupContext, now: float, *, suspect: Callable[[float, str], None],
                 merge: Callable[[ViewId, float], None], cut_off: Callable[[float, str], None]) -> None:
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, ctx.config, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.suspect, self.merge, self.cut_off = suspect, merge, cut_off
        self.view: View = ctx.views.current
        """The view ``last_heard`` is kept for: a New List changes the current view, the next check follows."""
        self.last_heard: dict[ProcessId, float] = dict.fromkeys(self.view.members, now)
        """When each member was last heard from (any packet of a view we know); besides the members of ``view``
        it may hold members of views before it, which nobody waits for."""
        self.next_alive = now
        """When this member multicasts its next Alive."""
        self.timer = Deadline()
        self.enabled = self.config.alive_interval > 0
        self.timer.deadline = now if self.enabled else None
        self.elsewhere: dict[ProcessId, float] = {}
        """When a member of our view was last heard saying it is alive in a view we do not know (a New List one of
        us missed): alive, so not silent, though not speaking in our view."""
        self.predecessors: set[ViewId] = set()
        """Views before our first one (the view the New List that admitted us was ordered in): a member lagging
        behind that New List still speaks in it, which does not mean we were cut off."""
        self.merge_target: ViewId | None = None
        """The view this member's view merges into: decided once, it holds until the membership ends."""

    def recently_heard(self, member: ProcessId, now: float) -> bool:
        """``member`` spoke in a view we know within the last half of ``fail_after``: a member that failed has
        been silent at least that long by the time anyone suspects it.  (An Alive in a view we do not know does not
        count: it may be a new incarnation of a process whose old one is being removed.)"""
        if not self.enabled:
            return False
        heard = self.last_heard.get(member)
        return heard is not None and now - heard < self.config.fail_after / 2

    def joined_from(self, view: ViewId) -> None:
        """The New List that admitted this member was ordered in ``view``: members still speaking in it are
        lagging behind, which does not mean we were cut off."""
        self.predecessors.add(view)

    def heard(self, member: ProcessId, now: float) -> None:
        """A packet of a view we know came from ``member``: it is alive."""
        self.last_heard[member] = now

    def resume(self, now: float) -> None:
        """A reformation ended: it heard from everyone it kept, so silence counts from now."""
        self.view = self.views.current
        self.last_heard = dict.fromkeys(self.view.members, now)
        self.next_alive = now
        self.timer.deadline = now if self.enabled else None

    def due(self, now: float) -> None:
        """Send this member's Alive when its time has come, suspect a member silent for ``fail_after``, and
        arm the timer for whichever comes next."""
        config = self.config
        view = self.views.current
        if now >= self.next_alive:
            self.next_alive = now + config.alive_interval
            self.stats["alives_sent"] += 1
            self.outbox.multicast(Alive(view.view_id, self.pid, self.group, view.members), now, journal=False)
        if self.view is not view:  # members new to the view count as heard from now on
            self.view = view
            self.last_heard = {m: self.last_heard.get(m, now) for m in view.members}
        heard, elsewhere = self.last_heard, self.elsewhere
        oldest = min((max(heard[m], elsewhere.get(m, heard[m])) for m in view.members if m != self.pid and m in heard),
                     default=None)
        silent_at = None if oldest is None else oldest + self._patience(oldest, now)
        if silent_at is not None and now >= silent_at:
            self.stats["members_silent"] += 1
            self.timer.deadline = None
            self.suspect(now, "silent")
            return
        self.timer.deadline = self.next_alive if silent_at is None else min(self.next_alive, silent_at)

    def _patience(self, oldest: float, now: float) -> float:
        """How long silence is borne here: ``fail_after`` at the nearest member before the silent one (in ring
        order) that is still heard, the member that would pass it the token, and ``SUSPECT_STAGGER`` more at each
        member after that one.  Every member sees the same silence at about the same moment, and reformations
        started together supersede one another; staggered, one member's Recovery Start reaches the others before
        they would start their own."""
        view, elsewhere = self.views.current, self.elsewhere
        heard = {m: max(t, elsewhere.get(m, t)) for m, t in self.last_heard.items()}
        cutoff = now - self.config.fail_after
        silent = next(m for m in view.members if m != self.pid and heard.get(m) == oldest)
        rank, member = 0, view.next_after(silent, -1)
        while member != self.pid and member != silent:
            if heard.get(member, now) > cutoff:
                rank += 1
            member = view.next_after(member, -1)
        return self.config.fail_after + SUSPECT_STAGGER * rank

    def on_alive(self, alive: Alive, now: float) -> bool:
        """An Alive of a view we know counts as hearing its sender; one of a view disjoint from ours is another
        view of the group that we can now hear: the smaller merges into the larger.  True when it is an Alive of a
        view we do not know from a member of ours: a New List one of us missed (the caller catches up)."""
        view = self.views.current
        if alive.view in self.views.known:
            if alive.src in view:
                self.last_heard[alive.src] = now
            return False
        if alive.src in view:
            self.elsewhere[alive.src] = now
        if self.pid not in alive.members and alive.src in view and alive.view not in self.predecessors and (
                now - self.last_heard.get(alive.src, now) > CUT_OFF_SILENCE * self.config.alive_interval) and (
                2 * sum(m in view for m in alive.members if m != self.pid) > view.size - 1):
            # A member of our view speaks, for a while now, only in a view that we do not know, that leaves us out
            # and holds most of the rest of our view: the group went on without us (a reformation cut us off).
            # Waiting for our own reformation to fail below the minimum partition would take several rounds of
            # it; rejoin now instead.  (A view holding fewer of ours is a few members that went their own way.)
            self.stats["cut_off"] += 1
            self.cut_off(now, f"cut off: the group went on in view {alive.view} without this member")
            return False
        if self.pid in alive.members or any(m in view for m in alive.members):
            self.stats["alive_of_lineage"] += 1  # a view our own changes lead to or from: not another group
            return alive.src in view
        self.stats["alive_of_other_view"] += 1
        if self.merge_target is None and merge_key(view.size, view.view_id) < merge_key(len(alive.members),
                                                                                         alive.view):
            self.merge_target = alive.view
            self.stats["merges"] += 1
            self.outbox.record("recovery", now, role="merge", new_view=str(alive.view), members=list(alive.members))
            self.merge(alive.view, now)
        return False
