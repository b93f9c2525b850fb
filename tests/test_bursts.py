"""Burst, backlog and burstiness arithmetic in servingcap.traffic (chapter "Offered load")."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servingcap import UnstableQueueError, sim
from servingcap import traffic as T

# The seed example: minutes 00-04 at 35 req/s, minute 05 at 180, 06-14 at 55, 15 at 160.
SEED_RATES = [35.0, 180.0, 55.0, 160.0]
SEED_DURATIONS = [300.0, 60.0, 540.0, 60.0]
CAPACITY = 100.0


def _hour_profile():
    rest = T.balancing_rate(60.0, SEED_RATES, SEED_DURATIONS, 3600.0)
    return SEED_RATES + [rest], SEED_DURATIONS + [3600.0 - sum(SEED_DURATIONS)]


# --- seed numbers -------------------------------------------------------------------------

def test_seed_burst_backlog_is_4800_requests():
    assert T.burst_backlog(180, CAPACITY, 60) == pytest.approx(4800.0)


def test_seed_drain_time_is_106_7_seconds():
    assert T.drain_time(4800, 55, CAPACITY) == pytest.approx(106.666666, rel=1e-6)
    assert round(T.drain_time(4800, 55, CAPACITY), 1) == 106.7


def test_seed_remaining_44_minutes_rate():
    # 60 req/s for 3600 s = 216,000 requests; the 16 shown minutes carry 60,600,
    # so the remaining 2,640 s need 155,400 requests: 58.86 req/s.
    rest = T.balancing_rate(60.0, SEED_RATES, SEED_DURATIONS, 3600.0)
    assert rest == pytest.approx(155_400 / 2_640)
    rates, durations = _hour_profile()
    assert np.dot(rates, durations) / 3600.0 == pytest.approx(60.0)


def test_burst_below_capacity_adds_nothing():
    assert T.burst_backlog(55, CAPACITY, 60) == 0.0
    assert T.drain_time(0, 150, CAPACITY) == 0.0


def test_fluid_backlog_seed_profile():
    rates, durations = _hour_profile()
    t = np.array([0.0, 300.0, 330.0, 360.0, 360.0 + 4800 / 45, 900.0, 960.0, 3600.0])
    q = T.fluid_backlog(rates, durations, CAPACITY, t)
    expected = [0, 0, 2400, 4800, 0, 0, 3600, 0]
    np.testing.assert_allclose(q, expected, atol=1e-6)
    # the second burst drains against the remaining 44 minutes' rate
    end2 = 960.0 + T.drain_time(3600, rates[-1], CAPACITY)
    assert T.fluid_backlog(rates, durations, CAPACITY, [end2 - 1.0])[0] > 0
    assert T.fluid_backlog(rates, durations, CAPACITY, [end2])[0] == pytest.approx(0, abs=1e-6)


def test_fluid_backlog_initial_backlog_and_unsorted_times():
    q = T.fluid_backlog([50.0], [100.0], 100.0, [10.0, 0.0, 4.0], initial_backlog=300.0)
    np.testing.assert_allclose(q, [0.0, 300.0, 100.0])


def test_fluid_backlog_matches_simulation():
    """Poisson arrivals from the hour profile through a deterministic 100 req/s server.

    Tolerance from sampling error: with deterministic service, the simulated backlog
    differs from the fluid one by the Poisson count noise accumulated since the busy
    period began. At the burst's end (t = 360 s) that is the noise of the 180 x 60 =
    10,800 burst arrivals, sd = sqrt(10,800) = 104 requests; we allow 5 sd. The drain end
    moves by that count noise over the 45 req/s spare capacity plus the noise of the
    55 req/s arrivals during the drain: sd = sqrt(10,800 + 55 x 106.7) / 45 = 2.9 s;
    we allow 5 sd.
    """
    rates, durations = _hour_profile()
    arrivals = T.piecewise_poisson(rates, durations, np.random.default_rng(20261129))
    waits = sim.fcfs_waits(arrivals, np.full(arrivals.size, 1.0 / CAPACITY))
    starts = arrivals + waits
    grid = np.arange(0.0, 1200.0, 0.5)
    waiting = (np.searchsorted(arrivals, grid, side="right")
               - np.searchsorted(starts, grid, side="right"))
    sd_peak = math.sqrt(180 * 60)
    at_peak = waiting[grid == 360.0][0]
    assert abs(at_peak - 4800) < 5 * sd_peak
    fluid = T.fluid_backlog(rates, durations, CAPACITY, grid)
    sd_drain = math.sqrt(180 * 60 + 55 * 4800 / 45)
    assert np.max(np.abs(waiting - fluid)[grid < 600]) < 5 * sd_drain
    # the drain ends when the queue first empties after the burst (later blips of an
    # M/D/1 queue at 55 % load are not the burst's backlog)
    drained = grid[(grid > 360) & (waiting == 0)].min()
    assert abs(drained - (360 + 4800 / 45)) < 5 * sd_drain / 45


def test_piecewise_poisson_counts():
    rng = np.random.default_rng(7)
    a = T.piecewise_poisson([10.0, 0.0, 50.0], [100.0, 50.0, 100.0], rng)
    assert np.all(np.diff(a) >= 0)
    assert not np.any((a >= 100) & (a < 150))
    # counts are Poisson(1000) and Poisson(5000): allow 5 sd
    assert abs(np.sum(a < 100) - 1000) < 5 * math.sqrt(1000)
    assert abs(np.sum(a >= 150) - 5000) < 5 * math.sqrt(5000)


# --- burstiness ---------------------------------------------------------------------------

def test_window_counts_only_complete_windows():
    a = np.array([0.0, 0.5, 1.2, 1.9, 2.1, 3.7])
    np.testing.assert_array_equal(T.window_counts(a, 1.0), [2, 2, 1])
    np.testing.assert_array_equal(T.window_counts(a, 2.0), [4])
    frame = pd.DataFrame({"arrival_s": a})
    np.testing.assert_array_equal(T.window_counts(frame, 1.0), [2, 2, 1])


def test_index_of_dispersion_poisson_is_one():
    """A seeded Poisson stream of 10^6 arrivals at 10 req/s in 1 s windows.

    For k windows of Poisson counts the variance-to-mean ratio has sampling sd about
    sqrt(2 / (k - 1)); here k = 100,000 windows, sd = 0.0045, and we allow 5 sd.
    """
    a = sim.poisson_arrivals(10.0, 1_000_000, np.random.default_rng(20261129))
    k = T.window_counts(a, 1.0).size
    tol = 5 * math.sqrt(2 / (k - 1))
    assert abs(T.index_of_dispersion(a, 1.0) - 1.0) < tol
    assert T.mean_rate(a) == pytest.approx(10.0, rel=0.01)


def test_index_of_dispersion_clumped_stream_is_large():
    # every arrival comes in a clump of 10 simultaneous requests
    base = sim.poisson_arrivals(1.0, 20_000, np.random.default_rng(3))
    clumped = np.repeat(base, 10)
    assert T.index_of_dispersion(clumped, 1.0) > 8.0


def test_peak_to_mean_and_window_utilization():
    a = np.array([0.1, 0.2, 0.3, 0.4, 1.5, 2.5, 3.5, 4.0])
    assert T.peak_to_mean(a, 1.0) == pytest.approx(4 / 1.75)
    np.testing.assert_allclose(T.window_utilization(a, 1.0, 2.0), [2.0, 0.5, 0.5, 0.5])


def test_mean_rate_ignores_clock_start():
    a = np.array([10.0, 11.0, 12.0, 14.0])
    assert T.mean_rate(a) == pytest.approx(3 / 4)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 100.0), min_size=2, max_size=60).filter(lambda g: sum(g) > 1e-3),
    start=st.floats(0.0, 1e4),
    target=st.floats(0.01, 1e4),
)
def test_rescale_to_rate_keeps_relative_gaps(gaps, start, target):
    a = start + np.concatenate([[0.0], np.cumsum(gaps)])
    frame = pd.DataFrame({"arrival_s": a, "prompt_tokens": np.arange(a.size)})
    out = T.rescale_to_rate(frame, target)
    b = out["arrival_s"].to_numpy()
    # times are stored as absolute floats, so each gap carries round-off of about
    # eps * |time|; compare the rate and the relative gaps to that precision
    span = min(np.ptp(a), np.ptp(b))
    tol = 8 * np.finfo(float).eps * max(abs(a).max(), abs(b).max()) / span + 1e-12
    assert T.mean_rate(b) == pytest.approx(target, rel=tol)
    np.testing.assert_allclose(np.diff(b) / np.diff(b).sum(), np.diff(a) / np.diff(a).sum(),
                               rtol=1e-9, atol=tol)
    assert b[0] == a[0]
    np.testing.assert_array_equal(out["prompt_tokens"], frame["prompt_tokens"])
    assert frame["arrival_s"].to_numpy()[1] == a[1]          # the input is not modified


def test_poisson_like_keeps_requests_and_rate():
    a = np.sort(np.random.default_rng(1).uniform(0, 1000, 50_000))
    frame = pd.DataFrame({"arrival_s": a, "output_tokens": np.arange(a.size)})
    out = T.poisson_like(frame, 20261129)
    assert len(out) == len(frame)
    np.testing.assert_array_equal(out["output_tokens"], frame["output_tokens"])
    # mean rate of n - 1 exponential gaps: relative sd 1/sqrt(n - 1) = 0.45 %; allow 5 sd
    assert T.mean_rate(out) == pytest.approx(T.mean_rate(frame), rel=5 / math.sqrt(a.size - 1))
    np.testing.assert_array_equal(T.poisson_like(a, 5), T.poisson_like(a, 5))


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("call, name, value", [
    (lambda: T.burst_backlog(-1, 100, 60), "arrival_rate", "-1"),
    (lambda: T.burst_backlog(180, 0, 60), "capacity", "0"),
    (lambda: T.burst_backlog(180, 100, float("nan")), "duration_s", "nan"),
    (lambda: T.drain_time(-5, 55, 100), "backlog", "-5"),
    (lambda: T.balancing_rate(60, [35], [300], -1), "total_s", "-1"),
    (lambda: T.balancing_rate(1, [180], [60], 120), "mean_rate", "1"),
    (lambda: T.fluid_backlog([1, -2], [1, 1], 100, [0]), "rates", "-2"),
    (lambda: T.fluid_backlog([1], [1], 100, [-3]), "times_s", "-3"),
    (lambda: T.window_counts([0, 1, 2], 0), "window_s", "0"),
    (lambda: T.window_counts([0, 1, 2], 10), "window_s", "10"),
    (lambda: T.index_of_dispersion([0, 1, 2], 1.5), "window_s", "1.5"),
    (lambda: T.window_utilization([0, 1, 2], 1, -4), "capacity", "-4"),
    (lambda: T.mean_rate([3.0]), "arrival_s", "1"),
    (lambda: T.mean_rate([2.0, 2.0]), "arrival_s", "2.0"),
    (lambda: T.rescale_to_rate(np.array([0.0, 1.0]), 0), "target_rate", "0"),
    (lambda: T.piecewise_poisson([1, 2], [1], 0), "durations_s", "1"),
])
def test_bad_input_names_parameter_and_value(call, name, value):
    with pytest.raises(ValueError) as info:
        call()
    assert name in str(info.value) and value in str(info.value)


def test_drain_time_without_spare_capacity_is_unstable():
    with pytest.raises(UnstableQueueError, match=r"arrival_rate = 120.*capacity = 100.*rho = 1.2"):
        T.drain_time(4800, 120, 100)
    with pytest.raises(ValueError, match="arrival_rate = 100"):
        T.drain_time(1, 100, 100)
