"""What one group's engine hands its caller: datagrams, application events and journal records, with the views
they are stamped with.

The parts of the engine write here; the process moves the lists into its own after every input (``move_to``,
through ``GroupEngine.hand_over``), and a caller driving an engine alone takes them (``GroupEngine.take_outputs``).
This is the engine's half of the one output contract (``Outputs``) that the process and the trio runtime pass on
unchanged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from .config import EngineConfig
from .events import Event, Transmit
from .ids import ProcessId
from .journalschema import PACKET_NAMES, RECORD_FIELDS
from .packets import Packet, encode
from .views import Views


@dataclass(frozen=True, slots=True)
class Outputs:
    """Everything a sans-IO step produced: the one shape the engine, the process and their callers share.

    ``persist``: a value of SCMP ``latest`` to write to stable storage and report back (process level only);
    ``deadline``: when to call ``handle_timer`` next (None: only on new input)."""

    datagrams: list[Transmit]
    events: list[Event]
    records: list[dict[str, Any]]
    persist: int | None
    deadline: float | None


class OutputLists:
    """Datagrams, events and journal records made and not yet taken, in the order they were made."""

    def __init__(self) -> None:
        self.datagrams: list[Transmit] = []
        self.events: list[Event] = []
        self.records: list[dict[str, Any]] = []

    def take_datagrams(self) -> list[Transmit]:
        out, self.datagrams = self.datagrams, []
        return out

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def take_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out

    def move_to(self, into: OutputLists, loop_back: ProcessId | None) -> list[bytes]:
        """Append everything made here to ``into``, in order, and keep nothing; datagrams to ``loop_back`` are not
        appended but returned (their bytes), for the caller to hand over instead of sending.  Lists are taken in
        place: this runs after every input."""
        looped: list[bytes] = []
        if self.datagrams:
            if loop_back is not None:
                looped = [tx.data for tx in self.datagrams if tx.dest == loop_back]
                self.datagrams = [tx for tx in self.datagrams if tx.dest != loop_back]
            into.datagrams.extend(self.datagrams)
            self.datagrams = []
        if self.events:
            into.events.extend(self.events)
            self.events = []
        if self.records:
            into.records.extend(self.records)
            self.records = []
        return looped


class Outbox(OutputLists):
    """What one group's engine sends, tells its application and journals."""

    def __init__(self, pid: ProcessId, group: str, config: EngineConfig, views: Views,
                 stats: Counter[str]) -> None:
        super().__init__()
        self.pid, self.group, self.journal, self.views, self.stats = pid, group, config.journal, views, stats
        self.removed_unicast_only: dict[ProcessId, float] = {}
        """Members that cannot receive multicast, removed by a New List, and until when they still get copies of
        what is multicast: a member on its way out learns from the ACKs after its removal that what it held is
        stable (rmpd.protocol.departure), and it hears no multicast."""

    def keep_unicasting(self, member: ProcessId, until: float) -> None:
        """``member``, which cannot receive multicast, was removed by a New List: send it a copy of what is
        multicast until ``until``."""
        self.removed_unicast_only[member] = until

    def event(self, event: Event) -> None:
        self.events.append(event)

    def multicast(self, packet: Packet, now: float, *, journal: bool = True) -> bytes:
        """Send to the group: one multicast, plus a unicast copy to each member that cannot receive multicast.
        ``journal=False`` keeps a periodic packet that orders nothing (an Alive) out of the journal."""
        data = encode(packet)
        self.datagrams.append(Transmit(None, data, self.group))
        for member in sorted(self.views.current.unicast_only):
            if member != self.pid:
                self.datagrams.append(Transmit(member, data, self.group))
        if self.removed_unicast_only:
            for member, until in list(self.removed_unicast_only.items()):
                if now > until:
                    del self.removed_unicast_only[member]
                elif member != self.pid:
                    self.datagrams.append(Transmit(member, data, self.group))
        self.stats["sent"] += 1
        if self.journal and journal:
            self.record_packet("send", packet, now)
        return data

    def resend(self, data: bytes) -> None:
        """Multicast again bytes made before (a token pass being retransmitted)."""
        self.datagrams.append(Transmit(None, data, self.group))

    def unicast(self, dest: ProcessId, packet: Packet, now: float) -> None:
        self.datagrams.append(Transmit(dest, encode(packet), self.group))
        self.stats["sent"] += 1
        if self.journal:
            self.record_packet("send", packet, now)

    def record(self, event: str, now: float, **fields: Any) -> None:
        if not self.journal:
            return
        record: dict[str, Any] = {
            "v": 1, "node": self.pid, "group": self.group, "event": event, "view": str(self.views.app.view_id),
            "ts": None, "src": None, "seq": None, "qos": None, "mono": now,
        }
        record.update(fields)
        self.records.append(record)

    def record_packet(self, event: str, packet: Packet, now: float) -> None:
        if not self.journal:
            return
        fields: dict[str, Any] = {"packet": PACKET_NAMES[type(packet).__name__]}
        if packet.view is not None:
            fields["view"] = str(packet.view)
        describe = RECORD_FIELDS.get(type(packet))
        if describe is not None:
            fields.update(describe(packet))
        else:
            fields.update(ts=getattr(packet, "ts", None), src=getattr(packet, "src", None))
        self.record(event, now, **fields)
