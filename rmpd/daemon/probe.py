"""Does multicast sent on this address come back to this host?  (IP_MULTICAST_LOOP, routes, interface flags.)

Several daemons on one host form a ring only if each hears the others' multicasts through the loop.  Some hosts
need a route (``ip route add 224.0.0.0/4 dev lo``) before that works on loopback, so the daemon checks at start-up
and says so, and the test fixtures and scripts use the same check instead of assuming.
Run ``python -m rmpd.daemon.probe [IP]``: it says what it found, and exits 0 when multicast loops back on IP
(default 127.0.0.1), 1 when it does not, 2 for an IP that is not an IPv4 address.
"""

from __future__ import annotations

import ipaddress
import os
import select
import sys

from rmpd.runtime.sockets import open_multicast, open_unicast

PROBE_GROUP = "239.255.77.77"


def multicast_loops(ip: str, timeout: float = 0.5) -> bool:
    return probe_multicast(ip, timeout) is None


def probe_multicast(ip: str, timeout: float = 0.5) -> str | None:
    """None when a datagram multicast on ``ip`` comes back to this host; otherwise why it did not, in one line."""
    port = 20000 + os.getpid() % 20000
    try:
        receiver = open_multicast(PROBE_GROUP, port, ip)
    except OSError as exc:
        return f"cannot join {PROBE_GROUP} on {ip}: {exc.strerror or exc}"
    try:
        sender = open_unicast(ip, 0, 1)
    except OSError as exc:
        receiver.close()
        return f"cannot open a UDP socket on {ip}: {exc.strerror or exc}"
    with receiver, sender:
        token = os.urandom(8)
        try:
            sender.sendto(token, (PROBE_GROUP, port))
        except OSError as exc:
            return f"cannot send to {PROBE_GROUP}:{port} from {ip}: {exc.strerror or exc}"
        while True:
            ready, _, _ = select.select([receiver], [], [], timeout)
            if not ready:
                return f"a datagram sent to {PROBE_GROUP}:{port} from {ip} did not come back within {timeout} s"
            try:
                data, _ = receiver.recvfrom(64)
            except BlockingIOError:
                continue
            if data == token:
                return None


def main(argv: list[str]) -> int:
    """Probe the address in ``argv`` (default 127.0.0.1) and say what was found; the exit status says it too."""
    ip = argv[0] if argv else "127.0.0.1"
    try:
        address = ipaddress.IPv4Address(ip)
    except ValueError:
        print(f"usage: python -m rmpd.daemon.probe [IPv4 address]; {ip!r} is not one", file=sys.stderr)
        return 2
    problem = probe_multicast(ip)
    if problem is None:
        print(f"multicast sent on {ip} comes back to this host: daemons on it can hear each other")
        return 0
    hint = " (on loopback: ip route add 224.0.0.0/4 dev lo)" if address.is_loopback else ""
    print(f"multicast sent on {ip} does not come back to this host: {problem}{hint}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
