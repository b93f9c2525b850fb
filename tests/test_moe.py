"""Mixture-of-experts models: parameter counts, touched experts, step bytes, memory, search.

Published figures: Mixtral-8x7B has 46.7 B parameters of which 12.9 B are active per token
(Mistral AI, "Mixtral of experts", 2023-12, and the model card); Qwen1.5-MoE-A2.7B 14.3 B
and 2.7 B (its model card). Both are rounded to 0.1 B, so the counts here must match
within 0.05 B (half the last digit).
"""

from __future__ import annotations

import numpy as np
import pytest
from servingcap import configsearch as cs
from servingcap import memory, planning, roofline
from servingcap.roofline import Roofline, expected_experts, step

GIB = 2 ** 30
# Qwen/Qwen1.5-MoE-A2.7B config.json (Hugging Face Hub): the fields the model reads.
QWEN_MOE = {"_name_or_path": "Qwen1.5-MoE-A2.7B", "model_type": "qwen2_moe",
            "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
            "num_key_value_heads": 16, "intermediate_size": 5632, "vocab_size": 151936,
            "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
MIXTRAL = roofline.model_config("Mixtral-8x7B-v0.1")


def test_total_and_active_parameters_match_the_published_figures():
    m = MIXTRAL
    assert (m.experts, m.experts_per_token, m.expert_intermediate) == (8, 2, 14336)
    assert m.total_params == pytest.approx(46.7e9, abs=0.05e9)
    assert m.active_params == pytest.approx(12.9e9, abs=0.05e9)
    # exact: Hugging Face counts 46,702,792,704 parameters, of which 266,240 are RMSNorm
    # weights (2 per layer x 32 layers + the final norm, 4,096 each), left out here
    assert m.total_params == 46_702_792_704 - (2 * 32 + 1) * 4096
    q = roofline.model_config(QWEN_MOE)
    assert q.shared_intermediate == 5632
    assert q.total_params == pytest.approx(14.3e9, abs=0.05e9)
    assert q.active_params == pytest.approx(2.7e9, abs=0.05e9)
    dense = roofline.model_config("Llama-3.1-8B")          # dense: active == total
    assert not dense.is_moe and dense.active_params == dense.total_params


def test_expected_experts_formula_limits_and_a_monte_carlo_check():
    assert expected_experts(8, 2, 1) == pytest.approx(2.0)           # T = 1: exactly k
    assert expected_experts(8, 2, 0) == 0.0
    assert expected_experts(8, 2, 10_000) == pytest.approx(8.0)      # large T: all E
    assert expected_experts(8, 8, 3) == 8.0                           # k = E: all, always
    t = np.arange(0, 300)
    assert np.all(np.diff(expected_experts(60, 4, t)) > 0)            # grows with T ...
    assert np.all(expected_experts(60, 4, t) <= 60)                   # ... up to E
    # Uniform routing simulated: 20,000 steps of T = 3 tokens, each choosing 2 distinct
    # of 8 experts. The count's standard deviation is < 1.5 (it lies in 2..6), so the
    # mean's standard error is < 0.011; 5 standard errors is 0.055.
    rng = np.random.default_rng(0)
    choice = np.argsort(rng.random((20_000, 3, 8)), axis=2)[:, :, :2]
    touched = np.array([len(np.unique(c)) for c in choice])
    assert touched.mean() == pytest.approx(expected_experts(8, 2, 3), abs=0.055)
    with pytest.raises(ValueError, match="experts_per_token"):
        expected_experts(8, 9, 1)
    with pytest.raises(ValueError, match="tokens"):
        expected_experts(8, 2, -1)


def test_decode_step_reads_few_experts_at_batch_1_and_all_at_256():
    m, model = MIXTRAL, Roofline("Mixtral-8x7B-v0.1", "H100-SXM", tp=2)
    work = {b: model.work(step(decode=np.full(b, 1000.0))) for b in (1, 8, 256)}
    dense, expert = m.dense_params_per_layer, m.expert_params
    assert work[1]["linear_bytes"] == pytest.approx(2 * m.layers * (dense + 2 * expert))
    assert work[256]["linear_bytes"] == pytest.approx(2 * m.layers * (dense + 8 * expert))
    assert work[1]["linear_bytes"] < work[8]["linear_bytes"] < work[256]["linear_bytes"]
    # ... while every token's FLOPs use the active weights only (top-2)
    assert work[256]["linear_flops"] == pytest.approx(
        2 * 256 * m.layers * m.active_params_per_layer)
    reads = [model.weight_read_bytes(b) for b in (1, 8, 64, 256)]
    assert reads[0] == pytest.approx(work[1]["linear_bytes"] + 2 * m.lm_head_params)
    assert reads[-1] == pytest.approx(m.weight_bytes)                 # every expert
    assert model.weight_read_s(1) < model.weight_read_s(256)
    assert model.decode_s(1, 1000) < model.decode_s(256, 1000)
    # a dense model reads the same weights at any batch
    llama = Roofline("Llama-3.1-8B", "H100-SXM")
    assert llama.weight_read_bytes(1) == llama.weight_read_bytes(256)
    # the compute ridge moves up: a big step reads all experts, each token uses two
    assert model.ridge_tokens > Roofline("Llama-3.1-8B", "H100-SXM").ridge_tokens
    compute, mem = model._times(*model._linear_work(model.ridge_tokens))
    assert float(compute) == pytest.approx(float(mem), rel=1e-6)
    assert "12.9 B active" in model.describe()


def test_memory_fit_holds_every_expert():
    one = pytest.raises(ValueError, match="weights need 87.0 GiB")
    with one:                                       # 93.4 GB of bf16 weights on one H100
        memory.memory_plan("Mixtral-8x7B-v0.1", "H100-SXM", tp=1)
    plan = memory.memory_plan("Mixtral-8x7B-v0.1", "H100-SXM", tp=2)
    assert plan.weight_bytes == 2 * MIXTRAL.total_params
    assert plan.weight_bytes > 3.5 * 2 * MIXTRAL.active_params      # total, not active
    fp8 = memory.memory_plan("Mixtral-8x7B-v0.1", "H100-SXM", tp=1, fp8=True)
    assert fp8.weight_bytes == MIXTRAL.total_params


@pytest.mark.parametrize("extra, match", [
    ({"n_routed_experts": 64}, "field n_routed_experts=64: DeepSeek"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
    ({"mlp_only_layers": [0]}, "mlp_only_layers"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 61}, "num_experts_per_tok=61"),
    ({"num_local_experts": 8}, "both num_local_experts"),
])
def test_unsupported_layouts_are_refused_naming_the_field(extra, match):
    with pytest.raises(ValueError, match=match) as err:
        roofline.model_config({**QWEN_MOE, **extra})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=match):
        cs.load_model({**QWEN_MOE, **extra})


def test_search_runs_a_tiny_moe_grid():
    out = cs.search("Mixtral-8x7B-v0.1", planning.PoissonWorkload(200, 20), 2.0,
                    gpus=["H100-SXM"], tps=(1, 2), dtypes=("bf16",), modes=("mixed",),
                    budgets=(512,), max_batches=(8,),
                    limits={"ttft_s": 1.0, "tpot_s": 0.1}, budget=2, holds=1,
                    min_requests=100, executor=None)
    rows = out.table.set_index("tp")
    assert rows.loc[1, "status"] == "refused"
    assert rows.loc[1, "reason"].startswith("Mixtral-8x7B-v0.1 weights need 87.0 GiB")
    assert rows.loc[2, "status"] == "ranked" and rows.loc[2, "replicas"] >= 1
    assert out.model == "Mixtral-8x7B-v0.1"
