"""The sending side of one member: the queue, packing, fragments, the window and retransmission (section 4.6).

Messages handed over together are packed together whatever the window: each joins the packet at the queue's tail
while it has room, and only then does the window decide what leaves.  None of them is held back for it, so this
costs no latency, and a busy sender pays one datagram, one slot of the order and one ACK entry per packet instead
of per message.  A message larger than ``max_packet`` goes as pieces with consecutive sequence numbers.

Own packets stay outstanding until an ACK orders them; the data timer resends the oldest first.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence

from .context import GroupContext
from .flow import CongestionControl, DelaySample, RttEstimator, make_congestion_control
from .ids import ProcessId, ViewId
from .packets import Data, Relayed
from .packing import PART_OVERHEAD, Queued
from .qos import Level, QoS
from .timers import Backoff


class Sender:
    """Own packets: queued, in flight (outstanding), and the timer that resends them."""

    def __init__(self, ctx: GroupContext, *, first_seq: int, first_unreliable_seq: int,
                 emit: Callable[[Data, float], None]) -> None:
        """``emit``: sends a new own packet and holds it like any received one (the engine's)."""
        config = ctx.config
        self.pid, self.config, self.stats, self.views = ctx.pid, config, ctx.stats, ctx.views
        self.emit = emit
        self.next_seq = first_seq
        self.next_unreliable_seq = first_unreliable_seq
        self.outstanding: dict[int, Data] = {}
        """Own packets sent and not yet ordered, oldest first."""
        self.send_queue: deque[Queued] = deque()
        """Packets accepted and not yet sent: the window holds them back."""
        self.rto = Backoff(config.rto_initial, config.rto_max, config.fail_after)
        self.window: CongestionControl = make_congestion_control(config)
        self.data_rtt = RttEstimator(config.rto_initial, config.rto_min, config.rto_max,
                                     self.window.timer_deviation_floor)
        """Send -> ordering time of our own packets: the data retransmission timer."""
        self.backed_off = 0.0
        """The data timer's interval after its last expiry, kept by every restart until a packet sent once is
        ordered (Karn's algorithm): a resent packet gives no sample, so a timer started below the path's round
        trip, and set back to it at each ACK, would resend the first packets before any is ordered and never learn
        a longer one.  A member silent for good is still found by its Alives' absence (liveness), whatever this
        timer's interval."""
        self.first_sent: dict[int, float] = {}
        """When each outstanding packet of ours was sent, for packets not retransmitted (Karn's rule)."""
        self.passing: list[tuple[int, float | None]] = []
        """(bytes, first sent) of own packets our own ACK ordered that the window still counts in transit: they may
        still wait in our link's queue, ahead of the ACK (when ``window.counts_until_passed``)."""
        self.passing_acked = False
        """Our ACK that ordered ``passing`` went out; the next ACK heard is a later site's, which holds them."""
        self.link_busy = False
        """The runtime's socket holds data it could not send yet: nothing new goes out, nor a resend (see
        :meth:`set_link_busy`)."""

    def unordered_seqs(self) -> tuple[int, ...]:
        """Sequence numbers of own messages accepted and not yet ordered (sent or still queued), each once."""
        seqs = {packet.seq for packet in self.outstanding.values()} | {queued.seq for queued in self.send_queue}
        return tuple(sorted(seqs))

    @property
    def idle(self) -> bool:
        """Nothing queued or in flight."""
        return not self.outstanding and not self.send_queue

    def queue(self, payloads: Sequence[bytes], qos: QoS, handler: int | None,
              keys: Sequence[bytes] | None = None, stamp: int = 0) -> list[int]:
        """Queue reliable messages, packing them into the packet at the queue's tail while it has room.  Keyed
        messages (``keys`` aligned with ``payloads``, ``stamp`` the clock in ms) pack only with keyed ones."""
        config = self.config
        seqs: list[int] = []
        queue = self.send_queue
        limit = self.window.packet_limit()
        keyed = keys is not None
        i, count = 0, len(payloads)
        while i < count:
            payload = payloads[i]
            if len(payload) > config.max_packet:
                seqs.append(self._queue_fragments(payload, qos, handler, None if keys is None else keys[i], stamp))
                i += 1
                continue
            tail = queue[-1] if queue else None
            if tail is not None and tail.packs(qos, handler, keyed):
                end = tail.take_run(payloads, i, limit, config.max_packet, keys)
                if end > i:
                    seqs.extend(itertools.repeat(tail.seq, end - i))
                    self.stats["packed"] += end - i
                    i = end
                    continue
            queue.append(Queued(self.next_seq, qos, handler, [payload], len(payload),
                                keys=None if keys is None else [keys[i]], stamp=stamp,
                                key_bytes=0 if keys is None else len(keys[i]) + PART_OVERHEAD))
            seqs.append(self.next_seq)
            self.next_seq += 1
            i += 1
        return seqs

    def send_now(self, payloads: Sequence[bytes], qos: QoS, handler: int | None, view_id: ViewId,
                 now: float) -> None:
        """Queue messages of the engine's own (a key table for joiners) and send what the window allows."""
        self.queue(payloads, qos, handler)
        self.fill_window(view_id, now)

    def _queue_fragments(self, payload: bytes, qos: QoS, handler: int | None, key: bytes | None,
                         stamp: int) -> int:
        """A message larger than MAX_PACKET goes as pieces with consecutive sequence numbers; it is delivered
        whole, at the place of its last piece, which is also the sequence number the sender gets.  Pieces of an
        unordered message travel source ordered, so every member reassembles them in sequence.  Every piece of a
        keyed message carries its key."""
        if qos.level == Level.UNORDERED:
            qos = QoS(Level.SOURCE)
        size = self.config.max_packet
        count = -(-len(payload) // size)
        for i in range(count):
            chunk = payload[i * size:(i + 1) * size]
            self.send_queue.append(Queued(self.next_seq, qos, handler, [chunk], len(chunk), more=i < count - 1,
                                          first=i == 0, keys=None if key is None else [key], stamp=stamp))
            self.next_seq += 1
        self.stats["fragmented"] += 1
        return self.next_seq - 1

    def queue_relayed(self, body: Relayed, qos: QoS, handler: int | None, size: int) -> None:
        """A non-member's call this member carries into the order."""
        self.send_queue.append(Queued(self.next_seq, qos, handler, [], size, relayed=body))
        self.next_seq += 1

    def unreliable(self, view_id: ViewId, payload: bytes, qos: QoS, handler: int | None) -> Data:
        seq = self.next_unreliable_seq
        self.next_unreliable_seq += 1
        return Data(view_id, self.pid, seq, qos, handler, payload)

    def set_link_busy(self, busy: bool, view_id: ViewId, now: float) -> None:
        """Back-pressure from below: while the process's socket cannot take more data, packets stay in the send
        queue (where later messages still pack into them) instead of waiting in the runtime as datagrams the
        window counts in flight; the data timer does not resend either, since a packet not yet on the wire is
        not lost, and it is restarted rather than backed off, so a busy link is never taken for a failed ring.
        When the socket drains, the window fills again."""
        self.link_busy = busy
        if busy:
            if self.rto.deadline is not None:
                self._start_rto(now)
        else:
            self.fill_window(view_id, now)

    def fill_window(self, view_id: ViewId, now: float) -> None:
        """Send queued packets while the window (bytes and packets in flight) allows and the link takes them.  With
        nothing of ours unordered, one packet goes whatever the window still counts of packets our own ACK ordered
        (``passing``): a quiet ring may rest the token at the next site with no ACK to release them, and the packet
        is what makes that site order, and so pass the token on."""
        if self.link_busy:
            return
        queue = self.send_queue
        while queue and len(self.outstanding) < self.config.window_packets and (
                self.window.may_send(queue[0].size) or (self.passing and not self.outstanding)):
            packet = queue.popleft().packet(view_id, self.pid)
            self.in_flight_again(packet)
            self.first_sent[packet.seq] = now
            if self.rto.deadline is None:
                self._start_rto(now)
            self.emit(packet, now)

    def in_flight_again(self, packet: Data) -> None:
        """``packet`` is outstanding (sent now, or unordered again by a reformation)."""
        if packet.seq not in self.outstanding:
            self.outstanding[packet.seq] = packet
            self.window.sent(packet.size)

    def _start_rto(self, now: float) -> None:
        self.rto.initial = max(self.data_rtt.rto, self.backed_off)
        self.rto.start(now)

    def _sample(self, rtt: float) -> None:
        """A packet sent once was ordered ``rtt`` after it was sent: the data timer's round trip, and the end of
        the interval backed off before it (``backed_off``)."""
        self.data_rtt.sample(rtt)
        self.backed_off = 0.0

    def data_timer_due(self, now: float, multicast: Callable[[Data, float], object]) -> bool:
        """The data timer expired: retransmit (``retransmit``); False, with the timer stopped, when its retries
        are exhausted (a member is taken for failed)."""
        if self.link_busy:
            self._start_rto(now)
            return True
        if self.rto.exhausted(self.config.fail_retries, now):
            self.rto.stop()
            return False
        self.retransmit(now, multicast)
        return True

    def retransmit(self, now: float, multicast: Callable[[Data, float], object]) -> None:
        """The data timer expired: resend the oldest outstanding packet, then twice as many per expiry in a row
        (as TCP resends one segment on a timeout): a timer that fired because the ring was slow, not because
        packets were lost, costs one resend."""
        if not self.outstanding:
            self.rto.stop()
            return
        if self.window.congested(now, self.data_rtt.rto):
            self.stats["window_halved_timeout"] += 1
        burst = min(self.config.retransmit_burst, 1 << min(self.rto.retries, 16))
        for i, packet in enumerate(self.outstanding.values()):
            if i >= burst:
                break
            self.stats["data_retransmits"] += 1
            self.first_sent.pop(packet.seq, None)
            multicast(packet, now)
        self.rto.back_off(now)
        self.backed_off = self.rto.interval

    def ring_moved(self, now: float) -> None:
        """A new ACK: the ring is ordering, so our packets are waiting their turn (at the latest the token reaches
        us and we order them ourselves), not lost; the data timer measures a ring that stopped moving.  It restarts
        after the samples this ACK gives (``_passed``), so that they set its interval."""
        if self.passing:
            if self.passing_acked:
                self._passed(now)
            else:
                self.passing_acked = True
        if self.outstanding and self.rto.deadline is not None:
            self._start_rto(now)

    def pass_arrived(self, now: float) -> None:
        """The next site has our pass (its NACK sent knowing of it), so every packet our ACK ordered has left our
        link's queue, which sends in order: they leave the window now, not when that site's own ACK comes.  Under
        loss that site must first fetch what it lacks (the acceptance rule), and a window that counted our packets
        through those repairs kept the link idle while the ring waited.  (A confirmation is not used: it comes with
        that site's ACK, and where nothing is lost these packets are timed to the ACK alone, so that one kind of
        sample sets both this site's base delay and its current one.)"""
        if self.passing and self.passing_acked:
            self._passed(now)

    def _passed(self, now: float) -> None:
        """An ACK after ours, or the next site's NACK knowing of our pass (``pass_arrived``): the pass got there,
        and every packet our ACK ordered, ahead of it, has left our link's queue.  Their bytes leave the window
        now, and send-to-now is what they waited there and on the way: a delay sample (this member as its site)
        and a data round trip, whose spread then covers the wait for the next site's ACK that the data timer
        measures."""
        site = self.pid
        for size, sent_at in self.passing:
            sample: DelaySample | None = None
            if sent_at is not None:
                sample = (site, now - sent_at, 0.0)
                self._sample(now - sent_at)
            self.window.ordered(size, now, sample)
        self.passing.clear()
        self.passing_acked = False
        view = self.views.current
        if self.pid in view:
            self.fill_window(view.view_id, now)

    def ordered(self, seq: int, now: float, site: ProcessId | None, waited: float | None = None) -> bool:
        """An ACK ordered our packet ``seq``; True when it was outstanding.

        ``site``: the member whose ACK ordered it, None when it was this one.  Ordered by another site, send-to-
        ordering is a round trip of the ring to that site, a sample of the data timer and, less ``waited`` (the
        seconds the packet waited at that site, ``Ack.waits``, given for one packet per ACK), of the congestion
        control's delay.  Packets we order ourselves as token site take no time at all; counted, they would pull
        the data timer to its floor while the token takes several ms to come round under load.  Where the window
        ``counts_until_passed`` they are timed to the next ACK instead (``ring_moved``)."""
        packet = self.outstanding.pop(seq, None)
        if packet is None:
            return False
        sent_at = self.first_sent.pop(seq, None)
        sample: DelaySample | None = None
        if site is None and self.window.counts_until_passed:
            self.passing.append((packet.size, sent_at))
        else:
            if sent_at is not None and site is not None:
                if waited is not None:
                    sample = (site, now - sent_at, waited)
                self._sample(now - sent_at)
            self.window.ordered(packet.size, now, sample)
        if self.outstanding:
            self._start_rto(now)
        else:
            self.rto.stop()
        return True

    def nacked(self, seqs: list[int], now: float) -> None:
        """A NACK asks for packets of ours: a receiver is overrun; halve the send window (once per lost packet,
        section 4.6)."""
        if seqs and self.window.nack_named(max(seqs), now, self.data_rtt.rto):
            self.stats["window_halved_nack"] += 1

    def unfreeze(self, now: float) -> None:
        """A reformation ended: a new ring, whose timer starts from the round trip, not from the expiries that
        found the old ring's failure."""
        self.backed_off = 0.0
        if self.outstanding:
            self._start_rto(now)
