"""The client library's fast Delivery constructor builds exactly what the dataclass's own does."""

from __future__ import annotations

import dataclasses

import pytest

from rmpd.client.events import Delivery, make_delivery
from rmpd.protocol.qos import QoS


def test_make_delivery_equals_the_dataclass_and_stays_frozen() -> None:
    args = (b"payload", "10.0.0.1:7000", 42, QoS.k(2), 17, "10.0.0.1:7000/5", "g", 3, 1, True)
    fast, slow = make_delivery(*args), Delivery(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 1  # type: ignore[misc]
