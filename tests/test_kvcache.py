"""KV-cache arithmetic: bytes per token, what fits, paging waste, prefix-cache reuse."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servingcap import kvcache as kv
from servingcap.serving import Replica, simulate

# --------------------------------------------------------------------------- model shape


def test_llama_3_1_8b_bytes_per_token_is_128_kib():
    shape = kv.AttentionShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert shape.bytes_per_token == 131_072 == 128 * 1024
    assert kv.LLAMA_3_1_8B.bytes_per_token == 131_072
    assert shape.kv_bytes(2300) == 2300 * 131_072
    # an fp8 KV cache halves it; full multi-head attention (32 KV heads) quadruples it
    assert kv.AttentionShape(32, 8, 128, dtype_bytes=1).bytes_per_token == 65_536
    assert kv.AttentionShape(32, 32, 128).bytes_per_token == 4 * 131_072


def test_weights_and_budget_on_an_80_gb_accelerator():
    weights = kv.weights_bytes(kv.LLAMA_3_1_8B_PARAMS, 2)
    assert weights == pytest.approx(16.06e9)
    tokens = kv.kv_budget_tokens(80e9, 131_072, weights, reserve_bytes=8e9)
    assert tokens == int((80e9 - 16.06e9 - 8e9) // 131_072) == 426_788
    assert kv.sequences_that_fit(tokens, 2300) == 185
    # paged in 16-token blocks: 2,300 tokens take 144 blocks (2,304 tokens)
    assert kv.sequences_that_fit(tokens, 2300, block_tokens=16) == (tokens // 16) // 144


def test_budget_refuses_when_weights_do_not_fit():
    with pytest.raises(ValueError, match="memory_bytes=16000000000.0"):
        kv.kv_budget_tokens(16e9, 131_072, weights_bytes=16.06e9)


@pytest.mark.parametrize("call, match", [
    (lambda: kv.AttentionShape(0, 8, 128), "layers"),
    (lambda: kv.AttentionShape(32, 8, 128, dtype_bytes=-2), "dtype_bytes"),
    (lambda: kv.kv_budget_tokens(80e9, 0), "bytes_per_token"),
    (lambda: kv.kv_budget_tokens(80e9, 1.0, reserve_bytes=-1), "reserve_bytes"),
    (lambda: kv.blocks_per_sequence([10, 20], block_tokens=0), "block_tokens"),
    (lambda: kv.blocks_per_sequence([10.5]), "tokens"),
    (lambda: kv.contiguous_reserved([100, 3000], max_tokens=2048), "max_tokens=2048"),
    (lambda: kv.used_fraction([10, 20], [5, 20]), "reserved"),
    (lambda: kv.hit_rate([[1, 2]], cache_blocks=0), "cache_blocks"),
    (lambda: kv.prefix_hits(["abc"]), "hash_ids"),
    (lambda: kv.saved_prefill_tokens([1], [0]), "prompt_tokens"),
])
def test_bad_inputs_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- paging


def test_blocks_and_internal_fragmentation_by_hand():
    tokens = [1, 16, 17, 31, 32, 2300]
    assert list(kv.blocks_per_sequence(tokens, 16)) == [1, 1, 2, 2, 2, 144]
    assert list(kv.internal_fragmentation(tokens, 16)) == [15, 0, 15, 1, 0, 4]
    assert list(kv.paged_reserved(tokens, 16)) == [16, 16, 32, 32, 32, 2304]


@given(st.lists(st.integers(1, 20_000), min_size=1, max_size=200), st.integers(1, 256))
def test_paging_waste_is_under_one_block_per_sequence(tokens, block):
    waste = kv.internal_fragmentation(tokens, block)
    assert (waste >= 0).all() and (waste < block).all()
    used = kv.used_fraction(tokens, kv.paged_reserved(tokens, block))
    lower = sum(tokens) / (sum(tokens) + len(tokens) * (block - 1))
    assert lower - 1e-12 <= used <= 1.0


def test_mean_waste_is_about_half_a_block_for_spread_lengths():
    rng = np.random.default_rng(3)
    tokens = rng.integers(100, 5000, 20_000)
    for block in (16, 32, 512):
        assert kv.internal_fragmentation(tokens, block).mean() == pytest.approx(
            (block - 1) / 2, rel=0.05)


def test_contiguous_reservation_wastes_more_than_paging():
    tokens = np.array([300, 800, 1500, 2048])
    contiguous = kv.used_fraction(tokens, kv.contiguous_reserved(tokens, 2048))
    paged = kv.used_fraction(tokens, kv.paged_reserved(tokens, 16))
    assert contiguous == pytest.approx(4648 / (4 * 2048))
    assert paged == pytest.approx(4648 / (304 + 800 + 1504 + 2048))
    assert contiguous < paged <= 1.0


# --------------------------------------------------------------------------- prefix reuse


def test_hit_rate_on_a_hand_built_trace():
    ids = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3, 6]]
    # leading hits: 0; 1,2 then miss; 1 then miss; 1,2,3 then miss
    assert list(kv.prefix_hits(ids)) == [0, 2, 1, 3]
    assert kv.hit_rate(ids) == pytest.approx(6 / 12)


def test_only_a_leading_prefix_counts():
    # block 3 was seen, but after a missed block 9 its cached keys are useless
    assert list(kv.prefix_hits([[1, 2, 3], [1, 9, 3]])) == [0, 1]


def test_lru_evicts_the_least_recently_used_block():
    ids = [[1, 2], [3], [1]]
    assert list(kv.prefix_hits(ids)) == [0, 0, 1]                     # unbounded keeps 1
    assert list(kv.prefix_hits(ids, cache_blocks=2)) == [0, 0, 0]     # {1,2} -> {2,3}
    # touching block 1 again makes block 2 the eviction victim instead
    ids = [[1, 2], [1], [3], [1], [2]]
    assert list(kv.prefix_hits(ids, cache_blocks=2)) == [0, 1, 0, 1, 0]
    # a bigger cache never hits less on this trace
    rng = np.random.default_rng(1)
    trace = [list(rng.integers(0, 40, rng.integers(1, 6))) for _ in range(300)]
    rates = [kv.hit_rate(trace, c) for c in (1, 5, 20, 80)] + [kv.hit_rate(trace)]
    assert rates == sorted(rates)


def test_saved_tokens_match_the_simulator_prefix_cache():
    reqs = pd.DataFrame({
        "arrival_s": [0.0, 10.0, 20.0],
        "prompt_tokens": [2048, 2048, 1024],
        "output_tokens": [5, 5, 5],
        "hash_ids": [[1, 2, 3, 4], [1, 2, 3, 9], [1, 2]],
    })
    hits = kv.prefix_hits(reqs.hash_ids)
    saved = kv.saved_prefill_tokens(hits, reqs.prompt_tokens, 512)
    assert list(saved) == [0, 3 * 512, 1023]          # a full hit still prefills one token
    out = simulate(reqs, Replica(prefix_cache_blocks=100))
    assert list(out.cached_tokens) == list(saved)


# --- conversation-sticky routing (moved out of chapters/kv_memory.ipynb) --------------

def test_sticky_routes_by_hand():
    ids = [[0, 1], [0, 2], [0, 1, 5], [0], [0, 3], [0, 2, 7]]
    # work after each: [100,0] -> [100,50] -> conv 1 home 0 [110,50] -> no key, least
    # work 1 [110,55] -> conv 3 to least work 1 [110,75] -> conv 2 home 1 [110,76]
    routes = kv.sticky_routes(ids, [100, 50, 10, 5, 20, 1], replicas=2)
    assert routes.tolist() == [0, 1, 0, 1, 1, 1]


def test_sticky_routes_keeps_conversations_together_and_balances_tokens():
    rng = np.random.default_rng(7)
    conv = rng.integers(0, 40, 500)
    ids = [[0, int(c), 1000 + k] for k, c in enumerate(conv)]
    prompts = rng.integers(100, 4000, 500)
    routes = kv.sticky_routes(ids, prompts, replicas=4)
    for c in np.unique(conv):                        # one replica per conversation
        assert len(set(routes[conv == c])) == 1
    assert set(routes) <= {0, 1, 2, 3}
    assert kv.sticky_routes(ids, prompts, replicas=1).tolist() == [0] * 500
    # key_block=0 (the shared block): everything is one conversation on replica 0
    assert set(kv.sticky_routes(ids, prompts, replicas=4, key_block=0)) == {0}


@pytest.mark.parametrize("kwargs, match", [
    ({"replicas": 0}, "replicas"),
    ({"replicas": 2, "key_block": -1}, "key_block"),
    ({"replicas": 2, "prompt_tokens": [1]}, "prompt_tokens has 1"),
    ({"replicas": 2, "prompt_tokens": [-1, 2]}, "prompt_tokens"),
    ({"replicas": 2, "hash_ids": ["ab", [0, 1]]}, "hash_ids\\[0\\]"),
])
def test_sticky_routes_bad_input(kwargs, match):
    args = {"hash_ids": [[0, 1], [0, 2]], "prompt_tokens": [10, 20], **kwargs}
    with pytest.raises(ValueError, match=match):
        kv.sticky_routes(**args)


def test_replay_routed_equals_one_simulation_per_share():
    rng = np.random.default_rng(3)
    reqs = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 60, 80)),
                         "prompt_tokens": rng.integers(50, 2000, 80),
                         "output_tokens": rng.integers(2, 200, 80)})
    routes = rng.integers(0, 3, 80)
    out = kv.replay_routed(reqs, Replica(), routes)
    assert out.index.equals(reqs.index) and out.replica.tolist() == routes.tolist()
    for k in range(3):
        alone = simulate(reqs[routes == k], Replica())
        pd.testing.assert_series_equal(out.ttft_s[routes == k], alone.ttft_s)
    # everything on one replica is the one-replica simulation
    pd.testing.assert_series_equal(kv.replay_routed(reqs, Replica(), np.zeros(80, int)).e2e_s,
                                   simulate(reqs, Replica()).e2e_s)


@pytest.mark.parametrize("routes, options, match", [
    (np.zeros(3, int), {}, "one replica per request"),
    (np.full(4, -1), {}, "indices"),
    (np.zeros(4), {}, "indices"),
    (np.zeros(4, int), {"replicas": 2}, "replicas"),
    (np.zeros(4, int), {"router": "random"}, "router"),
])
def test_replay_routed_bad_input(routes, options, match):
    reqs = pd.DataFrame({"arrival_s": [0.0, 1, 2, 3], "prompt_tokens": [10] * 4,
                         "output_tokens": [5] * 4})
    with pytest.raises(ValueError, match=match):
        kv.replay_routed(reqs, Replica(), routes, **options)
