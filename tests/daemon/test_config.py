"""Configuration: the shipped TOML and unit file are valid, flags override the file, mistakes are one clear line."""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netifaces
import pytest
import typer

from cli.rmpd_main import app, load_settings
from rmpd.daemon.config import KEYS, ConfigError, DaemonConfig, load_config
from rmpd.daemon.memberships import Membership
from rmpd.protocol.reformation import MIN_PARTITION_MAJORITY
from rmpd.runtime.net import PATH_OVERHEAD, interface_mtu, packet_limits_for

from .harness import RMPD

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_config_loads_and_flags_override_it() -> None:
    config = load_config(ROOT / "systemd" / "rmpd.toml", {"port": 7100, "interface": None})
    assert config.interface is None and config.bind is None and config.port == 7100  # loopback unless installed
    assert config.socket == Path("/run/rmpd/rmpd.sock")
    engine = config.engine_config()
    assert engine.join_retries == 4 and engine.null_ack_interval == 1.0 and not engine.journal


OWN_GROUP = grp.getgrgid(os.getgid()).gr_name
"""A group that exists here, for socket_group."""

KEY_EXAMPLES: dict[str, tuple[str, list[str]]] = {
    "interface": ("interface = 'lo'", ["--interface", "lo"]),
    "bind": ("bind = '127.0.0.2'", ["--bind", "127.0.0.2"]),
    "port": ("port = 7123", ["--port", "7123"]),
    "socket": ("socket = '/run/other/rmpd.sock'", ["--socket", "/run/other/rmpd.sock"]),
    "socket_mode": ("socket_mode = 0o600", ["--socket-mode", "0o600"]),
    "socket_group": (f"socket_group = '{OWN_GROUP}'", ["--socket-group", OWN_GROUP]),
    "runtime_dir_mode": ("runtime_dir_mode = 0o700", ["--runtime-dir-mode", "700"]),
    "journal": ("journal = '/var/log/other'", ["--journal", "/var/log/other"]),
    "journal_compress": ("journal_compress = true", ["--journal-compress"]),
    "journal_rotate_bytes": ("journal_rotate_bytes = 1048576", ["--journal-rotate-bytes", "1048576"]),
    "log_level": ("log_level = 'debug'", ["--log-level", "debug"]),
    "address_range": ("address_range = '239.1.0.0/16'", ["--address-range", "239.1.0.0/16"]),
    "ttl": ("ttl = 3", ["--ttl", "3"]),
    "multicast": ("multicast = false", ["--no-multicast"]),
    "via": ("via = '127.0.0.1:7001'", ["--via", "127.0.0.1:7001"]),
    "client_queue": ("client_queue = 500", ["--client-queue", "500"]),
    "max_frame": ("max_frame = 65536", ["--max-frame", "65536"]),
    "auth_key": ("auth_key = '/etc/rmpd/other.key'", ["--auth-key", "/etc/rmpd/other.key"]),
    "auth_key_previous": ("auth_key = '/k'\nauth_key_previous = '/old.key'",
                          ["--auth-key", "/k", "--auth-key-previous", "/old.key"]),
    "auth_rotation_window": ("auth_rotation_window = 60.5", ["--auth-rotation-window", "60.5"]),
    "encrypt": ("auth_key = '/k'\nencrypt = true", ["--auth-key", "/k", "--encrypt"]),
    "state_dir": ("state_dir = '/srv/rmpd'", ["--state-dir", "/srv/rmpd"]),
    "metrics": ("metrics = '127.0.0.1:9464'", ["--metrics", "127.0.0.1:9464"]),
    "groups": ("groups = ['app', {name = 'locks', min_partition = 'majority', ttl = 2}]",
               ["--groups", "app", "--groups", "{name = 'locks', min_partition = 'majority', ttl = 2}"]),
    "timers": ("[timers]\nrequest_interval = 0.5\ncongestion = 'fixed'",
               ["--timers", "request_interval=0.5", "--timers", "congestion=fixed"]),
    "scmp": ("[scmp]\nestimator = 'fixed'\nlifetime_ms = 800",
             ["--scmp", "estimator=fixed", "--scmp", "lifetime_ms=800"]),
}
"""Each key of the config written in the file and as flags: the two must give the same settings."""


def settings_from_flags(argv: list[str]) -> DaemonConfig:
    """The settings rmpd would run with for ``argv``, read by its own command-line parser."""
    context = typer.main.get_command(app).make_context("rmpd", list(argv))
    return load_settings(context.params)


def test_every_key_of_the_config_is_a_flag_of_the_same_name() -> None:
    fields = {f.name for f in dataclasses.fields(DaemonConfig)}
    assert {key.name for key in KEYS} == fields == KEY_EXAMPLES.keys()
    helped = subprocess.run([RMPD, "--help"], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "COLUMNS": "200"})
    assert helped.returncode == 0, helped.stderr
    for key in KEYS:
        assert re.search(rf"{key.flag}\b", helped.stdout), f"rmpd --help does not list {key.flag}"


def as_flags(values: dict[str, Any]) -> list[str]:
    """The flags that say what ``values`` (a config file as read) says."""
    kinds = {key.name: key for key in KEYS}
    argv: list[str] = []
    for name, value in values.items():
        key = kinds[name]
        if key.kind == "switch":
            argv.append(key.flag if value else f"--no-{key.flag[2:]}")
        elif key.kind == "entries":
            for entry in value:
                argv += [key.flag, entry if isinstance(entry, str) else
                         "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in entry.items()) + "}"]
        elif key.kind == "table":
            for item, setting in value.items():
                argv += [key.flag, f"{item}={json.dumps(setting)}"]
        else:
            argv += [key.flag, oct(value) if key.kind == "mode" else str(value)]
    return argv


def test_the_shipped_configs_keys_commented_or_not_are_flags_that_say_the_same(tmp_path: Path) -> None:
    shipped = (ROOT / "systemd" / "rmpd.toml").read_text()
    every_key = re.sub(r"^# (\w+ = )", r"\1", shipped, flags=re.MULTILINE)  # the commented examples too
    path = tmp_path / "rmpd.toml"
    path.write_text(every_key)
    with open(path, "rb") as handle:
        values = tomllib.load(handle)
    assert {"interface", "groups", "journal", "metrics", "timers"} <= values.keys()
    assert values.keys() <= KEY_EXAMPLES.keys()
    assert settings_from_flags(as_flags(values)) == load_config(path, {})


@pytest.mark.parametrize("key", sorted(KEY_EXAMPLES))
def test_a_flag_gives_the_same_setting_as_its_key(tmp_path: Path, key: str) -> None:
    text, argv = KEY_EXAMPLES[key]
    path = tmp_path / "rmpd.toml"
    path.write_text(text + "\n")
    from_file = load_config(path, {})
    assert getattr(from_file, key) != getattr(DaemonConfig(), key)  # the example sets something
    assert settings_from_flags(argv) == from_file


def test_flags_win_over_the_file_and_a_tables_flags_over_the_keys_they_name(tmp_path: Path) -> None:
    path = tmp_path / "rmpd.toml"
    path.write_text("ttl = 3\nsocket_mode = 0o600\ngroups = ['a', 'b']\n[timers]\nrequest_interval = 0.5\n"
                    "join_retries = 2\n")
    config = settings_from_flags(["--config", str(path), "--ttl", "4", "--socket-mode", "640", "--groups", "c",
                                  "--timers", "request_interval=0.9"])
    assert (config.ttl, config.socket_mode, config.groups) == (4, 0o640, [Membership("c")])
    assert config.timers == {"request_interval": 0.9, "join_retries": 2}


def test_flags_with_a_value_that_cannot_be_the_key_are_refused() -> None:
    for argv, message in [(["--socket-mode", "rw"], "octal file mode"), (["--timers", "request_interval"],
                          "NAME=VALUE"), (["--timers", "warp=1"], "unknown timer"),
                          (["--groups", "{name = "], "not a TOML value")]:
        with pytest.raises(ConfigError, match=message):
            settings_from_flags(argv)


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
    assert DaemonConfig().engine_config().congestion == "delay"


def test_defaults_are_loopback_and_a_per_user_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = DaemonConfig()
    assert config.address().startswith("127.")
    assert config.socket_path() == tmp_path / "rmpd.sock"


def test_packets_are_larger_where_the_interface_carries_them_whole(tmp_path: Path) -> None:
    """60 KiB packets on loopback (64 KiB MTU: no IP fragments); on an Ethernet-sized MTU the engine's 16 KiB, and
    packets shrink to one MTU's worth at most; an address on no interface keeps the engine's defaults;
    ``max_packet`` in ``[timers]`` wins over all."""
    if interface_mtu("lo") != 65536:
        pytest.skip("loopback MTU is not the Linux default")
    assert DaemonConfig().engine_config().max_packet == 60 * 1024
    assert packet_limits_for("127.0.0.2") == {"max_packet": 60 * 1024}
    assert packet_limits_for("198.51.100.7") == {}
    path = tmp_path / "rmpd.toml"
    path.write_text("[timers]\nmax_packet = 8192\n")
    assert load_config(path, {}).engine_config().max_packet == 8192
    ethernet = [name for name in netifaces.interfaces()
                if (interface_mtu(name) or 65536) <= 9000 and netifaces.ifaddresses(name).get(netifaces.AF_INET)]
    if ethernet:
        config = DaemonConfig(interface=ethernet[0]).engine_config()
        assert config.max_packet == 16384
        assert config.min_packet == min(8192, (interface_mtu(ethernet[0]) or 0) - PATH_OVERHEAD)
    assert packet_limits_for("10.99.0.1") == {}  # on no interface here


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
    assert "ExecReload=-/bin/kill -HUP $MAINPID" in text  # SIGHUP reloads (tests/daemon/test_stopping.py)
    documented = next(line for line in text.splitlines() if line.startswith("Documentation=file://"))
    assert (root / documented.removeprefix("Documentation=file:///")).is_file()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart=")
    argv = exec_start.split()
    argv = [str(root) + argv[0], argv[1], str(root) + argv[2], "--port", "0", "--socket", str(tmp_path / "s.sock"),
            "--state-dir", str(tmp_path / "state")]
    with running_rmpd(argv) as line:
        assert "rmpd: process" in line and str(tmp_path / "s.sock") in line, line
