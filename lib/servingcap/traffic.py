"""Offered-load inputs: the book's real request traces.

``load_trace(name)`` returns one DataFrame shape for every trace, so chapters and the
simulators never care where a trace came from:

========================  =======  ==========================================
column                    unit     meaning
========================  =======  ==========================================
``arrival_s``             s        arrival time, seconds after the first request
``prompt_tokens``         tokens   input (context) length
``output_tokens``         tokens   generated length
``hash_ids`` (Mooncake)   ids      512-token prompt blocks; a repeated id is a
                                   reusable prefix block
========================  =======  ==========================================

The rest of the module is offered-load arithmetic:

- fluid bursts: :func:`burst_backlog`, :func:`drain_time`, :func:`balancing_rate`,
  :func:`fluid_backlog` (backlog over time for a piecewise-constant rate profile) and
  :func:`piecewise_poisson` (Poisson arrivals from such a profile, to check the fluid
  answer by simulation);
- burstiness of an arrival stream: :func:`window_counts`, :func:`index_of_dispersion`,
  :func:`peak_to_mean`, :func:`window_utilization`, :func:`mean_rate`;
- reshaping a trace: :func:`rescale_to_rate` (same burst shape at another mean rate)
  and :func:`poisson_like` (same requests, Poisson timing at the same mean rate);
- resampling a trace: :func:`block_bootstrap` (any number of requests in contiguous
  segments of the trace, Politis & Romano's stationary bootstrap) and
  :func:`bootstrap_windows` (one such window per replication seed);
- agent call amplification: :func:`agent_request_rate` (user tasks/s to inference
  requests/s) and :func:`retry_multiplier` (requests per call under retries).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from . import _check
from ._check import UnstableQueueError
from .stats import replication_seeds

__all__ = [
    "TRACES", "data_dir", "load_trace",
    "burst_backlog", "drain_time", "balancing_rate", "fluid_backlog", "piecewise_poisson",
    "window_counts", "index_of_dispersion", "peak_to_mean", "window_utilization",
    "mean_rate", "rescale_to_rate", "poisson_like", "block_bootstrap", "BOOTSTRAP_SEGMENT_S",
    "bootstrap_windows",
    "agent_request_rate", "retry_multiplier",
]

TRACES = {
    "azure_conv": "AzureLLMInferenceTrace_conv_2023.csv",
    "azure_code": "AzureLLMInferenceTrace_code_2023.csv",
    "mooncake": "mooncake_conversation_trace.jsonl",
}
"""Trace names accepted by :func:`load_trace`, and their files in ``data/``."""


def data_dir() -> Path:
    """The folder holding the traces: ``$SERVINGCAP_DATA`` if set, else the repo's ``data/``."""
    env = os.environ.get("SERVINGCAP_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


def load_trace(name: str) -> pd.DataFrame:
    """Load a request trace as ``arrival_s, prompt_tokens, output_tokens`` (+ extras).

    Parameters
    ----------
    name : str
        One of :data:`TRACES` (``"azure_conv"``, ``"azure_code"``, ``"mooncake"``), or
        a path to a file in one of the two formats: an Azure-style CSV with columns
        ``TIMESTAMP, ContextTokens, GeneratedTokens``, or a Mooncake-style JSON-lines
        file with ``timestamp`` (numbers in milliseconds, from the trace start or the
        Unix epoch, or ISO 8601 strings), ``input_length``, ``output_length``.

    Returns
    -------
    pandas.DataFrame
        One row per request, sorted by ``arrival_s`` (seconds from the first request).

    Raises
    ------
    ValueError
        For an unknown name, an empty or unparseable file, a missing column, or values
        that are not valid (unparseable or mixed-type times, negative, non-integer or
        larger than ``_check.MAX_TOKENS`` token counts); the message names the file.
    FileNotFoundError
        When the file is not there.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise ValueError(f"name must be a trace name or a path, got {name!r}")
    path = data_dir() / TRACES[name] if name in TRACES else Path(name)
    if name not in TRACES and path.suffix not in (".csv", ".jsonl"):
        raise ValueError(
            f"name must be one of {sorted(TRACES)} or a .csv/.jsonl path, got {name!r}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    raw = _read_azure(path) if path.suffix == ".csv" else _read_mooncake(path)
    return _tidy(raw, path)


def _require(frame: pd.DataFrame, columns, path: Path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path.name}: missing column(s) {missing}; found {list(frame.columns)}")


def _read_azure(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV trace ({' '.join(str(exc).split())})"
                         ) from exc
    _require(frame, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path)
    # One line: the first value that is there but not a date-time, with its line in the
    # file (the header is line 1); empty stamps and token counts are checked by load_trace.
    stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce")
    bad = (stamps.isna() & frame["TIMESTAMP"].notna()).to_numpy()
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(f"{path} line {i + 2}: TIMESTAMP is {frame['TIMESTAMP'].iat[i]!r}, "
                         "expected an ISO 8601 date-time")
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return pd.DataFrame({"arrival_s": seconds, "prompt_tokens": frame["ContextTokens"],
                         "output_tokens": frame["GeneratedTokens"]})


def _read_mooncake(path: Path) -> pd.DataFrame:
    try:
        # dtype=False: pandas would otherwise turn a "timestamp" column of
        # epoch numbers or ISO strings into datetimes (nanoseconds), which then read as
        # milliseconds stretch the trace; _mooncake_seconds decides the unit instead.
        frame = pd.read_json(path, lines=True, dtype=False)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path.name}: not valid JSON lines ({exc})") from exc
    if frame.empty:
        raise ValueError(f"{path.name}: the trace has no requests")
    _require(frame, ["timestamp", "input_length", "output_length"], path)
    out = pd.DataFrame({"arrival_s": _mooncake_seconds(frame["timestamp"], path),
                        "prompt_tokens": frame["input_length"],
                        "output_tokens": frame["output_length"]})
    if "hash_ids" in frame.columns:
        out["hash_ids"] = frame["hash_ids"]
    return out


def _mooncake_seconds(stamps: pd.Series, path: Path) -> pd.Series:
    """Seconds since the first request from a JSONL ``timestamp`` column.

    Numbers are milliseconds (Mooncake's unit, from the trace start or from the Unix
    epoch: only differences matter); strings are ISO 8601 date-times (a time zone
    offset is honoured, none means UTC). Anything else, or a mix, is refused.
    """
    kinds = {type(v).__name__ for v in stamps}
    if stamps.dtype.kind in "iuf":
        ms = stamps.astype(float)
        if ms.isna().any() or not np.isfinite(ms).all():
            row = int((~np.isfinite(ms.to_numpy())).argmax())
            raise ValueError(f"{path.name}: row {row} has a missing or unparseable timestamp "
                             f"({stamps.iloc[row]!r})")
        first = float(ms.min())
        # Epoch milliseconds lie in [1e11, 1e14) (years 1973 to 5138). A trace starting
        # past 1e9 outside that range is in another epoch unit (1.7e9 seconds, 1.7e15
        # microseconds, 1.7e18 nanoseconds): refuse rather than stretch or squeeze it.
        if first >= 1e9 and not 1e11 <= first < 1e14:
            unit = "seconds" if first < 1e11 else "microseconds or nanoseconds"
            raise ValueError(
                f"{path.name}: timestamp {first:.6g} looks like a Unix time in {unit}; "
                "numeric timestamps must be milliseconds (or use ISO 8601 strings)"
            )
        return (ms - first) / 1000.0
    if kinds == {"str"}:
        try:
            when = pd.to_datetime(stamps, format="ISO8601", utc=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path.name}: timestamp strings must be ISO 8601 date-times "
                             f"({exc})") from exc
        return (when - when.min()).dt.total_seconds()
    row = next((i for i, v in enumerate(stamps) if type(v) is not type(stamps.iloc[0])), 0)
    raise ValueError(
        f"{path.name}: row {row} has a missing or unparseable timestamp "
        f"({stamps.iloc[row]!r}); timestamps must be all numbers (milliseconds) or all "
        f"ISO 8601 strings, got {sorted(kinds)}"
    )


def _tidy(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    if frame.empty:
        raise ValueError(f"{path.name}: the trace has no requests")
    if frame["arrival_s"].isna().any():
        row = int(frame["arrival_s"].isna().to_numpy().argmax())
        raise ValueError(f"{path.name}: row {row} has a missing or unparseable timestamp")
    for column in ("prompt_tokens", "output_tokens"):
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = (~np.isfinite(values) | (values < 0) | (values != np.round(values))
               | (values > _check.MAX_TOKENS))
        if bad.any():
            row = int(bad.argmax())
            raw = frame[column].iloc[row]
            shown = raw.item() if hasattr(raw, "item") else raw
            raise ValueError(f"{path.name}: row {row} has {column} = {shown!r}, "
                             f"expected a whole number of tokens from 0 to {_check.MAX_TOKENS:.0e}")
        frame[column] = values.astype(np.int64)
    frame["arrival_s"] = frame["arrival_s"].astype(float)
    return frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)


# ---------------------------------------------------------------------------------------
# Fluid bursts: backlog and drain for piecewise-constant arrival rates
# ---------------------------------------------------------------------------------------

@_check.guarded
def burst_backlog(arrival_rate: float, capacity: float, duration_s: float) -> float:
    """Requests queued by a burst that arrives faster than it is served (requests).

    Fluid approximation: for ``duration_s`` seconds requests arrive at ``arrival_rate``
    (requests/s) and leave at most at ``capacity`` (requests/s), so the queue grows by
    ``(arrival_rate - capacity) * duration_s``. A rate at or below capacity adds nothing
    (returns 0.0). Example: ``burst_backlog(180, 100, 60)`` is 4,800 requests.
    """
    lam = _check.nonnegative("arrival_rate", arrival_rate)
    mu = _check.positive("capacity", capacity)
    t = _check.nonnegative("duration_s", duration_s)
    return max(lam - mu, 0.0) * t


@_check.guarded
def drain_time(backlog: float, arrival_rate: float, capacity: float) -> float:
    """Seconds to empty ``backlog`` requests while new work keeps arriving (s).

    Only the spare capacity ``capacity - arrival_rate`` (requests/s) eats into the
    backlog, so the drain takes ``backlog / (capacity - arrival_rate)``. Example:
    ``drain_time(4800, 55, 100)`` is 106.7 s.

    Raises
    ------
    UnstableQueueError
        (a ``ValueError``) when ``arrival_rate >= capacity`` and the backlog is positive:
        there is no spare capacity, so the queue never drains.
    """
    q = _check.nonnegative("backlog", backlog)
    lam = _check.nonnegative("arrival_rate", arrival_rate)
    mu = _check.positive("capacity", capacity)
    if q == 0:
        return 0.0
    if lam >= mu:
        raise UnstableQueueError(
            f"backlog never drains: arrival_rate = {lam!r} requests/s >= capacity = {mu!r} "
            f"requests/s (utilization rho = {lam / mu:.4g} >= 1), so there is no spare "
            "capacity to work off the queue"
        )
    return q / (mu - lam)


def _profile(rates, durations_s):
    r = _check.array("rates", rates, nonnegative_values=True)
    d = _check.array("durations_s", durations_s, nonnegative_values=True)
    if r.shape != d.shape:
        raise ValueError(
            f"rates and durations_s must have the same length, got {r.size} and {d.size}"
        )
    if r.size == 0:
        raise ValueError("rates must hold at least one segment, got an empty array")
    return r, d


@_check.guarded
def balancing_rate(mean_rate: float, rates, durations_s, total_s: float) -> float:
    """Rate the rest of a period must have for the whole period to average ``mean_rate``.

    The known segments (``rates`` in requests/s, each lasting ``durations_s`` seconds)
    cover the start of a period of ``total_s`` seconds. Returns the constant rate
    (requests/s) of the remaining ``total_s - sum(durations_s)`` seconds such that
    the period's mean rate is ``mean_rate``.

    Raises ``ValueError`` if the known segments already last ``total_s`` or longer, or
    already hold more requests than the whole period may (the answer would be < 0).
    """
    target = _check.nonnegative("mean_rate", mean_rate)
    r, d = _profile(rates, durations_s)
    total = _check.positive("total_s", total_s)
    rest = total - float(d.sum())
    if rest <= 0:
        raise ValueError(
            f"total_s must exceed the known segments' {float(d.sum())!r} s, got {total!r}"
        )
    needed = target * total - float(r @ d)
    if needed < 0:
        raise ValueError(
            f"mean_rate = {target!r} requests/s is below what the known segments already "
            f"carry ({float(r @ d) / total!r} requests/s over total_s = {total!r} s)"
        )
    return needed / rest


@_check.guarded
def fluid_backlog(rates, durations_s, capacity: float, times_s,
                  initial_backlog: float = 0.0) -> np.ndarray:
    """Fluid queue length (requests) at ``times_s`` for a piecewise-constant arrival rate.

    Segment ``k`` lasts ``durations_s[k]`` seconds at ``rates[k]`` requests/s, starting
    at time 0; after the last segment the rate stays at ``rates[-1]``. The server works
    off at most ``capacity`` requests/s. With net input ``X(t) = A(t) - capacity * t``
    (``A`` the cumulative arrivals, plus ``initial_backlog``), the backlog is the
    reflected path ``Q(t) = X(t) - min(0, min_{s<=t} X(s))`` -- the continuous twin of
    the Lindley recursion's cumulative sum and running extremum. ``X`` is linear
    between breakpoints, so evaluating it at the breakpoints and the query times and
    taking a running minimum is exact.

    Returns an array of backlogs (requests), one per entry of ``times_s`` (s, >= 0).
    """
    r, d = _profile(rates, durations_s)
    mu = _check.positive("capacity", capacity)
    t = _check.array("times_s", times_s, nonnegative_values=True)
    q0 = _check.nonnegative("initial_backlog", initial_backlog)
    edges = np.concatenate([[0.0], np.cumsum(d)])
    grid = np.union1d(edges, t)
    seg = np.clip(np.searchsorted(edges, grid, side="right") - 1, 0, r.size - 1)
    arrived = np.concatenate([[0.0], np.cumsum(r * d)])[seg] + r[seg] * (grid - edges[seg])
    net = q0 + arrived - mu * grid
    backlog = net - np.minimum(np.minimum.accumulate(net), 0.0)
    return backlog[np.searchsorted(grid, t)]


@_check.guarded
def piecewise_poisson(rates, durations_s, rng) -> np.ndarray:
    """Sorted arrival times (s) of a Poisson process with a piecewise-constant rate.

    Segment ``k`` lasts ``durations_s[k]`` seconds at ``rates[k]`` requests/s, starting
    at time 0. Each segment gets a Poisson number of arrivals, placed uniformly at
    random inside it. ``rng`` is a ``numpy.random.Generator`` (or a seed for one).
    """
    r, d = _profile(rates, durations_s)
    rng = _check.generator("rng", rng)
    counts = rng.poisson(r * d)
    starts = np.concatenate([[0.0], np.cumsum(d)[:-1]])
    times = np.repeat(starts, counts) + rng.uniform(0.0, 1.0, counts.sum()) * np.repeat(d, counts)
    return np.sort(times)


# ---------------------------------------------------------------------------------------
# Burstiness of an arrival stream
# ---------------------------------------------------------------------------------------

def _arrivals(arrival_s, minimum: int = 1, name: str = "arrival_s") -> np.ndarray:
    with _check.naming(name):
        return _arrivals_of(arrival_s, minimum)


def _trace_tokens(trace, name: str) -> None:
    """A trace's token columns, when present, must be whole numbers >= 0."""
    if isinstance(trace, pd.DataFrame):
        _check.request_tokens(trace, name)


def _arrivals_of(arrival_s, minimum: int) -> np.ndarray:
    if isinstance(arrival_s, pd.DataFrame):
        if "arrival_s" not in arrival_s.columns:
            raise ValueError(
                f"arrival_s must be an array of times or a DataFrame with an 'arrival_s' "
                f"column, got columns {list(arrival_s.columns)}"
            )
        arrival_s = arrival_s["arrival_s"]
    a = _check.array("arrival_s", arrival_s)
    if a.size < minimum:
        raise ValueError(f"arrival_s must hold at least {minimum} arrivals, got {a.size}")
    return a


@_check.guarded
def window_counts(arrival_s, window_s: float, start: float = 0.0) -> np.ndarray:
    """Arrivals per window: counts in ``[start, start + w), [start + w, start + 2w), ...``.

    Only complete windows are counted: the last window ends at or before the last
    arrival, so a half-observed window at the end does not look like a lull.
    ``arrival_s`` is an array of times (s) or a trace DataFrame; ``window_s`` in s.
    Returns an integer array (requests per window).
    """
    a = _arrivals(arrival_s)
    w = _check.positive("window_s", window_s)
    t0 = _check.number("start", start)
    n_windows = _check.windows(float(a.max() - t0), w,
                               f"arrival_s up to {float(a.max())!r} s, from start = {t0!r} s in "
                               f"window_s = {w!r} s")
    if n_windows < 1:
        raise ValueError(
            f"window_s = {w!r} s is longer than the span of arrival_s after start "
            f"({a.max() - t0!r} s); need at least one complete window"
        )
    index = np.floor((a - t0) / w)
    keep = (index >= 0) & (index < n_windows)
    return np.bincount(index[keep].astype(np.int64), minlength=n_windows)


@_check.guarded
def index_of_dispersion(arrival_s, window_s: float, start: float = 0.0) -> float:
    """Variance over mean of the per-window arrival counts (dimensionless).

    A Poisson stream gives 1 at every window size; values well above 1 mean arrivals
    come in clumps at that time scale. Uses the unbiased (``ddof=1``) variance over the
    complete windows of :func:`window_counts`; needs at least two windows.
    """
    counts = window_counts(arrival_s, window_s, start)
    if counts.size < 2:
        raise ValueError(
            f"window_s = {float(window_s)!r} s leaves {counts.size} complete window; "
            "the index of dispersion needs at least 2"
        )
    mean = counts.mean()
    if mean == 0:
        raise ValueError(f"no arrivals fall in the windows of window_s = {float(window_s)!r} s")
    return float(counts.var(ddof=1) / mean)


@_check.guarded
def peak_to_mean(arrival_s, window_s: float, start: float = 0.0) -> float:
    """Busiest window's arrivals over the mean window's arrivals (dimensionless, >= 1)."""
    counts = window_counts(arrival_s, window_s, start)
    if counts.mean() == 0:
        raise ValueError(f"no arrivals fall in the windows of window_s = {float(window_s)!r} s")
    return float(counts.max() / counts.mean())


@_check.guarded
def window_utilization(arrival_s, window_s: float, capacity: float,
                       start: float = 0.0) -> np.ndarray:
    """Offered utilization in each window: arrivals / (capacity * window_s) (dimensionless).

    ``capacity`` is the requests/s the route can serve. A value above 1 means that
    window brought more work than the route could finish inside it.
    """
    mu = _check.positive("capacity", capacity)
    w = _check.positive("window_s", window_s)
    return window_counts(arrival_s, w, start) / (mu * w)


@_check.guarded
def mean_rate(arrival_s) -> float:
    """Mean arrival rate (requests/s): gaps between first and last arrival over that span.

    ``(n - 1) / (t_last - t_first)``: the ``n - 1`` inter-arrival gaps divided by the
    time they cover, so the answer does not depend on where the clock started.
    ``arrival_s`` is an array of times (s) or a trace DataFrame.
    """
    a = _arrivals(arrival_s, minimum=2)
    span = float(a.max() - a.min())
    if span <= 0:
        raise ValueError(f"arrival_s must span a positive time, got all arrivals at {a[0]!r} s")
    return (a.size - 1) / span


def rescale_to_rate(trace, target_rate: float):
    """A copy of ``trace`` whose mean rate is ``target_rate``, with the same burst shape.

    Every gap between consecutive arrivals is multiplied by the same factor
    ``mean_rate(trace) / target_rate`` (the first arrival keeps its time), so relative
    gaps, the order of requests and their token counts are unchanged. ``trace`` is a
    DataFrame with an ``arrival_s`` column (a DataFrame comes back) or an array of
    times (an array comes back). ``target_rate`` in requests/s.
    """
    target = _check.positive("target_rate", target_rate)
    _trace_tokens(trace, "trace")
    a = _arrivals(trace, minimum=2, name="trace")
    factor = _check.finite_result(mean_rate(a) / target,
                                  f"mean_rate(trace) / target_rate={target!r}")
    scaled = a[0] + (a - a[0]) * factor
    if isinstance(trace, pd.DataFrame):
        out = trace.copy()
        out["arrival_s"] = scaled
        return out
    return scaled


def poisson_like(trace, seed) -> pd.DataFrame | np.ndarray:
    """The same requests with Poisson timing at the same mean rate (a copy).

    Keeps the number of arrivals, the first arrival time, the order of requests (and
    so their token counts), and draws the ``n - 1`` gaps as independent exponentials
    with mean ``1 / mean_rate(trace)`` seconds. ``seed`` is an int or a
    ``numpy.random.Generator``. Returns the same kind of object it was given.
    """
    _trace_tokens(trace, "trace")
    a = _arrivals(trace, minimum=2, name="trace")
    rng = _check.generator("seed", seed)
    gaps = rng.exponential(1.0 / mean_rate(a), a.size - 1)
    times = a[0] + np.concatenate([[0.0], np.cumsum(gaps)])
    if isinstance(trace, pd.DataFrame):
        out = trace.copy()
        out["arrival_s"] = times
        return out
    return times


# ---------------------------------------------------------------------------------------
# Agent call amplification: user tasks are not model requests
# ---------------------------------------------------------------------------------------

@_check.guarded
def agent_request_rate(task_rate: float, calls_per_task: float,
                       retry_multiplier: float = 1.0) -> float:
    """Inference requests per second that a stream of user tasks offers the route (requests/s).

    ``task_rate * calls_per_task * retry_multiplier``: each user task (``task_rate`` in
    tasks/s) makes ``calls_per_task`` inference calls on average (calls/task, > 0), and
    retries and fallbacks multiply the calls by ``retry_multiplier`` (requests/call, >= 1).
    Example: ``agent_request_rate(2, 6, 1.15)`` is 13.8 requests/s.
    """
    lam = _check.nonnegative("task_rate", task_rate)
    calls = _check.positive("calls_per_task", calls_per_task)
    mult = _check.number("retry_multiplier", retry_multiplier)
    if mult < 1:
        raise ValueError(
            f"retry_multiplier must be >= 1 (requests per call), got {retry_multiplier!r}"
        )
    return lam * calls * mult


@_check.guarded
def retry_multiplier(failure_prob: float, max_retries: int | None = None) -> float:
    """Mean requests per call when a failed request is retried (requests/call, >= 1).

    Each request fails independently with ``failure_prob`` (0 <= p < 1) and a failed
    request is re-sent, at most ``max_retries`` times (``None``: until it succeeds). The
    number of requests is then truncated-geometric with mean
    ``(1 - p**(r + 1)) / (1 - p)``, or ``1 / (1 - p)`` without a budget.
    Example: ``retry_multiplier(0.1, 2)`` is 1.11.
    """
    p = _check.number("failure_prob", failure_prob)
    if not 0 <= p < 1:
        raise ValueError(f"failure_prob must be in [0, 1), got {failure_prob!r}")
    if max_retries is None:
        return 1.0 / (1.0 - p)
    r = _check.whole("max_retries", max_retries, minimum=0)
    return (1.0 - p ** (r + 1)) / (1.0 - p)


BOOTSTRAP_SEGMENT_S = 60.0
"""Mean segment of :func:`block_bootstrap`, in seconds of the trace (not of the
simulation): long enough to keep a burst whole. The book's traces keep getting burstier
as the window grows to a minute (index of dispersion of azure_conv 1.4 in 1 s windows,
16 in 60 s ones; azure_code 13 and 167), so a minute of consecutive requests holds the
bursts that build queues; a minute is about 330 azure_conv requests (5.5 req/s), 150
azure_code and 200 Mooncake ones, and a replication of a plan holds several segments."""

_MAX_SEGMENT_ROWS = 1e12    # longer mean segments are one segment of any sample anyway
_SEGMENTS_PER_DRAW = 64     # segments drawn per batch (fixed, so a longer sample extends
                            # a shorter one: the first rows do not depend on ``n``)


def _bootstrap_rows(rows: int, n: int, mean_length: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trace positions, segment-start flags, junction gap picks) of ``n`` resampled rows.

    Segments start at a uniform position, have a geometric length of mean
    ``mean_length`` rows and wrap around the end of the trace (Politis & Romano's
    circular version). Every segment's draws come in fixed batches, so the first ``m``
    rows are the same for every ``n >= m``."""
    p = 1.0 / min(max(1.0, mean_length), _MAX_SEGMENT_ROWS)
    positions, starts, picks = [], [], []
    total = 0
    while total < n:
        first = rng.integers(0, rows, _SEGMENTS_PER_DRAW)
        length = rng.geometric(p, _SEGMENTS_PER_DRAW)
        pick = rng.integers(0, rows - 1, _SEGMENTS_PER_DRAW)
        for a, m, g in zip(first.tolist(), length.tolist(), pick.tolist(), strict=True):
            m = min(m, n - total)
            positions.append((a + np.arange(m)) % rows)
            flag = np.zeros(m, dtype=bool)
            flag[0] = True
            starts.append(flag)
            picks.append(np.full(m, g))
            total += m
            if total >= n:
                break
    return np.concatenate(positions), np.concatenate(starts), np.concatenate(picks)


def block_bootstrap(trace: pd.DataFrame, n: int, seed,
                    segment_s: float = BOOTSTRAP_SEGMENT_S) -> pd.DataFrame:
    """``n`` requests resampled from ``trace`` in contiguous segments (stationary bootstrap).

    The stationary bootstrap of Politis & Romano (1994, "The stationary bootstrap",
    JASA 89:1303-1313), applied to the trace's rows with their inter-arrival gaps:
    segments of consecutive rows start at uniformly drawn rows, have geometric lengths
    with a mean of ``segment_s`` seconds of the trace (``segment_s x mean_rate(trace)``
    rows, at least 1; default :data:`BOOTSTRAP_SEGMENT_S`, 60 s) and wrap around the end
    of the trace; they are laid end to end until there are ``n`` rows. Inside a segment
    every row keeps the gap before it in the trace, so bursts shorter than a segment
    keep their shape; the gap before a segment (and at the wrap from the last row to the
    first) is one of the trace's gaps drawn at random. Token counts and every other
    column come from the rows drawn, so the length mix is the trace's.

    Why this one: the resampled stream is stationary (random segment lengths put the
    junctions at no fixed request index, so a replication's warm-up cut and attainment
    do not depend on where they fall), whereas Kuensch's (1989) moving blocks of fixed
    length join at the same positions in every sample; and it works for any ``n``: a
    trace shorter than ``n`` rows is simply drawn from again (segments repeat), so the
    number of independent samples is not limited by the trace's length.

    Rows drawn twice: a ``hash_ids`` column (prompt block ids, :func:`load_trace`'s
    Mooncake field) is relabelled on the second and later copies of a trace row in one
    sample (block ``b`` becomes ``"b~k"`` on copy ``k``), so a repeated request is a new
    conversation of the same shape rather than a prefix-cache hit on its own copy;
    first copies keep the trace's ids (and their sharing).

    ``trace``: a DataFrame with ``arrival_s`` (s) and at least two rows spread over
    time; ``n``: rows wanted (>= 1); ``seed``: an int, a ``SeedSequence`` or a numpy
    ``Generator`` (the same seed gives the same sample, and a larger ``n`` extends a
    smaller one). Returns a new DataFrame with the trace's columns, a fresh index and
    ``arrival_s`` starting at 0 on the trace's own time scale (use
    :func:`rescale_to_rate` for another rate).
    """
    if not isinstance(trace, pd.DataFrame):
        raise ValueError(f"trace must be a DataFrame with an 'arrival_s' column, "
                         f"got {type(trace).__name__}")
    _trace_tokens(trace, "trace")
    a = _arrivals(trace, minimum=2, name="trace")
    count = _check.size("n", n)
    length_s = _check.positive("segment_s", segment_s)
    rng = _check.generator("seed", seed)
    gaps = np.diff(a)
    if not (gaps >= 0).all():
        raise ValueError("trace must be sorted by arrival_s (gaps >= 0), got a negative gap")
    rate = mean_rate(a)
    positions, starts, picks = _bootstrap_rows(a.size, count, length_s * rate, rng)
    own = np.concatenate([[0.0], gaps])[positions]       # the gap before each row
    junction = starts | (positions == 0)
    step = np.where(junction, gaps[picks], own)
    step[0] = 0.0
    out = trace.iloc[positions].reset_index(drop=True)
    out["arrival_s"] = np.cumsum(step)
    if "hash_ids" in out.columns:
        copy = pd.Series(positions).groupby(positions).cumcount().to_numpy()
        if (copy > 0).any():
            ids = out["hash_ids"].tolist()
            for k in np.flatnonzero(copy).tolist():
                ids[k] = [f"{b}~{copy[k]}" for b in ids[k]]
            out["hash_ids"] = ids
    return out


def bootstrap_windows(trace: pd.DataFrame, replications: int, seed, *, n: int | None = None,
                      segment_s: float = BOOTSTRAP_SEGMENT_S) -> list[pd.DataFrame]:
    """Independent block-bootstrap windows of a trace, one per replication.

    Window ``i`` is :func:`block_bootstrap` of ``trace`` (``n`` rows, segments of a mean
    ``segment_s`` seconds of the trace) drawn from the ``i``-th seed of
    :func:`servingcap.stats.replication_seeds` ``(seed, replications)``: another stretch
    of traffic like the trace's, bursts and length mix kept, for replications of a
    replay (:func:`servingcap.stats.replicate` runs designs on them and deletes each
    warm-up). The first ``k`` windows are the same whatever ``replications`` is.

    ``trace``: a request table with ``arrival_s`` (s), sorted, at least two rows;
    ``replications``: windows wanted (>= 1); ``seed``: an int >= 0; ``n``: requests
    per window (default ``len(trace)``); ``segment_s``: mean segment in seconds of the
    trace's own time scale (> 0; a trace replayed ``k`` times faster than recorded
    keeps minute-long bursts with ``BOOTSTRAP_SEGMENT_S / k``). Returns the windows,
    each starting at 0 s on the trace's time scale.
    """
    if not isinstance(trace, pd.DataFrame):
        raise ValueError(f"trace must be a DataFrame with an 'arrival_s' column, "
                         f"got {type(trace).__name__}")
    count = len(trace) if n is None else _check.size("n", n)
    seeds = replication_seeds(seed, replications)
    return [block_bootstrap(trace, count, ss, segment_s) for ss in seeds]
