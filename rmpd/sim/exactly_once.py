"""``exactly-once`` in the simulator: a key takes one position of the group's order, and no member delivers it twice.

A keyed message's position is the view and timestamp of the packet that delivered it, and its index among the
packet's delivered messages.  A key delivered by two different sends (``src``, ``seq``) is a key at two positions:
the message was delivered twice, which keys exist to prevent.  One send at two slots is not this invariant's
question (a token site cut off in the instant it ordered a message leaves the others to order it again in their
next view): whether those orders agree is ``one-order``'s, as in ``rmp audit``.  Copies the group left out as
already delivered (a deliver record's ``duplicates``) take no position, and are owed to nobody.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

Position = tuple[str, int | None, int]
"""View, timestamp and index of a keyed message in the group's order."""
Send = tuple[str, int]
"""The packet that carried a keyed message: source and sequence number."""


@dataclass(frozen=True, slots=True)
class FirstDelivery:
    send: Send
    position: Position


def as_sent(sent: tuple[tuple[bytes, bytes], ...], keys: tuple[bytes, ...],
            duplicates: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """The payloads a keyed packet delivers, given the (payload, key) pairs sent in it, the keys delivered and the
    keys left out as duplicates; None when the delivered keys are not the ones sent less the ones left out."""
    taken: list[bytes] = []
    left_out: list[bytes] = []
    for payload, key in sent:
        if len(taken) < len(keys) and key == keys[len(taken)]:
            taken.append(payload)
        else:
            left_out.append(key)
    if len(taken) != len(keys) or Counter(left_out) != Counter(duplicates):
        return None
    return tuple(taken)


class ExactlyOnce:
    """Every keyed delivery, as observed: the first send and position of each key, the keys each member delivered,
    and the copies the group left out."""

    def __init__(self, fail: Callable[[str, str], None]) -> None:
        self.fail = fail
        self.first: dict[bytes, FirstDelivery] = {}
        """Each key delivered anywhere, with the send and position it was delivered at first."""
        self.by_member: dict[str, set[bytes]] = defaultdict(set)
        self.left_out: set[tuple[str, int, bytes]] = set()
        """(src, seq, key): the copy of ``key`` sent in that packet was left out, the key being delivered already."""
        self.reported: set[tuple[bytes, Send]] = set()

    def delivered(self, node: str, send: Send, view: str, ts: int | None, keys: tuple[bytes, ...],
                  duplicates: tuple[bytes, ...]) -> None:
        """``node`` delivered packet ``send`` at ``ts`` of ``view``: its messages under ``keys``, leaving out the
        copies of ``duplicates``."""
        for key in duplicates:
            self.left_out.add((*send, key))
        mine = self.by_member[node]
        for index, key in enumerate(keys):
            position = (view, ts, index)
            first = self.first.setdefault(key, FirstDelivery(send, position))
            if first.send != send and (key, send) not in self.reported:
                self.reported.add((key, send))
                self.fail("exactly-once", f"key {key!r} at two positions of the order: "
                                          f"{_place(first.send, first.position)} and {_place(send, position)} "
                                          f"(at {node})")
            if key in mine:
                self.fail("exactly-once", f"{node} delivered key {key!r} twice, again at {_place(send, position)}")
            mine.add(key)

    def restarted(self, node: str) -> None:
        """``node`` is a new application (restarted on its process ID): it delivered no key yet."""
        self.by_member.pop(node, None)

    def owed(self, src: str, seq: int, key: bytes | None) -> bool:
        """The message under ``key`` sent in packet ``src``#``seq`` is to be delivered: not a copy left out."""
        return key is None or (src, seq, key) not in self.left_out

    @property
    def keys_delivered(self) -> int:
        return len(self.first)


def _place(send: Send, position: Position) -> str:
    view, ts, index = position
    return f"ts {ts} #{index} in {view} ({send[0]} seq {send[1]})"
