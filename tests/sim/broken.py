"""Deliberately broken engines: each breaks one rule, so tests can show the checker notices.

Each replaces one rule of one part of the engine (or one step of the engine itself) with a wrong one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rmpd.protocol.engine import GroupEngine
from rmpd.protocol.ids import ProcessId, ViewId
from rmpd.protocol.membership import Change, apply_change
from rmpd.protocol.packets import Data, ListChangeRequest, NewList
from rmpd.protocol.qos import Level
from rmpd.protocol.view import View
from rmpd.sim.runner import SimConfig, run_seed


def violated(config: SimConfig, factory: type[GroupEngine], seeds: range, wanted: str | None = None) -> set[str]:
    """Invariants the engine built by ``factory`` violates over ``seeds``; stops at the first seed that shows
    ``wanted`` (when given), since rare faults need many seeds and one showing is enough."""
    found: set[str] = set()
    for seed in seeds:
        found |= {v["invariant"] for v in run_seed(config, seed, engine_factory=factory).violations}
        if wanted is not None and wanted in found:
            break
    return found


class AcceptsWithHoles(GroupEngine):
    """Accepts the token without holding every packet the ACK ordered."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ordering.holds_through = lambda ts: True  # type: ignore[method-assign]


class DeliversTotalOnReceipt(GroupEngine):
    """Hands totally ordered messages to the application as soon as they arrive, before any ACK."""

    def on_data(self, packet: Data, now: float) -> None:
        fresh = packet.qos.level == Level.TOTAL and not self.ordering.delivered(packet.src, packet.seq)
        super().on_data(packet, now)
        if fresh:
            self.deliverer.deliver(packet, None, now, holders=1)


class DeliversDuplicates(GroupEngine):
    """Hands every copy of an unordered message to the application, duplicates included."""

    def on_data(self, packet: Data, now: float) -> None:
        if packet.qos.level == Level.UNORDERED and self.ordering.delivered(packet.src, packet.seq):
            self.deliverer.deliver(packet, None, now, holders=1)
            return
        super().on_data(packet, now)


class IgnoresResilience(GroupEngine):
    """Delivers resilient messages as soon as they are ordered, as if one holder were enough (and journals the
    holders it really knew of)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.holdings.needed = lambda qos, ts, view: 1  # type: ignore[method-assign]


class SourceOrderOnReceipt(GroupEngine):
    """Delivers source-ordered messages on receipt, ignoring gaps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deliverer.source_chain = self._on_receipt  # type: ignore[method-assign]

    def _on_receipt(self, src: str, now: float) -> None:
        for (s, seq), packet in list(self.ordering.data.items()):
            if s == src and packet.qos.level == Level.SOURCE and not self.ordering.delivered(s, seq):
                self.deliverer.deliver(packet, None, now, holders=1)


class EveryoneHoldsTheToken(GroupEngine):
    """Every member starts as token site: two sites order different packets at one timestamp."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token.take(self.token.latest_ack_ts, 0)


class SkipsOneMessage(GroupEngine):
    """The second member never hands the message at timestamp 5 to its application."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        deliver = self.deliverer.deliver

        def skipping(packet: Data, ts: int | None, now: float, holders: int, need: int = 1) -> None:
            if ts == 5 and self.pid == self.views.current.members[1]:
                self.ordering.mark_delivered(packet.src, packet.seq)
                return
            deliver(packet, ts, now, holders, need)

        self.deliverer.deliver = skipping  # type: ignore[method-assign]


class CorruptsPayloads(GroupEngine):
    """Delivers a different payload than was sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        deliver = self.deliverer.deliver

        def corrupting(packet: Data, ts: int | None, now: float, holders: int, need: int = 1) -> None:
            if packet.src != self.pid:
                packet = Data(packet.view, packet.src, packet.seq, packet.qos, packet.handler, packet.payload + b"!")
            deliver(packet, ts, now, holders, need)

        self.deliverer.deliver = corrupting  # type: ignore[method-assign]


def _grant_held_locks(view: View, request: ListChangeRequest, token_site: ProcessId) -> Change:
    change = apply_change(view, request, token_site)
    if request.op == "lock" and not change.granted and request.arg is not None:
        locks = dict(change.locks)
        locks[request.arg] = request.src
        return replace(change, locks=tuple(sorted(locks.items())), granted=True, changed=True)
    return change


class GrantsHeldLocks(GroupEngine):
    """Grants a lock even while another member holds it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.changes.apply_change = _grant_held_locks


class ReusesViewIds(GroupEngine):
    """Names every view it creates with the same ID (it is built with a view counter that never moves)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "view_counter": FrozenCounter(kwargs["pid"])})


class FrozenCounter:
    def __init__(self, pid: str) -> None:
        self.pid = pid

    def next_view_id(self, now: float) -> ViewId:
        return ViewId(self.pid, 1)


class InstallsViewsEarly(GroupEngine):
    """Shows a view change to the application as soon as the New List arrives, before the messages ordered
    ahead of it: members then split deliveries at different points."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        place = self.rotation.on_new_list

        def installing(nl: NewList, now: float) -> None:
            place(nl, now)
            views = self.views
            if nl.new_view in views.known and nl.request_src is not None and not self.departed:
                view = views.known[nl.new_view]
                if view.view_id != views.app.view_id and self.pid in view:
                    views.installed(view)
                    self.outbox.record("view", now, ts=nl.ts, members=list(view.members), locks=[],
                                       view=str(view.view_id))

        self.rotation.on_new_list = installing  # type: ignore[method-assign]


class IgnoresMinimumPartition(GroupEngine):
    """Lets a minority partition carry on, though the group asked for a majority."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reformation.minimum_partition = lambda: 1  # type: ignore[method-assign]
