"""Flow and congestion control (RMP paper, section 4.6): Van Jacobson's algorithms applied to a multicast sender.

Each sender keeps a window of bytes it may have in transit (sent but not yet ordered by an ACK).  The window grows
by slow start (by the bytes of each packet the first time an ACK orders it, so it doubles per round trip) up to a
threshold and by one packet per round trip after, and is halved when a retransmission timer expires or when a NACK
names one of this sender's packets: NACKs are how overrun receivers tell senders to slow down.  A cache of the
last three NACKed sequence numbers keeps several NACKs for one loss from halving it several times, and a cut never
takes the window below two of the largest packets (as TCP's threshold never goes below two segments).

Timers for packets that need a positive acknowledgement come from a round-trip estimate (mean and mean deviation,
as in TCP), so that a loaded ring does not look like a lossy one; samples are taken only from packets sent once
(Karn's rule).  Everything here is pure arithmetic on values the engine passes in.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import EngineConfig


DelaySample = tuple[str, float, float]
"""(the site whose ACK ordered a packet of ours, seconds from the packet's only transmission to that ACK, seconds
of that the packet waited at the site for the token and for repairs, ``Ack.waits``)."""


class RttEstimator:
    """Smoothed round-trip time and its mean deviation; ``rto`` = srtt + 4 * rttvar, clamped, or ``initial`` until
    the first sample."""

    __slots__ = ("deviation_floor", "initial", "maximum", "minimum", "rttvar", "srtt")

    def __init__(self, initial: float, minimum: float, maximum: float, deviation_floor: float = 0.0) -> None:
        """``deviation_floor``: the mean deviation ``rto`` counts at least (as Linux keeps TCP's at least its
        minimum RTO), so a round trip that has been steady does not make a timer that fires on the first late
        one."""
        self.initial = initial
        self.minimum = minimum
        self.maximum = maximum
        self.deviation_floor = deviation_floor
        self.srtt: float | None = None
        self.rttvar = 0.0

    def sample(self, rtt: float) -> None:
        if rtt < 0:
            return
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar += (abs(rtt - self.srtt) - self.rttvar) / 4
            self.srtt += (rtt - self.srtt) / 8

    @property
    def rto(self) -> float:
        if self.srtt is None:
            return self.initial
        return min(self.maximum, max(self.minimum, self.srtt + 4 * max(self.rttvar, self.deviation_floor)))


class CongestionControl(ABC):
    """How many bytes a sender may have in transit, and how that moves: what the engine's sender asks.

    ``window`` is the current limit in bytes; the engine reports packets sent and ordered, and the two congestion
    signals (a retransmission timeout, a NACK naming one of its packets).  Chosen by ``EngineConfig.congestion``
    from ``CONGESTION_CONTROLS``."""

    window: int
    counts_until_passed = False
    """True: own packets this member orders as token site stay in transit until a later site's ACK, or the next
    site's NACK knowing of the pass, shows the pass (and so every packet ahead of it in our link's queue) got
    through (``Sender.ring_moved``, ``Sender.pass_arrived``), and send-to-then is a sample of the delay and of
    the data timer.  False: they leave the window when ordered, unsampled (the paper's window, and the fixed
    one)."""
    timer_deviation_floor = 0.0
    """Seconds of mean deviation the data timer counts at least (``RttEstimator.deviation_floor``)."""

    @abstractmethod
    def may_send(self, size: int) -> bool:
        """May a packet of ``size`` bytes go now?"""

    @abstractmethod
    def packet_limit(self) -> int:
        """Largest packet to build now (packing fills packets up to it)."""

    @abstractmethod
    def sent(self, size: int) -> None: ...

    @abstractmethod
    def ordered(self, size: int, now: float, sample: DelaySample | None) -> None:
        """The first ACK ordering one of our packets; ``sample``: which site ordered it and how long after it was
        first sent (None: ordered here, or sent more than once)."""

    @abstractmethod
    def congested(self, now: float, round_trip: float) -> bool:
        """A retransmission timer expired; True if the window was cut."""

    @abstractmethod
    def nack_named(self, seq: int, now: float, round_trip: float) -> bool:
        """A NACK asked for our packet ``seq``; True if the window was cut."""


class SendWindow(CongestionControl):
    """Van Jacobson's window as section 4.6 applies it; see the module docstring for how it moves."""

    __slots__ = ("cut_at", "in_flight", "max_packet", "max_window", "min_packet", "min_window", "nacked",
                 "threshold", "window")
    # in_flight: bytes of our packets sent and not yet ordered (the engine adds and removes them).

    def __init__(self, *, min_packet: int, max_packet: int, initial: int, max_window: int,
                 min_window: int = 0) -> None:
        """``min_window``: what a cut never takes the window below (at least ``min_packet``)."""
        self.min_packet = min_packet
        self.min_window = max(min_window, min_packet)
        self.max_packet = max_packet
        self.max_window = max_window
        self.window = max(initial, min_packet)
        self.threshold = max_window
        self.in_flight = 0
        self.nacked: deque[int] = deque(maxlen=3)
        self.cut_at: float | None = None
        """When the window was last halved: signals within one round trip after it are the same congestion."""

    def room(self) -> int:
        return max(0, self.window - self.in_flight)

    def may_send(self, size: int) -> bool:
        """May a packet of ``size`` bytes go now?  One packet may always be in transit, whatever its size, or a
        message larger than the window could never leave; beyond it, the silly-window rule of figure 4.2 holds
        back a packet until its bytes fit."""
        return self.in_flight == 0 or size <= self.room()

    def packet_limit(self) -> int:
        """Largest packet to build now (figure 4.2): up to half the window, at least MIN_PACKET, at most
        MAX_PACKET.  Packing uses it, so small messages are gathered into packets that shrink with the window."""
        return min(self.max_packet, max(self.min_packet, self.window // 2))

    def sent(self, size: int) -> None:
        self.in_flight += size

    def ordered(self, size: int, now: float, sample: DelaySample | None) -> None:
        """The first ACK ordering one of our packets: its bytes leave the window, which grows."""
        self.in_flight = max(0, self.in_flight - size)
        if self.window < self.threshold:
            self.window += size  # slow start: doubles per round trip
        else:
            self.window += max(1, self.packet_limit() * size // self.window)  # then a packet per round trip
        self.window = min(self.window, self.max_window)

    def congested(self, now: float, round_trip: float) -> bool:
        """A retransmission timer expired: halve (never below ``min_window``), unless the window was already
        halved less than one round trip ago, since every packet in flight then may time out for the same loss
        (as TCP cuts once per loss event).  True if halved."""
        if not self.cut_due(now, round_trip):
            return False
        self.window = max(self.window // 2, min(self.window, self.min_window))
        self.threshold = self.window
        return True

    def cut_due(self, now: float, round_trip: float) -> bool:
        """A loss may cut the window now: it was not cut less than one round trip ago (then noted as cut now)."""
        if self.cut_at is not None and now - self.cut_at < round_trip:
            return False
        self.cut_at = now
        return True

    def nack_named(self, seq: int, now: float, round_trip: float) -> bool:
        """A NACK asked for our packet ``seq``: a loss (``nack_loss``), unless a NACK for it was seen already (the
        paper's cache of three).  True if the window was cut."""
        if seq in self.nacked:
            return False
        self.nacked.append(seq)
        return self.nack_loss(now, round_trip)

    def nack_loss(self, now: float, round_trip: float) -> bool:
        """A NACK for a packet of ours not NACKed before: halve, unless the window was just halved."""
        return self.congested(now, round_trip)


class FixedWindow(SendWindow):
    """A window that never moves from ``max_window`` (no congestion control): for a known, lossless network or
    to measure what the window costs."""

    def __init__(self, *, min_packet: int, max_packet: int, initial: int, max_window: int,
                 min_window: int = 0) -> None:
        super().__init__(min_packet=min_packet, max_packet=max_packet, initial=max_window, max_window=max_window,
                         min_window=min_window)

    def ordered(self, size: int, now: float, sample: DelaySample | None) -> None:
        self.in_flight = max(0, self.in_flight - size)

    def congested(self, now: float, round_trip: float) -> bool:
        return False

    def nack_named(self, seq: int, now: float, round_trip: float) -> bool:
        return False


class SiteDelay:
    """Send-to-ordering delays of our packets ordered by one site: its base (the smallest in the last
    ``DelayWindow.BASE_SPAN`` seconds, kept in two buckets so an old minimum ages out) and its current delay (the
    smallest of the last ``DelayWindow.RECENT_SPAN`` seconds, so late ACKs are not read as a queue)."""

    __slots__ = ("bucket_min", "bucket_start", "heard", "previous_min", "recent")

    def __init__(self, now: float) -> None:
        self.bucket_start = now
        self.bucket_min = math.inf
        self.previous_min = math.inf
        self.recent: deque[tuple[float, float]] = deque()
        self.heard = now

    def add(self, now: float, delay: float) -> None:
        if now - self.bucket_start >= DelayWindow.BASE_SPAN / 2:
            self.previous_min, self.bucket_min, self.bucket_start = self.bucket_min, math.inf, now
        self.bucket_min = min(self.bucket_min, delay)
        recent = self.recent
        recent.append((now, delay))
        while len(recent) > 1 and now - recent[0][0] > DelayWindow.RECENT_SPAN:
            recent.popleft()
        self.heard = now

    @property
    def base(self) -> float:
        return min(self.bucket_min, self.previous_min)

    @property
    def current(self) -> float:
        return min(delay for _, delay in self.recent)


class UnansweredDelay:
    """Delay that does not answer to the window: waits for a busy CPU (or a stalled ring), not a queue the window
    made, which a smaller window would not shorten.  Read as a queue, it shrinks the window to its floor, packets
    to one message each, and the CPU each message costs keeps it there (a slow machine, many members, or random
    loss).

    It is judged whenever the window has fallen to half of its last high.  A queue the window made keeps the
    bottleneck busy while it drains, so the delivery rate holds, and the delay falls after; a wait for the CPU
    does neither: the rate falls with the window and the delay stays.  A delay that held (``HELD`` of the high's
    or more) while the rate fell (``FELL`` of the high's or less) is taken as part of the base, and forgotten by
    halves, one every ``HALF_LIFE`` seconds, so a queue that grows later is read again."""

    __slots__ = ("halved_at", "halved_bytes", "high_delay", "high_rate", "high_window", "last_at", "last_bytes",
                 "seconds", "set_at")

    HELD = 0.8
    FELL = 0.7
    HALF_LIFE = 1.0
    NEGLIGIBLE = 0.0005
    """Seconds below which what is left of it counts as nothing."""
    MIN_SPAN = 0.01
    """The rate since the window halved is judged over this many seconds at least."""

    def __init__(self) -> None:
        self.seconds = 0.0
        """Delay above the base taken as not the window's own."""
        self.set_at = 0.0
        self.high_window = 0
        self.high_delay = 0.0
        self.high_rate = 0.0
        self.halved_at: float | None = None
        """When the window fell to half of ``high_window`` (None: it has not since the high)."""
        self.halved_bytes = 0
        self.last_at = 0.0
        self.last_bytes = 0

    def observe(self, now: float, window: int, delay: float, base: float, ordered_bytes: int) -> None:
        """Once a round: the window, the delay of the site that queues most and its base, and every byte of
        ours ordered so far."""
        span = now - self.last_at
        rate = (ordered_bytes - self.last_bytes) / span if span > 0 else 0.0
        self.last_at, self.last_bytes = now, ordered_bytes
        if self.seconds and now - self.set_at > self.HALF_LIFE:
            self.seconds = 0.0 if self.seconds < 2 * self.NEGLIGIBLE else self.seconds / 2
            self.set_at = now
        if window >= self.high_window:
            self.high_window, self.high_delay, self.high_rate, self.halved_at = window, delay, rate, None
            return
        if window > self.high_window // 2:
            return
        if self.halved_at is None:
            self.halved_at, self.halved_bytes = now, ordered_bytes
            return
        since = now - self.halved_at
        if since < self.MIN_SPAN:
            return
        rate_since = (ordered_bytes - self.halved_bytes) / since
        if delay >= self.HELD * self.high_delay and rate_since <= self.FELL * self.high_rate \
                and delay - base > self.seconds:
            self.seconds, self.set_at = delay - base, now
        self.high_window, self.high_delay, self.high_rate, self.halved_at = window, delay, rate_since, None


class DelayWindow(SendWindow):
    """A window that finds the path's rate from queueing delay and keeps the queues it fills short.

    A packet of ours is ordered once the token site has it, so its send-to-ordering delay is a round trip to that
    site plus what waited in every queue on the way: the sender's socket and interface, the bottleneck link's queue,
    the site's receive queue; and the time it waited at the site for the token and for the repairs the site's
    acceptance needs, which the site's ACK reports (``Ack.waits``) and which is taken off: no smaller window
    shortens it.  Each site's smallest delay is its base; the current delay above the base is queueing.
    The slowest receiver governs: every site takes the token in turn, and the site with the most queueing sets the
    window.  Once a round trip the window moves half way to ``window * (base + TARGET) / delay``, FAST TCP's update
    with its alpha set to TARGET seconds of the measured rate: it grows while less than TARGET queues and settles
    where TARGET does, whatever the link's rate, so a bulk transfer fills a link without filling its buffer, and a
    light message behind it waits a few ms, not the buffer's length.  Where the CPU and not a link is the limit,
    queues of well under TARGET go with a busy ring, and the window grows to its ceiling as the ``rmp`` one does.

    Packets this member orders itself as token site still wait in its own link's queue, ahead of the ACK that
    ordered them; they count until the next site's ACK shows they left (``counts_until_passed``), so the window
    bounds that queue too and reads its delay, where freeing them at once let the queue hold twice the window and
    timed the data timer on other sites' packets only.

    Delay that does not fall when the window does, while the delivery rate falls with it, is no queue of ours
    (``UnansweredDelay``): waits for a busy CPU, or a ring stalled for repairs, which a smaller window would not
    shorten.  It counts as part of the base until it is forgotten.

    Loss is read with the queue (as TCP Veno does): a NACK for our packet while TARGET / 2 or more queues is
    congestion and halves the window; a NACK with less is random loss, which the repair answers, and takes an
    eighth, never below two of the largest packets.  A retransmission timeout halves it either way.  While NACKs
    name our packets its floor is ``repair_window`` (``nack_named``), otherwise ``quiet_window``.  Packets shrink
    with the window (figure 4.2), down to ``min_packet``, the path's MTU where the runtime knows it."""

    __slots__ = ("ordered_bytes", "quiet_window", "repair_window", "repairing_until", "round_end", "sites",
                 "starting", "unanswered")

    counts_until_passed = True

    TARGET = 0.005
    """Seconds of queueing the window aims at: enough that the link never idles between the token's turns, short
    against the 50 ms a person notices."""
    timer_deviation_floor = TARGET
    """The window lets its queue move by about TARGET from one round to the next, so a packet may be ordered that
    much later than the ones before it with nothing lost; a steady link otherwise takes the data timer's deviation
    to nothing, and every late ACK to a timeout, which halves the window and resends."""
    BASE_SPAN = 60.0
    """Seconds a site's smallest delay stays its base: an old minimum must age out (routes change), but each time
    one does while our packets queue, the queue is read a little shorter than it is."""
    RECENT_SPAN = 0.05
    """A site's current delay is the smallest of its samples of the last this many seconds (at least its last one):
    a packet ordered late because an earlier one was lost and repaired, or a token pass was, is not a queue, and
    random loss makes many such; a queue raises every sample."""
    SITE_HORIZON = 2.0
    """Only sites that ordered a packet of ours within this many seconds count (a member gone quiet or departed
    does not hold the window down)."""
    RANDOM_LOSS_CUT = 8
    """A loss with no queue takes this fraction (1/n) off the window."""
    FLOOR = 16384
    """Bytes the window never goes below where nothing of ours is lost (``min_window`` unless set), and so packets
    never below half of it.
    Delay that is no queue of ours (a busy CPU, a ring stalled for repairs) can hold the window at its floor,
    and there every message costs its packet's fixed CPU: with a floor of two MTU-sized packets, packets of one
    message each kept the cores busy enough that their waits read as a queue, and the window stayed there (a
    10 Mb/s link to 8 destinations at 0.51 to 0.91 of the wire on two cores; 0.81 to 0.93 with this floor).  It
    is 13 ms of a 10 Mb/s link and 1.3 ms of a 100 Mb/s one: a link much slower than 10 Mb/s would queue more
    than TARGET behind it, and wants ``min_window`` lower."""

    REPAIR_SPAN = 1.0
    """Seconds after a NACK last named a new packet of ours that the window keeps ``repair_window`` as its floor."""

    def __init__(self, *, min_packet: int, max_packet: int, initial: int, max_window: int,
                 min_window: int = 0, repair_window: int = 0) -> None:
        """``repair_window``: the floor while NACKs name our packets (at least ``min_window``)."""
        super().__init__(min_packet=min_packet, max_packet=max_packet, initial=initial, max_window=max_window,
                         min_window=min_window)
        self.window = self.min_window
        self.quiet_window = self.min_window
        """The floor where nothing of ours is lost (``min_window`` moves between it and ``repair_window``)."""
        self.repair_window = max(repair_window, self.min_window)
        self.repairing_until = -math.inf
        self.ordered_bytes = 0
        self.unanswered = UnansweredDelay()
        self.sites: dict[str, SiteDelay] = {}
        self.round_end = -math.inf
        self.starting = True
        """Slow start: the window doubles a round until our packets first queue.  It starts at its floor, whatever
        ``initial`` says, so the first delays measured are the path's own and not a queue the start made."""

    def ordered(self, size: int, now: float, sample: DelaySample | None) -> None:
        self.in_flight = max(0, self.in_flight - size)
        self.ordered_bytes += size
        if sample is None:
            return
        site, delay, waited = sample
        if waited > delay:  # longer than the whole delay: not a measurement (a site's report is remote input)
            return
        record = self.sites.get(site)
        if record is None:
            record = self.sites[site] = SiteDelay(now)
        record.add(now, delay - waited)
        if now >= self.round_end:
            self._update(now, delay)

    def queueing(self, now: float) -> tuple[float, float]:
        """(queueing delay, base delay) at the site that queues most among those heard from lately."""
        worst, worst_base = 0.0, 0.0
        for site, record in list(self.sites.items()):
            if now - record.heard > self.SITE_HORIZON:
                del self.sites[site]
                continue
            base = record.base
            queued = record.current - base
            if queued >= worst:
                worst, worst_base = queued, base
        return worst, worst_base

    def _update(self, now: float, loop: float) -> None:
        """Move the window once a round; ``loop``: the whole send-to-ordering time of the sample that prompted it,
        waits at the site included, which is how long a change of the window takes to show in the samples."""
        if now >= self.repairing_until:
            self.min_window = self.quiet_window
        queued, base = self.queueing(now)
        # A path with no delay at all (a simulated one; never a real one) reads as no queue: the window grows.
        delay = max(base + queued, 1e-9)
        self.unanswered.observe(now, self.window, delay, base, self.ordered_bytes)
        base += self.unanswered.seconds
        queued = max(0.0, delay - base)
        if self.starting and queued < self.TARGET / 2:
            window = 2 * self.window
        else:
            self.starting = False
            goal = self.window * (base + self.TARGET) / delay
            window = min(2 * self.window, (self.window + goal) / 2)
        self.window = int(max(self.min_window, min(self.max_window, window)))
        self.round_end = now + max(loop, 0.001)

    def congested(self, now: float, round_trip: float) -> bool:
        self.starting = False
        return super().congested(now, round_trip)

    def nack_named(self, seq: int, now: float, round_trip: float) -> bool:
        """A NACK for a packet of ours: some pass of the ring now waits for its repair, and the window holds at
        least ``repair_window`` for ``REPAIR_SPAN`` (two of the largest packets by default, the paper's floor, for
        its reason: the ring has packets to order while one is repaired).  Under random loss every pass waits for
        a repair at some site; a window at the quiet floor then bought one repair round trip per two packets, and
        the delay readings that held it there (packets ordered late behind a repair, each window's own burst in
        the queue) do not fall when the window does.  Where nothing is lost the quiet floor keeps the queue that a
        light message waits behind short."""
        if seq not in self.nacked:
            self.repairing_until = now + self.REPAIR_SPAN
            self.min_window = self.repair_window
            self.window = max(self.window, self.min_window)
        return super().nack_named(seq, now, round_trip)

    def nack_loss(self, now: float, round_trip: float) -> bool:
        self.starting = False
        if self.queueing(now)[0] - self.unanswered.seconds >= self.TARGET / 2:
            return self.congested(now, round_trip)
        if not self.cut_due(now, round_trip):
            return False
        # Random loss never takes the window below two of the largest packets (the paper's window's floor, and
        # for its reason: two packets keep the ring busy while one is repaired); only a queue takes it lower.
        floor = max(self.min_window, min(self.window, 2 * self.max_packet))
        self.window = max(floor, self.window - self.window // self.RANDOM_LOSS_CUT)
        return True


CONGESTION_CONTROLS: dict[str, Callable[..., CongestionControl]] = {"rmp": SendWindow, "fixed": FixedWindow,
                                                                     "delay": DelayWindow}
"""Congestion control by name: ``rmp`` is the paper's (section 4.6), ``fixed`` keeps the window at its ceiling,
``delay`` holds a few packets in the path's queues (``DelayWindow``)."""


def make_congestion_control(config: EngineConfig) -> CongestionControl:
    """The congestion control ``config.congestion`` names, sized from the config's packet and window limits."""
    factory = CONGESTION_CONTROLS.get(config.congestion)
    if factory is None:
        raise ValueError(f"unknown congestion control {config.congestion!r}: one of {', '.join(CONGESTION_CONTROLS)}")
    # The window's floor: two of the largest packets for the loss-driven windows, whose cuts would otherwise
    # leave one packet per token pass under random loss; ``DelayWindow.FLOOR`` (at most two of the largest) for
    # the delay-driven one.
    floor = min(DelayWindow.FLOOR, 2 * config.max_packet) if factory is DelayWindow else 2 * config.max_packet
    # The delay-driven window's floor while NACKs name our packets: two of the largest packets, as the others'.
    repair = {"repair_window": config.min_window or 2 * config.max_packet} if factory is DelayWindow else {}
    return factory(min_packet=config.min_packet, max_packet=config.max_packet,
                   min_window=config.min_window or floor, initial=config.initial_window,
                   max_window=config.max_window, **repair)
