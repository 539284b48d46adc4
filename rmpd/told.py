"""What a program is told of its process's engine events: the same through a daemon and an embedded node.

The engine (rmpd.protocol.events) speaks of the process's memberships; a program sees deliveries, views, and what
became of its membership, its requests and its calls.  The daemon (rmpd.daemon) tells its clients in local API
frames (rmpd.localapi), the embedded node (rmpd.client.node) tells its own program in Group events (rmpd.client);
what each engine event becomes is decided here, once: :data:`TOLD` says what a program is told of each kind of
event, and the functions below give the fields and the error codes, so both sides agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from rmpd.localapi import (
    AUTH_REQUIRED,
    CALL_PREFIX,
    ENCRYPTION_MISMATCH,
    EVENT_ALREADY_DELIVERED,
    EVENT_DELIVERIES,
    EVENT_REQUEST,
    EVENT_UNDELIVERED,
    EVENT_VIEW,
    JOIN_FAILED,
    LEFT,
    LOCK_DENIED,
)
from rmpd.protocol import events as engine
from rmpd.protocol.events import CallAnswered, JoinFailed, Left, LockResult, ViewInstalled
from rmpd.runtime.adapter import JoinEnd


class Told(Enum):
    """What a program is told of an engine event (the values of those told as local API events are the frames'
    ``event`` names)."""

    DELIVERIES = EVENT_DELIVERIES
    """A packet's messages, one ``rmpd.Delivery`` each: the packet's fields (the view by its name), the message's
    payload and index in the packet; ``answer`` for the program that holds the handler's lock."""
    VIEW = EVENT_VIEW
    """A view change, in order with the deliveries (:func:`view_of`)."""
    UNDELIVERED = EVENT_UNDELIVERED
    """Each sender is told which of its own messages will not be delivered here (rmpd.runtime.adapter.OwnMessages
    keeps who sent what)."""
    ALREADY_DELIVERED = EVENT_ALREADY_DELIVERED
    """A keyed message of the process's that the group dropped, having delivered its key already: its sender is
    told (``rmpd.AlreadyDelivered``, with where the group delivered the key), and owes it to nobody."""
    ENDED = "ended"
    """The membership or the join ended: the program is told it rejoins, or its group ends (:func:`ending`)."""
    CALL = EVENT_REQUEST
    """A non-member's call, to the program holding the call's handler lock."""
    LOCK_ANSWER = "lock-answer"
    """The answer to a lock or unlock request (:func:`lock_refusal`)."""
    CALL_ANSWER = "call-answer"
    """The outcome of the program's own call (:func:`call_failure`)."""
    NOTHING = "nothing"
    """The process's own business: status queries (the daemon answers them), a refused send (the send's caller is
    refused at once; the daemon logs and counts it)."""


TOLD: dict[type[engine.Event], Told] = {
    engine.Delivered: Told.DELIVERIES,
    engine.ViewInstalled: Told.VIEW,
    engine.UndeliveredSends: Told.UNDELIVERED,
    engine.AlreadyDelivered: Told.ALREADY_DELIVERED,
    engine.Left: Told.ENDED,
    engine.JoinFailed: Told.ENDED,
    engine.CallToAnswer: Told.CALL,
    engine.LockResult: Told.LOCK_ANSWER,
    engine.CallAnswered: Told.CALL_ANSWER,
    engine.SendRefused: Told.NOTHING,
    engine.StatusAsked: Told.NOTHING,
    engine.StatusGathered: Told.NOTHING,
}
"""Every engine event, by its type, and what a program is told of it."""


def view_of(event: ViewInstalled) -> tuple[str, tuple[str, ...]]:
    """The view's name (``creator-ip:port/counter``) and its members, as a program sees them."""
    return str(event.view), tuple(event.members)


@dataclass(frozen=True, slots=True)
class Ending:
    """What a program is told when its process's membership (or join) of a group ends."""

    rejoining: bool
    """The process joins again by itself: the program is told ``rejoining`` and its group goes on."""
    code: str
    """The error code what waited on the membership (a join, a lock request) ends with: ``join-failed`` for a
    join that failed, else ``left``."""
    reason: str
    """Why, as the protocol says it."""
    asked: bool
    """The process left because it was asked to: the group ends without an error."""


def ending(event: Left | JoinFailed) -> Ending:
    if isinstance(event, JoinFailed):
        return Ending(False, JOIN_FAILED, event.reason, False)
    return Ending(event.rejoining, LEFT, event.reason, not event.rejoining and event.reason == "left")


JOIN_END_CODES: dict[JoinEnd, str] = {
    JoinEnd.FAILED: JOIN_FAILED, JoinEnd.LEFT: LEFT, JoinEnd.NEEDS_KEY: AUTH_REQUIRED,
    JoinEnd.OTHER_ENCRYPTION: ENCRYPTION_MISMATCH,
}
"""The error code a join that ended without a view is answered with, for each of the runtime's reasons."""


def lock_refusal(event: LockResult) -> tuple[str, str] | None:
    """The error code and message of a lock or unlock the group refused; None when it was granted."""
    if event.granted:
        return None
    return LOCK_DENIED, f"{event.op} of lock {event.lock} was refused by the group"


def call_failure(event: CallAnswered) -> tuple[str, str] | None:
    """The error code (``call-`` and the engine's code) and message of a call that failed; None when answered."""
    if event.error is None:
        return None
    return CALL_PREFIX + event.error, event.reason
