"""Watching the views: every host asked for its view of the group, round after round, the whole run long."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import trio

from .cluster import GROUP, Cluster

POLL = 0.25
"""Seconds between two looks at every host's view."""


@dataclass(frozen=True)
class Look:
    """One round of asking every host for its view of the group."""

    start: float
    end: float
    views: tuple[tuple[str, tuple[str, ...]] | None, ...]
    one_view: bool


class Monitor:
    """Asks every daemon for its view of the group every POLL seconds, through its local socket, and keeps every
    round: when the hosts were one view of all of them is read from this history afterwards."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.looks: list[Look] = []
        self.everyone = tuple(sorted(cluster.pid(h) for h in cluster.hosts))

    async def run(self) -> None:
        while True:
            await self.look()
            await trio.sleep(POLL)

    async def look(self) -> Look:
        start = trio.current_time()
        views: list[tuple[str, tuple[str, ...]] | None] = [None] * self.cluster.n

        async def ask(index: int, host: int) -> None:
            views[index] = await view_of(self.cluster.socket(host), GROUP)

        async with trio.open_nursery() as nursery:
            for index, host in enumerate(self.cluster.hosts):
                nursery.start_soon(ask, index, host)
        one = (all(v is not None for v in views) and len({v[0] for v in views if v is not None}) == 1
               and all(v is not None and tuple(sorted(v[1])) == self.everyone for v in views))
        look = Look(start, trio.current_time(), tuple(views), one)
        self.looks.append(look)
        return look

    def first_one_view(self, after: float, before: float = math.inf) -> float | None:
        """When a round begun at or after ``after`` first saw one view of all hosts (its end), if before
        ``before``."""
        for look in self.looks:
            if look.start >= after and look.one_view and look.end <= before:
                return look.end
        return None

    def split(self, start: float, end: float) -> bool:
        """Whether a look begun between ``start`` and ``end`` found the hosts not in one view of all of them."""
        return any(not look.one_view for look in self.looks if start <= look.start <= end)

    async def wait_one_view(self, after: float, timeout: float) -> float | None:
        with trio.move_on_after(timeout):
            while True:
                seen = self.first_one_view(after)
                if seen is not None:
                    return seen
                await trio.sleep(POLL / 2)
        return None


async def view_of(socket_path: Path, group: str) -> tuple[str, tuple[str, ...]] | None:
    """A daemon's view of ``group`` (view ID, members), or None: not running, not a member, or no answer in 2 s."""
    import rmpd

    with trio.move_on_after(2.0):
        try:
            async with rmpd.connect(socket_path) as client:
                reply = await client.request("members", group=group)
                return str(reply["view"]), tuple(reply["members"])
        except (rmpd.RmpdError, OSError):
            return None
    return None
