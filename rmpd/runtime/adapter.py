"""What every application of a process does alike: the daemon's hub for its local clients, and the embedded node
for its own program.

OVERRUN_GRACE bounds how long a group may refuse the token for a reader that is behind (section 4.6)."""

from __future__ import annotations

OVERRUN_GRACE = 1.0
"""Seconds a group may hold the token back for a reader that is behind before that reader is cut off; well under the
time the ring takes to declare a silent token site failed (ten doubling retries)."""
