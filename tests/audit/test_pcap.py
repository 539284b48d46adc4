"""Wire captures: a pcap built here from encoded packets is decoded on the executors and checked."""

from __future__ import annotations

import struct
from dataclasses import fields
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmpd.audit.job import run_audit
from rmpd.audit.pcap import PcapError, udp_payloads
from rmpd.audit.read import UnreadableInput
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import Ack, Data, NewList, encode
from rmpd.protocol.qos import QoS

A, B, C, OUTSIDER = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.9:7000"
V1 = ViewId(A, 1)
V2 = ViewId(A, 2)


def _udp_ipv4(payload: bytes, src: str = "10.0.0.1", dst: str = "239.1.2.3") -> bytes:
    udp = struct.pack("!HHHH", 7000, 40000, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                     bytes(map(int, src.split("."))), bytes(map(int, dst.split("."))))
    return ip + udp


def write_pcap(path: Path, payloads: list[bytes], linktype: int = 1, big_endian: bool = False) -> None:
    """A classic libpcap file; ``linktype`` 1 wraps frames in Ethernet, 113 in Linux cooked, 101 raw IP."""
    e = ">" if big_endian else "<"
    out = [struct.pack(e + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype)]
    for n, payload in enumerate(payloads):
        ip = _udp_ipv4(payload)
        if linktype == 1:
            frame = b"\x01\x00\x5e\x01\x02\x03" + b"\x02" * 6 + b"\x08\x00" + ip
        elif linktype == 113:
            frame = b"\x00\x04\x00\x01\x00\x06" + b"\x02" * 8 + b"\x08\x00" + ip
        else:
            frame = ip
        out.append(struct.pack(e + "IIII", 1_700_000_000 + n, 0, len(frame), len(frame)) + frame)
    path.write_bytes(b"".join(out))


_EMPTY = {"uint": 0, "bool": True, "str": "demo", "seqs": (), "locks": (), "uints": (), "pids": ()}


def _new_list(view: ViewId, ts: int, src: str, next_site: str, new_view: ViewId, members: list[str]) -> NewList:
    """A New List; fields this test does not care about get neutral values by their wire kind."""
    given = {"view": view, "src": src, "ts": ts, "next_site": next_site, "new_view": new_view,
             "members": tuple((m, True) for m in members)}
    values = {
        f.name: given[f.name] if f.name in given else (None if kind.startswith("opt_") else _EMPTY[kind])
        for f, kind in zip(fields(NewList), NewList.KINDS, strict=True)
    }
    return NewList(**values)


def clean_traffic() -> list[bytes]:
    data = Data(V2, B, 1, QoS.TOTAL, None, b"hello")
    return [
        encode(_new_list(V1, 5, A, B, V2, [A, B, C])),
        encode(data),
        encode(Ack(V2, B, 6, C, 0, ((B, 1, QoS.TOTAL),))),
        encode(Ack(V2, B, 6, C, 0, ((B, 1, QoS.TOTAL),))),  # a retransmission is the same claim
        encode(Ack(V2, C, 8, A, 1, ())),
        b"junk that is not RMP",
    ]


def test_reader_handles_link_types_and_byte_orders(tmp_path: Path) -> None:
    payloads = clean_traffic()
    for linktype in (1, 113, 101):
        for big in (False, True):
            path = tmp_path / f"c{linktype}{big}.pcap"
            write_pcap(path, payloads, linktype, big)
            assert [p for _, p in udp_payloads(path.read_bytes())] == payloads
    with pytest.raises(PcapError):
        list(udp_payloads(b"\x0a\x0d\x0d\x0a" + bytes(40)))


def test_clean_capture_holds(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "clean.pcap"
    write_pcap(path, clean_traffic())
    report = run_audit(spark, [], pcaps=[str(path)])
    verdict = {r.name: (r.checked, r.violations) for r in report.results}
    # Slots: New List at 5 (V1); ACK 6, data 7, ACK 8 (V2).  Token checks: 3 ACKs + 1 New List.
    assert verdict == {"wire-one-order": (4, 0), "wire-token-member": (4, 0)}
    assert report.exit_code == 0


def test_conflicting_slot_and_token_to_outsider_are_violations(spark: SparkSession, tmp_path: Path) -> None:
    broken = [
        *clean_traffic(),
        encode(Ack(V2, B, 6, C, 0, ((C, 4, QoS.TOTAL),))),  # slot 7 of V2 now names two packets
        encode(Ack(V2, C, 9, OUTSIDER, 0, ())),  # token to a process outside V2
    ]
    path = tmp_path / "broken.pcap"
    write_pcap(path, broken, linktype=113)
    report = run_audit(spark, [], pcaps=[str(path)], examples=5)
    by_name = {r.name: r for r in report.results}
    assert report.exit_code == 1
    assert by_name["wire-one-order"].violations == 1
    assert by_name["wire-one-order"].examples[0]["ts"] == 7
    assert by_name["wire-token-member"].violations == 1
    ex = by_name["wire-token-member"].examples[0]
    assert (ex["node"], ex["view"], ex["ts"]) == (C, str(V2), 9) and OUTSIDER in ex["detail"]


def test_not_a_pcap_is_unreadable(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    path.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(60))
    with pytest.raises(UnreadableInput, match="pcapng"):
        run_audit(spark, [], pcaps=[str(path)])
