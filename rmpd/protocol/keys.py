"""Exactly-once sends: the keys a group delivered, kept as part of the group's state in the group's order.

A keyed message is delivered at most once in the group: every member keeps the keys delivered within a retention
window, and a keyed message whose key is in the table is not delivered again, at any member.  Every member applies
the same table to the same order, so every member makes the same decision; the sender's process is told where the
key was delivered first (``AlreadyDelivered``), so that a program that resends after a fault knows it is done.

The table forgets by count and by time, both carried in the order, never by a local clock: the time is the highest
``stamp`` (the sender's clock in ms) of the keyed packets delivered so far, so every member drops the same entries
at the same place of the order.

A process that joins (or rejoins, after a cut-off, a merge or a restart) takes the table at its place in the order:
the first member of the view that was in the view before sends the table as it stood at the New List that admitted
the joiner, in totally ordered messages of its own handler (``KEYS_HANDLER``), and the joiner, before it delivers
its first keyed message, waits until it holds the whole table (it takes the pieces as they arrive, before they are
ordered: the table is of the New List's place, and the joiner has delivered no keyed message since).  Until then
it delivers everything that carries no key and is no message of KEYS_HANDLER (a brought table's pieces, below).

A process that kept a table of the group from an earlier membership brings it when it joins (``expect``,
``take_brought``): its table may hold keys the group's lacks (it was in another view of the group, alive at the
same time).  Every member merges it where the order delivers its last piece.  Keyed deliveries do not wait for
it (they would wait for ever for pieces ordered after them): a keyed message ordered between the New List that
admitted the process and that place is decided without its keys, alike everywhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import groupby, repeat
from typing import NamedTuple

import msgpack

from .fieldkinds import MAX_KEY
from .ids import ProcessId, ViewId
from .timers import Deadline

__all__ = ["MAX_KEY", "KeyRecord", "KeyTable"]

PIECE_SIZE = 4096
"""Bytes of the encoded table per message of its transfer: packed several to a packet, never a fragment."""

_MAX_PIECES = 1 << 16

BROUGHT = "brought"
"""What a piece of a table a member brought is addressed to (a joiner's table is addressed to its view)."""


class KeyRecord(NamedTuple):
    """Where a key was delivered: the timestamp and view of its place in the order, and its packet's stamp (one
    record shared by the keys of one packet)."""

    ts: int
    view: ViewId
    stamp: int


class KeyTable:
    """The keys the group delivered, oldest first, and the table on its way to a joiner."""

    def __init__(self, retention_count: int, retention_ms: int, awaiting: ViewId | None = None) -> None:
        """``awaiting``: this process joined into that view and has no table until it receives the group's."""
        self.retention_count = retention_count
        self.retention_ms = retention_ms
        self.entries: set[bytes] = set()
        """The keys kept: one set operation per key delivered and one per key forgotten, at C speed.  Where each
        was delivered is in ``order``, looked up only for a copy left out (``_places``)."""
        self.order: deque[tuple[KeyRecord, tuple[bytes, ...]]] = deque()
        """The keys in ``entries`` by the packet that delivered them, oldest first: forgotten a packet at a time
        from the left."""
        self._index: dict[bytes, KeyRecord] | None = None
        """Key -> where it was delivered, built when a copy is left out and kept up while copies keep coming (a
        program resending after a fault resends many); dropped once the table has turned over without one."""
        self._since_repeat = 0
        """Keys kept since the last copy left out (``_index`` is dropped when this passes the table's size)."""
        self.clock = 0
        """The highest stamp delivered (ms): the group's time for retention, the same at every member."""
        self.position = 0
        """Keyed packets the group has delivered since it began: where in the group's history this table stands,
        the same at every member at the same place of the order.  Of two processes that kept the table of the
        same group, the one with the higher position has seen the longer history (``Joining``: it founds)."""
        self.awaiting = awaiting
        self.in_use = awaiting is not None
        """The group carried keyed messages while this process was in it (or before: it waits for their table).
        A New List that admits processes says so, and only then is a table sent and waited for, so a group that
        never uses keys pays nothing for them."""
        self.wait = Deadline()
        """Armed when this joiner first holds back a keyed delivery for the table: if the table is not in by then
        (the member sending it failed), the membership ends and the process joins again (``wait_from``)."""
        self.owed: list[ViewId] = []
        """Views whose joiners this member is to send the table once it holds it (it was the member to send it
        when their New List was delivered, and waited for the table itself)."""
        self._pieces: dict[ProcessId, dict[int, bytes]] = {}
        self.merging: dict[ProcessId, tuple[int, dict[int, bytes]]] = {}
        """Members admitted with a table they kept (``NewList.brings_keys``) whose table is not merged yet: the
        sequence number their messages as members start after, and the pieces of the table delivered so far."""
        self.refused = 0
        """Pieces of a table that were not well formed or not for this joiner (counted, dropped)."""

    def for_founder(self) -> KeyTable:
        """This table (of an ended membership, whose table this process held) for a group this process founds
        anew: alone in its view, its table is the group's, and joiners take it from there.  Every membership of
        the group may end with its processes still running (reformations that kept failing); a group founded
        again with an empty table would deliver again every key its programs resend after the fault."""
        table = KeyTable(self.retention_count, self.retention_ms)
        table.entries = set(self.entries)
        table.order = deque(self.order)
        table.clock = self.clock
        table.position = self.position
        table.in_use = True
        return table

    @property
    def ready(self) -> bool:
        """This member holds the group's table (it may decide keyed deliveries)."""
        return self.awaiting is None

    def carry(self) -> None:
        """The group carries keyed messages from here on: its later joiners wait for this table (``in_use``)."""
        self.in_use = True

    def expect(self, member: ProcessId, after_seq: int) -> None:
        """``member`` was admitted (its messages as a member start after ``after_seq``) bringing a table of its
        own: it is merged where the order delivers its last piece, at every member alike."""
        self.in_use = True
        self.merging[member] = (after_seq, {})

    def keep_expecting(self, members: tuple[ProcessId, ...]) -> None:
        """A view of ``members`` is installed: a member that brought a table and is gone before all of it was
        delivered will not send the rest, and the pieces delivered are dropped (every member of the view that goes
        on delivered the same pieces, so every one drops them alike)."""
        for member in [m for m in self.merging if m not in members]:
            del self.merging[member]

    def brought_pieces(self) -> list[bytes]:
        """This table, to bring into a group this process joins: messages of at most about PIECE_SIZE bytes."""
        return self._split(BROUGHT)

    def take_brought(self, src: ProcessId, seq: int, messages: tuple[bytes, ...]) -> bool:
        """Messages of KEYS_HANDLER in packet ``seq`` of ``src``, delivered here in the order (a joiner delivers
        none before it holds the group's table): pieces of a table ``src`` brought are collected, and the table is
        merged with the last of them (True).  Anything else is not a brought table."""
        waiting = self.merging.get(src)
        if waiting is None or self.awaiting is not None or seq <= waiting[0]:
            return False
        table, _ = self._gather(waiting[1], messages, BROUGHT)
        if table is None:
            return False
        del self.merging[src]
        if not self._merge(table):
            self.refused += 1
        return True

    def wait_from(self, now: float, patience: float) -> None:
        """A keyed delivery waits for the table: give it ``patience`` seconds from the first such wait."""
        if self.wait.deadline is None:
            self.wait.deadline = now + patience

    def deliver(self, keys: tuple[bytes, ...], ts: int, view: ViewId, stamp: int) -> list[tuple[int, KeyRecord]]:
        """The keyed messages of the packet at ``ts`` are delivered, but for the copies returned: (index, where the
        group delivered that key first), for keys kept already or repeated earlier in the packet.  The others are
        kept from now on, and the group's time moves to ``stamp``."""
        entries, index = self.entries, self._index
        place = KeyRecord(ts, view, stamp)
        self.position += 1
        repeated: list[tuple[int, KeyRecord]] = []
        before = len(entries)
        entries.update(keys)
        added = len(entries) - before
        if added == len(keys):  # the common case, one set operation: every key new
            self.order.append((place, keys))
            if index is not None:
                self._since_repeat += added
                if self._since_repeat > len(entries):
                    self._index = None  # the table turned over without a copy left out
                else:
                    index.update(zip(keys, repeat(place)))
        else:
            # Some keys were kept before (``entries`` already held them: the update added only the others) or come
            # twice in this packet.  Each is a copy left out, told where its key was delivered first.
            earlier = self._places()
            first: dict[bytes, None] = {}
            for number, key in enumerate(keys):
                was = earlier.get(key)
                if was is not None:
                    repeated.append((number, was))
                elif key in first:
                    repeated.append((number, place))
                else:
                    first[key] = None
            if first:
                kept = tuple(first)
                self.order.append((place, kept))
                earlier.update(zip(kept, repeat(place)))
            self._since_repeat = 0
        self.advance(stamp)
        return repeated

    def _places(self) -> dict[bytes, KeyRecord]:
        """Key -> where it was delivered, for every key kept (built from ``order`` when first needed)."""
        if self._index is None:
            self._index = {key: place for place, keys in self.order for key in keys}
        return self._index

    def advance(self, stamp: int) -> None:
        """A keyed packet was delivered: the group's time moves to its stamp (if later), and what is past the
        retention, by count or by time, is forgotten, oldest first."""
        if stamp > self.clock:
            self.clock = stamp
        entries, order, index = self.entries, self.order, self._index
        horizon = self.clock - self.retention_ms
        while order and (len(entries) > self.retention_count or order[0][0].stamp < horizon):
            forgotten = order.popleft()[1]
            entries.difference_update(forgotten)
            if index is not None:
                deque(map(index.__delitem__, forgotten), maxlen=0)

    # ------------------------------------------------------------------------------------------------------------
    # Transfer to joiners

    def _encode(self) -> bytes:
        """The table as it stands."""
        views: dict[ViewId, int] = {}
        rows = [[key, record.ts, views.setdefault(record.view, len(views)), record.stamp]
                for key, record in self]
        return msgpack.packb([self.clock, [list(v) for v in views], rows, self.position], use_bin_type=True)

    def pieces_for(self, view: ViewId) -> list[bytes]:
        """The table as it stands, for the joiners of ``view``: messages of at most about PIECE_SIZE bytes."""
        return self._split(list(view))

    def _split(self, address: object) -> list[bytes]:
        """The table as it stands, in pieces addressed to ``address`` (a joiner's view as a list, or BROUGHT)."""
        table = self._encode()
        count = max(1, -(-len(table) // PIECE_SIZE))
        return [msgpack.packb([address, index, count, table[index * PIECE_SIZE:(index + 1) * PIECE_SIZE]],
                              use_bin_type=True) for index in range(count)]

    def _gather(self, pieces: dict[int, bytes], messages: tuple[bytes, ...],
                address: object) -> tuple[bytes | None, int]:
        """Add the pieces among ``messages`` addressed to ``address`` to ``pieces``: (the whole table once every
        piece is in, else None; how many messages were no such piece)."""
        count = None
        strays = 0
        for message in messages:
            piece = self._piece(message, address)
            if piece is None:
                strays += 1
                continue
            index, count, chunk = piece
            pieces[index] = chunk
        if count is None or len(pieces) < count or not all(index in pieces for index in range(count)):
            return None, strays
        return b"".join(pieces[index] for index in range(count)), strays

    def take_pieces(self, src: ProcessId, messages: tuple[bytes, ...]) -> bool:
        """Pieces of a table from ``src`` (a packet of KEYS_HANDLER, as received); True when this joiner now holds
        the whole table.  Pieces for another joiner's view, or not well formed, are dropped and counted."""
        if self.awaiting is None:
            return False
        table, strays = self._gather(self._pieces.setdefault(src, {}), messages, list(self.awaiting))
        self.refused += strays
        if table is None:
            return False
        if not self._install(table):
            self.refused += 1
            del self._pieces[src]
            return False
        self.awaiting = None
        self.wait.stop()
        self._pieces.clear()
        return True

    def _piece(self, message: bytes, target: object) -> tuple[int, int, bytes] | None:
        """(index, count, chunk) of a piece addressed to ``target`` (a joiner's view as a list, or BROUGHT)."""
        try:
            fields = msgpack.unpackb(message, raw=False, max_array_len=4, max_map_len=0, max_bin_len=2 * PIECE_SIZE)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return None
        if not (isinstance(fields, list) and len(fields) == 4 and type(fields[1]) is int
                and type(fields[2]) is int and type(fields[3]) is bytes):
            return None
        addressed, index, count, chunk = fields
        if addressed != target or not 0 <= index < count <= _MAX_PIECES:
            return None
        return index, count, chunk

    @staticmethod
    def _decode(table: bytes) -> tuple[int, dict[bytes, KeyRecord], int] | None:
        """(clock, key -> where it was delivered (oldest first), position) of an encoded table; None when it is not
        one a member keeps."""
        try:
            clock, views, rows, position = msgpack.unpackb(table, raw=False, max_map_len=0)
            clock, position = int(clock), int(position)
            view_ids = [ViewId(str(creator), int(counter)) for creator, counter in views]
            entries = {bytes(key): KeyRecord(int(ts), view_ids[at], int(stamp)) for key, ts, at, stamp in rows}
        except (ValueError, TypeError, IndexError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return None
        if len(entries) != len(rows):
            return None  # a key twice: not a table any member keeps
        return clock, entries, position

    def _install(self, table: bytes) -> bool:
        decoded = self._decode(table)
        if decoded is None:
            return False
        clock, entries, position = decoded
        self.entries = set(entries)
        self.order = deque((place, tuple(keys)) for place, keys in groupby(entries, key=entries.__getitem__))
        self._index = None
        self.clock = clock
        self.position = position
        return True

    def _merge(self, table: bytes) -> bool:
        """A table a member brought is merged here: its keys this table lacks are kept from now on (newest, where
        each was delivered in the brought table's history), the group's time moves to the later of the two, and so
        does the position.  Merging a table twice changes nothing."""
        decoded = self._decode(table)
        if decoded is None:
            return False
        clock, entries, position = decoded
        new = {key: place for key, place in entries.items() if key not in self.entries}
        for place, keys in groupby(new, key=new.__getitem__):
            kept = tuple(keys)
            self.order.append((place, kept))
            self.entries.update(kept)
        self._index = None
        self.position = max(self.position, position)
        self.advance(clock)
        return True

    def __iter__(self) -> Iterator[tuple[bytes, KeyRecord]]:
        """(key, where it was delivered), oldest first."""
        return ((key, place) for place, keys in self.order for key in keys)

    def __len__(self) -> int:
        return len(self.entries)
