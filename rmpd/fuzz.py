"""Fuzz drivers: the packet decoder, the engine inside a simulated group, and the local API's frame reader.

Each driver is seeded and counts what it fed in, so a failure is replayed by its seed and a long run is the same
code as the short one CI runs (``scripts/fuzz --datagrams 1000000`` versus tests/test_fuzz.py).  What each asserts:

decoder
    any bytes either decode to a packet that encodes again, or raise ``DecodeError``; nothing else escapes.
engine
    a simulated group with loss, duplication and reordering under mixed QoS, with hostile datagrams
    (:mod:`rmpd.sim.hostile`) injected at every receiver: no exception escapes the engine, and in guarded mode
    (what a keyed group lets through) the invariant checker sees no violation and every accepted reliable
    message is delivered to every member.
frames
    any byte stream on the local socket yields frames or ``FrameError``s, and every frame that parses as a
    request either becomes a ``Request`` or raises ``RequestError``.
"""

from __future__ import annotations

import random
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgpack
import trio
import trio.testing

from rmpd.localapi import HEADER, FrameError, FrameReader, RequestError, encode_frame, parse_request
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import (
    Ack,
    Data,
    DecodeError,
    ListChangeRequest,
    Nack,
    decode,
    encode,
)
from rmpd.protocol.qos import QoS
from rmpd.sim.hostile import MUTATIONS, HostileNetwork, mutate, random_value
from rmpd.sim.runner import GROUP, SimConfig, Simulation


@dataclass
class FuzzReport:
    """What one driver fed in and what went wrong; ``failures`` hold a seed and a traceback or a reason each."""

    driver: str
    inputs: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"driver": self.driver, "inputs": self.inputs, "ok": self.ok, "kinds": dict(self.kinds),
                "failures": self.failures[:10], **self.extra}


def _seed_packets(rng: random.Random) -> list[bytes]:
    """A few real packets of every common shape, the raw material for mutations."""
    view = ViewId("10.0.0.1:7000", 1_700_000_000_000)
    members = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"]
    out = [encode(Data(view, members[i % 3], i, q, None, rng.randbytes(rng.randrange(40))))
           for i, q in enumerate((QoS.UNRELIABLE, QoS.SOURCE, QoS.TOTAL, QoS.SAFE, QoS.k(2)))]
    out.append(encode(Ack(view, members[0], 7, members[1], 3, ((members[2], 4, QoS.TOTAL),))))
    out.append(encode(Nack(view, members[1], members[0], 5, 7, False, (5, 6), ((members[2], 9),))))
    out.append(encode(ListChangeRequest(GROUP, None, "10.0.0.9:7000", 1, "join", None, True, 1, 1)))
    return out


def fuzz_decoder(count: int, seed: int = 0, progress: Callable[[int], None] | None = None) -> FuzzReport:
    report = FuzzReport("decoder")
    rng = random.Random(seed)
    seeds = _seed_packets(rng)
    for i in range(count):
        kind = rng.choice(MUTATIONS[:-1])  # a replay is the original packet: nothing new for the decoder
        data = mutate(rng.choice(seeds), rng, kind)
        report.kinds[kind] += 1
        try:
            packet = decode(data)
        except DecodeError:
            report.kinds["rejected"] += 1
        except Exception:  # exactly what the fuzzer looks for
            report.failures.append({"seed": seed, "input": i, "data": data.hex(), "error": traceback.format_exc()})
        else:
            report.kinds["accepted"] += 1
            try:
                if decode(encode(packet)) != packet:
                    report.failures.append({"seed": seed, "input": i, "data": data.hex(), "error": "no round trip"})
            except Exception:
                report.failures.append({"seed": seed, "input": i, "data": data.hex(), "error": traceback.format_exc()})
        report.inputs += 1
        if progress is not None and i % 10_000 == 0:
            progress(i)
    return report


ENGINE_CONFIG = SimConfig(members=4, senders=3, messages=60, loss=0.05, dup=0.02, reorder=0.05, qos="mixed")


def fuzz_engine(count: int, seed: int = 0, *, guarded: bool = True, rate: float = 0.5,
                config: SimConfig = ENGINE_CONFIG, progress: Callable[[int], None] | None = None) -> FuzzReport:
    """Run seeds ``seed, seed+1, ...`` until at least ``count`` hostile datagrams reached engines."""
    report = FuzzReport("engine" if guarded else "engine-open")
    runs = delivered = expected = 0
    run_seed = seed
    while report.inputs < count:
        network = partial(HostileNetwork, rate=rate, guarded=guarded, group=GROUP)
        sim = Simulation(config, run_seed, network_factory=network)
        hostile = sim.network
        assert isinstance(hostile, HostileNetwork)
        hostile.hosts = tuple(sim.hosts)
        try:
            result = sim.run()
        except Exception:  # an exception escaping the engine is the finding
            report.failures.append({"seed": run_seed, "error": traceback.format_exc()})
        else:
            if guarded:
                if result.violation_count:
                    report.failures.append({"seed": run_seed, "error": "invariant violated",
                                            "violations": result.violations[:3]})
                if not result.liveness or result.delivered != result.expected:
                    report.failures.append({"seed": run_seed, "error": "accepted messages not delivered",
                                            "delivered": result.delivered, "expected": result.expected})
            delivered += result.delivered
            expected += result.expected
        report.inputs += hostile.injected
        report.kinds.update(hostile.counts)
        runs += 1
        run_seed += 1
        if progress is not None:
            progress(report.inputs)
    report.extra = {"runs": runs, "first_seed": seed, "delivered": delivered, "expected": expected}
    return report


def _random_frame(rng: random.Random) -> bytes:
    """Bytes a local client might send: good frames, lies about length, bad msgpack, hostile requests."""
    choice = rng.randrange(8)
    ops = ["hello", "join", "send", "leave", "lock", "unlock", "status", "members", "attach", "bogus"]
    if choice == 0:
        return rng.randbytes(rng.randrange(40))
    if choice == 1:
        body = rng.randbytes(rng.randrange(30))
        return HEADER.pack(len(body)) + body
    if choice == 2:
        return HEADER.pack(rng.choice([0, 1, 2**31, 2**32 - 1])) + rng.randbytes(rng.randrange(10))
    request: dict[str, Any] = {"op": rng.choice(ops), "id": random_value(rng) if rng.random() < 0.3 else 1}
    for name in rng.sample(["group", "payload", "qos", "lock", "ttl", "min_partition", "persist", "handler",
                            "existing_only", "count", "x"], rng.randrange(5)):
        request[name] = random_value(rng) if rng.random() < 0.7 else {"group": "g", "payload": b"p",
                                                                      "qos": "total", "lock": 1}.get(name, 1)
    if choice >= 5:
        return encode_frame(request)
    body = msgpack.packb([request] if choice == 4 else random_value(rng), use_bin_type=True)
    return HEADER.pack(len(body)) + body


def fuzz_frames(count: int, seed: int = 0) -> FuzzReport:
    report = FuzzReport("frames")
    rng = random.Random(seed)

    async def one_stream(chunks: list[bytes]) -> None:
        send, receive = trio.testing.memory_stream_one_way_pair()
        await send.send_all(b"".join(chunks))
        await send.aclose()
        reader = FrameReader(receive, 4096)
        while True:
            try:
                frame = await reader.read()
            except FrameError as exc:
                report.kinds[f"frame_error_{exc.code}"] += 1
                if exc.fatal:
                    return
                continue
            if frame is None:
                return
            try:
                parse_request(frame)
                report.kinds["request"] += 1
            except RequestError as exc:
                report.kinds[f"request_error_{exc.code}"] += 1

    while report.inputs < count:
        chunks = [_random_frame(rng) for _ in range(rng.randrange(1, 20))]
        try:
            trio.run(one_stream, chunks)
        except Exception:
            report.failures.append({"seed": seed, "input": report.inputs, "error": traceback.format_exc(),
                                    "stream": b"".join(chunks).hex()[:2000]})
        report.inputs += len(chunks)
    return report
