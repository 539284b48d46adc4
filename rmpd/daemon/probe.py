"""Does multicast sent on this address come back to this host?  (IP_MULTICAST_LOOP, routes, interface flags.)

Several daemons on one host form a ring only if each hears the others' multicasts through the loop.  Some hosts
need a route (``ip route add 224.0.0.0/4 dev lo``) before that works on loopback, so the daemon checks at start-up
and says so, and the test fixtures and scripts use the same check instead of assuming.
Run ``python -m rmpd.daemon.probe [IP]``: exit 0 when multicast loops back on IP (default 127.0.0.1).
"""

from __future__ import annotations

import os
import select
import sys

from rmpd.runtime.sockets import open_multicast, open_unicast

PROBE_GROUP = "239.255.77.77"


def multicast_loops(ip: str, timeout: float = 0.5) -> bool:
    port = 20000 + os.getpid() % 20000
    try:
        receiver = open_multicast(PROBE_GROUP, port, ip)
    except OSError:
        return False
    try:
        sender = open_unicast(ip, 0, 1)
    except OSError:
        receiver.close()
        return False
    with receiver, sender:
        token = os.urandom(8)
        try:
            sender.sendto(token, (PROBE_GROUP, port))
        except OSError:
            return False
        while True:
            ready, _, _ = select.select([receiver], [], [], timeout)
            if not ready:
                return False
            try:
                data, _ = receiver.recvfrom(64)
            except BlockingIOError:
                continue
            if data == token:
                return True


if __name__ == "__main__":
    sys.exit(0 if multicast_loops(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1") else 1)
