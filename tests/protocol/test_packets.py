"""Codec: every packet type round-trips; hostile bytes raise DecodeError and nothing else."""

from __future__ import annotations

import contextlib
import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmpd.protocol.fieldkinds import RELAYED_TAG, RELAYED_VERDICTS
from rmpd.protocol.ids import ViewId
from rmpd.protocol.packets import (
    MAX_DATAGRAM,
    PACKET_CLASSES,
    Ack,
    CallStatus,
    Data,
    DecodeError,
    Fragment,
    Nack,
    Packet,
    Relayed,
    decode,
    encode,
)
from rmpd.protocol.qos import Level, QoS

pids = st.builds(lambda a, b, port: f"10.{a}.{b}.1:{port}", st.integers(0, 255), st.integers(0, 255),
                 st.integers(1, 65535))
qoses = st.one_of(
    st.sampled_from([QoS(level) for level in Level if level != Level.K_RESILIENT]),
    st.integers(1, 64).map(QoS.k),
)
views = st.builds(ViewId, pids, st.integers(0, 2**63))
uints = st.integers(0, 2**63)
small = st.lists

KIND_STRATEGIES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "uint": uints,
    "bool": st.booleans(),
    "str": st.text(max_size=40),
    "bytes": st.binary(max_size=200),
    "pid": pids,
    "opt_pid": st.none() | pids,
    "opt_uint": st.none() | uints,
    "opt_str": st.none() | st.text(max_size=20),
    "opt_bytes": st.none() | st.binary(max_size=50),
    "body": st.binary(max_size=200) | small(st.binary(max_size=50), min_size=2, max_size=5).map(tuple)
    | st.builds(Fragment, st.booleans(), st.booleans(), st.binary(max_size=200))
    | st.builds(Relayed, st.just(RELAYED_TAG), pids, uints, uints, uints, uints, st.binary(max_size=100),
                st.sampled_from(RELAYED_VERDICTS)),
    "view": views,
    "opt_view": st.none() | views,
    "qos": qoses,
    "ids": small(st.tuples(pids, uints, qoses), max_size=5).map(tuple),
    "uints": small(uints, max_size=5).map(tuple),
    "pids": small(pids, max_size=5).map(tuple),
    "seqs": small(st.tuples(pids, uints), max_size=5).map(tuple),
    "runs": small(st.tuples(pids, st.integers(0, 2**62), st.integers(0, 2**62))
                  .map(lambda run: (run[0], run[1], run[1] + run[2])), max_size=5).map(tuple),
    "members": small(st.tuples(pids, st.booleans()), min_size=1, max_size=5).map(tuple),
    "locks": small(st.tuples(uints, pids), max_size=5).map(tuple),
    "status": st.sampled_from(list(CallStatus)),
}


def packet_strategy(cls: type[Packet]) -> st.SearchStrategy[Packet]:
    return st.builds(lambda *args: cls(*args), *[KIND_STRATEGIES[k] for k in cls.KINDS])


any_packet = st.one_of([packet_strategy(cls) for cls in PACKET_CLASSES.values()])


def test_the_twelve_packet_types_of_the_paper_alive_and_the_status_query_and_report_exist() -> None:
    assert len(PACKET_CLASSES) == 15


@given(any_packet)
@settings(max_examples=600)
def test_round_trip(packet: Packet) -> None:
    assert decode(encode(packet)) == packet


@given(any_packet, st.data())
@settings(max_examples=300)
def test_truncated_packets_are_rejected(packet: Packet, data: st.DataObject) -> None:
    raw = encode(packet)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut])


@given(any_packet, st.binary(min_size=1, max_size=20))
def test_trailing_junk_is_rejected(packet: Packet, junk: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(encode(packet) + junk)


@given(st.binary(max_size=300))
@settings(max_examples=2000)
def test_random_bytes_raise_only_decode_error(raw: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(raw)


@given(st.sampled_from(list(PACKET_CLASSES)), st.lists(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 2**64 - 1), st.text(max_size=10), st.binary(max_size=10),
              st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
              st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=2)),
    max_size=16))
@settings(max_examples=2000)
def test_wrongly_typed_fields_raise_only_decode_error(ptype: int, body: list) -> None:
    raw = b"RM\x01" + bytes([ptype]) + msgpack.packb(body, use_bin_type=True)
    with contextlib.suppress(DecodeError):
        decode(raw)


@given(any_packet, st.data())
@settings(max_examples=300)
def test_single_byte_corruption_never_escapes(packet: Packet, data: st.DataObject) -> None:
    raw = bytearray(encode(packet))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        decode(bytes(raw))


def test_header_checks() -> None:
    good = encode(Ack(ViewId("1.2.3.4:5", 1), "1.2.3.4:5", 1, "1.2.3.4:6", 0, ()))
    with pytest.raises(DecodeError, match="version"):
        decode(good[:2] + b"\x09" + good[3:])
    with pytest.raises(DecodeError, match="unknown packet type"):
        decode(good[:3] + b"\x63" + good[4:])
    with pytest.raises(DecodeError, match="not an RMP"):
        decode(b"XX" + good[2:])
    with pytest.raises(DecodeError, match="oversized"):
        decode(good + b"\0" * MAX_DATAGRAM)


def test_bad_process_id_and_qos_are_rejected() -> None:
    view = [["1.2.3.4:5", 1]]
    for body in (
        [*view, "not-a-pid", 1, 3, None, b""],
        [*view, "1.2.3.4:99999", 1, 3, None, b""],
        [*view, "1.2.3.4:5", 1, 4, None, b""],  # K-resilient with K = 0
        [*view, "1.2.3.4:5", -1, 3, None, b""],
    ):
        with pytest.raises(DecodeError):
            decode(b"RM\x01\x01" + msgpack.packb(body, use_bin_type=True))


def test_oversized_packet_cannot_be_encoded() -> None:
    with pytest.raises(ValueError, match="datagram limit"):
        encode(Data(ViewId("1.2.3.4:5", 1), "1.2.3.4:5", 1, QoS.TOTAL, None, b"x" * MAX_DATAGRAM))


@pytest.mark.parametrize("name", ["unreliable", "unordered", "source", "total", "k3", "majority", "safe"])
def test_qos_names_round_trip(name: str) -> None:
    assert QoS.parse(name).name() == name
    assert QoS.from_code(QoS.parse(name).code()) == QoS.parse(name)


def test_required_holders() -> None:
    assert QoS.k(3).required_holders(5) == 3
    assert QoS.k(9).required_holders(5) == 5
    assert QoS.MAJORITY.required_holders(4) == 3
    assert QoS.MAJORITY.required_holders(5) == 3
    assert QoS.SAFE.required_holders(5) == 5


def test_packed_and_fragment_bodies_are_checked() -> None:
    view = ViewId("10.0.0.1:1", 1)
    packed = Data(view, "10.0.0.1:1", 7, QoS.TOTAL, None, (b"a", b"bc"))
    assert decode(encode(packed)) == packed and packed.size == 3
    piece = Data(view, "10.0.0.1:1", 8, QoS.TOTAL, None, Fragment(True, False, b"xyz"))
    assert decode(encode(piece)) == piece and piece.size == 3
    for body in ([b"only"], [], [b"a", "text"], [b"a", 1], [True, b"x"], [True, 1, b"x"], [True, False, b"x", b"y"]):
        raw = b"RM\x01\x01" + msgpack.packb([["10.0.0.1:1", 1], "10.0.0.1:1", 7, QoS.TOTAL.code(), None, body],
                                          use_bin_type=True)
        with pytest.raises(DecodeError):
            decode(raw)


def test_a_nack_whose_held_run_ends_before_it_starts_is_rejected() -> None:
    view = ViewId("10.0.0.1:7000", 1)
    held = Nack(view, "10.0.0.2:7000", None, 0, 3, False, (2, 3), (), (("10.0.0.1:7000", 4, 6),))
    assert decode(encode(held)) == held
    with pytest.raises(DecodeError, match="run ends before it starts"):
        decode(encode(dataclasses.replace(held, held=(("10.0.0.1:7000", 6, 4),))))
