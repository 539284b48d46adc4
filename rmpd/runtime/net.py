"""Where a process binds, and how large its packets may be: the network interface questions a daemon and an
embedded node both ask before they start."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import netifaces

from rmpd.protocol.config import EngineConfig


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and what is wrong with it."""


def loopback_interface() -> str:
    for name in netifaces.interfaces():
        for entry in netifaces.ifaddresses(name).get(netifaces.AF_INET, []):
            if entry.get("addr", "").startswith("127."):
                return name
    raise ConfigError("no loopback interface with an IPv4 address")


def interface_address(name: str) -> str:
    if name not in netifaces.interfaces():
        raise ConfigError(f"interface {name!r} does not exist (have: {', '.join(netifaces.interfaces())})")
    entries = netifaces.ifaddresses(name).get(netifaces.AF_INET, [])
    if not entries:
        raise ConfigError(f"interface {name!r} has no IPv4 address")
    return entries[0]["addr"]


UNFRAGMENTED_PACKET = 60 * 1024
"""MAX_PACKET where a datagram of that size crosses the interface whole (loopback's 64 KiB MTU)."""
DATAGRAM_OVERHEAD = 2048
"""IP and UDP headers, the RMP header and packing's per-message framing, with room to spare."""
PATH_OVERHEAD = 20 + 8 + 96 + 34
"""What a datagram adds to MAX_PACKET bytes of messages on an interface with a small MTU: the IP and UDP headers,
the RMP header and a data packet's fields with the longest process IDs, and sealing with encryption (prefix, nonce
and tag).  Packing counts its per-message framing against MAX_PACKET itself."""
SMALLEST_PACKET = 512
"""MAX_PACKET never goes below this, whatever the MTU says (an MTU under 670 bytes is fragmented instead)."""


def packet_limits_for(address: str) -> dict[str, int]:
    """MAX_PACKET and MIN_PACKET (figure 4.2) for a process on ``address``, as ``EngineConfig`` fields to set.

    Per datagram the costs are fixed (system calls, decoding, the engine's step, an ACK's share), so larger packets
    carry packed messages for less: where the interface carries 60 KiB datagrams whole (loopback), MAX_PACKET is
    that.  Elsewhere MAX_PACKET stays the engine's 16 KiB, and MIN_PACKET is what fits the interface's MTU whole:
    packets shrink with the send window toward it (figure 4.2) where the window's floor (``min_window``) lets
    them, which the delay window's default floor does not (packets of one MTU cost the cores more than their
    fragments risk while the window keeps the bottleneck's queue from overflowing; docs/protocol.md).  With no
    MTU to read, the engine's defaults stay.  ``max_packet`` and ``min_packet`` in ``[timers]`` set either."""
    mtu = interface_mtu(interface_of(address))
    if mtu is None:
        return {}
    if mtu >= UNFRAGMENTED_PACKET + DATAGRAM_OVERHEAD:
        return {"max_packet": UNFRAGMENTED_PACKET}
    return {"min_packet": max(SMALLEST_PACKET, min(EngineConfig.min_packet, mtu - PATH_OVERHEAD))}


def interface_of(address: str) -> str | None:
    """The interface with IPv4 ``address`` in its network (127.0.0.2 is on lo, whose address is 127.0.0.1/8), or
    None."""
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    for name in netifaces.interfaces():
        for entry in netifaces.ifaddresses(name).get(netifaces.AF_INET, []):
            try:
                if wanted in ipaddress.IPv4Interface(f"{entry['addr']}/{entry.get('netmask', '32')}").network:
                    return name
            except (KeyError, ValueError):
                continue
    return None


def interface_mtu(name: str | None) -> int | None:
    """The MTU of interface ``name`` (Linux sysfs), or None when it cannot be read."""
    if name is None:
        return None
    try:
        return int(Path("/sys/class/net", name, "mtu").read_text())
    except (OSError, ValueError):
        return None


__all__ = ["ConfigError", "interface_address", "interface_mtu", "interface_of", "loopback_interface",
           "packet_limits_for"]
