"""Exactly-once in the simulator (``rmp sim --keys``): the applications key their totally ordered messages and resend
what was not settled, and the checker's ``exactly-once`` invariant holds: no key at two positions of the order, no
member delivering a key twice, every key delivered somewhere."""

from __future__ import annotations

from typing import Any

from rmpd.protocol.events import Delivered
from rmpd.protocol.ids import ViewId
from rmpd.protocol.qos import QoS
from rmpd.sim.checker import InvariantChecker, SentMessage
from rmpd.sim.observations import observe_step
from rmpd.sim.runner import SimConfig, run_seed

VIEW = ViewId("10.0.0.1:7000", 1)
A, B, C = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"
TOTAL = QoS.TOTAL

FAULTS = SimConfig(members=5, senders=3, messages=60, loss=0.1, crash=1, partition=True, restarts=1, joins=1,
                   qos="mixed", keys=True)
"""Crashes (on a new process ID and on the same one), a partition, a joiner taking the key table, every QoS."""


def test_keyed_sends_under_crashes_and_a_partition_deliver_every_key_once() -> None:
    resent = already = tables = 0
    for seed in (2, 3, 5, 20):
        r = run_seed(FAULTS, seed)
        assert r.violations == [], (seed, r.violations)
        assert r.liveness and r.quiescent and r.one_view, seed
        assert 0 < r.keys_delivered == r.keys_sent, seed
        resent += r.keys_resent
        already += r.keys_already_delivered
        tables += r.stats.get("key_tables_sent", 0)
    # Copies were sent again after Undelivered or a crash (seeds 2 and 3 deliver keys only their resends carried),
    # some of them found delivered already (seed 20), and joiners took the table.
    assert resent > 0 and already > 0 and tables > 0


def test_a_group_founded_again_starts_from_the_longest_history_any_process_kept() -> None:
    """Every membership of the group ends and the group is founded again.  In seed 10 the lowest process ID asking
    kept the table of a shorter history than others asking (10 keys against 18), in seed 141 by one packet; in
    seed 104 a restarted process, holding no table, would found while a process that kept 39 keys asks.  Each
    time the group must start from the longest history, or it delivers again keys its programs resend."""
    for seed in (10, 104, 141):
        r = run_seed(FAULTS, seed)
        assert r.violations == [], (seed, r.violations)
        assert r.liveness and r.quiescent and r.one_view, seed
        assert r.keys_delivered == r.keys_sent, seed


def test_a_process_that_kept_a_table_brings_it_into_the_group_it_joins() -> None:
    """Two views of the group lived at once and delivered keys of their own (a process founded alone while a
    partition hid the group); when one view's members join the other, or a process whose fellows left its view
    before delivering what it delivered joins again, the table it kept is merged into the group's before any
    keyed delivery, so the keys only it had seen are not delivered again when resent.  Seed 292 delivers a key
    twice when the joiner does not bring its table."""
    for seed in (292,):
        r = run_seed(FAULTS, seed)
        assert r.violations == [], (seed, r.violations)
        assert r.liveness and r.quiescent and r.one_view, seed
        assert r.keys_delivered == r.keys_sent, seed
        assert r.stats.get("key_tables_brought", 0) > 0, seed


def test_keys_an_application_gave_up_by_leaving_are_not_required_delivered() -> None:
    """An application that leaves the group stops resending what was not settled: those keys may be delivered
    nowhere (or, ordered before it left, somewhere), every other key is delivered, and the run still holds
    exactly-once (this seed's leaver left with eighteen keys unsettled, none of which was delivered)."""
    config = SimConfig(members=7, senders=4, messages=200, loss=0.1, crash=2, partition=True, joins=2, leaves=1,
                       locks=True, calls=5, qos="mixed", keys=True, congestion="delay")
    r = run_seed(config, 34)
    assert r.keys_abandoned > 0 and r.keys_sent - r.keys_abandoned <= r.keys_delivered <= r.keys_sent
    assert r.violations == [] and r.liveness and r.quiescent


def test_a_key_ordered_only_by_a_cut_off_minority_is_resent_when_the_membership_ends() -> None:
    """A keyed message a minority's token site ordered but no majority held is never delivered; the engine's
    UndeliveredSends names only what was not ordered, so the application takes everything its ended membership did
    not deliver as undelivered (as the daemon and the node tell a program) and sends it again."""
    for seed in (1, 7):
        r = run_seed(FAULTS, seed)
        assert r.keys_delivered == r.keys_sent, (seed, r.violations)


# ------------------------------------------------------------------------------------------------------------------
# The checker, fed what processes journal and hand over


def deliver_record(node: str, src: str, seq: int, ts: int, keys: list[bytes], **extra: Any) -> dict[str, Any]:
    return {"v": 1, "node": node, "group": "sim", "event": "deliver", "view": str(VIEW), "ts": ts, "src": src,
            "seq": seq, "qos": "total", "mono": 1.0, "holders": 3, "need": 1, "order_view": str(VIEW),
            "keys": [key.hex() for key in keys], **({"parts": len(keys)} if len(keys) != 1 else {}), **extra}


def deliver(checker: InvariantChecker, node: str, src: str, seq: int, ts: int,
            messages: list[tuple[bytes, bytes]], **extra: Any) -> None:
    """``node`` delivers packet ``src``#``seq`` at ``ts``: its (key, payload) messages, as journaled and handed over."""
    keys = [key for key, _ in messages]
    event = Delivered("sim", src, seq, TOTAL, ts, VIEW, None, tuple(p for _, p in messages), keys=tuple(keys))
    for observation in observe_step(node, [deliver_record(node, src, seq, ts, keys, **extra)],
                                     [event] if messages else []):
        checker.observe(observation)


def sent(checker: InvariantChecker, src: str, seq: int, key: bytes, payload: bytes) -> None:
    checker.on_send(SentMessage(src, seq, TOTAL, payload, (key,)))


def exactly_once(checker: InvariantChecker) -> list[str]:
    return [v.detail for v in checker.violations if v.invariant == "exactly-once"]


def test_a_key_at_two_positions_of_the_order_is_caught() -> None:
    """The same key sent twice (a resend) and both copies delivered, each by a different member: no member delivered
    it twice, but the group's order holds it at two positions."""
    checker = InvariantChecker()
    sent(checker, A, 1, b"order-42", b"first")
    sent(checker, A, 2, b"order-42", b"again")
    deliver(checker, B, A, 1, 5, [(b"order-42", b"first")])
    deliver(checker, C, A, 2, 6, [(b"order-42", b"again")])
    assert [v.invariant for v in checker.violations] == ["exactly-once"]
    detail = exactly_once(checker)[0]
    assert "b'order-42' at two positions" in detail and "ts 5 #0" in detail and "ts 6 #0" in detail


def test_a_member_delivering_a_key_twice_is_caught() -> None:
    checker = InvariantChecker()
    sent(checker, A, 1, b"order-42", b"first")
    sent(checker, A, 2, b"order-42", b"again")
    deliver(checker, B, A, 1, 5, [(b"order-42", b"first")])
    deliver(checker, B, A, 2, 6, [(b"order-42", b"again")])
    assert any(f"{B} delivered key b'order-42' twice" in detail for detail in exactly_once(checker))


def test_a_copy_left_out_as_delivered_already_is_no_violation_and_owed_to_nobody() -> None:
    """The resend of a delivered key is dropped at every member (the record names it in ``duplicates``): the packet
    delivers the rest of its messages, or nothing at all."""
    checker = InvariantChecker()
    sent(checker, A, 1, b"k1", b"first")
    sent(checker, A, 2, b"k1", b"again")
    sent(checker, A, 2, b"k2", b"new")
    sent(checker, A, 3, b"k1", b"once more")
    for node in (B, C):
        deliver(checker, node, A, 1, 5, [(b"k1", b"first")])
        deliver(checker, node, A, 2, 6, [(b"k2", b"new")], duplicates=[b"k1".hex()])
        deliver(checker, node, A, 3, 7, [], duplicates=[b"k1".hex()])
    assert checker.violations == []
    assert checker.exactly_once.keys_delivered == 2
    assert not checker.exactly_once.owed(A, 2, b"k1") and checker.exactly_once.owed(A, 2, b"k2")
    assert not checker.exactly_once.owed(A, 3, b"k1")


def test_a_delivery_that_drops_a_copy_the_group_had_not_delivered_is_an_integrity_violation() -> None:
    """The keys delivered must be the keys sent less those named as left out."""
    checker = InvariantChecker()
    sent(checker, A, 1, b"k1", b"first")
    sent(checker, A, 1, b"k2", b"second")
    deliver(checker, B, A, 1, 5, [(b"k2", b"second")])
    assert [v.invariant for v in checker.violations] == ["integrity"]
