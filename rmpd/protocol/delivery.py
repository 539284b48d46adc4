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
from .events import AlreadyDelivered, make_delivered
from .ids import ProcessId, ViewId
from .keys import KeyTable
from .ordering import Ordering
from .orderingq import Slot, SlotKind
from .packets import Data, Fragment, Keyed, NewList, Relayed
from .qos import Level
from .relay import CallRelay
from .stability import Holdings
from .view import HANDLER_LOCKS, KEYS_HANDLER, View


class Deliverer:
    """The application's side of the order at one member."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, holdings: Holdings, relay: CallRelay, keys: KeyTable,
                 *, commit_view: Callable[[NewList, float], bool],
                 send_keys: Callable[[list[bytes], float], None]) -> None:
        """``commit_view``: the engine's step when the total order reaches a New List; False when this member is
        out of the group after it (nothing more is delivered here).  ``send_keys``: sends the key table to the
        joiners of a view, as totally ordered messages of KEYS_HANDLER (the engine's)."""
        self.pid, self.group, self.config, self.views = ctx.pid, ctx.group, ctx.config, ctx.views
        self.journal = ctx.config.journal
        self.outbox, self.stats = ctx.outbox, ctx.stats
        self.ordering, self.holdings, self.relay, self.commit_view = ordering, holdings, relay, commit_view
        self.keys, self.send_keys = keys, send_keys

    def deliver(self, packet: Data, ts: int | None, now: float, holders: int, need: int = 1) -> None:
        ordering = self.ordering
        if packet.qos.level != Level.UNRELIABLE:
            ordering.mark_delivered(packet.src, packet.seq)
        self.stats["delivered" if packet.handler != KEYS_HANDLER else "key_table_packets"] += 1
        body = packet.payload
        relayed = isinstance(body, Relayed)
        keys: tuple[bytes, ...] | None = None
        repeated: list[bytes] = []
        if relayed:
            # A non-member's call: what the application gets (a delivery for calls without handler, a request at
            # the handler's holder) is decided by the SCMP filter, not by this packet's payload.
            messages = self.relay.deliver(packet, body, ts, now)  # type: ignore[arg-type]
        else:
            messages = ordering.messages_of(packet)
            view = self.views.current
            if messages and type(body) is Keyed and ts is not None:
                messages, keys, repeated = self._first_deliveries(packet, body, messages, ts, view.view_id)
            elif packet.handler == KEYS_HANDLER and self.keys.merging and ts is not None:
                self._take_brought(packet, messages)
            if messages and packet.handler != KEYS_HANDLER:
                handler = packet.handler
                answer = handler is not None and handler < HANDLER_LOCKS and view.lock_holder(handler) == self.pid
                self.outbox.events.append(make_delivered(self.group, packet.src, packet.seq, packet.qos, ts,
                                                         view.view_id, handler, messages, answer, keys))
        if self.journal:
            extra: dict[str, Any] = {"parts": len(messages)} if len(messages) != 1 else {}
            if relayed:
                extra["relayed"] = True
            elif packet.handler == KEYS_HANDLER:
                extra["keytable"] = True
            elif keys is not None:
                extra["keys"] = [key.hex() for key in keys]
            if repeated:
                extra["duplicates"] = [key.hex() for key in repeated]
            inner = body.body if type(body) is Keyed else body
            if not messages and not repeated and isinstance(inner, Fragment) and not inner.more:
                extra["incomplete"] = True
            self.outbox.record(
                "deliver", now, ts=ts, src=packet.src, seq=packet.seq, qos=packet.qos.name(),
                size=packet.size, holders=holders, need=need, order_view=str(self.views.current.view_id), **extra,
            )

    def _first_deliveries(self, packet: Data, body: Keyed, messages: tuple[bytes, ...], ts: int,
                          view: ViewId) -> tuple[tuple[bytes, ...], tuple[bytes, ...], list[bytes]]:
        """The keyed messages of ``packet`` (at ``ts``) whose keys the group has not delivered: (messages, their
        keys, the keys left out).  The sender's process is told of each copy left out."""
        repeated = self.keys.deliver(body.keys, ts, view, body.stamp)
        if not repeated:
            return messages, body.keys, []
        self.stats["keys_repeated"] += len(repeated)
        if packet.src == self.pid:
            for index, first in repeated:
                self.outbox.event(AlreadyDelivered(self.group, packet.src, packet.seq, body.keys[index], first.ts,
                                                   first.view))
        left_out = {index for index, _ in repeated}
        kept = [i for i in range(len(messages)) if i not in left_out]
        return (tuple(messages[i] for i in kept), tuple(body.keys[i] for i in kept),
                [body.keys[index] for index, _ in repeated])

    def _keyed_delivered_before(self, slot: Slot) -> Data | None:
        """The keyed packet at ``slot`` (of a group that carries keys) if this process delivered it already, in an
        earlier membership of the group (``DeliveredBefore``), and it is ordered again here: not delivered twice,
        but its keys must count here as they do at every member that delivers it now, or the tables would differ."""
        if slot.kind is not SlotKind.DATA or slot.key is None:
            return None
        packet = self.ordering.data.get(slot.key)
        return packet if packet is not None and type(packet.payload) is Keyed else None

    def _count_keys(self, packet: Data, ts: int | None) -> None:
        """Keep the keys of a keyed packet delivered here before (:meth:`_keyed_delivered_before`)."""
        body = packet.payload
        assert type(body) is Keyed
        if ts is None or (isinstance(body.body, Fragment) and body.body.more):
            return
        self.keys.deliver(body.keys, ts, self.views.current.view_id, body.stamp)
        self.stats["keys_delivered_before"] += 1

    def _hand_keys_to_joiners(self, before: View, now: float) -> None:
        """A New List of a group that carried keyed messages was delivered: if it admitted processes, the first
        member that was in the view before sends them the key table as it stands here (rmpd.protocol.keys)."""
        view = self.views.app
        if view.view_id == before.view_id:
            return
        stayed = [member for member in view.members if member in before]
        if not (stayed and stayed[0] == self.pid and len(stayed) < len(view.members)):
            return
        if self.keys.ready:
            self.stats["key_tables_sent"] += 1
            self.send_keys(self.keys.pieces_for(view.view_id), now)
        else:
            # This member joined lately and waits for the table itself.  It delivered no keyed message, and took
            # no brought table, since it was admitted (it would be waiting there), so the table it is about to
            # receive is the table of this New List's place too: it sends it on once it holds it.
            self.keys.owed.append(view.view_id)

    def send_owed_tables(self, now: float) -> None:
        """This member now holds the table: send it to the joiners it owes it to (:meth:`_hand_keys_to_joiners`)."""
        for view_id in self.keys.owed:
            self.stats["key_tables_sent"] += 1
            self.send_keys(self.keys.pieces_for(view_id), now)
        self.keys.owed.clear()

    def _take_brought(self, packet: Data, messages: tuple[bytes, ...]) -> None:
        """A packet of KEYS_HANDLER delivered: pieces of a table its sender brought (``KeyTable.take_brought``)."""
        if all(type(message) is bytes for message in messages) and self.keys.take_brought(
                packet.src, packet.seq, messages):
            self.stats["key_tables_merged"] += 1

    def _held_for_table(self, packet: Data | None, done: Data | None, now: float) -> bool:
        """A joiner decides no keyed delivery before it holds the group's table (on_data takes it), nor takes a
        table a member brought, which is merged into the group's: it holds the first such packet in the order, and
        what follows it."""
        if done is not None or (packet is not None and (type(packet.payload) is Keyed
                                                        or packet.handler == KEYS_HANDLER)):
            self.keys.wait_from(now, 2 * self.config.fail_after)
            return True
        return False

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
            # (A group that never carried a key pays one attribute read per slot for this.)
            done = self._keyed_delivered_before(slot) if packet is None and self.keys.in_use else None
            if not self.keys.ready and self._held_for_table(packet, done, now):
                return
            if packet is not None:
                self.deliver(packet, slot.ts, now, holders, need)
            elif done is not None:
                self._count_keys(done, slot.ts)
            ordering.finish(slot)
            if packet is None and isinstance(slot.packet, NewList):
                before = self.views.app
                if not self.commit_view(slot.packet, now):
                    return
                self.keys.keep_expecting(self.views.app.members)
                if slot.packet.brings_keys and slot.packet.granted and slot.packet.request_src is not None:
                    joiner = slot.packet.request_src
                    self.keys.expect(joiner, dict(slot.packet.seqs).get(joiner, 0))
                if slot.packet.keys:
                    self._hand_keys_to_joiners(before, now)
