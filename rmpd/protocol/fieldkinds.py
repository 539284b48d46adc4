"""The kinds of field a packet carries: the values (bodies, fragments, relayed calls, call statuses) and, for each
kind, how it goes on the wire and how it is checked and rebuilt from untrusted input (raising only
:class:`DecodeError`).  packets.py declares each packet's fields by kind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from .ids import ProcessId, ViewId, split_process_id
from .qos import QoS

MAX_LIST = 4096
"""Upper bound on any list inside a packet; longer lists are hostile."""

DataId = tuple[ProcessId, int, QoS]
"""Identity of a data packet: (source process, per-source sequence number, QoS)."""


class DecodeError(ValueError):
    """The one error remote bytes can raise: the datagram is not a valid RMP packet."""


class CallStatus(IntEnum):
    """What a Non Member ACK says about the call (conn, stamp) it names."""

    ACK = 0
    """Delivered to the group (and, with a handler, being computed)."""
    REPLY = 1
    """The handler's reply, in ``reply``."""
    UNKNOWN = 2
    """Rejected by the SCMP filter with no state kept: it may have run before (a copy of a forgotten call, or a
    call from before a restart) or be a late fresh one; its fate cannot be told, so it will not run now."""
    TOO_EARLY = 3
    """Stamped after the group's acceptance bound: the sender's clock runs ahead; the same call may be retried."""
    NO_HANDLER = 4
    """No member holds the handler lock the call names (to a probe, with the floor in ``reply`` as for READY)."""
    REPLY_ACK = 5
    """From the caller to the member that replied: the reply arrived, it need not be kept."""
    JOIN_REFUSED = 6
    """To a joiner, about its List Change Request ``stamp`` (the request ID; ``conn`` is 0): the SCMP filter for
    join requests refused it (stamped at or below the group's join floor, or too far ahead of the token site's
    clock).  The group exists: ask again under a new request ID, and do not give up and form a group meanwhile."""
    READY = 7
    """The answer to a probe (a Non Member Data with FLAG_PROBE, never run): the group exists, someone holds the
    handler, and it accepts calls stamped after the floor in ``reply`` (decimal ms): the caller stamps its call
    afresh above it."""


class Fragment(NamedTuple):
    """One piece of a message too large for one datagram: ``first`` on the first piece, ``more`` on all but the
    last."""

    first: bool
    more: bool
    chunk: bytes


class Relayed(NamedTuple):
    """A non-member's call carried into the total order by the member that relays it (section 4.5).

    ``clock`` is the relaying member's clock in ms when it relayed; ``verdict`` its SCMP filter's verdict on the
    call (one of RELAYED_VERDICTS), which every member follows, so the members' verdicts are one (docs/protocol.md,
    "Non-members and SCMP").
    """

    tag: str
    caller: ProcessId
    conn: int
    stamp: int
    flags: int
    clock: int
    payload: bytes
    verdict: str = "new"


RELAYED_TAG = "nm"

RELAYED_VERDICTS = ("new", "duplicate", "summary-rejected", "too-early")
"""The SCMP verdicts a relayed call may carry (``rmpd.scmp.filter.Verdict`` values)."""

KEYED_TAG = "k"

MAX_KEY = 255
"""Bytes a message's key may hold (a key names a message across its sender's retries: an order number, a
request ID, a hash).  The most one byte counts, which ``well_formed_keys`` relies on."""


def well_formed_keys(keys: Sequence[Any]) -> bool:
    """Every key is bytes, of 1 to MAX_KEY bytes.  Two passes at C speed, since a packed keyed packet (or a batch
    handed over together) holds many: the types as a set, and the lengths as one byte each (``bytes`` refuses a
    length past 255) holding no zero."""
    if not keys:
        return True
    if set(map(type, keys)) != {bytes}:
        return False
    try:
        return 0 not in bytes(map(len, keys))
    except ValueError:
        return False


class Keyed(NamedTuple):
    """Messages that carry keys (exactly-once sends): ``keys`` one per message of ``body`` (a single message, a
    packed tuple, or a fragment, whose key every piece repeats), ``stamp`` the sender's clock in ms when it queued
    them, which moves the group's key retention forward in the order (rmpd.protocol.keys)."""

    tag: str
    stamp: int
    keys: tuple[bytes, ...]
    body: bytes | tuple[bytes, ...] | Fragment


Body = bytes | tuple[bytes, ...] | Fragment | Relayed | Keyed


def _fail(what: str) -> DecodeError:
    return DecodeError(what)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise _fail(f"expected int, got {type(v).__name__}")
    return v


def _uint(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise _fail("expected unsigned int")
    return v


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise _fail("expected bool")
    return v


def _str(v: Any) -> str:
    if type(v) is not str or len(v) > 1024:
        raise _fail("expected short str")
    return v


def _bytes(v: Any) -> bytes:
    if type(v) is not bytes:
        raise _fail("expected bytes")
    return v


_KNOWN_PIDS: set[str] = set()
"""Process IDs already validated; bounded, since hostile senders can invent any number of them."""


def _pid(v: Any) -> ProcessId:
    if type(v) is str and v in _KNOWN_PIDS:
        return v
    v = _str(v)
    try:
        split_process_id(v)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if len(_KNOWN_PIDS) >= 4096:
        _KNOWN_PIDS.clear()
    _KNOWN_PIDS.add(v)
    return v


def _view_dec(v: Any) -> ViewId:
    if type(v) is not list or len(v) != 2:
        raise _fail("expected view [creator, counter]")
    return ViewId(_pid(v[0]), _uint(v[1]))


def _view_enc(v: ViewId) -> list:
    return [v.creator, v.counter]


def _qos_dec(v: Any) -> QoS:
    try:
        return QoS.from_code(_uint(v))
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _list(v: Any) -> list:
    if type(v) is not list or len(v) > MAX_LIST:
        raise _fail("expected bounded list")
    return v


def _ids_dec(v: Any) -> tuple[DataId, ...]:
    out = []
    for item in _list(v):
        if type(item) is not list or len(item) != 3:
            raise _fail("expected data id [src, seq, qos]")
        out.append((_pid(item[0]), _uint(item[1]), _qos_dec(item[2])))
    return tuple(out)


def _ids_enc(v: tuple[DataId, ...]) -> list:
    return [[s, q, qos.code()] for s, q, qos in v]


def _uints_dec(v: Any) -> tuple[int, ...]:
    return tuple(_uint(x) for x in _list(v))


def _pids_dec(v: Any) -> tuple[ProcessId, ...]:
    return tuple(_pid(x) for x in _list(v))


def _seqs_dec(v: Any) -> tuple[tuple[ProcessId, int], ...]:
    out = []
    for item in _list(v):
        if type(item) is not list or len(item) != 2:
            raise _fail("expected [pid, seq]")
        out.append((_pid(item[0]), _uint(item[1])))
    return tuple(out)


def _runs_dec(v: Any) -> tuple[tuple[ProcessId, int, int], ...]:
    out = []
    for item in _list(v):
        if type(item) is not list or len(item) != 3:
            raise _fail("expected run [pid, first, last]")
        first, last = _uint(item[1]), _uint(item[2])
        if last < first:
            raise _fail("run ends before it starts")
        out.append((_pid(item[0]), first, last))
    return tuple(out)


def _pairs_enc(v: tuple[tuple[Any, ...], ...]) -> list:
    return [list(p) for p in v]


def _members_dec(v: Any) -> tuple[tuple[ProcessId, bool], ...]:
    out = []
    for item in _list(v):
        if type(item) is not list or len(item) != 2:
            raise _fail("expected member [pid, multicast_capable]")
        out.append((_pid(item[0]), _bool(item[1])))
    if not out:
        raise _fail("empty member list")
    return tuple(out)


def _locks_dec(v: Any) -> tuple[tuple[int, ProcessId], ...]:
    out = []
    for item in _list(v):
        if type(item) is not list or len(item) != 2:
            raise _fail("expected lock [number, holder]")
        out.append((_uint(item[0]), _pid(item[1])))
    return tuple(out)


def _body_dec(v: Any) -> Body:
    """One message (bytes), a packed list of at least two, a fragment [first, more, chunk], a relayed
    non-member call ["nm", caller, conn, stamp, flags, clock, payload, verdict], or keyed messages
    ["k", stamp, [key, ...], body] around one of the first three (one key per message)."""
    if type(v) is bytes:
        return v
    items = _list(v)
    if items and items[0] == KEYED_TAG:
        if len(items) != 4:
            raise _fail("keyed messages are [tag, stamp, keys, body]")
        body = _body_dec(items[3])
        if isinstance(body, (Relayed, Keyed)):
            raise _fail("keyed messages hold plain messages")
        keys = tuple(_list(items[2]))
        if not well_formed_keys(keys):
            raise _fail(f"a key is 1 to {MAX_KEY} bytes")
        if len(keys) != (len(body) if type(body) is tuple else 1):
            raise _fail("one key per keyed message")
        return Keyed(KEYED_TAG, _uint(items[1]), keys, body)
    if items and items[0] == RELAYED_TAG:
        if len(items) != 8:
            raise _fail("a relayed call is [tag, caller, conn, stamp, flags, clock, payload, verdict]")
        if items[7] not in RELAYED_VERDICTS:
            raise _fail("unknown verdict on a relayed call")
        return Relayed(RELAYED_TAG, _pid(items[1]), _uint(items[2]), _uint(items[3]), _uint(items[4]),
                       _uint(items[5]), _bytes(items[6]), items[7])
    if items and type(items[0]) is bool:
        if len(items) != 3:
            raise _fail("a fragment is [first, more, chunk]")
        return Fragment(items[0], _bool(items[1]), _bytes(items[2]))
    parts = tuple(items)
    if set(map(type, parts)) != {bytes}:  # every part bytes, checked at C speed: a packed body holds many
        raise _fail("expected bytes")
    if len(parts) < 2:
        raise _fail("a packed body holds at least two messages")
    return parts


def _body_enc(v: Body) -> bytes | list[Any]:
    if type(v) is Keyed:
        return [KEYED_TAG, v.stamp, list(v.keys), _body_enc(v.body)]
    return list(v) if isinstance(v, tuple) else v  # a Fragment is a tuple too: [first, more, chunk]


def _status_dec(v: Any) -> CallStatus:
    try:
        return CallStatus(_uint(v))
    except ValueError:
        raise _fail("unknown call status") from None


def _optional(dec: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else dec(v)


def _ident(v: Any) -> Any:
    return v


FIELD_KINDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "int": (_ident, _int),
    "uint": (_ident, _uint),
    "bool": (_ident, _bool),
    "str": (_ident, _str),
    "bytes": (_ident, _bytes),
    "pid": (_ident, _pid),
    "opt_pid": (_ident, _optional(_pid)),
    "opt_uint": (_ident, _optional(_uint)),
    "opt_str": (_ident, _optional(_str)),
    "opt_bytes": (_ident, _optional(_bytes)),
    "body": (_body_enc, _body_dec),
    "view": (_view_enc, _view_dec),
    "opt_view": (lambda v: None if v is None else _view_enc(v), _optional(_view_dec)),
    "qos": (lambda q: q.code(), _qos_dec),
    "status": (int, _status_dec),
    "ids": (_ids_enc, _ids_dec),
    "uints": (list, _uints_dec),
    "pids": (list, _pids_dec),
    "seqs": (_pairs_enc, _seqs_dec),
    "runs": (_pairs_enc, _runs_dec),
    "members": (_pairs_enc, _members_dec),
    "locks": (_pairs_enc, _locks_dec),
}
"""Each field kind by name (the names ``Packet.KINDS`` lists): (encode, decode)."""
