"""The datagram guard: a process's key setting (rmpd.wire.sealing's ``KeyRing``) on the live sockets, with what
the runtime adds around the codec's decisions: counting what it drops, remembering whose datagrams they were for
``rmp status``, warning in the log now and then, the clock of a key rotation window, and the nonce source.

A process with no key passes plain packets through but counts (and reports) sealed traffic it cannot verify: that
is how an operator learns that a group on this address wants a key this host lacks.  A keyed process takes only its
own form (signed, or encrypted: the group's ``encrypt`` setting), so daemons of different settings never hear each
other and cannot be members of one view.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable

from rmpd.wire.sealing import BAD_MAC, ENCRYPTION_MISMATCH, MAC_TAG, UNKNOWN_KEY, UNVERIFIABLE, GroupKey, KeyRing

log = logging.getLogger("rmpd")

LOG_INTERVAL = 10.0
"""At most one warning per reason per this many seconds, so a flood of forged datagrams cannot flood the log."""
MAX_SOURCES = 64
"""Distinct unverifiable sources remembered for ``rmp status``; more are counted but not named."""


def mismatch_words(encrypt: bool) -> str:
    """What a daemon whose setting is ``encrypt`` says of a valid datagram of the other form."""
    if encrypt:
        return ("signed but not encrypted under this daemon's key, by a member with encrypt = false; this daemon "
                "encrypts, and every member of a group must have the same encrypt setting")
    return ("encrypted under this daemon's key, by a member with encrypt = true (--encrypt); this daemon only "
            "signs, and every member of a group must have the same encrypt setting")


class DatagramGuard:
    """Seals outgoing datagrams and opens incoming ones; see the module docstring.

    ``rotation_window``: seconds of ``clock`` during which ``previous`` (a rotation's second key) is still
    accepted.  ``clock`` is injectable so tests can step through a rotation window.
    """

    def __init__(self, key: GroupKey | None = None, *, previous: GroupKey | None = None, encrypt: bool = False,
                 rotation_window: float = 3600.0, stats: Counter[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ring = KeyRing(key, previous=previous, encrypt=encrypt, previous_until=clock() + rotation_window,
                            nonces=os.urandom)
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.clock = clock
        self.unverified_sources: Counter[str] = Counter()
        self.mismatched_sources: Counter[str] = Counter()
        """Key holders heard sending in the other form (``encrypt`` differs from this daemon's), for ``rmp status``."""
        self.last_refusal: str | None = None
        """Why ``open`` dropped the datagram it was last given (a counter's suffix, e.g. ``unverifiable``,
        ``unknown_key``, ``encryption_mismatch``: rmpd.wire.sealing's reasons); None when it opened it.  The runtime
        reads it to tell a join that the group it asks for speaks in a form this daemon cannot take."""
        self._last_log: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    @property
    def encrypt(self) -> bool:
        return self.ring.encrypt

    @property
    def keyed(self) -> bool:
        return self.ring.key is not None

    # ------------------------------------------------------------------------------------------------------------

    def seal(self, packet: bytes) -> bytes:
        return self.ring.seal(packet)

    def open(self, datagram: bytes, source: str, where: str) -> bytes | None:
        """The packet inside ``datagram``, or None when it must be dropped (counted and, now and then, logged)."""
        packet, refusal, previous = self.ring.open(datagram, self.clock())
        self.last_refusal = refusal
        if previous:
            self.stats["auth_previous_key"] += 1
        if refusal is None:
            if self.ring.key is not None:
                self.stats["auth_verified"] += 1
            return packet
        if refusal == UNVERIFIABLE:
            self.stats["auth_unverifiable"] += 1
            self._remember(self.unverified_sources, source)
            self._warn(refusal, f"sealed datagrams on {where} (latest from {source}) that this daemon cannot verify: "
                       "the group there uses an auth key and this daemon has none")
            return None
        self.stats["auth_rejected"] += 1
        self.stats[f"auth_rejected_{refusal}"] += 1
        self._remember(self.mismatched_sources if refusal == ENCRYPTION_MISMATCH else self.unverified_sources,
                       source)
        self._warn(refusal, f"dropped datagrams on {where} {self._what(refusal, datagram)} (latest from {source})")
        return None

    def _what(self, refusal: str, datagram: bytes) -> str:
        if refusal == ENCRYPTION_MISMATCH:
            return mismatch_words(self.ring.encrypt)
        if refusal == UNKNOWN_KEY:
            return "sealed with a key this daemon does not hold"
        if refusal == BAD_MAC:
            return "with a wrong MAC" if datagram[:2] == MAC_TAG else "that fail decryption"
        return "without a MAC"  # UNSIGNED

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

    def describe(self) -> dict[str, object]:
        key, previous = self.ring.key, self.ring.previous
        return {"keyed": key is not None, "encrypt": self.ring.encrypt,
                "key_id": key.kid.hex() if key else None,
                "previous_key_id": previous.kid.hex() if previous else None,
                "unverified_sources": dict(self.unverified_sources.most_common(8)),
                "mismatched_sources": dict(self.mismatched_sources.most_common(8))}


__all__ = ["DatagramGuard"]
