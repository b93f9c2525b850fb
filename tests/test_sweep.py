"""servingcap.sweep: request streams, sweep tables and the TTFT / TPOT breakdowns."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED
from servingcap.llm import amortized_stall_s
from servingcap.serving import Replica, simulate
from servingcap.sweep import (
    first_crossing,
    poisson_requests,
    summarize,
    sweep,
    tpot_parts,
    ttft_parts,
)

TABLE = {1: 0.010625, 16: 0.020, 32: 0.030, 64: 0.055}


def single_request():
    return pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [LOCKED.prompt_tokens],
                         "output_tokens": [LOCKED.output_tokens]})


# --------------------------------------------------------------------------- requests


def test_poisson_requests_rate_and_common_random_numbers():
    slow = poisson_requests(1.0, 20_000, seed=7)
    fast = poisson_requests(4.0, 20_000, seed=7)
    assert list(slow.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert np.allclose(fast.arrival_s * 4.0, slow.arrival_s)          # same pattern, scaled
    assert (slow.arrival_s.diff().dropna() >= 0).all()
    assert 20_000 / slow.arrival_s.iloc[-1] == pytest.approx(1.0, rel=0.03)
    assert (slow.prompt_tokens == LOCKED.prompt_tokens).all()
    assert (slow.output_tokens == LOCKED.output_tokens).all()


def test_poisson_requests_per_request_lengths_and_validation():
    frame = poisson_requests(2.0, 3, seed=1, prompt_tokens=[10, 20, 30], output_tokens=5)
    assert frame.prompt_tokens.tolist() == [10, 20, 30]
    with pytest.raises(ValueError, match="rate"):
        poisson_requests(-1.0, 3, seed=1)
    with pytest.raises(ValueError, match="n"):
        poisson_requests(1.0, 0, seed=1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        poisson_requests(1.0, 3, seed=1, prompt_tokens=[1, 2])
    with pytest.raises(ValueError, match="output_tokens"):
        poisson_requests(1.0, 2, seed=1, output_tokens=[1.5, 2])


# --------------------------------------------------------------------------- summaries


def test_summarize_light_load_matches_the_unqueued_request():
    # At a very low rate no request meets another: TTFT is the prefill, TPOT the B=1 step.
    reqs = poisson_requests(0.01, 200, seed=3)
    result = simulate(reqs, Replica(decode_step_s=TABLE), step_log=True)
    s = summarize(result, warmup_fraction=0.0)
    assert s["requests"] == 200
    assert s["ttft_p50_s"] == pytest.approx(LOCKED.prefill_s)
    assert s["tpot_p50_s"] == pytest.approx(TABLE[1])
    assert s["queue_p99_s"] == pytest.approx(0.0)
    assert s["attainment"] == 1.0
    assert 0.0 < s["mean_batch"] <= 1.0
    assert s["goodput_rps"] == pytest.approx(s["throughput_rps"])


def test_summarize_overload_reports_service_rate_and_validates():
    # Saturated at max_batch 32: completions per second approach the service capacity
    # 1 / (t_prefill + (N - 1) * step(32) / 32), not the arrival rate.
    # (the seed's additive combined step, the model this capacity is written for)
    capacity = 1 / (LOCKED.prefill_s + (LOCKED.output_tokens - 1) * TABLE[32] / 32)
    reqs = poisson_requests(3.0, 3000, seed=4)
    s = summarize(simulate(reqs, Replica(decode_step_s=TABLE, mode="combined",
                                         step_cost="additive")), warmup_fraction=0.0)
    assert s["throughput_rps"] == pytest.approx(capacity, rel=0.03)
    assert s["ttft_p99_s"] > 100 * LOCKED.ttft_slo_s
    with pytest.raises(ValueError, match="warmup_fraction"):
        summarize(simulate(single_request()), warmup_fraction=1.0)
    with pytest.raises(ValueError, match="at least 2"):
        summarize(simulate(single_request()))


def test_sweep_builds_one_row_per_value():
    reqs = poisson_requests(0.5, 300, seed=5)
    table = sweep([8, 32], lambda b: simulate(reqs, Replica(max_batch=b), step_log=True),
                  name="max_batch")
    assert table.index.name == "max_batch" and table.index.tolist() == [8, 32]
    assert {"ttft_p99_s", "tpot_p99_s", "goodput_rps", "mean_batch"} <= set(table.columns)
    with pytest.raises(ValueError, match="values"):
        sweep([], lambda b: None, name="x")
    with pytest.raises(ValueError, match="name"):
        sweep([1], lambda b: None, name="")


# --------------------------------------------------------------------------- breakdowns


def test_breakdowns_of_the_unqueued_request():
    out, log = simulate(single_request(), Replica(), step_log=True)
    tt = ttft_parts(out, Replica()).iloc[0]
    assert tt.queue_s == 0.0 and tt.prefill_s == pytest.approx(0.25)
    assert tt.shared_s == pytest.approx(0.0)
    tp = tpot_parts(out, log, Replica()).iloc[0]
    assert tp.stall_s == 0.0 and tp.mean_batch == 1.0
    assert tp.decode_s == pytest.approx(LOCKED.decode_step_at(1))    # batch 1 on the curve


def test_parts_add_up_and_decode_part_is_the_step_curve():
    replica = Replica(decode_step_s=TABLE)
    reqs = poisson_requests(1.5, 1500, seed=6)
    out, log = simulate(reqs, replica, step_log=True)
    tt = ttft_parts(out, replica)
    assert np.allclose(tt.queue_s + tt.prefill_s + tt.shared_s, tt.ttft_s)
    assert (tt.queue_s >= 0).all() and (tt.shared_s >= -1e-12).all()
    tp = tpot_parts(out, log, replica)
    assert np.allclose(tp.decode_s + tp.stall_s, out.tpot_s)
    # independent check on a few requests: mean decode step time over the steps it ran in
    for i in (100, 700, 1400):
        r = out.iloc[i]
        mine = log[(log.start_s >= r.first_token_s - 1e-9) & (log.start_s < r.finish_s - 1e-9)]
        assert len(mine) == r.output_tokens - 1
        expected = np.mean([replica.decode_time(b) for b in mine.decode_batch])
        assert tp.decode_s.iloc[i] == pytest.approx(expected, rel=1e-9)
        assert tp.mean_batch.iloc[i] == pytest.approx(mine.decode_batch.mean())


def test_stall_of_one_long_prefill_is_the_amortized_stall_on_several_replicas():
    # 32 decoders per replica on two replicas, then one 4,000-token prompt lands on replica 0:
    # its victims' TPOT carries 0.5 s / 299 tokens of stall, the other replica's none.
    decoders = pd.DataFrame({"arrival_s": np.zeros(64), "prompt_tokens": 100,
                             "output_tokens": 300})
    long = pd.DataFrame({"arrival_s": [1.0], "prompt_tokens": [4000], "output_tokens": [50]})
    reqs = pd.concat([decoders, long], ignore_index=True)
    # the seed's additive combined step, where the whole prefill is the stall
    replica = Replica(max_batch=33, mode="combined", step_cost="additive")
    out, log = simulate(reqs, replica, replicas=2, router="round_robin", step_log=True)
    tp = tpot_parts(out, log, replica)
    victims = (out.replica == out.replica.iloc[64]) & (out.index < 64)
    spared = (out.replica != out.replica.iloc[64]) & (out.index < 64)
    assert victims.sum() == 32 and spared.sum() == 32
    # Without the long prompt, the stalls left are the decoders' own prefills (the first
    # decoder on each replica starts alone and sees the other 31 prefill after it).
    base_out, base_log = simulate(decoders, replica, replicas=2, router="round_robin",
                                  step_log=True)
    base = tpot_parts(base_out, base_log, replica).stall_s
    extra = tp.stall_s.iloc[:64] - base
    assert np.allclose(extra[victims.iloc[:64]], amortized_stall_s(4000, 8000, 299))
    assert np.allclose(extra[spared.iloc[:64]], 0.0)


def test_breakdowns_refuse_a_custom_cost_model():
    custom = Replica(step_time=lambda p, b, c: 0.03)
    out, log = simulate(single_request(), custom, step_log=True)
    with pytest.raises(ValueError, match="step_time"):
        ttft_parts(out, custom)
    with pytest.raises(ValueError, match="step_time"):
        tpot_parts(out, log, custom)
    with pytest.raises(ValueError, match="missing"):
        tpot_parts(out.drop(columns="replica"), log, Replica())


# --------------------------------------------------------------------------- crossings


def test_first_crossing():
    assert first_crossing([1, 2, 3], [0.5, 0.9, 1.3], 1.0) == pytest.approx(2.25)
    assert first_crossing([1, 2, 3], [0.5, 0.6, 0.7], 1.0) is None
    assert first_crossing([1, 2, 3], [2.0, 3.0, 4.0], 1.0) == 1.0
    assert first_crossing([1, 2, 3], [0.5, np.inf, np.inf], 1.0) == 2.0
    with pytest.raises(ValueError, match="increasing"):
        first_crossing([2, 1], [0, 1], 0.5)
    with pytest.raises(ValueError, match="same length"):
        first_crossing([1, 2], [0.0], 0.5)


def test_replica_replace_keeps_the_cost_model():
    base = Replica(decode_step_s=TABLE)
    bigger = dataclasses.replace(base, max_batch=64)
    assert bigger.decode_time(64) == pytest.approx(0.055) and bigger.max_batch == 64
