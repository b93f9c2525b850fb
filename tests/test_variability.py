"""Unit and property tests for servingcap.variability (samplers, penalty, planning helpers)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servingcap import MG1, MM1, UnstableQueueError
from servingcap import variability as v

N = 400_000  # draws per sampler check


def _moments_tolerance(dist, x):
    """Sampling-error bounds for the sample mean and C_v of ``x`` drawn from ``dist``.

    The sample mean has standard error sd / sqrt(n) = cv * mean / sqrt(n): allow 5 of
    them. The sample C_v's error is dominated by the sample second moment, whose standard
    error is sd(X**2) / sqrt(n); that is estimated from the sample itself (heavy tails
    make it large, which is why the bound is data-driven), and propagated through
    cv = sqrt(E[X**2] / mean**2 - 1): d cv ~ d E[X**2] / (2 cv mean**2). Allow 5 of those
    plus 1e-9 for the exact constant case.
    """
    n = x.size
    se_mean = dist.cv * dist.mean / math.sqrt(n)
    se_m2 = float(np.std(x**2)) / math.sqrt(n)
    se_cv = se_m2 / (2 * max(dist.cv, 1e-9) * dist.mean**2) + 2 * dist.cv * se_mean / dist.mean
    return 5 * se_mean + 1e-9, 5 * se_cv + 1e-9


@pytest.mark.parametrize("dist", [
    v.Lognormal(2.0, 0.0), v.Lognormal(2.0, 0.5), v.Lognormal(2.0, 1.0), v.Lognormal(2.0, 2.0),
    v.Gamma(0.5, 0.5), v.Gamma(0.5, 1.0), v.Gamma(0.5, 2.0),
    v.Bimodal(1.0, 1.0), v.Bimodal(1.0, 2.0), v.Bimodal(3.0, 1.5, long_fraction=0.1, mode_cv=0.0),
], ids=repr)
def test_samplers_hit_mean_and_cv(dist):
    x = dist.sample(N, np.random.default_rng(11))
    tol_mean, tol_cv = _moments_tolerance(dist, x)
    assert abs(x.mean() - dist.mean) <= tol_mean
    assert abs(v.coefficient_of_variation(x) - dist.cv) <= tol_cv if dist.cv else x.std() == 0
    assert (x >= 0).all()


def test_samplers_are_seeded():
    a = v.Lognormal(1.0, 2.0).sample(100, 5)
    b = v.Lognormal(1.0, 2.0).sample(100, np.random.default_rng(5))
    assert np.array_equal(a, b)


def test_bimodal_modes_reproduce_moments():
    b = v.Bimodal(1.0, 2.0, long_fraction=0.05, mode_cv=0.25)
    p = b.long_fraction
    mean = (1 - p) * b.short_mean + p * b.long_mean
    m2 = (1 + b.mode_cv**2) * ((1 - p) * b.short_mean**2 + p * b.long_mean**2)
    assert mean == pytest.approx(1.0)
    assert m2 == pytest.approx(b.second_moment)
    assert b.short_mean < 1 < b.long_mean


def test_capped_lognormal_mean_40_cap_512_cv_2():
    c = v.CappedLognormal(40, 2.0, 512)
    m1, m2, tail = v._capped_lognormal_moments(math.log(c.median), c.sigma, 512)
    assert m1 == pytest.approx(40, rel=1e-8)
    assert math.sqrt(m2 - m1 * m1) / m1 == pytest.approx(2.0, rel=1e-8)
    assert 0 < c.fraction_at_cap == tail < 0.05
    x = c.sample(N, 3)
    assert x.max() == 512
    tol_mean, tol_cv = _moments_tolerance(c, x)
    assert abs(x.mean() - 40) <= tol_mean
    assert abs(v.coefficient_of_variation(x) - 2.0) <= tol_cv


def test_capped_lognormal_rejects_impossible_cv():
    assert v.max_cv_under_cap(40, 512) == pytest.approx(math.sqrt(512 / 40 - 1))
    with pytest.raises(ValueError, match="cv must be <"):
        v.CappedLognormal(40, 3.5, 512)
    with pytest.raises(ValueError, match="mean must be < cap"):
        v.CappedLognormal(600, 1.0, 512)


def test_empirical_bootstrap_and_cap():
    values = np.array([1.0, 2.0, 3.0, 10.0])
    e = v.Empirical(values)
    assert e.mean == pytest.approx(4.0)
    assert e.cv == pytest.approx(values.std() / 4.0)
    assert set(e.sample(1000, 1)) <= set(values)
    assert e.capped(3).values.tolist() == [1, 2, 3, 3]
    assert e.scaled(0.03).mean == pytest.approx(0.12)
    assert e.below(2).values.tolist() == [1, 2]
    assert e.above(2).values.tolist() == [3, 10]
    assert "Empirical(n=4" in repr(e)


def test_variance_penalty_worked_numbers():
    assert v.variance_penalty(1.0) == 1.0
    assert v.variance_penalty(0.0) == 0.5
    assert v.variance_penalty(2.0) == 2.5
    assert v.mean_residual_service(1.0, 1.0) == 1.0
    # C_v = 2 multiplies the waiting component of every M/M/1 row by 2.5
    for rho in (0.5, 0.7, 0.8, 0.9, 0.95, 0.99):
        assert MG1(rho, 1.0, 2.0).mean_wait == pytest.approx(2.5 * MM1(rho, 1.0).mean_wait)


def test_equal_wait_utilization_worked_number():
    rho = v.utilization_for_equal_wait(0.8, 2.0)
    assert rho == pytest.approx(8 / 13)            # r = 4, k = 2.5: 4 / 6.5
    assert round(rho, 3) == 0.615
    assert MG1(rho, 1.0, 2.0).mean_wait == pytest.approx(MM1(0.8, 1.0).mean_wait)
    assert v.utilization_for_equal_wait(0.8, 1.0) == pytest.approx(0.8)
    assert v.utilization_for_equal_wait(0.8, 0.0) == pytest.approx(4 / 4.5)


@settings(max_examples=60, deadline=None)
@given(rho_ref=st.floats(0.01, 0.99), cv=st.floats(0, 5), cv_ref=st.floats(0, 5))
def test_equal_wait_round_trip(rho_ref, cv, cv_ref):
    rho = v.utilization_for_equal_wait(rho_ref, cv, reference_cv=cv_ref)
    assert 0 < rho < 1
    assert MG1(rho, 1.0, cv).mean_wait == pytest.approx(MG1(rho_ref, 1.0, cv_ref).mean_wait)
    if v.variance_penalty(cv) > v.variance_penalty(cv_ref):   # more variable: run cooler
        assert rho < rho_ref


@settings(max_examples=60, deadline=None)
@given(rho=st.floats(0.05, 1.5), cv=st.floats(0, 4), target=st.floats(0.01, 50),
       s=st.floats(0.01, 10))
def test_speedup_round_trip_one_server(rho, cv, target, s):
    lam = rho / s
    x = v.speedup_for_wait(lam, s, cv, target * s)
    assert x > rho
    assert MG1(lam, s / x, cv).mean_wait == pytest.approx(target * s, rel=1e-9)


def test_speedup_many_servers_and_mgc():
    assert v.mgc_mean_wait(0.8, 1.0, 2.0) == pytest.approx(MG1(0.8, 1.0, 2.0).mean_wait)
    x = v.speedup_for_wait(1.8, 1.0, 2.0, 1.0, servers=2)
    assert v.mgc_mean_wait(1.8, 1.0 / x, 2.0, 2) == pytest.approx(1.0, rel=1e-8)
    assert v.speedup_for_wait(0.8, 1.0, 1.0, MM1(0.8, 1.0).mean_wait) == pytest.approx(1.0)


def test_max_arrival_rate_for_wait_inverts_wait():
    lam = v.max_arrival_rate_for_wait(9.0, 2.0, 36.0)
    assert lam * 9.0 == pytest.approx(8 / 13)      # the equal-wait utilization again
    assert MG1(lam, 9.0, 2.0).mean_wait == pytest.approx(36.0)
    lam32 = v.max_arrival_rate_for_wait(9.0, 1.0, 0.75, servers=32)
    assert v.mgc_mean_wait(lam32, 9.0, 1.0, 32) == pytest.approx(0.75, rel=1e-8)
    assert lam32 < 32 / 9.0
    assert v.max_arrival_rate_for_wait(9.0, 2.0, 0.75, servers=32) < lam32
    with pytest.raises(ValueError, match="target_wait"):
        v.max_arrival_rate_for_wait(9.0, 1.0, -1.0)


def test_batch_means_iid_matches_naive_se():
    x = np.random.default_rng(2).normal(5.0, 2.0, 200_000)
    mean, se = v.batch_means(x, 20)
    assert mean == pytest.approx(x[:200_000].mean())
    assert se == pytest.approx(2.0 / math.sqrt(x.size), rel=0.5)


def test_simulate_fcfs_shapes_and_warmup():
    w, s = v.simulate_fcfs(0.5, v.Gamma(1.0, 1.0), 1000, 1, warmup=100)
    assert w.shape == s.shape == (1000,)
    assert (w >= 0).all()
    w2, _ = v.simulate_fcfs(1.0, v.Gamma(0.5, 1.0), 1000, 1, servers=2)
    assert w2.shape == (1000,)


@pytest.mark.parametrize("call, name", [
    (lambda: v.Lognormal(-1, 1), "mean"),
    (lambda: v.Gamma(1, float("nan")), "cv"),
    (lambda: v.Bimodal(1, 0.1, mode_cv=0.25), "cv"),
    (lambda: v.Bimodal(1, 2, long_fraction=0.5), "long_fraction"),
    (lambda: v.Bimodal(1, 2, long_fraction=1.0), "long_fraction"),
    (lambda: v.Empirical([1.0]), "values"),
    (lambda: v.Empirical([0.0, 0.0]), "values"),
    (lambda: v.coefficient_of_variation([1.0, -1.0]), "samples"),
    (lambda: v.variance_penalty(-0.1), "service_cv"),
    (lambda: v.cap_lengths([1, 2], 0), "cap"),
    (lambda: v.max_cv_under_cap(10, 5), "mean"),
    (lambda: v.utilization_for_equal_wait(-0.1, 1), "reference_utilization"),
    (lambda: v.speedup_for_wait(1, 1, 1, 0), "target_wait"),
    (lambda: v.batch_means([1.0] * 10, 20), "values"),
    (lambda: v.batch_means([1.0] * 100, 1), "batches"),
    (lambda: v.simulate_fcfs(0, v.Gamma(1, 1), 10, 1), "arrival_rate"),
    (lambda: v.service_distribution("pareto", 1, 1), "kind"),
    (lambda: v.Lognormal(1, 1).quantile(1.0), "p"),
])
def test_bad_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_unstable_inputs_raise_unstable_queue_error():
    with pytest.raises(UnstableQueueError, match="rho"):
        v.utilization_for_equal_wait(1.0, 2.0)
    with pytest.raises(UnstableQueueError):
        v.mgc_mean_wait(2.0, 1.0, 1.0, servers=2)


def test_service_distribution_factory():
    assert isinstance(v.service_distribution("lognormal", 1, 2), v.Lognormal)
    assert v.service_distribution("bimodal", 1, 2, long_fraction=0.1).long_fraction == 0.1
    assert v.Lognormal(1, 2).quantile(0.5) == pytest.approx(v.Lognormal(1, 2).median)
