"""Fast queue simulators: first-come-first-served waiting times from arrival and service times.

One server uses the Lindley recursion in closed form (cumulative sums and a running
maximum, no Python loop). Many servers use a heap of server free-times. Both take
arrays in seconds and return per-request waiting times in seconds, one per request,
in the order given.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from . import _check

__all__ = [
    "fcfs_waits", "poisson_arrivals", "mmc_sample", "time_average_in_system",
    "LittleMeasurement", "measure_little", "running_little",
]


def fcfs_waits(arrival_times, service_times, servers: int = 1) -> np.ndarray:
    """Waiting time of each request in a FCFS queue with ``servers`` identical servers.

    Parameters
    ----------
    arrival_times : array of float
        Arrival instants (s), non-decreasing.
    service_times : array of float
        Service durations (s), >= 0, same length.
    servers : int
        Number of servers sharing one queue, >= 1. A request starts on the server that
        frees up first (the pooled queue of M/M/c). With at least as many servers as
        requests nobody waits, so any count past ``len(arrival_times)`` gives the same
        (exact) answer without allocating a server each.

    Returns
    -------
    numpy.ndarray
        Time each request waits before its service starts (s), >= 0.
        Response time is ``waits + service_times``.

    Raises
    ------
    ValueError
        For NaN, infinite or negative inputs, unsorted arrivals, mismatched lengths or
        ``servers < 1``; :class:`~servingcap._check.NumericOverflowError` (a
        ``ValueError``) when arrival times plus the total service time exceed the
        floating-point range (about 1.8e308 s), where the waits would be ``inf``.
    """
    a, s = _check.arrivals_and_services(arrival_times, service_times)
    c = _check.whole("servers", servers)
    if a.size == 0:
        return np.zeros(0)
    if c == 1:
        return _one_server(a, s)
    if c >= a.size:
        return np.zeros_like(a)
    return _many_servers(a, s, c)


def _one_server(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    # Departure D_n = max(D_{n-1}, a_n) + s_n unrolls to
    #   D_n = C_n + max_{j<=n} (a_j - C_{j-1}),  C_n = s_1 + ... + s_n,
    # so the start time D_n - s_n is a cumulative sum plus a running maximum.
    # The wait D_n - s_n - a_n is therefore (running max of x) - x with x_j = a_j - C_{j-1}:
    # exactly zero whenever the request finds the server idle (x_n is the running max).
    # In-place arithmetic: two n-long temporaries instead of five (memory traffic and
    # page faults dominate at millions of requests).
    x = np.cumsum(s)
    x -= s
    np.subtract(a, x, out=x)
    waits = np.maximum.accumulate(x)
    waits -= x
    return waits


def _many_servers(a: np.ndarray, s: np.ndarray, c: int) -> np.ndarray:
    waits = np.empty_like(a)
    free_at = [-np.inf] * c                              # heap of server free times
    replace = heapq.heapreplace
    for i, (arrive, serve) in enumerate(zip(a.tolist(), s.tolist(), strict=True)):
        earliest = free_at[0]
        start = arrive if arrive > earliest else earliest
        waits[i] = start - arrive
        replace(free_at, start + serve)
    return waits


@_check.guarded
def poisson_arrivals(arrival_rate: float, n: int, rng) -> np.ndarray:
    """``n`` arrival instants (s) of a Poisson process with ``arrival_rate`` (requests/s).

    ``rng`` is a ``numpy.random.Generator`` (or a seed for one).
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    n = _check.size("n", n, minimum=0)
    rng = _check.generator("rng", rng)
    gaps = rng.exponential(1.0 / lam, n)
    return np.cumsum(gaps, out=gaps)


def poisson_arrivals_until(arrival_rate: float, horizon_s: float, rng) -> np.ndarray:
    """Arrival instants (s) of a Poisson process with ``arrival_rate`` (requests/s) on
    ``[0, horizon_s)``. Draws gaps in blocks sized to the expected count (plus ten
    standard deviations), so one block almost always suffices."""
    lam = _check.positive("arrival_rate", arrival_rate)
    horizon = _check.positive("horizon_s", horizon_s)
    rng = _check.generator("rng", rng)
    expected = lam * horizon
    if not expected <= _check.MAX_SAMPLES:
        raise ValueError(f"arrival_rate * horizon_s = {expected:.3g} expected arrivals is more "
                         f"than {_check.MAX_SAMPLES:.0e} (arrival_rate={lam!r}, "
                         f"horizon_s={horizon!r})")
    block = int(expected + 10 * math.sqrt(expected) + 10)
    arrivals = np.cumsum(rng.exponential(1.0 / lam, block))
    while arrivals[-1] < horizon:
        more = arrivals[-1] + np.cumsum(rng.exponential(1.0 / lam, block))
        arrivals = np.concatenate([arrivals, more])
    return arrivals[arrivals < horizon]


@_check.guarded
def mmc_sample(arrival_rate: float, service_rate: float, n: int, rng, servers: int = 1):
    """Simulate ``n`` requests through an M/M/c queue.

    Returns ``(arrival_times, service_times, waits)``, each an array of seconds.
    Does not require stability: an overloaded run simply shows growing waits.
    """
    mu = _check.positive("service_rate", service_rate)
    rng = _check.generator("rng", rng)
    arrivals = poisson_arrivals(arrival_rate, n, rng)
    service = rng.exponential(_check.finite_result(1.0 / mu, f"1 / service_rate={mu!r}"),
                              arrivals.size)
    return arrivals, service, fcfs_waits(arrivals, service, servers)


def time_average_in_system(entry_times, exit_times, start: float | None = None,
                           end: float | None = None) -> float:
    """Time-average number of items inside a boundary over [start, end] (items).

    The integral of N(t), the count of items with entry <= t < exit, divided by the
    window length. This is the L that Little's law is about, measured directly.
    Defaults: the window runs from the first entry to the last entry, so that
    items still inside at the end are not cut off arbitrarily.
    """
    entry = _check.array("entry_times", entry_times)
    exit_ = _check.array("exit_times", exit_times)
    if entry.shape != exit_.shape:
        raise ValueError(
            f"entry_times and exit_times must have the same length, got {entry.size} and {exit_.size}"
        )
    if entry.size == 0:
        raise ValueError("entry_times must not be empty")
    if (exit_ < entry).any():
        i = int(np.argmax(exit_ < entry))
        raise ValueError(f"exit_times must be >= entry_times, got {exit_[i]!r} < {entry[i]!r} at index {i}")
    lo = float(entry.min()) if start is None else _check.number("start", start)
    hi = float(entry.max()) if end is None else _check.number("end", end)
    if hi <= lo:
        raise ValueError(f"end must be after start, got start={lo!r}, end={hi!r}")
    inside = np.clip(exit_, lo, hi) - np.clip(entry, lo, hi)
    return float(inside.sum() / (hi - lo))


# --------------------------------------------------------------------------- Little on a sample path


def _items(entry_times, exit_times, weights):
    entry = _check.array("entry_times", entry_times)
    exit_ = _check.array("exit_times", exit_times)
    if entry.shape != exit_.shape:
        raise ValueError("entry_times and exit_times must have the same length, "
                         f"got {entry.size} and {exit_.size}")
    if entry.size == 0:
        raise ValueError("entry_times must not be empty")
    if (exit_ < entry).any():
        i = int(np.argmax(exit_ < entry))
        raise ValueError(f"exit_times must be >= entry_times, "
                         f"got {exit_[i]!r} < {entry[i]!r} at index {i}")
    if weights is None:
        w = np.ones_like(entry)
    else:
        w = _check.array("weights", weights, nonnegative_values=True)
        if w.shape != entry.shape:
            raise ValueError(
                f"weights must have the same length as entry_times, got {w.size} and {entry.size}"
            )
    return entry, exit_, w


@dataclass(frozen=True)
class LittleMeasurement:
    """The three Little's-law quantities measured independently at one boundary.

    ``L`` comes from the sample path (the time-average count), ``arrival_rate`` and
    ``time_in_system`` from the items that completed inside the window, so
    ``implied_L = arrival_rate * time_in_system`` is an independent estimate of ``L``.
    """

    L: float
    """Time-average number of items inside the boundary over the window (items)."""
    arrival_rate: float
    """Completions per second inside the window (items/s), the effective rate."""
    time_in_system: float
    """Mean time inside the boundary of the items that completed in the window (s)."""
    completed: float
    """Number (total weight) of items that completed in the window (items)."""
    window_s: float
    """Length of the measurement window (s)."""

    @property
    def implied_L(self) -> float:
        """lambda * W (items)."""
        return self.arrival_rate * self.time_in_system

    @property
    def rel_error(self) -> float:
        """(lambda * W - L) / L: how far the identity is from exact on this finite window."""
        return (self.implied_L - self.L) / self.L if self.L > 0 else 0.0


def measure_little(entry_times, exit_times, start: float, end: float,
                   weights=None) -> LittleMeasurement:
    """Measure L, lambda and W at one boundary over the window [start, end] (s).

    Parameters
    ----------
    entry_times, exit_times : array of float
        When each item crossed into and out of the boundary (s); exit >= entry.
    start, end : float
        The measurement window (s), end > start. Use ``start`` after a warm-up so the
        empty-system start does not bias the averages.
    weights : array of float, optional
        Items per row (>= 0), e.g. a sequence's prompt blocks that share one entry
        and one exit time. Default: one item per row.

    Returns
    -------
    LittleMeasurement
        ``L`` is the integral of the count inside the boundary over the window divided
        by its length (what a gauge averaged over the window shows). ``arrival_rate``
        counts the items whose exit falls in (start, end]; ``time_in_system`` is their
        mean full time inside (including any part before ``start``). The two sides
        differ only by the items straddling the window's edges, so the relative error
        shrinks like (mean time inside) / (window length).
    """
    entry, exit_, w = _items(entry_times, exit_times, weights)
    lo = _check.number("start", start)
    hi = _check.number("end", end)
    if hi <= lo:
        raise ValueError(f"end must be after start, got start={lo!r}, end={hi!r}")
    span = hi - lo
    inside = np.clip(exit_, lo, hi) - np.clip(entry, lo, hi)
    L = float((w * inside).sum() / span)
    done = (exit_ > lo) & (exit_ <= hi)
    n = float(w[done].sum())
    mean_time = float((w[done] * (exit_[done] - entry[done])).sum() / n) if n > 0 else 0.0
    return LittleMeasurement(L=L, arrival_rate=n / span, time_in_system=mean_time,
                             completed=n, window_s=span)


def running_little(entry_times, exit_times, times, start: float = 0.0, weights=None):
    """Running estimates of L and lambda * W over the growing window [start, t], for each t.

    Parameters
    ----------
    entry_times, exit_times : array of float
        When each item crossed into and out of the boundary (s).
    times : array of float
        Checkpoints t (s), each > ``start``.
    start : float
        Beginning of every window (s).
    weights : array of float, optional
        Items per row (>= 0); default one.

    Returns
    -------
    pandas.DataFrame
        Columns ``t_s`` (s), ``L`` (time-average count over [start, t], items),
        ``arrival_rate`` (completions in (start, t] per second, items/s),
        ``time_in_system`` (mean time inside of those completions, s) and
        ``implied_L`` (their product, items). Computed from one sort of the entry and
        exit events, so millions of items take about a second.
    """
    import pandas as pd

    entry, exit_, w = _items(entry_times, exit_times, weights)
    lo = _check.number("start", start)
    t = _check.array("times", times)
    if t.size == 0:
        raise ValueError("times must not be empty")
    if (t <= lo).any():
        i = int(np.argmax(t <= lo))
        raise ValueError(f"times must all be > start={lo!r}, got {t[i]!r} at index {i}")
    # Area under N(s) on [start, t]: N is a step function with +w at each (clipped)
    # entry and -w at each (clipped) exit, so its integral is piecewise linear.
    a = np.maximum(entry, lo)
    b = np.maximum(exit_, lo)
    when = np.concatenate([a, b])
    jump = np.concatenate([w, -w])
    order = np.argsort(when, kind="stable")
    when, jump = when[order], jump[order]
    level = np.cumsum(jump)                                 # N just after each event
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(when))])
    k = np.searchsorted(when, t, side="right") - 1          # last event at or before t
    before = k < 0
    k = np.clip(k, 0, None)
    area_t = np.where(before, 0.0, area[k] + level[k] * (t - when[k]))
    span = t - lo
    # Completions in (start, t]: sort exits once, accumulate weight and weighted sojourn.
    done = exit_ > lo
    ex, ww, soj = exit_[done], w[done], (exit_ - entry)[done]
    order = np.argsort(ex, kind="stable")
    ex, cw, cs = ex[order], np.cumsum(ww[order]), np.cumsum((ww * soj)[order])
    j = np.searchsorted(ex, t, side="right") - 1
    n = np.where(j >= 0, cw[np.clip(j, 0, None)], 0.0) if ex.size else np.zeros_like(t)
    total = np.where(j >= 0, cs[np.clip(j, 0, None)], 0.0) if ex.size else np.zeros_like(t)
    mean_time = np.divide(total, n, out=np.zeros_like(t), where=n > 0)
    return pd.DataFrame({"t_s": t, "L": area_t / span, "arrival_rate": n / span,
                         "time_in_system": mean_time, "implied_L": total / span})
