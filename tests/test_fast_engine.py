"""The engine's fast path gives the reference engine's rows, bit for bit.

``serving._FAST_PATH = False`` forces the step-by-step reference (``serving._Engine``)
for every configuration; each case runs both and compares the whole output frame
exactly (``check_exact=True``: the same floats, not merely close ones).
"""

import itertools

import numpy as np
import pandas as pd
import pytest
from servingcap import serving
from servingcap._fast_engine import usable
from servingcap.serving import Replica, detailed, simulate


def requests(n=300, rate=5.0, seed=7, prompt=(200, 3000), outputs=(1, 400)):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    arrival[10:14] = arrival[10]                        # simultaneous arrivals
    return pd.DataFrame({
        "arrival_s": arrival,
        "prompt_tokens": rng.integers(prompt[0], prompt[1] + 1, n),
        "output_tokens": rng.integers(outputs[0], outputs[1] + 1, n),
        "predicted_output_tokens": rng.integers(outputs[0], outputs[1] + 1, n),
        "priority": rng.integers(0, 3, n),
        "deadline_s": arrival + rng.uniform(2.0, 30.0, n),
        "hash_ids": [[int(g), 1000 + 3 * k, 1001 + 3 * k]
                     for k, g in enumerate(rng.integers(0, 6, n))],
    })


def fast_and_reference(monkeypatch, frame, replica, **options):
    fast = simulate(frame, replica, **options)
    monkeypatch.setattr(serving, "_FAST_PATH", False)
    reference = simulate(frame, replica, **options)
    monkeypatch.setattr(serving, "_FAST_PATH", True)
    return fast, reference


@detailed
def detailed_cost(step):
    """Order-sensitive float sums over each chunk and each decode's context (s)."""
    seconds = 0.0
    for chunk, cached in zip(step.prefill_chunks.tolist(), step.prefill_cached.tolist(),
                             strict=True):
        seconds += 1e-4 * chunk + 1e-9 * chunk * (chunk + 2 * cached)
    for context in step.decode_context.tolist():
        seconds += 3e-7 * context
    return seconds + (0.008 if step.decode_context.size else 0.0)


CASES = {
    "whole prompts": ({}, {}),
    "chunk 256": ({"chunk_tokens": 256}, {}),
    "chunk 97, small batch": ({"chunk_tokens": 97, "max_batch": 4}, {}),
    "decode table": ({"decode_step_s": {1: 0.012, 16: 0.02, 64: 0.05}, "chunk_tokens": 512}, {}),
    "decode callable": ({"decode_step_s": lambda b: 0.01 + 0.0007 * b}, {}),
    "timeouts and queue cap": ({"timeout_s": 4.0, "max_queue": 5, "max_batch": 8,
                                "chunk_tokens": 300}, {}),
    "tiered caps, deadline shedding": ({"max_queue": {0: 20, 2: 3}, "shed_past_deadline": True,
                                        "max_batch": 6, "max_prompt_tokens": 2800},
                                       {"policy": "priority"}),
    "sjf": ({"chunk_tokens": 256, "max_batch": 8}, {"policy": "sjf"}),
    "srpt": ({"max_batch": 8}, {"policy": "srpt"}),
    "edf": ({"chunk_tokens": 512, "max_batch": 8}, {"policy": "edf"}),
    "prefix cache": ({"prefix_cache_blocks": 8, "prefix_block_tokens": 128,
                      "chunk_tokens": 256}, {}),
    "totals cost model": ({"step_time": lambda p, b, c: 0.01 + 2e-7 * c + p / 9000,
                           "chunk_tokens": 256}, {}),
    "detailed cost model": ({"step_time": detailed_cost, "chunk_tokens": 300,
                             "prefix_cache_blocks": 8, "prefix_block_tokens": 128}, {}),
    # memory and preemption: 12,000 KV tokens hold about six of these sequences
    "kv tokens": ({"kv_capacity_tokens": 12_000, "chunk_tokens": 256}, {}),
    "kv blocks of 64, expected reserve": ({"kv_capacity_tokens": 16_000, "kv_block_tokens": 64,
                                           "kv_reserve": "expected", "max_batch": 8}, {}),
    "kv max reserve, whole prompts": ({"kv_capacity_tokens": 20_000, "kv_reserve": "max",
                                       "max_output_tokens": 400}, {}),
    "preemptive srpt": ({"preemptive": True, "max_batch": 6, "chunk_tokens": 256},
                        {"policy": "srpt"}),
    "preemptive priority, timeouts": ({"preemptive": True, "max_batch": 6, "timeout_s": 6.0},
                                      {"policy": "priority"}),
    "kv, prefix cache, preemptive srpt": ({"kv_capacity_tokens": 12_000, "chunk_tokens": 512,
                                           "prefix_cache_blocks": 8, "prefix_block_tokens": 128,
                                           "preemptive": True}, {"policy": "srpt"}),
    "kv, timeouts, deadline shedding": ({"kv_capacity_tokens": 10_000, "timeout_s": 5.0,
                                         "shed_past_deadline": True, "chunk_tokens": 300},
                                        {"policy": "edf"}),
    "kv, preemptive, detailed cost model": ({"kv_capacity_tokens": 12_000, "chunk_tokens": 300,
                                             "step_time": detailed_cost, "preemptive": True},
                                            {"policy": "srpt"}),
}
MODES = ("combined", "mixed", "prefill_first")
# every case in every mode behind two routers (the reference runs are the slow part:
# this keeps the file near a CPU-minute): in turn a shared queue or the router that
# reads the engine's outstanding work (work_at, cut by arrivals), and one of the others,
# also in turn, so that every router meets every mode on four or more cases
ROUTERS = ["oracle_work", "pooled"]
OTHER_ROUTERS = ["round_robin", "least_requests", "power_of_two", "affinity", "random",
                 "jsq", "endpoint_picker", "cache_aware", "kv_cost"]


def in_mode(spec: dict, mode: str) -> dict:
    """A CASES spec in ``mode``: combined keeps it (with the additive cost the cases
    were written for); mixed turns ``chunk_tokens`` into a token budget of that chunk
    beside a full batch, and uses the default fused cost; prefill_first caps a step at
    3,000 prompt tokens where the case chunks (the longest prompt: most steps hold one
    or two prompts) and at 4,096 otherwise (vLLM V0's smallest usual cap)."""
    spec = dict(spec)
    if mode == "combined":
        return {"mode": "combined", "step_cost": "additive", **spec}
    chunk = spec.pop("chunk_tokens", None)
    if mode == "prefill_first":
        return {"mode": "prefill_first", "max_batched_tokens": 4096 if chunk is None else 3000,
                **spec}
    if chunk is not None:
        spec["max_batched_tokens"] = chunk + spec.get("max_batch", 32)
    return spec


def _cases_modes_and_routers():
    return [(case, mode, router)
            for k, case in enumerate(CASES) for m, mode in enumerate(MODES)
            for router in (ROUTERS[(k + m) % 2], OTHER_ROUTERS[(k + m) % len(OTHER_ROUTERS)])]


@pytest.mark.parametrize("case, mode, router", _cases_modes_and_routers())
def test_fast_path_rows_equal_the_reference_exactly(monkeypatch, case, mode, router):
    spec, options = CASES[case]
    replica = Replica(**in_mode(spec, mode))
    assert usable(replica, step_log=False, horizon=np.inf)
    # rate 5/s on 3 replicas loads them enough to queue, preempt, time out and shed
    fast, reference = fast_and_reference(monkeypatch, requests(), replica, replicas=3,
                                         router=router, seed=11, **options)
    pd.testing.assert_frame_equal(fast, reference, check_exact=True)


def test_one_replica_near_saturation_equal_the_reference_exactly(monkeypatch):
    # long decode runs cut by arrivals and long chunk runs on one replica
    frame = requests(n=400, rate=1.2, seed=3)
    for spec in (in_mode({}, "combined"), in_mode({"chunk_tokens": 128}, "combined"),
                 {"mode": "combined", "chunk_tokens": 128},        # combined, fused cost
                 {}, {"max_batched_tokens": 64},                   # mixed, fused cost
                 {"mode": "prefill_first", "max_batched_tokens": 4096},
                 {"mode": "prefill_first", "max_batched_tokens": 3000}):
        fast, reference = fast_and_reference(monkeypatch, frame, Replica(**spec))
        pd.testing.assert_frame_equal(fast, reference, check_exact=True)


def test_memory_cases_do_preempt_and_time_out(monkeypatch):
    # the equality above means something only if these paths run: preemptions (KV or
    # policy) and timeouts of preempted or waiting requests happen in the reference
    monkeypatch.setattr(serving, "_FAST_PATH", False)
    for case, timeouts in [("kv tokens", False), ("preemptive srpt", False),
                           ("kv, prefix cache, preemptive srpt", False),
                           ("kv, timeouts, deadline shedding", True),
                           ("preemptive priority, timeouts", True)]:
        spec, options = CASES[case]
        for mode in MODES:
            out = simulate(requests(), Replica(**in_mode(spec, mode)), replicas=3, seed=11,
                           **options)
            assert out.preemptions.sum() > 0, (case, mode)
            assert (out.outcome == "timed_out").any() == timeouts, (case, mode)


def test_one_replica_memory_bound_equal_the_reference_exactly(monkeypatch):
    # long chunk and decode runs with the head of the queue waiting for memory, and
    # preemption by memory and by policy on one replica
    frame = requests(n=500, rate=0.8, seed=5)
    for (spec, options), mode in itertools.product(
            [({"kv_capacity_tokens": 9_000, "chunk_tokens": 128}, {}),
             ({"kv_capacity_tokens": 9_000, "chunk_tokens": 256, "preemptive": True},
              {"policy": "srpt"}),
             ({"kv_capacity_tokens": 12_000, "kv_block_tokens": 32}, {})],
            MODES):
        fast, reference = fast_and_reference(monkeypatch, frame,
                                             Replica(**in_mode(spec, mode)), **options)
        assert reference.preemptions.sum() > 0
        pd.testing.assert_frame_equal(fast, reference, check_exact=True)


UNTIL_CASES = ["chunk 256", "decode table", "timeouts and queue cap", "kv tokens",
               "kv, prefix cache, preemptive srpt", "kv, preemptive, detailed cost model"]


@pytest.mark.parametrize("case, mode, router", [
    (case, mode, ROUTERS[(k + m) % 2])                  # each case and mode behind one
    for k, case in enumerate(UNTIL_CASES) for m, mode in enumerate(MODES)])
def test_until_s_equal_the_reference_exactly(monkeypatch, case, mode, router):
    # a horizon in the middle of decode and chunk runs: the rows left unfinished keep
    # the tokens and largest gap of the steps that ended by then
    spec, options = CASES[case]
    fast, reference = fast_and_reference(monkeypatch, requests(),
                                         Replica(**in_mode(spec, mode)), replicas=3,
                                         router=router, seed=11, until_s=61.3, **options)
    unfinished = reference.outcome == "unfinished"
    assert unfinished.any() and reference.max_gap_s[unfinished].notna().any()
    pd.testing.assert_frame_equal(fast, reference, check_exact=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_step_log_runs_the_reference(mode):
    assert not usable(Replica(**in_mode({}, mode)), True, np.inf)


def test_mixed_chunk_runs_and_their_tails_equal_the_reference_exactly(monkeypatch):
    # mixed mode takes a prompt's chunks, its last chunk and the decode steps that
    # follow (the tail) at once (FastEngine._chunk_run): here arrivals cut them before the
    # last chunk and inside the tail, decodes finish at their end, one-token outputs
    # leave no tail, 8-token chunks make runs long enough to be summed by numpy, an
    # until_s horizon stops them, and routers read work and pending prefill mid-run
    from servingcap import _fast_engine
    taken = []                                   # per chunk run: the tail's steps

    def counting(method, tail_fast):             # every run once: _plan_tail calls
        def counted(self, *args):                # _tail_run, plan calls _chunk_run
            steps = method(self, *args)
            if steps > 1 and self.tail_fast == tail_fast:
                taken.append(self.tail)
            return steps
        return counted

    for name, tail_fast in (("_chunk_run", False), ("_tail_run", True)):
        method = getattr(_fast_engine.FastEngine, name)
        monkeypatch.setattr(_fast_engine.FastEngine, name, counting(method, tail_fast))
    short = requests(n=250, rate=2.0, seed=13, prompt=(100, 700), outputs=(1, 60))
    frame = requests(n=300, rate=3.0, seed=17, outputs=(1, 120))
    for rows, spec, options in [
            (short, {"max_batched_tokens": 40}, {}),                 # 8-token chunks
            (frame, {}, {"replicas": 3, "router": "oracle_work"}),   # reads work_at
            (frame, {"max_batch": 4, "max_batched_tokens": 200},
             {"replicas": 2, "router": "kv_cost"}),                  # pending prefill
            (frame, {}, {"replicas": 2, "router": "least_requests", "until_s": 40.0})]:
        taken.clear()
        fast, reference = fast_and_reference(monkeypatch, rows, Replica(**spec), **options)
        pd.testing.assert_frame_equal(fast, reference, check_exact=True)
        if "until_s" not in options:                 # no tail is taken with a horizon
            assert any(taken) and not all(taken), spec


@pytest.mark.parametrize(("spec", "lists"), [
    ({"max_batched_tokens": 300}, True),                          # a list row per batch
    ({"max_batched_tokens": np.int64(300)}, True),                # Replica stores the int
    ({"max_batched_tokens": 10**6, "max_batch": 16}, False),      # too large for lists
    ({"mode": "combined", "chunk_tokens": np.int64(97)}, True),
    ({"mode": "combined", "chunk_tokens": 97}, True),
    ({"mode": "combined", "chunk_tokens": 100_000, "step_cost": "fused"}, False)])
def test_step_time_memo_rows_equal_the_reference_exactly(monkeypatch, spec, lists):
    # the fast engine remembers step times by decode batch and prefill tokens, shared by
    # the replicas of a run, in lists up to the step's token bound or in dicts
    from servingcap import _fast_engine
    frame = requests(n=200, rate=4.0, seed=23)
    fast, reference = fast_and_reference(monkeypatch, frame, Replica(**spec), replicas=2)
    pd.testing.assert_frame_equal(fast, reference, check_exact=True)
    shared = _fast_engine.Shared(serving._Requests(frame, Replica(**spec), "fcfs"))
    assert isinstance(shared.memo(Replica(**spec))[1][0], list) == lists
