"""`rmp sim` as a person runs it: flags, exit codes, the JSON line, replay commands."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.rmp_main import app
from rmpd.sim import runner
from tests.sim import broken

RMP = str(Path(sys.executable).parent / "rmp")
cli_runner = CliRunner()


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_json_summary_has_the_promised_keys() -> None:
    result = cli_runner.invoke(app, ["sim", "--members", "3", "--messages", "20", "--loss", "0.1", "--seeds", "2",
                                     "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.stdout)
    assert {"seeds", "violations", "delivered", "expected", "quiescent", "failures"} <= summary.keys()
    assert summary["seeds"] == 2 and summary["violations"] == 0 and summary["failures"] == []
    assert summary["delivered"] == summary["expected"] == 2 * 3 * 20 * 3


def test_healing_flags_report_one_view_and_convergence() -> None:
    result = cli_runner.invoke(app, ["sim", "--members", "4", "--messages", "20", "--loss", "0.05", "--restarts", "1",
                                     "--simultaneous", "--partition", "--seeds", "2", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.stdout)
    assert summary["one_view_seeds"] == 2 and summary["violations"] == 0
    assert 0 <= summary["convergence_p50_seconds"] <= summary["convergence_p99_seconds"]
    assert "--restarts 1 --simultaneous" in runner.SimConfig(members=4, restarts=1, simultaneous=True).replay_command(7)


@pytest.mark.parametrize(("args", "message"), [
    (["--loss", "1.5"], "probability"),
    (["--qos", "fastest"], "must be one of"),
    (["--members", "2", "--senders", "3"], "--senders"),
    (["--members", "0"], "--members"),
    (["--congestion", "cubic"], "rmp, fixed, delay"),
])
def test_bad_flags_exit_2_with_a_clear_error(args: list[str], message: str) -> None:
    result = cli_runner.invoke(app, ["sim", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_a_congestion_control_is_chosen_for_the_members_and_kept_in_the_replay() -> None:
    """The same seed under another congestion control is another run (the windows send differently), and the
    replay command names the one it ran."""
    runs = {}
    for congestion in ("rmp", "delay"):
        result = cli_runner.invoke(app, ["sim", "--members", "3", "--messages", "300", "--size", "8000", "--loss",
                                         "0.1", "--seed", "2", "--congestion", congestion, "--json"])
        assert result.exit_code == 0, result.output
        runs[congestion] = last_json(result.stdout)
        assert runs[congestion]["delivered"] == runs[congestion]["expected"]
    assert runs["rmp"]["datagrams"] != runs["delay"]["datagrams"]
    config = runner.SimConfig(members=3, congestion="delay")
    assert "--congestion delay" in config.replay_command(2)


def test_violation_exits_1_and_prints_a_replay_that_reproduces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    run_seed = runner.run_seed

    def broken_run_seed(config, seed, journal_dir=None):
        return run_seed(config, seed, journal_dir, engine_factory=broken.DeliversTotalOnReceipt)

    monkeypatch.setattr(runner, "run_seed", broken_run_seed)
    args = ["sim", "--members", "3", "--messages", "15", "--loss", "0.2", "--seeds", "2", "--workers", "1", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 1
    summary = last_json(result.stdout)
    assert summary["violations"] > 0
    failure = summary["failures"][0]
    assert failure["invariant"] == "total-order"
    replay = shlex.split(failure["replay"])
    assert replay[:2] == ["rmp", "sim"] and replay[-2:] == ["--seed", str(failure["seed"])]
    again = cli_runner.invoke(app, [*replay[1:], "--json"])
    assert again.exit_code == 1
    assert last_json(again.stdout)["failures"][0] == failure


def test_keys_flag_counts_keys_and_is_kept_in_the_replay() -> None:
    """With --keys the summary says how many keys were sent and delivered (every one, once), and a failure's replay
    command runs keyed again."""
    result = cli_runner.invoke(app, ["sim", "--members", "3", "--messages", "30", "--loss", "0.1", "--qos", "mixed",
                                     "--keys", "--seeds", "2", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = last_json(result.stdout)
    assert summary["violations"] == 0 and summary["failures"] == []
    assert 0 < summary["keys_delivered"] == summary["keys_sent"] < 2 * 3 * 30
    assert "keys delivered / keys sent" in result.stderr
    assert runner.SimConfig(members=3, keys=True).replay_command(4).endswith("--keys --seed 4")


def test_journal_flag_writes_one_directory_per_seed(tmp_path: Path) -> None:
    result = cli_runner.invoke(app, ["sim", "--members", "2", "--messages", "5", "--seeds", "2", "--workers", "1",
                                     "--journal", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed-1", "seed-2"]
    assert len(list((tmp_path / "seed-1").glob("*.jsonl"))) == 2


@pytest.mark.slow
def test_acceptance_seeds_under_faults() -> None:
    """The acceptance run's mix, as a real process: 25 seeds, 5 members, 20% loss, mixed QoS (docs/reliability.md
    records the 100-seed run).  No crash is simulated, so a reformation, or a member left waiting, is a false
    suspicion."""
    out = subprocess.run(
        [RMP, "sim", "--members", "5", "--senders", "3", "--messages", "300", "--loss", "0.2", "--dup", "0.05",
         "--reorder", "0.3", "--qos", "mixed", "--seeds", "25", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = last_json(out.stdout)
    assert summary["seeds"] == 25 and summary["violations"] == 0
    assert summary["delivered"] == summary["expected"] > 0
    assert summary["liveness"] is True and summary["reformations"] == 0


@pytest.mark.slow
def test_acceptance_quiescent_without_faults() -> None:
    out = subprocess.run(
        [RMP, "sim", "--members", "5", "--senders", "3", "--messages", "300", "--loss", "0", "--dup", "0",
         "--reorder", "0", "--qos", "mixed", "--seeds", "10", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = last_json(out.stdout)
    assert summary["quiescent"] is True and summary["quiescent_seeds"] == 10
