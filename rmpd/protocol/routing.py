"""Where a process's datagrams go (sans-IO, part of ``RmpProcess``): by packet type to the process's own handlers
(join answers, join requests and non-members' packets by group name, Status Queries and Reports outside the order),
or else to the group whose view the packet names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .calls import Caller
from .ids import ProcessId
from .joins import REFORMATION_PACKETS, JoinAttempt, RejoinWish
from .packets import (
    Ack,
    Alive,
    CallStatus,
    Data,
    DecodeError,
    ListChangeRequest,
    NewList,
    NonMemberAck,
    NonMemberData,
    Packet,
    StatusQuery,
    StatusReport,
    decode,
)
from .statusquery import StatusQueries

if TYPE_CHECKING:
    from .engine import GroupEngine


class PacketRouting:
    """The routing half of ``RmpProcess``: what it does with each datagram it receives."""

    pid: ProcessId
    stats: Counter[str]
    engines: dict[str, GroupEngine]
    joining: dict[str, JoinAttempt]
    rejoin_wishes: dict[str, RejoinWish]
    caller: Caller
    status_queries: StatusQueries

    if TYPE_CHECKING:
        def wall_ms(self, now: float) -> int: ...
        def _collect(self, now: float) -> None: ...
        def _heard_outside(self, packet: ListChangeRequest | NonMemberData | Alive, now: float) -> None: ...
        def _maybe_our_group(self, now: float) -> None: ...
        def _join_refused(self, ack: NonMemberAck, now: float) -> None: ...
        def _admitted(self, nl: NewList, now: float) -> None: ...

    def receive_datagram(self, data: bytes, addr: ProcessId | None, now: float) -> None:
        try:
            packet = decode(data)
        except DecodeError:
            self.stats["malformed"] += 1
            return
        if type(packet) is StatusQuery:
            self.status_queries.received_query(packet, addr or packet.src, self._answers_for(packet.group), now)
        elif type(packet) is StatusReport:
            self.status_queries.received_report(packet, addr or packet.src)
        else:
            self.receive_packet(packet, now)

    def _answers_for(self, group: str) -> bool:
        """Whether this process answers a Status Query of ``group``: it is in it, or waits to rejoin it."""
        return group in self.engines or group in self.rejoin_wishes

    def receive_packet(self, packet: Packet, now: float) -> None:
        """Route a packet: by its type to the process's own handlers, else to the group whose view it names."""
        route = self._ROUTES.get(type(packet))
        if route is None:
            self._by_view(packet, now)
        else:
            route(self, packet, now)
        self._collect(now)

    def _on_non_member_ack(self, ack: NonMemberAck, now: float) -> None:
        if ack.status is CallStatus.JOIN_REFUSED:
            self._join_refused(ack, now)
        elif ack.status is CallStatus.REPLY_ACK:
            for engine in self.engines.values():
                if engine.accepts_view(ack.view):
                    engine.reply_acked(ack)
                    break
        else:
            self.caller.receive(ack, now, self.wall_ms(now))

    def _on_new_list(self, nl: NewList, now: float) -> None:
        if nl.request_src == self.pid and nl.group in self.joining:
            self._admitted(nl, now)
        else:
            self._by_view(nl, now)

    def _by_group(self, packet: ListChangeRequest | NonMemberData | Alive, now: float) -> None:
        """Join requests, Alives and non-members' packets go by their group, whatever view they name."""
        engine = self.engines.get(packet.group)
        if engine is None:
            self._heard_outside(packet, now)
            self.stats["other_group"] += 1
        elif isinstance(packet, NonMemberData):
            engine.non_member_data(packet, now)
        else:
            engine.receive_packet(packet, now)

    def _by_view(self, packet: Packet, now: float) -> None:
        view = packet.view
        for engine in self.engines.values():
            if engine.accepts_view(view):
                engine.receive_packet(packet, now)
                return
        self.stats["other_view"] += 1
        if self.joining and (type(packet) in REFORMATION_PACKETS
                             or (type(packet) is Ack and packet.next_site == self.pid)):
            self._maybe_our_group(now)
        for engine in self.engines.values():
            if engine.witness_of_unknown_view(packet) is not None:
                engine.receive_packet(packet, now)  # the engine notes a view it has not seen yet
            elif type(packet) is Data and engine.takes_earlier_data(packet):
                # A packet of a view before this member's, from a source no longer in the view (a NACK's
                # answer): the ordering or the reformation under way needs it all the same.
                engine.receive_packet(packet, now)

    _ROUTES: dict[type, Callable[[PacketRouting, Any, float], None]] = {
        NonMemberAck: _on_non_member_ack, NewList: _on_new_list, ListChangeRequest: _by_group,
        NonMemberData: _by_group, Alive: _by_group,
    }
    """Packets the process handles by type; everything else goes to the group whose view it names."""
