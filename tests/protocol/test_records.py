"""The generated constructors build the same frozen objects as the dataclasses' own __init__."""

from __future__ import annotations

import dataclasses

import pytest

from rmpd.client.events import Delivery as ClientDelivery
from rmpd.client.events import make_delivery as make_client_delivery
from rmpd.protocol.events import DeliveredMessage, make_delivered_message
from rmpd.protocol.ids import ViewId
from rmpd.protocol.qos import QoS


def test_engine_and_client_deliveries_equal_the_dataclass_constructors_and_stay_frozen() -> None:
    view = ViewId("10.0.0.1:7000", 12)
    engine_args = ("g", "10.0.0.2:7000", 7, QoS.TOTAL, 41, view, b"payload", 3, 2, b"order-42")
    client_args = (b"payload", "10.0.0.2:7000", 7, QoS.TOTAL, 41, "10.0.0.1:7000/12", "g", 3, 2, True, b"order-42")
    for make, cls, args in ((make_delivered_message, DeliveredMessage, engine_args),
                            (make_client_delivery, ClientDelivery, client_args)):
        made = make(*args)
        assert type(made) is cls
        assert made == cls(*args)
        assert dataclasses.astuple(made) == args  # each value in its own field, in declaration order
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.seq = 8  # type: ignore[misc]
