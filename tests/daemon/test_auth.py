"""The datagram guard: what a keyed daemon accepts, what it drops and how it counts, and the key files."""

from __future__ import annotations

import os
import stat
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmpd.daemon.config import ConfigError, load_config
from rmpd.keyfile import generate_key_file, load_key_file
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import Data, decode, encode
from rmpd.protocol.qos import QoS
from rmpd.runtime.auth import DatagramGuard
from rmpd.wire.sealing import AuthKeyError, GroupKey

from .harness import RMPD

KEY = GroupKey.from_secret(bytes(range(32)))
OTHER = GroupKey.from_secret(bytes(32))
PACKET = encode(Data(ViewId("127.0.0.1:7000", 3), "127.0.0.1:7000", 9, QoS.TOTAL, None, b"hello"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_sealed_packet_opens_to_itself_under_the_same_key_only(encrypt: bool) -> None:
    sender = DatagramGuard(KEY, encrypt=encrypt)
    receiver = DatagramGuard(KEY, encrypt=encrypt)
    stranger = DatagramGuard(OTHER, encrypt=encrypt)
    sealed = sender.seal(PACKET)
    assert sealed != PACKET
    assert (PACKET in sealed) is not encrypt  # signed bodies stay readable on the wire, encrypted ones do not
    assert receiver.open(sealed, "10.0.0.1:1", "here") == PACKET
    assert decode(receiver.open(sealed, "10.0.0.1:1", "here")) == decode(PACKET)
    assert stranger.open(sealed, "10.0.0.1:1", "here") is None
    assert stranger.stats["auth_rejected_unknown_key"] == 1
    assert receiver.stats["auth_verified"] == 2


@pytest.mark.parametrize("encrypt", [False, True])
@given(position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_changed_byte_is_rejected_and_counted(encrypt: bool, position: int, flip: int) -> None:
    guard = DatagramGuard(KEY, encrypt=encrypt)
    sealed = bytearray(guard.seal(PACKET))
    sealed[position % len(sealed)] ^= flip
    assert guard.open(bytes(sealed), "10.0.0.1:1", "here") is None
    assert guard.stats["auth_rejected"] == 1
    assert guard.unverified_sources == {"10.0.0.1:1": 1}


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_keyed_daemon_takes_only_its_own_encrypt_setting(encrypt: bool) -> None:
    receiver = DatagramGuard(KEY, encrypt=encrypt)
    other_form = DatagramGuard(KEY, encrypt=not encrypt).seal(PACKET)
    assert receiver.open(other_form, "10.0.0.2:1", "here") is None
    assert receiver.last_refusal == "encryption_mismatch"
    assert receiver.stats["auth_rejected_encryption_mismatch"] == receiver.stats["auth_rejected"] == 1
    assert receiver.describe()["mismatched_sources"] == {"10.0.0.2:1": 1}
    assert not receiver.unverified_sources
    forged = bytearray(other_form)
    forged[-1] ^= 1  # only a key holder's datagram counts as the other setting; a forgery is a bad MAC
    assert receiver.open(bytes(forged), "10.0.0.3:1", "here") is None
    assert receiver.last_refusal == "bad_mac"
    assert receiver.open(DatagramGuard(KEY, encrypt=encrypt).seal(PACKET), "10.0.0.2:1", "here") == PACKET
    assert receiver.last_refusal is None


def test_a_keyed_daemon_drops_plain_packets_and_truncated_ones() -> None:
    guard = DatagramGuard(KEY)
    sealed = guard.seal(PACKET)
    for data in (PACKET, b"", b"RA", sealed[:7], sealed[:-1]):
        assert guard.open(data, "s:1", "here") is None
    assert guard.stats["auth_rejected"] == 5
    assert guard.stats["auth_rejected_unsigned"] == 2  # the plain packet and the empty datagram
    assert guard.stats["auth_rejected_unknown_key"] == 1  # "RA" with no key ID
    assert guard.stats["auth_rejected_bad_mac"] == 2
    assert guard.stats["auth_verified"] == 0


def test_a_daemon_without_a_key_passes_plain_packets_and_reports_sealed_ones() -> None:
    guard = DatagramGuard()
    assert guard.seal(PACKET) == PACKET
    assert guard.open(PACKET, "s:1", "here") == PACKET
    assert guard.open(DatagramGuard(KEY).seal(PACKET), "10.0.0.9:7000", "239.1.1.1:7400") is None
    assert guard.stats["auth_unverifiable"] == 1
    assert guard.describe()["unverified_sources"] == {"10.0.0.9:7000": 1}


def test_the_previous_key_is_accepted_only_during_the_rotation_window() -> None:
    clock = Clock()
    guard = DatagramGuard(KEY, previous=OTHER, rotation_window=60, clock=clock)
    old_sender = DatagramGuard(OTHER)
    assert guard.open(old_sender.seal(PACKET), "s:1", "here") == PACKET
    assert guard.seal(PACKET)[2:6] == KEY.kid  # what it sends is always under the current key
    clock.now += 61
    assert guard.open(old_sender.seal(PACKET), "s:1", "here") is None
    assert guard.stats["auth_rejected_unknown_key"] == 1


def test_keygen_writes_a_private_key_once_and_it_loads(tmp_path: Path) -> None:
    path = tmp_path / "group.key"
    generate_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    with pytest.raises(FileExistsError):
        generate_key_file(path)
    first = load_key_file(path)
    other = tmp_path / "other.key"
    generate_key_file(other)
    assert load_key_file(other).kid != first.kid
    raw = tmp_path / "raw.key"
    raw.write_bytes(bytes(range(32)))
    assert load_key_file(raw) == KEY


def test_rmpd_keygen_makes_a_missing_directory_private(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "rmpd" / "group.key"  # a fresh host: no /etc/rmpd yet
    result = subprocess.run([RMPD, "keygen", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert load_key_file(path).kid
    again = subprocess.run([RMPD, "keygen", str(path)], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr


@pytest.mark.parametrize(("mode", "warned"), [(0o400, False), (0o440, False), (0o444, True), (0o404, True)])
def test_a_key_its_group_may_read_is_taken_quietly_one_every_user_may_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, warned: bool,
) -> None:
    """The systemd unit's daemon reaches a root-owned key through its group (docs/security.md)."""
    path = tmp_path / "group.key"
    generate_key_file(path)
    path.chmod(mode)
    with caplog.at_level("WARNING"):
        assert load_key_file(path).kid
    assert any(r.levelname == "WARNING" and str(path) in r.getMessage() for r in caplog.records) is warned


@pytest.mark.parametrize("content", [b"", b"short", b"zz" * 32, os.urandom(33)],
                         ids=["empty", "short", "not-hex", "33-random-bytes"])  # the same IDs in every process
def test_a_bad_key_file_is_refused_with_its_name(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    with pytest.raises(AuthKeyError, match=r"bad\.key"):
        load_key_file(path)


def test_key_settings_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs auth_key"):
        load_config(None, {"encrypt": True})
    with pytest.raises(ConfigError, match=r"missing\.key"):
        load_config(None, {"auth_key": tmp_path / "missing.key"}).guard(Counter())
    key = tmp_path / "k"
    generate_key_file(key)
    config = tmp_path / "rmpd.toml"
    config.write_text(f'auth_key = "{key}"\nencrypt = true\n')
    guard = load_config(config, {}).guard(Counter())
    assert guard.keyed and guard.encrypt
