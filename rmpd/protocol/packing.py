"""Packing: a packet waiting in the send queue takes further small messages until it is full.

While the send window is open, every message leaves at once in a packet of its own, so light traffic is never held
back.  Once the window is full, messages wait in the queue, and a message of the same QoS and handler joins the
packet at the queue's tail as long as the packet stays within the current packet limit (figure 4.2: half the
window, between MIN_PACKET and MAX_PACKET).  So packing happens exactly under load, one datagram and one slot of
the total order carry many messages, and each message keeps the packet's sequence number, delivered in order at
the packet's place.  Messages handed over together (``GroupEngine.send_batch``) are packed the same way whatever the
window, since none of them has to wait for another: the daemon's per-datagram work, not the wire, is what limits a
loaded ring.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from .fieldkinds import KEYED_TAG
from .ids import ProcessId, ViewId
from .packets import MAX_LIST, Data, Fragment, Keyed, Relayed
from .qos import QoS

PART_OVERHEAD = 5
"""Bytes msgpack adds per packed message (a bin header), counted against the packet limit."""


@dataclass(slots=True)
class Queued:
    """A packet not yet sent: its sequence number is fixed (the sender has been told it), its messages may grow."""

    seq: int
    qos: QoS
    handler: int | None
    parts: list[bytes]
    size: int
    more: bool | None = None
    """For a piece of a fragmented message: more pieces follow (None: not a fragment)."""
    first: bool = False
    """For a piece of a fragmented message: it is the first."""
    relayed: Relayed | None = None
    """A non-member's call this member carries into the order (travels alone)."""
    keys: list[bytes] | None = None
    """One key per message of a packet of keyed messages (which packs only keyed messages); None: no keys."""
    stamp: int = 0
    """For keyed messages: the sender's clock in ms when the packet was started (``Keyed.stamp``)."""
    key_bytes: int = 0
    """What the keys take on the wire (each key and its PART_OVERHEAD), counted against the packet limit."""

    def packs(self, qos: QoS, handler: int | None, keyed: bool = False) -> bool:
        """Messages of ``qos`` for ``handler`` (``keyed`` or not) may join this packet (room permitting): it is
        neither a piece of a fragmented message nor a relayed call."""
        return (self.more is None and self.relayed is None and qos == self.qos and handler == self.handler
                and keyed == (self.keys is not None))

    def take_run(self, payloads: Sequence[bytes], start: int, limit: int, max_packet: int,
                 keys: Sequence[bytes] | None = None) -> int:
        """Add ``payloads[start:]`` (of a QoS and handler this packet :meth:`packs`, with ``keys`` aligned with
        them when keyed) while each fits within ``limit`` bytes, counting PART_OVERHEAD per message (and its
        key), and needs no fragments; returns the index of the first one left.  One loop for a batch, not method
        calls per message: the sending daemon packs every message it is handed."""
        parts = self.parts
        used = self.size + PART_OVERHEAD * len(parts) + self.key_bytes
        end = start
        for payload in itertools.islice(payloads, start, None):
            size = len(payload)
            if keys is not None:
                size += len(keys[end]) + PART_OVERHEAD
            if size > max_packet or len(parts) >= MAX_LIST or used + size + PART_OVERHEAD > limit:
                break
            parts.append(payload)
            used += size + PART_OVERHEAD
            end += 1
        if keys is not None:
            assert self.keys is not None
            self.keys.extend(keys[start:end])
            self.key_bytes += sum(map(len, keys[start:end])) + PART_OVERHEAD * (end - start)
        self.size = used - PART_OVERHEAD * len(parts) - self.key_bytes
        return end

    def packet(self, view: ViewId, src: ProcessId) -> Data:
        if self.relayed is not None:
            return Data(view, src, self.seq, self.qos, self.handler, self.relayed)
        body: bytes | tuple[bytes, ...] | Fragment
        if self.more is not None:
            body = Fragment(self.first, self.more, self.parts[0])
        else:
            body = self.parts[0] if len(self.parts) == 1 else tuple(self.parts)
        if self.keys is not None:
            return Data(view, src, self.seq, self.qos, self.handler,
                        Keyed(KEYED_TAG, self.stamp, tuple(self.keys), body))
        return Data(view, src, self.seq, self.qos, self.handler, body)
