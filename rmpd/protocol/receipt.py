"""Holding a data packet this member received, or sent (its own are held alike): ``Receipt``.

A packet from a source our view no longer holds is taken only while it may still be wanted; an unreliable one is
delivered at once; any other is held in the DataList (``Ordering.hold``).  What is held may complete the key table
this member waits for (``KeyTables.held``), show a gap before it (``Repair.maybe_gap``), and be delivered on
receipt or along its source's chain as its QoS says (``qos.DELIVERY_RULES``).  A copy of a packet ordered already
prompts the token site to pass the token soon, so that its source learns it missed the ACK.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import GroupContext
from .delivery import Deliverer
from .keytables import KeyTables
from .ordering import Held, Ordering
from .packets import Data
from .qos import DELIVERY_RULES, Gate, Level
from .repair import Repair
from .token import Token


class Receipt:
    """What a data packet does at the member that holds it; owns nothing."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, keys: KeyTables, deliverer: Deliverer, repair: Repair,
                 token: Token, *, frozen: Callable[[], bool], leaving: Callable[[], bool]) -> None:
        """``frozen``: a reformation runs; ``leaving``: a leave was asked for, or the membership ended (both the
        engine's, which asks the parts that know)."""
        self.pid, self.config, self.views, self.stats = ctx.pid, ctx.config, ctx.views, ctx.stats
        self.ordering, self.keys, self.deliverer, self.repair, self.token = ordering, keys, deliverer, repair, token
        self.frozen, self.leaving = frozen, leaving

    def on_data(self, packet: Data, now: float) -> None:
        level = packet.qos.level
        if packet.src not in self.views.current and not self.frozen() and (
                level == Level.UNRELIABLE or self.ordering.q.ts_of((packet.src, packet.seq)) is None):
            # A process our view no longer holds (a reformation cut it off) still speaks in an older view we know.
            # Only a packet an ACK already ordered is still wanted (a NACK's answer), or, while a reformation runs,
            # one its sync point may name; anything else came too late: no token site may order it.
            self.stats["removed_source"] += 1
            return
        if level == Level.UNRELIABLE:
            self.deliverer.deliver(packet, None, now, holders=1)
            return
        held, ts, gap = self.ordering.hold(packet, now)
        if held is Held.DUPLICATE:
            self.stats["duplicates"] += 1
            if packet.src != self.pid and packet.seq <= self.ordering.ordered_upto.get(packet.src, 0):
                self._resent_after_order(now)
            return
        if held is Held.MISMATCH:
            self.stats["qos_mismatch"] += 1
            return
        if self.keys.held(packet):
            self.deliverer.send_owed_tables(now)
        if gap:
            self.repair.maybe_gap(packet.src)
        rule = DELIVERY_RULES[level]
        if rule.on_receipt:
            self.deliverer.deliver(packet, ts, now, holders=1)
        if rule.gate is Gate.SOURCE:
            self.deliverer.source_chain(packet.src, now)

    def _resent_after_order(self, now: float) -> None:
        """The source resent a packet that is ordered already: it missed the ACK that ordered it and knows of no
        later timestamp, so it has no hole to NACK and goes on resending on its backed-off timer.  The token site
        passes the token soon (a NULL ACK after ``null_ack_prompt``) instead of after up to ``null_ack_interval``:
        the NULL ACK names the newest timestamp, and the source NACKs what it missed.  Only the token site answers,
        once per prompt interval, so a burst of resends costs one packet."""
        self.stats["resent_after_order"] += 1
        if not (self.frozen() or self.leaving()) and self.pid in self.views.current:
            self.token.prompt_null(now + self.config.null_ack_prompt)
