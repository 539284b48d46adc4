"""What a process's group looks like from outside: a snapshot, so nothing outside the engine reads its state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .ordering import DeliveredBefore
from .view import View


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """One group at one process, at the moment it was asked for (``RmpProcess.status``)."""

    group: str
    view: View
    """The view the application has seen installed."""
    leaving: bool
    """A leave was asked for and is not finished."""
    departed: bool
    """Out of the group: its leave was ordered, or a failure it could not repair stopped it."""
    finished: bool
    """Departed, and nobody needs anything from it any more (its ``Left`` event was given)."""
    reforming: bool
    """A reformation runs or waits to restart: nothing is ordered or delivered meanwhile."""
    next_seq: int
    """The sequence number the next reliable message sent will take."""
    send_queue: int
    """Packets accepted from the application and not yet sent (the window holds them back)."""
    in_flight: int
    """Own packets sent and not yet ordered."""
    window: int
    """The send window in bytes."""
    orderingq_slots: int
    ack_slots: int
    """OrderingQ slots held, and how many of them are ACK or New List slots."""
    packets_held: int
    """Data packets held (ordered and not yet stable, or not yet ordered)."""
    started_at: float
    """The ``now`` at which this membership began."""
    needed: int
    """Members of the view a next view must keep (its minimum partition at its size)."""
    below_minimum: int | None
    """While a reformation runs: the members its last proposal found when that fell below ``needed``; else None."""
    describe_scmp: Callable[[], dict[str, Any]] = field(repr=False, compare=False)
    token_rotations: Callable[[], tuple[list[int], float, int]] = field(repr=False, compare=False,
                                                                         default=lambda: ([], 0.0, 0))
    """Token rotation times here: (per-bucket counts for ``token.ROTATION_BOUNDS`` and above, their sum in seconds,
    their number), read when asked for."""
    counters: Callable[[], dict[str, int]] = field(repr=False, compare=False, default=dict)
    """This membership's own counters (deliveries, retransmissions, ...), read when asked for."""

    @property
    def scmp(self) -> dict[str, Any]:
        """The SCMP call filter and the join floor, as ``rmp status`` shows them (made when asked for: the
        snapshot itself is taken after every step by the simulator)."""
        return self.describe_scmp()


@dataclass(frozen=True, slots=True)
class MembershipEnd:
    """What a finished membership leaves its process for the next membership of the group."""

    rejoin: bool
    """The process joins the group again by itself (the view merged away, or this member was cut off)."""
    last_view: View
    needed: int
    """Members of ``last_view`` a view founded again must hold (its minimum partition at its size)."""
    last_seqs: tuple[int, int]
    """The last (reliable, unreliable) sequence numbers used: a next membership goes on above them."""
    delivered: DeliveredBefore
    """What was delivered here, which the next membership never delivers again."""
