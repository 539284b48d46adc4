"""The local API: everything the daemon and its clients must agree on, in one module both import.

A frame is a 4-byte big-endian length, then one msgpack map.  A client sends requests (``op``, ``id`` and the
fields of :data:`OPS`); the daemon answers each with ``{"id", "ok": True, ...}`` or a structured error
``{"id", "error": code, "message"}`` (the codes below), and pushes events (``{"event": kind, "group", ...}``) in
the order its process produced them.  A group's deliveries travel as the engine's ``Delivered`` events, one run
per packet delivered, which a client reads with :func:`decode_deliveries_untrusted`.  Bytes from the other end
are untrusted: anything that is not a well-formed frame or request surfaces as :class:`FrameError` or
:class:`RequestError` only, with the code the daemon sends back.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import trio

from rmpd.protocol.events import Delivered
from rmpd.protocol.fieldkinds import MAX_KEY as MAX_KEY  # what a key holds at most, for clients of this API
from rmpd.protocol.fieldkinds import well_formed_keys
from rmpd.protocol.limits import BadArgument, check_call_handler, check_handler, check_lock
from rmpd.protocol.qos import QoS
from rmpd.protocol.reformation import MIN_PARTITION_ALL, MIN_PARTITION_MAJORITY

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------------------------
# Where the daemon listens

SYSTEM_SOCKET = Path("/run/rmpd/rmpd.sock")
"""Where the systemd unit (RuntimeDirectory=rmpd) puts the socket; clients look there last."""


def default_socket_path() -> Path:
    """$XDG_RUNTIME_DIR/rmpd.sock, else /tmp/rmpd-<uid>.sock: a place the user can write without privileges."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "rmpd.sock"
    return Path("/tmp") / f"rmpd-{os.getuid()}.sock"


def client_socket_path() -> Path:
    """The socket a client uses with no explicit path: $RMPD_SOCKET, the per-user default, or the system one."""
    env = os.environ.get("RMPD_SOCKET")
    if env:
        return Path(env)
    path = default_socket_path()
    if not path.exists() and SYSTEM_SOCKET.exists():
        return SYSTEM_SOCKET
    return path


# ----------------------------------------------------------------------------------------------------------------
# Error codes: every refused request is answered ``{"error": code, "message": text}``

BAD_FRAME = "bad-frame"
FRAME_TOO_LARGE = "frame-too-large"
BAD_REQUEST = "bad-request"
UNKNOWN_OP = "unknown-op"
NOT_MEMBER = "not-member"
NOT_JOINED = "not-joined"
JOIN_FAILED = "join-failed"
AUTH_REQUIRED = "auth-required"
"""A join of a group whose traffic is sealed with an auth key, by a process that has none (docs/security.md)."""
ENCRYPTION_MISMATCH = "encryption-mismatch"
"""A join of a group whose members' encrypt setting is not this process's (docs/security.md)."""
SEND_REFUSED = "send-refused"
MESSAGE_TOO_LARGE = "message-too-large"
LOCK_HELD = "lock-held"
NOT_OWNER = "not-owner"
LOCK_DENIED = "lock-denied"
LEFT = "left"
SLOW_CONSUMER = "slow-consumer"
SHUTTING_DOWN = "shutting-down"
STATE_UNWRITABLE = "state-unwritable"
"""A persistent join or leave the daemon could not record in its state directory (nothing was changed)."""
INTERNAL = "internal"
CALL_PREFIX = "call-"
"""A failed call: ``call-`` plus the code of rmpd.protocol.calls.CALL_ERRORS (call-timeout, call-unknown, ...)."""
STALE_CALL = "stale-call"
BAD_KEY = "bad-key"
"""A message key the group cannot take: on a QoS below total order, empty, or over MAX_KEY bytes
(``rmpd.protocol.limits.check_keyed``)."""


class RequestError(Exception):
    """A request the daemon refuses; becomes one structured error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ----------------------------------------------------------------------------------------------------------------
# Frames

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 17 * 1024 * 1024
"""Room for the largest message (16 MiB, ``EngineConfig.max_message``) and its request fields."""


class FrameError(Exception):
    """A frame that cannot be used.  ``fatal`` frames leave the stream unusable (the length could not be trusted)."""

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal


def encode_frame(obj: dict[str, Any]) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def decode_body_untrusted(body: bytes | bytearray) -> dict[str, Any]:
    """One frame body to a dict with string keys, or FrameError."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for hostile input; all mean the same here
        raise FrameError(BAD_FRAME, f"frame is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise FrameError(BAD_FRAME, f"a frame must be a map, got {type(obj).__name__}")
    if not all(isinstance(k, str) for k in obj):
        raise FrameError(BAD_FRAME, "frame keys must be strings")
    return obj


class FrameReader:
    """Reads whole frames from a trio stream, refusing any announced length above ``max_frame``."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self.max_frame = max_frame
        self._buffer = bytearray()

    async def _fill(self, n: int) -> bool:
        while len(self._buffer) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def read(self) -> dict[str, Any] | None:
        """The next frame, None at a clean end of stream; FrameError for a bad one."""
        if not await self._fill(HEADER.size):
            if self._buffer:
                raise FrameError(BAD_FRAME, "stream ended inside a frame header", fatal=True)
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame:
            raise FrameError(FRAME_TOO_LARGE, f"frame of {length} bytes exceeds the limit of {self.max_frame}",
                             fatal=True)
        if not await self._fill(HEADER.size + length):
            raise FrameError(BAD_FRAME, "stream ended inside a frame", fatal=True)
        body = self._buffer[HEADER.size:HEADER.size + length]  # one copy; msgpack reads a bytearray as well
        del self._buffer[:HEADER.size + length]
        return decode_body_untrusted(body)


# ----------------------------------------------------------------------------------------------------------------
# The minimum partition, as people and programs name it

MIN_PARTITION_NAMES: dict[str, int] = {"majority": MIN_PARTITION_MAJORITY, "all": MIN_PARTITION_ALL}
"""The two minimum partitions that are no fixed number, by the names the CLI, the local API, the client library
and the config use (the protocol encodes them as 0 and 0xFFFF)."""
DEFAULT_MIN_PARTITION = 1
"""What a join that names no minimum partition asks for: the group goes on in any partition (the view keeps the
stricter of the group's and the joiner's, see ``rmpd.protocol.membership``)."""
MAX_MIN_PARTITION = MIN_PARTITION_ALL - 1
"""The largest fixed minimum partition: 0xFFFF already means ``all``."""


def parse_min_partition(value: int | str) -> int:
    """A minimum partition as every public interface takes it, to the protocol's encoding.

    The public form is ``"majority"`` (of the old view), ``"all"`` (every member of the old view: any failure stops
    the group) or a whole number 1..65534 (an int, or its digits as text, as a command line gives it).  The
    protocol's own encoding (0 for majority) is refused on purpose: 0 reads as "no minimum", the opposite of what
    it means, so one spelling is accepted and nobody has to remember which number is which.  ValueError, with a
    message fit for one line, for anything else."""
    number: int | None = None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in MIN_PARTITION_NAMES:
            return MIN_PARTITION_NAMES[text]
        if text.isascii() and text.isdigit():
            number = int(text) if len(text) <= 12 else MAX_MIN_PARTITION + 1  # int() refuses very long digit strings
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    if number is None or not 1 <= number <= MAX_MIN_PARTITION:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        hint = " (for a majority say 'majority')" if number == 0 else ""
        raise ValueError(f"min_partition must be 'majority', 'all' or a whole number from 1 to "
                         f"{MAX_MIN_PARTITION}, got {shown}{hint}")
    return number


def min_partition_name(value: int) -> int | str:
    """The protocol's encoding back to the public form: ``"majority"``, ``"all"`` or the number."""
    if value == MIN_PARTITION_MAJORITY:
        return "majority"
    if value >= MIN_PARTITION_ALL:
        return "all"
    return value


# ----------------------------------------------------------------------------------------------------------------
# Requests: one table of operations and the fields each takes, checked once here so the daemon's handlers
# only ever see a well-formed Request

MAX_GROUP_NAME = 255
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (C0, DEL, C1) and the Unicode line and paragraph separators."""


def check_group_name(name: str) -> None:
    """ValueError (one line) for a name no group may have: empty, over MAX_GROUP_NAME characters, or holding a
    control character or line break.  A group's name is written into log lines, ``rmp status`` and journals, where
    such a character would split or forge a line."""
    if not 0 < len(name) <= MAX_GROUP_NAME:
        raise ValueError(f"group name must be 1..{MAX_GROUP_NAME} characters")
    bad = _LINE_BREAKING.search(name)
    if bad is not None:
        raise ValueError(f"group name must hold no control characters or line breaks; {name[:64]!r} has "
                         f"{bad.group()!r} at {bad.start()}")


MAX_BATCH = 4096
"""Messages one send_batch request may carry."""
MAX_CALL_TIMEOUT = 3600.0


@dataclass
class Request:
    op: str
    id: Any = None
    group: str = ""
    payload: bytes = b""
    payloads: list[bytes] | None = None
    qos: QoS = QoS.TOTAL
    handler: int | None = None
    lock: int = 0
    ttl: int | None = None
    min_partition: int | None = None
    """In the protocol's encoding (:func:`parse_min_partition` has turned the public form into it); None: not
    given."""
    persist: bool = False
    existing_only: bool = False
    via: str | None = None
    """A member's process ID that multicasts for this daemon in the group (explicit naming, paper 3.3)."""
    state: bool = False
    """The client takes part in the group's state transfer (it joins with ``state=True``)."""
    all: bool = False
    """``status`` of one group: gather every member's status through the group (``rmp status G --all``)."""
    timeout: float = 5.0
    caller: str = ""
    conn: int = 0
    stamp: int = 0
    key: bytes | None = None
    """``send``: the message's key (the group delivers a key at most once)."""
    keys: list[bytes] | None = None
    """``send_batch``: one key per payload."""
    post_id: int | None = None
    """The client library's number for the first message (the next ones follow in order): messages posted
    without a key have no other name the client knows, so ``undelivered`` names them by it."""

    def idents(self, count: int) -> list[bytes | int] | None:
        """What ``undelivered`` names the request's ``count`` messages by: their keys, their post numbers, or
        nothing (the sequence numbers the answer gave)."""
        if self.keys is not None:
            return list(self.keys)
        if self.key is not None:
            return [self.key]
        if self.post_id is not None:
            return list(range(self.post_id, self.post_id + count))
        return None


# op -> (required fields, optional fields)
OPS: dict[str, tuple[set[str], set[str]]] = {
    "hello": (set(), set()),
    "status": (set(), {"group", "all", "timeout"}),
    "join": ({"group"}, {"ttl", "min_partition", "persist", "existing_only", "via", "state"}),
    "leave": ({"group"}, {"persist"}),
    "send": ({"group", "payload"}, {"qos", "handler", "key", "post_id"}),
    "send_batch": ({"group", "payloads"}, {"qos", "handler", "keys", "post_id"}),
    "members": ({"group"}, set()),
    "lock": ({"group", "lock"}, {"persist"}),
    "unlock": ({"group", "lock"}, {"persist"}),
    "call": ({"group", "payload"}, {"handler", "timeout", "qos"}),
    "reply": ({"group", "caller", "conn", "stamp", "payload"}, set()),
}

FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "group": (str,), "all": (bool,), "payload": (bytes,), "payloads": (list,), "qos": (str,),
    "handler": (int, type(None)),
    "lock": (int,), "ttl": (int, type(None)), "min_partition": (int, str, type(None)), "persist": (bool,),
    "existing_only": (bool,), "via": (str, type(None)), "state": (bool,), "timeout": (int, float),
    "caller": (str,), "conn": (int,), "stamp": (int,), "key": (bytes,), "keys": (list,), "post_id": (int,),
}


def parse_request(frame: dict[str, Any]) -> Request:
    rid = frame.get("id")
    if rid is not None and (not isinstance(rid, int | str) or isinstance(rid, bool)):
        raise RequestError(BAD_REQUEST, "id must be an integer or a string")
    op = frame.get("op")
    if not isinstance(op, str):
        raise RequestError(BAD_REQUEST, "every request needs an 'op' string")
    if op not in OPS:
        raise RequestError(UNKNOWN_OP, f"unknown op {op[:64]!r}; known: {', '.join(sorted(OPS))}")
    required, optional = OPS[op]
    fields = set(frame) - {"op", "id"}
    missing = required - fields
    if missing:
        raise RequestError(BAD_REQUEST, f"{op} needs {', '.join(sorted(missing))}")
    extra = fields - required - optional
    if extra:
        raise RequestError(BAD_REQUEST, f"{op} does not take {', '.join(sorted(extra))}")
    values: dict[str, Any] = {}
    for name in fields:
        value = frame[name]
        types = FIELD_TYPES[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise RequestError(BAD_REQUEST, f"{name} must be {' or '.join(t.__name__ for t in types)}, "
                                                   f"got {type(value).__name__}")
        values[name] = value
    if "group" in values:
        try:
            check_group_name(values["group"])
        except ValueError as exc:
            raise RequestError(BAD_REQUEST, str(exc)) from None
    if "qos" in values:
        try:
            values["qos"] = QoS.parse(values["qos"])
        except ValueError as exc:
            raise RequestError(BAD_REQUEST, str(exc)) from None
    if "payloads" in values:
        payloads = values["payloads"]
        if not 0 < len(payloads) <= MAX_BATCH or not all(type(p) is bytes for p in payloads):
            raise RequestError(BAD_REQUEST, f"payloads must be a list of 1..{MAX_BATCH} byte strings")
    if values.get("ttl") is not None and not 0 <= values["ttl"] <= 255:
        raise RequestError(BAD_REQUEST, "ttl must be 0..255")
    if values.get("min_partition") is not None:
        try:
            values["min_partition"] = parse_min_partition(values["min_partition"])
        except ValueError as exc:
            raise RequestError(BAD_REQUEST, str(exc)) from None
    if op == "call" and "handler" not in values:
        values["handler"] = 0  # a call goes to handler 0 unless it names another (or None: no handler)
    if "timeout" in values and not 0 < values["timeout"] <= MAX_CALL_TIMEOUT:
        raise RequestError(BAD_REQUEST, f"timeout must be in (0, {MAX_CALL_TIMEOUT}] seconds")
    try:
        (check_call_handler if op == "call" else check_handler)(values.get("handler"))
        if "lock" in values:
            check_lock(values["lock"])
    except BadArgument as exc:
        raise RequestError(BAD_REQUEST, str(exc)) from None
    for name in ("conn", "stamp", "post_id"):
        if name in values and values[name] < 0:
            raise RequestError(BAD_REQUEST, f"{name} must be non-negative")
    _check_keys(values)
    return Request(op=op, id=rid, **values)


def _check_keys(values: dict[str, Any]) -> None:
    """A batch's keys are one per payload.  What a key may be is the engine's rule, checked once, when the daemon
    hands the messages over (``rmpd.protocol.limits.check_keys``: refused whole with ``bad-key``)."""
    if "keys" in values and len(values["keys"]) != len(values["payloads"]):
        raise RequestError(BAD_REQUEST, "keys must be a list of byte strings, one per payload")


# ----------------------------------------------------------------------------------------------------------------
# Pushed events

EVENT_DELIVERIES = "deliveries"
EVENT_VIEW = "view"
EVENT_LEFT = "left"
EVENT_REQUEST = "request"
EVENT_UNDELIVERED = "undelivered"
"""Messages of this client that the daemon will not see delivered: its membership of the group ended first."""
EVENT_ALREADY_DELIVERED = "already-delivered"
"""A keyed message of this client that the group dropped: it had delivered that key already."""
EVENT_REJOINING = "rejoining"
"""The daemon's membership of the group ended without a leave; it joins again by itself and the client stays."""
MAX_REPORTED_SEQS = 1 << 20
"""Sequence numbers one ``undelivered`` event may carry: far above what a group's send backlog holds, and a bound
on what a hostile daemon can make a client build."""


def deliveries_event(group: str, delivered: list[Delivered],
                     answers: Callable[[Delivered], bool] | None = None) -> dict[str, Any]:
    """The ``deliveries`` event of the engine's ``delivered`` packets: each packet's fields as the engine made them,
    one array per packet.  The QoS travels as its code (one integer, as in a datagram) and the view as its ID's
    array ``[creator, counter]``: nothing is turned into text to be parsed back.  A keyed packet's run has a tenth
    field, its messages' keys (one per payload); an unkeyed one's has nine, as before keys.  ``answers``: whether
    the client this frame goes to is the one to answer a packet (default: as the engine said,
    ``Delivered.answer``)."""
    runs: list[tuple[Any, ...]] = []
    for d in delivered:
        answer = d.answer if answers is None else answers(d)
        if d.keys is None:
            runs.append((d.src, d.seq, d.qos.code(), d.ts, d.view, d.handler, 0, d.payloads, answer))
        else:
            runs.append((d.src, d.seq, d.qos.code(), d.ts, d.view, d.handler, 0, d.payloads, answer, d.keys))
    return {"event": EVENT_DELIVERIES, "group": group, "runs": runs}


RunTaker = Callable[[str, int, QoS, "int | None", str, "int | None", int, list[bytes], bool, "list[bytes] | None"],
                    list[T]]
"""Takes one delivered packet's run as read from a ``deliveries`` event: source (``ip:port``), seq, QoS,
timestamp, view ID (``creator-ip:port/counter``), handler, the index of its first payload within the packet (0:
the whole packet), its payloads, whether this client is the one to answer them (it holds the handler's lock,
paper 3.3), and their keys (one per payload; None for a packet without keys); returns what the client makes of
them."""


def decode_deliveries_untrusted(runs: Any, take: RunTaker[T]) -> list[T]:
    """A ``deliveries`` event's runs, each handed to ``take`` as it is read (the client makes its deliveries there,
    with no shape in between), or FrameError when they are not a list of runs of nine or ten fields with a QoS
    code and a view ID (and, in the tenth, one key per payload), or ``take`` refuses a field's type.  On the wire
    a run is a msgpack array of those fields in that order, with the QoS as its code and the view as
    ``[creator, counter]``: a packet of many small messages costs its identity once.  A frame's runs are of one
    group, nearly always of one view and few QoS levels: the QoS and the view are read again only where they
    differ from the run before."""
    decoded: list[T] = []
    code_before: Any = None
    view_before: Any = None
    qos, view_id = QoS.TOTAL, ""
    try:
        for run in runs:
            if len(run) == 9:
                source, seq, code, ts, view, handler, first, payloads, answer = run
                keys = None
            else:
                source, seq, code, ts, view, handler, first, payloads, answer, keys = run
                if type(keys) is not list or len(keys) != len(payloads) or not well_formed_keys(keys):
                    raise ValueError("not one key per payload")
            if code != code_before:
                qos, code_before = QoS.from_code(code), code
            if view != view_before:
                creator, counter = view
                if type(creator) is not str or type(counter) is not int:
                    raise ValueError("not a view ID")
                view_id, view_before = f"{creator}/{counter}", view
            decoded += take(source, seq, qos, ts, view_id, handler, first, payloads, answer, keys)
    except (TypeError, ValueError):  # not a list, a run of another length, no QoS code, no view ID
        raise FrameError(BAD_FRAME, "deliveries must be a list of runs of nine or ten fields, each with a QoS code "
                                    "and a view ID, and one key per payload in the tenth") from None
    return decoded


def view_event(group: str, view: str, members: list[str], ts: int | None) -> dict[str, Any]:
    return {"event": EVENT_VIEW, "group": group, "view": view, "members": members, "ts": ts}


def left_event(group: str, reason: str) -> dict[str, Any]:
    return {"event": EVENT_LEFT, "group": group, "reason": reason}


def undelivered_event(group: str, seqs: list[int], reason: str,
                      ids: list[bytes | int] | None = None) -> dict[str, Any]:
    """``seqs``: the sequence numbers this client's ``send`` and ``send_batch`` requests were answered with;
    ``ids``: the same messages' keys, and the post numbers (``post_id``) of those sent without a key, where the
    request gave them."""
    event: dict[str, Any] = {"event": EVENT_UNDELIVERED, "group": group, "seqs": seqs, "reason": reason}
    if ids:
        event["ids"] = ids
    return event


def decode_ids_untrusted(ids: Any) -> tuple[bytes | int, ...]:
    """An ``undelivered`` event's ``ids`` (none in a frame without them), or FrameError when they are not a list of
    keys (byte strings) and post numbers (non-negative whole numbers)."""
    if ids is None:
        return ()
    if (not isinstance(ids, list) or len(ids) > MAX_REPORTED_SEQS
            or not all(type(i) is bytes or (type(i) is int and i >= 0) for i in ids)):
        raise FrameError(BAD_FRAME, "ids must be a list of keys and non-negative post numbers")
    return tuple(ids)


def already_delivered_event(group: str, key: bytes, ts: int, view: str) -> dict[str, Any]:
    """To the client that sent a keyed message the group dropped: the group had delivered ``key`` already, at
    timestamp ``ts`` in view ``view`` (``creator-ip:port/counter``)."""
    return {"event": EVENT_ALREADY_DELIVERED, "group": group, "key": key, "ts": ts, "view": view}


def decode_seqs_untrusted(seqs: Any) -> tuple[int, ...]:
    """An ``undelivered`` event's sequence numbers, or FrameError when they are not a list of whole numbers."""
    if (not isinstance(seqs, list) or len(seqs) > MAX_REPORTED_SEQS
            or not all(type(seq) is int and seq >= 0 for seq in seqs)):
        raise FrameError(BAD_FRAME, "seqs must be a list of non-negative integers")
    return tuple(seqs)


def rejoining_event(group: str, reason: str) -> dict[str, Any]:
    return {"event": EVENT_REJOINING, "group": group, "reason": reason}


STATE_GONE = "gone"
"""The kind of the state-transfer message (handler ``LIBRARY_HANDLER``, rmpd.client.state) by which a daemon tells
a group that one of its clients taking part left it."""


def state_participant_gone(pid: str, client: int) -> bytes:
    """The payload a daemon multicasts, totally ordered, when its client ``client`` (the number its ``hello`` was
    answered with) that joined ``state`` leaves a group the daemon stays in: for the group's programs, that
    participant's going is what a member's leaving the view is for a daemon's, ordered the same for all."""
    return msgpack.packb([STATE_GONE, pid, client], use_bin_type=True)


def call_request_event(group: str, caller: str, conn: int, stamp: int, handler: int, payload: bytes,
                       view: str) -> dict[str, Any]:
    return {"event": EVENT_REQUEST, "group": group, "caller": caller, "conn": conn, "stamp": stamp,
            "handler": handler, "payload": payload, "view": view}


# ----------------------------------------------------------------------------------------------------------------
# Replies


def ok_reply(rid: Any, fields: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "ok": True, **fields}


def error_reply(rid: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": rid, "error": code, "message": message}
