"""The local API's framing, fed whole, byte by byte, with trailing junk and with lies about lengths."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from rmpd.localapi import FrameError, FrameReader, encode_frame


async def read_all(chunks: list[bytes], max_frame: int = 1024) -> list[dict | FrameError]:
    send, receive = trio.testing.memory_stream_one_way_pair()
    for chunk in chunks:
        await send.send_all(chunk)
    await send.aclose()
    reader = FrameReader(receive, max_frame)
    out: list[dict | FrameError] = []
    while True:
        try:
            frame = await reader.read()
        except FrameError as exc:
            out.append(exc)
            if exc.fatal:
                return out
            continue
        if frame is None:
            return out
        out.append(frame)


FRAMES = [{"op": "hello", "id": 1}, {"op": "send", "group": "g", "payload": b"\x00\xff" * 100}, {"ok": True}]


async def test_whole_and_byte_by_byte_give_the_same_frames() -> None:
    data = b"".join(encode_frame(f) for f in FRAMES)
    assert await read_all([data]) == FRAMES
    assert await read_all([data[i:i + 1] for i in range(len(data))]) == FRAMES


async def test_trailing_junk_is_a_fatal_error_after_the_good_frames() -> None:
    data = b"".join(encode_frame(f) for f in FRAMES) + b"\x00\x00"
    out = await read_all([data])
    assert out[:3] == FRAMES
    assert isinstance(out[3], FrameError) and out[3].fatal and out[3].code == "bad-frame"


@pytest.mark.parametrize(("body", "code"), [
    (b"\xc1", "bad-frame"), (b"\x93\x01\x02\x03", "bad-frame"), (b"\x81\x01\x02", "bad-frame"), (b"", "bad-frame"),
])
async def test_bad_bodies_are_reported_and_the_stream_goes_on(body: bytes, code: str) -> None:
    data = struct.pack(">I", len(body)) + body + encode_frame({"op": "hello"})
    out = await read_all([data])
    assert isinstance(out[0], FrameError) and out[0].code == code and not out[0].fatal
    assert out[1] == {"op": "hello"}


async def test_an_oversize_length_is_refused_before_reading_the_body() -> None:
    out = await read_all([struct.pack(">I", 1 << 30)])
    assert isinstance(out[0], FrameError) and out[0].code == "frame-too-large" and out[0].fatal
