"""Frames to a group's local clients: each encoded once for all of them, and a drain's deliveries gathered into
as few frames as possible.

Several local clients may be attached to one group; each delivery is fanned out to all of them in the order the
engine delivered it, one ``deliveries`` frame per group per drain (split past DELIVERY_FRAME_BYTES), whatever the
number of clients: a busy group costs one frame per batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rmpd import localapi
from rmpd.localapi import encode_frame
from rmpd.protocol.events import Delivered

from .attachments import Attachments
from .locks import LockOwners

DELIVERY_FRAME_BYTES = 4 * 1024 * 1024
"""Payload bytes gathered into one deliveries frame before another is started."""


class Fanout:
    """What the current drain delivered, per group, until it is pushed to the group's clients."""

    def __init__(self, attachments: Attachments, locks: LockOwners) -> None:
        self.attachments = attachments
        self.locks = locks
        self._gathered: defaultdict[str, list[Delivered]] = defaultdict(list)

    def gather(self, event: Delivered) -> None:
        """A packet delivered: sent with the rest of the drain's, or before the group's next other event."""
        self._gathered[event.group].append(event)

    def flush(self, group: str | None = None) -> None:
        """Push gathered deliveries (of one group, or of all) to the group's clients, in delivery order."""
        if not self._gathered:
            return
        for name in [group] if group is not None else list(self._gathered):
            runs = self._gathered.pop(name, None)
            if not runs:
                continue
            start = size = 0
            last = len(runs) - 1
            for i, run in enumerate(runs):
                size += sum(map(len, run.payloads))
                if size >= DELIVERY_FRAME_BYTES or i == last:
                    self._deliver(name, runs[start:i + 1])
                    start, size = i + 1, 0

    def _deliver(self, group: str, runs: list[Delivered]) -> None:
        """One deliveries frame to the group's clients; where this process is to answer a message (it holds the
        handler's lock), the client holding the lock gets a frame of its own that says so, the others one that
        does not."""
        if not any(run.answer for run in runs):
            self.to_group(group, localapi.deliveries_event(group, runs))
            return
        client_of = self.locks.client_of
        for client in list(self.attachments.clients(group)):
            def answers(run: Delivered, client: object = client) -> bool:
                return run.answer and client_of(group, run.handler) is client
            client.push_encoded(encode_frame(localapi.deliveries_event(group, runs, answers)))

    def to_group(self, group: str, message: dict[str, Any]) -> None:
        """One frame to every client of ``group``, encoded once for all of them."""
        clients = list(self.attachments.clients(group))
        if not clients:
            return
        frame = encode_frame(message)
        for client in clients:
            client.push_encoded(frame)


__all__ = ["DELIVERY_FRAME_BYTES", "Fanout"]
