"""Handing messages to the application, in the order each one's QoS requires (figure 3.2).

Packets are delivered along the two cursors of ``Ordering``: per source (source order, and never twice) and along
the timestamps (total order and above, with resilient packets waiting for enough holders).  A delivered packet
becomes one ``Delivered`` event with all its messages (packed messages, or a reassembled fragmented one), and a
``deliver`` journal record; a relayed non-member call is decided by SCMP instead (``CallRelay``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .context import GroupContext
from .events import make_delivered
from .ids import ProcessId
from .ordering import Ordering
from .packets import Data, Fragment, NewList, Relayed
from .qos import Level
from .relay import CallRelay
from .stability import Holdings
from .view import HANDLER_LOCKS


class Deliverer:
    """The application's side of the order at one member."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, holdings: Holdings, relay: CallRelay, *,
                 commit_view: Callable[[NewList, float], bool]) -> None:
        """``commit_view``: the engine's step when the total order reaches a New List; False when this member is
        out of the group after it (nothing more is delivered here)."""
        self.pid, self.group, self.journal, self.views = ctx.pid, ctx.group, ctx.config.journal, ctx.views
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.ordering, self.holdings, self.relay, self.commit_view = ordering, holdings, relay, commit_view

    def deliver(self, packet: Data, ts: int | None, now: float, holders: int, need: int = 1) -> None:
        ordering = self.ordering
        if packet.qos.level != Level.UNRELIABLE:
            ordering.mark_delivered(packet.src, packet.seq)
        self.stats["delivered"] += 1
        body = packet.payload
        relayed = isinstance(body, Relayed)
        if relayed:
            # A non-member's call: what the application gets (a delivery for calls without handler, a request at
            # the handler's holder) is decided by the SCMP filter, not by this packet's payload.
            messages = self.relay.deliver(packet, body, ts, now)  # type: ignore[arg-type]
        else:
            messages = ordering.messages_of(packet)
            if messages:
                view = self.views.current
                handler = packet.handler
                answer = handler is not None and handler < HANDLER_LOCKS and view.lock_holder(handler) == self.pid
                self.outbox.events.append(make_delivered(self.group, packet.src, packet.seq, packet.qos, ts,
                                                         view.view_id, handler, messages, answer))
        if self.journal:
            extra: dict[str, Any] = {"parts": len(messages)} if len(messages) != 1 else {}
            if relayed:
                extra["relayed"] = True
            if not messages and isinstance(body, Fragment) and not body.more:
                extra["incomplete"] = True
            self.outbox.record(
                "deliver", now, ts=ts, src=packet.src, seq=packet.seq, qos=packet.qos.name(),
                size=packet.size, holders=holders, need=need, order_view=str(self.views.current.view_id), **extra,
            )

    def source_chain(self, src: ProcessId, now: float) -> None:
        """Deliver source-ordered packets from ``src`` whose predecessors are all delivered."""
        ordering = self.ordering
        while (packet := ordering.next_in_source_order(src)) is not None:
            self.deliver(packet, ordering.q.ts_of((src, packet.seq)), now, holders=1)

    def total(self, now: float) -> None:
        """Deliver in timestamp order everything that may go now; a New List reached installs its view."""
        ordering = self.ordering
        while (step := ordering.next_in_total_order(self.holdings, self.views.current)) is not None:
            slot, packet, holders, need = step
            if packet is not None:
                self.deliver(packet, slot.ts, now, holders, need)
            ordering.finish(slot)
            if packet is None and isinstance(slot.packet, NewList) and not self.commit_view(slot.packet, now):
                return
