"""The iteration-level serving simulator: accounting, limits, closed-form agreement."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED, MG1, sim
from servingcap.llm import decode_step_time
from servingcap.serving import Replica, StepDetail, detailed, simulate


def poisson_requests(rate, n, seed, prompt=2000, outputs=(100, 500)):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
        "prompt_tokens": prompt,
        "output_tokens": rng.integers(outputs[0], outputs[1] + 1, n),
    })


STEP_S = 0.030
"""A constant decode step (s) for tests whose schedules are worked out by hand."""

SEED = {"mode": "combined", "step_cost": "additive"}
"""The seed essay's hybrid step: all decodes plus the prefill in one step, priced as a
decode step plus a prefill step (its conservative floor). Tests of the seed's worked
numbers (the 530 ms stall, C_max = 160) pass it explicitly; the default replica runs
fused mixed steps."""


def service_time(frame, replica=LOCKED):
    """One slot, no batching: prefill, then N - 1 decode steps at batch 1 (s), on the
    book's decode curve (the default replica's)."""
    return (frame.prompt_tokens / replica.prefill_rate
            + (frame.output_tokens - 1) * replica.decode_step_at(1)).to_numpy()


# --------------------------------------------------------------------------- accounting


def test_every_request_appears_once_with_an_outcome():
    reqs = poisson_requests(rate=8.0, n=3000, seed=1)
    out = simulate(reqs, Replica(max_queue=20, timeout_s=5.0), replicas=2)
    assert len(out) == len(reqs) and (out.index == reqs.index).all()
    counts = out.outcome.value_counts()
    assert counts.sum() == len(reqs)
    assert counts["done"] > 0 and counts["rejected"] > 0 and counts["timed_out"] > 0
    assert counts["unfinished"] == 0
    done = out[out.outcome == "done"]
    assert done[["first_token_s", "finish_s", "ttft_s", "e2e_s"]].notna().all().all()
    assert (done.finish_s >= done.first_token_s).all()
    assert (done.first_token_s >= done.admitted_s).all() and (done.admitted_s >= done.arrival_s).all()
    refused = out[out.outcome.isin(["rejected", "timed_out"])]
    assert refused.first_token_s.isna().all() and refused.finish_s.notna().all()
    rejected = out[out.outcome == "rejected"]
    assert np.allclose(rejected.finish_s, rejected.arrival_s)
    timed_out = out[out.outcome == "timed_out"]
    assert np.allclose(timed_out.finish_s - timed_out.arrival_s, 5.0)


def test_horizon_leaves_requests_unfinished_but_accounted():
    reqs = poisson_requests(rate=3.0, n=500, seed=2)
    out = simulate(reqs, Replica(), until_s=60.0)
    counts = out.outcome.value_counts()
    assert counts.sum() == len(reqs) and counts["unfinished"] > 0
    assert (out.loc[out.outcome == "done", "finish_s"] <= 60.0 + 1e-9).all()


# --------------------------------------------------------------------------- exact limits


def test_one_slot_waits_equal_the_fcfs_lindley_recursion_exactly():
    # With one slot the replica is a single FCFS server whose service time is
    # prefill + (N - 1) decode steps, so its waits must equal fcfs_waits to round-off.
    reqs = poisson_requests(rate=0.08, n=2000, seed=3)
    out = simulate(reqs, Replica(max_batch=1))
    expected = sim.fcfs_waits(reqs.arrival_s, service_time(reqs))
    assert np.allclose(out.admitted_s - out.arrival_s, expected, atol=1e-6)


def test_one_slot_agrees_with_pollaczek_khinchine():
    # Ten independent seeded replications at rho = 0.7; the replication means are iid, so
    # their standard error is std/sqrt(10). The closed form must lie within 4 standard
    # errors (a false alarm has probability < 1e-3 even with t(9) tails ~ 0.3 %), and the
    # standard error must be under 5 % of the answer so that the test has teeth.
    lo, hi = 100, 500
    outputs = np.arange(lo, hi + 1)
    services = 0.25 + (outputs - 1) * LOCKED.decode_step_at(1)     # one slot: batch 1
    mean_s, cv = services.mean(), services.std() / services.mean()
    rate = 0.7 / mean_s
    theory = MG1(rate, mean_s, cv).mean_wait
    means = []
    for seed in range(10):
        reqs = poisson_requests(rate, 6000, seed=100 + seed, outputs=(lo, hi))
        out = simulate(reqs, Replica(max_batch=1))
        means.append((out.admitted_s - out.arrival_s).to_numpy()[500:].mean())
    se = np.std(means, ddof=1) / math.sqrt(len(means))
    assert se < 0.05 * theory
    assert abs(np.mean(means) - theory) < 4 * se


def test_unperturbed_request_has_constant_tpot_and_phase_arithmetic():
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [2000], "output_tokens": [300]})
    out = simulate(reqs, Replica(**SEED)).iloc[0]
    alone = LOCKED.decode_step_at(1)              # a batch of one on the book's curve
    assert out.ttft_s == pytest.approx(LOCKED.prefill_s, abs=1e-12)
    assert out.tpot_s == pytest.approx(alone, abs=1e-12)
    assert out.max_gap_s == pytest.approx(alone, abs=1e-12)
    assert out.e2e_s == pytest.approx(LOCKED.prefill_s + 299 * alone, abs=1e-9)  # 3.43 s
    # with a constant step the same request is the seed's 0.25 s + 299 x 30 ms = 9.22 s
    flat = simulate(reqs, Replica(decode_step_s=LOCKED.decode_step_s, **SEED)).iloc[0]
    assert flat.e2e_s == pytest.approx(LOCKED.e2e_s, abs=1e-9)


def test_token_cap_follows_the_mode_through_replace():
    # the cap is computed once per Replica (the engine asks for it every step); a
    # dataclasses.replace that changes mode or max_batched_tokens must recompute it
    mixed = Replica()
    assert mixed.token_cap() == LOCKED.token_budget
    assert dataclasses.replace(mixed, max_batched_tokens=512).token_cap() == 512
    assert dataclasses.replace(mixed, mode="combined").token_cap() == math.inf
    assert dataclasses.replace(mixed, mode="prefill_first").token_cap() == math.inf


def test_lone_request_on_the_default_fused_mixed_replica():
    # Alone, the 2,000-token prompt is prefilled in 240-token chunks (the book's token
    # budget): eight fused steps of max(10 ms, 240 / 8,000 s) = 30 ms and an 80-token
    # last chunk at the ridge, max(10 ms, 80 / 8,000 s) = 10 ms: TTFT 0.25 s, the
    # additive prefill time, because every chunk sits at or above the compute ridge.
    assert Replica().token_cap() == LOCKED.token_budget == 240
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [2000], "output_tokens": [300]})
    out = simulate(reqs, Replica()).iloc[0]
    assert out.ttft_s == pytest.approx(8 * 0.030 + 0.010, abs=1e-12)
    assert out.tpot_s == pytest.approx(LOCKED.decode_step_at(1), abs=1e-12)
    # a 50-token prompt sits below the 80-token ridge: it rides one weight read,
    # 10 ms, not 50 / 8,000 s = 6.25 ms
    short = simulate(reqs.assign(prompt_tokens=50), Replica()).iloc[0]
    assert short.ttft_s == pytest.approx(LOCKED.weight_read_s, abs=1e-12)


def _interference_workload():
    """32 sequences decoding, then a 4,000-token prompt arrives."""
    decoders = pd.DataFrame({"arrival_s": np.zeros(32), "prompt_tokens": 100, "output_tokens": 300})
    long = pd.DataFrame({"arrival_s": [1.0], "prompt_tokens": [4000], "output_tokens": [50]})
    return pd.concat([decoders, long], ignore_index=True)


def test_unchunked_prefill_stalls_every_decoder_530_ms():
    reqs = _interference_workload()
    out = simulate(reqs, Replica(max_batch=33, **SEED))
    victims = out.iloc[:32]
    assert np.allclose(victims.max_gap_s, 0.030 + 4000 / 8000)         # the 530 ms step


def test_chunked_prefill_keeps_gaps_within_budget_and_costs_ttft():
    c_max = round((0.050 - 0.030) * 8000)                                # 160 tokens
    reqs = _interference_workload()
    out = simulate(reqs, Replica(max_batch=33, chunk_tokens=c_max, **SEED))
    assert out.iloc[:32].max_gap_s.max() == pytest.approx(0.050, abs=1e-12)
    # 25 chunks of 160 tokens, each in a 50 ms step; arrival lands mid-step and waits
    # for the boundary, so TTFT is 1.25 s plus less than one 30 ms step.
    ttft = out.iloc[32].ttft_s
    assert 1.25 - 1e-9 <= ttft < 1.25 + 0.030


def test_fused_mixed_steps_keep_gaps_within_budget_and_meet_ttft():
    # The default replica: a 240-token budget leaves the 4,000-token prompt 208 tokens
    # beside 32 decodes, a fused step of 20 ms (the decodes' per-sequence part) plus
    # max(10 ms, 240 / 8,000 s) = 50 ms; 19 such steps and a 48-token last chunk
    # (80 tokens in all: at the ridge, 20 + 10 = 30 ms): TTFT 0.98 s plus less than one
    # 30 ms step of waiting for the boundary. The additive floor needed 1.25 s.
    reqs = _interference_workload()
    out = simulate(reqs, Replica(max_batch=33))
    assert out.iloc[:32].max_gap_s.max() == pytest.approx(0.050, abs=1e-12)
    ttft = out.iloc[32].ttft_s
    assert 0.98 - 1e-9 <= ttft < 0.98 + 0.030


MODE_OPTIONS = {
    "combined": {"mode": "combined", "chunk_tokens": 512},
    "prefill_first": {"mode": "prefill_first", "max_batched_tokens": 4096},
    "mixed": {"mode": "mixed", "max_batched_tokens": 512},
}


@pytest.mark.parametrize("mode", list(MODE_OPTIONS))
@pytest.mark.parametrize("router, options", [
    ("oracle_work", {}),
    ("jsq", {}),
    ("least_requests", {}),
    ("endpoint_picker", {"kv_capacity_tokens": 40_000}),
    ("cache_aware", {}),
    ("kv_cost", {"kv_capacity_tokens": 40_000}),
    ("power_of_two", {}),
    ("affinity", {}),
    ("random", {}),
    ("pooled", {}),
    ("oracle_work", {"preemptive": True, "max_batch": 8}),
    ("jsq", {"kv_capacity_tokens": 40_000, "max_queue": 6}),
    ("round_robin", {"kv_capacity_tokens": 40_000, "max_queue": 6}),
])
def test_multi_step_jump_matches_step_by_step(router, options, mode):
    # A user cost model disables the identical-step shortcut; with the same arithmetic as
    # the default, every per-request time must agree, in every scheduling mode.
    def same_cost(prefill_tokens, decode_batch, context_tokens):
        return (0.030 if decode_batch else 0.0) + prefill_tokens / 8000

    reqs = poisson_requests(rate=4.0, n=400, seed=4)
    policy = "srpt" if options.get("preemptive") else "fcfs"
    options = {**options, **MODE_OPTIONS[mode]}
    fast, log_fast = simulate(reqs, Replica(decode_step_s=STEP_S, step_cost="additive",
                                            **options), replicas=2,
                              router=router, policy=policy, seed=3, step_log=True)
    slow, log_slow = simulate(reqs, Replica(step_time=same_cost, **options),
                              replicas=2, router=router, policy=policy, seed=3, step_log=True)
    assert (fast.outcome == slow.outcome).all() and (fast.replica == slow.replica).all()
    cols = ["admitted_s", "first_token_s", "finish_s", "max_gap_s"]
    assert np.allclose(fast[cols].to_numpy(), slow[cols].to_numpy(), equal_nan=True, atol=1e-9)
    assert len(log_fast) == len(log_slow)
    for column in ("start_s", "duration_s", "decode_batch", "prefill_tokens", "running", "kv_tokens"):
        assert np.allclose(log_fast[column], log_slow[column], atol=1e-9), column


def test_littles_law_at_the_admitted_sequence_boundary():
    # L from the engine's own step log (time-weighted running count) against
    # throughput x mean residence (admission to finish); the window is the whole run,
    # which starts and ends empty, so the identity is exact up to step granularity.
    reqs = poisson_requests(rate=3.0, n=2000, seed=5)
    out, log = simulate(reqs, Replica(max_batched_tokens=256 + 32), step_log=True)
    end = float(out.finish_s.max())
    area = float((log.running * log.duration_s).sum())
    L_engine = area / end
    lam_W = len(out) / end * float((out.finish_s - out.admitted_s).mean())
    assert L_engine == pytest.approx(lam_W, rel=1e-6)
    L_direct = sim.time_average_in_system(out.admitted_s, out.finish_s, start=0.0, end=end)
    assert L_direct == pytest.approx(lam_W, rel=1e-9)


# --------------------------------------------------------------------------- memory


def test_kv_in_use_never_exceeds_capacity_and_preemption_is_counted():
    reqs = poisson_requests(rate=6.0, n=800, seed=6, prompt=1000, outputs=(200, 800))
    capacity = 24_000
    out, log = simulate(reqs, Replica(kv_capacity_tokens=capacity, kv_block_tokens=16),
                        step_log=True)
    assert (log.kv_tokens <= capacity).all()
    assert out.preemptions.sum() > 0
    assert (out.outcome == "done").all()
    preempted = out[out.preemptions > 0]
    # a preempted sequence recomputes, which shows as an inter-token gap longer than a step
    assert (preempted.max_gap_s > 0.030 + 1e-9).all()


def test_reserving_max_output_avoids_preemption():
    reqs = poisson_requests(rate=6.0, n=800, seed=6, prompt=1000, outputs=(200, 800))
    replica = Replica(kv_capacity_tokens=24_000, kv_reserve="max", max_output_tokens=800)
    out, log = simulate(reqs, replica, step_log=True)
    assert out.preemptions.sum() == 0
    assert (log.kv_tokens <= 24_000).all()
    # reserving 1,800 tokens per sequence admits at most 13 at once
    assert log.running.max() <= 24_000 // 1800


def test_request_larger_than_memory_is_an_error():
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [5000], "output_tokens": [10]})
    with pytest.raises(ValueError, match="kv_capacity_tokens=4000"):
        simulate(reqs, Replica(kv_capacity_tokens=4000))


def test_prefix_cache_skips_cached_blocks():
    reqs = pd.DataFrame({
        "arrival_s": [0.0, 10.0],
        "prompt_tokens": [2048, 2048],
        "output_tokens": [5, 5],
        "hash_ids": [[1, 2, 3, 4], [1, 2, 3, 9]],
    })
    out = simulate(reqs, Replica(prefix_cache_blocks=100, **SEED))
    assert list(out.cached_tokens) == [0, 3 * 512]
    assert out.ttft_s.iloc[1] == pytest.approx((2048 - 1536) / 8000)


# --------------------------------------------------------------------------- fleet and policy


def test_round_robin_and_random_routing():
    reqs = poisson_requests(rate=2.0, n=12, seed=7)
    out = simulate(reqs, Replica(), replicas=3, router="round_robin")
    assert list(out.replica) == [0, 1, 2] * 4
    a = simulate(reqs, Replica(), replicas=3, router="random", seed=11)
    b = simulate(reqs, Replica(), replicas=3, router="random", seed=11)
    assert list(a.replica) == list(b.replica) and set(a.replica) == {0, 1, 2}


def test_pooled_queue_is_never_worse_than_random_routing():
    reqs = poisson_requests(rate=6.0, n=3000, seed=8)
    replica = Replica(max_batch=8)
    pooled = simulate(reqs, replica, replicas=3, router="pooled")
    random = simulate(reqs, replica, replicas=3, router="random", seed=1)
    assert pooled.ttft_s.quantile(0.99) < random.ttft_s.quantile(0.99)


def test_sjf_serves_short_jobs_first():
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2, 0.3], "prompt_tokens": 100,
                         "output_tokens": [50, 400, 300, 10]})
    out = simulate(reqs, Replica(max_batch=1), policy="sjf")
    order = out.sort_values("admitted_s").index.tolist()
    assert order == [0, 3, 2, 1]


def test_edf_needs_deadlines_and_orders_by_them():
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": 100,
                         "output_tokens": [50, 50, 50]})
    with pytest.raises(ValueError, match="deadline_s"):
        simulate(reqs, Replica(max_batch=1), policy="edf")
    reqs["deadline_s"] = [100.0, 50.0, 10.0]
    out = simulate(reqs, Replica(max_batch=1), policy="edf")
    assert out.sort_values("admitted_s").index.tolist() == [0, 2, 1]


def test_priority_classes_and_deadline_shedding():
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": 100,
                         "output_tokens": [100, 100, 100], "priority": [1, 1, 0],
                         "deadline_s": [100.0, 2.0, 100.0]})
    out = simulate(reqs, Replica(max_batch=1, shed_past_deadline=True), policy="priority")
    assert list(out.outcome) == ["done", "timed_out", "done"]
    # the priority-0 request jumps the queue and starts when the first one finishes;
    # the late one is shed with its deadline as its finish time
    assert out.admitted_s[2] == pytest.approx(out.finish_s[0])
    assert out.finish_s[1] == pytest.approx(2.0)


# --------------------------------------------------------------------------- cost models


def test_decode_table_is_interpolated():
    replica = Replica(decode_step_s={16: 0.020, 32: 0.030, 64: 0.055})
    assert replica.decode_time(16) == pytest.approx(0.020)
    assert replica.decode_time(48) == pytest.approx(0.0425)
    assert replica.decode_time(0) == 0.0


def test_detailed_cost_model_sees_each_chunk_and_context():
    seen = []

    @detailed
    def cost(detail: StepDetail) -> float:
        seen.append(detail)
        return 0.01 + 1e-6 * detail.prefill_chunks.sum() + 1e-7 * detail.decode_context.sum()

    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [300], "output_tokens": [3]})
    simulate(reqs, Replica(chunk_tokens=128, step_time=cost, mode="combined"))
    assert [d.prefill_chunks.tolist() for d in seen[:3]] == [[128], [128], [44]]
    assert [d.prefill_cached.tolist() for d in seen[:3]] == [[0], [128], [256]]
    assert seen[3].decode_context.tolist() == [301]


@pytest.mark.parametrize("kwargs, match", [
    ({"prefill_rate": -1}, "prefill_rate"),
    ({"max_batch": 0}, "max_batch"),
    ({"chunk_tokens": 2.5, "mode": "combined"}, "chunk_tokens"),
    ({"kv_reserve": "some"}, "kv_reserve"),
    ({"decode_step_s": float("nan")}, "decode_step_s"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_bad_replica_parameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Replica(**kwargs)


def test_bad_requests_and_options_are_named():
    good = poisson_requests(1.0, 5, seed=9)
    with pytest.raises(ValueError, match="output_tokens"):
        simulate(good.drop(columns="output_tokens"))
    bad = good.copy()
    bad.loc[2, "prompt_tokens"] = -5
    with pytest.raises(ValueError, match="prompt_tokens"):
        simulate(bad)
    with pytest.raises(ValueError, match="router"):
        simulate(good, router="fastest")
    with pytest.raises(ValueError, match="policy"):
        simulate(good, policy="lifo")
    with pytest.raises(ValueError, match="replicas"):
        simulate(good, replicas=0)
    with pytest.raises(ValueError, match="max_output_tokens"):
        simulate(good, Replica(kv_capacity_tokens=10**6, kv_reserve="max"))
    with pytest.raises(ValueError, match="step_time .*lambda.* returned -1.0 for a step of"):
        simulate(good, Replica(step_time=lambda p, b, c: -1.0))


def test_preemptive_srpt_lets_a_short_request_displace_a_long_one():
    reqs = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": 100,
                         "output_tokens": [300, 10]})
    patient = simulate(reqs, Replica(max_batch=1, decode_step_s=STEP_S), policy="srpt")
    eager = simulate(reqs, Replica(max_batch=1, preemptive=True, decode_step_s=STEP_S),
                     policy="srpt")
    assert patient.admitted_s[1] > 8.0 and patient.preemptions.sum() == 0
    # the short one starts at the first step boundary after it arrives
    assert eager.admitted_s[1] < 1.0 + 0.030 + 1e-9
    assert eager.preemptions.tolist() == [1, 0]
    assert (eager.outcome == "done").all()
    # the long one is out for the short one's whole service (prefill + 9 decode steps),
    # then recomputes its prompt and generated tokens: one gap longer than all of that
    short_service = 100 / 8000 + 9 * 0.030
    assert eager.max_gap_s[0] > short_service


def test_tiered_queue_caps_and_prompt_length_limit():
    n = 60
    reqs = pd.DataFrame({"arrival_s": np.linspace(0, 1, n), "prompt_tokens": 500,
                         "output_tokens": 200, "priority": np.tile([0, 1], n // 2)})
    reqs.loc[5, "prompt_tokens"] = 9000
    out = simulate(reqs, Replica(max_batch=4, max_queue={0: 20, 1: 2}, max_prompt_tokens=8192),
                   policy="priority")
    assert out.outcome[5] == "rejected"
    rejected = out[out.outcome == "rejected"].drop(index=5)
    low = reqs.loc[rejected.index, "priority"]
    assert (low == 1).sum() > (low == 0).sum()
    assert out.outcome.value_counts().sum() == n
    with pytest.raises(ValueError, match="max_queue"):
        Replica(max_queue={0: -1})


def test_queue_cap_counts_only_requests_waiting_for_a_slot():
    one = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [100], "output_tokens": [10]})
    assert simulate(one, Replica(max_queue=0)).outcome.tolist() == ["done"]
    # two slots, cap 0: the first two fill the slots, the next two find none free
    four = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.01, 0.02], "prompt_tokens": 100,
                         "output_tokens": 50})
    out = simulate(four, Replica(max_batch=2, max_queue=0))
    assert out.outcome.tolist() == ["done", "done", "rejected", "rejected"]
    out = simulate(four, Replica(max_batch=2, max_queue=1))
    assert out.outcome.tolist() == ["done", "done", "done", "rejected"]


@pytest.mark.parametrize("replicas, router", [(1, "jsq"), (3, "jsq"), (3, "oracle_work"),
                                              (3, "round_robin"), (2, "pooled")])
def test_simultaneous_arrivals_share_their_first_step(replicas, router):
    # Eight requests arriving at the same instant on idle replicas all prefill in the
    # first step of their replica: one step of (total prompt) / prefill_rate, not a
    # lone first prefill followed by the rest.
    reqs = pd.DataFrame({"arrival_s": np.full(8, 5.0), "prompt_tokens": 800, "output_tokens": 20})
    out = simulate(reqs, Replica(**SEED), replicas=replicas, router=router)
    assert (out.admitted_s == 5.0).all()
    per_replica = out.groupby("replica").size()
    expected_ttft = out.replica.map(per_replica) * 800 / 8000
    assert np.allclose(out.ttft_s, expected_ttft)


# --------------------------------------------------------------------------- modes


def test_prefill_first_toy_schedule_by_hand():
    # 1,000 prompt tokens/s, 10 ms decode steps, at most 300 prompt tokens per step.
    # t=0     A (100 tokens) alone: prefill-only step of 0.1 s -> A's first token at 0.1.
    # t=0.1   B (200) and C (150) wait; B fits the cap, C would make 350 > 300, so the
    #         step prefills B only (0.2 s); A's decode waits -> B's first token at 0.3.
    # t=0.3   C prefills alone (0.15 s) -> 0.45; A still waits.
    # t=0.45  no prefill left: one decode step of A, B, C (10 ms) -> B, C finish at 0.46;
    #         A's second token comes 0.36 s after its first.
    # t=0.46  A's last decode step -> 0.47. D (400 tokens > cap) is rejected on arrival.
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.05, 0.05, 0.2],
                         "prompt_tokens": [100, 200, 150, 400],
                         "output_tokens": [3, 2, 2, 5]})
    replica = Replica(prefill_rate=1000, decode_step_s=0.010, max_batch=10,
                      mode="prefill_first", max_batched_tokens=300)
    out, log = simulate(reqs, replica, step_log=True)
    assert out.outcome.tolist() == ["done", "done", "done", "rejected"]
    assert out.admitted_s[:3].tolist() == pytest.approx([0.0, 0.1, 0.3])
    assert out.first_token_s[:3].tolist() == pytest.approx([0.1, 0.3, 0.45])
    assert out.finish_s[:3].tolist() == pytest.approx([0.47, 0.46, 0.46])
    assert out.max_gap_s[0] == pytest.approx(0.36)
    assert log.prefill_tokens.tolist() == [100, 200, 150, 0, 0]
    assert log.decode_batch.tolist() == [0, 0, 0, 3, 1]


def test_mixed_toy_schedule_by_hand():
    # Budget 100 tokens per step; decodes take one token each first, prompt chunks the rest.
    # t=0      A (150) admitted, takes 100; B (30) is not admitted: no budget left.
    # t=0.1    A's last 50 and B's 30 (80 tokens, 0.08 s) -> both first tokens at 0.18.
    # t=0.18   decodes A, B (2 tokens) + 98 of C (arrived 0.15, 200 tokens): 0.01 + 0.098
    #          -> 0.288; B finishes.
    # t=0.288  decode A + 99 of C: 0.109 s -> 0.397; A finishes.
    # t=0.397  C's last 3 tokens: 0.003 s -> C's first token at 0.400; one decode -> 0.410.
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.15], "prompt_tokens": [150, 30, 200],
                         "output_tokens": [3, 2, 2]})
    replica = Replica(prefill_rate=1000, decode_step_s=0.010, max_batch=10,
                      mode="mixed", max_batched_tokens=100, step_cost="additive")
    out, log = simulate(reqs, replica, step_log=True)
    assert out.admitted_s.tolist() == pytest.approx([0.0, 0.1, 0.18])
    assert out.first_token_s.tolist() == pytest.approx([0.18, 0.18, 0.400])
    assert out.finish_s.tolist() == pytest.approx([0.397, 0.288, 0.410])
    assert log.prefill_tokens.tolist() == [100, 80, 98, 99, 3, 0]
    assert log.decode_batch.tolist() == [0, 0, 2, 1, 0, 1]
    assert (log.prefill_tokens + log.decode_batch <= 100).all()


def test_fused_mixed_toy_schedule_by_hand():
    # The same requests on fused steps: weights read in w = 10 ms (a constant decode
    # step is all weight read), 1,000 tokens/s past the 10-token ridge, budget 100.
    # t=0      A takes 100 tokens: max(0.01, 0.1) = 0.1 s.
    # t=0.1    A's last 50 and B's 30: 80 tokens, 0.08 s -> both first tokens at 0.18.
    # t=0.18   2 decodes + 98 of C: max(0.01, 0.1) = 0.1 s (the decodes ride along:
    #          the additive step took 0.108 s) -> 0.28; B finishes.
    # t=0.28   A's decode + 99 of C: 0.1 s -> 0.38; A finishes.
    # t=0.38   C's last 3 tokens: below the ridge, 0.01 s -> 0.39; one decode -> 0.40.
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.0, 0.15], "prompt_tokens": [150, 30, 200],
                         "output_tokens": [3, 2, 2]})
    replica = Replica(prefill_rate=1000, decode_step_s=0.010, max_batch=10,
                      max_batched_tokens=100)
    out = simulate(reqs, replica)
    assert out.first_token_s.tolist() == pytest.approx([0.18, 0.18, 0.39])
    assert out.finish_s.tolist() == pytest.approx([0.38, 0.28, 0.40])


def test_mixed_budget_smaller_than_the_batch_is_refused():
    # vLLM refuses max_num_batched_tokens < max_num_seqs: a step must hold one token of
    # every decoding sequence
    with pytest.raises(ValueError, match="max_batched_tokens=2 is below max_batch=32"):
        Replica(max_batched_tokens=2)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "fifo"}, "mode"),
    ({"mode": "mixed", "max_batched_tokens": 16}, "max_batched_tokens=16 is below max_batch"),
    ({"mode": "mixed", "max_batched_tokens": 0}, "max_batched_tokens"),
    ({"mode": "prefill_first", "chunk_tokens": 512}, "chunk_tokens"),
    ({"chunk_tokens": 512}, "chunk_tokens"),
    ({"mode": "combined", "max_batched_tokens": 2048}, "max_batched_tokens"),
    ({"step_cost": "sum"}, "step_cost"),
    ({"weight_read_s": 0.0}, "weight_read_s"),
])
def test_bad_mode_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Replica(**kwargs)


def test_modes_agree_without_contention():
    # One request alone: no other work to wait for, so every mode gives the same times.
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [2000], "output_tokens": [300]})
    times = [simulate(reqs, Replica(**opts))[["first_token_s", "finish_s"]].to_numpy()
             for opts in ({}, {"mode": "prefill_first"},
                          {"mode": "mixed", "max_batched_tokens": 4096})]
    assert np.allclose(times[0], times[1]) and np.allclose(times[0], times[2])


# --------------------------------------------------------------------------- routers


def with_prefixes(reqs, groups, seed):
    """Give each request four 512-token blocks, the first shared within its group."""
    rng = np.random.default_rng(seed)
    first = rng.integers(groups, size=len(reqs))
    return reqs.assign(hash_ids=[[int(g), 10_000 + 4 * k, 10_001 + 4 * k, 10_002 + 4 * k]
                                 for k, g in enumerate(first)])


def test_affinity_with_prefix_cache_matches_step_by_step_and_raises_hits():
    def same_cost(prefill_tokens, decode_batch, context_tokens):
        return (0.030 if decode_batch else 0.0) + prefill_tokens / 8000

    # 12 prefix groups, caches of 16 blocks: a replica that sees every group evicts a
    # group's first block before it recurs more often than one that sees a third of them
    # (measured cached tokens: affinity 126,976, oracle_work 64,512).
    reqs = with_prefixes(poisson_requests(rate=4.0, n=400, seed=4, prompt=2048), 12, seed=1)
    spec = dict(prefix_cache_blocks=16, **SEED)
    fast = simulate(reqs, Replica(decode_step_s=STEP_S, **spec), replicas=3,
                    router="affinity")
    slow = simulate(reqs, Replica(step_time=same_cost, **spec), replicas=3, router="affinity")
    cols = ["admitted_s", "first_token_s", "finish_s", "max_gap_s"]
    assert (fast.replica == slow.replica).all()
    assert np.allclose(fast[cols].to_numpy(), slow[cols].to_numpy(), equal_nan=True, atol=1e-9)
    spread = simulate(reqs, Replica(decode_step_s=STEP_S, **spec), replicas=3,
                      router="oracle_work")
    assert fast.cached_tokens.sum() > 1.5 * spread.cached_tokens.sum()


def test_affinity_keeps_a_prefix_on_one_replica_until_the_load_bound():
    # Spaced arrivals with one shared first block all land on the same replica ...
    spaced = with_prefixes(pd.DataFrame({"arrival_s": 10.0 * np.arange(20), "prompt_tokens": 2048,
                                         "output_tokens": 5}), groups=1, seed=0)
    out = simulate(spaced, Replica(), replicas=4, router="affinity")
    assert out.replica.nunique() == 1
    # ... while a burst of them spreads: no replica holds more than
    # ceil(1.25 * (total + 1) / 4) outstanding requests when it is chosen.
    burst = spaced.assign(arrival_s=0.001 * np.arange(20))
    out = simulate(burst, Replica(), replicas=4, router="affinity")
    assert out.replica.nunique() == 4
    assert out.replica.value_counts().max() <= math.ceil(1.25 * 20 / 4)
    with pytest.raises(ValueError, match="affinity_bound"):
        simulate(burst, Replica(), replicas=4, router="affinity", affinity_bound=0.5)


def test_oracle_work_counts_work_and_least_requests_counts_requests():
    # A: a long job on replica 0; B: a tiny one on replica 1; C arrives next. Both
    # replicas hold one request, so least_requests breaks the tie to replica 0, while
    # oracle_work sees 1,000 + 100 tokens of work against 10 + 10 and picks replica 1.
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.001, 0.002], "prompt_tokens": [1000, 10, 10],
                         "output_tokens": [100, 10, 10]})
    assert simulate(reqs, Replica(), replicas=2, router="least_requests").replica.tolist() == [0, 1, 0]
    assert simulate(reqs, Replica(), replicas=2, router="oracle_work").replica.tolist() == [0, 1, 1]


def test_work_accounting_returns_to_zero(monkeypatch):
    # The work counters behind oracle_work must drain to exactly zero
    # through prefill chunks, prefix hits, repeated decode steps, preemption with
    # recompute and timeouts: a request arriving after everything finished sees zero.
    from servingcap import routers
    seen, signals = [], []
    init = routers.Router.__init__

    def spied_init(self, *args, **kwargs):       # spy on the picker simulate calls
        init(self, *args, **kwargs)              # (bound in __init__ for the hot ones)
        original = self.pick

        def spy(i):
            t = self.req.arrival[i]
            seen.append([e.work for e in self.engines])
            signals.append([(e.queue_depth(), e.running_requests(), e.kv_tokens(t),
                             e.pending_prefill(t), e.queued_tokens(),
                             e.active_prompt_blocks()) for e in self.engines])
            return original(i)
        self.pick = spy

    monkeypatch.setattr(routers.Router, "__init__", spied_init)
    reqs = with_prefixes(poisson_requests(rate=6.0, n=600, seed=6, prompt=1000,
                                          outputs=(200, 800)), 8, seed=2)
    late = pd.DataFrame({"arrival_s": [10_000.0], "prompt_tokens": [10], "output_tokens": [2],
                         "hash_ids": [[99]]})
    reqs = pd.concat([reqs, late], ignore_index=True)
    spec = Replica(kv_capacity_tokens=24_000, chunk_tokens=256, timeout_s=20.0,
                   prefix_cache_blocks=16, mode="combined")
    out = simulate(reqs, spec, replicas=2, router="oracle_work")
    assert out.preemptions.sum() > 0 and (out.outcome == "timed_out").any()
    assert out.cached_tokens.sum() > 0
    assert min(min(w) for w in seen) >= 0
    assert seen[-1] == [0, 0]
    # so do the gateway signals (and they move in between)
    assert signals[-1] == [(0,) * 6] * 2
    assert max(s[2] for row in signals for s in row) > 0


def test_power_of_two_is_seeded_and_balances_requests():
    reqs = poisson_requests(rate=8.0, n=2000, seed=10)
    a = simulate(reqs, Replica(), replicas=6, router="power_of_two", seed=5)
    b = simulate(reqs, Replica(), replicas=6, router="power_of_two", seed=5)
    c = simulate(reqs, Replica(), replicas=6, router="power_of_two", seed=6)
    assert a.replica.tolist() == b.replica.tolist() != c.replica.tolist()
    rand = simulate(reqs, Replica(), replicas=6, router="random", seed=5)
    # it counts requests, so on these identical requests (2,000 / 300 tokens) its TTFT
    # p99 carries the cohort prefills of a count router (0.96 s, random's too); the
    # balancing shows in smaller batches, so faster decodes: mean e2e 7.60 s against
    # random's 8.41 s (measured, deterministic seeded runs)
    assert a.e2e_s.mean() < 0.95 * rand.e2e_s.mean()


def test_request_count_router_synchronizes_equal_length_cohorts():
    # The book's locked workload (2,000-token prompts, exactly 300 output tokens) on six
    # replicas at 8 req/s. Counting requests, an emptied replica takes every arrival
    # until its count catches up, so cohorts form and their prompts are prefilled six at
    # a time (12,000 tokens, 1.5 s); p99 TTFT grows along the run. Counting work, every
    # step holds at most one prompt and p99 TTFT stays put. (Deterministic seeded run;
    # measured p99 by thirds: least_requests 0.78 / 1.05 / 1.39 s, oracle_work
    # 0.38 / 0.45 / 0.44 s.)
    rng = np.random.default_rng(1)
    reqs = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 8.0, 4000)),
                         "prompt_tokens": 2000, "output_tokens": 300})
    thirds = np.arange(len(reqs)) * 3 // len(reqs)
    p99 = {}
    for router in ("least_requests", "oracle_work"):
        out, log = simulate(reqs, Replica(decode_step_s=STEP_S, **SEED), replicas=6,
                            router=router, step_log=True)
        p99[router] = out.ttft_s.groupby(thirds).quantile(0.99).to_numpy()
        p99[router + " prefill"] = log.prefill_tokens.max()
    assert p99["least_requests prefill"] >= 5 * 2000 and p99["oracle_work prefill"] == 2000
    assert p99["least_requests"][2] > 1.3 * p99["least_requests"][0]
    assert (p99["least_requests"] > 1.5 * p99["oracle_work"]).all()


def test_a_rejected_last_simultaneous_arrival_still_wakes_the_replica():
    # Six tiny prompts and one too long for the step cap arrive together: the rejected
    # one came last, and the other six must still be served (they were left waiting
    # on an idle replica, "unfinished", before the fix).
    reqs = pd.DataFrame({"arrival_s": [0.0] * 7, "prompt_tokens": [1] * 6 + [257],
                         "output_tokens": [1] * 7})
    spec = Replica(mode="prefill_first", max_batch=1, max_batched_tokens=256)
    assert simulate(reqs, spec).outcome.tolist() == ["done"] * 6 + ["rejected"]
    capped = Replica(max_batch=1, max_queue=2)           # the queue cap rejects the last
    out = simulate(reqs.assign(prompt_tokens=100), capped)
    assert out.outcome.tolist() == ["done"] * 3 + ["rejected"] * 4


def test_a_decode_table_is_extended_past_its_last_point_and_held_below_its_first():
    # the book's curve: 30 ms at 32, 55 ms at 64, so 0.78125 ms per extra sequence past 64
    book = Replica()
    assert book.decode_time(96) == pytest.approx(0.055 + 32 * 0.025 / 32)      # 80 ms
    assert book.decode_time(96) == pytest.approx(LOCKED.decode_step_at(96))
    assert book.decode_time(96) == pytest.approx(decode_step_time(96, LOCKED.decode_step_table))
    own = Replica(decode_step_s={16: 0.020, 32: 0.030})
    assert own.decode_time(1) == 0.020 and own.decode_time(64) == pytest.approx(0.050)
    flat_then_cheaper = Replica(decode_step_s={16: 0.030, 32: 0.020})
    assert flat_then_cheaper.decode_time(64) == 0.020    # a falling last segment is held


@pytest.mark.parametrize("decode", [{"a": 1}, lambda b: "x", lambda b: None])
def test_decode_step_s_that_is_not_seconds_is_named(decode):
    # found by fuzzing: a table keyed by text, or a function returning text or None,
    # used to fail with float()'s own message, which names no parameter
    with pytest.raises(ValueError, match="decode_step_s"):
        simulate(poisson_requests(2.0, 5, seed=0), Replica(decode_step_s=decode))


def test_whole_number_fields_given_as_floats_are_stored_as_int_and_run_the_same():
    # 256.0 passed validation but stayed a float, and the fast engine's range() over it
    # raised TypeError; the replica now stores the int, so both spellings run identically
    reqs = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [600, 300, 50],
                         "output_tokens": [5, 3, 2]})
    for floats, ints in (({"mode": "combined", "step_cost": "additive",
                           "chunk_tokens": 256.0}, {"chunk_tokens": 256}),
                         ({"max_batched_tokens": 300.0, "max_batch": 8.0},
                          {"max_batched_tokens": 300, "max_batch": 8})):
        rep = Replica(**floats)
        for name, value in ints.items():
            assert type(getattr(rep, name)) is int and getattr(rep, name) == value
        assert simulate(reqs, rep).equals(simulate(reqs, Replica(**{**floats, **ints})))
