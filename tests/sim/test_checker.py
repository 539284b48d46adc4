"""The in-process checker can fail: each deliberately broken engine trips the invariant it breaks."""

from __future__ import annotations

import pytest

from rmpd.protocol.engine import GroupEngine
from rmpd.sim.runner import SimConfig

from . import broken
from .broken import violated

FAULTY = {"members": 4, "senders": 3, "messages": 60, "loss": 0.2, "dup": 0.1, "reorder": 0.3}

CASES = [
    ("token-acceptance", broken.AcceptsWithHoles, SimConfig(**FAULTY, qos="total")),
    ("total-order", broken.DeliversTotalOnReceipt, SimConfig(**FAULTY, qos="total")),
    ("no-duplicate", broken.DeliversDuplicates, SimConfig(**FAULTY, qos="unordered")),
    ("k-resilience", broken.IgnoresResilience, SimConfig(**FAULTY, qos="safe")),
    ("source-order", broken.SourceOrderOnReceipt, SimConfig(**FAULTY, qos="source")),
    ("one-order", broken.EveryoneHoldsTheToken, SimConfig(**FAULTY, qos="total")),
    ("total-order", broken.SkipsOneMessage, SimConfig(members=3, senders=2, messages=10, qos="total")),
    ("integrity", broken.CorruptsPayloads, SimConfig(members=3, senders=2, messages=10, qos="mixed")),
]


@pytest.mark.parametrize(("invariant", "factory", "config"), CASES, ids=[c[1].__name__ for c in CASES])
def test_checker_catches_broken_engine(invariant: str, factory: type[GroupEngine], config: SimConfig) -> None:
    assert violated(config, GroupEngine, range(1, 4)) == set(), "the correct engine passes this workload"
    assert invariant in violated(config, factory, range(1, 4))
