"""Membership views (RMP paper, sections 3.1 and 4.3).

A view is an ordered member list under a unique view ID; the token travels round the list in order.  Members that
cannot receive multicast are listed in ``unicast_only``: multicasts to the view are also unicast to them (section
3.4).  Locks (the first six are handler locks), the minimum partition size and the members' multicast TTLs live in
the view, because they change only through New List packets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ids import ProcessId, ViewId

HANDLER_LOCKS = 6

MAX_LOCK = 1023
"""Locks 0-5 are the handler locks; 6..MAX_LOCK are general mutual-exclusion locks."""

LIBRARY_HANDLER = HANDLER_LOCKS
"""The handler number the client library's own messages carry (state transfer, rmpd.client.state): delivered to
every member like any message, tied to no lock, and kept out of what a program reads from its Group."""

KEYS_HANDLER = LIBRARY_HANDLER + 1
"""The handler number of the engine's own messages that hand the group's key table to a joiner (rmpd.protocol.keys):
ordered like any message and never handed to the application."""


@dataclass(frozen=True)
class View:
    view_id: ViewId
    members: tuple[ProcessId, ...]
    unicast_only: frozenset[ProcessId] = frozenset()
    locks: tuple[tuple[int, ProcessId], ...] = ()
    min_partition: int = 1
    ttls: tuple[tuple[ProcessId, int], ...] = ()
    """The multicast TTL each member asked for when it joined (section 3.1: the group uses the largest)."""
    _index: dict[ProcessId, int] = field(init=False, repr=False, compare=False)
    ttl: int = field(init=False, compare=False)
    """The TTL every member multicasts to the group with: the largest any member asked for, 1 without any."""

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a view needs at least one member")
        if len(set(self.members)) != len(self.members):
            raise ValueError("duplicate member in view")
        object.__setattr__(self, "_index", {pid: i for i, pid in enumerate(self.members)})
        object.__setattr__(self, "ttl", max((t for m, t in self.ttls if m in self._index), default=1))

    @property
    def size(self) -> int:
        return len(self.members)

    def __contains__(self, pid: object) -> bool:
        return pid in self._index

    def index(self, pid: ProcessId) -> int:
        return self._index[pid]

    def next_after(self, pid: ProcessId, step: int = 1) -> ProcessId:
        """The member ``step`` places after ``pid`` in ring order."""
        return self.members[(self._index[pid] + step) % len(self.members)]

    def lock_holder(self, lock: int) -> ProcessId | None:
        return dict(self.locks).get(lock)
