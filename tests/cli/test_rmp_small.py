"""What a person checks first: `--version`, the multicast probe's answer, `rmp sim`'s table at 80 columns."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

from typer.testing import CliRunner

from cli.rmp_main import app as rmp_app
from cli.rmpd_main import app as rmpd_app
from tests.daemon.harness import ensure_loopback_multicast

cli_runner = CliRunner()


def test_rmp_and_rmpd_print_the_installed_version() -> None:
    installed = version("rmpd")
    for app, command in ((rmp_app, "rmp"), (rmpd_app, "rmpd")):
        result = cli_runner.invoke(app, ["--version"])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == f"{command} {installed}"


def test_the_probe_says_what_it_found_with_its_exit_status() -> None:
    ensure_loopback_multicast()
    probe = [sys.executable, "-m", "rmpd.daemon.probe"]
    loops = subprocess.run([*probe, "127.0.0.1"], capture_output=True, text=True, timeout=30)
    assert loops.returncode == 0
    assert "multicast sent on 127.0.0.1 comes back to this host" in loops.stdout
    nowhere = subprocess.run([*probe, "192.0.2.1"], capture_output=True, text=True, timeout=30)  # TEST-NET-1
    assert nowhere.returncode == 1
    assert "multicast sent on 192.0.2.1 does not come back to this host: cannot join" in nowhere.stdout
    bad = subprocess.run([*probe, "not-an-address"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_sim_table_reads_whole_at_80_columns() -> None:
    result = cli_runner.invoke(rmp_app, ["sim", "--members", "5", "--messages", "200", "--seeds", "2",
                                         "--workers", "1"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout
    text = "\n".join(lines)
    delivered = 3 * 200 * 5 * 2  # senders x messages x members x seeds
    for measure, value in (("delivered / expected", f"{delivered} / {delivered}"), ("violations", "0"),
                           ("max OrderingQ ACKs", r"\d+"), ("datagrams", r"\d{4,}")):
        assert re.search(rf"│ {re.escape(measure)} +│ +{value} │", text), (measure, text)


def test_a_command_loads_what_it_runs_and_not_what_the_other_commands_run() -> None:
    """Every `rmp` builds all of its commands' options, so a module of commands imports at its top only what those
    need: a command to the daemon must not wait for the auditor, the simulator, the bench or package metadata."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from cli.rmp_main import app; import typer.main; "
                               "typer.main.get_command(app); print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert "trio" in loaded and "rmpd.client" in loaded  # what the daemon's commands run with
    for heavy in ("rmpd.audit.inputs", "rmpd.keyfile", "rmpd.sim.runner", "rmpd.bench.run", "rich.progress",
                  "rich.live", "importlib.metadata", "concurrent.futures.process", "pyspark"):
        assert heavy not in loaded, heavy
