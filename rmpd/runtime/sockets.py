"""The UDP sockets of one RMP process.

One unicast socket bound to ``ip:port`` is the process ID: everything the process sends leaves from it (so the
source address of its multicasts is its ID too), and unicasts to it arrive there.  Each group address the process
listens on gets its own socket bound to that multicast address and port, so groups whose names hash to different
addresses never see each other's traffic, and several processes on one host (SO_REUSEADDR) all get a copy.
Sockets are non-blocking stdlib sockets: the process loop sends synchronously from its drain step (a full send
buffer is counted as a drop, like any loss the protocol already recovers from) and waits for input with trio.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections import Counter
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


class DatagramSender:
    """Sends datagrams from the unicast socket, setting the multicast TTL per group; counts what fails."""

    def __init__(self, sock: socket.socket, stats: Counter[str]) -> None:
        self.sock = sock
        self.stats = stats
        self._ttl = sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL)

    def send(self, data: bytes, addr: tuple[str, int], ttl: int | None = None) -> None:
        try:
            if ttl is not None and ttl != self._ttl:
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
                self._ttl = ttl
            self.sock.sendto(data, addr)
            self.stats["datagrams_sent"] += 1
        except BlockingIOError:
            self.stats["send_dropped"] += 1
        except OSError:
            self.stats["send_errors"] += 1


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
