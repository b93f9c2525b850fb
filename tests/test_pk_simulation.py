"""Pollaczek–Khinchine against seeded M/G/1 simulation, for several C_v.

How the tolerance is set. Consecutive waits in a queue are strongly autocorrelated, so
the standard error of a mean wait cannot be s / sqrt(n). We run R independent
replications (each starts empty, discards a warm-up of many relaxation times, then keeps
n customers); the R replication means are independent, so their standard error is
sd(means) / sqrt(R). The check is |mean - P-K| <= 4 standard errors (a two-sided miss
probability near 1e-4 for a correct formula) plus the bias the empty start leaves
(bounded well below 1 % of the mean by the warm-up). We also require the standard error
to be small (< 8 % of the P-K value), so that the test would fail for a formula off by
the factors at stake here (e.g. forgetting the (1 + C_v**2) / 2 penalty).
Heavy tails (C_v = 2) make the wait's variance grow with E[S**3], so those cases use
the lighter-tailed gamma at moderate load, plus one lognormal case with more customers.
Whole file: a few seconds.
"""

import math

import numpy as np
import pytest
from servingcap import MG1, MM1
from servingcap import variability as v

SEED = 20261129


def replicate(rho, dist, reps=10, n=200_000, warmup=20_000, seed=SEED):
    """Mean wait (units of S = 1 s) and its standard error over independent replications."""
    rng = np.random.default_rng(seed)
    means = [v.simulate_fcfs(rho, dist, n, rng, warmup=warmup)[0].mean() for _ in range(reps)]
    return float(np.mean(means)), float(np.std(means, ddof=1) / math.sqrt(reps))


@pytest.mark.parametrize("cv, rho, dist", [
    (0.0, 0.8, v.Gamma(1.0, 0.0)),          # M/D/1: half the M/M/1 wait
    (0.5, 0.8, v.Gamma(1.0, 0.5)),
    (1.0, 0.8, v.Gamma(1.0, 1.0)),          # M/M/1
    (2.0, 0.7, v.Gamma(1.0, 2.0)),
    (2.0, 0.7, v.Bimodal(1.0, 2.0)),
    (2.0, 0.6, v.Lognormal(1.0, 2.0)),
])
def test_pk_matches_simulation(cv, rho, dist):
    pk = MG1(rho, 1.0, cv).mean_wait
    mean, se = replicate(rho, dist)
    assert se < 0.08 * pk, f"simulation too noisy to test: se={se:.4f} s vs P-K {pk:.4f} s"
    assert abs(mean - pk) <= 4 * se + 0.01 * pk, (
        f"C_v={cv}, rho={rho}: simulated {mean:.4f} +/- {se:.4f} s, P-K {pk:.4f} s")


def test_simulation_distinguishes_penalty():
    """The simulated C_v = 2 wait is far from the M/M/1 wait: the penalty is real."""
    mean, se = replicate(0.7, v.Gamma(1.0, 2.0))
    mm1 = MM1(0.7, 1.0).mean_wait
    assert mean - mm1 > 10 * se
    assert mean / mm1 == pytest.approx(2.5, rel=0.1)


def test_equal_wait_utilization_by_simulation():
    """C_v = 2 at rho = 0.615 waits as long as M/M/1 at 0.8 (4 S), in simulation too."""
    rho = v.utilization_for_equal_wait(0.8, 2.0)
    assert rho == pytest.approx(0.6154, abs=1e-4)
    mean, se = replicate(rho, v.Gamma(1.0, 2.0))
    target = MM1(0.8, 1.0).mean_wait
    assert target == pytest.approx(4.0)
    assert abs(mean - target) <= 4 * se + 0.01 * target


def test_batch_means_agrees_with_replications():
    """Batch means on one long run gives a standard error of the same size as replications."""
    w, _ = v.simulate_fcfs(0.8, v.Gamma(1.0, 1.0), 2_000_000, SEED, warmup=20_000)
    mean, se = v.batch_means(w, 20)
    assert abs(mean - 4.0) <= 4 * se
    _, se_rep = replicate(0.8, v.Gamma(1.0, 1.0))
    assert 0.3 < se / se_rep < 3.0
