"""The sealing codec: the bytes each form puts on the wire, and which datagrams a key setting accepts."""

from __future__ import annotations

import pytest

from rmpd.wire.sealing import (
    BAD_MAC,
    ENCRYPTION_MISMATCH,
    UNKNOWN_KEY,
    UNSIGNED,
    UNVERIFIABLE,
    AuthKeyError,
    GroupKey,
    KeyRing,
    encrypt,
    sign,
    signed_body,
    unseal,
)

KEY = GroupKey.from_secret(bytes(range(32)))
OTHER = GroupKey.from_secret(bytes(32))
PACKET = bytes.fromhex("524d01019692ae3132372e302e302e313a3730303003ae3132372e302e302e313a373030300903c0c40568656c6c6f")
"""An encoded Data packet (view 127.0.0.1:7000/3, seq 9, total, b"hello")."""
NONCE = bytes(range(100, 112))

# Both forms as daemons have put them on the wire since keys were introduced: a change here strands every
# deployed daemon and every capture.
SIGNED = bytes.fromhex(
    "5241ebcba8c2524d01019692ae3132372e302e302e313a3730303003ae3132372e302e302e313a373030300903c0c40568656c6c6f"
    "11de8f186bf2743e2e9e474197d3a0a5")
ENCRYPTED = bytes.fromhex(
    "5245ebcba8c26465666768696a6b6c6d6e6f24d2dc21f9e59d78cb9d475d3eb68b3ae6d38dd79f1e48470da774699da0ca1c22b9f6"
    "e446664153c438953d5aa17d384eb748557f575e4c74567f3e758dc9")


def nonces(n: int) -> bytes:
    assert n == len(NONCE)
    return NONCE


def test_both_forms_are_the_bytes_on_the_wire_and_open_to_the_packet() -> None:
    assert KEY.kid.hex() == "ebcba8c2"
    assert sign(KEY, PACKET) == KeyRing(KEY).seal(PACKET) == SIGNED
    assert encrypt(KEY, PACKET, NONCE) == KeyRing(KEY, encrypt=True, nonces=nonces).seal(PACKET) == ENCRYPTED
    assert unseal(KEY, SIGNED) == unseal(KEY, ENCRYPTED) == PACKET
    assert unseal(OTHER, SIGNED) is None
    assert signed_body(SIGNED) == PACKET and signed_body(ENCRYPTED) is None


@pytest.mark.parametrize(("encrypting", "datagram"), [(False, SIGNED), (True, ENCRYPTED)])
def test_a_key_setting_takes_only_its_own_form_under_a_key_it_holds(encrypting: bool, datagram: bytes) -> None:
    ring = KeyRing(KEY, encrypt=encrypting, nonces=nonces)
    assert ring.open(datagram, 0.0) == (PACKET, None, False)
    other_form = ENCRYPTED if datagram is SIGNED else SIGNED
    assert ring.open(other_form, 0.0).refusal == ENCRYPTION_MISMATCH
    assert ring.open(PACKET, 0.0).refusal == UNSIGNED
    assert ring.open(datagram[:-1], 0.0).refusal == BAD_MAC
    assert KeyRing(OTHER, encrypt=encrypting, nonces=nonces).open(datagram, 0.0).refusal == UNKNOWN_KEY


def test_without_a_key_plain_packets_pass_and_sealed_ones_are_unverifiable() -> None:
    ring = KeyRing()
    assert ring.seal(PACKET) == PACKET
    assert ring.open(PACKET, 0.0) == (PACKET, None, False)
    assert ring.open(SIGNED, 0.0).refusal == ring.open(ENCRYPTED, 0.0).refusal == UNVERIFIABLE


def test_the_previous_key_opens_until_the_time_given() -> None:
    ring = KeyRing(OTHER, previous=KEY, previous_until=10.0)
    assert ring.open(SIGNED, 9.9) == (PACKET, None, True)
    assert ring.open(SIGNED, 10.0).refusal == UNKNOWN_KEY
    assert ring.seal(PACKET)[2:6] == OTHER.kid


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(AuthKeyError):
        KeyRing(encrypt=True, nonces=nonces)
    with pytest.raises(AuthKeyError):
        KeyRing(KEY, encrypt=True)  # no nonce source: the codec has no randomness of its own
    with pytest.raises(AuthKeyError):
        KeyRing(previous=KEY)
