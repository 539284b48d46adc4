"""Group name -> multicast address and port (RMP paper, section 3.1).

The default mapping hashes the name into an administratively scoped range (239.0.0.0/8: 24 bits of address) and
15 bits of port with the high bit set, so hashed ports never collide with statically assigned ones.  Two names may
hash to the same pair; membership view IDs in every packet keep such groups apart.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress

DEFAULT_RANGE = "239.0.0.0/8"


@functools.lru_cache(maxsize=1024)
def group_address(name: str, address_range: str = DEFAULT_RANGE) -> tuple[str, int]:
    """The multicast (address, port) a group name maps to inside ``address_range`` (cached: the daemon asks
    for every datagram it sends)."""
    if not name or len(name) > 255:
        raise ValueError("a group name is 1 to 255 characters")
    network = ipaddress.IPv4Network(address_range)
    if not network.is_multicast:
        raise ValueError(f"{address_range} is not a multicast range")
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    host_bits = network.max_prefixlen - network.prefixlen
    offset = (digest >> 15) % (1 << host_bits) if host_bits else 0
    address = network.network_address + offset
    port = 0x8000 | (digest & 0x7FFF)
    return str(address), port
