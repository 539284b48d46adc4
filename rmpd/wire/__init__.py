"""Codecs of a datagram's outer layers, below the runtime and beside the packet codec (rmpd.protocol.packets):
sealing and opening under a group key (``sealing``) and the forwarding flag (``forwarding``).

Sans-IO like the protocol core: keys, nonces and the time are passed in, so the runtime, the auditor and tests
read and write the same bytes without a socket, a clock or a key file.
"""
