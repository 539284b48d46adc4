"""What a journal record of a sent or received packet says: the packet's name and, by packet type, its fields.

The journal format is read by the simulator's checker and by ``rmp audit``; ``Outbox.record_packet`` writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .packets import Ack, Data, Keyed, NewList, RecoveryVote

PACKET_NAMES = {
    "Data": "data", "Ack": "ack", "Confirm": "confirm", "Nack": "nack", "NewList": "new_list",
    "ListChangeRequest": "list_change_request", "RecoveryStart": "recovery_start",
    "RecoveryVote": "recovery_vote", "RecoveryAckNewList": "recovery_ack_new_list",
    "RecoveryAbort": "recovery_abort", "NonMemberData": "non_member_data", "NonMemberAck": "non_member_ack",
    "Alive": "alive",
}


def _ack_fields(packet: Ack) -> dict[str, Any]:
    return {"ts": packet.ts, "src": packet.src, "next": packet.next_site,
            "orders": [[s, n, q.name()] for s, n, q in packet.ids]}


def _data_fields(packet: Data) -> dict[str, Any]:
    fields = {"src": packet.src, "seq": packet.seq, "qos": packet.qos.name()}
    if type(packet.payload) is Keyed:
        fields["keys"] = [key.hex() for key in packet.payload.keys]
    return fields


def _new_list_fields(packet: NewList) -> dict[str, Any]:
    return {"ts": packet.ts, "src": packet.src, "next": packet.next_site, "orders": [],
            "members": [m for m, _ in packet.members], "new_view": str(packet.new_view)}


RECORD_FIELDS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Data: _data_fields,
    Ack: _ack_fields,
    NewList: _new_list_fields,
    RecoveryVote: lambda p: {"ts": p.sync_ts, "src": p.src},
}
"""What a journal record of a sent or received packet carries, by packet type (the rest: ``ts`` and ``src``)."""
