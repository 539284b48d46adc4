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


def single_error(group: BaseExceptionGroup) -> BaseException:
    """The program's own exception out of a nursery's group, so callers can catch RmpdError as usual."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
