"""Disaggregated designs in the configuration search (issue 24): the decode pool's fluid
bound, the two-pool search, the search's rows, cache, executors and bad input.

The workloads are tiny (short requests, 2 replications of at least 100 requests) so each
test runs in seconds; the answers are not capacity numbers, only the same answers by
different routes and the invariants of the procedure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from servingcap import configsearch as cs
from servingcap import disagg, parallel, planning
from servingcap.__main__ import main
from servingcap.roofline import Roofline, gpu_table, model_config, read_config
from servingcap.serving import Replica, simulate

WORKLOAD = planning.PoissonWorkload(200, 20)
SMALL = dict(dtypes=("bf16",), modes=("mixed",), budgets=(512,), max_batches=(8,),
             limits={"ttft_s": 1.0, "tpot_s": 0.05}, budget=2, holds=1, min_requests=100)
BOTH = ("colocated", "disaggregated")
RATE = 12.0


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("disagg-cache")


@pytest.fixture(scope="module")
def serial(cache):
    """Both designs on one GPU, tp 1 and 2, no pruning, in this process."""
    return cs.search("Llama-3.1-8B", WORKLOAD, RATE, gpus=["L40S"], tps=(1, 2), **SMALL,
                     designs=BOTH, prune=False, executor=None, cache_dir=cache)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=["cached"]), b.drop(columns=["cached"]))


# --------------------------------------------------------------------------- fluid bound


@pytest.mark.parametrize("costed", ["roofline", "built-in"])
def test_decode_pool_fluid_bound_is_proven(costed):
    """A saturated decode pool (every request waiting within the first millisecond)
    never completes requests faster than its fluid rate: the bound is a proof, so no
    tolerance beyond rounding."""
    if costed == "roofline":
        spec = model_config(read_config("Llama-3.1-8B")[0])
        base = Replica(max_batch=32, mode="mixed", max_batched_tokens=2048,
                       step_time=Roofline(spec, "H100-SXM"))
    else:
        base = Replica(max_batch=32)
    pool = disagg.decode_pool_replica(base)
    assert callable(getattr(pool.step_time, "fluid_work_s", None))
    rng = np.random.default_rng(7)
    n = 600
    requests = pd.DataFrame({"arrival_s": np.linspace(0.0, 1e-3, n),
                             "prompt_tokens": rng.integers(200, 3000, n),
                             "output_tokens": rng.integers(20, 300, n)})
    bound = planning.fluid_rate(requests, pool)
    out = simulate(requests, pool, replicas=1)
    assert (out["outcome"] == "done").all()
    assert n / out["finish_s"].max() <= bound * (1 + 1e-9)


def test_decode_pool_without_a_stated_bound_keeps_the_estimate():
    def step(batch, prefill_tokens, context):
        return 0.01 + 0.001 * batch
    pool = disagg.decode_pool_replica(Replica(step_time=step))
    assert not hasattr(pool.step_time, "fluid_work_s")


# --------------------------------------------------------------------------- two pools


@pytest.fixture(scope="module")
def pools():
    """The built-in replica at 30 req/s of 1,000 / 100-token requests: the prefill
    pool must grow past its fluid guess, so the grow and shrink steps both run."""
    return disagg.smallest_pools(
        planning.PoissonWorkload(1000, 100), Replica(mode="prefill_first",
                                                     max_batched_tokens=4096),
        Replica(), 30.0, limits={"ttft_s": 1.0, "tpot_s": 0.035}, budget=4, holds=3,
        min_requests=300, seed=1)


def test_smallest_pools_meets_and_one_fewer_is_not_shown_to_meet(pools):
    t = pools.evaluations
    assert pools.row()["verdict"] == "meets"
    assert len(t) >= 2                            # it grew or shrank at least once
    for pool, below, floor in (("prefill_replicas", pools.prefill_below,
                                pools.prefill_fluid_min),
                               ("decode_replicas", pools.decode_below,
                                pools.decode_fluid_min)):
        other = "decode_replicas" if pool == "prefill_replicas" else "prefill_replicas"
        n = getattr(pools, pool)
        assert n >= floor
        fewer = t[(t[pool] == n - 1) & (t[other] == getattr(pools, other))]
        if below == "fluid bound":
            assert n - 1 < floor and fewer.empty
        else:
            assert below in ("misses", "open")
            assert fewer["verdict"].iloc[-1] in (("misses", "unstable") if below == "misses"
                                                 else ("open",))
    # the sizes tried are never below either fluid bound
    assert (t["prefill_replicas"] >= pools.prefill_fluid_min).all()
    assert (t["decode_replicas"] >= pools.decode_fluid_min).all()


def test_pool_fluid_bounds_match_the_answer(pools):
    busy = disagg.pool_fluid_bounds(planning.PoissonWorkload(1000, 100),
                                    Replica(mode="prefill_first", max_batched_tokens=4096),
                                    Replica(), 30.0)
    assert [int(np.floor(b)) + 1 for b in busy] == [pools.prefill_fluid_min,
                                                    pools.decode_fluid_min]


# --------------------------------------------------------------------------- search


def test_disaggregated_rows_are_ranked_and_priced(serial):
    t = serial.table
    split = t[t["design"] == "disaggregated"]
    assert len(t) == 6 and len(split) == 4 and serial.simulated == 6
    assert (t["status"] == "ranked").all()
    assert list(serial.ranked["rank"]) == list(range(1, 7))
    price = float(cs.load_prices().set_index("gpu").loc["L40S", "usd_per_gpu_hour"])
    # half the L40S's bidirectional PCIe figure per GPU of the smaller replica
    link = float(gpu_table().set_index("gpu").loc["L40S", "link_gb_per_s"]) / 2
    for row in split.itertuples():
        assert row.label == (f"L40S bf16 disagg P tp{int(row.prefill_tp)}/512 / "
                             f"D tp{int(row.tp)} B8")
        assert row.replicas == row.prefill_replicas + row.decode_replicas
        assert row.spares == 2                     # one per pool
        assert row.gpus == ((row.prefill_replicas + 1) * row.prefill_tp
                            + (row.decode_replicas + 1) * row.tp)
        assert row.usd_per_hour == pytest.approx(row.gpus * price)
        assert row.usd_per_mtok == pytest.approx(
            row.usd_per_hour * 1e6 / (3600 * RATE * row.attainment * 20))
        assert row.min_usd_per_mtok <= row.usd_per_mtok + 1e-9
        assert row.min_separating_usd_per_mtok <= row.usd_per_mtok_high + 1e-9
        assert row.kv_link_gb_per_s == pytest.approx(min(row.tp, row.prefill_tp) * link)
        assert row.below_verdict.startswith("P-1 ")
    assert t.loc[t["design"] == "colocated", "prefill_tp"].isna().all()
    assert t["pareto"].dtype == bool and t["pareto"].any()
    best = serial.ranked.iloc[0]
    assert serial.conclusion.startswith(f"Cheapest: {best['label']}")
    if best["design"] == "disaggregated":
        assert " prefill + " in serial.conclusion


def test_colocated_only_by_default():
    configs = cs.grid(["L40S"], tps=(1, 2), dtypes=("bf16",))
    assert all(c.design == "colocated" for c in configs)
    both = cs.grid(["L40S", "H100-SXM"], tps=(1, 2), dtypes=("bf16", "fp8"), designs=BOTH)
    colocated = cs.grid(["L40S", "H100-SXM"], tps=(1, 2), dtypes=("bf16", "fp8"))
    # the colocated configurations first, unchanged; then both GPUs in bf16 and fp8:
    # 4 GPU-dtype pairs x 2 prefill x 2 decode degrees
    assert both[:len(colocated)] == colocated
    split = both[len(colocated):]
    assert len(split) == 16 and all(c.design == "disaggregated" for c in split)


def test_disaggregated_cache_round_trip(serial, cache):
    again = cs.search("Llama-3.1-8B", WORKLOAD, RATE, gpus=["L40S"], tps=(1, 2), **SMALL,
                      designs=BOTH, prune=False, executor=None, cache_dir=cache)
    assert again.simulated == 0 and again.from_cache == 6
    _same(serial.table, again.table)


def test_pool_executor_gives_identical_results(serial):
    out = cs.search("Llama-3.1-8B", WORKLOAD, RATE, gpus=["L40S"], tps=(1, 2), **SMALL,
                    designs=BOTH, prune=False, executor=parallel.local_pool(2))
    assert out.simulated == 6
    _same(serial.table, out.table)


def test_dask_local_cluster_gives_identical_results_with_disaggregated_rows(serial):
    # as test_configsearch's colocated Dask test, on the grid with four split designs
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, \
            distributed.get_task_stream(client) as stream:
        on_dask = cs.search("Llama-3.1-8B", WORKLOAD, RATE, gpus=["L40S"], tps=(1, 2),
                            **SMALL, designs=BOTH, prune=False, executor=client)
    # every configuration ran as a task on the cluster (waves of 4 then 2)
    assert sum(task["key"].startswith("_simulate") for task in stream.data) == 6
    assert on_dask.simulated == 6
    assert (on_dask.table["design"] == "disaggregated").sum() == 4
    _same(serial.table, on_dask.table)


def test_a_pool_that_does_not_fit_is_refused_by_name():
    out = cs.search("Llama-3.1-70B", WORKLOAD, RATE, gpus=["L40S"], tps=(1,), **SMALL,
                    designs=("disaggregated",), executor=None)
    row = out.table.iloc[0]
    assert row["status"] == "refused" and row["reason"].startswith("prefill pool: ")


def test_a_prefill_cap_below_the_prompts_is_refused_not_grown():
    out = cs.search("Llama-3.1-8B", planning.PoissonWorkload(600, 20), RATE, gpus=["L40S"],
                    tps=(1,), **SMALL, designs=("disaggregated",), executor=None)
    row = out.table.iloc[0]
    assert row["status"] == "refused" and "longer than its batch cap of 512" in row["reason"]
    # the two-pool search itself stops at once: every prompt is rejected at any size
    with pytest.raises(ValueError, match="more replicas will not help"):
        disagg.smallest_pools(planning.PoissonWorkload(600, 20),
                              Replica(mode="prefill_first", max_batched_tokens=512),
                              Replica(), 2.0, budget=2, holds=1, min_requests=100)


def test_bad_disaggregated_input_names_it():
    with pytest.raises(ValueError, match="prefill_tp"):
        cs.DisaggConfig("L40S", "bf16", 0, 1, 512, 8)
    with pytest.raises(ValueError, match="dtype"):
        cs.DisaggConfig("L40S", "int4", 1, 1, 512, 8)
    with pytest.raises(ValueError, match="designs"):
        cs.grid(["L40S"], designs=("split",))
    with pytest.raises(ValueError, match="kv_link_gb_per_s"):
        cs.search("Llama-3.1-8B", WORKLOAD, RATE, gpus=["L40S"], **SMALL, designs=BOTH,
                  kv_link_gb_per_s=0, executor=None)
    with pytest.raises(ValueError, match="decode_replica"):
        disagg.smallest_pools(WORKLOAD, Replica(), "H100", 1.0)


@pytest.mark.parametrize("extra, option", [
    (["--designs", "colocated,split"], "--designs"),
    (["--designs", ""], "--designs"),
    (["--kv-link-gbps", "-1"], "--kv-link-gbps"),
])
def test_cli_bad_disaggregated_input_is_one_line_exit_2(capsys, extra, option):
    code = main(["search", "--model-config", "Llama-3.1-8B", "--rate", "2", "--gpus",
                 "L40S", "--no-cache", "--no-progress", *extra])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and option in err


def test_confirm_keeps_a_disaggregated_row_a_disaggregated_configuration(serial):
    # The confirmation rebuilds each row's configuration from the table: a split row must
    # come back as a split design (its pools, its GPUs), not as a colocated one.
    done = cs.confirm(serial, top=6, most=6, budget=2, holds=1, min_requests=100,
                      executor=None)
    split = done.table[done.table["design"] == "disaggregated"]
    assert len(split) == 4 and (split["status"] == "ranked").all()
    for row in split.itertuples():
        assert row.replicas == row.prefill_replicas + row.decode_replicas
        assert row.gpus == ((row.prefill_replicas + 1) * row.prefill_tp
                            + (row.decode_replicas + 1) * row.tp)
