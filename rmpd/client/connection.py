"""A connection to the local rmpd over its Unix socket (see docs/operations.md, "Local API").

One reader task takes every frame from the daemon: replies wake the request that waits for them (matched by id),
pushed events go to their Group's queue.  When a group's reader falls behind, the reader task waits for it, the
socket fills, and the daemon cuts the connection with ``slow-consumer``: the program then sees ConnectionLost.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from rmpd import localapi
from rmpd.localapi import DEFAULT_MAX_FRAME, FrameError, FrameReader, client_socket_path, encode_frame
from rmpd.protocol.calls import CALL_ERRORS, CALL_GRACE, DEFAULT_CALL_TIMEOUT
from rmpd.protocol.config import EngineConfig
from rmpd.protocol.limits import MessageTooLarge, check_message_size
from rmpd.protocol.qos import QoS
from rmpd.protocol.view import LIBRARY_HANDLER

from .backend import Participant
from .batching import Coalescer, Poster, SendBatch
from .errors import ConnectionLost, RmpdError, check_group_name_here, single_error
from .events import AlreadyDelivered, CallRequest, Delivery, Rejoining, Undelivered, ViewChange, deliveries_of
from .group import Group, GroupInbox
from .joinonce import JoinOnce


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None


FRAME_ROOM = DEFAULT_MAX_FRAME - 64 * 1024
"""The largest payload a request frame can carry with room for its other fields: a larger one, sent, would be
answered frame-too-large with the connection closed, ending every group on it."""


class Client:
    """Requests to the daemon, and the groups this connection has joined.

    It is the :class:`rmpd.client.backend.Backend` of those groups: ``send``, ``post``, ``flush``, ``members``,
    ``lock``, ``leave`` and the rest take a group's name and are what its :class:`Group` calls; programs use the
    Group."""

    def __init__(self, stream: trio.SocketStream, path: Path) -> None:
        self.path = path
        self._stream = stream
        self._send_lock = trio.StrictFIFOLock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._groups: dict[str, tuple[Group, GroupInbox]] = {}
        """Each joined group, with its inbox (the reader task feeds it)."""
        self._lost: ConnectionLost | None = None
        self._poster = Poster(self._send_batch)
        self._coalescer = Coalescer(self._poster, self._hand_over)
        self._limits: EngineConfig | None = None
        """max_message and max_packet as the daemon said (``hello``)."""
        self._always_fits = 0
        """A payload up to this size passes every size check, whatever its QoS."""
        self._join_once = JoinOnce()
        self._pid = ""
        """The daemon's process ID (``hello``): the state transfer tells its own requests apart by it."""
        self._number = 0
        """This connection's number at the daemon (``hello``): with the process ID, it names this program's offers
        of state, and the daemon names it when the program leaves a group."""

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; RmpdError carries the daemon's structured error."""
        return await self._answer_to(await self._submit(op, **fields))

    async def _submit(self, op: str, **fields: Any) -> _Pending:
        """Write one request frame; what its answer will arrive in.  Not cancellable: the wait for the write
        lock is bounded by other frames' writes, and a frame cut short would leave the daemon's reader out of
        step for good, failing every later request on the connection."""
        if self._lost is not None:
            raise self._lost
        rid = next(self._ids)
        pending = self._pending[rid] = _Pending()
        frame = encode_frame({"op": op, "id": rid, **fields})
        try:
            with trio.CancelScope(shield=True):
                async with self._send_lock:
                    await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._pending.pop(rid, None)
            raise self._lost or ConnectionLost("connection-lost", "the daemon closed the connection") from None
        return pending

    async def _answer_to(self, pending: _Pending) -> dict[str, Any]:
        """Wait for a submitted request's reply (any number of tasks may wait for one)."""
        await pending.done.wait()
        reply = pending.reply
        if reply is None:
            raise self._lost or ConnectionLost("connection-lost", "the daemon closed the connection")
        if "error" in reply:
            raise RmpdError(str(reply["error"]), str(reply.get("message", "")))
        return reply

    async def join(self, name: str, *, ttl: int | None = None, min_partition: int | str | None = None,
                   persist: bool = False, existing_only: bool = False, state: bool = False,
                   via: str | None = None) -> Group:
        """Join ``name`` (the daemon joins it if needed); returns once the daemon is in a view of the group.

        ``min_partition``: ``"majority"``, ``"all"`` or a whole number (:func:`rmpd.localapi.parse_min_partition`),
        checked here so a bad one costs no round trip.  ``persist``: the daemon keeps the membership after this
        connection ends and rejoins it when it starts again, until a persistent leave (what ``rmp join`` does).
        ``state``: the group's state from a member that provides it is the first event (:class:`State`).  ``via``:
        a member's process ID (``ip:port``) that multicasts for the daemon in this group (explicit naming)."""
        check_group_name_here(name)
        if min_partition is not None:
            try:
                min_partition = localapi.min_partition_name(localapi.parse_min_partition(min_partition))
            except ValueError as exc:
                raise RmpdError(localapi.BAD_REQUEST, str(exc)) from None
        return await self._join_once.run(name, lambda: self._join(name, ttl, min_partition, persist, existing_only,
                                                                  via, state), state)

    async def _join(self, name: str, ttl: int | None, min_partition: int | str | None, persist: bool,
                    existing_only: bool, via: str | None, state: bool) -> Group:
        joined = self._groups.get(name)
        if joined is not None:
            return joined[0]
        inbox = GroupInbox(name)
        group = Group(self, inbox)
        self._groups[name] = group, inbox
        fields: dict[str, Any] = {"group": name, "persist": persist, "existing_only": existing_only}
        if state:
            fields["state"] = True
        if ttl is not None:
            fields["ttl"] = ttl
        if min_partition is not None:
            fields["min_partition"] = min_partition
        if via is not None:
            fields["via"] = via
        try:
            reply = await self.request("join", **fields)
        except BaseException:
            self._groups.pop(name, None)
            raise
        inbox.joined(reply["view"], reply["members"], int(reply.get("state_peers", 0)))
        return group

    async def _learn_limits(self) -> None:
        """The daemon's message limits, so that each send and post is checked before it joins a batch: a message
        the daemon refuses then costs its sender alone, never the messages batched with it."""
        hello = await self.request("hello")
        if "max_message" in hello and "max_packet" in hello:
            self._limits = EngineConfig(max_message=int(hello["max_message"]), max_packet=int(hello["max_packet"]))
            self._always_fits = min(self._limits.max_message, self._limits.max_packet, FRAME_ROOM)
        self._pid = str(hello.get("pid", ""))
        number = hello.get("client")
        self._number = number if type(number) is int else 0

    def _check_size(self, payload: bytes, qos: QoS) -> None:
        if len(payload) <= self._always_fits:  # the common case, on every send and post
            return
        if self._limits is not None:  # the group's limit first: it is the one a person can act on
            try:
                check_message_size(self._limits, payload, qos)
            except MessageTooLarge as exc:
                raise RmpdError(exc.code, str(exc)) from None
        if len(payload) > FRAME_ROOM:
            raise RmpdError("message-too-large", f"a message is at most {FRAME_ROOM} bytes through the daemon's "
                                                 f"socket; this one has {len(payload)}")

    async def status(self) -> dict[str, Any]:
        return await self.request("status")

    async def call(self, group: str, payload: bytes, *, handler: int | None = 0,
                   timeout: float = DEFAULT_CALL_TIMEOUT,
                   qos: QoS = QoS.TOTAL) -> bytes | None:
        """Call ``group`` without joining it: the member holding ``handler``'s lock runs the call at most once and
        its reply is returned (None for ``handler=None``: the call was delivered to every member).  RmpdError
        ``call-timeout``, ``call-unknown``, ``call-too-early`` or ``call-no-handler`` when it fails."""
        check_group_name_here(group)
        fields: dict[str, Any] = {"group": group, "payload": bytes(payload), "handler": handler,
                                  "timeout": float(timeout), "qos": qos.name()}
        pending = await self._submit("call", **fields)
        with trio.move_on_after(float(timeout) + CALL_GRACE):  # the daemon answers by the timeout; never wait on
            return (await self._answer_to(pending))["reply"]
        raise RmpdError("call-timeout", CALL_ERRORS["timeout"])

    async def _reply(self, request: CallRequest, payload: bytes) -> None:
        await self.request("reply", group=request.group, caller=request.caller, conn=request.conn,
                           stamp=request.stamp, payload=payload)

    # Backend of Group

    def participant(self) -> Participant:
        largest = min(self._limits.max_message, FRAME_ROOM) if self._limits is not None else FRAME_ROOM
        return Participant(self._pid, self._number, largest, self._spawn)

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self._poster.nursery is not None
        self._poster.nursery.start_soon(task)

    async def send(self, group: str, payload: bytes, qos: QoS, handler: int | None, key: bytes | None = None) -> int:
        """Sends from concurrent tasks that arrive while one is being prepared travel in one ``send_batch``
        request: same order, one frame and one answer for all (a lone send waits one scheduling step)."""
        self._check_size(payload, qos)
        return await self._coalescer.send(group, payload, qos, handler, key)

    async def _hand_over(self, group: str, batch: SendBatch, qos: QoS, handler: int | None) -> None:
        pending = await self._submit_batch(group, batch.payloads, qos, handler, batch.keys)
        # Every sender in the batch waits for the one answer: one of them cancelled does not fail the others.
        batch.outcome = lambda: self._seqs_of(pending)

    async def _submit_batch(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None,
                            keys: list[bytes] | None = None, post_id: int | None = None) -> _Pending:
        """One request for ``payloads`` (with their ``keys``, or the ``post_id`` of the first), in order (see
        _seqs_of for its answer)."""
        fields: dict[str, Any] = {"group": group, "qos": qos.name()}
        if handler is not None:
            fields["handler"] = handler
        if post_id is not None:
            fields["post_id"] = post_id
        if len(payloads) == 1:
            if keys is not None:
                fields["key"] = keys[0]
            return await self._submit("send", payload=payloads[0], **fields)
        if keys is not None:
            fields["keys"] = keys
        return await self._submit("send_batch", payloads=payloads, **fields)

    async def _seqs_of(self, pending: _Pending) -> list[int]:
        reply = await self._answer_to(pending)
        return [int(reply["seq"])] if "seq" in reply else [int(s) for s in reply["seqs"]]

    async def _send_batch(self, group: str, payloads: list[bytes], qos: QoS, handler: int | None,
                          keys: list[bytes] | None, post_id: int | None) -> list[int]:
        """One request for posted ``payloads``, in order; their sequence numbers."""
        return await self._seqs_of(await self._submit_batch(group, payloads, qos, handler, keys, post_id))

    async def post(self, group: str, payload: bytes, qos: QoS, handler: int | None,
                   key: bytes | None = None) -> bytes | int:
        self._check_size(payload, qos)
        return await self._poster.post(group, payload, qos, handler, key)  # after a loss, it raises the loss

    async def flush(self, group: str) -> None:
        await self._poster.flush(group)

    def posts_pending(self, group: str) -> int:
        return self._poster.pending(group)

    async def members(self, group: str) -> tuple[str, list[str]]:
        reply = await self.request("members", group=group)
        return reply["view"], list(reply["members"])

    async def lock(self, group: str, lock: int, op: str) -> bool:
        return bool((await self.request(op, group=group, lock=lock))["granted"])

    async def leave(self, group: str) -> None:
        """Posts made before the leave go first (as before a send); a refusal among them is raised once left."""
        joined = self._groups.get(group)
        if joined is not None:
            # Ended first: the reader task may be waiting for room in this group's full queue, and the answers
            # to the posts and to the leave come after what it is holding.  Events still queued stay readable.
            joined[1].end()
        try:
            refused = await self._poster.settle(group)
            await self.request("leave", group=group)
        finally:
            self._groups.pop(group, None)
        if refused is not None:
            raise refused

    # Reading

    async def _read_loop(self) -> None:
        reader = FrameReader(self._stream, DEFAULT_MAX_FRAME * 4)
        reason = ConnectionLost("connection-lost", "the daemon closed the connection")
        try:
            while True:
                frame = await reader.read()
                if frame is None:
                    break
                rid = frame.get("id")
                if rid is not None and rid in self._pending:
                    pending = self._pending.pop(rid)
                    pending.reply = frame
                    pending.done.set()
                elif "event" in frame:
                    await self._dispatch(frame)
                elif "error" in frame:
                    reason = ConnectionLost(str(frame["error"]), str(frame.get("message", "")))
        except (FrameError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            reason = ConnectionLost("connection-lost", str(exc))
        finally:
            self._lose(reason)

    async def _dispatch(self, frame: dict[str, Any]) -> None:
        joined = self._groups.get(frame.get("group", ""))
        if joined is None:
            return
        inbox = joined[1]
        name = inbox.name
        kind = frame["event"]
        if kind == localapi.EVENT_DELIVERIES:
            library = False

            def run_of(source: str, seq: int, qos: QoS, ts: int | None, view: str, handler: int | None,
                       first: int, payloads: list[bytes], answer: bool, keys: list[bytes] | None) -> list[Delivery]:
                nonlocal library
                library = library or handler == LIBRARY_HANDLER
                return deliveries_of(name, source, seq, qos, ts, view, handler, payloads, first, answer, keys)

            deliveries = localapi.decode_deliveries_untrusted(frame["runs"], run_of)
            await inbox.deliver(deliveries, library)
        elif kind == localapi.EVENT_VIEW:
            await inbox.tell(ViewChange(frame["view"], tuple(frame["members"]), name))
        elif kind == localapi.EVENT_UNDELIVERED:
            seqs = localapi.decode_seqs_untrusted(frame.get("seqs"))
            ids = localapi.decode_ids_untrusted(frame.get("ids"))
            await inbox.tell(Undelivered(seqs, str(frame.get("reason", "")), name, ids))
        elif kind == localapi.EVENT_ALREADY_DELIVERED:
            key, ts, view = frame.get("key"), frame.get("ts"), frame.get("view")
            if type(key) is not bytes or type(ts) is not int or type(view) is not str:
                raise FrameError(localapi.BAD_FRAME, "already-delivered needs a key, a timestamp and a view")
            await inbox.tell(AlreadyDelivered(key, ts, view, name))
        elif kind == localapi.EVENT_REJOINING:
            await inbox.tell(Rejoining(str(frame.get("reason", "")), name))
        elif kind == localapi.EVENT_REQUEST:
            inbox.call(CallRequest(frame["payload"], frame["caller"], frame["conn"], frame["stamp"],
                                   frame["handler"], name, frame["view"], self._reply))
        elif kind == localapi.EVENT_LEFT:
            self._groups.pop(name, None)
            inbox.end(RmpdError("left", f"left {name!r}: {frame.get('reason', '')}"))

    def _lose(self, reason: ConnectionLost) -> None:
        if self._lost is None:
            self._lost = reason
        self._poster.fail(self._lost)
        for pending in self._pending.values():
            pending.done.set()
        self._pending.clear()
        for _, inbox in self._groups.values():
            inbox.end(reason)
        self._groups.clear()


@asynccontextmanager
async def connect(path: str | Path | None = None) -> AsyncIterator[Client]:
    """``async with rmpd.connect() as client``: a connection to the local daemon ($RMPD_SOCKET or the default)."""
    where = Path(path) if path is not None else client_socket_path()
    try:
        stream = await trio.open_unix_socket(str(where))
    except OSError as exc:
        raise RmpdError("no-daemon", f"cannot reach rmpd at {where}: {exc.strerror or exc} (is rmpd running? start "
                                     f"it with `rmpd`, or run the engine in this program with rmpd.Node)") from None
    client = Client(stream, where)
    try:
        async with stream, trio.open_nursery() as nursery:
            client._poster.nursery = nursery
            nursery.start_soon(client._read_loop)
            await client._learn_limits()
            try:
                yield client
                await client._poster.flush_all()  # posts made must not vanish with the connection
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise single_error(group) from None
