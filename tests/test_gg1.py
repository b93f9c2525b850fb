"""Kingman's G/G/1 approximation (servingcap.queues.GG1): identities, validation, and a
check against the vectorized FCFS simulator.

How the tolerance is set. Waits in one queue are strongly autocorrelated, so the
standard error of a simulated mean comes from batch means (20 contiguous batches of
90,000 customers, long against the queue's relaxation time at rho = 0.9, which is a few
hundred service times). With Poisson arrivals Kingman *is* Pollaczek–Khinchine, so the
only error is sampling: we allow 4 standard errors (a false alarm about once in 16,000
runs, and the seed is fixed). With non-Poisson arrivals Kingman is an approximation,
exact only as rho -> 1; at rho = 0.9 its error for these gamma gaps and services was
measured at -2.9 %, +1.3 % and +0.8 % (2,000,000 customers each, one seed), so we allow
4 standard errors of sampling plus 6 % of the simulated mean for the approximation, and
check that the test could fail by also asserting that the M/M/1 mean (which ignores the
variability) misses by far more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from servingcap import MG1, MM1, UnstableQueueError
from servingcap.queues import GG1
from servingcap.sim import fcfs_waits
from servingcap.variability import batch_means

N = 2_000_000
WARMUP = N // 10


def simulated_mean_wait(rho, ca2, cs2, seed):
    """Batch-means mean wait (s) and its standard error for gamma gaps (mean 1 s) and
    gamma services (mean rho s) with the given squared CVs."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(1 / ca2, ca2, N)
    services = rng.gamma(1 / cs2, cs2 * rho, N)
    waits = fcfs_waits(np.cumsum(gaps), services)[WARMUP:]
    return batch_means(waits, 20)


def test_poisson_arrivals_give_pollaczek_khinchine():
    for rho, cv in [(0.3, 0.0), (0.8, 0.5), (0.95, 2.0)]:
        assert GG1(rho, 1.0, 1.0, cv).mean_wait == pytest.approx(MG1(rho, 1.0, cv).mean_wait)
    assert GG1(0.9, 1.0, 1.0, 1.0).mean_response == pytest.approx(MM1(0.9, 1.0).mean_response)


def test_formula_and_littles_law():
    q = GG1(arrival_rate=2.0, mean_service=0.4, arrival_cv=2.0, service_cv=0.5)
    assert q.utilization == pytest.approx(0.8)
    assert q.variability_factor == pytest.approx((4 + 0.25) / 2)
    assert q.mean_wait == pytest.approx(0.8 / 0.2 * 2.125 * 0.4)
    assert q.mean_queue_length == pytest.approx(2.0 * q.mean_wait)
    # clockwork arrivals and fixed service never wait
    assert GG1(1.0, 0.9, 0.0, 0.0).mean_wait == 0.0


def test_simulation_matches_kingman_with_poisson_arrivals():
    mean, se = simulated_mean_wait(0.9, 1.0, 0.5, seed=11)
    assert abs(GG1(1.0, 0.9, 1.0, math.sqrt(0.5)).mean_wait - mean) <= 4 * se


@pytest.mark.parametrize("ca2, cs2, seed", [(2.0, 0.5, 12), (0.5, 0.5, 13), (4.0, 1.0, 14)])
def test_simulation_matches_kingman_with_general_arrivals(ca2, cs2, seed):
    mean, se = simulated_mean_wait(0.9, ca2, cs2, seed)
    kingman = GG1(1.0, 0.9, math.sqrt(ca2), math.sqrt(cs2)).mean_wait
    assert abs(kingman - mean) <= 4 * se + 0.06 * mean
    # the variability matters: the M/M/1 mean is far outside that band
    assert abs(MM1(1.0, 1 / 0.9).mean_wait - mean) > 4 * se + 0.06 * mean


def test_from_samples_measures_rate_and_cvs():
    rng = np.random.default_rng(5)
    gaps = rng.gamma(0.5, 2.0, 200_000)           # mean 1 s, C_a^2 = 2
    services = rng.gamma(2.0, 0.25, gaps.size)    # mean 0.5 s, C_s^2 = 0.5
    q = GG1.from_samples(np.cumsum(gaps), services)
    assert q.arrival_rate == pytest.approx(1.0, rel=0.01)
    assert q.mean_service == pytest.approx(0.5, rel=0.01)
    assert q.arrival_cv**2 == pytest.approx(2.0, rel=0.03)
    assert q.service_cv**2 == pytest.approx(0.5, rel=0.03)


@pytest.mark.parametrize("kwargs, name", [
    (dict(arrival_rate=-1.0, mean_service=1.0, arrival_cv=1.0, service_cv=1.0), "arrival_rate"),
    (dict(arrival_rate=0.5, mean_service=0.0, arrival_cv=1.0, service_cv=1.0), "mean_service"),
    (dict(arrival_rate=0.5, mean_service=1.0, arrival_cv=float("nan"), service_cv=1.0),
     "arrival_cv"),
    (dict(arrival_rate=0.5, mean_service=1.0, arrival_cv=1.0, service_cv=-0.1), "service_cv"),
])
def test_bad_input_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GG1(**kwargs)


def test_unstable_queue_says_so():
    with pytest.raises(UnstableQueueError, match="rho = 1"):
        GG1(1.0, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="at least 3"):
        GG1.from_samples([0.0, 1.0], [0.5, 0.5])
