"""Reactive autoscaling against a burst: capacity that arrives after a delay.

An autoscaler notices overload ``detect_s`` seconds after it starts and asks for more
replicas, which become ready ``startup_s`` seconds later. Until then the burst is
served by the capacity already running. Two models of that situation:

* :func:`fcfs_time_varying` -- a request-level FCFS queue whose servers come online at
  given times (each server is one batch slot, or one replica). A server that becomes
  ready at time ``r`` behaves exactly like a server that is busy until ``r``, so the
  multi-server Lindley recursion (a heap of server free times) handles the step in
  capacity with no special case. Optional admission control rejects an arrival, at
  once and without using a server, when ``queue_cap`` requests are already waiting or
  when its wait would exceed ``max_wait_s``.
* :func:`fluid_wait` -- the fluid (deterministic, continuous) limit for a constant
  burst rate that starts on an empty queue at time 0 with one capacity step at
  ``ready_s``: the closed form the simulation must approach when rates are large.

:func:`reactive_ready_times` builds the server ready-times array for a fleet that
scales out once. Units: seconds, requests/s; "servers" are whole numbers.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from . import _check

__all__ = ["reactive_ready_times", "fcfs_time_varying", "fluid_wait"]


@_check.guarded
def reactive_ready_times(base_servers: int, added_servers: int, overload_start_s: float,
                         detect_s: float, startup_s: float) -> np.ndarray:
    """Ready time (s) of every server of a fleet that scales out once.

    ``base_servers`` are ready at time 0 (arrivals start at 0 or later);
    ``added_servers`` become ready at
    ``overload_start_s + detect_s + startup_s``: the overload must be noticed, then the
    new capacity must start. Returns a sorted float array of length
    ``base_servers + added_servers``.
    """
    base = _check.whole("base_servers", base_servers)
    added = _check.whole("added_servers", added_servers, minimum=0)
    start = _check.nonnegative("overload_start_s", overload_start_s)
    detect = _check.nonnegative("detect_s", detect_s)
    startup = _check.nonnegative("startup_s", startup_s)
    ready = start + detect + startup
    return np.concatenate([np.zeros(base), np.full(added, ready)])


def fcfs_time_varying(arrival_s, service_s, server_ready_s, queue_cap: int | None = None,
                      max_wait_s: float | None = None):
    """FCFS queue whose servers come online at ``server_ready_s``; optional admission.

    Parameters
    ----------
    arrival_s : array of float
        Arrival times (s), non-decreasing.
    service_s : array of float
        Service time of each request (s), >= 0.
    server_ready_s : array of float
        When each server can first start work (s), >= 0; one entry per server.
    queue_cap : int or None
        Reject an arrival that finds this many admitted requests still waiting for a
        server (a queue-depth cap; ``None``: never).
    max_wait_s : float or None
        Reject an arrival whose FCFS wait would exceed this many seconds (deadline-aware
        admission: FCFS start times are known at arrival when service times are;
        ``None``: never).

    Returns
    -------
    (waits, admitted) : (numpy.ndarray, numpy.ndarray)
        Wait before service (s; NaN for rejected requests) and the admitted flag,
        one per request. Rejected requests use no server.
    """
    a, s = _check.arrivals_and_services(arrival_s, service_s, names=("arrival_s", "service_s"))
    ready = _check.array("server_ready_s", server_ready_s, nonnegative_values=True)
    if ready.size == 0:
        raise ValueError("server_ready_s must list at least one server, got an empty array")
    cap = None if queue_cap is None else _check.whole("queue_cap", queue_cap, minimum=0)
    limit = math.inf if max_wait_s is None else _check.nonnegative("max_wait_s", max_wait_s)
    free = sorted(ready.tolist())                 # a sorted list is a valid heap
    waits = np.full(a.size, np.nan)
    admitted = np.zeros(a.size, dtype=bool)
    starts: list[float] = []                      # start times of admitted requests
    head = 0
    for i, (arrive, serve) in enumerate(zip(a.tolist(), s.tolist(), strict=True)):
        # FCFS start times never decrease, so the ones still waiting are a suffix.
        while head < len(starts) and starts[head] <= arrive:
            head += 1
        start = max(arrive, free[0])
        if cap is not None and start > arrive and len(starts) - head >= cap:
            continue
        if start - arrive > limit:
            continue
        waits[i] = start - arrive
        admitted[i] = True
        heapq.heapreplace(free, start + serve)
        if start > arrive:
            starts.append(start)
    return waits, admitted


@_check.guarded
def fluid_wait(t_s, arrival_rate: float, base_capacity: float, added_capacity: float,
               ready_s: float):
    """Fluid FCFS wait (s) of work arriving at ``t_s`` during a constant-rate burst.

    Work arrives at ``arrival_rate`` (requests/s) from time 0 onto an empty queue; the
    service capacity is ``base_capacity`` (requests/s) until ``ready_s`` and
    ``base_capacity + added_capacity`` after. With ``mu0 = base_capacity`` and
    ``mu1 = mu0 + added_capacity``, the backlog is
    ``Q(t) = (lambda - mu0) t`` for ``t <= ready_s`` and
    ``max(0, Q(ready_s) + (lambda - mu1)(t - ready_s))`` after (0 throughout when
    ``lambda <= mu0``). Work arriving at ``t`` waits until the capacity after ``t``
    has served the ``Q(t)`` ahead of it:

    * ``Q / mu0`` if that ends before ``ready_s``;
    * ``(ready_s - t) + (Q - mu0 (ready_s - t)) / mu1`` if it straddles ``ready_s``;
    * ``Q / mu1`` for ``t >= ready_s``.

    Example: a burst at twice the base capacity waits ``t`` seconds at time ``t``
    until the step, so with a 5 s deadline only the first ~5 s of it are served in time.
    Returns a float for a scalar ``t_s``, else an array (s).
    """
    lam = _check.nonnegative("arrival_rate", arrival_rate)
    mu0 = _check.positive("base_capacity", base_capacity)
    mu1 = mu0 + _check.nonnegative("added_capacity", added_capacity)
    r = _check.nonnegative("ready_s", ready_s)
    scalar = np.ndim(t_s) == 0
    t = _check.array("t_s", np.atleast_1d(t_s), nonnegative_values=True)
    before = np.minimum(t, r)
    q_ready = max(lam - mu0, 0.0) * r
    q = np.where(t <= r, np.maximum(lam - mu0, 0.0) * before,
                 np.maximum(q_ready + (lam - mu1) * (t - r), 0.0))
    w = np.where(t >= r, q / mu1, q / mu0)
    straddle = (t < r) & (t + q / mu0 > r)
    w = np.where(straddle, (r - t) + (q - mu0 * (r - t)) / mu1, w)
    return float(w[0]) if scalar else w
