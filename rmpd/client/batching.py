"""Concurrent sends to one group coalesced into one batch, for both backends (daemon connection, embedded Node).

Sends from tasks that run while the first of them is being prepared join its batch; the batch goes to the daemon
as one ``send_batch`` request, or to the embedded engine in one call, where its messages are packed into as few
packets as they fit (``GroupEngine.send_batch``).  Order is kept: each waiter takes its sequence number by its
position in the batch.  A lone send waits one scheduling step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import trio

from rmpd.protocol.qos import QoS

from .errors import ConnectionLost, RmpdError

BATCH_BYTES = 256 * 1024
"""Payload bytes one batch carries at most."""
MAX_BATCH = 4096
"""Messages one batch carries at most (the daemon's limit for one send_batch request)."""


def fits(size: int, count: int, payload: bytes) -> bool:
    """May a batch of ``count`` messages and ``size`` bytes take ``payload`` too?"""
    return size + len(payload) <= BATCH_BYTES and count < MAX_BATCH


class SendBatch:
    """Sends coalesced into one request; each waiter takes its sequence number by position."""

    __slots__ = ("done", "error", "keys", "outcome", "payloads", "seqs", "size")

    def __init__(self, first: bytes, key: bytes | None = None) -> None:
        self.payloads = [first]
        self.keys: list[bytes] | None = None if key is None else [key]
        """One key per payload, or None: a batch is keyed throughout or not at all."""
        self.size = len(first)
        self.seqs: list[int] = []
        self.done = trio.Event()
        """Set once the batch is handed over (or refused)."""
        self.error: BaseException | None = None
        self.outcome: Callable[[], Awaitable[list[int]]] | None = None
        """Where the sequence numbers come from when the answer comes later (a daemon's reply): every sender
        of the batch waits for it, so one sender cancelled does not fail the others."""

    def takes(self, payload: bytes) -> bool:
        return fits(self.size, len(self.payloads), payload)

    async def join(self, payload: bytes, key: bytes | None = None) -> int:
        """Add ``payload`` (with ``key`` in a keyed batch) and wait for the batch to be sent; its sequence number,
        or the batch's error."""
        index = len(self.payloads)
        self.payloads.append(payload)
        if self.keys is not None:
            self.keys.append(key)  # type: ignore[arg-type]  # the batch was chosen by whether it is keyed
        self.size += len(payload)
        await self.done.wait()
        return (await self.result())[index]

    async def result(self) -> list[int]:
        """The batch's sequence numbers once handed over, or its error."""
        if self.error is not None:
            raise self.error
        if self.outcome is not None:
            return await self.outcome()
        return self.seqs


HandOver = Callable[[str, SendBatch, QoS, "int | None"], Awaitable[None]]
"""A backend's hand-over of a batch (group, batch, QoS, handler; the batch's ``keys``, if any): sets the batch's
``seqs`` (taken at once) or its ``outcome`` (an answer to come); raises RmpdError when the group refuses the
batch."""


class Coalescer:
    """Sends to one group with one QoS and handler, from tasks that run while the first of them is being prepared,
    handed over as one batch; both backends send this way.  Messages posted to the group go first."""

    def __init__(self, poster: Poster, hand_over: HandOver,
                 room: Callable[[str], Awaitable[None]] | None = None) -> None:
        """``room(group)``: waits until the group may take another batch (None: it always may)."""
        self._poster = poster
        self._hand_over = hand_over
        self._room = room
        self._batches: dict[tuple[str, QoS, int | None, bool], SendBatch] = {}
        """The batch being prepared per group, QoS, handler and whether keyed: a send arriving meanwhile joins
        it."""

    async def send(self, group: str, payload: bytes, qos: QoS, handler: int | None, key: bytes | None = None) -> int:
        """Send ``payload`` (with ``key``, if any) in a batch; its sequence number, or the RmpdError that refused
        the batch."""
        poster = self._poster
        if poster.pending(group):
            await poster.flush(group)
        else:
            poster.check(group)  # a post refused since: raised by this send, as Group.post says
        kind = (group, qos, handler, key is not None)
        batch = self._batches.get(kind)
        if batch is not None and batch.takes(payload):
            return await batch.join(payload, key)
        if self._room is not None:
            await self._room(group)
            batch = self._batches.get(kind)
            if batch is not None and batch.takes(payload):  # another sender started one while we waited
                return await batch.join(payload, key)
        batch = self._batches[kind] = SendBatch(payload, key)
        try:
            await trio.lowlevel.cancel_shielded_checkpoint()  # let other ready tasks join this batch
        finally:
            if self._batches.get(kind) is batch:
                del self._batches[kind]
        try:
            await self._hand_over(group, batch, qos, handler)
        except BaseException as exc:
            # The others in the batch get the refusal, or a lost backend: never this task's own cancellation.
            batch.error = exc if isinstance(exc, RmpdError) else ConnectionLost("send-failed", repr(exc))
            raise
        finally:
            batch.done.set()
        return (await batch.result())[0]


POST_LIMIT = 8192
"""Posted messages a backend holds not yet accepted by the group, at most: ``post`` waits beyond this, so a
program that posts faster than the ring takes messages is slowed to the ring's pace instead of queueing without
bound."""
POST_YIELD_EVERY = 64
"""Posts that return without letting other tasks run: the carrier then hands what gathered over in one batch."""

Submit = Callable[[str, list[bytes], QoS, "int | None", "list[bytes] | None", "int | None"], Awaitable[object]]
"""A backend's batch send: group, payloads, QoS, handler, the payloads' keys (or None), and the post number of the
first payload of a batch without keys (the others follow; None for a keyed batch); raises RmpdError when the group
refuses them."""


class _Run:
    """Consecutive posts to one group with the same QoS and handler, all keyed or none: one batch, bounded as
    concurrent sends are."""

    __slots__ = ("first_id", "handler", "keys", "payloads", "qos", "size")

    def __init__(self, qos: QoS, handler: int | None, first: bytes, key: bytes | None, first_id: int) -> None:
        self.qos = qos
        self.handler = handler
        self.payloads = [first]
        self.keys: list[bytes] | None = None if key is None else [key]
        self.first_id = first_id
        """The post number of the first payload (posts to a group are numbered from 1, keyed or not)."""
        self.size = len(first)

    def takes(self, payload: bytes) -> bool:
        return fits(self.size, len(self.payloads), payload)


class Poster:
    """Messages posted (``Group.post``): queued without waiting, carried to the group by one task per group.

    Each group's posts wait in one queue of runs (consecutive posts with the same QoS and handler), which its
    carrier task hands over a batch at a time, in order, so a group's posted messages get sequence numbers in the
    order they were posted.  A refusal is kept and raised by the group's next post or flush.
    """

    def __init__(self, submit: Submit) -> None:
        self._submit = submit
        self.nursery: trio.Nursery | None = None
        """Where carriers run; set by the backend once it is running."""
        self._queues: dict[str, deque[_Run]] = {}
        """Runs waiting, per group; a group has a queue exactly while its carrier task runs."""
        self._unaccepted = 0
        self._posted: dict[str, int] = {}
        self._settled: dict[str, int] = {}
        """Per group, messages ever posted and ever accepted or refused: posts settle in order, so a flush waits
        for the count it saw posted, not for a moment with nothing pending that a busy poster never leaves."""
        self._errors: dict[str, BaseException] = {}
        self._failed: BaseException | None = None
        self._changed = trio.Event()
        self._since_yield = 0

    def pending(self, group: str) -> int:
        """Messages posted to ``group`` and not yet accepted or refused."""
        return self._posted.get(group, 0) - self._settled.get(group, 0)

    async def post(self, group: str, payload: bytes, qos: QoS, handler: int | None,
                   key: bytes | None = None) -> bytes | int:
        """Queue ``payload`` (with ``key``, if any); what names it in an ``Undelivered``: its key, or its post
        number (the count of messages posted to the group before it, plus one)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.nursery is None:
            raise RuntimeError("post() needs a running backend")
        self.check(group)
        while self._unaccepted >= POST_LIMIT:
            await self._wait_for_change()
            self.check(group)
        queue = self._queues.get(group)
        if queue is None:
            queue = self._queues[group] = deque()
            self.nursery.start_soon(self._carry, group, queue)
        number = self._posted.get(group, 0) + 1
        run = queue[-1] if queue else None
        if (run is not None and run.qos == qos and run.handler == handler and (run.keys is None) == (key is None)
                and run.takes(payload)):
            run.payloads.append(payload)
            if run.keys is not None:
                run.keys.append(key)  # type: ignore[arg-type]  # keyed runs take keyed posts only
            run.size += len(payload)
        else:
            queue.append(_Run(qos, handler, payload, key, number))
        self._unaccepted += 1
        self._posted[group] = number
        self._since_yield += 1
        if self._since_yield >= POST_YIELD_EVERY:
            self._since_yield = 0
            await trio.lowlevel.cancel_shielded_checkpoint()
        return number if key is None else key

    async def flush(self, group: str) -> None:
        """Wait until every message posted to ``group`` before this call is accepted (later posts, from other
        tasks, are not waited for); raise the first refusal since the last one raised."""
        refused = await self.settle(group)
        if refused is not None:
            raise refused

    async def settle(self, group: str) -> BaseException | None:
        """``flush`` that returns the refusal instead of raising it: a leave goes ahead with it and raises it
        after."""
        mark = self._posted.get(group, 0)
        await trio.lowlevel.checkpoint()
        while self._settled.get(group, 0) < mark and self._failed is None:
            await self._wait_for_change()
        return self._errors.pop(group, None) or self._failed

    async def flush_all(self) -> None:
        """Wait until every posted message is accepted, before the backend closes, and raise a refusal not yet
        raised, so that no post vanishes unnoticed.  A lost backend is not raised again here: every post, send
        and flush since the loss has raised it."""
        await trio.lowlevel.checkpoint()
        while self._unaccepted and self._failed is None:
            await self._wait_for_change()
        if self._failed is None:
            for group in list(self._errors):
                self.check(group)

    def fail(self, error: BaseException) -> None:
        """The backend is gone: every waiting and later post and flush ends with ``error``."""
        self._failed = error
        self._changed.set()

    def check(self, group: str) -> None:
        """Raise a refusal of a post to ``group`` not raised yet, or the backend's failure."""
        error = self._errors.pop(group, None) or self._failed
        if error is not None:
            raise error

    async def _wait_for_change(self) -> None:
        if self._changed.is_set():
            self._changed = trio.Event()
        await self._changed.wait()

    async def _carry(self, group: str, queue: deque[_Run]) -> None:
        try:
            while queue:
                run = queue.popleft()
                try:
                    await self._submit(group, run.payloads, run.qos, run.handler, run.keys,
                                       None if run.keys is not None else run.first_id)
                except RmpdError as exc:
                    # Raised by the group's next post, send or flush, naming every post refused until then.
                    first = self._errors.setdefault(group, exc)
                    if isinstance(first, RmpdError):
                        first.refused.extend(run.keys if run.keys is not None else
                                             range(run.first_id, run.first_id + len(run.payloads)))
                finally:
                    self._unaccepted -= len(run.payloads)
                    self._settled[group] = self._settled.get(group, 0) + len(run.payloads)
                    self._changed.set()
        finally:
            del self._queues[group]  # the next post starts a carrier again
