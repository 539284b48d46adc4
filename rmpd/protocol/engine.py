"""The sans-IO RMP engine for one group at one process (RMP paper, sections 4.1 and 4.2): a coordinator over parts.

The caller feeds it datagrams (``receive_datagram``), timer expiries (``handle_timer``) and application requests
(``send``, ``leave``, ``lock``, ...), always with the current time, and pulls out ``take_outputs()``: datagrams,
application events, journal records and the next deadline (``Outputs``, the shape the process hands on too).  It
reads no clock, draws no randomness of its own and touches no socket, so the daemon, the simulator and the tests
run the same code.

Basic delivery: members multicast Data; the token site orders what it holds with one ACK per batch, giving the ACK
timestamp t and the data t+1.., and passes the token to the next member, which accepts once it holds everything
that ACK orders.  Holes are NACKed.  An ACK from a member proves it holds every packet up to the last one it
orders, which is how resilient packets know when they may be delivered and how stable slots are freed.

The parts, each owning its state (docs/architecture.md):

- ``Views`` (views.py): the view ordered in, the view the application saw, and every view heard of;
- ``Ordering`` (ordering.py): the DataList, the OrderingQ, reassembly and the delivery cursors;
- ``Receipt`` (receipt.py): holding a received (or own) data packet, and what it tells the other parts;
- ``Deliverer`` (delivery.py): handing packets to the application along the delivery cursors;
- ``Holdings`` (stability.py): what each member is known to hold, for resilient delivery and freeing slots;
- ``Token`` (token.py): holding, passing and accepting the token;
- ``Rotation`` (rotation.py): what ACKs and New Lists do, and the token site's moves;
- ``Repair`` (repair.py): NACKs, gaps, hints and stalls, and answering NACKs;
- ``Sender`` (sender.py): the send queue, packing, fragments, the window, retransmission;
- ``ViewChanges`` (viewchange.py): membership requests, New Lists, join admission, leaving;
- ``Reformation`` (reformation.py): suspecting failures and reforming the view;
- ``CallRelay`` (relay.py): non-members' calls;
- ``KeyTables`` (keytables.py): the group's key table at this member, and the one a joiner brought;
- ``Liveness`` (liveness.py): Alives, silent members, and merging with another view of the group;
- ``Departure`` (departure.py): out of the group, finished, lingering, and whether the process rejoins;
- ``Outbox`` (outbox.py): what goes out; ``TimerRegistry`` (timers.py): every timer, in firing order.

This module holds what crosses parts: building and wiring them, application requests, the timers' handlers and
the step that runs after every input (``_progress``).  ``GroupEngine`` is made of three more parts of its own, each
in its module: which packets are taken and the dispatch table by member state and packet type (intake.py,
``PacketIntake``), how a membership ends (ending.py, ``MembershipEnding``), and what a reformation asks of this
member (reformside.py, ``ReformationSide``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from .config import EngineConfig
from .context import GroupContext
from .delivery import Deliverer
from .departure import Departure
from .ending import MembershipEnding
from .events import SendRefused, ViewInstalled
from .ids import ProcessId, ViewCounter, ViewId
from .intake import MemberState, PacketIntake
from .keys import KeyTable
from .keytables import KeyTables
from .limits import check_handler, check_keys, check_lock, check_message_size, keyed_qos
from .liveness import Liveness
from .membership import Op
from .multirpc import ScmpSettings
from .ordering import DeliveredBefore, Ordering
from .outbox import Outbox, OutputLists, Outputs
from .packets import Confirm, Data, NewList, NonMemberAck, NonMemberData
from .qos import Level, QoS
from .receipt import Receipt
from .reformation import Reformation, Rng
from .reformside import ReformationSide
from .relay import CallRelay
from .repair import Repair
from .rotation import Rotation
from .sender import Sender
from .stability import Holdings
from .status import GroupStatus, MembershipEnd
from .timers import TimerRegistry
from .token import Token
from .view import View
from .viewchange import ViewChanges
from .views import Views

__all__ = ["GroupEngine"]


class GroupEngine(PacketIntake, MembershipEnding, ReformationSide):
    """One RMP process's state for one group with a given membership view."""

    def __init__(
        self,
        *,
        pid: ProcessId,
        group: str,
        view: View,
        config: EngineConfig | None = None,
        rng: Rng,
        now: float,
        view_counter: ViewCounter | None = None,
        request_ids: Iterator[int] | None = None,
        joined_by: NewList | None = None,
        first_seq: int = 1,
        first_unreliable_seq: int = 1,
        scmp: ScmpSettings | None = None,
        join_floor: int = 0,
        delivered_before: DeliveredBefore | None = None,
        kept_keys: KeyTable | None = None,
        wall_offset: float = 0.0,
    ) -> None:
        """Start in ``view``: either as a founding member of a view created out of band (the first member holds
        the token), or, with ``joined_by``, as a joiner admitted by that New List (which names it the next token
        site and carries the per-source sequence numbers it starts from).

        ``join_floor``: this member's own bound for join requests from processes the group has no entry for
        (``ViewChanges.join_admissible``); the group's, carried in every New List, is taken too when higher.

        ``delivered_before``: what this process delivered in its previous membership of the group, which a
        reformation may order again after this one began: it is not delivered twice.

        ``kept_keys``: the key table of this process's previous membership of the group, for a founding member
        (``KeyTable.for_founder``); a joiner takes the group's table instead.

        ``wall_offset``: seconds from ``now`` to the process's wall clock (SCMP stamps)."""
        if pid not in view:
            raise ValueError(f"{pid} is not a member of view {view.view_id}")
        start_ts = joined_by.ts if joined_by is not None else 0
        self.pid = pid
        self.group = group
        self.started_at = now
        self.config = config = config or EngineConfig()
        self.stats: Counter[str] = Counter()
        stats = self.stats
        self.views = views = Views(view)
        self.outbox = outbox = Outbox(pid, group, config, views, stats)
        ctx = GroupContext(pid, group, config, views, outbox, stats)
        self.ordering = ordering = Ordering(start_ts, stats)
        self.holdings = holdings = Holdings(pid, view, start_ts, ordering.q)
        first = view.members[0] if joined_by is None else joined_by.src
        self.token = token = Token(ctx, first=first, start_ts=start_ts, joined_by=joined_by, ring_size=view.size)
        # A rejoining process goes on from the sequence number its join request announced, so its new messages
        # never collide with ones it sent as an earlier member.
        next_seq = 1 + dict(joined_by.seqs).get(pid, 0) if joined_by is not None else first_seq
        self.sender = Sender(ctx, first_seq=next_seq, first_unreliable_seq=first_unreliable_seq, emit=self._emit_own)
        self.relay = relay = CallRelay(ctx, scmp or ScmpSettings(), wall_offset)
        view_counter = view_counter or ViewCounter(pid, 0, now)
        self.keys = keys = KeyTables(ctx, self.sender, joined_by=joined_by, kept=kept_keys)
        self.changes = ViewChanges(ctx, ordering, relay, keys.table, view_counter=view_counter,
                                   request_ids=request_ids, join_floor=join_floor, joined_by=joined_by)
        self.repair = repair = Repair(ctx, ordering, token, start_ts=start_ts, suspect=self.suspect_failure,
                                      own_path=self.sender.data_rtt)
        self.deliverer = Deliverer(ctx, ordering, holdings, relay, keys.table, send_keys=keys.send,
                                   commit_view=lambda nl, now: self.rotation.commit_view(nl, now))
        self.receipt = Receipt(ctx, ordering, keys, self.deliverer, repair, token, frozen=lambda: self.frozen,
                               leaving=lambda: self.leaving)
        self.reformation = Reformation(ctx, rng, view_counter, host=self)
        self.timers = timers = TimerRegistry()
        timers.add("reformation", self.reformation, self.reformation.on_timer)
        timers.add("token_pass", token.pass_timer, self._pass_due, frozen_stops=True)
        timers.add("data", self.sender.rto, self._data_due, frozen_stops=True, departed_stops=True)
        timers.add("null_ack", token.null, self._null_due, frozen_stops=True, departed_stops=True)
        timers.add("gap", repair.gap, repair.ask_sources, departed_stops=True)
        timers.add("nack", repair.nack, lambda now: repair.nack_due(now, self.frozen), departed_stops=True)
        timers.add("hint", repair.hint, lambda now: repair.hint_due(now, self.hints_held), frozen_stops=True,
                   departed_stops=True)
        timers.add("stall", repair.stall, repair.stall_due, frozen_stops=True, departed_stops=True)
        timers.add("request", self.changes.timer, self._request_due, frozen_stops=True, departed_stops=True)
        self.liveness = Liveness(ctx, now, suspect=self.suspect_failure, merge=self._merge, cut_off=self._cut_off)
        timers.add("alive", self.liveness.timer, self.liveness.due, frozen_stops=True, departed_stops=True)
        timers.add("keys", keys.table.wait, lambda now: self._cut_off(now, "the group's key table did not arrive"),
                   departed_stops=True)
        if joined_by is not None:
            self.liveness.joined_from(joined_by.view)
        self.departure = Departure(ctx, ordering, holdings, token, timers)
        timers.add("linger", self.departure, None)
        self.rotation = Rotation(ctx, ordering, holdings, token, self.sender, repair, self.changes, self.departure,
                                 own_ordered=self._maybe_request_leave)
        handlers = self.dispatch_table()
        self._member_handlers = handlers[MemberState.MEMBER]
        self._departed_handlers = handlers[MemberState.DEPARTED]

        ordering.start(pid, joined_by, first_seq, view.view_id)
        if delivered_before is not None:
            ordering.carry_delivered(delivered_before)
        outbox.event(ViewInstalled(group, view.view_id, view.members, start_ts))
        outbox.record("view", now, ts=start_ts, members=list(view.members), locks=[list(x) for x in view.locks],
                      view=str(view.view_id))
        keys.send_brought(now)

    # ------------------------------------------------------------------------------------------------------------
    # What callers may read

    @property
    def departed(self) -> bool:
        """Out of the group (its leave was ordered, or a failure it could not repair stopped it)."""
        return self.departure.departed

    @property
    def leaving(self) -> bool:
        """A leave was asked for, or the membership ended (no more sends or calls are taken)."""
        return self.changes.leaving or self.departure.departed

    @property
    def frozen(self) -> bool:
        """A reformation runs (or waits to restart): the token stands still."""
        return self.reformation.frozen

    @property
    def hints_held(self) -> bool:
        """A reformation runs and this member is not waiting for its commit: a packet of a view it does not know is
        no reason to ask (``Repair.unknown_view``).  One that acknowledged the New List and then hears a view it
        does not know asks that packet's sender what follows: the new view's first packets may all have been lost
        to it, and every later packet is of a view it cannot know before it has committed."""
        return self.frozen and not self.reformation.awaiting_commit

    def status(self) -> GroupStatus:
        """A snapshot of this membership for the process's callers (``RmpProcess.status``)."""
        sender, q = self.sender, self.ordering.q
        return GroupStatus(
            group=self.group, view=self.views.app, leaving=self.changes.leaving and not self.departed,
            departed=self.departed, finished=self.departure.finished, reforming=self.frozen, next_seq=sender.next_seq,
            send_queue=len(sender.send_queue), in_flight=len(sender.outstanding), window=sender.window.window,
            orderingq_slots=len(q.slots), ack_slots=q.ack_slots, packets_held=len(self.ordering.data),
            started_at=self.started_at, needed=self.reformation.minimum_partition(),
            below_minimum=self.reformation.minority_found if self.frozen else None,
            describe_scmp=self.scmp_status, token_rotations=self._token_rotations, counters=self.stats.copy,
        )

    def _token_rotations(self) -> tuple[list[int], float, int]:
        rotations = self.token.rotations
        return list(rotations.counts), rotations.total, rotations.count

    def scmp_status(self) -> dict[str, Any]:
        """What ``rmp status`` shows of SCMP: the call filter, and the join floor with the joins it refused here."""
        return self.relay.describe(self.changes.join_floor)

    def accepts_view(self, view_id: ViewId | None) -> bool:
        return view_id in self.views.known

    @property
    def app_view(self) -> View:
        """The view the application has seen installed."""
        return self.views.app

    def send_backlog(self) -> int:
        """Packets accepted and not yet sent: cheap, for back-pressure."""
        return len(self.sender.send_queue)

    @property
    def finished(self) -> bool:
        """Departed, and nobody needs anything from this member any more (its ``Left`` was given)."""
        return self.departure.finished

    @property
    def settled(self) -> bool:
        """Departed with nothing left to do for others: finished, or its last view held only this member (whose
        last pass, to itself, nobody will confirm)."""
        return self.departure.departed and (self.departure.finished or self.views.current.size == 1)

    def membership_end(self) -> MembershipEnd:
        """What this membership leaves its process when it is finished."""
        sender = self.sender
        return MembershipEnd(self.departure.rejoin, self.views.current, self.reformation.minimum_partition(),
                             (sender.next_seq - 1, sender.next_unreliable_seq - 1), self.ordering.delivered_state())

    def table_to_keep(self) -> KeyTable | None:
        """The key table this process keeps when its membership ends by itself (``KeyTables.to_keep``)."""
        return self.keys.to_keep()

    def raise_latest(self, value: int) -> None:
        """SCMP ``latest`` reached stable storage (``CallRelay.raise_latest``)."""
        self.relay.raise_latest(value)

    # ------------------------------------------------------------------------------------------------------------
    # Outputs

    def take_outputs(self, *, deadline: bool = True) -> Outputs:
        """Datagrams, events and journal records since the last call, and the next deadline (``Outputs``; see
        ``RmpProcess.take_outputs``)."""
        outbox = self.outbox
        return Outputs(outbox.take_datagrams(), outbox.take_events(), outbox.take_records(), None,
                       self.get_timer() if deadline else None)

    def hand_over(self, into: OutputLists, loop_back: ProcessId | None) -> list[bytes]:
        """Move the outputs made since the last call into the process's ``into`` (``Outbox.move_to``); returns the
        bytes of datagrams to ``loop_back``, which were kept out."""
        return self.outbox.move_to(into, loop_back)

    def get_timer(self) -> float | None:
        return self.timers.next_deadline()

    @property
    def quiet(self) -> bool:
        """True when this member has nothing left to do but say it is alive (and listen for silence)."""
        return self.timers.next_deadline(ignore=self.liveness.timer) is None

    # ------------------------------------------------------------------------------------------------------------
    # Application requests

    def send(self, payload: bytes, qos: QoS, now: float, handler: int | None = None,
             key: bytes | None = None) -> int | None:
        """Accept an application message; returns its sequence number (None when refused)."""
        seqs = self.send_batch((payload,), qos, now, handler, None if key is None else (key,))
        return None if seqs is None else seqs[0]

    def send_batch(self, payloads: Sequence[bytes], qos: QoS, now: float, handler: int | None = None,
                   keys: Sequence[bytes] | None = None) -> list[int] | None:
        """Accept several application messages at once, in order, packed together (``Sender.queue``); returns
        their sequence numbers (None when refused: all of them, and MessageTooLarge, checked first, refuses all of
        them too).  ``keys``: one per message, for exactly-once sends (rmpd.protocol.keys)."""
        if self.leaving:
            self.outbox.event(SendRefused(self.group, "this process is leaving the group"))
            return None
        check_handler(handler)
        check_keys(payloads, qos, keys)
        if payloads:
            check_message_size(self.config, max(payloads, key=len), qos)  # both limits are on the length
        if qos.level == Level.UNRELIABLE:
            return [self._send_unreliable(payload, qos, handler, now) for payload in payloads]
        stamp = 0
        if keys is not None:
            stamp = self.relay.wall_ms(now)
            qos = keyed_qos(qos)
        seqs = self.sender.queue(payloads, qos, handler, keys, stamp)
        self.sender.fill_window(self.views.current.view_id, now)
        self._progress(now)
        return seqs

    def _send_unreliable(self, payload: bytes, qos: QoS, handler: int | None, now: float) -> int:
        packet = self.sender.unreliable(self.views.current.view_id, payload, qos, handler)
        self.outbox.multicast(packet, now)
        self.deliverer.deliver(packet, None, now, holders=1)
        return packet.seq

    def _emit_own(self, packet: Data, now: float) -> None:
        """A new own packet leaves: multicast it, and hold it as any member holds what it receives."""
        self.outbox.multicast(packet, now)
        self.on_data(packet, now)

    def set_overrun(self, overrun: bool, now: float) -> None:
        """Section 4.6: a process that runs out of buffers delays accepting the token, so nothing more is ordered
        anywhere until it catches up, instead of dropping what was accepted.  Senders' windows then fill and they
        slow down.  Delayed too long, it is declared failed by its predecessor, as the paper intends."""
        if not self.token.hold_back(overrun):
            return
        if overrun:
            self.stats["overruns"] += 1
        else:
            self._progress(now)

    def set_link_busy(self, busy: bool, now: float) -> None:
        """The process's socket cannot take more data (or can again): ``Sender.set_link_busy``."""
        self.sender.set_link_busy(busy, self.views.current.view_id, now)
        if not busy:
            self._progress(now)

    def request_change(self, op: str, arg: int | None, now: float) -> int:
        """Ask the token site for a view change (leave, lock, unlock); the answer comes back in order."""
        request_id = self.changes.issue(op, arg, now)
        self._progress(now)
        return request_id

    def lock(self, lock: int, now: float) -> int:
        check_lock(lock)
        return self.request_change(Op.LOCK, lock, now)

    def unlock(self, lock: int, now: float) -> int:
        check_lock(lock)
        return self.request_change(Op.UNLOCK, lock, now)

    def non_member_data(self, packet: NonMemberData, now: float) -> None:
        """A non-member's call or message: the relay carries it into the order; the other members wait for it."""
        if self.leaving or self.reformation.participation is not None:
            self.stats["call_not_now"] += 1
            return
        relayed = self.relay.relay(packet, now)
        if relayed is None:
            return
        body, qos = relayed
        self.sender.queue_relayed(body, qos, packet.handler, len(packet.payload))
        self.sender.fill_window(self.views.current.view_id, now)
        self._progress(now)

    def reply(self, caller: ProcessId, conn: int, stamp: int, payload: bytes, now: float) -> bool:
        """The application's answer to a ``CallToAnswer`` (``CallRelay.reply``)."""
        return self.relay.reply(caller, conn, stamp, payload, now)

    def reply_acked(self, packet: NonMemberAck) -> None:
        self.relay.reply_acked(packet)

    # ------------------------------------------------------------------------------------------------------------
    # Timers

    def handle_timer(self, now: float) -> None:
        """Run whatever is due at ``now`` (the registry's order), then what follows from it."""
        self.timers.fire_due(now)
        if self.departed:
            self.departure.check_finished(now)
            return
        self._progress(now)

    def _pass_due(self, now: float) -> None:
        if self.token.pass_pending is not None and not self.token.resend_pass(now):
            self.suspect_failure(now, "token_pass")

    def _data_due(self, now: float) -> None:
        if not self.sender.data_timer_due(now, self.outbox.multicast):
            self.suspect_failure(now, "data")

    def _null_due(self, now: float) -> None:
        if self.token.null_due():
            # The count only says whether a round of NULL ACKs is complete; one from the wire may be any uint64, so
            # it is capped at the ring's size before counting on (past the wire's range it could not be sent).
            quiet = min(self.token.incoming_quiet, self.views.current.size) + 1
            self.rotation.send_ack((), quiet, now)

    def _request_due(self, now: float) -> None:
        if not self.changes.resend(now):
            self.suspect_failure(now, "request")

    def suspect_failure(self, now: float, why: str) -> None:
        """Retries ran out: someone is gone (``Reformation.suspect_failure``)."""
        self.reformation.suspect_failure(now, why)

    # ------------------------------------------------------------------------------------------------------------
    # Data

    def on_data(self, packet: Data, now: float) -> None:
        """A data packet received, or one of this member's own leaving (``Receipt.on_data``)."""
        self.receipt.on_data(packet, now)

    # ------------------------------------------------------------------------------------------------------------
    # After every input

    def _progress(self, now: float) -> None:
        if self.departure.departed:
            # Out of the group: nothing more is delivered or ordered here, even if later slots are held (a
            # departed process delivering past the view that removed it would break virtual synchrony).
            return
        if self.changes.leaving and self._last_to_leave():
            self.departure.depart(now)
            return
        ordering, token, reformation = self.ordering, self.token, self.reformation
        q = ordering.q
        frozen = reformation.frozen
        if frozen:
            # Nothing is delivered or ordered during a reformation, but what the catch-up NACKs brought in must
            # count towards this member's sync point, or no member behind the shared one could ever reach it.
            q.advance()
        else:
            while True:
                q.advance()
                if ordering.deliver_ts <= q.contig:
                    self.deliverer.total(now)
                accepted = self.rotation.try_accept(now) if token.accept_target is not None else None
                if not token.have_token:
                    break
                if self.rotation.order_pending(now):
                    if reformation.frozen:
                        break
                    continue  # the ACK passed the token on (in a group of one, back to ourselves)
                if accepted is not None and accepted[1] != self.pid:
                    # Nothing to order: confirm the pass explicitly (an ACK of ours would have confirmed it).
                    self.outbox.unicast(accepted[1], Confirm(self.views.current.view_id, self.pid, accepted[0]),
                                        now)
                if token.null.deadline is None:
                    self.rotation.schedule_null(now)
                break
            frozen = reformation.frozen
        ordering.free_stable(token.latest_ack_ts, self.holdings, self.views.current)
        # Stall: undelivered messages, own packets waiting to be ordered, a pass naming us not yet accepted, or
        # the ring passing the token in a view we do not know beyond any timestamp we know (``passed_by``: a New
        # List that left us out never reaches us, and without this we would stay in that view for ever).
        waiting = (ordering.deliver_ts <= q.high or bool(token.accept_target) or bool(self.sender.outstanding)
                   or self.repair.passed_by) and not frozen
        self.repair.watch(now, waiting=waiting, frozen=frozen)
