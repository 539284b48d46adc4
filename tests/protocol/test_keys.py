"""Exactly-once sends in the engine: a key is delivered at most once in the group's order, at every member, and a
joiner takes the group's key table before it decides a keyed delivery (rmpd.protocol.keys)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import AlreadyDelivered, Delivered, Left, ViewInstalled
from rmpd.protocol.fieldkinds import MAX_KEY, DecodeError, Keyed, well_formed_keys
from rmpd.protocol.ids import ViewId
from rmpd.protocol.keys import KeyRecord, KeyTable
from rmpd.protocol.limits import BadKey
from rmpd.protocol.packets import Data, decode, encode
from rmpd.protocol.qos import QoS

from .harness import Net


def group_of(n: int, config: EngineConfig | None = None, joined: int | None = None) -> Net:
    """``joined`` of ``n`` processes (all by default) in group ``g``, joined one after the other."""
    net = Net(n, config)
    net.do(0, lambda p, now: p.create("g", now))
    for i in range(1, n if joined is None else joined):
        net.do(i, lambda p, now: p.join("g", now))
        net.advance(0.5)
    return net


def send(net: Net, i: int, payloads: list[bytes], keys: list[bytes] | None, qos: QoS = QoS.TOTAL) -> None:
    net.do(i, lambda p, now: p.send_batch("g", payloads, qos, now, keys=keys))


def keyed(net: Net, i: int) -> list[tuple[bytes | None, bytes]]:
    """(key, payload) of every message member ``i`` delivered, in order."""
    return [(d.key, d.payload) for d in net.deliveries(i)]


def test_a_key_sent_again_is_delivered_once_everywhere_and_its_sender_is_told_where() -> None:
    net = group_of(3)
    send(net, 1, [b"first"], [b"order-42"])
    net.advance(0.5)
    send(net, 1, [b"again"], [b"order-42"])
    send(net, 2, [b"other sender"], [b"order-42"])
    send(net, 2, [b"plain"], None)
    net.advance(0.5)
    for i in range(3):
        assert keyed(net, i) == [(b"order-42", b"first"), (None, b"plain")]
    first = next(e for e in net.events[net.pids[0]] if isinstance(e, Delivered) and e.keys)
    told_1 = net.of_type(1, AlreadyDelivered)
    told_2 = net.of_type(2, AlreadyDelivered)
    assert [(t.key, t.ts, t.view) for t in told_1 + told_2] == [(b"order-42", first.ts, first.view)] * 2
    assert not net.of_type(0, AlreadyDelivered)  # only the copy's own sender is told


def test_a_keyed_message_is_delivered_once_a_majority_holds_it() -> None:
    """A sender that sees its keyed message delivered stops resending it: that delivery must survive the sender's
    being cut off, so keyed messages below MAJORITY are delivered as MAJORITY (safe ones stay safe)."""
    net = group_of(3)
    send(net, 0, [b"t"], [b"k1"], QoS.TOTAL)
    send(net, 0, [b"r"], [b"k2"], QoS.k(1))
    send(net, 0, [b"s"], [b"k3"], QoS.SAFE)
    net.advance(0.5)
    assert [(d.key, d.qos) for d in net.deliveries(1)] == [(b"k1", QoS.MAJORITY), (b"k2", QoS.MAJORITY),
                                                           (b"k3", QoS.SAFE)]


def test_a_packed_batch_keeps_the_first_copy_of_each_key() -> None:
    net = group_of(2)
    send(net, 0, [b"a1", b"b1", b"a2", b"c1"], [b"a", b"b", b"a", b"c"])
    net.advance(0.5)
    for i in range(2):
        assert keyed(net, i) == [(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1")]
    assert [t.key for t in net.of_type(0, AlreadyDelivered)] == [b"a"]
    # The sender is told of the copy left out before the packet's delivery, so what it still holds of the packet
    # when the delivery comes is what was delivered (runtime.adapter.OwnMessages relies on it).
    kinds = [type(e) for e in net.events[net.pids[0]] if isinstance(e, AlreadyDelivered | Delivered)]
    assert kinds == [AlreadyDelivered, Delivered]


def test_a_large_keyed_message_travels_as_fragments_and_is_kept_once() -> None:
    net = group_of(2, EngineConfig(journal=True, max_packet=2048, min_packet=1024))
    big = bytes(range(256)) * 40
    send(net, 0, [big], [b"big"])
    net.advance(0.5)
    send(net, 1, [big], [b"big"])
    net.advance(0.5)
    for i in range(2):
        assert keyed(net, i) == [(b"big", big)]
    assert [t.key for t in net.of_type(1, AlreadyDelivered)] == [b"big"]


def test_keys_the_group_cannot_keep_are_refused_before_anything_is_sent() -> None:
    net = group_of(2)
    for qos in (QoS.SOURCE, QoS.UNORDERED, QoS.UNRELIABLE):
        with pytest.raises(BadKey, match="total order"):
            send(net, 0, [b"x"], [b"k"], qos)
    with pytest.raises(BadKey, match="1 to 255"):
        send(net, 0, [b"x"], [b"k" * 256])
    with pytest.raises(BadKey, match="1 to 255"):
        send(net, 0, [b"x"], [b""])
    with pytest.raises(BadKey, match="one key per message"):
        send(net, 0, [b"x", b"y"], [b"k"])
    net.advance(0.5)
    assert net.delivered(1) == []
    send(net, 0, [b"x"], [b"k"], QoS.SAFE)
    net.advance(0.5)
    assert keyed(net, 1) == [(b"k", b"x")]


def test_a_joiner_takes_the_table_and_filters_a_key_delivered_before_it_joined() -> None:
    net = group_of(3, joined=2)
    send(net, 0, [b"before"], [b"order-1"])
    net.advance(0.5)
    net.do(2, lambda p, now: p.join("g", now))
    net.advance(0.5)
    assert net[2].view("g") is not None and net.pids[2] in net[2].view("g").members
    send(net, 2, [b"resent by the joiner"], [b"order-1"])
    send(net, 1, [b"new"], [b"order-2"])
    net.advance(0.5)
    assert keyed(net, 0) == keyed(net, 1) == [(b"order-1", b"before"), (b"order-2", b"new")]
    assert keyed(net, 2) == [(b"order-2", b"new")]
    assert [t.key for t in net.of_type(2, AlreadyDelivered)] == [b"order-1"]
    assert net[0].counters()["key_tables_sent"] == 1


def test_a_joiner_delivers_no_keyed_message_before_it_holds_the_table() -> None:
    """The table's pieces are lost until later: the joiner holds back keyed deliveries (never deciding without the
    table), delivers what carries no key, and catches up once the table arrives."""
    net = group_of(3, joined=2)
    send(net, 0, [b"before"], [b"order-1"])
    net.advance(0.5)
    losing = True
    net.drop = lambda src, dst, p: losing and isinstance(p, Data) and p.handler == 7 and dst == net.pids[2]
    net.do(2, lambda p, now: p.join("g", now))
    net.advance(0.5)
    send(net, 1, [b"again"], [b"order-1"])
    send(net, 1, [b"plain"], None)
    net.advance(0.3)
    assert keyed(net, 2) == []  # "plain" comes after the keyed copy in the order: it waits too
    losing = False
    net.advance(3.0)
    assert keyed(net, 2) == [(None, b"plain")]
    assert keyed(net, 0) == [(b"order-1", b"before"), (None, b"plain")]


def test_a_group_without_keys_hands_no_table_to_joiners() -> None:
    net = group_of(3)
    send(net, 0, [b"x"], None)
    net.advance(0.5)
    assert all(not net[i].counters()["key_tables_sent"] for i in range(3))
    assert net.delivered(2) == [b"x"]


def test_the_table_forgets_by_count_alike_at_every_member() -> None:
    net = group_of(2, EngineConfig(journal=True, key_retention_count=2))
    for key in (b"a", b"b", b"c"):
        send(net, 0, [key], [key])
        net.advance(0.2)
    send(net, 1, [b"a again"], [b"a"])  # forgotten: delivered again
    send(net, 1, [b"c again"], [b"c"])  # kept: not
    net.advance(0.5)
    for i in range(2):
        assert keyed(net, i) == [(b"a", b"a"), (b"b", b"b"), (b"c", b"c"), (b"a", b"a again")]


def test_keyed_bodies_round_trip_and_hostile_ones_are_refused() -> None:
    view = ViewId("10.0.0.1:7000", 3)
    for body in (Keyed("k", 5, (b"x",), b"m"), Keyed("k", 5, (b"x", b"y"), (b"m", b"n"))):
        packet = Data(view, "10.0.0.1:7000", 1, QoS.TOTAL, None, body)
        assert decode(encode(packet)) == packet
    too_many = encode(Data(view, "10.0.0.1:7000", 1, QoS.TOTAL, None, Keyed("k", 5, (b"x", b"y", b"z"),
                                                                               (b"m", b"n"))))
    with pytest.raises(DecodeError, match="one key per"):
        decode(too_many)
    too_long = encode(Data(view, "10.0.0.1:7000", 1, QoS.TOTAL, None, Keyed("k", 5, (b"x" * 256,), b"m")))
    with pytest.raises(DecodeError, match="1 to 255"):
        decode(too_long)


@given(st.lists(st.one_of(st.binary(min_size=0, max_size=300), st.text(max_size=3), st.integers(), st.none(),
                         st.binary(max_size=3).map(bytearray)), max_size=6))
@example([b"k" * 255, b"k"]).via("the longest key")
@example([b"k", b"k" * 256]).via("one byte too long")
@example([b"k", b""]).via("empty")
def test_well_formed_keys_are_bytes_of_1_to_max_key_bytes(keys: list[object]) -> None:
    """The rule every side checks (engine, packet decoding, local API, client) holds as it says, however it is
    computed."""
    expected = all(type(key) is bytes and 0 < len(key) <= MAX_KEY for key in keys)
    assert well_formed_keys(keys) is expected
    assert well_formed_keys(tuple(keys)) is expected


def test_a_joiner_whose_table_never_comes_joins_again_and_takes_it_then() -> None:
    """The member that would send the table fails as the joiner is admitted: the joiner does not decide keyed
    deliveries without the table, its membership ends after a while, and it joins again and takes it then."""
    net = group_of(3, joined=2)
    send(net, 0, [b"before"], [b"order-1"])
    net.advance(0.5)
    crashed = []

    def crash_as_the_table_leaves(src: str, dst: str, packet: object) -> bool:
        if isinstance(packet, Data) and packet.handler == 7 and src == net.pids[0]:
            crashed.append(True)
        return bool(crashed) and net.pids[0] in (src, dst)

    net.drop = crash_as_the_table_leaves
    net.do(2, lambda p, now: p.join("g", now))
    net.advance(0.5)
    send(net, 1, [b"again"], [b"order-1"])
    send(net, 1, [b"new"], [b"order-2"])
    assert net.advance_until(lambda: bool(net.of_type(2, Left)), limit=30.0) is not None
    assert [(left.reason, left.rejoining) for left in net.of_type(2, Left)] == [
        ("the group's key table did not arrive", True)]
    assert net.advance_until(lambda: net.pids[2] in (net[2].view("g") or ()), limit=10.0) is not None
    send(net, 2, [b"after"], [b"order-2"])
    send(net, 2, [b"fresh"], [b"order-3"])
    net.advance(1.0)
    assert keyed(net, 2) == [(b"order-3", b"fresh")]
    assert keyed(net, 1) == [(b"order-1", b"before"), (b"order-2", b"new"), (b"order-3", b"fresh")]
    assert [t.key for t in net.of_type(2, AlreadyDelivered)] == [b"order-2"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), min_size=1, max_size=3),
                          st.integers(0, 5000)), max_size=40), st.integers(1, 5), st.integers(100, 3000))
def test_the_table_keeps_what_a_plain_model_keeps_and_hands_it_over_whole(
        packets: list[tuple[list[bytes], int]], count: int, retention_ms: int) -> None:
    """The table decides like the rule it states (a packet's keys: each kept unless kept already or earlier in the
    packet, and a copy left out told where its key was delivered first; forgotten a packet at a time, oldest first,
    while more than ``count`` are kept or the packet is past the retention in the group's time), and a joiner that
    takes its pieces holds the same table."""
    table = KeyTable(count, retention_ms)
    view = ViewId("10.0.0.1:7000", 1)
    model: list[tuple[list[bytes], int, int]] = []  # per packet: (its keys kept, ts, stamp), oldest first
    clock = 0
    for ts, (keys, stamp) in enumerate(packets, 1):
        kept_now = {k: at for group, at, _ in model for k in group}
        new: list[bytes] = []
        expected_repeats = []
        for index, key in enumerate(keys):
            if key in kept_now:
                expected_repeats.append((index, kept_now[key]))
            elif key in new:
                expected_repeats.append((index, ts))
            else:
                new.append(key)
        assert [(index, first.ts) for index, first in table.deliver(tuple(keys), ts, view, stamp)] == expected_repeats
        if new:
            model.append((new, ts, stamp))
        clock = max(clock, stamp)
        while model and (sum(len(g) for g, _, _ in model) > count or model[0][2] < clock - retention_ms):
            model.pop(0)
        assert [(k, r.stamp) for k, r in table] == [(k, stamp) for group, _, stamp in model for k in group]
        assert len(table) == sum(len(g) for g, _, _ in model)
    joiner = KeyTable(count, retention_ms, awaiting=ViewId("10.0.0.2:7000", 9))
    assert not joiner.take_pieces("10.0.0.1:7000", tuple(table.pieces_for(ViewId("10.0.0.3:7000", 9))))
    assert joiner.take_pieces("10.0.0.1:7000", tuple(reversed(table.pieces_for(ViewId("10.0.0.2:7000", 9)))))
    assert list(joiner) == list(table) and joiner.clock == table.clock and joiner.ready
    # Its place in the group's history comes with it: a keyed packet delivered is one step, copies or not.
    assert joiner.position == table.position == len(packets)
    assert table.for_founder().position == table.position
    # The joiner forgets as the table does from here on.
    for ts, (keys, stamp) in enumerate(packets, 100):
        assert table.deliver(tuple(keys), ts, view, stamp) == joiner.deliver(tuple(keys), ts, view, stamp)
        assert list(joiner) == list(table)


def test_a_table_larger_than_a_piece_arrives_in_pieces_and_hostile_pieces_are_counted() -> None:
    table = KeyTable(100_000, 10**9)
    view = ViewId("10.0.0.1:7000", 1)
    for n in range(2000):
        table.deliver((f"order-{n}".encode(),), n, view, n)
    target = ViewId("10.0.0.2:7000", 9)
    pieces = table.pieces_for(target)
    assert len(pieces) > 3
    joiner = KeyTable(100_000, 10**9, awaiting=target)
    assert not joiner.take_pieces("10.0.0.1:7000", (b"\xc1", b"not msgpack", *pieces[:-1]))
    assert joiner.refused == 2 and not joiner.ready
    assert joiner.take_pieces("10.0.0.1:7000", (pieces[-1],))
    assert len(joiner) == 2000 and joiner.deliver((b"order-7", b"new"), 9999, view, 0) == [(0, KeyRecord(7, view, 7))]


def test_keyed_messages_packed_over_many_batches_keep_each_packet_within_its_limit() -> None:
    """A packet that already holds keyed messages counts their keys when later batches pack into it."""
    net = group_of(2, EngineConfig(journal=True, max_packet=16384, min_packet=16384, initial_window=1024))
    sizes = []
    net.drop = lambda src, dst, p: sizes.append(len(encode(p))) or False
    for batch in range(200):
        send(net, 0, [b"p" * 20] * 10, [b"key-%06d-%06d" % (batch, n) for n in range(10)])
    net.advance(2.0)
    assert len(net.deliveries(1)) == 2000
    assert max(sizes) <= 16384 + 512


def test_joiners_whose_table_holder_crashed_join_again_and_then_deliver_each_key_once() -> None:
    """X and Z are admitted together; the table reaches Z only, and its sender crashes.  The reformed view puts X
    first, so X, itself still waiting, is the member that owes the table to Y, admitted next.  Neither decides a
    keyed delivery without the table: both end their memberships, join again, take the table from Z, and from then
    on a key is delivered once everywhere and a copy is dropped."""
    net = Net(4)
    x, a, z, y = net.pids

    def members(i: int) -> tuple[str, ...]:
        view = net[i].view("g")
        return view.members if view is not None else ()

    net.do(1, lambda p, now: p.create("g", now))
    net.advance(0.5)
    send(net, 1, [b"before"], [b"order-1"])
    net.advance(0.5)
    net.drop = lambda src, dst, p: isinstance(p, Data) and p.handler == 7 and dst == x
    net.do(0, lambda p, now: p.join("g", now))
    net.do(2, lambda p, now: p.join("g", now))
    net.advance(0.5)
    net.down.add(a)
    assert net.advance_until(lambda: members(0) == (x, z), limit=20.0) is not None
    net.do(3, lambda p, now: p.join("g", now))
    assert net.advance_until(lambda: y in members(0), limit=10.0) is not None
    net.drop = lambda src, dst, p: False
    send(net, 2, [b"new"], [b"order-2"])
    assert net.advance_until(lambda: all(net.of_type(i, Left) for i in (0, 3)), limit=30.0) is not None
    reasons = [left.reason for i in (0, 3) for left in net.of_type(i, Left)]
    assert reasons == ["the group's key table did not arrive"] * 2
    assert net.advance_until(lambda: all(set(members(i)) == {x, y, z} for i in (0, 2, 3)),
                             limit=30.0) is not None
    send(net, 3, [b"again"], [b"order-2"])
    send(net, 0, [b"after"], [b"order-3"])
    net.advance(2.0)
    assert keyed(net, 2) == [(b"order-2", b"new"), (b"order-3", b"after")]
    assert keyed(net, 0) == keyed(net, 3) == [(b"order-3", b"after")]
    assert [t.key for t in net.of_type(3, AlreadyDelivered)] == [b"order-2"]


def test_a_group_founded_again_by_a_member_that_held_its_table_keeps_the_keys_delivered() -> None:
    """Every membership of the group ends with both processes running (the other member unreachable, the one left
    below the minimum partition); the first to rejoin finds nobody and founds the group again.  It keeps the keys
    the group delivered, and the other, joining it, takes them: a copy resent then is left out, not delivered
    again."""
    net = Net(2)
    a, b = net.pids

    def members(i: int) -> set[str]:
        view = net[i].view("g")
        return set(view.members) if view is not None else set()

    net.do(0, lambda p, now: p.create("g", now, min_partition=2))
    net.do(1, lambda p, now: p.join("g", now))
    net.advance(0.5)
    send(net, 0, [b"first"], [b"order-1"])
    net.advance(0.5)
    assert keyed(net, 0) == keyed(net, 1) == [(b"order-1", b"first")]
    net.down.add(b)
    assert net.advance_until(lambda: bool(net.of_type(0, Left)), limit=30.0) is not None
    assert [left.rejoining for left in net.of_type(0, Left)] == [True]
    net.down.discard(b)
    assert net.advance_until(lambda: members(0) == members(1) == {a, b}, limit=60.0) is not None
    founded = [e.view for e in net.events[a] if isinstance(e, ViewInstalled) and e.members == (a,)]
    assert len(founded) == 2, "the group was founded again"
    send(net, 1, [b"again"], [b"order-1"])
    send(net, 0, [b"new"], [b"order-2"])
    net.advance(2.0)
    assert keyed(net, 0) == keyed(net, 1) == [(b"order-1", b"first"), (b"order-2", b"new")]
    assert [t.key for t in net.of_type(1, AlreadyDelivered)] == [b"order-1"]


def test_a_member_merging_in_brings_the_keys_its_side_delivered() -> None:
    """A partition splits a group of two (minimum partition 1: both sides go on) and each side delivers a key of
    its own.  When it heals, one side's member merges into the other's view, bringing the table it kept; every
    member merges it before deciding a keyed delivery, so a copy of either side's key, resent by either member,
    is left out everywhere."""
    net = group_of(2)
    a, b = net.pids
    send(net, 0, [b"both"], [b"k-both"])
    net.advance(0.5)
    cut = True
    net.drop = lambda src, dst, p: cut and {src, dst} == {a, b}
    alone = net.advance_until(lambda: all(net[i].view("g") is not None and net[i].view("g").members == (net.pids[i],)
                                          for i in (0, 1)), limit=60)
    assert alone is not None
    send(net, 0, [b"side 0"], [b"k-0"])
    send(net, 1, [b"side 1"], [b"k-1"])
    net.advance(1.0)
    cut = False
    merged = net.advance_until(lambda: all(net[i].view("g") is not None and len(net[i].view("g").members) == 2
                                           for i in (0, 1)), limit=120)
    assert merged is not None
    net.advance(2.0)
    before = [len(keyed(net, i)) for i in (0, 1)]
    send(net, 0, [b"again 1"], [b"k-1"])
    send(net, 1, [b"again 0"], [b"k-0"])
    send(net, 0, [b"new"], [b"k-new"])
    net.advance(2.0)
    for i in (0, 1):
        assert keyed(net, i)[before[i]:] == [(b"k-new", b"new")]
    assert [t.key for t in net.of_type(0, AlreadyDelivered)] == [b"k-1"]
    assert [t.key for t in net.of_type(1, AlreadyDelivered)] == [b"k-0"]
    assert sum(net[i].counters()["key_tables_brought"] for i in (0, 1)) == 1


def test_a_brought_table_is_merged_with_its_last_piece_and_only_from_the_member_expected() -> None:
    """A table a member brought arrives in pieces and is merged with the last of them.  Pieces from a member
    nobody waits for, from before its admission, or not well formed change nothing; merging keeps the keys the
    group lacked with their own places, twice changes nothing, and a member gone before its table came is no
    longer waited for."""
    view, other_view = ViewId("10.0.0.1:7000", 1), ViewId("10.0.0.9:7000", 4)
    group = KeyTable(100_000, 10**9)
    group.deliver((b"shared", b"group-only"), 1, view, 10)
    brought = KeyTable(100_000, 10**9)
    for n in range(2000):
        brought.deliver((f"side-{n}".encode(), b"shared") if n == 0 else (f"side-{n}".encode(),), n, other_view, n)
    pieces = brought.brought_pieces()
    assert len(pieces) > 2
    member = "10.0.0.9:7000"
    group.expect(member, after_seq=40)
    assert not group.take_brought(member, 41, tuple(pieces[:1]))
    assert not group.take_brought("10.0.0.5:7000", 7, tuple(pieces[1:]))  # nobody waits for this member's
    assert not group.take_brought(member, 40, tuple(pieces[1:]))  # sent before its admission
    assert len(group) == 2 and group.merging
    assert group.take_brought(member, 42, (b"not msgpack", *pieces[1:]))
    assert not group.merging and len(group) == 2 + 2000 and group.position == 2000
    assert group.deliver((b"side-7", b"shared", b"new"), 5, view, 20) == [(0, KeyRecord(7, other_view, 7)),
                                                                          (1, KeyRecord(1, view, 10))]
    kept = list(group)
    group.expect(member, after_seq=50)
    assert group.take_brought(member, 51, tuple(pieces)) and list(group) == kept
    group.expect("10.0.0.6:7000", after_seq=0)
    group.keep_expecting(("10.0.0.1:7000",))
    assert not group.merging
