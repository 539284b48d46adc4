"""The forwarding flag (RMP paper, sections 3.3 and 3.4): a datagram a process sends to a named member's unicast
port for that member to multicast to the group.

A process whose multicasts cannot reach the group (its host cannot send multicast, or it is far from the group's
multicast scope) names a member (``via``, a process ID) and sends it every multicast it would make, wrapped:

    ``b"RF"`` group-name-length (2 bytes, big-endian) group-name (UTF-8) datagram

The datagram inside is exactly what would have been multicast, sealed with the group key if there is one, so the
forwarder copies it unchanged and every receiver checks it as the sender made it.  The forwarder multicasts it to
the group's address, unicasts a copy to each member that cannot receive multicast (bar the sender), and takes it
itself as received from the sender.  The flag travels outside the sealed packet because the forwarder must read it
without the key, and it adds nothing a receiver trusts: only the packet inside is ever acted on.
"""

from __future__ import annotations

FORWARD_TAG = b"RF"

_HEADER = len(FORWARD_TAG) + 2


def wrap(group: str, datagram: bytes) -> bytes:
    """``datagram`` (as it would be multicast to ``group``) with the forwarding flag, for a forwarding member."""
    name = group.encode()
    return FORWARD_TAG + len(name).to_bytes(2, "big") + name + datagram


def unwrap(data: bytes) -> tuple[str, bytes] | None:
    """The group and the datagram to multicast, or None for a forwarding datagram that is not well formed."""
    if len(data) < _HEADER or data[:2] != FORWARD_TAG:
        return None
    end = _HEADER + int.from_bytes(data[2:4], "big")
    if end >= len(data):
        return None
    try:
        group = data[_HEADER:end].decode()
    except UnicodeDecodeError:
        return None
    return (group, data[end:]) if group else None
