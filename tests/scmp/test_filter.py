"""Every rule of the SCMP paper's figures 2-1 (non-resilient) and 2-2 (resilient), one test each."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rmpd.scmp.filter import ScmpFilter, Verdict
from rmpd.scmp.latest import LatestStore
from rmpd.scmp.lifetime import LifetimeEstimator

A, B = ("a", 0), ("b", 0)


def fixed(p: int = 100, interval: int = 10**9) -> LifetimeEstimator:
    """A fixed lifetime that never collects on its own, so tests collect exactly when they say."""
    return LifetimeEstimator(p, interval)


def test_initialisation_empty_table_and_upper_zero() -> None:
    f = ScmpFilter(fixed())
    assert f.table == {} and f.upper == 0


def test_rule_1a_entry_at_or_below_is_duplicate() -> None:
    f = ScmpFilter(fixed())
    assert f.decide(A, 50, 60) is Verdict.NEW
    assert f.decide(A, 50, 61) is Verdict.DUPLICATE
    assert f.decide(A, 40, 61) is Verdict.DUPLICATE  # out of order counts as a duplicate too


def test_rule_1b_entry_above_is_accepted_and_recorded() -> None:
    f = ScmpFilter(fixed())
    f.decide(A, 50, 60)
    assert f.decide(A, 51, 62) is Verdict.NEW
    assert f.table[A] == 51


def test_rule_2a_no_entry_at_or_below_upper_is_rejected() -> None:
    f = ScmpFilter(fixed(), upper=100)
    assert f.decide(A, 100, 150) is Verdict.SUMMARY
    assert f.decide(A, 99, 150) is Verdict.SUMMARY
    assert A not in f.table


def test_rule_2b_no_entry_above_upper_is_accepted_and_stored() -> None:
    f = ScmpFilter(fixed(), upper=100)
    assert f.decide(A, 101, 150) is Verdict.NEW
    assert f.table == {A: 101}


def test_gc_removes_only_old_entries_and_raises_upper() -> None:
    f = ScmpFilter(fixed(p=100))
    f.decide(A, 10, 20)
    f.decide(B, 500, 505)
    removed = f.collect(clock=200)  # horizon 100: A (10) goes, B (500) stays
    assert removed == [(A, 10)]
    assert f.table == {B: 500} and f.upper == 10
    # A copy of A's message now meets upper instead of the table: still rejected.
    assert f.decide(A, 10, 210) is Verdict.SUMMARY


def test_gc_never_lowers_upper() -> None:
    f = ScmpFilter(fixed(p=100), upper=1000)
    f.decide(A, 1001, 1002)
    f.collect(clock=5000)
    assert f.upper == 1001
    f.collect(clock=6000)
    assert f.upper == 1001


def test_pinned_connections_are_not_collected() -> None:
    f = ScmpFilter(fixed(p=100))
    f.decide(A, 10, 20)
    f.pinned.add(A)
    assert f.collect(clock=1000) == []
    assert f.table == {A: 10}


def test_resilient_rule_1_refuses_messages_after_latest() -> None:
    f = ScmpFilter(fixed(), latest=1000)
    assert f.decide(A, 1001, 900) is Verdict.TOO_EARLY
    assert A not in f.table
    assert f.decide(A, 1000, 900) is Verdict.NEW


def test_maintaining_latest_only_raises() -> None:
    f = ScmpFilter(fixed(), latest=1000)
    f.raise_latest(2000)
    assert f.latest == 2000
    f.raise_latest(1500)
    assert f.latest == 2000
    assert f.decide(A, 1999, 1000) is Verdict.NEW


def test_crash_recovery_starts_upper_at_persisted_latest(tmp_path) -> None:
    store = LatestStore(tmp_path / "latest")
    store.write(1000)
    before = ScmpFilter(fixed(), latest=store.load())
    assert before.decide(A, 900, 950) is Verdict.NEW
    # crash: the table is lost; only the store survives
    after = ScmpFilter.recovered(fixed(), LatestStore(tmp_path / "latest").load())
    assert after.table == {} and after.upper == 1000
    assert after.decide(A, 900, 2000) is Verdict.SUMMARY  # the replayed copy
    assert after.decide(B, 1200, 2000) is Verdict.TOO_EARLY  # no new latest established yet
    after.raise_latest(store.write(3000))
    assert after.decide(B, 1200, 2000) is Verdict.NEW


def test_rejections_below_the_recovery_floor_do_not_hold_the_estimate_up() -> None:
    """After a crash every message stamped before the persisted latest is refused; that says nothing about the
    lifetime estimate, so the estimator does not count it (it would block lowering the estimate for minutes)."""
    f = ScmpFilter.recovered(fixed(), 1000)
    f.raise_latest(5000)
    assert f.decide(A, 900, 1100) is Verdict.SUMMARY
    assert f.estimator.summary_rejected == 0
    f.upper = 1500  # a later collection raised upper: a fresh message below it is a real loss
    assert f.decide(B, 1200, 1300) is Verdict.SUMMARY
    assert f.estimator.summary_rejected == 1


def test_latest_store_is_monotonic_and_durable(tmp_path) -> None:
    store = LatestStore(tmp_path / "d" / "latest")
    assert store.load() is None
    assert store.write(500) == 500
    assert store.write(400) == 500
    assert LatestStore(tmp_path / "d" / "latest").load() == 500
    assert not (tmp_path / "d" / "latest.tmp").exists()


def test_latest_store_refuses_a_corrupt_file(tmp_path) -> None:
    import pytest

    from rmpd.scmp.latest import LatestStoreError

    (tmp_path / "latest").write_text("12x")
    with pytest.raises(LatestStoreError):
        LatestStore(tmp_path / "latest").load()


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.booleans()), max_size=200),
       st.integers(1, 40))
def test_no_message_is_ever_accepted_twice(script, p) -> None:
    """Any interleaving of copies, collections and estimates: each (conn, stamp) is accepted at most once, and
    never after a later stamp on its connection (adaptive paper, theorem 2)."""
    f = ScmpFilter(fixed(p))
    accepted: set[tuple[int, int]] = set()
    highest: dict[int, int] = {}
    for clock, (conn, stamp, collect) in enumerate(script, 1):
        if collect:
            f.collect(clock)
        if f.decide(conn, stamp, clock) is Verdict.NEW:
            assert (conn, stamp) not in accepted
            assert stamp > highest.get(conn, -1)
            accepted.add((conn, stamp))
            highest[conn] = stamp


def test_a_verdict_learned_from_another_server_is_kept_as_if_decided_here() -> None:
    """A member following the relay's verdict: a call the relay accepted is recorded, even below this filter's own
    floor, so this filter refuses its copies should it decide later; refusals leave the table alone."""
    f = ScmpFilter(fixed(), upper=1000)
    f.learn(A, 500, 600, Verdict.NEW)
    f.learn(B, 700, 800, Verdict.SUMMARY)
    assert f.table == {A: 500} and f.counts[Verdict.NEW] == 1 and f.counts[Verdict.SUMMARY] == 1
    assert f.decide(A, 500, 900) is Verdict.DUPLICATE
    assert f.decide(A, 1001, 900) is Verdict.NEW
