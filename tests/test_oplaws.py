"""Operational laws and mean value analysis (servingcap.oplaws)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servingcap import MM1, oplaws


def test_utilization_law_and_bottleneck():
    assert oplaws.utilization_law(1.5, 0.5) == pytest.approx(0.75)
    assert oplaws.throughput_bound(0.53) == pytest.approx(1 / 0.53)
    assert oplaws.throughput_bound([0.2, 0.5, 0.1]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="exceeds the bound"):
        oplaws.utilization_law(2.5, 0.5)


def test_closed_loop_law_round_trip():
    x = oplaws.closed_loop_throughput(32, 9.0, think_time=7.0)
    assert x == pytest.approx(2.0)
    assert oplaws.response_time_law(32, x, think_time=7.0) == pytest.approx(9.0)
    with pytest.raises(ValueError, match="throughput"):
        oplaws.response_time_law(10, 3.0, think_time=5.0)   # 10 clients cannot do 3/s


def test_locked_replica_bounds():
    # the book's locked replica: a lone request takes 9.22 s; the GPU does
    # 0.25 + 299 x 0.03 / 32 s of work per request
    demand = 0.25 + 299 * 0.030 / 32
    x, r = oplaws.closed_loop_bounds(64, 9.22, demand)
    assert x == pytest.approx(1 / demand) and 1 / demand == pytest.approx(1.8857, abs=1e-4)
    assert r == pytest.approx(64 * demand)
    x1, r1 = oplaws.closed_loop_bounds(1, 9.22, demand)
    assert (x1, r1) == (pytest.approx(1 / 9.22), 9.22)


def machine_repairman_throughput(n, d, z):
    """Closed form of one exponential server with n exponential thinkers (M/M/1//n)."""
    terms = [math.factorial(n) / math.factorial(n - k) * (d / z) ** k for k in range(n + 1)]
    return (1 - 1 / sum(terms)) / d


@pytest.mark.parametrize("n, d, z", [(1, 0.5, 5.0), (8, 0.53, 10.0), (40, 0.2, 3.0)])
def test_mva_matches_the_machine_repairman_closed_form(n, d, z):
    loop = oplaws.mva(n, d, z)
    assert loop.throughput[-1] == pytest.approx(machine_repairman_throughput(n, d, z), rel=1e-9)
    # response-time law holds at every N, and the asymptotic bounds hold
    assert np.allclose(loop.users / loop.throughput - z, loop.response_time)
    for i, users in enumerate(loop.users):
        x_max, r_min = oplaws.closed_loop_bounds(users, d, d, z)
        assert loop.throughput[i] <= x_max * (1 + 1e-12)
        assert loop.response_time[i] >= r_min * (1 - 1e-12)


def test_mva_without_think_time_saturates_immediately():
    loop = oplaws.mva(5, 0.5)
    assert np.allclose(loop.throughput, 2.0) and np.allclose(loop.response_time, 0.5 * loop.users)
    assert np.allclose(loop.utilization, 1.0)


@given(st.integers(1, 60), st.floats(0.01, 5.0), st.floats(0.0, 50.0))
def test_closed_loop_never_waits_longer_than_open_loop_at_the_same_rate(n, d, z):
    # the closed loop throttles itself: at equal throughput an open (Poisson) M/M/1
    # stream waits at least as long (coordinated omission hides exactly this gap)
    loop = oplaws.mva(n, d, z)
    x = float(loop.throughput[-1])
    if x * d < 1 - 1e-9:
        assert loop.response_time[-1] <= MM1(x, 1 / d).mean_response * (1 + 1e-9)


@pytest.mark.parametrize("call, name", [
    (lambda: oplaws.utilization_law(-1.0, 0.5), "throughput"),
    (lambda: oplaws.utilization_law(1.0, 0.0), "demand"),
    (lambda: oplaws.throughput_bound([0.0, 0.0]), "demand"),
    (lambda: oplaws.throughput_bound([0.1, float("nan")]), "demand"),
    (lambda: oplaws.closed_loop_throughput(0, 1.0), "users"),
    (lambda: oplaws.closed_loop_throughput(2, -1.0), "response_time"),
    (lambda: oplaws.closed_loop_throughput(2, 0.0, 0.0), "response_time"),
    (lambda: oplaws.closed_loop_bounds(2, 0.0, 0.5), "lone_response"),
    (lambda: oplaws.mva(0, 0.5), "users"),
    (lambda: oplaws.mva(3, 0.5, -1.0), "think_time"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()
