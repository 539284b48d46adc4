"""The exactly-once resend loop of the simulated applications (``rmp sim --keys``).

Each keyed message stays the application's to settle until its own process delivers the key or is told the group
had delivered it already (``AlreadyDelivered``): both mean it is done.  A copy reported undelivered
(``UndeliveredSends``), not delivered when its membership ended (``Left``), or in flight when its process crashed, is
sent again, with the same key and payload, from
the slot's application once its process (a new incarnation after a crash) is back in a view.  The group, not the
application, keeps the key from being delivered twice, so resending whatever is not known to be done is safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..protocol.events import AlreadyDelivered, Delivered, Left, UndeliveredSends
from ..protocol.qos import QoS
from .schedule import AppResend, Timeline

RESEND_RETRY = 0.1
"""Virtual seconds between an application's looks at whether its process can take its resends."""


@dataclass(frozen=True, slots=True)
class KeyedMessage:
    """A keyed message of one slot's application: what it sends again, as it sent it first."""

    slot: int
    key: bytes
    payload: bytes
    qos: QoS


class KeyedSends:
    """Every slot's keyed messages not yet settled: which copy each process carries, and what is to be sent again."""

    def __init__(self, slots: int, clock: Timeline) -> None:
        self.clock = clock
        self.unsettled: dict[bytes, KeyedMessage] = {}
        self.made = [0] * slots
        """Keys each slot's application made (its next key's number)."""
        self.carried: list[dict[int, list[bytes]]] = [{} for _ in range(slots)]
        """Per slot: the keys the slot's current process carries, by the sequence number ``send`` returned."""
        self.to_resend: list[dict[bytes, None]] = [{} for _ in range(slots)]
        """Per slot, in the order they were made: keys to send again once the process can take them."""
        self.resend_due = [False] * slots
        self.left = [False] * slots
        self.resent = 0
        self.already_delivered = 0
        self.abandoned: set[bytes] = set()
        """Keys whose application left the group before they were settled: it resends them no more, so they may be
        delivered nowhere (a program that leaves gives up what it was told is undelivered)."""

    @property
    def keys_made(self) -> int:
        return sum(self.made)

    def all_keys(self) -> list[bytes]:
        """Every key made, by slot, in the order made."""
        return [f"{slot}:{n}".encode() for slot, made in enumerate(self.made) for n in range(1, made + 1)]

    def new_key(self, slot: int) -> bytes:
        """A key no other message of the run carries."""
        self.made[slot] += 1
        return f"{slot}:{self.made[slot]}".encode()

    def sent(self, message: KeyedMessage, seq: int, again: bool) -> None:
        """The slot's process took ``message`` (sent ``again`` after a fault) as sequence number ``seq``."""
        self.unsettled[message.key] = message
        self.carried[message.slot].setdefault(seq, []).append(message.key)
        self.resent += again

    def take(self, slot: int, pid: str, events: Iterable[object]) -> None:
        """What the slot's process (``pid``) told its application: keys delivered or already delivered are done;
        copies reported undelivered are to be sent again."""
        for event in events:
            if isinstance(event, Delivered):
                if event.keys is not None:
                    for key in event.keys:
                        self._settle(slot, key)
                    if event.src == pid:  # (unreliable packets are numbered apart: only keyed ones are carried)
                        self.carried[slot].pop(event.seq, None)
            elif isinstance(event, AlreadyDelivered):
                self.already_delivered += 1
                self._settle(slot, event.key)
            elif isinstance(event, UndeliveredSends):
                carried = self.carried[slot]
                self._resend(slot, [key for seq in event.seqs for key in carried.pop(seq, ())])
            elif isinstance(event, Left):
                # The membership ended: what it carried and did not deliver here is the application's to send again,
                # also what was ordered and not delivered here (the engine's UndeliveredSends names only what was
                # not ordered; the daemon and the node report the rest too, as runtime.adapter.OwnMessages does).
                self.process_lost(slot)

    def process_lost(self, slot: int) -> None:
        """The slot's process crashed: every copy it carried is to be sent again by the next one."""
        carried = self.carried[slot]
        keys = [key for seq in sorted(carried) for key in carried[seq]]
        carried.clear()
        self._resend(slot, keys)

    def stopped(self, slot: int) -> None:
        """The slot's application left the group: it resends nothing more."""
        self.left[slot] = True

    def due(self, slot: int) -> list[KeyedMessage]:
        """The messages the slot's application is to send again now (it asks when its process is in a view)."""
        self.resend_due[slot] = False
        pending = self.to_resend[slot]
        messages = [self.unsettled[key] for key in pending if key in self.unsettled]
        pending.clear()
        return messages

    def retry(self, slot: int, messages: Iterable[KeyedMessage]) -> None:
        """The process could not take these yet: look again a little later."""
        self._resend(slot, [message.key for message in messages])

    def _settle(self, slot: int, key: bytes) -> None:
        message = self.unsettled.get(key)
        if message is not None and message.slot == slot:
            del self.unsettled[key]
            self.to_resend[slot].pop(key, None)

    def _resend(self, slot: int, keys: list[bytes]) -> None:
        keys = [key for key in keys if key in self.unsettled]
        if not keys:
            return
        if self.left[slot]:
            self.abandoned.update(keys)
            for key in keys:
                del self.unsettled[key]
            return
        self.to_resend[slot].update(dict.fromkeys(keys))
        if not self.resend_due[slot]:
            self.resend_due[slot] = True
            self.clock.push(self.clock.now + RESEND_RETRY, AppResend(slot))
