"""The client library: one Group API over a connection to the local rmpd, or over an embedded RMP process.

``Node`` (the embedded process, with the engine and its metrics) is loaded on first use: a program or command that
only talks to the daemon does not pay for importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .connection import Client, connect
from .errors import ConnectionLost, RmpdError
from .events import AlreadyDelivered, CallRequest, Delivery, Rejoining, State, Undelivered, ViewChange
from .group import Group

if TYPE_CHECKING:
    from .node import Node

__all__ = ["AlreadyDelivered", "CallRequest", "Client", "ConnectionLost", "Delivery", "Group", "Node", "Rejoining",
           "RmpdError", "State", "Undelivered", "ViewChange", "connect"]


def __getattr__(name: str) -> Any:
    if name != "Node":
        raise AttributeError(f"module 'rmpd.client' has no attribute {name!r}")
    from .node import Node

    globals()["Node"] = Node
    return Node
