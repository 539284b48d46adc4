"""The daemon's Prometheus endpoint: ``GET /metrics`` answered from the loop's registry, inside the trio loop.

``prometheus_client`` writes the exposition (``generate_latest``, with the format its ``Accept`` header asks for);
what is here is only the HTTP around it.  It runs in the daemon's own trio loop, not in the library's server thread,
because the collector reads the engine's counters and groups as a scrape asks, and the engine belongs to that loop:
read from another thread it could be caught mid-change.  One request per connection, a bounded header, a deadline
per client, so a slow or hostile scraper costs a socket and nothing else.
"""

from __future__ import annotations

import contextlib

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

MAX_REQUEST = 8192
"""Bytes of request line and headers read at most; a longer request is answered 431."""

CLIENT_DEADLINE = 10.0
"""Seconds a scraper has to send its request and read the answer."""


class MetricsAddressError(Exception):
    """The metrics address cannot be served (bad form, or the port is taken)."""


def parse_address(value: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``":PORT"`` for every interface) as (host, port); ValueError naming the mistake."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics must be HOST:PORT (e.g. 127.0.0.1:9464), got {value!r}")
    return host or "0.0.0.0", int(port)


async def open_metrics_listeners(address: str) -> tuple[list[trio.SocketListener], str]:
    """Bind ``address`` (before the daemon reports ready, so a taken port stops it with a clear error); the
    listeners and the bound ``host:port``."""
    host, port = parse_address(address)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise MetricsAddressError(f"cannot serve metrics on {host}:{port}: {exc.strerror} (is another exporter or "
                                  f"daemon using that port? choose another with --metrics HOST:PORT)") from None
    bound = listeners[0].socket.getsockname()
    return listeners, f"{bound[0]}:{bound[1]}"


async def serve_metrics(registry: CollectorRegistry, listeners: list[trio.SocketListener]) -> None:
    """Answer scrapes of ``registry`` on ``listeners`` until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        with trio.move_on_after(CLIENT_DEADLINE):
            await _answer(stream, registry)
        await trio.aclose_forcefully(stream)

    await trio.serve_listeners(handle, listeners)


async def _answer(stream: trio.SocketStream, registry: CollectorRegistry) -> None:
    request = b""
    while b"\r\n\r\n" not in request and b"\n\n" not in request:
        if len(request) > MAX_REQUEST:
            await _respond(stream, "431 Request Header Fields Too Large", b"request too large\n")
            return
        try:
            chunk = await stream.receive_some(4096)
        except trio.BrokenResourceError:
            return
        if not chunk:
            return
        request += chunk
    head = request.split(b"\n", 1)[0].decode("latin-1").split()
    if len(head) < 2 or head[0] not in ("GET", "HEAD"):
        await _respond(stream, "405 Method Not Allowed", b"only GET /metrics\n")
        return
    path = head[1].split("?", 1)[0]
    if path not in ("/metrics", "/"):
        await _respond(stream, "404 Not Found", b"metrics are at /metrics\n")
        return
    accept = ""
    for line in request.decode("latin-1").splitlines()[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "accept":
            accept = value.strip()
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    await _respond(stream, "200 OK", b"" if head[0] == "HEAD" else body, content_type, len(body))


async def _respond(stream: trio.SocketStream, status: str, body: bytes,
                   content_type: str = "text/plain; charset=utf-8", length: int | None = None) -> None:
    header = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
              f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(header.encode("latin-1") + body)
