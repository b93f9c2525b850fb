"""The configuration search (issue 24): refusals, pruning, ranking, prices, Dask, cache, CLI,
and the confirmation of a screening search at longer statistics.

Every simulated search here is tiny (200-token prompts, 20-token outputs, 2 replications
of at least 100 requests, 8 slots), so the whole file runs in seconds; the answers are
not meant as capacity numbers, only as the same answers by different routes.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from servingcap import _search_cli as search_cli
from servingcap import configsearch as cs
from servingcap import planning
from servingcap.__main__ import main
from servingcap.roofline import gpu_table
from servingcap.traffic import data_dir

WORKLOAD = planning.PoissonWorkload(200, 20)
SMALL = dict(dtypes=("bf16",), modes=("mixed",), budgets=(512,), max_batches=(8,),
             limits={"ttft_s": 1.0, "tpot_s": 0.05}, budget=2, holds=1, min_requests=100)
GRID = dict(gpus=["L40S", "A100-40GB"], tps=(1, 2))
RATE = 12.0
LLAMA = json.loads((data_dir() / "model_configs" / "Llama-3.1-8B.json").read_text())


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=["cached"]), b.drop(columns=["cached"]))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("search-cache")


@pytest.fixture(scope="module")
def serial(cache):
    """The reference search: no pruning, in this process, filling the cache."""
    return cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **SMALL, prune=False,
                     executor=None, cache_dir=cache)


# --------------------------------------------------------------------------- search


def test_serial_search_ranks_every_fitting_configuration(serial):
    t = serial.table
    assert len(t) == 4 and serial.simulated == 4 and serial.from_cache == 0
    assert (t["status"] == "ranked").all()
    ranked = serial.ranked
    assert list(ranked["rank"]) == [1, 2, 3, 4]
    assert (np.diff(ranked["usd_per_mtok"]) >= 0).all()
    for row in ranked.itertuples():
        # GPUs = (replicas + spares) x tp; $/h = GPUs x price; $/Mtok by the formula
        assert row.gpus == (row.replicas + row.spares) * row.tp
        assert row.usd_per_hour == pytest.approx(row.gpus * row.usd_per_gpu_hour)
        assert row.usd_per_mtok == pytest.approx(
            row.usd_per_hour * 1e6 / (3600 * RATE * row.attainment * 20))
        assert row.usd_per_mtok_low <= row.usd_per_mtok <= row.usd_per_mtok_high
        assert row.replicas >= row.fluid_min and row.replicas_low <= row.replicas
        assert row.min_usd_per_mtok <= row.usd_per_mtok + 1e-9
    assert serial.conclusion.startswith(f"Cheapest: {ranked['label'].iloc[0]}")


def test_cache_resume_simulates_nothing(serial, cache):
    again = cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **SMALL, prune=False,
                      executor=None, cache_dir=cache)
    assert again.simulated == 0 and again.from_cache == 4
    assert again.table["cached"].all()
    _same(serial.table, again.table)


def test_pruning_keeps_the_answer_and_skips_costlier_bounds(serial, tmp_path):
    pruned = cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **SMALL, prune=True, wave=1,
                       executor=None, cache_dir=tmp_path)
    assert pruned.pruned >= 1
    assert pruned.simulated + pruned.pruned == 4
    best = pruned.ranked.iloc[0]
    assert best["label"] == serial.ranked["label"].iloc[0]
    assert best["usd_per_mtok"] == pytest.approx(serial.ranked["usd_per_mtok"].iloc[0])
    skipped = pruned.table.loc[pruned.table["status"] == "pruned"]
    assert (skipped["min_usd_per_mtok"] > best["usd_per_mtok_high"]).all()
    assert skipped["reason"].str.startswith("pruned: fluid bound costs more than $").all()
    assert skipped["replicas"].isna().all()          # not simulated


def test_dask_local_cluster_gives_identical_results(serial):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        on_dask = cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **SMALL, prune=False,
                            executor=client)
    assert on_dask.simulated == 4
    _same(serial.table, on_dask.table)


def test_progress_is_called_once_per_configuration(tmp_path):
    seen = []
    cs.search("Llama-3.1-8B", WORKLOAD, 2.0, gpus=["L40S"], tps=(1, 3), **SMALL,
              executor=None, progress=seen.append)
    assert [row["label"] for row in seen] == ["L40S tp1 bf16 mixed/512 B8"]


def test_refusals_are_recorded_not_raised():
    big = {**LLAMA, "num_hidden_layers": 320}              # ~ 4 x 80 GB of weights
    out = cs.search(big, WORKLOAD, 2.0, gpus=["L40S"], tps=(1, 3), **SMALL, executor=None)
    t = out.table
    assert out.simulated == 0 and (t["status"] == "refused").all()
    reasons = dict(zip(t["tp"], t["reason"], strict=True))
    assert "does not divide by tp=3" in reasons[3]
    assert "weights need" in reasons[1]
    # the KV cache holds the weights but not the slots asked for
    slots = cs.search("Llama-3.1-8B", planning.PoissonWorkload(60000, 20), 0.1,
                      gpus=["L40S"], tps=(1,), **{**SMALL, "max_batches": (64,)},
                      executor=None)
    row = slots.table.iloc[0]
    assert row["status"] == "refused" and "slots=64" in row["reason"]
    # an SLO no fleet meets is refused before simulating
    slow = cs.search("Llama-3.1-8B", WORKLOAD, 2.0, gpus=["L40S"], tps=(1,),
                     **{**SMALL, "limits": {"ttft_s": 1e-4, "tpot_s": 0.05}}, executor=None)
    assert slow.table["status"].iloc[0] == "refused"
    assert "no fleet can meet" in slow.table["reason"].iloc[0]


def test_bad_search_input_names_it():
    with pytest.raises(ValueError, match="gpus: no price for H200"):
        cs.search("Llama-3.1-8B", WORKLOAD, 2.0, gpus=["H200"], tps=(1,), **SMALL,
                  prices=cs.load_prices().query("gpu != 'H200'"), executor=None)
    with pytest.raises(ValueError, match="grid is empty"):
        cs.search("Llama-3.1-8B", WORKLOAD, 2.0, gpus=["A100-80GB"], tps=(1,),
                  **{**SMALL, "dtypes": ("fp8",)}, executor=None)
    with pytest.raises(ValueError, match="n_routed_experts"):      # DeepSeek-style MoE
        cs.search({**LLAMA, "n_routed_experts": 64}, WORKLOAD, 2.0, executor=None)
    with pytest.raises(ValueError, match="rate"):
        cs.search("Llama-3.1-8B", WORKLOAD, -1.0, executor=None)
    with pytest.raises(ValueError, match="wave"):
        cs.search("Llama-3.1-8B", WORKLOAD, 2.0, wave=0, executor=None)



# --------------------------------------------------------------------------- confirm
# The screening is the tiny search at 2 replications of >= 100 requests, 1 hold time,
# pruning in waves of one; the confirmation re-runs it at 4 replications of >= 300
# requests, 3 hold times (LONGER). Both are deterministic (seeded), so rows compare
# exactly with a search run at the confirmation's statistics.
LONGER = dict(budget=4, holds=3, min_requests=300)
SIM_COLUMNS = ["replicas", "replicas_low", "gpus", "usd_per_mtok", "usd_per_mtok_low",
               "usd_per_mtok_high", "attainment", "ttft_p99_s", "replications"]


@pytest.fixture(scope="module")
def screened():
    return cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **SMALL, wave=1,
                     executor=None)


@pytest.fixture(scope="module")
def confirmed(screened):
    return cs.confirm(screened, top=1, most=1, **LONGER, executor=None)


def test_confirm_reranks_by_its_own_results(screened, confirmed):
    full = cs.search("Llama-3.1-8B", WORKLOAD, RATE, **GRID, **{**SMALL, **LONGER},
                     prune=False, executor=None)
    t = confirmed.table
    assert list(t["label"]) == list(screened.table["label"])
    assert list(t.columns) == [*cs.RESULT_COLUMNS, *cs.SCREENED_COLUMNS]
    pd.testing.assert_series_equal(t["screened_status"], screened.table["status"],
                                   check_names=False)
    done = t["status"] == "ranked"
    # each confirmed row is the row a search at the confirmation's statistics gives
    # (confirm starts at the screened fleet; no undecided size lies on the way here)
    pd.testing.assert_frame_equal(t.loc[done, SIM_COLUMNS], full.table.loc[done, SIM_COLUMNS],
                                  check_dtype=False)     # ints there, floats beside NaN here
    # ranked by its own costs, not the screened ones; same cheapest as the full search
    assert (np.diff(confirmed.ranked["usd_per_mtok"]) >= 0).all()
    assert confirmed.ranked["label"].iloc[0] == full.ranked["label"].iloc[0]
    assert confirmed.simulated == int(done.sum()) and confirmed.from_cache == 0
    # what was not confirmed is pruned against the confirmed best, never ranked unchecked
    best_high = t.loc[done, "usd_per_mtok_high"].min()
    rest = t.loc[t["status"] == "pruned"]
    assert (rest["min_usd_per_mtok"] > best_high).all()
    assert rest["reason"].str.startswith("pruned at confirmation: fluid bound").all()
    assert confirmed.conclusion.startswith(f"Cheapest: {confirmed.ranked['label'].iloc[0]}")


def test_confirm_takes_the_shortlist_then_every_bound_below_the_answer(screened, confirmed):
    # top=1, most=1: only the screened cheapest is on the shortlist; every other row
    # confirmed got there by its fluid bound, at most the confirmed best's high end
    t = confirmed.table
    first = screened.ranked.index[0]
    assert t.loc[first, "status"] in ("ranked", "failed")
    others = t.loc[(t.index != first) & t["status"].isin(["ranked", "failed"])]
    best_high = t.loc[t["status"] == "ranked", "usd_per_mtok_high"].min()
    assert (others["min_usd_per_mtok"] <= best_high).all()


def test_confirm_refuses_bad_input(screened):
    for kwargs, name in (({"top": 0}, "top"), ({"most": 0}, "most"),
                         ({"top": 3, "most": 2}, "most"), ({"budget": 0}, "budget"),
                         ({"holds": -1.0}, "holds"), ({"min_requests": 50}, "min_requests"),
                         ({"wave": 0}, "wave"), ({"executor": "bogus"}, "executor"),
                         ({"cache_dir": 3}, "cache_dir"), ({"progress": 3}, "progress")):
        with pytest.raises(ValueError, match=name):
            cs.confirm(screened, **kwargs)
    with pytest.raises(ValueError, match="result must be the SearchResult"):
        cs.confirm(screened.table)
    big = {**LLAMA, "num_hidden_layers": 320}              # fits nowhere: nothing ranked
    none = cs.search(big, WORKLOAD, 2.0, gpus=["L40S"], tps=(1,), **SMALL, executor=None)
    with pytest.raises(ValueError, match="result ranks no configuration"):
        cs.confirm(none)


def test_confirm_gives_the_same_table_on_any_executor_and_from_its_cache(
        screened, confirmed, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        pooled = cs.confirm(screened, top=1, most=1, **LONGER, executor=pool,
                            cache_dir=tmp_path)
    _same(confirmed.table, pooled.table)
    again = cs.confirm(screened, top=1, most=1, **LONGER, executor=None, cache_dir=tmp_path)
    assert again.simulated == 0 and again.from_cache == pooled.simulated
    _same(confirmed.table, again.table)


def test_grid_keeps_fp8_where_the_gpu_has_it():
    configs = cs.grid(["A100-80GB", "H100-SXM"], tps=(1, 2), modes=("mixed", "combined"),
                      budgets=(512, 2048), max_batches=(16,))
    a100 = [c for c in configs if c.gpu == "A100-80GB"]
    assert {c.dtype for c in a100} == {"bf16"}
    assert {c.dtype for c in configs if c.gpu == "H100-SXM"} == {"bf16", "fp8"}
    # mixed: one per budget; combined: no budget
    assert len(a100) == 2 * (2 + 1)
    assert {c.max_batched_tokens for c in configs if c.mode == "combined"} == {None}
    with pytest.raises(ValueError, match="unknown|not in data/gpus.csv"):
        cs.grid(["B300"])


# --------------------------------------------------------------------------- ranking


def _synthetic(rows):
    base = {"status": "ranked", "label": "", "usd_per_mtok": 1.0, "ttft_p99_s": 0.1}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_rank_orders_by_cost_then_ttft():
    t = _synthetic([{"label": "a", "usd_per_mtok": 2.0, "ttft_p99_s": 0.1},
                    {"label": "b", "usd_per_mtok": 1.0, "ttft_p99_s": 0.3},
                    {"label": "c", "usd_per_mtok": 1.0, "ttft_p99_s": 0.2},
                    {"label": "d", "status": "pruned", "usd_per_mtok": 0.1}])
    assert list(cs.rank(t)["label"]) == ["c", "b", "a"]
    assert list(cs.rank(t)["rank"]) == [1, 2, 3]


def test_pareto_front_on_synthetic_points():
    t = _synthetic([{"label": "cheap-slow", "usd_per_mtok": 1.0, "ttft_p99_s": 0.5},
                    {"label": "mid", "usd_per_mtok": 2.0, "ttft_p99_s": 0.2},
                    {"label": "dominated", "usd_per_mtok": 2.5, "ttft_p99_s": 0.3},
                    {"label": "fast", "usd_per_mtok": 4.0, "ttft_p99_s": 0.1},
                    {"label": "tie", "usd_per_mtok": 2.0, "ttft_p99_s": 0.2},
                    {"label": "nan", "usd_per_mtok": math.nan, "ttft_p99_s": 0.01}])
    front = cs.pareto_front(t)
    assert list(t.loc[front, "label"]) == ["cheap-slow", "mid", "fast", "tie"]


def _pair(best_high, floor):
    row = {"status": "ranked", "replicas": 2, "spares": 1, "gpus": 3, "usd_per_hour": 3.0,
           "usd_per_mtok_low": 0.9, "ttft_p99_s": 0.1}
    return pd.DataFrame([
        {**row, "label": "A", "usd_per_mtok": 1.0, "usd_per_mtok_high": best_high,
         "min_separating_usd_per_mtok": 0.5},
        {**row, "label": "B", "usd_per_mtok": 1.5, "usd_per_mtok_high": 1.6,
         "min_separating_usd_per_mtok": floor}])


def test_conclusion_says_separated_only_when_it_is():
    assert "runner-up B $1.50 (+50.0%), separated" in cs.conclusion(_pair(1.1, 1.2))
    text = cs.conclusion(_pair(1.1, 1.05))
    assert "not separated" in text and "$1.05" in text
    assert "No configuration meets" in cs.conclusion(_pair(1.1, 1.2).assign(status="failed"))
    alone = _pair(1.1, 1.2).iloc[:1]
    assert cs.conclusion(alone).endswith("; no other configuration meets the SLO.")
    # a pruned row was not simulated: the line does not say it misses
    pruned = pd.concat([alone, _pair(1.1, 1.2).iloc[1:].assign(status="pruned")])
    assert cs.conclusion(pruned).endswith(
        "; no other configuration was shown to meet the SLO (1 pruned: a lower bound on "
        "each one's cost is above this one's).")


def _trio(costs, floors, spares=1, replicas=(2, 2, 2), tps=(1, 1, 1)):
    """Three ranked rows A, B, C: costs per million good tokens and their lowest still
    possible costs (``min_separating``); A's high end is its cost + 0.05."""
    rows = []
    for label, cost, floor, n, tp in zip("ABC", costs, floors, replicas, tps, strict=True):
        rows.append({"label": label, "status": "ranked", "replicas": n, "spares": spares,
                     "gpus": (n + spares) * tp, "usd_per_hour": 3.0, "ttft_p99_s": 0.1,
                     "usd_per_mtok": cost, "usd_per_mtok_low": cost - 0.05,
                     "usd_per_mtok_high": cost + 0.05, "min_separating_usd_per_mtok": floor})
    return pd.DataFrame(rows)


def test_conclusion_names_every_configuration_not_separated():
    # B is separated (floor 1.3 > A's high end 1.05); C, third, is not (floor 1.0): the
    # line names C, not only the runner-up
    text = cs.conclusion(_trio((1.0, 1.4, 1.6), (0.5, 1.3, 1.0)))
    assert "runner-up B $1.40 (+40.0%), separated" in text
    assert "also not separated from the cheapest: C $1.60 (as little as $1.00)" in text
    assert "tie on price" not in text and text.count("\n") == 0
    text = cs.conclusion(_trio((1.0, 1.4, 1.6), (0.5, 1.3, 1.2)))
    assert "not separated" not in text


def test_conclusion_calls_a_gap_inside_the_price_tolerance_a_tie():
    # B is separated (statistically) but only 3 % dearer: a tie on price at the 10 %
    # default, not at a 2 % tolerance; C (+8 %) ties at 10 % too
    table = _trio((1.0, 1.03, 1.08), (0.5, 1.06, 1.07))
    text = cs.conclusion(table)
    assert "runner-up B $1.03 (+3.0%), separated" in text
    assert ("a tie on price: B (+3.0%), C (+8.0%) within the 10% price tolerance of the "
            "cheapest, so the choice turns on your prices") in text
    assert "tie on price: B (+3.0%) within the 2% price tolerance" not in text
    assert "tie on price" not in cs.conclusion(table, price_tolerance=0.02)
    assert "within the 5% price tolerance" in cs.conclusion(table, price_tolerance=0.05)
    for bad in (-0.1, 1.0, "x", math.nan):
        with pytest.raises(ValueError, match="price_tolerance"):
            cs.conclusion(table, price_tolerance=bad)


def test_conclusion_says_when_the_spare_decides_the_order():
    # A: 4 + 1 replicas at $1.00; B: 2 + 1 at $1.03. Without the spare A costs 1.00 x 4/5
    # = 0.80 and B 1.03 x 2/3 = 0.687: B would be cheaper, so the spare decides
    table = _trio((1.0, 1.03, 1.5), (0.5, 1.06, 1.6), replicas=(4, 2, 2))
    assert "the spare replicas decide the order (B cheaper without them)" in cs.conclusion(table)
    assert "spare replicas decide" not in cs.conclusion(table.assign(spares=0))


def test_conclusion_says_when_the_spare_decides_an_order_outside_the_tolerance():
    # A: 4 + 1 replicas at $1.00; B: 1 + 1 at $1.50, +50 %, no tie. Without the spare A
    # costs 1.00 x 4/5 = 0.80 and B 1.50 x 1/2 = 0.75: only the spare puts A first
    table = _trio((1.0, 1.5, 2.0), (0.5, 1.4, 1.9), replicas=(4, 1, 4))
    text = cs.conclusion(table)
    assert "tie on price" not in text
    assert text.endswith("outside the price tolerance, the spare replicas alone decide the "
                         "order: B cheaper than the cheapest without them.")
    # C: 2.00 x 4/5 = 1.60 > 0.80, and without spares nothing is flagged
    assert "C cheaper" not in text
    assert "alone decide" not in cs.conclusion(table.assign(spares=0))


def test_usd_per_mtok_formula():
    # 10 GPUs at $2: $20/h; 10 req/s x 3600 s x 0.5 x 100 tokens = 1.8 M good tokens/h
    assert cs.usd_per_mtok(20.0, 10.0, 0.5, 100.0) == pytest.approx(20 / 1.8)
    assert cs.usd_per_mtok(20.0, 10.0, 0.0, 100.0) == math.inf
    with pytest.raises(ValueError, match="attainment"):
        cs.usd_per_mtok(20.0, 10.0, 1.5, 100.0)


# --------------------------------------------------------------------------- prices


def test_shipped_prices_cover_every_gpu_with_a_source_and_date():
    prices = cs.load_prices()
    assert set(prices["gpu"]) == set(gpu_table()["gpu"])
    assert (prices["usd_per_gpu_hour"] > 0).all()
    assert prices["source"].str.contains("http|example value, unverified").all()
    assert prices["date"].str.match(r"^\d{4}-\d{2}").all()


@pytest.mark.parametrize("text, match", [
    ("gpu,usd_per_gpu_hour,source\nL40S,1,x\n", "lacks the column"),
    ("gpu,usd_per_gpu_hour,source,date\nL40S,-1,x,2026-01\n", "usd_per_gpu_hour must be"),
    ("gpu,usd_per_gpu_hour,source,date\nL40S,1,x,2026-01\nl40s,2,y,2026-01\n", "twice"),
    ("gpu,usd_per_gpu_hour,source,date\nL40S,1,x,yesterday\n", "date must be"),
    ("gpu,usd_per_gpu_hour,source,date\nL40S,1,,2026-01\n", "source must"),
    ("gpu,usd_per_gpu_hour,source,date\n", "no rows"),
])
def test_price_file_validation(tmp_path, text, match):
    path = tmp_path / "prices.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        cs.load_prices(path)


def test_price_overrides():
    table = cs.resolve_prices(None, {"h100-sxm": 2.5})
    row = table.set_index("gpu").loc["H100-SXM"]
    assert row["usd_per_gpu_hour"] == 2.5 and row["source"] == "command line"
    assert cs.parse_price("L40S=0.9") == ("L40S", 0.9)
    for bad in ("L40S", "L40S=abc", "L40S=-1", "=1"):
        with pytest.raises(ValueError, match="price"):
            cs.parse_price(bad)
    with pytest.raises(ValueError, match="B300"):
        cs.resolve_prices(None, {"B300": 9.0})
    table = cs.resolve_prices(None, {"L40S": 0.9}, override_source="config file s.toml")
    assert table.set_index("gpu").loc["L40S", "source"] == "config file s.toml"
    with pytest.raises(ValueError, match="override_source"):
        cs.resolve_prices(None, {"L40S": 0.9}, override_source=" ")


# --------------------------------------------------------------------------- CLI


def _cli(capsys, *args):
    code = main(["search", *args])
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["--model-config", "Llama-3.1-8B", "--rate", "2", "--prompt-tokens", "200",
        "--output-tokens", "20", "--budgets", "512", "--max-batch", "8", "--budget", "2",
        "--holds", "1", "--workers", "1", "--no-cache", "--no-progress", "--dtypes", "bf16"]


@pytest.mark.parametrize("extra, option", [
    (["--gpus", "B300"], "--gpus"),
    (["--gpus", "L40S", "--price", "L40S"], "--price"),
    (["--gpus", "L40S,,H200"], "--gpus"),
    (["--gpus", "A100-80GB", "--dtypes", "fp8"], "--dtypes"),
    (["--tp", "0"], "--tp"),
    (["--wave", "0"], "--wave"),
    (["--price", "B300=1"], "--price"),
    (["--no-cache", "--cache-dir", "x"], "--cache-dir"),
    (["--output", "x.txt"], "--output"),
    (["--plot", "x.svg"], "--plot"),
    (["--price-tolerance", "100"], "--price-tolerance"),
    (["--price-tolerance", "-5"], "--price-tolerance"),
    (["--confirm", "0"], "--confirm"),
    (["--confirm", "1.5"], "--confirm"),
    (["--confirm", "two"], "--confirm"),
    (["--confirm-budget", "4"], "--confirm-budget"),           # without --confirm
    (["--confirm", "1", "--confirm-budget", "0"], "--confirm-budget"),
    (["--confirm", "1", "--confirm-holds", "-1"], "--confirm-holds"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, extra, option):
    code, out, err = _cli(capsys, *BASE, *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and option in err


def test_cli_refuses_missing_price_and_a_model_that_fits_nowhere(capsys, tmp_path):
    prices = tmp_path / "prices.csv"
    prices.write_text("gpu,usd_per_gpu_hour,source,date\nL40S,1.0,example value, "
                      "unverified,2026-01\n")
    code, _, err = _cli(capsys, *BASE, "--prices", str(prices))
    assert code == 2 and "--prices" in err          # the unquoted comma breaks the CSV
    prices.write_text('gpu,usd_per_gpu_hour,source,date\nL40S,1.0,"example value, '
                      'unverified",2026-01\n')
    code, _, err = _cli(capsys, *BASE, "--prices", str(prices), "--gpus", "L40S,H200")
    assert code == 2 and "--gpus" in err and "H200 without a price" in err
    big = tmp_path / "config.json"
    big.write_text(json.dumps({**LLAMA, "num_hidden_layers": 320}))
    code, _, err = _cli(capsys, *BASE, "--model-config", str(big), "--gpus", "L40S",
                        "--tp", "1")
    assert code == 2 and "--model-config" in err and "fits no configuration" in err
    assert err.count("\n") == 1
    code, _, err = _cli(capsys, *BASE[2:])
    assert code == 2 and "--model-config is required" in err


def test_cli_report_output_and_plot(capsys, tmp_path):
    out_json, plot = tmp_path / "r.json", tmp_path / "r.png"
    # the command line has no --min-requests: each replication is 2,000 requests, so the
    # requests are kept tiny here (the report's numbers are not the point)
    code, out, err = _cli(capsys, *BASE, "--gpus", "L40S", "--tp", "1,3", "--price",
                          "L40S=1", "--prompt-tokens", "50", "--output-tokens", "2",
                          "--output", str(out_json), "--plot", str(plot))
    assert code == 0, err
    assert "  L40S         1.000  command line (no date)" in out
    assert "Cheapest: L40S tp1 bf16 mixed/512 B8" in out
    data = json.loads(out_json.read_text())
    assert "Refused:\n  L40S tp3 bf16 mixed/512 B8: num_attention_heads 32" in out
    assert len(data["configurations"]) == 2 and data["conclusion"].startswith("Cheapest")
    assert data["price_tolerance"] == 0.1
    assert plot.stat().st_size > 1000


def test_cli_bad_confirm_names_the_option_and_the_value(capsys):
    code, out, err = _cli(capsys, *BASE, "--confirm", "-2")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--confirm must be a whole number >= 1, got '-2'" in err


def test_cli_confirm_reports_and_writes_the_confirmed_ranking(capsys, tmp_path,
                                                              monkeypatch):
    # the screen at 2 replications of 1 hold time, the confirmation at 4 of 3, both of at
    # least 2,000 requests (the command line's); tiny requests keep it to seconds
    out_json, out_csv, cache = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "cache"
    args = [*(a for a in BASE if a != "--no-cache"), "--cache-dir", str(cache), "--gpus",
            "L40S,A100-40GB", "--tp", "1,2", "--prompt-tokens", "50", "--output-tokens", "2",
            "--confirm", "1", "--confirm-budget", "4", "--confirm-holds", "3"]
    code, out, err = _cli(capsys, *args, "--output", str(out_json))
    assert code == 0, err
    # the library's answer at the same settings, screen then confirm
    screen = cs.search("Llama-3.1-8B", planning.PoissonWorkload(50, 2), 2.0,
                       gpus=["L40S", "A100-40GB"], tps=(1, 2), **{**SMALL,
                                                                  "min_requests": 2000},
                       executor=None)
    confirmed = cs.confirm(screen, top=1, most=6, budget=4, holds=3, min_requests=2000,
                           executor=None)
    assert "Confirmation (--confirm 1): the screen's 1 cheapest" in out
    screen_stats = "up to 2 replications of 1 hold times, at least 2,000 requests each"
    confirm_stats = "up to 4 replications of 3 hold times, at least 2,000 requests each"
    assert f"\nScreen ({screen_stats}): {screen.conclusion}\n" in out
    assert out.endswith(f"\nConfirmed ({confirm_stats}): {confirmed.conclusion}\n")
    best = confirmed.ranked.iloc[0]
    assert f"\n   1* {best['label']}" in out.split("Confirmation (--confirm 1)")[1]
    data = json.loads(out_json.read_text())
    rows = data["confirmation"]["configurations"]
    assert [r["label"] for r in rows] == list(confirmed.table["label"])
    assert [r["status"] for r in rows] == list(confirmed.table["status"])
    assert {r["stage"] for r in rows} == {"confirm"}
    assert {r["stage"] for r in data["configurations"]} == {"screen"}
    assert data["confirmation"]["conclusion"] == confirmed.conclusion
    assert data["confirmation"]["statistics"]["budget"] == 4
    assert data["confirmation"]["statistics"]["holds"] == 3
    assert data["statistics"]["budget"] == 2
    # the same command again: both stages come from the cache; the CSV holds both stages,
    # and the plot shows the confirmed answers, titled as such
    drawn = []
    monkeypatch.setattr(search_cli, "plot", lambda *a: drawn.append(a))
    code, out, err = _cli(capsys, *args, "--output", str(out_csv), "--plot",
                          str(tmp_path / "r.png"))
    assert code == 0, err
    (plotted, _, stage), = drawn
    assert stage == "confirmed"
    assert list(plotted.table["label"]) == list(confirmed.table["label"])
    assert plotted.table["replicas"].equals(confirmed.table["replicas"])
    done = int(confirmed.table["status"].isin(["ranked", "failed"]).sum())
    line = next(x for x in out.splitlines() if x.startswith("Confirmed: "))
    assert line.endswith(f"; 0 simulated, {done} read from the cache")
    table = pd.read_csv(out_csv)
    assert list(table["stage"]) == ["screen"] * 4 + ["confirm"] * 4
    both = table.loc[table["stage"] == "confirm"].reset_index(drop=True)
    assert list(both["status"]) == list(confirmed.table["status"])
    assert list(both["screened_status"]) == list(screen.table["status"])


def test_cli_config_file_gives_the_same_search_and_the_command_line_wins(capsys, tmp_path):
    # the flags of test_cli_report_output_and_plot as a TOML file: lists and a price table
    flags = [*BASE, "--gpus", "L40S", "--tp", "1", "--price", "L40S=1",
             "--prompt-tokens", "50", "--output-tokens", "2"]
    code, by_flags, err = _cli(capsys, *flags)
    assert code == 0, err
    config = tmp_path / "search.toml"
    config.write_text(
        "[search]\nmodel-config = \"Llama-3.1-8B\"\nrate = 2\nprompt-tokens = 50\n"
        "output-tokens = 2\nbudgets = [512]\nmax-batch = 8\nbudget = 2\nholds = 1\n"
        "workers = 1\nno-progress = true\ndtypes = [\"bf16\"]\ngpus = [\"L40S\"]\n"
        "tp = [1]\nprice = { L40S = 1 }\n")
    code, by_file, err = _cli(capsys, "--config", str(config),
                              "--no-cache")
    assert code == 0, err
    # the same search; the price row says the price came from the config file
    assert f"  L40S         1.000  config file {config} (no date)" in by_file
    assert by_file.replace(f"config file {config}", "command line") == by_flags
    code, out, err = _cli(capsys, "--config", str(config), "--no-cache", "--price", "L40S=2")
    assert code == 0, err
    assert "  L40S         2.000  command line" in out          # the command line wins
    config.write_text("rate = 2\nbogus = 1\n")
    code, out, err = _cli(capsys, "--config", str(config), *BASE)
    assert code == 2 and out == "" and "unknown key 'bogus'" in err
    code, out, err = _cli(capsys, "--config", str(tmp_path / "missing.toml"), *BASE)
    assert code == 2 and "--config" in err
