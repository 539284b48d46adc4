"""Engine timers and limits.  Times are in seconds of whatever clock the caller passes in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    rto_initial: float = 0.005
    """First retransmission timeout for packets that need a positive acknowledgement (data, ACK passes), used until
    a round trip has been measured."""
    rto_min: float = 0.001
    """Timers computed from measured round trips (token passes, own data, NACKs) never go below this.  A round trip
    between nearby hosts is well under a millisecond, and under loss the ring waits on these timers: with a 5 ms
    floor a lost token pass or NACK answer cost many round trips each (docs/protocol.md)."""
    rto_max: float = 2.0
    """Exponential back-off is clamped here (RMP paper, section 4.6)."""
    null_ack_interval: float = 1.0
    """A token site idle this long passes the token with a NULL ACK (section 4.2)."""
    null_ack_prompt: float = 0.001
    """... or only this long while packets it ordered are not yet stable (so resilient messages are not delayed)."""
    nack_delay: float = 0.01
    """Wait at most this long after spotting a hole before the first NACK, so a merely reordered packet is not asked
    for; once NACKs have been answered, the wait is their smoothed round trip (at least ``rto_min``)."""
    nack_timeout: float = 0.02
    """Resend an unanswered NACK after at most this long (doubling once it names no site, up to four times this),
    sooner when answered NACKs show a shorter round trip (its timeout, at least ``rto_min``).  Short, because the
    next token site waits for the packets it asks for, and with it the whole ring."""
    nack_rotate: int = 3
    """After this many unanswered NACKs a NACK names no site, so any site holding the packets answers."""
    stall_timeout: float = 1.5
    """With undelivered messages and no new ACK for this long, ask for anything beyond the last known ACK."""
    window_packets: int = 64
    """Own packets in flight (sent, not yet ordered) at most, whatever the byte window allows."""
    min_packet: int = 8192
    """MIN_PACKET of figure 4.2: packets shrink with the window (to half of it) down to this size, and packing
    always allows this much; the window floor (``min_window``) is never below it."""
    max_packet: int = 16384
    """MAX_PACKET of figure 4.2: packing gathers small messages into packets of at most this many bytes."""
    min_window: int = 0
    """A cut never takes the send window below this; 0 means two of the largest packets (2 * ``max_packet``), as
    TCP never sets its slow-start threshold below two segments (RFC 5681), and for the delay window
    ``DelayWindow.FLOOR`` (16 KiB) or two of the largest packets if that is less.  Random loss cuts the window
    about once per round trip, so under loss it sits at this floor, and a floor of one packet would leave a sender
    one packet per token pass (docs/benchmarks.md)."""
    max_message: int = 16 * 1024 * 1024
    """Largest application message; larger than ``max_packet``, it travels as fragments and is delivered whole."""
    initial_window: int = 65536
    """Bytes in flight a sender starts with; slow start grows it from there (section 4.6)."""
    max_window: int = 1 << 20
    """The byte window's ceiling."""
    congestion: str = "delay"
    """Congestion control (``flow.CONGESTION_CONTROLS``): ``delay``, a window that finds a link's rate from the
    queueing delay of each ordering site and keeps that queue short (``flow.DelayWindow``); ``rmp``, the paper's
    window (section 4.6); or ``fixed``, a window held at ``max_window``.  ``delay`` is the default because it
    holds 0.9 of a rate-limited link where ``rmp`` reaches 0.3 to 0.6, does better under random loss, and costs the
    same where the CPU is the limit (docs/benchmarks.md)."""
    max_ack_ids: int = 64
    """Data packets one ACK orders at most."""
    retransmit_burst: int = 16
    """Own unordered packets resent per retransmission timeout at most: the oldest one on a first expiry, twice as
    many on each expiry in a row after it."""
    nack_response_limit: int = 64
    """Packets resent for one tail NACK at most."""
    max_ahead: int = 65536
    """A packet naming a timestamp more than this far beyond the last consecutive one held is dropped: every slot
    up to it would have to be allocated, so a hostile or corrupt timestamp could exhaust memory.  A member this far
    behind catches up through NACKs instead."""
    request_interval: float = 0.5
    """First resend interval of an unanswered List Change Request (doubling up to rto_max)."""
    join_retries: int = 6
    """Unanswered join requests before a process forms a group of its own (or gives up, for existing-only joins)."""
    leave_linger: float = 30.0
    """A departed member answers NACKs at most this long while waiting for what it held to become stable."""
    fail_after: float = 4.5
    """... and a failure needs this long without an answer as well as ``fail_retries`` expiries (a timer expires at
    that moment if doubling would pass it), so timers that adapt below ``rto_initial`` on a fast network do not make
    failure detection quicker and jumpier than the paper's "within 5 seconds" for nearby sites."""
    fail_retries: int = 10
    """A process that leaves this many timer expiries in a row unanswered (each followed by a retransmission but
    the last) is declared failed: 4.6 s from a 5 ms timer, the paper's "within 5 seconds" for nearby sites."""
    alive_interval: float = 1.0
    """Every member multicasts an Alive this often, busy or idle: a quiet ring still notices a member silent for
    ``fail_after`` (and another view of its group that it can hear again) at one datagram per second per member.
    0 turns Alives off: failures are then found only by unanswered retransmissions, as in the paper."""
    recovery_interval: float = 0.2
    """Reformation: interval between Recovery Start polls and New List resends."""
    recovery_patience: int = 5
    """Reformation: rounds without progress before the initiator settles (or aborts)."""
    recovery_backoff: tuple[float, float] = (0.3, 1.5)
    """Random wait, in this range, before restarting an aborted reformation."""
    minority_attempts: int = 3
    """Reformations in a row that find fewer members than the minimum partition before this process stops."""
    reformation_attempts: int = 8
    """Failed reformations in a row (not counting ones given up for a higher one) before this process stops."""
    key_retention_count: int = 100_000
    """Keys of delivered keyed messages each member keeps at most (exactly-once sends, rmpd.protocol.keys): a
    resend of a key forgotten is delivered again."""
    key_retention_seconds: float = 86_400.0
    """... and for at most this long, in the group's time (the keyed messages' stamps, carried in the order)."""
    journal: bool = False
    """Produce journal records (docs/trace-format.md)."""
