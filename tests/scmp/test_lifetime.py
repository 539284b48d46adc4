"""The adaptive lifetime estimators (adaptive paper, figures 2 and 3)."""

from __future__ import annotations

import pytest

from rmpd.scmp.lifetime import LimitedHorizon, UnlimitedHorizon, make_estimator, power_of_two_at_least


def feed(est, lifetimes, accepted=True, summary=False):
    for lt in lifetimes:
        est.observe(lt, accepted, summary)


def test_power_of_two() -> None:
    assert [power_of_two_at_least(x) for x in (0, 1, 2, 3, 4, 5, 1000)] == [1, 1, 2, 4, 4, 8, 1024]


def test_limited_collects_after_exactly_s_messages() -> None:
    est = LimitedHorizon(window=4, spikes=1)
    feed(est, [10, 10, 10])
    assert not est.due(0)
    feed(est, [10])
    assert est.due(0)


def test_limited_raises_to_cover_the_h_plus_first_largest() -> None:
    est = LimitedHorizon(window=5, spikes=1)
    feed(est, [900, 30, 20, 10, 5])  # one spike (900) is tolerated: the 2nd largest (30) counts
    assert est.update(0) == 32


def test_limited_ignores_up_to_h_spikes_but_not_more() -> None:
    est = LimitedHorizon(window=5, spikes=1)
    feed(est, [900, 800, 20, 10, 5])
    assert est.update(0) == 1024


def test_limited_lowers_only_while_accepted_outnumber_p_times_rejected() -> None:
    est = LimitedHorizon(window=4, spikes=0, p=2)
    feed(est, [1000] * 4)
    assert est.update(0) == 1024
    # Now lifetimes are small, but rejections are many: no decrease (numacc 4+1=5, numrej 3: 5 > 6 is false).
    feed(est, [10], accepted=True)
    feed(est, [10, 10, 10], accepted=False, summary=True)
    assert est.update(0) == 1024
    # Plenty of accepted messages: it drops to cover the largest lifetime seen, and numacc pays p*numrej + 1.
    feed(est, [10, 12, 9, 11])
    numacc_before = est.state.numacc
    assert est.update(0) == 16
    assert est.state.numacc == numacc_before - 2 * 3 - 1
    assert est.state.numrej == 0


def test_limited_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        LimitedHorizon(window=10, spikes=5, p=2)  # p must be <= (S-H)/H = 1
    with pytest.raises(ValueError):
        LimitedHorizon(window=3, spikes=3)


def test_limited_converges_within_twice_the_true_bound() -> None:
    """Condition 2: once lifetimes stay below X (with at most H spikes per S), the estimate ends below 2X."""
    est = LimitedHorizon(window=16, spikes=2)
    feed(est, [5000] * 16)
    est.update(0)
    for round_ in range(20):
        lifetimes = [100 + (i * 37) % 200 for i in range(14)] + [9000, 8000]  # X = 299, two spikes
        feed(est, lifetimes)
        est.update(round_)
    assert 299 <= est.estimate < 2 * 299


def test_unlimited_raises_at_once_and_lowers_with_growing_p() -> None:
    est = UnlimitedHorizon(interval=10)
    feed(est, [300])
    assert est.update(0) == 512
    feed(est, [20])
    assert est.update(10) == 32
    assert est.p == 2


def test_make_estimator_names() -> None:
    assert make_estimator("fixed", lifetime=500).estimate == 500
    assert make_estimator("limited").name == "limited-horizon"
    assert make_estimator("unlimited").name == "unlimited-horizon"
    with pytest.raises(ValueError):
        make_estimator("magic")
