"""The client library against a real daemon, and the embedded rmpd.Node in the same group: one Group API."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import rmpd
from rmpd.client.batching import POST_LIMIT
from rmpd.client.group import EVENT_BUFFER
from rmpd.protocol.config import EngineConfig

from .harness import read_deliveries, unique

FAST_NODE = EngineConfig(request_interval=0.05, join_retries=2)
"""A node that creates a group it finds no one in after 0.1 s instead of 3 s."""


async def next_delivery(group: rmpd.Group) -> rmpd.Delivery:
    async for event in group:
        if isinstance(event, rmpd.Delivery):
            return event
    raise AssertionError("the group ended")


async def test_node_and_daemon_client_share_a_group(daemons) -> None:
    d = daemons()
    d.rmp("join", "lib")
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client, rmpd.Node(interface="lo", port=0) as node:
            via_daemon = await client.join("lib")
            embedded = await node.join("lib", existing_only=True)
            assert sorted(await embedded.members()) == sorted([d.pid, node.pid])
            assert sorted(await via_daemon.members()) == sorted([d.pid, node.pid])

            seq = await embedded.send(b"from the node", qos=rmpd.QoS.SAFE)
            got = await next_delivery(via_daemon)
            assert (got.payload, got.source, got.seq, got.qos) == (b"from the node", node.pid, seq, rmpd.QoS.SAFE)
            assert got.timestamp is not None and got.view == embedded.view
            mine = await next_delivery(embedded)
            assert (mine.payload, mine.timestamp) == (b"from the node", got.timestamp)

            await via_daemon.send(b"k2", qos=rmpd.QoS.k(2))
            assert (await next_delivery(embedded)).payload == b"k2"

            assert await embedded.lock(2)
            with pytest.raises(rmpd.RmpdError) as refused:
                await via_daemon.lock(2)
            assert refused.value.code in ("lock-held", "lock-denied")
            assert await embedded.unlock(2)

            with pytest.raises(rmpd.RmpdError) as bad:
                await client.join("")
            assert bad.value.code == "bad-request"
        # The node left on exit: the daemon installs a view without it.
    with trio.fail_after(30):
        while d.members("lib") != [d.pid]:
            await trio.sleep(0.1)


async def test_view_changes_arrive_in_the_group_stream(daemons) -> None:
    d = daemons()
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("views")
            async with rmpd.Node(interface="lo", port=0) as node:
                await node.join("views", existing_only=True)
                async for event in group:
                    if isinstance(event, rmpd.ViewChange) and node.pid in event.members:
                        assert event.members == (d.pid, node.pid)
                        break
            await group.leave()
            with pytest.raises(rmpd.RmpdError) as exc:
                await group.send(b"after leave")
            assert exc.value.code == "not-member"


async def test_connect_to_a_missing_daemon_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(rmpd.RmpdError) as exc:
        async with rmpd.connect(tmp_path / "nobody.sock"):
            pass
    assert exc.value.code == "no-daemon"


def test_the_readme_library_example_without_a_daemon_ends_in_one_line(tmp_path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "RMPD_SOCKET": str(tmp_path / "nobody.sock")}
    result = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: no-daemon: cannot reach rmpd at") and "start it with `rmpd`" in line, line


async def test_every_local_client_of_a_group_gets_the_same_deliveries_in_the_same_order(daemons) -> None:
    d = daemons()
    d.rmp("join", "fan")
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as one, rmpd.connect(d.socket) as two, \
                rmpd.Node(interface="lo", port=0) as node:
            groups = [await one.join("fan"), await two.join("fan")]
            sender = await node.join("fan", existing_only=True)
            for i in range(50):
                await sender.send(b"n%d" % i, qos=rmpd.QoS.TOTAL)
                await groups[0].send(b"c%d" % i, qos=rmpd.QoS.TOTAL)
            seen: list[list[tuple[bytes, int | None]]] = []
            for group in groups:
                got = []
                while len(got) < 100:
                    event = await next_delivery(group)
                    got.append((event.payload, event.timestamp))
                seen.append(got)
            assert seen[0] == seen[1]
            assert sorted(p for p, _ in seen[0]) == sorted([b"n%d" % i for i in range(50)] +
                                                            [b"c%d" % i for i in range(50)])


async def test_concurrent_sends_of_an_embedded_node_are_packed_and_an_oversized_one_is_refused_alone(
        loopback_multicast) -> None:
    config = EngineConfig(request_interval=0.05, join_retries=2, max_message=50_000)
    with trio.fail_after(60):
        async with rmpd.Node(interface="lo", port=0, config=config) as node:
            group = await node.join("packed-node")
            seqs: dict[int, int] = {}

            async def send(i: int) -> None:
                seqs[i] = await group.send(i.to_bytes(2, "big") * 500)

            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(send, i)
                with pytest.raises(rmpd.RmpdError) as refused:
                    await group.send(b"x" * 60_000)
            assert refused.value.code == "message-too-large"
            got: list[rmpd.Delivery] = []
            await read_deliveries(group, 40, got)
            assert len({d.payload for d in got}) == 40
            assert [(d.seq, d.index) for d in got] == sorted((d.seq, d.index) for d in got)
            assert len({d.seq for d in got}) < 40  # sent together: packed
            assert {seqs[int.from_bytes(d.payload[:2], "big")] for d in got} == {d.seq for d in got}


async def test_an_embedded_reader_that_falls_behind_slows_the_group_and_loses_nothing(loopback_multicast) -> None:
    """Section 4.6 for embedded members: with EVENT_BUFFER deliveries unread, the node stops accepting the token
    (the ring waits) instead of ending the group; once the reader catches up, everything arrives in order."""
    config = EngineConfig(request_interval=0.05, join_retries=2)
    total = EVENT_BUFFER + EVENT_BUFFER // 2
    with trio.fail_after(120):
        async with rmpd.Node(interface="lo", port=0, config=config) as reader_node, \
                rmpd.Node(interface="lo", port=0, config=config) as sender_node:
            slow = await reader_node.join("behind")
            fast = await sender_node.join("behind", existing_only=True)
            while len(await slow.members()) < 2:
                await trio.sleep(0.01)

            async def send_all() -> None:
                for i in range(total):
                    await fast.send(b"%d" % i)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all)
                while slow.statistics().events_queued < EVENT_BUFFER:  # nobody reads yet
                    await trio.sleep(0.005)
                assert "behind" in reader_node.statistics().groups_held_back, \
                    "the reader is behind: the node holds the ring back"
                await trio.sleep(0.2)  # still not reading
                assert slow.statistics().events_queued < total, "the ring waited instead of delivering everything"
                got = []
                async for event in slow:
                    if isinstance(event, rmpd.Delivery):
                        got.append(int(event.payload))
                        if len(got) == total:
                            break
            assert got == list(range(total))
            assert "behind" not in reader_node.statistics().groups_held_back


async def post_and_read(group: rmpd.Group, count: int) -> tuple[list[rmpd.Delivery], int]:
    """Post ``count`` numbered messages from one task while another reads them; the deliveries, and the most
    posted messages the backend held unaccepted at once."""
    got: list[rmpd.Delivery] = []
    most_unaccepted = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_deliveries, group, count, got)
        for n in range(count):
            await group.post(n.to_bytes(4, "big") + b"." * 100)
            most_unaccepted = max(most_unaccepted, group.statistics().posts_pending)
        await group.flush()
    return got, most_unaccepted


def assert_in_posted_order(got: list[rmpd.Delivery], count: int) -> None:
    assert [int.from_bytes(d.payload[:4], "big") for d in got] == list(range(count))
    assert [(d.seq, d.index) for d in got] == sorted((d.seq, d.index) for d in got)
    assert any(d.index > 0 for d in got), "posts from one task travelled packed"


async def test_posts_through_the_daemon_keep_their_order_and_a_refusal_is_raised_by_flush(daemons) -> None:
    d = daemons()
    count = 2 * POST_LIMIT + 100
    with trio.fail_after(120):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("posts")
            got, most_unaccepted = await post_and_read(group, count)
            assert_in_posted_order(got, count)
            assert most_unaccepted <= POST_LIMIT, "a fast poster is held to the ring's pace"
            # Too large for the daemon: refused at once (the client asked the daemon its limits), alone, so the
            # posts around it are not refused with it.
            await group.post(b"p1")
            with pytest.raises(rmpd.RmpdError) as refused:
                await group.post(b"x" * (16 * 1024 * 1024 + 1))
            assert refused.value.code == "message-too-large"
            await group.post(b"p2")
            await group.flush()
            assert [(await next_delivery(group)).payload for _ in range(2)] == [b"p1", b"p2"]
            await group.post(b"h", handler=9)  # the daemon refuses it; post does not wait to know
            with pytest.raises(rmpd.RmpdError) as refused:
                await group.flush()
            assert refused.value.code == "bad-request"
            await group.flush()  # raised once
            await group.post(b"h", handler=9)
            while group.statistics().posts_pending:
                await trio.sleep(0.001)
            with pytest.raises(rmpd.RmpdError, match="handler"):  # by the next send, though nothing is pending
                await group.send(b"next")
            seq = await group.send(b"after")
            assert (await next_delivery(group)).seq == seq


async def test_posts_of_an_embedded_node_keep_their_order_before_a_later_send(loopback_multicast) -> None:
    config = EngineConfig(request_interval=0.05, join_retries=2, max_message=50_000)
    count = POST_LIMIT + 100
    with trio.fail_after(120):
        async with rmpd.Node(interface="lo", port=0, config=config) as node:
            group = await node.join("posts-node")
            got, most_unaccepted = await post_and_read(group, count)
            assert_in_posted_order(got, count)
            assert most_unaccepted <= POST_LIMIT
            with pytest.raises(rmpd.RmpdError) as refused:
                await group.post(b"x" * 60_000)  # the node knows its limit: refused at once
            assert refused.value.code == "message-too-large"
            await group.post(b"posted")
            await group.send(b"sent")  # waits for the post to be accepted first
            assert [(await next_delivery(group)).payload for _ in range(2)] == [b"posted", b"sent"]


async def test_posting_to_a_daemon_that_died_raises_connection_lost_instead_of_waiting(daemons) -> None:
    d = daemons()
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("posts-lost")
            await group.post(b"before")
            await group.flush()
            d.stop(signal.SIGKILL)
            with pytest.raises(rmpd.ConnectionLost):
                for _ in range(POST_LIMIT * 2):  # more than the limit: a post that waited would wait forever
                    await group.post(b"x" * 100)
                await group.flush()


async def test_batches_give_the_group_stream_as_lists_and_raise_what_ended_it(daemons) -> None:
    d = daemons()
    count = 3000
    with trio.fail_after(120):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("batches")
            for n in range(count):
                await group.post(n.to_bytes(4, "big"))
            await group.flush()
            got: list[rmpd.Delivery] = []
            sizes = []
            async for batch in group.batches(max_events=500):
                assert 1 <= len(batch) <= 500
                sizes.append(len(batch))
                got += [e for e in batch if isinstance(e, rmpd.Delivery)]
                if len(got) == count:
                    break
            assert [int.from_bytes(e.payload, "big") for e in got] == list(range(count))
            assert max(sizes) > 1, "what arrived together is read together"
            d.stop(signal.SIGKILL)
            with pytest.raises(rmpd.ConnectionLost):
                async for _ in group.batches():
                    pass


async def test_a_cancelled_send_leaves_the_connection_and_the_other_senders_whole(daemons) -> None:
    """A send cancelled in the middle of writing its frame left the daemon's reader out of step (every later
    request hung); a batch's first sender cancelled failed the others with ConnectionLost though their messages
    were delivered (a program retrying them sent them twice)."""
    d = daemons()
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("cancel")
            writing = trio.CancelScope()

            async def send_big() -> None:
                with writing:
                    await group.send(b"x" * 8_000_000)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_big)
                await trio.testing.wait_all_tasks_blocked()  # the frame part written, the socket full
                writing.cancel()
            assert await group.send(b"small") >= 1

            for round_ in range(30):  # trio varies the order tasks run in: most rounds put both in one batch
                first, second = b"first %d" % round_, b"second %d" % round_
                outcome: list[object] = []
                leader = trio.CancelScope()

                async def send_first(payload: bytes = first, scope: trio.CancelScope = leader) -> None:
                    with scope:
                        await group.send(payload)

                async def send_second(payload: bytes = second, into: list[object] = outcome) -> None:
                    try:
                        into.append(await group.send(payload))
                    except rmpd.RmpdError as exc:
                        into.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send_first)
                    nursery.start_soon(send_second)
                    await trio.testing.wait_all_tasks_blocked()  # both requests written, answers awaited
                    leader.cancel()
                assert isinstance(outcome[0], int), outcome
                got: set[bytes] = set()
                while not {first, second} <= got:  # written before the cancel: delivered, as the other was told
                    got.add((await next_delivery(group)).payload)


async def test_a_group_left_even_by_a_cancelled_leave_ends_its_iterations_instead_of_waiting(daemons) -> None:
    d = daemons()
    with trio.fail_after(30):
        async with rmpd.connect(d.socket) as client:
            group = await client.join("ended")
            await group.leave()
            assert [r async for r in group.requests(1)] == []
            other = await client.join("ended-too")
            with trio.CancelScope() as scope:
                scope.cancel()  # the leave is cancelled at its first chance
                await other.leave()
            assert all(isinstance(e, rmpd.ViewChange) for e in [e async for e in other])  # ends, not waits


@pytest.mark.parametrize("backend", ["daemon", "node"])
async def test_posts_not_yet_flushed_are_delivered_when_the_program_closes(daemons, backend) -> None:
    """Leaving `async with` cancelled the carrier tasks: posts made just before vanished without an error."""
    d = daemons()
    d.rmp("join", "closing")
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as watcher:
            watching = await watcher.join("closing")
            if backend == "daemon":
                async with rmpd.connect(d.socket) as client:
                    group = await client.join("closing")
                    for i in range(300):
                        await group.post(b"%d" % i)
            else:
                async with rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
                    group = await node.join("closing", existing_only=True)
                    for i in range(300):
                        await group.post(b"%d" % i)
            got = [(await next_delivery(watching)).payload for _ in range(300)]
            assert got == [b"%d" % i for i in range(300)]


async def test_an_error_inside_a_node_comes_out_as_itself_and_a_stopped_node_says_so(loopback_multicast) -> None:
    with pytest.raises(rmpd.RmpdError, match="mine"):
        async with rmpd.Node(interface="lo", port=0, config=FAST_NODE):
            raise rmpd.RmpdError("mine", "raised by the program")
    with trio.fail_after(30):
        async with rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
            group = await node.join("stopping")
        for request in (group.post(b"late"), group.send(b"late"), group.flush(), node.join("other")):
            with pytest.raises(rmpd.RmpdError, match="stopped"):
                await request


@pytest.mark.parametrize("backend", ["daemon", "node"])
async def test_a_send_and_a_flush_return_while_another_task_keeps_posting(daemons, backend) -> None:
    """They waited for a moment with nothing posted and unaccepted, which a busy poster never leaves."""
    d = daemons()
    async with contextlib.AsyncExitStack() as stack:
        if backend == "daemon":
            group = await (await stack.enter_async_context(rmpd.connect(d.socket))).join("busy")
        else:
            node = await stack.enter_async_context(rmpd.Node(interface="lo", port=0, config=FAST_NODE))
            group = await node.join("busy")
        async with trio.open_nursery() as nursery:
            async def keep_posting() -> None:
                while True:
                    await group.post(b"p")

            async def keep_reading() -> None:
                async for _ in group.batches():
                    pass

            nursery.start_soon(keep_reading)
            nursery.start_soon(keep_posting)
            with trio.fail_after(30):
                for _ in range(3):
                    await trio.sleep(0.05)  # the poster well under way
                    await group.send(b"S")
                    await group.flush()
            nursery.cancel_scope.cancel()


async def test_a_node_joins_again_a_group_it_is_still_leaving(loopback_multicast) -> None:
    with trio.fail_after(60):
        async with (rmpd.Node(interface="lo", port=0, config=FAST_NODE) as a,
                    rmpd.Node(interface="lo", port=0, config=FAST_NODE) as b):
            await a.join("again")
            left = await b.join("again", existing_only=True)
            await left.leave()
            back = await b.join("again")  # the daemon joins again once its leave is through: so does a node
            assert sorted(await back.members()) == sorted([a.pid, b.pid])
            await back.send(b"back")
            assert (await next_delivery(back)).payload == b"back"


async def test_leaving_a_group_nobody_read_returns_and_the_connection_goes_on(daemons) -> None:
    """The connection's reader waited for room in the unread group's queue, so the answer to the leave, behind
    it, never came once the group went quiet."""
    d = daemons()
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as client, rmpd.connect(d.socket) as sender:
            unread = await client.join("unread")
            other = await client.join("other")
            busy = await sender.join("unread")
            async with trio.open_nursery() as nursery:
                async def drain() -> None:
                    async for _ in busy.batches():
                        pass

                nursery.start_soon(drain)
                for i in range(EVENT_BUFFER + 2000):
                    await busy.post(b"%d" % i)
                while unread.statistics().events_queued < EVENT_BUFFER:  # the reader task now waits for room
                    await trio.sleep(0.01)
                await unread.leave()
                await busy.leave()
            await other.send(b"still served")
            assert (await next_delivery(other)).payload == b"still served"


@pytest.mark.parametrize("backend", ["daemon", "node"])
async def test_concurrent_joins_of_one_group_share_one_group_once_it_is_joined(daemons, backend) -> None:
    """The daemon backend answered the second join at once with no view; the node made a second Group that no
    event reached."""
    d = daemons()
    with trio.fail_after(30):
        async with contextlib.AsyncExitStack() as stack:
            if backend == "daemon":
                backend_ = await stack.enter_async_context(rmpd.connect(d.socket))
            else:
                backend_ = await stack.enter_async_context(rmpd.Node(interface="lo", port=0, config=FAST_NODE))
            joined: list[rmpd.Group] = []

            async def join() -> None:
                joined.append(await backend_.join("together"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(join)
                nursery.start_soon(join)
            assert joined[0] is joined[1] and joined[0].view
            await joined[0].send(b"one")
            assert (await next_delivery(joined[1])).payload == b"one"


async def test_the_holder_of_a_handler_lock_is_told_to_answer_a_members_message_for_that_handler(daemons) -> None:
    """Paper 3.3: every member delivers a message sent with handler N; the member holding handler lock N is told it
    is the one to answer.  Through a daemon, only the client that took the lock is told, not its other clients."""
    d = daemons()
    name = unique("answer")
    d.rmp("join", name)
    with trio.fail_after(60):
        async with rmpd.connect(d.socket) as one, rmpd.connect(d.socket) as two, \
                rmpd.Node(interface="lo", port=0, config=FAST_NODE) as node:
            holder, bystander = await one.join(name), await two.join(name)
            embedded = await node.join(name, existing_only=True)
            assert await holder.lock(0) and await embedded.lock(1)
            await embedded.send(b"for handler 0", handler=0)
            await holder.send(b"for handler 1", handler=1)
            await embedded.send(b"for no handler")
            seen: dict[str, dict[bytes, bool]] = {}
            for label, group in (("holder", holder), ("bystander", bystander), ("node", embedded)):
                seen[label] = {}
                for _ in range(3):
                    delivery = await next_delivery(group)
                    seen[label][delivery.payload] = delivery.answer
            assert seen["holder"] == {b"for handler 0": True, b"for handler 1": False, b"for no handler": False}
            assert seen["bystander"] == {b"for handler 0": False, b"for handler 1": False, b"for no handler": False}
            assert seen["node"] == {b"for handler 0": False, b"for handler 1": True, b"for no handler": False}


async def test_a_node_that_neither_sends_nor_hears_multicast_takes_part_through_a_named_member(daemons) -> None:
    """The forwarding flag and explicit naming (paper 3.3, 3.4): a node with multicast off names a member, which
    multicasts every packet the node would have multicast; the group sends the node unicast copies.  It delivers
    the same order as the others."""
    a, b = daemons(), daemons()
    name = unique("via")
    a.rmp("join", name)
    b.rmp("join", name, "--existing")
    with trio.fail_after(60):
        async with rmpd.connect(a.socket) as client, \
                rmpd.Node(interface="lo", port=0, config=FAST_NODE, multicast=False) as node:
            member = await client.join(name)
            relayed = await node.join(name, existing_only=True, via=a.pid)
            assert sorted(await relayed.members()) == sorted([a.pid, b.pid, node.pid])
            got: dict[str, list[rmpd.Delivery]] = {"member": [], "node": []}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_deliveries, member, 40, got["member"])
                nursery.start_soon(read_deliveries, relayed, 40, got["node"])
                for i in range(20):
                    await relayed.send(b"from the node %d" % i)
                    await member.send(b"from a %d" % i)
            assert [d.payload for d in got["node"]] == [d.payload for d in got["member"]]
            assert [d.timestamp for d in got["node"]] == [d.timestamp for d in got["member"]]
    assert a.counters()["forwarded"] > 0 and b.counters().get("forwarded", 0) == 0
