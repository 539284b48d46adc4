"""Wire captures: decode RMP packets from classic libpcap files on the executors and check wire invariants.

The reader is deliberately minimal (no dependency): the pcap global header (either byte order, microsecond or
nanosecond magic), record headers, and Ethernet (with 802.1Q tags), Linux cooked (SLL and SLL2), BSD loopback or
raw IPv4 link layers, then IPv4 and UDP.  IP fragments other than the first cannot be reassembled and are counted
as undecodable, like anything the project's codec (:func:`rmpd.protocol.packets.decode`) rejects.

Checks, over every capture together (the same packet seen by several hosts counts once):

- ``wire-one-order``: every ACK, New List and ordered data slot of a view names one packet;
- ``wire-token-member``: the ``next_site`` an ACK passes the token to is a member of the ACK's view, when some New
  List in the captures announced that view's members (a New List's own ``next_site`` must be in its new list);
- ``wire-authentic`` (a keyed group's capture, given its key): every RMP datagram is sealed under the key and opens
  (a right MAC, or decryption).  An unsigned RMP packet, a flipped bit or a datagram sealed with another key is
  a violation; bytes that are not RMP at all stay undecodable, as without a key.

Without the key, MAC-signed datagrams are read unverified (their packets are in the clear), and encrypted ones
cannot be read: such a capture is refused, asking for ``--auth-key``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rmpd.wire.sealing import GroupKey

from .check import Check, example
from .report import Tally
from .tables import Tables

PACKET_SCHEMA = T.StructType(
    [
        T.StructField("file", T.StringType()),
        T.StructField("frame", T.LongType()),
        T.StructField("kind", T.StringType()),
        T.StructField("view", T.StringType()),
        T.StructField("ts", T.LongType()),
        T.StructField("src", T.StringType()),
        T.StructField("next", T.StringType()),
        T.StructField("new_view", T.StringType()),
        T.StructField("members", T.ArrayType(T.StringType())),
        T.StructField("orders", T.ArrayType(T.StringType())),
    ]
)

_LINK_ETHERNET = 1
_LINK_NULL = 0
_LINK_RAW = (101, 12, 228)
_LINK_SLL = 113
_LINK_SLL2 = 276


class PcapError(ValueError):
    """The file is not a classic libpcap capture."""


def udp_payloads(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(frame number, UDP payload)`` for every frame; the payload is None when it is not IPv4/UDP."""
    if len(data) < 24:
        raise PcapError("shorter than a pcap global header")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise PcapError("not a classic libpcap file (pcapng is not supported; convert with editcap -F pcap)")
    (linktype,) = struct.unpack_from(endian + "I", data, 20)
    linktype &= 0x0FFFFFFF
    record = struct.Struct(endian + "IIII")
    pos, frame = 24, 0
    while pos + 16 <= len(data):
        _, _, incl, _ = record.unpack_from(data, pos)
        pos += 16
        packet = data[pos:pos + incl]
        pos += incl
        frame += 1
        yield frame, _udp(_ipv4(packet, linktype))


def _ipv4(frame: bytes, linktype: int) -> bytes | None:
    if linktype == _LINK_ETHERNET:
        off, ethertype = 14, frame[12:14]
        while ethertype in (b"\x81\x00", b"\x88\xa8") and len(frame) >= off + 4:
            ethertype = frame[off + 2:off + 4]
            off += 4
        return frame[off:] if ethertype == b"\x08\x00" else None
    if linktype == _LINK_SLL:
        return frame[16:] if frame[14:16] == b"\x08\x00" else None
    if linktype == _LINK_SLL2:
        return frame[20:] if frame[0:2] == b"\x08\x00" else None
    if linktype == _LINK_NULL:
        return frame[4:] if frame[:4] in (b"\x02\x00\x00\x00", b"\x00\x00\x00\x02") else None
    if linktype in _LINK_RAW:
        return frame
    return None


def _udp(ip: bytes | None) -> bytes | None:
    if ip is None or len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 17:
        return None
    ihl = (ip[0] & 0x0F) * 4
    flags_frag = struct.unpack_from("!H", ip, 6)[0]
    if flags_frag & 0x3FFF:  # a fragment: more fragments follow, or not the first
        return None
    total = struct.unpack_from("!H", ip, 2)[0]
    udp = ip[ihl:total]
    if len(udp) < 8:
        return None
    length = struct.unpack_from("!H", udp, 4)[0]
    return udp[8:length] if length >= 8 else None


def decode_capture(file: str, data: bytes, key: GroupKey | None = None) -> Iterator[tuple]:
    """Rows of ``PACKET_SCHEMA`` for one capture; kind ``undecodable`` for frames the codec rejects, ``encrypted``
    for sealed ones it cannot open without ``key``, ``unauthentic`` for RMP datagrams that do not open under it."""
    from rmpd.protocol.packets import Ack, DecodeError, NewList, decode
    from rmpd.wire.sealing import SEALED_TAGS, aead_cipher, signed_body, unseal

    cipher = aead_cipher(key) if key is not None else None
    for frame, payload in udp_payloads(data):
        if payload is None:
            continue
        sealed = payload[:2] in SEALED_TAGS
        if key is not None and sealed:
            opened = unseal(key, payload, cipher)
            if opened is None:
                yield (file, frame, "unauthentic", None, None, None, None, None, None, None)
                continue
            payload = opened
        elif sealed:
            body = signed_body(payload)
            if body is None:
                yield (file, frame, "encrypted", None, None, None, None, None, None, None)
                continue
            payload = body
        try:
            p = decode(payload)
        except DecodeError:
            yield (file, frame, "undecodable", None, None, None, None, None, None, None)
            continue
        if key is not None and not sealed:
            yield (file, frame, "unauthentic", None, None, None, None, None, None, None)
            continue
        view = str(p.view) if p.view is not None else None
        if isinstance(p, Ack):
            orders = ["|".join(("data", s, str(n), q.name())) for s, n, q in p.ids]
            yield (file, frame, "ack", view, p.ts, p.src, p.next_site, None, None, orders)
        elif isinstance(p, NewList):
            members = [m for m, _ in p.members]
            yield (file, frame, "new_list", view, p.ts, p.src, p.next_site, str(p.new_view), members, [])
        else:
            yield (file, frame, type(p).__name__, view, None, getattr(p, "src", None), None, None, None, None)


def read_captures(spark: SparkSession, paths: list[str], key: GroupKey | None = None) -> DataFrame:
    """Decoded packets of every capture; each capture is read whole by one executor task (``key`` travels with
    the task, so the executors need no key file)."""
    raw = spark.read.format("binaryFile").load(paths).select("path", "content")

    def decode_partition(rows: Iterator) -> Iterator[tuple]:
        for row in rows:
            try:
                yield from decode_capture(row.path, bytes(row.content), key)
            except PcapError as exc:
                yield (row.path, None, f"error: {exc}", None, None, None, None, None, None, None)

    return spark.createDataFrame(raw.rdd.mapPartitions(decode_partition), PACKET_SCHEMA)


def wire_one_order(v: Tables) -> Check:
    """Every (view, ts) slot holds one thing across all captures."""
    per_slot = v.table("wire-one-order: per slot", lambda v: f"""
        SELECT view, ts, count(DISTINCT what) AS n, min(what) AS a, max(what) AS b FROM (
            SELECT view, ts, concat_ws('|', 'ack', src) AS what FROM {v.base} WHERE kind = 'ack'
            UNION ALL SELECT view, ts + i + 1, what FROM (
                SELECT view, ts, unnest(range(len(orders))) AS i, unnest(orders) AS what FROM {v.base}
                WHERE kind = 'ack')
            UNION ALL SELECT view, ts, concat_ws('|', 'new_list', new_view) FROM {v.base} WHERE kind = 'new_list'
        ) GROUP BY view, ts""")
    return Check("wire-one-order", f"SELECT * FROM {per_slot}", example(
        f"{per_slot} WHERE n > 1", view="view", ts="ts", detail="concat('slot holds ', a, ' and ', b)", group="NULL"))


def wire_token_member(v: Tables) -> Check:
    """The token goes only to members of the view it is passed in."""
    known = v.table("wire-token-member: known", lambda v: f"""
        SELECT DISTINCT view, m FROM (SELECT new_view AS view, unnest(members) AS m FROM {v.base}
                                      WHERE kind = 'new_list')""")
    acks = v.table("wire-token-member: acks", lambda v: f"""
        SELECT view, ts, src, "next", file, frame FROM {v.base} WHERE kind = 'ack'
        AND view IN (SELECT view FROM {known})""")
    own = v.table("wire-token-member: own", lambda v: f"""
        SELECT new_view AS view, ts, src, "next", file, frame, members FROM {v.base} WHERE kind = 'new_list'""")
    bad = f"""(
        SELECT view, ts, src, "next", file, frame FROM {acks}
        ANTI JOIN (SELECT view, m AS "next" FROM {known}) USING (view, "next")
        UNION ALL SELECT view, ts, src, "next", file, frame FROM {own} WHERE NOT list_contains(members, "next"))"""
    return Check(
        "wire-token-member",
        f"SELECT view FROM {acks} UNION ALL SELECT view FROM {own}",
        example(bad, node="src", view="view", ts="ts", group="NULL", detail=(
            "concat('token passed to non-member ', \"next\", ' (frame ', CAST(frame AS STRING), ' of ', file, ')')")),
    )


def wire_authentic(v: Tables, keyed: bool) -> Check:
    """Every RMP datagram of a keyed group's capture opens under its key (nothing is checked without the key)."""
    rmp = f"{v.base} WHERE NOT kind IN ('undecodable', 'encrypted') AND {str(keyed).lower()}"
    return Check("wire-authentic", f"SELECT * FROM {rmp}", example(
        f"{rmp} AND kind = 'unauthentic'", group="NULL", detail=(
            "concat('frame ', CAST(frame AS STRING), ' of ', file, ' is not sealed under the key, or does not open')")))


def wire_checks(tables: Tables, keyed: bool) -> list[Check]:
    """The wire checks over ``tables`` (whose base is the decoded packets of every capture)."""
    return [wire_one_order(tables), wire_token_member(tables), wire_authentic(tables, keyed)]


def wire_audit(spark: SparkSession, paths: list[str], key: GroupKey | None, examples: int,
               ) -> tuple[int, list[Tally]]:
    """Decode the captures at ``paths`` (of a keyed group: ``key`` opens them) and check them in one task; returns
    the packets read and a tally per wire invariant."""
    from .grouped import audit_packets
    from .read import UnreadableInput, list_files

    files = list_files(spark, paths, suffixes=(".pcap", ".cap", ".dmp"))
    packets = read_captures(spark, files, key).persist()
    try:
        errors = packets.where(F.col("kind").startswith("error: ") | (F.col("kind") == "encrypted")).limit(1).collect()
        if errors:
            if errors[0].kind == "encrypted":
                raise UnreadableInput(errors[0].file, None, "holds encrypted datagrams of a keyed group: give its key "
                                      "with --auth-key FILE")
            raise UnreadableInput(errors[0].file, None, errors[0].kind.removeprefix("error: "))
        return audit_packets(packets, key is not None, examples)
    finally:
        packets.unpersist()
