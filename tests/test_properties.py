"""Property-based tests (hypothesis) for the closed forms and the FCFS simulator."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from servingcap.queues import MM1, MMc, erlang_b, erlang_c, little, sqrt_staffing
from servingcap.sim import fcfs_waits

# No deadline: the suite runs on a shared 2-core machine where timings are noisy.
PROPS = settings(max_examples=150, deadline=None)

rates = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
times = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
rhos = st.floats(min_value=1e-3, max_value=0.999, allow_nan=False)
levels = st.floats(min_value=1e-6, max_value=1 - 1e-6, allow_nan=False)
loads = st.floats(min_value=0.01, max_value=2000.0, allow_nan=False)


# --------------------------------------------------------------------------- Little


@PROPS
@given(lam=rates, w=times)
def test_little_round_trips(lam, w):
    L = little(arrival_rate=lam, time_in_system=w)
    assert L == pytest.approx(lam * w, rel=1e-12)
    assert little(L=L, arrival_rate=lam) == pytest.approx(w, rel=1e-12)
    assert little(L=L, time_in_system=w) == pytest.approx(lam, rel=1e-12)


# --------------------------------------------------------------------------- M/M/1


@PROPS
@given(mu=rates, r1=rhos, r2=rhos, p=levels)
def test_mm1_latency_increases_with_utilization(mu, r1, r2, p):
    assume(r1 < r2 and r2 - r1 > 1e-9)
    lo, hi = MM1(r1 * mu, mu), MM1(r2 * mu, mu)
    assert lo.mean_response < hi.mean_response
    assert lo.mean_wait < hi.mean_wait
    assert lo.response_quantile(p) < hi.response_quantile(p)
    assert lo.wait_quantile(p) <= hi.wait_quantile(p)


@PROPS
@given(mu=rates, rho=rhos, p=levels)
def test_mm1_response_quantile_inverts_cdf(mu, rho, p):
    q = MM1(rho * mu, mu)
    t = q.response_quantile(p)
    assert t > 0
    assert float(q.response_cdf(t)) == pytest.approx(p, rel=1e-9, abs=1e-12)


def _check_wait_quantile(q, p, p_zero):
    """Quantile of a law with an atom P(wait = 0) = p_zero and exponential tail."""
    t = q.wait_quantile(p)
    if p <= p_zero:
        # Inside the atom: the smallest t with CDF >= p is 0, and CDF(0) covers p.
        assert t == 0.0
        assert float(q.wait_cdf(0.0)) >= p - 1e-12
    else:
        assert t > 0
        assert float(q.wait_cdf(t)) == pytest.approx(p, rel=1e-9, abs=1e-12)
        # ... and it is the smallest such t: just below it the CDF is below p.
        assert float(q.wait_cdf(t * (1 - 1e-6))) < p
    assert float(q.wait_cdf(0.0)) == pytest.approx(p_zero, rel=1e-12)


@PROPS
@given(mu=rates, rho=rhos, p=levels)
def test_mm1_wait_quantile_inverts_cdf(mu, rho, p):
    q = MM1(rho * mu, mu)
    _check_wait_quantile(q, p, 1 - q.utilization)


@PROPS
@given(mu=rates, rho=rhos, c=st.integers(1, 400), p=levels)
def test_mmc_wait_quantile_inverts_cdf(mu, rho, c, p):
    q = MMc(rho * c * mu, mu, c)
    _check_wait_quantile(q, p, 1 - q.prob_wait)


# --------------------------------------------------------------------------- Erlang


@PROPS
@given(a=loads, extra=st.integers(0, 50), step=st.integers(1, 20))
def test_erlang_c_is_a_probability_non_increasing_in_servers(a, extra, step):
    c = math.floor(a) + 1 + extra
    assume(c > a * (1 + 1e-9))
    now, more = erlang_c(c, a), erlang_c(c + step, a)
    assert 0.0 <= now <= 1.0 and 0.0 <= more <= 1.0
    assert more <= now * (1 + 1e-12)


@PROPS
@given(a=loads, extra=st.integers(0, 200))
def test_erlang_b_at_most_erlang_c(a, extra):
    c = math.floor(a) + 1 + extra
    assume(c > a * (1 + 1e-9))
    b = erlang_b(c, a)
    assert 0.0 < b <= 1.0 or b == 0.0
    assert b <= erlang_c(c, a) * (1 + 1e-12)


@PROPS
@given(a=st.floats(min_value=0.01, max_value=600.0), c=st.integers(1, 300))
def test_erlang_b_non_increasing_in_servers(a, c):
    assert erlang_b(c + 1, a) <= erlang_b(c, a) * (1 + 1e-12)


# --------------------------------------------------------------------------- staffing


@PROPS
@given(a=st.floats(min_value=1e-3, max_value=1e6), b1=st.floats(0, 10), b2=st.floats(0, 10))
def test_sqrt_staffing_stable_and_monotone(a, b1, b2):
    lo, hi = sorted((b1, b2))
    c_lo, c_hi = sqrt_staffing(a, lo), sqrt_staffing(a, hi)
    assert isinstance(c_lo, int)
    assert c_lo > a and c_hi > a
    assert c_lo <= c_hi
    target = a + lo * math.sqrt(a)
    # Covers the target (up to the documented 1e-9 relative round-off allowance) ...
    assert c_lo >= target * (1 - 1e-9)
    # ... and is the smallest whole number that does (or the smallest stable one).
    assert c_lo - 1 < target or c_lo == math.floor(a) + 1


# --------------------------------------------------------------------------- fcfs_waits


@st.composite
def queue_inputs(draw, max_n=60):
    n = draw(st.integers(1, max_n))
    gaps = draw(st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n))
    service = draw(st.lists(st.floats(0.0, 8.0), min_size=n, max_size=n))
    start = draw(st.floats(0.0, 100.0))
    return start + np.cumsum(gaps), np.array(service)


@PROPS
@given(data=queue_inputs(), c=st.integers(1, 6))
def test_fcfs_waits_non_negative_and_shaped(data, c):
    a, s = data
    w = fcfs_waits(a, s, servers=c)
    assert w.shape == a.shape
    assert np.all(np.isfinite(w)) and np.all(w >= 0)


@PROPS
@given(data=queue_inputs())
def test_fcfs_one_server_starts_in_arrival_order_after_previous_finish(data):
    a, s = data
    w = fcfs_waits(a, s)
    start = a + w
    tol = 1e-9 * (1 + a.max() + s.sum())
    assert np.all(np.diff(start) >= -tol)                     # FIFO start order
    assert np.all(start[1:] >= start[:-1] + s[:-1] - tol)     # never two in service
    # Work-conserving: a request waits only if the previous one is still in service.
    prev_done = np.concatenate([[-np.inf], start[:-1] + s[:-1]])
    waited = w > tol
    assert np.allclose(start[waited], prev_done[waited], atol=tol)


@PROPS
@given(data=queue_inputs(), c=st.integers(2, 6))
def test_fcfs_many_servers_never_exceeds_capacity(data, c):
    a, s = data
    w = fcfs_waits(a, s, servers=c)
    start, done = a + w, a + w + s
    tol = 1e-9 * (1 + a.max() + s.sum())
    assert np.all(np.diff(start) >= -tol)                     # FIFO start order
    for i in range(a.size):
        busy = np.sum((start[:i] <= start[i] + tol) & (done[:i] > start[i] + tol))
        assert busy < c
        if w[i] > tol:  # it waited, so all c servers were busy until it started
            assert np.sum((start[:i] < start[i] - tol) & (done[:i] >= start[i] - tol)) >= c


@PROPS
@given(data=queue_inputs(), c=st.integers(1, 6), shift=st.floats(0.0, 1e4))
def test_fcfs_waits_shift_invariant(data, c, shift):
    a, s = data
    base = fcfs_waits(a, s, servers=c)
    moved = fcfs_waits(a + shift, s, servers=c)
    np.testing.assert_allclose(moved, base, rtol=0, atol=1e-9 * (1 + shift + a.max() + s.sum()))


def test_fcfs_waits_shift_invariant_for_negative_times_many_servers():
    a, s = np.array([-5.0, -4.0, -3.5]), np.array([1.0, 1.0, 1.0])
    np.testing.assert_allclose(fcfs_waits(a, s, servers=2), fcfs_waits(a + 10, s, servers=2))


def test_fcfs_waits_negative_times_one_server():
    a, s = np.array([-5.0, -4.5, -3.5]), np.array([1.0, 1.0, 1.0])
    np.testing.assert_allclose(fcfs_waits(a, s), [0.0, 0.5, 0.5])


def _outspaced(service, slack):
    s = np.array(service)
    # Each arrival comes after the previous request's service would have ended.
    gaps = s[:-1] + np.array(slack[: s.size - 1])
    return np.concatenate([[0.0], np.cumsum(gaps)]), s


outspaced = dict(service=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=60),
                 slack=st.lists(st.floats(1e-3, 5.0), min_size=60, max_size=60))


@PROPS
@given(**outspaced, c=st.integers(2, 6))
def test_fcfs_no_waits_when_arrivals_outspace_services_many_servers(service, slack, c):
    a, s = _outspaced(service, slack)
    np.testing.assert_array_equal(fcfs_waits(a, s, servers=c), np.zeros(s.size))


@PROPS
@given(**outspaced)
def test_fcfs_no_waits_when_arrivals_outspace_services_one_server(service, slack):
    a, s = _outspaced(service, slack)
    # The one-server path works with cumulative sums, so when the slack between an
    # arrival and the previous departure is itself at round-off level the comparison can
    # go either way by a few ulps of the clock (~1e-16 x elapsed time). A request that
    # finds the server idle by more than that waits exactly zero (tested below).
    w = fcfs_waits(a, s)
    assert np.all(w <= 8 * np.finfo(float).eps * (1 + a[-1] + s.sum()))


def test_fcfs_one_server_idle_arrival_waits_exactly_zero():
    a, s = _outspaced([0.0, 0.0, 0.9520017625841961, 0.05, 0.0], [1.0, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(fcfs_waits(a, s, servers=1), np.zeros(5))
