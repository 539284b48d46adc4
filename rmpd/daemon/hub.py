"""The daemon's shared state between local clients and its one RMP process.

The daemon is one member of each group; several local clients may be attached to one group, and each delivery is
fanned out to all of them in the order the engine delivered it.  What a send gave each client is kept until the
message is delivered here, so that when the membership ends first each client is told its own messages
(``undelivered``), and only its own: the sequence numbers are the process's, shared by all its clients.  A
membership that ends by itself (``Left.rejoining``) is rejoined with the clients still attached; they are told
(``rejoining``), and their sends are refused as not-member, saying so, until the next view.

Membership taken with a persistent join (``rmp join``) stays until a persistent leave (``rmp leave``), also across
restarts: it is recorded in the state directory and rejoined at start, with the config's ``groups``
(rmpd.daemon.memberships).  Otherwise the daemon leaves a group once its last attached client leaves or
disconnects.  Handler locks are held by the daemon in the view, but each belongs to the local client that took it:
only that client may release it, and it is released when that client goes away.

Requests are answered without blocking the loop: those that wait for the protocol (join, lock, unlock) are parked
here and answered from :meth:`on_event` when the engine's answer arrives.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rmpd import localapi
from rmpd.localapi import DeliveryRun, Request, RequestError, encode_frame, parse_request, qos_name
from rmpd.protocol.events import (
    CallAnswered,
    CallRequest,
    Delivered,
    Event,
    JoinFailed,
    Left,
    LockResult,
    SendRefused,
    StatusAsked,
    StatusGathered,
    Undelivered,
    ViewInstalled,
)
from rmpd.protocol.ids import view_name
from rmpd.protocol.limits import BadArgument
from rmpd.protocol.process import NotMember
from rmpd.protocol.qos import QoS
from rmpd.protocol.status import GroupStatus
from rmpd.protocol.view import LIBRARY_HANDLER
from rmpd.runtime.adapter import OVERRUN_GRACE, Application, LockBusy, LockRequests, OwnMessages
from rmpd.runtime.loop import ProcessLoop

from .group_status import MAX_GATHER_TIMEOUT, StatusGatherer, group_details
from .memberships import Membership, MembershipFile
from .session import Session

log = logging.getLogger("rmpd")

Waiter = tuple[Session, Any]
"""A parked request: the session to answer and the request's id."""

PERSISTENT = "persistent"
"""Owner of a lock taken with ``persist`` (``rmp lock``): the daemon keeps it until a persistent unlock."""

Owner = Session | str | None

OVERRUN_BYTES = 4 * 1024 * 1024
"""A client with more than this queued (or more than half of client_queue frames) is behind: what the daemon
buffers for a client is bounded in bytes, not only in frames of any size."""

DELIVERY_FRAME_BYTES = 4 * 1024 * 1024
"""Payload bytes gathered into one deliveries frame before another is started."""


class SessionReply:
    """A request parked until the process answers it: the client's session, the request's id, and fields of the
    answer known when it was asked."""

    __slots__ = ("extra", "rid", "session")

    def __init__(self, session: Session, rid: Any, extra: dict[str, Any] | None = None) -> None:
        self.session = session
        self.rid = rid
        self.extra = extra or {}

    def ok(self, fields: dict[str, Any]) -> None:
        self.session.push(localapi.ok_reply(self.rid, {**fields, **self.extra}))

    def fail(self, code: str, message: str) -> None:
        self.session.push(localapi.error_reply(self.rid, code, message))


class KeptReply:
    """The daemon itself waiting for a join it made at start for a kept membership: nobody to answer, so the
    outcome goes to the log."""

    __slots__ = ("group",)

    def __init__(self, group: str) -> None:
        self.group = group

    def ok(self, fields: dict[str, Any]) -> None:
        log.info("rejoined %s: view %s, %d member(s)", self.group, fields["view"], len(fields["members"]))

    def fail(self, code: str, message: str) -> None:
        log.warning("could not rejoin %s: %s: %s", self.group, code, message)


class Hub:
    def __init__(self, loop: ProcessLoop, socket_path: str, overrun_frames: int = 5000,
                 kept: MembershipFile | None = None) -> None:
        self.loop = loop
        self.socket_path = socket_path
        self.sessions: set[Session] = set()
        self.attached: dict[str, set[Session]] = defaultdict(set)
        self.persistent: set[str] = set()
        """Groups the daemon stays in with no client attached: persistent joins, and the kept memberships."""
        self.kept = kept
        """Where persistent joins are recorded for the next start (None: nowhere, they end with the process)."""
        self.recorded: dict[str, Membership] = {}
        """What ``kept`` holds: the groups joined with a persistent join and not left with a persistent leave."""
        self._unconfirmed: set[str] = set()
        """Groups recorded by a persistent join still on its way: a join that fails takes its record back."""
        self.locks: LockRequests[tuple[Session, Any]] = LockRequests(loop)
        self.lock_owner: dict[tuple[str, int], Owner] = {}
        """Locks this daemon holds per group, and the local client each belongs to (None once it went away)."""
        self.shutting_down = False
        self._sessions_changed = trio.Event()
        """Set when a client goes away (replaced by whoever waits for the next one: :meth:`sessions_gone`)."""
        self.send_waiters: dict[str, list[tuple[Session, Any, dict[str, Any]]]] = defaultdict(list)
        """Sends accepted while the group's backlog was full, answered once it has room again."""
        self.call_waiters: dict[int, Waiter] = {}
        """Calls to groups made for local clients, by call ID, answered from CallAnswered events."""
        self.stats: dict[str, int] = defaultdict(int)
        loop.application = self
        self.deliveries: dict[str, list[DeliveryRun]] = defaultdict(list)
        """Deliveries of the current drain per group, not yet pushed to clients, one run per packet delivered."""
        self.app = Application(loop, self.stats)
        """Join waiters, rejoin on Left, and the overrun rule, as the embedded node has them too."""
        self.own: OwnMessages[Session] = OwnMessages()
        """Which client each message sent here and not yet delivered here belongs to."""
        self.overrun_frames = overrun_frames
        self.metrics_address: str | None = None
        """Where the daemon serves its Prometheus metrics (``host:port``), when it does."""
        self.last_reload: dict[str, Any] | None = None
        """What the last reload (SIGHUP) applied and did not (rmpd.daemon.reload.ReloadReport), for status."""
        loop.metrics.extra.append(self._client_metrics)
        self.gatherer = StatusGatherer(loop, lambda group: self.attached.get(group, ()), self.stats)
        """``rmp status G --all``: this daemon's gatherings, and its answers to other members'."""

    # ------------------------------------------------------------------------------------------------------------
    # Memberships kept across restarts

    def rejoin_kept(self, configured: list[Membership], recorded: dict[str, Membership]) -> None:
        """At start, before the daemon says it is ready: join every group of the config and every one recorded by
        a persistent join, and keep them with no client attached (the daemon is the member, on the operator's
        behalf).  A group in both is joined once, with the config's settings: the config is what the operator
        edits."""
        self.recorded = dict(recorded)
        wanted = {**recorded, **{m.group: m for m in configured}}
        with self.loop.one_step():
            for membership in wanted.values():
                self._keep(membership)
        if wanted:
            log.info("rejoining %d kept group(s): %s", len(wanted), ", ".join(sorted(wanted)))

    def reload_kept(self, configured: list[Membership], recorded: dict[str, Membership]) -> tuple[list[str], list[str]]:
        """A reload (SIGHUP): keep the groups the config and the kept file list now, as a start would.  A group
        newly listed is joined; one no longer listed is no longer kept, and left unless a client uses it.  A group
        kept before and still listed is not touched (a changed ``min_partition`` or ``ttl`` applies at its next
        join).  Returns the groups joined and those no longer kept."""
        self.recorded = dict(recorded)
        self._unconfirmed &= recorded.keys()
        wanted = {**recorded, **{m.group: m for m in configured}}
        added = sorted(group for group in wanted if group not in self.persistent)
        dropped = sorted(self.persistent - wanted.keys())
        with self.loop.one_step():
            for group in dropped:
                self.persistent.discard(group)
                if not self.attached.get(group):
                    self._leave_group(group)
            for group in added:
                self._keep(wanted[group])
        return added, dropped

    def _keep(self, membership: Membership) -> None:
        """Be a member of the group on the operator's behalf, with no client: join it unless a member already."""
        group = membership.group
        self.persistent.add(group)
        min_partition = (localapi.DEFAULT_MIN_PARTITION if membership.min_partition is None
                         else membership.min_partition)
        try:
            self.app.join(group, KeptReply(group), ttl=membership.ttl, min_partition=min_partition)
        except ValueError as exc:  # a name this daemon's address range cannot take
            self.persistent.discard(group)
            log.error("cannot rejoin %s: %s", group, exc)

    def _record(self, membership: Membership) -> None:
        """A persistent join: keep the membership for the next start, durably, before the join goes ahead, so an
        answered ``rmp join`` is never forgotten by a crash.  Refused (state-unwritable, nothing changed) when the
        state directory cannot be written."""
        old = self.recorded.get(membership.group)
        new = old.merged(membership) if old is not None else membership
        if new == old:
            return
        self._save({**self.recorded, new.group: new})
        if old is None:
            self._unconfirmed.add(new.group)

    def _unrecord(self, group: str) -> None:
        """A persistent leave: the next start no longer rejoins the group (refused, nothing changed, when the
        state directory cannot be written)."""
        self._unconfirmed.discard(group)
        if group in self.recorded:
            self._save({g: m for g, m in self.recorded.items() if g != group})

    def _save(self, recorded: dict[str, Membership]) -> None:
        if self.kept is not None:
            try:
                self.kept.save(recorded.values())
            except OSError as exc:
                self.stats["memberships_unsaved"] += 1
                raise RequestError(localapi.STATE_UNWRITABLE,
                                   f"cannot record memberships in {self.kept.path}: {exc.strerror or exc}") from None
        self.recorded = recorded

    # ------------------------------------------------------------------------------------------------------------
    # Sessions

    def add(self, session: Session) -> None:
        self.sessions.add(session)
        session.on_written = self._client_caught_up

    def remove(self, session: Session) -> None:
        """A client went away: detach it from its groups, forget what it sent, and give back its locks."""
        self.sessions.discard(session)
        self._sessions_changed.set()
        for group in list(session.groups):
            self._detach(session, group)
        self.own.forget(session)  # sent to a group it had left already
        self.app.forget(lambda reply: isinstance(reply, SessionReply) and reply.session is session)
        for parked in self.send_waiters.values():
            parked[:] = [w for w in parked if w[0] is not session]
        self.gatherer.forget(session)
        for call_id, (waiter, _) in list(self.call_waiters.items()):
            if waiter is session:
                del self.call_waiters[call_id]
                self.loop.cancel_call(call_id)
        for key, owner in list(self.lock_owner.items()):
            if owner is session:
                self.lock_owner[key] = None
                self._release(*key)

    def _detach(self, session: Session, group: str) -> None:
        session.groups.discard(group)
        self.attached[group].discard(session)
        self.own.forget(session, group)
        if not self.attached[group]:
            del self.attached[group]
            if group not in self.persistent and not self.shutting_down:
                self._leave_group(group)
        if group in session.state_groups:
            self._state_participant_gone(session, group)

    def _state_participant_gone(self, session: Session, group: str) -> None:
        """A client taking part in the group's state transfer left it while the daemon stays a member: the group's
        programs are told in the total order, as of a member leaving the view, so that a transfer it was sending
        goes on from the next offer everywhere alike instead of waiting for its chunks."""
        session.state_groups.discard(group)
        if self.shutting_down or not self.loop.is_member(group):
            return  # the daemon leaves: the view that follows says so
        notice = localapi.state_participant_gone(self.loop.pid, session.id)
        with contextlib.suppress(NotMember, BadArgument), self.loop.one_step():
            self.loop.send_many(group, [notice], QoS.TOTAL, LIBRARY_HANDLER)

    def _leave_group(self, group: str) -> None:
        with contextlib.suppress(NotMember):
            self.loop.leave(group)

    def _release(self, group: str, lock: int) -> None:
        try:
            self.loop.unlock(group, lock)
        except NotMember:
            self.lock_owner.pop((group, lock), None)

    # ------------------------------------------------------------------------------------------------------------
    # Requests

    def handle(self, session: Session, frame: dict[str, Any]) -> None:
        """Answer one frame: now, or later from on_event.  Never raises."""
        rid = frame.get("id")
        try:
            request = parse_request(frame)
            if self.shutting_down:
                raise RequestError(localapi.SHUTTING_DOWN, "the daemon is shutting down")
            result = getattr(self, f"_op_{request.op}")(session, request)
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

    def _not_member(self, session: Session, group: str) -> RequestError:
        """The refusal of a request that needs the daemon in a view of ``group``: saying whether it rejoins (retry
        after the next view) or was never asked to join."""
        return RequestError(localapi.NOT_MEMBER,
                            f"the daemon is {self.app.not_member(group, attached=group in session.groups)}")

    def _op_hello(self, session: Session, request: Request) -> dict[str, Any]:
        limits = self.loop.process.config  # a client checks each message against these before batching it
        return {"pid": self.loop.pid, "version": 1, "max_message": limits.max_message,
                "max_packet": limits.max_packet, "client": session.id}

    def _op_status(self, session: Session, request: Request) -> dict[str, Any] | None:
        if request.all:
            if not request.group or request.timeout > MAX_GATHER_TIMEOUT:
                raise RequestError(localapi.BAD_REQUEST, f"status with all needs a group and a timeout of at most "
                                                         f"{MAX_GATHER_TIMEOUT:g} s")
            self.gatherer.start(request.group, request.timeout, SessionReply(session, request.id))
            return None
        groups = []
        for group in self.loop.groups():
            if request.group and group != request.group:
                continue
            view = self.loop.view(group)
            status = self.loop.status(group)
            groups.append({
                "group": group,
                "view": str(view.view_id) if view else None,
                "members": list(view.members) if view else [],
                "joining": status is None,  # listed, with no membership yet
                "persistent": group in self.persistent,
                "min_partition": localapi.min_partition_name(view.min_partition) if view else None,
                "ttl": self.loop.group_ttl.get(group),  # what its multicasts go out with
                "clients": len(self.attached.get(group, ())),
                "locks": sorted(lock for (g, lock) in self.lock_owner if g == group),
                "buffers": self._buffers(group, status),
                "scmp": status.scmp if status is not None else {},
                **group_details(self.loop, group, self.attached.get(group, ())),
            })
        counters = self.loop.counters()
        counters.update({f"hub_{k}": v for k, v in self.stats.items()})
        return {"pid": self.loop.pid, "socket": self.socket_path, "groups": groups,
                "clients": len(self.sessions), "auth": self.loop.guard.describe(), "counters": counters,
                "metrics": self.metrics_address, "reload": self.last_reload}

    def _client_metrics(self) -> list[Metric]:
        """The local clients and what waits for them, for the metrics endpoint (read when scraped)."""
        clients = GaugeMetricFamily("rmpd_clients", "Local clients connected.", value=len(self.sessions))
        frames = GaugeMetricFamily("rmpd_client_queue_frames", "Frames queued for local clients, by group (the "
                                   "largest of one client, and all together).", labels=["group", "of"])
        hub = CounterMetricFamily("rmpd_hub_events", "The local API's counters, by name.", labels=["counter"])
        for group, sessions in self.attached.items():
            sizes = [s.queued_frames for s in sessions] or [0]
            frames.add_metric([group, "largest"], max(sizes))
            frames.add_metric([group, "all"], sum(sizes))
        for name, value in self.stats.items():
            hub.add_metric([name], value)
        return [clients, frames, hub]

    def _buffers(self, group: str, status: GroupStatus | None) -> dict[str, int]:
        """What the group holds in memory here: OrderingQ slots, data packets, own packets in flight and queued,
        the bytes queued for its local clients, and the sequence numbers given to clients whose message was not
        delivered here yet (``own_pending``)."""
        held = {"orderingq": status.orderingq_slots, "packets": status.packets_held, "in_flight": status.in_flight,
                "send_queue": status.send_queue} if status is not None else {}
        return {**held, "client_bytes": sum(s.queued_bytes for s in self.attached.get(group, ())),
                "own_pending": self.own.held(group)}

    def _op_join(self, session: Session, request: Request) -> dict[str, Any] | None:
        group = request.group
        if request.persist:
            self._record(Membership(group, request.min_partition, request.ttl))
            self.persistent.add(group)
        # Clients of this daemon are participants of the group's state transfer each: one that attaches when
        # another takes part already is not alone with the state, even when this daemon is alone in the view.
        peers = {"state_peers": sum(group in s.state_groups for s in self.attached.get(group, ()) if s is not session)}
        if group not in session.groups:
            session.groups.add(group)
            session.state_groups.discard(group)  # as an earlier attachment to the group said
            self.attached[group].add(session)
        if request.state:
            session.state_groups.add(group)
        try:
            view = self.app.join(group, SessionReply(session, request.id, peers), ttl=request.ttl,
                                 min_partition=localapi.DEFAULT_MIN_PARTITION if request.min_partition is None
                                 else request.min_partition, existing_only=request.existing_only,
                                 via=request.via)
        except ValueError as exc:
            self._detach(session, group)
            self.persistent.discard(group)
            if group in self._unconfirmed:
                with contextlib.suppress(RequestError):
                    self._unrecord(group)
            raise RequestError(localapi.BAD_REQUEST, str(exc)) from None
        if view is not None:
            self._unconfirmed.discard(group)  # a member already: the record stands
            return {"view": str(view.view_id), "members": list(view.members), **peers}
        return None

    def _op_leave(self, session: Session, request: Request) -> dict[str, Any]:
        group = request.group
        kept = group in self.persistent or group in self.recorded  # recorded: also after the group ended here
        if group not in session.groups and not (request.persist and kept):
            hint = " (a persistent membership ends with a persistent leave)" if kept else ""
            raise RequestError(localapi.NOT_JOINED, f"this client has not joined {group!r}{hint}")
        if request.persist:
            self._unrecord(group)
            self.persistent.discard(group)
        if group in session.groups:
            self._detach(session, group)
        elif group not in self.attached:
            self._leave_group(group)
        return {"daemon_left": group not in self.attached and group not in self.persistent}

    def _op_send(self, session: Session, request: Request) -> dict[str, Any] | None:
        return self._send(session, request, [request.payload])

    def _op_send_batch(self, session: Session, request: Request) -> dict[str, Any] | None:
        """Several messages in one request (the client library coalesces concurrent sends): one answer with
        every sequence number, in order."""
        assert request.payloads is not None
        return self._send(session, request, request.payloads)

    def _send(self, session: Session, request: Request, payloads: list[bytes]) -> dict[str, Any] | None:
        group = request.group
        if not self.loop.is_member(group):
            raise self._not_member(session, group)
        # The engine checks every message before it accepts any (BadArgument): a batch is taken or refused whole.
        # One step: the messages are kept as this client's before the drain can deliver them (a group of one
        # delivers at once).
        with self.loop.one_step():
            seqs = self.loop.send_many(group, payloads, request.qos, request.handler)
            if seqs is not None:
                self.own.sent(group, seqs, request.qos, session)
        if seqs is None:
            raise RequestError(localapi.SEND_REFUSED, f"the daemon is leaving {group!r}")
        self.stats["sends"] += len(seqs)
        self.stats["send_requests"] += 1
        answer = {"seq": seqs[0]} if request.payloads is None else {"seqs": seqs}
        if not self.loop.has_room(group):
            # Accepted and queued in order, but the answer waits until the ring has taken some of the backlog:
            # this is how a client faster than the ring is slowed down.
            self.stats["sends_delayed"] += 1
            self.send_waiters[group].append((session, request.id, answer))
            return None
        return answer

    def _answer_delayed_sends(self) -> None:
        """After each drain: answer parked sends of groups whose backlog went down (or that are gone)."""
        for group in [g for g, waiters in self.send_waiters.items() if waiters and self.loop.has_room(g)]:
            for session, rid, answer in self.send_waiters.pop(group):
                session.push(localapi.ok_reply(rid, answer))

    def _op_call(self, session: Session, request: Request) -> None:
        """Call a group as a non-member (no join needed); answered when the group replies or the call fails."""
        with self.loop.one_step():  # the answer can come at once (our own one-member group): wait for it first
            call_id = self.loop.call(request.group, request.payload, handler=request.handler,
                                      timeout=request.timeout, qos=request.qos)
            self.call_waiters[call_id] = (session, request.id)
        self.stats["calls"] += 1

    def _op_reply(self, session: Session, request: Request) -> dict[str, Any]:
        """A local client answers a call it got as the handler's holder."""
        if not self.loop.reply(request.group, request.caller, request.conn, request.stamp, request.payload):
            raise RequestError(localapi.STALE_CALL, "that call is not waiting for a reply from this daemon")
        return {"sent": True}

    def _call_answered(self, event: CallAnswered) -> None:
        waiter = self.call_waiters.pop(event.call_id, None)
        if waiter is None:
            return
        session, rid = waiter
        if event.error is None:
            session.push(localapi.ok_reply(rid, {"reply": event.reply}))
        else:
            self.stats[f"calls_failed_{event.error}"] += 1
            session.push(localapi.error_reply(rid, localapi.CALL_PREFIX + event.error, event.reason))

    def _call_request(self, event: CallRequest) -> None:
        """Hand a call to the local client holding its handler lock; without one nobody here can answer."""
        owner = self.lock_owner.get((event.group, event.handler))
        if not isinstance(owner, Session):
            self.stats["requests_unserved"] += 1
            log.warning("call to %s handler %d with no local client holding the lock", event.group, event.handler)
            return
        owner.push(localapi.call_request_event(event.group, event.caller, event.conn, event.stamp, event.handler,
                                               event.payload, str(event.view)))

    def _op_members(self, session: Session, request: Request) -> dict[str, Any]:
        view = self.loop.view(request.group)
        if view is None:
            raise self._not_member(session, request.group)
        return {"view": str(view.view_id), "members": list(view.members),
                "unicast_only": sorted(view.unicast_only), "locks": [list(x) for x in view.locks]}

    def _op_lock(self, session: Session, request: Request) -> dict[str, Any] | None:
        key = (request.group, request.lock)
        owner: Owner = PERSISTENT if request.persist else session
        view = self.loop.view(request.group)
        if view is None:
            raise self._not_member(session, request.group)
        if key in self.lock_owner:
            if self.lock_owner[key] is owner:
                return {"granted": True, "lock": request.lock}
            raise RequestError(localapi.LOCK_HELD, f"lock {request.lock} is held by another client of this daemon")
        if view.lock_holder(request.lock) not in (None, self.loop.pid):
            raise RequestError(localapi.LOCK_HELD, f"lock {request.lock} is held by {view.lock_holder(request.lock)}")
        self._request_lock(session, request, owner, "lock")
        return None

    def _op_unlock(self, session: Session, request: Request) -> dict[str, Any] | None:
        key = (request.group, request.lock)
        owner: Owner = PERSISTENT if request.persist else session
        if key not in self.lock_owner:
            raise RequestError(localapi.NOT_OWNER,
                               f"this daemon does not hold lock {request.lock} of {request.group!r}")
        if self.lock_owner[key] is not owner:
            raise RequestError(localapi.NOT_OWNER, f"lock {request.lock} belongs to another client of this daemon"
                               + ("" if request.persist else " (use a persistent unlock for `rmp lock` locks)"))
        self._request_lock(session, request, owner, "unlock")
        return None

    def _request_lock(self, session: Session, request: Request, owner: Owner, op: str) -> None:
        """One request per lock and operation in flight (``LockRequests``): a second client asking meanwhile is
        refused with lock-held."""
        try:
            self.locks.request(request.group, request.lock, op, (session, request.id), owner)
        except LockBusy as exc:
            raise RequestError(localapi.LOCK_HELD, str(exc)) from None

    # ------------------------------------------------------------------------------------------------------------
    # Events from the engine, in order

    def handle_events(self, events: list[Event]) -> None:
        """One drain's events, in order; then what the drain changed: deliveries pushed, parked sends answered,
        readers behind checked."""
        deliveries = self.deliveries
        me = self.loop.pid
        for event in events:
            if type(event) is Delivered:
                # Gathered and sent as one frame per group after the drain: a busy group costs one frame per
                # batch.  A packet's messages travel as one run: its fields once, then its payloads (from 0).
                deliveries[event.group].append(DeliveryRun(event.src, event.seq, qos_name(event.qos), event.ts,
                                                           view_name(event.view), event.handler, 0, event.payloads,
                                                           event.answer))
                if event.src == me:
                    self.own.delivered(event.group, event.seq, event.qos)
            else:
                self._send_deliveries(event.group)  # whatever was delivered before this event goes first
                self.on_event(event)
        if deliveries:
            self._send_deliveries()
        self._answer_delayed_sends()
        self._check_overrun()

    def on_event(self, event: Event) -> None:
        """An event other than a delivery."""
        if isinstance(event, ViewInstalled):
            members = list(event.members)
            self._fan_out(event.group, localapi.view_event(event.group, str(event.view), members, event.ts))
            if self.loop.is_member(event.group):
                self._unconfirmed.discard(event.group)  # the persistent join took effect: its record stands
            self.app.view_installed(event)
            for (group, lock), owner in list(self.lock_owner.items()):
                if group == event.group and self.loop.pid in members and owner is None:
                    self._release(group, lock)
        elif isinstance(event, LockResult):
            self._lock_result(event)
        elif isinstance(event, CallAnswered):
            self._call_answered(event)
        elif isinstance(event, CallRequest):
            self._call_request(event)
        elif isinstance(event, StatusAsked):
            self.gatherer.asked(event)
        elif isinstance(event, StatusGathered):
            self.gatherer.gathered(event)
        elif isinstance(event, Left | JoinFailed):
            self._gone(event)
        elif isinstance(event, Undelivered):
            self.stats["undelivered"] += len(event.seqs)
            log.warning("%d message(s) of %s not delivered here (%s): seqs %s", len(event.seqs), event.group,
                        event.reason, ", ".join(map(str, event.seqs[:20])))
            self._report_undelivered(event.group, event.reason, event)
        elif isinstance(event, SendRefused):
            self.stats["sends_refused"] += 1
            log.warning("send refused in %s: %s", event.group, event.reason)

    def _send_deliveries(self, group: str | None = None) -> None:
        """Push gathered deliveries (of one group, or of all) to the group's clients, in delivery order."""
        for name in [group] if group is not None else list(self.deliveries):
            runs = self.deliveries.pop(name, [])
            start = size = 0
            for i, run in enumerate(runs):
                size += sum(map(len, run.payloads))
                if size >= DELIVERY_FRAME_BYTES or i == len(runs) - 1:
                    self._fan_out_runs(name, runs[start:i + 1])
                    start, size = i + 1, 0

    def _fan_out_runs(self, group: str, runs: list[DeliveryRun]) -> None:
        """One deliveries frame to the group's clients; where this process is to answer a message (it holds the
        handler's lock), the client holding the lock gets a frame of its own that says so, the others one that
        does not."""
        if not any(run.answer for run in runs):
            self._fan_out(group, localapi.deliveries_event(group, runs))
            return
        for session in self.attached.get(group, ()):
            mine = [run if not run.answer or self.lock_owner.get((group, run.handler)) is session
                    else run._replace(answer=False) for run in runs]
            session.push_encoded(encode_frame(localapi.deliveries_event(group, mine)))

    def _check_overrun(self) -> None:
        """A group with a client more than ``overrun_frames`` (or OVERRUN_BYTES) behind stops accepting the token
        until the client catches up (section 4.6), rather than letting the client fall further behind.  A client
        still behind after OVERRUN_GRACE seconds is cut off as a slow consumer: one stuck reader must not stall the
        ring until the others declare this daemon failed."""
        if not self.app.overrun and all(s.queued_frames <= self.overrun_frames and s.queued_bytes <= OVERRUN_BYTES
                                        for s in self.sessions):
            return  # nobody is behind and no group holds the token back: the common case, checked cheaply
        self.app.check_overrun(list(self.attached.keys() | self.app.overrun.keys()),
                               lambda group: bool(self._clients_behind(group)), self._cut_clients_behind)

    def _clients_behind(self, group: str) -> list[Session]:
        return [s for s in self.attached.get(group, ()) if not s.closed and (
            s.queued > self.overrun_frames or s.queued_bytes > OVERRUN_BYTES)]

    def _cut_clients_behind(self, group: str) -> None:
        for session in self._clients_behind(group):
            session.cut(localapi.SLOW_CONSUMER, f"held the group {group!r} back for {OVERRUN_GRACE:g} s")
            self.stats["overrun_cut"] += 1

    def _client_caught_up(self) -> None:
        """After a write to a client: a group it held back may take the token again (drained as one step).  A
        write only shortens a queue, so with no group held back there is nothing to check."""
        if not self.app.overrun:
            return
        with self.loop.one_step():
            self._check_overrun()

    def _fan_out(self, group: str, message: dict[str, Any]) -> None:
        """One frame to every client of ``group``, encoded once for all of them."""
        sessions = list(self.attached.get(group, ()))
        if not sessions:
            return
        frame = encode_frame(message)
        for session in sessions:
            session.push_encoded(frame)

    def _lock_result(self, event: LockResult) -> None:
        key = (event.group, event.lock)
        waiters = self.locks.answered(event)
        if event.op == "lock" and event.granted:
            owner = waiters[0][1] if waiters else None
            if isinstance(owner, Session) and owner.closed:
                owner = None
            self.lock_owner[key] = owner  # type: ignore[assignment]
            if owner is None:
                self._release(*key)
        elif event.op == "unlock" and event.granted:
            self.lock_owner.pop(key, None)
        for (session, rid), _owner in waiters:
            if event.granted:
                session.push(localapi.ok_reply(rid, {"granted": True, "lock": event.lock}))
            else:
                session.push(localapi.error_reply(rid, localapi.LOCK_DENIED,
                                                  f"{event.op} of lock {event.lock} was refused by the group"))

    def _report_undelivered(self, group: str, reason: str, named: Undelivered | None = None) -> None:
        """The membership of ``group`` ended: tell each client attached to it which of the messages it sent were
        not delivered here (``named`` by the engine as never ordered, or ordered and not delivered here yet)."""
        per_client, unclaimed = self.own.ended(group, named)
        attached = self.attached.get(group, set())
        for session, seqs in per_client.items():
            if session in attached:
                self.stats["undelivered_reported"] += len(seqs)
                session.push(localapi.undelivered_event(group, list(seqs), reason))
        if unclaimed:
            self.stats["undelivered_unclaimed"] += unclaimed  # relayed calls, or clients gone meanwhile

    def _gone(self, event: Left | JoinFailed) -> None:
        group = event.group
        if isinstance(event, Left):
            self._report_undelivered(group, event.reason)  # ordered, not delivered here (usually nothing)
        if isinstance(event, Left) and event.rejoining:
            # Cut off or merged: the process joins again by itself, and the clients stay in the group, told so
            # now; the view that follows tells them where they are.  Locks do not survive the membership that
            # held them.
            log.warning("membership of %s ended (%s); rejoining", group, event.reason)
            self.stats["rejoins"] += 1
            self.app.membership_ended(event)
            self._fan_out(group, localapi.rejoining_event(group, event.reason))
            for session, rid in self.locks.ended(group):
                session.push(localapi.error_reply(rid, localapi.LEFT, f"left {group!r}: {event.reason}"))
            for key in [k for k in self.lock_owner if k[0] == group]:
                del self.lock_owner[key]
            return
        if self.app.ended(event):
            return  # someone asked to join while the daemon was still finishing its leave: joined again
        for session, rid in self.locks.ended(group):
            session.push(localapi.error_reply(rid, localapi.LEFT, f"left {group!r}: {event.reason}"))
        for key in [k for k in self.lock_owner if k[0] == group]:
            del self.lock_owner[key]
        if not self.shutting_down:  # at shutdown each client is told once, shutting-down (close_sessions)
            self._fan_out(group, localapi.left_event(group, event.reason))
        for session in self.attached.pop(group, set()):
            session.groups.discard(group)
        self.persistent.discard(group)
        if isinstance(event, JoinFailed) and group in self._unconfirmed:
            # The persistent join that recorded the group never took effect (its client was told join-failed):
            # nothing to rejoin at the next start.  A group that was left keeps its record: the daemon was a
            # member on the operator's behalf, and the next start rejoins it.
            try:
                self._unrecord(group)
            except RequestError as exc:
                log.error("%s", exc.message)

    # ------------------------------------------------------------------------------------------------------------

    def leave_all(self) -> None:
        """Shutdown: refuse new requests and leave every group."""
        self.shutting_down = self.app.stopping = True
        for group in self.loop.groups():
            self._leave_group(group)

    def close_sessions(self, message: str) -> None:
        """Shutdown, once the groups are left: every client gets what is queued for it (the deliveries before the
        leave), then one ``shutting-down`` error, the reason its connection ends, instead of a ``left`` per
        group that would read as if the group had gone."""
        for session in list(self.sessions):
            session.push(localapi.error_reply(None, localapi.SHUTTING_DOWN, message))
            session.finish()

    async def sessions_gone(self) -> None:
        """Return once no client is connected (after :meth:`close_sessions`, when each has been sent its last
        frame)."""
        while self.sessions:
            self._sessions_changed = trio.Event()
            await self._sessions_changed.wait()
