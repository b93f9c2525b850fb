"""Tests of servingcap.goodput: the seed's batch-size curve and the 1,000-vs-650 example."""

import math

import numpy as np
import pandas as pd
import pytest
from servingcap import goodput as gp
from servingcap import slo
from servingcap.serving import Replica, simulate
from servingcap.sweep import poisson_requests

SEED_CURVE = {16: 0.020, 32: 0.030, 64: 0.055}


def test_seed_batch_numbers():
    curve = gp.batch_curve(SEED_CURVE, 0.050).set_index("batch")
    assert curve.loc[16, "tokens_per_s"] == pytest.approx(800.0)
    assert curve.loc[32, "tokens_per_s"] == pytest.approx(1066.67, abs=0.01)
    assert curve.loc[64, "tokens_per_s"] == pytest.approx(1163.64, abs=0.01)
    assert round(curve.loc[32, "tokens_per_s"]) == 1067
    assert round(curve.loc[64, "tokens_per_s"]) == 1164
    assert curve["feasible"].tolist() == [True, True, False]
    assert curve.loc[64, "goodput_tokens_per_s"] == 0.0
    # raw throughput peaks at 64; the feasible optimum is 32
    assert curve["tokens_per_s"].idxmax() == 64
    assert gp.best_feasible_batch(SEED_CURVE, 0.050) == (32.0, pytest.approx(1066.67, abs=0.01))


def test_max_feasible_batch_solves_step_equals_slo():
    b = gp.max_feasible_batch(SEED_CURVE, 0.050)
    assert b == pytest.approx(57.6)
    from servingcap.llm import decode_step_time
    assert decode_step_time(b, SEED_CURVE) == pytest.approx(0.050)
    assert gp.max_feasible_batch(SEED_CURVE, 0.025) == pytest.approx(24.0)
    assert gp.max_feasible_batch(SEED_CURVE, 0.100) == pytest.approx(64 + 0.045 / (0.025 / 32))
    assert gp.max_feasible_batch({32: 0.03}, 0.05) == math.inf
    with pytest.raises(ValueError, match="tpot_slo_s"):
        gp.max_feasible_batch({32: 0.06}, 0.05)


def test_tokens_per_s_and_bad_input():
    assert gp.tokens_per_s(32, 0.030) == pytest.approx(1066.667, abs=1e-3)
    np.testing.assert_allclose(gp.tokens_per_s([16, 64], [0.02, 0.055]), [800, 64 / 0.055])
    with pytest.raises(ValueError, match=r"batch must be > 0, got -1"):
        gp.tokens_per_s(-1, 0.03)
    with pytest.raises(ValueError, match=r"step_s must be > 0, got 0"):
        gp.tokens_per_s(32, 0)
    with pytest.raises(ValueError, match=r"tpot_slo_s must be > 0, got -0.05"):
        gp.batch_curve(SEED_CURVE, -0.05)
    with pytest.raises(ValueError, match="measured"):
        gp.batch_curve({}, 0.05)
    with pytest.raises(ValueError, match=r"measured seconds must be > 0, got -0.02"):
        gp.batch_curve({16: -0.02}, 0.05)
    with pytest.raises(ValueError, match="no measured batch"):
        gp.best_feasible_batch(SEED_CURVE, 0.010)


def seed_frame():
    """1,000 completions in one minute: 650 meet both, 150 late first token, 120 slow
    stream, 80 both."""
    ttft = np.r_[np.full(650, 0.5), np.full(150, 1.5), np.full(120, 0.5), np.full(80, 2.0)]
    tpot = np.r_[np.full(650, 0.03), np.full(150, 0.03), np.full(120, 0.06), np.full(80, 0.07)]
    return pd.DataFrame({"arrival_s": np.linspace(0, 59, 1000), "ttft_s": ttft, "tpot_s": tpot,
                         "output_tokens": 300, "outcome": "done",
                         "verified": np.arange(1000) % 10 != 0})


def test_seed_example_1000_vs_650():
    frame = seed_frame()
    table = gp.metric_table(frame, 60.0, ttft_s=1.0, tpot_s=0.05)
    assert table.loc["requests/s", "per_minute"] == pytest.approx(1000)
    assert table.loc["TTFT+TPOT goodput", "per_minute"] == pytest.approx(650)
    assert table.loc["TTFT+TPOT goodput", "value"] == pytest.approx(650 / 60)
    assert table.loc["requests/s", "value"] == pytest.approx(1000 / 60)
    assert table.loc["TTFT goodput", "per_minute"] == pytest.approx(770)
    assert table.loc["tokens/s", "value"] == pytest.approx(300 * 1000 / 60)
    assert table.loc["verified-outcome goodput", "per_minute"] == pytest.approx(585)
    assert table.loc["TTFT+TPOT goodput", "share"] == pytest.approx(0.65)
    # the metrics are nested
    v = table["value"].iloc[1:].to_numpy()
    assert (np.diff(v) <= 0).all()
    with pytest.raises(ValueError, match="duration_s must be > 0, got 0"):
        gp.metric_table(frame, 0)
    with pytest.raises(ValueError, match="verified column 'ok'"):
        gp.metric_table(frame, 60.0, verified="ok")
    assert "verified-outcome goodput" not in gp.metric_table(frame, 60.0, verified=None).index


def test_load_sweep_goodput_below_throughput_and_knee():
    def run(rate):
        return simulate(poisson_requests(rate, 300, 7), Replica(), seed=7)
    table = gp.load_sweep([0.5, 1.2, 2.2], run)
    assert (table["goodput_rps"] <= table["ttft_goodput_rps"] + 1e-12).all()
    assert (table["ttft_goodput_rps"] <= table["throughput_rps"] + 1e-12).all()
    assert table.loc[0.5, "goodput_rps"] >= 0.95 * table.loc[0.5, "throughput_rps"]
    assert table.loc[2.2, "goodput_rps"] < 0.5 * table.loc[2.2, "throughput_rps"]
    np.testing.assert_allclose(table["tokens_per_s"], 300 * table["throughput_rps"])
    knee = gp.goodput_knee(table.index, table["goodput_rps"])
    assert knee == 1.2
    with pytest.raises(ValueError, match="rates must be increasing"):
        gp.load_sweep([1.0, 0.5], run)
    with pytest.raises(ValueError, match=r"rates must be > 0, got -1"):
        gp.load_sweep([-1], run)


def test_slo_capacity_and_pool_split():
    rates = [1.0, 2.0, 3.0, 4.0]
    assert gp.slo_capacity(rates, [1.0, 0.95, 0.85, 0.1]) == pytest.approx(2.5)
    assert gp.slo_capacity(rates, [1.0, 1.0, 1.0, 0.95]) is None
    with pytest.raises(ValueError, match="target must be strictly between 0 and 1, got 1.5"):
        gp.slo_capacity(rates, [1, 1, 1, 1], target=1.5)
    # 4,000-token prompts: a prefill GPU does 2 req/s, a decode GPU 32/(299*0.03) = 3.57 req/s
    n, rate = gp.pool_split(4, 2.0, 32 / (299 * 0.03))
    assert (n, rate) == (2, pytest.approx(4.0))
    assert gp.pool_split(4, 16.0, 3.5)[0] == 1
    with pytest.raises(ValueError, match="gpus must be a whole number >= 2, got 1"):
        gp.pool_split(1, 2.0, 3.0)
    assert slo.goodput(seed_frame(), 60.0, ttft_s=1.0, tpot_s=0.05) == pytest.approx(650 / 60)


def test_attainment_drops_warmup():
    frame = seed_frame()
    assert gp.attainment(frame, 0.0, ttft_s=1.0, tpot_s=0.05) == pytest.approx(0.65)
    assert gp.attainment(frame, 0.5, ttft_s=1.0, tpot_s=0.05) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="warmup_fraction must be in"):
        gp.attainment(frame, 1.0, ttft_s=1.0)


def test_capacity_below_the_grid_is_not_the_first_rate():
    # attainment 0 at every rate: the capacity lies below the grid, not at rates[0]
    rates = [0.26, 0.5, 0.8]
    found = gp.capacity_on_grid(rates, [0.0, 0.0, 0.0], 0.9)
    assert found.where == "below the grid" and math.isnan(found.rate)
    assert found.describe() == "below the grid (< 0.26 req/s)"
    assert math.isnan(gp.slo_capacity(rates, [0.0, 0.0, 0.0], 0.9))
    # first point misses but later ones meet: still below the grid (non-monotone noise)
    assert gp.capacity_on_grid(rates, [0.5, 0.95, 0.2]).where == "below the grid"
    above = gp.capacity_on_grid(rates, [1.0, 1.0, 0.95], 0.9)
    assert above.where == "above the grid" and above.describe() == "above the grid (> 0.80 req/s)"
    on = gp.capacity_on_grid([1.0, 2.0, 3.0, 4.0], [1.0, 0.95, 0.85, 0.1])
    assert on.where == "on the grid" and on.rate == pytest.approx(2.5)
    assert on.describe() == "2.50 req/s" and on.describe(".1f", unit="") == "2.5"
    assert found.describe(unit="") == "below the grid (< 0.26)"
    with pytest.raises(ValueError, match="same non-zero length, got 0 and 0"):
        gp.capacity_on_grid([], [])
    with pytest.raises(ValueError, match="rates must be strictly increasing"):
        gp.capacity_on_grid([2.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"attainment must lie in \[0, 1\]"):
        gp.capacity_on_grid([1.0], [1.5])


def test_capacity_table_scores_stored_runs():
    def frame(ttft):   # 10 requests, all with the same TTFT (s) and a 30 ms TPOT
        return pd.DataFrame({"arrival_s": np.arange(10.0), "ttft_s": ttft, "tpot_s": 0.03,
                             "max_gap_s": 0.03, "output_tokens": 100, "outcome": "done"})

    rates = {"short": [1.0, 2.0, 3.0]}
    runs = {("short", "good"): [frame(0.5), frame(0.5), frame(2.0)],
            ("short", "bad"): [frame(2.0), frame(2.0), frame(2.0)],
            ("short", "great"): [frame(0.5)] * 3}
    table = gp.capacity_table(runs, rates, 0.9, 0.0, ttft_s=1.0, tpot_s=0.05)
    by = table.set_index("design")
    # attainment 1, 1, 0: the miss fraction crosses 0.1 one tenth of the way from 2 to 3
    assert by.loc["good", "capacity"] == pytest.approx(2.1)
    assert by.loc["good", "where"] == "on the grid"
    assert by.loc["bad", "where"] == "below the grid" and math.isnan(by.loc["bad", "capacity"])
    assert by.loc["great", "where"] == "above the grid"
    with pytest.raises(ValueError, match="has 1 runs for 3 rates"):
        gp.capacity_table({("short", "x"): [frame(0.5)]}, rates)
    with pytest.raises(ValueError, match="rates has no grid for workload 'long'"):
        gp.capacity_table({("long", "x"): [frame(0.5)]}, rates)


def _contest_table(rows):
    return pd.DataFrame(rows, columns=["workload", "design", "capacity", "where"])


def test_contest_board_scores_and_winners():
    nan = math.nan
    table = _contest_table([
        # w1: the split wins (1.5 vs 1.2, +25 %), the better of two splits counts
        ("w1", "colo", 1.2, "on the grid"), ("w1", "split 1P", 1.5, "on the grid"),
        ("w1", "split 2P", 1.0, "on the grid"),
        # w2: within the 5 % band: a tie
        ("w2", "colo", 1.00, "on the grid"), ("w2", "split 1P", 1.04, "on the grid"),
        ("w2", "split 2P", 0.5, "on the grid"),
        # w3: the splits are below the grid: score 0, the colocated fleet wins
        ("w3", "colo", 0.8, "on the grid"), ("w3", "split 1P", nan, "below the grid"),
        ("w3", "split 2P", nan, "below the grid"),
        # w4: a split above the grid scores inf, never its last grid rate
        ("w4", "colo", 0.8, "on the grid"), ("w4", "split 1P", nan, "above the grid"),
        ("w4", "split 2P", 0.1, "on the grid"),
        # w5: both sides below the grid: the grid cannot separate them
        ("w5", "colo", nan, "below the grid"), ("w5", "split 1P", nan, "below the grid"),
        ("w5", "split 2P", nan, "below the grid"),
        # w6: challengers differ by workload (only one split simulated here)
        ("w6", "colo", 1.0, "on the grid"), ("w6", "split 3P", 0.5, "on the grid"),
    ])
    board = gp.contest_board(table, ["colo"], tie_band=0.05, label="split")
    assert list(board.columns) == ["colo", "split (best split)", "best split",
                                   "split / best colocated", "winner"]
    assert board.loc["w1", "split (best split)"] == 1.5
    assert board.loc["w1", "best split"] == "split 1P"
    assert board.loc["w1", "split / best colocated"] == pytest.approx(1.25)
    assert board.winner.to_dict() == {"w1": "split", "w2": "tie", "w3": "colocated",
                                      "w4": "split", "w5": "tie", "w6": "colocated"}
    assert board.loc["w6", "best split"] == "split 3P"
    assert board.loc["w3", "split (best split)"] == 0.0
    assert math.isinf(board.loc["w4", "split (best split)"])
    # a zero band makes any difference a verdict
    assert gp.contest_board(table, ["colo"], tie_band=0.0).loc["w2", "winner"] == \
        "disaggregated"


def test_contest_board_rejects_bad_tables():
    good = _contest_table([("w", "a", 1.0, "on the grid"), ("w", "b", 1.1, "on the grid")])
    with pytest.raises(ValueError, match="table"):
        gp.contest_board(good.to_dict("list"), ["a"])
    with pytest.raises(ValueError, match="where"):
        gp.contest_board(good.drop(columns="where"), ["a"])
    with pytest.raises(ValueError, match="capacity"):
        gp.contest_board(good.assign(capacity=[math.nan, 1.0]), ["a"])
    with pytest.raises(ValueError, match="capacity"):
        gp.contest_board(good.assign(capacity=[-1.0, 1.0]), ["a"])
    with pytest.raises(ValueError, match="colocated"):
        gp.contest_board(good, ["zzz"])
    with pytest.raises(ValueError, match="colocated"):
        gp.contest_board(good, "a")
    with pytest.raises(ValueError, match="challenger"):
        gp.contest_board(good, ["a", "b"])
    with pytest.raises(ValueError, match="tie_band"):
        gp.contest_board(good, ["a"], tie_band=1.0)
    with pytest.raises(ValueError, match="one challenger"):
        gp.contest_board(pd.concat([good, _contest_table([("v", "a", 1.0, "on the grid")])]),
                         ["a"])
    with pytest.raises(ValueError, match="every colocated design"):
        gp.contest_board(pd.concat([good, _contest_table([("v", "b", 1.0, "on the grid")])]),
                         ["a"])
    with pytest.raises(ValueError, match="twice"):
        gp.contest_board(pd.concat([good, good]), ["a"])
