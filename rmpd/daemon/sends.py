"""Local clients' sends: the answer (held back while the group's backlog is full), and which client each message
belongs to until it is delivered here.

What a send gave each client is kept until the message is delivered here (or, for a keyed copy the group dropped,
until the group says it had delivered the key: the client is told ``already-delivered``), so that when the
membership ends first each client is told its own messages (``undelivered``), and only its own: the sequence
numbers are the process's, shared by all its clients.
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping
from typing import Any

from rmpd import localapi
from rmpd.localapi import Request, RequestError
from rmpd.protocol.events import AlreadyDelivered, Delivered, UndeliveredSends
from rmpd.protocol.ids import view_name
from rmpd.runtime.adapter import OwnMessages

from .ports import Outlet, Runtime


class Sends:
    """Sends answered and not, and the messages not yet delivered here, per client."""

    def __init__(self, runtime: Runtime, stats: MutableMapping[str, int]) -> None:
        self.runtime = runtime
        self.stats = stats
        self.own: OwnMessages[Outlet] = OwnMessages()
        """Which client each message sent here and not yet delivered here belongs to."""
        self._delayed: dict[str, list[tuple[Outlet, Any, dict[str, Any]]]] = {}
        """Sends accepted while the group's backlog was full, answered once it has room again."""

    def send(self, client: Outlet, request: Request, payloads: list[bytes]) -> dict[str, Any] | None:
        """Send ``payloads`` to the group (the process is a member): the answer, or None when it waits for room."""
        group = request.group
        # The engine checks every message before it accepts any (BadArgument): a batch is taken or refused whole.
        # One step: the messages are kept as this client's before the drain can deliver them (a group of one
        # delivers at once).
        keys = request.keys if request.key is None else [request.key]
        with self.runtime.one_step():
            if keys is None:
                seqs = self.runtime.send_many(group, payloads, request.qos, request.handler)
            else:
                seqs = self.runtime.send_many(group, payloads, request.qos, request.handler, keys)
            if seqs is not None:
                self.own.sent(group, seqs, request.qos, client, request.idents(len(payloads)))
        if seqs is None:
            raise RequestError(localapi.SEND_REFUSED, f"the daemon is leaving {group!r}")
        self.stats["sends"] += len(seqs)
        self.stats["send_requests"] += 1
        answer = {"seq": seqs[0]} if request.payloads is None else {"seqs": seqs}
        if not self.runtime.has_room(group):
            # Accepted and queued in order, but the answer waits until the ring has taken some of the backlog:
            # this is how a client faster than the ring is slowed down.
            self.stats["sends_delayed"] += 1
            self._delayed.setdefault(group, []).append((client, request.id, answer))
            return None
        return answer

    def answer_delayed(self) -> None:
        """After each drain: answer held sends of groups whose backlog went down (or that are gone)."""
        if not self._delayed:
            return
        for group in [g for g in self._delayed if self.runtime.has_room(g)]:
            for client, rid, answer in self._delayed.pop(group):
                client.push(localapi.ok_reply(rid, answer))

    def delivered(self, event: Delivered) -> None:
        """One of this process's own packets was delivered here: its messages are no longer owed to anyone (but a
        keyed copy the group dropped, whose sender is told by :meth:`already_delivered`)."""
        self.own.delivered(event.group, event.seq, event.qos)

    def already_delivered(self, event: AlreadyDelivered, attached: Collection[Outlet]) -> None:
        """The group dropped a keyed message of this process as a copy of one it delivered: its sender is told
        (``already-delivered``), and the message is owed to nobody, as if delivered."""
        client = self.own.already_delivered(event.group, event.seq, event.key)
        if client is None or client not in attached:
            self.stats["already_delivered_unclaimed"] += 1
            return
        self.stats["already_delivered"] += 1
        client.push(localapi.already_delivered_event(event.group, event.key, event.ts, view_name(event.view)))

    def ended(self, group: str, reason: str, named: UndeliveredSends | None, attached: Collection[Outlet]) -> None:
        """The membership of ``group`` ended: tell each client attached to it which of the messages it sent were
        not delivered here (``named`` by the engine as never ordered, or ordered and not delivered here yet)."""
        per_client, unclaimed = self.own.ended_named(group, named)
        for client, lost in per_client.items():
            if client in attached:
                self.stats["undelivered_reported"] += len(lost.seqs)
                client.push(localapi.undelivered_event(group, list(lost.seqs), reason, list(lost.ids)))
        if unclaimed:
            self.stats["undelivered_unclaimed"] += unclaimed  # relayed calls, or clients gone meanwhile

    def detached(self, client: Outlet, group: str) -> None:
        """``client`` left ``group``: nobody is left to tell about its messages there."""
        self.own.forget(client, group)

    def forget(self, client: Outlet) -> None:
        """A client went away: its messages and its held answers are forgotten."""
        self.own.forget(client)
        for held in self._delayed.values():
            held[:] = [w for w in held if w[0] is not client]

    def held(self, group: str) -> int:
        """Sequence numbers of ``group`` given to clients and not delivered here yet (``own_pending``)."""
        return self.own.held(group)


__all__ = ["Sends"]
