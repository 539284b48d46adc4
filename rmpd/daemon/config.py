"""Daemon settings: TOML file, then command-line flags on top, then defaults.

Every key of the file has a flag of the same name (``log_level``: ``--log-level``), made from one table,
:data:`KEYS`, so an operator can move a setting between the unit file and the config without renaming it, and a
key cannot be added without its flag.  Timers live in a ``[timers]`` table whose keys are the engine's own
(:class:`rmpd.protocol.config.EngineConfig`), so the file never needs to learn a second vocabulary.
"""

from __future__ import annotations

import dataclasses
import grp
import ipaddress
import os
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmpd.keyfile import load_key_file
from rmpd.localapi import DEFAULT_MAX_FRAME, default_socket_path
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.flow import CONGESTION_CONTROLS
from rmpd.protocol.ids import split_process_id
from rmpd.protocol.multirpc import ScmpSettings
from rmpd.protocol.naming import DEFAULT_RANGE
from rmpd.runtime.auth import DatagramGuard
from rmpd.runtime.net import ConfigError, interface_address, loopback_interface, packet_limits_for
from rmpd.wire.sealing import AuthKeyError

from .memberships import Membership, parse_memberships
from .metrics_http import parse_address

DEFAULT_PORT = 7000



@dataclass(frozen=True)
class Key:
    """One key of the config file and its command-line flag: ``--`` and the name with ``-`` for ``_``."""

    name: str
    kind: str
    """How the flag reads its value: ``text``, ``path``, ``int``, ``number``, ``switch`` (``--x/--no-x``),
    ``mode`` (octal, ``0o660`` or ``660``), ``entries`` (repeated, one list entry each: a name or an inline TOML
    table) or ``table`` (repeated ``NAME=VALUE``, one key of the TOML table each, VALUE as in TOML)."""
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KEYS: tuple[Key, ...] = (
    Key("interface", "text", "Interface name (e.g. lo, eth0) to bind and join on (default: loopback)."),
    Key("bind", "text", "IPv4 address to bind and join on, instead of --interface."),
    Key("port", "int", "Unicast UDP port (0: any free port)."),
    Key("socket", "path", "Unix socket for local clients (default: $XDG_RUNTIME_DIR/rmpd.sock, else in /tmp)."),
    Key("socket_mode", "mode", "File mode of the client socket (octal)."),
    Key("socket_group", "text", "Group owning the client socket (default: rmpd, when it exists)."),
    Key("runtime_dir_mode", "mode", "File mode of the socket's directory when rmpd creates it (octal)."),
    Key("journal", "path", "Write the journal (docs/trace-format.md) into DIR."),
    Key("journal_compress", "switch", "Compress the journal's files."),
    Key("journal_rotate_bytes", "int", "Start a new journal file after this many bytes."),
    Key("log_level", "text", "debug, info, warning or error."),
    Key("address_range", "text", "Multicast range that group names hash into."),
    Key("ttl", "int", "Multicast TTL unless a client asks for more (1: this link only)."),
    Key("multicast", "switch", "--no-multicast: this host cannot receive multicast; members send it unicast copies."),
    Key("via", "text", "A member's process ID (ip:port) that multicasts for this daemon, for a host whose "
                       "multicasts do not reach the group."),
    Key("client_queue", "int", "Frames queued for one local client before it is cut off (slow-consumer)."),
    Key("max_frame", "int", "Largest local API frame accepted, in bytes."),
    Key("auth_key", "path", "Group key file (rmpd keygen): sign every datagram, drop every one that is not signed "
                            "with it."),
    Key("auth_key_previous", "path", "During a key rotation: the old key, still accepted for receiving."),
    Key("auth_rotation_window", "number", "Seconds the previous key is accepted for."),
    Key("encrypt", "switch", "Also encrypt datagrams (ChaCha20-Poly1305) under --auth-key."),
    Key("state_dir", "path", "Where SCMP's latest and the groups to rejoin are kept across restarts (default: "
                             "$STATE_DIRECTORY, /var/lib/rmpd as root, ~/.local/state/rmpd)."),
    Key("metrics", "text", "Serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 "
                           "(default: off)."),
    Key("groups", "entries", "A group joined at every start and kept with no client: NAME, or a table such as "
                             "'{name = \"locks\", min_partition = \"majority\"}'.  Repeat for more; replaces the "
                             "file's list."),
    Key("timers", "table", "One engine setting of the timers table, NAME=VALUE (request_interval=0.2).  Repeat "
                           "for more."),
    Key("scmp", "table", "One setting of the scmp table, NAME=VALUE (estimator=fixed).  Repeat for more."),
)
"""The config's keys, in the order ``rmpd --help`` lists their flags."""

TOP_KEYS = {key.name for key in KEYS if key.kind != "table"}
TIMER_KEYS = {f.name for f in dataclasses.fields(EngineConfig)} - {"journal"}
SCMP_KEYS = {f.name for f in dataclasses.fields(ScmpSettings)} - {"upper", "latest"}
DAEMON_TIMERS: dict[str, Any] = {"request_interval": 0.2, "join_retries": 4}
"""Where the daemon departs from the engine's defaults: a first join to a group nobody else is in forms the group
after about 3 s (0.2 + 0.4 + 0.8 + 1.6) instead of about 10 s, which is what a person at a terminal waits for."""


@dataclass
class DaemonConfig:
    interface: str | None = None
    """Network interface name (resolved to its IPv4 address with netifaces); loopback when neither it nor bind."""
    bind: str | None = None
    """IPv4 address to bind and to join multicast groups on, instead of an interface name."""
    port: int = DEFAULT_PORT
    """Unicast UDP port: with the address it is this process's ID.  0 lets the kernel choose."""
    socket: Path | None = None
    journal: Path | None = None
    journal_compress: bool = False
    journal_rotate_bytes: int = 64 * 1024 * 1024
    log_level: str = "info"
    address_range: str = DEFAULT_RANGE
    ttl: int = 1
    """Multicast TTL when no client asks for more (1: the local link only)."""
    multicast: bool = True
    """False on hosts that cannot receive multicast: the group then sends this member unicast copies."""
    socket_mode: int = 0o660
    socket_group: str | None = None
    """Group owning the socket (and a runtime directory the daemon creates); default ``rmpd`` when it exists."""
    runtime_dir_mode: int = 0o750
    client_queue: int = 10_000
    """Frames queued for one local client before it is cut off as a slow consumer."""
    max_frame: int = DEFAULT_MAX_FRAME
    auth_key: Path | None = None
    """Group key file (``rmpd keygen``): every datagram sent carries a MAC, every one received must."""
    auth_key_previous: Path | None = None
    """During a key rotation: a second key still accepted for receiving, for ``auth_rotation_window`` seconds."""
    auth_rotation_window: float = 3600.0
    encrypt: bool = False
    """Seal datagrams with ChaCha20-Poly1305 under the auth key instead of only signing them."""
    state_dir: Path | None = None
    """Where ``latest`` of SCMP and the memberships to rejoin are kept across restarts (default: $STATE_DIRECTORY
    from systemd, else /var/lib/rmpd for root, else ~/.local/state/rmpd)."""
    groups: list[Membership] = field(default_factory=list)
    """Groups the daemon joins at every start and keeps with no client (``groups = ["a", {name = "b",
    min_partition = "majority", ttl = 2}]``), on top of those recorded by persistent joins (rmpd.daemon.memberships).
    Its flag, ``--groups``, takes one entry each time it is given."""
    metrics: str | None = None
    """``HOST:PORT`` to serve Prometheus metrics on (``127.0.0.1:9464``); none by default."""
    via: str | None = None
    """A member's process ID (``ip:port``) that multicasts for this daemon (the forwarding flag, paper 3.4): for a
    host whose multicasts do not reach the group.  With ``multicast = false`` too, it neither sends nor receives
    multicast."""
    timers: dict[str, float | int] = field(default_factory=dict)
    scmp: dict[str, Any] = field(default_factory=dict)
    """[scmp] table: the fields of ``rmpd.protocol.multirpc.ScmpSettings`` (estimator, lifetime_ms, ...)."""

    def scmp_settings(self, latest: int | None) -> ScmpSettings:
        return ScmpSettings(latest=latest, **self.scmp)

    def latest_path(self, pid: str) -> Path:
        """The file holding this process's ``latest`` (one per process ID: several daemons may share a host)."""
        return self.state_path() / f"scmp-latest-{pid.replace(':', '_')}"

    def memberships_path(self, pid: str) -> Path:
        """The file of groups joined with a persistent join, rejoined at start (one per process ID, as latest)."""
        return self.state_path() / f"memberships-{pid.replace(':', '_')}.json"

    def state_path(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        env = os.environ.get("STATE_DIRECTORY")
        if env:
            return Path(env.split(":")[0])
        if os.geteuid() == 0:
            return Path("/var/lib/rmpd")
        return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "rmpd"

    def engine_config(self) -> EngineConfig:
        try:
            packet_limits = packet_limits_for(self.address())
        except ConfigError:  # no such interface: the daemon says so when it binds
            packet_limits = {}
        defaults = {**DAEMON_TIMERS, **packet_limits}
        return EngineConfig(journal=self.journal is not None, **{**defaults, **self.timers})

    def address(self) -> str:
        """The IPv4 address this daemon binds to and joins multicast on."""
        if self.bind is not None:
            return self.bind
        return interface_address(self.interface or loopback_interface())

    def guard(self, stats: Counter[str]) -> DatagramGuard:
        """The datagram guard for these settings; ConfigError when a key file cannot be used."""
        try:
            key = load_key_file(self.auth_key) if self.auth_key is not None else None
            previous = load_key_file(self.auth_key_previous) if self.auth_key_previous is not None else None
            return DatagramGuard(key, previous=previous, encrypt=self.encrypt,
                                 rotation_window=self.auth_rotation_window, stats=stats)
        except AuthKeyError as exc:
            raise ConfigError(str(exc)) from None

    def socket_path(self) -> Path:
        return self.socket if self.socket is not None else default_socket_path()


def default_of(key: Key) -> Any:
    """The key's default as ``rmpd --help`` shows it; None where it depends on the host or there is none (the
    help text says so)."""
    spec = next(f for f in dataclasses.fields(DaemonConfig) if f.name == key.name)
    if spec.default is dataclasses.MISSING or spec.default is None or key.kind == "switch":
        return None
    return oct(spec.default) if key.kind == "mode" else spec.default


def _flag_value(key: Key, value: Any) -> Any:
    """What a flag's value says as the key's value: the same as the key written in the file."""
    if key.kind == "mode" and isinstance(value, str):
        try:
            return int(value.removeprefix("0o"), 8)
        except ValueError:
            raise ConfigError(f"{key.flag} must be an octal file mode such as 0o660, got {value!r}") from None
    if key.kind == "entries":
        return [_toml_value(key, text) if text.lstrip().startswith("{") else text for text in value]
    if key.kind == "table":
        table = {}
        for item in value:
            name, equals, text = item.partition("=")
            if not equals or not name.strip():
                raise ConfigError(f"{key.flag} takes NAME=VALUE, got {item!r}")
            table[name.strip()] = _toml_value(key, text.strip(), or_text=True)
        return table
    return value


def _toml_value(key: Key, text: str, or_text: bool = False) -> Any:
    """``text`` read as a TOML value; with ``or_text``, text that is not one is taken as a string (``fixed``)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError as exc:
        if or_text:
            return text
        raise ConfigError(f"{key.flag}: {text!r} is not a TOML value: {exc}") from None


def load_config(path: Path | None, overrides: dict[str, Any]) -> DaemonConfig:
    """Read ``path`` (if any), apply ``overrides`` (the flags, by key name; None or empty: not given), and check
    the result.  A flag replaces its key, except a table's flags (``--timers``, ``--scmp``), which replace the
    table's keys they name."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                values = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    timers = values.pop("timers", {})
    if not isinstance(timers, dict):
        raise ConfigError("[timers] must be a table")
    scmp = values.pop("scmp", {})
    if not isinstance(scmp, dict):
        raise ConfigError("[scmp] must be a table")
    keys = {key.name: key for key in KEYS}
    for name, value in overrides.items():
        if value is None or (keys[name].kind in ("entries", "table") and not value):
            continue
        value = _flag_value(keys[name], value)
        if name == "timers":
            timers = {**timers, **value}
        elif name == "scmp":
            scmp = {**scmp, **value}
        else:
            values[name] = value
    unknown = set(scmp) - SCMP_KEYS
    if unknown:
        raise ConfigError(f"unknown scmp key(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(SCMP_KEYS))}")
    unknown = set(values) - TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s) in config: {', '.join(sorted(unknown))}")
    unknown = set(timers) - TIMER_KEYS
    if unknown:
        raise ConfigError(f"unknown timer(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(TIMER_KEYS))}")
    if values.get("interface") and values.get("bind"):
        raise ConfigError("give either interface or bind, not both")
    for path_key in (key.name for key in KEYS if key.kind == "path"):
        if path_key in values:
            values[path_key] = Path(values[path_key])
    if "groups" in values:
        try:
            values["groups"] = parse_memberships(values["groups"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    config = DaemonConfig(**values, timers=timers, scmp=scmp)
    _check(config)
    return config


def _check(config: DaemonConfig) -> None:
    if not isinstance(config.port, int) or not 0 <= config.port < 65536:
        raise ConfigError(f"port must be 0..65535, got {config.port!r}")
    if config.bind is not None:
        try:
            ipaddress.IPv4Address(config.bind)
        except ValueError:
            raise ConfigError(f"bind must be an IPv4 address, got {config.bind!r}") from None
    try:
        if not ipaddress.IPv4Network(config.address_range).is_multicast:
            raise ConfigError(f"address_range {config.address_range} is not a multicast range")
    except ValueError as exc:
        raise ConfigError(f"address_range: {exc}") from None
    if config.via is not None:
        try:
            split_process_id(config.via)
        except (ValueError, TypeError):
            raise ConfigError(f"via must be a process ID, ip:port, got {config.via!r}") from None
    if not isinstance(config.ttl, int) or not 0 <= config.ttl <= 255:
        raise ConfigError(f"ttl must be 0..255, got {config.ttl!r}")
    if config.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level must be debug, info, warning or error, got {config.log_level!r}")
    for name, value in config.timers.items():
        if name == "congestion":
            if value not in CONGESTION_CONTROLS:
                raise ConfigError(f"congestion must be one of {', '.join(CONGESTION_CONTROLS)}, got {value!r}")
            continue
        numbers = value if isinstance(value, list) else [value]
        if not numbers or not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                                  for v in numbers):
            raise ConfigError(f"timer {name} must be a non-negative number, got {value!r}")
        if isinstance(value, list):
            config.timers[name] = tuple(value)
    if not isinstance(config.encrypt, bool):
        raise ConfigError(f"encrypt must be true or false, got {config.encrypt!r}")
    if config.encrypt and config.auth_key is None:
        raise ConfigError("encrypt = true needs auth_key (make one with: rmpd keygen FILE)")
    if config.auth_key_previous is not None and config.auth_key is None:
        raise ConfigError("auth_key_previous needs auth_key")
    if not isinstance(config.auth_rotation_window, int | float) or config.auth_rotation_window < 0:
        raise ConfigError(f"auth_rotation_window must be a non-negative number, got {config.auth_rotation_window!r}")
    for name in ("socket_mode", "runtime_dir_mode"):
        value = getattr(config, name)
        if not isinstance(value, int) or not 0 <= value <= 0o777:
            raise ConfigError(f"{name} must be a file mode such as 0o660, got {value!r}")
    if config.socket_group is not None:
        try:
            grp.getgrnam(config.socket_group)
        except KeyError:
            raise ConfigError(f"socket_group {config.socket_group!r} does not exist") from None
    try:
        config.scmp_settings(None).make_estimator()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[scmp]: {exc}") from None
    if config.metrics is not None:
        try:
            parse_address(str(config.metrics))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if config.client_queue < 1 or config.max_frame < 64:
        raise ConfigError("client_queue must be >= 1 and max_frame >= 64")
