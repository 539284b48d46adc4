"""The twelve RMP packet types (RMP paper, figure 4.1), plus Alive and the status query and report, and their
wire codec.

Wire format: a 4-byte header ``b"RM"``, a version byte and a packet-type byte, then one msgpack array holding the
packet's fields in declaration order.  Every packet names the membership view it belongs to (packets that can be
sent before the sender knows a view, List Change Request and Non Member Data, name the group instead or as well),
so receivers filter packets of other views and hash collisions of group addresses do no harm.

Decoding treats every byte as hostile: anything malformed, truncated, oversized, of an unknown version or type, or
wrongly typed raises :class:`DecodeError` and nothing else, so the caller counts and drops it.  Each field's kind
(fieldkinds.py) checks and rebuilds its value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import ClassVar

import msgpack

from .fieldkinds import FIELD_KINDS, MAX_LIST, Body, CallStatus, DataId, DecodeError, Fragment, Keyed, Relayed
from .ids import ProcessId, ViewId
from .qos import QoS
from .view import View

MAGIC = b"RM"
VERSION = 1
HEADER_SIZE = 4
MAX_DATAGRAM = 65507


class PacketType(IntEnum):
    DATA = 1
    ACK = 2
    CONFIRM = 3
    NACK = 4
    NEW_LIST = 5
    LIST_CHANGE_REQUEST = 6
    RECOVERY_START = 7
    RECOVERY_VOTE = 8
    RECOVERY_ACK_NEW_LIST = 9
    RECOVERY_ABORT = 10
    NON_MEMBER_DATA = 11
    NON_MEMBER_ACK = 12
    ALIVE = 13
    STATUS_QUERY = 14
    STATUS_REPORT = 15


TYPE_OFFSET = 3
"""Where the packet-type byte sits in the header (after the magic and the version)."""


def packet_type_of(data: bytes) -> int | None:
    """The packet-type byte of an encoded packet, read without decoding it (counting datagrams by type) and not
    checked against :class:`PacketType`; None for bytes too short to carry one."""
    return data[TYPE_OFFSET] if len(data) > TYPE_OFFSET else None


class Packet:
    """Base of all packet classes.  ``KINDS`` gives each field's wire kind, in field order."""

    TYPE: ClassVar[PacketType]
    KINDS: ClassVar[tuple[str, ...]]
    view: ViewId | None


@dataclass(frozen=True, slots=True)
class Data(Packet):
    """Data to the group from a member, identified by (src, seq, qos).

    ``payload`` is one application message; or, for a packet packed under load, a tuple of several (at least two),
    delivered one after the other at the packet's place in the order; or a :class:`Fragment` of a message larger
    than one packet, whose pieces have consecutive sequence numbers and which is delivered whole with the last;
    any of the three may come :class:`Keyed`, one key per message.
    """

    view: ViewId
    src: ProcessId
    seq: int
    qos: QoS
    handler: int | None
    payload: Body
    TYPE: ClassVar[PacketType] = PacketType.DATA
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "qos", "opt_uint", "body")

    @property
    def data_id(self) -> DataId:
        return (self.src, self.seq, self.qos)

    @property
    def size(self) -> int:
        """Application bytes carried (what the send window counts)."""
        body = self.payload
        if type(body) is Keyed:
            body = body.body
        if isinstance(body, Fragment):
            return len(body.chunk)
        if isinstance(body, Relayed):
            return len(body.payload)
        return sum(map(len, body)) if isinstance(body, tuple) else len(body)


@dataclass(frozen=True, slots=True)
class Ack(Packet):
    """Orders ``ids`` at timestamps ts+1.. and passes the token to ``next_site``.

    ``quiet`` counts consecutive NULL ACKs ending with this one, so the ring can pass the token once round after
    the last ordered packet and then stop.  ``waits`` gives, per source, how many microseconds the last of its
    packets here waited at the token site between arriving and this ACK: its sender subtracts it from the packet's
    send-to-ordering delay, leaving the path's delay and its queues without the ring's turn and its repairs.
    """

    view: ViewId
    src: ProcessId
    ts: int
    next_site: ProcessId
    quiet: int
    ids: tuple[DataId, ...]
    waits: tuple[tuple[ProcessId, int], ...] = ()
    TYPE: ClassVar[PacketType] = PacketType.ACK
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "pid", "uint", "ids", "seqs")

    @property
    def last_ts(self) -> int:
        return self.ts + len(self.ids)


@dataclass(frozen=True, slots=True)
class Confirm(Packet):
    """Unicast to the previous token site: the token passed by its ACK at ``ts`` was accepted."""

    view: ViewId
    src: ProcessId
    ts: int
    TYPE: ClassVar[PacketType] = PacketType.CONFIRM
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint")


@dataclass(frozen=True, slots=True)
class Nack(Packet):
    """Asks ``target`` (or anyone when None) to resend the packets at ``missing`` timestamps.

    ``upto`` is the requester's highest consecutive timestamp; when ``tail`` is set the target also resends what it
    holds beyond the highest timestamp the requester knows of (``known``), which recovers a lost last ACK.
    ``data`` names data packets by (src, seq) that the requester knows exist but has not seen ordered.  ``held``
    lists runs (src, first seq, last seq) of data packets the requester holds and has not seen ordered: a
    requester that lost an ACK asks for the timestamps it ordered without knowing which packets they are, and most
    of them are in its DataList already, so an answer by timestamp skips those.
    """

    view: ViewId
    src: ProcessId
    target: ProcessId | None
    upto: int
    known: int
    tail: bool
    missing: tuple[int, ...]
    data: tuple[tuple[ProcessId, int], ...]
    held: tuple[tuple[ProcessId, int, int], ...] = ()
    TYPE: ClassVar[PacketType] = PacketType.NACK
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "opt_pid", "uint", "uint", "bool", "uints", "seqs", "runs")


@dataclass(frozen=True, slots=True)
class NewList(Packet):
    """A new membership view, ordered at ``ts`` and acting as its own ACK (it passes the token to ``next_site``).

    ``view`` is the view the packet is ordered in; ``new_view`` and ``members`` (pid, multicast capable) the view
    it installs; ``seqs`` the highest ordered sequence number per source (members and non-members) and ``done``
    the highest List Change Request ID served per requester, which a joiner needs; ``locks`` the lock table
    (lock number, holder).  ``request`` names the List Change Request it
    answers (src, request id) and ``granted`` whether the change was made.  ``join_floor`` is the group's SCMP
    ``upper`` for join requests: a join from a process the ``done`` table does not know is refused when stamped at
    or below it (docs/protocol.md, "Join requests and SCMP").  ``ttls`` the multicast TTL each member asked for
    (the view's TTL is the largest) and ``address`` the group's multicast address (``ip:port``), which a joiner
    checks against the address it derived from the name (section 3.1).  ``keys``: the group has carried keyed
    messages, so the processes this New List admits wait for the group's key table (rmpd.protocol.keys).
    """

    view: ViewId
    src: ProcessId
    ts: int
    next_site: ProcessId
    group: str
    new_view: ViewId
    members: tuple[tuple[ProcessId, bool], ...]
    seqs: tuple[tuple[ProcessId, int], ...]
    done: tuple[tuple[ProcessId, int], ...]
    locks: tuple[tuple[int, ProcessId], ...]
    min_partition: int
    request_src: ProcessId | None
    request_id: int | None
    granted: bool
    address: str | None
    join_floor: int = 0
    ttls: tuple[tuple[ProcessId, int], ...] = ()
    keys: bool = False
    brings_keys: bool = False
    """The process this New List admits kept a key table of the group (its join said so): every member holds its
    keyed deliveries until that table, sent in the order, is merged into the group's (rmpd.protocol.keys)."""
    TYPE: ClassVar[PacketType] = PacketType.NEW_LIST
    KINDS: ClassVar[tuple[str, ...]] = (
        "view", "pid", "uint", "pid", "str", "view", "members", "seqs", "seqs", "locks", "uint",
        "opt_pid", "opt_uint", "bool", "opt_str", "uint", "seqs", "bool", "bool",
    )

    @property
    def last_ts(self) -> int:
        """A New List orders only itself."""
        return self.ts

    def installed_view(self) -> View:
        """The view this New List installs."""
        return View(self.new_view, tuple(m for m, _ in self.members),
                    frozenset(m for m, capable in self.members if not capable), self.locks, self.min_partition,
                    self.ttls)


@dataclass(frozen=True, slots=True)
class ListChangeRequest(Packet):
    """Asks the token site to change the view: ``op`` is join, leave, lock or unlock (``arg`` = lock number)."""

    group: str
    view: ViewId | None
    src: ProcessId
    request_id: int
    op: str
    arg: int | None
    multicast_capable: bool
    min_partition: int
    ttl: int
    keys_position: int = 0
    """A join's: the position (``KeyTable.position``) of the key table its sender kept from its last membership of
    the group, 0 for none; among processes asking to found the group again, the longest history founds."""
    TYPE: ClassVar[PacketType] = PacketType.LIST_CHANGE_REQUEST
    KINDS: ClassVar[tuple[str, ...]] = ("str", "opt_view", "pid", "uint", "str", "opt_uint", "bool", "uint", "uint",
                                        "uint")


@dataclass(frozen=True, slots=True)
class RecoveryStart(Packet):
    """Reformation poll: the initiator proposes ``members`` under ``version`` and the best known sync point."""

    view: ViewId
    src: ProcessId
    version: int
    members: tuple[ProcessId, ...]
    sync_ts: int
    sync_seqs: tuple[tuple[ProcessId, int], ...]
    TYPE: ClassVar[PacketType] = PacketType.RECOVERY_START
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "pids", "uint", "seqs")


@dataclass(frozen=True, slots=True)
class RecoveryVote(Packet):
    """A member's answer to Recovery Start: its sync point and the highest version it has seen."""

    view: ViewId
    src: ProcessId
    version: int
    sync_ts: int
    sync_seqs: tuple[tuple[ProcessId, int], ...]
    TYPE: ClassVar[PacketType] = PacketType.RECOVERY_VOTE
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "uint", "seqs")


@dataclass(frozen=True, slots=True)
class RecoveryAckNewList(Packet):
    """Acknowledges the reformation's New List (first phase of the commit)."""

    view: ViewId
    src: ProcessId
    version: int
    new_view: ViewId
    TYPE: ClassVar[PacketType] = PacketType.RECOVERY_ACK_NEW_LIST
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "view")


@dataclass(frozen=True, slots=True)
class RecoveryAbort(Packet):
    """Tells the members that reformation ``version`` is aborted."""

    view: ViewId
    src: ProcessId
    version: int
    reason: str
    TYPE: ClassVar[PacketType] = PacketType.RECOVERY_ABORT
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "str")


@dataclass(frozen=True, slots=True)
class Alive(Packet):
    """A member's sign of life, multicast once per ``alive_interval`` (not one of the paper's types).

    Members of its view learn that ``src`` lives while the ring is quiet; a member of another view of ``group``
    learns from ``members`` that the two views are disjoint and must merge (docs/protocol.md, "Healing")."""

    view: ViewId
    src: ProcessId
    group: str
    members: tuple[ProcessId, ...]
    TYPE: ClassVar[PacketType] = PacketType.ALIVE
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "str", "pids")

@dataclass(frozen=True, slots=True)
class NonMemberData(Packet):
    """A call (or plain message) from a process outside the group, addressed by group name and, once the sender
    has cached one from an answer, the view ID (multi-RPC, section 4.5).

    ``conn`` and ``stamp`` are the SCMP message identity (docs/protocol.md, "Non-members and SCMP"): a connection
    number the sender picks (one per outstanding call) and the sender's clock in ms, strictly increasing on each
    connection; every copy and retransmission of one call carries the same pair.  ``flags``: bit 0 acknowledge on
    delivery, bit 1 repeat the reply to every duplicate, bit 2 a probe (FLAG_PROBE).  ``handler``: the handler
    lock whose holder answers.
    """

    group: str
    view: ViewId | None
    src: ProcessId
    conn: int
    stamp: int
    qos: QoS
    flags: int
    handler: int | None
    payload: bytes
    TYPE: ClassVar[PacketType] = PacketType.NON_MEMBER_DATA
    KINDS: ClassVar[tuple[str, ...]] = ("str", "opt_view", "pid", "uint", "uint", "qos", "uint", "opt_uint", "bytes")

    FLAG_ACK: ClassVar[int] = 1
    FLAG_REPEAT_REPLY: ClassVar[int] = 2
    FLAG_PROBE: ClassVar[int] = 4
    """Not a call: asks the group whether it can take calls, and from which stamp on (answered READY)."""


@dataclass(frozen=True, slots=True)
class NonMemberAck(Packet):
    """An answer about a non-member's call ``(conn, stamp)``, naming the view for the sender to cache; or, with
    status REPLY_ACK, the caller's acknowledgement of a reply."""

    view: ViewId
    src: ProcessId
    conn: int
    stamp: int
    status: CallStatus
    reply: bytes | None
    TYPE: ClassVar[PacketType] = PacketType.NON_MEMBER_ACK
    KINDS: ClassVar[tuple[str, ...]] = ("view", "pid", "uint", "uint", "status", "opt_bytes")


@dataclass(frozen=True, slots=True)
class StatusQuery(Packet):
    """A member asks another for its status of ``group`` (``rmp status G --all``; not one of the paper's types):
    outside the order, answered by a Status Report to the datagram's source (docs/protocol.md, "Status of every
    member")."""

    group: str
    src: ProcessId
    query: int
    TYPE: ClassVar[PacketType] = PacketType.STATUS_QUERY
    KINDS: ClassVar[tuple[str, ...]] = ("str", "pid", "uint")


@dataclass(frozen=True, slots=True)
class StatusReport(Packet):
    """The answer to Status Query ``query``: ``report`` is the answering application's snapshot of ``group``
    (the daemon's: a msgpack map), opaque to the protocol."""

    group: str
    src: ProcessId
    query: int
    report: bytes
    TYPE: ClassVar[PacketType] = PacketType.STATUS_REPORT
    KINDS: ClassVar[tuple[str, ...]] = ("str", "pid", "uint", "bytes")


PACKET_CLASSES: dict[PacketType, type[Packet]] = {
    cls.TYPE: cls
    for cls in (
        Data, Ack, Confirm, Nack, NewList, ListChangeRequest, RecoveryStart, RecoveryVote,
        RecoveryAckNewList, RecoveryAbort, NonMemberData, NonMemberAck, Alive, StatusQuery, StatusReport,
    )
}

_CODECS: dict[type[Packet], tuple[tuple[str, ...], tuple[Callable, ...], tuple[Callable, ...]]] = {}
for _cls in PACKET_CLASSES.values():
    _names = tuple(f.name for f in fields(_cls))
    assert len(_names) == len(_cls.KINDS), _cls
    _CODECS[_cls] = (_names, tuple(FIELD_KINDS[k][0] for k in _cls.KINDS), tuple(FIELD_KINDS[k][1] for k in _cls.KINDS))


def encode(packet: Packet) -> bytes:
    """Serialise a packet: header then a msgpack array of its fields."""
    names, encoders, _ = _CODECS[type(packet)]
    body = [enc(getattr(packet, name)) for name, enc in zip(names, encoders, strict=True)]
    data = MAGIC + bytes((VERSION, packet.TYPE)) + msgpack.packb(body, use_bin_type=True)
    if len(data) > MAX_DATAGRAM:
        raise ValueError(f"packet of {len(data)} bytes exceeds the datagram limit {MAX_DATAGRAM}")
    return data


def decode(data: bytes) -> Packet:
    """Parse untrusted bytes into a packet; raises only :class:`DecodeError`."""
    if len(data) > MAX_DATAGRAM:
        raise DecodeError("oversized datagram")
    if len(data) < HEADER_SIZE + 1 or data[:2] != MAGIC:
        raise DecodeError("not an RMP datagram")
    if data[2] != VERSION:
        raise DecodeError(f"unsupported version {data[2]}")
    kind = data[TYPE_OFFSET]
    try:
        cls = PACKET_CLASSES[PacketType(kind)]
    except ValueError:
        raise DecodeError(f"unknown packet type {kind}") from None
    try:
        body = msgpack.unpackb(
            memoryview(data)[HEADER_SIZE:], raw=False, use_list=True, strict_map_key=True,
            max_array_len=MAX_LIST, max_map_len=MAX_LIST, max_str_len=MAX_DATAGRAM, max_bin_len=MAX_DATAGRAM,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types for hostile input; all mean "malformed"
        raise DecodeError(f"malformed body: {type(exc).__name__}") from None
    _, _, decoders = _CODECS[cls]
    if type(body) is not list or len(body) != len(decoders):
        raise DecodeError(f"{cls.__name__}: expected {len(decoders)} fields")
    return cls(*[dec(v) for dec, v in zip(decoders, body, strict=True)])
