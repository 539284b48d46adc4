"""SCMP under clocks off by up to 2 s, drifting lifetimes, duplicates and server crashes (rmp sim-scmp)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.rmp_main import app
from rmpd.sim.scmp_sim import ScmpSimConfig, bounded_lifetime, run_scmp_seed


def test_bounded_lifetime_tolerates_h_spikes_per_window() -> None:
    assert bounded_lifetime([10, 10, 500, 10, 10, 10], window=3, spikes=1) == 10
    assert bounded_lifetime([10, 500, 500, 10, 10, 10], window=3, spikes=1) == 500


def test_no_duplicate_accepted_and_the_estimate_converges_below_twice_the_bound() -> None:
    config = ScmpSimConfig(clients=10, seconds=40, crashes=2)
    for seed in range(1, 101):
        result = run_scmp_seed(config, seed)
        assert result.duplicates_accepted == 0, seed
        assert result.crashes == 2
        assert result.estimate_ratio < 2.0, (seed, result)
        # After each crash every message stamped before the persisted latest is refused (figure 2-2): with
        # latest 5 s ahead, two crashes in 40 s cost about a quarter of the fresh messages.
        assert result.fresh_rejected_fraction < 0.5, (seed, result)


def test_a_late_crash_does_not_leave_the_estimate_high() -> None:
    """Seeds whose last crash comes late in the default 240 s run: the rejections right after recovery once kept
    the estimate at 8 s against a true lifetime of about 2 s (ratio 2.9 and 3.9)."""
    for seed in (29, 57):
        result = run_scmp_seed(ScmpSimConfig(), seed)
        assert result.duplicates_accepted == 0
        assert result.estimate_ratio < 2.0, result


def test_cli_reports_and_fails_on_nothing_here() -> None:
    out = CliRunner().invoke(app, ["sim-scmp", "--seeds", "3", "--seconds", "20", "--clients", "5", "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["duplicates_accepted"] == 0 and summary["seeds"] == 3


def test_engine_sim_calls_duplicated_five_times_run_once_and_all_get_their_reply() -> None:
    from rmpd.sim.runner import SimConfig, run_seed

    config = SimConfig(members=3, senders=2, messages=50, calls=10, call_dup=5)
    for seed in range(1, 6):
        result = run_seed(config, seed)
        assert result.violation_count == 0, result.violations[:3]
        assert result.calls_replied == 10, result.calls_failed
        copies = result.stats.get("call_copy_in_flight", 0) + result.stats.get("calls_duplicate", 0)
        assert copies >= 10 * 4, "the copies reached the relay: dropped while in flight, or filtered once ordered"


def test_engine_sim_calls_under_faults_never_run_twice() -> None:
    from rmpd.sim.runner import SimConfig, run_seed

    config = SimConfig(members=5, senders=2, messages=60, loss=0.05, crash=1, partition=True, locks=True,
                       calls=10, call_dup=5)
    for seed in range(1, 4):
        result = run_seed(config, seed)
        assert result.violation_count == 0, result.violations[:3]
        assert result.calls_replied + sum(result.calls_failed.values()) == 10
