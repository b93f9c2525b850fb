"""Published step-time profiles as cost models: DistServe's fitted coefficients (hand
arithmetic, bad profiles) and Vidur's measured linear ops fused with a roofline."""

import json

import numpy as np
import pandas as pd
import pytest
from servingcap import profiles
from servingcap.serving import Replica, StepDetail, simulate

# OPT-13B, TP 1, DistServe engine: data/distserve_profiles/profiler-a100-80g.distserve.json
PREFILL = (18.10254647486372, 0.1019122572698738, 7.122264314252114e-06)
SMALL = (19.934702624895458, 0.0006269356524350583, 0.03850697740828398)
LARGE = (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046)


def detail(prompts=(), contexts=()):
    prompts = np.asarray(prompts, dtype=np.int64)
    return StepDetail(prefill_chunks=prompts, prefill_cached=np.zeros_like(prompts),
                      decode_context=np.asarray(contexts, dtype=np.int64))


def test_prefill_step_equals_the_published_formula_by_hand():
    cost = profiles.distserve_profile("opt-13b", tp=1)
    a, b, c = PREFILL
    # one 374-token prompt: a + b L + c L^2, + 1 ms per prefill step, + 2 ms + 1e-4 ms * L
    by_hand = a + b * 374 + c * 374**2 + 1 + 2 + 1e-4 * 374
    assert cost(detail([374])) == pytest.approx(by_hand / 1000, rel=1e-12)
    # DistServe's own simulator gave the first Azure request (alone, 374 tokens) this TTFT
    assert cost(detail([374])) == pytest.approx(0.060251365, abs=1e-9)
    # two prompts in one step: the quadratic term sums L_i^2, not (sum L)^2
    two = a + b * 1500 + c * (1000**2 + 500**2) + 1 + 2 + 1e-4 * 1500
    assert cost(detail([1000, 500])) == pytest.approx(two / 1000, rel=1e-12)


@pytest.mark.parametrize("batch, terms", [(1, SMALL), (94, SMALL), (95, LARGE), (200, LARGE)])
def test_decode_step_switches_coefficients_at_batch_95(batch, terms):
    cost = profiles.distserve_profile("opt-13b", tp=1)
    contexts = np.arange(batch) + 500                       # prompt + tokens generated
    a, b, c = terms
    # the formula sees each context; the overhead counts the tokens already cached (C - 1)
    by_hand = a + b * contexts.sum() + c * batch + 2 + 1e-4 * (contexts - 1).sum()
    assert cost(detail(contexts=contexts)) == pytest.approx(by_hand / 1000, rel=1e-12)


def test_hybrid_steps_and_switches():
    cost = profiles.distserve_profile("opt-13b")
    mixed = detail([200], [600, 700])
    a, b, c = PREFILL
    prefill = a + b * 200 + c * 200**2 + 1
    decode = SMALL[0] + SMALL[1] * 1300 + SMALL[2] * 2
    overhead = 2 + 1e-4 * (200 + 599 + 699)
    assert cost(mixed) == pytest.approx((prefill + decode + overhead) / 1000, rel=1e-12)
    only_overhead = profiles.distserve_profile("opt-13b", hybrid="distserve")
    assert only_overhead(mixed) == pytest.approx((prefill + overhead) / 1000, rel=1e-12)
    bare = profiles.distserve_profile("opt-13b", overheads=False)
    assert bare(detail([200])) == pytest.approx((prefill - 1) / 1000, rel=1e-12)


def test_engines_models_and_token_caps():
    assert profiles.distserve_max_num_tokens("opt-13b", 1, 1) == 66_144
    cost = profiles.distserve_profile("facebook/opt-13b", tp=1)
    assert cost.max_num_tokens == 66_144 and cost.threshold == 95
    assert "DistServe" in cost.source and "opt-13b" in cost.source
    vllm = profiles.distserve_profile("opt-13b", tp=1, engine="vllm")
    assert vllm.prefill != cost.prefill
    big = profiles.distserve_profile("opt-66b", tp=4)
    assert big.prefill[0] == pytest.approx(29.441636037717455)


def test_profile_drives_the_simulator():
    # one request alone: TTFT is one prefill step; each decode step sees prompt + generated
    cost = profiles.distserve_profile("opt-13b")
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [374], "output_tokens": [3]})
    out = simulate(reqs, Replica(step_time=cost, mode="prefill_first",
                                 max_batched_tokens=cost.max_num_tokens)).iloc[0]
    assert out.ttft_s == pytest.approx(0.060251365, abs=1e-9)
    steps = [SMALL[0] + SMALL[1] * ctx + SMALL[2] + 2 + 1e-4 * (ctx - 1) for ctx in (375, 376)]
    assert out.finish_s - out.first_token_s == pytest.approx(sum(steps) / 1000, rel=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "llama-7b"}, "model='llama-7b'"),
    ({"model": "opt-13b", "tp": 8}, "tp=8"),
    ({"engine": "sglang"}, "engine"),
    ({"tp": 0}, "tp"),
    ({"hybrid": "max"}, "hybrid"),
    ({"overheads": "no"}, "overheads"),
])
def test_missing_entries_and_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        profiles.distserve_profile(**kwargs)


def _write(tmp_path, entry):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"facebook/opt-13b": {"1": entry}}))
    return path


@pytest.mark.parametrize("change, match", [
    ({"prefill": [-50.0, 0.1, 7e-6]}, "prefill gives a step time of"),
    ({"prefill": [18.0, 0.1, -1e-5]}, "prefill gives a step time of"),
    ({"decoding_smallbs": [-1.0, 0.0006, 0.04]}, "decoding_smallbs"),
    ({"decoding_largebs": [7.0, -0.1, 0.15]}, "decoding_largebs"),
    ({"prefill": [18.0, 0.1]}, "three numbers"),
    ({"prefill": [18.0, "x", 0.1]}, r"prefill\[1\]"),
    ({"decoding_large_small_bs_threshold": 0}, "threshold"),
])
def test_a_profile_with_negative_times_or_bad_fields_is_refused(tmp_path, change, match):
    entry = {"decoding_large_small_bs_threshold": 95, "prefill": list(PREFILL),
             "decoding_smallbs": list(SMALL), "decoding_largebs": list(LARGE), **change}
    with pytest.raises(ValueError, match=match):
        profiles.distserve_profile("opt-13b", 1, path=_write(tmp_path, entry))


def test_an_unreadable_profile_names_the_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):
        profiles.distserve_profile(path=broken)
    no_decode = {"decoding_large_small_bs_threshold": 95, "prefill": list(PREFILL)}
    with pytest.raises(ValueError, match="decoding_smallbs"):
        profiles.distserve_profile(path=_write(tmp_path, no_decode))


def test_distserve_replica_is_the_colocated_baseline():
    replica = profiles.distserve_replica("opt-13b", tp=1)
    assert replica.mode == "prefill_first" and replica.max_batched_tokens == 66_144
    assert replica.max_batch == profiles.NO_BATCH_LIMIT and replica.kv_capacity_tokens is None
    assert isinstance(replica.step_time, profiles.DistServeCost)
    capped = profiles.distserve_replica("opt-13b", kv_capacity_tokens=400_000, max_batch=64)
    assert capped.kv_capacity_tokens == 400_000 and capped.max_batch == 64


# --------------------------------------------------------------------------- Vidur


def _vidur(model="Llama-3.1-8B", gpu="A100-80GB"):
    from servingcap.roofline import measured_steps
    v = measured_steps().query("source == 'vidur' and model == @model and gpu == @gpu")
    return dict(zip(v.tokens, v.measured_ms, strict=True))


def test_vidur_linear_ops_are_looked_up_at_tokens_rounded_up_to_eight():
    cost = profiles.vidur_cost("Llama-3.1-8B", "A100-80GB")
    ms = _vidur()
    assert cost.max_tokens == 4096
    assert cost.linear_s(1) == pytest.approx(ms[8] / 1e3)          # 1 -> 8, as Vidur does
    assert cost.linear_s(97) == pytest.approx(ms[104] / 1e3)        # 97 -> 104
    assert cost.linear_s(4090) == pytest.approx(ms[4096] / 1e3)     # 4090 -> 4096
    # 2,056 is not measured (multiples of 32 there): linear between 2,048 and 2,080
    assert cost.linear_s(2056) == pytest.approx((ms[2048] + (ms[2080] - ms[2048]) / 4) / 1e3)
    assert cost.linear_s(0) == 0.0


def test_vidur_cost_adds_roofline_head_and_attention_to_measured_linear_ops():
    from servingcap.roofline import GROUPS, Roofline, step
    cost = profiles.vidur_cost("Llama-3.1-8B", "A100-80GB", overhead_s=0.002)
    roof = Roofline("Llama-3.1-8B", "A100-80GB", overhead_s=0.002)
    detail_ = step(prefill=[512], cached=[300], decode=np.full(32, 2300.0))
    br, rb = cost.breakdown(detail_), roof.breakdown(detail_)
    assert br["linear_s"] == cost.linear_s(544) and br["linear_bound"] == "measured"
    for group in GROUPS[1:]:
        assert br[f"{group}_s"] == rb[f"{group}_s"]
    assert cost(detail_) == pytest.approx(
        cost.linear_s(544) + sum(rb[f"{g}_s"] for g in GROUPS[1:]) + 0.002, rel=1e-12)
    assert cost(step()) == 0.0
    assert "Vidur" in cost.describe() and "Meta-Llama-3-8B" in cost.source


def test_vidur_cost_drives_the_simulator():
    from servingcap.roofline import step
    cost = profiles.vidur_cost("Llama-2-7b-hf", "H100-SXM")
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [2000], "output_tokens": [2]})
    out = simulate(reqs, Replica(step_time=cost, mode="mixed",
                                 max_batched_tokens=cost.max_tokens)).iloc[0]
    assert out.ttft_s == pytest.approx(cost(step(prefill=[2000])))
    assert out.finish_s - out.first_token_s == pytest.approx(cost(step(decode=[2001])))


def test_vidur_profiles_lists_what_was_measured():
    table = profiles.vidur_profiles()
    assert set(zip(table.model, table.gpu, strict=True)) == {("Llama-2-7b-hf", "A100-80GB"),
                                               ("Llama-2-7b-hf", "H100-SXM"),
                                               ("Llama-3.1-8B", "A100-80GB")}
    assert (table.min_tokens == 1).all() and (table.max_tokens == 4096).all()
    # Vidur's own name for the Llama-3 profile is accepted
    assert profiles.vidur_cost("Meta-Llama-3-8B").measured_model == "Meta-Llama-3-8B"


@pytest.mark.parametrize("call, match", [
    (lambda: profiles.vidur_cost("opt-13b"), r"model='opt-13b' has no Vidur.*Llama-2-7b-hf"),
    (lambda: profiles.vidur_cost("Llama-3.1-8B", "H100-SXM"),
     r"gpu='H100-SXM' has no Vidur.*A100-80GB"),
    (lambda: profiles.vidur_cost("Llama-2-7b-hf", "B300"), r"gpu='B300'"),
    (lambda: profiles.vidur_cost().linear_s(4097), r"tokens=4097 is outside the measured range "
                                                   r"1 to 4096"),
    (lambda: profiles.vidur_cost().linear_s(2.5), r"tokens=2.5"),
    (lambda: profiles.vidur_cost()(__import__("servingcap.roofline").roofline.step(
        prefill=[4000], decode=np.full(200, 10.0))), r"tokens=4200\.0 is outside"),
])
def test_vidur_cost_refuses_what_it_has_no_measurement_for(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
