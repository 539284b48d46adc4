"""The local API's framing: a 4-byte big-endian length, then one msgpack map.

Both the daemon and the client library use this module, so the two ends cannot disagree about the format.  Bytes
from the other end are untrusted: anything that is not a well-formed frame surfaces as :class:`FrameError` only,
with the code the daemon sends back in its structured error.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import trio

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
        raise FrameError("bad-frame", f"frame is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise FrameError("bad-frame", f"a frame must be a map, got {type(obj).__name__}")
    if not all(isinstance(k, str) for k in obj):
        raise FrameError("bad-frame", "frame keys must be strings")
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
                raise FrameError("bad-frame", "stream ended inside a frame header", fatal=True)
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self.max_frame:
            raise FrameError("frame-too-large", f"frame of {length} bytes exceeds the limit of {self.max_frame}",
                             fatal=True)
        if not await self._fill(HEADER.size + length):
            raise FrameError("bad-frame", "stream ended inside a frame", fatal=True)
        body = self._buffer[HEADER.size:HEADER.size + length]  # one copy; msgpack reads a bytearray as well
        del self._buffer[:HEADER.size + length]
        return decode_body_untrusted(body)
