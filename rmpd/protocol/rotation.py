"""The token going round (section 4.2): what an ACK or a New List does at each member, and what the token site
does with the token.

Each ACK (or New List) fills its slot of the OrderingQ, orders the packets it names, and passes the token to the
next member; the newest one known tells every member where the token is.  The site named accepts the token once it
holds every packet the pass orders, then answers the oldest membership request with a New List, or orders what
it holds with an ACK, or, with nothing to order, confirms the pass and passes the token on later with a NULL ACK.
A New List is also a view change: it is installed when it is placed (packets are ordered in the new view from its
timestamp on) and shown to the application when the total order reaches it.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import GroupContext
from .departure import Departure
from .events import ViewInstalled
from .ids import ProcessId
from .ordering import Ordering
from .orderingq import Conflict, SlotKind
from .packets import Ack, Confirm, DataId, NewList
from .repair import Repair
from .sender import Sender
from .stability import Holdings
from .token import Token
from .viewchange import ViewChanges


class Rotation:
    """ACKs and New Lists at one member, and the token site's moves."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, holdings: Holdings, token: Token, sender: Sender,
                 repair: Repair, changes: ViewChanges, departure: Departure, *,
                 own_ordered: Callable[[float], None]) -> None:
        """``own_ordered``: the engine's step after an ACK ordered packets of ours (a leave may now go out)."""
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, ctx.config, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.ordering, self.holdings, self.token, self.sender = ordering, holdings, token, sender
        self.repair, self.changes, self.departure = repair, changes, departure
        self.after_own_ordered = own_ordered

    # ------------------------------------------------------------------------------------------------------------
    # At every member

    def on_ack(self, ack: Ack, now: float) -> None:
        if not self._place(ack, SlotKind.ACK, now):
            return
        site = ack.src if ack.src != self.pid else None
        waited = self._waited(ack) if site is not None else None
        self.ordering.order(ack, self.pid, lambda seq: self._own_ordered(seq, now, site, waited))
        self._token_moved(ack.src, ack.ts, ack.last_ts, ack.next_site, ack.quiet, now)

    def _place(self, packet: Ack | NewList, kind: SlotKind, now: float) -> bool:
        """Put an ACK or New List into the OrderingQ; False when it is old, a duplicate or in conflict (a resent
        pass we accepted already is confirmed again)."""
        q = self.ordering.q
        if packet.ts < q.base:
            self._reconfirm(packet, now)
            return False
        try:
            if kind is SlotKind.ACK:
                q.check_ids(packet)  # type: ignore[arg-type]
            fresh = q.place_control(packet.ts, kind, packet)
        except Conflict:
            self.stats["conflicts"] += 1
            return False
        if not fresh:
            self.stats["duplicates"] += 1
            self._reconfirm(packet, now)
            return False
        return True

    def _waited(self, ack: Ack) -> tuple[int, float] | None:
        """(our sequence number, seconds it waited at the token site) from ``ack.waits``: the last of our packets
        the ACK orders, None when it orders none or does not say."""
        for src, micros in ack.waits:
            if src == self.pid:
                for id_src, seq, _ in reversed(ack.ids):
                    if id_src == src:
                        return seq, micros / 1e6
        return None

    def _own_ordered(self, seq: int, now: float, site: ProcessId | None,
                     waited: tuple[int, float] | None) -> None:
        if self.sender.ordered(seq, now, site, waited[1] if waited is not None and waited[0] == seq else None):
            self.sender.fill_window(self.views.current.view_id, now)
            self.after_own_ordered(now)

    def _token_moved(self, sender: ProcessId, ts: int, last_ts: int, next_site: ProcessId, quiet: int,
                     now: float) -> None:
        """An ACK or New List at ``ts`` passed the token from ``sender`` to ``next_site``."""
        self.holdings.learn(sender, last_ts)
        if not self.token.moved(sender, ts, last_ts, next_site, quiet, self.views.current.size, now):
            return
        self.sender.ring_moved(now)
        self.repair.token_moved()

    def on_new_list(self, nl: NewList, now: float) -> None:
        if not self._place(nl, SlotKind.VIEW, now):
            return
        self.changes.new_list_placed(nl)
        new_view = nl.installed_view()
        views = self.views
        views.heard_of(new_view)
        if nl.ts > self.token.latest_ack_ts:
            old = views.current
            announced = dict(nl.seqs)
            for m in new_view.members:
                if m not in old and m != self.pid:
                    self.ordering.restart_source(m, announced.get(m, 0))
            self.holdings.view_changed(nl.ts, old, new_view)
            self.ordering.forget_unorderable(new_view)
            for member in old.unicast_only - set(new_view.members):
                self.outbox.keep_unicasting(member, now + self.config.fail_after)
            views.order_in(new_view)
            if self.pid not in new_view:  # a view without us: its token is not ours to hold or pass
                self.token.give_up()
        if not self.departure.departed:
            self.changes.ask_again_if_lost(now)
        self._token_moved(nl.src, nl.ts, nl.ts, nl.next_site, 0, now)

    def commit_view(self, nl: NewList, now: float) -> bool:
        """The New List is delivered: the application sees the view change here, in order.  False when this
        member is out of the group after it."""
        view = self.views.known[nl.new_view]
        self.ordering.commit_restarts([member for member, _ in nl.members])
        self.ordering.drop_reassembly_outside(view)
        if nl.new_view != self.views.app.view_id:
            self.views.installed(view)
            self.outbox.event(ViewInstalled(self.group, view.view_id, view.members, nl.ts))
            self.outbox.record("view", now, ts=nl.ts, members=list(view.members),
                               locks=[list(x) for x in view.locks], view=str(view.view_id))
        self.changes.new_list_delivered(nl)
        if self.pid not in view:
            self.departure.removed(now, self.changes.leaving)
        return not self.departure.departed

    def _reconfirm(self, ack: Ack | NewList, now: float) -> None:
        """A resent ACK whose token we already accepted: the Confirm was lost, send it again."""
        if ack.next_site == self.pid and self.token.accepted_ts >= ack.ts and ack.src != self.pid:
            self.outbox.unicast(ack.src, Confirm(self.views.current.view_id, self.pid, ack.ts), now)

    def on_confirm(self, confirm: Confirm, now: float) -> None:
        pending = self.token.pass_pending
        if pending is not None and confirm.ts == pending.ts:
            self.holdings.learn(confirm.src, pending.last_ts)
            self.token.confirmed(now)

    # ------------------------------------------------------------------------------------------------------------
    # At the token site

    def try_accept(self, now: float) -> tuple[int, ProcessId] | None:
        """Accept the token if named and holding everything it requires (the acceptance rule: no hole in the
        OrderingQ up to the last packet the pass orders); returns (ACK ts, previous site)."""
        target = self.token.accept_target
        if (target is None or self.token.overrun or self.pid not in self.views.current
                or not self.ordering.holds_through(target[1])):
            return None
        return self.token.accept(now, str(self.views.current.view_id))

    def schedule_null(self, now: float) -> None:
        """An idle token site passes the token with a NULL ACK after ``null_ack_interval``, or almost at once
        while something ordered is not yet delivered here or not yet known held by everyone: resilient (K,
        majority, safe) messages become deliverable only as the token goes round, and at light load they would
        otherwise wait a whole interval per member."""
        token, view = self.token, self.views.current
        if token.incoming_quiet < view.size - 1:
            q = self.ordering.q
            # Not yet stable: slots before the latest ACK not freed, or what that ACK ordered (freeing stops at
            # its slot, which is kept) not known held by everyone.
            waiting = (self.ordering.deliver_ts <= q.high or q.base < token.latest_ack_ts
                       or self.holdings.holders_of(q.high) < self.holdings.eligible(q.high, view))
            delay = self.config.null_ack_prompt if waiting else self.config.null_ack_interval
            token.null_at(now + delay)
        else:
            token.null.stop()

    def order_pending(self, now: float) -> bool:
        """As token site, answer a pending request or order what can be ordered; True when the token went on."""
        if self.changes.pending and self._make_new_list(now):
            return True
        if not self.ordering.unordered:
            return False
        ids = self.ordering.orderable(self.config.max_ack_ids, self.views.current)
        if not ids:
            return False
        self.send_ack(tuple(ids), 0, now)
        return True

    def _make_new_list(self, now: float) -> bool:
        """As token site, answer the oldest pending request with a New List and pass the token with it."""
        nl = self.changes.next_new_list(now)
        if nl is None:
            return False
        if nl is False:  # at most one new view per ms of uptime: try again on the next tick
            self.token.null_at(now + 0.001)
            return False
        assert isinstance(nl, NewList)
        joiner = nl.request_src if nl.request_src is not None and nl.request_src not in self.views.current else None
        self.token.give_up()
        self.stats["new_lists_sent"] += 1
        data = self.outbox.multicast(nl, now)
        if joiner is not None and dict(nl.members).get(joiner, True):
            self.outbox.unicast(joiner, nl, now)  # the joiner does not listen to the group's address yet
        self.token.pass_on(nl, data, now)
        self.on_new_list(nl, now)
        return True

    def send_ack(self, ids: tuple[DataId, ...], quiet: int, now: float) -> None:
        view = self.views.current
        waits = self.ordering.waits(ids, now) if ids else ()
        ack = Ack(view.view_id, self.pid, self.ordering.q.high + 1, view.next_after(self.pid), quiet, ids, waits)
        self.token.give_up()
        self.stats["acks_sent" if ids else "null_acks_sent"] += 1
        data = self.outbox.multicast(ack, now)
        self.token.pass_on(ack, data, now)
        self.on_ack(ack, now)
