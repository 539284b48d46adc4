"""Memberships the daemon keeps on the operator's behalf, and rejoins by itself every time it starts.

Two sources, as corosync has its configured rings: the config's ``groups`` (what the operator declared), and the
groups joined with a persistent join (``rmp join``, or ``join(persist=True)`` of the client library) until a
persistent leave (``rmp leave``), which are recorded in a file in the state directory.  A daemon started again with
the same config and state directory (``Restart=on-failure`` after a crash, a reboot, ``systemctl restart``) joins
every one of them before it reports ready, with no client connected: it is the member itself, so no program has to
hold the membership.

The file is small JSON, ``{"version": 1, "groups": [{"name": ..., "min_partition": ..., "ttl": ...}]}``, each entry
in the shape of a table of the config's ``groups``.  It is replaced whole on every change (a temporary file,
fsynced, renamed over the old one, then the directory fsynced), so a crash at any point leaves the old list or the
new one, never a torn file; a file that cannot be read is refused at start rather than guessed at, since starting
without it would silently drop memberships the operator asked for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmpd.durable import replace_durably
from rmpd.localapi import MAX_GROUP_NAME, check_group_name, min_partition_name, parse_min_partition

FILE_VERSION = 1
ENTRY_KEYS = {"name", "min_partition", "ttl"}


class MembershipFileError(Exception):
    """The file of kept memberships cannot be read or does not hold a list of memberships."""


@dataclass(frozen=True)
class Membership:
    """One group the daemon keeps, with what it asks for when it joins the group."""

    group: str
    min_partition: int | None = None
    """In the protocol's encoding (0: majority); None: the join names none (the default, 1)."""
    ttl: int | None = None
    """Multicast TTL the join asks for; None: the daemon's ``ttl``."""

    def merged(self, newer: Membership) -> Membership:
        """This membership as a later join of the same group asks for it: what the later one names replaces what
        this one had, and what it leaves out stays (typing ``rmp join G`` again does not drop a majority)."""
        return Membership(self.group,
                          self.min_partition if newer.min_partition is None else newer.min_partition,
                          self.ttl if newer.ttl is None else newer.ttl)

    def as_entry(self) -> dict[str, Any]:
        """The membership as a table of the config's ``groups`` (and an entry of the file): what is not set is
        left out."""
        entry: dict[str, Any] = {"name": self.group}
        if self.min_partition is not None:
            entry["min_partition"] = min_partition_name(self.min_partition)
        if self.ttl is not None:
            entry["ttl"] = self.ttl
        return entry


def parse_membership(value: Any) -> Membership:
    """A group name, or a table with ``name`` and optionally ``min_partition`` (``"majority"``, ``"all"`` or a
    whole number) and ``ttl`` (0..255).  ValueError, one line, for anything else."""
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ValueError(f"a group is a name or a table with name, min_partition, ttl; got {type(value).__name__}")
    unknown = set(value) - ENTRY_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                         f"known: {', '.join(sorted(ENTRY_KEYS))}")
    name = value.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_GROUP_NAME:
        raise ValueError(f"a group needs a name of 1..{MAX_GROUP_NAME} characters, got {name!r}")
    check_group_name(name)
    min_partition = value.get("min_partition")
    if min_partition is not None:
        min_partition = parse_min_partition(min_partition)
    ttl = value.get("ttl")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= 255):
        raise ValueError(f"ttl of {name!r} must be 0..255, got {ttl!r}")
    return Membership(name, min_partition, ttl)


def parse_memberships(values: Any) -> list[Membership]:
    """The config's ``groups``: a list of names or tables, no group twice.  ValueError naming the bad entry."""
    if not isinstance(values, list):
        raise ValueError(f"groups must be a list of group names or tables, got {type(values).__name__}")
    out: list[Membership] = []
    seen: set[str] = set()
    for i, value in enumerate(values):
        try:
            membership = parse_membership(value)
        except ValueError as exc:
            raise ValueError(f"groups[{i}]: {exc}") from None
        if membership.group in seen:
            raise ValueError(f"groups[{i}]: {membership.group!r} is listed twice")
        seen.add(membership.group)
        out.append(membership)
    return out


class MembershipFile:
    """The groups joined with a persistent join, on stable storage (one file per process ID, as SCMP's latest)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.writes = 0

    def load(self) -> dict[str, Membership]:
        """The recorded memberships by group (none when the file does not exist yet); MembershipFileError for a
        file that is not what :meth:`save` writes."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise MembershipFileError(f"{self.path}: {exc}") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != FILE_VERSION:
                raise ValueError(f"not a version {FILE_VERSION} file of memberships")
            return {m.group: m for m in parse_memberships(data.get("groups"))}
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise MembershipFileError(f"{self.path}: {exc}; fix it or remove it (the daemon then rejoins only the "
                                      f"config's groups)") from None

    def save(self, memberships: Iterable[Membership]) -> None:
        """Replace the file with ``memberships``, durably: once this returns, a crash cannot lose the change.
        OSError when the state directory cannot be written (the old file is then untouched)."""
        body = json.dumps({"version": FILE_VERSION,
                           "groups": [m.as_entry() for m in sorted(memberships, key=lambda m: m.group)]},
                          indent=1) + "\n"
        replace_durably(self.path, body.encode("utf-8"))
        self.writes += 1


__all__ = ["Membership", "MembershipFile", "MembershipFileError", "parse_membership", "parse_memberships"]
