"""Disaggregated prefill/decode: accounting, phase arithmetic, transfer cost, isolation."""

import math

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED
from servingcap.disagg import (
    decode_pool_replica,
    kv_bytes_per_token,
    kv_transfer_s,
    simulate_disaggregated,
)
from servingcap.serving import OUTCOMES, Replica, StepDetail, simulate


def poisson_requests(rate, n, seed, prompts=(200, 4000), outputs=(1, 400)):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
        "prompt_tokens": rng.integers(prompts[0], prompts[1] + 1, n),
        "output_tokens": rng.integers(outputs[0], outputs[1] + 1, n),
    })


def spaced(prompts, outputs, gap_s=100.0):
    """Requests far enough apart that none ever waits for another."""
    return pd.DataFrame({"arrival_s": gap_s * np.arange(len(prompts)),
                         "prompt_tokens": prompts, "output_tokens": outputs})


# --------------------------------------------------------------------------- accounting


def test_every_request_appears_once_with_an_outcome():
    reqs = poisson_requests(rate=6.0, n=1500, seed=1)
    reqs.index = reqs.index + 1000                     # output keeps the caller's index
    out = simulate_disaggregated(reqs, Replica(max_queue=5), Replica(),
                                 prefill_replicas=1, decode_replicas=2,
                                 kv_bytes_per_token=131_072, link_bytes_per_s=12.5e9)
    assert len(out) == len(reqs) and (out.index == reqs.index).all()
    assert set(out.outcome.astype(str)) <= set(OUTCOMES)
    counts = out.outcome.value_counts()
    assert counts.sum() == len(reqs) and counts["rejected"] > 0 and counts["done"] > 0
    assert counts["unfinished"] == 0
    rejected = out[out.outcome == "rejected"]
    assert (rejected.replica == -1).all() and rejected.transfer_s.isna().all()
    assert rejected.first_token_s.isna().all() and rejected.decode_arrival_s.isna().all()
    done = out[out.outcome == "done"]
    assert (done.first_token_s >= done.admitted_s).all()
    assert (done.admitted_s >= done.arrival_s).all()
    assert (done.finish_s >= done.first_token_s).all()
    assert np.allclose(done.e2e_s, done.finish_s - done.arrival_s)
    many = done[done.output_tokens > 1]
    assert (many.replica >= 0).all() and (many.decode_arrival_s >= many.first_token_s).all()
    assert np.allclose(many.tpot_s, (many.finish_s - many.first_token_s) / (many.output_tokens - 1))
    one = done[done.output_tokens == 1]
    assert len(one) > 0 and (one.replica == -1).all() and one.tpot_s.isna().all()
    assert np.allclose(one.finish_s, one.first_token_s)


def test_horizon_leaves_requests_unfinished_but_accounted():
    reqs = poisson_requests(rate=4.0, n=400, seed=2)
    out = simulate_disaggregated(reqs, decode_replicas=2, until_s=40.0)
    counts = out.outcome.value_counts()
    assert counts.sum() == len(reqs) and counts["unfinished"] > 0
    assert (out.loc[out.outcome == "done", "finish_s"] <= 40.0 + 1e-9).all()


# --------------------------------------------------------------------------- phase arithmetic


def test_free_transfer_and_ample_capacity_gives_ttft_equal_to_prefill_time():
    prompts = [1, 500, 2000, 4000, 14_000]
    reqs = spaced(prompts, [300] * len(prompts))
    out = simulate_disaggregated(reqs, prefill_replicas=3, decode_replicas=3)
    # the prefill pool runs whole prompts, one fused pass each: at least one weight read
    # (10 ms), else prompt / prefill rate
    whole = np.maximum(LOCKED.weight_read_s, np.array(prompts) / LOCKED.prefill_rate)
    assert np.allclose(out.ttft_s, whole, rtol=0, atol=1e-12)
    assert np.allclose(out.transfer_s, 0.0)
    # every decode-pool step is a plain decode step of a batch of one
    assert np.allclose(out.tpot_s, LOCKED.decode_step_at(1), atol=1e-12)
    assert np.allclose(out.max_gap_s, LOCKED.decode_step_at(1), atol=1e-12)


def test_isolated_request_reproduces_the_locked_e2e():
    reqs = spaced([LOCKED.prompt_tokens], [LOCKED.output_tokens])
    row = simulate_disaggregated(reqs).iloc[0]
    assert row.ttft_s == pytest.approx(LOCKED.prefill_s, abs=1e-12)          # 0.25 s
    alone = LOCKED.prefill_s + 299 * LOCKED.decode_step_at(1)                  # 3.43 s
    assert row.e2e_s == pytest.approx(alone, abs=1e-9)


def test_transfer_delays_the_second_token_by_exactly_the_transfer():
    link = 12.5e9
    width = kv_bytes_per_token(32, 8, 128)
    reqs = spaced([4000], [300])
    row = simulate_disaggregated(reqs, kv_bytes_per_token=width, link_bytes_per_s=link,
                                 link_latency_s=0.002).iloc[0]
    transfer = 0.002 + 4000 * width / link
    assert row.transfer_s == pytest.approx(transfer, rel=1e-12)
    step = LOCKED.decode_step_at(1)              # alone in the decode pool: a batch of one
    assert row.max_gap_s == pytest.approx(transfer + step, rel=1e-9)
    assert row.e2e_s == pytest.approx(0.5 + transfer + 299 * step, rel=1e-9)


def test_a_long_prompt_never_stalls_the_decode_pool():
    decoders = pd.DataFrame({"arrival_s": np.zeros(32), "prompt_tokens": 100, "output_tokens": 300})
    long = pd.DataFrame({"arrival_s": [1.0], "prompt_tokens": [4000], "output_tokens": [300]})
    reqs = pd.concat([decoders, long], ignore_index=True)
    seed = simulate(reqs, Replica(max_batch=33, mode="combined", step_cost="additive"))
    assert seed.iloc[:32].max_gap_s.max() == pytest.approx(0.530, abs=1e-9)
    fused = simulate(reqs, Replica(max_batch=33))          # chunked mixed steps stay at 50 ms
    assert fused.iloc[:32].max_gap_s.max() == pytest.approx(0.050, abs=1e-9)
    split = simulate_disaggregated(reqs, decode_replica=Replica(max_batch=33))
    alone = simulate_disaggregated(decoders, decode_replica=Replica(max_batch=33))
    # the decoders' gaps (at most a boundary wait plus one step) do not see the long
    # prompt; the only difference is the newcomer in the batch (a step at 33, not 32)
    newcomer = LOCKED.decode_step_at(33) - LOCKED.decode_step_at(32)
    assert (split.iloc[:32].max_gap_s <= alone.max_gap_s + newcomer + 1e-12).all()
    assert split.iloc[:32].max_gap_s.max() < 2 * LOCKED.decode_step_s
    assert split.iloc[32].ttft_s == pytest.approx(0.5, abs=1e-9)


def test_decode_pool_counts_newcomers_in_the_batch():
    table = {1: 0.010, 33: 0.040}
    pool = decode_pool_replica(Replica(decode_step_s=table, chunk_tokens=160, mode="combined"))
    assert pool.chunk_tokens is None
    detail = StepDetail(prefill_chunks=np.array([4000]), prefill_cached=np.array([0]),
                        decode_context=np.full(32, 150))
    assert pool.cost(detail) == pytest.approx(0.040)          # 33 sequences, no prefill cost
    custom = decode_pool_replica(Replica(step_time=lambda p, b, ctx: 0.001 * b + 1e-6 * ctx + p))
    # contexts count the whole request: the decode pool's run starts after the first token
    assert custom.cost(detail) == pytest.approx(0.033 + 1e-6 * (32 * 151 + 4001))


# --------------------------------------------------------------------------- transfer helpers


def test_kv_size_and_transfer_arithmetic():
    assert kv_bytes_per_token(32, 8, 128) == 131_072
    assert kv_bytes_per_token(80, 8, 128, bytes_per_value=1) == 163_840
    assert kv_transfer_s(4000, 131_072, 12.5e9) == pytest.approx(0.04194304)
    assert kv_transfer_s(4000, 131_072, math.inf, 0.001) == pytest.approx(0.001)
    got = kv_transfer_s(np.array([0, 1000]), 100.0, 1e5)
    assert np.allclose(got, [0.0, 1.0])


@pytest.mark.parametrize("kwargs, name", [
    (dict(kv_bytes_per_token=-1.0), "kv_bytes_per_token"),
    (dict(link_bytes_per_s=0.0), "link_bytes_per_s"),
    (dict(link_latency_s=float("nan")), "link_latency_s"),
    (dict(prefill_replicas=0), "prefill_replicas"),
    (dict(decode_replicas=1.5), "decode_replicas"),
])
def test_bad_parameters_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        simulate_disaggregated(spaced([100], [10]), **kwargs)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="output_tokens"):
        simulate_disaggregated(spaced([100], [0]))
    with pytest.raises(ValueError, match="decode_replica"):
        simulate_disaggregated(spaced([100], [10]), decode_replica="fast")
    with pytest.raises(ValueError, match="layers"):
        kv_bytes_per_token(0, 8, 128)
    with pytest.raises(ValueError, match="prompt_tokens"):
        kv_transfer_s(-5, 100.0, 1e9)
