"""Sealing and opening a datagram under a group key, and which datagrams a key setting accepts.

Anyone on the LAN can send to a multicast address, and RMP itself trusts whatever names the right view.  A keyed
process seals every datagram it sends and opens every one it receives before the packet codec sees a byte of it,
so the engine stays unaware of keys and the simulator keeps running the same engine.  Two sealed forms, both
starting with a 2-byte tag and a 4-byte key ID so a receiver knows at once which of its keys (current, or the
previous one during a rotation) to try:

``b"RA" kid packet mac``
    keyed BLAKE2b-128 over everything before the MAC.  Bodies stay readable (tcpdump, ``rmp audit --pcap``).
``b"RE" kid nonce ciphertext``
    ChaCha20-Poly1305 with a random 96-bit nonce; the 6 leading bytes are its associated data.

The MAC and encryption keys are derived from the one 32-byte secret with BLAKE2b under distinct personalisations,
so one secret serves both without a key being used for two purposes.

Whether a group encrypts is the group's, not one process's: a keyed process takes only its own form
(:class:`KeyRing`), so one that encrypts drops signed datagrams even under its key, and one that only signs drops
encrypted ones.  Such a datagram is verified first, so ``encryption_mismatch`` names only a holder of the key,
never a forger.

Sans-IO: the secret, the nonce source and the time are passed in; reading key files is rmpd.keyfile's, counting
and logging what is dropped the runtime's (rmpd.runtime.auth).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

KEY_BYTES = 32
KID_BYTES = 4
MAC_BYTES = 16
NONCE_BYTES = 12
AEAD_TAG_BYTES = 16
MAC_TAG = b"RA"
AEAD_TAG = b"RE"
SEALED_TAGS = (MAC_TAG, AEAD_TAG)
"""The first two bytes of every sealed datagram; no plain packet starts with them (docs/security.md)."""
PREFIX_BYTES = 2 + KID_BYTES


class AuthKeyError(ValueError):
    """A key cannot be used; the message says why (and, for a key file, names it)."""


def _derive(secret: bytes, purpose: bytes) -> bytes:
    return hashlib.blake2b(purpose, key=secret, digest_size=32, person=b"rmpd-group-key").digest()


@dataclass(frozen=True)
class GroupKey:
    """One group secret and what is derived from it."""

    kid: bytes
    mac_key: bytes
    aead_key: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> GroupKey:
        if len(secret) != KEY_BYTES:
            raise AuthKeyError(f"a group key is {KEY_BYTES} bytes, got {len(secret)}")
        return cls(kid=_derive(secret, b"key-id")[:KID_BYTES], mac_key=_derive(secret, b"mac"),
                   aead_key=_derive(secret, b"aead"))


def aead_cipher(key: GroupKey) -> Any:
    """The ChaCha20-Poly1305 cipher of ``key`` (made once per key: it is not free)."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(key.aead_key)


def sign(key: GroupKey, packet: bytes) -> bytes:
    """``packet`` in the ``RA`` form: readable, with a MAC under ``key``."""
    body = MAC_TAG + key.kid + packet
    return body + hashlib.blake2b(body, key=key.mac_key, digest_size=MAC_BYTES).digest()


def encrypt(key: GroupKey, packet: bytes, nonce: bytes, cipher: Any = None) -> bytes:
    """``packet`` in the ``RE`` form under ``nonce`` (NONCE_BYTES, never used twice with one key).  ``cipher``:
    ``aead_cipher(key)``, made here when not given."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
    head = AEAD_TAG + key.kid
    return head + nonce + (cipher or aead_cipher(key)).encrypt(nonce, packet, head)


def unseal(key: GroupKey, datagram: bytes, cipher: Any = None) -> bytes | None:
    """The packet inside a datagram sealed under ``key`` (either form), or None when its MAC is wrong, it fails
    decryption, or it is cut short.  ``cipher``: ``aead_cipher(key)``, made here when not given."""
    tag = datagram[:2]
    if tag == MAC_TAG:
        if len(datagram) < PREFIX_BYTES + MAC_BYTES:
            return None
        body, mac = datagram[:-MAC_BYTES], datagram[-MAC_BYTES:]
        expected = hashlib.blake2b(body, key=key.mac_key, digest_size=MAC_BYTES).digest()
        return body[PREFIX_BYTES:] if hmac.compare_digest(mac, expected) else None
    if tag != AEAD_TAG:
        return None
    from cryptography.exceptions import InvalidTag

    nonce = datagram[PREFIX_BYTES:PREFIX_BYTES + NONCE_BYTES]
    ciphertext = datagram[PREFIX_BYTES + NONCE_BYTES:]
    if len(nonce) != NONCE_BYTES or len(ciphertext) < AEAD_TAG_BYTES:
        return None
    try:
        return (cipher or aead_cipher(key)).decrypt(nonce, ciphertext, datagram[:PREFIX_BYTES])
    except InvalidTag:
        return None


def signed_body(datagram: bytes) -> bytes | None:
    """The packet inside a MAC-signed datagram, unverified (what tcpdump shows without the key); None for any
    other form."""
    if datagram[:2] != MAC_TAG or len(datagram) < PREFIX_BYTES + MAC_BYTES:
        return None
    return datagram[PREFIX_BYTES:-MAC_BYTES]


# Why a datagram is refused: each a counter's suffix (``auth_rejected_<reason>``, or ``auth_unverifiable``).
UNVERIFIABLE = "unverifiable"
"""Sealed, and this process has no key."""
UNSIGNED = "unsigned"
"""Not sealed, and this process has a key."""
UNKNOWN_KEY = "unknown_key"
"""Sealed under a key this process does not hold (or a previous key after its rotation window)."""
BAD_MAC = "bad_mac"
"""Sealed under a key it holds, but the MAC is wrong or decryption fails: forged, altered or cut short."""
ENCRYPTION_MISMATCH = "encryption_mismatch"
"""Opened under its key, but in the other form than this process's ``encrypt`` setting."""


class Opening(NamedTuple):
    """What :meth:`KeyRing.open` made of one datagram."""

    packet: bytes | None
    """The packet inside, or None when the datagram is refused."""
    refusal: str | None
    """Why it is refused (UNVERIFIABLE, UNSIGNED, ...); None when it opened."""
    previous_key: bool = False
    """It named the previous key, within its rotation window (whether or not it then opened)."""


_REFUSED = {reason: Opening(None, reason) for reason in (UNVERIFIABLE, UNSIGNED, UNKNOWN_KEY, BAD_MAC,
                                                         ENCRYPTION_MISMATCH)}


class KeyRing:
    """One process's key setting: the current key (None: no key), the previous one during a rotation, and whether
    the group encrypts.  Seals what the process sends under the current key in the group's form, and decides which
    datagrams it accepts: with no key, plain ones only; with a key, only its own form under a key it holds.

    ``previous_until``: the time after which the previous key is no longer accepted (``open`` is given the time).
    ``nonces(n)``: n fresh random bytes (``os.urandom`` in a process); needed only to encrypt."""

    def __init__(self, key: GroupKey | None = None, *, previous: GroupKey | None = None, encrypt: bool = False,
                 previous_until: float = math.inf, nonces: Callable[[int], bytes] | None = None) -> None:
        if encrypt and key is None:
            raise AuthKeyError("encryption needs an auth key")
        if encrypt and nonces is None:
            raise AuthKeyError("encryption needs a nonce source")
        if previous is not None and key is None:
            raise AuthKeyError("a previous key needs a current auth key")
        self.key = key
        self.previous = previous
        self.encrypt = encrypt
        self.previous_until = previous_until
        self.nonces = nonces
        self._ciphers: dict[bytes, Any] = {}

    def seal(self, packet: bytes) -> bytes:
        """``packet`` as this process sends it: unchanged with no key, else signed or encrypted."""
        key = self.key
        if key is None:
            return packet
        if self.encrypt:
            assert self.nonces is not None  # checked when made
            return encrypt(key, packet, self.nonces(NONCE_BYTES), self._cipher(key))
        return sign(key, packet)

    def open(self, datagram: bytes, now: float) -> Opening:
        """The packet inside ``datagram``, or why this key setting refuses it."""
        tag = datagram[:2]
        sealed = tag in SEALED_TAGS
        if self.key is None:
            return _REFUSED[UNVERIFIABLE] if sealed else Opening(datagram, None)
        if not sealed:
            return _REFUSED[UNSIGNED]
        kid = datagram[2:PREFIX_BYTES]
        previous = False
        if kid == self.key.kid:
            key = self.key
        elif self.previous is not None and kid == self.previous.kid and now < self.previous_until:
            key, previous = self.previous, True
        else:
            return _REFUSED[UNKNOWN_KEY]
        opened = unseal(key, datagram, self._cipher(key) if tag == AEAD_TAG else None)
        if opened is None:
            return Opening(None, BAD_MAC, previous)
        if (tag == AEAD_TAG) != self.encrypt:
            return Opening(None, ENCRYPTION_MISMATCH, previous)
        return Opening(opened, None, previous)

    def _cipher(self, key: GroupKey) -> Any:
        cipher = self._ciphers.get(key.kid)
        if cipher is None:
            cipher = self._ciphers[key.kid] = aead_cipher(key)
        return cipher
