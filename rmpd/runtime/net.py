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


def max_packet_for(address: str) -> int:
    """MAX_PACKET (figure 4.2) for a process on ``address``: 60 KiB where such a datagram needs no IP
    fragmentation, the engine's 16 KiB otherwise.

    Per datagram the costs are fixed (system calls, decoding, the engine's step, an ACK's share), so larger packets
    carry packed messages for less.  On loopback nothing is fragmented or lost, and 60 KiB packets cut the CPU per
    delivered message by about a fifth (docs/benchmarks.md).  On a 1500-byte Ethernet a 16 KiB packet is already
    twelve fragments and a lost fragment loses the packet; 60 KiB would be 42, so the smaller default stays there
    (``max_packet`` in ``[timers]`` sets either)."""
    mtu = interface_mtu(interface_of(address))
    if mtu is not None and mtu >= UNFRAGMENTED_PACKET + DATAGRAM_OVERHEAD:
        return UNFRAGMENTED_PACKET
    return EngineConfig.max_packet


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
           "max_packet_for"]
