"""Where a process's datagrams go: each group's multicast address and TTL, or the member that multicasts for it.

The process names a datagram's destination abstractly (a group, or a process ID); the loop hands every one to
:class:`GroupRoutes`, which seals it and sends it from the process's socket: to the group's address (its name
hashed into the address range) with the group's TTL, or, for a group joined naming a member (explicit naming and
the forwarding flag, paper 3.3 and 3.4), wrapped to that member, which multicasts it in this process's place.  As
such a member, it multicasts what others wrap to it (``GroupRoutes.forward``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from rmpd.protocol.events import Transmit
from rmpd.protocol.ids import split_process_id
from rmpd.protocol.naming import group_address
from rmpd.protocol.packets import PacketType, packet_type_of
from rmpd.protocol.view import View
from rmpd.wire.forwarding import unwrap, wrap

from .auth import DatagramGuard
from .sockets import DatagramSender


class GroupRoutes:
    """Per group: the TTL asked for and the one used, and the member forwarding for this process; sends
    datagrams accordingly.  ``sent_by_type``: counts per packet-type byte of what goes out (the loop's metrics)."""

    def __init__(self, sender: DatagramSender, guard: DatagramGuard, stats: Counter[str], sent_by_type: list[int],
                 *, address_range: str, default_ttl: int, via: str | None) -> None:
        self.sender, self.guard, self.stats, self.sent_by_type = sender, guard, stats, sent_by_type
        self.address_range = address_range
        self.default_ttl = default_ttl
        self.via = via
        """A member's process ID that multicasts for this process in every group not joined with one of its own."""
        self.asked_ttl: dict[str, int] = {}
        """Per group, the multicast TTL this process asked for when it joined (the largest its clients wanted)."""
        self.group_ttl: dict[str, int] = {}
        """Per group, the TTL multicasts go out with: the view's (the largest any member asked for), or this
        process's own while it has no view."""
        self.group_via: dict[str, str] = {}
        """Per group joined naming a member (explicit naming, paper 3.3): the member that multicasts for us."""

    def joining(self, group: str, ttl: int | None, via: str | None) -> int:
        """A join of ``group`` asks for ``ttl`` (None: the default) and, maybe, names a member to multicast for it;
        the TTL the join asks the group for (the largest asked so far).  ValueError for a ``via`` that is no
        process ID."""
        if via is not None:
            split_process_id(via)
            self.group_via[group] = via
        wanted = max(ttl if ttl is not None else self.default_ttl, self.asked_ttl.get(group, 0))
        self.asked_ttl[group] = wanted
        self.group_ttl[group] = max(wanted, self.group_ttl.get(group, 0))
        return wanted

    def view_installed(self, group: str, view: View) -> None:
        """Multicasts of ``group`` go out with the view's TTL, or the one asked here if larger."""
        self.group_ttl[group] = max(view.ttl, self.asked_ttl.get(group, self.default_ttl))

    def forget(self, group: str) -> None:
        """The process is no longer in ``group``."""
        self.group_via.pop(group, None)
        self.group_ttl.pop(group, None)
        self.asked_ttl.pop(group, None)

    def transmit(self, tx: Transmit) -> None:
        """Seal ``tx`` and send it where it goes (counted as dropped when it names no group or a bad process)."""
        kind = packet_type_of(tx.data)
        if kind is not None:
            self.sent_by_type[kind] += 1
        bulk = kind == PacketType.DATA
        if tx.dest is None:
            if tx.group is None:
                self.stats["transmit_without_group"] += 1
                return
            via = self.group_via.get(tx.group, self.via)
            if via is not None:  # a member multicasts it for us
                self.sender.send(wrap(tx.group, self.guard.seal(tx.data)), split_process_id(via), bulk=bulk)
                return
            self.sender.send(self.guard.seal(tx.data), group_address(tx.group, self.address_range),
                             self.group_ttl.get(tx.group, self.default_ttl), bulk=bulk)
            return
        try:
            address = split_process_id(tx.dest)
        except ValueError:
            self.stats["transmit_bad_dest"] += 1
            return
        self.sender.send(self.guard.seal(tx.data), address, bulk=bulk)

    def forward(self, data: bytes, source: str, forwarding_view: Callable[[str], View | None],
                own: str) -> bytes | None:
        """A datagram from ``source`` with the forwarding flag: multicast what it wraps for its sender, when
        ``forwarding_view`` gives a view of its group (this process is a member of it that multicasts), and return
        it, to be taken as received from the sender; None when it is dropped (counted)."""
        unwrapped = unwrap(data)
        if unwrapped is None:
            self.stats["forward_malformed"] += 1
            return None
        group, datagram = unwrapped
        view = forwarding_view(group)
        if view is None:
            self.stats["forward_refused"] += 1  # only a member that multicasts forwards: no relay for strangers
            return None
        self.stats["forwarded"] += 1
        self._multicast_for(source, group, datagram, view, own)
        return datagram

    def _multicast_for(self, source: str, group: str, datagram: bytes, view: View, own: str) -> None:
        """Multicast ``datagram`` (sealed by ``source``, a process this one forwards for) to ``group``, and unicast
        it to each member of ``view`` that cannot receive multicast, bar ``source`` and this process (``own``)."""
        self.sender.send(datagram, group_address(group, self.address_range),
                         self.group_ttl.get(group, self.default_ttl))
        for member in sorted(view.unicast_only):
            if member not in (source, own):
                self.sender.send(datagram, split_process_id(member))

    def describe(self) -> dict[str, object]:
        return {"via": self.via, "group_via": dict(self.group_via)}
