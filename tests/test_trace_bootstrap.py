"""Replications from a trace that do not depend on its length (issue 23, item 1):
the stationary block bootstrap of a trace (servingcap.traffic.block_bootstrap), its use
by the planner (one fresh sample per replication, as many as the budget) and what the
plan report says about it."""

import re

import numpy as np
import pandas as pd
import pytest
from servingcap import stats
from servingcap.__main__ import main
from servingcap.planning import Replay, _Replay, _Trace, evaluate, fluid_rate
from servingcap.serving import Replica, simulate
from servingcap.traffic import BOOTSTRAP_SEGMENT_S, block_bootstrap, bootstrap_windows, mean_rate

SMALL = Replica(prefill_rate=8000, decode_step_s=0.02, max_batch=8)
FAST = {"limits": {"ttft_s": 1.0, "tpot_s": 0.05}, "target": 0.9, "min_requests": 400,
        "executor": None}


def _trace(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    """A bursty trace (gaps alternate between busy and quiet minutes) whose ``row``
    column names each request, so a resampled row can be traced back."""
    rng = np.random.default_rng(seed)
    busy = (np.arange(n) // 150) % 2 == 0
    gaps = rng.exponential(np.where(busy, 0.1, 0.5))
    return pd.DataFrame({"arrival_s": np.cumsum(gaps) - gaps[0],
                         "prompt_tokens": rng.integers(1, 4000, n),
                         "output_tokens": rng.integers(1, 400, n),
                         "row": np.arange(n)})


def test_same_seed_same_sample_other_seed_other_sample_and_longer_extends_shorter():
    trace = _trace()
    a = block_bootstrap(trace, 2000, 7)
    assert a.equals(block_bootstrap(trace, 2000, 7))
    assert not a["row"].equals(block_bootstrap(trace, 2000, 8)["row"])
    # a longer sample from the same seed starts with the shorter one (common random
    # numbers across rates: a run at a higher rate is longer)
    longer = block_bootstrap(trace, 5000, 7)
    assert longer.iloc[:2000].equals(a)


def test_planner_replications_are_deterministic_per_seed_and_index_and_differ_by_index():
    trace = _Trace(_trace())
    seeds = stats.replication_seeds(3, 4)
    again = stats.replication_seeds(3, 4)
    first = trace.sample(5.0, 1000, seeds[0])
    assert first.equals(trace.sample(5.0, 1000, again[0]))
    assert not first["row"].equals(trace.sample(5.0, 1000, seeds[1])["row"])
    assert mean_rate(first) == pytest.approx(5.0)            # rescaled to the rate
    # the same rows at another rate (common random numbers), only the gaps shrink
    faster = trace.sample(10.0, 1000, seeds[0])
    assert faster["row"].equals(first["row"])
    assert np.allclose(faster["arrival_s"], first["arrival_s"] / 2)


def test_every_row_is_a_trace_row_and_segments_keep_the_trace_gaps():
    trace = _trace()
    out = block_bootstrap(trace, 20_000, 1)          # longer than the trace: rows repeat
    assert len(out) == 20_000 and list(out.columns) == list(trace.columns)
    rows = out["row"].to_numpy()
    src = trace.iloc[rows]
    for column in ("prompt_tokens", "output_tokens"):
        assert (out[column].to_numpy() == src[column].to_numpy()).all()
    assert out["arrival_s"].iloc[0] == 0 and (np.diff(out["arrival_s"]) >= 0).all()
    # inside a segment (the next row of the trace follows) the trace's own gap is kept
    gaps = np.diff(trace["arrival_s"].to_numpy())
    inside = np.flatnonzero(rows[1:] == rows[:-1] + 1)
    assert np.allclose(np.diff(out["arrival_s"].to_numpy())[inside], gaps[rows[inside]])
    # segments average BOOTSTRAP_SEGMENT_S of the trace: L = 60 s x mean rate rows; a
    # segment ends after each row with probability 1/L (a junction may also happen to
    # continue the trace, probability 1/3000, negligible). Breaks ~ Binomial(19,999, 1/L):
    # about 19,999/L +- sqrt of it; 5 standard deviations of slack.
    length = BOOTSTRAP_SEGMENT_S * mean_rate(trace)
    breaks = (rows[1:] != (rows[:-1] + 1) % len(trace)).sum()
    expect = (len(out) - 1) / length
    assert abs(breaks - expect) < 5 * np.sqrt(expect) + 1
    # the junction gaps are trace gaps too
    # (up to the rounding of summing 20,000 gaps to 6,000 s and differencing: 1e-9 s)
    drawn = np.diff(out["arrival_s"].to_numpy())
    known = np.sort(gaps)
    at = np.clip(np.searchsorted(known, drawn), 1, known.size - 1)
    nearest = np.minimum(abs(known[at] - drawn), abs(known[at - 1] - drawn))
    assert (nearest < 1e-9).all()


def test_the_length_mix_and_the_rate_of_a_pooled_bootstrap_are_the_traces():
    trace = _trace()
    # The circular stationary bootstrap draws every row with the same probability, so a
    # sample's mean prompt is unbiased for the trace's; its spread comes from the
    # segments (about 20,000 / 1,700-row segments here). Check the mean of 20 samples
    # against the trace's within 4 standard errors estimated from the 20 samples (a
    # t-type bound: fails by chance with probability well below 1e-3).
    means = np.array([block_bootstrap(trace, 20_000, s)["prompt_tokens"].mean()
                      for s in range(20)])
    se = means.std(ddof=1) / np.sqrt(means.size)
    assert abs(means.mean() - trace["prompt_tokens"].mean()) < 4 * se
    assert se < 0.02 * trace["prompt_tokens"].mean()      # and the samples are informative
    rates = np.array([mean_rate(block_bootstrap(trace, 20_000, s)) for s in range(20)])
    assert rates.mean() == pytest.approx(mean_rate(trace), rel=0.05)


def test_hash_ids_are_kept_and_a_repeated_row_is_a_new_conversation():
    n = 200
    trace = pd.DataFrame({"arrival_s": np.arange(n, dtype=float),
                          "prompt_tokens": 1024, "output_tokens": 10, "row": np.arange(n),
                          "hash_ids": [[0, 1, k + 2] for k in range(n)]})
    out = block_bootstrap(trace, 1000, 2, segment_s=20.0)     # each row about 5 times
    seen = set()
    for row, ids in zip(out["row"], out["hash_ids"], strict=True):
        if row not in seen:                    # first copy: the trace's own ids
            assert ids == [0, 1, row + 2]
            seen.add(row)
        else:                                  # later copies: relabelled, same shape
            assert len(ids) == 3 and ids[2] != row + 2 and str(ids[2]).startswith(f"{row + 2}~")
    assert len(seen) < len(out)


def test_bad_input_is_named():
    trace = _trace(50)
    with pytest.raises(ValueError, match="n must"):
        block_bootstrap(trace, 0, 1)
    with pytest.raises(ValueError, match="segment_s"):
        block_bootstrap(trace, 10, 1, segment_s=-1.0)
    with pytest.raises(ValueError, match="seed"):
        block_bootstrap(trace, 10, "x")
    with pytest.raises(ValueError, match="sorted"):
        block_bootstrap(trace.iloc[::-1], 10, 1)
    with pytest.raises(ValueError, match="trace"):
        block_bootstrap(trace["arrival_s"], 10, 1)


def test_a_short_trace_runs_as_many_replications_as_the_budget():
    # 300 rows while a replication needs at least 400: before the bootstrap this was one
    # replication (the whole table) whatever the budget
    table = _trace(300).drop(columns="row").assign(prompt_tokens=1000, output_tokens=40)
    rate = 0.5 * fluid_rate(table, SMALL)
    row = evaluate(table, SMALL, rate, budget=3, **FAST)
    assert row["replications"] == 3
    assert row["requests"] > 300 * 0.5           # runs longer than the trace, after warm-up
    assert np.isfinite(row["goodput_low"])       # an interval across replications


def test_the_plan_report_states_the_method_and_the_true_count(capsys, tmp_path):
    path = tmp_path / "short.csv"
    rng = np.random.default_rng(4)
    t0 = pd.Timestamp("2023-11-16 18:15:00")
    stamps = t0 + pd.to_timedelta(np.cumsum(rng.exponential(0.5, 300)), unit="s")
    pd.DataFrame({"TIMESTAMP": stamps.strftime("%Y-%m-%d %H:%M:%S.%f"),
                  "ContextTokens": 1000, "GeneratedTokens": 40}).to_csv(path, index=False)
    args = ["plan", "--trace", str(path), "--rate", "2", "--rtol", "0.5", "--prefill-rate", "8000",
            "--decode-step-ms", "20", "--max-batch", "8", "--ttft-p99-ms", "1000",
            "--tpot-p99-ms", "50", "--target", "0.9", "--budget", "3", "--workers", "1",
            "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "300 of 300 requests, resampled by a block bootstrap of the trace" in out
    assert "segments of" in out and "60 s of the trace" in out
    # the header gives the schedule and what really ran (3 at every point: 300 rows no
    # longer cap a trace at one replication)
    assert "Statistics: 3 independent replications per point; 3 ran at each of the" in out
    points, total = map(int, re.search(r"3 ran at each of the (\d+) points, (\d+) in all",
                                       out).groups())
    assert total == 3 * points
    assert f"({total} replications in {points} points;" in out
    assert "consecutive blocks" not in out


def test_replay_is_the_opt_in_for_a_table_as_recorded():
    # Replay keeps the old meaning: consecutive blocks of the table, so 3,000 rows in
    # runs of at least 400 requests hold at most 7 replications, and 300 rows hold one
    # (decided on batch means); the default (the table itself) takes the budget's count
    table = _trace(3000).drop(columns="row").assign(prompt_tokens=1000, output_tokens=40)
    rate = 0.5 * fluid_rate(table, SMALL)
    short = evaluate(Replay(table.iloc[:300]), SMALL, rate, budget=3, **FAST)
    assert short["replications"] == 1
    assert short["requests"] <= 300
    assert evaluate(table.iloc[:300], SMALL, rate, budget=3, **FAST)["replications"] == 3
    with pytest.raises(ValueError, match="requests"):
        Replay(table.iloc[:1])


def test_replay_covers_every_row_in_equal_blocks():
    # 1,000 rows in runs of at least 400 requests: two blocks of 500, not two of 400
    # with the last 200 rows never replayed (a bad day injected late in a slice must be
    # in the replay)
    table = _trace(1000)
    source = _Replay(table)
    k = source.blocks(400)
    rows = np.concatenate([source.sample(1.0, 400, i)["row"].to_numpy() for i in range(k)])
    assert k == 2
    np.testing.assert_array_equal(np.sort(rows), table["row"].to_numpy())


def test_replay_is_decided_on_attainment_not_on_its_trend():
    # at twice the fluid bound the queue grows all along: the resampled table is called
    # unstable, while the replay of the same table, a finite scenario, is decided on its
    # attainment (all requests counted, so it misses)
    table = _trace(3000).drop(columns="row").assign(prompt_tokens=1000, output_tokens=40)
    rate = 2.0 * fluid_rate(table, SMALL)
    assert evaluate(table, SMALL, rate, budget=3, **FAST)["verdict"] == "unstable"
    assert evaluate(Replay(table), SMALL, rate, budget=3, **FAST)["verdict"] == "misses"


# --------------------------------------------------------------------------- replications
# traffic.bootstrap_windows + stats.replicate: the steps the chapters chunked_prefill,
# tail_latency, two_slos and scheduling_policies used to write out by hand (windows ->
# replay each -> arrival order -> MSER-5 cut -> keep the rest). Every check below is
# exact (same seeds, same draws, same cut): no sampling tolerance is involved.


def _fleet(policy="fcfs"):
    """A design: one small replica, the chapters' `simulate` call."""
    return lambda reqs: simulate(reqs, SMALL, policy=policy)


def test_bootstrap_windows_are_the_hand_written_draws():
    trace = _trace(1500)
    for segment in (BOOTSTRAP_SEGMENT_S, BOOTSTRAP_SEGMENT_S / 4):
        windows = bootstrap_windows(trace, 4, 11, segment_s=segment)
        by_hand = [block_bootstrap(trace, len(trace), ss, segment)
                   for ss in stats.replication_seeds(11, 4)]
        assert len(windows) == 4
        assert all(w.equals(h) for w, h in zip(windows, by_hand, strict=True))
    # more replications keep the first ones (replication_seeds' prefix property); n
    # sets the window length
    assert bootstrap_windows(trace, 6, 11)[3].equals(bootstrap_windows(trace, 4, 11)[3])
    assert [len(w) for w in bootstrap_windows(trace, 2, 11, n=700)] == [700, 700]


def test_replicate_cuts_where_warmup_cuts_does_and_accounts_for_every_request():
    windows = bootstrap_windows(_trace(1200), 4, 5)
    kept = stats.replicate(windows, _fleet())
    outs = [simulate(w, SMALL).sort_values("arrival_s", kind="stable") for w in windows]
    cuts = stats.warmup_cuts([o.ttft_s.to_numpy() for o in outs])
    assert any(c > 0 for c in cuts)       # the small replica starts empty: a warm-up
    for k, o, c, w in zip(kept, outs, cuts, windows, strict=True):
        assert k.equals(o.iloc[c:])
        assert len(k) + c == len(w)       # kept + deleted = every request of the window
        assert k.index.is_unique and k["arrival_s"].is_monotonic_increasing


def test_paired_designs_share_the_latest_cut_or_a_named_designs_cut():
    windows = bootstrap_windows(_trace(1200), 3, 9)
    designs = {"FCFS": _fleet("fcfs"), "SJF": _fleet("sjf")}
    own = stats.replicate(windows, designs)
    common = stats.replicate(windows, designs, cut="common")
    named = stats.replicate(windows, designs, cut="FCFS")
    for i, w in enumerate(windows):
        dropped = {n: len(w) - len(own[n][i]) for n in designs}
        assert dropped == {n: stats.warmup_cuts(
            [simulate(x, SMALL, policy=n.lower()).ttft_s.to_numpy() for x in windows]
        )[i] for n in designs}
        # the same requests kept under both orders: the comparison stays paired
        assert common["FCFS"][i].index.equals(common["SJF"][i].index)
        assert len(w) - len(common["SJF"][i]) == max(dropped.values())
        assert len(w) - len(named["SJF"][i]) == dropped["FCFS"]


def test_replicate_puts_a_shuffled_output_in_arrival_order():
    windows = bootstrap_windows(_trace(800), 2, 1)
    shuffled = stats.replicate(windows, lambda r: _fleet()(r).sample(frac=1.0,
                                                                      random_state=0))
    assert all(a.equals(b) for a, b in zip(shuffled, stats.replicate(windows, _fleet()),
                                            strict=True))


@pytest.mark.parametrize(("call", "named"), [
    (lambda w: stats.replicate(w[0], _fleet()), "requests"),
    (lambda w: stats.replicate([], _fleet()), "requests"),
    (lambda w: stats.replicate([w[0].drop(columns="arrival_s")], _fleet()), "requests[0]"),
    (lambda w: stats.replicate(w, {}), "designs"),
    (lambda w: stats.replicate(w, {"a": 1}), "designs"),
    (lambda w: stats.replicate(w, _fleet(), cut="FCFS"), "cut"),
    (lambda w: stats.replicate(w, {"a": _fleet()}, cut="b"), "cut"),
    (lambda w: stats.replicate(w, {"a": _fleet()}, cut=["a"]), "cut"),
    (lambda w: stats.replicate(w, _fleet(), signal=3), "signal"),
    (lambda w: stats.replicate(w, _fleet(), signal="nope"), "designs(requests[0])"),
    (lambda w: stats.replicate(w, lambda r: _fleet()(r).iloc[1:]), "designs(requests[0])"),
    (lambda w: stats.replicate(w, lambda r: _fleet()(r).assign(ttft_s=np.nan)),
     "designs(requests[0])['ttft_s']"),
    (lambda w: bootstrap_windows(w[0], 0, 1), "replications"),
    (lambda w: bootstrap_windows(w[0], 2, -1), "seed"),
    (lambda w: bootstrap_windows(w[0], 2, 1, n=0), "n"),
    (lambda w: bootstrap_windows(w[0], 2, 1, segment_s=0), "segment_s"),
    (lambda w: bootstrap_windows(w[0].to_numpy(), 2, 1), "trace"),
])
def test_replicate_and_windows_name_bad_input(call, named):
    windows = bootstrap_windows(_trace(300), 2, 0)
    with pytest.raises(ValueError) as err:
        call(windows)
    assert named in str(err.value)


def test_a_named_cut_reads_only_that_designs_signal():
    # a design whose signal holds NaN (a rejected request has no TTFT) is fine when
    # another design's cut is used, and refused when its own cut is needed
    windows = bootstrap_windows(_trace(800), 2, 4)
    designs = {"FCFS": _fleet(), "gappy": lambda r: _fleet()(r).assign(ttft_s=np.nan)}
    named = stats.replicate(windows, designs, cut="FCFS")
    assert all(a.index.equals(b.index) for a, b in zip(named["FCFS"], named["gappy"],
                                                        strict=True))
    with pytest.raises(ValueError, match="gappy"):
        stats.replicate(windows, designs, cut="common")
