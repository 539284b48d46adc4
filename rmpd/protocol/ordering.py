"""The DataList and the OrderingQ of one member (section 4.2): data held, what ACKs ordered, and the delivery cursor.

Data packets are held by (source, sequence number); those not yet ordered form the DataList (``unordered``).  An ACK
fills the OrderingQ's slots with the packets it orders.  Delivery runs along two cursors: per source (the next
sequence number, for source-ordered traffic and for not delivering anything twice) and along the timestamps (total
order and above).  Fragments are reassembled here, per source, in delivery order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from enum import Enum
from itertools import islice

from .fieldkinds import DataId
from .ids import ProcessId, ViewId
from .orderingq import OrderingQ, Slot, SlotKind, SlotState
from .packets import Ack, Data, Fragment, Keyed, NewList, Packet, Relayed
from .qos import DELIVERY_RULES, Gate
from .stability import Holdings
from .view import View

DeliveredBefore = tuple[dict[ProcessId, int], dict[ProcessId, set[int]]]
"""Per source, the next sequence number to deliver and those delivered beyond it (``Ordering.delivered_state``)."""

Key = tuple[ProcessId, int]


class Held(Enum):
    """What became of a reliable data packet offered to the DataList."""

    NEW = "new"
    DUPLICATE = "duplicate"
    """Held or delivered already."""
    MISMATCH = "mismatch"
    """Its QoS differs from the one its ACK ordered: not the packet that was ordered."""


class Ordering:
    """Data held, its order, and how far delivery got."""

    def __init__(self, start_ts: int, stats: Counter[str]) -> None:
        self.stats = stats
        self.q = OrderingQ(start_ts)
        self.data: dict[Key, Data] = {}
        self.unordered: dict[ProcessId, dict[int, float | None]] = {}
        """The DataList: sequence numbers held and not yet ordered, per source, each with when it arrived (None:
        unordered again by a reformation)."""
        self.ordered_upto: dict[ProcessId, int] = {}
        """Per source, the highest sequence number an ACK ordered."""
        self.deliver_ts = start_ts
        """Next timestamp of the total-order scan."""
        self.src_next: dict[ProcessId, int] = {}
        """Per source, the next sequence number to deliver."""
        self.src_ahead: dict[ProcessId, set[int]] = {}
        """Per source, sequence numbers delivered ahead of ``src_next`` (unordered traffic)."""
        self.reassembly: dict[ProcessId, list[bytes]] = {}
        """Pieces of a fragmented message delivered so far, per source."""
        self.source_restarts: dict[ProcessId, int] = {}
        """Members (re)joining in a New List not yet delivered: their messages are delivered from this + 1 on."""

    def start(self, pid: ProcessId, joined_by: NewList | None, first_seq: int, view_id: ViewId) -> None:
        """The first slot: the New List that admitted this member, or the founding of the view.  It counts as
        delivered (the application is told of the view when the engine starts)."""
        q, ts = self.q, self.deliver_ts
        if joined_by is not None:
            self.ordered_upto.update(joined_by.seqs)
            self.src_next.update({src: seq + 1 for src, seq in joined_by.seqs})
            q.place_control(ts, SlotKind.VIEW, joined_by)
        else:
            # A founder whose numbering does not start at 1 (a daemon numbers from its start time) says so in the
            # group's first order, or its first message would wait forever behind sequence numbers never sent.
            self.ordered_upto[pid] = first_seq - 1
            self.src_next[pid] = first_seq
            q.place_control(ts, SlotKind.VIEW, ("initial", view_id))
        first_slot = q.get(ts)
        assert first_slot is not None
        first_slot.state = SlotState.DELIVERED
        q.advance()
        self.deliver_ts = ts + 1

    def beyond_horizon(self, packet: Packet, max_ahead: int) -> bool:
        """Does the packet name a timestamp too far ahead to make room for (``max_ahead``)?"""
        ts = getattr(packet, "ts", None)
        if ts is None:
            ts = getattr(packet, "sync_ts", None)
        return ts is not None and ts > self.q.contig + max_ahead

    # ------------------------------------------------------------------------------------------------------------
    # Holding and ordering

    def hold(self, packet: Data, now: float) -> tuple[Held, int | None, bool]:
        """Keep a reliable data packet.  Returns what became of it, its timestamp if an ACK ordered it, and
        whether an earlier packet of its source is missing from the DataList (a gap to ask the source about)."""
        key = (packet.src, packet.seq)
        if key in self.data:
            return Held.DUPLICATE, None, False
        if self.delivered(packet.src, packet.seq):
            self._fill_delivered(key, packet)
            return Held.DUPLICATE, None, False
        ts = self.q.ts_of(key)
        gap = False
        if ts is not None:
            slot = self.q.slots[ts]
            if slot.qos != packet.qos:
                return Held.MISMATCH, ts, False
            self.data[key] = packet
            if slot.state in (SlotState.MISSING, SlotState.REQUESTED):
                slot.state = SlotState.RECEIVED
        else:
            self.data[key] = packet
            self.unordered.setdefault(packet.src, {})[packet.seq] = now
            if packet.seq - 1 > self.ordered_upto.get(packet.src, 0) and (packet.src, packet.seq - 1) not in self.data:
                gap = True
        return Held.NEW, ts, gap

    def _fill_delivered(self, key: tuple[ProcessId, int], packet: Data) -> None:
        """A packet delivered here already (in an earlier membership of this process) that an ACK we hold orders
        again: keep it in its slot, which the token's acceptance rule and the NACKs of others need, though it is
        never delivered twice."""
        ts = self.q.ts_of(key)
        if ts is None:
            return
        slot = self.q.slots[ts]
        if slot.qos == packet.qos and slot.state in (SlotState.MISSING, SlotState.REQUESTED):
            self.data[key] = packet
            slot.state = SlotState.RECEIVED

    def carry_delivered(self, delivered: DeliveredBefore) -> None:
        """What this process delivered in its previous membership of the group: never delivered again."""
        src_next, src_ahead = delivered
        for src, nxt in src_next.items():
            if nxt > self.src_next.get(src, 1):
                self.src_next[src] = nxt
        for src, ahead in src_ahead.items():
            floor = self.src_next.get(src, 1)
            kept = {seq for seq in ahead if seq >= floor}
            if kept:
                self.src_ahead.setdefault(src, set()).update(kept)

    def delivered_state(self) -> DeliveredBefore:
        """Per source, the delivery cursor and the sequence numbers delivered beyond it (``carry_delivered``)."""
        return dict(self.src_next), {src: set(seqs) for src, seqs in self.src_ahead.items() if seqs}

    def order(self, ack: Ack, pid: ProcessId, own_ordered: Callable[[int], None]) -> None:
        """Place what ``ack`` orders (its slot is placed already); ``own_ordered`` is told each of ``pid``'s own
        sequence numbers as it is placed (the sender may send more at once, which may already use later slots)."""
        q = self.q
        data = self.data
        for i, data_id in enumerate(ack.ids):
            src, seq, _ = data_id
            key = (src, seq)
            q.place_data_id(ack.ts + 1 + i, data_id, key in data)
            if seq > self.ordered_upto.get(src, 0):
                self.ordered_upto[src] = seq
            pending = self.unordered.get(src)
            if pending is not None:
                pending.pop(seq, None)
                if not pending:
                    del self.unordered[src]
            if src == pid:
                own_ordered(seq)

    def waits(self, ids: tuple[DataId, ...], now: float) -> tuple[tuple[ProcessId, int], ...]:
        """For an ACK ordering ``ids``: per source, the microseconds its last packet there has waited here since it
        arrived (``Ack.waits``; a source whose packet came back unordered from a reformation is left out)."""
        last: dict[ProcessId, int] = {}
        for src, seq, _ in ids:
            last[src] = seq
        waits = []
        for src, seq in last.items():
            arrived = self.unordered.get(src, {}).get(seq)
            if arrived is not None:
                waits.append((src, max(0, round((now - arrived) * 1e6))))
        return tuple(waits)

    def holds_through(self, ts: int) -> bool:
        """The token's acceptance rule: no hole in the OrderingQ up to ``ts``."""
        return self.q.contig >= ts

    def orderable(self, limit: int, view: View) -> list[DataId]:
        """What a token site may order now: per source of ``view``, the run of held packets after the last one
        ordered.  Never a source outside the view: it may live on past a partition and order them itself."""
        ids: list = []
        for src in list(self.unordered):
            if src not in view:
                continue
            seq = self.ordered_upto.get(src, 0) + 1
            packet = self.data.get((src, seq))
            while packet is not None and len(ids) < limit:
                ids.append(packet.data_id)
                seq += 1
                packet = self.data.get((src, seq))
        return ids

    def restart_source(self, member: ProcessId, base: int) -> None:
        """A process (re)joins: order its messages from ``base``+1 on, forgetting any older ones still unordered.
        Delivery restarts there when the New List is delivered (``commit_restarts``)."""
        self.ordered_upto[member] = max(self.ordered_upto.get(member, 0), base)
        pending = self.unordered.get(member)
        if pending:
            for seq in [s for s in pending if s <= base]:
                del pending[seq]
                self.data.pop((member, seq), None)
            if not pending:
                del self.unordered[member]
        self.source_restarts[member] = base

    def forget_unorderable(self, view: View) -> None:
        """A view without some sources: none of their packets not yet ordered will be ordered in it.  A source
        left out may be alive past a partition, and it orders its unordered messages again on its own side
        (``truncate``): ordered here too, one message would have two places.  The packets stay in ``data``: an ACK
        of an earlier view that ordered them may still arrive and fill its slot."""
        for src in [s for s in self.unordered if s not in view]:
            del self.unordered[src]

    def truncate(self, after: int, pid: ProcessId) -> list[Data]:
        """A reformation drops every slot beyond its sync point ``after``: what they ordered is unordered again.
        Returns this process's own packets among them, which are in flight again."""
        own: list[Data] = []
        for slot in self.q.truncate(after):
            if slot.key is None:
                continue
            src, seq = slot.key
            self.unordered.setdefault(src, {})[seq] = None
            if self.ordered_upto.get(src, 0) >= seq:
                self.ordered_upto[src] = seq - 1
            packet = self.data.get(slot.key)
            if src == pid and packet is not None:
                own.append(packet)
        return own

    def sync_point(self) -> tuple[int, dict[ProcessId, int]]:
        """This member's reformation sync point: its highest consecutive timestamp and, per source, its highest
        consecutive sequence number held."""
        seqs: dict[ProcessId, int] = {}
        sources = set(self.src_next) | set(self.ordered_upto) | {src for src, _ in self.data}
        for src in sorted(sources):  # sorted: set order of strings changes from run to run
            seq = self.src_next.get(src, 1) - 1
            while (src, seq + 1) in self.data:
                seq += 1
            if seq > 0:
                seqs[src] = seq
        return self.q.contig, seqs

    def source_gaps(self, sources: dict[ProcessId, None], view: View, limit: int) -> list[Key]:
        """(src, seq) of packets not yet ordered that are known to exist, because a later packet of the same
        source is held, but are not held.  Only ``sources`` are looked at; one found without a gap (or no longer
        in ``view``: it answers no more, and a holder's ACK would name what it lacks) leaves it."""
        gaps: list[Key] = []
        for src in list(sources):
            if src not in view:
                del sources[src]
                continue
            seqs = self.unordered.get(src)
            newest = max(seqs) if seqs else 0
            found: list[Key] = []
            seq = self.ordered_upto.get(src, 0) + 1
            while seq < newest and len(found) < limit - len(gaps):
                if (src, seq) not in self.data:
                    found.append((src, seq))
                seq += 1
            if not found:
                del sources[src]
            gaps.extend(found)
            if len(gaps) >= limit:
                break
        return gaps

    def held_runs(self, limit: int) -> tuple[tuple[ProcessId, int, int], ...]:
        """The DataList as runs (src, first seq, last seq) of consecutive sequence numbers, sources in order, the
        oldest runs first and at most ``limit`` of them: what a NACK by timestamp tells its answerer it holds."""
        runs = ((src, first, last) for src in sorted(self.unordered)
                for first, last in consecutive_runs(sorted(self.unordered[src])))
        return tuple(islice(runs, limit))

    # ------------------------------------------------------------------------------------------------------------
    # Delivery cursors

    def delivered(self, src: ProcessId, seq: int) -> bool:
        if seq < self.src_next.get(src, 1):
            return True
        ahead = self.src_ahead.get(src)
        return ahead is not None and seq in ahead

    def mark_delivered(self, src: ProcessId, seq: int) -> None:
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

    def next_in_source_order(self, src: ProcessId) -> Data | None:
        """The source-ordered packet of ``src`` that may be delivered now, if any."""
        packet = self.data.get((src, self.src_next.get(src, 1)))
        if packet is None or not DELIVERY_RULES[packet.qos.level].in_source_order:
            return None
        return packet

    def next_in_total_order(self, holdings: Holdings, view: View) -> tuple[Slot, Data | None, int, int] | None:
        """The slot at the delivery cursor when it may be delivered now: (slot, its packet, members known to hold
        it, members needed), the packet None for a control slot (ACK or New List) or a packet delivered already.
        None: the cursor must wait."""
        slot = self.q.get(self.deliver_ts)
        if slot is None or not slot.have:
            return None
        if slot.kind is not SlotKind.DATA:
            return slot, None, 0, 0
        key = slot.key
        assert key is not None
        if self.delivered(*key):
            return slot, None, 0, 0
        packet = self.data[key]
        gate = DELIVERY_RULES[packet.qos.level].gate
        if gate is Gate.SOURCE:
            if self.src_next.get(key[0], 1) != key[1]:
                return None
            return slot, packet, 1, 1
        if gate is Gate.TOTAL:
            return slot, packet, 1, 1
        holders = holdings.holders_of(slot.ts)
        need = holdings.needed(packet.qos, slot.ts, view)
        if holders < need:
            return None
        return slot, packet, holders, need

    def finish(self, slot: Slot) -> None:
        slot.state = SlotState.DELIVERED
        self.deliver_ts += 1

    def commit_restarts(self, members: list[ProcessId]) -> None:
        """The New List that (re)admitted ``members`` is delivered: their delivery restarts after the base it
        announced (messages after it may already be delivered: source order needs no ACK)."""
        for member in members:
            base = self.source_restarts.pop(member, None)
            if base is None:
                continue
            self.src_next[member] = max(self.src_next.get(member, 1), base + 1)
            ahead = {s for s in self.src_ahead.get(member, ()) if s > base}
            self.src_ahead[member] = ahead
            while self.src_next[member] in ahead:
                ahead.discard(self.src_next[member])
                self.src_next[member] += 1

    def free_stable(self, latest_ack_ts: int, holdings: Holdings, view: View) -> None:
        """Free slots from the front once delivered here and held by every member that was a member then.

        A member that joined later never holds what was ordered before it came (it starts after its New List),
        so waiting for it would keep every slot of a group formed by joins forever."""
        q = self.q
        holders_of, eligible = holdings.holders_of, holdings.eligible
        views_held = len(holdings.view_sizes) > 1  # only then may freeing let an older view's size go
        while q.base < self.deliver_ts and q.base < latest_ack_ts:
            if holders_of(q.base) < eligible(q.base, view):
                return
            slot = q.pop_front()
            if slot.key is not None:
                self.data.pop(slot.key, None)
            if views_held:
                holdings.freed(q.base)
                views_held = len(holdings.view_sizes) > 1

    # ------------------------------------------------------------------------------------------------------------
    # Reassembly

    def messages_of(self, packet: Data) -> tuple[bytes, ...]:
        """What the application gets for a delivered packet: its message, its packed messages, or, for fragments,
        nothing until the last piece, then the whole message (pieces of one source arrive in sequence order).
        A relayed call gives nothing here: the SCMP filter decides what it gives (``CallRelay``)."""
        body = packet.payload
        if type(body) is Keyed:
            body = body.body
        if isinstance(body, Relayed):
            return ()
        if isinstance(body, Fragment):
            if body.first:
                self.reassembly[packet.src] = []
            pieces = self.reassembly.get(packet.src)
            if pieces is None:  # we joined after its first piece was ordered: the message is not ours
                self.stats["fragments_before_join"] += 1
                return ()
            pieces.append(body.chunk)
            if body.more:
                return ()
            del self.reassembly[packet.src]
            return (b"".join(pieces),)
        return body if isinstance(body, tuple) else (body,)

    def drop_reassembly_outside(self, view: View) -> None:
        """A source left the view: every member drops the same unfinished message."""
        for src in [s for s in self.reassembly if s not in view]:
            del self.reassembly[src]


def consecutive_runs(seqs: list[int]) -> Iterator[tuple[int, int]]:
    """(first, last) of each run of consecutive numbers in the sorted ``seqs``."""
    if not seqs:
        return
    first = last = seqs[0]
    for seq in seqs[1:]:
        if seq != last + 1:
            yield first, last
            first = seq
        last = seq
    yield first, last
