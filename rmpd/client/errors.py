"""What the client library raises: the daemon's structured errors, with their codes, as one exception type."""

from __future__ import annotations


class RmpdError(Exception):
    """A request was refused; ``code`` is the daemon's error code (see docs/operations.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ConnectionLost(RmpdError):
    """The daemon closed the connection (it stopped, or cut this client off, e.g. as a slow consumer)."""
