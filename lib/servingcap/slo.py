"""Service-level arithmetic on per-request records: goodput, honest percentiles, capacity.

Every function takes the same per-request table, one row per request that *arrived*
(the output shape of the book's serving simulator):

============  =====  ==========================================================
column        unit   meaning
============  =====  ==========================================================
``arrival_s``  s     arrival time
``ttft_s``     s     time to first token (NaN allowed when the request never ran)
``tpot_s``     s     mean time per output token after the first
``e2e_s``      s     arrival to last token
``outcome``    --    ``"done"``, ``"rejected"``, ``"timed_out"`` or ``"unfinished"``
============  =====  ==========================================================

Only the columns a function needs must be present; extra columns (for example a
boolean ``verified`` column saying the outcome was accepted) are used when named.

Two rules make the numbers honest:

* A rejected, timed-out or unfinished (still in the system when the record was cut)
  request is not dropped. In latency percentiles it counts as
  an infinitely late request, so a p99 over offered work is ``inf`` whenever more than
  1 % of the work failed.
* Goodput counts only ``done`` requests meeting every named constraint, per second of
  the observation window the caller states.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _check

__all__ = [
    "OUTCOMES", "latencies", "latency_quantile", "meets_slo", "slo_attainment",
    "offered_rate", "throughput", "goodput", "OperationsPage", "operations_page",
    "max_rate", "capped_fcfs",
]

OUTCOMES = ("done", "rejected", "timed_out", "unfinished")
"""The outcome labels a request record may carry (``servingcap.serving`` uses the same)."""


def _requests(requests, columns=()) -> pd.DataFrame:
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a pandas DataFrame, got {type(requests).__name__}")
    missing = [c for c in ("outcome", *columns) if c not in requests.columns]
    if missing:
        raise ValueError(
            f"requests is missing column(s) {missing}; it has {list(requests.columns)}"
        )
    bad = ~requests["outcome"].isin(OUTCOMES)
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise ValueError(
            f"requests outcome must be one of {OUTCOMES}, "
            f"got {requests['outcome'].iloc[i]!r} at row {i}"
        )
    return requests


def _done(requests: pd.DataFrame) -> np.ndarray:
    return (requests["outcome"] == "done").to_numpy()


PER_TOKEN = ("tpot_s", "max_gap_s")
"""Columns undefined for a one-token answer (no gap between tokens): NaN there is allowed."""


def _latency_values(frame: pd.DataFrame, column: str):
    """Per-request latency (inf when not done) and whether it is defined."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    done = _done(frame)
    undefined = done & np.isnan(values) if column in PER_TOKEN else np.zeros_like(done)
    bad = done & ~undefined & ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"{column} must be a finite number >= 0 for done requests, got {values[i]!r} at row {i}"
        )
    return np.where(done, values, np.inf), ~undefined


def latencies(requests, column: str = "ttft_s") -> np.ndarray:
    """One latency (s) per request, with ``inf`` for every request that is not ``done``.

    For the per-token columns (``tpot_s``, ``max_gap_s``) a done request with a one-token
    answer has no value (NaN) and is left out. Raises ``ValueError`` if a ``done`` request
    has any other missing, negative or infinite value.
    """
    frame = _requests(requests, (_check.label("column", column),))
    values, defined = _latency_values(frame, column)
    return values[defined]


def latency_quantile(requests, p: float, column: str = "ttft_s") -> float:
    """The p-quantile (s) of a latency over *all* requests, failures counted as ``inf``.

    Uses the empirical (inverted-CDF) quantile: the smallest observed value ``x`` with
    at least a fraction ``p`` of requests at or below ``x``. Returns ``inf`` when more
    than ``1 - p`` of the requests were rejected or timed out.
    """
    p = _check.probability("p", p)
    x = latencies(requests, column)
    if x.size == 0:
        raise ValueError("requests must not be empty")
    return float(np.quantile(x, p, method="inverted_cdf"))


def meets_slo(requests, **limits) -> np.ndarray:
    """Boolean per request: ``done`` and every named column <= its limit.

    ``meets_slo(frame, ttft_s=1.0, tpot_s=0.05)`` is True for a finished request with
    TTFT <= 1 s and TPOT <= 50 ms. A boolean column (such as ``verified``) may be named
    with the limit ``True`` to require it. With no limits, only completion is required.
    """
    frame = _requests(requests, tuple(limits))
    ok = _done(frame).copy()
    for column, limit in limits.items():
        if limit is True:
            ok &= frame[column].fillna(False).astype(bool).to_numpy()
            continue
        limit = _check.positive(column, limit)
        values, defined = _latency_values(frame, column)
        ok &= (values <= limit) | ~defined      # a one-token answer meets any TPOT limit
    return ok


def slo_attainment(requests, **limits) -> float:
    """Fraction of all requests (including rejected and timed out) that meet the limits."""
    ok = meets_slo(requests, **limits)
    if ok.size == 0:
        raise ValueError("requests must not be empty")
    return float(ok.mean())


@_check.guarded
def offered_rate(requests, duration_s: float) -> float:
    """Offered load (requests/s): every request that tried to enter, per second of window."""
    frame = _requests(requests)
    return len(frame) / _check.positive("duration_s", duration_s)


@_check.guarded
def throughput(requests, duration_s: float) -> float:
    """Throughput (requests/s): completed requests per second, whatever their latency."""
    frame = _requests(requests)
    return float(_done(frame).sum()) / _check.positive("duration_s", duration_s)


@_check.guarded
def goodput(requests, duration_s: float, **limits) -> float:
    """Goodput (requests/s): completed requests meeting every named limit, per second.

    ``goodput(frame, 60.0, ttft_s=1.0, tpot_s=0.05)`` is SLO goodput over a 60 s window;
    add ``verified=True`` for verified-outcome goodput.
    """
    window = _check.positive("duration_s", duration_s)
    return float(meets_slo(requests, **limits).sum()) / window


@dataclass(frozen=True)
class OperationsPage:
    """The three rates that belong on one operations page (all requests/s)."""

    offered: float
    """Work trying to enter, including rejected and timed-out requests."""
    slo_goodput: float
    """Completed inside every declared latency limit."""
    verified_goodput: float
    """Completed inside the limits *and* accepted by outcome verification."""

    @property
    def serving_pressure(self) -> float:
        """offered - SLO goodput (requests/s): work the serving system failed to deliver in time."""
        return self.offered - self.slo_goodput

    @property
    def workflow_pressure(self) -> float:
        """SLO goodput - verified goodput (requests/s): timely work that was not accepted."""
        return self.slo_goodput - self.verified_goodput

    def __str__(self) -> str:
        return (
            f"offered load          = {self.offered:8.3f} req/s\n"
            f"SLO goodput           = {self.slo_goodput:8.3f} req/s\n"
            f"verified goodput      = {self.verified_goodput:8.3f} req/s\n"
            f"serving pressure      = {self.serving_pressure:8.3f} req/s  (offered - SLO goodput)\n"
            f"workflow pressure     = {self.workflow_pressure:8.3f} req/s  (SLO goodput - verified)"
        )


def operations_page(requests, duration_s: float, verified: str = "verified",
                    **limits) -> OperationsPage:
    """Offered load, SLO goodput and verified-outcome goodput of one window (requests/s).

    Parameters
    ----------
    requests : DataFrame
        One row per arriving request (see the module docstring).
    duration_s : float
        Length of the observation window (s), > 0.
    verified : str
        Name of the boolean column saying the outcome was accepted.
    **limits
        The declared latency limits, e.g. ``ttft_s=1.0, tpot_s=0.05`` (s).
    """
    if not limits:
        raise ValueError("limits must name at least one latency constraint, e.g. ttft_s=1.0")
    verified = _check.label("verified", verified)
    if verified in limits:
        raise ValueError(f"verified column {verified!r} must not also be a latency limit")
    return OperationsPage(
        offered=offered_rate(requests, duration_s),
        slo_goodput=goodput(requests, duration_s, **limits),
        verified_goodput=goodput(requests, duration_s, **limits, **{verified: True}),
    )


def max_rate(latency_at: Callable[[float], float], target_s: float, upper: float,
             rtol: float = 1e-9) -> float:
    """The capacity question: the largest arrival rate whose latency meets ``target_s``.

    Bisection on ``(0, upper)`` for the boundary of ``{rate : latency_at(rate) <= target_s}``,
    assuming ``latency_at`` is non-decreasing in the rate (true of queueing delay).

    Parameters
    ----------
    latency_at : callable
        ``rate (requests/s) -> latency (s)``, e.g. the p99 TTFT of a queue at that rate.
        It may raise :class:`~servingcap.UnstableQueueError` (or return ``inf``/NaN) where
        the queue is unstable; that counts as a miss.
    target_s : float
        The latency objective (s), > 0.
    upper : float
        A rate (requests/s) at or above which the target is surely missed, e.g. the
        saturation rate ``servers * service_rate``.
    rtol : float
        Relative tolerance on the returned rate.

    Returns
    -------
    float
        The rate (requests/s); ``0.0`` if even a vanishing load misses the target.
    """
    if not callable(latency_at):
        raise ValueError(f"latency_at must be a function of the rate, got {latency_at!r}")
    target = _check.positive("target_s", target_s)
    hi = _check.positive("upper", upper)
    tol = _check.positive("rtol", rtol)
    if tol < 1e-15:
        raise ValueError(f"rtol must be >= 1e-15 (floating point resolves no finer), got {rtol!r}")

    def ok(rate: float) -> bool:
        try:
            value = float(latency_at(rate))
        except ValueError:  # includes UnstableQueueError
            return False
        return math.isfinite(value) and value <= target

    if ok(hi):
        raise ValueError(
            f"upper must be a rate that misses the target, but latency_at({hi!r}) <= "
            f"target_s={target!r}"
        )
    if not ok(hi * 1e-9):
        return 0.0
    lo = hi * 1e-9
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def capped_fcfs(arrival_times, service_times, servers: int = 1,
                queue_cap: int | None = None):
    """FCFS queue with ``servers`` servers whose waiting room holds at most ``queue_cap``.

    A request that arrives while ``queue_cap`` requests are already waiting (not yet in
    service) is rejected on the spot and uses no server: the queue-depth cap of an
    admission controller (a 429). ``queue_cap=None`` never rejects and matches
    :func:`servingcap.sim.fcfs_waits`; ``queue_cap=0`` is a loss system (Erlang B).

    Parameters
    ----------
    arrival_times : array of float
        Arrival instants (s), non-decreasing.
    service_times : array of float
        Service durations (s), >= 0, same length.
    servers : int
        Number of servers sharing the queue, >= 1.
    queue_cap : int or None
        Maximum number waiting, >= 0.

    Returns
    -------
    (waits, admitted) : (numpy.ndarray, numpy.ndarray)
        Waiting time before service (s; NaN for rejected requests) and a boolean
        admitted flag, one per request in the order given.
    """
    a, s = _check.arrivals_and_services(arrival_times, service_times)
    # More servers than requests never changes the answer (nobody waits): cap the heap.
    c = min(_check.whole("servers", servers), max(a.size, 1))
    cap = None if queue_cap is None else _check.whole("queue_cap", queue_cap, minimum=0)
    waits = np.full(a.size, np.nan)
    admitted = np.zeros(a.size, dtype=bool)
    free_at = [0.0] * c            # heap of server free times
    waiting_starts: list[float] = []  # FIFO of start times of admitted requests not yet started
    head = 0
    for i, (arrive, serve) in enumerate(zip(a.tolist(), s.tolist(), strict=True)):
        # FCFS start times are non-decreasing, so the waiting requests are a suffix.
        while head < len(waiting_starts) and waiting_starts[head] <= arrive:
            head += 1
        earliest = free_at[0]
        if cap is not None and earliest > arrive and len(waiting_starts) - head >= cap:
            continue
        start = arrive if arrive > earliest else earliest
        waits[i] = start - arrive
        admitted[i] = True
        heapq.heapreplace(free_at, start + serve)
        if start > arrive:
            waiting_starts.append(start)
    return waits, admitted
