"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET, so `Type=notify` units know when we serve."""

from __future__ import annotations

import os
import socket


def sd_notify(state: str) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to the service manager; False when not run by one or when it fails."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True
