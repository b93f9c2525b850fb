"""Scheduling-policy helpers (servingcap.policies): workload, deadlines, predictions,
slowdown accounting, Cobham's formula against the simulator, and the conservation law."""

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED, MG1, UnstableQueueError
from servingcap import policies as pol
from servingcap.serving import Replica, detailed, simulate


def mix(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_tokens": rng.integers(100, 3000, n),
                         "output_tokens": rng.integers(10, 600, n)})


# --------------------------------------------------------------------------- workload


def test_unqueued_e2e_matches_a_request_alone_in_the_simulator():
    reqs = pd.DataFrame({"arrival_s": [0.0, 100.0, 200.0], "prompt_tokens": [2000, 4000, 7],
                         "output_tokens": [300, 1, 50]})
    for replica in (Replica(max_batch=1), Replica(max_batch=8),
                    Replica(max_batch=8, chunk_tokens=512, mode="combined"),
                    Replica(max_batch=8, mode="combined", step_cost="additive")):
        out = simulate(reqs, replica)
        assert np.allclose(out.e2e_s, pol.unqueued_e2e_s(reqs, replica))
    # the locked typical request alone: 0.25 s + 299 steps at batch 1 on the book's curve;
    # with the seed's constant 30 ms step, 0.25 + 299 x 0.030 = 9.22 s
    alone = LOCKED.prefill_s + 299 * LOCKED.decode_step_at(1)
    assert pol.unqueued_e2e_s(reqs.iloc[[0]])[0] == pytest.approx(alone)
    flat = Replica(decode_step_s=LOCKED.decode_step_s, mode="combined", step_cost="additive")
    assert pol.unqueued_e2e_s(reqs.iloc[[0]], flat)[0] == pytest.approx(9.22)


def test_unqueued_e2e_with_a_custom_cost_model_sums_its_steps():
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [1000], "output_tokens": [5]})
    totals = Replica(max_batch=1, step_time=lambda p, b, c: 0.01 + p / 10_000 + 0.02 * b,
                     mode="combined")
    expect = (0.01 + 0.1) + 4 * (0.01 + 0.02)
    assert pol.unqueued_e2e_s(reqs, totals)[0] == pytest.approx(expect)
    assert simulate(reqs, totals).e2e_s[0] == pytest.approx(expect)

    @detailed
    def per_context(d):
        return (0.001 * d.prefill_chunks.size + 1e-6 * d.decode_context.sum()
                + 1e-4 * d.prefill_tokens)

    rich = Replica(max_batch=1, chunk_tokens=300, step_time=per_context, mode="combined")
    assert pol.unqueued_e2e_s(reqs, rich)[0] == pytest.approx(simulate(reqs, rich).e2e_s[0])


def test_full_batch_work_and_capacity():
    m = mix()
    seed = {"mode": "combined", "step_cost": "additive"}
    one, eight = Replica(max_batch=1, **seed), Replica(max_batch=8, **seed)
    assert np.allclose(pol.full_batch_work_s(m, one), pol.unqueued_e2e_s(m, one))
    work8 = m.prompt_tokens / 8000 + (m.output_tokens - 1) * LOCKED.decode_step_at(8) / 8
    assert np.allclose(pol.full_batch_work_s(m, eight), work8)
    assert pol.capacity_rate(m, eight) == pytest.approx(1 / work8.mean())
    # fused: a lower bound (the prompt rides the decodes' weight reads), never above the
    # additive work, and by hand: max(w (N-1) / B, (P + N - 1) / rate) + (N - 1) 0.625 ms
    fused = pol.full_batch_work_s(m, Replica(max_batch=8))
    assert (fused <= work8 + 1e-12).all()
    d = m.output_tokens - 1
    by_hand = np.maximum(0.010 * d / 8, (m.prompt_tokens + d) / 8000) + d * 0.000625
    assert np.allclose(fused, by_hand)
    with pytest.raises(ValueError, match="step_time"):
        pol.full_batch_work_s(m, Replica(step_time=lambda p, b, c: 0.03))


def test_bootstrap_workload_is_seeded_and_hits_the_load():
    m = mix(2000)
    rep = Replica(max_batch=1, mode="combined", step_cost="additive")   # work = service
    a = pol.bootstrap_workload(m, 20_000, 0.7, rep, rng=5)
    b = pol.bootstrap_workload(m, 20_000, 0.7, rep, rng=5)
    pd.testing.assert_frame_equal(a, b)
    assert list(a.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert (np.diff(a.arrival_s) > 0).all()
    rate = len(a) / a.arrival_s.iloc[-1]
    assert rate * pol.unqueued_e2e_s(a, rep).mean() == pytest.approx(0.7, rel=0.03)
    # pairs are drawn jointly from the source
    pairs = set(zip(m.prompt_tokens, m.output_tokens, strict=True))
    assert set(zip(a.prompt_tokens, a.output_tokens, strict=True)) <= pairs
    with pytest.raises(ValueError, match="load"):
        pol.bootstrap_workload(m, 10, 0.0)
    with pytest.raises(ValueError, match="n must"):
        pol.bootstrap_workload(m, 0, 0.5)


def test_saturated_rate_measures_what_a_backlog_finishes():
    m = mix(400)
    # additive step: capacity_rate is exact, so the measured rate must agree with it
    # within sampling error. 5 replications of 1,500 resampled requests give a half-width
    # of about 1 % (t over 5); 3 % leaves room for the interval's own error.
    seed = Replica(max_batch=8, mode="combined", step_cost="additive")
    est = pol.saturated_rate(m, seed, n=1_500, replications=5, seed=3)
    assert est.value == pytest.approx(pol.capacity_rate(m, seed), rel=0.03)
    assert est.low <= est.value <= est.high and est.n == 5
    again = pol.saturated_rate(m, seed, n=1_500, replications=5, seed=3)
    assert again.value == est.value                        # seeded
    # fused step: capacity_rate rests on a lower bound of the work, so what the replica
    # finishes is below it (here by far more than the interval's width)
    fused = Replica(max_batch=8)
    meas = pol.saturated_rate(m, fused, n=1_500, replications=5, seed=3)
    assert meas.high < pol.capacity_rate(m, fused)
    # one slot, additive: one request at a time, so the rate is 1 / mean service time
    one = Replica(max_batch=1, mode="combined", step_cost="additive")
    est1 = pol.saturated_rate(m, one, n=1_500, replications=5, seed=3)
    assert est1.value == pytest.approx(1 / pol.unqueued_e2e_s(m, one).mean(), rel=0.05)
    # the measured rate defines a load for bootstrap_workload
    w = pol.bootstrap_workload(m, 20_000, 0.5, fused, rng=1, capacity=meas.value)
    assert len(w) / w.arrival_s.iloc[-1] == pytest.approx(0.5 * meas.value, rel=0.03)
    for bad, match in (({"n": 5}, "n must"), ({"replications": 1}, "replications"),
                       ({"trim": 0.5}, "trim"), ({"trim": -0.1}, "trim"),
                       ({"seed": -1}, "seed"), ({"replica": "x"}, "replica")):
        with pytest.raises(ValueError, match=match):
            pol.saturated_rate(m, **({"replica": seed} | bad))
    with pytest.raises(ValueError, match="n=10"):                # one step finishes all
        pol.saturated_rate(m.assign(prompt_tokens=10, output_tokens=5), Replica(max_batch=64),
                           n=10)
    with pytest.raises(ValueError, match="capacity"):
        pol.bootstrap_workload(m, 10, 0.5, capacity=0.0)


def test_slo_deadlines_and_noisy_predictions():
    reqs = pd.DataFrame({"arrival_s": [0.0, 5.0], "prompt_tokens": [10, 10],
                         "output_tokens": [1, 301]})
    assert np.allclose(pol.slo_deadlines(reqs, 1.0, 0.05), [1.0, 5.0 + 1.0 + 15.0])
    with pytest.raises(ValueError, match="tpot_slo_s"):
        pol.slo_deadlines(reqs, 1.0, -0.05)
    tokens = np.full(50_000, 200)
    assert (pol.noisy_predictions(tokens, 0.0, rng=1) == 200).all()
    noisy = pol.noisy_predictions(tokens, 1.0, rng=1)
    assert noisy.min() >= 1 and noisy.dtype.kind == "i"
    ratio = np.log(noisy / tokens)
    assert np.median(ratio) == pytest.approx(0.0, abs=0.02)
    assert ratio.std() == pytest.approx(1.0, rel=0.03)
    assert (pol.noisy_predictions(tokens, 1.0, rng=1) == noisy).all()
    with pytest.raises(ValueError, match="sigma"):
        pol.noisy_predictions(tokens, -1.0)


# --------------------------------------------------------------------------- accounting


def test_length_buckets_and_summary():
    tokens = np.arange(1, 1001)
    b = pol.length_buckets(tokens)
    assert list(b.categories) == ["p0-p50", "p50-p90", "p90-p99", "p99-p100"]
    counts = pd.Series(b).value_counts().reindex(b.categories).tolist()
    assert counts == [500, 400, 90, 10]
    with pytest.raises(ValueError, match="increasing"):
        pol.length_buckets(tokens, (0.9, 0.5))
    reqs = pd.DataFrame({"arrival_s": np.arange(200) * 20.0, "prompt_tokens": 100,
                         "output_tokens": np.arange(1, 201)})
    out = simulate(reqs, Replica(max_batch=1))
    assert np.allclose(pol.slowdown(out, Replica(max_batch=1)), 1.0)   # nobody queued
    table = pol.bucket_summary(out, Replica(max_batch=1))
    assert table.requests.sum() == 200
    assert (table["mean slowdown"] == 1.0).all() and (table["max wait (s)"] == 0).all()


def test_failures_count_as_infinitely_late_and_as_misses():
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": 100,
                         "output_tokens": [200, 10, 10], "deadline_s": [100.0, 0.5, 100.0]})
    out = simulate(reqs, Replica(max_batch=1, shed_past_deadline=True), policy="edf")
    assert out.outcome.tolist() == ["done", "timed_out", "done"]
    assert np.isinf(pol.queue_wait_s(out)[1]) and np.isinf(pol.slowdown(out)[1])
    assert pol.deadline_miss_rate(out, reqs.deadline_s) == pytest.approx(1 / 3)
    summary = pol.latency_summary(out)
    assert np.isinf(summary["mean E2E (s)"]) and set(summary) >= {"p99.9 E2E (s)", "p99 TTFT (s)"}
    with pytest.raises(ValueError, match="deadline_s"):
        pol.deadline_miss_rate(out, [1.0])


# --------------------------------------------------------------------------- closed forms


def test_priority_waits_reduce_to_pollaczek_khinchine_and_conserve_work():
    rng = np.random.default_rng(3)
    s = rng.gamma(0.5, 4.0, 5000)
    lam = 0.8 / s.mean()
    fcfs = pol.priority_waits(lam, s, np.zeros(s.size))
    assert np.allclose(fcfs, MG1.from_service_times(lam, s).mean_wait)
    sjf = pol.priority_waits(lam, s, np.round(s, 1))
    assert sjf.mean() < fcfs.mean()
    # Kleinrock: the load-weighted wait is the same for every non-preemptive order
    assert np.mean(s * sjf) == pytest.approx(np.mean(s * fcfs), rel=1e-12)
    longest = sjf[np.argmax(s)]
    assert fcfs[0] < longest < fcfs[0] / (1 - 0.8) + 1e-9
    with pytest.raises(UnstableQueueError, match="rho"):
        pol.priority_waits(1.0 / s.mean(), s, np.zeros(s.size))
    with pytest.raises(ValueError, match="same length"):
        pol.priority_waits(lam, s, [0, 1])


def test_sjf_simulation_agrees_with_cobham():
    rng = np.random.default_rng(11)
    n = 40_000
    out_tokens = rng.choice([20, 100, 400], size=n, p=[0.5, 0.3, 0.2])
    service = (out_tokens - 1) * LOCKED.decode_step_at(1) + 100 / 8000    # one slot
    lam = 0.8 / service.mean()
    reqs = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / lam, n)),
                         "prompt_tokens": 100, "output_tokens": out_tokens})
    out = simulate(reqs, Replica(max_batch=1), policy="sjf")
    wait = pol.queue_wait_s(out)
    formula = pol.priority_waits(lam, service, out_tokens)
    for k in (20, 100, 400):
        m = out_tokens == k
        assert wait[m].mean() == pytest.approx(formula[m][0], rel=0.15)


def test_unfinished_work_and_busy_time_are_policy_invariant():
    # the one-slot M/G/1 of the seed's additive step, where service is a whole prompt
    # then its decodes (fused chunked steps make the work inside a service uneven)
    one = {"max_batch": 1, "mode": "combined", "step_cost": "additive"}
    reqs = pol.bootstrap_workload(mix(500), 1500, 0.85, Replica(**one), rng=4)
    reqs["deadline_s"] = pol.slo_deadlines(reqs, 1.0, 0.05)
    reqs["priority"] = np.arange(len(reqs)) % 3
    s = pol.unqueued_e2e_s(reqs, Replica(**one))
    work, busy = [], []
    for policy in ("fcfs", "sjf", "edf", "priority"):
        out, log = simulate(reqs, Replica(**one), policy=policy, step_log=True)
        work.append(pol.mean_unfinished_work_s(out, s))
        busy.append(pol.busy_time_s(out))
        assert busy[-1] == pytest.approx(log.duration_s.sum())
    assert np.allclose(work, work[0], rtol=1e-9) and np.allclose(busy, busy[0], rtol=1e-9)
    assert busy[0] == pytest.approx(s.sum())
    out, log = simulate(reqs, Replica(**one, preemptive=True), policy="srpt", step_log=True)
    assert pol.busy_time_s(out) == pytest.approx(log.duration_s.sum())
    assert pol.busy_time_s(out) > busy[0]                        # recompute is extra work
    with pytest.raises(ValueError, match="one value per request"):
        pol.mean_unfinished_work_s(out, s[:-1])


def test_busy_time_of_overlapping_intervals():
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0, 5.0, 5.5], "finish_s": [2.0, 3.0, 6.0, 5.8]})
    assert pol.busy_time_s(frame) == pytest.approx(3.0 + 1.0)
    with pytest.raises(ValueError, match="finish_s"):
        pol.busy_time_s(pd.DataFrame({"arrival_s": [1.0], "finish_s": [0.5]}))
