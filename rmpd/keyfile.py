"""Group key files: ``rmpd keygen`` writes one, and the daemon, an embedded ``Node`` and ``rmp audit`` load one.

A key file holds the 32-byte group secret as 64 hex digits (or as 32 raw bytes); what is derived from it and how a
datagram is sealed with it is rmpd.wire.sealing's.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from rmpd.wire.sealing import KEY_BYTES, AuthKeyError, GroupKey

log = logging.getLogger("rmpd")

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
    """Read a key written by ``rmpd keygen`` (64 hex digits) or 32 raw bytes; AuthKeyError naming the file when
    it cannot be used."""
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


__all__ = ["KEY_DIR_MODE", "generate_key_file", "load_key_file"]
