"""The UDP sockets of one RMP process.

One unicast socket bound to ``ip:port`` is the process ID: everything the process sends leaves from it (so the
source address of its multicasts is its ID too), and unicasts to it arrive there.  Each group address the process
listens on gets its own socket bound to that multicast address and port, so groups whose names hash to different
addresses never see each other's traffic, and several processes on one host (SO_REUSEADDR) all get a copy.
Sockets are non-blocking stdlib sockets: the process loop sends synchronously from its drain step and waits for
input with trio; what a full send buffer refuses waits in :class:`DatagramSender` (back-pressure, not loss).
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

log = logging.getLogger("rmpd")

MAX_DATAGRAM = 65535


def _datagram_socket(setup: Callable[[socket.socket], None]) -> socket.socket:
    """A non-blocking UDP socket with a large receive buffer, set up by ``setup``; closed again if that fails."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        setup(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def open_unicast(ip: str, port: int, ttl: int) -> socket.socket:
    """Bind the process's own socket; multicasts it sends go out on the interface of ``ip`` and loop back."""

    def setup(sock: socket.socket) -> None:
        sock.bind((ip, port))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ip))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)

    return _datagram_socket(setup)


def open_multicast(group_ip: str, port: int, interface_ip: str) -> socket.socket:
    """A socket that receives ``group_ip:port`` on the interface of ``interface_ip``."""

    def setup(sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((group_ip, port))
        membership = struct.pack("4s4s", socket.inet_aton(group_ip), socket.inet_aton(interface_ip))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)

    return _datagram_socket(setup)


SEND_BACKLOG_BYTES = 16 * 1024 * 1024
"""Bytes of datagrams the sender holds while its socket is full, at most: beyond it a datagram is dropped (counted
``send_dropped``).  The engine's windows bound what it sends unacknowledged far below this, so only a socket that
stays full for long (a link far slower than the windows allow for) ever reaches it."""

RETRY_AFTER_NO_BUFFERS = 0.001
"""Seconds to wait before sending again after ``ENOBUFS``: the socket reads as writable, so waiting for that would
not wait at all."""


class DatagramSender:
    """Sends datagrams from the unicast socket, setting the multicast TTL per group; counts what fails.

    A full socket (``EAGAIN``, or ``ENOBUFS`` from the interface's queue) is back-pressure, not loss: the datagram
    waits here and :meth:`flush_forever` sends it once the socket takes more.  Control datagrams (anything but
    data: the token's ACKs, NACKs, confirms, membership) wait in a queue of their own that goes first, and a control
    datagram is tried at once even while data waits, so a saturated link never holds the ring's control traffic
    behind bulk data in this process (what a member sends late looks, to the others, like a member that failed)."""

    def __init__(self, sock: socket.socket, stats: Counter[str]) -> None:
        self.sock = sock
        self.stats = stats
        self._ttl = sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL)
        self.waiting_control: deque[tuple[bytes, tuple[str, int], int | None]] = deque()
        self.waiting_data: deque[tuple[bytes, tuple[str, int], int | None]] = deque()
        self.waiting_bytes = 0
        self._backlog = trio.Event()
        """Set when something waits: :meth:`flush_forever` wakes on it."""
        self._no_buffers = False
        """The last send failed with ENOBUFS, which leaves the socket writable: wait a moment instead."""
        self.on_busy: Callable[[bool], None] | None = None
        """Told when data starts waiting here (True) and when the last of it has gone (False): the process's
        back-pressure (``RmpProcess.set_link_busy``)."""

    def send(self, data: bytes, addr: tuple[str, int], ttl: int | None = None, *, bulk: bool = False) -> None:
        """Send ``data`` now, or queue it while the socket is full; ``bulk``: a data packet, which waits behind
        control datagrams (and behind earlier data, so one sender's packets keep their order)."""
        if bulk and (self.waiting_data or self.waiting_control):
            self._wait(self.waiting_data, data, addr, ttl)
            return
        if not bulk and self.waiting_control:
            self._wait(self.waiting_control, data, addr, ttl)
            return
        if not self._try(data, addr, ttl):
            self._wait(self.waiting_data if bulk else self.waiting_control, data, addr, ttl)

    def _try(self, data: bytes, addr: tuple[str, int], ttl: int | None) -> bool:
        """Send one datagram; False when the socket is full (try again later).  Other errors are counted and the
        datagram is given up, as a loss the protocol recovers from."""
        try:
            if ttl is not None and ttl != self._ttl:
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
                self._ttl = ttl
            self.sock.sendto(data, addr)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                self._no_buffers = True
                return False
            self.stats["send_errors"] += 1
            return True
        self.stats["datagrams_sent"] += 1
        return True

    def _wait(self, queue: deque[tuple[bytes, tuple[str, int], int | None]], data: bytes, addr: tuple[str, int],
              ttl: int | None) -> None:
        if self.waiting_bytes + len(data) > SEND_BACKLOG_BYTES:
            self.stats["send_dropped"] += 1
            return
        became_busy = queue is self.waiting_data and not queue
        queue.append((data, addr, ttl))
        self.waiting_bytes += len(data)
        self.stats["send_deferred"] += 1
        self._backlog.set()
        if became_busy and self.on_busy is not None:
            self.on_busy(True)

    def flush(self) -> bool:
        """Send what waits, control first, while the socket takes it; True when nothing waits any more."""
        had_data = bool(self.waiting_data)
        for queue in (self.waiting_control, self.waiting_data):
            while queue:
                data, addr, ttl = queue[0]
                if not self._try(data, addr, ttl):
                    return False
                queue.popleft()
                self.waiting_bytes -= len(data)
        if had_data and self.on_busy is not None:
            self.on_busy(False)
        return True

    async def flush_forever(self) -> None:
        """Send waiting datagrams whenever the socket can take them (run in the process loop's nursery)."""
        while True:
            await self._backlog.wait()
            # A fresh event before flushing: what the last flush's on_busy(False) has the process send, if the
            # socket refuses it, sets this one and is flushed in the next round.
            self._backlog = trio.Event()
            while not self.flush():
                if self._no_buffers:
                    self._no_buffers = False
                    await trio.sleep(RETRY_AFTER_NO_BUFFERS)
                else:
                    await trio.lowlevel.wait_writable(self.sock)


@dataclass
class Listener:
    """One multicast socket, shared by every group whose name hashes to its address and port."""

    sock: socket.socket
    scope: trio.CancelScope
    groups: set[str] = field(default_factory=set)


class MulticastListeners:
    """The multicast sockets a process listens on, one per address and port: opened before a join (to hear the
    answer) and closed once the last group hashed to it is left."""

    def __init__(self, interface_ip: str) -> None:
        self.interface_ip = interface_ip
        self.by_address: dict[tuple[str, int], Listener] = {}

    def listen(self, group: str, address: tuple[str, int], serve: Callable[[Listener], None] | None) -> None:
        """Listen for ``group`` on ``address``; ``serve`` starts reading a socket opened for it (None: nothing can
        read one now, RuntimeError if a socket must be opened)."""
        listener = self.by_address.get(address)
        if listener is None:
            if serve is None:
                raise RuntimeError("the process loop is not running")
            listener = Listener(open_multicast(address[0], address[1], self.interface_ip), trio.CancelScope())
            self.by_address[address] = listener
            serve(listener)
            log.info("listening on %s:%d for group %s", address[0], address[1], group)
        listener.groups.add(group)

    def unlisten(self, group: str) -> None:
        """Stop listening for ``group``: a socket no other group needs is closed and its reader cancelled."""
        for address, listener in list(self.by_address.items()):
            listener.groups.discard(group)
            if not listener.groups:
                listener.scope.cancel()
                trio.lowlevel.notify_closing(listener.sock)
                listener.sock.close()
                del self.by_address[address]

    def close(self) -> None:
        for listener in self.by_address.values():
            listener.sock.close()
        self.by_address.clear()
