"""rmpd: reliable, totally ordered multicast (the RMP protocol) for Python programs.

``async with rmpd.connect() as client`` talks to the local daemon; ``async with rmpd.Node(...) as node`` is an RMP
process inside the program.  Both give ``await x.join(name)`` -> Group.  The names are loaded on first use, so
importing the sans-IO engine (``rmpd.protocol``) or the simulator does not pull in trio or sockets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rmpd.client import (
        AlreadyDelivered,
        CallRequest,
        Client,
        ConnectionLost,
        Delivery,
        Group,
        Node,
        Rejoining,
        RmpdError,
        State,
        Undelivered,
        ViewChange,
        connect,
    )
    from rmpd.protocol.qos import QoS

_EXPORTS = {
    "connect": "rmpd.client", "Client": "rmpd.client", "Node": "rmpd.client", "Group": "rmpd.client",
    "AlreadyDelivered": "rmpd.client",
    "Delivery": "rmpd.client", "ViewChange": "rmpd.client", "RmpdError": "rmpd.client",
    "ConnectionLost": "rmpd.client", "CallRequest": "rmpd.client", "Undelivered": "rmpd.client",
    "Rejoining": "rmpd.client", "State": "rmpd.client", "QoS": "rmpd.protocol.qos",
}

__all__ = ["AlreadyDelivered", "CallRequest", "Client", "ConnectionLost", "Delivery", "Group", "Node", "QoS",
           "Rejoining", "RmpdError", "State", "Undelivered", "ViewChange", "connect"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rmpd' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
