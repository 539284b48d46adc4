"""The daemon's translator with keyed messages, driven without sockets (tests/daemon/test_translator.py's stand-ins):
keys go to the process, deliveries carry them to the clients, a copy the group dropped is told to its sender only
(and is owed to nobody), and a membership that ends names each client's keyed and posted messages by what the
client knows them by."""

from __future__ import annotations

import pytest

from rmpd import localapi
from rmpd.client.events import Delivery, deliveries_of
from rmpd.daemon.translator import Translator
from rmpd.protocol.events import AlreadyDelivered, Delivered, Left, UndeliveredSends
from rmpd.protocol.ids import ViewId
from rmpd.protocol.qos import QoS
from rmpd.runtime.adapter import OwnMessages

from .test_translator import ME, PEER, Clock, Process, connect, joined


@pytest.fixture
def process() -> Process:
    return Process()


@pytest.fixture
def hub(process: Process) -> Translator:
    return Translator(process, clock=Clock())


def own_pending(hub: Translator, group: str) -> int:
    return hub.sends.held(group)


def test_keys_go_to_the_process_and_a_key_below_total_order_is_refused(hub: Translator, process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    hub.handle(client, {"op": "send", "id": 1, "group": "g", "payload": b"x", "key": b"k1"})
    hub.handle(client, {"op": "send_batch", "id": 2, "group": "g", "payloads": [b"y", b"z"], "keys": [b"k2", b"k3"],
                        "qos": "safe"})
    hub.handle(client, {"op": "send", "id": 3, "group": "g", "payload": b"x", "key": b"k", "qos": "source"})
    hub.handle(client, {"op": "send", "id": 4, "group": "g", "payload": b"x", "key": b"k" * 256})
    replies = client.replies()
    assert replies[1]["seq"] == 1 and replies[2]["seqs"] == [2, 3]
    assert replies[3]["error"] == replies[4]["error"] == localapi.BAD_KEY
    assert process.requests("send") == [("send", "g", (b"x",), (b"k1",)), ("send", "g", (b"y", b"z"), (b"k2", b"k3"))]


def test_a_keyed_delivery_carries_its_keys_and_an_unkeyed_run_keeps_the_old_nine_fields(hub: Translator,
                                                                                       process: Process) -> None:
    client = connect(hub)
    joined(hub, process, "g", client)
    keyed = Delivered("g", PEER, 5, QoS.TOTAL, 9, ViewId(PEER, 12), None, (b"a", b"b"), False, (b"ka", b"kb"))
    plain = Delivered("g", PEER, 6, QoS.TOTAL, 10, ViewId(PEER, 12), None, (b"c",), False)
    hub.handle_events([keyed, plain])
    (event,) = client.events("deliveries")
    assert len(event["runs"][0]) == 10 and event["runs"][0][9] == [b"ka", b"kb"]
    assert len(event["runs"][1]) == 9  # what a client from before keys reads
    made = localapi.decode_deliveries_untrusted(
        event["runs"], lambda src, seq, qos, ts, view, handler, first, payloads, answer, keys:
        deliveries_of("g", src, seq, qos, ts, view, handler, payloads, first, answer, keys))
    assert [(d.payload, d.key, d.index) for d in made] == [(b"a", b"ka", 0), (b"b", b"kb", 1), (b"c", None, 0)]
    assert made[0] == Delivery(b"a", PEER, 5, QoS.TOTAL, 9, f"{PEER}/12", "g", None, 0, False, b"ka")


def test_a_dropped_copy_is_told_to_its_sender_only_and_owed_to_nobody(hub: Translator, process: Process) -> None:
    sender, other = connect(hub), connect(hub)
    joined(hub, process, "g", sender, other)
    hub.handle(sender, {"op": "send_batch", "id": 1, "group": "g", "payloads": [b"a", b"b"], "keys": [b"k1", b"k2"]})
    assert sender.replies()[1]["seqs"] == [1, 2] and own_pending(hub, "g") == 2
    # The group delivered k2 and dropped k1 (a copy): the delivery is everyone's, the word on k1 the sender's.
    hub.handle_events([Delivered("g", ME, 2, QoS.TOTAL, 20, ViewId(ME, 1), None, (b"b",), False, (b"k2",)),
                       AlreadyDelivered("g", ME, 1, b"k1", 7, ViewId(PEER, 3))])
    assert own_pending(hub, "g") == 0
    told = sender.events("already-delivered")
    assert told == [{"event": "already-delivered", "group": "g", "key": b"k1", "ts": 7, "view": f"{PEER}/3"}]
    assert other.events("already-delivered") == []
    # Nothing owed: the end of the membership names nothing.
    hub.handle_events([Left("g", "cut off", rejoining=True)])
    assert sender.events("undelivered") == []
    assert hub.stats["already_delivered"] == 1


def test_the_copies_a_packet_left_out_go_to_their_senders_and_its_delivery_settles_the_rest() -> None:
    """The engine tells each copy it left out of an own packet (AlreadyDelivered) before the packet's delivery."""
    own: OwnMessages[str] = OwnMessages()
    own.sent("g", [4, 4, 4], QoS.TOTAL, "c1", [b"k1", b"k2", b"k1"])  # packed into one packet, k1 twice
    own.sent("g", [4], QoS.TOTAL, "c2", [b"k3"])
    assert own.already_delivered("g", 4, b"k3") == "c2"  # the second k1 and k3 were dropped as copies
    assert own.already_delivered("g", 4, b"k1") == "c1"
    assert own.held("g") == 1
    own.delivered("g", 4, QoS.TOTAL)
    assert own.held("g") == 0 and own.already_delivered("g", 4, b"k1") is None
    own.sent("g", [5, 5], QoS.TOTAL, "c1", [1, 2])
    own.sent("g", [6], QoS.TOTAL, "c1", [b"k9"])
    per_sender, unclaimed = own.ended_named("g", UndeliveredSends("g", (5, 6), "cut off"))
    assert per_sender["c1"].seqs == (5, 6) and per_sender["c1"].ids == (1, 2, b"k9") and unclaimed == 0


def test_a_copy_dropped_with_nothing_delivered_is_done_too(hub: Translator, process: Process) -> None:
    sender = connect(hub)
    joined(hub, process, "g", sender)
    hub.handle(sender, {"op": "send", "id": 1, "group": "g", "payload": b"a", "key": b"k1"})
    hub.handle_events([AlreadyDelivered("g", ME, 1, b"k1", 7, ViewId(PEER, 3))])  # no Delivered at all
    assert own_pending(hub, "g") == 0 and len(sender.events("already-delivered")) == 1


def test_undelivered_names_keyed_and_posted_messages_by_what_the_client_knows_them_by(hub: Translator,
                                                                                     process: Process) -> None:
    first, second = connect(hub), connect(hub)
    joined(hub, process, "g", first, second)
    hub.handle(first, {"op": "send_batch", "id": 1, "group": "g", "payloads": [b"a", b"b"], "post_id": 7})
    hub.handle(second, {"op": "send", "id": 2, "group": "g", "payload": b"c", "key": b"order-42"})
    hub.handle(first, {"op": "send", "id": 3, "group": "g", "payload": b"d"})  # sent: its seq names it
    hub.handle(first, {"op": "send_batch", "id": 4, "group": "g", "payloads": [b"e"], "keys": [b"k-e"]})
    hub.handle_events([Delivered("g", ME, 1, QoS.TOTAL, 20, ViewId(ME, 1), None, (b"a",), False)])
    hub.handle_events([UndeliveredSends("g", (2, 3, 4, 5), "cut off"), Left("g", "cut off", rejoining=True)])
    assert first.events("undelivered") == [{"event": "undelivered", "group": "g", "seqs": [2, 4, 5],
                                            "reason": "cut off", "ids": [8, b"k-e"]}]
    assert second.events("undelivered") == [{"event": "undelivered", "group": "g", "seqs": [3],
                                             "reason": "cut off", "ids": [b"order-42"]}]
    assert localapi.decode_ids_untrusted([8, b"k-e"]) == (8, b"k-e")
