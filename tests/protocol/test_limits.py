"""Arguments the wire cannot carry are refused where they enter the engine, before anything is kept.

Accepted first and encoded later, such an argument failed inside a retransmission timer or a receive loop: in
the daemon that stopped the process, and with it every message it had accepted.
"""

from __future__ import annotations

import random

import pytest

from rmpd.protocol.config import EngineConfig
from rmpd.protocol.events import LockResult
from rmpd.protocol.ids import ViewId
from rmpd.protocol.limits import BadArgument, MessageTooLarge
from rmpd.protocol.packets import Data, decode, encode
from rmpd.protocol.process import RmpProcess
from rmpd.protocol.qos import MAX_RESILIENCE, QoS
from rmpd.protocol.view import HANDLER_LOCKS, LIBRARY_HANDLER, MAX_LOCK

from .harness import Ring
from .test_membership import group_of


def test_k_is_bounded_so_that_every_qos_that_can_be_made_can_be_encoded() -> None:
    largest = QoS.k(MAX_RESILIENCE)
    packet = Data(ViewId("10.0.0.1:7000", 1), "10.0.0.1:7000", 1, largest, None, b"x")
    assert decode(encode(packet)).qos == largest
    for text in ("k" + "9" * 30, f"k{MAX_RESILIENCE + 1}", "k0"):
        with pytest.raises(ValueError, match="K"):
            QoS.parse(text)
    with pytest.raises(ValueError):
        QoS.from_code(4 | (MAX_RESILIENCE + 1) << 3)


def test_a_send_naming_a_handler_out_of_range_is_refused_before_it_takes_a_sequence_number() -> None:
    ring = Ring(2)
    for handler in (LIBRARY_HANDLER + 1, -1, 2**70):
        with pytest.raises(BadArgument, match="handler"):
            ring[0].send(b"x", QoS.TOTAL, ring.now, handler=handler)
    assert ring[0].sender.next_seq == 1 and not ring[0].sender.send_queue and not ring[0].sender.outstanding
    assert ring.send(0, b"fits") == 1


def test_locks_past_the_groups_last_are_refused_before_a_request_is_made() -> None:
    net = group_of(2)
    for lock in (MAX_LOCK + 1, -1, 2**31):
        for op in ("lock", "unlock"):
            with pytest.raises(BadArgument, match="lock"):
                net.do(1, lambda p, now, op=op, lock=lock: getattr(p, op)("g", lock, now))
    net.do(1, lambda p, now: p.lock("g", MAX_LOCK, now))
    net.advance(2.0)
    assert [(r.lock, r.op, r.granted) for r in net.of_type(1, LockResult)] == [(MAX_LOCK, "lock", True)]


def test_a_call_or_a_reply_over_one_packet_is_refused_and_nothing_is_kept_to_resend() -> None:
    config = EngineConfig(max_packet=1000)
    process = RmpProcess(pid="10.0.1.1:7000", config=config, rng=random.Random(1), now=0.0,
                         wall_ms=1_700_000_000_000)
    with pytest.raises(MessageTooLarge, match="one packet"):
        process.call("g", b"x" * 1001, 0.0)
    with pytest.raises(BadArgument, match="handler"):
        process.call("g", b"x", 0.0, handler=HANDLER_LOCKS)
    with pytest.raises(BadArgument, match="timeout"):
        process.call("g", b"x", 0.0, timeout=0)
    assert not process.caller.calls and process.caller.get_timer() is None
    assert not process.take_outputs().datagrams
    process.call("g", b"x" * 1000, 0.0)
    assert len(process.caller.calls) == 1

    ring = Ring(2, config)
    with pytest.raises(MessageTooLarge, match="a reply must fit one packet"):
        ring[0].reply("10.0.9.9:7000", 0, 1, b"x" * 1001, ring.now)
