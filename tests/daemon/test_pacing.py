"""Many concurrent sends through one daemon: coalesced into few requests, packed under load, paced by the ring,
and every message delivered once, in the sender's order, at every member."""

from __future__ import annotations

import pytest
import trio

import rmpd

from .harness import read_deliveries

MESSAGES = 3000


async def test_concurrent_sends_are_coalesced_packed_and_all_delivered_in_order(daemons) -> None:
    first, second = daemons(), daemons()
    first.rmp("join", "pace")
    second.rmp("join", "pace")
    with trio.fail_after(120):
        async with rmpd.connect(first.socket) as sender_client, rmpd.connect(second.socket) as reader_client:
            sender = await sender_client.join("pace")
            reader = await reader_client.join("pace")
            sent: dict[int, bytes] = {}  # message number -> payload; the ids it got: (seq, position) below
            ids: list[tuple[int, int]] = []

            async def send_range(start: int) -> None:
                for n in range(start, MESSAGES, 50):
                    payload = n.to_bytes(4, "big") + b"." * 200
                    sent[n] = payload
                    ids.append((await sender.send(payload, qos=rmpd.QoS.TOTAL), n))

            got: list[rmpd.Delivery] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_deliveries, reader, MESSAGES, got)
                async with trio.open_nursery() as senders:
                    for start in range(50):
                        senders.start_soon(send_range, start)
    assert sorted(d.payload for d in got) == sorted(sent.values())  # each exactly once
    assert [(d.seq, d.index) for d in got] == sorted((d.seq, d.index) for d in got)  # in the sender's order
    # The order the sends were accepted in is the delivery order: sequence numbers never go backwards.
    assert [seq for seq, _ in sorted(ids, key=lambda x: x[0])] == sorted(seq for seq, _ in ids)
    counters = first.counters()
    assert counters["hub_send_requests"] < MESSAGES  # concurrent sends travelled together
    assert counters["hub_sends"] == MESSAGES
    packed = [d for d in got if d.index > 0]  # faster than the ring: messages shared packets
    assert packed and counters["packed"] == len(packed)


async def test_a_16_mib_message_arrives_whole_and_a_larger_one_is_refused(daemons) -> None:
    first, second = daemons(), daemons()
    first.rmp("join", "big")
    second.rmp("join", "big")
    big = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    with trio.fail_after(120):
        async with rmpd.connect(first.socket) as sender_client, rmpd.connect(second.socket) as reader_client:
            sender = await sender_client.join("big")
            reader = await reader_client.join("big")
            with pytest.raises(rmpd.RmpdError) as refused:
                await sender.send(big + b"!", qos=rmpd.QoS.TOTAL)
            assert refused.value.code == "message-too-large"
            # An unreliable message travels in one packet: 60 KiB on loopback, which carries that unfragmented.
            with pytest.raises(rmpd.RmpdError) as refused:
                await sender.send(b"u" * (60 * 1024 + 1), qos=rmpd.QoS.UNRELIABLE)
            assert refused.value.code == "message-too-large" and "one packet (61440 bytes)" in refused.value.message
            seq = await sender.send(big, qos=rmpd.QoS.SAFE)
            await sender.send(b"after", qos=rmpd.QoS.SAFE)
            got = []
            async for event in reader:
                if isinstance(event, rmpd.Delivery):
                    got.append(event)
                    if event.payload == b"after":
                        break
    assert [len(d.payload) for d in got] == [len(big), 5]
    assert got[0].payload == big and got[0].seq == seq
    assert first.counters()["fragmented"] == 1
