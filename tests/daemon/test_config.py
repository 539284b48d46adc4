"""Configuration: the shipped TOML and unit file are valid, flags override the file, mistakes are one clear line."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmpd.daemon.config import ConfigError, DaemonConfig, load_config
from rmpd.daemon.memberships import Membership
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.reformation import MIN_PARTITION_MAJORITY
from rmpd.runtime.net import interface_mtu, max_packet_for

from .harness import RMPD

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_config_loads_and_flags_override_it() -> None:
    config = load_config(ROOT / "systemd" / "rmpd.toml", {"port": 7100, "interface": None})
    assert config.interface is None and config.bind is None and config.port == 7100  # loopback unless installed
    assert config.socket == Path("/run/rmpd/rmpd.sock")
    engine = config.engine_config()
    assert engine.join_retries == 4 and engine.null_ack_interval == 1.0 and not engine.journal


@pytest.mark.parametrize(("text", "overrides", "message"), [
    ("colour = 'blue'\n", {}, "unknown key"),
    ("port = 70000\n", {}, "port"),
    ("[timers]\nnull_ack_interval = -1\n", {}, "non-negative"),
    ("[timers]\nwarp = 1\n", {}, "unknown timer"),
    ("[timers]\ncongestion = 'cubic'\n", {}, "congestion must be one of rmp, fixed"),
    ("interface = 'lo'\n", {"bind": "127.0.0.1"}, "either interface or bind"),
    ("bind = 'not-an-ip'\n", {}, "IPv4"),
    ("address_range = '10.0.0.0/8'\n", {}, "multicast"),
    ("port = \n", {}, "rmpd.toml"),
    ("groups = 'app'\n", {}, "groups must be a list"),
    ("groups = [7]\n", {}, r"groups\[0\]: a group is a name or a table"),
    ("groups = ['app', 'app']\n", {}, r"groups\[1\]: 'app' is listed twice"),
    ("groups = ['app', {name = 'b', min_partition = 'most'}]\n", {}, r"groups\[1\]: min_partition must be 'majority'"),
    ("groups = [{name = 'b', min_partition = 0}]\n", {}, "say 'majority'"),
    ("groups = [{name = 'b', ttl = 300}]\n", {}, "ttl of 'b' must be 0..255"),
    ("groups = [{name = 'b', colour = 'blue'}]\n", {}, "unknown key"),
    ("groups = [{min_partition = 2}]\n", {}, "needs a name"),
])
def test_bad_configs_are_refused_with_a_reason(tmp_path: Path, text: str, overrides: dict, message: str) -> None:
    path = tmp_path / "rmpd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)


def test_groups_are_names_or_tables_in_the_public_form(tmp_path: Path) -> None:
    path = tmp_path / "rmpd.toml"
    path.write_text("groups = ['app', {name = 'quorum', min_partition = 'majority', ttl = 2}, "
                    "{name = 'few', min_partition = 3}]\n[timers]\njoin_retries = 2\n")
    config = load_config(path, {})
    assert config.groups == [Membership("app"), Membership("quorum", MIN_PARTITION_MAJORITY, 2),
                             Membership("few", 3)]
    assert [m.as_entry() for m in config.groups][1] == {"name": "quorum", "min_partition": "majority", "ttl": 2}
    assert DaemonConfig().groups == []


def test_congestion_control_is_chosen_in_timers(tmp_path: Path) -> None:
    path = tmp_path / "rmpd.toml"
    path.write_text("[timers]\ncongestion = 'fixed'\n")
    assert load_config(path, {}).engine_config().congestion == "fixed"
    assert DaemonConfig().engine_config().congestion == "rmp"


def test_defaults_are_loopback_and_a_per_user_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = DaemonConfig()
    assert config.address().startswith("127.")
    assert config.socket_path() == tmp_path / "rmpd.sock"


def test_packets_are_larger_where_the_interface_carries_them_whole(tmp_path: Path) -> None:
    """60 KiB packets on loopback (64 KiB MTU: no IP fragments), the engine's 16 KiB on an Ethernet-sized MTU or an
    address on no interface; ``max_packet`` in ``[timers]`` wins over both."""
    if interface_mtu("lo") != 65536:
        pytest.skip("loopback MTU is not the Linux default")
    assert DaemonConfig().engine_config().max_packet == 60 * 1024
    assert max_packet_for("127.0.0.2") == 60 * 1024
    assert max_packet_for("198.51.100.7") == EngineConfig.max_packet == 16384
    path = tmp_path / "rmpd.toml"
    path.write_text("[timers]\nmax_packet = 8192\n")
    assert load_config(path, {}).engine_config().max_packet == 8192
    ethernet = [name for name in os.listdir("/sys/class/net") if (interface_mtu(name) or 65536) <= 9000]
    if ethernet:  # whether or not it has an address to bind
        assert DaemonConfig(interface=ethernet[0]).engine_config().max_packet == 16384


def test_rmpd_says_where_it_serves_and_refuses_a_bad_interface_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run([RMPD, "--interface", "no-such-if0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no-such-if0" in result.stderr
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    with running_rmpd([RMPD, "--port", "0"], env) as line:
        assert "127.0.0.1:" in line and str(tmp_path / "rmpd.sock") in line, line


@contextlib.contextmanager
def running_rmpd(argv: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """An rmpd started with ``argv``, for the body: its first line on stderr (where it serves); SIGTERM after,
    which must end it with status 0."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        yield proc.stderr.readline()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_a_second_rmpd_on_a_taken_port_names_the_port_and_the_likely_cause(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    with running_rmpd([RMPD, "--port", "0", "--state-dir", str(tmp_path / "one")], env) as serving:
        pid = serving.split("process ", 1)[1].split(",", 1)[0]  # "rmpd: process IP:PORT, clients on ..."
        port = pid.rsplit(":", 1)[1]
        second = subprocess.run([RMPD, "--port", port, "--socket", str(tmp_path / "two.sock"), "--state-dir",
                                 str(tmp_path / "two")], capture_output=True, text=True, timeout=30)
    assert second.returncode == 1
    (line,) = second.stderr.strip().splitlines()
    assert f"cannot bind UDP {pid}: address already in use" in line and "--port" in line, line


def test_the_unit_as_installed_by_install_systemd_verifies_and_its_command_runs(tmp_path: Path) -> None:
    """docs/operations.md's install (scripts/install-systemd), into a directory: systemd-analyze verifies the unit
    against that root, and the installed command line starts a daemon that reads the installed config."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    root = tmp_path / "root"
    install = subprocess.run([str(ROOT / "scripts" / "install-systemd"), "--root", str(root)], capture_output=True,
                             text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    unit = root / "etc" / "systemd" / "system" / "rmpd.service"
    # The command as docs/operations.md writes it, on the directory as installed (nothing copied into it).
    documented_verify = "systemd-analyze verify --recursive-errors=no --root=DIR DIR/etc/systemd/system/rmpd.service"
    assert documented_verify in (ROOT / "docs" / "operations.md").read_text()
    result = subprocess.run([tool, "verify", "--recursive-errors=no", f"--root={root}", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "rmpd.service" not in result.stderr, result.stderr
    for command in ("rmp", "rmpd"):  # on PATH: links in /usr/local/bin to the virtual environment's commands
        link = root / "usr" / "local" / "bin" / command
        assert os.readlink(link) == f"/opt/rmpd/bin/{command}"
        assert os.access(root / "opt" / "rmpd" / "bin" / command, os.X_OK)
    helped = subprocess.run([str(root / "opt" / "rmpd" / "bin" / "rmp"), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "rmp" in helped.stdout, helped.stderr
    text = unit.read_text()
    assert "Type=notify" in text and "RuntimeDirectory=rmpd" in text
    documented = next(line for line in text.splitlines() if line.startswith("Documentation=file://"))
    assert (root / documented.removeprefix("Documentation=file:///")).is_file()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart=")
    argv = exec_start.split()
    argv = [str(root) + argv[0], argv[1], str(root) + argv[2], "--port", "0", "--socket", str(tmp_path / "s.sock"),
            "--state-dir", str(tmp_path / "state")]
    with running_rmpd(argv) as line:
        assert "rmpd: process" in line and str(tmp_path / "s.sock") in line, line
