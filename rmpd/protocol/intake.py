"""Which packets a member of a group takes, and what handles each (sans-IO, part of ``GroupEngine``).

A packet of a view the member knows goes to its handler by (member state, packet type): ``dispatch_table``, built
per engine from bound methods.  A packet of another view is taken only when it can be one of the group's own
history (data an ACK we hold orders, or that a reformation's sync point names); otherwise it may show a New List
this member missed (``_unknown_view``).  Join requests go by group name, Alives by group too (any view of it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from .config import EngineConfig
from .ids import ProcessId
from .journalschema import PACKET_NAMES
from .packets import (
    Ack,
    Alive,
    Confirm,
    Data,
    DecodeError,
    ListChangeRequest,
    Nack,
    NewList,
    Packet,
    RecoveryAbort,
    RecoveryAckNewList,
    RecoveryStart,
    RecoveryVote,
    decode,
)
from .qos import Level
from .views import Views

if TYPE_CHECKING:
    from .departure import Departure
    from .keytables import KeyTables
    from .liveness import Liveness
    from .ordering import Ordering
    from .outbox import Outbox
    from .reformation import Reformation
    from .repair import Repair
    from .rotation import Rotation
    from .sender import Sender
    from .token import Token
    from .viewchange import ViewChanges


class MemberState(Enum):
    """Which packets a member handles: a departed one only answers for what it held (NACKs, pass confirmations)."""

    MEMBER = "member"
    DEPARTED = "departed"


PacketHandler = Callable[[Any, float], None]
"""What a packet is dispatched to: the handler of one packet type, given the packet and ``now``."""


class PacketIntake:
    """The receiving half of ``GroupEngine``: filtering packets by view and dispatching them to their handlers."""

    pid: ProcessId
    group: str
    config: EngineConfig
    stats: Counter[str]
    views: Views
    outbox: Outbox
    ordering: Ordering
    token: Token
    sender: Sender
    repair: Repair
    changes: ViewChanges
    reformation: Reformation
    liveness: Liveness
    departure: Departure
    rotation: Rotation
    keys: KeyTables
    _member_handlers: dict[type, PacketHandler]
    _departed_handlers: dict[type, PacketHandler]

    if TYPE_CHECKING:
        departed: bool
        leaving: bool
        frozen: bool
        hints_held: bool

        def _progress(self, now: float) -> None: ...
        def on_data(self, packet: Data, now: float) -> None: ...
        def suspect_failure(self, now: float, why: str) -> None: ...

    def dispatch_table(self) -> dict[MemberState, dict[type, PacketHandler]]:
        """Packet dispatch by (member state, packet type), to this engine's or its parts' methods.  A member's
        packet not listed is counted as unhandled; a departed member ignores what is not listed (it only checks
        whether it may finish)."""
        rotation, reformation, departure = self.rotation, self.reformation, self.departure
        return {
            MemberState.MEMBER: {
                Data: self.on_data, Ack: rotation.on_ack, NewList: self._on_new_list, Confirm: rotation.on_confirm,
                Nack: self._on_nack, RecoveryStart: reformation.on_packet, RecoveryVote: reformation.on_packet,
                RecoveryAckNewList: reformation.on_packet, RecoveryAbort: reformation.on_packet,
            },
            MemberState.DEPARTED: {
                Ack: departure.pass_seen, NewList: departure.pass_seen, Confirm: rotation.on_confirm,
                Nack: self._on_nack,
            },
        }

    def receive_datagram(self, data: bytes, addr: ProcessId | None, now: float) -> None:
        """Handle one datagram from the network.  Nothing raised by hostile bytes escapes."""
        try:
            packet = decode(data)
        except DecodeError:
            self.stats["malformed"] += 1
            return
        self.receive_packet(packet, now)

    def receive_packet(self, packet: Packet, now: float) -> None:
        src = getattr(packet, "src", None)
        if src == self.pid:
            self.stats["own_echo"] += 1
            return
        views = self.views
        kind = type(packet)
        if kind is ListChangeRequest:  # addressed by group name, not view: see _on_request
            self._on_request(packet, now)
            return
        if kind is Alive:  # any view of the group: see Liveness.on_alive
            if not self.leaving and self.liveness.on_alive(packet, now):  # type: ignore[arg-type]
                self._unknown_view(packet, now)
            return
        reformation = self.reformation
        if reformation.participation is not None:
            committed = reformation.committed_by(packet.view)
            if committed is not None:
                reformation.commit(committed, now)  # the initiator committed: so do we
        view = views.known.get(packet.view)  # type: ignore[arg-type]
        if view is None:
            if kind is Data and self.takes_earlier_data(packet):  # type: ignore[arg-type]
                # Sent in a view before ours (before we joined, or before a reformation ordered it again): taken
                # when an ACK we hold orders it (the ACK vouches for its identity) or, during a reformation, when
                # the shared sync point names it (some member holds it, so every member must).  Nothing more: a
                # packet of a view that went on beside ours (the other side of a split, a view we merge into
                # later) would otherwise be ordered again here, at another place than there.  A source never
                # reuses a sequence number (a rejoin goes on from its last, a restart starts above), so (source,
                # sequence number) names one packet.
                self.stats["data_of_earlier_view"] += 1
                if self.config.journal:
                    self.outbox.record_packet("recv", packet, now)
                self.on_data(packet, now)  # type: ignore[arg-type]
                self._progress(now)
                return
            self.stats["other_view"] += 1
            if not self.departed:
                self._unknown_view(packet, now)
            return
        if src not in view:
            self.stats["non_member"] += 1
            return
        self.liveness.heard(src, now)
        if self.ordering.beyond_horizon(packet, self.config.max_ahead):
            self.stats["beyond_horizon"] += 1
            return
        self.stats["received"] += 1
        if self.config.journal:
            self.outbox.record_packet("recv", packet, now)
        if self.departure.departed:
            handler = self._departed_handlers.get(type(packet))
            if handler is not None:
                handler(packet, now)
            self.departure.check_finished(now)
            return
        handler = self._member_handlers.get(type(packet))
        if handler is None:
            self.stats["unhandled_" + PACKET_NAMES[type(packet).__name__]] += 1
            return
        handler(packet, now)
        self._progress(now)

    def _of_our_lineage(self, creator: ProcessId) -> bool:
        """Could a view made by ``creator`` be one of our group's own history: a member of our view, or a source our
        group's order named.  (Unreliable data is never taken from a view we do not know: nothing orders it.)"""
        return creator in self.views.current or creator in self.ordering.ordered_upto

    def _on_request(self, request: ListChangeRequest, now: float) -> None:
        if self.departed:
            self.stats["departed_ignored"] += 1
        elif request.group == self.group and (request.view is None or request.view in self.views.known):
            if self.changes.on_request(request, now) and request.src == self.token.token_site:
                # A new incarnation of the member the token was last passed to: the token is lost with the old
                # one, so no token site will answer; remove it now instead of waiting for silence.
                self.suspect_failure(now, "restarted")
            self._progress(now)
        else:
            self.stats["other_view"] += 1

    def _unknown_view(self, packet: Packet, now: float) -> None:
        """A packet of a view we do not know, from a member of ours (or made by one): we missed a New List.  A
        pass in that view beyond any timestamp we know means the ring moved on past it (see the stall)."""
        witness = self.witness_of_unknown_view(packet)
        if witness is None:
            return
        self.repair.unknown_view(witness, now, self.hints_held)
        if isinstance(packet, (Ack, NewList)) and packet.ts > self.token.latest_ack_ts:
            self.repair.ring_passed_by()
            self._progress(now)

    def takes_earlier_data(self, packet: Data) -> bool:
        """Is ``packet``, stamped with a view this member does not know, one it takes all the same: sent in a view
        of our group's history before ours, and ordered by an ACK this member holds or named by the sync point of
        the reformation under way (``receive_packet`` says why)."""
        return (not self.departed and packet.qos.level != Level.UNRELIABLE and packet.view is not None
                and self._of_our_lineage(packet.view.creator)
                and (self.ordering.q.ts_of((packet.src, packet.seq)) is not None
                     or (self.frozen and self.reformation.names(packet.src, packet.seq))))

    def witness_of_unknown_view(self, packet: Packet) -> ProcessId | None:
        """A member of our view that can tell us about the view ``packet`` is stamped with (``Views.witness``)."""
        return self.views.witness(packet, self.pid)

    def _on_new_list(self, nl: NewList, now: float) -> None:
        if nl.brings_keys:
            self.keys.carried()
        if nl.request_src is not None or not self.reformation.on_new_list(nl, now):
            self.rotation.on_new_list(nl, now)

    def _on_nack(self, nack: Nack, now: float) -> None:
        self.sender.nacked(self.repair.own_named(nack), now)
        pass_arrived = self.token.heard_of(nack, now)
        self.repair.answer(nack, now, frozen=self.frozen)
        if pass_arrived:  # after the answer, so a repair the ring waits for is not queued behind new data
            self.sender.pass_arrived(now)
