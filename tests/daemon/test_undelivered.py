"""Nothing lost in silence (docs/protocol.md, "Healing"): a message whose ``send`` returned is delivered here, or its
sender is told it was not (``undelivered``), through a daemon and an embedded Node alike; a membership that ends by
itself says so (``rejoining``) and refuses sends, saying why, until the next view.

The real-process tests cut a member off by stopping the other one with SIGSTOP: in a group of two that asks for a
majority, the member left alone reforms below its minimum partition and stops, with its own messages unordered (the
token went to the stopped member), and rejoins once the other runs again.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trio
import trio.testing

import rmpd
from rmpd import localapi
from rmpd.client.events import deliveries_of
from rmpd.client.group import EVENT_BUFFER, GroupInbox
from rmpd.localapi import FrameError, FrameReader, encode_frame
from rmpd.protocol.events import UndeliveredSends
from rmpd.protocol.qos import QoS
from rmpd.runtime.adapter import OwnMessages

from .harness import Daemon, unique, wait_for
from .test_client_library import FAST_NODE

CUT_OFF_WITHIN = 60.0
"""Seconds for a member alone below its minimum to stop: ``fail_after``, then ``minority_attempts`` reformations."""


# ----------------------------------------------------------------------------------------------------------------
# The frames and the bookkeeping, without a daemon


async def test_an_undelivered_frame_round_trips_and_what_it_tells_reaches_the_reader_in_its_place() -> None:
    frames = [localapi.undelivered_event("g", [3, 4, 9], "partition of 1 is below the minimum of 2"),
              localapi.rejoining_event("g", "partition of 1 is below the minimum of 2")]
    send, receive = trio.testing.memory_stream_one_way_pair()
    await send.send_all(b"".join(encode_frame(f) for f in frames))
    reader = FrameReader(receive)
    read = [await reader.read() for _ in frames]
    assert read == frames
    assert localapi.decode_seqs_untrusted(frames[0]["seqs"]) == (3, 4, 9)

    # What a backend hands a Group through its inbox: a reader behind (the buffer full, as on a node that cannot
    # wait) still gets the word about its membership, after the deliveries before it.
    inbox = GroupInbox("g")
    group = rmpd.Group(rmpd.Node(interface="lo"), inbox)  # not started: reading asks the backend nothing
    delivered = deliveries_of("g", "10.0.0.1:7000", 1, QoS.TOTAL, 5, "10.0.0.1:7000/1", None, [b"a"] * EVENT_BUFFER)
    assert inbox.deliver_now(delivered) == EVENT_BUFFER
    told = [rmpd.Undelivered((3, 4, 9), "partition of 1 is below the minimum of 2", "g"),
            rmpd.Rejoining("partition of 1 is below the minimum of 2", "g")]
    for event in told:
        inbox.tell_now(event)
    inbox.end()
    assert group.statistics().events_queued == EVENT_BUFFER + 2
    events = [event async for event in group]
    assert events[:EVENT_BUFFER] == delivered and events[EVENT_BUFFER:] == told


@pytest.mark.parametrize("seqs", [None, "1,2", [1, "2"], [1, -2], [True], [1.5],
                                  [0] * (localapi.MAX_REPORTED_SEQS + 1)])
def test_undelivered_seqs_from_the_daemon_are_checked(seqs: object) -> None:
    with pytest.raises(FrameError) as bad:
        localapi.decode_seqs_untrusted(seqs)
    assert bad.value.code == localapi.BAD_FRAME and not bad.value.fatal


def test_each_sender_is_told_only_the_numbers_it_was_given_and_not_delivered_here() -> None:
    own: OwnMessages[str] = OwnMessages()
    own.sent("g", [1, 2, 2, 2, 3], QoS.TOTAL, "c1")  # a batch packed into three packets
    own.sent("g", [3, 4], QoS.SAFE, "c2")  # c2's first message went into c1's last packet
    own.sent("g", [1], QoS.UNRELIABLE, "c2")  # unreliable: a numbering of its own, never reported
    own.sent("h", [7], QoS.TOTAL, "c1")
    own.delivered("g", 1, QoS.TOTAL)
    own.delivered("g", 2, QoS.UNRELIABLE)  # c2's unreliable message 2 is not c1's reliable 2
    assert own.held("g") == 3
    per_sender, unclaimed = own.ended("g", UndeliveredSends("g", (3, 4, 5), "cut off"))
    assert per_sender == {"c1": (2, 3), "c2": (3, 4)}  # 2 was ordered and not delivered here: reported too
    assert unclaimed == 1  # 5: a non-member's call this member relayed, say
    assert own.held("g") == 0 and own.held("h") == 1
    own.forget("c1")
    assert own.held("h") == 0 and own.ended("h") == ({}, 0)


# ----------------------------------------------------------------------------------------------------------------
# Real processes


@dataclass
class Sender:
    """One program streaming to a group, and what it was told."""

    group: rmpd.Group
    me: str
    """The sending process's ID: its own deliveries come from it."""
    sent: list[int] = field(default_factory=list)
    delivered: set[int] = field(default_factory=set)
    """Messages of ``me`` seen delivered: this program's, and those of the other programs using the process."""
    undelivered: list[rmpd.Undelivered] = field(default_factory=list)
    refused: rmpd.RmpdError | None = None
    rejoining: rmpd.Rejoining | None = None

    async def stream(self) -> None:
        """Send until a send is refused: the membership ended.  The pause paces the stream (a message every
        20 ms), it waits for nothing."""
        n = 0
        while True:
            try:
                self.sent.append(await self.group.send(b"%d" % n))
            except rmpd.RmpdError as exc:
                self.refused = exc
                return
            n += 1
            await trio.sleep(0.02)

    async def read(self) -> None:
        """Read until the membership ends."""
        async for event in self.group:
            if isinstance(event, rmpd.Delivery) and event.source == self.me:
                self.delivered.add(event.seq)
            elif isinstance(event, rmpd.Undelivered):
                self.undelivered.append(event)
            elif isinstance(event, rmpd.Rejoining):
                self.rejoining = event
                return

    def check(self) -> None:
        """Told about every message it sent, once: seen delivered, or named undelivered; at least one was cut off
        (the token was with the stopped member while it went on sending)."""
        assert self.rejoining is not None and self.undelivered, (self.rejoining, self.undelivered)
        named = [seq for event in self.undelivered for seq in event.seqs]
        assert len(named) == len(set(named)) and set(named) <= set(self.sent), (named, self.sent)
        assert not set(named) & self.delivered
        assert set(self.sent) == (self.delivered & set(self.sent)) | set(named)  # the others' come from `me` too
        assert all(event.reason and event.group == self.group.name for event in self.undelivered)
        assert self.refused is not None and self.refused.code == "not-member", self.refused
        assert "rejoining" in self.refused.message, self.refused.message


async def wait_for_view(group: rmpd.Group, members: set[str]) -> None:
    async for event in group:
        if isinstance(event, rmpd.ViewChange) and set(event.members) == members:
            return
    raise AssertionError("the group ended")


QUICK_FAILURE = "[timers]\nrequest_interval = 0.1\njoin_retries = 3\nfail_after = 1.5\n"
"""Daemons that find a stopped member gone in 1.5 s instead of 4.5 s: the tests are about what follows."""


def quick(daemons: Callable[..., Daemon], tmp_path: Path, name: str) -> Daemon:
    config = tmp_path / "quick-failure.toml"
    config.write_text(QUICK_FAILURE)
    return daemons(name, config=config)


def pair(daemons: Callable[..., Daemon], tmp_path: Path, group: str) -> tuple[Daemon, Daemon]:
    """Two daemons in ``group``, which asks for a majority: either one alone is below its minimum."""
    a, b = quick(daemons, tmp_path, "a"), quick(daemons, tmp_path, "b")
    a.rmp("join", group, "--min-partition", "majority")
    wait_for(lambda: a.members(group) == [a.pid], 20, "a in a view of its own")
    b.rmp("join", group, "--existing-only")
    wait_for(lambda: all(len(d.members(group)) == 2 for d in (a, b)), 30, "a view of two")
    return a, b


async def test_clients_of_a_daemon_cut_off_are_told_their_own_unordered_messages_and_rejoin(daemons,
                                                                                           tmp_path) -> None:
    group = unique("cut")
    a, b = pair(daemons, tmp_path, group)
    async with rmpd.connect(b.socket) as one, rmpd.connect(b.socket) as two:
        senders = [Sender(await one.join(group), b.pid), Sender(await two.join(group), b.pid)]
        a.proc.send_signal(signal.SIGSTOP)
        try:
            with trio.fail_after(CUT_OFF_WITHIN):
                async with trio.open_nursery() as nursery:
                    for sender in senders:
                        nursery.start_soon(sender.stream)
                        nursery.start_soon(sender.read)
            for sender in senders:
                sender.check()  # the process's numbers are shared by its clients: each was told its own only
            with pytest.raises(rmpd.RmpdError) as refused:
                await senders[0].group.send(b"while rejoining")
            assert refused.value.code == "not-member" and "rejoining" in refused.value.message
        finally:
            a.proc.send_signal(signal.SIGCONT)
        with trio.fail_after(CUT_OFF_WITHIN):
            await wait_for_view(senders[0].group, {a.pid, b.pid})
            seq = await senders[0].group.send(b"back")
            assert seq > max(senders[0].sent + senders[1].sent)  # a new membership numbers on from the old one
            async for event in senders[0].group:
                if isinstance(event, rmpd.Delivery) and (event.source, event.seq) == (b.pid, seq):
                    break
    status = next(g for g in b.status()["groups"] if g["group"] == group)
    assert status["buffers"]["own_pending"] == 0
    assert b.counters()["hub_undelivered_reported"] == sum(len(e.seqs) for s in senders for e in s.undelivered)


async def test_an_embedded_node_cut_off_is_told_its_unordered_messages_and_rejoins(daemons, tmp_path) -> None:
    group = unique("cut-node")
    a = quick(daemons, tmp_path, "a")
    a.rmp("join", group, "--min-partition", "majority")
    wait_for(lambda: a.members(group) == [a.pid], 20, "a in a view of its own")
    async with rmpd.Node(interface="lo", port=0, config=replace(FAST_NODE, fail_after=1.5)) as node:
        joined = await node.join(group, existing_only=True)
        assert sorted(await joined.members()) == sorted([a.pid, node.pid])
        sender = Sender(joined, node.pid)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            with trio.fail_after(CUT_OFF_WITHIN):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sender.stream)
                    nursery.start_soon(sender.read)
            sender.check()
            with pytest.raises(rmpd.RmpdError) as refused:
                await joined.send(b"while rejoining")
            assert refused.value.code == "not-member" and "rejoining" in refused.value.message
        finally:
            a.proc.send_signal(signal.SIGCONT)
        with trio.fail_after(CUT_OFF_WITHIN):
            await wait_for_view(joined, {a.pid, node.pid})
            assert await joined.send(b"back") > max(sender.sent)
        assert node.stats["undelivered_reported"] == sum(len(e.seqs) for e in sender.undelivered)

