"""servingcap.knee: marginal cost, the knee, max utilization for a tail target, headroom."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servingcap import MG1, MM1, UnstableQueueError
from servingcap.knee import (
    find_knee,
    headroom_gain,
    marginal_cost,
    max_utilization_for_quantile,
    mm1_knee,
)

# ----------------------------------------------------------------- marginal cost


def test_marginal_cost_values():
    # S / (1 - rho)^2 at the chapter's utilizations, S = 1 s
    assert marginal_cost(0.5) == pytest.approx(4.0)
    assert marginal_cost(0.9) == pytest.approx(100.0)
    assert marginal_cost(0.95, mean_service=2.0) == pytest.approx(800.0)


def test_marginal_cost_is_derivative_of_mean_response():
    for rho in (0.3, 0.8, 0.97):
        h = 1e-6
        slope = (MM1(rho + h, 1.0).mean_response - MM1(rho - h, 1.0).mean_response) / (2 * h)
        assert marginal_cost(rho) == pytest.approx(slope, rel=1e-5)


def test_marginal_cost_vectorized_and_scalar_types():
    out = marginal_cost([0.0, 0.5, 0.9])
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [1.0, 4.0, 100.0])
    assert isinstance(marginal_cost(0.5), float)


@pytest.mark.parametrize("rho", [1.0, 1.2, [0.5, 1.0]])
def test_marginal_cost_unstable(rho):
    with pytest.raises(UnstableQueueError, match="rho"):
        marginal_cost(rho)


@pytest.mark.parametrize("rho", [-0.1, float("nan"), "x"])
def test_marginal_cost_bad_rho(rho):
    with pytest.raises(ValueError, match="rho"):
        marginal_cost(rho)


def test_marginal_cost_bad_service():
    with pytest.raises(ValueError, match="mean_service"):
        marginal_cost(0.5, mean_service=0)


# ----------------------------------------------------------------- knee


def test_mm1_knee_defaults_and_round_numbers():
    assert mm1_knee() == pytest.approx(0.90)
    assert mm1_knee(cost_per_point=0.25) == pytest.approx(0.80)
    assert mm1_knee(cost_per_point=4.0) == pytest.approx(0.95)


def test_mm1_knee_satisfies_definition():
    for c in (0.1, 1.0, 7.0):
        rho = mm1_knee(cost_per_point=c)
        assert 0.01 * marginal_cost(rho) == pytest.approx(c)


@pytest.mark.parametrize("kwargs,name", [
    ({"cost_per_point": 0}, "cost_per_point"),
    ({"cost_per_point": 0.005}, "cost_per_point"),
    ({"point": 0}, "point"),
    ({"point": 1.5}, "point"),
])
def test_mm1_knee_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=name):
        mm1_knee(**kwargs)


def test_find_knee_matches_closed_form_on_mm1_curve():
    rho = np.linspace(0.0, 0.99, 991)
    w = 1.0 / (1.0 - rho)
    for c in (0.25, 1.0, 4.0):
        assert find_knee(rho, w, 1.0, cost_per_point=c) == pytest.approx(mm1_knee(c), abs=2e-3)


def test_find_knee_scale_free():
    rho = np.linspace(0.0, 0.99, 991)
    s = 0.25
    assert find_knee(rho, s / (1 - rho), s) == pytest.approx(find_knee(rho, 1 / (1 - rho), 1.0))


def test_find_knee_moves_left_with_service_variance():
    rho = np.linspace(0.01, 0.99, 981)
    knees = []
    for cv in (0.0, 1.0, 2.0):
        w = np.array([MG1(r, 1.0, cv).mean_response for r in rho])
        knees.append(find_knee(rho, w, 1.0))
    assert knees[1] == pytest.approx(0.90, abs=2e-3)          # M/G/1 with C_v = 1 is M/M/1
    assert knees[2] < knees[1] < knees[0]


def test_find_knee_errors():
    rho = np.linspace(0.0, 0.5, 51)
    with pytest.raises(ValueError, match="mean_response never"):
        find_knee(rho, 1 / (1 - rho), 1.0)
    with pytest.raises(ValueError, match="increasing"):
        find_knee([0.1, 0.3, 0.2], [1, 2, 3], 1.0)
    with pytest.raises(ValueError, match="same length"):
        find_knee([0.1, 0.2, 0.3], [1, 2], 1.0)
    with pytest.raises(ValueError, match="at least 3"):
        find_knee([0.1, 0.2], [1, 2], 1.0)
    with pytest.raises(UnstableQueueError):
        find_knee([0.5, 0.9, 1.0], [2, 10, 20], 1.0)
    with pytest.raises(ValueError, match="mean_service"):
        find_knee(rho, 1 / (1 - rho), -1.0)
    with pytest.raises(ValueError, match="mean_response must be > 0"):
        find_knee([0.1, 0.2, 0.3], [1, 0, 3], 1.0)


# ----------------------------------------------------------------- max utilization


def test_max_utilization_chapter_numbers():
    ln100 = math.log(100)
    assert max_utilization_for_quantile(10.0) == pytest.approx(1 - ln100 / 10)
    assert max_utilization_for_quantile(20.0) == pytest.approx(0.76974, abs=1e-5)
    assert max_utilization_for_quantile(50.0) == pytest.approx(0.90790, abs=1e-5)


@given(rho=st.floats(0.01, 0.995), p=st.floats(0.5, 0.9999), s=st.floats(1e-3, 1e3))
def test_max_utilization_inverts_mm1_quantile(rho, p, s):
    target = MM1(rho / s, 1.0 / s).response_quantile(p)
    assert max_utilization_for_quantile(target, p=p, mean_service=s) == pytest.approx(rho, rel=1e-9)


def test_max_utilization_unreachable_target():
    # the zero-load p99 of an exponential 0.25 s service is ln(100) * 0.25 = 1.15 s
    with pytest.raises(ValueError, match="target"):
        max_utilization_for_quantile(1.0, p=0.99, mean_service=0.25)


@pytest.mark.parametrize("kwargs,name", [
    ({"target": 0}, "target"),
    ({"target": float("inf")}, "target"),
    ({"target": 10, "p": 1.0}, "p"),
    ({"target": 10, "mean_service": 0}, "mean_service"),
])
def test_max_utilization_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=name):
        max_utilization_for_quantile(**kwargs)


# ----------------------------------------------------------------- headroom


def test_headroom_gain_values():
    ln100 = math.log(100)
    assert headroom_gain(0.95) == pytest.approx(ln100 / 0.05 - ln100 / 0.06)
    np.testing.assert_allclose(headroom_gain([0.8, 0.9]),
                               [ln100 / 0.2 - ln100 / 0.21, ln100 / 0.1 - ln100 / 0.11])


def test_headroom_gain_grows_toward_saturation():
    gains = headroom_gain(np.array([0.5, 0.8, 0.9, 0.95, 0.99]))
    assert (np.diff(gains) > 0).all()


def test_headroom_gain_bad_inputs():
    with pytest.raises(UnstableQueueError):
        headroom_gain(1.0)
    with pytest.raises(ValueError, match="rho"):
        headroom_gain(0.005)
    with pytest.raises(ValueError, match="p"):
        headroom_gain(0.9, p=0)
