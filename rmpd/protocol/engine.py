"""The sans-IO RMP engine for one group at one process (RMP paper, sections 4.1 and 4.2).

The caller feeds it datagrams (``receive_datagram``), timer expiries (``handle_timer``) and application sends
(``send``), always with the current time, and pulls out datagrams (``datagrams_to_send``), application events
(``events``), journal records (``journal_records``) and the next deadline (``get_timer``).  It reads no clock,
draws no randomness of its own and touches no socket, so the daemon, the simulator and the tests run the same code.

Basic delivery: members multicast Data; the token site orders what it holds with one ACK per batch, giving the ACK
timestamp t and the data t+1.., and passes the token to the next member.  That member accepts only once it holds
every packet through the last one the ACK ordered, then confirms (with a Confirm, or its own ACK).  An ACK is resent
until the next site confirms.  Holes are NACKed.  An idle token site passes the token with a NULL ACK; a quiet ring
passes it once round after the last ordered packet and stops.  An ACK from a member proves that member holds every
packet up to the last one it orders, which is how K-resilient, majority and safe packets know when they may be
delivered, and how stable slots are found and freed.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from rmpd.scmp.filter import Verdict

from .config import EngineConfig
from .events import (
    CallRequest,
    Delivered,
    Event,
    Left,
    LockResult,
    SendRefused,
    Transmit,
    ViewInstalled,
    make_delivered,
)
from .flow import RttEstimator, SendWindow
from .ids import ProcessId, ViewCounter, ViewId
from .limits import check_handler, check_lock, check_message_size, check_one_packet
from .membership import Change, apply_change
from .multirpc import GroupCalls, ScmpSettings, relay_of
from .orderingq import Conflict, OrderingQ, Slot, SlotKind, SlotState
from .packets import (
    RELAYED_TAG,
    Ack,
    CallStatus,
    Confirm,
    Data,
    DataId,
    DecodeError,
    Fragment,
    ListChangeRequest,
    Nack,
    NewList,
    NonMemberAck,
    NonMemberData,
    Packet,
    RecoveryAbort,
    RecoveryAckNewList,
    RecoveryStart,
    RecoveryVote,
    Relayed,
    decode,
    encode,
)
from .packing import Queued
from .qos import Level, QoS
from .reformation import Reformation
from .status import GroupStatus
from .view import HANDLER_LOCKS, View

RECOVERY_PACKETS = (RecoveryStart, RecoveryVote, RecoveryAckNewList, RecoveryAbort)

PACKET_NAMES = {
    "Data": "data", "Ack": "ack", "Confirm": "confirm", "Nack": "nack", "NewList": "new_list",
    "ListChangeRequest": "list_change_request", "RecoveryStart": "recovery_start",
    "RecoveryVote": "recovery_vote", "RecoveryAckNewList": "recovery_ack_new_list",
    "RecoveryAbort": "recovery_abort", "NonMemberData": "non_member_data", "NonMemberAck": "non_member_ack",
}


class Rng(Protocol):
    """The randomness the engine needs, passed in (a ``random.Random`` will do)."""

    def random(self) -> float: ...


STALL_NACKS = 3
"""Tail NACKs left unanswered before a stall is taken for a failure (docs/protocol.md, "Tail NACKs")."""

NAMED_HOLE_SCAN = 256
"""How many slots before a pass's last one ``_named_with_holes`` examines (NACKs name at most 256 holes too)."""


class Backoff:
    """A retransmission timer: doubles on each expiry, clamped, reset on progress.

    ``patience``: how long after the first transmission a failure may be declared at the earliest; an expiry is
    placed at that moment so that declaring one does not wait for the next doubling."""

    __slots__ = ("deadline", "initial", "interval", "maximum", "patience", "retries", "started")

    def __init__(self, initial: float, maximum: float, patience: float = 0.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.patience = patience
        self.interval = initial
        self.deadline: float | None = None
        self.retries = 0
        self.started = 0.0

    def start(self, now: float) -> None:
        self.interval = self.initial
        self.retries = 0
        self.started = now
        self.deadline = now + self.interval

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def exhausted(self, limit: int, now: float) -> bool:
        """This expiry is the ``limit``-th in a row without an answer, the first transmission's included, and
        ``patience`` has passed since that transmission.

        The paper allows "up to N retransmissions (currently 10)" and says that this detects failures in nearby
        sites "within 5 seconds": ten doubling waits from a nearby site's 5 ms, clamped at 2 s, take 4.6 s;
        waiting out an eleventh would make it 6.6 s.  So N counts the expiries (docs/protocol.md).  A timer that
        starts lower (a round trip measured on a fast network) reaches N expiries sooner; ``patience`` keeps
        detection at the paper's time instead of making it quicker and jumpier.
        """
        return self.retries + 1 >= limit and now - self.started >= self.patience

    def back_off(self, now: float) -> None:
        self.retries += 1
        self.interval = min(self.interval * 2, self.maximum)
        self.deadline = now + self.interval
        if now < self.started + self.patience < self.deadline:
            self.deadline = self.started + self.patience

    def heard(self, now: float) -> None:
        """The other side is alive but not done yet: count expiries and ``patience`` from now, keep the interval."""
        self.retries = 0
        self.started = now

    def stop(self) -> None:
        self.deadline = None
        self.retries = 0


class GroupEngine(Reformation):
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
    ) -> None:
        """Start in ``view``: either as a founding member of a view created out of band (the first member holds
        the token), or, with ``joined_by``, as a joiner admitted by that New List (which names it the next token
        site and carries the per-source sequence numbers it starts from).

        ``join_floor``: this member's own bound for join requests from processes the group has no entry for
        (see ``_join_admissible``); the group's, carried in every New List, is taken too when it is higher."""
        if pid not in view:
            raise ValueError(f"{pid} is not a member of view {view.view_id}")
        start_ts = joined_by.ts if joined_by is not None else 0
        self.pid = pid
        self.group = group
        self.started_at = now
        self.view = view
        """The view packets are ordered in now (the latest New List known)."""
        self.app_view = view
        """The view the application has seen installed (changes when the New List is delivered)."""
        self.known_views: dict[ViewId, View] = {view.view_id: view}
        self.member_since: dict[ProcessId, int] = {m: start_ts for m in view.members}
        self.view_sizes: list[tuple[int, int]] = [(start_ts, view.size)]
        """(timestamp, view size) of each view still in the OrderingQ, for MaxN."""
        self.view_counter = view_counter or ViewCounter(pid, 0, now)
        self.config = config or EngineConfig()
        self.rng = rng
        self.stats: Counter[str] = Counter()
        self.calls = GroupCalls(scmp or ScmpSettings())
        """Non-members' calls: the SCMP filter and the RPC server states (multirpc.py)."""
        self.wall_offset = 0.0
        """Seconds to add to ``now`` for this process's wall clock (the process sets it; SCMP stamps use it)."""
        self.join_floor = max(join_floor, joined_by.join_floor if joined_by is not None else 0)
        """SCMP ``upper`` for join requests: ``requests_done`` is their connection table (docs/protocol.md)."""

        self._datagrams: list[Transmit] = []
        self._events: list[Event] = []
        self._journal: list[dict[str, Any]] = []

        # OrderingQ and the data packets held (the DataList is the part not yet ordered).
        self.q = OrderingQ(start_ts)
        self.data: dict[tuple[ProcessId, int], Data] = {}
        self.unordered: dict[ProcessId, set[int]] = {}
        self.ordered_upto: dict[ProcessId, int] = {}
        # Delivery state: next timestamp of the total-order scan, next sequence number per source.
        self.deliver_ts = start_ts
        self.src_next: dict[ProcessId, int] = {}
        self.src_ahead: dict[ProcessId, set[int]] = {}
        # What each other member is known to hold: everything through holds[m].
        self.holds: dict[ProcessId, int] = {m: start_ts for m in view.members if m != pid}

        # Token state.  A founded view starts with its first member holding the token and the ring quiet; a
        # joiner starts named as next token site by the New List that admitted it.
        first = view.members[0] if joined_by is None else joined_by.src
        self.latest_ack_ts = start_ts
        self.last_ack_sender: ProcessId = first
        self.token_site: ProcessId = first if joined_by is None else joined_by.next_site
        self.have_token = pid == first
        self.accepted_ts = start_ts if self.have_token else -1
        self.incoming_quiet = view.size - 1
        self.accept_target: tuple[int, int, ProcessId, int] | None = None
        if joined_by is not None and joined_by.next_site == pid:
            self.accept_target = (start_ts, start_ts, joined_by.src, 0)
        self.pass_pending: Ack | None = None
        self._pass_bytes = b""
        self.pass_timer = Backoff(self.config.rto_initial, self.config.rto_max, self.config.fail_after)
        self.null_deadline: float | None = None

        # Sending.  A rejoining process goes on from the sequence number its join request announced, so its new
        # messages never collide with ones it sent as an earlier member.
        self.next_seq = 1 + dict(joined_by.seqs).get(pid, 0) if joined_by is not None else first_seq
        self.next_unreliable_seq = first_unreliable_seq
        self.outstanding: dict[int, Data] = {}
        self.send_queue: deque[Queued] = deque()
        self.rto = Backoff(self.config.rto_initial, self.config.rto_max, self.config.fail_after)
        self.window = SendWindow(min_packet=self.config.min_packet, max_packet=self.config.max_packet,
                                 min_window=self.config.min_window or 2 * self.config.max_packet,
                                 initial=self.config.initial_window, max_window=self.config.max_window)
        self.data_rtt = self._round_trips(self.config.rto_initial)
        """Send -> ordering time of our own packets: the data retransmission timer."""
        self.pass_rtt = self._round_trips(self.config.rto_initial)
        """Token pass -> confirmation time: the ACK retransmission timer."""
        self._first_sent: dict[int, float] = {}
        """When each outstanding packet of ours was sent, for packets not retransmitted (Karn's rule)."""
        self._pass_sent_at: float | None = None
        self.overrun = False
        """The application cannot take more deliveries for now: do not accept the token (section 4.6)."""
        self._reassembly: dict[ProcessId, list[bytes]] = {}
        """Pieces of a fragmented message delivered so far, per source."""

        # NACKs and stall detection.
        self.nack_deadline: float | None = None
        self.nack_tries = 0
        self.nack_rtt = self._round_trips(self.config.nack_timeout, maximum=self.config.nack_timeout)
        """First NACK for a hole -> the hole filled: how soon to NACK a hole, and to NACK it again."""
        self._nack_first_at: float | None = None
        """When the current hole was first NACKed (None: not yet); its answer times the round trip only while that
        NACK was not resent (``nack_tries`` is 1: Karn's rule)."""
        self._multicast_resends: dict[tuple[int, ProcessId | None, int], float] = {}
        """When each packet was last multicast again for a NACK, keyed by (timestamp, None, 0) for what the
        OrderingQ holds and (-1, src, seq) for unordered data: see ``_on_nack``."""
        self._nack_contig = start_ts
        self.gap_deadline: float | None = None
        """When to ask sources for packets of theirs known to exist but not held here: see ``_ask_sources``."""
        self.gap_tries = 0
        self._gap_first: tuple[ProcessId, int] | None = None
        """The first such packet the current asking is about: a new one starts the wait and the back-off afresh."""
        self._gappy: dict[ProcessId, None] = {}
        """Sources a packet arrived from while an earlier unordered one of theirs was not held (maybe a gap); a dict
        as an ordered set, so that which gap is asked for first does not depend on string hashing."""
        self.stall_deadline: float | None = None
        self.stall_tries = 0
        self._hint_target: ProcessId | None = None
        """A member of our view that spoke in a view we do not know: it can send us the New Lists we missed."""
        self._passed_by = False
        """Since our last new ACK, a member of our view passed the token in a view we do not know, at a timestamp
        beyond any we know: the ring moved on past a view change we missed (see ``_progress``, the stall)."""
        self.hint_deadline: float | None = None
        self._hint_quiet_until = 0.0
        self._hint_gap = self.config.nack_timeout

        # Membership changes: requests waiting for the token site, the highest request ID served per requester,
        # this process's own requests awaiting their New List, and leaving.
        self.pending_requests: dict[tuple[ProcessId, int], ListChangeRequest] = {}
        self._source_restarts: dict[ProcessId, int] = {}
        self.requests_done: dict[ProcessId, int] = {}
        self.my_requests: dict[int, ListChangeRequest] = {}
        self._answered: dict[int, ListChangeRequest] = {}
        self.request_ids = request_ids or itertools.count(1)
        """Shared with the process: request IDs only grow, across joins and groups."""
        self.request_timer = Backoff(self.config.request_interval, self.config.rto_max)
        self.leaving = False
        self.departed = False
        # Reformation (see reformation.py).
        self.version_seen: tuple[int, ProcessId] = (0, "")
        self.participation = None
        self.initiation = None
        self.restart_deadline: float | None = None
        self.minority_attempts = 0
        self.failed_reformations = 0
        self.departed_at: float | None = None
        self.depart_reason = "left"
        self.finished = False

        if joined_by is not None:
            self.ordered_upto.update(joined_by.seqs)
            self.src_next.update({src: seq + 1 for src, seq in joined_by.seqs})
            self.requests_done.update(joined_by.done)
            self.q.place_control(start_ts, SlotKind.VIEW, joined_by)
        else:
            # A founder whose numbering does not start at 1 (a daemon numbers from its start time) says so in the
            # group's first order, or its first message would wait forever behind sequence numbers never sent.
            self.ordered_upto[pid] = first_seq - 1
            self.src_next[pid] = first_seq
            self.q.place_control(start_ts, SlotKind.VIEW, ("initial", view.view_id))
        first_slot = self.q.get(start_ts)
        assert first_slot is not None
        first_slot.state = SlotState.DELIVERED
        self.q.advance()
        self.deliver_ts = start_ts + 1
        self._events.append(ViewInstalled(group, view.view_id, view.members, start_ts))
        self._record("view", now, ts=start_ts, members=list(view.members), locks=[list(x) for x in view.locks],
                     view=str(view.view_id))

    # ------------------------------------------------------------------------------------------------------------
    # Outputs

    def datagrams_to_send(self) -> list[Transmit]:
        out, self._datagrams = self._datagrams, []
        return out

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def journal_records(self) -> list[dict[str, Any]]:
        out, self._journal = self._journal, []
        return out

    def get_timer(self) -> float | None:
        deadlines = [
            d
            for d in (
                self.pass_timer.deadline, self.rto.deadline, self.null_deadline, self.nack_deadline, self.gap_deadline,
                self.stall_deadline, self.hint_deadline, self.request_timer.deadline, self.recovery_deadline(),
                self._linger_deadline(),
            )
            if d is not None
        ]
        return min(deadlines) if deadlines else None

    def status(self) -> GroupStatus:
        """A snapshot of this membership for the process's callers (``RmpProcess.status``)."""
        return GroupStatus(
            group=self.group, view=self.app_view, leaving=self.leaving and not self.departed,
            departed=self.departed, finished=self.finished, reforming=self.frozen, next_seq=self.next_seq,
            send_queue=len(self.send_queue), in_flight=len(self.outstanding), window=self.window.window,
            orderingq_slots=len(self.q.slots), ack_slots=self.q.ack_slots, packets_held=len(self.data),
            started_at=self.started_at, scmp=self.scmp_status(),
        )

    @property
    def quiet(self) -> bool:
        """True when this process has nothing left to do until new input arrives."""
        return self.get_timer() is None

    # ------------------------------------------------------------------------------------------------------------
    # Inputs

    def send(self, payload: bytes, qos: QoS, now: float, handler: int | None = None) -> int | None:
        """Accept an application message; returns its sequence number (None when refused)."""
        seqs = self.send_batch((payload,), qos, now, handler)
        return None if seqs is None else seqs[0]

    def send_batch(self, payloads: Sequence[bytes], qos: QoS, now: float,
                   handler: int | None = None) -> list[int] | None:
        """Accept several application messages at once, in order; returns their sequence numbers (None when
        refused: all of them, and MessageTooLarge, checked first, refuses all of them too).

        Messages handed over together are packed together whatever the window: each joins the packet at the
        queue's tail while it has room, and only then does the window decide what leaves.  None of them is held
        back for it, so this costs no latency, and a busy sender pays one datagram, one slot of the order and one
        ACK entry per packet instead of per message (the per-datagram work, not the wire, limits a loaded ring)."""
        if self.leaving or self.departed:
            self._events.append(SendRefused(self.group, "this process is leaving the group"))
            return None
        config = self.config
        check_handler(handler)
        if payloads:
            check_message_size(config, max(payloads, key=len), qos)  # both limits are on the length
        if qos.level == Level.UNRELIABLE:
            return [self._send_unreliable(payload, qos, handler, now) for payload in payloads]
        seqs: list[int] = []
        queue = self.send_queue
        limit = self.window.packet_limit()
        i, count = 0, len(payloads)
        while i < count:
            payload = payloads[i]
            if len(payload) > config.max_packet:
                seqs.append(self._queue_fragments(payload, qos, handler))
                i += 1
                continue
            # Under load (the window is full, or the messages came together): pack into the packet waiting to go,
            # so one datagram and one slot of the order carry many small messages.
            tail = queue[-1] if queue else None
            if tail is not None and tail.packs(qos, handler):
                end = tail.take_run(payloads, i, limit, config.max_packet)
                if end > i:
                    seqs.extend(itertools.repeat(tail.seq, end - i))
                    self.stats["packed"] += end - i
                    i = end
                    continue
            queue.append(Queued(self.next_seq, qos, handler, [payload], len(payload)))
            seqs.append(self.next_seq)
            self.next_seq += 1
            i += 1
        self._fill_window(now)
        self._progress(now)
        return seqs

    def _send_unreliable(self, payload: bytes, qos: QoS, handler: int | None, now: float) -> int:
        seq = self.next_unreliable_seq
        self.next_unreliable_seq += 1
        packet = Data(self.view.view_id, self.pid, seq, qos, handler, payload)
        self._multicast(packet, now)
        self._deliver(packet, None, now, holders=1)
        return seq

    def _queue_fragments(self, payload: bytes, qos: QoS, handler: int | None) -> int:
        """A message larger than MAX_PACKET goes as pieces with consecutive sequence numbers; it is delivered
        whole, at the place of its last piece, which is also the sequence number the sender gets.  Pieces of an
        unordered message travel source ordered, so every member reassembles them in sequence."""
        if qos.level == Level.UNORDERED:
            qos = QoS(Level.SOURCE)
        size = self.config.max_packet
        count = -(-len(payload) // size)
        for i in range(count):
            chunk = payload[i * size:(i + 1) * size]
            self.send_queue.append(Queued(self.next_seq, qos, handler, [chunk], len(chunk), more=i < count - 1,
                                          first=i == 0))
            self.next_seq += 1
        self.stats["fragmented"] += 1
        return self.next_seq - 1

    def _fill_window(self, now: float) -> None:
        """Send queued packets while the window (bytes and packets in flight) allows."""
        queue = self.send_queue
        while queue and len(self.outstanding) < self.config.window_packets and self.window.may_send(queue[0].size):
            queued = queue.popleft()
            self._transmit_new(queued.packet(self.view.view_id, self.pid), now)

    def set_overrun(self, overrun: bool, now: float) -> None:
        """Section 4.6: a process that runs out of buffers delays accepting the token, so nothing more is ordered
        anywhere until it catches up, instead of dropping what was accepted.  Senders' windows then fill and they
        slow down.  Delayed too long, it is declared failed by its predecessor, as the paper intends."""
        if overrun == self.overrun:
            return
        self.overrun = overrun
        if overrun:
            self.stats["overruns"] += 1
        else:
            self._progress(now)

    def receive_datagram(self, data: bytes, addr: ProcessId | None, now: float) -> None:
        """Handle one datagram from the network.  Nothing raised by hostile bytes escapes."""
        try:
            packet = decode(data)
        except DecodeError:
            self.stats["malformed"] += 1
            return
        self.receive_packet(packet, now)

    def accepts_view(self, view_id: ViewId | None) -> bool:
        return view_id in self.known_views

    def receive_packet(self, packet: Packet, now: float) -> None:
        src = getattr(packet, "src", None)
        if src == self.pid:
            self.stats["own_echo"] += 1
            return
        if isinstance(packet, ListChangeRequest):
            if self.departed:
                self.stats["departed_ignored"] += 1
            elif packet.group == self.group and (packet.view is None or packet.view in self.known_views):
                self._on_request(packet, now)
                self._progress(now)
            else:
                self.stats["other_view"] += 1
            return
        part = self.participation
        if part is not None and part.new_list is not None and packet.view == part.new_list.new_view:
            self._commit_recovery(part.new_list, now)  # the initiator committed: so do we
        view = self.known_views.get(packet.view)  # type: ignore[arg-type]
        if view is None:
            self.stats["other_view"] += 1
            if not self.departed:
                witness = self.witness_of_unknown_view(packet)
                if witness is not None:
                    self._note_unknown_view(witness, now)
                    if isinstance(packet, (Ack, NewList)) and packet.ts > self.latest_ack_ts:
                        self._passed_by = True
                        self._progress(now)
            return
        if src not in view:
            self.stats["non_member"] += 1
            return
        if self._beyond_horizon(packet):
            self.stats["beyond_horizon"] += 1
            return
        self.stats["received"] += 1
        if self.config.journal:
            self._record_packet("recv", packet, now)
        if self.departed:
            self._departed_receive(packet, now)
            return
        if isinstance(packet, Data):
            self._on_data(packet, now)
        elif isinstance(packet, Ack):
            self._on_ack(packet, now)
        elif isinstance(packet, NewList):
            if packet.request_src is not None or not self._on_recovery_new_list(packet, now):
                self._on_new_list(packet, now)
        elif isinstance(packet, RECOVERY_PACKETS):
            self._on_recovery_packet(packet, now)
        elif isinstance(packet, Confirm):
            self._on_confirm(packet, now)
        elif isinstance(packet, Nack):
            self._on_nack(packet, now)
        else:
            self.stats["unhandled_" + PACKET_NAMES[type(packet).__name__]] += 1
            return
        self._progress(now)

    def witness_of_unknown_view(self, packet: Packet) -> ProcessId | None:
        """A member of our view that can tell us about the view ``packet`` is stamped with, if there is one.

        The sender, when it is one of ours; otherwise the view's creator, when it is one of ours: a member that a
        New List we missed brought in speaks in a view we do not know, and passes us the token in it, but the token
        site that created that view holds the New List.
        """
        src = getattr(packet, "src", None)
        if src in self.view:
            return src
        creator = packet.view.creator if packet.view is not None else None
        if creator in self.view and creator != self.pid:
            return creator
        return None

    def _note_unknown_view(self, src: ProcessId, now: float) -> None:
        """A member speaks in a view we have not seen: we missed a New List.  Ask that member for what follows.

        The ring waits for us (the token site retransmits its pass in the new view), so ask soon, after
        ``nack_delay`` in case the New List is merely behind the packet, and again at doubling gaps while the hints
        go on.  Waiting for the stall timer instead cost a round of up to ``rto_max`` per missed New List, and a
        member that had missed three kept the ring stopped for six seconds (``rmp sim`` seed 23 of the issue's
        fault mix).  These requests do not count towards suspecting a failure: the witness is evidently alive.
        """
        self.stats["unknown_view_hints"] += 1
        if self.frozen:
            return
        self._hint_target = src
        if self.hint_deadline is None and now >= self._hint_quiet_until:
            self.hint_deadline = now + self.config.nack_delay

    def handle_timer(self, now: float) -> None:
        """Run whatever is due at ``now``."""
        self._recovery_timer(now)
        if self.pass_timer.expired(now) and self.pass_pending is not None:
            if self.pass_timer.exhausted(self.config.fail_retries, now):
                self.pass_timer.stop()
                self.suspect_failure(now, "token_pass")
            else:
                self.stats["ack_retransmits"] += 1
                self._datagrams.append(Transmit(None, self._pass_bytes, self.group))
                self._record_packet("send", self.pass_pending, now)
                self.pass_timer.back_off(now)
        if self.rto.expired(now):
            if self.rto.exhausted(self.config.fail_retries, now):
                self.rto.stop()
                self.suspect_failure(now, "data")
            else:
                self._retransmit_own(now)
        if self.null_deadline is not None and now >= self.null_deadline:
            self.null_deadline = None
            if self.have_token:
                self._send_ack((), self.incoming_quiet + 1, now)
        if self.gap_deadline is not None and now >= self.gap_deadline:
            self._ask_sources(now)
        if self.nack_deadline is not None and now >= self.nack_deadline:
            if (self.nack_tries >= self.config.nack_rotate + self.config.fail_retries and not self.frozen
                    and self._nack_first_at is not None and now - self._nack_first_at >= self.config.fail_after):
                self.suspect_failure(now, "nack")
            self._send_nack(now, tail=False)
        if self.hint_deadline is not None and now >= self.hint_deadline:
            self.hint_deadline = None
            if self._hint_target is not None and not self.frozen:
                self.stats["hint_nacks_sent"] += 1
                self._emit_nack(now, self._hint_target, tail=True, missing=self.q.missing(256))
                self._hint_quiet_until = now + self._hint_gap
                self._hint_gap = min(self._hint_gap * 2, self.config.rto_max)
        if self.stall_deadline is not None and now >= self.stall_deadline:
            if self.stall_tries >= STALL_NACKS:
                self.stall_deadline = None
                self.suspect_failure(now, "stall")
            else:
                self._send_nack(now, tail=True)
        if self.request_timer.expired(now):
            if self.request_timer.exhausted(self.config.fail_retries, now):
                self.request_timer.stop()
                self.suspect_failure(now, "request")
            else:
                self._resend_requests(now)
        if self.departed:
            self._check_finished(now)
            return
        self._progress(now)

    # ------------------------------------------------------------------------------------------------------------
    # Data

    def _transmit_new(self, packet: Data, now: float) -> None:
        self._add_outstanding(packet)
        self._first_sent[packet.seq] = now
        if self.rto.deadline is None:
            self._start_rto(now)
        self._multicast(packet, now)
        self._on_data(packet, now)

    def _add_outstanding(self, packet: Data) -> None:
        if packet.seq not in self.outstanding:
            self.outstanding[packet.seq] = packet
            self.window.sent(packet.size)

    def _start_rto(self, now: float) -> None:
        self.rto.initial = self.data_rtt.rto
        self.rto.start(now)

    def _retransmit_own(self, now: float) -> None:
        if not self.outstanding:
            self.rto.stop()
            return
        if self.window.congested(now, self.data_rtt.rto):
            self.stats["window_halved_timeout"] += 1
        # The oldest packet first, then twice as many per expiry in a row (as TCP resends one segment on a
        # timeout): a timer that fired because the ring was slow, not because packets were lost, costs one resend.
        burst = min(self.config.retransmit_burst, 1 << min(self.rto.retries, 16))
        for i, packet in enumerate(self.outstanding.values()):
            if i >= burst:
                break
            self.stats["data_retransmits"] += 1
            self._first_sent.pop(packet.seq, None)
            self._multicast(packet, now)
        self.rto.back_off(now)

    def _on_data(self, packet: Data, now: float) -> None:
        if packet.src not in self.view and not self.frozen and (
                packet.qos.level == Level.UNRELIABLE or self.q.ts_of((packet.src, packet.seq)) is None):
            # A process our view no longer holds (a reformation cut it off) still speaks in an older view we know.
            # Only a packet an ACK already ordered is still wanted (a NACK's answer), or, while a reformation runs,
            # one its sync point may name; anything else came too late: no token site may order it.
            self.stats["removed_source"] += 1
            return
        if packet.qos.level == Level.UNRELIABLE:
            self._deliver(packet, None, now, holders=1)
            return
        key = (packet.src, packet.seq)
        if key in self.data or self._delivered(packet.src, packet.seq):
            self.stats["duplicates"] += 1
            if packet.src != self.pid and packet.seq <= self.ordered_upto.get(packet.src, 0):
                self._resent_after_order(now)
            return
        ts = self.q.ts_of(key)
        if ts is not None:
            slot = self.q.slots[ts]
            if slot.qos != packet.qos:
                self.stats["qos_mismatch"] += 1
                return
            self.data[key] = packet
            if slot.state in (SlotState.MISSING, SlotState.REQUESTED):
                slot.state = SlotState.RECEIVED
        else:
            self.data[key] = packet
            self.unordered.setdefault(packet.src, set()).add(packet.seq)
            if packet.seq - 1 > self.ordered_upto.get(packet.src, 0) and (packet.src, packet.seq - 1) not in self.data:
                self._gappy[packet.src] = None
        level = packet.qos.level
        if level == Level.UNORDERED:
            self._deliver(packet, ts, now, holders=1)
        if level <= Level.SOURCE:
            self._deliver_source_chain(packet.src, now)

    def _resent_after_order(self, now: float) -> None:
        """The source resent a packet that is ordered already: it missed the ACK that ordered it and knows of no
        later timestamp, so it has no hole to NACK and goes on resending on its backed-off timer.  The token site
        passes the token soon (a NULL ACK after ``null_ack_prompt``) instead of after up to ``null_ack_interval``:
        the NULL ACK names the newest timestamp, and the source NACKs what it missed.  Only the token site answers,
        once per prompt interval, so a burst of resends costs one packet."""
        self.stats["resent_after_order"] += 1
        prompt = now + self.config.null_ack_prompt
        holding = self.have_token and not (self.frozen or self.departed or self.leaving) and self.pid in self.view
        if holding and (self.null_deadline is None or self.null_deadline > prompt):
            self.null_deadline = prompt

    # ------------------------------------------------------------------------------------------------------------
    # ACKs and the token

    def _beyond_horizon(self, packet: Packet) -> bool:
        """Does the packet name a timestamp too far ahead to make room for (``max_ahead``)?"""
        ts = getattr(packet, "ts", None)
        if ts is None:
            ts = getattr(packet, "sync_ts", None)
        return ts is not None and ts > self.q.contig + self.config.max_ahead

    def _on_ack(self, ack: Ack, now: float) -> None:
        q = self.q
        if ack.ts < q.base:
            self._reconfirm(ack, now)
            return
        try:
            q.check_ids(ack)
            fresh = q.place_control(ack.ts, SlotKind.ACK, ack)
        except Conflict:
            self.stats["conflicts"] += 1
            return
        if not fresh:
            self.stats["duplicates"] += 1
            self._reconfirm(ack, now)
            return
        for i, data_id in enumerate(ack.ids):
            src, seq, _ = data_id
            key = (src, seq)
            q.place_data_id(ack.ts + 1 + i, data_id, key in self.data)
            if seq > self.ordered_upto.get(src, 0):
                self.ordered_upto[src] = seq
            pending = self.unordered.get(src)
            if pending is not None:
                pending.discard(seq)
                if not pending:
                    del self.unordered[src]
            if src == self.pid:
                self._own_ordered(seq, now, sample=ack.src != self.pid)
        self._token_moved(ack.src, ack.ts, ack.last_ts, ack.next_site, ack.quiet, now)

    def _token_moved(self, sender: ProcessId, ts: int, last_ts: int, next_site: ProcessId, quiet: int,
                     now: float) -> None:
        """An ACK or New List at ``ts`` passed the token from ``sender`` to ``next_site``."""
        self._learn_holds(sender, last_ts)
        if ts <= self.latest_ack_ts:
            return
        self.latest_ack_ts = ts
        self.last_ack_sender = sender
        self.token_site = next_site
        if self.outstanding and self.rto.deadline is not None:
            # The ring is ordering: our packets are waiting their turn (at the latest the token reaches us and
            # we order them ourselves), not lost; the data timer measures a ring that stopped moving.
            self._start_rto(now)
        if self.pass_pending is not None and ts > self.pass_pending.ts:
            self._pass_confirmed(now)
        if next_site == self.pid and (sender != self.pid or self.view.size == 1):
            self.accept_target = (ts, last_ts, sender, quiet)
        else:
            self.accept_target = None
        self.stall_deadline = None
        self.stall_tries = 0
        self._hint_target = None
        self._passed_by = False
        self.hint_deadline = None
        self._hint_gap = self.config.nack_timeout

    # ------------------------------------------------------------------------------------------------------------
    # Membership changes (New List, List Change Request)

    def _on_request(self, request: ListChangeRequest, now: float) -> None:
        key = (request.src, request.request_id)
        if request.request_id <= self.requests_done.get(request.src, 0):
            self.stats["requests_repeated"] += 1
            self._answer_repeated_request(request, now)
            return
        if request.op == "join" and request.src in self.view:
            self.stats["requests_repeated"] += 1
            return
        if request.op != "join" and request.src not in self.view:
            self.stats["non_member"] += 1
            return
        self.pending_requests.setdefault(key, request)

    def _answer_repeated_request(self, request: ListChangeRequest, now: float) -> None:
        """A joiner that missed its New List asks again: the New List's sender unicasts it once more."""
        for slot in self.q.slots.values():
            nl = slot.packet
            if (isinstance(nl, NewList) and nl.src == self.pid and nl.request_src == request.src
                    and nl.request_id == request.request_id):
                self._unicast(request.src, nl, now)
                return

    def _make_new_list(self, now: float) -> bool:
        """As token site, answer the oldest pending request with a New List; False when none can be made now."""
        while self.pending_requests:
            key, request = next(iter(self.pending_requests.items()))
            if request.request_id <= self.requests_done.get(request.src, 0) or (
                    request.op != "join" and request.src not in self.view):
                del self.pending_requests[key]
                continue
            self._collect_requests_done(now)
            if request.op == "join" and request.src not in self.view and not self._join_admissible(request, now):
                del self.pending_requests[key]
                continue
            change = self._apply_change(request)
            view_id = self.view.view_id
            if change.changed:
                fresh = self.view_counter.next_view_id(now)
                if fresh is None:  # at most one new view per ms of uptime: try again on the next tick
                    self.null_deadline = now + 0.001
                    return False
                view_id = fresh
            members = change.members
            if request.op == "join" and change.changed:
                next_site = request.src
            elif self.pid in members:
                next_site = members[(members.index(self.pid) + 1) % len(members)]
            else:  # the token site itself leaves: the token goes to the member after it
                old = self.view.members
                i = old.index(self.pid)
                next_site = next(old[(i + k) % len(old)] for k in range(1, len(old)) if old[(i + k) % len(old)]
                                 in members)
            done = dict(self.requests_done)
            done[request.src] = request.request_id
            seqs = dict(self.ordered_upto)
            if request.op == "join" and change.changed:
                seqs[request.src] = request.arg or 0  # a (re)joiner's messages start after this
            nl = NewList(
                self.view.view_id, self.pid, self.q.high + 1, next_site, self.group, view_id,
                tuple((m, m not in change.unicast_only) for m in members),
                tuple(seqs.items()), tuple(done.items()), change.locks, change.min_partition,
                request.src, request.request_id, change.granted, None, self.join_floor,
            )
            self.have_token = False
            self.null_deadline = None
            self.stats["new_lists_sent"] += 1
            self._pass_bytes = self._multicast(nl, now)
            if request.op == "join" and change.changed and request.src in change.unicast_only:
                pass  # _multicast already unicast a copy to members that cannot receive multicast
            elif request.op == "join" and change.changed:
                self._unicast(request.src, nl, now)
            self._await_confirmation(nl, now)
            self._on_new_list(nl, now)
            return True
        return False

    def _join_admissible(self, request: ListChangeRequest, now: float) -> bool:
        """SCMP for a join request at the token site; a refused joiner is told, and asks again under a new ID.

        A join request is a first-contact packet: its request ID is its sender's clock in ms times 1000 (plus a
        counter), and ``requests_done`` is the connection table, carried in every New List.  A requester the table
        knows is judged by it (``_make_new_list``).  One it does not know is refused when stamped at or below the
        group's join floor (a replay of a join some earlier incarnation of the group accepted, or a late one) or
        more than ``ahead_ms`` after this site's clock or, with stable storage, after its ``latest`` (so every
        accepted stamp is bounded by some member's clock, which is what the floor relies on).
        """
        stamp = request.request_id // 1000
        settings = self.calls.settings
        bound = self.wall_ms(now) + settings.ahead_ms
        if self.calls.filter.latest is not None:
            bound = min(bound, self.calls.filter.latest)
        if stamp > bound:
            self.stats["joins_refused_too_early"] += 1
        elif stamp <= self.join_floor:
            self.stats["joins_refused_summary"] += 1
        else:
            return True
        self._unicast(request.src, NonMemberAck(self.view.view_id, self.pid, 0, request.request_id,
                                                CallStatus.JOIN_REFUSED, None), now)
        return False

    def _collect_requests_done(self, now: float) -> None:
        """SCMP garbage collection of the join table: a process outside the view whose last request is older than
        the lifetime estimate leaves ``requests_done``, and the join floor rises to that request's stamp, so its
        old requests stay refused while the table (carried in every New List) stays the size of the group."""
        horizon = self.wall_ms(now) - self.calls.filter.estimator.estimate
        for src, request_id in list(self.requests_done.items()):
            if request_id // 1000 <= horizon and src not in self.view:
                del self.requests_done[src]
                self.join_floor = max(self.join_floor, request_id // 1000)

    def scmp_status(self) -> dict[str, Any]:
        """What ``rmp status`` shows of SCMP: the call filter, and the join floor with the joins it refused here."""
        return {**self.calls.filter.describe(), "join_floor": self.join_floor,
                "joins_refused": self.stats["joins_refused_summary"],
                "joins_too_early": self.stats["joins_refused_too_early"]}

    def _apply_change(self, request: ListChangeRequest) -> Change:
        """The membership rules (membership.py) applied to the current view at this token site."""
        return apply_change(self.view, request, self.pid)

    def _on_new_list(self, nl: NewList, now: float) -> None:
        q = self.q
        if nl.ts < q.base:
            self._reconfirm(nl, now)
            return
        try:
            fresh = q.place_control(nl.ts, SlotKind.VIEW, nl)
        except Conflict:
            self.stats["conflicts"] += 1
            return
        if not fresh:
            self.stats["duplicates"] += 1
            self._reconfirm(nl, now)
            return
        self.join_floor = max(self.join_floor, nl.join_floor)
        if nl.request_src is not None and nl.request_id is not None:
            if nl.request_id > self.requests_done.get(nl.request_src, 0):
                self.requests_done[nl.request_src] = nl.request_id
            self.pending_requests.pop((nl.request_src, nl.request_id), None)
            answered_mine = nl.request_src == self.pid and self.my_requests.pop(nl.request_id, None) is not None
            if answered_mine and not self.my_requests:
                self.request_timer.stop()
        new_view = View(nl.new_view, tuple(m for m, _ in nl.members),
                        frozenset(m for m, capable in nl.members if not capable), nl.locks, nl.min_partition)
        self.known_views[nl.new_view] = new_view
        if nl.ts > self.latest_ack_ts:
            announced = dict(nl.seqs)
            for m in new_view.members:
                if m not in self.view:
                    self.member_since[m] = nl.ts
                    if m != self.pid:
                        self.holds.setdefault(m, nl.ts)
                        self._restart_source(m, announced.get(m, 0))
            for m in self.view.members:
                if m not in new_view:
                    self.holds.pop(m, None)
            for src in [s for s in self.unordered if s not in new_view]:
                self._forget_unorderable(src)
            self.view = new_view
            self.view_sizes.append((nl.ts, new_view.size))
            if self.pid not in new_view:  # a view without us: its token is not ours to hold or pass
                self.have_token = False
                self.null_deadline = None
        self._ask_again_if_lost(now)
        self._token_moved(nl.src, nl.ts, nl.ts, nl.next_site, 0, now)

    def _forget_unorderable(self, src: ProcessId) -> None:
        """A view without ``src``: of its packets not yet ordered, only the run that follows what was ordered may
        still be (a token site holding it orders it, as after a reformation).  Past the first hole nothing can be:
        the one process sure to hold the hole is gone and its late copies are refused (``_on_data``), so stop
        waiting for it.  The packets stay in ``data``: an ACK from a site that held the hole may still order them."""
        pending = self.unordered[src]
        seq = self.ordered_upto.get(src, 0) + 1
        while seq in pending:
            seq += 1
        for late in [s for s in pending if s > seq]:
            pending.discard(late)
        if not pending:
            del self.unordered[src]

    def _restart_source(self, member: ProcessId, base: int) -> None:
        """A process (re)joins: order its messages from ``base``+1 on, forgetting any older ones still unordered.
        Delivery restarts there when the New List is delivered (see _commit_view)."""
        self.ordered_upto[member] = max(self.ordered_upto.get(member, 0), base)
        pending = self.unordered.get(member)
        if pending:
            for seq in [s for s in pending if s <= base]:
                pending.discard(seq)
                self.data.pop((member, seq), None)
            if not pending:
                del self.unordered[member]
        self._source_restarts[member] = base

    def _commit_view(self, nl: NewList, now: float) -> None:
        """The New List is delivered: the application sees the view change here, in order."""
        view = self.known_views[nl.new_view]
        for member, _ in nl.members:
            base = self._source_restarts.pop(member, None)
            if base is not None:  # messages after base may already be delivered (source order needs no ACK)
                self.src_next[member] = max(self.src_next.get(member, 1), base + 1)
                ahead = {s for s in self.src_ahead.get(member, ()) if s > base}
                self.src_ahead[member] = ahead
                while self.src_next[member] in ahead:
                    ahead.discard(self.src_next[member])
                    self.src_next[member] += 1
        for src in [s for s in self._reassembly if s not in view]:
            del self._reassembly[src]  # its sender is gone: every member drops the same unfinished message
        if nl.new_view != self.app_view.view_id:
            self.app_view = view
            self._events.append(ViewInstalled(self.group, view.view_id, view.members, nl.ts))
            self._record("view", now, ts=nl.ts, members=list(view.members), locks=[list(x) for x in view.locks],
                         view=str(view.view_id))
        if nl.request_src == self.pid and nl.request_id is not None:
            self._request_answered(nl, now)
        if self.pid not in view:
            self._depart(now)

    def _request_answered(self, nl: NewList, now: float) -> None:
        request = self._answered.pop(nl.request_id, None)  # type: ignore[arg-type]
        if request is not None and request.op in ("lock", "unlock") and request.arg is not None:
            self._events.append(LockResult(self.group, request.arg, request.op, nl.granted))

    def request_change(self, op: str, arg: int | None, now: float) -> int:
        """Ask the token site for a view change (leave, lock, unlock); the answer comes back in order."""
        request_id = self._issue_request(op, arg, now)
        self._progress(now)
        return request_id

    def _issue_request(self, op: str, arg: int | None, now: float) -> int:
        request_id = next(self.request_ids)
        request = ListChangeRequest(self.group, self.view.view_id, self.pid, request_id, op, arg, True, 1, 1)
        self.my_requests[request_id] = request
        self._answered[request_id] = request
        if self.request_timer.deadline is None:
            self.request_timer.start(now)
        self._multicast(request, now)
        self._on_request(request, now)
        return request_id

    def _ask_again_if_lost(self, now: float) -> None:
        """Ask again, under a fresh number, for every change of ours that no New List will ever answer.

        A token site takes every request numbered at or below the highest it served from a process as done, so a
        request overtaken by a later one (lost, then resent after the later one was served) would be skipped; and a
        New List that answered us can be dropped by a reformation (it lay beyond the sync point).  Either way the
        request is neither waiting in ``my_requests`` under a live number nor answered by a New List in the
        OrderingQ.
        """
        if self.departed:
            return
        placed = {slot.packet.request_id for slot in self.q.slots.values()
                  if isinstance(slot.packet, NewList) and slot.packet.request_src == self.pid}
        done = self.requests_done.get(self.pid, 0)
        lost = [request for request_id, request in self._answered.items()
                if request_id not in placed and (request_id not in self.my_requests or request_id <= done)]
        for request in lost:
            del self._answered[request.request_id]
            self.my_requests.pop(request.request_id, None)
            self.stats["requests_reissued"] += 1
            self._issue_request(request.op, request.arg, now)

    def lock(self, lock: int, now: float) -> int:
        check_lock(lock)
        return self.request_change("lock", lock, now)

    def unlock(self, lock: int, now: float) -> int:
        check_lock(lock)
        return self.request_change("unlock", lock, now)

    def leave(self, now: float) -> None:
        """Leave once every message this process sent has been ordered, so nothing it accepted is lost."""
        if self.leaving or self.departed:
            return
        self.leaving = True
        if self.view.size == 1:
            self._depart(now)
            return
        self._maybe_request_leave(now)

    def _maybe_request_leave(self, now: float) -> None:
        if self.leaving and not self.outstanding and not self.send_queue and not any(
                r.op == "leave" for r in self._answered.values()):
            self.request_change("leave", None, now)

    def _resend_requests(self, now: float) -> None:
        if not self.my_requests:
            self.request_timer.stop()
            return
        for request in self.my_requests.values():
            self.stats["request_retransmits"] += 1
            resent = ListChangeRequest(request.group, self.view.view_id, request.src, request.request_id,
                                       request.op, request.arg, request.multicast_capable, request.min_partition,
                                       request.ttl)
            self._multicast(resent, now)
        self.request_timer.back_off(now)

    # ------------------------------------------------------------------------------------------------------------
    # After leaving: answer NACKs until everything held is stable

    def _depart(self, now: float, reason: str = "left") -> None:
        self.departed = True
        self.depart_reason = reason
        self.departed_at = now
        self.have_token = False
        self.accept_target = None
        self.null_deadline = None
        self.nack_deadline = None
        self.gap_deadline = None
        self.stall_deadline = None
        self.hint_deadline = None
        self.rto.stop()
        self.request_timer.stop()
        self._check_finished(now)

    def _departed_receive(self, packet: Packet, now: float) -> None:
        if isinstance(packet, Ack | NewList):
            last = packet.last_ts if isinstance(packet, Ack) else packet.ts
            self._learn_holds(packet.src, last)
            if self.pass_pending is not None and packet.ts > self.pass_pending.ts:
                self._pass_confirmed()
        elif isinstance(packet, Confirm):
            self._on_confirm(packet, now)
        elif isinstance(packet, Nack):
            self._on_nack(packet, now)
        self._check_finished(now)

    def _linger_deadline(self) -> float | None:
        if self.departed_at is None or self.finished:
            return None
        return self.departed_at + self.config.leave_linger

    def _check_finished(self, now: float) -> None:
        if self.finished:
            return
        stable = all(self.holds.get(m, -1) >= self.q.high for m in self.view.members if m != self.pid)
        linger_end = self._linger_deadline()
        lingered = linger_end is not None and now >= linger_end
        if (stable and self.pass_pending is None) or lingered:
            self.finished = True
            self.pass_timer.stop()
            self._events.append(Left(self.group, self.depart_reason))

    def _reconfirm(self, ack: Ack | NewList, now: float) -> None:
        """A resent ACK whose token we already accepted: the Confirm was lost, send it again."""
        if ack.next_site == self.pid and self.accepted_ts >= ack.ts and ack.src != self.pid:
            self._unicast(ack.src, Confirm(self.view.view_id, self.pid, ack.ts), now)

    def _own_ordered(self, seq: int, now: float, sample: bool) -> None:
        """``sample``: the ordering ACK came from another site, so send-to-ordering is a round trip of the ring.
        Packets we order ourselves as token site take no time at all; counted, they pulled the data timer to its
        1 ms floor while the token took several ms to come round under load, and a third of a loaded sender's
        datagrams were resends of packets that were only waiting their turn."""
        packet = self.outstanding.pop(seq, None)
        if packet is None:
            return
        sent_at = self._first_sent.pop(seq, None)
        if sent_at is not None and sample:
            self.data_rtt.sample(now - sent_at)
        self.window.ordered(packet.size)
        if self.outstanding:
            self._start_rto(now)
        else:
            self.rto.stop()
        self._fill_window(now)
        self._maybe_request_leave(now)

    def _on_confirm(self, confirm: Confirm, now: float) -> None:
        pending = self.pass_pending
        if pending is not None and confirm.ts == pending.ts:
            self._learn_holds(confirm.src, pending.last_ts)
            self._pass_confirmed(now)

    def _round_trips(self, initial: float, maximum: float | None = None) -> RttEstimator:
        return RttEstimator(initial, self.config.rto_min, self.config.rto_max if maximum is None else maximum)

    def _start_pass_timer(self, now: float) -> None:
        self._pass_sent_at = now
        self.pass_timer.initial = self.pass_rtt.rto
        self.pass_timer.start(now)

    def _pass_heard_of(self, nack: Nack, now: float) -> None:
        """A NACK from the member our pending pass names, sent knowing of the pass: the pass arrived, and that member
        is fetching what it needs before it can accept.  Its confirmation will come after those repairs, so it is no
        sample of the round trip: one slow repair would otherwise make every lost pass wait that long to be resent.
        The member is alive, so failure detection counts from here."""
        pending = self.pass_pending
        if pending is None or nack.src != pending.next_site or nack.known < pending.ts:
            return
        self._pass_sent_at = None
        self.pass_timer.heard(now)

    def _pass_confirmed(self, now: float | None = None) -> None:
        if now is not None and self._pass_sent_at is not None and self.pass_timer.retries == 0:
            self.pass_rtt.sample(now - self._pass_sent_at)
        self._pass_sent_at = None
        self.pass_pending = None
        self.pass_timer.stop()

    def _learn_holds(self, member: ProcessId, through: int) -> None:
        if member != self.pid and through > self.holds.get(member, through):
            self.holds[member] = through

    def holders_of(self, ts: int) -> int:
        """How many members are known to hold the slot at ``ts`` (this process counts when it holds it).

        A member that joined after ``ts`` never held it, whatever its later ACKs say."""
        since = self.member_since
        others = sum(1 for m, h in self.holds.items() if h >= ts and since.get(m, 0) <= ts)
        return others + (1 if self.q.contig >= ts else 0)

    def _eligible_holders(self, ts: int) -> int:
        """Members that can still prove they hold ``ts``: this process and the others of the current view that
        were members at ``ts``.  A member that left on its own had its messages ordered before it went, so a
        packet is not held back waiting for it."""
        since = self.member_since
        return 1 + sum(1 for m in self.view.members if m != self.pid and since.get(m, 0) <= ts)

    def _holders_needed(self, qos: QoS, ts: int, size: int) -> int:
        """Members that must be known to hold the slot at ``ts`` before a resilient packet there is delivered: the
        QoS rule over MaxN, lowered to the members that can still prove it (``_eligible_holders``)."""
        return min(qos.required_holders(size), self._eligible_holders(ts))

    def max_n(self) -> int:
        """MaxN: the largest view any packet still held was ordered in."""
        return max(size for _, size in self.view_sizes)

    def _try_accept(self, now: float) -> tuple[int, ProcessId] | None:
        """Accept the token if named and holding everything it requires; returns (ACK ts, previous site)."""
        target = self.accept_target
        if target is None or self.overrun or self.pid not in self.view or not self._holds_through(target[1]):
            return None
        ack_ts, last_ts, prev, quiet = target
        self.accept_target = None
        self.have_token = True
        self.accepted_ts = ack_ts
        self.incoming_quiet = quiet
        self.stats["token_accepts"] += 1
        self._record("token", now, ts=last_ts, prev=prev, view=str(self.view.view_id))
        return ack_ts, prev

    def _holds_through(self, ts: int) -> bool:
        """The acceptance rule: no hole in the OrderingQ up to ``ts``."""
        return self.q.contig >= ts

    def _schedule_null(self, now: float) -> None:
        """An idle token site passes the token with a NULL ACK after ``null_ack_interval``, or almost at once
        while something ordered is not yet delivered here or not yet known held by everyone: resilient (K,
        majority, safe) messages become deliverable only as the token goes round, and at light load they would
        otherwise wait a whole interval per member."""
        if self.incoming_quiet < self.view.size - 1:
            q = self.q
            # Not yet stable: slots before the latest ACK not freed, or what that ACK ordered (freeing stops at
            # its slot, which is kept) not known held by everyone.
            waiting = (self.deliver_ts <= q.high or q.base < self.latest_ack_ts
                       or self.holders_of(q.high) < self._eligible_holders(q.high))
            delay = self.config.null_ack_prompt if waiting else self.config.null_ack_interval
            self.null_deadline = now + delay
        else:
            self.null_deadline = None

    def _order_pending(self, now: float) -> bool:
        """As token site, answer a pending request or order what can be ordered; True when the token went on."""
        if self.pending_requests and self._make_new_list(now):
            return True
        if not self.unordered:
            return False
        ids: list[DataId] = []
        limit = self.config.max_ack_ids
        for src in list(self.unordered):
            seq = self.ordered_upto.get(src, 0) + 1
            packet = self.data.get((src, seq))
            while packet is not None and len(ids) < limit:
                ids.append(packet.data_id)
                seq += 1
                packet = self.data.get((src, seq))
        if not ids:
            return False
        self._send_ack(tuple(ids), 0, now)
        return True

    def _send_ack(self, ids: tuple[DataId, ...], quiet: int, now: float) -> None:
        ack = Ack(self.view.view_id, self.pid, self.q.high + 1, self.view.next_after(self.pid), quiet, ids)
        self.have_token = False
        self.null_deadline = None
        self.stats["acks_sent" if ids else "null_acks_sent"] += 1
        self._pass_bytes = self._multicast(ack, now)
        self._await_confirmation(ack, now)
        self._on_ack(ack, now)

    def _await_confirmation(self, passing: Ack | NewList, now: float) -> None:
        """Resend the pass (``_pass_bytes``) until the next site confirms it; a pass to ourselves (a group of one,
        or a New List that leaves only us) has nothing to wait for."""
        if passing.next_site == self.pid:
            self._pass_confirmed()
        else:
            self.pass_pending = passing  # type: ignore[assignment]
            self._start_pass_timer(now)

    # ------------------------------------------------------------------------------------------------------------
    # NACKs

    def _nack_target(self, tries: int, *, tail: bool = False) -> ProcessId | None:
        """The sender of the newest ACK known here: it accepted the token, so it held every packet before its ACK,
        and it holds what its ACK ordered.  An unanswered NACK for those packets most often means the NACK or its
        answer was lost, so it goes to the same site again.  A tail NACK asks for what comes after the newest ACK
        known here, which that site may have missed too, so it goes round the ring from there (or to the member a
        hint named, ``_hint_target``).  After
        ``nack_rotate`` tries a NACK names no one and any holder answers (which also gets past a failed target); so
        does the last tail NACK before a stall is taken for a failure, or three losses in a row under heavy loss
        (the NACK to its one target, or that target's answer) would start a needless reformation."""
        if tail and tries >= STALL_NACKS - 1:
            return None
        if tail and self._hint_target is not None:
            return self._hint_target
        if tries >= self.config.nack_rotate or self.view.size == 1:
            return None
        base = next((m for m in (self.last_ack_sender, self.token_site) if m in self.view), self.view.members[0])
        target = self.view.next_after(base, tries) if tail else base
        if target == self.pid:
            target = self.view.next_after(target)
        return target if target != self.pid else None

    def _hole_filled(self, now: float) -> None:
        """The first missing timestamp moved on: time the NACK that asked for it, and start afresh on the next."""
        if self.nack_tries == 1 and self._nack_first_at is not None:
            self.nack_rtt.sample(now - self._nack_first_at)
        self._nack_contig = self.q.contig
        self.nack_tries = 0
        self.nack_deadline = None
        self._nack_first_at = None

    def _named_with_holes(self) -> bool:
        """Is the token passed to us and held up by a packet its ACK ordered that is lost, not merely late?

        The whole ring waits until we accept, so such a hole is NACKed at once instead of after ``_nack_wait``,
        and the NACK also tells the passing site that its pass arrived (``_pass_heard_of``): a slow repair then
        neither waits for a resent pass nor inflates the pass round trip.  Lost, not late: we hold a later packet
        of the same source, and a source's packets travel in order (a reordering on the way would cost one
        needless resend, and its NACK would halve the source's window).  Under 20% loss on the namespace hosts,
        three quarters of token passes found a hole.  Only the last ``NAMED_HOLE_SCAN`` slots are looked at, so a
        member far behind does not scan its whole gap after every datagram."""
        target = self.accept_target
        if target is None or self.nack_tries or self.q.contig >= target[1]:
            return False
        slots = self.q.slots
        lacking: set[ProcessId] = set()
        for ts in range(max(self.q.contig + 1, target[1] - NAMED_HOLE_SCAN), target[1] + 1):
            slot = slots.get(ts)
            if slot is None or slot.key is None:
                continue
            src = slot.key[0]
            if not slot.have:
                lacking.add(src)
            elif src in lacking:
                return True
        return any(self.unordered.get(src) for src in lacking)

    def _nack_wait(self) -> float:
        """How long a new hole waits for its first NACK: long enough for a merely reordered packet to arrive, which
        on a network whose NACKs are answered within a round trip is about that round trip (the RACK reordering
        window of TCP is a quarter of one), never more than ``nack_delay``."""
        srtt = self.nack_rtt.srtt
        if srtt is None:
            return self.config.nack_delay
        return min(self.config.nack_delay, max(self.config.rto_min, srtt))

    def _nack_retry_after(self, tries: int) -> float:
        """How long the NACK sent after ``tries`` unanswered ones waits for its answer: the timeout of the NACK
        round trip while it names the same site (the paper resends "if there is no response within the specified
        timeout"; under random loss an unanswered NACK is a lost NACK or a lost answer, and doubling made a repair
        that failed twice wait four timeouts, with the whole ring waiting on it when the next token site asked),
        then doubling once it names no one, up to what doubling ``nack_timeout`` five times gives."""
        doublings = min(max(0, tries - self.config.nack_rotate + 1), 32)  # the clamp is reached long before
        return min(self.nack_rtt.rto * 2.0 ** doublings, self.config.nack_timeout * 32, self.config.rto_max)

    def _send_nack(self, now: float, *, tail: bool) -> None:
        missing = self.q.missing(256)
        if tail:
            tries = self.stall_tries
            self.stall_tries += 1
            delay = min(self.config.stall_timeout * (2 ** min(self.stall_tries, 4)), self.config.rto_max)
            self.stall_deadline = now + delay
        else:
            self.nack_deadline = None
            if not missing:
                return
            tries = self.nack_tries
            self.nack_tries += 1
            if tries == 0:
                self._nack_first_at = now
            self.nack_deadline = now + self._nack_retry_after(tries)
        self._emit_nack(now, self._nack_target(tries, tail=tail), tail=tail, missing=missing)

    def _source_gaps(self, limit: int) -> list[tuple[ProcessId, int]]:
        """(src, seq) of packets not yet ordered that we know exist, because we hold a later packet of the same
        source, but do not hold.  Only sources in ``_gappy`` are looked at; one found without a gap leaves it."""
        gaps: list[tuple[ProcessId, int]] = []
        for src in list(self._gappy):
            if src not in self.view:  # removed: it answers no more, and a holder's ACK would name what it lacks
                del self._gappy[src]
                continue
            seqs = self.unordered.get(src)
            newest = max(seqs) if seqs else 0
            lacking = (s for s in range(self.ordered_upto.get(src, 0) + 1, newest) if (src, s) not in self.data)
            found = [(src, seq) for seq in itertools.islice(lacking, limit - len(gaps))]
            if not found:
                del self._gappy[src]
            gaps.extend(found)
            if len(gaps) >= limit:
                break
        return gaps

    def _watch_source_gaps(self, now: float) -> None:
        """Arm ``_ask_sources`` while a source's packet is known missing: after the reordering wait for a new first
        gap, keeping the back-off while the same one stays unfilled."""
        if not self._gappy and self._gap_first is None:
            return  # the common case, after every datagram: no source is known to have a gap
        gaps = self._source_gaps(1) if self._gappy and not self.frozen else []
        first = gaps[0] if gaps else None
        if first != self._gap_first:
            self._gap_first = first
            self.gap_tries = 0
            self.gap_deadline = None if first is None else now + self._nack_wait()

    def _ask_sources(self, now: float) -> None:
        """Ask sources for their packets we know exist but lack, before any ACK orders them (a NACK whose ``data``
        names them, naming the first one's source, no one after ``nack_rotate`` tries; unanswered, again after
        ``_nack_retry_after``).  The token site cannot order a source's later packets without the missing one,
        and the next site cannot accept the token until it holds what an ACK ordered: asked for only then, the
        repair is a round trip on the ring's path at every pass; asked for on arrival, it is most often done
        before the token comes (docs/protocol.md, "NACKs")."""
        gaps = self._source_gaps(self.config.nack_response_limit)
        if not gaps:
            self.gap_deadline = None
            return
        tries = self.gap_tries
        self.gap_tries += 1
        self.gap_deadline = now + self._nack_retry_after(tries)
        source = gaps[0][0]
        target = source if tries < self.config.nack_rotate and source in self.view else None
        self.stats["gap_nacks_sent"] += 1
        self._emit_nack(now, target, tail=False, missing=[], data=gaps)

    def _emit_nack(self, now: float, target: ProcessId | None, *, tail: bool, missing: list[int],
                   data: list[tuple[ProcessId, int]] | None = None) -> None:
        for ts in missing:
            self.q.slots[ts].state = SlotState.REQUESTED
        nack = Nack(self.view.view_id, self.pid, target, self.q.contig, self.q.high, tail, tuple(missing),
                    tuple(data or ()))
        self.stats["tail_nacks_sent" if tail else "nacks_sent"] += 1
        self._multicast(nack, now)

    def _on_nack(self, nack: Nack, now: float) -> None:
        """Resend what a NACK asks for.  A NACK naming this process is answered by multicast (others likely lack the
        same packets); a tail NACK, or one naming no one (which every holder answers), only to the requester."""
        self._nacked_own(nack, now)
        self._pass_heard_of(nack, now)
        if nack.target is not None and nack.target != self.pid:
            return
        self.stats["nacks_answered"] += 1
        resend: list[int] = list(nack.missing)
        if nack.tail:
            start = max(nack.upto + 1, self.q.base)
            resend.extend(range(start, min(self.q.high, start + self.config.nack_response_limit - 1) + 1))
        privately = nack.tail or nack.target is None
        found: list[tuple[tuple[int, ProcessId | None, int], Packet]] = []
        for ts in resend:
            slot = self.q.get(ts)
            if slot is None or not slot.have:
                continue
            if slot.kind is SlotKind.ACK or isinstance(slot.packet, NewList):
                found.append(((ts, None, 0), slot.packet))  # type: ignore[arg-type]
            elif slot.kind is SlotKind.DATA and slot.key is not None:
                found.append(((ts, None, 0), self.data[slot.key]))
        found.extend(((-1, *key), self.data[key]) for key in nack.data if key in self.data)
        del found[self.config.nack_response_limit:]  # bounded: the requester asks again for the rest
        if privately:
            for _, packet in found:
                self._unicast(nack.src, packet, now)
            return
        # Several members often NACK one hole within a few ms, before the first answer reached them; one multicast
        # answers them all.  A requester whose copy was lost asks again after its NACK timeout, past this window
        # (half of ours: NACKs here and there are timed from round trips on the same network).
        recent = self._multicast_resends
        window = self.nack_rtt.rto / 2
        if len(recent) > 4 * self.config.nack_response_limit:
            self._multicast_resends = recent = {k: t for k, t in recent.items() if now - t < window}
        for key, packet in found:
            if now - recent.get(key, -window) < window:
                self.stats["nack_resends_suppressed"] += 1
                continue
            recent[key] = now
            self._multicast(packet, now)

    def _nacked_own(self, nack: Nack, now: float) -> None:
        """A NACK that asks for one of our packets tells us a receiver is overrun: halve the send window (once
        per lost packet, section 4.6)."""
        own = [seq for src, seq in nack.data if src == self.pid]
        for ts in nack.missing:
            slot = self.q.get(ts)
            if slot is not None and slot.key is not None and slot.key[0] == self.pid:
                own.append(slot.key[1])
        if own and self.window.nack_named(max(own), now, self.data_rtt.rto):
            self.stats["window_halved_nack"] += 1

    # ------------------------------------------------------------------------------------------------------------
    # Non-members' calls (section 4.5, decided by SCMP at delivery: multirpc.py)

    def non_member_data(self, packet: NonMemberData, now: float) -> None:
        """A non-member's call or message: the relay carries it into the order; the other members wait for it."""
        if self.departed or self.leaving or self.participation is not None:
            self.stats["call_not_now"] += 1
            return
        if packet.handler is not None and not 0 <= packet.handler < HANDLER_LOCKS:
            self.stats["call_bad_handler"] += 1
            return
        if relay_of(self.view, packet.handler) != self.pid:
            self.stats["call_not_relay"] += 1
            return
        if len(packet.payload) > self.config.max_packet:
            self.stats["call_too_large"] += 1
            return
        if not self.calls.should_relay(packet.src, packet.conn, packet.stamp):
            self.stats["call_copy_in_flight"] += 1
            return
        qos = packet.qos if packet.qos.level >= Level.TOTAL else QoS(Level.TOTAL)
        clock = self.wall_ms(now)
        body = Relayed(RELAYED_TAG, packet.src, packet.conn, packet.stamp, packet.flags, clock, packet.payload)
        self.stats["calls_relayed"] += 1
        self.send_queue.append(Queued(self.next_seq, qos, packet.handler, [], len(packet.payload), relayed=body))
        self.next_seq += 1
        self._fill_window(now)
        self._progress(now)

    def wall_ms(self, now: float) -> int:
        """This process's clock in ms (the caller passes ``now``; ``wall_offset`` maps it to wall-clock time)."""
        return int((now + self.wall_offset) * 1000)

    def _deliver_call(self, packet: Data, call: Relayed, ts: int | None, now: float) -> tuple[bytes, ...]:
        """Every member runs the filter on the call here, in total order; the responder acts on the verdict.
        Returns what was handed to the application as a delivery (the call, for a new call without handler)."""
        view = self.view
        handler = packet.handler
        holder = view.lock_holder(handler) if handler is not None else None
        if handler is not None and holder is None:
            # Every member sees the same lock table here, so every member skips the filter alike: the call is not
            # taken, and the caller may send it again once someone holds the handler.
            self.calls.in_flight.discard((call.caller, call.conn, call.stamp))
            if packet.src == self.pid:
                self._answer_call(call, CallStatus.NO_HANDLER, None, now)
            return ()
        responder = holder if holder is not None else packet.src
        verdict, _, answer = self.calls.decide(call, responder == self.pid, holder is not None)
        accepted = verdict is Verdict.NEW
        self.stats[f"calls_{verdict.value}"] += 1
        self._record("scmp", now, conn=f"{call.caller}/{call.conn}", msg_ts=call.stamp, accepted=accepted, ts=ts,
                     src=call.caller, qos=packet.qos.name())
        delivered: tuple[bytes, ...] = ()
        if accepted and holder is None:
            self._events.append(Delivered(self.group, call.caller, call.stamp, packet.qos, ts, view.view_id, None,
                                          (call.payload,)))
            delivered = (call.payload,)
        elif accepted and holder == self.pid:
            self._events.append(CallRequest(self.group, call.caller, call.conn, call.stamp, handler or 0,
                                            call.payload, view.view_id))
        if answer is not None and (holder is not None or answer.status is not CallStatus.ACK
                                   or call.flags & NonMemberData.FLAG_ACK):
            self._answer_call(call, answer.status, answer.reply, now)
        return delivered

    def _answer_call(self, call: Relayed, status: CallStatus, reply: bytes | None, now: float) -> None:
        self.stats[f"call_answer_{status.name.lower()}"] += 1
        self._unicast(call.caller, NonMemberAck(self.view.view_id, self.pid, call.conn, call.stamp, status, reply),
                      now)

    def reply(self, caller: ProcessId, conn: int, stamp: int, payload: bytes, now: float) -> bool:
        """The application's answer to a :class:`CallRequest`; kept for copies of the call.  False when the call
        is no longer this member's to answer.  MessageTooLarge, before anything is kept, for a reply over one
        packet: a kept reply is sent again for every copy of the call."""
        check_one_packet(self.config, payload, "a reply")
        if not self.calls.server.complete((caller, conn), stamp, payload, self.calls.clock):
            self.stats["reply_stale"] += 1
            return False
        self.stats["call_answer_reply"] += 1
        self._unicast(caller, NonMemberAck(self.view.view_id, self.pid, conn, stamp, CallStatus.REPLY, payload),
                      now)
        return True

    def reply_acked(self, packet: NonMemberAck) -> None:
        """The caller got our reply: it need not be kept (figure 3-1, REPLY-ACK)."""
        self.calls.server.reply_acked((packet.src, packet.conn), packet.stamp)

    # ------------------------------------------------------------------------------------------------------------
    # Delivery

    def _delivered(self, src: ProcessId, seq: int) -> bool:
        if seq < self.src_next.get(src, 1):
            return True
        ahead = self.src_ahead.get(src)
        return ahead is not None and seq in ahead

    def _mark_delivered(self, src: ProcessId, seq: int) -> None:
        nxt = self.src_next.get(src, 1)
        if seq != nxt:
            self.src_ahead.setdefault(src, set()).add(seq)
            return
        nxt += 1
        ahead = self.src_ahead.get(src)
        while ahead and nxt in ahead:
            ahead.discard(nxt)
            nxt += 1
        self.src_next[src] = nxt

    def _deliver(self, packet: Data, ts: int | None, now: float, holders: int, need: int = 1) -> None:
        if packet.qos.level != Level.UNRELIABLE:
            self._mark_delivered(packet.src, packet.seq)
        self.stats["delivered"] += 1
        messages = self._messages_of(packet)
        relayed = isinstance(packet.payload, Relayed)
        if relayed:
            # A non-member's call: what the application gets (a delivery for calls without handler, a request at
            # the handler's holder) is decided by the SCMP filter, not by this packet's payload.
            messages = self._deliver_call(packet, packet.payload, ts, now)  # type: ignore[arg-type]
        else:
            if messages:
                self._events.append(make_delivered(self.group, packet.src, packet.seq, packet.qos, ts,
                                                   self.view.view_id, packet.handler, messages))
        if self.config.journal:
            extra: dict[str, Any] = {"parts": len(messages)} if len(messages) != 1 else {}
            if relayed:
                extra["relayed"] = True
            if not messages and isinstance(packet.payload, Fragment) and not packet.payload.more:
                extra["incomplete"] = True
            self._record(
                "deliver", now, ts=ts, src=packet.src, seq=packet.seq, qos=packet.qos.name(),
                size=packet.size, holders=holders, need=need, order_view=str(self.view.view_id), **extra,
            )

    def _messages_of(self, packet: Data) -> tuple[bytes, ...]:
        """What the application gets for a delivered packet: its message, its packed messages, or, for fragments,
        nothing until the last piece, then the whole message (pieces of one source arrive in sequence order)."""
        body = packet.payload
        if isinstance(body, Relayed):
            return ()
        if isinstance(body, Fragment):
            if body.first:
                self._reassembly[packet.src] = []
            pieces = self._reassembly.get(packet.src)
            if pieces is None:  # we joined after its first piece was ordered: the message is not ours
                self.stats["fragments_before_join"] += 1
                return ()
            pieces.append(body.chunk)
            if body.more:
                return ()
            del self._reassembly[packet.src]
            return (b"".join(pieces),)
        return body if isinstance(body, tuple) else (body,)

    def _deliver_source_chain(self, src: ProcessId, now: float) -> None:
        """Deliver source-ordered packets from ``src`` whose predecessors are all delivered."""
        while True:
            seq = self.src_next.get(src, 1)
            packet = self.data.get((src, seq))
            if packet is None or packet.qos.level != Level.SOURCE:
                return
            self._deliver(packet, self.q.ts_of((src, seq)), now, holders=1)

    def _scan_total(self, now: float) -> None:
        """Deliver in timestamp order everything that may go now."""
        q = self.q
        size = self.max_n()
        while True:
            slot = q.get(self.deliver_ts)
            if slot is None or not slot.have:
                return
            if slot.kind is not SlotKind.DATA:
                self._finish(slot)
                if isinstance(slot.packet, NewList):
                    self._commit_view(slot.packet, now)
                    if self.departed:
                        return
                continue
            key = slot.key
            assert key is not None
            if self._delivered(*key):
                self._finish(slot)
                continue
            packet = self.data[key]
            level = packet.qos.level
            need = 1
            if level <= Level.SOURCE:
                if self.src_next.get(key[0], 1) != key[1]:
                    return
                holders = 1
            elif level == Level.TOTAL:
                holders = 1
            else:
                holders = self.holders_of(slot.ts)
                need = self._holders_needed(packet.qos, slot.ts, size)
                if holders < need:
                    return
            self._deliver(packet, slot.ts, now, holders, need)
            self._finish(slot)

    def _finish(self, slot: Slot) -> None:
        slot.state = SlotState.DELIVERED
        self.deliver_ts += 1

    def _free_stable(self) -> None:
        """Free slots from the front once delivered here and held by every member that was a member then.

        A member that joined later never holds what was ordered before it came (it starts after its New List),
        so waiting for it would keep every slot of a group formed by joins forever."""
        q = self.q
        while q.base < self.deliver_ts and q.base < self.latest_ack_ts:
            if self.holders_of(q.base) < self._eligible_holders(q.base):
                return
            slot = q.pop_front()
            if slot.key is not None:
                self.data.pop(slot.key, None)
            if len(self.view_sizes) > 1 and self.view_sizes[1][0] <= q.base:
                self.view_sizes.pop(0)

    # ------------------------------------------------------------------------------------------------------------
    # After every input

    def _advance_and_scan(self, now: float) -> None:
        self.q.advance()
        if self.deliver_ts <= self.q.contig:
            self._scan_total(now)

    def _progress(self, now: float) -> None:
        if self.departed:
            # Out of the group: nothing more is delivered or ordered here, even if later slots are held (a
            # departed process delivering past the view that removed it would break virtual synchrony).
            return
        q = self.q
        if self.frozen:
            # Nothing is delivered or ordered during a reformation, but what the catch-up NACKs brought in must
            # count towards this member's sync point; otherwise no member behind the shared one could ever reach
            # it (rmp sim, the issue's fault mix, seed 82: twenty reformations aborted in a row over 35 s).
            q.advance()
        while not self.frozen:
            self._advance_and_scan(now)
            accepted = self._try_accept(now)
            if not self.have_token:
                break
            if self._order_pending(now):
                continue  # the ACK passed the token on (in a group of one, back to ourselves)
            if accepted is not None and accepted[1] != self.pid:
                # Nothing to order: confirm the pass explicitly (an ACK of ours would have confirmed it).
                self._unicast(accepted[1], Confirm(self.view.view_id, self.pid, accepted[0]), now)
            if self.null_deadline is None:
                self._schedule_null(now)
            break
        self._free_stable()
        # NACK holes; the first NACK waits a little so reordering alone does not cause one.
        if q.contig != self._nack_contig:
            self._hole_filled(now)
        if q.contig < q.high:
            if self._named_with_holes():
                self.nack_deadline = now  # the ring waits on us: ask at once
            elif self.nack_deadline is None:
                self.nack_deadline = now + self._nack_wait()
        else:
            self.nack_deadline = None
        self._watch_source_gaps(now)
        # Stall: undelivered messages, or own packets waiting to be ordered, and no new ACK for a while.  The
        # latter alone is how the ring's survivors notice a lost token (the token site passed it to a member that
        # had just crashed, then crashed too): the data timer, from the ordering time under load, took 12 s.
        # So is a member whose fellows pass the token in a view it does not know, beyond any timestamp it knows
        # (``_passed_by``), while no ACK of its own view comes: a New List it merely missed comes with the hint
        # NACK's answer (``_note_unknown_view``) and its ACKs end this, but one that left it out never does (a
        # reformation that removed it while a partition cut it off and it had nothing to send or deliver): without
        # this it stayed in that view for ever, NACKing gaps its old view's sources can no longer fill.
        waiting = (self.deliver_ts <= q.high or bool(self.accept_target) or bool(self.outstanding)
                   or self._passed_by) and not self.frozen
        if waiting and self.stall_deadline is None:
            self.stall_deadline = now + self.config.stall_timeout
        elif not waiting:
            self.stall_deadline = None
            self.stall_tries = 0

    # ------------------------------------------------------------------------------------------------------------
    # Output helpers

    def _multicast(self, packet: Packet, now: float) -> bytes:
        """Send to the group: one multicast, plus a unicast copy to each member that cannot receive multicast."""
        data = encode(packet)
        self._datagrams.append(Transmit(None, data, self.group))
        for member in sorted(self.view.unicast_only):
            if member != self.pid:
                self._datagrams.append(Transmit(member, data, self.group))
        self.stats["sent"] += 1
        if self.config.journal:
            self._record_packet("send", packet, now)
        return data

    def _unicast(self, dest: ProcessId, packet: Packet, now: float) -> None:
        self._datagrams.append(Transmit(dest, encode(packet), self.group))
        self.stats["sent"] += 1
        if self.config.journal:
            self._record_packet("send", packet, now)

    def _record(self, event: str, now: float, **fields: Any) -> None:
        if not self.config.journal:
            return
        record: dict[str, Any] = {
            "v": 1, "node": self.pid, "group": self.group, "event": event, "view": str(self.app_view.view_id),
            "ts": None, "src": None, "seq": None, "qos": None, "mono": now,
        }
        record.update(fields)
        self._journal.append(record)

    def _record_packet(self, event: str, packet: Packet, now: float) -> None:
        if not self.config.journal:
            return
        fields: dict[str, Any] = {"packet": PACKET_NAMES[type(packet).__name__]}
        if packet.view is not None:
            fields["view"] = str(packet.view)
        if isinstance(packet, Data):
            fields.update(src=packet.src, seq=packet.seq, qos=packet.qos.name())
        elif isinstance(packet, Ack):
            fields.update(
                ts=packet.ts, src=packet.src, next=packet.next_site,
                orders=[[s, n, q.name()] for s, n, q in packet.ids],
            )
        elif isinstance(packet, NewList):
            fields.update(ts=packet.ts, src=packet.src, next=packet.next_site, orders=[],
                          members=[m for m, _ in packet.members], new_view=str(packet.new_view))
        elif isinstance(packet, RecoveryVote):
            fields.update(ts=packet.sync_ts, src=packet.src)
        else:
            ts = getattr(packet, "ts", None)
            fields.update(ts=ts, src=getattr(packet, "src", None))
        self._record(event, now, **fields)
