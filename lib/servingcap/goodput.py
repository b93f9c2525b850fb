"""Goodput: throughput that counts only work delivered inside the named constraints.

``goodput(SLO)`` is the number of completed requests (or tokens) that satisfy *every*
named latency constraint, per unit time. This module holds the reusable pieces of the
book's goodput chapter:

- the decode batch-size curve: tokens/s ``B / step(B)`` at each batch size, which batch
  sizes keep the step (the TPOT) inside the objective, and the largest such batch
  (:func:`tokens_per_s`, :func:`batch_curve`, :func:`best_feasible_batch`,
  :func:`max_feasible_batch`);
- the five metrics of one run side by side, from tokens/s to verified-outcome goodput
  (:func:`metric_table`);
- an offered-load sweep returning throughput, TTFT goodput and TTFT+TPOT goodput
  (:func:`load_sweep`, built on :func:`servingcap.sweep.summarize`), its knee
  (:func:`goodput_knee`) and the SLO-attainment capacity DistServe calls goodput
  (:func:`slo_capacity`, :func:`capacity_on_grid`, which says when the capacity lies
  below or above the swept grid, and :func:`capacity_table` for many designs at once),
  and the contest between colocated designs and their challengers scored from that
  table (:func:`contest_board`);
- the integer split of a GPU budget between a prefill and a decode pool
  (:func:`pool_split`).

Units: seconds, tokens, requests/s, tokens/s; batch sizes in sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np
import pandas as pd

from . import _check
from .llm import decode_step_time
from .params import LOCKED
from .slo import goodput, slo_attainment, throughput
from .sweep import first_crossing, summarize

__all__ = ["tokens_per_s", "batch_curve", "best_feasible_batch", "max_feasible_batch",
           "metric_table", "load_sweep", "goodput_knee", "slo_capacity", "capacity_on_grid",
           "GridCapacity", "capacity_table", "contest_board", "pool_split", "attainment"]

_UNBOUNDED_TPOT_S = 1e9     # a TPOT "limit" no request reaches: TTFT-only goodput


def _measured(measured) -> dict:
    if not hasattr(measured, "items") or len(measured) == 0:
        raise ValueError(
            f"measured must be a non-empty mapping {{batch: seconds}}, got {measured!r}")
    return {_check.positive("measured batch", b): _check.positive("measured seconds", s)
            for b, s in measured.items()}


@_check.guarded
def tokens_per_s(batch, step_s):
    """Decode throughput (tokens/s) of a batch of ``batch`` sequences: ``batch / step_s``.

    Each decode step emits one token per sequence, so ``B = 32`` at 30 ms per step is
    32 / 0.030 = 1,067 tokens/s. Scalars give a float, arrays an array.
    """
    b = _check.points("batch", batch)
    s = _check.points("step_s", step_s)
    if b.ndim and s.ndim and b.shape != s.shape:
        raise ValueError(f"batch and step_s must have the same length, got {b.size} and {s.size}")
    if np.ndim(batch) == 0:
        _check.positive("batch", batch)
    elif (b <= 0).any() or not np.isfinite(b).all():
        raise ValueError(f"batch must be finite and > 0, got {batch!r}")
    if np.ndim(step_s) == 0:
        _check.positive("step_s", step_s)
    elif (s <= 0).any() or not np.isfinite(s).all():
        raise ValueError(f"step_s must be finite and > 0, got {step_s!r}")
    out = b / s
    return float(out) if np.ndim(out) == 0 else out


def batch_curve(measured, tpot_slo_s: float = LOCKED.tpot_slo_s, batches=None) -> pd.DataFrame:
    """Throughput and TPOT goodput of a decode batch, per batch size.

    Parameters
    ----------
    measured : mapping {batch: seconds}
        Measured decode step times (s) at some batch sizes (sequences).
    tpot_slo_s : float
        The time-per-output-token objective (s), > 0. A batch whose step exceeds it
        makes every token late, so its goodput is zero.
    batches : iterable of float, optional
        Batch sizes to evaluate (default: the measured ones). Others are interpolated
        (and extrapolated) linearly by :func:`servingcap.llm.decode_step_time`.

    Returns
    -------
    pandas.DataFrame
        ``batch`` (sequences), ``step_s`` (s), ``tokens_per_s`` (tokens/s),
        ``feasible`` (step <= objective) and ``goodput_tokens_per_s`` (tokens/s: the
        throughput if feasible, else 0).
    """
    table = _measured(measured)
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    b = np.array(sorted(table) if batches is None else list(batches), dtype=float)
    if b.size == 0:
        raise ValueError("batches must not be empty")
    step = np.atleast_1d(decode_step_time(b, table))
    rate = b / step
    feasible = step <= slo * (1 + 1e-12)
    return pd.DataFrame({"batch": b, "step_s": step, "tokens_per_s": rate, "feasible": feasible,
                         "goodput_tokens_per_s": np.where(feasible, rate, 0.0)})


@_check.guarded
def best_feasible_batch(measured, tpot_slo_s: float = LOCKED.tpot_slo_s) -> tuple[float, float]:
    """The measured batch size with the most tokens/s whose step meets the objective.

    Returns ``(batch, tokens_per_s)``. For ``{16: 0.020, 32: 0.030, 64: 0.055}`` and a
    50 ms objective: ``(32, 1066.7)``; B = 64 emits more (1,164 tokens/s) but every
    token is late. Raises ``ValueError`` when no measured batch is feasible.
    """
    curve = batch_curve(measured, tpot_slo_s)
    ok = curve[curve["feasible"]]
    if ok.empty:
        raise ValueError(f"no measured batch meets tpot_slo_s={tpot_slo_s!r}: the smallest "
                         f"step is {curve['step_s'].min()!r} s")
    best = ok.loc[ok["tokens_per_s"].idxmax()]
    return float(best["batch"]), float(best["tokens_per_s"])


def max_feasible_batch(measured, tpot_slo_s: float = LOCKED.tpot_slo_s) -> float:
    """The batch size (sequences, real-valued) whose step time equals the TPOT objective.

    Solves ``step(B) = tpot_slo_s`` on the piecewise-linear curve of
    :func:`servingcap.llm.decode_step_time` (linear between measured points, extrapolated
    beyond them). ``floor`` of the result is the largest whole batch that meets the
    objective. Example: between (32, 30 ms) and (64, 55 ms) the step grows 25/32 ms per
    sequence, so 50 ms is reached at B = 32 + 20 / (25/32) = 57.6.

    Returns ``math.inf`` if the step never reaches the objective (a flat or falling
    curve); raises ``ValueError`` if even a vanishing batch misses it.
    """
    table = _measured(measured)
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    xs = np.array(sorted(table))
    ys = np.array([table[x] for x in xs])
    if xs.size == 1:
        if ys[0] > slo:
            raise ValueError(
                f"the measured step {ys[0]!r} s exceeds tpot_slo_s={slo!r} at every batch")
        return math.inf
    tiny = decode_step_time(1e-9, table)
    if tiny > slo:
        raise ValueError(f"no batch meets tpot_slo_s={slo!r}: even a vanishing batch takes "
                         f"{tiny!r} s per step")
    # knots of the piecewise-linear curve, extended by the last segment's slope
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    knots_x = np.concatenate([[1e-9], xs])
    knots_y = np.array([decode_step_time(x, table) for x in knots_x])
    for j in range(1, knots_x.size):
        if knots_y[j] > slo:
            x0, y0, x1, y1 = knots_x[j - 1], knots_y[j - 1], knots_x[j], knots_y[j]
            return float(x0 + (slo - y0) * (x1 - x0) / (y1 - y0))
    if slope <= 0:
        return math.inf
    with np.errstate(over="ignore"):     # past float range: the curve never gets there
        return float(xs[-1] + (slo - ys[-1]) / slope)


def metric_table(requests: pd.DataFrame, duration_s: float, *,
                 ttft_s: float = LOCKED.ttft_slo_s, tpot_s: float = LOCKED.tpot_slo_s,
                 verified: str | None = "verified") -> pd.DataFrame:
    """The book's five serving metrics of one window, side by side.

    Parameters
    ----------
    requests : DataFrame
        One row per arriving request (the output of :func:`servingcap.serving.simulate`,
        or a hand-built table with ``outcome``, ``ttft_s``, ``tpot_s`` and
        ``output_tokens``), optionally with a boolean ``verified`` column.
    duration_s : float
        The observation window (s), > 0.
    ttft_s, tpot_s : float
        The latency objectives (s).
    verified : str or None
        Name of the boolean acceptance column; None leaves the last row out.

    Returns
    -------
    pandas.DataFrame
        Indexed by metric: ``tokens/s``, ``requests/s``, ``TTFT goodput``,
        ``TTFT+TPOT goodput``, ``verified-outcome goodput``, with columns ``value``
        (per second), ``unit``, ``per_minute`` and ``share`` (of completed requests;
        of emitted tokens for the tokens/s row).
    """
    window = _check.positive("duration_s", duration_s)
    _check.table("requests", requests, minimum=1)
    done = (requests["outcome"] == "done").to_numpy() if "outcome" in requests else None
    if done is None:
        raise ValueError(f"requests is missing column 'outcome'; it has {list(requests.columns)}")
    if "output_tokens" not in requests:
        raise ValueError(
            f"requests is missing column 'output_tokens'; it has {list(requests.columns)}")
    emitted = _check.array("requests['output_tokens']",
                           _check.column(requests, "output_tokens", "requests")[done],
                           nonnegative_values=True)
    tokens = float(emitted.sum()) / window
    completed = throughput(requests, window)
    rows = [("tokens/s", tokens, "tokens/s"), ("requests/s", completed, "requests/s"),
            ("TTFT goodput", goodput(requests, window, ttft_s=ttft_s), "requests/s"),
            ("TTFT+TPOT goodput", goodput(requests, window, ttft_s=ttft_s, tpot_s=tpot_s),
             "requests/s")]
    if verified is not None:
        if verified not in requests:
            raise ValueError(f"verified column {verified!r} not in requests; pass verified=None "
                             "to leave verified-outcome goodput out")
        rows.append(("verified-outcome goodput",
                     goodput(requests, window, ttft_s=ttft_s, tpot_s=tpot_s, **{verified: True}),
                     "requests/s"))
    frame = pd.DataFrame(rows, columns=["metric", "value", "unit"]).set_index("metric")
    frame["per_minute"] = 60.0 * frame["value"]
    share = frame["value"] / completed if completed > 0 else np.nan
    frame["share"] = share
    frame.loc["tokens/s", "share"] = 1.0
    return frame


def load_sweep(rates: Iterable[float], run: Callable, *, ttft_slo_s: float = LOCKED.ttft_slo_s,
               tpot_slo_s: float = LOCKED.tpot_slo_s,
               warmup_fraction: float = 0.1) -> pd.DataFrame:
    """Throughput, TTFT goodput and TTFT+TPOT goodput at each offered load.

    Parameters
    ----------
    rates : iterable of float
        Offered loads (requests/s), increasing.
    run : callable
        ``rate -> simulate(...)`` output for a request stream offered at that rate.
    ttft_slo_s, tpot_slo_s : float
        The objectives (s).
    warmup_fraction : float
        Passed to :func:`servingcap.sweep.summarize` (the window and warm-up rule are
        that function's, so an overloaded run reports its service rate).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``offered_rps``: ``throughput_rps``, ``tokens_per_s``,
        ``ttft_goodput_rps``, ``goodput_rps`` (both objectives), ``attainment``,
        ``ttft_p99_s`` and ``tpot_p99_s``.
    """
    if isinstance(rates, (str, bytes)) or not hasattr(rates, "__iter__"):
        raise ValueError(f"rates must be a sequence of arrival rates, got {rates!r}")
    values = [_check.positive("rates", r) for r in rates]
    if not values:
        raise ValueError("rates must not be empty")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"rates must be increasing, got {values!r}")
    if not callable(run):
        raise ValueError(f"run must be callable, got {run!r}")
    rows = []
    for rate in values:
        result = run(rate)
        with _check.naming("run"):
            both = summarize(result, warmup_fraction=warmup_fraction, ttft_slo_s=ttft_slo_s,
                             tpot_slo_s=tpot_slo_s)
        first = summarize(result, warmup_fraction=warmup_fraction, ttft_slo_s=ttft_slo_s,
                          tpot_slo_s=_UNBOUNDED_TPOT_S)
        frame = result[0] if isinstance(result, tuple) else result
        kept = frame.sort_values("arrival_s", kind="stable").iloc[
            int(math.floor(warmup_fraction * len(frame))):]
        done = kept["outcome"] == "done"
        per_token = float(kept.loc[done, "output_tokens"].sum()) / max(int(done.sum()), 1)
        rows.append({"offered_rps": rate,
                     "throughput_rps": both["throughput_rps"],
                     "tokens_per_s": both["throughput_rps"] * per_token,
                     "ttft_goodput_rps": first["goodput_rps"],
                     "goodput_rps": both["goodput_rps"],
                     "attainment": both["attainment"],
                     "ttft_p99_s": both["ttft_p99_s"],
                     "tpot_p99_s": both["tpot_p99_s"]})
    return pd.DataFrame(rows).set_index("offered_rps")


@_check.guarded
def goodput_knee(offered, goodput_rps) -> float:
    """The offered load (requests/s) at which goodput peaks on a sweep grid.

    Beyond it more offered work buys less delivered work: the knee of a goodput curve.
    Ties go to the smallest load.
    """
    x = _check.array("offered", offered)
    y = _check.array("goodput_rps", goodput_rps, nonnegative_values=True)
    if x.size == 0 or x.shape != y.shape:
        raise ValueError(f"offered and goodput_rps must be non-empty and equally long, "
                         f"got {x.size} and {y.size}")
    return float(x[int(np.argmax(y))])


class GridCapacity(NamedTuple):
    """Where an SLO-attainment capacity lies on a swept grid of rates.

    ``where`` is ``"on the grid"`` (``rate`` is the interpolated capacity, requests/s),
    ``"below the grid"`` (the first rate already misses the target: the capacity is
    somewhere below it and ``rate`` is NaN) or ``"above the grid"`` (the last rate
    still meets it: the capacity is at least that rate and ``rate`` is NaN).
    """

    rate: float
    where: str
    lowest: float
    highest: float

    def describe(self, fmt: str = ".2f", unit: str = "req/s") -> str:
        """The capacity as text: ``"1.23 req/s"``, ``"below the grid (< 0.40 req/s)"``..."""
        tail = f" {unit}" if unit else ""
        if self.where == "below the grid":
            return f"below the grid (< {self.lowest:{fmt}}{tail})"
        if self.where == "above the grid":
            return f"above the grid (> {self.highest:{fmt}}{tail})"
        return f"{self.rate:{fmt}}{tail}"


# Not @_check.guarded: NaN is this function's answer when the capacity is off the grid.
def capacity_on_grid(rates, attainment, target: float = 0.9) -> GridCapacity:
    """The largest rate whose SLO attainment stays at or above ``target``, and where it lies.

    Parameters
    ----------
    rates : array-like of float
        Offered rates (requests/s, or requests/s/GPU), strictly increasing.
    attainment : array-like of float
        SLO attainment (fraction in [0, 1]) measured at each rate.
    target : float
        The attainment that defines capacity, in (0, 1) (DistServe uses 0.9).

    The capacity is the first point where the miss fraction ``1 - attainment`` exceeds
    ``1 - target``, linearly interpolated between grid rates. When the first rate
    already misses, the grid says only that capacity lies below it: the result is
    ``"below the grid"`` with ``rate`` NaN, never the first rate (which would read as a
    capacity the system does not have). When no rate misses it is ``"above the grid"``.
    """
    goal = _check.probability("target", target)
    a = _check.array("attainment", attainment)
    if ((a < 0) | (a > 1)).any():
        raise ValueError(f"attainment must lie in [0, 1], got {attainment!r}")
    x = _check.array("rates", rates)
    if x.size != a.size or x.size == 0:
        raise ValueError(f"rates and attainment must have the same non-zero length, "
                         f"got {x.size} and {a.size}")
    if x.size > 1 and (np.diff(x) <= 0).any():
        raise ValueError(f"rates must be strictly increasing, got {rates!r}")
    crossing = first_crossing(x, 1.0 - a, 1.0 - goal)
    low, high = float(x[0]), float(x[-1])
    if crossing is None:
        return GridCapacity(math.nan, "above the grid", low, high)
    if 1.0 - a[0] > 1.0 - goal:
        return GridCapacity(math.nan, "below the grid", low, high)
    return GridCapacity(float(crossing), "on the grid", low, high)


# Not @_check.guarded: NaN means "below the grid" (see capacity_on_grid).
def slo_capacity(rates, attainment, target: float = 0.9) -> float | None:
    """The largest rate whose SLO attainment stays at or above ``target``.

    DistServe's per-GPU goodput is this rate divided by the GPUs used. Found as the
    first point where the miss fraction ``1 - attainment`` exceeds ``1 - target``,
    linearly interpolated between grid rates. Returns None when the grid never crosses
    (the capacity lies above its last rate) and NaN when the first rate already misses
    (the capacity lies below the grid; it is not ``rates[0]``). Use
    :func:`capacity_on_grid` to get the verdict with the value.
    """
    found = capacity_on_grid(rates, attainment, target)
    if found.where == "above the grid":
        return None
    return found.rate


def capacity_table(runs, rates, target: float = 0.9, warmup_fraction: float = 0.1,
                   **limits) -> pd.DataFrame:
    """SLO capacity of every (workload, design) pair from the stored runs of rate sweeps.

    Parameters
    ----------
    runs : mapping {(workload, design): sequence of DataFrames}
        The per-request output of one simulation at each rate of the workload's grid.
    rates : mapping {workload: array-like}
        The swept rates (requests/s, or requests/s/GPU), increasing, one per run.
    target : float
        SLO attainment that defines capacity, in (0, 1).
    warmup_fraction : float
        Share of each run's requests (by arrival) dropped as warm-up.
    **limits
        The named constraints, e.g. ``ttft_s=1.0, tpot_s=0.05, max_gap_s=1.0`` (s).

    Returns
    -------
    pandas.DataFrame
        One row per pair: ``workload``, ``design``, ``capacity`` (the rate, NaN when
        off the grid) and ``where`` (``"on the grid"``, ``"below the grid"``,
        ``"above the grid"``), as :func:`capacity_on_grid` decides.
    """
    if not hasattr(runs, "items") or len(runs) == 0:
        raise ValueError(f"runs must be a non-empty mapping {{(workload, design): runs}}, "
                         f"got {runs!r}")
    if not hasattr(rates, "keys"):
        raise ValueError(f"rates must be a mapping {{workload: rates}}, got {rates!r}")
    rows = []
    for key, outs in runs.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"runs keys must be (workload, design) pairs, got {key!r}")
        workload, design = key
        if workload not in rates:
            raise ValueError(f"rates has no grid for workload {workload!r}")
        grid = _check.array("rates", rates[workload])
        if not isinstance(outs, (list, tuple)):
            raise ValueError(f"runs[{key!r}] must be a list of run outputs, got {outs!r}")
        if len(outs) != grid.size:
            raise ValueError(f"runs[{key!r}] has {len(outs)} runs for {grid.size} rates")
        try:
            att = [attainment(out, warmup_fraction, **limits) for out in outs]
        except ValueError as exc:
            if "warmup_fraction" in str(exc):
                raise
            raise ValueError(f"runs[{key!r}]: {exc}") from exc
        found = capacity_on_grid(grid, att, target)
        rows.append({"workload": workload, "design": design, "capacity": found.rate,
                     "where": found.where})
    return pd.DataFrame(rows)


_GRID_SCORE = {"below the grid": 0.0, "above the grid": math.inf}


def contest_board(table: pd.DataFrame, colocated, tie_band: float = 0.05,
                  label: str = "disaggregated") -> pd.DataFrame:
    """Who wins, per workload: the best colocated design or the best challenger.

    Parameters
    ----------
    table : pandas.DataFrame
        The output of :func:`capacity_table`: columns ``workload``, ``design``,
        ``capacity`` (requests/s or requests/s/GPU; NaN off the grid) and ``where``.
        Every workload must have each colocated design and at least one challenger,
        each (workload, design) pair once; the challengers may differ by workload.
    colocated : sequence of str
        The designs of the incumbent side; every other design is a challenger (e.g. the
        pool splits of a disaggregated fleet). At least one design must be left over.
    tie_band : float
        Relative difference below which two capacities count as a tie, in [0, 1).
    label : str
        Name of the challenger side in column names and in the ``winner`` column.

    Returns
    -------
    pandas.DataFrame
        Indexed by workload: one score column per colocated design, ``"<label> (best
        split)"`` (the best challenger's score), ``"best split"`` (its design name),
        ``"<label> / best colocated"`` (the ratio) and ``winner`` (``label``,
        ``"colocated"`` or ``"tie"``). A score is the capacity when it lies on the
        grid, 0 when it lies below the grid and ``inf`` when above it: a grid rate is
        never credited as a capacity. Ratios that are undefined (both sides below the
        grid, or both above) count as a tie: the grid cannot separate them.
    """
    if not isinstance(table, pd.DataFrame) or table.empty:
        raise ValueError(f"table must be a non-empty DataFrame from capacity_table, "
                         f"got {type(table).__name__}")
    for col in ("workload", "design", "capacity", "where"):
        if col not in table.columns:
            raise ValueError(f"table has no {col} column (columns: {list(table.columns)})")
    where = table["where"]
    if not where.isin(["on the grid", *_GRID_SCORE]).all():
        raise ValueError(f"table where must be 'on the grid', 'below the grid' or "
                         f"'above the grid', got {sorted(set(map(str, where)))!r}")
    cap = pd.to_numeric(table["capacity"], errors="coerce")
    on = where == "on the grid"
    if (on & ~(np.isfinite(cap) & (cap >= 0))).any():
        raise ValueError(f"table capacity must be a finite rate >= 0 on the grid, "
                         f"got {table['capacity'][on].tolist()!r}")
    designs = set(table["design"])
    if isinstance(colocated, str) or not isinstance(colocated, (list, tuple)):
        raise ValueError(f"colocated must be a list of design names, got {colocated!r}")
    names = list(colocated)
    if not names or not all(isinstance(n, str) and n in designs for n in names):
        raise ValueError(f"colocated must name designs of the table {sorted(designs)!r}, "
                         f"got {colocated!r}")
    rivals = sorted(designs - set(names))
    if not rivals:
        raise ValueError(f"colocated {colocated!r} leaves no challenger design")
    band = _check.nonnegative("tie_band", tie_band)
    if band >= 1:
        raise ValueError(f"tie_band must be in [0, 1), got {tie_band!r}")
    side = _check.label("label", label)
    if table.duplicated(["workload", "design"]).any():
        raise ValueError("table has a (workload, design) pair twice")
    score = cap.where(on, where.map(_GRID_SCORE))
    board = (table.assign(score=score)
             .pivot(index="workload", columns="design", values="score"))
    challengers = board[rivals]
    if board[names].isna().any().any() or challengers.isna().all(axis=1).any():
        raise ValueError("table lacks a design for some workload: every workload needs "
                         "every colocated design and one challenger")
    frame = board[names].copy()
    frame[f"{side} (best split)"] = challengers.max(axis=1)
    frame["best split"] = challengers.idxmax(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = frame[f"{side} (best split)"] / board[names].max(axis=1)
    frame[f"{side} / best colocated"] = ratio
    frame["winner"] = np.select([ratio > 1 + band, ratio < 1 - band],
                                [side, "colocated"], "tie")
    frame.columns.name = None
    return frame


@_check.guarded
def pool_split(gpus: int, prefill_rps: float, decode_rps: float) -> tuple[int, float]:
    """Best integer split of ``gpus`` between a prefill and a decode pool (fluid bound).

    A prefill GPU completes ``prefill_rps`` requests/s (prefill rate / prompt tokens), a
    decode GPU ``decode_rps`` (max batch / (decode tokens x step)). With ``n`` prefill
    GPUs the pipeline carries ``min(n * prefill_rps, (gpus - n) * decode_rps)``.

    Returns ``(n_prefill, requests/s)`` maximizing that (ties: fewer prefill GPUs).
    ``gpus`` must be >= 2 (each pool needs one).
    """
    g = _check.whole("gpus", gpus, minimum=2)
    p = _check.positive("prefill_rps", prefill_rps)
    d = _check.positive("decode_rps", decode_rps)
    # min(n p, (g - n) d) rises then falls, peaking at n* = g d / (p + d): only the whole
    # numbers next to n* can win (bounded cost for any gpus; same answer as trying all).
    peak = g * d / (p + d)
    near = {min(g - 1, max(1, k)) for k in range(math.floor(peak) - 1, math.ceil(peak) + 2)}
    best = max(sorted(near), key=lambda n: (min(n * p, (g - n) * d), -n))
    return best, float(min(best * p, (g - best) * d))



def attainment(requests: pd.DataFrame, warmup_fraction: float = 0.1, **limits) -> float:
    """SLO attainment (fraction) of a run after dropping its warm-up.

    The first ``warmup_fraction`` of requests by arrival are left out (the simulation
    starts empty); of the rest, the fraction that is ``done`` and meets every named
    limit (e.g. ``ttft_s=1.0, tpot_s=0.05, max_gap_s=1.0``) is returned. Failed
    requests count as misses.
    """
    w = _check.nonnegative("warmup_fraction", warmup_fraction)
    if w >= 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    if not isinstance(requests, pd.DataFrame) or "arrival_s" not in requests:
        raise ValueError("requests must be a DataFrame with an arrival_s column")
    ordered = requests.sort_values("arrival_s", kind="stable")
    kept = ordered.iloc[int(math.floor(w * len(ordered))):]
    return slo_attainment(kept, **limits)
