"""The replica memory model: weights, runtime reserve and KV cache on tp GPUs."""

import re

import pytest
from servingcap import memory, roofline
from servingcap.__main__ import InputError, settings
from servingcap.traffic import data_dir

GIB = 2 ** 30
# Llama-3.1-70B's config.json (meta-llama/Llama-3.1-70B): the fields the model needs.
LLAMA_70B = {"_name_or_path": "Llama-3.1-70B", "model_type": "llama", "hidden_size": 8192,
             "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False}


def test_llama_8b_on_h100_matches_vllm_logged_kv_memory():
    m = memory.memory_plan("Llama-3.1-8B", "H100-SXM")
    # 8.03e9 parameters x 2 bytes = 14.96 GiB, as vLLM logs ("model weights take 14.96GiB")
    assert m.weight_bytes / GIB == pytest.approx(14.96, abs=0.01)
    # KV per token: 2 (K, V) x 32 layers x 8 heads x 128 x 2 bytes = 128 KiB
    assert m.kv_bytes_per_token == 131072
    # vLLM logged 53.29 GiB for the KV cache (79.22 GiB total); the spec sheet's 80 GiB
    # gives 0.9 x 80 - 14.96 - 3.05 = 53.99 GiB: within 1.5 %.
    assert m.kv_bytes / GIB == pytest.approx(53.29, rel=0.015)
    assert m.kv_capacity_tokens % 16 == 0
    assert m.kv_capacity_tokens == pytest.approx(m.kv_bytes / 131072, abs=16)


def test_64_slots_at_15k_context_do_not_fit_on_an_h100():
    m = memory.memory_plan("Llama-3.1-8B", "H100-SXM")
    # 64 x 15,000 tokens x 128 KiB = 117.2 GiB (125.8 GB) of KV against 54.0 GiB free
    with pytest.raises(ValueError, match=r"slots=64 at mean_context_tokens=15000 need 117\.2 GiB.*"
                                         r"54\.0 GiB.*at most 29"):
        m.check_batch(64, 15_000)
    assert m.max_batch(15_000) == 29
    m.check_batch(29, 15_000)


def test_70b_on_one_l40s_is_refused_naming_what_does_not_fit():
    with pytest.raises(ValueError, match=r"Llama-3\.1-70B weights need 131\.4 GiB.*"
                                         r"1 x L40S at gpu_memory_utilization 0\.9 gives 43\.2 GiB"):
        memory.memory_plan(LLAMA_70B, "L40S")
    fits = memory.memory_plan(LLAMA_70B, "H100-SXM", tp=4)
    assert fits.kv_capacity_tokens > 400_000


def test_8b_on_a100_80gb_fits_with_a_stated_capacity():
    m = memory.memory_plan("Llama-3.1-8B", "A100-80GB")
    # 53.99 GiB / 128 KiB = 442,304 tokens (whole 16-token blocks)
    assert m.kv_capacity_tokens == 442_304
    assert "442,304 tokens" in m.describe()


def test_fp8_halves_weights_and_kv_per_token():
    bf16 = memory.memory_plan("Llama-3.1-8B", "H100-SXM")
    fp8 = memory.memory_plan("Llama-3.1-8B", "H100-SXM", fp8=True)
    assert fp8.weight_bytes == bf16.weight_bytes / 2
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2


def test_tp_beyond_kv_heads_replicates_them():
    # 8 KV heads over tp=16: each GPU holds one head, so a token costs 16 heads' worth
    m = memory.memory_plan(LLAMA_70B, "H100-SXM", tp=16)
    assert m.kv_bytes_per_token == 2 * 80 * 1 * 128 * 2 * 16


@pytest.mark.parametrize("kwargs, name", [({"tp": 0}, "tp"),
                                          ({"gpu_memory_utilization": 1.5},
                                           "gpu_memory_utilization"),
                                          ({"reserve_gib": -1}, "reserve_gib"),
                                          ({"fp8": "yes"}, "fp8")])
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        memory.memory_plan("Llama-3.1-8B", "H100-SXM", **kwargs)


def test_plan_sets_kv_capacity_and_warns_about_slots():
    s = settings({"model_config": "Llama-3.1-8B", "gpu": "H100-SXM", "max_batch": 64,
                  "prompt_tokens": 14_000, "output_tokens": 2_000, "rate": 1})
    assert s.replica.kv_capacity_tokens == 442_304
    assert re.search(r"WARNING: --max-batch 64 slots at the workload.s mean context of 15,000 "
                     r"tokens .* need 117.2 GiB .* 54.0 GiB left: at most 29", s.memory)


def test_plan_refuses_weights_that_do_not_fit():
    with pytest.raises(InputError, match=r"--gpu-memory-utilization.*gives 4\.8 GiB"):
        settings({"model_config": "Llama-3.1-8B", "gpu": "L40S",
                  "gpu_memory_utilization": 0.1})
    with pytest.raises(InputError, match="applies only with --model-config"):
        settings({"gpu_memory_utilization": 0.5})


USER_GPUS = data_dir() / "gpus_example_user.csv"


def test_a_user_gpu_sizes_the_memory_by_its_own_capacity():
    # 70B in bf16 (131.5 GiB of weights) fits on one 192 GB MI300X, not on one H100
    mi300x = roofline.gpu("MI300X", extra=USER_GPUS)
    plan = memory.memory_plan(LLAMA_70B, mi300x)
    assert plan.gpu == "MI300X"
    assert plan.usable_bytes_per_gpu == 0.9 * 192 * GIB
    assert plan.kv_bytes == pytest.approx(0.9 * 192 * GIB - plan.weight_bytes
                                          - memory.RUNTIME_RESERVE_GIB * GIB)
    with pytest.raises(ValueError, match="weights need"):
        memory.memory_plan(LLAMA_70B, "H100-SXM")


def test_plan_uses_the_user_gpu_memory_and_says_fp8():
    s = settings({"model_config": "Llama-3.1-8B", "gpu": "MI300X", "gpu_spec": str(USER_GPUS),
                  "rate": 1, "fp8": True})
    plan = memory.memory_plan("Llama-3.1-8B", roofline.gpu("MI300X", extra=USER_GPUS),
                              fp8=True)
    assert s.replica.kv_capacity_tokens == plan.kv_capacity_tokens
    assert plan.kv_capacity_tokens > 2 * memory.memory_plan("Llama-3.1-8B", "H100-SXM",
                                                            fp8=True).kv_capacity_tokens
    assert s.memory.startswith("1 x MI300X at gpu_memory_utilization 0.9 = 172.8 GiB: "
                               "weights (fp8) 7.5 GiB") and "KV cache (fp8)" in s.memory
