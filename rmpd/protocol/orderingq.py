"""The OrderingQ (RMP paper, section 4.2): one slot per global timestamp.

An ACK (or New List) placed at timestamp t fills slot t and names the data packets at t+1 .. t+k, creating slots
as needed; a slot of a timestamp nobody has told us about yet is UNKNOWN and Missing.  Slots move Missing ->
Requested (NACKed) -> Received -> Delivered.  ``contig`` is the highest timestamp up to which every slot is
Received or Delivered: the token may be accepted only through it.  Stable slots are freed from the front, so the
queue stays bounded by the ring size.
"""

from __future__ import annotations

from enum import Enum

from .ids import ProcessId
from .packets import Ack, DataId
from .qos import QoS


class SlotState(Enum):
    MISSING = "missing"
    REQUESTED = "requested"
    RECEIVED = "received"
    DELIVERED = "delivered"


class SlotKind(Enum):
    UNKNOWN = "unknown"
    ACK = "ack"
    DATA = "data"
    VIEW = "view"


_HAVE = (SlotState.RECEIVED, SlotState.DELIVERED)


class Slot:
    __slots__ = ("key", "kind", "packet", "qos", "state", "ts")

    def __init__(self, ts: int, kind: SlotKind = SlotKind.UNKNOWN) -> None:
        self.ts = ts
        self.kind = kind
        self.state = SlotState.MISSING
        self.key: tuple[ProcessId, int] | None = None
        self.qos: QoS | None = None
        self.packet: object | None = None

    @property
    def have(self) -> bool:
        return self.state in _HAVE

    def __repr__(self) -> str:
        return f"Slot({self.ts}, {self.kind.name}, {self.state.name}, {self.key})"


class Conflict(Exception):
    """Two different packets claim one timestamp.  Never expected; the caller counts and drops."""


class OrderingQ:
    def __init__(self, base: int) -> None:
        self.slots: dict[int, Slot] = {}
        self.base = base
        """Lowest timestamp still held; everything below was stable and freed."""
        self.contig = base - 1
        self.high = base - 1
        self.ack_slots = 0
        self.index: dict[tuple[ProcessId, int], int] = {}
        """(src, seq) -> timestamp for every data slot held."""

    def get(self, ts: int) -> Slot | None:
        return self.slots.get(ts)

    def ts_of(self, key: tuple[ProcessId, int]) -> int | None:
        return self.index.get(key)

    def _slot_for(self, ts: int) -> Slot:
        slot = self.slots.get(ts)
        if slot is None:
            for gap in range(self.high + 1, ts):
                self.slots[gap] = Slot(gap)
            slot = self.slots[ts] = Slot(ts)
            self.high = ts
        return slot

    def place_control(self, ts: int, kind: SlotKind, packet: object) -> bool:
        """Fill slot ``ts`` with an ACK or New List; False when it already holds this packet."""
        slot = self._slot_for(ts)
        if slot.kind is not SlotKind.UNKNOWN:
            if slot.kind is kind and slot.packet == packet:
                return False
            raise Conflict(f"timestamp {ts} holds {slot!r}, not {packet!r}")
        slot.kind = kind
        slot.packet = packet
        slot.state = SlotState.RECEIVED
        self.ack_slots += 1
        return True

    def check_ids(self, ack: Ack) -> None:
        """Raise Conflict when the ACK's data ids disagree with slots already known."""
        for i, (src, seq, qos) in enumerate(ack.ids):
            slot = self.slots.get(ack.ts + 1 + i)
            if slot is not None and slot.kind is not SlotKind.UNKNOWN and (
                slot.kind is not SlotKind.DATA or slot.key != (src, seq) or slot.qos != qos
            ):
                raise Conflict(f"timestamp {ack.ts + 1 + i} holds {slot!r}, not {(src, seq)}")
            other = self.index.get((src, seq))
            if other is not None and other != ack.ts + 1 + i:
                raise Conflict(f"{(src, seq)} already ordered at {other}")

    def place_data_id(self, ts: int, data_id: DataId, have: bool) -> Slot:
        slot = self._slot_for(ts)
        if slot.kind is SlotKind.UNKNOWN:
            src, seq, qos = data_id
            slot.kind = SlotKind.DATA
            slot.key = (src, seq)
            slot.qos = qos
            self.index[slot.key] = ts
            if have:
                slot.state = SlotState.RECEIVED
        return slot

    def advance(self) -> bool:
        """Move ``contig`` over Received slots; True when it moved."""
        start = self.contig
        slots = self.slots
        nxt = slots.get(self.contig + 1)
        while nxt is not None and nxt.state in _HAVE:
            self.contig += 1
            nxt = slots.get(self.contig + 1)
        return self.contig != start

    def missing(self, limit: int) -> list[int]:
        out = []
        for ts in range(self.contig + 1, self.high + 1):
            if not self.slots[ts].have:
                out.append(ts)
                if len(out) >= limit:
                    break
        return out

    def truncate(self, after: int) -> list[Slot]:
        """Drop every slot beyond ``after`` (a reformation's sync point) and return them."""
        dropped = [self.slots.pop(ts) for ts in range(after + 1, self.high + 1) if ts in self.slots]
        for slot in dropped:
            if slot.key is not None:
                self.index.pop(slot.key, None)
            if slot.kind in (SlotKind.ACK, SlotKind.VIEW):
                self.ack_slots -= 1
        self.high = max(after, self.base - 1)
        self.contig = min(self.contig, self.high)
        return dropped

    def pop_front(self) -> Slot:
        slot = self.slots.pop(self.base)
        self.base += 1
        if slot.key is not None:
            self.index.pop(slot.key, None)
        if slot.kind in (SlotKind.ACK, SlotKind.VIEW):
            self.ack_slots -= 1
        return slot

    def __len__(self) -> int:
        return len(self.slots)
