"""SLO arithmetic (servingcap.slo): goodput, failure-keeping percentiles, the capacity
question, and the queue-depth-capped FCFS simulator."""

import math

import numpy as np
import pandas as pd
import pytest
from servingcap import MM1, MMc, UnstableQueueError, erlang_b, sim, slo


def frame(rows):
    columns = ["arrival_s", "ttft_s", "tpot_s", "e2e_s", "outcome", "verified"]
    return pd.DataFrame(rows, columns=columns)


@pytest.fixture
def ten():
    # 10 requests in a 10 s window: 6 fast, 1 slow TTFT, 1 slow TPOT, 1 rejected, 1 timed out.
    return frame([
        (0.0, 0.3, 0.030, 9.3, "done", True),
        (1.0, 0.4, 0.030, 9.4, "done", True),
        (2.0, 0.5, 0.030, 9.5, "done", False),
        (3.0, 0.6, 0.040, 12.6, "done", True),
        (4.0, 0.7, 0.030, 9.7, "done", True),
        (5.0, 0.8, 0.030, 9.8, "done", False),
        (6.0, 2.5, 0.030, 11.5, "done", True),
        (7.0, 0.2, 0.080, 24.1, "done", True),
        (8.0, np.nan, np.nan, np.nan, "rejected", False),
        (9.0, np.nan, np.nan, np.nan, "timed_out", False),
    ])


def test_latencies_keep_failures_as_infinite(ten):
    x = slo.latencies(ten, "ttft_s")
    assert x.size == 10
    assert np.isinf(x[8]) and np.isinf(x[9])
    assert x[:8].tolist() == [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 2.5, 0.2]


def test_quantile_counts_failures_instead_of_dropping_them(ten):
    # inverted CDF: the 0.5-quantile is the 5th smallest of 10
    assert slo.latency_quantile(ten, 0.5) == pytest.approx(0.6)
    assert slo.latency_quantile(ten, 0.8) == pytest.approx(2.5)
    assert slo.latency_quantile(ten, 0.81) == math.inf   # 20 % failed: the p81 is a failure
    assert slo.latency_quantile(ten, 0.99) == math.inf
    # dropping the failures would have reported a finite p99: the trap this avoids
    done_only = ten[ten.outcome == "done"]
    assert math.isfinite(slo.latency_quantile(done_only, 0.99))


def test_unfinished_and_categorical_outcomes_are_accepted(ten):
    # the serving simulator stores outcome as a Categorical and marks requests still in
    # flight at the end of a run as "unfinished": they count as failures, not as gaps
    x = ten.assign(outcome=pd.Categorical(ten.outcome.replace("timed_out", "unfinished"),
                                          categories=list(slo.OUTCOMES)))
    assert np.isinf(slo.latencies(x, "ttft_s")[9])
    assert slo.goodput(x, 10.0, ttft_s=1.0, tpot_s=0.05) == pytest.approx(0.6)
    assert slo.latency_quantile(x, 0.99) == math.inf


def test_meets_slo_requires_done_and_every_limit(ten):
    ok = slo.meets_slo(ten, ttft_s=1.0, tpot_s=0.05)
    assert ok.tolist() == [True] * 6 + [False] * 4
    assert slo.meets_slo(ten).sum() == 8                  # completion only
    assert slo.meets_slo(ten, ttft_s=1.0).sum() == 7
    assert slo.meets_slo(ten, ttft_s=1.0, tpot_s=0.05, verified=True).sum() == 4
    assert slo.slo_attainment(ten, ttft_s=1.0, tpot_s=0.05) == pytest.approx(0.6)


def test_rates_over_the_window(ten):
    assert slo.offered_rate(ten, 10.0) == pytest.approx(1.0)
    assert slo.throughput(ten, 10.0) == pytest.approx(0.8)
    assert slo.goodput(ten, 10.0, ttft_s=1.0, tpot_s=0.05) == pytest.approx(0.6)
    assert slo.goodput(ten, 10.0, ttft_s=1.0, tpot_s=0.05, verified=True) == pytest.approx(0.4)


def test_seed_example_throughput_is_not_goodput():
    # 1,000 completions in a minute, 650 of them inside TTFT and TPOT
    n = 1_000
    x = pd.DataFrame({"ttft_s": np.where(np.arange(n) < 650, 0.5, 2.0),
                      "tpot_s": 0.03, "outcome": "done"})
    assert slo.throughput(x, 60.0) * 60 == pytest.approx(1_000)
    assert slo.goodput(x, 60.0, ttft_s=1.0, tpot_s=0.05) * 60 == pytest.approx(650)


def test_operations_page_and_its_two_gaps(ten):
    page = slo.operations_page(ten, 10.0, ttft_s=1.0, tpot_s=0.05)
    assert page.offered == pytest.approx(1.0)
    assert page.slo_goodput == pytest.approx(0.6)
    assert page.verified_goodput == pytest.approx(0.4)
    assert page.serving_pressure == pytest.approx(0.4)
    assert page.workflow_pressure == pytest.approx(0.2)
    text = str(page)
    assert "serving pressure" in text and "req/s" in text


@pytest.mark.parametrize("call, name", [
    (lambda f: slo.latencies([1, 2], "ttft_s"), "requests"),
    (lambda f: slo.latencies(f.drop(columns="ttft_s"), "ttft_s"), "ttft_s"),
    (lambda f: slo.latencies(f.assign(outcome="failed"), "ttft_s"), "outcome"),
    (lambda f: slo.latencies(f.assign(ttft_s=np.nan), "ttft_s"), "ttft_s"),
    (lambda f: slo.latencies(f.assign(ttft_s=-1.0), "ttft_s"), "ttft_s"),
    (lambda f: slo.latency_quantile(f, 1.0), "p"),
    (lambda f: slo.latency_quantile(f, 0.0), "p"),
    (lambda f: slo.latency_quantile(f.iloc[:0], 0.5), "requests"),
    (lambda f: slo.meets_slo(f, ttft_s=0), "ttft_s"),
    (lambda f: slo.meets_slo(f, ttft_s=float("nan")), "ttft_s"),
    (lambda f: slo.meets_slo(f, deadline_s=1.0), "deadline_s"),
    (lambda f: slo.goodput(f, 0.0, ttft_s=1.0), "duration_s"),
    (lambda f: slo.offered_rate(f, -5), "duration_s"),
    (lambda f: slo.throughput(f, float("inf")), "duration_s"),
    (lambda f: slo.operations_page(f, 10.0), "limits"),
    (lambda f: slo.operations_page(f, 10.0, ttft_s=1.0, verified_by="x"), "verified_by"),
])
def test_bad_input_names_the_parameter(ten, call, name):
    with pytest.raises(ValueError, match=name):
        call(ten)


# ------------------------------------------------------------------ the capacity question


def test_max_rate_solves_mm1_p99_exactly():
    # M/M/1 response p99 = ln(100) / (mu - lambda) <= T  =>  lambda = mu - ln(100) / T
    mu, target = 10.0, 2.0
    rate = slo.max_rate(lambda lam: MM1(lam, mu).response_quantile(0.99), target, upper=mu)
    assert rate == pytest.approx(mu - math.log(100) / target, rel=1e-6)


def test_max_rate_on_mmc_wait_quantile_meets_the_target_at_the_boundary():
    mu, c, target = 1 / 9.25, 32, 0.75
    rate = slo.max_rate(lambda lam: MMc(lam, mu, c).wait_quantile(0.99), target, upper=c * mu)
    assert 0 < rate < c * mu
    assert MMc(rate, mu, c).wait_quantile(0.99) <= target + 1e-9
    assert MMc(rate * (1 + 1e-4), mu, c).wait_quantile(0.99) > target


def test_max_rate_treats_unstable_and_infinite_as_misses():
    def latency(lam):
        if lam >= 5:
            raise UnstableQueueError("unstable")
        return math.inf if lam > 3 else lam

    assert slo.max_rate(latency, 10.0, upper=6.0) == pytest.approx(3.0, rel=1e-6)
    assert slo.max_rate(lambda lam: 1.0 + lam, 0.5, upper=1.0) == 0.0   # unattainable


@pytest.mark.parametrize("kwargs, name", [
    (dict(target_s=0.0, upper=1.0), "target_s"),
    (dict(target_s=1.0, upper=-1.0), "upper"),
    (dict(target_s=1.0, upper=1.0, rtol=0.0), "rtol"),
    (dict(target_s=10.0, upper=1.0), "upper"),          # upper does not miss the target
])
def test_max_rate_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        slo.max_rate(lambda lam: lam, **kwargs)


# ------------------------------------------------------------------ capped FCFS


def test_capped_fcfs_by_hand():
    # one server, service 2 s, arrivals at 0, 0.5, 1, 1.5; waiting room of 1
    waits, admitted = slo.capped_fcfs([0.0, 0.5, 1.0, 1.5], [2.0, 2.0, 2.0, 2.0], 1, queue_cap=1)
    assert admitted.tolist() == [True, True, False, False]
    assert waits[:2].tolist() == [0.0, 1.5]
    assert np.isnan(waits[2:]).all()
    # the waiting request starts at t=2, so a request at t=2.5 finds the room empty
    waits, admitted = slo.capped_fcfs([0.0, 0.5, 1.0, 2.5], [2.0] * 4, 1, queue_cap=1)
    assert admitted.tolist() == [True, True, False, True]
    assert waits[3] == pytest.approx(1.5)


def test_capped_fcfs_without_cap_matches_fcfs_waits():
    rng = np.random.default_rng(7)
    a, s, w = sim.mmc_sample(3.0, 0.5, 5_000, rng, servers=8)
    waits, admitted = slo.capped_fcfs(a, s, 8, queue_cap=None)
    assert admitted.all()
    np.testing.assert_allclose(waits, w)


def test_capped_fcfs_zero_room_is_erlang_b():
    rng = np.random.default_rng(11)
    a, s, _ = sim.mmc_sample(3.0, 1 / 9.25, 100_000, rng, servers=32)
    _, admitted = slo.capped_fcfs(a, s, 32, queue_cap=0)
    assert 1 - admitted.mean() == pytest.approx(erlang_b(32, 3.0 * 9.25), abs=0.005)


def test_capped_fcfs_blocking_matches_mmck():
    lam, mu, c, k = 3.0, 1 / 9.25, 32, 2
    a = lam / mu
    weights = [a**n / math.factorial(n) if n <= c else a**c / math.factorial(c) * (a / c) ** (n - c)
               for n in range(c + k + 1)]
    blocking = weights[-1] / sum(weights)
    rng = np.random.default_rng(12)
    arr, s, _ = sim.mmc_sample(lam, mu, 100_000, rng, servers=c)
    _, admitted = slo.capped_fcfs(arr, s, c, queue_cap=k)
    assert 1 - admitted.mean() == pytest.approx(blocking, abs=0.005)


@pytest.mark.parametrize("args, name", [
    (([0.0, 1.0], [1.0]), "same length"),
    (([1.0, 0.0], [1.0, 1.0]), "non-decreasing"),
    (([0.0, 1.0], [1.0, -1.0]), "service_times"),
    (([0.0, 1.0], [1.0, 1.0], 0), "servers"),
    (([0.0, 1.0], [1.0, 1.0], 1, -1), "queue_cap"),
    (([0.0, 1.0], [1.0, 1.0], 1, 1.5), "queue_cap"),
])
def test_capped_fcfs_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        slo.capped_fcfs(*args)


def test_one_token_answers_have_no_tpot_and_meet_any_tpot_limit():
    frame = pd.DataFrame({"outcome": ["done", "done", "rejected"],
                          "ttft_s": [0.2, 0.3, np.nan], "tpot_s": [0.04, np.nan, np.nan]})
    assert slo.latencies(frame, "tpot_s").tolist() == [0.04, np.inf]
    assert slo.meets_slo(frame, ttft_s=1.0, tpot_s=0.05).tolist() == [True, True, False]
    # a NaN TTFT on a done request is still an error: every answer has a first token
    frame.loc[1, "ttft_s"] = np.nan
    with pytest.raises(ValueError, match="ttft_s"):
        slo.latencies(frame, "ttft_s")
