"""The checker's membership invariants can fail: each broken engine trips the one it breaks."""

from __future__ import annotations

import pytest

from rmpd.protocol.engine import GroupEngine
from rmpd.sim.runner import SimConfig, run_seed

from . import broken
from .broken import violated

CASES = [
    ("lock-exclusion", broken.GrantsHeldLocks,
     SimConfig(members=4, senders=2, messages=30, loss=0.05, locks=True, qos="total"), 1),
    ("unique-view-id", broken.ReusesViewIds,
     SimConfig(members=4, senders=2, messages=30, loss=0.05, locks=True, joins=1, qos="total"), 1),
    ("virtual-synchrony", broken.InstallsViewsEarly,
     SimConfig(members=4, senders=3, messages=30, loss=0.1, reorder=0.3, locks=True, joins=1, leaves=1, qos="total"),
     1),
    ("resilient-order", broken.IgnoresMinimumPartition,
     SimConfig(members=5, senders=3, messages=300, loss=0.2, partition=True, qos="majority"), 10),
]
"""(invariant, broken engine, workload, the first seed to search from for a schedule that shows it)."""


@pytest.mark.parametrize(("invariant", "factory", "config", "first_seed"), CASES, ids=[c[0] for c in CASES])
def test_checker_catches_broken_membership(invariant: str, factory: type[GroupEngine], config: SimConfig,
                                           first_seed: int) -> None:
    for seed in (1, 2):
        result = run_seed(config, seed)
        assert result.violations == [], "the correct engine passes this workload"
        assert result.quiescent and result.liveness
    # A partition must split the ring while majority traffic is in flight, and last until the minority has
    # reformed on its own, for the broken rule to show; a few schedules in forty give it room to (for
    # resilient-order: at 20% loss with enough messages that some are still being repaired when the partition
    # strikes, seed 6 of the first fifteen until the token pass rules of f395185 moved every lossy schedule, seed 31
    # of forty after them, seed 44 alone of sixty since a pass's arrival frees the window, seed 10 since a NACK
    # naming no one is answered by the packet's sender and one other holder; at 10% only seed 39 of
    # forty since a view stopped ordering the data of a source it left out).  The search starts at the seed known
    # to show it, so the run costs one seed, not forty.
    assert invariant in violated(config, factory, range(first_seed, 61), invariant)
