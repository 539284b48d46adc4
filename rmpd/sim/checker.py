"""In-process invariant checker: every journal record of every simulated process, checked as it happens.

The simulator sees all processes at once, on one clock, so it can check what no single process can: one canonical
order of timestamps, that each token acceptance really held every packet ordered so far, and that a K-resilient
message was held by K members at the moment anyone delivered it.  Invariant names match ``rmp audit``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..protocol.qos import Level, QoS

DataKey = tuple[str, int]


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


@dataclass(frozen=True)
class SentMessage:
    src: str
    seq: int
    qos: QoS
    payload: bytes


class InvariantChecker:
    """Feed it ``sent`` messages and journal ``records``; read ``violations``."""

    MAX_VIOLATIONS = 50

    def __init__(self, members: list[str], view_size: int) -> None:
        self.members = members
        self.view_size = view_size
        self.violations: list[Violation] = []
        self.violation_count = 0
        self.sent: dict[tuple[str, int, bool], SentMessage] = {}
        self.source_seqs: dict[str, list[int]] = defaultdict(list)
        """Per sender, the sequence numbers it sent with QoS >= source, in order."""
        # Canonical history: timestamp -> ("ack", src) or ("data", key).
        self.history: dict[int, tuple[str, Any]] = {}
        # Per node: what it holds, what it delivered.
        self.has_data: dict[str, set[DataKey]] = defaultdict(set)
        self.has_ack: dict[str, set[int]] = defaultdict(set)
        self.holders: dict[DataKey, set[str]] = defaultdict(set)
        self.delivered: dict[str, set[DataKey]] = defaultdict(set)
        self.delivered_count = 0
        self.last_total_ts: dict[str, int] = {}
        self.total_ts: dict[str, list[int]] = defaultdict(list)
        self.source_cursor: dict[tuple[str, str], int] = defaultdict(int)
        self.token_checked: dict[str, int] = defaultdict(int)

    def fail(self, invariant: str, detail: str) -> None:
        self.violation_count += 1
        if len(self.violations) < self.MAX_VIOLATIONS:
            self.violations.append(Violation(invariant, detail))

    # --------------------------------------------------------------------------------------------------------------

    def on_send(self, message: SentMessage) -> None:
        reliable = message.qos.level != Level.UNRELIABLE
        self.sent[(message.src, message.seq, reliable)] = message
        if message.qos.level >= Level.SOURCE:
            self.source_seqs[message.src].append(message.seq)

    def on_record(self, rec: dict[str, Any], payload: bytes | None = None) -> None:
        event = rec["event"]
        node = rec["node"]
        if event == "deliver":
            self._on_deliver(node, rec, payload)
        elif event in ("send", "recv"):
            kind = rec["packet"]
            if kind == "data":
                if rec["qos"] != "unreliable":
                    key = (rec["src"], rec["seq"])
                    self.has_data[node].add(key)
                    self.holders[key].add(node)
            elif kind == "ack":
                self._on_ack(node, rec)
        elif event == "token":
            self._on_token(node, rec["ts"])

    def _on_ack(self, node: str, rec: dict[str, Any]) -> None:
        ts = rec["ts"]
        self.has_ack[node].add(ts)
        entries = [(ts, ("ack", rec["src"]))]
        entries += [(ts + 1 + i, ("data", (s, n))) for i, (s, n, _) in enumerate(rec["orders"])]
        for at, entry in entries:
            known = self.history.setdefault(at, entry)
            if known != entry:
                self.fail("one-order", f"timestamp {at} holds {known} at one process and {entry} at {node}")

    def _on_token(self, node: str, through: int) -> None:
        start = self.token_checked[node]
        for ts in range(start, through + 1):
            entry = self.history.get(ts)
            if entry is None:
                if ts == 0:
                    continue
                self.fail("token-acceptance", f"{node} accepted the token through {through}; ts {ts} never ordered")
                return
            kind, what = entry
            held = ts in self.has_ack[node] if kind == "ack" else what in self.has_data[node]
            if not held:
                self.fail("token-acceptance", f"{node} accepted the token through {through} without ts {ts} ({entry})")
                return
        self.token_checked[node] = max(start, through + 1)

    def _on_deliver(self, node: str, rec: dict[str, Any], payload: bytes | None) -> None:
        qos = QoS.parse(rec["qos"])
        src, seq, ts = rec["src"], rec["seq"], rec["ts"]
        reliable = qos.level != Level.UNRELIABLE
        sent = self.sent.get((src, seq, reliable))
        if sent is None or sent.qos != qos or (payload is not None and payload != sent.payload):
            self.fail("integrity", f"{node} delivered {src}#{seq} ({qos.name()}) that was not sent so")
            return
        if not reliable:
            return
        key = (src, seq)
        if key in self.delivered[node]:
            self.fail("no-duplicate", f"{node} delivered {src}#{seq} twice")
            return
        self.delivered[node].add(key)
        self.delivered_count += 1
        if qos.level >= Level.SOURCE:
            self._check_source_order(node, src, seq)
        if qos.level >= Level.TOTAL:
            if ts is None:
                self.fail("total-order", f"{node} delivered {src}#{seq} ({qos.name()}) without a timestamp")
                return
            if self.history.get(ts) != ("data", key):
                self.fail("one-order", f"{node} delivered {src}#{seq} at ts {ts}; history says {self.history.get(ts)}")
            last = self.last_total_ts.get(node, -1)
            if ts <= last:
                self.fail("total-order", f"{node} delivered ts {ts} after ts {last}")
            self.last_total_ts[node] = ts
            self.total_ts[node].append(ts)
        if qos.level >= Level.K_RESILIENT:
            need = qos.required_holders(self.view_size)
            have = len(self.holders[key])
            if have < need:
                self.fail("k-resilience", f"{node} delivered {src}#{seq} ({qos.name()}) held by {have} < {need}")

    def _check_source_order(self, node: str, src: str, seq: int) -> None:
        seqs = self.source_seqs[src]
        delivered = self.delivered[node]
        cursor = self.source_cursor[(node, src)]
        while cursor < len(seqs) and (src, seqs[cursor]) in delivered:
            cursor += 1
        self.source_cursor[(node, src)] = cursor
        if cursor < len(seqs) and seqs[cursor] < seq:
            self.fail("source-order", f"{node} delivered {src}#{seq} before {src}#{seqs[cursor]}")

    # --------------------------------------------------------------------------------------------------------------

    def finish(self) -> None:
        """End-of-run checks: every member delivered the same totally ordered sequence, without gaps."""
        canonical = sorted({ts for seqs in self.total_ts.values() for ts in seqs})
        for node in self.members:
            mine = self.total_ts.get(node, [])
            if mine != canonical[: len(mine)]:
                first = next((a for a, b in zip(mine, canonical, strict=False) if a != b), None)
                self.fail("total-order", f"{node} skipped a totally ordered message (first difference at ts {first})")
