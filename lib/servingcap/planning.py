"""Capacity planning as a workload experiment: replay, search, size.

The closed forms of :mod:`servingcap.fleet` give a first guess; this module checks it
the way Vidur-Search does, but with the book's simulator, in seconds:

- :func:`capacity_search` finds the largest mean arrival rate (requests/s) at which a
  workload, replayed through :func:`servingcap.serving.simulate` with its arrivals
  rescaled to that rate (:func:`servingcap.traffic.rescale_to_rate` keeps the burst
  shape), still has SLO attainment at or above a target. Bisection between a feasible
  and an infeasible rate, bracketed automatically from a fluid estimate of capacity.
- :func:`goodput_curve` simulates a grid of rates and returns throughput, TTFT goodput,
  TTFT+TPOT goodput, attainment and p99 latencies at each; :func:`curve_knee` reads the
  capacity (last rate meeting the target) and the goodput peak off that curve.
- :func:`smallest_fleet` searches replica counts for the smallest fleet meeting the
  target at one rate, and :func:`plan` strings the steps together (closed-form guess,
  simulator-confirmed fleet, capacity knee): it is what ``python -m servingcap plan``
  prints.

Every simulation of one search replays the *same* requests, only stretched in time
(common random numbers), so attainment falls monotonically with rate in practice and
bisection is safe.

Units: rates in requests/s, times in seconds, tokens, replicas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import _check
from .fleet import FleetSizing, size_fleet
from .params import LOCKED
from .serving import Replica, StepDetail, check_fleet, simulate
from .slo import goodput, latency_quantile, slo_attainment
from .traffic import mean_rate, rescale_to_rate

__all__ = [
    "CapacityResult", "capacity_search", "evaluate", "fluid_rate", "hold_time",
    "goodput_curve", "CurveKnee", "curve_knee", "FleetResult", "smallest_fleet",
    "Plan", "plan", "CURVE_COLUMNS",
]

CURVE_COLUMNS = ("rate_rps", "throughput_rps", "ttft_goodput_rps", "goodput_rps",
                 "attainment", "ttft_p99_s", "tpot_p99_s", "meets")
"""Columns of :func:`goodput_curve` and of ``CapacityResult.evaluations``."""

_MAX_BRACKET_STEPS = 40     # doublings or halvings allowed while bracketing (a factor 2^40)


# --------------------------------------------------------------------------- validation


def _default_limits() -> dict:
    return {"ttft_s": LOCKED.ttft_slo_s, "tpot_s": LOCKED.tpot_slo_s}


def _limits(limits) -> dict:
    if limits is None:
        return _default_limits()
    if not isinstance(limits, Mapping):
        raise ValueError(f"limits must be a mapping like {{'ttft_s': 1.0, 'tpot_s': 0.05}}, "
                         f"got {limits!r}")
    clean = {}
    for column, limit in limits.items():
        if not isinstance(column, str):
            raise ValueError(f"limits keys must be column names (str), got {column!r}")
        clean[column] = True if limit is True else _check.positive(f"limits[{column!r}]", limit)
    return clean


def _workload(requests) -> pd.DataFrame:
    _check.requests(requests, minimum=2)  # a rate needs at least one gap
    mean_rate(requests)     # raises if every arrival is at the same instant
    return requests


def _options(replica, replicas, router, policy, seed) -> dict:
    n = check_fleet(replica, replicas, router, policy)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    return {"replicas": n, "router": router, "policy": policy, "seed": seed}


def _target(target) -> float:
    value = _check.number("target", target)
    if not 0 < value <= 1:
        raise ValueError(f"target must be in (0, 1], got {target!r}")
    return value


# --------------------------------------------------------------------------- one run


def _summary(out: pd.DataFrame, rate: float, limits: dict, target: float) -> dict:
    """One row of an evaluation table from a simulate() output."""
    start = float(out["arrival_s"].min())
    end = float(out["arrival_s"].max())
    last = out["finish_s"].max()
    if pd.notna(last):
        end = max(end, float(last))
    span = end - start
    attainment = slo_attainment(out, **limits)
    ttft_limits = {k: v for k, v in limits.items() if k == "ttft_s"}
    return {
        "rate_rps": rate,
        "throughput_rps": float((out["outcome"] == "done").sum()) / span,
        "ttft_goodput_rps": goodput(out, span, **ttft_limits),
        "goodput_rps": goodput(out, span, **limits),
        "attainment": attainment,
        "ttft_p99_s": latency_quantile(out, 0.99, "ttft_s"),
        "tpot_p99_s": _tpot_p99(out),
        "meets": bool(attainment >= target),
    }


def _tpot_p99(out: pd.DataFrame) -> float:
    try:
        return latency_quantile(out, 0.99, "tpot_s")
    except ValueError:       # every answer was one token long: TPOT is undefined
        return math.nan


def evaluate(requests, replica: Replica, rate: float, *, replicas: int = 1,
             router: str = "least_loaded", policy: str = "fcfs", limits=None,
             target: float = 0.99, seed=0) -> dict:
    """Simulate ``requests`` rescaled to ``rate`` and summarize against the limits.

    Returns a dict with the :data:`CURVE_COLUMNS`: ``rate_rps``, ``throughput_rps``
    (completed requests/s), ``ttft_goodput_rps`` (done within the TTFT limit, per s),
    ``goodput_rps`` (done within every limit, per s), ``attainment`` (fraction of all
    requests meeting every limit), ``ttft_p99_s``, ``tpot_p99_s`` (failures count as
    ``inf``) and ``meets`` (attainment >= target). Rates are per second of the window
    from the first arrival to the last arrival or finish, whichever is later.
    """
    frame = _workload(requests)
    opts = _options(replica, replicas, router, policy, seed)
    lim = _limits(limits)
    goal = _target(target)
    lam = _check.positive("rate", rate)
    return _run(frame, replica, lam, opts, lim, goal)


def _run(frame, replica, rate, opts, limits, target) -> dict:
    out = simulate(rescale_to_rate(frame, rate), replica, **opts)
    return _summary(out, rate, limits, target)


# --------------------------------------------------------------------------- fluid


def _mean_tokens(frame: pd.DataFrame) -> tuple[float, float]:
    return float(frame["prompt_tokens"].mean()), float(frame["output_tokens"].mean())


def _step_cost(replica: Replica, prefill: float, decode_batch: int, context: float) -> float:
    chunks = np.array([prefill]) if prefill > 0 else np.array([], dtype=float)
    detail = StepDetail(prefill_chunks=chunks, prefill_cached=np.zeros(chunks.size),
                        decode_context=np.full(decode_batch, context))
    return replica.cost(detail)


def hold_time(requests, replica: Replica) -> float:
    """T_hold (s): how long a mean request holds a batch slot when the batch is full.

    Prefill of the mean prompt plus the mean output's decode steps at ``max_batch``
    sequences, from the replica's own cost model. With the book's locked numbers:
    2,000 / 8,000 + 300 x 0.030 = 9.25 s.
    """
    frame = _workload(requests)
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    prompt, output = _mean_tokens(frame)
    prefill = _step_cost(replica, prompt, 0, 0.0)
    step = _step_cost(replica, 0.0, replica.max_batch, prompt + output / 2)
    return prefill + output * step


def fluid_rate(requests, replica: Replica, replicas: int = 1) -> float:
    """Fluid capacity estimate (requests/s): GPU time per request at a full batch.

    Each request costs its prefill plus ``output_tokens - 1`` decode steps shared with
    ``max_batch - 1`` others, so a replica completes ``1 / (prefill + (N - 1) * step /
    max_batch)`` requests per second when it is never idle. Queueing and SLOs are
    ignored: it is an upper-bound first guess that :func:`capacity_search` starts from.
    """
    frame = _workload(requests)
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    n = _check.whole("replicas", replicas)
    prompt, output = _mean_tokens(frame)
    prefill = _step_cost(replica, prompt, 0, 0.0)
    step = _step_cost(replica, 0.0, replica.max_batch, prompt + output / 2)
    per_request = prefill + max(output - 1.0, 0.0) * step / replica.max_batch
    return n / per_request


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class CapacityResult:
    """Largest arrival rate meeting the SLO target, and every rate simulated to find it."""

    rate: float
    """Largest rate found that meets the target (requests/s); 0.0 if none does."""
    attainment: float
    """SLO attainment at ``rate`` (fraction of all requests meeting every limit)."""
    target: float
    """The attainment target the search used."""
    replicas: int
    """Replicas simulated."""
    limits: dict
    """The limits (column -> seconds) a request had to meet."""
    evaluations: pd.DataFrame = field(repr=False)
    """One row per rate tried, in the order tried (:data:`CURVE_COLUMNS`)."""

    @property
    def upper(self) -> float:
        """Smallest rate tried that misses the target (requests/s): the bracket's top."""
        misses = self.evaluations.loc[~self.evaluations["meets"], "rate_rps"]
        return float(misses.min()) if len(misses) else math.inf

    @property
    def at_rate(self) -> pd.Series:
        """The evaluation row at :attr:`rate` (goodput, p99s, ...)."""
        rows = self.evaluations.loc[self.evaluations["rate_rps"] == self.rate]
        return rows.iloc[-1]

    def __str__(self) -> str:
        limits = ", ".join(f"{k} <= {v:g} s" if v is not True else k
                           for k, v in self.limits.items())
        if self.rate == 0:
            return (f"no rate meets {self.target:.1%} attainment of ({limits}) on "
                    f"{self.replicas} replica(s); {len(self.evaluations)} simulations")
        row = self.at_rate
        tpot = "n/a" if math.isnan(row["tpot_p99_s"]) else f"{row['tpot_p99_s']:.3g} s"
        return (f"capacity {self.rate:.4g} req/s on {self.replicas} replica(s): "
                f"attainment {self.attainment:.2%} >= {self.target:.1%} of ({limits}); "
                f"p99 TTFT {row['ttft_p99_s']:.3g} s, p99 TPOT {tpot}, "
                f"goodput {row['goodput_rps']:.4g} req/s; misses at {self.upper:.4g} req/s "
                f"({len(self.evaluations)} simulations)")


def capacity_search(requests, replica: Replica, *, replicas: int = 1,
                    router: str = "least_loaded", policy: str = "fcfs", limits=None,
                    target: float = 0.99, lo: float | None = None, hi: float | None = None,
                    rtol: float = 0.02, seed=0, progress: Callable | None = None
                    ) -> CapacityResult:
    """The largest mean arrival rate (requests/s) whose SLO attainment meets ``target``.

    The workload is replayed through :func:`servingcap.serving.simulate` with its
    arrivals rescaled to each candidate rate by :func:`servingcap.traffic.rescale_to_rate`
    (same burst shape, same requests). A rate *meets* when
    ``slo.slo_attainment(out, **limits) >= target`` over every request (rejected and
    unfinished ones count as misses). Bisection between a meeting ``lo`` and a missing
    ``hi`` until ``hi - lo <= rtol * hi``; the answer is the last meeting rate, so it
    errs low by at most ``rtol``.

    Parameters
    ----------
    requests : pandas.DataFrame
        ``arrival_s`` (s), ``prompt_tokens``, ``output_tokens`` (plus any extra columns
        :func:`~servingcap.serving.simulate` uses); at least two requests.
    replica : Replica
        The replica model.
    replicas, router, policy, seed
        Passed to :func:`~servingcap.serving.simulate` (``seed`` feeds the random router).
    limits : mapping, optional
        Output column -> limit (s) that a request must meet, e.g.
        ``{"ttft_s": 1.0, "tpot_s": 0.05}`` (the default: ``LOCKED.ttft_slo_s`` and
        ``LOCKED.tpot_slo_s``).
    target : float
        Attainment to keep, in (0, 1]; 0.99 asks that 99 % of requests meet every limit.
    lo, hi : float, optional
        A rate known to meet and one known to miss (requests/s). Missing ends are found
        by doubling or halving from the fluid estimate :func:`fluid_rate` (or from the
        other end when one is given); a given end is checked by simulation.
    rtol : float
        Relative width of the final bracket, in (0, 1).
    progress : callable, optional
        Called as ``progress(row)`` after each simulation (row: dict of
        :data:`CURVE_COLUMNS`), e.g. to advance a progress bar.

    Returns
    -------
    CapacityResult
        ``rate`` 0.0 if even ``fluid_rate / 2**40`` misses (a limit below the unqueued
        latency of some request).

    Raises
    ------
    ValueError
        For bad input (naming the parameter), a ``lo`` that misses, a ``hi`` that
        meets, or a target met even at ``2**40`` times the fluid estimate.
    """
    frame = _workload(requests)
    opts = _options(replica, replicas, router, policy, seed)
    lim = _limits(limits)
    goal = _target(target)
    tol = _check.positive("rtol", rtol)
    if tol >= 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    if lo is not None:
        lo = _check.positive("lo", lo)
    if hi is not None:
        hi = _check.positive("hi", hi)
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"lo must be < hi, got lo={lo!r}, hi={hi!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be callable or None, got {progress!r}")

    return _capacity(frame, replica, opts, lim, goal, tol, lo, hi, progress, {})


def _capacity(frame, replica, opts, lim, goal, tol, lo, hi, progress, known) -> CapacityResult:
    """Bracket and bisect; ``known`` maps rates already simulated to their rows."""
    rows: list[dict] = []

    def meets(rate: float) -> bool:
        row = known[rate] if rate in known else _run(frame, replica, rate, opts, lim, goal)
        rows.append(row)
        if progress is not None and rate not in known:
            progress(row)
        return row["meets"]

    def result(rate: float) -> CapacityResult:
        table = pd.DataFrame(rows, columns=list(CURVE_COLUMNS))
        at = table.loc[table["rate_rps"] == rate, "attainment"]
        attainment = float(at.iloc[-1]) if len(at) else float(table["attainment"].iloc[-1])
        return CapacityResult(rate=rate, attainment=attainment, target=goal,
                              replicas=opts["replicas"], limits=lim, evaluations=table)

    if lo is not None and not meets(lo):
        raise ValueError(f"lo must be a rate that meets the target, but lo={lo!r} req/s "
                         f"has attainment {rows[-1]['attainment']:.4g} < {goal!r}")
    if hi is not None and meets(hi):
        raise ValueError(f"hi must be a rate that misses the target, but hi={hi!r} req/s "
                         f"has attainment {rows[-1]['attainment']:.4g} >= {goal!r}")
    if lo is None and hi is None:
        guess = fluid_rate(frame, replica, opts["replicas"])
        if meets(guess):
            lo = guess
        else:
            hi = guess
    if hi is None:
        hi = lo
        for _ in range(_MAX_BRACKET_STEPS):
            hi *= 2.0
            if not meets(hi):
                break
            lo = hi
        else:
            raise ValueError(
                f"target {goal!r} is met even at {hi:.4g} req/s: the limits {lim} never "
                f"bind for these {len(frame)} requests; simulate more requests or tighten "
                "the limits")
    if lo is None:
        lo = hi
        for _ in range(_MAX_BRACKET_STEPS):
            lo /= 2.0
            if meets(lo):
                break
            hi = lo
        else:
            return result(0.0)
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return result(lo)


# --------------------------------------------------------------------------- curve


def goodput_curve(requests, replica: Replica, rates: Iterable[float], *, replicas: int = 1,
                  router: str = "least_loaded", policy: str = "fcfs", limits=None,
                  target: float = 0.99, seed=0, progress: Callable | None = None
                  ) -> pd.DataFrame:
    """Throughput, goodput, attainment and p99s of the workload at each rate.

    Same replay as :func:`capacity_search` (rescaled arrivals, same requests). Returns
    one row per rate, in increasing order, with the :data:`CURVE_COLUMNS`:
    ``rate_rps`` (offered, requests/s), ``throughput_rps`` (completed/s),
    ``ttft_goodput_rps`` (done within the TTFT limit /s), ``goodput_rps`` (done within
    every limit /s), ``attainment``, ``ttft_p99_s``, ``tpot_p99_s``, ``meets``.
    """
    frame = _workload(requests)
    opts = _options(replica, replicas, router, policy, seed)
    lim = _limits(limits)
    goal = _target(target)
    if isinstance(rates, (str, bytes)) or not isinstance(rates, Iterable):
        raise ValueError(f"rates must be an iterable of rates (requests/s), got {rates!r}")
    grid = [_check.positive("rates", r) for r in rates]
    if not grid:
        raise ValueError("rates must not be empty, got []")
    if any(b <= a for a, b in zip(grid, grid[1:], strict=False)):
        raise ValueError(f"rates must be strictly increasing, got {grid!r}")
    rows = []
    for rate in grid:
        rows.append(_run(frame, replica, rate, opts, lim, goal))
        if progress is not None:
            progress(rows[-1])
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


@dataclass(frozen=True)
class CurveKnee:
    """Where a goodput curve bends: the SLO capacity and the goodput peak."""

    slo_rate: float | None
    """Largest rate meeting the target, linearly interpolated between grid points
    (requests/s); None if every rate on the grid meets it (the knee is further right),
    the first rate if none does."""
    peak_rate: float
    """Grid rate with the highest goodput (requests/s)."""
    peak_goodput: float
    """That goodput (requests/s)."""

    def __str__(self) -> str:
        slo = "beyond the grid" if self.slo_rate is None else f"{self.slo_rate:.4g} req/s"
        return (f"SLO capacity {slo}; goodput peaks at {self.peak_goodput:.4g} req/s "
                f"when offered {self.peak_rate:.4g} req/s")


def curve_knee(curve: pd.DataFrame, target: float = 0.99) -> CurveKnee:
    """Read the knee off a :func:`goodput_curve`: SLO capacity and goodput peak.

    The SLO capacity is where the miss fraction ``1 - attainment`` first crosses
    ``1 - target`` (interpolated); past it, goodput stops tracking the offered rate and
    turns down. The peak is the grid rate of highest goodput (ties: the smallest).
    """
    from .goodput import goodput_knee, slo_capacity

    if not isinstance(curve, pd.DataFrame):
        raise ValueError(f"curve must be a DataFrame from goodput_curve, "
                         f"got {type(curve).__name__}")
    missing = [c for c in ("rate_rps", "attainment", "goodput_rps") if c not in curve.columns]
    if missing:
        raise ValueError(f"curve is missing column(s) {missing}; has {list(curve.columns)}")
    if curve.empty:
        raise ValueError("curve must not be empty")
    goal = _target(target)
    rates = curve["rate_rps"].to_numpy(dtype=float)
    good = curve["goodput_rps"].to_numpy(dtype=float)
    peak = goodput_knee(rates, good)
    attainment = curve["attainment"].to_numpy(dtype=float)
    slo = (None if (attainment >= goal).all()
           else slo_capacity(rates, attainment, min(goal, 1 - 1e-12)))
    return CurveKnee(slo_rate=None if slo is None else float(slo), peak_rate=peak,
                     peak_goodput=float(good[rates == peak][0]))


# --------------------------------------------------------------------------- fleet


@dataclass(frozen=True)
class FleetResult:
    """Smallest replica count meeting the SLO target at one rate, and every count tried."""

    replicas: int
    """Smallest count that meets the target (before spares)."""
    rate: float
    """The arrival rate simulated (requests/s)."""
    evaluations: pd.DataFrame = field(repr=False)
    """One row per replica count tried: ``replicas`` plus the :data:`CURVE_COLUMNS`."""

    def row(self, replicas: int) -> pd.Series | None:
        """The evaluation of a fleet of this size, or None if it was not simulated."""
        rows = self.evaluations.loc[self.evaluations["replicas"] == replicas]
        return None if rows.empty else rows.iloc[-1]

    def __str__(self) -> str:
        return (f"{self.replicas} replica(s) meet the target at {self.rate:.4g} req/s "
                f"({len(self.evaluations)} simulations)")


def smallest_fleet(requests, replica: Replica, rate: float, *, router: str = "least_loaded",
                   policy: str = "fcfs", limits=None, target: float = 0.99, seed=0,
                   start: int | None = None, max_replicas: int = 4096,
                   progress: Callable | None = None) -> FleetResult:
    """Smallest replica count whose simulated SLO attainment at ``rate`` meets ``target``.

    Starts from ``start`` (default: the count :func:`fluid_rate` says is needed), walks
    up by doubling or down by halving the step until the answer is bracketed, then
    bisects; the count one below the answer is always simulated (and misses), so the
    answer is shown to be the smallest. Assumes more replicas never hurt, which holds
    when every count replays the same requests.
    """
    frame = _workload(requests)
    _options(replica, 1, router, policy, seed)
    lim = _limits(limits)
    goal = _target(target)
    lam = _check.positive("rate", rate)
    cap = _check.whole("max_replicas", max_replicas)
    if start is None:
        start = min(cap, max(1, math.ceil(lam / fluid_rate(frame, replica))))
    else:
        start = _check.whole("start", start)
        if start > cap:
            raise ValueError(f"start must be <= max_replicas={cap}, got {start!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be callable or None, got {progress!r}")
    scaled = rescale_to_rate(frame, lam)
    rows: list[dict] = []
    seen: dict[int, bool] = {}

    def meets(n: int) -> bool:
        if n not in seen:
            out = simulate(scaled, replica, replicas=n, router=router, policy=policy, seed=seed)
            row = {"replicas": n, **_summary(out, lam, lim, goal)}
            rows.append(row)
            seen[n] = row["meets"]
            if progress is not None:
                progress(row)
        return seen[n]

    if meets(start):
        good, bad, step = start, 0, 1
        while good - step >= 1:
            if not meets(good - step):
                bad = good - step
                break
            good -= step
            step *= 2
    else:
        bad, step = start, 1
        while True:
            n = min(cap, bad + step)
            if meets(n):
                good = n
                break
            if n == cap:
                raise ValueError(f"max_replicas={cap} replicas still miss the target {goal!r} "
                                 f"at {lam:.4g} req/s (attainment {rows[-1]['attainment']:.4g})")
            bad, step = n, step * 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    table = pd.DataFrame(rows, columns=["replicas", *CURVE_COLUMNS])
    return FleetResult(replicas=good, rate=lam,
                       evaluations=table.sort_values("replicas").reset_index(drop=True))


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Plan:
    """A fleet plan: the closed-form guess, the simulator's answer, and its capacity."""

    rate: float
    """Arrival rate planned for (requests/s)."""
    hold_s: float
    """T_hold used by the closed form (s): see :func:`hold_time`."""
    sizing: FleetSizing
    """Little + square-root staffing + spares (:func:`servingcap.fleet.size_fleet`)."""
    fleet: FleetResult
    """Smallest simulated fleet meeting the target at ``rate`` (spares not included)."""
    spares: int
    """Whole replicas added for failures."""
    capacity: CapacityResult
    """Largest rate the ``fleet.replicas`` serving replicas carry (spares held back)."""

    @property
    def replicas(self) -> int:
        """Replicas to order: the simulator's count plus spares."""
        return self.fleet.replicas + self.spares

    @property
    def at_size(self) -> pd.Series:
        """Evaluation at the simulator's count (p99s, goodput, attainment)."""
        return self.fleet.row(self.fleet.replicas)

    @property
    def below(self) -> pd.Series | None:
        """Evaluation one replica fewer (it misses), or None when the answer is 1."""
        return self.fleet.row(self.fleet.replicas - 1)

    @property
    def headroom(self) -> float:
        """Capacity over planned rate, minus one (0.10 = 10 % growth before it misses)."""
        return self.capacity.rate / self.rate - 1.0

    @property
    def simulations(self) -> int:
        """Simulations run for the plan."""
        return len(self.fleet.evaluations) + len(self.capacity.evaluations)


def plan(requests, replica: Replica, rate: float, *, router: str = "least_loaded",
         policy: str = "fcfs", limits=None, target: float = 0.99, spares: int = 1,
         beta: float = 2.0, seed=0, rtol: float = 0.02,
         progress: Callable | None = None) -> Plan:
    """Size a fleet for ``rate`` and check it by simulation (what ``servingcap plan`` prints).

    1. Closed form: ``size_fleet(rate, hold_time(requests, replica), replica.max_batch,
       beta, spares)``.
    2. Simulation: :func:`smallest_fleet` from the closed form's count (without spares).
    3. Capacity: :func:`capacity_search` on that many replicas, starting from ``rate``
       (which meets), to relative tolerance ``rtol``.
    """
    frame = _workload(requests)
    lam = _check.positive("rate", rate)
    n_spares = _check.whole("spares", spares, minimum=0)
    hold = hold_time(frame, replica)
    sizing = size_fleet(lam, hold, replica.max_batch, beta=beta, spares=n_spares,
                        p=0.99)
    fleet = smallest_fleet(frame, replica, lam, router=router, policy=policy, limits=limits,
                           target=target, seed=seed, start=sizing.replicas_for_slots,
                           max_replicas=max(4096, 4 * sizing.replicas_for_slots),
                           progress=progress)
    # The planned rate meets (the fleet search just showed it). For the top of the bracket
    # try a modest step first: the fleet one replica smaller misses at ``rate``, so the
    # fleet's capacity is rarely far above rate * n / (n - 1); double only if it meets.
    n = fleet.replicas
    opts = _options(replica, n, router, policy, seed)
    lim, goal = _limits(limits), _target(target)
    tol = _check.positive("rtol", rtol)
    if tol >= 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    at_rate = {k: v for k, v in fleet.row(n).items() if k != "replicas"}
    step_up = lam * (1.0 + 1.5 / max(n - 1, 1))
    probe = _run(frame, replica, step_up, opts, lim, goal)
    if progress is not None:
        progress(probe)
    known = {lam: at_rate, step_up: probe}
    if probe["meets"]:
        capacity = _capacity(frame, replica, opts, lim, goal, tol, step_up, None, progress, known)
    else:
        capacity = _capacity(frame, replica, opts, lim, goal, tol, lam, step_up, progress, known)
    return Plan(rate=lam, hold_s=hold, sizing=sizing, fleet=fleet, spares=n_spares,
                capacity=capacity)
