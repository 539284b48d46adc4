"""Error codes of the local API.  Every refused request is answered ``{"error": code, "message": text}``."""

from __future__ import annotations

BAD_FRAME = "bad-frame"
FRAME_TOO_LARGE = "frame-too-large"
BAD_REQUEST = "bad-request"
UNKNOWN_OP = "unknown-op"
NOT_MEMBER = "not-member"
NOT_JOINED = "not-joined"
JOIN_FAILED = "join-failed"
SEND_REFUSED = "send-refused"
MESSAGE_TOO_LARGE = "message-too-large"
LOCK_HELD = "lock-held"
NOT_OWNER = "not-owner"
LOCK_DENIED = "lock-denied"
LEFT = "left"
SLOW_CONSUMER = "slow-consumer"
SHUTTING_DOWN = "shutting-down"
INTERNAL = "internal"
CALL_PREFIX = "call-"
"""A failed call: ``call-`` plus the code of rmpd.protocol.calls.CALL_ERRORS (call-timeout, call-unknown, ...)."""
STALE_CALL = "stale-call"


class RequestError(Exception):
    """A request the daemon refuses; becomes one structured error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
