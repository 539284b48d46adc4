"""At-most-once RPC server states (SCMP paper, figure 3-1)."""

from __future__ import annotations

from rmpd.scmp.filter import ScmpFilter, Verdict
from rmpd.scmp.lifetime import LifetimeEstimator
from rmpd.scmp.rpc import Action, RpcServer, State

C = ("client", 0)


def server(keep: int = 1000) -> RpcServer:
    return RpcServer(ScmpFilter(LifetimeEstimator(100, 10**9)), keep=keep)


def test_new_call_starts_computing_and_is_pinned() -> None:
    s = server()
    assert s.call(C, 10, 11)[0] is Action.START
    assert s.entries[C].state is State.COMPUTING and C in s.filter.pinned


def test_duplicate_while_computing_is_acked() -> None:
    s = server()
    s.call(C, 10, 11)
    assert s.call(C, 10, 12)[:2] == (Action.ACK, Verdict.DUPLICATE)


def test_duplicate_after_reply_resends_the_stored_reply() -> None:
    s = server()
    s.call(C, 10, 11)
    assert s.complete(C, 10, b"answer", 20)
    assert s.call(C, 10, 30) == (Action.RESEND, Verdict.DUPLICATE, b"answer")
    assert C not in s.filter.pinned


def test_new_call_discards_the_stored_reply() -> None:
    s = server()
    s.call(C, 10, 11)
    s.complete(C, 10, b"old", 20)
    assert s.call(C, 15, 21)[0] is Action.START
    assert s.entries[C].reply is None
    assert s.call(C, 10, 22)[0] is Action.IGNORE  # a copy of the older call gets nothing


def test_reply_ack_returns_to_idle() -> None:
    s = server()
    s.call(C, 10, 11)
    s.complete(C, 10, b"x", 20)
    s.reply_acked(C, 10)
    assert s.entries[C].state is State.IDLE and s.entries[C].reply is None
    assert s.call(C, 10, 30)[0] is Action.REFUSE  # accepted once, reply gone: its fate is not ours to tell


def test_duplicate_without_entry_is_refused_or_ignored() -> None:
    s = RpcServer(ScmpFilter(LifetimeEstimator(100, 10**9), upper=50))
    assert s.call(C, 40, 60)[:2] == (Action.REFUSE, Verdict.SUMMARY)


def test_gc_keeps_computing_entries_and_raises_upper_from_call_stamps() -> None:
    s = server(keep=50)
    s.call(C, 10, 11)
    s.call(("other", 0), 12, 13)
    s.complete(("other", 0), 12, b"r", 14)
    assert s.collect(clock=1000) == 1
    assert C in s.entries and ("other", 0) not in s.entries
    assert s.filter.upper >= 12


def test_complete_of_a_superseded_call_is_refused() -> None:
    s = server()
    s.call(C, 10, 11)
    assert not s.complete(C, 9, b"x", 12)
    s.abandon(C, 10)
    assert s.entries[C].state is State.IDLE and C not in s.filter.pinned
