"""servingcap.sim: hand-worked cases, cross-checks against two independent simulators
(plain Python loops and Ciw), and simulation-vs-closed-form checks with error bars.
"""

import math

import ciw
import numpy as np
import pytest
from servingcap.queues import MG1, MM1, MMc
from servingcap.sim import fcfs_waits, mmc_sample, poisson_arrivals, time_average_in_system

# --------------------------------------------------------------------------- references


def lindley_loop(a, s):
    """One server: W_1 = 0, W_{n+1} = max(0, W_n + S_n - (A_{n+1} - A_n))."""
    w = [0.0] * len(a)
    for n in range(1, len(a)):
        w[n] = max(0.0, w[n - 1] + s[n - 1] - (a[n] - a[n - 1]))
    return np.array(w)


def free_list_loop(a, s, c):
    """c servers, one FCFS queue: an explicit list of the time each server frees up."""
    free = [-math.inf] * c
    w = []
    for arrive, serve in zip(a, s, strict=True):
        k = min(range(c), key=free.__getitem__)
        start = max(arrive, free[k])
        w.append(start - arrive)
        free[k] = start + serve
    return np.array(w)


def ciw_waits(interarrivals, services, c):
    """Per-customer waits from Ciw fed the same deterministic sequences."""
    n = len(interarrivals)
    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Sequential(list(map(float, interarrivals)))],
        service_distributions=[ciw.dists.Sequential(list(map(float, services)))],
        number_of_servers=[c],
    )
    q = ciw.Simulation(network)
    # Run long enough for the first n customers to finish; the Sequential arrivals
    # cycle afterwards, but later customers cannot change earlier ones' FCFS waits.
    q.simulate_until_max_time(float(np.sum(interarrivals) + np.sum(services) + 1.0))
    records = {r.id_number: r for r in q.get_all_records()}
    got = [records[i] for i in range(1, n + 1)]  # Ciw numbers customers in arrival order
    # Ciw records service_time as end - start on its clock: round-off ~1e-16 x clock.
    np.testing.assert_allclose([r.service_time for r in got], services, rtol=0, atol=1e-9)
    return (np.array([r.arrival_date for r in got]),
            np.array([r.waiting_time for r in got]))


def random_inputs(rng, n, c, rho, service="exp"):
    inter = rng.exponential(1.0 / (rho * c), n)
    if service == "exp":
        s = rng.exponential(1.0, n)
    else:  # lognormal with C_v ~ 2: heavy-ish tail, many short jobs
        s = rng.lognormal(-0.8, 1.27, n)
    return inter, s


# --------------------------------------------------------------------------- hand-worked


def test_hand_worked_one_server():
    # Arrive at 0, 1, 2, each needing 3 s: starts at 0, 3, 6 -> waits 0, 2, 4.
    np.testing.assert_allclose(fcfs_waits([0, 1, 2], [3, 3, 3]), [0, 2, 4])


def test_hand_worked_two_servers():
    # Two servers: 0 and 1 start at once; the third starts when the first frees at 3.
    np.testing.assert_allclose(fcfs_waits([0, 1, 2], [3, 3, 3], servers=2), [0, 0, 1])


def test_hand_worked_ties_and_zero_service():
    a, s = [0, 0, 0, 5, 5], [2, 0, 1, 1, 1]
    np.testing.assert_allclose(fcfs_waits(a, s), [0, 2, 2, 0, 1])
    np.testing.assert_allclose(fcfs_waits(a, s, servers=2), [0, 0, 0, 0, 0])


def test_more_servers_than_requests_never_wait():
    np.testing.assert_array_equal(fcfs_waits([0, 0, 0], [5, 5, 5], servers=3), [0, 0, 0])


def test_empty_input():
    assert fcfs_waits([], []).shape == (0,)
    assert fcfs_waits([], [], servers=4).shape == (0,)


@pytest.mark.parametrize("args, kwargs, fragment", [
    (([0, 1], [1]), {}, "same length"),
    (([0, 2, 1], [1, 1, 1]), {}, "non-decreasing"),
    (([0, 1], [1, -1]), {}, "service_times must be >= 0"),
    (([0, float("nan")], [1, 1]), {}, "arrival_times must be finite"),
    (([0, 1], [1, float("inf")]), {}, "service_times must be finite"),
    (([0, 1], [1, 1]), {"servers": 0}, "servers"),
    (([0, 1], [1, 1]), {"servers": 1.5}, "servers"),
    (([[0, 1]], [[1, 1]]), {}, "1-D"),
])
def test_fcfs_waits_bad_input(args, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        fcfs_waits(*args, **kwargs)


# --------------------------------------------------------------------------- cross-checks


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("c", [1, 2, 3, 8, 32])
@pytest.mark.parametrize("service", ["exp", "lognormal"])
def test_matches_plain_python_loops(seed, c, service):
    rng = np.random.default_rng(1000 * seed + c)
    inter, s = random_inputs(rng, 3000, c, rho=rng.uniform(0.5, 1.05), service=service)
    a = np.cumsum(inter)
    reference = lindley_loop(a, s) if c == 1 else free_list_loop(a, s, c)
    got = fcfs_waits(a, s, servers=c)
    # Both are exact algorithms; only float round-off (~1e-16 x clock) may differ.
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-9 * (a[-1] + s.sum()))
    if c == 1:  # the free-list loop with one server is Lindley too
        np.testing.assert_allclose(free_list_loop(a, s, 1), reference, rtol=0, atol=1e-9 * a[-1])


@pytest.mark.parametrize("c", [1, 2, 4])
def test_matches_loops_with_ties_and_zero_services(c):
    # Coarse clock: many simultaneous arrivals and zero-length services.
    rng = np.random.default_rng(7 + c)
    a = np.cumsum(rng.integers(0, 3, 2000)).astype(float)
    s = rng.integers(0, 4, 2000).astype(float) * c
    reference = lindley_loop(a, s) if c == 1 else free_list_loop(a, s, c)
    np.testing.assert_array_equal(fcfs_waits(a, s, servers=c), reference)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("c", [1, 2, 8])
def test_matches_ciw_per_customer(seed, c):
    rng = np.random.default_rng(50 + 10 * seed + c)
    inter, s = random_inputs(rng, 400, c, rho=0.9, service="exp" if seed % 2 else "lognormal")
    ciw_arrivals, ciw_w = ciw_waits(inter, s, c)
    a = np.cumsum(inter)
    np.testing.assert_allclose(ciw_arrivals, a, rtol=1e-12)
    got = fcfs_waits(a, s, servers=c)
    assert (ciw_w > 0).sum() > 50  # the comparison exercises real queueing
    np.testing.assert_allclose(got, ciw_w, rtol=0, atol=1e-9)


# --------------------------------------------------------------------------- vs formula
#
# Waits in one queue are strongly autocorrelated, so the iid standard error s/sqrt(n)
# of one long run is far too small. We use independent replications instead: R runs from
# independent streams, each discarding a warm-up (the queue starts empty), and the
# standard error of the grand mean is sd(replication means) / sqrt(R).
#
# M/M/1, rho = 0.8, mu = 1: W = 1/(1-0.8) = 5 s. The asymptotic variance constant of the
# mean response time is rho(2 + 5 rho - 4 rho^2 + rho^3) / (mu^2 (1-rho)^4)
# = 0.8 x 3.952 / 0.0016 ~ 1976 s^2, i.e. ~2,000x the iid value. With R = 40 runs of
# 100,000 customers, SE ~ sqrt(1976 / 4e6) ~ 0.022 s (0.44 % of W). We assert
# |mean - W| < 4.5 SE (false alarm probability ~1e-5 with a t_39 reference) and that
# SE < 1 % of W, so the test rejects any formula more than ~4.5 % off: the M/M/1 mean
# at rho = 0.78 or 0.82 (4.55 s, 5.56 s) would fail. For p99 = ln(100) W = 23.03 s the
# replication SE comes out ~0.25 s (1.1 %; a sample quantile of correlated data is
# noisier than the mean); we require SE < 2 % of the target, so the band is < 9 % wide.

Z = 4.5


def replicate(fn, reps, seed):
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(reps)]
    return np.array([fn(rng) for rng in rngs])


def mean_and_se(values):
    values = np.asarray(values, dtype=float)
    return values.mean(axis=0), values.std(axis=0, ddof=1) / math.sqrt(len(values))


def test_mm1_mean_response_and_p99():
    q = MM1(0.8, 1.0)
    warm, n = 2_000, 100_000

    def run(rng):
        _, s, w = mmc_sample(0.8, 1.0, warm + n, rng)
        resp = (w + s)[warm:]
        return resp.mean(), np.quantile(resp, 0.99), np.quantile(w[warm:], 0.99)

    (mean, p99, wait_p99), (se_mean, se_p99, se_wait) = mean_and_se(replicate(run, 40, 2024))
    assert se_mean < 0.01 * q.mean_response
    assert se_p99 < 0.02 * q.response_quantile(0.99)
    assert se_wait < 0.02 * q.wait_quantile(0.99)
    assert abs(mean - q.mean_response) < Z * se_mean
    assert abs(p99 - q.response_quantile(0.99)) < Z * se_p99
    assert abs(wait_p99 - q.wait_quantile(0.99)) < Z * se_wait
    # Power: a 10 %-wrong closed form sits far outside the band.
    for wrong in (0.9 * q.mean_response, 1.1 * q.mean_response):
        assert abs(mean - wrong) > Z * se_mean


# M/M/8 at rho = 0.85 (a = 6.8 Erlangs): C(8, 6.8) = 0.5726, W_q = C / (8 - 6.8) = 0.477 s.
# Per run of 100,000 customers the replication sd is ~0.011 for P(wait) and ~0.03 s for
# W_q, so with R = 20 the SEs are ~0.0024 (0.4 %) and ~0.007 s (1.4 %). We require
# SE < 1 % and < 3 % of the targets respectively, and agreement within 4.5 SE.


def test_mmc_prob_wait_and_mean_wait():
    q = MMc(6.8, 1.0, 8)
    warm, n = 1_000, 100_000

    def run(rng):
        _, _, w = mmc_sample(6.8, 1.0, warm + n, rng, servers=8)
        w = w[warm:]
        return (w > 0).mean(), w.mean()

    (p_wait, mean_wait), (se_p, se_w) = mean_and_se(replicate(run, 20, 8085))
    assert se_p < 0.01 * q.prob_wait and se_w < 0.03 * q.mean_wait
    assert abs(p_wait - q.prob_wait) < Z * se_p
    assert abs(mean_wait - q.mean_wait) < Z * se_w
    # Power: Erlang C is far from both the M/M/1-style guess rho and the Erlang B value.
    assert abs(p_wait - q.utilization) > Z * se_p


# M/D/1 at rho = 0.8 (S = 1 s, C_v = 0): Pollaczek-Khinchine W_q = 0.8 x 0.5 / 0.2 = 2 s,
# half the M/M/1 value. Deterministic service makes waits less correlated: the
# replication SE with R = 20 runs of 100,000 is ~0.01 s (0.5 %).


def test_md1_mean_wait_is_half_of_mm1():
    q = MG1(0.8, 1.0, 0.0)
    warm, n = 2_000, 100_000

    def run(rng):
        a = poisson_arrivals(0.8, warm + n, rng)
        return fcfs_waits(a, np.ones(a.size))[warm:].mean()

    mean_wait, se = mean_and_se(replicate(run, 20, 4242))
    assert se < 0.02 * q.mean_wait
    assert abs(mean_wait - q.mean_wait) < Z * se
    assert abs(mean_wait - MM1(0.8, 1.0).mean_wait) > Z * se


# One server at rho = 0.3: P(wait > 0) = rho = 0.3. Replication SE with R = 10 runs of
# 100,000 is ~0.0005.


def test_mm1_prob_wait_from_exact_zero_waits():
    def run(rng):
        _, _, w = mmc_sample(0.3, 1.0, 101_000, rng)
        return (w[1_000:] > 0).mean()

    p_wait, se = mean_and_se(replicate(run, 10, 303))
    assert se < 0.005
    assert abs(p_wait - 0.3) < Z * se


# --------------------------------------------------------------------------- helpers


def test_poisson_arrivals_rate_and_shape():
    a = poisson_arrivals(5.0, 200_000, 1)
    assert a.shape == (200_000,) and np.all(np.diff(a) >= 0) and a[0] > 0
    gaps = np.diff(np.concatenate([[0.0], a]))
    # iid exponential gaps: mean 0.2 s, SE = 0.2 / sqrt(2e5) = 4.5e-4 s.
    assert abs(gaps.mean() - 0.2) < Z * 0.2 / math.sqrt(gaps.size)
    # exponential: sd equals the mean (SE of the sd ~ 0.2 / sqrt(2e5) too, x ~1.1).
    assert abs(gaps.std() - 0.2) < Z * 1.2 * 0.2 / math.sqrt(gaps.size)
    assert poisson_arrivals(5.0, 0, 1).shape == (0,)


def test_poisson_arrivals_seeded():
    np.testing.assert_array_equal(poisson_arrivals(2.0, 10, 42), poisson_arrivals(2.0, 10, 42))
    with pytest.raises(ValueError, match="arrival_rate"):
        poisson_arrivals(-2.0, 10, 42)
    with pytest.raises(ValueError, match="n must be"):
        poisson_arrivals(2.0, -1, 42)


def test_mmc_sample_consistent_with_fcfs_waits():
    a, s, w = mmc_sample(2.0, 1.0, 500, np.random.default_rng(3), servers=3)
    assert a.shape == s.shape == w.shape == (500,)
    np.testing.assert_array_equal(w, fcfs_waits(a, s, servers=3))
    with pytest.raises(ValueError, match="service_rate"):
        mmc_sample(2.0, 0.0, 10, 1)


def test_time_average_in_system_hand_worked():
    # Items inside [0,4), [1,2), [2,6) over the window [0, 4]: integral 4 + 1 + 2 = 7.
    assert time_average_in_system([0, 1, 2], [4, 2, 6], 0, 4) == pytest.approx(7 / 4)
    # Default window: first to last entry [0, 2]: integral 2 + 1 + 0 = 3.
    assert time_average_in_system([0, 1, 2], [4, 2, 6]) == pytest.approx(3 / 2)


@pytest.mark.parametrize("entry, exit_, kwargs, fragment", [
    ([0, 1], [1], {}, "same length"),
    ([], [], {}, "empty"),
    ([0, 1], [1, 0.5], {}, "exit_times must be >= entry_times"),
    ([0, 1], [1, 2], {"start": 3, "end": 1}, "end must be after start"),
])
def test_time_average_in_system_bad_input(entry, exit_, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        time_average_in_system(entry, exit_, **kwargs)


def test_littles_law_on_a_simulated_mm1():
    # L (time-average count, measured directly) = lambda x W (mean response), within SE.
    q = MM1(0.7, 1.0)

    def run(rng):
        a, s, w = mmc_sample(0.7, 1.0, 60_000, rng)
        return time_average_in_system(a, a + w + s, a[2_000], a[-1])

    L, se = mean_and_se(replicate(run, 20, 77))
    assert se < 0.02 * q.mean_in_system
    assert abs(L - q.mean_in_system) < Z * se


# --------------------------------------------------------------------------- robustness


def test_more_servers_than_requests_is_exact_and_allocates_nothing():
    rng = np.random.default_rng(3)
    a, s = np.cumsum(rng.exponential(1.0, 50)), rng.exponential(5.0, 50)
    np.testing.assert_array_equal(fcfs_waits(a, s, servers=10**9), np.zeros(50))
    np.testing.assert_array_equal(fcfs_waits(a, s, servers=50), fcfs_waits(a, s, servers=10**9))
    assert fcfs_waits(a, s, servers=49)[-1] >= 0


@pytest.mark.parametrize("servers", [1, 3])
def test_overflowing_times_are_an_error_not_inf(servers):
    from servingcap._check import NumericOverflowError
    with pytest.raises(NumericOverflowError, match="service_times"):
        fcfs_waits([0.0, 1.0, 2.0], [1e308, 1e308, 1e308], servers=servers)
    with pytest.raises(NumericOverflowError, match="arrival_times"):
        fcfs_waits([-1.7e308, 1.7e308], [1.0, 1.0], servers=servers)
    # Large but representable values still work.
    assert fcfs_waits([0.0, 1e300], [1e300, 1.0], servers=servers).tolist() == [0.0, 0.0]
