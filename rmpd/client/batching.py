"""Concurrent sends to one group coalesced into one batch, for both backends (daemon connection, embedded Node).

Sends from tasks that run while the first of them is being prepared join its batch; the batch goes to the daemon
as one ``send_batch`` request, or to the embedded engine in one call, where its messages are packed into as few
packets as they fit (``GroupEngine.send_batch``).  Order is kept: each waiter takes its sequence number by its
position in the batch.  A lone send waits one scheduling step.
"""

from __future__ import annotations

import trio

BATCH_BYTES = 256 * 1024
"""Payload bytes one batch carries at most."""
MAX_BATCH = 4096
"""Messages one batch carries at most (the daemon's limit for one send_batch request)."""


class SendBatch:
    """Sends coalesced into one request; each waiter takes its sequence number by position."""

    __slots__ = ("done", "error", "payloads", "seqs", "size")

    def __init__(self, first: bytes) -> None:
        self.payloads = [first]
        self.size = len(first)
        self.seqs: list[int] = []
        self.done = trio.Event()
        self.error: BaseException | None = None

    def takes(self, payload: bytes) -> bool:
        return self.size + len(payload) <= BATCH_BYTES and len(self.payloads) < MAX_BATCH

    async def join(self, payload: bytes) -> int:
        """Add ``payload`` and wait for the batch to be sent; its sequence number, or the batch's error."""
        index = len(self.payloads)
        self.payloads.append(payload)
        self.size += len(payload)
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.seqs[index]
