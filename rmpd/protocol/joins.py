"""A process's joins under way and its wishes to rejoin (``RmpProcess``; docs/protocol.md, "Healing").

Joining (paper 4.3): the process multicasts a List Change Request to the group's address and resends it until a New
List admits it.  After ``join_retries`` unanswered requests it forms a group of its own, unless the join asked for an
existing group only, in which case the join fails; but while an Alive of the group was heard lately, it asks again
instead (up to ``HEARD_ROUNDS`` times): the group exists.  A reformation heard meanwhile counts the same (a reforming
group sends no Alives, and a process restarted under its old ID is often what made it reform).  A request the
group's SCMP filter refuses is answered: the process asks again under a new request ID and counts its tries from
zero, since the group exists.

A membership that ends without the application asking (the view merged into another, or this member was cut off
and stopped) leaves a wish to rejoin: the process joins the group again, as a new member, when it next hears an
Alive of it, backing off between attempts that go unanswered.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .config import EngineConfig
from .events import JoinFailed, Transmit
from .ids import ProcessId, RequestIds
from .outbox import OutputLists
from .packets import (
    Alive,
    ListChangeRequest,
    NewList,
    NonMemberAck,
    NonMemberData,
    RecoveryAbort,
    RecoveryAckNewList,
    RecoveryStart,
    RecoveryVote,
    encode,
)
from .timers import Backoff

if TYPE_CHECKING:
    from .engine import GroupEngine
    from .keys import KeyTable
    from .view import View


@dataclass
class JoinAttempt:
    request: ListChangeRequest
    timer: Backoff
    existing_only: bool
    tries: int = 0
    ids: set[int] = field(default_factory=set)
    """Every request ID this attempt used: a New List answering any of them admits the process."""
    rejoin: bool = False
    """Made by the process for a membership that ended by itself: unanswered, it waits for the group again."""
    rounds: int = 0
    """Rounds of ``join_retries`` requests made again because the group could be heard (at most ``HEARD_ROUNDS``)."""


@dataclass
class RejoinWish:
    """A group this process was in until its membership ended without the application asking."""

    min_partition: int
    ttl: int
    last_view: tuple[ProcessId, ...]
    """The members of the view this process was last in."""
    needed: int
    """How many of them a new founding needs (the group's minimum partition of that view)."""
    not_before: float = 0.0
    """No attempt before this (doubling after each unanswered one, up to ``REJOIN_BACKOFF_MAX``)."""
    backoff: float = 1.0
    group_heard: bool = False
    """An Alive of the group was heard since the wish began: the group exists somewhere."""
    wishers: dict[ProcessId, tuple[float, int]] = field(default_factory=dict)
    """Members of ``last_view`` heard asking to join meanwhile: when, and the position of the key table each kept
    (``ListChangeRequest.keys_position``).  They are in no view of the group either."""


REJOIN_BACKOFF_MAX = 30.0
HEARD_ROUNDS = 4
"""Rounds of join requests a join makes again, before founding or failing, while the group can be heard: its
token may be on its way back from a failure (a restart's old incarnation is being removed)."""

REFORMATION_ROUNDS = 1
"""Rounds of join requests made again because a reformation was heard (and no Alive): enough to outlast one."""

REFORMATION_PACKETS = (RecoveryStart, RecoveryVote, RecoveryAckNewList, RecoveryAbort)
"""A reformation's own packets: heard by a joiner, they say that some group where it listens is reforming."""


class Joining:
    """The joining half of ``RmpProcess``: its joins under way and its wishes to rejoin, and their timers."""

    pid: ProcessId
    config: EngineConfig
    stats: Counter[str]
    multicast_capable: bool
    engines: dict[str, GroupEngine]
    joining: dict[str, JoinAttempt]
    rejoin_wishes: dict[str, RejoinWish]
    _join_ids: dict[str, set[int]]
    _join_settings: dict[str, tuple[int, int]]
    _last_seqs: dict[str, tuple[int, int]]
    _seq_base: int
    _request_ids: RequestIds
    _group_heard_at: dict[str, float]
    _reformation_heard_at: dict[str, float]
    _longer_history_heard_at: dict[str, float]
    _kept_keys: dict[str, KeyTable]
    _out: OutputLists

    if TYPE_CHECKING:
        def wall_ms(self, now: float) -> int: ...
        def create(self, group: str, now: float, *, min_partition: int = 1, ttl: int = 1) -> GroupEngine: ...
        def _install(self, group: str, view: View, now: float, joined_by: NewList | None = None) -> GroupEngine: ...

    def join(self, group: str, now: float, *, min_partition: int = 1, ttl: int = 1,
             existing_only: bool = False) -> None:
        """Start joining ``group``; a ViewInstalled event (or JoinFailed) follows."""
        if group in self.engines or group in self.joining:
            return
        self.rejoin_wishes.pop(group, None)
        self._join_settings[group] = (min_partition, ttl)
        last_seq = self._last_seqs.get(group, (self._seq_base, self._seq_base))[0]
        request_id = self._request_ids.stamped(self.wall_ms(now))
        request = ListChangeRequest(group, None, self.pid, request_id, "join", last_seq,
                                    self.multicast_capable, min_partition, ttl, self._keys_position(group))
        ids = self._join_ids.setdefault(group, set())
        ids.add(request_id)
        attempt = JoinAttempt(request, Backoff(self.config.request_interval, self.config.rto_max), existing_only,
                              ids=ids)
        self.joining[group] = attempt
        self._send_join(attempt, now)

    def _keys_position(self, group: str) -> int:
        """The position of the key table this process kept from its last membership of ``group`` (0: none)."""
        kept = self._kept_keys.get(group)
        return 0 if kept is None else kept.position

    def keep_from_founding(self, group: str) -> bool:
        """Make the join of ``group`` under way fail, rather than found a view, if nobody answers it: the runtime heard
        the group on its address in a form this process cannot take (sealed under a key it lacks), so a view founded
        here would be a second group beside it.  A member it can talk to that answers still admits it.  False when
        no such join is under way (a rejoin the process makes by itself is left as it is)."""
        attempt = self.joining.get(group)
        if attempt is None or attempt.rejoin:
            return False
        attempt.existing_only = True
        return True

    def _heard_outside(self, packet: ListChangeRequest | NonMemberData | Alive, now: float) -> None:
        """A packet of a group this process holds no membership of: an Alive says the group can be heard (and a
        wish to rejoin it may ask now); a join request from a member of a wish's last view says it wishes too."""
        if type(packet) is Alive:
            self._group_heard_at[packet.group] = now
            self._heard_group(packet.group, now)
            return
        if type(packet) is not ListChangeRequest:
            return
        if packet.keys_position > self._keys_position(packet.group):
            self._longer_history_heard_at[packet.group] = now
        wish = self.rejoin_wishes.get(packet.group)
        if wish is not None and packet.src in wish.last_view:
            wish.wishers[packet.src] = (now, packet.keys_position)

    def _heard_group(self, group: str, now: float) -> None:
        """An Alive of a group this process wishes to rejoin: ask to join it, now that it can be heard."""
        wish = self.rejoin_wishes.get(group)
        if wish is not None:
            wish.group_heard = True
        if wish is None or group in self.joining or now < wish.not_before:
            return
        self._ask_to_rejoin(group, wish, now)

    def _ask_to_rejoin(self, group: str, wish: RejoinWish, now: float) -> None:
        wish.not_before = now + wish.backoff
        wish.backoff = min(wish.backoff * 2, REJOIN_BACKOFF_MAX)
        self.stats["rejoins"] += 1
        self.join(group, now, min_partition=wish.min_partition, ttl=wish.ttl, existing_only=True)
        self.rejoin_wishes[group] = wish  # kept until a view is installed (join() dropped it)
        self.joining[group].rejoin = True

    def _maybe_our_group(self, now: float) -> None:
        """A reformation runs where this process listens, or a token is passed to this process ID in a view it
        does not know (its previous incarnation's): a group it is joining may be reforming, and a reforming group
        sends no Alives.  The join asks one more round (``REFORMATION_ROUNDS``) rather than found a view beside the
        group that would have to merge later.  Only one: the reformation may be another group's on the same address,
        or one that will not admit this process soon, and a joiner kept waiting longer leaves stale requests that
        admit it where it no longer listens."""
        self.stats["reformation_heard_while_joining"] += 1
        for group in self.joining:
            self._reformation_heard_at[group] = now

    def _unanswered_rejoin(self, group: str, now: float) -> None:
        """Nobody answered a rejoin.  If no Alive of the group was heard either, and enough members of the last
        view are asking too (as many as its minimum partition needs, this process included), the group has no
        view left anywhere: one of them founds it again and the others join.  The founder is the one whose kept
        key table stands furthest in the group's history (the lowest process ID among equals): joiners take the
        founder's table, and a founder holding less than another would let the group deliver again a key that
        one had seen delivered.  Otherwise the wish waits, and probes again after its back-off."""
        wish = self.rejoin_wishes.get(group)
        if wish is None:
            return
        wishers = self._asking(group, wish, now)
        founder = min(wishers, key=lambda pid: (-wishers[pid], pid))
        if not wish.group_heard and len(wishers) >= wish.needed and founder == self.pid:
            del self.rejoin_wishes[group]
            self.stats["refounded"] += 1
            self.create(group, now, min_partition=wish.min_partition, ttl=wish.ttl)
        wish.group_heard = False

    def _asking(self, group: str, wish: RejoinWish, now: float) -> dict[ProcessId, int]:
        """Members of the wish's last view asking to join right now (a joiner resends at least every ``rto_max``),
        this process included, with the position of the key table each kept."""
        recent = now - 2 * self.config.rto_max
        asking = {pid: position for pid, (at, position) in wish.wishers.items() if at >= recent}
        asking[self.pid] = self._keys_position(group)
        return asking

    def _rejoin_probes(self, now: float) -> None:
        """A wish that has heard nothing of its group asks to join now and then anyway, so that members left with
        no view at all hear one another (``_unanswered_rejoin``)."""
        for group, wish in list(self.rejoin_wishes.items()):
            if group not in self.joining and group not in self.engines and now >= wish.not_before:
                self._ask_to_rejoin(group, wish, now)

    def _heard_lately(self, heard_at: dict[str, float], group: str, now: float, within: float | None = None) -> bool:
        """``group`` was heard in ``heard_at`` within ``within`` seconds (default: two Alive intervals)."""
        heard = heard_at.get(group)
        return heard is not None and now - heard <= (2 * self.config.alive_interval if within is None else within)

    def _join_timers(self, now: float) -> None:
        """Resend, give up on or found after the joins whose timers expired; probe for the groups wished for."""
        for group, attempt in list(self.joining.items()):
            if attempt.timer.expired(now):
                if attempt.tries >= self.config.join_retries and not attempt.rejoin and (
                        (self._heard_lately(self._group_heard_at, group, now) and attempt.rounds < HEARD_ROUNDS)
                        or (self._heard_lately(self._reformation_heard_at, group, now)
                        and attempt.rounds < REFORMATION_ROUNDS)
                        or (self._heard_lately(self._longer_history_heard_at, group, now, 2 * self.config.rto_max)
                        and attempt.rounds < HEARD_ROUNDS)):
                    # The group can be heard: founding another view of it beside it would only make a merge.  Or
                    # a process that kept the group's keys asks to join: it founds (``_unanswered_rejoin``), since
                    # a view founded here would hand its joiners an emptier table.
                    self.stats["joins_kept_asking"] += 1
                    attempt.tries = 0
                    attempt.rounds += 1
                    self._send_join(attempt, now)
                    continue
                if attempt.tries >= self.config.join_retries:
                    del self.joining[group]
                    if attempt.rejoin:
                        self._unanswered_rejoin(group, now)
                        continue
                    if attempt.existing_only:
                        self._out.events.append(JoinFailed(group, f"group {group!r} not found: no member "
                                                              f"answered {attempt.tries} join requests"))
                    else:
                        self.create(group, now, min_partition=attempt.request.min_partition,
                                    ttl=attempt.request.ttl)
                else:
                    self._send_join(attempt, now)
        self._rejoin_probes(now)

    def _send_join(self, attempt: JoinAttempt, now: float) -> None:
        if attempt.tries == 0:
            attempt.timer.start(now)
        else:
            attempt.timer.back_off(now)
        attempt.tries += 1
        self.stats["join_requests"] += 1
        self._out.datagrams.append(Transmit(None, encode(attempt.request), attempt.request.group))

    def _join_refused(self, ack: NonMemberAck, now: float) -> None:
        """The group refused our current join request (SCMP): ask again, stamped afresh, at the next retry."""
        for attempt in self.joining.values():
            if attempt.request.request_id == ack.stamp:
                self.stats["joins_refused"] += 1
                request_id = self._request_ids.stamped(self.wall_ms(now))
                attempt.request = replace(attempt.request, request_id=request_id)
                attempt.ids.add(request_id)
                attempt.tries = 0
                return

    def _admitted(self, nl: NewList, now: float) -> None:
        attempt = self.joining[nl.group]
        if nl.request_id not in attempt.ids or not nl.granted:
            return
        if self.pid not in (m for m, _ in nl.members):
            return
        del self.joining[nl.group]
        self.rejoin_wishes.pop(nl.group, None)
        self._install(nl.group, nl.installed_view(), now, joined_by=nl)
