"""Repair at one member: NACKs for holes in the OrderingQ, asking sources for gaps in their sequence, hints for
views it missed, stall detection, and answering other members' NACKs (sections 4.2 and 4.6).

A hole is NACKed after a short wait (so a merely reordered packet is not asked for), to the site most likely to
hold it, then to anyone; a member named next token site NACKs at once, since the whole ring waits on it.  A stall
(undelivered messages or own packets waiting, and no new ACK) sends tail NACKs that ask for anything after the
newest ACK known here, and after ``STALL_NACKS`` of them the member suspects a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import islice
from typing import Generic, TypeVar

from .context import GroupContext
from .flow import RttEstimator
from .ids import ProcessId
from .ordering import Ordering
from .orderingq import SlotKind, SlotState
from .packets import Nack, NewList, Packet
from .timers import Deadline
from .token import Token
from .view import View

STALL_NACKS = 3
"""Tail NACKs left unanswered before a stall is taken for a failure (docs/protocol.md, "Tail NACKs")."""

NAMED_HOLE_SCAN = 256
"""How many slots before a pass's last one ``named_with_holes`` examines (NACKs name at most 256 holes too)."""

NACK_LIST = 256
"""Timestamps, and (source, sequence) pairs, one NACK asks for at most."""

HELD_RUNS = 32
"""Runs of unordered packets held that one NACK reports at most (``Nack.held``)."""


K = TypeVar("K", bound=Hashable)


class AskTimes(Generic[K]):
    """When each packet still missing was last asked for, and how many times: a NACK lists a packet again only
    once the wait for the answer to its own last request is over (``Repair.nack_retry_after`` of its own count).

    A NACK lists every packet missing, and one that names no one is answered privately by two holders; if each NACK
    asked again for every packet, a requester whose own link queues (answers on their way, not lost) would have
    each hole resent to it once per NACK, by two holders, into that same queue, and the queue would grow with every
    hole behind it.  Timed per packet, a packet is asked for again as often as a packet alone would be, however
    many others are missing beside it."""

    def __init__(self) -> None:
        self.asks: dict[K, tuple[float, int]] = {}
        """Per packet asked for: when it was last asked for, and how many times."""

    def ask(self, keys: Sequence[K], now: float, retry_after: Callable[[int], float]) -> tuple[list[K], float]:
        """Of ``keys`` (all that is missing, as far as one NACK lists), those to ask for now: not asked for yet, or
        whose last request has waited ``retry_after`` of its count of earlier ones.  They count as asked for now;
        what is not among ``keys`` any more is forgotten.  Also when the first of ``keys`` (not empty) is due again."""
        asks = self.asks
        if len(asks) > len(keys):
            self.asks = asks = {key: asks[key] for key in keys if key in asks}
        due = [key for key in keys if (ask := asks.get(key)) is None or now >= ask[0] + retry_after(ask[1] - 1)]
        for key in due:
            ask = asks.get(key)
            asks[key] = (now, 1 if ask is None else ask[1] + 1)
        return due, min(asks[key][0] + retry_after(asks[key][1] - 1) for key in keys)

    def last_asked(self, key: K) -> float | None:
        ask = self.asks.get(key)
        return None if ask is None else ask[0]


class Repair:
    """Everything one member asks others for, and answers them."""

    def __init__(self, ctx: GroupContext, ordering: Ordering, token: Token, *, start_ts: int,
                 suspect: Callable[[float, str], None], own_path: RttEstimator) -> None:
        """``suspect``: what to do when repair gives up on a member (the engine starts a reformation);
        ``own_path``: the send -> ordering time of our own packets (``Sender.data_rtt``), how long what we send
        takes to get through our link's queue and across."""
        config = ctx.config
        self.pid, self.config, self.views, self.outbox, self.stats = ctx.pid, config, ctx.views, ctx.outbox, ctx.stats
        self.ordering, self.token = ordering, token
        self.suspect = suspect
        self.own_path = own_path
        self.nack = Deadline()
        self.nack_tries = 0
        self.nack_rtt = RttEstimator(config.nack_timeout, config.rto_min, config.nack_timeout)
        """The last request for the first hole -> that hole filled, resent or not (docs/protocol.md, "NACKs"):
        how soon to NACK a hole, and to NACK it again.  Karn's rule (holes asked for once only) would time only the
        answers that came before any retry, so an answer slower than the retry time (behind a queue on our own
        link) would never be seen and the retries would never slow; from the last request a sample is a lower
        bound, exact when the retry time is longer than the answer takes, and it grows past a shorter retry time as
        a hole's retries double."""
        self.nack_first_at: float | None = None
        """When the first NACK since the first missing timestamp last moved was sent (None: none yet)."""
        self.hole_asks: AskTimes[int] = AskTimes()
        """Per missing timestamp, its requests."""
        self.gap_asks: AskTimes[tuple[ProcessId, int]] = AskTimes()
        """Per (source, sequence number) of a source's gap, its requests (``ask_sources``)."""
        self.multicast_resends: dict[tuple[int, ProcessId | None, int], float] = {}
        """When each packet was last multicast again for a NACK, keyed by (timestamp, None, 0) for what the
        OrderingQ holds and (-1, src, seq) for unordered data: see ``answer``.  (Not one key for a packet named
        either way: the next token site NACKs an ordered packet by its timestamp at once, the ring waiting on it,
        and a copy multicast a moment before for a source's gap may be the one it lost.)"""
        self.nack_contig = start_ts
        """The first missing timestamp the current NACKs are about is the one after this."""
        self.gap = Deadline()
        """When to ask sources for packets of theirs known to exist but not held here: see ``ask_sources``."""
        self.gap_tries = 0
        self.gap_first: tuple[ProcessId, int] | None = None
        """The first such packet the current asking is about: a new one starts the wait and the back-off afresh."""
        self.gappy: dict[ProcessId, None] = {}
        """Sources a packet arrived from while an earlier unordered one of theirs was not held (maybe a gap); a dict
        as an ordered set, so that which gap is asked for first does not depend on string hashing."""
        self.stall = Deadline()
        self.stall_tries = 0
        self.hint_target: ProcessId | None = None
        """A member of our view that spoke in a view we do not know: it can send us the New Lists we missed."""
        self.passed_by = False
        """Since our last new ACK, a member of our view passed the token in a view we do not know, at a timestamp
        beyond any we know: the ring moved on past a view change we missed (see the stall, ``watch``)."""
        self.hint = Deadline()
        self.hint_quiet_until = 0.0
        self.hint_gap = config.nack_timeout

    # ------------------------------------------------------------------------------------------------------------
    # Asking

    def nack_target(self, tries: int, *, tail: bool = False) -> ProcessId | None:
        """Who a NACK after ``tries`` unanswered ones names.

        The sender of the newest ACK known here: it accepted the token, so it held every packet before its ACK,
        and it holds what its ACK ordered.  An unanswered NACK for those packets most often means the NACK or its
        answer was lost, so it goes to the same site again.  A tail NACK asks for what comes after the newest ACK
        known here, which that site may have missed too, so it goes round the ring from there (or to the member a
        hint named).  After ``nack_rotate`` tries a NACK names no one and any holder answers (which also gets past
        a failed target); so does the last tail NACK before a stall is taken for a failure, or three losses in a
        row under heavy loss would start a needless reformation."""
        view = self.views.current
        if tail and tries >= STALL_NACKS - 1:
            return None
        if tail and self.hint_target is not None:
            return self.hint_target
        if tries >= self.config.nack_rotate or view.size == 1:
            return None
        token = self.token
        base = next((m for m in (token.last_ack_sender, token.token_site) if m in view), view.members[0])
        target = view.next_after(base, tries) if tail else base
        if target == self.pid:
            target = view.next_after(target)
        return target if target != self.pid else None

    def hole_filled(self, now: float) -> None:
        """The first missing timestamp moved on: time the NACK that asked for it, and start afresh on the next."""
        asked_at = self.hole_asks.last_asked(self.nack_contig + 1)
        if asked_at is not None:
            self.nack_rtt.sample(now - asked_at)
        self.nack_contig = self.ordering.q.contig
        self.nack_tries = 0
        self.nack.stop()
        self.nack_first_at = None

    def named_with_holes(self) -> bool:
        """Is the token passed to us and held up by a packet its ACK ordered that is lost, not merely late?

        The whole ring waits until we accept, so such a hole is NACKed at once instead of after ``nack_wait``,
        and the NACK also tells the passing site that its pass arrived (``Token.heard_of``): a slow repair then
        neither waits for a resent pass nor inflates the pass round trip.  Lost, not late: we hold a later packet
        of the same source, and a source's packets travel in order (a reordering on the way would cost one
        needless resend, and its NACK would halve the source's window).  Only the last ``NAMED_HOLE_SCAN`` slots
        are looked at, so a member far behind does not scan its whole gap after every datagram.  A first hole
        already asked for waits for its own retry time (``AskTimes``) like any other."""
        target = self.token.accept_target
        q = self.ordering.q
        if target is None or q.contig >= target[1] or self.hole_asks.last_asked(q.contig + 1) is not None:
            return False
        slots = q.slots
        lacking: set[ProcessId] = set()
        for ts in range(max(q.contig + 1, target[1] - NAMED_HOLE_SCAN), target[1] + 1):
            slot = slots.get(ts)
            if slot is None or slot.key is None:
                continue
            src = slot.key[0]
            if not slot.have:
                lacking.add(src)
            elif src in lacking:
                return True
        return any(self.ordering.unordered.get(src) for src in lacking)

    def nack_wait(self) -> float:
        """How long a new hole waits for its first NACK: long enough for a merely reordered packet to arrive, which
        on a network whose NACKs are answered within a round trip is about that round trip (the RACK reordering
        window of TCP is a quarter of one), never more than ``nack_delay``."""
        srtt = self.nack_rtt.srtt
        if srtt is None:
            return self.config.nack_delay
        return min(self.config.nack_delay, max(self.config.rto_min, srtt))

    def nack_retry_after(self, tries: int) -> float:
        """How long the NACK sent after ``tries`` unanswered ones waits for its answer: the timeout of the NACK
        round trip while it names the same site (the paper resends "if there is no response within the specified
        timeout"; under random loss an unanswered NACK is a lost NACK or a lost answer, and doubling would make a
        repair that failed twice wait four timeouts, with the whole ring waiting on it), then doubling once it
        names no one, up to four times ``nack_timeout``: losses in a row are as independent as the first, and a
        member that holds the ring's pass for a repair holds every sender's window with it, so a wait that kept
        doubling made the rare repair that failed three times (one in twenty at 20% loss each way) stall the whole
        group for hundreds of ms.  A silent holder is found by its Alives' absence, not by these waits.  The
        timeout is twice the smoothed round trip when that is shorter than the mean plus four deviations: a NACK
        resent too early costs one NACK and at most one copy, one resent too late holds the ring's pass."""
        doublings = min(max(0, tries - self.config.nack_rotate + 1), 32)  # the clamp is reached long before
        rtt = self.nack_rtt
        timeout = rtt.rto if rtt.srtt is None else min(rtt.rto, max(self.config.rto_min, 2 * rtt.srtt))
        return min(timeout * 2.0 ** doublings, self.config.nack_timeout * 4, self.config.rto_max)

    def send_nack(self, now: float, *, tail: bool) -> None:
        missing = self.ordering.q.missing(NACK_LIST)
        if tail:
            tries = self.stall_tries
            self.stall_tries += 1
            delay = min(self.config.stall_timeout * (2 ** min(self.stall_tries, 4)), self.config.rto_max)
            self.stall.deadline = now + delay
        else:
            self.nack.stop()
            if not missing:
                return
            missing, self.nack.deadline = self.hole_asks.ask(missing, now, self.nack_retry_after)
            if not missing:
                return
            tries = self.nack_tries
            self.nack_tries += 1
            if tries == 0:
                self.nack_first_at = now
        self.emit(now, self.nack_target(tries, tail=tail), tail=tail, missing=missing)

    def watch_source_gaps(self, now: float, frozen: bool) -> None:
        """Arm ``ask_sources`` while a source's packet is known missing: after the reordering wait for a new first
        gap, keeping the back-off while the same one stays unfilled."""
        if not self.gappy and self.gap_first is None:
            return  # the common case, after every datagram: no source is known to have a gap
        gaps = self.ordering.source_gaps(self.gappy, self.views.current, 1) if self.gappy and not frozen else []
        first = gaps[0] if gaps else None
        if first != self.gap_first:
            self.gap_first = first
            self.gap_tries = 0
            self.gap.deadline = None if first is None else now + self.nack_wait()

    def ask_sources(self, now: float) -> None:
        """Ask sources for their packets we know exist but lack, before any ACK orders them (a NACK whose ``data``
        names them, naming the first one's source, no one after ``nack_rotate`` tries; unanswered, again after
        ``nack_retry_after``).  The token site cannot order a source's later packets without the missing one,
        and the next site cannot accept the token until it holds what an ACK ordered: asked for only then, the
        repair is a round trip on the ring's path at every pass; asked for on arrival, it is most often done
        before the token comes (docs/protocol.md, "NACKs")."""
        known = self.ordering.source_gaps(self.gappy, self.views.current, self.config.nack_response_limit)
        if not known:
            self.gap.stop()
            return
        gaps, self.gap.deadline = self.gap_asks.ask(known, now, self.nack_retry_after)
        if not gaps:
            return
        tries = self.gap_tries
        self.gap_tries += 1
        source = gaps[0][0]
        target = source if tries < self.config.nack_rotate and source in self.views.current else None
        self.stats["gap_nacks_sent"] += 1
        self.emit(now, target, tail=False, missing=[], data=gaps)

    def emit(self, now: float, target: ProcessId | None, *, tail: bool, missing: list[int],
             data: list[tuple[ProcessId, int]] | None = None) -> None:
        q = self.ordering.q
        for ts in missing:
            q.slots[ts].state = SlotState.REQUESTED
        held = self.ordering.held_runs(HELD_RUNS) if missing or tail else ()
        nack = Nack(self.views.current.view_id, self.pid, target, q.contig, q.high, tail, tuple(missing),
                    tuple(data or ()), held)
        self.stats["tail_nacks_sent" if tail else "nacks_sent"] += 1
        self.outbox.multicast(nack, now)

    def unknown_view(self, src: ProcessId, now: float, held: bool) -> None:
        """A member speaks in a view we have not seen: we missed a New List.  Ask that member for what follows,
        unless hints are ``held`` (a reformation runs: ``GroupEngine.hints_held``).

        The ring waits for us (the token site retransmits its pass in the new view), so ask soon, after
        ``nack_delay`` in case the New List is merely behind the packet, and again at doubling gaps while the hints
        go on, rather than waiting for the stall timer.  These requests do not count towards suspecting a
        failure: the witness is evidently alive."""
        self.stats["unknown_view_hints"] += 1
        if held:
            return
        self.hint_target = src
        if self.hint.deadline is None and now >= self.hint_quiet_until:
            self.hint.deadline = now + self.config.nack_delay

    def maybe_gap(self, src: ProcessId) -> None:
        """A packet from ``src`` arrived while an earlier unordered one of its was not held: ask for it if it
        stays missing (``ask_sources``)."""
        self.gappy[src] = None

    def ring_passed_by(self) -> None:
        """A member of our view passed the token in a view we do not know, beyond any timestamp we know: time a
        stall (``watch``) even with nothing else to wait for."""
        self.passed_by = True

    def token_moved(self) -> None:
        """A new ACK: the ring moves, so no stall, and no hint is needed any more."""
        self.stall.deadline = None
        self.stall_tries = 0
        self.hint_target = None
        self.passed_by = False
        self.hint.deadline = None
        self.hint_gap = self.config.nack_timeout

    def watch(self, now: float, *, waiting: bool, frozen: bool) -> None:
        """After every input: NACK holes (the first NACK waits a little so reordering alone does not cause one),
        and time a stall while ``waiting`` (for deliveries, the token, or own packets to be ordered)."""
        q = self.ordering.q
        nack = self.nack
        if q.contig != self.nack_contig:
            self.hole_filled(now)
        if q.contig < q.high:
            if self.named_with_holes():
                nack.deadline = now  # the ring waits on us: ask at once
            elif nack.deadline is None:
                nack.deadline = now + self.nack_wait()
        else:
            nack.deadline = None
        if self.gappy or self.gap_first is not None:
            self.watch_source_gaps(now, frozen)
        stall = self.stall
        if waiting:
            if stall.deadline is None:
                stall.deadline = now + self.config.stall_timeout
        else:
            stall.deadline = None
            self.stall_tries = 0

    # ------------------------------------------------------------------------------------------------------------
    # Timers

    def nack_due(self, now: float, frozen: bool) -> None:
        if (self.nack_tries >= self.config.nack_rotate + self.config.fail_retries and not frozen
                and self.nack_first_at is not None and now - self.nack_first_at >= self.config.fail_after):
            self.suspect(now, "nack")
        self.send_nack(now, tail=False)

    def hint_due(self, now: float, held: bool) -> None:
        self.hint.stop()
        if self.hint_target is not None and not held:
            self.stats["hint_nacks_sent"] += 1
            self.emit(now, self.hint_target, tail=True, missing=self.ordering.q.missing(NACK_LIST))
            self.hint_quiet_until = now + self.hint_gap
            self.hint_gap = min(self.hint_gap * 2, self.config.rto_max)

    def stall_due(self, now: float) -> None:
        if self.stall_tries >= STALL_NACKS:
            self.stall.stop()
            self.suspect(now, "stall")
        else:
            self.send_nack(now, tail=True)

    def catch_up(self, target: tuple[int, dict[ProcessId, int]], now: float) -> None:
        """During a reformation: NACK, to anyone, whatever separates this member from the sync point ``target``."""
        ts, seqs = target
        q, ordering = self.ordering.q, self.ordering
        # Lazily, and only as many as one NACK carries: a sync point far ahead must not build huge lists.
        missing = list(islice((t for t in range(q.contig + 1, ts + 1) if (s := q.get(t)) is None or not s.have),
                              NACK_LIST))
        wanted = list(islice(((src, n) for src, high in seqs.items()
                              for n in range(ordering.src_next.get(src, 1), high + 1)
                              if (src, n) not in ordering.data), NACK_LIST))
        if missing or wanted:
            self.stats["recovery_nacks"] += 1
            self.outbox.multicast(Nack(self.views.current.view_id, self.pid, None, q.contig, q.high, False,
                                       tuple(missing), tuple(wanted)), now)

    # ------------------------------------------------------------------------------------------------------------
    # Answering

    def answer(self, nack: Nack, now: float, *, frozen: bool = False) -> None:
        """Resend what a NACK asks for.  A NACK naming this process is answered by multicast (others likely lack the
        same packets); a tail NACK, or one naming no one, only to the requester.

        A NACK naming no one is answered, for each packet, by the member that sent it (the data's source, the
        ACK's or New List's sender) and by the first member after the requester in ring order other than that
        sender, while the sender is in our view; by every holder when it is not.  Such a NACK follows
        ``nack_rotate`` unanswered ones, which under a queue on the requester's own link means answers still on
        their way more often than answers lost, and a copy from every holder into that same queue made it longer
        with each retry; with one answerer, a lost datagram under random loss cost a doubled wait.  The sender
        of a packet is the one holder sure to have it, and one that failed leaves the view, after which everyone
        answers.  While frozen (a reformation, whose catch-up NACKs name no one and may ask for a failed member's
        packets) every holder answers."""
        if nack.target is not None and nack.target != self.pid:
            return
        self.stats["nacks_answered"] += 1
        q = self.ordering.q
        data = self.ordering.data
        limit = self.config.nack_response_limit
        resend: list[int] = list(nack.missing)
        if nack.tail:
            start = max(nack.upto + 1, q.base)
            resend.extend(range(start, min(q.high, start + limit - 1) + 1))
        privately = nack.tail or nack.target is None
        found: list[tuple[tuple[int, ProcessId | None, int], Packet]] = []
        for ts in resend:
            slot = q.get(ts)
            if slot is None or not slot.have:
                continue
            if slot.kind is SlotKind.ACK or isinstance(slot.packet, NewList):
                found.append(((ts, None, 0), slot.packet))  # type: ignore[arg-type]
            elif slot.kind is SlotKind.DATA and slot.key is not None:
                if nack.held and held_by(nack, slot.key):
                    self.stats["nack_resends_held"] += 1  # the requester lost the ACK, not the packet
                    continue
                found.append(((ts, None, 0), data[slot.key]))
        found.extend(((-1, *key), data[key]) for key in nack.data if key in data)
        del found[limit:]  # bounded: the requester asks again for the rest
        # Several members often NACK one hole within a few ms, before the first answer reached them; one multicast
        # answers them all, and a private answer adds no copy of a packet multicast within the window either (that
        # copy is on its way to every member, the requester too).  A requester whose copy was lost asks again after
        # its NACK timeout, past this window (half of ours: NACKs here and there are timed from round trips on the
        # same network), and not before our last copy could have got through our link's queue: a NACK resent while
        # it still waits there would add another copy behind it, and the queue would grow with every repair.
        recent = self.multicast_resends
        window = max(self.nack_rtt.rto / 2, self.own_path.srtt or 0.0)
        if len(recent) > 4 * limit:
            self.multicast_resends = recent = {k: t for k, t in recent.items() if now - t < window}
        untargeted = nack.target is None and not nack.tail and not frozen
        view = self.views.current
        for key, packet in found:
            if untargeted and _left_to_others(packet, self.pid, nack.src, view):
                self.stats["nack_resends_left_to_others"] += 1
                continue
            if now - recent.get(key, -window) < window:
                self.stats["nack_resends_suppressed"] += 1
            elif privately:
                self.outbox.unicast(nack.src, packet, now)
            else:
                recent[key] = now
                self.outbox.multicast(packet, now)

    def own_named(self, nack: Nack) -> list[int]:
        """Sequence numbers of this process's packets that ``nack`` asks for."""
        own = [seq for src, seq in nack.data if src == self.pid]
        for ts in nack.missing:
            slot = self.ordering.q.get(ts)
            if slot is not None and slot.key is not None and slot.key[0] == self.pid:
                own.append(slot.key[1])
        return own


def _left_to_others(packet: Packet, pid: ProcessId, requester: ProcessId, view: View) -> bool:
    """Whether an answer to a NACK naming no one is left to others (``Repair.answer``): the member that sent
    ``packet`` is another member of our view than this one and the requester, and this one is not the second
    answerer, the first member after the requester in ring order other than that sender."""
    src = packet.src
    if src in (pid, requester) or src not in view or requester not in view:
        return False
    for step in range(1, view.size):
        second = view.next_after(requester, step)
        if second != src:
            return second != pid
    return True


def held_by(nack: Nack, key: tuple[ProcessId, int]) -> bool:
    """Whether ``nack``'s requester reports holding the data packet ``key`` (``Nack.held``)."""
    src, seq = key
    return any(run_src == src and first <= seq <= last for run_src, first, last in nack.held)
