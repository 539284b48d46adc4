"""The client library's per-group event queue: order, the bound, closing with an error, cancellation, fairness."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from rmpd.client.group import YIELD_EVERY, EventBuffer


async def test_events_come_out_in_order_across_frames() -> None:
    queue: EventBuffer[int] = EventBuffer(100)
    await queue.put_many([1, 2, 3])
    assert queue.put_nowait(4)
    await queue.put_many([5])
    assert [await queue.get() for _ in range(5)] == [1, 2, 3, 4, 5]


async def test_a_full_queue_makes_the_producer_wait_and_refuses_put_nowait() -> None:
    queue: EventBuffer[int] = EventBuffer(4)
    done = trio.Event()

    async def produce() -> None:
        await queue.put_many(list(range(10)))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await trio.testing.wait_all_tasks_blocked()
        assert len(queue) == 4 and not done.is_set() and not queue.put_nowait(99)
        got = [await queue.get() for _ in range(10)]
        await done.wait()
    assert got == list(range(10))


async def test_close_delivers_what_is_queued_then_the_error_then_ends() -> None:
    queue: EventBuffer[object] = EventBuffer(2)
    await queue.put_many([1, 2])
    error = RuntimeError("left")
    queue.close(error)  # past the bound: the reader must learn why the stream ended
    assert [await queue.get() for _ in range(3)] == [1, 2, error]
    with pytest.raises(trio.EndOfChannel):
        await queue.get()
    assert not queue.put_nowait(3)


async def test_close_wakes_a_waiting_reader_and_a_waiting_writer() -> None:
    queue: EventBuffer[int] = EventBuffer(1)
    await queue.put_many([1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.put_many, [2, 3])
        await trio.testing.wait_all_tasks_blocked()
        queue.close()
    assert await queue.get() == 1
    with pytest.raises(trio.EndOfChannel):
        await queue.get()


async def test_get_is_a_cancellation_point_even_with_events_buffered() -> None:
    queue: EventBuffer[int] = EventBuffer(10)
    await queue.put_many([1, 2])
    with trio.CancelScope() as scope:
        scope.cancel()
        await queue.get()
    assert scope.cancelled_caught and len(queue) == 2


async def ticks_of_another_task_while(read: Callable[[], Awaitable[None]]) -> int:
    """How often a task that only checkpoints ran while ``read`` ran."""
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.lowlevel.checkpoint()
        before = ticks
        await read()
        nursery.cancel_scope.cancel()
    return ticks - before


async def test_a_flooded_reader_lets_other_tasks_run() -> None:
    queue: EventBuffer[int] = EventBuffer(10_000)
    await queue.put_many(list(range(10 * YIELD_EVERY)))

    async def read() -> None:
        for _ in range(10 * YIELD_EVERY):
            await queue.get()

    assert await ticks_of_another_task_while(read) >= 9


async def test_get_many_takes_what_is_queued_up_to_its_limit_and_waits_for_at_least_one() -> None:
    queue: EventBuffer[int] = EventBuffer(100)
    await queue.put_many([1, 2, 3, 4, 5])
    assert await queue.get_many(3) == [1, 2, 3]
    assert await queue.get_many(100) == [4, 5]
    got: list[int] = []

    async def read() -> None:
        got.extend(await queue.get_many(100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [], "an empty queue makes the reader wait"
        await queue.put_many([6, 7])
    assert got == [6, 7]
    with pytest.raises(ValueError):
        await queue.get_many(0)


async def test_get_many_frees_room_for_a_waiting_producer_then_ends_after_the_error() -> None:
    queue: EventBuffer[object] = EventBuffer(4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.put_many, list(range(6)))
        await trio.testing.wait_all_tasks_blocked()
        assert await queue.get_many(10) == [0, 1, 2, 3]
    error = RuntimeError("left")
    queue.close(error)
    assert await queue.get_many(10) == [4, 5, error]
    with pytest.raises(trio.EndOfChannel):
        await queue.get_many(10)


async def test_a_flooded_batch_reader_lets_other_tasks_run() -> None:
    queue: EventBuffer[int] = EventBuffer(10_000)
    await queue.put_many(list(range(10 * YIELD_EVERY)))

    async def read() -> None:
        for _ in range(10):
            assert len(await queue.get_many(YIELD_EVERY)) == YIELD_EVERY

    assert await ticks_of_another_task_while(read) >= 9
    with trio.CancelScope() as scope:
        scope.cancel()
        await queue.get_many(1)
    assert scope.cancelled_caught
