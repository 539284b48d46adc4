"""The memberships the daemon keeps with no client attached, and their record for the next start.

A group is kept when the config lists it or a persistent join (``rmp join``) asked for it: the daemon stays a
member when its last client leaves.  A persistent join is recorded (rmpd.daemon.memberships.MembershipFile)
durably before the join goes ahead, so an answered ``rmp join`` survives a crash; a persistent leave takes the
record back.  A join that recorded its group and then failed takes its record back too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, MutableMapping

from rmpd import localapi
from rmpd.localapi import RequestError

from .memberships import Membership, MembershipFile

log = logging.getLogger("rmpd")


class KeptMemberships:
    """Which groups are kept, and what the file of kept memberships holds."""

    def __init__(self, file: MembershipFile | None, stats: MutableMapping[str, int]) -> None:
        self.file = file
        """Where persistent joins are recorded for the next start (None: nowhere, they end with the process)."""
        self.stats = stats
        self._kept: set[str] = set()
        self.recorded: dict[str, Membership] = {}
        """What the file holds: the groups joined with a persistent join and not left with a persistent leave."""
        self._unconfirmed: set[str] = set()
        """Groups recorded by a persistent join still on its way: a join that fails takes its record back."""

    def keeps(self, group: str) -> bool:
        return group in self._kept

    def groups(self) -> set[str]:
        return set(self._kept)

    def keep(self, group: str) -> None:
        self._kept.add(group)

    def drop(self, group: str) -> None:
        """No longer kept (its record, if any, is left as it is)."""
        self._kept.discard(group)

    def is_recorded(self, group: str) -> bool:
        return group in self.recorded

    def reread(self, recorded: dict[str, Membership]) -> None:
        """The file as read at start or at a reload."""
        self.recorded = dict(recorded)
        self._unconfirmed &= recorded.keys()

    def record(self, membership: Membership) -> None:
        """A persistent join: keep the membership for the next start, durably, before the join goes ahead.
        RequestError state-unwritable (nothing changed) when the state directory cannot be written."""
        old = self.recorded.get(membership.group)
        new = old.merged(membership) if old is not None else membership
        if new == old:
            return
        self._save({**self.recorded, new.group: new})
        if old is None:
            self._unconfirmed.add(new.group)

    def unrecord(self, group: str) -> None:
        """A persistent leave: the next start no longer rejoins the group (RequestError state-unwritable, nothing
        changed, when the state directory cannot be written)."""
        self._unconfirmed.discard(group)
        if group in self.recorded:
            self._save({g: m for g, m in self.recorded.items() if g != group})

    def confirmed(self, group: str) -> None:
        """The daemon is a member of ``group``: a persistent join's record stands."""
        self._unconfirmed.discard(group)

    def join_failed(self, group: str) -> None:
        """A join of ``group`` failed: a record its persistent join made goes.  A group that was left keeps its
        record: the daemon was a member on the operator's behalf, and the next start rejoins it."""
        if group in self._unconfirmed:
            try:
                self.unrecord(group)
            except RequestError as exc:
                log.error("%s", exc.message)

    def wanted(self, configured: Iterable[Membership]) -> dict[str, Membership]:
        """Every group to keep: those recorded and those of the config (its settings win: the config is what the
        operator edits)."""
        return {**self.recorded, **{m.group: m for m in configured}}

    def _save(self, recorded: dict[str, Membership]) -> None:
        if self.file is not None:
            try:
                self.file.save(recorded.values())
            except OSError as exc:
                self.stats["memberships_unsaved"] += 1
                raise RequestError(localapi.STATE_UNWRITABLE,
                                   f"cannot record memberships in {self.file.path}: {exc.strerror or exc}") from None
        self.recorded = recorded


__all__ = ["KeptMemberships"]
