"""Flow and congestion control (section 4.6) and packing: the window's arithmetic, then the engine obeying it."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import Delivered, messages_of
from rmpd.protocol.flow import DelayWindow, RttEstimator, SendWindow, UnansweredDelay, make_congestion_control
from rmpd.protocol.limits import MessageTooLarge
from rmpd.protocol.packets import Ack, Data, Fragment, Nack
from rmpd.protocol.qos import QoS

from .harness import Ring


def window(**kw: int) -> SendWindow:
    args = {"min_packet": 1000, "max_packet": 16000, "initial": 4000, "max_window": 64000} | kw
    return SendWindow(**args)


def test_rto_follows_the_round_trip_and_its_variance_within_bounds() -> None:
    rtt = RttEstimator(0.005, 0.001, 2.0)
    assert rtt.rto == 0.005  # no sample yet
    rtt.sample(0.1)
    assert rtt.srtt == 0.1 and abs(rtt.rto - 0.3) < 1e-9  # srtt + 4 * (rtt / 2)
    for _ in range(200):
        rtt.sample(0.02)
    assert abs(rtt.srtt - 0.02) < 1e-3 and rtt.rto < 0.03
    for _ in range(50):
        rtt.sample(30.0)
    assert rtt.rto == 2.0


def test_slow_start_doubles_per_round_then_grows_linearly() -> None:
    w = window(max_window=1 << 20)
    w.threshold = 16000
    for _ in range(4):  # one round: everything in the window is sent, then ordered
        w.sent(1000)
    for _ in range(4):
        w.ordered(1000, 0.0, None)
    assert w.window == 8000 and w.in_flight == 0
    for _ in range(8):
        w.ordered(1000, 0.0, None)
    assert w.window == 16000
    packet = w.packet_limit()
    w.ordered(1000, 0.0, None)
    assert w.window == 16000 + packet * 1000 // 16000  # past the threshold: one packet per window ordered


def test_timeouts_halve_the_window_once_per_round_trip_never_below_one_minimum_packet() -> None:
    w = window(initial=8000)
    assert w.congested(1.0, 0.1)
    assert w.window == 4000 and w.threshold == 4000
    assert not w.congested(1.05, 0.1) and w.window == 4000  # the same loss, seen by another packet's timer
    for i in range(10):
        w.congested(2.0 + i, 0.1)
    assert w.window == 1000


def test_cuts_stop_at_the_window_floor_and_never_raise_a_smaller_window() -> None:
    w = window(initial=64000, min_window=32000)
    for i in range(5):
        w.congested(1.0 + i, 0.1)
    assert w.window == 32000, "two 16000-byte packets stay in flight under repeated loss"
    small = window(initial=4000, min_window=32000)
    assert small.congested(1.0, 0.1) and small.window == 4000, "a cut never grows the window"


def test_the_papers_window_in_the_engine_keeps_a_floor_of_two_of_the_largest_packets() -> None:
    ring = Ring(2, EngineConfig(congestion="rmp", max_packet=16000, initial_window=64000, journal=True))
    w = ring[0].sender.window
    for i in range(6):
        w.congested(1.0 + i, 0.1)
    assert w.window == 32000


def test_a_nack_halves_once_per_lost_packet_remembering_the_last_three() -> None:
    w = window(initial=64000)
    assert w.nack_named(5, 1.0, 0.1) and w.window == 32000
    assert not w.nack_named(5, 2.0, 0.1) and w.window == 32000  # another receiver lost the same packet
    for i, seq in enumerate((6, 7, 8)):
        assert w.nack_named(seq, 3.0 + i, 0.1)
    assert w.window == 4000
    assert w.nack_named(5, 9.0, 0.1)  # fell out of the three-entry cache
    assert w.window == 2000


@given(st.integers(1000, 1 << 20))
def test_packet_limit_is_half_the_window_between_min_and_max(size: int) -> None:
    w = window(initial=size, max_window=1 << 21)
    assert w.packet_limit() == min(16000, max(1000, size // 2))


def test_one_packet_may_always_be_in_flight_however_large() -> None:
    w = window(initial=1000)
    assert w.may_send(50000)
    w.sent(50000)
    assert not w.may_send(1)


def test_engine_keeps_its_bytes_in_flight_within_the_window() -> None:
    ring = Ring(2, EngineConfig(congestion="rmp", initial_window=16000, min_packet=1000, max_packet=16000,
                                journal=True))
    for i in range(20):
        ring.send(1, bytes([i]) * 6000, QoS.TOTAL)
    sender = ring[1]
    assert len(sender.sender.outstanding) == 2  # a third would put 18000 bytes in flight
    assert sum(p.size for p in sender.sender.outstanding.values()) <= 16000
    assert len(sender.sender.send_queue) == 18  # 6000-byte messages are too large to pack within 16000 / 2
    ring.advance(5.0)
    assert ring.delivered(0) == [bytes([i]) * 6000 for i in range(20)]
    assert sender.sender.window.window > 16000  # every packet ordered without loss: slow start grew the window


def test_a_nack_for_our_packet_halves_the_window_once() -> None:
    ring = Ring(3, EngineConfig(congestion="rmp", initial_window=64000, min_window=1000, journal=True))
    sender = ring[1]
    ring.send(1, b"x", QoS.TOTAL)
    ring.advance(0.5)
    before = sender.sender.window.window
    nack = Nack(ring.view.view_id, ring.pids[2], None, 0, 0, False, (), ((ring.pids[1], 1),))
    sender.receive_packet(nack, ring.now)
    sender.receive_packet(nack, ring.now)
    assert sender.sender.window.window == before // 2 and sender.stats["window_halved_nack"] == 1


def test_packing_keeps_qos_boundaries_and_the_order_of_every_message() -> None:
    ring = Ring(3, EngineConfig(window_packets=1, journal=True))
    plan = [(f"m{i}".encode(), QoS.TOTAL if (i // 5) % 2 == 0 else QoS.SAFE) for i in range(40)]
    seqs = [ring.send(1, payload, qos) for payload, qos in plan]
    assert len(set(seqs)) < len(seqs)  # the window held one packet: the rest were packed
    ring.advance(5.0)
    for member in range(3):
        assert ring.delivered(member) == [payload for payload, _ in plan]
    packed = [p for _, _, p in ring.log if isinstance(p, Data) and isinstance(p.payload, tuple)]
    assert packed and all(len({QoS.TOTAL, QoS.SAFE} & {p.qos}) == 1 for p in packed)


def test_a_large_message_travels_in_pieces_and_is_delivered_whole_in_order() -> None:
    config = EngineConfig(max_packet=1000, min_packet=500, initial_window=2000, journal=True)
    ring = Ring(3, config)
    big = bytes(range(256)) * 40  # 10240 bytes: 11 pieces
    ring.send(0, b"before", QoS.TOTAL)
    seq = ring.send(1, big, QoS.TOTAL)
    ring.send(2, b"during", QoS.TOTAL)
    ring.send(1, b"after", QoS.TOTAL)
    ring.advance(5.0)
    orders = [ring.delivered(i) for i in range(3)]
    assert orders[0] == orders[1] == orders[2]
    assert big in orders[0] and orders[0].index(big) < orders[0].index(b"after")
    got = [e for e in messages_of(ring.events[ring.pids[0]]) if e.payload == big]
    assert len(got) == 1 and got[0].seq == seq  # the sender is told the sequence number of the last piece
    assert ring[1].stats["fragmented"] == 1
    assert max(len(p.payload.chunk) for _, _, p in ring.log
               if isinstance(p, Data) and isinstance(p.payload, Fragment)) == 1000


def test_oversized_and_unfragmentable_sends_are_refused_clearly() -> None:
    ring = Ring(2, EngineConfig(max_packet=1000, max_message=5000))
    with pytest.raises(MessageTooLarge, match="at most 5000"):
        ring.send(0, b"x" * 5001, QoS.TOTAL)
    with pytest.raises(MessageTooLarge, match="must fit one packet"):
        ring.send(0, b"x" * 1001, QoS.UNRELIABLE)
    assert ring[0].sender.next_seq == 1 and not ring[0].sender.send_queue and not ring[0].sender.outstanding


def test_a_member_that_joined_mid_message_does_not_deliver_its_tail() -> None:
    ring = Ring(2, EngineConfig(max_packet=100, journal=True))
    engine = ring[1]
    tail = Data(ring.view.view_id, ring.pids[0], 5, QoS.SOURCE, None, Fragment(False, False, b"end"))
    assert engine.ordering.messages_of(tail) == ()
    assert engine.stats["fragments_before_join"] == 1
    head = Data(ring.view.view_id, ring.pids[0], 6, QoS.SOURCE, None, Fragment(True, True, b"ab"))
    last = Data(ring.view.view_id, ring.pids[0], 7, QoS.SOURCE, None, Fragment(False, False, b"c"))
    assert engine.ordering.messages_of(head) == () and engine.ordering.messages_of(last) == (b"abc",)


def test_an_overrun_member_holds_the_token_back_until_it_catches_up() -> None:
    ring = Ring(3)
    slow = ring[1]
    slow.set_overrun(True, ring.now)
    ring.send(0, b"first", QoS.TOTAL)  # member 0 holds the token: orders it, passes the token to member 1
    ring.advance(0.5)
    ring.send(2, b"second", QoS.TOTAL)
    ring.advance(0.5)
    accepts = slow.stats["token_accepts"]
    assert ring.delivered(2) == [b"first"] and accepts == 0  # nothing more is ordered anywhere
    slow.set_overrun(False, ring.now)
    ring.collect(ring.pids[1])
    ring.advance(1.0)
    assert all(ring.delivered(i) == [b"first", b"second"] for i in range(3))
    assert slow.stats["token_accepts"] > accepts and slow.stats["overruns"] == 1


@given(sizes=st.lists(st.integers(0, 2600), max_size=80), queued=st.integers(0, 1500))
@example(sizes=[1990, 0], queued=0)  # fills the 2000-byte limit exactly: 5 + 1990 + 5, then starts a packet
def test_a_batch_is_packed_as_the_per_message_rule_would(sizes: list[int], queued: int) -> None:
    """Packing a batch in one loop gives each message the sequence number the per-message rule gives it: join the
    packet at the queue's tail while it has room (each message costing its bytes plus PART_OVERHEAD), else start
    a packet; a message over max_packet goes as fragments, after which the next one starts a packet."""
    ring = Ring(2, EngineConfig(max_packet=2000, min_packet=1000, initial_window=4000, window_packets=1))
    sender = ring[1]
    sender.send_batch([b"q" * 4000], QoS.TOTAL, ring.now)  # in flight: what follows waits in the queue
    sender.send_batch([b"w" * queued], QoS.TOTAL, ring.now)  # a packet already waiting at the tail
    limit = sender.sender.window.packet_limit()
    tail_seq, used, count, packable = sender.sender.send_queue[-1].seq, queued + 5, 1, True
    next_seq, expected = tail_seq + 1, []
    for size in sizes:
        if size > 2000:
            next_seq += -(-size // 2000)
            expected.append(next_seq - 1)
            packable = False
        elif packable and used + size + 5 <= limit:
            used, count = used + size + 5, count + 1
            expected.append(tail_seq)
        else:
            tail_seq, used, count, packable = next_seq, size + 5, 1, True
            next_seq += 1
            expected.append(tail_seq)
    payloads = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    assert sender.send_batch(payloads, QoS.TOTAL, ring.now) == expected
    assert sender.sender.next_seq == next_seq


def test_a_batch_is_packed_at_once_even_with_the_window_open() -> None:
    """Messages handed over together share packets up to the packet limit: nothing is held back for it, and the
    ring carries one datagram per packet instead of one per message.  (The paper's window, whose 64 KB start
    lets every packet of the batch go at once.)"""
    ring = Ring(3, EngineConfig(congestion="rmp", journal=True))
    sender = ring[1]
    payloads = [bytes([i]) * 1000 for i in range(40)]
    seqs = sender.send_batch(payloads, QoS.TOTAL, ring.now)
    ring.collect(ring.pids[1])
    assert seqs is not None and seqs == sorted(seqs)
    limit = sender.sender.window.packet_limit()
    per_packet = limit // (1000 + 5)
    assert len(set(seqs)) == -(-40 // per_packet)  # as few packets as the limit allows, all sent at once
    assert not sender.sender.send_queue and len(sender.sender.outstanding) == len(set(seqs))
    ring.advance(1.0)
    for member in range(3):
        assert ring.delivered(member) == payloads
    assert [(d.seq, d.index) for d in ring.deliveries(0)] == [
        (seq, seqs[:i].count(seq)) for i, seq in enumerate(seqs)]
    # One event per packet, carrying its messages in order: not one object per message on the way out.
    packets = [e for e in ring.events[ring.pids[0]] if isinstance(e, Delivered)]
    assert [(e.seq, e.payloads) for e in packets] == [
        (seq, tuple(p for p, s in zip(payloads, seqs, strict=True) if s == seq)) for seq in sorted(set(seqs))]


def test_a_batch_is_refused_whole() -> None:
    ring = Ring(2, EngineConfig(max_message=5000, journal=True))
    with pytest.raises(MessageTooLarge):
        ring[1].send_batch([b"ok", b"x" * 6000], QoS.TOTAL, ring.now)
    assert ring[1].sender.next_seq == 1 and not ring[1].sender.send_queue
    ring[1].leave(ring.now)
    assert ring[1].send_batch([b"late"], QoS.TOTAL, ring.now) is None


def test_congestion_control_is_chosen_by_config_and_a_fixed_window_never_moves() -> None:
    config = EngineConfig(congestion="fixed", max_window=100_000)
    window = make_congestion_control(config)
    assert window.window == 100_000
    assert not window.congested(1.0, 0.1) and not window.nack_named(5, 1.0, 0.1)
    window.sent(16_000)
    window.ordered(16_000, 0.0, None)
    assert window.window == 100_000 and window.room() == 100_000
    assert make_congestion_control(EngineConfig(congestion="rmp")).congested(1.0, 0.1), "the paper's halves"
    assert isinstance(make_congestion_control(EngineConfig()), DelayWindow), "the default reads queues"
    with pytest.raises(ValueError, match="unknown congestion control"):
        make_congestion_control(EngineConfig(congestion="cubic"))



def delay_window(**kw: int) -> DelayWindow:
    args = {"min_packet": 1400, "max_packet": 16000, "initial": 64000, "max_window": 1 << 20,
            "min_window": 2800} | kw
    return DelayWindow(**args)


def run_link(w: DelayWindow, *, rate: float, base: float, rounds: int, sites: tuple[str, ...] = ("b",),
             slow: dict[str, float] | None = None) -> list[float]:
    """A fluid model of a link: what exceeds rate * base waits in the bottleneck's queue; each round every site
    orders some of our packets with the delay that queue makes (``slow``: a site's own link rate, if lower).
    Returns the queueing delay seen at each round."""
    now, queueing = 0.0, []
    for _ in range(rounds):
        worst = 0.0
        for site in sites:
            site_rate = (slow or {}).get(site, rate)
            queued = max(0.0, w.window - site_rate * base) / site_rate
            worst = max(worst, queued)
            for _ in range(4):
                w.sent(1400)
                w.ordered(1400, now, (site, base + queued, 0.0))
        queueing.append(worst)
        now += base + worst
    return queueing


def test_delay_window_fills_the_link_and_holds_a_few_packets_in_its_queue() -> None:
    """10 Mb/s, 2 ms round trip: the window settles near the path's bytes in flight plus TARGET seconds of the
    link's rate, so the link is full and the queue a few ms."""
    rate, base = 1_250_000.0, 0.002
    for initial in (2800, 64000, 512_000):
        w = delay_window(initial=initial)
        queueing = run_link(w, rate=rate, base=base, rounds=300)
        settled = queueing[-50:]
        assert all(q > 0 for q in settled)  # the link never idles
        assert max(settled) < 0.02  # 20 ms of queue at most
        assert rate * base < w.window < rate * (base + 2 * DelayWindow.TARGET)


def test_delay_window_grows_while_nothing_queues_and_packets_shrink_with_it() -> None:
    w = delay_window(initial=2800)
    run_link(w, rate=1e9, base=0.001, rounds=40)
    assert w.window > 200_000 and w.packet_limit() == 16000
    small = delay_window(initial=512_000)
    run_link(small, rate=1_250_000.0, base=0.001, rounds=300)
    assert small.packet_limit() < 16000  # a slow link: packets shrink toward the MTU-sized minimum


def test_delay_window_follows_the_slowest_site() -> None:
    """Sites take the token in turn; the one whose own link queues most sets the window."""
    fast = delay_window()
    run_link(fast, rate=12_500_000.0, base=0.002, rounds=300, sites=("b", "c"))
    slow = delay_window()
    queueing = run_link(slow, rate=12_500_000.0, base=0.002, rounds=300, sites=("b", "c"),
                        slow={"c": 1_250_000.0})
    assert fast.window > 12_500_000.0 * 0.002
    assert slow.window < 1_250_000.0 * (0.002 + 2 * DelayWindow.TARGET) < fast.window / 2
    assert max(queueing[-50:]) < 0.02


def run_waits(w: DelayWindow, *, base: float, wait: float, rounds: int, quiet: int = 5) -> list[int]:
    """A path whose delay does not answer to the window (a busy CPU): after ``quiet`` rounds at ``base``, every
    packet waits ``wait`` more however many are in flight, and a round orders the whole window.  Returns the
    window after each round."""
    now, windows = 0.0, []
    for r in range(rounds):
        delay = base + (0.0 if r < quiet else wait)
        for _ in range(max(1, w.window // 1400)):
            w.sent(1400)
            w.ordered(1400, now, ("b", delay, 0.0))
        now += delay
        windows.append(w.window)
    return windows


def test_delay_window_takes_waits_that_do_not_answer_to_it_for_no_queue() -> None:
    """Read as a queue, 20 ms of waiting for the CPU would take the window to its floor for good (and packets to
    one message each); it is not a queue the window made, since it stays when the window halves."""
    w = delay_window(initial=64000)
    windows = run_waits(w, base=0.001, wait=0.020, rounds=300)
    assert min(windows[30:]) > 10 * w.min_window
    assert w.unanswered.seconds > 0


def test_a_queue_that_drains_at_the_links_rate_is_no_wait() -> None:
    """The window halves: a queue it made keeps the link busy (the rate holds) while the delay is still high, so
    it stays a queue; a wait for the CPU lets the rate fall with the window and is taken as part of the base."""
    for rate_after, taken in ((1_250_000.0, False), (600_000.0, True)):
        unanswered = UnansweredDelay()
        now, ordered = 0.0, 0
        for _ in range(5):  # a high window, 20 ms of delay over a 1 ms base, at the link's rate
            now += 0.02
            ordered += 25_000
            unanswered.observe(now, 50_000, 0.021, 0.001, ordered)
        for _ in range(3):  # the window halved; the delay has not fallen yet
            now += 0.02
            ordered += int(rate_after * 0.02)
            unanswered.observe(now, 24_000, 0.021, 0.001, ordered)
        assert (unanswered.seconds > 0) is taken
        if taken:
            assert unanswered.seconds == pytest.approx(0.020)


def test_delay_window_reads_loss_with_the_queue() -> None:
    """A NACK with no queue is random loss: an eighth off, down to two of the largest packets; with our packets
    queueing it is congestion: halved."""
    w = delay_window()
    run_link(w, rate=1e9, base=0.002, rounds=20)  # no queue: the window grows well past two largest packets
    before = w.window
    assert before > 4 * 32000
    assert w.nack_named(1, 1.0, 0.01)
    assert w.window == before - before // DelayWindow.RANDOM_LOSS_CUT
    assert not w.nack_named(2, 1.005, 0.01)  # the same round trip
    for i in range(40):
        w.nack_named(3 + i, 2.0 + i, 0.01)
    assert w.window == 32000  # random loss never takes it below two of the largest packets
    queued = delay_window()
    run_link(queued, rate=1e9, base=0.002, rounds=20)
    for _ in range(4):
        queued.ordered(0, 1.0, ("b", 0.050, 0.0))  # 48 ms of queue
    before = queued.window
    assert queued.nack_named(1, 1.0, 0.01)
    assert queued.window == before // 2


def rounds_on_a_link(w: DelayWindow, *, start: float, rounds: int, rate: float = 1_250_000.0,
                     base: float = 0.002) -> list[tuple[float, int]]:
    """``run_link`` from ``start`` for one site: (the time, the window) after each round."""
    now, after = start, []
    for _ in range(rounds):
        queued = max(0.0, w.window - rate * base) / rate
        for _ in range(4):
            w.sent(1400)
            w.ordered(1400, now, ("b", base + queued, 0.0))
        now += base + queued
        after.append((now, w.window))
    return after


def test_while_nacks_name_our_packets_the_window_keeps_two_of_the_largest() -> None:
    """A 2 Mb/s link holds the window below two of the largest packets; a NACK for our packet lifts its floor to
    ``repair_window`` for ``REPAIR_SPAN`` (the ring waits for repairs, and a larger window keeps packets to order
    meanwhile), after which the queue takes it back down to the quiet floor's side.  By default the repair floor
    is two of the largest packets, and a ``min_window`` set in the config is both floors."""
    w = delay_window(min_window=16000, repair_window=32000)
    now, window = rounds_on_a_link(w, start=0.0, rounds=200, rate=250_000.0)[-1]
    assert 16000 <= window < 32000
    w.nack_named(1, now, 0.01)
    assert w.window >= 32000 == w.min_window
    after = rounds_on_a_link(w, start=now, rounds=400, rate=250_000.0)
    assert min(x for t, x in after if t < now + DelayWindow.REPAIR_SPAN) >= 32000
    assert after[-1][1] < 32000 and w.min_window == 16000
    default = make_congestion_control(EngineConfig(congestion="delay"))
    assert isinstance(default, DelayWindow)
    assert (default.min_window, default.repair_window) == (DelayWindow.FLOOR, 2 * default.max_packet)
    configured = make_congestion_control(EngineConfig(congestion="delay", min_window=20000))
    assert isinstance(configured, DelayWindow) and configured.repair_window == configured.min_window == 20000


def test_time_a_packet_waited_at_the_token_site_is_not_read_as_a_queue() -> None:
    """Under loss a packet waits at its token site for the token and for the repairs the site's acceptance needs,
    often longer than any queue; the site's ACK says how long (``Ack.waits``), and the window reads the path's
    delay without it, so it settles where the same link without those waits puts it."""
    rate, base = 1_250_000.0, 0.002
    rng = random.Random(5)

    def run(subtract: bool) -> int:
        w = delay_window(initial=2800)
        now = 0.0
        for _ in range(300):
            queued = max(0.0, w.window - rate * base) / rate
            for _ in range(4):
                waited = rng.uniform(0.0, 0.040)
                w.sent(1400)
                w.ordered(1400, now, ("b", base + queued + waited, waited if subtract else 0.0))
            now += base + queued + 0.02
        return w.window

    clean = delay_window(initial=2800)
    run_link(clean, rate=rate, base=base, rounds=300)
    assert run(subtract=True) == pytest.approx(clean.window, rel=0.2)
    assert run(subtract=False) < clean.window / 2  # read as a queue, the waits shrink it
    reported = delay_window()
    reported.ordered(1400, 0.0, ("b", 0.010, 5.0))  # a wait longer than the whole delay is no sample
    assert "b" not in reported.sites


def test_an_ack_says_how_long_what_it_orders_waited_at_its_site() -> None:
    """A packet that reached the next token site before the pass did waits there until the pass comes; that site's
    ACK gives the wait (``Ack.waits``), and the packet's sender takes send-to-ordering less the wait as its delay
    sample from that site: the path's delay, not that plus the time the pass took to be resent."""
    ring = Ring(3, EngineConfig(congestion="delay", min_packet=1400, max_packet=16000, journal=True))
    site, sender_pid = ring.pids[1], ring.pids[2]
    first_pass = []

    def lose_first_pass(src: str, dst: str, packet: object) -> bool:
        if isinstance(packet, Ack) and src == ring.pids[0] and dst == site and not first_pass:
            first_pass.append(packet)
            return True
        return False

    ring.drop = lose_first_pass
    ring.send(0, b"q")  # the founder orders its own packet and passes the token to the site: that pass is lost
    ring.send(2, b"p")
    assert ring.advance_until(lambda: ring.delivered(2) == [b"q", b"p"], limit=2.0) is not None
    acks = [(t, packet) for (src, dst, packet), t in zip(ring.log, ring.log_times, strict=True)
            if src == site and dst == sender_pid and isinstance(packet, Ack) and packet.ids]
    sent_at, ack = acks[0]
    assert [seq for src, seq, _ in ack.ids if src == sender_pid] == [1]
    arrived = next(t for (src, dst, packet), t in zip(ring.log, ring.log_times, strict=True)
                   if src == sender_pid and dst == site and isinstance(packet, Data))
    assert dict(ack.waits)[sender_pid] == pytest.approx((sent_at - arrived) * 1e6, abs=1)
    assert sent_at - arrived >= 0.003  # the pass was resent: p waited for it
    window = ring[2].sender.window
    assert isinstance(window, DelayWindow) and window.sites[site].current == pytest.approx(arrived)


def test_own_packets_ordered_as_token_site_count_until_the_next_site_has_the_pass() -> None:
    """A token site orders its own packets in its own ACK at once, while they may still wait in its link's queue,
    ahead of that ACK.  The delay window counts them in transit until an ACK of a later site shows the pass (and
    so they) got through, and send-to-then is a delay sample and a data round trip; meanwhile, with nothing else of
    ours in flight, one more packet may always go.  The paper's window frees them when ordered."""
    ring = Ring(3, EngineConfig(congestion="delay", min_packet=1400, max_packet=16000, journal=True))
    sender, pid = ring[0].sender, ring.pids[0]  # the founder holds the token
    ring.send(0, b"x" * 1000)
    assert not sender.outstanding and sender.window.in_flight == 1000  # ordered by its own ACK, still counted
    ring.send(0, b"y" * 2000)  # 3000 bytes with the first, over the 2800-byte window: it goes all the same
    assert len(sender.outstanding) == 1 and not sender.send_queue
    ring.now += 0.02  # the link's queue: the pass and the packets reach the others 20 ms later
    ring.flush()
    assert sender.window.in_flight == 0
    assert isinstance(sender.window, DelayWindow) and sender.window.sites[pid].current == pytest.approx(0.02)
    assert sender.data_rtt.srtt == pytest.approx(0.02)
    ring.advance(1.0)
    assert ring.delivered(2) == [b"x" * 1000, b"y" * 2000]
    paper = Ring(3, EngineConfig(congestion="rmp", min_packet=1400, max_packet=16000, journal=True))
    paper.send(0, b"x" * 1000)
    assert paper[0].sender.window.in_flight == 0


def test_the_delay_windows_data_timer_waits_a_deviation_of_target_over_a_steady_round_trip() -> None:
    """A link that clocks our packets out at its rate makes every round trip alike; the paper's timer then comes
    down to the round trip itself, and the delay window's keeps TARGET of deviation above it."""
    for congestion, least in (("rmp", 0.010), ("delay", 0.010 + 4 * DelayWindow.TARGET)):
        sender = Ring(3, EngineConfig(congestion=congestion, journal=True))[0].sender
        for _ in range(50):
            sender.data_rtt.sample(0.010)
        assert sender.data_rtt.rto == pytest.approx(least, rel=0.05)


def transfer_over_rated_links(members: int, *, rate: float = 1_250_000.0, messages: int = 1000,
                              jitter: float = 0.0002, senders: int = 1, backlog: int = 2,
                              ports: bool = False) -> tuple[float, int, int]:
    """The first ``senders`` members each transfer ``messages`` total-order messages of 1,000 bytes to the others,
    every member's datagrams leaving through a link of ``rate`` bytes a second (one FIFO: data, ACKs and confirms
    alike, as in a tbf qdisc) and, with ``ports``, reaching each member through another (a switch's port to it,
    which several senders share), each arriving 0.2 ms plus a seeded exponential ``jitter`` later.  Each sender's
    client keeps ``backlog`` packets queued.  Returns (seconds until every member delivered everything, the
    senders' timeouts, the senders' data retransmissions)."""
    ring = Ring(members, EngineConfig(congestion="delay", min_packet=1342, max_packet=16384, journal=False))
    engines, pids = ring.engines, ring.pids
    sending = pids[:senders]
    rng = random.Random(1)
    link_free = dict.fromkeys(pids, 0.0)
    port_free = dict.fromkeys(pids, 0.0)
    arrivals: list[tuple[float, int, str, bytes | None, str]] = []
    order = itertools.count()
    delivered = dict.fromkeys(pids, 0)
    queued = dict.fromkeys(sending, 0)

    def top_up(pid: str, now: float) -> None:
        engine = engines[pid]
        while queued[pid] < messages and len(engine.sender.send_queue) < backlog:
            engine.send(bytes([queued[pid] % 256]) * 1000, QoS.TOTAL, now)
            queued[pid] += 1

    def take(pid: str, now: float) -> None:
        out = engines[pid].take_outputs(deadline=False)
        delivered[pid] += len(messages_of(out.events))
        for tx in out.datagrams:
            link_free[pid] = max(now, link_free[pid]) + len(tx.data) / rate
            for dst in [p for p in pids if p != pid] if tx.dest is None else [tx.dest]:
                arrival = link_free[pid]
                if ports:  # each IP fragment is forwarded as it comes: an idle port ends one fragment after the link
                    port_free[dst] = max(port_free[dst] + len(tx.data) / rate,
                                         link_free[pid] + min(len(tx.data), 1500) / rate)
                    arrival = port_free[dst]
                heapq.heappush(arrivals, (arrival + 0.0002 + rng.expovariate(1 / jitter), next(order), dst,
                                          tx.data, pid))
        deadline = engines[pid].get_timer()
        if deadline is not None:
            heapq.heappush(arrivals, (max(deadline, now), next(order), pid, None, pid))

    ring.wire.clear()
    for pid in sending:
        top_up(pid, 0.0)
    for pid in pids:
        take(pid, 0.0)
    now = 0.0
    while arrivals and now < 30.0:
        now, _, pid, data, src = heapq.heappop(arrivals)
        if data is not None:
            engines[pid].receive_datagram(data, src, now)
        elif (deadline := engines[pid].get_timer()) is not None and deadline <= now:
            engines[pid].handle_timer(now)
        if pid in queued:
            top_up(pid, now)
        take(pid, now)
        if all(count == messages * senders for count in delivered.values()):
            break
    return (now, sum(engines[pid].stats["window_halved_timeout"] for pid in sending),
            sum(engines[pid].stats["data_retransmits"] for pid in sending))


@pytest.mark.parametrize("destinations", [1, 2, 4])
def test_delay_window_fills_a_rated_link_to_any_number_of_destinations(destinations: int) -> None:
    """The engines themselves over rated links: the transfer keeps the sender's link busy (0.9 of it or more,
    with every header and control packet on the same link) and the data timer quiet, whatever the number of
    destinations, and never stalls while the token site's own packets wait for the next site's ACK."""
    seconds, timeouts, _ = transfer_over_rated_links(destinations + 1)
    assert 1000 * 1000 / 1_250_000.0 / seconds >= 0.9
    assert timeouts <= 3


def test_a_data_timer_started_below_the_round_trip_learns_it_after_a_few_resends() -> None:
    """Three senders start at once over rated links, and their first packets take tens of ms to be ordered, far
    above the data timer's first interval.  The interval backed off at an expiry is kept by the restarts at each
    ACK until a packet sent once is ordered (Karn's algorithm), so a few resends teach the timer the path; set
    back to the first interval at every ACK, it resent most of the first windows and sampled none of them."""
    seconds, _, resends = transfer_over_rated_links(5, senders=3, backlog=16, ports=True)
    assert 3 * 1000 * 1000 / 1_250_000.0 / seconds >= 0.9
    assert resends <= 12


def test_a_busy_link_holds_new_packets_and_resends_and_is_never_taken_for_a_failure() -> None:
    """While the runtime's socket is full, nothing new leaves and nothing is resent (a packet that has not left is
    not lost), the data timer does not count towards failure, and later messages pack into the held packets; once
    it drains, the window fills again and every member delivers everything in one order."""
    ring = Ring(3, EngineConfig(journal=True))
    sender_pid = ring.pids[1]
    ring.drop = lambda src, dst, packet: src == sender_pid and isinstance(packet, Data)  # the first packet is lost
    first = ring.send(1, b"first", QoS.TOTAL)
    ring.flush()
    ring.do(1, lambda engine, now: engine.set_link_busy(True, now))
    for i in range(10):
        ring.send(1, f"m{i}".encode(), QoS.TOTAL)
    ring.drop = lambda src, dst, packet: False
    ring.advance(10.0)  # twice the failure timeout
    assert ring[1].stats["data_retransmits"] == 0  # the data timer resent nothing (NACKs are still answered)
    assert not [p for src, _, p in ring.log if src == sender_pid and isinstance(p, Data) and p.seq != first]
    assert all(ring.engines[pid].views.current.size == 3 for pid in ring.pids)  # nobody taken for failed
    assert ring.delivered(0) == [b"first"]  # repaired through NACKs
    assert len(ring[1].sender.send_queue) == 1  # the ten messages wait packed in one packet
    ring.do(1, lambda engine, now: engine.set_link_busy(False, now))
    ring.advance(2.0)
    expected = [b"first"] + [f"m{i}".encode() for i in range(10)]
    assert [ring.delivered(i) for i in range(3)] == [expected] * 3


def test_the_delay_windows_floor_keeps_packets_of_several_messages_where_the_mtu_is_small() -> None:
    """On a 1500-byte Ethernet ``min_packet`` is 1,342 bytes; waits that hold the window at its floor still leave
    packets of 8 KiB (eight 1,000-byte messages), not one message each.  Packets that cannot be that large lower
    the floor to two of them, and ``min_window`` sets it outright."""
    window = make_congestion_control(EngineConfig(congestion="delay", min_packet=1342))
    assert isinstance(window, DelayWindow) and window.min_window == DelayWindow.FLOOR == 16384
    windows = run_waits(window, base=0.001, wait=0.050, rounds=300, quiet=1)
    assert min(windows) >= DelayWindow.FLOOR and window.packet_limit() >= 8192
    small_packets = make_congestion_control(EngineConfig(congestion="delay", min_packet=1342, max_packet=1342))
    assert small_packets.min_window == 2 * 1342
    assert make_congestion_control(EngineConfig(congestion="delay", min_packet=1342, min_window=4000)).min_window \
        == 4000
