"""Engine behaviour, driven with a scripted clock: ordering, token acceptance, NACKs, QoS delivery times."""

from __future__ import annotations

import collections
import itertools

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import messages_of
from rmpd.protocol.ids import ViewId
from rmpd.protocol.orderingq import SlotKind, SlotState
from rmpd.protocol.packets import Ack, Alive, Confirm, Data, ListChangeRequest, Nack, Packet, RecoveryVote, encode
from rmpd.protocol.qos import QoS
from rmpd.protocol.token import TokenState

from .harness import Ring


def test_total_order_is_the_same_everywhere_including_the_sender() -> None:
    ring = Ring(3)
    ring.send(1, b"b1")
    ring.send(2, b"c1")
    assert ring.delivered(1) == [] and ring.delivered(2) == [], "total messages wait for their ACK"
    ring.flush()
    orders = [[(d.payload, d.ts) for d in ring.deliveries(i)] for i in range(3)]
    assert orders[0] == orders[1] == orders[2]
    assert sorted(p for p, _ in orders[0]) == [b"b1", b"c1"]
    ts = [t for _, t in orders[0]]
    assert ts == sorted(ts) and len(set(ts)) == 2


def test_ack_orders_a_batch_with_consecutive_timestamps() -> None:
    ring = Ring(3)
    ring.drop = lambda src, dst, p: dst == ring.pids[0] and isinstance(p, Data) and p.seq == 1
    for i in range(3):
        ring.send(1, f"m{i}".encode())
    ring.flush()
    assert ring.delivered(2) == [], "A holds m1 and m2 but may not order them before m0"
    ring.drop = lambda src, dst, p: False
    ring.advance(0.5)  # B retransmits m0; A, the token site, orders all three with one ACK
    acks = [p for s, _, p in ring.log if isinstance(p, Ack) and p.ids and s == ring.pids[0]]
    assert acks[0].ids == tuple((ring.pids[1], n, QoS.TOTAL) for n in (1, 2, 3))
    d = ring.deliveries(2)
    assert [x.ts for x in d] == [acks[0].ts + 1, acks[0].ts + 2, acks[0].ts + 3]
    assert [x.payload for x in d] == [b"m0", b"m1", b"m2"]


def test_unordered_and_unreliable_are_delivered_on_receipt() -> None:
    ring = Ring(3)
    c = ring.pids[2]
    ring.drop = lambda src, dst, p: dst == c and isinstance(p, Ack)
    ring.send(1, b"u", QoS.UNORDERED)
    ring.send(1, b"x", QoS.UNRELIABLE)
    ring.send(1, b"t", QoS.TOTAL)
    ring.flush()
    assert ring.delivered(2) == [b"u", b"x"], "C has no ACK yet: only unordered and unreliable may be delivered"
    assert ring.delivered(1)[:2] == [b"u", b"x"], "the sender delivers its own at once too"


def test_source_order_waits_for_earlier_sequence_numbers() -> None:
    ring = Ring(3)
    b, c = ring.pids[1], ring.pids[2]
    ring.drop = lambda src, dst, p: (dst == c and isinstance(p, Data) and p.seq == 1) or (
        dst == c and isinstance(p, Ack))
    ring.send(1, b"s1", QoS.SOURCE)
    ring.send(1, b"s2", QoS.SOURCE)
    ring.flush()
    assert ring.delivered(2) == [], "s2 must wait for s1"
    assert ring.delivered(1) == [b"s1", b"s2"]
    ring.drop = lambda src, dst, p: False
    ring.advance(1.0)
    assert ring.delivered(2) == [b"s1", b"s2"]
    assert [d.src for d in ring.deliveries(2)] == [b, b]


def test_k_resilient_waits_until_k_members_are_known_to_hold_it() -> None:
    ring = Ring(3)  # A holds the token; C sends; A's ACK orders it and passes the token to B.
    a = ring.pids[0]
    ring.drop = lambda src, dst, p: dst == a and isinstance(p, Confirm | Ack)
    ring.send(2, b"k2", QoS.k(2))
    ring.flush()
    assert ring.delivered(2) == [b"k2"], "C knows A (the ACK's sender) and itself hold it"
    assert ring.delivered(1) == [b"k2"], "B accepted the token: A and B hold it"
    assert ring.delivered(0) == [], "A has not heard that anyone else holds it"
    ring.drop = lambda src, dst, p: False
    ring.advance(1.5)
    assert ring.delivered(0) == [b"k2"]


def test_safe_waits_for_the_token_to_go_round() -> None:
    ring = Ring(3)
    ring.send(2, b"safe", QoS.SAFE)
    ring.flush()
    assert [ring.delivered(i) for i in range(3)] == [[], [], []], "only A and one other are known to hold it"
    delivered_at: dict[int, float] = {}
    while len(delivered_at) < 3 and ring.now < 1.0:  # NULL ACKs go round promptly while it is not stable
        ring.advance(0.001, step=0.001)
        delivered_at.update({i: ring.now for i in range(3) if ring.delivered(i) and i not in delivered_at})
    assert sorted(delivered_at) == [0, 1, 2] and max(delivered_at.values()) < 0.1
    assert delivered_at[0] > max(delivered_at[1], delivered_at[2]), "A hears from C last, through C's NULL ACK"


def test_majority_in_a_ring_of_four_needs_three_holders() -> None:
    ring = Ring(4)
    ring.send(1, b"m", QoS.MAJORITY)
    ring.flush()
    assert ring.delivered(2) == [] and ring.delivered(3) == [], "A and self make two of four: not a majority"
    ring.advance(1.2)
    assert ring.delivered(2) == [b"m"] and ring.delivered(3) == [b"m"]


def test_token_is_accepted_only_without_holes() -> None:
    ring = Ring(3)
    a, b, _c = ring.pids
    ring.drop = lambda src, dst, p: dst == b and isinstance(p, Data)
    ring.send(2, b"from-c")
    ring.flush()
    engine_b = ring[1]
    assert engine_b.token.accept_target is not None, "A's ACK named B as the next token site"
    assert not engine_b.token.have_token, "B lacks the data the ACK ordered, so it must not accept"
    assert not any(isinstance(p, Confirm) and s == b for s, _, p in ring.log)
    assert ring.delivered(1) == []
    ring.advance(0.2)
    assert any(isinstance(p, Nack) and s == b for s, _, p in ring.log)
    assert not engine_b.token.have_token
    ring.drop = lambda src, dst, p: False
    ring.advance(0.5)
    assert engine_b.token.have_token or engine_b.token.accepted_ts >= 1
    assert ring.delivered(1) == [b"from-c"]
    assert any(isinstance(p, Confirm) and s == b and d == a for s, d, p in ring.log)


def test_nack_names_the_last_ack_sender_again_then_anyone() -> None:
    """The newest ACK's sender holds what it ordered, so an unanswered NACK (most often a lost NACK or answer)
    goes to it again; after nack_rotate tries it names no one, which also gets past a failed target."""
    ring = Ring(4, EngineConfig(journal=True, null_ack_prompt=1.0))  # the token stays near A meanwhile
    a, _, c, d = ring.pids
    ring.drop = lambda src, dst, p: dst == c and isinstance(p, Data)
    ring.send(1, b"x")
    ring.advance(3.0)
    named = [p.target for s, dst, p in ring.log if s == c and dst == d and isinstance(p, Nack) and not p.tail]
    rotate = ring[2].config.nack_rotate
    assert named[:rotate] == [a] * rotate
    assert named[rotate] is None
    ring.drop = lambda src, dst, p: False
    ring.advance(3.0)
    assert ring.delivered(2) == [b"x"]


def test_ack_is_resent_with_backoff_until_confirmed() -> None:
    ring = Ring(3, EngineConfig(journal=True, rto_initial=0.2, fail_retries=50, fail_after=60.0))
    a = ring.pids[0]
    ring.drop = lambda src, dst, p: dst == a and not isinstance(p, Data)
    ring.send(1, b"x")
    ring.flush()  # A orders and passes the token to B, then hears nothing back
    ring.advance(12.0)
    resends = [t for (s, _, p), t in zip(ring.log, ring.log_times, strict=True)
               if s == a and isinstance(p, Ack) and p.ids]
    times = sorted(set(resends))
    gaps = [round(y - x, 2) for x, y in itertools.pairwise(times)]
    assert gaps[:6] == [0.2, 0.2, 0.2, 0.4, 0.8, 1.6], "two resends at the first interval, then doubling"
    assert max(gaps) <= 2.0 + 0.01, "back-off is clamped at 2 s"
    assert ring[0].token.pass_pending is not None
    ring.drop = lambda src, dst, p: False
    ring.advance(3.0)
    assert ring[0].token.pass_pending is None


def test_quiet_ring_passes_the_token_once_round_and_stops() -> None:
    ring = Ring(4)
    ring.send(2, b"last")
    ring.flush()
    ring.advance(10.0)
    null_acks = [p for _, _, p in ring.log if isinstance(p, Ack) and not p.ids]
    assert len({p.ts for p in null_acks}) == 3, "after the last ordered packet, N-1 NULL ACKs bring it home"
    assert [p.quiet for p in sorted({p.ts: p for p in null_acks}.values(), key=lambda p: p.ts)] == [1, 2, 3]
    assert all(e.quiet for e in ring.engines.values()), "nothing left to do: the ring is silent but for Alives"
    holders = [e for e in ring.engines.values() if e.token.have_token]
    assert len(holders) == 1
    before = len(ring.log)
    ring.advance(10.0)
    later = [p for _, _, p in ring.log[before:]]
    assert later and all(isinstance(p, Alive) for p in later)
    alives = {(p.src, round(t)) for (_, _, p), t in zip(ring.log[before:], ring.log_times[before:], strict=True)}
    assert len(alives) <= 4 * 11, "at most one Alive per second per member"


def test_orderingq_stays_bounded_and_frees_stable_slots() -> None:
    ring = Ring(3)
    for i in range(60):
        ring.send(i % 3, f"m{i}".encode())
        ring.flush()
        for e in ring.engines.values():
            assert e.ordering.q.ack_slots <= 3 + 1
    ring.advance(5.0)
    for e in ring.engines.values():
        assert e.ordering.q.ack_slots <= 3
        assert len(e.ordering.data) == 0, "every message is stable, so no data packet is held for retransmission"
        assert all(s.state is SlotState.DELIVERED or s.kind is not SlotKind.DATA for s in e.ordering.q.slots.values())
    assert [len(ring.delivered(i)) for i in range(3)] == [60, 60, 60]


def test_duplicates_are_delivered_once() -> None:
    ring = Ring(3)
    ring.send(1, b"once", QoS.UNORDERED)
    ring.send(1, b"once-total")
    ring.flush()
    packets = [p for s, d, p in ring.log if isinstance(p, Data) and d == ring.pids[2]]
    for p in packets:
        ring[2].receive_datagram(encode(p), ring.pids[1], ring.now)
    ring.advance(1.0)
    assert ring.delivered(2) == [b"once", b"once-total"]
    assert ring[2].stats["duplicates"] >= 2


def test_window_queues_sends_and_delivers_all_in_order() -> None:
    ring = Ring(2, EngineConfig(window_packets=4, journal=True))
    for i in range(40):
        ring.send(1, f"{i}".encode(), QoS.SOURCE)
    # Four packets in flight; the other 36 messages wait packed into the one packet at the queue's tail.
    assert len(ring[1].sender.outstanding) == 4 and len(ring[1].sender.send_queue) == 1
    assert ring[1].sender.send_queue[0].parts == [f"{i}".encode() for i in range(4, 40)]
    ring.advance(3.0)
    assert ring.delivered(0) == [f"{i}".encode() for i in range(40)]
    assert ring.delivered(1) == [f"{i}".encode() for i in range(40)]
    assert ring[1].stats["packed"] == 35


def test_hostile_datagrams_are_counted_and_dropped() -> None:
    ring = Ring(2)
    e = ring[1]
    e.receive_datagram(b"garbage", None, 0.0)
    e.receive_datagram(encode(Data(ViewId("9.9.9.9:9", 1), ring.pids[0], 1, QoS.TOTAL, None, b"")), None, 0.0)
    e.receive_datagram(encode(Data(ring.view.view_id, "9.9.9.9:9", 1, QoS.TOTAL, None, b"")), None, 0.0)
    e.receive_datagram(encode(Data(ring.view.view_id, ring.pids[1], 1, QoS.TOTAL, None, b"")), None, 0.0)
    assert (e.stats["malformed"], e.stats["other_view"], e.stats["non_member"], e.stats["own_echo"]) == (1, 1, 1, 1)
    assert ring.delivered(1) == []


def test_single_member_group_orders_its_own_messages() -> None:
    ring = Ring(1)
    for q in (QoS.TOTAL, QoS.SAFE, QoS.SOURCE):
        ring.send(0, q.name().encode(), q)
    assert ring.delivered(0) == [b"total", b"safe", b"source"]
    assert ring[0].quiet


def test_a_timestamp_far_ahead_is_dropped_instead_of_allocating_every_slot_before_it() -> None:
    ring = Ring(3)
    ring.send(1, b"before")
    ring.flush()
    target = ring[2]
    far = target.ordering.q.contig + target.config.max_ahead + 1
    forged = Ack(ring.view.view_id, ring.pids[0], far, ring.pids[1], 0, ((ring.pids[0], 10**9, QoS.TOTAL),))
    target.receive_packet(forged, ring.now)
    vote = RecoveryVote(ring.view.view_id, ring.pids[0], 1, 2**62, ((ring.pids[0], 2**62),))
    target.receive_packet(vote, ring.now)
    assert target.stats["beyond_horizon"] == 2
    assert len(target.ordering.q.slots) < 100
    ring.send(1, b"after")
    ring.flush()
    assert [d.payload for d in ring.deliveries(2)] == [b"before", b"after"]


def test_a_departed_member_delivers_nothing_more_whatever_it_hears() -> None:
    """Removed from the view (here: departed directly), a process holding later slots must not deliver them, even
    when a join request or ACKs make it look at its OrderingQ again."""
    ring = Ring(3)
    ring.send(0, b"safe", QoS.SAFE)
    ring.flush()
    removed = ring[2]
    assert removed.ordering.q.high > removed.ordering.deliver_ts - 1 and ring.delivered(2) == []  # held, not yet stable
    removed.depart(ring.now)
    for other in ring.pids[:2]:  # later ACKs from the others tell it the packet became stable
        removed.holdings.learn(other, removed.ordering.q.high)
    joiner = ListChangeRequest("g", None, "10.0.0.9:7000", 1, "join", 0, True, 1, 1)
    removed.receive_packet(joiner, ring.now)
    removed.handle_timer(ring.now + 1.0)
    assert ring.delivered(2) == [] and messages_of(removed.take_outputs().events) == []


def test_resilient_messages_do_not_wait_for_idle_null_acks() -> None:
    """At light load the token goes round promptly while something is not yet stable, so a safe message is
    delivered in milliseconds, not after one NULL ACK interval (1 s) per member; then the ring falls quiet."""
    ring = Ring(4)
    ring.send(1, b"safe", QoS.SAFE)
    ring.advance(0.1)
    assert all(ring.delivered(i) == [b"safe"] for i in range(4))
    ring.advance(10.0)
    assert all(ring[i].quiet for i in range(4))
    nulls = sum(ring[i].stats["null_acks_sent"] for i in range(4))
    assert nulls <= 8  # one quiet round after stability, not a busy loop


def test_a_silent_next_site_is_suspected_after_ten_unanswered_expiries() -> None:
    """Twelve waits from a nearby site's 5 ms (two at the first interval, then doubling, clamped at 2 s): suspected
    4.5 to 4.6 s after the first pass (the paper: "within 5 seconds" for nearby sites), twelve passes in all."""
    ring = Ring(3)
    a, b = ring.pids[0], ring.pids[1]
    ring.drop = lambda src, dst, p: b in (src, dst)  # B has crashed
    ring.send(0, b"x")
    ring.flush()  # A orders and passes the token to B
    first_pass = ring.now
    suspected_at = ring.advance_until(lambda: ring[0].stats["failures_suspected"] > 0, 10.0)
    assert suspected_at is not None and 4.5 <= suspected_at - first_pass <= 4.6, suspected_at
    passes = [p for s, _, p in ring.log if s == a and isinstance(p, Ack) and p.ids]
    assert len(passes) == 12 * (len(ring.pids) - 2), "the first pass and eleven retransmissions, heard by C only"


def test_two_crashed_members_are_removed_once_every_voter_is_at_the_sync_point() -> None:
    """Two of five fall silent: the reformation proposes once the three voters are at the sync point and three
    Recovery Starts went unanswered, rather than waiting out all of recovery_patience."""
    ring = Ring(5)
    gone = set(ring.pids[3:])
    ring.drop = lambda src, dst, p: src in gone or dst in gone
    ring.send(0, b"x")
    ring.flush()
    suspected = ring.advance_until(lambda: any(ring[i].stats["failures_suspected"] for i in range(3)), 10.0)
    assert suspected is not None
    removed = ring.advance_until(lambda: all(ring[i].views.current.size == 3 for i in range(3)), 5.0)
    assert removed is not None and removed - suspected < 0.9, (suspected, removed)
    ring.send(1, b"after")
    ring.advance(1.0)
    assert all(ring.delivered(i) == [b"x", b"after"] for i in range(3))


def test_a_member_behind_the_sync_point_catches_up_during_the_reformation() -> None:
    """C lost a data packet, and its NACKs' answers, until its silence started a reformation.  Then the network
    heals: what C's catch-up NACKs bring in while it is frozen must count towards its sync point, so all four
    members make the new view (it is not dropped as the one member that never reached the sync point)."""
    ring = Ring(4)
    lagging = ring.pids[2]
    losing = [True]
    ring.drop = lambda src, dst, p: losing[0] and dst == lagging and isinstance(p, Data)
    ring.send(0, b"a")
    ring.flush()
    assert ring.advance_until(lambda: any(ring[i].frozen for i in range(4)), 10.0) is not None
    losing[0] = False
    first = ring[0].views.current.view_id
    settled = ring.advance_until(lambda: all(ring[i].views.current.view_id != first and not ring[i].frozen
                                             for i in range(4)), 5.0)
    assert settled is not None
    assert all(ring[i].views.current.size == 4 for i in range(4)), [ring[i].views.current.members for i in range(4)]
    assert all(ring.delivered(i) == [b"a"] for i in range(4))


def test_a_lost_token_is_noticed_by_a_member_whose_packet_waits_to_be_ordered() -> None:
    """The token rests at A; A and the next site B crash together, so nobody holds it.  C sends: its packet waits
    for an ACK that never comes.  Data timers from a loaded ring's ordering time are long (here at least 0.2 s:
    15 s to suspect); hearing no ACK at all, C takes the stall path and suspects a failure after 7.5 s."""
    ring = Ring(4, EngineConfig(journal=True, rto_initial=0.2, alive_interval=0))  # the paper's detection only
    ring.send(0, b"a")
    ring.flush()
    ring.advance(3.0)
    assert ring[0].token.have_token, "a quiet ring's token rests at the site that ordered last"
    dead = {ring.pids[0], ring.pids[1]}
    ring.drop = lambda src, dst, p: src in dead or dst in dead
    sent_at = ring.now
    ring.send(2, b"b")
    suspected = ring.advance_until(lambda: ring[2].stats["failures_suspected"] > 0, 30.0)
    assert suspected is not None and suspected - sent_at < 8.0, suspected
    assert ring[2].stats["suspected_stall"] == 1


def test_one_multicast_answers_several_nacks_for_the_same_hole() -> None:
    """Two members NACK one packet of B's at A within the same ms: A multicasts it once, and again for a NACK
    that comes after the window (the requester's copy was lost)."""
    ring = Ring(4)
    a, b, c, d = ring.pids
    ring.send(1, b"x")
    ring.flush()  # ordered by A; not yet stable, so still held
    ts = next(ts for ts, slot in ring[0].ordering.q.slots.items() if slot.key == (b, 1))
    holder = ring[0]

    def nack_from(src: str) -> list[bytes]:
        nack = Nack(ring.view.view_id, src, a, ts - 1, ts, False, (ts,), ())
        holder.receive_datagram(encode(nack), src, ring.now)
        return [tx.data for tx in holder.take_outputs().datagrams if tx.dest is None]

    first, second = nack_from(c), nack_from(d)
    assert len(first) == 1 and second == [], "the second NACK is answered by the first one's multicast"
    assert holder.stats["nack_resends_suppressed"] == 1
    ring.now += holder.config.nack_timeout
    assert nack_from(c) == first, "a NACK after the window gets the packet again"
    for _ in range(8):  # answered NACKs have shown a 1 ms round trip: requesters ask again that much sooner
        holder.repair.nack_rtt.sample(0.001)
    assert nack_from(d) == [] and holder.stats["nack_resends_suppressed"] == 2
    ring.now += holder.repair.nack_rtt.rto
    assert holder.repair.nack_rtt.rto < holder.config.nack_timeout / 2
    assert nack_from(d) == first, "the window is half the NACK timeout, which follows the round trip"


def test_a_private_answer_adds_no_copy_of_a_packet_multicast_within_the_window() -> None:
    """C NACKs A's packet at A, which multicasts it; a NACK answered privately (a tail NACK, or one naming no one)
    then adds no unicast copy of it within the window, the multicast copy being on its way to every member."""
    ring = Ring(4)
    a, _, c, d = ring.pids
    ring.send(0, b"x")
    ring.flush()
    ts = next(ts for ts, slot in ring[0].ordering.q.slots.items() if slot.key == (a, 1))
    holder = ring[0]
    view = ring.view.view_id

    def answer(nack: Nack) -> list[tuple[str | None, bytes]]:
        holder.receive_datagram(encode(nack), nack.src, ring.now)
        return [(tx.dest, tx.data) for tx in holder.take_outputs().datagrams]

    by_timestamp = answer(Nack(view, c, a, ts - 1, ts, False, (ts,), ()))
    assert [dest for dest, _ in by_timestamp] == [None]
    packet = by_timestamp[0][1]
    assert packet not in [data for _, data in answer(Nack(view, d, None, ts - 1, ts, False, (ts,), ()))]
    assert packet not in [data for _, data in answer(Nack(view, c, a, ts - 1, ts, True, (), ()))]
    assert holder.stats["nack_resends_suppressed"] == 2
    ring.now += holder.config.nack_timeout
    assert answer(Nack(view, d, None, ts - 1, ts, False, (ts,), ())) == [(d, packet)], "asked again, past it"


def test_a_nack_naming_no_one_is_answered_by_the_packets_sender_and_one_other_holder() -> None:
    """C's NACK naming no one asks for B's packet: B, its sender, and D, the first member after C other than B,
    answer privately; A holds it too but leaves it to them (a copy from every holder would each queue on C's
    link).  During a reformation every holder answers, since the sender may be the member that failed."""
    ring = Ring(4)
    _, b, c, _ = ring.pids
    ring.send(1, b"x")
    ring.flush()
    ts = next(ts for ts, slot in ring[0].ordering.q.slots.items() if slot.key == (b, 1))
    nack = Nack(ring.view.view_id, c, None, ts - 1, ts, False, (ts,), ())

    def answers(i: int) -> list[tuple[str | None, bytes]]:
        ring[i].receive_datagram(encode(nack), c, ring.now)
        return [(tx.dest, tx.data) for tx in ring[i].take_outputs().datagrams]

    assert answers(0) == []
    assert ring[0].stats["nack_resends_left_to_others"] == 1
    from_sender = answers(1)
    assert [dest for dest, _ in from_sender] == [c]
    assert answers(3) == from_sender
    ring[0].repair.answer(nack, ring.now, frozen=True)
    assert [(tx.dest, tx.data) for tx in ring[0].take_outputs().datagrams] == from_sender


def test_a_packet_is_not_multicast_again_while_our_last_copy_may_still_wait_in_our_link() -> None:
    """Our own packets take 30 ms from sending to ordering (a queue in our link): a NACK resent sooner than that
    finds the last copy still on its way, and another copy behind it would only lengthen the queue."""
    ring = Ring(3)
    a, b, c = ring.pids
    ring.send(1, b"x")
    ring.flush()
    ts = next(ts for ts, slot in ring[0].ordering.q.slots.items() if slot.key == (b, 1))
    holder = ring[0]
    for _ in range(16):
        holder.sender.data_rtt.sample(0.03)

    def nack_from(src: str) -> list[bytes]:
        nack = Nack(ring.view.view_id, src, a, ts - 1, ts, False, (ts,), ())
        holder.receive_datagram(encode(nack), src, ring.now)
        return [tx.data for tx in holder.take_outputs().datagrams if tx.dest is None]

    first = nack_from(c)
    assert len(first) == 1
    ring.now += holder.config.nack_timeout  # past half the NACK timeout, within our path's 30 ms
    assert nack_from(c) == [], "the first copy may still be in our link's queue"
    ring.now += 0.011
    assert nack_from(c) == first, "past our path's time the copy was lost: send it again"


def test_passes_go_twice_where_they_are_often_lost_and_once_where_they_get_through() -> None:
    """A member whose passes often need a resend sends each pass twice at once; while they get through, once."""

    def copies(lose_first_passes: bool) -> int:
        ring = Ring(3)
        a, b, _ = ring.pids
        lost: set[int] = set()

        def drop(src: str, dst: str, packet: object) -> bool:
            if lose_first_passes and src == a and dst == b and isinstance(packet, Ack) and packet.ts not in lost:
                lost.add(packet.ts)
                return True  # the first copy of each of A's passes to B is lost
            return False

        ring.drop = drop
        for i in range(20):
            ring.send(0, bytes([i]))
            ring.flush()
            ring.advance(0.05)
        assert ring.delivered(2) == [bytes([i]) for i in range(20)]
        sent = collections.Counter((round(t, 6), p.ts) for (s, d, p), t in zip(ring.log, ring.log_times, strict=True)
                                   if s == a and d == ring.pids[2] and isinstance(p, Ack))
        return sum(1 for n in sent.values() if n == 2)

    assert copies(lose_first_passes=False) == 0
    assert copies(lose_first_passes=True) >= 10, "after a few lost passes every pass goes twice"


def test_a_tail_nack_goes_round_the_ring_a_hole_nack_stays_with_the_ack_sender() -> None:
    """A hole NACK asks for what the newest known ACK ordered: its sender holds it.  A tail NACK asks for what came
    after that ACK, which its sender may have missed as well, so an unanswered one asks the next member; the last
    one before the stall counts as a failure names no one, so any holder answers (under heavy loss three single
    tries can all fail on a live ring)."""
    ring = Ring(4)
    _, b, c, _ = ring.pids
    engine = ring[3]
    engine.token.last_ack_sender = b
    assert [engine.repair.nack_target(t) for t in range(4)] == [b, b, b, None]
    assert [engine.repair.nack_target(t, tail=True) for t in range(4)] == [b, c, None, None]


def test_data_timer_resends_the_oldest_packet_first_then_twice_as_many_per_expiry() -> None:
    ring = Ring(3, EngineConfig(journal=True, rto_initial=0.2, fail_retries=50, fail_after=60.0))
    b = ring.pids[1]
    ring.drop = lambda src, dst, p: src == b and isinstance(p, Data)
    for i in range(10):
        ring.send(1, f"m{i}".encode())
    ring.flush()
    sent_before = ring[1].stats["data_retransmits"]
    bursts = []
    for _ in range(5):
        ring.advance(ring[1].sender.rto.deadline - ring.now + 0.001)
        sent = ring[1].stats["data_retransmits"]
        bursts.append(sent - sent_before)
        sent_before = sent
    assert bursts == [1, 2, 4, 8, 10], "one, then doubling, never more than are outstanding"
    ring.drop = lambda src, dst, p: False
    ring.advance(5.0)
    assert ring.delivered(0) == [f"m{i}".encode() for i in range(10)]


def test_data_round_trips_are_sampled_only_from_other_sites_acks() -> None:
    """A token site orders its own packets in its own ACK at once: no round trip of the ring, so no sample (they
    held the data timer at its floor while the token took longer to come round)."""
    ring = Ring(3)
    ring.send(0, b"a")  # A holds the token and orders its packet itself
    ring.flush()
    assert ring.delivered(1) == [b"a"]
    assert ring[0].stats["acks_sent"] == 1 and ring[0].sender.data_rtt.srtt is None
    other = next(i for i in (1, 2) if ring[i].token.token_site != ring.pids[i])
    ring.send(other, b"b")  # ordered by another site's ACK
    ring.flush()
    ring.advance(0.1)
    assert ring.delivered(other) == [b"a", b"b"]
    assert ring[other].stats["acks_sent"] == 0 and ring[other].sender.data_rtt.srtt is not None


def test_the_token_state_follows_a_pass_that_has_to_wait_for_a_repair() -> None:
    ring = Ring(3)
    _a, b, _c = ring.pids
    assert [ring[i].token.state for i in range(3)] == [TokenState.HOLDING, TokenState.IDLE, TokenState.IDLE]
    ring.send(0, b"x")
    assert ring[0].token.state is TokenState.PASSING, "A ordered its message and passed the token to B"
    ring.drop = lambda src, dst, p: dst == b and isinstance(p, Data)
    ring.flush()
    assert ring[1].token.state is TokenState.NAMED, "B is named but lacks the message the ACK ordered"
    assert ring[0].token.state is TokenState.PASSING, "no confirmation while B cannot accept"
    ring.drop = lambda src, dst, p: False
    ring.advance_until(lambda: ring[0].token.state is TokenState.IDLE, 1.0)
    assert ring[0].token.state is TokenState.IDLE, "B's confirmation reached A"
    assert ring[1].token.state is not TokenState.NAMED, "B got the message by its NACK and accepted"
    assert ring.delivered(1) == [b"x"]


def test_packets_our_pass_ordered_leave_the_window_once_the_next_site_shows_the_pass_arrived() -> None:
    """The next site lacks a packet our pass ordered, so it cannot accept until the repair comes; its NACK, sent
    knowing of the pass, shows that everything the pass ordered has left our link.  From then on the window
    counts only our packets not yet ordered, not those waiting for that site's ACK."""
    ring = Ring(2)
    a, b = ring.pids
    sender = ring[0].sender
    ring.drop = lambda src, dst, packet: src == a and isinstance(packet, Data) and packet.seq == 1
    for i in range(40):
        ring.send(0, bytes([i]) * 1000)
    ring.flush()
    unordered = sum(p.size for p in sender.outstanding.values())
    assert sender.window.in_flight > unordered > 0, "our pass ordered some of our packets, the rest are in flight"
    ring.advance_until(lambda: any(s == b and isinstance(p, Nack) for s, _, p in ring.log), limit=1.0)
    assert not any(s == b and isinstance(p, (Ack, Confirm)) for s, _, p in ring.log), "B accepted the token"
    assert sender.window.in_flight == sum(p.size for p in sender.outstanding.values())
    ring.drop = lambda src, dst, packet: False
    ring.advance(2.0)
    assert ring.delivered(1) == [bytes([i]) * 1000 for i in range(40)]


def test_a_member_that_lost_an_ack_gets_the_ack_again_but_not_the_data_it_holds() -> None:
    """D holds B's packets but loses the ACK that ordered them: its NACK by timestamp names what it holds
    (``Nack.held``), and the answers bring the ACK without another copy of those packets."""
    ring = Ring(4)
    b, d = ring.pids[1], ring.pids[3]

    def lost(src: str, dst: str, packet: Packet) -> bool:
        return dst == d and isinstance(packet, Ack) and any(src_ == b for src_, _, _ in packet.ids)

    ring.drop = lost
    for i in range(3):
        ring.send(1, b"m%d" % i)
    ring.flush()
    ring.drop = lambda src, dst, packet: False
    assert ring.advance_until(lambda: len(ring.delivered(3)) == 3, 5.0) is not None
    assert ring.delivered(3) == [b"m0", b"m1", b"m2"]
    nacks = [p for s, _, p in ring.log if s == d and isinstance(p, Nack)]
    assert nacks and all((b, 1, 3) in nack.held for nack in nacks), nacks
    copies = [dst for s, dst, p in ring.log if isinstance(p, Data) and p.src == b]
    assert copies.count(d) == 3, "D got each of B's packets once: the answers held back what it had"
    assert sum(ring[i].stats["nack_resends_held"] for i in range(4)) >= 3
