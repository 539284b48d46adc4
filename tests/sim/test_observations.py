"""What the checker is told: a delivery's payloads come from the event of the same packet, whatever the order."""

from __future__ import annotations

from typing import Any

from rmpd.protocol.events import Delivered, Left
from rmpd.protocol.ids import ViewId
from rmpd.protocol.qos import QoS
from rmpd.sim.checker import InvariantChecker, SentMessage
from rmpd.sim.observations import MembershipEnded, MessageDelivered, observe_step

VIEW = ViewId("10.0.0.1:7000", 1)
A, B = "10.0.0.1:7000", "10.0.0.2:7000"


def deliver_record(src: str, seq: int, qos: str, ts: int | None, **extra: Any) -> dict[str, Any]:
    return {"v": 1, "node": B, "group": "sim", "event": "deliver", "view": str(VIEW), "ts": ts, "src": src,
            "seq": seq, "qos": qos, "mono": 1.0, "holders": 1, "need": 1, "order_view": str(VIEW), **extra}


def delivered(src: str, seq: int, qos: QoS, ts: int | None, payloads: tuple[bytes, ...]) -> Delivered:
    return Delivered("sim", src, seq, qos, ts, VIEW, None, payloads)


def test_each_delivery_gets_the_payloads_of_its_own_packet() -> None:
    records = [deliver_record(A, 1, "total", 2), deliver_record(A, 1, "unreliable", None),
               deliver_record(B, 4, "source", None, parts=0)]
    events = [delivered(A, 1, QoS.parse("unreliable"), None, (b"u",)), Left("sim", "left"),
              delivered(A, 1, QoS.TOTAL, 2, (b"t1", b"t2"))]
    seen = observe_step(B, records, events)
    assert [(o.seq, o.qos.name(), o.payloads) for o in seen if isinstance(o, MessageDelivered)] == [
        (1, "total", (b"t1", b"t2")), (1, "unreliable", (b"u",)), (4, "source", ())]
    assert seen[-1] == MembershipEnded(B, "left")


def test_a_delivery_journaled_without_its_messages_is_an_integrity_violation() -> None:
    checker = InvariantChecker()
    checker.on_send(SentMessage(A, 1, QoS.TOTAL, b"hello"))
    checker.on_send(SentMessage(A, 2, QoS.TOTAL, b"world"))
    steps = [([deliver_record(A, 1, "total", 2)], [delivered(A, 1, QoS.TOTAL, 2, (b"hello",))]),
             ([deliver_record(A, 2, "total", 3)], [])]
    for records, events in steps:
        for observation in observe_step(B, records, events):
            checker.observe(observation)
    assert [v.invariant for v in checker.violations] == ["integrity"]
    assert f"{A}#2" in checker.violations[0].detail
