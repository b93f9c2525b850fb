"""Tests for the Little's-law measurement tools in servingcap.sim."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servingcap import MM1, sim


def _edge_terms(entry, exit_, lo, hi, w):
    """Area of the window's edge straddlers, the only gap between L and lambda*W."""
    done = (exit_ > lo) & (exit_ <= hi)
    before = (w * np.where(done, np.clip(lo - entry, 0, None), 0.0)).sum()
    still = exit_ > hi
    after = (w * np.where(still, np.clip(hi - np.maximum(entry, lo), 0, None), 0.0)).sum()
    return before, after


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 30), st.integers(1, 5)),
                min_size=1, max_size=60),
       st.floats(0, 50), st.floats(1, 80))
def test_measure_little_differs_from_lambda_w_only_by_edge_terms(items, lo, span):
    # Little's law on a sample path: L*T - (sum of completed sojourns) is exactly the
    # part of the edge straddlers' time that falls outside/inside the window.
    entry = np.array([e for e, _, _ in items])
    exit_ = entry + np.array([d for _, d, _ in items])
    w = np.array([float(k) for _, _, k in items])
    hi = lo + span
    m = sim.measure_little(entry, exit_, lo, hi, weights=w)
    before, after = _edge_terms(entry, exit_, lo, hi, w)
    assert m.implied_L * span == pytest.approx(m.L * span + before - after, abs=1e-6)


def test_measure_little_matches_time_average_in_system():
    rng = np.random.default_rng(3)
    a, s, wq = sim.mmc_sample(0.8, 1.0, 20_000, rng)
    m = sim.measure_little(a, a + wq + s, 100.0, float(a[-1]))
    assert m.L == pytest.approx(sim.time_average_in_system(a, a + wq + s, 100.0, float(a[-1])))


def test_measure_little_on_mm1_agrees_with_closed_form():
    # 2e5 customers of M/M/1 at rho = 0.8: the time average of N has a relative standard
    # error of about sqrt(2 (1 + rho) / ((1 - rho)^3 n)) ~ 0.9 %, so allow 5 %.
    rng = np.random.default_rng(11)
    a, s, wq = sim.mmc_sample(0.8, 1.0, 200_000, rng)
    m = sim.measure_little(a, a + wq + s, 1_000.0, float(a[-1]))
    assert m.L == pytest.approx(MM1(0.8, 1.0).mean_in_system, rel=0.05)
    # and the identity itself: edge effects are about W / T = 5 / 2.5e5, allow 1e-3
    assert abs(m.rel_error) < 1e-3


def test_weights_equal_repeated_rows():
    entry = np.array([0.0, 1.0, 2.0])
    exit_ = np.array([3.0, 4.0, 2.5])
    m1 = sim.measure_little(entry, exit_, 0.5, 3.5, weights=[2, 1, 3])
    m2 = sim.measure_little(np.repeat(entry, [2, 1, 3]), np.repeat(exit_, [2, 1, 3]), 0.5, 3.5)
    assert (m1.L, m1.arrival_rate, m1.time_in_system) == pytest.approx(
        (m2.L, m2.arrival_rate, m2.time_in_system))


def test_running_little_matches_measure_little_at_each_checkpoint():
    rng = np.random.default_rng(5)
    a, s, wq = sim.mmc_sample(0.7, 1.0, 5_000, rng, servers=2)
    ex = a + wq + s
    w = rng.integers(1, 4, a.size).astype(float)
    times = np.array([10.0, 500.0, 3_000.0, float(ex.max()) + 1.0])
    run = sim.running_little(a, ex, times, start=2.0, weights=w)
    for t, row in zip(times, run.itertuples(), strict=True):
        m = sim.measure_little(a, ex, 2.0, t, weights=w)
        assert row.L == pytest.approx(m.L, rel=1e-9, abs=1e-12)
        assert row.arrival_rate == pytest.approx(m.arrival_rate, rel=1e-12)
        assert row.implied_L == pytest.approx(m.implied_L, rel=1e-9, abs=1e-12)
    # after every item has left, the sample-path identity is exact
    assert run["L"].iloc[-1] == pytest.approx(run["implied_L"].iloc[-1], rel=1e-9)


@pytest.mark.parametrize("kwargs, word", [
    (dict(entry_times=[0.0, 1.0], exit_times=[1.0], start=0, end=1), "same length"),
    (dict(entry_times=[], exit_times=[], start=0, end=1), "entry_times"),
    (dict(entry_times=[1.0], exit_times=[0.5], start=0, end=1), "exit_times"),
    (dict(entry_times=[0.0], exit_times=[1.0], start=1, end=1), "end"),
    (dict(entry_times=[0.0], exit_times=[1.0], start=0, end=1, weights=[-1.0]), "weights"),
    (dict(entry_times=[0.0], exit_times=[1.0], start=0, end=1, weights=[1.0, 2.0]), "weights"),
    (dict(entry_times=[0.0], exit_times=[float("nan")], start=0, end=1), "exit_times"),
])
def test_measure_little_rejects_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        sim.measure_little(**kwargs)


def test_running_little_rejects_bad_times():
    with pytest.raises(ValueError, match="times"):
        sim.running_little([0.0], [1.0], [0.0], start=0.0)
    with pytest.raises(ValueError, match="times"):
        sim.running_little([0.0], [1.0], [], start=0.0)
