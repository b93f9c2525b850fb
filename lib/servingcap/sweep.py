"""Sweeps of the serving simulator, and where each request's latency went.

Capacity questions are answered by turning one knob (arrival rate, max batch size, ...)
and watching the two latency objectives. This module keeps that loop out of the chapters:

- :func:`poisson_requests` builds a seeded Poisson request stream (common random
  numbers: the same seed gives the same arrival *pattern* at every rate, scaled);
- :func:`summarize` turns one simulation into p50/p99 TTFT, TPOT and queue wait, SLO
  attainment, goodput and the mean decode batch;
- :func:`sweep` runs a simulation per knob value and returns one tidy row per value;
- :func:`ttft_parts` splits each request's TTFT into queue wait, its own prefill and
  the rest of the step(s) that produced the first token;
- :func:`tpot_parts` splits each request's TPOT into the decode step at the batch it
  ran in and the stalls caused by other requests' prefills sharing those steps;
- :func:`first_crossing` finds where a swept curve first exceeds a limit.

Units: seconds, tokens, requests/s; batch sizes in sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from . import _check
from .params import LOCKED
from .serving import Replica
from .slo import goodput, latency_quantile, slo_attainment

__all__ = ["poisson_requests", "summarize", "sweep", "ttft_parts", "tpot_parts",
           "first_crossing"]

_EPS = 1e-9     # tolerance (s) when matching event times to step boundaries


@_check.guarded
def poisson_requests(rate: float, n: int, seed, prompt_tokens=LOCKED.prompt_tokens,
                     output_tokens=LOCKED.output_tokens) -> pd.DataFrame:
    """``n`` requests with Poisson arrivals at ``rate`` requests/s.

    Parameters
    ----------
    rate : float
        Arrival rate (requests/s), > 0.
    n : int
        Number of requests, >= 1.
    seed : int or numpy.random.Generator
        The gaps are ``Exp(1) / rate`` from ``numpy.random.default_rng(seed)``, so one
        seed gives the same pattern, only stretched, at every rate.
    prompt_tokens, output_tokens : int or array of int
        Token counts: one number for every request, or one per request (length ``n``).

    Returns
    -------
    pandas.DataFrame
        ``arrival_s`` (s, first arrival after one gap), ``prompt_tokens``, ``output_tokens``.
    """
    lam = _check.positive("rate", rate)
    count = _check.size("n", n)
    rng = _check.generator("seed", seed)
    arrivals = np.cumsum(rng.exponential(1.0, count)) / lam
    frame = pd.DataFrame({"arrival_s": arrivals})
    for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if np.ndim(value) == 0:
            frame[name] = _check.whole(name, value)
            continue
        values = _check.array(name, value)
        if values.size != count:
            raise ValueError(f"{name} must have one value per request (n={count}), "
                             f"got {values.size}")
        if (values < 1).any() or (values != np.round(values)).any():
            i = int(np.argmax((values < 1) | (values != np.round(values))))
            raise ValueError(f"{name} must be whole numbers >= 1, got {values[i]!r} at index {i}")
        frame[name] = values.astype(np.int64)
    return frame


def _split(result):
    """(requests, steps or None) from a simulate() result."""
    if isinstance(result, tuple):
        if len(result) != 2:
            raise ValueError(f"result must be a DataFrame or (requests, steps), got a "
                             f"tuple of {len(result)}")
        return result
    return result, None


@_check.renames("result")
def summarize(result, *, warmup_fraction: float = 0.1, ttft_slo_s: float = LOCKED.ttft_slo_s,
              tpot_slo_s: float = LOCKED.tpot_slo_s) -> dict:
    """Latency percentiles, SLO attainment and goodput of one simulation.

    Parameters
    ----------
    result : DataFrame or (DataFrame, DataFrame)
        The output of :func:`servingcap.serving.simulate` (with or without its step log).
    warmup_fraction : float
        Fraction of requests, by arrival order, dropped from the statistics because
        the simulation starts empty; in ``[0, 1)``.
    ttft_slo_s, tpot_slo_s : float
        The objectives (s) for attainment and goodput.

    Returns
    -------
    dict
        ``requests`` (kept), ``ttft_p50_s``, ``ttft_p99_s``, ``tpot_p50_s``,
        ``tpot_p99_s``, ``queue_p50_s``, ``queue_p99_s`` (admitted minus arrival),
        ``attainment`` (fraction meeting both objectives), ``goodput_rps`` (requests/s
        meeting both) and ``throughput_rps`` (completed requests/s), both per second of
        the window from the first kept arrival to the last kept arrival or finish,
        whichever is later (so an overloaded run reports its service rate, not its
        arrival rate), and, when the step log is given,
        ``mean_batch`` (time-weighted decode batch, sequences). Failed requests count
        as infinitely late in every percentile (see :mod:`servingcap.slo`).
    """
    requests, steps = _split(result)
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"result must hold a DataFrame of requests, got {type(requests).__name__}")
    _check.table("result", requests, ("arrival_s", "admitted_s", "finish_s", "outcome"))
    for column in ("arrival_s", "admitted_s", "finish_s"):
        _check.column(requests, column, "result")
    _check.array("result['arrival_s']", requests["arrival_s"])
    w = _check.nonnegative("warmup_fraction", warmup_fraction)
    if w >= 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    ttft_slo = _check.positive("ttft_slo_s", ttft_slo_s)
    tpot_slo = _check.positive("tpot_slo_s", tpot_slo_s)
    ordered = requests.sort_values("arrival_s", kind="stable")
    kept = ordered.iloc[int(math.floor(w * len(ordered))):]
    if len(kept) < 2:
        raise ValueError(f"result needs at least 2 requests after warm-up (warmup_fraction={w!r} of "
                         f"{len(ordered)}), got {len(kept)}")
    start = float(kept["arrival_s"].iloc[0])
    last_finish = kept["finish_s"].max()                    # NaN-skipping
    end = float(kept["arrival_s"].iloc[-1])
    if pd.notna(last_finish):
        end = max(end, float(last_finish))
    span = end - start
    if span <= 0:
        raise ValueError("the kept requests must span a positive time, got 0 s")
    queue = kept.assign(queue_s=kept["admitted_s"] - kept["arrival_s"])
    out = {
        "requests": int(len(kept)),
        "ttft_p50_s": latency_quantile(kept, 0.50, "ttft_s"),
        "ttft_p99_s": latency_quantile(kept, 0.99, "ttft_s"),
        "tpot_p50_s": latency_quantile(kept, 0.50, "tpot_s"),
        "tpot_p99_s": latency_quantile(kept, 0.99, "tpot_s"),
        "queue_p50_s": latency_quantile(queue, 0.50, "queue_s"),
        "queue_p99_s": latency_quantile(queue, 0.99, "queue_s"),
        "attainment": slo_attainment(kept, ttft_s=ttft_slo, tpot_s=tpot_slo),
        "goodput_rps": goodput(kept, span, ttft_s=ttft_slo, tpot_s=tpot_slo),
        "throughput_rps": float((kept["outcome"] == "done").sum()) / span,
    }
    if steps is not None:
        busy = float(steps["duration_s"].sum())
        out["mean_batch"] = (float((steps["decode_batch"] * steps["duration_s"]).sum()) / busy
                             if busy > 0 else 0.0)
    return out


def sweep(values: Iterable, run: Callable, *, name: str, **summary_options) -> pd.DataFrame:
    """Run ``run(value)`` for each knob value and summarize each run.

    Parameters
    ----------
    values : iterable
        Knob settings, e.g. arrival rates (requests/s) or max batch sizes.
    run : callable
        ``value -> simulate(...)`` output (a DataFrame, or ``(requests, steps)``).
    name : str
        Name of the knob; it becomes the index of the table.
    **summary_options
        Passed to :func:`summarize` (``warmup_fraction``, ``ttft_slo_s``, ``tpot_slo_s``).

    Returns
    -------
    pandas.DataFrame
        One row per value, indexed by ``name``, with the columns of :func:`summarize`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not callable(run):
        raise ValueError(f"run must be callable, got {run!r}")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"values must be a sequence of parameter values, got {values!r}")
    values = list(values)
    if not values:
        raise ValueError("values must not be empty")
    rows = []
    for i, value in enumerate(values):
        with _check.naming("values", ("run",)):
            try:
                result = run(value)
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"values[{i}] = {value!r}: run failed: {exc}") from exc
        with _check.naming("run"):
            rows.append({name: value, **summarize(result, **summary_options)})
    return pd.DataFrame(rows).set_index(name)


def _default_cost(replica: Replica) -> float:
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    if replica.step_time is not None:
        raise ValueError("the breakdown needs the built-in cost model (Replica.step_cost), "
                         "but replica has a custom step_time")
    return replica.prefill_rate


@_check.renames("requests")
def ttft_parts(requests: pd.DataFrame, replica: Replica) -> pd.DataFrame:
    """Split each request's TTFT (s) into queue wait, own prefill, and the rest.

    ``ttft_s = queue_s + prefill_s + shared_s`` where

    - ``queue_s = admitted_s - arrival_s``: waiting for a batch slot (and for the step in
      flight to end);
    - ``prefill_s``: the request's own prefill work, ``prompt_tokens - cached_tokens``
      prefilled alone in the mode's chunks (``Replica.idle_prefill_s``; with the
      additive cost, tokens / prefill_rate);
    - ``shared_s``: the rest of the step(s) that produced its first token, i.e. the
      decodes and other prefills it shared them with.

    Needs the default cost model of :class:`~servingcap.serving.Replica`. Rows of
    requests that never produced a first token get NaN.
    """
    _default_cost(replica)
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a DataFrame, got {type(requests).__name__}")
    _check.table("requests", requests,
                 ("arrival_s", "admitted_s", "first_token_s", "prompt_tokens", "ttft_s"))
    _check.request_tokens(requests)
    _check.array("requests['arrival_s']", requests["arrival_s"])
    for column in ("admitted_s", "first_token_s", "ttft_s"):
        if np.isinf(_check.column(requests, column, "requests")).any():
            raise ValueError(f"requests[{column!r}] must be finite or NaN (not reached)")
    cached = (_check.array("requests['cached_tokens']", requests["cached_tokens"],
                           nonnegative_values=True)
              if "cached_tokens" in requests else 0)
    queue = requests["admitted_s"] - requests["arrival_s"]
    alone = replica.idle_prefill_s((requests["prompt_tokens"] - cached).to_numpy(dtype=float))
    own = pd.Series(alone, index=requests.index).where(requests["ttft_s"].notna())
    return pd.DataFrame({
        "ttft_s": requests["ttft_s"],
        "queue_s": queue.where(requests["ttft_s"].notna()),
        "prefill_s": own,
        "shared_s": requests["first_token_s"] - requests["admitted_s"] - own,
    }, index=requests.index)


@_check.renames("requests")
def tpot_parts(requests: pd.DataFrame, steps: pd.DataFrame, replica: Replica) -> pd.DataFrame:
    """Split each request's TPOT (s/token) into its batch's decode time and prefill stalls.

    A request's tokens after the first come from the steps of its replica that start in
    ``[first_token_s, finish_s)``. Each such step lasts ``decode(batch)`` plus what the
    prefill chunks in it add (``prefill_tokens / prefill_rate`` with the additive cost;
    with the fused cost, only what the chunk adds past the weight read: ``duration_s -
    decode(batch)``); averaging over those ``output_tokens - 1`` steps:

    ``tpot_s = decode_s + stall_s`` where ``stall_s`` is the prefill work of *other*
    requests per token (s/token) and ``decode_s`` the decode step time at the batches it
    ran in. ``mean_batch`` is the mean decode batch (sequences) over those steps.

    Parameters
    ----------
    requests, steps : DataFrame
        The two outputs of ``simulate(..., step_log=True)`` for ``replica``.
    replica : Replica
        The replica model simulated (default cost model required).

    Returns
    -------
    pandas.DataFrame
        ``tpot_s, decode_s, stall_s, mean_batch``; NaN for requests without a TPOT.
    """
    rate = _default_cost(replica)
    for label, frame, cols in (("requests", requests, ("first_token_s", "finish_s", "tpot_s",
                                                      "output_tokens", "replica")),
                               ("steps", steps, ("start_s", "replica", "decode_batch",
                                                 "prefill_tokens", "duration_s"))):
        if not isinstance(frame, pd.DataFrame):
            raise ValueError(f"{label} must be a DataFrame, got {type(frame).__name__}")
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{label} is missing column(s) {missing}")
    for column in ("first_token_s", "finish_s", "tpot_s"):
        if np.isinf(_check.column(requests, column, "requests")).any():
            raise ValueError(f"requests[{column!r}] must be finite or NaN (not reached)")
    n = len(requests)
    stall = np.full(n, np.nan)
    batch = np.full(n, np.nan)
    has = requests["tpot_s"].notna().to_numpy()
    rep = requests["replica"].to_numpy()
    first = _check.column(requests, "first_token_s", "requests")
    finish = _check.column(requests, "finish_s", "requests")
    tokens = _check.column(requests, "output_tokens", "requests") - 1
    for k, group in steps.groupby("replica", sort=True):
        g = group.sort_values("start_s", kind="stable")
        start = _check.column(g, "start_s", "steps")
        batches = _check.column(g, "decode_batch", "steps")
        finite = np.where(np.isfinite(batches), batches, -1.0)
        bad = (finite < 0) | (finite > 1e9) | (finite != np.round(finite))
        if bad.any():
            raise ValueError("steps['decode_batch'] must be whole numbers of sequences "
                             f"(0 to 1e9), got {batches[bad][0]!r}")
        batches = batches.astype(np.int64)
        extra = _check.column(g, "duration_s", "steps") - np.array(
            [replica.decode_time(int(b)) for b in batches])
        if replica.step_cost == "additive":       # the same seconds, without round-off
            extra = _check.column(g, "prefill_tokens", "steps") / rate
        pre = np.concatenate([[0.0], np.cumsum(extra)])
        bat = np.concatenate([[0.0], np.cumsum(_check.column(g, "decode_batch", "steps"))])
        idx = np.flatnonzero(has & (rep == k))
        lo = np.searchsorted(start, first[idx] - _EPS, side="left")
        hi = np.searchsorted(start, finish[idx] - _EPS, side="left")
        count = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            stall[idx] = (pre[hi] - pre[lo]) / tokens[idx]
            batch[idx] = np.where(count > 0, (bat[hi] - bat[lo]) / count, np.nan)
    tpot = _check.column(requests, "tpot_s", "requests")
    return pd.DataFrame({"tpot_s": tpot, "decode_s": tpot - stall, "stall_s": stall,
                         "mean_batch": batch}, index=requests.index)


@_check.guarded
def first_crossing(x, y, limit: float) -> float | None:
    """The ``x`` where ``y`` first exceeds ``limit``, by linear interpolation.

    ``x`` increasing (e.g. arrival rates, requests/s), ``y`` the swept statistic in the
    limit's units (``inf`` allowed). Returns ``x[0]`` when already over at the first
    point and None when ``y`` never exceeds ``limit``.
    """
    xs = _check.array("x", x)
    ys = _check.points("y", y)
    lim = _check.number("limit", limit)
    if ys.shape != xs.shape:
        raise ValueError(f"x and y must have the same length, got {xs.size} and {ys.size}")
    if xs.size and (np.diff(xs) <= 0).any():
        raise ValueError("x must be strictly increasing")
    if np.isnan(ys).any():
        raise ValueError("y must not contain NaN")
    over = np.flatnonzero(ys > lim)
    if over.size == 0:
        return None
    j = int(over[0])
    if j == 0:
        return float(xs[0])
    if not math.isfinite(ys[j]):
        return float(xs[j])
    frac = (lim - ys[j - 1]) / (ys[j] - ys[j - 1])
    return float(xs[j - 1] + frac * (xs[j] - xs[j - 1]))
