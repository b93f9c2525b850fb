"""The routers of :mod:`servingcap.routers`: realistic ones never read output lengths,
the default is near the pooled bound on issue 21's scenario, the heap behind ``jsq`` and
``least_requests`` picks what a full scan picks, and ``least_loaded`` is refused with
its new name."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from servingcap import routers, serving
from servingcap.routers import BOUNDS, DEFAULT_ROUTER, REALISTIC, Router
from servingcap.serving import Replica, simulate

# bench/routers.py holds the scenario and its measurement; load it by path (no sys.path edit)
_BENCH = Path(__file__).resolve().parent.parent / "bench" / "routers.py"
_spec = importlib.util.spec_from_file_location("bench_routers", _BENCH)
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_routers"] = bench
_spec.loader.exec_module(bench)


def fleet_requests(outputs_seed: int) -> pd.DataFrame:
    """48 requests in 1.2 s onto 3 replicas of 6 slots: queues form, prefills overlap
    decodes, prefixes repeat. Output lengths (from ``outputs_seed``) are 400 to 900
    tokens, so nothing finishes before the last arrival (900 steps of >= 10 ms)."""
    rng = np.random.default_rng(3)
    n = 48
    groups = rng.integers(0, 5, n)
    return pd.DataFrame({
        "arrival_s": np.sort(rng.uniform(0, 1.2, n)),
        "prompt_tokens": rng.integers(300, 2500, n),
        "output_tokens": np.random.default_rng(outputs_seed).integers(400, 901, n),
        "hash_ids": [[int(g), 100 + int(g), 1000 + k] for k, g in enumerate(groups)],
    })


@pytest.mark.parametrize("router", REALISTIC)
def test_realistic_routers_never_read_output_lengths(router):
    # Two runs whose requests differ only in output lengths: up to the last arrival no
    # request finishes, so every routing decision is made on two fleet states that
    # differ only in the remaining output lengths of the running and queued requests.
    # A realistic router picks the same replica in both, every time.
    spec = Replica(max_batch=6, max_batched_tokens=512 + 6, kv_capacity_tokens=40_000,
                   prefix_cache_blocks=64, prefix_block_tokens=256)
    a, b = fleet_requests(1), fleet_requests(2)
    assert (a.output_tokens != b.output_tokens).mean() > 0.9
    out_a = simulate(a, spec, replicas=3, router=router, seed=4)
    out_b = simulate(b, spec, replicas=3, router=router, seed=4)
    assert out_a.finish_s.min() > a.arrival_s.max()         # nothing finished meanwhile
    assert (out_a.replica.to_numpy() == out_b.replica.to_numpy()).all()
    assert out_a.replica.nunique() == 3 or router == "affinity"


def test_the_oracle_does_read_output_lengths():
    # the same two runs tell oracle_work apart: the test above has the power to see it
    spec = Replica(max_batch=6, max_batched_tokens=512 + 6)
    a = simulate(fleet_requests(1), spec, replicas=3, router="oracle_work")
    b = simulate(fleet_requests(2), spec, replicas=3, router="oracle_work")
    assert (a.replica.to_numpy() != b.replica.to_numpy()).any()


def test_default_is_within_twice_pooled_on_the_issue_scenario():
    # Issue 21's scenario (bench/routers.py): 11 x 32 slots at 30 req/s, exponential
    # outputs of mean 300, 30 ms steps, TTFT p99 after 60 s; 240 s here, seed 1. TTFT
    # is counted in 30 ms steps: an arrival waits for the next step boundary, then a
    # step prefills it and emits its first token, so with a free slot TTFT <= 60 ms.
    # Measured: pooled 0.060 s, jsq 0.060 s (ratio 1.01); the p99 of ~5,400 post-warm-up
    # requests rests on ~54 in the top 1 %, and a 2x limit leaves a full step of queueing
    # at the p99 as margin, while random (4.3 s) and round_robin (0.54 s) are far outside.
    requests = bench.scenario(240.0, seed=1)
    pooled = bench.ttft_p99("pooled", requests, seed=1)
    default = bench.ttft_p99(DEFAULT_ROUTER, requests, seed=1)
    assert pooled <= 0.061
    assert default <= 2 * pooled
    assert DEFAULT_ROUTER in REALISTIC
    assert serving.simulate.__kwdefaults__["router"] == DEFAULT_ROUTER


@pytest.mark.parametrize("router", ["jsq", "least_requests"])
def test_the_heap_picks_what_a_full_scan_picks(monkeypatch, router):
    # The indexed routers refresh a replica's key only when simulate reports an event
    # there; a missed event would make the heap disagree with a scan of every replica.
    scanned = []
    init = Router.__init__

    def checked_init(self, *args, **kwargs):     # spy on the picker simulate calls
        init(self, *args, **kwargs)              # (bound in __init__ for the hot ones)
        original = self.pick

        def checked(i):
            target = original(i)
            best = min(self.engines, key=self.key)
            scanned.append(target is best)
            return target
        self.pick = checked

    monkeypatch.setattr(Router, "__init__", checked_init)
    spec = Replica(max_batch=4, max_batched_tokens=256 + 4, kv_capacity_tokens=4_000,
                   timeout_s=3.0)
    rng = np.random.default_rng(8)
    n = 400
    reqs = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / 8.0, n)),
                         "prompt_tokens": rng.integers(100, 1500, n),
                         "output_tokens": rng.integers(1, 300, n)})
    out = simulate(reqs, spec, replicas=4, router=router)
    assert out.preemptions.sum() > 0 and (out.outcome == "timed_out").any()
    assert len(scanned) == n and all(scanned)


@pytest.mark.parametrize("router", ["jsq", "least_requests"])
@pytest.mark.parametrize("scanned", [1, 4])
def test_the_heap_and_the_scan_agree_with_the_keys(monkeypatch, router, scanned):
    # A fleet of up to routers.SCANNED replicas is scanned at each arrival (one number
    # per replica), a larger one keeps a heap of keys: both pick the least key, the
    # lowest index on ties, as a scan of every replica's key does (SCANNED=1 forces the
    # heap on these 4 replicas, SCANNED=4 the scan).
    monkeypatch.setattr(routers, "SCANNED", scanned)
    test_the_heap_picks_what_a_full_scan_picks(monkeypatch, router)


def test_least_loaded_is_refused_with_its_new_name():
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [5]})
    with pytest.raises(ValueError, match="renamed 'oracle_work'"):
        simulate(reqs, Replica(), replicas=2, router="least_loaded")
    with pytest.raises(ValueError, match="router must be one of"):
        simulate(reqs, Replica(), replicas=2, router="fastest")


def test_router_options_are_checked_and_used():
    reqs = fleet_requests(1)
    spec = Replica(max_batch=6, max_batched_tokens=512 + 6, prefix_cache_blocks=64,
                   prefix_block_tokens=256)
    with pytest.raises(ValueError, match="router_options for 'kv_cost' takes"):
        simulate(reqs, spec, replicas=3, router="kv_cost", router_options={"weight": 1})
    with pytest.raises(ValueError, match="balance_rel"):
        simulate(reqs, spec, replicas=3, router="cache_aware",
                 router_options={"balance_rel": 0.5})
    with pytest.raises(ValueError, match="queue_weight"):
        simulate(reqs, spec, replicas=3, router="endpoint_picker",
                 router_options={"queue_weight": -1})
    # prefix weight 0 and a heavy queue weight: the picker spreads by queue alone
    base = simulate(reqs, spec, replicas=3, router="endpoint_picker", seed=1)
    queue_only = simulate(reqs, spec, replicas=3, router="endpoint_picker", seed=1,
                          router_options={"prefix_weight": 0.0})
    assert (base.replica != queue_only.replica).any()
    warm = simulate(reqs, spec, replicas=3, router="kv_cost", router_options={"temperature": 1.0},
                    seed=2)
    assert warm.replica.nunique() == 3


def test_affinity_keys_on_every_block_not_the_first():
    # Mooncake's first block is a system prompt shared by every request: keyed on it,
    # affinity degenerates to its load bound. Keyed on the longest run of matched
    # blocks, two conversations (blocks shared within each) stay apart while they fit.
    shared = 7
    rows = []
    for k in range(20):
        conversation = k % 2
        rows.append({"arrival_s": 5.0 * k, "prompt_tokens": 2048, "output_tokens": 5,
                     "hash_ids": [shared, 100 + conversation, 200 + conversation, 300 + k]})
    frame = pd.DataFrame(rows)
    out = simulate(frame, Replica(), replicas=4, router="affinity")
    assert (out.groupby(np.arange(20) % 2).replica.nunique() == 1).all()
    # a burst of prompts sharing only the first block spreads by load: the shared block
    # matches on every replica that has one, so it only breaks no tie
    burst = frame.assign(arrival_s=0.001 * np.arange(20), output_tokens=500,
                         hash_ids=[[shared, 500 + k, 600 + k, 700 + k] for k in range(20)])
    counts = simulate(burst, Replica(), replicas=4, router="affinity").replica.value_counts()
    assert len(counts) == 4 and counts.max() - counts.min() <= 1


def test_the_sets_partition_the_routers():
    assert set(REALISTIC) | set(BOUNDS) == set(routers.ROUTERS) == set(serving.ROUTERS)
    assert not set(REALISTIC) & set(BOUNDS)
