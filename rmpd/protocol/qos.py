"""Quality of service levels (RMP paper, figure 3.2), selectable per packet.

Levels build on each other; between two packets of different levels only the lower level's guarantee holds.
On the wire a QoS is one integer: the level in the low 3 bits and K (for K-resilient) above them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import NamedTuple

MAX_RESILIENCE = 65535
"""The largest K a K-resilient QoS may name.  K above the group's size is clamped to it anyway; the bound keeps
the wire code within msgpack's unsigned 64 bits, so every QoS that can be made can be encoded."""


class Level(IntEnum):
    UNRELIABLE = 0
    UNORDERED = 1
    SOURCE = 2
    TOTAL = 3
    K_RESILIENT = 4
    MAJORITY = 5
    SAFE = 6


class QoS(NamedTuple):
    """A QoS level plus K (``resilience``) for K-resilient delivery."""

    level: Level
    resilience: int = 0

    # Class constants UNRELIABLE .. SAFE are attached below the class.


    @staticmethod
    def k(n: int) -> QoS:
        """K-resilient QoS: delivered once at least ``n`` members hold the packet."""
        if not 1 <= n <= MAX_RESILIENCE:
            raise ValueError(f"K must be from 1 to {MAX_RESILIENCE}, got {n}")
        return QoS(Level.K_RESILIENT, n)

    @property
    def reliable(self) -> bool:
        return self.level >= Level.UNORDERED

    @property
    def ordered(self) -> bool:
        """True for levels delivered in timestamp (total) order."""
        return self.level >= Level.TOTAL

    @property
    def resilient(self) -> bool:
        """True for levels that wait for token passes after ordering."""
        return self.level >= Level.K_RESILIENT

    def code(self) -> int:
        return int(self.level) | (self.resilience << 3)

    @classmethod
    def from_code(cls, code: int) -> QoS:
        known = _BY_CODE.get(code)
        if known is not None:
            return known
        level = Level(code & 7)
        k = code >> 3
        if level == Level.K_RESILIENT and not 1 <= k <= MAX_RESILIENCE:
            raise ValueError(f"K-resilient QoS needs K from 1 to {MAX_RESILIENCE}")
        if level != Level.K_RESILIENT and k:
            raise ValueError("only K-resilient QoS carries K")
        qos = _CANONICAL.get((level, k)) or cls(level, k)
        if len(_BY_CODE) < 1024:
            _BY_CODE[code] = qos
        return qos

    def name(self) -> str:
        if self.level == Level.K_RESILIENT:
            return f"k{self.resilience}"
        return _NAMES[self.level]

    @classmethod
    def parse(cls, text: str) -> QoS:
        """A QoS from its name; K-resilient is named with its K (``k2``): a bare ``k`` names no level."""
        text = text.strip().lower()
        if text.startswith("k") and text[1:].isdigit():
            return cls.k(int(text[1:]))
        for level, name in _NAMES.items():
            if name == text and level != Level.K_RESILIENT:
                return cls(level)
        raise ValueError(f"unknown QoS {text!r}; expected one of {', '.join(QOS_NAMES)}")

    def required_holders(self, group_size: int) -> int:
        """How many members must hold a packet of this QoS before any member may deliver it.

        Majority uses a strict majority of MaxN (floor(MaxN/2)+1): the paper's (MaxN+1)/2 is not a majority for
        even MaxN, and two halves must never both deliver.  K is clamped to the group size.
        """
        if self.level == Level.K_RESILIENT:
            return min(self.resilience, group_size)
        if self.level == Level.MAJORITY:
            return group_size // 2 + 1
        if self.level == Level.SAFE:
            return group_size
        return 1


_NAMES = {
    Level.UNRELIABLE: "unreliable",
    Level.UNORDERED: "unordered",
    Level.SOURCE: "source",
    Level.TOTAL: "total",
    Level.K_RESILIENT: "k",
    Level.MAJORITY: "majority",
    Level.SAFE: "safe",
}

QOS_NAMES = tuple(f"k1..k{MAX_RESILIENCE}" if level == Level.K_RESILIENT else name for level, name in _NAMES.items())
"""Every name ``QoS.parse`` takes, as a person reads them (K-resilient as its range), in level order."""

QoS.UNRELIABLE = QoS(Level.UNRELIABLE)
QoS.UNORDERED = QoS(Level.UNORDERED)
QoS.SOURCE = QoS(Level.SOURCE)
QoS.TOTAL = QoS(Level.TOTAL)
QoS.MAJORITY = QoS(Level.MAJORITY)
QoS.SAFE = QoS(Level.SAFE)
_CANONICAL = {
    (q.level, q.resilience): q
    for q in (QoS.UNRELIABLE, QoS.UNORDERED, QoS.SOURCE, QoS.TOTAL, QoS.MAJORITY, QoS.SAFE)
}
_BY_CODE: dict[int, QoS] = {}
"""Decoded QoS codes, so the hot path of packet decoding builds no new objects."""


class Gate(Enum):
    """What a packet waits for at its timestamp in the total-order scan."""

    NONE = "none"
    """Never ordered (unreliable)."""
    SOURCE = "source"
    """Only its source's earlier packets."""
    TOTAL = "total"
    """Every earlier timestamp."""
    HOLDERS = "holders"
    """Every earlier timestamp, and enough members known to hold it (``QoS.required_holders``)."""


@dataclass(frozen=True, slots=True)
class DeliveryRule:
    """When a packet of one level may be delivered (figure 3.2)."""

    on_receipt: bool
    """As soon as it is held."""
    in_source_order: bool
    """As soon as its source's earlier packets are delivered."""
    gate: Gate


DELIVERY_RULES: dict[Level, DeliveryRule] = {
    Level.UNRELIABLE: DeliveryRule(on_receipt=True, in_source_order=False, gate=Gate.NONE),
    Level.UNORDERED: DeliveryRule(on_receipt=True, in_source_order=False, gate=Gate.SOURCE),
    Level.SOURCE: DeliveryRule(on_receipt=False, in_source_order=True, gate=Gate.SOURCE),
    Level.TOTAL: DeliveryRule(on_receipt=False, in_source_order=False, gate=Gate.TOTAL),
    Level.K_RESILIENT: DeliveryRule(on_receipt=False, in_source_order=False, gate=Gate.HOLDERS),
    Level.MAJORITY: DeliveryRule(on_receipt=False, in_source_order=False, gate=Gate.HOLDERS),
    Level.SAFE: DeliveryRule(on_receipt=False, in_source_order=False, gate=Gate.HOLDERS),
}
"""Figure 3.2 as a table: each level keeps the guarantees of the levels below it."""
