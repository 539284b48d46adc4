"""The trio side's outlet to one client (rmpd.daemon.session.Session): frames it will not deliver are counted."""

from __future__ import annotations

import trio
import trio.testing

from rmpd import localapi
from rmpd.daemon.group_status import local_clients
from rmpd.daemon.session import Session
from rmpd.daemon.translator import Translator

from .test_translator import Client, Process


async def test_frames_a_client_will_not_get_are_counted_and_added_up_when_it_goes() -> None:
    ours, _theirs = trio.testing.memory_stream_pair()
    session = Session(ours, queue_size=2)
    assert session.push({"event": "a"}) and session.push({"event": "b"})
    assert session.dropped == 0
    assert not session.push({"event": "c"})  # the queue is full: cut off as a slow consumer
    assert session.closed and session.cut_reason is not None
    assert session.cut_reason["error"] == localapi.SLOW_CONSUMER
    assert not session.push_encoded(localapi.encode_frame({"event": "d"}))
    assert session.dropped == 2
    hub = Translator(Process(), clock=trio.current_time)
    hub.add(session)
    hub.remove(session)
    assert hub.stats["frames_dropped"] == 2


async def test_a_client_that_keeps_up_drops_nothing() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    session = Session(ours, queue_size=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.writer)
        for n in range(10):
            assert session.push({"event": "x", "n": n})
            await trio.testing.wait_all_tasks_blocked()
            await theirs.receive_some()
        session.finish()
    assert session.dropped == 0


def test_status_shows_the_frames_each_client_was_not_given() -> None:
    client = Client(stalled=True)
    client.push({"event": "queued"})
    client.cut(localapi.SLOW_CONSUMER, "behind")
    client.push({"event": "after the cut"})
    (shown,) = local_clients([client])
    assert (shown["client"], shown["queued"], shown["dropped"]) == (client.id, 1, 1)
