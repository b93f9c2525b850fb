"""Fleet sizing: the worked numbers of "Sizing a fleet for p99", the routing checks, the
simulators against Erlang C, the smallest-fleet search, and input validation."""

import math

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED, fleet, sim
from servingcap.queues import erlang_c
from servingcap.serving import simulate

LAMBDA = 30.0


# --------------------------------------------------------------------------- worked numbers


def test_seed_worked_example_numbers():
    # "T_hold = 0.25 + 300 x 0.030 = 9.25 s; a = 277.5; c = 277.5 + 2 x 16.7 ~ 311;
    #  311/32 = 9.7 -> 10 replicas, plus one: 11. Size on lambda alone and you order 9."
    plan = fleet.size_fleet(LAMBDA, LOCKED.hold_s, LOCKED.decode_batch)
    assert LOCKED.hold_s == pytest.approx(9.25)
    assert plan.offered_load == pytest.approx(277.5)
    assert round(math.sqrt(plan.offered_load), 1) == 16.7
    assert plan.slots == 311
    assert round(plan.slots / 32, 1) == 9.7
    assert plan.replicas_for_slots == 10
    assert plan.replicas == 11
    assert plan.naive_replicas == 9


def test_erlang_c_halfin_whitt_and_random_routing_numbers():
    plan = fleet.size_fleet(LAMBDA, 9.25, 32, beta=2, spares=1)
    assert round(100 * plan.prob_wait_pooled) == 3            # exact Erlang C ~ 3 %
    assert round(100 * plan.prob_wait_halfin_whitt, 1) == 2.7  # Halfin-Whitt limit ~ 2.7 %
    assert round(100 * plan.prob_wait_random) == 14            # 11 separate M/M/32 ~ 14 %
    assert plan.split.arrival_rate == pytest.approx(30 / 11)
    # p99 wait under random routing is seconds, past the 750 ms wait budget
    assert plan.wait_quantile_random > 3 * (LOCKED.ttft_slo_s - LOCKED.prefill_s)
    assert plan.wait_quantile_pooled == 0.0
    assert plan.prob_wait_pooled == pytest.approx(erlang_c(311, 277.5))


def test_naive_fleet_misses_the_wait_budget_even_pooled():
    naive = fleet.pooled_queue(LAMBDA, 9.25, 32, 9)
    assert naive.wait_quantile(0.99) > LOCKED.ttft_slo_s - LOCKED.prefill_s


def test_gpu_busy_shows_the_11_replica_plan_is_overloaded_when_colocated():
    busy = fleet.gpu_busy(LAMBDA, 11, LOCKED.prefill_s, 300, 0.030, 32)
    assert round(100 * busy.prefill) == 68
    assert round(100 * busy.decode) == 77
    assert busy.total > 1


def test_full_batch_step_gives_the_least_decode_time_on_the_book_curve():
    # The chapter prices decode at the full batch's 30 ms on the decode curve
    # (LOCKED.decode_step_table); that is a lower bound only if a lighter batch spends
    # at least as much GPU time per token: t(b) / b non-increasing in b.
    assert LOCKED.decode_step_at(LOCKED.decode_batch) == pytest.approx(0.030)
    decode = [fleet.gpu_busy(LAMBDA, 18, LOCKED.prefill_s, 300, LOCKED.decode_step_at(b),
                             b).decode for b in range(1, LOCKED.decode_batch + 1)]
    assert all(light > heavy for light, heavy in zip(decode, decode[1:], strict=False))
    assert decode[-1] == pytest.approx(LAMBDA / 18 * 300 * 0.030 / 32)


def test_pooled_is_better_than_split_and_more_replicas_help():
    for n in range(10, 15):
        pooled = fleet.pooled_queue(LAMBDA, 9.25, 32, n)
        split = fleet.split_queue(LAMBDA, 9.25, 32, n)
        assert pooled.prob_wait < split.prob_wait
    waits = [fleet.split_queue(LAMBDA, 9.25, 32, n).prob_wait for n in range(10, 15)]
    assert all(a > b for a, b in zip(waits, waits[1:], strict=False))


def test_serving_cost_counts_the_whole_fleet():
    cost = fleet.serving_cost(11, 30.0, 2.0)
    assert cost.replica_hours == pytest.approx(11 * 1000 / (3600 * 30))
    assert cost.dollars == pytest.approx(2 * cost.replica_hours)


# --------------------------------------------------------------------------- simulation


def test_routed_waits_pooled_agrees_with_erlang_c_at_311_slots():
    # 311 pooled slots at a = 277.5, exponential holding: Erlang C says 2.99 %.
    # Waits are correlated in time, so the sampling error comes from 10 independent
    # replications (each 30,000 requests, ~108 holding times): their mean has standard
    # error std/sqrt(10). The closed form must lie within 4 standard errors (false alarm
    # < 1e-3 with t(9) tails ~ 0.3 %).
    estimates = []
    for seed in range(10):
        arrivals, _, waits = sim.mmc_sample(LAMBDA, 1 / 9.25, 30_000, seed, servers=311)
        keep = arrivals > 2 * 9.25
        estimates.append(np.mean(waits[keep] > 0))
    est = np.array(estimates)
    se = est.std(ddof=1) / math.sqrt(est.size)
    assert abs(est.mean() - erlang_c(311, 277.5)) < 4 * se
    assert se < 0.5 * erlang_c(311, 277.5)         # the test has teeth


def test_serving_simulator_pooled_router_agrees_with_erlang_c():
    # Slot model: 4 replicas x 8 slots (c = 32) at a = 27 Erlangs, holding ~exponential
    # with mean 2 s; Erlang C gives P(wait) ~ 0.45, a level where a short run is precise.
    # Sampling error: 8 independent seeded replications of 3,000 requests; the closed
    # form must lie within 4 standard errors of their mean (false alarm < 1e-3, t(7)
    # tails ~ 0.5 %). The geometric step count makes the holding time exponential up
    # to 1 ms steps, and a request "waited" if admission lagged arrival by > 2 steps
    # (a free slot is taken at the next step boundary, <= 1 step later).
    hold, slots, n_rep, step = 2.0, 8, 4, 0.001
    rate = 27 / hold
    expected = erlang_c(slots * n_rep, 27.0)
    estimates = []
    for seed in range(8):
        reqs = fleet.slot_requests(rate, 3_000, hold, seed, step_s=step)
        out = simulate(reqs, fleet.slot_replica(slots, step), replicas=n_rep, router="pooled")
        wait = (out.admitted_s - out.arrival_s).to_numpy()[reqs.arrival_s.to_numpy() > 4 * hold]
        estimates.append(np.mean(wait > 2 * step))
    est = np.array(estimates)
    se = est.std(ddof=1) / math.sqrt(est.size)
    assert abs(est.mean() - expected) < 4 * se
    assert se < 0.1 * expected


def test_routed_waits_matches_the_serving_simulator_request_by_request():
    # Same arrivals and holding times, same random-router seed: the queue-level and the
    # serving simulators make the same routing decisions, so waits agree to the 1 ms step.
    reqs = fleet.slot_requests(LAMBDA, 1_500, 9.25, 7)
    holds = reqs.output_tokens.to_numpy() * 0.001
    for router in ("random", "round_robin", "pooled", "least_requests", "jsq", "power_of_two"):
        out = simulate(reqs, fleet.slot_replica(32), replicas=11, router=router, seed=3)
        fast = fleet.routed_waits(reqs.arrival_s, holds, 11, 32, router, rng=3)
        served = (out.admitted_s - out.arrival_s).to_numpy()
        assert np.quantile(np.abs(served - fast), 0.99) < 0.01, router


def test_work_router_agrees_with_the_serving_simulator_in_distribution():
    # By outstanding work the two simulators count the same thing in different units
    # (slot-seconds vs tokens of 1 ms steps), so near-ties break differently and the paths
    # diverge request by request; the policy is the same, so the mean wait agrees in
    # distribution. Paired over 8 seeded runs of 3,000 requests (seen: per-run means 0.03
    # to 0.11 s either way round), the mean difference must be within 4 standard errors of
    # the paired differences (a false alarm below 1e-4 for a t-statistic with 7 d.o.f. is
    # not guaranteed, but 4 SE leaves the test failing only on a real bias of that size).
    diffs = []
    for seed in range(8):
        reqs = fleet.slot_requests(LAMBDA, 3_000, 9.25, 100 + seed)
        holds = reqs.output_tokens.to_numpy() * 0.001
        out = simulate(reqs, fleet.slot_replica(32), replicas=11, router="oracle_work")
        fast = fleet.routed_waits(reqs.arrival_s, holds, 11, 32, "oracle_work")
        diffs.append((out.admitted_s - out.arrival_s).mean() - fast.mean())
    diffs = np.array(diffs)
    se = diffs.std(ddof=1) / math.sqrt(diffs.size)
    assert abs(diffs.mean()) < 4 * se + 0.002    # + the 1 ms step's admission granularity


def test_random_routing_waits_match_per_replica_erlang_c():
    rng = np.random.default_rng(11)
    arr = sim.poisson_arrivals(LAMBDA, 200_000, rng)
    svc = rng.exponential(9.25, arr.size)
    waits = fleet.routed_waits(arr, svc, 11, 32, "random", rng=5)[arr > 20]
    expected = fleet.split_queue(LAMBDA, 9.25, 32, 11).prob_wait
    assert np.mean(waits > 0) == pytest.approx(expected, rel=0.15)
    least = fleet.routed_waits(arr, svc, 11, 32, "least_requests")[arr > 20]
    assert np.mean(least > 0) < 0.01


def test_slot_requests_hold_for_hold_s_on_average():
    reqs = fleet.slot_requests(5.0, 20_000, 9.25, 1)
    holds = reqs.output_tokens * 0.001
    assert holds.mean() == pytest.approx(9.25, rel=0.03)
    assert holds.std() / holds.mean() == pytest.approx(1.0, abs=0.05)
    const = fleet.slot_requests(5.0, 10, 9.25, 1, service="deterministic")
    assert (const.output_tokens == 9250).all()


# --------------------------------------------------------------------------- search


def fake_run(threshold_ttft, threshold_tpot, calls):
    """A fleet of n replicas whose p99s fall as 1/n; records the sizes simulated."""
    def run(n):
        calls.append(n)
        k = 200
        return pd.DataFrame({"outcome": ["done"] * k,
                             "ttft_s": np.full(k, threshold_ttft / n),
                             "tpot_s": np.full(k, threshold_tpot / n)})
    return run


def test_smallest_fleet_bisection_finds_the_boundary():
    calls = []
    # TTFT p99 = 20/n <= 1 needs n >= 20; TPOT = 0.9/n <= 0.05 needs n >= 18.
    result = fleet.smallest_fleet(fake_run(20.0, 0.9, calls), 10, 40)
    assert result.replicas == 20
    assert result.meets(20) and not result.meets(19)
    assert len(calls) <= 1 + math.ceil(math.log2(31))
    assert list(result.trials.replicas) == sorted(calls)


def test_smallest_fleet_returns_lo_when_lo_meets_and_rejects_a_failing_hi():
    assert fleet.smallest_fleet(fake_run(1.0, 0.01, []), 3, 9).replicas == 3
    with pytest.raises(ValueError, match="hi=5"):
        fleet.smallest_fleet(fake_run(20.0, 0.01, []), 2, 5)


def test_smallest_fleet_counts_failed_requests_as_late():
    def run(n):
        return pd.DataFrame({"outcome": ["done"] * 90 + ["rejected"] * 10,
                             "ttft_s": [0.1] * 90 + [np.nan] * 10,
                             "tpot_s": [0.01] * 90 + [np.nan] * 10})
    with pytest.raises(ValueError, match="hi must be a fleet"):
        fleet.smallest_fleet(run, 1, 4)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, match", [
    (dict(arrival_rate=-1.0), "arrival_rate must be > 0, got -1.0"),
    (dict(hold_s=float("nan")), "hold_s must be finite, got nan"),
    (dict(slots_per_replica=0), "slots_per_replica must be a whole number >= 1, got 0"),
    (dict(beta=-0.5), "beta must be >= 0, got -0.5"),
    (dict(spares=-1), "spares must be a whole number >= 0, got -1"),
    (dict(p=1.0), "p must be strictly between 0 and 1, got 1.0"),
])
def test_size_fleet_names_bad_inputs(kwargs, match):
    args = dict(arrival_rate=30.0, hold_s=9.25, slots_per_replica=32)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fleet.size_fleet(**args)


def test_other_functions_name_bad_inputs():
    with pytest.raises(ValueError, match="replicas must be a whole number >= 1, got 0"):
        fleet.pooled_queue(30, 9.25, 32, 0)
    with pytest.raises(ValueError, match="router must be one of"):
        fleet.routed_waits([0.0, 1.0], [1.0, 1.0], 2, 2, "fastest")
    with pytest.raises(ValueError, match="renamed 'oracle_work'"):
        fleet.routed_waits([0.0, 1.0], [1.0, 1.0], 2, 2, "least_loaded")
    with pytest.raises(ValueError, match="slot model"):
        fleet.routed_waits([0.0, 1.0], [1.0, 1.0], 2, 2, "endpoint_picker")
    with pytest.raises(ValueError, match="service must be"):
        fleet.slot_requests(1.0, 10, 1.0, 0, service="uniform")
    with pytest.raises(ValueError, match="good_rate must be > 0, got 0"):
        fleet.serving_cost(3, 0, 1.0)
    with pytest.raises(ValueError, match="hi must be >= lo"):
        fleet.smallest_fleet(lambda n: None, 5, 4)
    with pytest.raises(ValueError, match="batch must be a whole number >= 1, got 0"):
        fleet.gpu_busy(30, 11, 0.25, 300, 0.03, 0)
    with pytest.raises(ValueError, match="unstable queue"):
        fleet.split_queue(30, 9.25, 32, 8)


def _work_router_by_hand(a, s, n, slots):
    # The definition, evaluated from scratch at every arrival: join the replica whose
    # unfinished requests still need the fewest slot-seconds, sum(f - max(b, t)).
    import heapq as hq
    free = [[-math.inf] * slots for _ in range(n)]
    spans = [[] for _ in range(n)]
    waits = np.empty_like(a)
    for i, (t, x) in enumerate(zip(a, s, strict=True)):
        work = [sum(f - max(b, t) for b, f in spans[k] if f > t) for k in range(n)]
        k = int(np.argmin(work))
        start = max(t, free[k][0])
        waits[i] = start - t
        hq.heapreplace(free[k], start + x)
        spans[k].append((start, start + x))
    return waits


def test_work_router_matches_its_definition():
    rng = np.random.default_rng(7)
    arr = sim.poisson_arrivals(12.0, 1_500, rng)
    svc = rng.exponential(2.0, arr.size)
    fast = fleet.routed_waits(arr, svc, 3, 8, "oracle_work")
    # same choices, so the same waits up to rounding of the running sums
    np.testing.assert_allclose(fast, _work_router_by_hand(arr, svc, 3, 8), atol=1e-9)
    assert (fast > 0).mean() > 0.01          # the case is loaded enough to queue


def _replications(replicas, seeds=4, n=1_500):
    reps = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        reqs = pd.DataFrame({"arrival_s": sim.poisson_arrivals(3.0, n, rng),
                             "prompt_tokens": 2_000, "output_tokens": 300})
        reps.append(simulate(reqs, replicas=replicas))
    return reps


LIMITS = {"ttft_s": 1.0, "tpot_s": 0.05}


def test_replicated_attainment_meets_and_reports_the_design():
    # 3 req/s of the locked request on 4 replicas: 0.75 req/s each, 40 % of the additive
    # fluid bound (1.88 req/s), p99 TPOT well under 50 ms: every replication meets.
    row = fleet.replicated_attainment(_replications(4), LIMITS, target=0.99)
    assert row["verdict"] == "meets" and row["replications"] == 4
    assert row["attainment_high"] >= 0.99 and row["attainment"] <= 1.0
    # run after warm-up: at most the simulated span (1,500 arrivals at 3/s, about 500 s)
    assert 300 < row["run_s"] < 600 and row["ttft_p99_s"] < 1.0


def test_replicated_attainment_calls_an_overloaded_fleet_unstable():
    # 3 req/s on 1 replica: 1.6 x its fluid bound, the backlog grows all run long.
    row = fleet.replicated_attainment(_replications(1, seeds=2, n=600), LIMITS)
    assert row["verdict"] == "unstable"
    assert row["attainment"] < 0.5


@pytest.mark.parametrize("kwargs, name", [
    ({"runs": []}, "runs"),
    ({"runs": pd.DataFrame()}, "runs"),
    ({"limits": {}}, "limits"),
    ({"limits": {"ttft_s": -1.0}}, "limits"),
    ({"target": 1.5}, "target"),
    ({"confidence": 0.0}, "confidence"),
    ({"confidence": 0.5}, "confidence"),
    ({"delta": 0.0}, "delta"),
])
def test_replicated_attainment_rejects_bad_input(kwargs, name):
    args = {"runs": _replications(1, seeds=1, n=100), "limits": LIMITS, **kwargs}
    with pytest.raises(ValueError, match=name):
        fleet.replicated_attainment(**args)


def test_replicated_attainment_pools_the_p99s_and_reports_the_range():
    # Three runs of 2,000 requests; only the third has slow streams (5 % at 60 ms TPOT).
    # Per-run p99 TPOT: 30, 30, 60 ms, whose mean (40 ms) would sit inside a 50 ms
    # limit; pooled, 100 of 6,000 requests (1.7 % > 1 %) are slow, so the p99 is 60 ms.
    runs = []
    for i in range(3):
        rng = np.random.default_rng(i)
        tpot = np.full(2_000, 0.030)
        if i == 2:
            tpot[rng.choice(2_000, 100, replace=False)] = 0.060
        runs.append(pd.DataFrame({
            "arrival_s": np.arange(2_000) / 3.0,
            "ttft_s": rng.uniform(0.2, 0.3 + 0.1 * i, 2_000),
            "tpot_s": tpot, "outcome": "done"}))
    row = fleet.replicated_attainment(runs, LIMITS, target=0.9)
    assert row["tpot_p99_s"] == pytest.approx(0.060)
    # the p99 TTFT interval is sectioning around the pooled p99 (symmetric about it), and
    # is wide here: run i's p99 is 0.299 + 0.099 i s, far apart
    pooled = row["ttft_p99_s"]
    assert row["ttft_p99_low"] < pooled < row["ttft_p99_high"]
    assert row["ttft_p99_low"] + row["ttft_p99_high"] == pytest.approx(2 * pooled)
    assert row["ttft_p99_high"] - row["ttft_p99_low"] > 0.2
    # too few kept requests per run for a p99 by sectioning (fewer than 1,000): NaN
    short = fleet.replicated_attainment([r.iloc[:500] for r in runs], LIMITS, target=0.9)
    assert math.isnan(short["ttft_p99_low"]) and math.isnan(short["ttft_p99_high"])
    assert row["misses"] == pytest.approx(100, abs=10)   # the warm-up cut may drop a few
    assert row["requests"] <= 6_000
