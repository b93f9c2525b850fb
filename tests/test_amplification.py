"""Tests for the chapter "Agents multiply traffic": call amplification (servingcap.traffic)
and the fan-out simulator with retries and late cancellation (servingcap.agents)."""

import math

import numpy as np
import pytest
from servingcap import LOCKED, MM1, UnstableQueueError, agents, sim, traffic
from servingcap.agents import FanOut
from servingcap.knee import mm1_knee

CLASSES = {"timeout": 0.04, "rate_limited": 0.06}
BUDGET = {"timeout": 1, "rate_limited": 2}


# --------------------------------------------------------------------------- seed numbers

def test_seed_arithmetic_before_the_update():
    lam = traffic.agent_request_rate(2, 6, 1.15)
    assert lam == pytest.approx(13.8)
    q = MM1(arrival_rate=lam, service_rate=18)
    assert q.utilization == pytest.approx(0.767, abs=5e-4)
    assert round(q.mean_response, 3) == 0.238
    assert round(q.response_quantile(0.95), 3) == 0.713


def test_seed_arithmetic_after_the_update():
    lam = traffic.agent_request_rate(2, 7.5, 1.15)
    assert lam == pytest.approx(17.25)
    q = MM1(arrival_rate=lam, service_rate=18)
    assert q.utilization == pytest.approx(0.958, abs=5e-4)
    assert round(q.mean_response, 3) == 1.333
    assert round(q.response_quantile(0.95), 3) == 3.994
    before = MM1(arrival_rate=traffic.agent_request_rate(2, 6, 1.15), service_rate=18)
    assert 7.5 / 6 - 1 == pytest.approx(0.25)
    assert q.mean_response / before.mean_response == pytest.approx(5.6)
    assert q.response_quantile(0.95) / before.response_quantile(0.95) == pytest.approx(5.6)
    assert before.utilization < mm1_knee() < q.utilization


def test_seed_update_is_past_capacity_at_eight_calls():
    lam = traffic.agent_request_rate(2, 8, 1.15)
    with pytest.raises(UnstableQueueError, match="rho"):
        MM1(arrival_rate=lam, service_rate=18)


def test_seed_toy_numbers_by_simulation():
    rng = np.random.default_rng(20261129)
    arr, svc, waits = sim.mmc_sample(13.8, 18.0, 400_000, rng)
    resp = waits + svc
    assert resp.mean() == pytest.approx(1 / 4.2, rel=0.03)
    assert np.quantile(resp, 0.95) == pytest.approx(-math.log(0.05) / 4.2, rel=0.03)


@pytest.mark.parametrize("kwargs, name", [
    (dict(task_rate=-1, calls_per_task=6), "task_rate"),
    (dict(task_rate=2, calls_per_task=0), "calls_per_task"),
    (dict(task_rate=2, calls_per_task=float("nan")), "calls_per_task"),
    (dict(task_rate=2, calls_per_task=6, retry_multiplier=0.9), "retry_multiplier"),
])
def test_agent_request_rate_rejects_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        traffic.agent_request_rate(**kwargs)


def test_retry_multiplier_closed_forms():
    assert traffic.retry_multiplier(0.0, 3) == 1.0
    assert traffic.retry_multiplier(0.1, 2) == pytest.approx(1.11)
    assert traffic.retry_multiplier(0.2) == pytest.approx(1.25)
    assert traffic.retry_multiplier(0.2, 200) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="failure_prob"):
        traffic.retry_multiplier(1.0)
    with pytest.raises(ValueError, match="max_retries"):
        traffic.retry_multiplier(0.1, -1)


# --------------------------------------------------------------------------- branch_attempts

def test_branch_attempts_one_class_matches_traffic():
    for p, r in ((0.1, 0), (0.1, 2), (0.3, 5)):
        a = agents.branch_attempts({"x": p}, {"x": r})
        assert a.mean_requests == pytest.approx(traffic.retry_multiplier(p, r))
        assert a.retries_by_class["x"] == pytest.approx(a.mean_requests - 1)
        assert a.p_exhausted == pytest.approx(p ** (r + 1))


def test_branch_attempts_by_class_sums_and_matches_simulation():
    a = agents.branch_attempts(CLASSES, BUDGET)
    assert a.mean_requests == pytest.approx(1 + sum(a.retries_by_class.values()))
    f = FanOut.from_params(LOCKED, task_rate=0.5, branches=2, failure_probs=CLASSES,
                           retries=BUDGET, cancel_delay_s=math.inf, max_rounds=1)
    run = agents.simulate_fanout(f, 4 * 3600, seed=5)
    reqs = run.requests
    first = (reqs["attempt"] == 0).sum()
    assert len(reqs) / first == pytest.approx(a.mean_requests, rel=0.01)
    for name, expected in a.retries_by_class.items():
        # counts are close to Poisson: allow four standard errors
        se = math.sqrt(expected / first)
        assert abs((reqs["cause"] == name).sum() / first - expected) < 4 * se


@pytest.mark.parametrize("probs, retries, name", [
    ({"t": 1.2}, {}, "failure_probs"),
    ({"t": 0.6, "u": 0.5}, {}, "sum"),
    ({"t": 0.1}, {"u": 1}, "retries"),
    ({"t": 0.1}, {"t": -1}, "retries"),
    ({"accepted": 0.1}, {}, "reserved"),
    ([0.1], {}, "failure_probs"),
])
def test_branch_attempts_rejects_bad_input(probs, retries, name):
    with pytest.raises(ValueError, match=name):
        agents.branch_attempts(probs, retries)


# --------------------------------------------------------------------------- fan-out simulator

def _system(**changes):
    base = dict(task_rate=0.8, branches=3, output_cv=0.5, failure_probs=CLASSES,
                retries=BUDGET)
    base.update(changes)
    return FanOut.from_params(LOCKED, **base)


@pytest.fixture(scope="module")
def runs():
    return {d: agents.simulate_fanout(_system(cancel_delay_s=d), 2 * 3600, seed=11)
            for d in (0.0, 2.0, 10.0, math.inf)}


def test_same_seed_same_run():
    a = agents.simulate_fanout(_system(), 1800, seed=1)
    b = agents.simulate_fanout(_system(), 1800, seed=1)
    assert a.tasks.equals(b.tasks) and a.requests.equals(b.requests)


@pytest.mark.parametrize("delay", [0.0, 2.0, 10.0, math.inf])
def test_every_task_and_branch_accounted_for(runs, delay):
    run = runs[delay]
    tasks, reqs = run.tasks, run.requests
    k = run.system.branches
    assert np.isfinite(tasks["finish_s"]).all()
    assert (tasks["finish_s"] >= tasks["arrival_s"]).all()
    assert set(tasks["outcome"]) <= {"done", "failed"}
    assert (tasks["branches"] == k * tasks["rounds"]).all()
    # every branch of every round sent its first request (no backoff)
    firsts = reqs[reqs["attempt"] == 0].groupby("task").size().reindex(tasks.index, fill_value=0)
    assert (firsts == tasks["branches"]).all()
    assert reqs.groupby("task").size().reindex(tasks.index, fill_value=0).equals(tasks["requests"])
    # one winner per finished task, none for failed ones
    wins = reqs.groupby("task")["winner"].sum().reindex(tasks.index, fill_value=0)
    assert (wins == (tasks["outcome"] == "done")).all()
    w = reqs[reqs["winner"]]
    assert np.allclose(w["end_s"].to_numpy(), tasks.loc[w["task"], "finish_s"].to_numpy())
    # every request left the route, and its slot time is consistent
    assert np.isfinite(reqs["end_s"]).all()
    assert set(reqs["status"]) <= {"completed", "stopped", "dropped"}
    dropped = reqs["status"] == "dropped"
    assert reqs.loc[dropped, "start_s"].isna().all() and (reqs.loc[dropped, "busy_s"] == 0).all()
    done = reqs["status"] == "completed"
    assert np.allclose(reqs.loc[done, "busy_s"], reqs.loc[done, "hold_s"])
    assert (reqs["busy_s"] <= reqs["hold_s"] + 1e-9).all()
    assert np.allclose(tasks["busy_s"], tasks["winner_busy_s"] + tasks["loser_busy_s"])
    if delay == math.inf:
        assert (reqs["status"] == "completed").all()


def test_k1_without_cancellation_is_plain_fcfs():
    f = _system(task_rate=2.5, branches=1, failure_probs={}, retries={}, accept_prob=1.0,
                cancel_delay_s=math.inf)
    run = agents.simulate_fanout(f, 3600, seed=3)
    reqs = run.requests
    assert len(reqs) == len(run.tasks)
    assert np.allclose(reqs["arrival_s"], run.tasks["arrival_s"])
    waits = sim.fcfs_waits(reqs["arrival_s"], reqs["hold_s"], servers=f.slots)
    assert np.allclose(waits, reqs["start_s"] - reqs["arrival_s"], atol=1e-9)
    assert waits.max() > 0                                  # the queue was exercised
    assert np.allclose(run.tasks["critical_path_s"], waits + reqs["hold_s"])


def test_never_cancelling_is_plain_fcfs_for_any_k(runs):
    reqs = runs[math.inf].requests
    waits = sim.fcfs_waits(reqs["arrival_s"], reqs["hold_s"], servers=runs[math.inf].system.slots)
    assert np.allclose(waits, reqs["start_s"] - reqs["arrival_s"], atol=1e-9)


def test_late_work_is_zero_with_immediate_cancel_and_grows_with_delay(runs):
    after = {d: r.tasks["busy_after_finish_s"].sum() for d, r in runs.items()}
    assert after[0.0] == 0.0
    assert (runs[0.0].requests["busy_after_finish_s"] == 0).all()
    assert 0 < after[2.0] < after[10.0] < after[math.inf]
    util = [runs[d].utilization() for d in (0.0, 2.0, 10.0, math.inf)]
    assert util == sorted(util)
    # stopped requests never run past the cancellation instant
    fin = runs[2.0].tasks["finish_s"]
    stopped = runs[2.0].requests[runs[2.0].requests["status"] == "stopped"]
    assert (stopped["end_s"].to_numpy() <= fin[stopped["task"]].to_numpy() + 2.0 + 1e-9).all()


def test_common_random_numbers_across_delays(runs):
    # changing only the cancellation delay keeps arrivals and the first round's draws
    a, b = runs[0.0], runs[10.0]
    assert np.array_equal(a.tasks["arrival_s"], b.tasks["arrival_s"])


def test_uncancelled_load_matches_formula(runs):
    run = runs[math.inf]
    f = run.system
    per_task = run.tasks["requests"].mean()
    assert per_task == pytest.approx(f.requests_per_task_uncancelled, rel=0.03)


def test_fanout_cuts_critical_path_at_low_load():
    one = agents.simulate_fanout(_system(task_rate=0.3, branches=1), 3 * 3600, seed=2)
    three = agents.simulate_fanout(_system(task_rate=0.3, branches=3), 3 * 3600, seed=2)
    assert three.critical_path_quantile(0.95) < 0.7 * one.critical_path_quantile(0.95)


def test_task_metrics_table(runs):
    m = runs[10.0].task_metrics(warmup_s=600).set_index("metric")
    assert m.loc["requests per user task", "value"] >= m.loc["parallel branches per task", "value"]
    assert m.loc["retry multiplier, all classes", "value"] >= 1
    assert m.loc["peak concurrent tasks", "value"] >= 1
    assert 0 < m.loc["work after task completion, share", "value"] < 1
    assert {"unit"} <= set(m.columns)


def test_peak_in_flight():
    assert agents.peak_in_flight([0, 1, 2], [3, 2, 4]) == 2        # exit before entry at t=2
    assert agents.peak_in_flight([0, 0, 0], [1, 1, 1]) == 3
    assert agents.peak_in_flight([0, 5], [10, 6], start=7, end=9) == 1
    assert agents.peak_in_flight([], []) == 0
    with pytest.raises(ValueError, match="exit_s"):
        agents.peak_in_flight([1.0], [0.5])


@pytest.mark.parametrize("changes, name", [
    (dict(task_rate=0), "task_rate"),
    (dict(branches=0), "branches"),
    (dict(branches=1.5), "branches"),
    (dict(accept_prob=0), "accept_prob"),
    (dict(accept_prob=1.5), "accept_prob"),
    (dict(cancel_delay_s=-1), "cancel_delay_s"),
    (dict(cancel_delay_s=float("nan")), "cancel_delay_s"),
    (dict(max_rounds=0), "max_rounds"),
    (dict(slots=0), "slots"),
    (dict(output_cv=-0.1), "output_cv"),
    (dict(retry_backoff_s=-1), "retry_backoff_s"),
    (dict(failure_probs={"t": 0.5, "u": 0.6}), "failure_probs"),
])
def test_fanout_rejects_bad_input(changes, name):
    with pytest.raises(ValueError, match=name):
        _system(**changes)


def test_simulate_fanout_rejects_bad_input():
    with pytest.raises(ValueError, match="system"):
        agents.simulate_fanout("not a system", 100, seed=1)
    with pytest.raises(ValueError, match="horizon_s"):
        agents.simulate_fanout(_system(), -5, seed=1)
    run = agents.simulate_fanout(_system(), 600, seed=1)
    with pytest.raises(ValueError, match="warmup_s"):
        run.window(600)
    with pytest.raises(ValueError, match="p"):
        run.critical_path_quantile(1.5)


def test_output_lengths_have_the_requested_mean():
    for cv in (0.0, 0.5, 1.0):
        run = agents.simulate_fanout(_system(output_cv=cv, cancel_delay_s=math.inf), 1800, seed=4)
        out = run.requests["output_tokens"]
        assert out.mean() == pytest.approx(300, rel=0.05)
        assert out.std() / out.mean() == pytest.approx(cv, abs=0.05)


def test_backoff_delays_retries():
    f = _system(retry_backoff_s=1.5, cancel_delay_s=math.inf)
    run = agents.simulate_fanout(f, 1800, seed=6)
    reqs = run.requests.sort_values(["branch", "attempt"])
    prev_end = reqs.groupby("branch")["end_s"].shift()
    retried = reqs["attempt"] > 0
    assert retried.any()
    assert np.allclose(reqs.loc[retried, "arrival_s"], prev_end[retried] + 1.5)
