"""Which local clients are attached to which group, and which of them take part in its state transfer."""

from __future__ import annotations

from collections.abc import Collection

from .ports import Outlet


class Attachments:
    """The local clients of each group, kept both ways: a group's events go to its clients, and a client that goes
    away is detached from each of its groups.

    A client joined with ``state`` takes part in the group's state transfer: a client that attaches later is not
    alone with the state (``state_peers``), and when a participant leaves a group the daemon stays in, the group's
    programs are told (the translator's ``state_participant_gone``)."""

    def __init__(self) -> None:
        self._clients: dict[str, set[Outlet]] = {}
        self._groups: dict[Outlet, set[str]] = {}
        self._state: dict[Outlet, set[str]] = {}

    def clients(self, group: str) -> Collection[Outlet]:
        """The clients attached to ``group`` (empty when none)."""
        return self._clients.get(group, ())

    def groups(self) -> list[str]:
        """The groups with at least one client attached."""
        return list(self._clients)

    def groups_of(self, client: Outlet) -> list[str]:
        return sorted(self._groups.get(client, ()))

    def is_attached(self, client: Outlet, group: str) -> bool:
        return group in self._groups.get(client, ())

    def attach(self, client: Outlet, group: str, *, state: bool) -> int:
        """Attach ``client`` to ``group`` (again: its ``state`` is what this join says).  Returns how many other
        clients of the group take part in its state transfer."""
        peers = sum(1 for other in self._clients.get(group, ()) if other is not client
                    and group in self._state.get(other, ()))
        if not self.is_attached(client, group):
            self._clients.setdefault(group, set()).add(client)
            self._groups.setdefault(client, set()).add(group)
        if state:
            self._state.setdefault(client, set()).add(group)
        return peers

    def detach(self, client: Outlet, group: str) -> tuple[bool, bool]:
        """Detach ``client`` from ``group``: whether that left the group without clients, and whether the client
        took part in its state transfer."""
        took_part = group in self._state.get(client, ())
        self._discard(client, group)
        return group not in self._clients, took_part

    def end(self, group: str) -> list[Outlet]:
        """The daemon's membership of ``group`` ended: every client is detached from it; returns them."""
        clients = list(self._clients.get(group, ()))
        for client in clients:
            self._discard(client, group)
        return clients

    def _discard(self, client: Outlet, group: str) -> None:
        clients = self._clients.get(group)
        if clients is not None:
            clients.discard(client)
            if not clients:
                del self._clients[group]
        for table in (self._groups, self._state):
            groups = table.get(client)
            if groups is not None:
                groups.discard(group)
                if not groups:
                    del table[client]


__all__ = ["Attachments"]
