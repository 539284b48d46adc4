"""Replacing a small file so that a crash at any moment leaves the old contents or the new, never a torn file.

The contents go to a temporary file that is fsynced and renamed over the old one, then the directory is fsynced
so the rename itself survives a crash.  Used for what the daemon must not lose across restarts: SCMP's ``latest``
and the memberships it rejoins.
"""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Make ``data`` the contents of ``path``, durably, once this returns.  OSError when it cannot be written (the
    old file is then untouched)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
