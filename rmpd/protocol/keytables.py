"""One member's key tables for exactly-once sends (``KeyTables``; the table itself is keys.py's ``KeyTable``).

Which table a membership starts with depends on how it began: a founder goes on from the table it kept of an
earlier membership of the group, if any; a joiner waits for the group's, which a member that was in the view before
sends it in the order.  A joiner that kept a table of the group (its join said so) brings that one too: it sends it
in the order, and every member, itself included, merges it into the group's where the order delivers its last
piece.  The parts that decide keyed deliveries and admit joiners (``Deliverer``, ``ViewChanges``) share the group's
table, ``KeyTables.table``; the engine asks this part the rest.
"""

from __future__ import annotations

from .config import EngineConfig
from .context import GroupContext
from .ids import ViewId
from .keys import KeyTable
from .packets import Data, Keyed, NewList
from .qos import Level, QoS
from .sender import Sender
from .view import KEYS_HANDLER


def _empty_table(config: EngineConfig, awaiting: ViewId | None = None) -> KeyTable:
    """An empty table with the group's retention (``awaiting``: see ``KeyTable``)."""
    return KeyTable(config.key_retention_count, int(config.key_retention_seconds * 1000), awaiting=awaiting)


class KeyTables:
    """The group's key table at this member, and the one this member brought from an earlier membership."""

    def __init__(self, ctx: GroupContext, sender: Sender, *, joined_by: NewList | None,
                 kept: KeyTable | None) -> None:
        """``joined_by``: the New List that admitted this member (None for a founder).  ``kept``: the table of this
        process's previous membership of the group, if it kept one."""
        self.views, self.stats, self.sender = ctx.views, ctx.stats, sender
        if kept is not None and joined_by is None:
            self.table = kept.for_founder()
        else:
            # A joiner into a group that carries keys waits for the group's table (from a member of the view before).
            self.table = _empty_table(ctx.config, ctx.views.current.view_id
                                      if joined_by is not None and joined_by.keys else None)
        self.brought: KeyTable | None = None
        """The table this joiner brought, sent in the order once the membership starts (``send_brought``)."""
        if joined_by is not None and joined_by.brings_keys:
            self.brought = kept or _empty_table(ctx.config)
            self.table.expect(ctx.pid, dict(joined_by.seqs).get(ctx.pid, 0))  # its own too, where the order has it

    def send(self, pieces: list[bytes], now: float) -> None:
        """Send pieces of a table in the group's total order, in the view ordered in now."""
        self.sender.send_now(pieces, QoS(Level.TOTAL), KEYS_HANDLER, self.views.current.view_id, now)

    def send_brought(self, now: float) -> None:
        """A joiner that brought a table sends it, for every member to merge into the group's."""
        if self.brought is not None:
            self.stats["key_tables_brought"] += 1
            self.send(self.brought.brought_pieces(), now)

    def carried(self) -> None:
        """The group carries keys from here on: later joiners wait for its table."""
        self.table.carry()

    def held(self, packet: Data) -> bool:
        """A data packet was held: a keyed one shows the group carries keys, and pieces of the group's table are
        taken while this member waits for it.  True when they completed the table: this member may now send it to
        the joiners it owes it to."""
        table = self.table
        if type(packet.payload) is Keyed:
            table.carry()
        elif packet.handler == KEYS_HANDLER and not table.ready:
            messages = packet.payload if type(packet.payload) is tuple else (packet.payload,)
            if all(type(message) is bytes for message in messages) and table.take_pieces(packet.src, messages):
                self.stats["key_tables_taken"] += 1
                return True
        return False

    def to_keep(self) -> KeyTable | None:
        """The table this process keeps when its membership ends by itself (``RmpProcess``): the group's, if it
        holds it, else the one it brought, which the group's would have included."""
        if self.table.ready and len(self.table):
            return self.table
        return self.brought if self.brought is not None and len(self.brought) else None
