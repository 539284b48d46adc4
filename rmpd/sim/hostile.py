"""Hostile datagrams for fuzzing: mutations of real traffic, structure-aware field changes, garbage and replays.

Blind random bytes almost never get past the header check, so most mutations start from a real datagram the
simulated group just sent: flip bits, cut it short, change its type byte, or decode its msgpack body and replace,
drop or duplicate one field before packing it again, which reaches the type checks of every field kind.  Replays
send a real datagram again, unchanged, up to two simulated seconds later.

``guarded`` mode models a keyed group (docs/security.md): the group key drops every datagram whose MAC fails, so
what reaches the engine is garbage that does not decode, packets of views and groups this group never had, and
replays of authentic datagrams.  A mutation that still decodes to a packet of this group's own views is a forgery
only a key holder could send; guarded mode leaves those out, and the open mode sends them too, where the test is
only that nothing raises.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import msgpack

from rmpd.protocol.packets import HEADER_SIZE, TYPE_OFFSET, ListChangeRequest, NonMemberData, decode

from .network import LinkFaults, SimNetwork
from .schedule import Arrival, Timeline

REPLAY_DELAY = 2.0
MUTATIONS = ("garbage", "bitflip", "truncate", "extend", "retype", "field", "drop_field", "dup_field", "replay")


def random_value(rng: random.Random) -> Any:
    """A msgpack value of a random type, with the sizes and signs that break naive parsers."""
    choice = rng.randrange(12)
    if choice == 0:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1])
    if choice == 1:
        return rng.randrange(-1000, 100_000)
    if choice == 2:
        return rng.choice(["", "x" * rng.randrange(300), "10.0.0.1:7000", "not a pid", "1.2.3.4:99999", "sim"])
    if choice == 3:
        return rng.randbytes(rng.randrange(64))
    if choice == 4:
        return None
    if choice == 5:
        return rng.random() < 0.5
    if choice == 6:
        return rng.random() * 1e9
    if choice == 7:
        return [random_value(rng) for _ in range(rng.randrange(4))]
    if choice == 8:
        return [[rng.choice(["10.0.0.1:7000", "10.66.0.1:7000", 3]), rng.randrange(-2, 10**6)]
                for _ in range(rng.randrange(5))]
    if choice == 9:
        return {"k": random_value(rng)}
    if choice == 10:
        return [f"10.66.0.{rng.randrange(256)}:7000", rng.randrange(10**15)]  # a view of a creator never seen
    return list(range(rng.randrange(5000)))  # longer than any list a packet may hold


def mutate(data: bytes, rng: random.Random, kind: str) -> bytes:
    """One hostile variant of the real datagram ``data``."""
    if kind == "garbage":
        prefix = rng.choice([b"", b"RM", b"RM\x01", bytes((0x52, 0x4D, 1, rng.randrange(256)))])
        return prefix + rng.randbytes(rng.randrange(200))
    if kind == "bitflip":
        out = bytearray(data)
        for _ in range(rng.randrange(1, 9)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "extend":
        return data + rng.randbytes(rng.randrange(1, 64))
    if kind == "retype":
        return data[:TYPE_OFFSET] + bytes((rng.randrange(256),)) + data[TYPE_OFFSET + 1:]
    try:
        body = msgpack.unpackb(data[HEADER_SIZE:], raw=False, strict_map_key=False)
    except Exception:  # the input is a real datagram; anything odd just means "send garbage"
        return rng.randbytes(len(data))
    if not isinstance(body, list) or not body:
        return data
    i = rng.randrange(len(body))
    if kind == "field":
        body[i] = random_value(rng)
    elif kind == "drop_field":
        del body[i]
    elif kind == "dup_field":
        body.insert(i, body[i])
    return data[:HEADER_SIZE] + msgpack.packb(body, use_bin_type=True)


class HostileNetwork(SimNetwork):
    """A :class:`SimNetwork` that, for a share ``rate`` of real datagrams, also delivers hostile ones to the same
    receiver, from the same (spoofed) sender.  ``counts`` says how many of each mutation were delivered."""

    def __init__(self, clock: Timeline, faults: LinkFaults, rng: random.Random, size: int, *,
                 rate: float, per_datagram: int = 3, guarded: bool = True, hosts: tuple[str, ...] = (),
                 group: str = "") -> None:
        super().__init__(clock, faults, rng, size)
        self.hostile_rng = random.Random(rng.random())
        self.rate = rate
        self.per_datagram = per_datagram
        self.guarded = guarded
        self.hosts = hosts
        self.group = group
        self.counts: Counter[str] = Counter()

    @property
    def injected(self) -> int:
        return sum(v for k, v in self.counts.items() if not k.startswith("withheld"))

    def unicast(self, src: int, dst: int, data: bytes) -> None:
        super().unicast(src, dst, data)
        rng = self.hostile_rng
        if rng.random() >= self.rate:
            return
        for _ in range(self.per_datagram):
            kind = rng.choice(MUTATIONS)
            if kind == "replay":
                hostile, delay = data, rng.random() * REPLAY_DELAY
            else:
                hostile, delay = mutate(data, rng, kind), rng.random() * 0.01
            if self.guarded and kind != "replay" and self._forgery(hostile):
                self.counts["withheld_forgery"] += 1
                continue
            self.counts[kind] += 1
            self.in_flight += 1
            self.clock.push(self.clock.now + delay, Arrival(dst, src, hostile))

    def _forgery(self, data: bytes) -> bool:
        """Would only a key holder be able to send this?  True when it decodes to a packet of our own group."""
        try:
            packet = decode(data)
        except ValueError:
            return False
        if isinstance(packet, ListChangeRequest | NonMemberData) and packet.group == self.group:
            return True
        view = getattr(packet, "view", None)
        return view is not None and view.creator.split(":")[0] in self.hosts
