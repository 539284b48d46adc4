"""In-process invariant checker: what every simulated process does, checked as it happens.

The simulator sees all processes at once, on one clock, so it can check what no single process can: one canonical
order per view, that each token acceptance really held every packet ordered so far, that a K-resilient message was
held by K members at the moment anyone delivered it, and that members moving through the same two views delivered
the same messages in between; with keyed messages, ``exactly-once`` (exactly_once.py).  Invariant names match
``rmp audit``.  It is told what processes do as typed observations (observations.py), read from their journal
records and events.

Processes are named by ``node`` keys that include an incarnation (``ip:port#n``), so a crashed and restarted
process, which comes back as a new member, is checked as a new process.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.qos import Level, QoS
from .exactly_once import ExactlyOnce, as_sent
from .observations import (
    AckHeld,
    DataHeld,
    MembershipEnded,
    MessageDelivered,
    Observation,
    ReformationCommitted,
    Reincarnated,
    TokenAccepted,
    ViewEntered,
)

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
    payload: bytes | tuple[bytes, ...]
    keys: tuple[bytes, ...] = ()
    """The messages' keys, one per payload, for keyed messages; none for messages sent without."""

    @property
    def payloads(self) -> tuple[bytes, ...]:
        return self.payload if isinstance(self.payload, tuple) else (self.payload,)

    def delivers(self, payloads: tuple[bytes, ...] | None, keys: tuple[bytes, ...] | None,
                 duplicates: tuple[bytes, ...]) -> bool:
        """A delivery of this packet hands over what was sent (``payloads`` None: not compared), less the keyed
        copies the group left out as delivered already."""
        if not self.keys:
            return keys is None and not duplicates and (payloads is None or payloads == self.payloads)
        kept = as_sent(tuple(zip(self.payloads, self.keys, strict=True)), keys or (), duplicates)
        return kept is not None and (payloads is None or payloads == kept)


class InvariantChecker:
    """Tell it the messages sent (``on_send``) and what processes did (``observe``); read ``violations``."""

    MAX_VIOLATIONS = 50

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.violation_count = 0
        self.sent: dict[tuple[str, int, bool], SentMessage] = {}
        # Canonical history per view: ts -> ("ack", sender) or ("data", key), from ACKs as sent.
        self.history: dict[str, dict[int, tuple[str, Any]]] = defaultdict(dict)
        self.view_start: dict[str, int] = {}
        self.view_members: dict[str, tuple[str, ...]] = {}
        # Per node: what it holds, what it delivered, where it is.
        self.has_data: dict[str, set[DataKey]] = defaultdict(set)
        self.has_ack: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self.holders: dict[DataKey, set[str]] = defaultdict(set)
        self.delivered: dict[str, set[DataKey]] = defaultdict(set)
        self.delivered_count = 0
        self.deliveries: dict[str, list[tuple[str, DataKey, float]]] = defaultdict(list)
        self.last_total: dict[str, tuple[str, int]] = {}
        self.last_source: dict[tuple[str, str], int] = {}
        self.total_in_view: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.source_in_view: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        """Per (node, view, source): sequence numbers of source-ordered-or-above messages delivered."""
        self.at_position: dict[tuple[str, int], DataKey] = {}
        self.resilient_position: dict[DataKey, tuple[str, int]] = {}
        self.views_of: dict[str, list[str]] = defaultdict(list)
        self.locks_of_view: dict[str, dict[int, str]] = {}
        self.token_checked: dict[str, int] = {}
        self.reformed: dict[str, tuple[str, ...]] = {}
        """Views made by a reformation, with their members: all they hold up to the sync point is stable."""
        self.exactly_once = ExactlyOnce(self.fail)
        self._observers: dict[type, Callable[[Any], None]] = {
            DataHeld: self._on_data_held, AckHeld: self._on_ack, TokenAccepted: self._on_token,
            ViewEntered: self._on_view, ReformationCommitted: self._on_reformed, MessageDelivered: self._on_deliver,
            MembershipEnded: self._on_membership_ended, Reincarnated: self._on_reincarnated,
        }
        """Each kind of observation and the check it feeds."""

    def fail(self, invariant: str, detail: str) -> None:
        self.violation_count += 1
        if len(self.violations) < self.MAX_VIOLATIONS:
            self.violations.append(Violation(invariant, detail))

    # --------------------------------------------------------------------------------------------------------------

    def on_send(self, message: SentMessage) -> None:
        """Record a message handed to a process; messages packed into one packet share its seq, in order."""
        key = (message.src, message.seq, message.qos.level != Level.UNRELIABLE)
        earlier = self.sent.get(key)
        if earlier is not None and earlier.qos == message.qos:
            self.sent[key] = SentMessage(message.src, message.seq, message.qos, (*earlier.payloads, *message.payloads),
                                         (*earlier.keys, *message.keys))
        else:
            self.sent[key] = message

    def observe(self, observation: Observation) -> None:
        self._observers[type(observation)](observation)

    def _on_data_held(self, held: DataHeld) -> None:
        key = (held.src, held.seq)
        self.has_data[held.node].add(key)
        self.holders[key].add(held.node)

    def _on_reformed(self, commit: ReformationCommitted) -> None:
        self.reformed[commit.new_view] = commit.members

    def _on_ack(self, ack: AckHeld) -> None:
        view, ts = ack.view, ack.ts
        self.has_ack[ack.node].add((view, ts))
        history = self.history[view]
        claims = [(ts, ("ack", ack.src))] + [(ts + 1 + i, ("data", key)) for i, key in enumerate(ack.orders)]
        for at, claim in claims:
            known = history.setdefault(at, claim)
            if known != claim:
                self.fail("one-order", f"view {view} ts {at}: an ACK from {ack.src} orders {claim[1]}, "
                                       f"another ordered {known[1]}")
                return

    def _on_token(self, token: TokenAccepted) -> None:
        node, view, through = token.node, token.view, token.through
        start = max(self.token_checked.get(node, 0), self.view_start.get(view, 0) + 1)
        history = self.history[view]
        for ts in range(start, through + 1):
            entry = history.get(ts)
            if entry is None:
                continue  # a New List slot, or ordered in an earlier view
            kind, what = entry
            held = (view, ts) in self.has_ack[node] if kind == "ack" else what in self.has_data[node]
            if not held:
                self.fail("token-acceptance", f"{node} accepted the token through {through} without ts {ts} ({entry})")
                return
        self.token_checked[node] = max(start, through + 1)

    def _on_view(self, entered: ViewEntered) -> None:
        node, view, members = entered.node, entered.view, entered.members
        known = self.view_members.setdefault(view, members)
        if known != members:
            self.fail("unique-view-id", f"view {view} names {known} at one process and {members} at {node}")
        self.view_start.setdefault(view, entered.ts)
        locks = dict(entered.locks)
        if any(holder not in members for holder in locks.values()):
            self.fail("lock-exclusion", f"view {view} gives a lock to a non-member: {locks}")
        previous = self.views_of[node][-1] if self.views_of[node] else None
        if previous:
            before = self.locks_of_view.get(previous, {})
            for n, holder in locks.items():
                if before.get(n) not in (None, holder) and before[n] in members:
                    self.fail("lock-exclusion", f"lock {n} moved from {before[n]} to {holder} in view {view} "
                                                f"while {before[n]} still held it")
        self.locks_of_view.setdefault(view, locks)
        self.views_of[node].append(view)
        self.last_total.pop(node, None)

    def _on_deliver(self, delivered: MessageDelivered) -> None:
        node, qos, payloads = delivered.node, delivered.qos, delivered.payloads
        src, seq, ts, view = delivered.src, delivered.seq, delivered.ts, delivered.view
        reliable = qos.level != Level.UNRELIABLE
        sent = self.sent.get((src, seq, reliable))
        if delivered.relayed or delivered.keytable:
            # A member relaying a non-member's call, or the engine's own key table: no application sent it; it is
            # checked for order like any packet, and the runner checks the calls themselves (each run at most
            # once, answered once).
            sent = self.sent.setdefault((src, seq, reliable), SentMessage(src, seq, qos, ()))
        if sent is None or sent.qos != qos or not sent.delivers(payloads, delivered.keys, delivered.duplicates):
            self.fail("integrity", f"{node} delivered {src}#{seq} ({qos.name()}) that was not sent so")
            return
        if not reliable:
            return
        key = (src, seq)
        if key in self.delivered[node]:
            self.fail("no-duplicate", f"{node} delivered {src}#{seq} twice")
            return
        self.delivered[node].add(key)
        if delivered.keys is not None:
            self.exactly_once.delivered(node, key, view, ts, delivered.keys, delivered.duplicates)
        self.delivered_count += delivered.parts
        self.deliveries[node].append((view, key, delivered.mono))
        if qos.level >= Level.SOURCE:
            last = self.last_source.get((node, src), 0)
            if seq <= last:
                self.fail("source-order", f"{node} delivered {src}#{seq} after {src}#{last}")
            self.last_source[(node, src)] = max(seq, last)
            self.source_in_view[(node, view, src)].append(seq)
        if qos.level < Level.TOTAL:
            return
        if ts is None:
            self.fail("total-order", f"{node} delivered {src}#{seq} ({qos.name()}) without a timestamp")
            return
        known = self.at_position.setdefault((view, ts), key)
        if known != key:
            self.fail("one-order", f"view {view} ts {ts}: {node} delivered {src}#{seq}, another process {known}")
        last_view, last_ts = self.last_total.get(node, (view, -1))
        if last_view == view and ts <= last_ts:
            self.fail("total-order", f"{node} delivered ts {ts} after ts {last_ts} in view {view}")
        self.last_total[node] = (view, ts)
        self.total_in_view[(node, view)].append(ts)
        if qos.level >= Level.MAJORITY:
            first = self.resilient_position.setdefault(key, (view, ts))
            if first != (view, ts):
                self.fail("resilient-order", f"{qos.name()} {src}#{seq} delivered at {first} and at {(view, ts)}")
        if qos.level >= Level.K_RESILIENT:
            # The rule is K holders among the delivery view.  When members left or were removed by a reformation
            # before delivery (the deliverer orders in a later view), K shrinks to the members that remain, which
            # the engine reports as ``need``; either way, that many processes must really have received it.
            members = set(self.view_members.get(view, ()))
            order_view = delivered.order_view or view
            need = qos.required_holders(len(members) or 1)
            if order_view != view:
                need = min(need, delivered.need or need)
                members |= set(self.view_members.get(order_view, ()) or self.reformed.get(order_view, ()))
            have = len(self.holders[key] & members)
            if have < need:
                self.fail("k-resilience", f"{node} delivered {src}#{seq} ({qos.name()}) held by {have} < {need}")

    def _on_reincarnated(self, restarted: Reincarnated) -> None:
        """The process restarted under the same ID: a new application, which holds and delivered nothing yet."""
        node = restarted.node
        self._forget_views(node)
        self.exactly_once.restarted(node)
        for per_node in (self.delivered, self.has_data, self.has_ack):
            per_node.pop(node, None)
        self.token_checked.pop(node, None)
        for key in [k for k in self.last_source if k[0] == node]:
            del self.last_source[key]

    def _on_membership_ended(self, ended: MembershipEnded) -> None:
        self._forget_views(ended.node)

    def _forget_views(self, node: str) -> None:
        """The process left its group; if it joins again it is a new member, with a view history of its own."""
        self.views_of[node].append("")
        self.last_total.pop(node, None)

    # --------------------------------------------------------------------------------------------------------------

    def finish(self) -> None:
        """End-of-run checks: no gaps in any member's total order; virtual synchrony across view changes."""
        canonical: dict[str, list[int]] = defaultdict(list)
        for (_, view), seqs in self.total_in_view.items():
            canonical[view].extend(seqs)
        for view in canonical:
            canonical[view] = sorted(set(canonical[view]))
        for (node, view), mine in self.total_in_view.items():
            full = canonical[view]
            lo, hi = full.index(mine[0]), full.index(mine[-1])
            if full[lo:hi + 1] != mine:
                missing = sorted(set(full[lo:hi + 1]) - set(mine))
                self.fail("total-order", f"{node} skipped totally ordered messages in view {view} at ts {missing[:5]}")
        # Within one view, a member delivers every source-ordered message numbered between two it delivered.
        source_ordered: dict[str, set[int]] = defaultdict(set)
        for (src, seq, reliable), message in self.sent.items():
            if reliable and message.qos.level >= Level.SOURCE:
                source_ordered[src].add(seq)
        for (node, view, src), seqs in self.source_in_view.items():
            lo, hi = min(seqs), max(seqs)
            skipped = sorted(n for n in source_ordered[src] - set(seqs) if lo < n < hi)
            if skipped:
                self.fail("source-order", f"{node} skipped {src}#{skipped[:5]} in view {view}")
        # Members that install the same two consecutive views delivered the same set in the first.
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for node, views in self.views_of.items():
            for a, b in itertools.pairwise(views):
                if a and b:  # "" marks where a process left and later joined again as a new member
                    groups[(a, b)].append(node)
        for (a, b), nodes in groups.items():
            sets = {node: frozenset(self.total_in_view.get((node, a), [])) for node in nodes}
            if len(set(sets.values())) > 1:
                sizes = {node: len(s) for node, s in sets.items()}
                self.fail("virtual-synchrony", f"members moving from view {a} to {b} delivered different sets: "
                                               f"{sizes}")
