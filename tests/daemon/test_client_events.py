"""The client library's events: the fast Delivery constructor builds exactly what the dataclass's own does, a
delivered packet becomes one Delivery per message in one place, and every engine event is told to a program one
way (rmpd.told)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rmpd.client.events import Delivery, deliveries_of, make_delivery
from rmpd.protocol import events as engine
from rmpd.protocol.qos import QoS
from rmpd.told import TOLD, Told, ending


def test_make_delivery_equals_the_dataclass_and_stays_frozen() -> None:
    args = (b"payload", "10.0.0.1:7000", 42, QoS.k(2), 17, "10.0.0.1:7000/5", "g", 3, 1, True, b"order-42")
    fast, slow = make_delivery(*args), Delivery(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 1  # type: ignore[misc]


def test_a_packet_becomes_one_delivery_per_message_indexed_from_its_first() -> None:
    made = deliveries_of("g", "10.0.0.1:7000", 42, QoS.SAFE, 17, "10.0.0.1:7000/5", 3, [b"x", b"y"], 4, True)
    assert made == [Delivery(b"x", "10.0.0.1:7000", 42, QoS.SAFE, 17, "10.0.0.1:7000/5", "g", 3, 4, True),
                    Delivery(b"y", "10.0.0.1:7000", 42, QoS.SAFE, 17, "10.0.0.1:7000/5", "g", 3, 5, True)]


def test_every_engine_event_is_told_one_way() -> None:
    assert set(TOLD) == set(typing.get_args(engine.Event))
    assert set(TOLD.values()) == set(Told)


@pytest.mark.parametrize(("event", "rejoining", "code", "asked"), [
    (engine.Left("g", "left"), False, "left", True),
    (engine.Left("g", "partition of 1 is below the minimum of 2"), False, "left", False),
    (engine.Left("g", "cut off", rejoining=True), True, "left", False),
    (engine.JoinFailed("g", "no existing group answered"), False, "join-failed", False),
])
def test_an_end_says_whether_the_group_goes_on_and_with_which_error(event: engine.Left | engine.JoinFailed,
                                                                    rejoining: bool, code: str, asked: bool) -> None:
    end = ending(event)
    assert (end.rejoining, end.code, end.reason, end.asked) == (rejoining, code, event.reason, asked)
