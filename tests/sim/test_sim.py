"""Simulation over many seeds: safety under loss, duplication and reordering; liveness and quiescence after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmpd.protocol.config import EngineConfig
from rmpd.sim.detection import CrashDetections
from rmpd.sim.runner import QOS_CHOICES, SimConfig, run_seed

REQUIRED_FIELDS = {"v", "node", "group", "event", "view", "ts", "src", "seq", "qos", "wall", "mono"}


@pytest.mark.parametrize("qos", QOS_CHOICES)
def test_every_qos_is_safe_and_live_under_faults(qos: str) -> None:
    config = SimConfig(members=4, senders=3, messages=40, loss=0.25, dup=0.1, reorder=0.4, qos=qos)
    for seed in range(1, 6):
        r = run_seed(config, seed)
        assert r.violations == [], (seed, r.violations)
        assert r.delivered == r.expected, seed
        assert r.quiescent, seed


@pytest.mark.parametrize("members", [1, 2, 7])
def test_group_sizes(members: int) -> None:
    r = run_seed(SimConfig(members=members, senders=members, messages=30, loss=0.1, reorder=0.2, qos="mixed"), 3)
    assert (r.violations, r.delivered, r.quiescent) == ([], r.expected, True)


def test_a_seed_replays_exactly() -> None:
    config = SimConfig(members=4, senders=2, messages=50, loss=0.2, dup=0.05, reorder=0.3, qos="mixed")
    assert run_seed(config, 42).to_json() == run_seed(config, 42).to_json()
    assert run_seed(config, 42).to_json() != run_seed(config, 43).to_json()


def test_orderingq_stays_within_two_rotations() -> None:
    for members in (3, 5):
        r = run_seed(SimConfig(members=members, senders=3, messages=200, loss=0.2, reorder=0.3, qos="mixed"), 7)
        assert 0 < r.max_ack_slots <= 2 * members
    r = run_seed(SimConfig(members=5, senders=3, messages=200, qos="mixed"), 7)
    assert r.max_ack_slots <= 5, "without loss every member frees slots once N ACKs follow them"


def test_journal_records_follow_the_trace_format(tmp_path: Path) -> None:
    config = SimConfig(members=3, senders=2, messages=20, loss=0.1, qos="mixed")
    result = run_seed(config, 5, journal_dir=tmp_path)
    files = sorted((tmp_path / "seed-5").glob("*.jsonl"))
    assert [f.name for f in files] == ["10.0.0.1_7000.0.jsonl", "10.0.0.2_7000.0.jsonl", "10.0.0.3_7000.0.jsonl"]
    events: dict[str, int] = {}
    reliable_deliveries = 0
    for f in files:
        node = None
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec.keys() >= REQUIRED_FIELDS
            node = node or rec["node"]
            assert rec["node"] == node
            events[rec["event"]] = events.get(rec["event"], 0) + 1
            if rec["event"] in ("send", "recv"):
                assert rec["packet"] in {"data", "ack", "confirm", "nack"}
            if rec["event"] == "deliver" and rec["qos"] != "unreliable":
                reliable_deliveries += 1
            if rec["event"] == "deliver" and rec["qos"] not in ("unreliable", "unordered", "source"):
                assert isinstance(rec["ts"], int)
    assert reliable_deliveries == result.delivered == result.expected
    assert {"send", "recv", "deliver", "view", "token"} <= events.keys()


@pytest.mark.parametrize("faults", [
    {"crash": 1}, {"joins": 2, "leaves": 1}, {"locks": True}, {"partition": True}, {"restarts": 2},
    {"simultaneous": True},
    {"crash": 1, "partition": True, "joins": 1, "leaves": 1, "locks": True},
    {"crash": 1, "restarts": 2, "partition": True, "simultaneous": True},
], ids=["crash", "joins-leaves", "locks", "partition", "restarts", "simultaneous", "all", "healing"])
def test_membership_faults_keep_every_invariant_and_end_in_one_view(faults: dict) -> None:
    config = SimConfig(members=5, senders=3, messages=40, loss=0.1, qos="mixed", **faults)
    for seed in (1, 2, 3):
        r = run_seed(config, seed)
        assert r.violations == [], (seed, r.violations)
        assert r.quiescent and r.liveness, seed
        assert r.one_view, f"seed {seed}: the live members did not end in one view"
        assert r.views_installed >= 1


def test_a_member_restarted_on_its_process_id_is_a_new_incarnation_in_the_one_view() -> None:
    """A restart on the same ID neither waits for failure detection (the token site replaces the old incarnation)
    nor delivers what the old one delivered (the checker counts a same-ID restart as a new application)."""
    config = SimConfig(members=4, senders=2, messages=60, loss=0.05, qos="total", restarts=1)
    for seed in (1, 2, 3, 4):
        r = run_seed(config, seed)
        assert r.violations == [] and r.one_view, seed
        assert r.stats.get("incarnations_replaced", 0) + r.stats.get("suspected_restarted", 0) >= 1, seed
        assert r.convergence_seconds < EngineConfig().fail_after, (seed, r.convergence_seconds)


def test_a_crashed_member_is_removed_within_the_papers_order_of_time() -> None:
    config = SimConfig(members=5, senders=3, messages=60, loss=0.05, qos="total", crash=1)
    detections = [run_seed(config, seed).detection_seconds for seed in (1, 2, 3)]
    assert all(0 < d < 20 for d in detections), detections


def test_detection_counts_only_views_of_the_crashed_members_fellows() -> None:
    """Under the issue's fault mix a crash was once "detected" in 0.07 s (a joiner's group of its own, which never
    held the crashed process) and in 17 s (the crashed process's own restart forming a new group).  Only a view
    installed by a process whose view held the crashed one counts; crashes whose fellows all stopped first are
    counted apart, not timed."""
    crashes = CrashDetections()
    crashed, fellow, stranger = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.9:7000"
    crashes.crashed(crashed, 0.0, {fellow})
    crashes.view_installed(stranger, {stranger}, at=0.5)
    assert crashes.detections == [] and crashes.untimed == 1
    crashes.view_installed(fellow, {fellow}, at=4.5)
    assert crashes.detections == [4.5] and crashes.untimed == 0
    crashes.crashed(fellow, 5.0, {stranger})
    crashes.no_longer_fellow(stranger)
    crashes.view_installed(stranger, {stranger}, at=6.0)
    assert crashes.detections == [4.5] and crashes.untimed == 1, "a fellow that stopped times nothing"
    config = SimConfig(members=7, senders=4, messages=200, loss=0.1, crash=2, partition=True, joins=2, leaves=1,
                       locks=True, qos="mixed")
    for seed in (8, 14, 41):
        r = run_seed(config, seed)
        assert r.violation_count == 0 and r.liveness, seed
        assert len(r.detections) + r.crashes_untimed == 2, (seed, r.detections, r.crashes_untimed)
        # A removal can come well before the failure detector's time when a partition had already cut the process
        # off and a reformation was under way when it crashed (seed 8: 0.7 s).
        assert all(0.0 < d < 15.0 for d in r.detections), (seed, r.detections)


def test_loss_without_faults_never_makes_a_member_suspect_a_failure() -> None:
    """20% loss with duplication and reordering but no crash: every suspicion would be false.  Seeds 1, 37, 43
    and 89 once suspected a stall when unanswered tail NACKs kept naming a member that had missed the same last
    ACK (they go round the ring).  Seeds 1 to 25 of this mix are run by tests/cli/test_sim_cli.py's acceptance
    run, which asserts the same."""
    config = SimConfig(members=5, senders=3, messages=300, loss=0.2, dup=0.05, reorder=0.3, qos="mixed")
    for seed in (1, 37, 43, 89):
        r = run_seed(config, seed)
        assert r.violation_count == 0 and r.liveness, seed
        assert r.reformations == 0, (seed, r.reformations)


def test_a_member_cut_off_that_sends_after_the_heal_and_crashes_leaves_nobody_asking_for_ever() -> None:
    """Seed 132 of this mix: a member a reformation removed went on multicasting in its old view after the
    partition healed; the others took its packets in, ordered what happened to follow on from its last ordered
    one, and after it crashed NACKed for ever a hole only it had held (the ring never went quiet)."""
    config = SimConfig(members=6, senders=3, messages=200, size=100, loss=0.15, dup=0.05, reorder=0.2,
                       qos="mixed", crash=2, partition=True, joins=1, leaves=1, locks=True, calls=5)
    r = run_seed(config, 132)
    assert r.violations == [] and r.quiescent and r.liveness
    assert r.delivered == r.expected


def test_a_member_removed_while_cut_off_and_idle_stops_instead_of_nacking_for_ever() -> None:
    """Seed 8 of this mix: two members a partition cut off while they had nothing to send or deliver were removed
    by the majority's reformation; after the heal they heard the ring pass the token only in views they did not
    know, never got an ACK of their own view, and NACKed a gap of an old view's source every 0.64 s for ever."""
    config = SimConfig(members=5, senders=3, messages=100, size=100, loss=0.1, qos="mixed", crash=1,
                       partition=True, joins=2, leaves=1)
    r = run_seed(config, 8)
    assert r.violations == [] and r.quiescent and r.liveness


def test_a_call_that_waited_for_its_handler_does_not_hold_its_caller_at_one_instant() -> None:
    """Seed 75 of this mix: a caller's probe was answered no-handler, then ready; the call went out, and once the
    no-handler grace had passed the caller kept asking for a timer already due that did nothing, so simulated time
    stood still (100,000 events at one instant)."""
    config = SimConfig(members=7, senders=4, messages=200, size=100, loss=0.1, qos="mixed", crash=2,
                       partition=True, joins=2, leaves=1, locks=True, calls=5)
    r = run_seed(config, 75)
    assert r.violations == [] and r.quiescent and r.liveness
