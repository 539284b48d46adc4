"""Wire captures: a pcap built here from encoded packets is decoded on the executors and checked."""

from __future__ import annotations

import os
import struct
from dataclasses import fields
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from cli.audit_cmd import audit_app
from rmpd.audit.job import run_audit
from rmpd.audit.pcap import PcapError, udp_payloads
from rmpd.audit.read import UnreadableInput
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import Ack, Data, NewList, encode
from rmpd.protocol.qos import QoS
from rmpd.wire.sealing import GroupKey, KeyRing

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
    assert verdict == {"wire-one-order": (4, 0), "wire-token-member": (4, 0), "wire-authentic": (0, 0)}
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


KEY = GroupKey.from_secret(bytes(range(32)))
OTHER_KEY = GroupKey.from_secret(bytes(range(1, 33)))


def sealed_traffic(encrypt: bool, key: GroupKey = KEY) -> list[bytes]:
    """The clean traffic as a keyed group's daemons put it on the wire (the junk stays as it is)."""
    ring = KeyRing(key, encrypt=encrypt, nonces=os.urandom)
    return [ring.seal(p) if p.startswith(b"RM") else p for p in clean_traffic()]


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_keyed_groups_capture_passes_with_its_key(spark: SparkSession, tmp_path: Path, encrypt: bool) -> None:
    path = tmp_path / "keyed.pcap"
    payloads = sealed_traffic(encrypt)
    assert all(p[:2] in (b"RA", b"RE") for p in payloads[:-1])
    write_pcap(path, payloads)
    report = run_audit(spark, [], pcaps=[str(path)], key=KEY)
    verdict = {r.name: (r.checked, r.violations) for r in report.results}
    assert verdict == {"wire-one-order": (4, 0), "wire-token-member": (4, 0), "wire-authentic": (5, 0)}


def test_a_tampered_keyed_capture_is_caught(spark: SparkSession, tmp_path: Path) -> None:
    payloads = sealed_traffic(encrypt=False)
    flipped = bytearray(payloads[2])
    flipped[10] ^= 0x01  # one bit of the ACK's body: its MAC no longer matches
    forged = encode(Ack(V2, C, 9, A, 0, ()))  # an unsigned RMP packet injected into a keyed group
    path = tmp_path / "tampered.pcap"
    write_pcap(path, [*payloads[:2], bytes(flipped), *payloads[3:], forged, sealed_traffic(False, OTHER_KEY)[4]])
    report = run_audit(spark, [], pcaps=[str(path)], key=KEY, examples=5)
    authentic = next(r for r in report.results if r.name == "wire-authentic")
    assert report.exit_code == 1 and authentic.violations == 3
    assert sorted(e["detail"].split()[1] for e in authentic.examples) == ["3", "7", "8"]  # frames count from 1


def test_without_the_key_signed_captures_are_read_and_encrypted_ones_refused(spark: SparkSession,
                                                                            tmp_path: Path) -> None:
    signed, encrypted = tmp_path / "signed.pcap", tmp_path / "encrypted.pcap"
    write_pcap(signed, sealed_traffic(encrypt=False))
    write_pcap(encrypted, sealed_traffic(encrypt=True))
    report = run_audit(spark, [], pcaps=[str(signed)])
    assert {r.name: (r.checked, r.violations) for r in report.results}["wire-one-order"] == (4, 0)
    with pytest.raises(UnreadableInput, match="--auth-key"):
        run_audit(spark, [], pcaps=[str(encrypted)])


def test_rmp_audit_takes_the_key_file(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "keyed.pcap"
    write_pcap(path, sealed_traffic(encrypt=True))
    key_file = tmp_path / "group.key"
    key_file.write_text(bytes(range(32)).hex() + "\n")
    key_file.chmod(0o400)
    result = CliRunner().invoke(audit_app, ["--pcap", str(path), "--auth-key", str(key_file)])
    assert result.exit_code == 0, result.output
    assert "wire-authentic" in result.stdout
    missing = CliRunner().invoke(audit_app, ["--pcap", str(path), "--auth-key", str(tmp_path / "none.key")])
    assert missing.exit_code == 2 and "cannot read key file" in missing.stderr
