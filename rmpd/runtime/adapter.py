"""What every application of a process does alike: the daemon's hub for its local clients, and the embedded node
for its own program.

Both park a join until the process is in a view of the group, join again when a join was asked for while the
process was still on its way out of the group (its ``Left`` comes first), explain a join that failed, say why a
send is refused while the process rejoins, keep one lock request per lock in flight (``LockRequests``), hold a
group's token back while a reader of it is behind (section 4.6), cutting that reader off after OVERRUN_GRACE, and
keep which messages each sender was given until they are delivered, so that a membership that ends first reports
them to their sender (``OwnMessages``).
They differ in who waits (a client's request, or a task) and in what "behind" and "cut off" mean; those they pass
in.  The adapter makes its requests through the loop, so when it runs from an application's ``handle_events``
they are drained after it, never inside the drain that produced the event.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

import trio

from rmpd.protocol.events import JoinFailed, Left, LockResult, UndeliveredSends, ViewInstalled
from rmpd.protocol.qos import Level, QoS
from rmpd.protocol.view import View
from rmpd.wire.sealing import ENCRYPTION_MISMATCH, UNKNOWN_KEY, UNSIGNED, UNVERIFIABLE

from .loop import ProcessLoop

OVERRUN_GRACE = 1.0
"""Seconds a group may hold the token back for a reader that is behind before that reader is cut off; well under the
time the ring takes to declare a silent token site failed (ten doubling retries)."""


class JoinEnd(Enum):
    """Why a join ended without a view, in the runtime's terms; the daemon and the client library each name it in
    theirs (the local API's error codes)."""

    FAILED = "failed"
    """The process's join failed (``JoinFailed``: nobody answered an existing-only join, the group refused it, or
    the group name cannot be joined)."""
    LEFT = "left"
    """The membership ended (``Left``) before the join was answered, and nothing joins again."""
    NEEDS_KEY = "needs-key"
    """Nobody answered, and the group's address carries datagrams sealed with a key while this process has none."""
    OTHER_ENCRYPTION = "other-encryption"
    """Nobody answered, and a key holder sends on the group's address with the other ``encrypt`` setting."""


class Reply(Protocol):
    """Whoever waits for a join: answered once, with the view's fields or with why the join ended and a message."""

    def ok(self, fields: dict[str, Any]) -> None: ...

    def fail(self, reason: JoinEnd, message: str) -> None: ...


@dataclass(frozen=True)
class JoinOptions:
    """What a join asked for besides the group, kept while it waits: a join asked while the process is on its way
    out of the group is made once the process has left, and must ask what the program asked."""

    ttl: int | None
    min_partition: int
    existing_only: bool
    via: str | None


class ProcessAdapter:
    """Join waiters, rejoin on ``Left`` and the overrun rule, over one :class:`ProcessLoop`: what the application
    owning the loop (the daemon's, or an embedded node) does with it alike."""

    def __init__(self, loop: ProcessLoop, stats: MutableMapping[str, int]) -> None:
        self.loop = loop
        self.stats = stats
        """Counts overrun_on, overrun_off and overrun_cut (shared with the owner's own counters)."""
        self.join_waiters: dict[str, list[Reply]] = defaultdict(list)
        self.join_options: dict[str, JoinOptions] = {}
        """Per group with join waiters, what the latest of their joins asked for."""
        self.overrun: dict[str, float] = {}
        """Groups whose process holds the token back because a reader is behind, and since when."""
        self.stopping = False
        """Set on shutdown: a Left no longer leads to a rejoin."""
        self.rejoining: dict[str, str] = {}
        """Groups whose membership ended by itself (``Left.rejoining``) and that are not in a view again yet, with
        the reason: a send meanwhile is refused, and the refusal says so."""
        self.join_refusals: dict[str, tuple[JoinEnd, str]] = {}
        """Joins whose group was heard in a form this process cannot take: kept from founding a view, and, if nobody
        answers them, failed with this reason and message."""
        self.unverified_heard: dict[str, Counter[tuple[str, str]]] = {}
        """Per group with join waiters: datagrams dropped on its address while they wait, by (reason, source)."""
        loop.refusal_watch = self.refused

    # ------------------------------------------------------------------------------------------------------------
    # Joins

    def join(self, group: str, reply: Reply, *, ttl: int | None = None, min_partition: int = 1,
             existing_only: bool = False, via: str | None = None) -> View | None:
        """Join ``group`` for ``reply``: the view at once when the process is a member already (nothing parked),
        else None, and ``reply`` is answered once it is in a view or the join failed.  ValueError for a group
        name that cannot be joined (nothing parked)."""
        self.loop.join(group, ttl=ttl, min_partition=min_partition, existing_only=existing_only, via=via)
        view = self.loop.view(group)
        if view is not None and self.loop.is_member(group):
            return view
        self.join_waiters[group].append(reply)  # if the process is leaving: joined again on Left
        self.join_options[group] = JoinOptions(ttl, min_partition, existing_only, via)
        return None

    def forget(self, gone: Callable[[Reply], bool]) -> None:
        """Join waiters for which ``gone`` is true no longer wait (their client went away)."""
        for waiters in self.join_waiters.values():
            waiters[:] = [w for w in waiters if not gone(w)]

    def view_installed(self, event: ViewInstalled) -> None:
        """Answer the group's join waiters, unless this is a view installed on the way out of a membership."""
        if self.loop.is_member(event.group):
            self.rejoining.pop(event.group, None)
            self.join_options.pop(event.group, None)
            self.unverified_heard.pop(event.group, None)
            self.join_refusals.pop(event.group, None)
            answer = {"view": str(event.view), "members": list(event.members)}
            for reply in self.join_waiters.pop(event.group, []):
                reply.ok(answer)

    def ended(self, event: Left | JoinFailed) -> bool:
        """A membership or a join ended.  True when a join was asked for meanwhile and the process joins again
        (the membership goes on for the application); otherwise the join waiters get the error."""
        group = event.group
        self.rejoining.pop(group, None)
        if isinstance(event, Left) and self.join_waiters.get(group) and not self.stopping:
            self._rejoin(group)
            return True
        self.join_options.pop(group, None)
        refusal = self.join_refusals.pop(group, None)
        hint = self.auth_hint(group)
        if not isinstance(event, JoinFailed):
            reason, message = JoinEnd.LEFT, event.reason
        else:
            reason, message = refusal or (JoinEnd.FAILED, event.reason + hint)
        for reply in self.join_waiters.pop(group, []):
            reply.fail(reason, message)
        return False

    def membership_ended(self, event: Left) -> None:
        """A membership ended by itself and the process joins again (``Left.rejoining``): the application's
        membership goes on, but until the next view a send has no view to go to."""
        self.rejoining[event.group] = event.reason

    def not_member(self, group: str, *, attached: bool) -> str:
        """Why a send to ``group`` was refused as not-member, in words that tell a program between two memberships
        (retry after the next view) from one that never joined.  ``attached``: the sender has joined the group."""
        reason = self.rejoining.get(group)
        if reason is not None:
            return (f"not in a view of {group!r}: rejoining it (the membership ended: {reason}); sends are refused "
                    f"until the next view")
        if attached and self.loop.is_leaving(group):
            return f"not in a view of {group!r}: leaving its view to join the group again (a merge, or a leave)"
        if attached and group in self.loop.groups():
            return f"not in a view of {group!r} yet: joining it"
        return f"not in a view of {group!r} (join it first)"

    def _rejoin(self, group: str) -> None:
        """Join ``group`` again as its waiting joins asked (the process dropped what the old membership had)."""
        asked = self.join_options[group]
        try:
            self.loop.join(group, ttl=asked.ttl, min_partition=asked.min_partition,
                           existing_only=asked.existing_only, via=asked.via)
        except ValueError as exc:
            self.join_options.pop(group, None)
            for reply in self.join_waiters.pop(group, []):
                reply.fail(JoinEnd.FAILED, str(exc))

    def refused(self, groups: Iterable[str], refusals: Counter[tuple[str, str]]) -> None:
        """The group key's check dropped ``refusals`` (count per reason and source) on the multicast address of
        ``groups``.  A join the application waits for learns here that its group speaks in a form this process
        cannot take.  Sealed datagrams on a process with no key, or datagrams of the other encrypt setting under
        its own key (verified: only a key holder makes them), mean it can never be in that group: unless a member
        it can talk to answers (a group of its own setting on the same address), the join fails with a reason
        naming the setting, instead of founding a second group beside the first.  Other drops (another key, plain
        or forged datagrams) only explain a join that went unanswered."""
        for group in [g for g in groups if g in self.join_waiters]:
            if group in self.rejoining or group in self.join_refusals or self.loop.view(group) is not None:
                continue  # the process rejoins by itself, the join is kept from founding already, or a view is in
            blocking = [(reason, source) for reason, source in refusals if reason in JOIN_BLOCKERS]
            if not blocking:
                heard = self.unverified_heard.setdefault(group, Counter())
                if len(heard) < MAX_HEARD:
                    heard.update(refusals)
                continue
            reason, source = blocking[-1]
            if self.loop.keep_from_founding(group):
                self.join_refusals[group] = JOIN_BLOCKERS[reason](
                    group, self.loop.group_address(group), source, self.loop.guard.encrypt)

    def auth_hint(self, group: str) -> str:
        """Why a join of ``group`` may have gone unanswered: datagrams on its address, heard while the join waited,
        that this process could not verify (nothing about traffic of other groups or from before the join)."""
        heard = self.unverified_heard.pop(group, None)
        if not heard:
            return ""
        sources = sorted({source for _, source in heard})
        reasons = {reason for reason, _ in heard}
        if UNKNOWN_KEY in reasons:
            likely = "the group is probably keyed with a different auth key"
        elif UNSIGNED in reasons:
            likely = "a group without an auth key uses that address, and this process has one"
        else:
            likely = "someone sends forged datagrams to that address"
        return (f"; this process dropped {heard.total()} datagram(s) on the group's address it could not verify "
                f"from {', '.join(sources[:3])}: {likely}")

    # ------------------------------------------------------------------------------------------------------------
    # A reader behind (section 4.6)

    def check_overrun(self, groups: Iterable[str], behind: Callable[[str], bool],
                      cut: Callable[[str], None], now: float | None = None) -> None:
        """For each of ``groups``: while ``behind(group)``, the process refuses the group's token, so the ring waits
        instead of the reader falling further behind; a reader still behind after OVERRUN_GRACE is ``cut`` off
        (one stuck reader must not stall the ring until the others declare this process failed).  ``now``: the
        caller's clock (default: trio's)."""
        if now is None:
            now = trio.current_time()
        for group in groups:
            is_behind = behind(group)
            since = self.overrun.get(group)
            if is_behind and since is not None and now - since > OVERRUN_GRACE:
                cut(group)
                is_behind = False
            if is_behind != (since is not None):
                if is_behind:
                    self.overrun[group] = now
                else:
                    del self.overrun[group]
                self.stats["overrun_on" if is_behind else "overrun_off"] += 1
                self.loop.set_overrun(group, is_behind)


MAX_HEARD = 64
"""(reason, source) pairs a waiting join remembers for its message: a flood from many sources must not grow it."""


def _needs_key(group: str, address: tuple[str, int], source: str, encrypt: bool) -> tuple[JoinEnd, str]:
    return JoinEnd.NEEDS_KEY, (
        f"{group!r} is a keyed group: nobody answered the join, and its address {address[0]}:{address[1]} carries "
        f"datagrams sealed with an auth key (latest from {source}) while this process has no key; start rmpd with "
        f"--auth-key FILE (auth_key in its config) naming the group's key file")


def _other_encryption(group: str, address: tuple[str, int], source: str, encrypt: bool) -> tuple[JoinEnd, str]:
    if encrypt:
        heard, fix = "signed but not encrypted", "start rmpd with --no-encrypt, or every member with --encrypt"
    else:
        heard, fix = "encrypted", "start rmpd with --encrypt, or encrypt = true in its config"
    return JoinEnd.OTHER_ENCRYPTION, (
        f"{group!r} is {heard}: nobody answered the join, and {source} sends on its address "
        f"{address[0]}:{address[1]} under this process's auth key with the other encrypt setting; every member of a "
        f"group must have the same one ({fix})")


JOIN_BLOCKERS: dict[str, Callable[[str, tuple[str, int], str, bool], tuple[JoinEnd, str]]] = {
    UNVERIFIABLE: _needs_key, ENCRYPTION_MISMATCH: _other_encryption,
}
"""Drops (``DatagramGuard.last_refusal``) that say the group heard cannot be joined from here, whatever else
happens: the reason and message a join of it fails with."""


W = TypeVar("W")
"""Whoever waits for a lock answer: a client's request (the hub) or a task (the node)."""

S = TypeVar("S")
"""Whoever sent a message: a client's session (the hub) or the program (the node)."""


MessageId = bytes | int
"""How a sender names a message besides its sequence number: its key, or the number the client library gave a
message posted without one (``Group.post`` returns it)."""


@dataclass(frozen=True)
class NotDelivered:
    """One sender's messages a membership ended without delivering here."""

    seqs: tuple[int, ...]
    """Their sequence numbers, in order, each once."""
    ids: tuple[MessageId, ...]
    """The keys and post numbers of those the sender named so, in order."""


class OwnMessages(Generic[S]):
    """The messages this process's ``send`` gave each sender, per group, until they are delivered here or the
    group tells the sender it had delivered their key already: when the membership ends first, each sender is told
    its own (docs/protocol.md, "Nothing lost in silence").

    The engine's ``UndeliveredSends`` names the process's messages not yet ordered; a daemon has many clients, and the
    numbers alone do not say whose they are, so the sender of each is kept here, with the message's key or post
    number when it has one (what the sender knows it by).  A message delivered here is forgotten (it was not lost,
    and a busy sender must not grow this); so is a keyed one the group dropped as a copy (``AlreadyDelivered``):
    its sender is told it is done.  What is still kept when the membership ends was ordered but not delivered here
    (a safe message not yet stable, say): the sender will not see it here either, so it is reported with the rest.
    Messages packed into one packet share its number: each of their senders is told it.  Numbers nobody here was
    given (a non-member's call this member relayed into the order, a sender gone meanwhile) are left out.
    Unreliable messages are not kept: they have a numbering of their own, and no delivery is promised for them."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[int, list[tuple[S, MessageId | None]]]] = {}
        """Per group: sequence number -> (sender, the message's key or post number) for each message named so, and
        one (sender, None) for a sender's messages in that packet named by the number alone."""

    def sent(self, group: str, seqs: list[int], qos: QoS, sender: S,
             ids: Sequence[MessageId] | None = None) -> None:
        """``send`` gave ``sender`` these numbers (in a group the process is a member of); ``ids``: the messages'
        keys or post numbers, one per number (None: the numbers name them)."""
        if qos.level == Level.UNRELIABLE:
            return
        table = self.groups.setdefault(group, {})
        if ids is None:
            entry: tuple[S, MessageId | None] = (sender, None)
            for seq in dict.fromkeys(seqs):  # a batch packed into few packets repeats their numbers
                entries = table.get(seq)
                if entries is None:
                    table[seq] = [entry]
                elif entry not in entries:
                    entries.append(entry)
            return
        for seq, ident in zip(seqs, ids, strict=True):
            entries = table.get(seq)
            if entries is None:
                table[seq] = [(sender, ident)]
            else:
                entries.append((sender, ident))

    def delivered(self, group: str, seq: int, qos: QoS) -> None:
        """An own packet was delivered here (called only for own deliveries: the caller checks the source): every
        message of it still kept is done.  For a keyed packet the engine tells each copy it left out
        (:meth:`already_delivered`) before the packet's delivery, so what is still kept is what was delivered,
        without its keys to tell them apart."""
        table = self.groups.get(group)
        if table and qos.level != Level.UNRELIABLE:
            table.pop(seq, None)

    def already_delivered(self, group: str, seq: int, key: bytes) -> S | None:
        """The group dropped the keyed message ``key`` of packet ``seq``: it had delivered the key already.  Its
        sender (None when nobody here waits for it), who owes it to nobody now."""
        table = self.groups.get(group)
        entries = table.get(seq) if table else None
        if not entries:
            return None
        for at, (sender, ident) in enumerate(entries):
            if type(ident) is bytes and ident == key:
                del entries[at]
                if not entries:
                    del table[seq]  # type: ignore[index]
                return sender
        return None

    def ended(self, group: str, named: UndeliveredSends | None = None) -> tuple[dict[S, tuple[int, ...]], int]:
        """The membership of ``group`` ended (``named``: the engine's report of what it had not ordered): per
        sender, the numbers of its messages not delivered here, in order; and how many of the named numbers no
        sender here waits for (:meth:`ended_named`)."""
        per_sender, unclaimed = self.ended_named(group, named)
        return {sender: lost.seqs for sender, lost in per_sender.items()}, unclaimed

    def ended_named(self, group: str, named: UndeliveredSends | None = None) -> tuple[dict[S, NotDelivered], int]:
        """The membership of ``group`` ended (``named``: the engine's report of what it had not ordered): per
        sender, its messages not delivered here, by number and by key or post number; and how many of the named
        numbers no sender here waits for (a relayed call, a sender gone, a message of unordered or source QoS
        delivered here as it went out)."""
        table = self.groups.pop(group, {})
        unclaimed = sum(1 for seq in named.seqs if seq not in table) if named is not None else 0
        seqs: dict[S, list[int]] = {}
        ids: dict[S, list[MessageId]] = {}
        for seq in sorted(table):
            for sender, ident in table[seq]:
                numbers = seqs.setdefault(sender, [])
                if not numbers or numbers[-1] != seq:
                    numbers.append(seq)
                if ident is not None:
                    ids.setdefault(sender, []).append(ident)
        return {sender: NotDelivered(tuple(numbers), tuple(ids.get(sender, ())))
                for sender, numbers in seqs.items()}, unclaimed

    def forget(self, sender: S, group: str | None = None) -> None:
        """``sender`` went away (from ``group``, or from all): nobody is left to tell about its messages."""
        for name in [group] if group is not None else list(self.groups):
            table = self.groups.get(name, {})
            for seq in [s for s, entries in table.items() if any(e[0] == sender for e in entries)]:
                left = [e for e in table[seq] if e[0] != sender]
                if left:
                    table[seq] = left
                else:
                    del table[seq]

    def held(self, group: str) -> int:
        """Sequence numbers of ``group`` kept (``rmp status``: ``own_pending``; tests check it drains)."""
        return len(self.groups.get(group, ()))


class LockBusy(Exception):
    """Another owner of this process asked for the same lock operation first; its answer is on its way."""


class LockRequests(Generic[W]):
    """Lock and unlock requests of one process, one per lock and operation in flight.

    The group grants a lock to a process: it cannot tell the owners inside it apart (a daemon's clients).  So a
    second owner asking while the first one's request is on its way is refused (``LockBusy``), and the same owner
    asking again waits for the answer already coming.  That also bounds what the owners can make the group carry
    to one request per lock."""

    def __init__(self, loop: ProcessLoop) -> None:
        self.loop = loop
        self.waiting: dict[tuple[str, int, str], deque[tuple[W, object]]] = {}

    def request(self, group: str, lock: int, op: str, waiter: W, owner: object) -> None:
        """Ask for ``op`` ("lock" or "unlock") of ``lock`` for ``owner``; ``waiter`` is among the answered.  The
        waiter is parked before the process is asked: in a one-member group the answer comes back inside the call.
        The process's refusal of the arguments (BadArgument, NotMember) leaves nothing parked."""
        key = (group, lock, op)
        waiters = self.waiting.get(key)
        if waiters:
            if waiters[0][1] is not owner:
                raise LockBusy(f"lock {lock} of {group!r}: another owner in this process asked first ({op})")
            waiters.append((waiter, owner))
            return
        self.waiting[key] = deque([(waiter, owner)])
        try:
            (self.loop.lock if op == "lock" else self.loop.unlock)(group, lock)
        except BaseException:
            self.waiting.pop(key, None)
            raise

    def answered(self, event: LockResult) -> list[tuple[W, object]]:
        """The waiters ``event`` answers (all one owner's), oldest first."""
        return list(self.waiting.pop((event.group, event.lock, event.op), ()))

    def ended(self, group: str) -> list[W]:
        """The membership of ``group`` ended: every waiter of it, to be told so."""
        gone: list[W] = []
        for key in [k for k in self.waiting if k[0] == group]:
            gone.extend(waiter for waiter, _owner in self.waiting.pop(key))
        return gone


__all__ = ["OVERRUN_GRACE", "JoinEnd", "LockBusy", "LockRequests", "MessageId", "NotDelivered", "OwnMessages",
           "ProcessAdapter", "Reply"]
