"""The engine against DistServe's own simulator, request by request (issue 15).

``data/reference_outputs/`` holds what DistServe's simulator (``simdistserve``, commit
82831f1, unmodified) computed for the first 2,000 requests of the Azure conversation
trace, OPT-13B on one A100 with DistServe's published profile: one colocated instance
with prefill priority at 0.96 req/s, and one prefill plus one decode instance at
1.26 req/s. Here the same requests run through :mod:`servingcap.serving` with the
shipped profile as the cost model (:func:`servingcap.profiles.distserve_replica`:
``mode="prefill_first"`` with DistServe's 66,144-token prefill cap, no batch limit), one
instance colocated and :mod:`servingcap.disagg` for the pair (whose decode pool turns the
replica into pure decode steps).

Measured agreement (2026-11-30): every TTFT within 1 microsecond in both
configurations; TTFT mean and p99 and TPOT mean within 1e-7 relative; every TPOT within
2e-6 relative.

Rule differences that remain between the two simulators, which set the tolerances:

1. Input rounding. The reference files store arrivals to 1 microsecond and results to
   1 nanosecond, while DistServe ran on the unrounded arrival times (and accumulates
   inter-arrival gaps in floating point). A busy period starts at a rounded arrival,
   so each TTFT can move by up to one rounding of its own arrival plus one of the
   period's first arrival: about 1 microsecond.
2. DistServe caps a decode step at ``decode_max_tokens`` context tokens (rotating the
   sequences beyond it) and stops prefilling when its decode queue holds more than
   ``0.9 * decode_max_batch_size`` tokens (back-pressure). Our engine has neither rule;
   the test checks that the peak context held stays below the smallest such cap
   (50,000 tokens), so neither can have acted.
3. Ties. When an arrival and the end of a step fall at the same instant, DistServe's
   event order (simpy) and ours could differ on whether the arrival joins the next
   step; at microsecond resolution the trace has no such ties.

Everything else (whole-prompt FIFO prefill batches up to the token cap, decodes waiting
while prompts are pending, no batch-size cap, no KV limit, no transfer time, the step
formula with its per-step overheads) is the same rule on both sides.
"""

import dataclasses

import numpy as np
import pandas as pd
import pytest
from servingcap import profiles
from servingcap.disagg import simulate_disaggregated
from servingcap.serving import simulate
from servingcap.traffic import data_dir

DECODE_TOKEN_CAP = 50_000             # the smallest decode-step cap DistServe versions use
INPUTS = ["arrival_s", "prompt_tokens", "output_tokens"]


def reference(kind: str) -> pd.DataFrame:
    name = f"distserve_opt13b_a100_azure_conv2000_{kind}.csv"
    frame = pd.read_csv(data_dir() / "reference_outputs" / name)
    assert len(frame) == 2000
    return frame


# kv_block_tokens=1: the step log's kv_tokens is then the exact context held
DISTSERVE = profiles.distserve_replica("opt-13b", tp=1, engine="distserve", kv_block_tokens=1)


def test_disaggregated_one_prefill_one_decode_instance():
    ref = reference("disaggregated_1p1d")
    out = simulate_disaggregated(ref[INPUTS], DISTSERVE, DISTSERVE)
    assert (out.outcome == "done").all()
    # Issue 15's tolerances: TTFT per request within 1 ms, TPOT mean within 1 %.
    # Rule difference 1 alone allows about 1 microsecond, so these hold with a margin of
    # 1,000x; the tighter checks below make any new rule difference visible.
    ttft_error = (out.ttft_s - ref.ttft_s).abs()
    assert ttft_error.max() < 1e-3
    assert out.tpot_s.mean() == pytest.approx(ref.tpot_s.mean(), rel=0.01)
    assert ttft_error.max() < 2e-6
    assert np.allclose(out.tpot_s, ref.tpot_s, rtol=1e-5, equal_nan=True)


def test_colocated_prefill_first_instance():
    ref = reference("colocated_prefill_first")
    out, log = simulate(ref[INPUTS], DISTSERVE, step_log=True)
    assert (out.outcome == "done").all()
    # rule difference 2 never acts: the context held stays below DistServe's caps
    assert log.kv_tokens.max() < DECODE_TOKEN_CAP
    # Issue 15's tolerances: TTFT mean and p99 within 2 %, TPOT mean within 2 %, at least
    # 95 % of requests within 5 % on TTFT (loose enough for a scheduler that differed in
    # tie-breaking, rule 3); measured, every request agrees to about 1 microsecond.
    assert out.ttft_s.mean() == pytest.approx(ref.ttft_s.mean(), rel=0.02)
    assert out.ttft_s.quantile(0.99) == pytest.approx(ref.ttft_s.quantile(0.99), rel=0.02)
    assert out.tpot_s.mean() == pytest.approx(ref.tpot_s.mean(), rel=0.02)
    within = ((out.ttft_s - ref.ttft_s).abs() <= 0.05 * ref.ttft_s).mean()
    assert within >= 0.95
    assert (out.ttft_s - ref.ttft_s).abs().max() < 2e-6
    assert np.allclose(out.tpot_s, ref.tpot_s, rtol=1e-5, equal_nan=True)


def test_the_combined_step_is_not_distserves_colocated_rule():
    # The same workload in mode="combined" (prefill and decodes in one step) gives a
    # visibly different TTFT (measured: mean 19 % above DistServe's): the agreement above
    # is the mode's doing, not the trace's.
    ref = reference("colocated_prefill_first")
    combined = dataclasses.replace(DISTSERVE, mode="combined", max_batched_tokens=None)
    out = simulate(ref[INPUTS], combined)
    assert out.ttft_s.mean() > 1.1 * ref.ttft_s.mean()
