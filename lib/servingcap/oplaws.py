"""Operational laws: what measured rates, times and counts must satisfy, before any model.

The laws of Denning and Buzen hold for *any* system observed over a period in which
arrivals equal completions, whatever the distributions, so they come before any queueing
formula: they check measurements and bound what a formula may claim.

- Utilization law: a resource that each request needs for D seconds (its *service
  demand*) is busy U = X * D of the time at throughput X (requests/s).
- Bottleneck bound: U <= 1 for every resource, so X <= 1 / D_max.
- Response-time law (Little's law around a closed loop): N clients that each wait R for
  a response and then think Z before the next request run at X = N / (R + Z).
- Asymptotic bounds for a closed loop: X(N) <= min(N / (R_0 + Z), 1 / D_max) and
  R(N) >= max(R_0, N * D_max - Z), where R_0 is a lone request's response time.

:func:`mva` gives the exact closed-loop curve for one queueing station (exponential or
processor-sharing service) behind a think time, the model of a fixed-concurrency
benchmark, so its numbers can be set beside an open-loop queue at the same throughput.
Units: seconds, requests, requests/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _check

__all__ = [
    "utilization_law",
    "throughput_bound",
    "closed_loop_throughput",
    "response_time_law",
    "closed_loop_bounds",
    "ClosedLoop",
    "mva",
]

MAX_MVA_USERS = 10**6
"""Largest concurrency :func:`mva` evaluates: its recursion is one Python step per client
count (about a second for a million), far past any benchmark's connection count."""


def _demands(demand) -> np.ndarray:
    d = _check.array("demand", np.atleast_1d(demand), nonnegative_values=True)
    if d.size == 0 or d.max() <= 0:
        raise ValueError(f"demand must hold at least one value > 0 (s), got {demand!r}")
    return d


@_check.guarded
def utilization_law(throughput: float, demand: float) -> float:
    """U = X * D: the busy fraction of a resource (0..1).

    Parameters
    ----------
    throughput : float
        X, completed requests per second (>= 0).
    demand : float
        D, seconds of this resource each request uses (> 0).

    Raises ``ValueError`` if X * D > 1: no resource can be busy more than all the time,
    so the measured throughput and demand contradict each other.
    """
    x = _check.nonnegative("throughput", throughput)
    d = _check.positive("demand", demand)
    u = x * d
    if u > 1 + 1e-12:
        raise ValueError(
            f"utilization X * D = {x:g}/s x {d:g} s = {u:.4g} > 1: throughput={x!r} exceeds "
            f"the bound 1 / D = {1 / d:.4g}/s for demand={d!r}"
        )
    return u


@_check.guarded
def throughput_bound(demand) -> float:
    """X <= 1 / D_max (requests/s): the bottleneck resource's saturation rate.

    ``demand`` is one service demand (s) or one per resource a request visits.
    """
    return float(1.0 / _demands(demand).max())


@_check.guarded
def closed_loop_throughput(users: float, response_time: float, think_time: float = 0.0
                           ) -> float:
    """X = N / (R + Z) (requests/s): the response-time law of a closed loop.

    Parameters
    ----------
    users : float
        N, clients (or benchmark connections) each with at most one request out, > 0.
    response_time : float
        R, mean time from sending a request to its response (s), >= 0.
    think_time : float
        Z, mean time a client waits after a response before its next request (s), >= 0.
    """
    n = _check.positive("users", users)
    r = _check.nonnegative("response_time", response_time)
    z = _check.nonnegative("think_time", think_time)
    if r + z <= 0:
        raise ValueError("response_time + think_time must be > 0, got 0.0")
    return n / (r + z)


@_check.guarded
def response_time_law(users: float, throughput: float, think_time: float = 0.0) -> float:
    """R = N / X - Z (s): the mean response time a closed loop's counts imply.

    Raises ``ValueError`` if the result would be negative (the three measurements are
    inconsistent: N clients cannot complete more than N / Z requests/s).
    """
    n = _check.positive("users", users)
    x = _check.positive("throughput", throughput)
    z = _check.nonnegative("think_time", think_time)
    r = n / x - z
    if r < 0:
        raise ValueError(
            f"N / X - Z = {n:g} / {x:g} - {z:g} = {r:.4g} s < 0: throughput={x!r} is more "
            f"than users / think_time = {n / z if z else float('inf'):.4g}/s allows"
        )
    return r


@_check.guarded
def closed_loop_bounds(users: float, lone_response: float, demand,
                       think_time: float = 0.0) -> tuple[float, float]:
    """Asymptotic bounds of a closed loop: (max throughput, min mean response time).

    X(N) <= min(N / (R_0 + Z), 1 / D_max) and R(N) >= max(R_0, N * D_max - Z).

    Parameters
    ----------
    users : float
        N, concurrent clients, > 0.
    lone_response : float
        R_0, response time of a request alone in the system (s), > 0.
    demand : float or sequence of float
        Service demand(s) per request at each resource (s); the largest is the bottleneck.
    think_time : float
        Z (s), >= 0.
    """
    n = _check.positive("users", users)
    r0 = _check.positive("lone_response", lone_response)
    z = _check.nonnegative("think_time", think_time)
    d_max = float(_demands(demand).max())
    return min(n / (r0 + z), 1.0 / d_max), max(r0, n * d_max - z)


@dataclass(frozen=True)
class ClosedLoop:
    """Mean-value-analysis results for 1..N clients (arrays indexed by N - 1)."""

    users: np.ndarray
    """N = 1, 2, ..., clients."""
    throughput: np.ndarray
    """X(N), requests/s."""
    response_time: np.ndarray
    """R(N), mean time at the station, waiting plus service (s)."""
    utilization: np.ndarray
    """U(N) = X(N) * D, busy fraction of the station."""


@_check.guarded
def mva(users: int, demand: float, think_time: float = 0.0) -> ClosedLoop:
    """Exact mean value analysis: N clients, think time Z, one queueing station.

    Each client sends a request, waits for it, thinks for Z (any distribution), and
    repeats. The station serves with demand D per request, FCFS with exponential service
    or processor sharing with any service distribution (where MVA is exact). The
    recursion (Reiser and Lavenberg) is R(n) = D (1 + Q(n - 1)), X(n) = n / (R(n) + Z),
    Q(n) = X(n) R(n), from Q(0) = 0.

    Parameters
    ----------
    users : int
        N >= 1, the largest concurrency to evaluate.
    demand : float
        D, service demand per request at the station (s), > 0.
    think_time : float
        Z, mean think time between a response and the next request (s), >= 0.
    """
    n_max = _check.whole("users", users)
    if n_max > MAX_MVA_USERS:
        raise ValueError(f"users must be <= {MAX_MVA_USERS:.0e} (the recursion runs once per "
                         f"client count), got {users!r}")
    d = _check.positive("demand", demand)
    z = _check.nonnegative("think_time", think_time)
    x = np.empty(n_max)
    r = np.empty(n_max)
    q = 0.0
    for i in range(n_max):
        r[i] = d * (1.0 + q)
        x[i] = (i + 1) / (r[i] + z)
        q = x[i] * r[i]
    return ClosedLoop(np.arange(1, n_max + 1), x, r, x * d)
