"""At-most-once RPC on the SCMP filter: the server side of the SCMP paper's figure 3-1.

Per connection the server is IDLE, COMPUTING (a call accepted as new is being run) or REPLYING (the reply is kept
to answer duplicates).  A duplicate CALL is answered with an ACK while computing and with the stored REPLY after;
a REPLY-ACK (or a newer call) discards the stored reply.  Connections being computed are pinned in the filter so
their entries are never collected; stored replies are collected after ``p' = max(p, keep)`` ms.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum

from .filter import ScmpFilter, Verdict


class State(Enum):
    IDLE = "idle"
    COMPUTING = "computing"
    REPLYING = "replying"


class Action(Enum):
    START = "start"
    """Run the call (it was accepted as new)."""
    ACK = "ack"
    """Tell the caller the call is being computed."""
    RESEND = "resend"
    """Send the stored reply again."""
    REFUSE = "refuse"
    """No state for this call: tell the caller its fate is unknown (summary-rejected) or that it is too early."""
    IGNORE = "ignore"
    """A copy of an older call on this connection: nothing to say."""


@dataclass
class Entry:
    state: State
    stamp: int
    """Timestamp of the most recent call accepted on this connection."""
    reply: bytes | None = None
    reply_time: int = 0


class RpcServer:
    def __init__(self, filter: ScmpFilter, keep: int = 300_000) -> None:
        self.filter = filter
        self.keep = keep
        """The K of figure 3-1: how long a stored reply is kept at least, for callers still retrying."""
        self.entries: dict[Hashable, Entry] = {}

    def call(self, conn: Hashable, stamp: int, clock: int,
             bound: int | None = None) -> tuple[Action, Verdict, bytes | None]:
        """A CALL arrived: its filter verdict and what to do (with the stored reply for RESEND).

        A copy of a call this server accepted but holds no reply for (it was not the one computing it, or the
        reply was acknowledged) is refused: the caller learns its fate is unknown here rather than waiting."""
        verdict = self.filter.decide(conn, stamp, clock, bound)
        action, stored = self.act(conn, stamp, verdict)
        return action, verdict, stored

    def act(self, conn: Hashable, stamp: int, verdict: Verdict) -> tuple[Action, bytes | None]:
        """What to do about a CALL the filter (here or elsewhere) gave ``verdict`` (with the stored reply for
        RESEND)."""
        entry = self.entries.get(conn)
        if verdict is Verdict.NEW:
            self.entries[conn] = Entry(State.COMPUTING, stamp)
            self.filter.pinned.add(conn)
            return Action.START, None
        if entry is None or entry.stamp < stamp:
            return Action.REFUSE, None
        if entry.stamp > stamp:
            return Action.IGNORE, None
        if entry.state is State.IDLE:
            return Action.REFUSE, None
        if entry.state is State.COMPUTING:
            return Action.ACK, None
        return Action.RESEND, entry.reply

    def complete(self, conn: Hashable, stamp: int, reply: bytes, clock: int) -> bool:
        """The call finished with ``reply``; False when that call is no longer the connection's current one."""
        entry = self.entries.get(conn)
        if entry is None or entry.stamp != stamp or entry.state is not State.COMPUTING:
            return False
        entry.state, entry.reply, entry.reply_time = State.REPLYING, reply, clock
        self.filter.pinned.discard(conn)
        return True

    def abandon(self, conn: Hashable, stamp: int) -> None:
        """The call cannot finish here (its server went away): forget it without a reply, never run it again."""
        entry = self.entries.get(conn)
        if entry is not None and entry.stamp == stamp and entry.state is State.COMPUTING:
            entry.state = State.IDLE
            self.filter.pinned.discard(conn)

    def reply_acked(self, conn: Hashable, stamp: int) -> None:
        entry = self.entries.get(conn)
        if entry is not None and entry.stamp == stamp and entry.state is State.REPLYING:
            entry.state, entry.reply = State.IDLE, None

    def collect(self, clock: int) -> int:
        """Drop IDLE and REPLYING entries whose reply is older than p' (figure 3-1); COMPUTING ones stay."""
        horizon = clock - max(self.filter.estimator.estimate, self.keep)
        old = [c for c, e in self.entries.items() if e.state is not State.COMPUTING and e.reply_time < horizon]
        for conn in old:
            self.filter.upper = max(self.filter.upper, self.entries.pop(conn).stamp)
        return len(old)
