"""What the client library raises: the daemon's structured errors, with their codes, as one exception type."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rmpd.localapi import BAD_KEY, BAD_REQUEST, check_group_name
from rmpd.protocol.limits import BadArgument, check_keyed
from rmpd.protocol.qos import QoS


class RmpdError(Exception):
    """A request was refused; ``code`` is the daemon's error code (see docs/operations.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.refused: list[bytes | int] = []
        """Raised for posted messages the group refused (by the next ``post``, ``send`` or ``flush``): what each
        of their posts returned (its key, or its number), in order; empty for any other refusal."""


class ConnectionLost(RmpdError):
    """The daemon closed the connection (it stopped, or cut this client off, e.g. as a slow consumer)."""


def check_group_name_here(name: str) -> None:
    """Refuse a name no group may have (:func:`rmpd.localapi.check_group_name`) as the daemon would, with its code
    and text, before any request: the embedded node has no daemon to ask, and a daemon connection saves the trip."""
    try:
        check_group_name(name)
    except ValueError as exc:
        raise RmpdError(BAD_REQUEST, str(exc)) from None


def check_key_here(key: bytes, qos: QoS) -> None:
    """Refuse a key the group cannot take (:func:`rmpd.protocol.limits.check_keyed`) with the daemon's code and
    text, before the message joins a batch: it must cost its sender alone."""
    try:
        check_keyed(qos, (key,))
    except ValueError as exc:
        raise RmpdError(BAD_KEY, str(exc)) from None


def single_error(group: BaseExceptionGroup) -> BaseException:
    """The program's own exception out of a nursery's group, so callers can catch RmpdError as usual."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """The embedded engine's refusal of an argument (:class:`rmpd.protocol.limits.BadArgument`) as the RmpdError a
    daemon would answer with (same code, same text): the node and its calls hand the program's arguments to the
    engine, and one translation keeps their errors alike."""
    try:
        yield
    except BadArgument as exc:
        raise RmpdError(exc.code, str(exc)) from None
