"""Fast queue simulators: first-come-first-served waiting times from arrival and service times.

One server uses the Lindley recursion in closed form (cumulative sums and a running
maximum, no Python loop). Many servers use a heap of server free-times. Both take
arrays in seconds and return per-request waiting times in seconds, one per request,
in the order given.
"""

from __future__ import annotations

import heapq

import numpy as np

from . import _check

__all__ = ["fcfs_waits", "poisson_arrivals", "mmc_sample", "time_average_in_system"]


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
        frees up first (the pooled queue of M/M/c).

    Returns
    -------
    numpy.ndarray
        Time each request waits before its service starts (s), >= 0.
        Response time is ``waits + service_times``.
    """
    a = _check.array("arrival_times", arrival_times)
    s = _check.array("service_times", service_times, nonnegative_values=True)
    c = _check.whole("servers", servers)
    if a.shape != s.shape:
        raise ValueError(
            f"arrival_times and service_times must have the same length, got {a.size} and {s.size}"
        )
    if a.size and (np.diff(a) < 0).any():
        i = int(np.argmax(np.diff(a) < 0)) + 1
        raise ValueError(
            f"arrival_times must be non-decreasing, got {a[i]!r} after {a[i - 1]!r} at index {i}"
        )
    if a.size == 0:
        return np.zeros(0)
    if c == 1:
        return _one_server(a, s)
    return _many_servers(a, s, c)


def _one_server(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    # Departure D_n = max(D_{n-1}, a_n) + s_n unrolls to
    #   D_n = C_n + max_{j<=n} (a_j - C_{j-1}),  C_n = s_1 + ... + s_n,
    # so the start time D_n - s_n is a cumulative sum plus a running maximum.
    done_before = np.cumsum(s) - s                       # C_{n-1}
    start = done_before + np.maximum.accumulate(a - done_before)
    return np.maximum(start - a, 0.0)                    # clip round-off below zero


def _many_servers(a: np.ndarray, s: np.ndarray, c: int) -> np.ndarray:
    waits = np.empty_like(a)
    free_at = [0.0] * c                                  # heap of server free times
    replace = heapq.heapreplace
    for i, (arrive, serve) in enumerate(zip(a.tolist(), s.tolist())):
        earliest = free_at[0]
        start = arrive if arrive > earliest else earliest
        waits[i] = start - arrive
        replace(free_at, start + serve)
    return waits


def poisson_arrivals(arrival_rate: float, n: int, rng) -> np.ndarray:
    """``n`` arrival instants (s) of a Poisson process with ``arrival_rate`` (requests/s).

    ``rng`` is a ``numpy.random.Generator`` (or a seed for one).
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    n = _check.whole("n", n, minimum=0)
    rng = np.random.default_rng(rng)
    return np.cumsum(rng.exponential(1.0 / lam, n))


def mmc_sample(arrival_rate: float, service_rate: float, n: int, rng, servers: int = 1):
    """Simulate ``n`` requests through an M/M/c queue.

    Returns ``(arrival_times, service_times, waits)``, each an array of seconds.
    Does not require stability: an overloaded run simply shows growing waits.
    """
    mu = _check.positive("service_rate", service_rate)
    rng = np.random.default_rng(rng)
    arrivals = poisson_arrivals(arrival_rate, n, rng)
    service = rng.exponential(1.0 / mu, arrivals.size)
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
