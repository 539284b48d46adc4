"""Group keys: every datagram a keyed daemon sends carries a MAC (or is sealed with an AEAD), and every datagram it
receives must carry a valid one, or it is dropped before the engine sees a byte of it.

Anyone on the LAN can send to a multicast address, and RMP itself trusts whatever names the right view.  This layer
sits between the sockets and the sans-IO process, so the engine stays unaware of keys and the simulator keeps
running the same engine.  Two sealed forms, both starting with a 2-byte tag and a 4-byte key ID so a receiver knows
at once which of its keys (current, or the previous one during a rotation) to try:

``b"RA" kid packet mac``
    keyed BLAKE2b-128 over everything before the MAC.  Bodies stay readable (tcpdump, ``rmp audit --pcap``).
``b"RE" kid nonce ciphertext``
    ChaCha20-Poly1305 with a random 96-bit nonce; the 6 leading bytes are its associated data.

The MAC and encryption keys are derived from the one 32-byte key file with BLAKE2b under distinct personalisations,
so one secret serves both without a key being used for two purposes.  A daemon with no key passes plain packets
through but counts (and reports) sealed traffic it cannot verify: that is how an operator learns that a group on
this address wants a key this host lacks.

Whether a group encrypts is the group's, not one daemon's: a keyed daemon takes only its own form, so a daemon that
encrypts drops signed datagrams even under its key, and one that only signs drops encrypted ones.  Daemons with
different ``encrypt`` settings therefore never hear each other and cannot be members of one view, and an encrypting
daemon's groups never carry a readable body.  Such a datagram is verified first, so ``encryption_mismatch`` names
only a holder of the key, never a forger.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("rmpd")

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
LOG_INTERVAL = 10.0
"""At most one warning per reason per this many seconds, so a flood of forged datagrams cannot flood the log."""
MAX_SOURCES = 64
"""Distinct unverifiable sources remembered for ``rmp status``; more are counted but not named."""


class AuthKeyError(ValueError):
    """A key file cannot be used; the message names the file and the reason."""


def _derive(key: bytes, purpose: bytes) -> bytes:
    return hashlib.blake2b(purpose, key=key, digest_size=32, person=b"rmpd-group-key").digest()


@dataclass(frozen=True)
class GroupKey:
    """One key file's secret and what is derived from it."""

    kid: bytes
    mac_key: bytes
    aead_key: bytes

    @classmethod
    def from_secret(cls, secret: bytes) -> GroupKey:
        if len(secret) != KEY_BYTES:
            raise AuthKeyError(f"a group key is {KEY_BYTES} bytes, got {len(secret)}")
        return cls(kid=_derive(secret, b"key-id")[:KID_BYTES], mac_key=_derive(secret, b"mac"),
                   aead_key=_derive(secret, b"aead"))


KEY_DIR_MODE = 0o700
"""Mode of a directory ``generate_key_file`` makes for the key: a fresh host has no /etc/rmpd yet."""


def generate_key_file(path: Path) -> list[Path]:
    """Write a fresh key as 64 hex digits, mode 0400; never overwrite (FileExistsError).  Missing parent
    directories are made first (the innermost mode KEY_DIR_MODE, as ``mkdir -p -m``); returns those made."""
    missing = [parent for parent in reversed(path.absolute().parents) if not parent.exists()]
    if missing:
        missing[-1].mkdir(mode=KEY_DIR_MODE, parents=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(KEY_BYTES) + "\n")
    return missing


def load_key_file(path: Path) -> GroupKey:
    """Read a key written by ``rmpd keygen`` (64 hex digits) or 32 raw bytes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AuthKeyError(f"cannot read key file {path}: {exc.strerror}") from None
    text = raw.strip()
    try:
        secret = bytes.fromhex(text.decode("ascii")) if len(text) == 2 * KEY_BYTES else raw
    except (UnicodeDecodeError, ValueError):
        raise AuthKeyError(f"key file {path} is not 64 hex digits") from None
    try:
        key = GroupKey.from_secret(secret)
    except AuthKeyError as exc:
        raise AuthKeyError(f"key file {path}: {exc} (make one with: rmpd keygen FILE)") from None
    # Its group may read it: under the systemd unit the daemon runs as a dynamic user whose group (rmpd) is
    # the only way to reach a key owned by root.  Every other user must not.
    if path.stat().st_mode & 0o007:
        log.warning("key file %s can be read by every user (chmod 0400 it, or 0440 with the daemon's group)", path)
    return key


def aead_cipher(key: GroupKey) -> Any:
    """The ChaCha20-Poly1305 cipher of ``key`` (made once per key: it is not free)."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(key.aead_key)


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


def mismatch_words(encrypt: bool) -> str:
    """What a daemon whose setting is ``encrypt`` says of a valid datagram of the other form."""
    if encrypt:
        return ("signed but not encrypted under this daemon's key, by a member with encrypt = false; this daemon "
                "encrypts, and every member of a group must have the same encrypt setting")
    return ("encrypted under this daemon's key, by a member with encrypt = true (--encrypt); this daemon only "
            "signs, and every member of a group must have the same encrypt setting")


def signed_body(datagram: bytes) -> bytes | None:
    """The packet inside a MAC-signed datagram, unverified (what tcpdump shows without the key); None for any
    other form."""
    if datagram[:2] != MAC_TAG or len(datagram) < PREFIX_BYTES + MAC_BYTES:
        return None
    return datagram[PREFIX_BYTES:-MAC_BYTES]


class DatagramGuard:
    """Seals outgoing datagrams and opens incoming ones; see the module docstring.

    ``accept_until`` is the clock reading after which ``previous`` (a rotation's second key) is no longer accepted.
    ``clock`` is injectable so tests can step through a rotation window.
    """

    def __init__(self, key: GroupKey | None = None, *, previous: GroupKey | None = None, encrypt: bool = False,
                 rotation_window: float = 3600.0, stats: Counter[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if encrypt and key is None:
            raise AuthKeyError("encryption needs an auth key")
        if previous is not None and key is None:
            raise AuthKeyError("a previous key needs a current auth key")
        self.key = key
        self.previous = previous
        self.encrypt = encrypt
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.clock = clock
        self.accept_previous_until = clock() + rotation_window
        self.unverified_sources: Counter[str] = Counter()
        self.mismatched_sources: Counter[str] = Counter()
        """Key holders heard sending in the other form (``encrypt`` differs from this daemon's), for ``rmp status``."""
        self.last_refusal: str | None = None
        """Why ``open`` dropped the datagram it was last given (a counter's suffix, e.g. ``unverifiable``,
        ``unknown_key``, ``encryption_mismatch``); None when it opened it.  The runtime reads it to tell a join
        that the group it asks for speaks in a form this daemon cannot take."""
        self._ciphers: dict[bytes, Any] = {}
        self._last_log: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    @property
    def keyed(self) -> bool:
        return self.key is not None

    # ------------------------------------------------------------------------------------------------------------

    def seal(self, packet: bytes) -> bytes:
        key = self.key
        if key is None:
            return packet
        if self.encrypt:
            nonce = os.urandom(NONCE_BYTES)
            head = AEAD_TAG + key.kid
            return head + nonce + self._cipher(key).encrypt(nonce, packet, head)
        body = MAC_TAG + key.kid + packet
        return body + hashlib.blake2b(body, key=key.mac_key, digest_size=MAC_BYTES).digest()

    def open(self, datagram: bytes, source: str, where: str) -> bytes | None:
        """The packet inside ``datagram``, or None when it must be dropped (counted and, now and then, logged)."""
        tag = datagram[:2]
        sealed = tag in SEALED_TAGS
        self.last_refusal = None
        if self.key is None:
            if sealed:
                self.last_refusal = "unverifiable"
                self.stats["auth_unverifiable"] += 1
                self._remember(self.unverified_sources, source)
                self._warn("unverifiable", f"sealed datagrams on {where} (latest from {source}) that this daemon "
                           "cannot verify: the group there uses an auth key and this daemon has none")
                return None
            return datagram
        if not sealed:
            return self._reject("unsigned", source, where, "without a MAC")
        key = self._key_for(datagram[2:PREFIX_BYTES])
        if key is None:
            return self._reject("unknown_key", source, where, "sealed with a key this daemon does not hold")
        opened = unseal(key, datagram, self._cipher(key) if tag == AEAD_TAG else None)
        if opened is None:
            return self._reject("bad_mac", source, where,
                                "with a wrong MAC" if tag == MAC_TAG else "that fail decryption")
        if (tag == AEAD_TAG) != self.encrypt:
            return self._reject("encryption_mismatch", source, where, mismatch_words(self.encrypt))
        self.stats["auth_verified"] += 1
        return opened

    def _key_for(self, kid: bytes) -> GroupKey | None:
        if self.key is not None and kid == self.key.kid:
            return self.key
        if self.previous is not None and kid == self.previous.kid and self.clock() < self.accept_previous_until:
            self.stats["auth_previous_key"] += 1
            return self.previous
        return None

    def _reject(self, reason: str, source: str, where: str, what: str) -> None:
        self.last_refusal = reason
        self.stats["auth_rejected"] += 1
        self.stats[f"auth_rejected_{reason}"] += 1
        self._remember(self.mismatched_sources if reason == "encryption_mismatch" else self.unverified_sources,
                       source)
        self._warn(reason, f"dropped datagrams on {where} {what} (latest from {source})")
        return None

    @staticmethod
    def _remember(sources: Counter[str], source: str) -> None:
        if source in sources or len(sources) < MAX_SOURCES:
            sources[source] += 1

    def _warn(self, reason: str, message: str) -> None:
        self._unlogged[reason] += 1
        now = self.clock()
        last = self._last_log.get(reason)
        if last is not None and now - last < LOG_INTERVAL:
            return
        self._last_log[reason] = now
        log.warning("%s: %d since the last report", message, self._unlogged.pop(reason))

    def _cipher(self, key: GroupKey) -> Any:
        cipher = self._ciphers.get(key.kid)
        if cipher is None:
            cipher = self._ciphers[key.kid] = aead_cipher(key)
        return cipher

    def describe(self) -> dict[str, object]:
        return {"keyed": self.keyed, "encrypt": self.encrypt,
                "key_id": self.key.kid.hex() if self.key else None,
                "previous_key_id": self.previous.kid.hex() if self.previous else None,
                "unverified_sources": dict(self.unverified_sources.most_common(8)),
                "mismatched_sources": dict(self.mismatched_sources.most_common(8))}
