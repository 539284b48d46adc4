"""The embedded node's engine refusing an argument, told to the program as a daemon would tell it.

Both the node (sends, locks) and its calls (:mod:`rmpd.client.calls`) hand the program's arguments to the engine,
which refuses a bad one with :class:`rmpd.protocol.limits.BadArgument`; one translation keeps their errors alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rmpd.protocol.limits import BadArgument

from .errors import RmpdError


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """The engine's refusal of an argument as the RmpdError a daemon would answer with (same code, same text)."""
    try:
        yield
    except BadArgument as exc:
        raise RmpdError(exc.code, str(exc)) from None
