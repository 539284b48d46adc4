"""The views one member of a group knows (``Views``): shared by the parts of its engine through ``GroupContext``."""

from __future__ import annotations

from .ids import ProcessId, ViewId
from .packets import Packet
from .view import View


class Views:
    """The views one member knows: the one it orders in, the one its application has seen, and every one it has
    heard of (packets of other views are not for it)."""

    __slots__ = ("app", "current", "known")

    def __init__(self, view: View) -> None:
        self.current = view
        """The view packets are ordered in now (the latest New List known)."""
        self.app = view
        """The view the application has seen installed (changes when the New List is delivered)."""
        self.known: dict[ViewId, View] = {view.view_id: view}

    def heard_of(self, view: View) -> None:
        """A New List made ``view``: packets stamped with it are for this member from now on."""
        self.known[view.view_id] = view

    def order_in(self, view: View) -> None:
        """The newest New List's view: packets are ordered in it from now on."""
        self.current = view

    def installed(self, view: View) -> None:
        """The application has seen ``view`` installed (its New List was delivered)."""
        self.app = view

    def witness(self, packet: Packet, pid: ProcessId) -> ProcessId | None:
        """A member of our view that can tell us about the view ``packet`` is stamped with, if there is one.

        The sender, when it is one of ours; otherwise the view's creator, when it is one of ours: a member that a
        New List we missed brought in speaks in a view we do not know, and passes us the token in it, but the token
        site that created that view holds the New List.
        """
        view = self.current
        src = getattr(packet, "src", None)
        if src in view:
            return src
        creator = packet.view.creator if packet.view is not None else None
        if creator in view and creator != pid:
            return creator
        return None
