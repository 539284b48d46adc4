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

from dataclasses import dataclass, field

from .ids import ProcessId
from .packets import ListChangeRequest, RecoveryAbort, RecoveryAckNewList, RecoveryStart, RecoveryVote
from .timers import Backoff


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
    wishers: dict[ProcessId, float] = field(default_factory=dict)
    """Members of ``last_view`` heard asking to join meanwhile, and when: they are in no view of the group either."""


REJOIN_BACKOFF_MAX = 30.0
HEARD_ROUNDS = 4
"""Rounds of join requests a join makes again, before founding or failing, while the group can be heard: its
token may be on its way back from a failure (a restart's old incarnation is being removed)."""

REFORMATION_ROUNDS = 1
"""Rounds of join requests made again because a reformation was heard (and no Alive): enough to outlast one."""

REFORMATION_PACKETS = (RecoveryStart, RecoveryVote, RecoveryAckNewList, RecoveryAbort)
"""A reformation's own packets: heard by a joiner, they say that some group where it listens is reforming."""
