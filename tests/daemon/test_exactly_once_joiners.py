"""Exactly once across joins: a daemon that joins a group takes the group's table of delivered keys at its place in
the order, so a program there that asked for the group's state filters a key the group delivered before it joined,
as every member does (docs/protocol.md, "Exactly once: keys").  Real daemons on loopback."""

from __future__ import annotations

import trio

import rmpd

from .harness import unique, wait_for


async def test_a_joiner_that_asked_for_state_filters_a_key_delivered_before_it_joined(daemons) -> None:
    first, second, late = daemons("a"), daemons("b"), daemons("c")
    group = unique("joiner-keys")
    first.rmp("join", group)
    wait_for(lambda: first.members(group) == [first.pid], 20, "a in a view of its own")
    marker = b"end-" + unique("m").encode()
    keys_read: dict[str, list[bytes]] = {}

    async def read_keys(name: str, reader: rmpd.Group) -> None:
        """A member's program reading its group (a state provider must, to take its snapshot at the cut)."""
        keys_read[name] = [event.key async for event in _until_payload(reader, marker)
                           if isinstance(event, rmpd.Delivery) and event.key is not None]

    with trio.fail_after(40):
        async with rmpd.connect(first.socket) as one, rmpd.connect(second.socket) as two, \
                trio.open_nursery() as nursery:
            provider = await one.join(group, state=True)
            provider.provide_state(lambda: b"state at the cut")
            nursery.start_soon(read_keys, "a", provider)
            other = await two.join(group)
            nursery.start_soon(read_keys, "b", other)
            await provider.send(b"before", key=b"order-1")
            wait_for(lambda: len(second.members(group)) == 2, 20, "a view of two")
            async with rmpd.connect(late.socket) as three:
                joiner = await three.join(group, state=True)
                state = await _next(joiner, rmpd.State)
                assert state.data == b"state at the cut"
                # The program at the new member resends the key: the group delivered it before this daemon
                # joined, and the daemon took the table at its place in the order: the copy is dropped.
                await joiner.send(b"resent", key=b"order-1")
                assert (await _next(joiner, rmpd.AlreadyDelivered)).key == b"order-1"
                await joiner.send(b"new", key=b"order-2")
                await joiner.send(marker)
                await read_keys("c", joiner)
    assert keys_read == {"a": [b"order-1", b"order-2"], "b": [b"order-1", b"order-2"], "c": [b"order-2"]}


async def _next(group: rmpd.Group, kind: type):
    async for event in group:
        if isinstance(event, kind):
            return event
    raise AssertionError("the group ended")


async def _until_payload(group: rmpd.Group, payload: bytes):
    async for event in group:
        if isinstance(event, rmpd.Delivery) and event.payload == payload:
            return
        yield event
    raise AssertionError("the group ended")
