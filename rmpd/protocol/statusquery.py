"""Asking every member of a group for its status, and answering such questions (``rmp status G --all``).

Outside the order, as Alives are: a member asks each member of its view with a Status Query, unicast; each
answers its asker with a Status Report carrying its application's snapshot, which the protocol does not read.  A
stalled ring (a member just killed, a reformation) does not hold the answers back, so a member that does not
answer within the timeout is one that is gone or cannot be reached.  The datagrams go through the same key as the
group's other packets (rmpd.wire.sealing), so only holders of a keyed group's key can ask or answer.

The answer goes to the datagram's source, not to an address the packet names, and each process answers at most
``ANSWER_BURST`` queries at once and ``ANSWERS_PER_SECOND`` after that: a forged source can make a process send a
report to a stranger, but only at that rate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .events import StatusAsked, StatusGathered, Transmit
from .ids import ProcessId
from .outbox import OutputLists
from .packets import StatusQuery, StatusReport, encode

ANSWERS_PER_SECOND = 10.0
ANSWER_BURST = 20
"""Queries answered at once before the rate above applies (a status of every member of a group of 20, asked
twice at once from one host, say)."""


@dataclass
class Gathering:
    """One ``ask`` waiting for its answers."""

    group: str
    members: tuple[ProcessId, ...]
    deadline: float
    reports: dict[ProcessId, bytes] = field(default_factory=dict)


class StatusQueries:
    """The queries this process asked and waits for, and the rate at which it answers others'."""

    def __init__(self, pid: ProcessId, out: OutputLists, stats: Counter[str]) -> None:
        self.pid = pid
        self.out = out
        self.stats = stats
        self.asked: dict[int, Gathering] = {}
        self._next_query = 1
        self._allowance = float(ANSWER_BURST)
        self._allowance_at: float | None = None

    def ask(self, group: str, members: tuple[ProcessId, ...], now: float, timeout: float) -> int:
        """Ask each of ``members`` (this process among them, answered like any other) for its status of
        ``group``; a ``StatusGathered`` with the query's number follows, by ``now + timeout`` at the latest."""
        query = self._next_query
        self._next_query += 1
        self.asked[query] = Gathering(group, members, now + timeout)
        data = encode(StatusQuery(group, self.pid, query))
        for member in members:
            if member == self.pid:
                self.out.events.append(StatusAsked(group, self.pid, query))
            else:
                self.out.datagrams.append(Transmit(member, data))
        self.stats["status_queries_sent"] += 1
        return query

    def received_query(self, packet: StatusQuery, source: ProcessId, in_group: bool, now: float) -> None:
        """Another process asks: the application is asked to answer when this process is in (or waits to rejoin)
        the group and the answer rate allows it."""
        if not in_group:
            self.stats["status_queries_refused"] += 1
            return
        if not self._take_allowance(now):
            self.stats["status_queries_limited"] += 1
            return
        self.out.events.append(StatusAsked(packet.group, source, packet.query))

    def answer(self, asker: ProcessId, group: str, query: int, report: bytes) -> None:
        """The application's answer to a ``StatusAsked``."""
        if asker == self.pid:
            self._reported(query, group, self.pid, report)
            return
        try:
            data = encode(StatusReport(group, self.pid, query, report))
        except ValueError:  # over one datagram: the application's report must be smaller
            self.stats["status_reports_too_large"] += 1
            return
        self.out.datagrams.append(Transmit(asker, data))
        self.stats["status_queries_answered"] += 1

    def received_report(self, packet: StatusReport, source: ProcessId) -> None:
        if packet.src != source:
            self.stats["status_reports_dropped"] += 1  # a member answers for itself only
            return
        self._reported(packet.query, packet.group, packet.src, packet.report)

    def _reported(self, query: int, group: str, member: ProcessId, report: bytes) -> None:
        gathering = self.asked.get(query)
        if gathering is None or gathering.group != group or member not in gathering.members:
            self.stats["status_reports_dropped"] += 1  # late, or not asked
            return
        gathering.reports.setdefault(member, report)
        if len(gathering.reports) == len(gathering.members):
            self._finish(query)

    def handle_timer(self, now: float) -> None:
        for query in [q for q, g in self.asked.items() if g.deadline <= now]:
            self._finish(query)

    def get_timer(self) -> float | None:
        return min((g.deadline for g in self.asked.values()), default=None)

    def _finish(self, query: int) -> None:
        gathering = self.asked.pop(query)
        reports = tuple((m, gathering.reports[m]) for m in gathering.members if m in gathering.reports)
        self.out.events.append(StatusGathered(gathering.group, query, gathering.members, reports))

    def _take_allowance(self, now: float) -> bool:
        """A token bucket of ANSWER_BURST answers, refilled at ANSWERS_PER_SECOND."""
        if self._allowance_at is not None:
            self._allowance = min(float(ANSWER_BURST),
                                  self._allowance + (now - self._allowance_at) * ANSWERS_PER_SECOND)
        self._allowance_at = now
        if self._allowance < 1.0:
            return False
        self._allowance -= 1.0
        return True
