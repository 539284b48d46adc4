"""What ``rmp status`` tells of a group beyond its view, and ``rmp status G --all``: every member's status.

The first is what corosync's and Spread's tools show an operator: the group's multicast address and port, whether
it is quorate or blocked below its minimum partition (``rmpd.protocol.quorum``), and the local clients attached
to it, by process ID and user (SO_PEERCRED of their connection).  The second gathers a member's row of each member
of the group through the group itself (``rmpd.protocol.statusquery``: a Status Query to each member of the view,
answered with a Status Report, outside the order and sealed with the group's key like its other packets), as
Spread's spmonitor and JGroups' probe do; a member that does not answer within the timeout is shown as such.

A report comes from the network: it is read as an untrusted msgpack map, and one that is not is shown as an
unreadable answer of that member, counted, never passed on as the member's status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from rmpd.localapi import FrameError, decode_body_untrusted, min_partition_name

if TYPE_CHECKING:  # `rmp status` reads the limits below without loading the daemon's runtime
    from rmpd.protocol.events import StatusAsked, StatusGathered
    from rmpd.runtime.loop import ProcessLoop

    from .session import Session

REPORTED_CLIENTS = 64
"""Local clients a report lists at most (their number is always given): a report must fit one datagram."""
REPORTED_MEMBERS = 512
"""Members of its view a report lists at most (their number is always given), for the same reason."""
REPORTED_COUNTERS = ("delivered", "sent", "received", "data_retransmits", "gap_nacks_sent", "reformations")
"""The membership's counters a report carries (the local status has them all)."""
DEFAULT_GATHER_TIMEOUT = 2.0
"""Seconds ``rmp status G --all`` waits for the members' answers unless told otherwise."""
MAX_GATHER_TIMEOUT = 60.0
"""The longest a local client may have a gathering wait (each waits in the process until its timeout)."""


class Reply(Protocol):
    """Whoever waits for a gathering: the hub's parked request."""

    session: Session

    def ok(self, fields: dict[str, Any]) -> None: ...


def local_clients(sessions: Iterable[Session]) -> list[dict[str, Any]]:
    """The local clients attached to a group, by connection: their process ID and user ID (None where the socket
    does not say), the frames queued for them and those they will not get (``dropped``), in the order they
    connected."""
    clients = []
    for session in sorted(sessions, key=lambda s: s.id):
        pid, uid = session.peer[:2] if session.peer is not None else (None, None)
        clients.append({"client": session.id, "pid": pid, "uid": uid, "queued": session.queued_frames,
                        "dropped": session.dropped})
    return clients


def group_details(loop: ProcessLoop, group: str, sessions: Iterable[Session]) -> dict[str, Any]:
    """The fields ``rmp status`` adds to a group: ``address`` (``ip:port`` of its multicast), ``quorum`` (``state``,
    ``quorate``, ``members`` counted, ``needed``; None when the process holds nothing of the group),
    ``local_clients`` and the membership's ``group_counters``."""
    address, port = loop.group_address(group)
    quorum = loop.quorum(group)
    status = loop.status(group)
    return {
        "address": f"{address}:{port}",
        "quorum": None if quorum is None else {"state": quorum.state, "quorate": quorum.quorate,
                                               "members": quorum.members, "needed": quorum.needed},
        "local_clients": local_clients(sessions),
        "group_counters": dict(sorted(status.counters().items())) if status is not None else {},
    }


def member_row(loop: ProcessLoop, group: str, sessions: Iterable[Session]) -> dict[str, Any]:
    """This member's row of ``rmp status G --all``: what it answers a Status Query with."""
    view = loop.view(group)
    details = group_details(loop, group, sessions)
    clients = details["local_clients"]
    counters = details["group_counters"]
    return {
        "pid": loop.pid,
        "view": str(view.view_id) if view is not None else None,
        "members": list(view.members[:REPORTED_MEMBERS]) if view is not None else [],
        "member_count": view.size if view is not None else 0,
        "min_partition": min_partition_name(view.min_partition) if view is not None else None,
        "quorum": details["quorum"],
        "address": details["address"],
        "clients": len(clients),
        "local_clients": clients[:REPORTED_CLIENTS],
        "counters": {name: counters.get(name, 0) for name in REPORTED_COUNTERS},
    }


def read_report(report: bytes) -> dict[str, Any] | None:
    """A member's report as a map with string keys, or None when it is not one."""
    try:
        return decode_body_untrusted(report)
    except FrameError:
        return None


class StatusGatherer:
    """``rmp status G --all`` at one daemon: its own queries waiting for their answers, and its answers to
    every member's queries."""

    def __init__(self, loop: ProcessLoop, sessions_of: Callable[[str], Iterable[Session]],
                 stats: MutableMapping[str, int]) -> None:
        self.loop = loop
        self.sessions_of = sessions_of
        """The local clients attached to a group (the hub's)."""
        self.stats = stats
        self.waiting: dict[int, Reply] = {}
        """Gatherings asked for by local clients, by query number."""

    def start(self, group: str, timeout: float, reply: Reply) -> None:
        """Ask every member of ``group``; ``reply`` is answered once all did or ``timeout`` passed.  NotMember
        when this daemon has no view of the group (nor a last one, waiting to rejoin it)."""
        # Drained once the reply waits: this daemon answers itself within the step, and in a group of one the
        # gathering ends there too.
        with self.loop.one_step():
            query = self.loop.ask_status(group, timeout)
            self.waiting[query] = reply

    def forget(self, session: Session) -> None:
        """A client went away: its gatherings go on, and their answers are dropped."""
        for query in [q for q, reply in self.waiting.items() if reply.session is session]:
            del self.waiting[query]

    def asked(self, event: StatusAsked) -> None:
        """A member (this one too) asks for this daemon's row of the group."""
        row = member_row(self.loop, event.group, self.sessions_of(event.group))
        self.loop.answer_status(event.asker, event.group, event.query, msgpack.packb(row, use_bin_type=True))
        self.stats["status_answered"] += 1

    def gathered(self, event: StatusGathered) -> None:
        """A gathering ended: its client gets one row per member asked, answered or not."""
        reply = self.waiting.pop(event.query, None)
        if reply is None:
            return
        reports = dict(event.reports)
        rows = []
        for member in event.members:
            if member not in reports:
                rows.append({"pid": member, "answered": False})
                continue
            row = read_report(reports[member])
            if row is None:
                self.stats["status_reports_unreadable"] += 1
                rows.append({"pid": member, "answered": True, "error": "the member's report is not a msgpack map"})
                continue
            rows.append({**row, "pid": member, "answered": True})
        reply.ok({"group": event.group, "asked": len(event.members), "answered": len(reports), "members": rows})
