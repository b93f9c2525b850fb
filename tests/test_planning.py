"""Capacity search, goodput curves and fleet search (servingcap.planning)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, optimize
from servingcap.params import LOCKED
from servingcap.planning import (
    CURVE_COLUMNS,
    CapacityResult,
    capacity_search,
    curve_knee,
    evaluate,
    fluid_rate,
    goodput_curve,
    hold_time,
    plan,
    smallest_fleet,
)
from servingcap.queues import MMc
from servingcap.serving import Replica


def _mmc_workload(n, mean_tokens, seed):
    """Poisson arrivals (rate 1/s, rescaled later) and exponential prompts, 1-token answers."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0, n))
    prompts = np.ceil(rng.exponential(mean_tokens, n)).astype(int)   # >= 1 token
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": prompts, "output_tokens": 1})


def _mmc_response_cdf(lam, mu, c, t):
    """P(wait + service <= t) in M/M/c: the wait CDF convolved with the Exp(mu) service."""
    queue = MMc(lam, mu, c)
    return integrate.quad(lambda s: float(queue.wait_cdf(t - s)) * mu * math.exp(-mu * s),
                          0.0, t)[0]


def test_capacity_search_finds_the_mmc_limit():
    # One slot per replica and one-token answers: a request's TTFT is its queue wait plus
    # its own prefill (prompt / prefill_rate). Exponential prompts make the service
    # exponential, and the pooled router is one FCFS queue in front of c servers: M/M/c.
    c, mean_tokens, limit, target = 3, 1000, 4.0, 0.95
    mean_tokens_exact = 1.0 / (1.0 - math.exp(-1.0 / mean_tokens))   # E[ceil(Exp(m))]
    mu = mean_tokens / mean_tokens_exact            # prefill_rate = mean_tokens tokens/s
    exact = optimize.brentq(lambda lam: _mmc_response_cdf(lam, mu, c, limit) - target,
                            0.01, c * mu * (1 - 1e-9))
    assert exact == pytest.approx(1.989, abs=0.001)      # rho = 0.66

    requests = _mmc_workload(12_000, mean_tokens, seed=3)
    found = capacity_search(requests, Replica(prefill_rate=mean_tokens, max_batch=1),
                            replicas=c, router="pooled", limits={"ttft_s": limit},
                            target=target, rtol=0.01)
    # Tolerance. The answer is the rate where a *sampled* attainment (12,000 correlated
    # requests) crosses 0.95. Near it attainment falls 0.19 per unit of log-rate (slope
    # of the exact CDF above), so an attainment error of 0.004 (binomial sd 0.002,
    # doubled by the queue's autocorrelation) moves the rate by about 2 %. Over 20 seeds
    # we measured a relative sd of 2.2 % for this set-up. Allow 4 sd (9 %) for sampling,
    # plus rtol (the search returns the feasible end of a 1 % bracket): 10 %.
    assert found.rate == pytest.approx(exact, rel=0.10)
    # The test has power: under random routing each replica is its own M/M/1 queue at
    # lam / c, whose response time is Exp(mu - lam / c), so the same SLO holds only up to
    # c * (mu - ln(1 / (1 - target)) / limit) = 0.75 req/s, far outside the band.
    random_routing = c * (mu - math.log(1 / (1 - target)) / limit)
    assert abs(random_routing / exact - 1) > 0.5
    assert found.attainment >= target
    assert found.upper > found.rate
    assert (found.upper - found.rate) <= 0.01 * found.upper + 1e-12
    table = found.evaluations
    assert list(table.columns) == list(CURVE_COLUMNS)
    assert (table.loc[table.meets, "attainment"] >= target).all()
    assert (table.loc[~table.meets, "attainment"] < target).all()
    assert "req/s" in str(found)


def _small_workload(n=400, seed=0, output=40):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1.0, n)),
                         "prompt_tokens": 1000, "output_tokens": output})


SMALL = Replica(prefill_rate=8000, decode_step_s=0.02, max_batch=8)
LIMITS = {"ttft_s": 1.0, "tpot_s": 0.05}


def test_capacity_search_with_a_given_bracket_agrees_with_the_automatic_one():
    requests = _small_workload()
    auto = capacity_search(requests, SMALL, limits=LIMITS, target=0.9, rtol=0.02)
    given = capacity_search(requests, SMALL, limits=LIMITS, target=0.9, rtol=0.02,
                            lo=auto.rate * 0.5, hi=auto.upper * 1.5)
    # both brackets hold the same crossing of the same monotone replay
    assert given.rate == pytest.approx(auto.rate, rel=0.05)
    assert isinstance(auto, CapacityResult)
    # the answer meets, and evaluate() at the answer reproduces its attainment
    again = evaluate(requests, SMALL, auto.rate, limits=LIMITS, target=0.9)
    assert again["attainment"] == pytest.approx(auto.attainment)
    assert again["meets"]


def test_capacity_search_rejects_a_bad_bracket():
    requests = _small_workload()
    auto = capacity_search(requests, SMALL, limits=LIMITS, target=0.9)
    with pytest.raises(ValueError, match="lo must be a rate that meets"):
        capacity_search(requests, SMALL, limits=LIMITS, target=0.9, lo=auto.upper * 2)
    with pytest.raises(ValueError, match="hi must be a rate that misses"):
        capacity_search(requests, SMALL, limits=LIMITS, target=0.9, hi=auto.rate / 2)


def test_capacity_search_returns_zero_when_no_rate_meets():
    # a 1000-token prompt takes 0.125 s to prefill: a 0.1 s TTFT limit is never met
    found = capacity_search(_small_workload(n=50), SMALL, limits={"ttft_s": 0.1})
    assert found.rate == 0.0
    assert "no rate meets" in str(found)


def test_goodput_curve_shape_and_knee():
    requests = _small_workload()
    cap = fluid_rate(requests, SMALL)
    rates = cap * np.array([0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.8])
    curve = goodput_curve(requests, SMALL, rates, limits=LIMITS, target=0.9)
    assert list(curve.columns) == list(CURVE_COLUMNS)
    assert np.allclose(curve.rate_rps, rates)
    # goodput <= TTFT goodput <= throughput, and nothing is delivered faster than offered
    assert (curve.goodput_rps <= curve.ttft_goodput_rps + 1e-9).all()
    assert (curve.ttft_goodput_rps <= curve.throughput_rps + 1e-9).all()
    assert (curve.throughput_rps <= curve.rate_rps * 1.15).all()
    # light load: everything meets, goodput tracks the offered rate
    assert curve.attainment.iloc[0] == 1.0
    assert curve.goodput_rps.iloc[0] == pytest.approx(curve.throughput_rps.iloc[0])
    # throughput saturates near the fluid capacity; attainment collapses past it
    assert curve.throughput_rps.iloc[-1] <= cap * 1.05
    assert curve.attainment.iloc[-1] < 0.5
    assert curve.attainment.is_monotonic_decreasing
    assert (np.diff(curve.ttft_p99_s) >= -1e-9).all()
    knee = curve_knee(curve, target=0.9)
    assert rates[0] <= knee.slo_rate <= rates[-1]
    assert knee.peak_rate in set(rates)
    assert knee.peak_goodput == curve.goodput_rps.max()
    # the knee read off the curve brackets what capacity_search finds
    found = capacity_search(requests, SMALL, limits=LIMITS, target=0.9)
    below = rates[rates <= found.rate].max()
    above = rates[rates > found.rate].min()
    assert below <= knee.slo_rate <= above
    assert "req/s" in str(knee)
    # a grid that never crosses the target puts the knee beyond it
    assert curve_knee(curve.iloc[:1], target=0.9).slo_rate is None


def test_hold_time_and_fluid_rate_use_the_cost_model():
    requests = _small_workload()
    locked = Replica()
    frame = requests.assign(prompt_tokens=LOCKED.prompt_tokens,
                            output_tokens=LOCKED.output_tokens)
    assert hold_time(frame, locked) == pytest.approx(LOCKED.hold_s)       # 9.25 s
    per_request = LOCKED.prefill_s + (LOCKED.output_tokens - 1) * LOCKED.decode_step_s / 32
    assert fluid_rate(frame, locked, replicas=3) == pytest.approx(3 / per_request)


def test_smallest_fleet_is_the_smallest_and_plan_builds_on_it():
    requests = _small_workload(n=600)
    rate = 2.5 * fluid_rate(requests, SMALL)
    fleet = smallest_fleet(requests, SMALL, rate, limits=LIMITS, target=0.9, start=1)
    n = fleet.replicas
    assert fleet.row(n)["meets"]
    assert n > 1 and not fleet.row(n - 1)["meets"]
    result = plan(requests, SMALL, rate, limits=LIMITS, target=0.9, spares=1)
    assert result.fleet.replicas == n            # same answer from the closed-form start
    assert result.replicas == n + 1
    assert result.capacity.rate >= rate
    assert result.capacity.replicas == n
    assert result.headroom == pytest.approx(result.capacity.rate / rate - 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"target": 0.0}, "target must be in"),
    ({"target": 1.5}, "target must be in"),
    ({"rtol": 0.0}, "rtol must be > 0"),
    ({"rtol": 1.0}, "rtol must be in"),
    ({"replicas": 0}, "replicas must be a whole number"),
    ({"router": "fastest"}, "router must be one of"),
    ({"policy": "lifo"}, "policy must be one of"),
    ({"limits": 1.0}, "limits must be a mapping"),
    ({"limits": {"ttft_s": -1}}, r"limits\['ttft_s'\] must be > 0"),
    ({"lo": -1.0}, "lo must be > 0"),
    ({"hi": float("nan")}, "hi must be finite"),
    ({"lo": 2.0, "hi": 1.0}, "lo must be < hi"),
    ({"seed": 1.5}, "seed must be an int"),
])
def test_capacity_search_validates_its_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        capacity_search(_small_workload(n=20), SMALL, **kwargs)


def test_inputs_that_are_not_workloads_are_rejected():
    with pytest.raises(ValueError, match="requests must be a pandas DataFrame"):
        capacity_search([1, 2], SMALL)
    with pytest.raises(ValueError, match="missing column"):
        capacity_search(pd.DataFrame({"arrival_s": [0.0, 1.0]}), SMALL)
    with pytest.raises(ValueError, match="at least 2 requests"):
        capacity_search(_small_workload(n=1), SMALL)
    with pytest.raises(ValueError, match="replica must be"):
        capacity_search(_small_workload(n=20), "a100")
    with pytest.raises(ValueError, match="rates must be strictly increasing"):
        goodput_curve(_small_workload(n=20), SMALL, [2.0, 1.0])
    with pytest.raises(ValueError, match="rates must be > 0"):
        goodput_curve(_small_workload(n=20), SMALL, [-1.0])
    with pytest.raises(ValueError, match="rates must not be empty"):
        goodput_curve(_small_workload(n=20), SMALL, [])
    with pytest.raises(ValueError, match="rate must be > 0"):
        evaluate(_small_workload(n=20), SMALL, 0.0)
    with pytest.raises(ValueError, match="curve is missing"):
        curve_knee(pd.DataFrame({"rate_rps": [1.0]}))
