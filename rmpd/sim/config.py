"""What a simulation run is asked to do (``SimConfig``, as ``rmp sim`` flags) and what it reports (``SeedResult``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..protocol.flow import CONGESTION_CONTROLS
from . import QOS_CHOICES
from .network import LinkFaults

SIM_EPOCH = 1_700_000_000.0
"""Wall-clock time journaled for virtual time 0."""
GROUP = "sim"
"""The one group every simulated process is (or wants to be) a member of."""


@dataclass(frozen=True)
class SimConfig:
    members: int = 5
    senders: int = 3
    messages: int = 100
    size: int = 100
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    qos: str = "total"
    crash: int = 0
    partition: bool = False
    joins: int = 0
    leaves: int = 0
    locks: bool = False
    calls: int = 0
    """Calls from a non-member process to handler 0, held by the first member (multi-RPC with SCMP)."""
    restarts: int = 0
    """Members that crash and start again on the same process ID (a new incarnation), which rejoin at once."""
    simultaneous: bool = False
    """The first members found the group by all joining at time 0, instead of in one view made out of band."""
    call_dup: int = 1
    """Copies of every Non Member Data datagram the caller puts on the wire."""
    send_interval: float = 0.002
    """Mean gap between one sender's messages (exponentially distributed), in virtual seconds."""
    max_time: float = 900.0
    """Virtual seconds after which a run that has not fallen silent counts as not quiescent."""
    congestion: str | None = None
    """The members' congestion control (``flow.CONGESTION_CONTROLS``); None: the engine's default."""
    keys: bool = False
    """Every totally ordered (or above) message carries a key of its own, and the application resends each one
    reported undelivered, or in flight when its process crashed, until it is delivered or told AlreadyDelivered."""

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ValueError("--members must be at least 1")
        if not 0 <= self.senders <= self.members:
            raise ValueError("--senders must be between 0 and --members")
        if self.messages < 0 or self.size < 0:
            raise ValueError("--messages and --size must not be negative")
        if self.qos not in QOS_CHOICES:
            raise ValueError(f"--qos must be one of {', '.join(QOS_CHOICES)}")
        if self.crash < 0 or self.joins < 0 or self.leaves < 0 or self.restarts < 0:
            raise ValueError("--crash, --restarts, --joins and --leaves must not be negative")
        if self.leaves >= self.members:
            raise ValueError("--leaves must leave at least one member")
        if self.calls < 0 or self.call_dup < 1:
            raise ValueError("--calls must not be negative and --call-dup must be at least 1")
        LinkFaults(loss=self.loss, dup=self.dup, reorder=self.reorder)
        if self.congestion is not None and self.congestion not in CONGESTION_CONTROLS:
            raise ValueError(f"--congestion must be one of {', '.join(CONGESTION_CONTROLS)}")

    @property
    def membership_faults(self) -> bool:
        return bool(self.crash or self.restarts or self.partition or self.joins or self.leaves or self.locks
                    or self.simultaneous)

    def cli_args(self) -> list[str]:
        """The ``rmp sim`` flags that reproduce this configuration."""
        args = [
            "--members", str(self.members), "--senders", str(self.senders), "--messages", str(self.messages),
            "--size", str(self.size), "--loss", str(self.loss), "--dup", str(self.dup),
            "--reorder", str(self.reorder), "--qos", self.qos,
        ]
        if self.crash:
            args += ["--crash", str(self.crash)]
        if self.restarts:
            args += ["--restarts", str(self.restarts)]
        if self.simultaneous:
            args.append("--simultaneous")
        if self.partition:
            args.append("--partition")
        if self.joins:
            args += ["--joins", str(self.joins)]
        if self.leaves:
            args += ["--leaves", str(self.leaves)]
        if self.locks:
            args.append("--locks")
        if self.calls:
            args += ["--calls", str(self.calls), "--call-dup", str(self.call_dup)]
        if self.congestion is not None:
            args += ["--congestion", self.congestion]
        if self.keys:
            args.append("--keys")
        return args

    def replay_command(self, seed: int) -> str:
        return " ".join(["rmp", "sim", *self.cli_args(), "--seed", str(seed)])


@dataclass
class SeedResult:
    seed: int
    violations: list[dict[str, str]]
    violation_count: int
    delivered: int
    expected: int
    quiescent: bool
    liveness: bool
    sim_time: float
    datagrams: int
    views_installed: int = 0
    one_view: bool = True
    """At the end every live process is a member of one and the same view, which holds all of them."""
    convergence_seconds: float = 0.0
    """From the last fault (a restart, a join, a heal) to the last view installed anywhere."""
    reformations: int = 0
    detection_seconds: float = 0.0
    detections: list[float] = field(default_factory=list)
    """Seconds from each crash to the first view without the crashed process installed by one of its fellow
    members (the processes whose view held it when it crashed)."""
    crashes_untimed: int = 0
    """Crashes no fellow member ever installed a view without: a partition had cut the process off and its side
    stopped (below the minimum partition) while the majority had already removed it, or the fellows crashed too."""
    stats: dict[str, int] = field(default_factory=dict)
    max_ack_slots: int = 0
    calls: int = 0
    calls_replied: int = 0
    calls_failed: dict[str, int] = field(default_factory=dict)
    keys_sent: int = 0
    """Distinct keys the applications gave their messages (``--keys``)."""
    keys_delivered: int = 0
    """Of those, the keys some member delivered."""
    keys_resent: int = 0
    """Copies of keyed messages sent again (after Undelivered, or a crash with the message in flight)."""
    keys_already_delivered: int = 0
    """Copies their senders were told the group had delivered already."""
    keys_abandoned: int = 0
    """Keys whose application left the group before they were settled: nobody resends them."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
