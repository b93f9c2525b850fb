"""Sizing a fleet of serving replicas for a tail-latency target.

The recipe, in the order a planner applies it:

1. **Little's law** turns a request rate into busy batch slots: ``a = lambda * T_hold``
   (Erlangs), where ``T_hold`` is how long one request occupies a slot.
2. **Square-root staffing** adds tail headroom: ``c = a + beta * sqrt(a)`` slots
   (Halfin and Whitt 1981); ``beta = 2`` keeps the chance of queueing near 3 %.
3. **Whole replicas plus spares**: ``ceil(c / slots_per_replica) + spares``.
4. **Check instead of trusting**: exact Erlang C for the pooled slots, and Erlang C
   *per replica* when the router splits traffic at random (each replica is then its
   own M/M/c queue at ``lambda / replicas``).
5. **Check with the serving simulator**: :func:`smallest_fleet` searches replica
   counts for the smallest fleet whose simulated p99 TTFT and TPOT meet the SLOs.

Also here: :func:`routed_waits`, a fast queue-level simulator of replicas with slots
behind the serving simulator's routers that need no token state; :func:`slot_requests` and
:func:`slot_replica`, the *slot model* that makes the serving simulator hold each
request in a slot for ``T_hold`` whatever else runs (prefill and batch effects
removed, so only slots and routing remain); :func:`gpu_busy`, the per-replica GPU time
that prefill and decode need when they share a replica; :func:`replicated_attainment`,
the output analysis of :mod:`servingcap.planning` (warm-up cut, interval over
replications, verdict) for runs it cannot make itself, such as disaggregated pools; and
:func:`serving_cost`.

Units: requests/s, seconds, slots (concurrent sequences), replicas.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _check
from .queues import MMc, erlang_c, halfin_whitt_prob_wait, sqrt_staffing
from .routers import DEFAULT_ROUTER, check_router
from .serving import Replica
from .sim import fcfs_waits, poisson_arrivals

#: Routers of the queue-level simulator :func:`routed_waits`: those of the serving
#: simulator (:data:`servingcap.routers.ROUTERS`, same meanings) that need no token or
#: prefix state; the default first.
ROUTERS = ("jsq", "least_requests", "power_of_two", "random", "round_robin", "pooled",
           "oracle_work")

__all__ = [
    "ROUTERS", "FleetSizing", "size_fleet", "pooled_queue", "split_queue", "GpuBusy", "gpu_busy",
    "routed_waits", "slot_requests", "slot_replica", "FleetSearch", "smallest_fleet",
    "replicated_attainment", "ServingCost", "serving_cost",
]


# --------------------------------------------------------------------------- closed forms


@_check.guarded
def pooled_queue(arrival_rate: float, hold_s: float, slots_per_replica: int,
                 replicas: int) -> MMc:
    """All slots of the fleet behind one queue: M/M/(replicas * slots) at ``arrival_rate``.

    What a pooled (or, nearly, a join-the-shortest-queue) router achieves. Raises
    :class:`~servingcap.UnstableQueueError` when ``arrival_rate * hold_s`` >= total slots.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    hold = _check.positive("hold_s", hold_s)
    slots = _check.whole("slots_per_replica", slots_per_replica)
    n = _check.whole("replicas", replicas)
    return MMc(lam, _check.finite_result(1.0 / hold, f"1 / hold_s={hold!r}"), slots * n)


@_check.guarded
def split_queue(arrival_rate: float, hold_s: float, slots_per_replica: int,
                replicas: int) -> MMc:
    """One replica's queue under random routing: M/M/slots at ``arrival_rate / replicas``.

    Random routing thins a Poisson stream into independent Poisson streams, so each
    replica is its own M/M/c queue whose slots cannot help the others.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    hold = _check.positive("hold_s", hold_s)
    slots = _check.whole("slots_per_replica", slots_per_replica)
    n = _check.whole("replicas", replicas)
    return MMc(lam / n, _check.finite_result(1.0 / hold, f"1 / hold_s={hold!r}"), slots)


@dataclass(frozen=True)
class FleetSizing:
    """The square-root-staffing plan for one arrival rate, with its Erlang C checks.

    Build it with :func:`size_fleet`. Times in seconds, rates in requests/s.
    """

    arrival_rate: float
    """lambda, requests/s."""
    hold_s: float
    """T_hold, seconds one request occupies a slot."""
    slots_per_replica: int
    """Concurrent sequences one replica holds (its max batch)."""
    beta: float
    """Square-root staffing headroom parameter."""
    spares: int
    """Extra whole replicas for failures (1 = N+1)."""
    p: float
    """Quantile level of the wait quantiles (0.99 = p99)."""

    @property
    def offered_load(self) -> float:
        """a = lambda * T_hold: slots busy on average (Erlangs), Little's law."""
        return self.arrival_rate * self.hold_s

    @property
    def slots(self) -> int:
        """c = ceil(a + beta * sqrt(a)): slots the square-root rule asks for."""
        return sqrt_staffing(self.offered_load, self.beta)

    @property
    def slots_target(self) -> float:
        """a + beta * sqrt(a) before rounding (slots)."""
        return self.offered_load + self.beta * math.sqrt(self.offered_load)

    @property
    def replicas_for_slots(self) -> int:
        """ceil(c / slots_per_replica): replicas that hold the staffed slots."""
        return math.ceil(self.slots / self.slots_per_replica)

    @property
    def replicas(self) -> int:
        """Replicas to order: replicas_for_slots + spares."""
        return self.replicas_for_slots + self.spares

    @property
    def naive_replicas(self) -> int:
        """ceil(a / slots_per_replica): the fleet sized on the mean load alone."""
        return math.ceil(self.offered_load / self.slots_per_replica - 1e-12)

    @property
    def prob_wait_pooled(self) -> float:
        """Exact Erlang C at the staffed c slots, one pooled queue."""
        return erlang_c(self.slots, self.offered_load)

    @property
    def prob_wait_halfin_whitt(self) -> float:
        """The Halfin–Whitt many-server limit of P(wait) for this beta."""
        return halfin_whitt_prob_wait(self.beta) if self.beta > 0 else 1.0

    @property
    def pooled(self) -> MMc:
        """The ordered fleet's slots behind one queue (pooled / join-the-shortest-queue routing)."""
        return pooled_queue(self.arrival_rate, self.hold_s, self.slots_per_replica,
                            self.replicas)

    @property
    def split(self) -> MMc:
        """One replica of the ordered fleet under random routing."""
        return split_queue(self.arrival_rate, self.hold_s, self.slots_per_replica,
                           self.replicas)

    @property
    def prob_wait_random(self) -> float:
        """P(wait) on one replica when the ordered fleet routes at random."""
        return self.split.prob_wait

    @property
    def wait_quantile_pooled(self) -> float:
        """p-quantile of queue wait (s), ordered fleet, one pooled queue."""
        return self.pooled.wait_quantile(self.p)

    @property
    def wait_quantile_random(self) -> float:
        """p-quantile of queue wait (s), ordered fleet, random routing."""
        return self.split.wait_quantile(self.p)

    def __str__(self) -> str:
        return (f"lambda = {self.arrival_rate:g} req/s x T_hold = {self.hold_s:g} s -> "
                f"a = {self.offered_load:.1f} slots; c = {self.slots} slots "
                f"(beta = {self.beta:g}) -> {self.replicas_for_slots} replicas "
                f"+ {self.spares} spare = {self.replicas}")


def size_fleet(arrival_rate: float, hold_s: float, slots_per_replica: int,
               beta: float = 2.0, spares: int = 1, p: float = 0.99) -> FleetSizing:
    """Size a fleet with Little's law, square-root staffing and spares.

    Parameters
    ----------
    arrival_rate : float
        Target request rate lambda (requests/s), > 0.
    hold_s : float
        T_hold, time one request occupies a batch slot (s), > 0.
    slots_per_replica : int
        Batch slots (concurrent sequences) per replica, >= 1.
    beta : float
        Square-root staffing headroom, >= 0 (2 keeps P(wait) near 3 %).
    spares : int
        Whole replicas added for failures, >= 0 (1 is N+1).
    p : float
        Quantile level for the wait quantiles, in (0, 1).

    Examples
    --------
    >>> plan = size_fleet(30, 9.25, 32)
    >>> plan.offered_load, plan.slots, plan.replicas_for_slots, plan.replicas
    (277.5, 311, 10, 11)
    """
    return FleetSizing(
        arrival_rate=_check.positive("arrival_rate", arrival_rate),
        hold_s=_check.positive("hold_s", hold_s),
        slots_per_replica=_check.whole("slots_per_replica", slots_per_replica),
        beta=_check.nonnegative("beta", beta),
        spares=_check.whole("spares", spares, minimum=0),
        p=_check.probability("p", p),
    )


@dataclass(frozen=True)
class GpuBusy:
    """Fraction of one replica's time that prefill and decode need when colocated."""

    prefill: float
    """Per-replica arrival rate x prefill time (fraction of the replica's time)."""
    decode: float
    """Decode steps per second x step time, at a full batch (fraction)."""

    @property
    def total(self) -> float:
        """prefill + decode; >= 1 means the replica cannot keep up."""
        return self.prefill + self.decode


@_check.guarded
def gpu_busy(arrival_rate: float, replicas: int, prefill_s: float, output_tokens: float,
             decode_step_s: float, batch: int) -> GpuBusy:
    """GPU-time budget of one colocated replica (additive cost model, even routing).

    ``prefill = (lambda / n) * prefill_s``; ``decode = (lambda / n) * output_tokens *
    decode_step_s / batch`` (each step emits one token for each of ``batch``
    sequences). With ``decode_step_s`` the step at the full batch, the decode term is
    the *least* decode time whenever the time per token, ``t(b) / b``, does not rise
    with the batch, as on the book's decode curve ``t(b) = t0 + s b`` with ``t0 > 0``
    (``LOCKED.decode_step_table``): a lighter batch steps faster but needs more steps
    for the same tokens.

    Parameters
    ----------
    arrival_rate : float
        Fleet request rate (requests/s), > 0.
    replicas : int
        Replicas sharing it evenly, >= 1.
    prefill_s : float
        Prefill time of one prompt (s), >= 0.
    output_tokens : float
        Tokens decoded per request (tokens), >= 0.
    decode_step_s : float
        Time of one decode step at ``batch`` sequences (s), > 0.
    batch : int
        Sequences per decode step, >= 1.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    n = _check.whole("replicas", replicas)
    pre = _check.nonnegative("prefill_s", prefill_s)
    out = _check.nonnegative("output_tokens", output_tokens)
    step = _check.positive("decode_step_s", decode_step_s)
    b = _check.whole("batch", batch)
    per = lam / n
    return GpuBusy(prefill=per * pre, decode=per * out * step / b)


# --------------------------------------------------------------------------- simulation


def routed_waits(arrival_times, service_times, replicas: int, slots_per_replica: int,
                 router: str = DEFAULT_ROUTER, rng=None) -> np.ndarray:
    """Queue waits (s) of requests routed to ``replicas`` FCFS replicas of ``slots`` each.

    A fast queue-level counterpart of :func:`servingcap.serving.simulate` in its slot
    model (no prefill, no batch effect: a request holds one slot for its service time).

    Parameters
    ----------
    arrival_times, service_times : array of float
        Arrival instants (s, non-decreasing) and slot holding times (s, >= 0).
    replicas, slots_per_replica : int
        Fleet shape, each >= 1.
    router : str
        One of :data:`ROUTERS`, with the serving simulator's meanings (ties go to the
        lowest index; then the request waits there FCFS). Realistic:
        ``jsq`` (default): a replica with a free slot first (the most free), else
        the shortest queue (here, with no memory limit, the same order as
        ``least_requests``); ``least_requests``: the fewest requests waiting or in
        service; ``power_of_two``: two distinct replicas at random, the one with fewer
        requests; ``random``; ``round_robin``. Bounds: ``pooled``, one queue for every
        slot (M/M/c with c = replicas x slots); ``oracle_work``, the least outstanding
        work, the slot-seconds still to serve there, known in advance (the serving
        simulator counts the same work in tokens). The serving simulator's
        ``endpoint_picker``, ``cache_aware``, ``kv_cost`` and ``affinity`` read KV and
        prefix state that a slot has not: they raise ValueError here.
    rng : numpy.random.Generator or seed
        Used by the random and power_of_two routers.

    Returns
    -------
    numpy.ndarray
        Wait before a slot is free (s), one per request in the order given.
    """
    a = _check.array("arrival_times", arrival_times)
    s = _check.array("service_times", service_times, nonnegative_values=True)
    n = _check.whole("replicas", replicas)
    slots = _check.whole("slots_per_replica", slots_per_replica)
    check_router(router)
    if router not in ROUTERS:
        raise ValueError(f"router {router!r} reads KV or prefix state the slot model has not: "
                         f"use servingcap.serving.simulate, or one of {ROUTERS}")
    if a.shape != s.shape:
        raise ValueError(
            f"arrival_times and service_times must have the same length, got {a.size} and {s.size}")
    if router == "pooled":
        return fcfs_waits(a, s, servers=n * slots)
    if router in ("random", "round_robin"):
        if router == "random":
            target = _check.generator("rng", rng).integers(n, size=a.size)
        else:
            target = np.arange(a.size) % n
        waits = np.empty_like(a)
        for k in range(n):
            mine = target == k
            if mine.any():
                waits[mine] = fcfs_waits(a[mine], s[mine], servers=slots)
        return waits
    draw = _check.generator("rng", rng) if router == "power_of_two" else None
    return _join_least(a, s, n, slots, router, draw)


def _join_least(a: np.ndarray, s: np.ndarray, n: int, slots: int, router: str,
                rng) -> np.ndarray:
    """Join-the-least routers: by outstanding work (slot-seconds, ``oracle_work``), by
    request count (``least_requests``, ``power_of_two`` between two), or free slots
    then queue (``jsq``).

    Outstanding work at time ``t`` on a replica is ``sum(f - max(b, t))`` over its
    requests not yet finished (start ``b``, finish ``f``). Within one FCFS replica the
    starts are non-decreasing, so it is kept in O(1) per event: the sum of ``f``, the
    queue of starts still ahead of ``t`` (and their sum), and the count in service.
    """
    if a.size and (np.diff(a) < 0).any():
        i = int(np.argmax(np.diff(a) < 0)) + 1
        raise ValueError(
            f"arrival_times must be non-decreasing, got {a[i]!r} after {a[i - 1]!r} at index {i}")
    by_work = router == "oracle_work"
    waits = np.empty_like(a)
    free = [[-math.inf] * slots for _ in range(n)]   # per replica: heap of slot free times
    leave = [[] for _ in range(n)]                   # per replica: heap of departure times
    load = [0] * n
    ahead = [deque() for _ in range(n)]              # per replica: starts still to come
    ahead_sum = [0.0] * n                            # their sum (s)
    serving = [0] * n                                # requests in service
    finish_sum = [0.0] * n                           # finish times of those outstanding
    for i, (arrive, serve) in enumerate(zip(a.tolist(), s.tolist(), strict=True)):
        work = []
        for k in range(n):
            queue = ahead[k]
            while queue and queue[0] <= arrive:
                ahead_sum[k] -= queue.popleft()
                serving[k] += 1
            out = leave[k]
            while out and out[0] <= arrive:
                finish_sum[k] -= heapq.heappop(out)
                load[k] -= 1
                serving[k] -= 1
            if load[k] == 0:                             # exact zero: ties stay ties
                finish_sum[k] = ahead_sum[k] = 0.0
            if by_work:
                work.append(finish_sum[k] - ahead_sum[k] - arrive * serving[k])
        if by_work:
            k = min(range(n), key=work.__getitem__)
        elif router == "jsq":
            k = min(range(n), key=lambda j: (0, load[j] - slots, j) if load[j] < slots
                    else (1, load[j] - serving[j], j))
        elif router == "power_of_two" and n > 1:
            x = int(rng.integers(n))
            y = int(rng.integers(n - 1))
            y += y >= x
            k = min((x, y), key=lambda j: (load[j], j))
        else:
            k = min(range(n), key=load.__getitem__)
        earliest = free[k][0]
        start = arrive if arrive > earliest else earliest
        waits[i] = start - arrive
        heapq.heapreplace(free[k], start + serve)
        heapq.heappush(leave[k], start + serve)
        load[k] += 1
        finish_sum[k] += start + serve
        if start > arrive:
            ahead[k].append(start)
            ahead_sum[k] += start
        else:
            serving[k] += 1
    return waits


@_check.guarded
def slot_requests(arrival_rate: float, n: int, hold_s: float, rng, step_s: float = 0.001,
                  service: str = "exponential") -> pd.DataFrame:
    """Requests for the serving simulator's *slot model*: each holds a slot ~``hold_s``.

    Every request has a one-token prompt and ``K`` output tokens, so with
    :func:`slot_replica` (decode steps of ``step_s`` whatever the batch) it occupies a
    slot for ``K * step_s`` seconds and nothing else: no prefill stall, no batch
    effect. ``K`` is geometric with mean ``hold_s / step_s`` (the discrete
    exponential, as Erlang C assumes) or constant (``service="deterministic"``).

    Parameters
    ----------
    arrival_rate : float
        Poisson arrival rate (requests/s), > 0.
    n : int
        Number of requests, >= 1.
    hold_s : float
        Mean slot holding time (s), > 0.
    rng : numpy.random.Generator or seed
    step_s : float
        Step time of the slot replica (s), > 0; small keeps step-boundary effects small.
    service : {"exponential", "deterministic"}
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    count = _check.size("n", n)
    hold = _check.positive("hold_s", hold_s)
    step = _check.positive("step_s", step_s)
    if service not in ("exponential", "deterministic"):
        raise ValueError(f"service must be 'exponential' or 'deterministic', got {service!r}")
    steps = hold / step
    if steps < 1:
        raise ValueError(
            f"hold_s must be at least one step_s, got hold_s={hold!r}, step_s={step!r}")
    rng = _check.generator("rng", rng)
    arrivals = poisson_arrivals(lam, count, rng)
    if service == "exponential":
        tokens = rng.geometric(1.0 / steps, count)
    else:
        tokens = np.full(count, max(1, round(steps)))
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": 1, "output_tokens": tokens})


def slot_replica(slots: int, step_s: float = 0.001) -> Replica:
    """A replica for the slot model: ``slots`` batch slots, every step ``step_s`` seconds.

    Prefill is made negligible (a one-token prompt at 10^12 tokens/s), so a request's
    time in a slot is its number of output tokens times ``step_s``.
    """
    # combined steps with the additive cost: a one-token prompt costs nothing and never
    # waits for a token budget, so a slot is held exactly output_tokens steps
    return Replica(prefill_rate=1e12, decode_step_s=_check.positive("step_s", step_s),
                   max_batch=_check.whole("slots", slots), mode="combined",
                   step_cost="additive")


# --------------------------------------------------------------------------- search


class NotSimulatedError(KeyError, ValueError):
    """A fleet size :func:`smallest_fleet` did not simulate (a KeyError, as before, and a
    ValueError about the ``replicas`` argument)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class FleetSearch:
    """Result of :func:`smallest_fleet`: the answer and every fleet it simulated."""

    replicas: int
    """Smallest replica count meeting every SLO."""
    trials: pd.DataFrame
    """One row per simulated fleet: replicas, ttft_p (s), tpot_p (s), meets."""

    def meets(self, replicas: int) -> bool:
        """Whether a simulated fleet of this size met the SLOs (KeyError if not run; the
        error is also a ValueError naming ``replicas``)."""
        replicas = _check.whole("replicas", replicas)
        row = self.trials.loc[self.trials.replicas == replicas]
        if row.empty:
            tried = sorted(self.trials.replicas)
            raise NotSimulatedError(f"replicas={replicas} was not simulated; tried {tried}")
        return bool(row.meets.iloc[0])


MAX_FLEET = 100_000
"""Largest fleet :func:`smallest_fleet` searches (replicas); every probe simulates it."""


def smallest_fleet(run: Callable[[int], pd.DataFrame], lo: int, hi: int, *,
                   ttft_s: float = 1.0, tpot_s: float = 0.050, p: float = 0.99) -> FleetSearch:
    """Smallest replica count in ``[lo, hi]`` whose simulated p-quantiles meet the SLOs.

    Bisection, like :func:`servingcap.slo.max_rate` but over whole replicas: it
    simulates ``hi`` (which must pass), then halves the interval, assuming that a
    fleet that meets the SLOs still meets them with more replicas. Reuse the same
    request table in every call (common random numbers) so that noise does not break
    that monotonicity. Percentiles count failed requests as infinitely late
    (:func:`servingcap.slo.latency_quantile`).

    Parameters
    ----------
    run : callable
        ``replicas -> per-request DataFrame`` (the output of
        :func:`servingcap.serving.simulate` or
        :func:`servingcap.disagg.simulate_disaggregated`).
    lo, hi : int
        Search range, 1 <= lo <= hi. Give as ``lo`` a count known to be too small
        plus one (e.g. the GPU-time stability bound) to save simulations.
    ttft_s, tpot_s : float
        SLOs on the p-quantile of TTFT and of TPOT (s), > 0.
    p : float
        Quantile level, in (0, 1).
    """
    from .slo import latency_quantile

    if not callable(run):
        raise ValueError(f"run must be callable (replicas -> DataFrame), got {run!r}")
    lo = _check.whole("lo", lo)
    hi = _check.whole("hi", hi)
    if hi > MAX_FLEET:
        raise ValueError(f"hi must be <= {MAX_FLEET} replicas (each is simulated), got {hi!r}")
    if hi < lo:
        raise ValueError(f"hi must be >= lo, got hi={hi!r} < lo={lo!r}")
    ttft_s = _check.positive("ttft_s", ttft_s)
    tpot_s = _check.positive("tpot_s", tpot_s)
    p = _check.probability("p", p)
    rows = []

    def meets(n: int) -> bool:
        frame = run(n)
        with _check.naming("run"):
            _check.table(f"run({n})", frame, ("ttft_s", "tpot_s", "outcome"))
            ttft = latency_quantile(frame, p, "ttft_s")
            tpot = latency_quantile(frame, p, "tpot_s")
        ok = ttft <= ttft_s and tpot <= tpot_s
        rows.append({"replicas": n, "ttft_p": ttft, "tpot_p": tpot, "meets": ok})
        return ok

    if not meets(hi):
        raise ValueError(f"hi must be a fleet that meets the SLOs, but hi={hi} misses them "
                         f"(p{100 * p:g} TTFT {rows[-1]['ttft_p']:.3g} s vs ttft_s={ttft_s:g}, "
                         f"TPOT {rows[-1]['tpot_p']:.3g} s vs tpot_s={tpot_s:g})")
    good, bad = hi, lo - 1
    while good - bad > 1:
        mid = (good + bad) // 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    trials = pd.DataFrame(rows).sort_values("replicas").reset_index(drop=True)
    return FleetSearch(replicas=good, trials=trials)


def replicated_attainment(runs, limits, target: float = 0.99,
                          confidence: float = 0.95, *, delta: float = 0.0025,
                          first: int | None = None, cap: int | None = None) -> dict:
    """SLO attainment of independent replications, with its interval and a verdict.

    For runs that :mod:`servingcap.planning` cannot make itself (e.g. the two chained
    simulations of :func:`servingcap.disagg.simulate_disaggregated`), the same output
    analysis: each run's warm-up is cut by MSER-5 on the other runs' average TTFT
    (:func:`servingcap.stats.warmup_cuts`); each replication gives one attainment (the
    share of kept requests that finished within every limit); the attainment interval
    is Student-t across replications (:func:`servingcap.stats.mean_ci`). The p99s are
    those of the kept requests of all replications pooled, as in
    :data:`servingcap.planning.CURVE_COLUMNS` (a mean of per-run p99s would average a
    failing replication away), with a sectioning interval around the pooled p99 TTFT
    (:func:`servingcap.stats.replicated_quantile_ci`; NaN with fewer than 1,000 kept
    requests in a run). The verdict is ``"unstable"`` when at least half the runs fail
    :func:`servingcap.stats.steady_state` (TTFT judged against the TTFT limit, misses
    against the share ``1 - target`` allows), else ``meets`` / ``misses`` / ``open``
    from :func:`servingcap.stats.sequential_check` with one look at all the runs given
    (error at most ``1 - confidence`` outside ``target +- delta``; ``open`` is not a
    miss: add replications). To add replications in looks fixed in advance, as
    :func:`servingcap.planning.evaluate` does, pass the schedule's ``first`` and ``cap``
    (:func:`servingcap.stats.look_schedule`) and call again with the runs of each look:
    the error bound then holds across all the looks.

    Parameters
    ----------
    runs : sequence of DataFrame
        One per-request output per replication (``arrival_s``, ``ttft_s``, ``tpot_s``,
        ``outcome`` and each limited column), each from its own seed.
    limits : mapping
        Column -> limit in seconds, e.g. ``{"ttft_s": 1.0, "tpot_s": 0.05}``.
    target : float
        Attainment to reach, in (0, 1).
    confidence : float
        Level of the intervals, in (0.5, 1); ``1 - confidence`` bounds the verdict's error.
    delta : float
        Half-width of the indifference zone around ``target`` (a fraction, default
        0.0025: a quarter of a percentage point).
    first, cap : int, optional
        First look and most replications of a sequential schedule (default: one look,
        ``first = cap = len(runs)``); ``2 <= first <= cap``, ``len(runs) <= cap``.

    Returns
    -------
    dict
        ``attainment``, ``attainment_low``, ``attainment_high`` (fractions),
        ``ttft_p99_s`` and ``tpot_p99_s`` (s, p99 of all replications' kept requests
        pooled), ``ttft_p99_low`` / ``ttft_p99_high`` (s, sectioning interval around
        the pooled p99 TTFT), ``requests`` (kept requests, all replications together),
        ``misses`` (how many of them missed a limit), ``replications``, ``run_s`` (mean
        simulated seconds after warm-up), ``verdict``.
    """
    from . import stats

    goal = _check.probability("target", target)
    conf = _check.probability("confidence", confidence)
    if conf <= 0.5:
        raise ValueError(f"confidence must be > 0.5 (1 - confidence is the verdict's "
                         f"error), got {confidence!r}")
    zone = _check.positive("delta", delta)
    if isinstance(runs, pd.DataFrame) or not isinstance(runs, (list, tuple)) or not runs:
        raise ValueError(f"runs must be a non-empty list of per-request DataFrames, "
                         f"got {type(runs).__name__}")
    if not hasattr(limits, "items") or not limits:
        raise ValueError(f"limits must be a non-empty mapping column -> seconds, "
                         f"got {limits!r}")
    lim = {str(k): _check.positive(f"limits[{k!r}]", v) for k, v in limits.items()}
    n0 = max(len(runs), 2) if first is None else _check.whole("first", first, minimum=2)
    top = max(len(runs), n0) if cap is None else _check.whole("cap", cap)
    if top < n0 or len(runs) > top:
        raise ValueError(f"cap must be >= first={n0} and >= the {len(runs)} runs given, "
                         f"got cap={cap!r}")
    columns = ("arrival_s", "ttft_s", "tpot_s", "outcome", *lim)
    series = []
    for i, frame in enumerate(runs):
        _check.table(f"runs[{i}]", frame, tuple(dict.fromkeys(columns)), minimum=20)
        frame = frame.sort_values("arrival_s", kind="stable")
        done = (frame["outcome"] == "done").to_numpy()
        ok = done.copy()
        for column, limit in lim.items():
            values = frame[column].to_numpy(dtype=float)
            ok &= np.isnan(values) | (values <= limit)
        ttft = np.where(done, frame["ttft_s"].to_numpy(dtype=float), np.inf)
        finite = ttft[np.isfinite(ttft)]
        signal = np.where(np.isfinite(ttft), ttft, finite.max() if finite.size else 0.0)
        series.append((frame["arrival_s"].to_numpy(dtype=float), ttft, signal, ok,
                       np.where(done, frame["tpot_s"].to_numpy(dtype=float), np.inf)))
    cuts = stats.warmup_cuts([s[2] for s in series])
    per = []
    for (arrival, ttft, signal, ok, tpot), cut in zip(series, cuts, strict=True):
        cut = min(cut, arrival.size - 2)
        steady = (stats.steady_state(signal, scale=lim.get("ttft_s")).steady
                  and stats.steady_state((~ok).astype(float),
                                         scale=max(1.0 - goal, 1e-3)).steady)
        per.append((float(ok[cut:].mean()),
                    float(np.quantile(ttft[cut:], 0.99, method="inverted_cdf")),
                    float(arrival[-1] - arrival[cut]), steady,
                    ttft[cut:], tpot[cut:], ok[cut:]))
    units = [p[0] for p in per]
    decision = stats.sequential_check(units, goal, cap=top, first=n0, delta=zone,
                                      alpha=1.0 - conf, confidence=conf)
    attain = decision.estimate
    unstable = 2 * sum(not p[3] for p in per) >= len(per)
    kept_ok = np.concatenate([p[6] for p in per])
    parts = [p[4] for p in per]
    if len(parts) >= 2 and min(x.size for x in parts) * 0.01 >= stats.MIN_TAIL:
        p99 = stats.replicated_quantile_ci(parts, 0.99, conf)
        p99_low, p99_high = p99.low, p99.high
    else:
        p99_low = p99_high = math.nan
    return {"attainment": attain.value, "attainment_low": max(attain.low, 0.0),
            "attainment_high": min(attain.high, 1.0),
            "ttft_p99_s": _pooled_p99([p[4] for p in per]),
            "ttft_p99_low": p99_low, "ttft_p99_high": p99_high,
            "tpot_p99_s": _pooled_p99([p[5] for p in per]),
            "requests": int(kept_ok.size), "misses": int((~kept_ok).sum()),
            "replications": len(per), "run_s": float(np.mean([p[2] for p in per])),
            "verdict": "unstable" if unstable else decision.verdict}


def _pooled_p99(parts) -> float:
    """p99 (inverted CDF) of the non-NaN values of all parts together; NaN if none."""
    values = np.concatenate(parts)
    values = values[~np.isnan(values)]
    return (float(np.quantile(values, 0.99, method="inverted_cdf")) if values.size
            else math.nan)


# --------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class ServingCost:
    """What a batch of SLO-satisfying requests costs."""

    replica_hours: float
    """Replica-hours per ``per`` good requests."""
    dollars: float
    """Price of those replica-hours (currency units)."""
    per: int
    """Number of good requests priced."""


@_check.guarded
def serving_cost(replicas: int, good_rate: float, price_per_replica_hour: float,
                 per: int = 1000) -> ServingCost:
    """Replica-hours (and price) per ``per`` requests that met every SLO.

    ``replica_hours = replicas * per / (3600 * good_rate)``: the whole fleet is paid
    for, whether it is serving good requests, failing ones or idling as a spare.

    Parameters
    ----------
    replicas : int
        Replicas paid for, >= 1.
    good_rate : float
        SLO goodput (requests/s), > 0.
    price_per_replica_hour : float
        Price of one replica for one hour (currency units), >= 0.
    per : int
        Number of good requests to price, >= 1.
    """
    n = _check.whole("replicas", replicas)
    good = _check.positive("good_rate", good_rate)
    price = _check.nonnegative("price_per_replica_hour", price_per_replica_hour)
    k = _check.whole("per", per)
    hours = n * k / (3600.0 * good)
    return ServingCost(replica_hours=hours, dollars=hours * price, per=k)
