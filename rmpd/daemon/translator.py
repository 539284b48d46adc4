"""The daemon's translation between its local clients and its one RMP process, sans-IO.

Client requests (decoded frames, from one :class:`~rmpd.daemon.ports.Outlet` each) and the engine's events come
in; frames to each client and requests to the process (:class:`~rmpd.daemon.ports.Runtime`) go out.  Nothing here
awaits: the trio side (rmpd.daemon.server, rmpd.daemon.hub) reads a frame, hands it over and writes what was
pushed.  The translator is a coordinator over parts that each own their state:

- ``attachments`` (Attachments): which clients are attached to which group;
- ``kept`` (KeptMemberships): the groups kept with no client, and their record for the next start;
- ``sends`` (Sends): send answers held for room, and which client each message belongs to until delivered;
- ``locks`` (LockOwners): handler locks and the client each belongs to;
- ``calls`` (CallWaiters): calls of clients to groups, and groups' calls to the lock's client;
- ``fanout`` (Fanout): frames encoded once per group, a drain's deliveries gathered;
- ``backpressure`` (Backpressure): the token held back for a client behind, and the cut of one that stays so;
- ``app`` (rmpd.runtime.adapter.ProcessAdapter): join waiters and rejoins, as the embedded node has them.

The daemon is one member of each group; a membership that ends by itself (``Left.rejoining``) is rejoined with the
clients still attached; they are told (``rejoining``), and their sends are refused as not-member, saying so,
until the next view.  Otherwise the daemon leaves a group once its last attached client leaves or disconnects,
unless it keeps the group.  Requests that wait for the protocol (join, lock, unlock, call, a send waiting for room)
are answered from the events that settle them.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rmpd import localapi
from rmpd.localapi import Request, RequestError, parse_request
from rmpd.protocol.events import (
    AlreadyDelivered,
    CallAnswered,
    CallToAnswer,
    Delivered,
    Event,
    JoinFailed,
    Left,
    LockResult,
    SendRefused,
    StatusAsked,
    StatusGathered,
    UndeliveredSends,
    ViewInstalled,
)
from rmpd.protocol.limits import BadArgument
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER
from rmpd.runtime.adapter import JoinEnd, ProcessAdapter
from rmpd.told import JOIN_END_CODES, ending, view_of

from . import status
from .attachments import Attachments
from .backpressure import Backpressure
from .calls import CallWaiters
from .fanout import Fanout
from .group_status import MAX_GATHER_TIMEOUT, StatusGatherer
from .kept import KeptMemberships
from .locks import LockOwners
from .memberships import Membership, MembershipFile
from .ports import Outlet, Runtime
from .sends import Sends

log = logging.getLogger("rmpd")


class ClientReply:
    """A request parked until the process answers it: the client, the request's id, and fields of the answer
    known when it was asked."""

    __slots__ = ("extra", "rid", "session")

    def __init__(self, session: Outlet, rid: Any, extra: dict[str, Any] | None = None) -> None:
        self.session = session
        self.rid = rid
        self.extra = extra or {}

    def ok(self, fields: dict[str, Any]) -> None:
        self.session.push(localapi.ok_reply(self.rid, {**fields, **self.extra}))

    def fail(self, reason: JoinEnd, message: str) -> None:
        self.session.push(localapi.error_reply(self.rid, JOIN_END_CODES[reason], message))


class KeptReply:
    """The daemon itself waiting for a join it made for a kept membership: nobody to answer, so the outcome goes
    to the log."""

    __slots__ = ("group",)

    def __init__(self, group: str) -> None:
        self.group = group

    def ok(self, fields: dict[str, Any]) -> None:
        log.info("rejoined %s: view %s, %d member(s)", self.group, fields["view"], len(fields["members"]))

    def fail(self, reason: JoinEnd, message: str) -> None:
        log.warning("could not rejoin %s: %s: %s", self.group, JOIN_END_CODES[reason], message)


Handler = Callable[[Outlet, Request], "dict[str, Any] | None"]


class Translator:
    """Requests and events in, frames and process requests out (see the module's docstring)."""

    def __init__(self, runtime: Runtime, *, clock: Callable[[], float], socket_path: str = "",
                 overrun_frames: int = 5000, kept: MembershipFile | None = None) -> None:
        self.runtime = runtime
        self.socket_path = socket_path
        self.stats: defaultdict[str, int] = defaultdict(int)
        """The local API's counters (``rmp status``: ``hub_*``; the metrics' ``rmpd_hub_events``)."""
        self.sessions: set[Outlet] = set()
        """Every client connected."""
        self.shutting_down = False
        self.metrics_address: str | None = None
        """Where the daemon serves its Prometheus metrics (``host:port``), when it does."""
        self.last_reload: dict[str, Any] | None = None
        """What the last reload (SIGHUP) applied and did not (rmpd.daemon.reload.ReloadReport), for status."""
        self.app = ProcessAdapter(runtime, self.stats)  # type: ignore[arg-type]
        self.attachments = Attachments()
        self.kept = KeptMemberships(kept, self.stats)
        self.sends = Sends(runtime, self.stats)
        self.locks = LockOwners(runtime)
        self.calls = CallWaiters(runtime, self.locks, self.stats)
        self.fanout = Fanout(self.attachments, self.locks)
        self.backpressure = Backpressure(self.app, self.attachments, self.sessions, overrun_frames, self.stats, clock)
        self.gatherer = StatusGatherer(runtime, self.attachments.clients, self.stats)  # type: ignore[arg-type]
        """``rmp status G --all``: this daemon's gatherings, and its answers to other members'."""
        self._ops: dict[str, Handler] = {
            "hello": self._hello, "status": self._status,
            "join": self._join, "leave": self._leave, "send": self._send, "send_batch": self._send_batch,
            "members": self._members, "lock": self._lock, "unlock": self._unlock,
            "call": self._call, "reply": lambda client, request: self.calls.reply(request),
        }
        """The handler of each operation of the local API (localapi.OPS)."""
        self._events: dict[type, Callable[[Any], None]] = {
            ViewInstalled: self._view_installed, LockResult: self.locks.result,
            CallAnswered: self.calls.answered, CallToAnswer: self.calls.requested,
            StatusAsked: self.gatherer.asked, StatusGathered: self.gatherer.gathered,
            Left: self._gone, JoinFailed: self._gone, UndeliveredSends: self._undelivered,
            SendRefused: self._send_refused, AlreadyDelivered: self._already_delivered,
        }
        """The handler of each engine event but ``Delivered`` (gathered per drain, see :meth:`handle_events`)."""

    # ------------------------------------------------------------------------------------------------------------
    # Clients

    def add(self, session: Outlet) -> None:
        self.sessions.add(session)
        session.on_written = self.caught_up

    def remove(self, session: Outlet) -> None:
        """A client went away: detach it from its groups, forget what it sent, and give back its locks."""
        self.sessions.discard(session)
        self.stats["frames_dropped"] += session.dropped
        for group in self.attachments.groups_of(session):
            self._detach(session, group)
        self.sends.forget(session)  # sent to a group it had left already
        self.app.forget(lambda reply: isinstance(reply, ClientReply) and reply.session is session)
        self.gatherer.forget(session)  # type: ignore[arg-type]
        self.calls.forget(session)
        self.locks.client_gone(session)

    def caught_up(self) -> None:
        """After a write to a client: a group it held back may take the token again (drained as one step).  A
        write only shortens a queue, so with no group held back there is nothing to check."""
        if not self.backpressure.holding():
            return
        with self.runtime.one_step():
            self.backpressure.check()

    def _detach(self, session: Outlet, group: str) -> None:
        emptied, took_part = self.attachments.detach(session, group)
        self.sends.detached(session, group)
        if emptied and not self.kept.keeps(group) and not self.shutting_down:
            self._leave_group(group)
        if took_part:
            self._state_participant_gone(session, group)

    def _state_participant_gone(self, session: Outlet, group: str) -> None:
        """A client taking part in the group's state transfer left it while the daemon stays a member: the group's
        programs are told in the total order, as of a member leaving the view, so that a transfer it was sending
        goes on from the next offer everywhere alike instead of waiting for its chunks."""
        if self.shutting_down or not self.runtime.is_member(group):
            return  # the daemon leaves: the view that follows says so
        notice = localapi.state_participant_gone(self.runtime.pid, session.id)
        with contextlib.suppress(NotMember, BadArgument), self.runtime.one_step():
            self.runtime.send_many(group, [notice], QoS.TOTAL, LIBRARY_HANDLER)

    def _leave_group(self, group: str) -> None:
        with contextlib.suppress(NotMember):
            self.runtime.leave(group)

    # ------------------------------------------------------------------------------------------------------------
    # Memberships kept with no client

    def rejoin_kept(self, configured: list[Membership], recorded: dict[str, Membership]) -> None:
        """At start, before the daemon says it is ready: join every group of the config and every one recorded by
        a persistent join, and keep them with no client attached (the daemon is the member, on the operator's
        behalf).  A group in both is joined once, with the config's settings."""
        self.kept.reread(recorded)
        wanted = self.kept.wanted(configured)
        with self.runtime.one_step():
            for membership in wanted.values():
                self._keep(membership)
        if wanted:
            log.info("rejoining %d kept group(s): %s", len(wanted), ", ".join(sorted(wanted)))

    def reload_kept(self, configured: list[Membership], recorded: dict[str, Membership]) -> tuple[list[str], list[str]]:
        """A reload (SIGHUP): keep the groups the config and the kept file list now, as a start would.  A group
        newly listed is joined; one no longer listed is no longer kept, and left unless a client uses it.  A group
        kept before and still listed is not touched (a changed ``min_partition`` or ``ttl`` applies at its next
        join).  Returns the groups joined and those no longer kept."""
        self.kept.reread(recorded)
        wanted = self.kept.wanted(configured)
        kept = self.kept.groups()
        added = sorted(group for group in wanted if group not in kept)
        dropped = sorted(kept - wanted.keys())
        with self.runtime.one_step():
            for group in dropped:
                self.kept.drop(group)
                if not self.attachments.clients(group):
                    self._leave_group(group)
            for group in added:
                self._keep(wanted[group])
        return added, dropped

    def _keep(self, membership: Membership) -> None:
        """Be a member of the group on the operator's behalf, with no client: join it unless a member already."""
        group = membership.group
        self.kept.keep(group)
        min_partition = (localapi.DEFAULT_MIN_PARTITION if membership.min_partition is None
                         else membership.min_partition)
        try:
            self.app.join(group, KeptReply(group), ttl=membership.ttl, min_partition=min_partition)
        except ValueError as exc:  # a name this daemon's address range cannot take
            self.kept.drop(group)
            log.error("cannot rejoin %s: %s", group, exc)

    # ------------------------------------------------------------------------------------------------------------
    # Requests

    def handle(self, session: Outlet, frame: dict[str, Any]) -> None:
        """Answer one frame: now, or later from the events that settle it.  Never raises."""
        rid = frame.get("id")
        try:
            request = parse_request(frame)
            if self.shutting_down:
                raise RequestError(localapi.SHUTTING_DOWN, "the daemon is shutting down")
            result = self._ops[request.op](session, request)
        except RequestError as exc:
            self.stats["requests_refused"] += 1
            session.push(localapi.error_reply(rid, exc.code, exc.message))
            return
        except BadArgument as exc:  # the engine's own checks: bad-request or message-too-large
            self.stats["requests_refused"] += 1
            session.push(localapi.error_reply(rid, exc.code, str(exc)))
            return
        except NotMember as exc:
            self.stats["requests_refused"] += 1
            group = frame.get("group")
            refusal = self._not_member(session, group) if isinstance(group, str) else None
            session.push(localapi.error_reply(rid, localapi.NOT_MEMBER, refusal.message if refusal else str(exc)))
            return
        except Exception as exc:  # a bug must cost one request, never the daemon
            self.stats["requests_failed"] += 1
            log.exception("request %r failed", frame.get("op"))
            session.push(localapi.error_reply(rid, localapi.INTERNAL, f"{type(exc).__name__}: {exc}"))
            return
        if result is not None:
            session.push(localapi.ok_reply(rid, result))

    def _not_member(self, session: Outlet, group: str) -> RequestError:
        """The refusal of a request that needs the daemon in a view of ``group``: saying whether it rejoins (retry
        after the next view) or was never asked to join."""
        attached = self.attachments.is_attached(session, group)
        return RequestError(localapi.NOT_MEMBER, f"the daemon is {self.app.not_member(group, attached=attached)}")

    def _hello(self, session: Outlet, request: Request) -> dict[str, Any]:
        limits = self.runtime.process.config  # type: ignore[attr-defined]  # a client checks each message first
        return {"pid": self.runtime.pid, "version": 1, "max_message": limits.max_message,
                "max_packet": limits.max_packet, "client": session.id}

    def _status(self, session: Outlet, request: Request) -> dict[str, Any] | None:
        if not request.all:
            return status.local_status(self, request)
        if not request.group or request.timeout > MAX_GATHER_TIMEOUT:
            raise RequestError(localapi.BAD_REQUEST, f"status with all needs a group and a timeout of at most "
                                                     f"{MAX_GATHER_TIMEOUT:g} s")
        self.gatherer.start(request.group, request.timeout, ClientReply(session, request.id))  # type: ignore[arg-type]
        return None

    def _join(self, session: Outlet, request: Request) -> dict[str, Any] | None:
        group = request.group
        if request.persist:
            self.kept.record(Membership(group, request.min_partition, request.ttl))
            self.kept.keep(group)
        # Clients of this daemon are participants of the group's state transfer each: one that attaches when
        # another takes part already is not alone with the state, even when this daemon is alone in the view.
        peers = {"state_peers": self.attachments.attach(session, group, state=request.state)}
        try:
            view = self.app.join(group, ClientReply(session, request.id, peers), ttl=request.ttl,
                                 min_partition=localapi.DEFAULT_MIN_PARTITION if request.min_partition is None
                                 else request.min_partition, existing_only=request.existing_only,
                                 via=request.via)
        except ValueError as exc:
            self._detach(session, group)
            self.kept.drop(group)
            self.kept.join_failed(group)
            raise RequestError(localapi.BAD_REQUEST, str(exc)) from None
        if view is not None:
            self.kept.confirmed(group)  # a member already: the record stands
            return {"view": str(view.view_id), "members": list(view.members), **peers}
        return None

    def _leave(self, session: Outlet, request: Request) -> dict[str, Any]:
        group = request.group
        kept = self.kept.keeps(group) or self.kept.is_recorded(group)  # recorded: also after the group ended here
        attached = self.attachments.is_attached(session, group)
        if not attached and not (request.persist and kept):
            hint = " (a persistent membership ends with a persistent leave)" if kept else ""
            raise RequestError(localapi.NOT_JOINED, f"this client has not joined {group!r}{hint}")
        if request.persist:
            self.kept.unrecord(group)
            self.kept.drop(group)
        if attached:
            self._detach(session, group)
        elif not self.attachments.clients(group):
            self._leave_group(group)
        return {"daemon_left": not self.attachments.clients(group) and not self.kept.keeps(group)}

    def _send(self, session: Outlet, request: Request) -> dict[str, Any] | None:
        if not self.runtime.is_member(request.group):
            raise self._not_member(session, request.group)
        return self.sends.send(session, request, [request.payload])

    def _send_batch(self, session: Outlet, request: Request) -> dict[str, Any] | None:
        """Several messages in one request (the client library coalesces concurrent sends): one answer with
        every sequence number, in order."""
        assert request.payloads is not None
        if not self.runtime.is_member(request.group):
            raise self._not_member(session, request.group)
        return self.sends.send(session, request, request.payloads)

    def _call(self, session: Outlet, request: Request) -> None:
        self.calls.call(session, request)

    def _members(self, session: Outlet, request: Request) -> dict[str, Any]:
        view = self.runtime.view(request.group)
        if view is None:
            raise self._not_member(session, request.group)
        return {"view": str(view.view_id), "members": list(view.members),
                "unicast_only": sorted(view.unicast_only), "locks": [list(x) for x in view.locks]}

    def _lock(self, session: Outlet, request: Request) -> dict[str, Any] | None:
        view = self.runtime.view(request.group)
        if view is None:
            raise self._not_member(session, request.group)
        return self.locks.lock(session, request, view)

    def _unlock(self, session: Outlet, request: Request) -> None:
        self.locks.unlock(session, request)

    # ------------------------------------------------------------------------------------------------------------
    # Events from the engine, in order

    def handle_events(self, events: list[Event]) -> None:
        """One drain's events, in order; then what the drain changed: deliveries pushed, held sends answered,
        clients behind checked."""
        gather, own_delivered, me = self.fanout.gather, self.sends.delivered, self.runtime.pid
        for event in events:
            if type(event) is Delivered:
                gather(event)
                if event.src == me:
                    own_delivered(event)
            else:
                self.fanout.flush(event.group)  # whatever was delivered before this event goes first
                handler = self._events.get(type(event))
                if handler is not None:
                    handler(event)
        self.fanout.flush()
        self.sends.answer_delayed()
        self.backpressure.check()

    def _view_installed(self, event: ViewInstalled) -> None:
        view, members = view_of(event)
        self.fanout.to_group(event.group, localapi.view_event(event.group, view, list(members), event.ts))
        if self.runtime.is_member(event.group):
            self.kept.confirmed(event.group)  # the persistent join took effect: its record stands
        self.app.view_installed(event)
        self.locks.view_installed(event)

    def _undelivered(self, event: UndeliveredSends) -> None:
        self.stats["undelivered"] += len(event.seqs)
        log.warning("%d message(s) of %s not delivered here (%s): seqs %s", len(event.seqs), event.group,
                    event.reason, ", ".join(map(str, event.seqs[:20])))
        self.sends.ended(event.group, event.reason, event, self.attachments.clients(event.group))

    def _already_delivered(self, event: AlreadyDelivered) -> None:
        self.sends.already_delivered(event, self.attachments.clients(event.group))

    def _send_refused(self, event: SendRefused) -> None:
        self.stats["sends_refused"] += 1
        log.warning("send refused in %s: %s", event.group, event.reason)

    def _gone(self, event: Left | JoinFailed) -> None:
        group = event.group
        if isinstance(event, Left):  # ordered, not delivered here (usually nothing)
            self.sends.ended(group, event.reason, None, self.attachments.clients(group))
        if ending(event).rejoining:
            # Cut off or merged: the process joins again by itself, and the clients stay in the group, told so
            # now; the view that follows tells them where they are.  Locks do not survive the membership that
            # held them.
            log.warning("membership of %s ended (%s); rejoining", group, event.reason)
            self.stats["rejoins"] += 1
            self.app.membership_ended(event)
            self.fanout.to_group(group, localapi.rejoining_event(group, event.reason))
            self.locks.ended(group, event.reason)
            return
        if self.app.ended(event):
            return  # someone asked to join while the daemon was still finishing its leave: joined again
        self.locks.ended(group, event.reason)
        if not self.shutting_down:  # at shutdown each client is told once, shutting-down (close_sessions)
            self.fanout.to_group(group, localapi.left_event(group, event.reason))
        self.attachments.end(group)
        self.kept.drop(group)
        if isinstance(event, JoinFailed):
            # The persistent join that recorded the group never took effect (its client was told join-failed):
            # nothing to rejoin at the next start.
            self.kept.join_failed(group)

    # ------------------------------------------------------------------------------------------------------------

    def leave_all(self) -> None:
        """Shutdown: refuse new requests and leave every group."""
        self.shutting_down = self.app.stopping = True
        for group in self.runtime.groups():
            self._leave_group(group)

    def close_sessions(self, message: str) -> None:
        """Shutdown, once the groups are left: every client gets what is queued for it (the deliveries before the
        leave), then one ``shutting-down`` error, the reason its connection ends, instead of a ``left`` per
        group that would read as if the group had gone."""
        for session in list(self.sessions):
            session.push(localapi.error_reply(None, localapi.SHUTTING_DOWN, message))
            session.finish()


__all__ = ["ClientReply", "KeptReply", "Translator"]
