"""Tail latency by segment: who is in the p99, and what a p99 hides.

A fleet's p99 is one number, but the requests behind it are not a random 1 %: they are
the long prompts, the low-priority tenant, the cold cache, the preempted and the retried.
This module cuts a per-request table (the output shape of
:func:`servingcap.serving.simulate`) into segments and reports, for each segment, its
size, its own latency quantiles and its share of the *overall* tail.

Conventions (the same as :mod:`servingcap.slo`):

* Latencies are in seconds. A request whose ``outcome`` is not ``"done"`` (rejected,
  timed out, unfinished) is never dropped silently. ``failures="inf"`` (the default)
  counts it as infinitely late; ``failures="censor"`` counts it at the time it was known
  to have failed (``finish_s - arrival_s``, a lower bound on the latency the user saw);
  ``failures="drop"`` removes it, which is the flattering, dishonest choice the book
  warns about and is offered only so the two can be compared.
* Quantiles are empirical (inverted CDF): the smallest observed value with at least a
  fraction ``p`` of the requests at or below it.
* The **overall tail** at level ``p`` is the set of requests whose latency is at or above
  the overall p-quantile. A segment's *tail share* is the fraction of that set that
  belongs to the segment; tail shares over a partition sum to 1.

Functions:

- :func:`request_latencies` one latency per request under a failure rule
- :func:`tail_mask`          which requests are in the overall tail
- :func:`tail_shares`        share of the overall tail contributed by each segment
- :func:`tail_by_segment`    the tidy per-segment table (count, share, quantiles, tail share)
- :func:`quantile_ways`      one quantile computed with failures dropped, censored and infinite
- :func:`length_buckets`     label token counts by fixed edges
- :func:`burst_windows`      label requests by whether their arrival window was busy
- :func:`simulate_with_retries` re-submit failed requests after a delay, tagged as retries
- :func:`sequential_paths`   per-task critical path of a chain of sequential calls
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.stats import hypergeom

from . import _check
from .slo import OUTCOMES

__all__ = ["FAILURE_RULES", "request_latencies", "tail_mask", "tail_shares",
           "tail_by_segment", "quantile_ways", "length_buckets", "burst_windows",
           "simulate_with_retries", "sequential_paths"]

FAILURE_RULES = ("inf", "censor", "drop")
"""How a request that is not ``done`` enters a latency quantile (see the module doc)."""


# --------------------------------------------------------------------------- validation


def _frame(frame, columns) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in ("outcome", *columns) if c not in frame.columns]
    if missing:
        raise ValueError(f"frame is missing column(s) {missing}; it has {list(frame.columns)}")
    if len(frame) == 0:
        raise ValueError("frame must have at least one request, got an empty DataFrame")
    bad = ~frame["outcome"].astype(object).isin(OUTCOMES).to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"frame outcome must be one of {OUTCOMES}, "
                         f"got {frame['outcome'].iloc[i]!r} at row {i}")
    return frame


def _rule(failures: str) -> str:
    if failures not in FAILURE_RULES:
        raise ValueError(f"failures must be one of {FAILURE_RULES}, got {failures!r}")
    return failures


def _labels(frame: pd.DataFrame, by) -> pd.Series:
    """Segment label per request, from a column name or an array-like of labels."""
    if isinstance(by, str):
        if by not in frame.columns:
            raise ValueError(f"by must name a column of frame or be one label per request, "
                             f"got {by!r}; columns are {list(frame.columns)}")
        labels = frame[by]
    else:
        values = by.array if isinstance(by, pd.Series) else by
        if np.ndim(values) != 1 or len(values) != len(frame):
            size = len(values) if np.ndim(values) == 1 else np.shape(values)
            raise ValueError(f"by must have one label per request ({len(frame)}), got {size!r}")
        labels = pd.Series(values, index=frame.index)
    if labels.isna().any():
        i = int(np.argmax(labels.isna().to_numpy()))
        raise ValueError(f"by must label every request, got a missing label at row {i}")
    return labels


def _order(labels: pd.Series) -> list:
    if isinstance(labels.dtype, pd.CategoricalDtype):
        present = set(labels.unique())
        return [c for c in labels.cat.categories if c in present]
    return sorted(labels.unique(), key=lambda x: (str(type(x)), x))


def _quantile(values: np.ndarray, p: float) -> float:
    if values.size == 0:
        return float("nan")
    return float(np.quantile(values, p, method="inverted_cdf"))


def _pct(p: float) -> str:
    return f"p{100 * p:g}"


# --------------------------------------------------------------------------- latencies


def request_latencies(frame, column: str = "ttft_s", failures: str = "inf") -> np.ndarray:
    """One latency (s) per request of ``frame``, failures handled by ``failures``.

    Parameters
    ----------
    frame : pandas.DataFrame
        Per-request table with ``outcome`` and ``column``; ``arrival_s`` and ``finish_s``
        too when ``failures="censor"``.
    column : str
        Latency column (s), e.g. ``"ttft_s"`` or ``"e2e_s"``.
    failures : {"inf", "censor", "drop"}
        A request that is not ``done`` counts as ``inf``, as ``finish_s - arrival_s``
        (the time it was known to have failed: a lower bound), or is dropped (NaN here;
        quantile functions then skip it).

    Returns
    -------
    numpy.ndarray
        Latencies in s, aligned with the rows of ``frame``.
    """
    rule = _rule(failures)
    column = _check.label("column", column)
    need = (column, "arrival_s", "finish_s") if rule == "censor" else (column,)
    frame = _frame(frame, need)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    done = (frame["outcome"].astype(object) == "done").to_numpy()
    bad = done & ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{column} must be a finite number >= 0 for done requests, "
                         f"got {values[i]!r} at row {i}")
    if rule == "inf":
        return np.where(done, values, np.inf)
    if rule == "drop":
        return np.where(done, values, np.nan)
    known = (_check.column(frame, "finish_s", "frame") - _check.column(frame, "arrival_s", "frame"))
    if (~done & ~np.isfinite(known)).any():
        i = int(np.argmax(~done & ~np.isfinite(known)))
        raise ValueError(f"failures='censor' needs finish_s for every failed request, "
                         f"got {frame['finish_s'].iloc[i]!r} at row {i}")
    return np.where(done, values, np.maximum(known, 0.0))


def tail_mask(frame, p: float = 0.99, column: str = "ttft_s",
              failures: str = "inf") -> tuple[np.ndarray, float]:
    """Which requests are in the overall tail: latency at or above the overall p-quantile.

    Returns ``(mask, threshold_s)``. The mask is never empty (the quantile is an observed
    value); with ``failures="drop"`` dropped requests are never in the tail. When more
    than ``1 - p`` of the requests failed and ``failures="inf"``, the threshold is
    ``inf`` and the tail is exactly the failed requests.
    """
    p = _check.probability("p", p)
    x = request_latencies(frame, column, failures)
    kept = x[~np.isnan(x)]
    if kept.size == 0:
        raise ValueError(f"no request left to take a quantile of ({column}, failures={failures!r})")
    threshold = _quantile(kept, p)
    return (x >= threshold) & ~np.isnan(x), threshold


def tail_shares(frame, by, p: float = 0.99, column: str = "ttft_s",
                failures: str = "inf") -> pd.Series:
    """Share of the overall p-tail contributed by each segment (fractions summing to 1).

    Parameters
    ----------
    frame : pandas.DataFrame
        Per-request table (see the module doc).
    by : str or array-like
        A column of ``frame`` holding each request's segment, or one label per request.
    p : float
        Tail level in (0, 1), e.g. 0.99 for the p99 tail.
    column : str
        Latency column (s).
    failures : {"inf", "censor", "drop"}
        How failed requests count (see :func:`request_latencies`).

    Returns
    -------
    pandas.Series
        Indexed by segment (categorical order if ``by`` is categorical, else sorted).
    """
    mask, _ = tail_mask(frame, p, column, failures)
    labels = _labels(frame, by)
    counts = labels[mask].value_counts()
    order = _order(labels)
    return pd.Series([counts.get(s, 0) / mask.sum() for s in order], index=order,
                     name=f"{column} {_pct(p)} tail share", dtype=float)


def tail_by_segment(frame, by, columns: str | Sequence[str] = ("ttft_s", "e2e_s"),
                    quantiles: Sequence[float] = (0.5, 0.99), tail_p: float = 0.99,
                    failures: str = "inf", dimension: str | None = None) -> pd.DataFrame:
    """The per-segment tail table: size, own quantiles, share of the overall tail.

    Parameters
    ----------
    frame : pandas.DataFrame
        Per-request table with ``outcome`` and each latency column (s).
    by : str or array-like
        Segment of each request: a column name of ``frame`` or one label per request.
    columns : str or sequence of str
        Latency columns (s) to summarize, e.g. ``("ttft_s", "e2e_s")``.
    quantiles : sequence of float
        Quantile levels in (0, 1) reported per segment (columns named ``<column>_p50`` ...).
    tail_p : float
        Level of the overall tail whose shares are reported (``<column>_tail_share``).
    failures : {"inf", "censor", "drop"}
        How failed requests count (see :func:`request_latencies`).
    dimension : str, optional
        Name of the segmentation put in a ``dimension`` column (default: ``by`` if it is
        a column name, else ``"segment"``), so tables of several dimensions concatenate
        into one long, tidy table.

    Returns
    -------
    pandas.DataFrame
        One row per segment: ``dimension, segment, requests`` (count), ``share`` (of all
        requests), then for each column its quantiles (s, unrounded), its tail share
        (fraction; the tail shares of one column sum to 1 over the segments),
        ``<column>_tail_requests`` (how many of the segment's requests are in the tail)
        and ``<column>_tail_p``: the probability that a tail of the same size drawn at
        random from all requests would hold at least that many of the segment's
        (hypergeometric upper tail, in [0, 1]). A small ``_tail_p`` says the segment is
        over-represented in the tail by more than chance; with a small tail (a p99 over a
        few hundred requests is a handful of them) it stays large, so say "not decided".
    """
    cols = [columns] if isinstance(columns, str) else list(columns)
    if not cols:
        raise ValueError(f"columns must name at least one latency column, got {columns!r}")
    qs = [_check.probability("quantiles", q) for q in quantiles]
    if not qs:
        raise ValueError(f"quantiles must hold at least one level, got {quantiles!r}")
    tail_p = _check.probability("tail_p", tail_p)
    rule = _rule(failures)
    labels = _labels(_frame(frame, cols), by)
    name = dimension if dimension is not None else (by if isinstance(by, str) else "segment")
    order = _order(labels)
    lat = {c: request_latencies(frame, c, rule) for c in cols}
    shares = {c: tail_shares(frame, labels, tail_p, c, rule) for c in cols}
    in_tail = {c: tail_mask(frame, tail_p, c, rule)[0] for c in cols}
    n = len(frame)
    rows = []
    for seg in order:
        m = (labels == seg).to_numpy()
        row = {"dimension": name, "segment": seg, "requests": int(m.sum()),
               "share": float(m.sum()) / n}
        for c in cols:
            x = lat[c][m]
            x = x[~np.isnan(x)]
            for q in qs:
                row[f"{c}_{_pct(q)}"] = _quantile(x, q)
            row[f"{c}_tail_share"] = float(shares[c][seg])
            size, hits = int(in_tail[c].sum()), int((in_tail[c] & m).sum())
            row[f"{c}_tail_requests"] = hits
            # P(at least `hits` of the segment in a random subset of `size` of the
            # requests the tail could hold: those with a latency under this rule)
            valid = ~np.isnan(lat[c])
            row[f"{c}_tail_p"] = float(hypergeom.sf(hits - 1, int(valid.sum()),
                                                    int((valid & m).sum()), size))
        rows.append(row)
    return pd.DataFrame(rows)


def quantile_ways(frame, p: float = 0.99, column: str = "ttft_s") -> dict:
    """One latency quantile (s) computed the three ways failures can be handled.

    Returns a dict with keys ``"drop"`` (failed requests removed: flatters the tail),
    ``"censor"`` (failed requests at the time they were known to fail: a lower bound on
    the honest value), ``"inf"`` (failed requests infinitely late: the honest value when
    nothing better is known, as :func:`servingcap.slo.latency_quantile` computes), and
    ``"failed_share"`` (fraction of requests that are not ``done``).
    """
    p = _check.probability("p", p)
    out = {}
    for rule in ("drop", "censor", "inf"):
        x = request_latencies(frame, column, rule)
        x = x[~np.isnan(x)]
        out[rule] = _quantile(x, p)
    out["failed_share"] = float((frame["outcome"].astype(object) != "done").mean())
    return out


# --------------------------------------------------------------------------- labels


@_check.guarded
def length_buckets(tokens, edges: Sequence[float], unit: str = "tokens") -> pd.Categorical:
    """Label token counts by bucket edges: ``[e0, e1)``, ... with open ends (ordered).

    ``length_buckets(prompts, [500, 2000])`` gives ``"< 500"``, ``"500-1,999"`` and
    ``">= 2,000"`` (with ``unit`` appended).
    """
    x = _check.array("tokens", tokens, nonnegative_values=True)
    e = _check.array("edges", edges)
    if e.size == 0 or (np.diff(e) <= 0).any() or (e <= 0).any():
        raise ValueError(f"edges must be positive and strictly increasing, got {list(edges)!r}")
    names = [f"< {e[0]:,.0f} {unit}"]
    names += [f"{lo:,.0f}-{hi - 1:,.0f} {unit}" for lo, hi in zip(e[:-1], e[1:], strict=True)]
    names.append(f">= {e[-1]:,.0f} {unit}")
    idx = np.searchsorted(e, x, side="right")
    return pd.Categorical.from_codes(idx, categories=names, ordered=True)


@_check.guarded
def burst_windows(arrival_s, window_s: float, busy_share: float = 0.2,
                  start: float = 0.0) -> tuple[pd.Categorical, np.ndarray]:
    """Label each request by whether its arrival window was among the busiest.

    The time axis is cut into windows of ``window_s`` seconds from ``start``; the
    ``busy_share`` fraction of windows with the most arrivals (ties broken by time) are
    ``"burst window"``, the rest ``"ordinary window"``. Returns ``(labels, counts)``
    where ``counts`` is arrivals per window (requests).
    """
    a = _check.array("arrival_s", arrival_s)
    w = _check.positive("window_s", window_s)
    share = _check.probability("busy_share", busy_share)
    t0 = _check.number("start", start)
    if a.size and a.min() < t0:
        raise ValueError(f"start must be <= the first of arrival_s ({float(a.min())!r} s), "
                         f"got {start!r}")
    if a.size:
        _check.windows(float(a.max() - t0), w, f"arrival_s up to {float(a.max())!r} s, from "
                                               f"start = {t0!r} s in window_s = {w!r} s")
    idx = np.floor((a - t0) / w).astype(np.int64)
    counts = np.bincount(idx, minlength=int(idx.max()) + 1 if a.size else 0)
    k = max(1, int(round(share * counts.size)))
    busiest = np.argsort(-counts, kind="stable")[:k]
    busy = np.zeros(counts.size, dtype=bool)
    busy[busiest] = True
    codes = np.where(busy[idx], 0, 1)
    labels = pd.Categorical.from_codes(codes, categories=["burst window", "ordinary window"])
    return labels, counts


# --------------------------------------------------------------------------- retries


def simulate_with_retries(requests, replica=None, *, retry_delay_s: float,
                          max_retries: int = 1, retry_on: Sequence[str] = ("timed_out",),
                          max_rounds: int = 10, **options) -> pd.DataFrame:
    """Simulate a client that re-submits failed requests after a delay, tagged as retries.

    A request whose attempt ends with an outcome in ``retry_on`` is sent again
    ``retry_delay_s`` seconds after it failed (its ``finish_s``), up to ``max_retries``
    times. Retries add load, which can make other requests fail, so the retry set is
    found by repeated replay: run, derive the retries from that run's failures, run
    originals plus retries again, until the set of retries no longer changes (a fixed
    point) or ``max_rounds`` is reached.

    Parameters
    ----------
    requests : pandas.DataFrame
        Input of :func:`servingcap.serving.simulate` (extra columns such as
        ``priority`` are copied to the retries).
    replica : servingcap.serving.Replica, optional
        The replica model.
    retry_delay_s : float
        Client back-off between the failure and the retry (s), >= 0.
    max_retries : int
        Most retries per original request, >= 1.
    retry_on : sequence of str
        Outcomes that trigger a retry (from ``("rejected", "timed_out")``).
    max_rounds : int
        Most replays before giving up on the fixed point.
    **options
        Passed to :func:`servingcap.serving.simulate` (``replicas``, ``policy``, ...).

    Returns
    -------
    pandas.DataFrame
        The simulator's per-attempt output, the input's extra columns (such as
        ``priority``), ``request`` (position of the original
        request), ``attempt`` (0 = original, 1.. = retry), ``first_arrival_s`` (s, the
        original's arrival) and ``user_e2e_s`` / ``user_ttft_s`` (s, measured from the
        original arrival; NaN unless the attempt is done). ``attrs`` reports the search:
        ``rounds`` (replays run), ``converged`` (the last replay's failures imply exactly
        the retries it contained), ``missing_retries`` (failures of the last replay with
        no retry in it) and ``stale_retries`` (retries whose attempt before did not fail
        in the last replay). ``max_rounds=2`` is the one-step approximation: retries
        derived from a replay without retries, then one replay with them.
    """
    from .serving import simulate  # local import: serving is the heavier module

    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a pandas DataFrame, got {type(requests).__name__}")
    _check.request_tokens(requests)
    delay = _check.nonnegative("retry_delay_s", retry_delay_s)
    tries = _check.whole("max_retries", max_retries)
    rounds = _check.whole("max_rounds", max_rounds)
    retry_on = tuple(retry_on)
    allowed = ("rejected", "timed_out")
    if not retry_on or any(o not in allowed for o in retry_on):
        raise ValueError(f"retry_on must be a non-empty subset of {allowed}, got {retry_on!r}")
    base = requests.reset_index(drop=True).copy()
    base["request"] = np.arange(len(base))
    base["attempt"] = 0
    base["first_arrival_s"] = _check.column(base, "arrival_s", "requests")
    retries = base.iloc[0:0]
    used = 0
    converged = False
    for _ in range(rounds):
        used += 1
        frame = pd.concat([base, retries], ignore_index=True)
        sim_in = frame.drop(columns=["request", "attempt", "first_arrival_s"])
        out = simulate(sim_in, replica, **options)
        failed = out["outcome"].astype(object).isin(retry_on).to_numpy() & \
            (frame["attempt"].to_numpy() < tries)
        new = frame[failed].copy()
        new["arrival_s"] = out["finish_s"].to_numpy()[failed] + delay
        new["attempt"] = new["attempt"] + 1
        implied = _retry_keys(new)
        present = _retry_keys(retries)
        if implied == present:
            converged = True
            break
        if used < rounds:
            retries = new.reset_index(drop=True)
    result = out.copy()
    for c in frame.columns:
        if c not in result.columns:
            result[c] = frame[c].to_numpy()
    done = (result["outcome"].astype(object) == "done").to_numpy()
    result["user_ttft_s"] = np.where(done, result["first_token_s"] - result["first_arrival_s"],
                                     np.nan)
    result["user_e2e_s"] = np.where(done, result["finish_s"] - result["first_arrival_s"], np.nan)
    result.attrs["rounds"] = used
    result.attrs["converged"] = converged
    result.attrs["missing_retries"] = len(implied - present)
    result.attrs["stale_retries"] = len(present - implied)
    return result


def _retry_keys(frame: pd.DataFrame) -> set:
    """(request, attempt, arrival rounded to 1 ns) of each retry row."""
    arrival = _check.column(frame, "arrival_s", "requests")
    # Rounding to 1 ns multiplies by 1e9: leave times past 1e290 s as they are (no overflow).
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.where(np.abs(arrival) < 1e290, np.round(arrival, 9), arrival)
    return set(zip(frame["request"].tolist(), frame["attempt"].tolist(), rounded.tolist(),
                   strict=True))


# --------------------------------------------------------------------------- agent chains


def sequential_paths(calls, task: str = "task") -> pd.DataFrame:
    """Per-task critical path of a chain of sequential calls (s).

    Parameters
    ----------
    calls : pandas.DataFrame
        One row per call with ``task`` (the owning task), ``arrival_s`` (issued),
        ``start_s`` (admitted to a slot) and ``finish_s`` (last token), in s.
    task : str
        Name of the task column.

    Returns
    -------
    pandas.DataFrame
        Indexed by task: ``calls`` (count), ``sum_wait_s`` (sum of queue waits),
        ``sum_call_s`` (sum of call latencies, arrival to finish), ``max_call_s``
        (the slowest call), ``span_s`` (first call issued to last call finished: the
        critical path through the calls, including any gaps between them, such as tool
        operations) and ``gap_s`` (``span_s - sum_call_s``: time outside the route).
    """
    if not isinstance(calls, pd.DataFrame):
        raise ValueError(f"calls must be a pandas DataFrame, got {type(calls).__name__}")
    task = _check.label("task", task)
    missing = [c for c in (task, "arrival_s", "start_s", "finish_s") if c not in calls.columns]
    if missing:
        raise ValueError(f"calls is missing column(s) {missing}; it has {list(calls.columns)}")
    arr = _check.array("arrival_s", calls["arrival_s"])
    start = _check.array("start_s", calls["start_s"])
    fin = _check.array("finish_s", calls["finish_s"])
    if ((start < arr) | (fin < start)).any():
        i = int(np.argmax((start < arr) | (fin < start)))
        raise ValueError(f"calls must have arrival_s <= start_s <= finish_s, got "
                         f"{arr[i]!r}, {start[i]!r}, {fin[i]!r} at row {i}")
    work = pd.DataFrame({"task": calls[task].to_numpy(), "wait": start - arr,
                         "call": fin - arr, "arrival": arr, "finish": fin})
    g = work.groupby("task", sort=True)
    out = pd.DataFrame({"calls": g.size(), "sum_wait_s": g["wait"].sum(),
                        "sum_call_s": g["call"].sum(), "max_call_s": g["call"].max(),
                        "span_s": g["finish"].max() - g["arrival"].min()})
    out["gap_s"] = out["span_s"] - out["sum_call_s"]
    out.index.name = task
    return out

