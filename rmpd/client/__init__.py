"""The client library: one Group API over a connection to the local rmpd, or over an embedded RMP process."""

from .connection import Client, connect
from .errors import ConnectionLost, RmpdError
from .events import CallRequest, Delivery, Rejoining, State, Undelivered, ViewChange
from .group import Group
from .node import Node

__all__ = ["CallRequest", "Client", "ConnectionLost", "Delivery", "Group", "Node", "Rejoining", "RmpdError",
           "State", "Undelivered", "ViewChange", "connect"]
