"""Capacity planning as a workload experiment: replay, search, size, with intervals.

The closed forms of :mod:`servingcap.fleet` give a first guess; this module checks it
the way Vidur-Search does, but with the book's simulator, and reports every simulated
answer as an estimate with its interval (:mod:`servingcap.stats`):

- :func:`evaluate` simulates one (rate, fleet) point as independent replications and
  returns SLO attainment with a confidence interval, goodput, p99s, the run length
  after warm-up, the number of replications and a verdict: ``meets`` / ``misses``
  decided sequentially with an indifference zone
  (:func:`servingcap.stats.sequential_check`),
  ``open`` when the replication budget ran out first (never counted as a miss),
  ``unstable`` when the runs have no steady state.
- :func:`capacity_search` brackets the capacity between the largest rate shown to
  *meet* and the smallest shown to *miss* (bisection on decided probes; open probes are
  kept between the two; the fluid throughput bound caps the bracket);
  :func:`goodput_curve` evaluates a grid of rates and :func:`curve_knee` reads it.
- :func:`smallest_fleet` finds the smallest replica count shown to meet (never below
  the fluid bound), with the count below it shown to miss or reported open, and
  :func:`plan` strings the steps together: it is what ``python -m servingcap plan``
  prints.

How a point is simulated (the *design*):

- **Run length.** Each replication simulates ``holds`` hold times (:func:`hold_time`)
  of traffic at the rate, at least ``min_requests`` requests: long enough to fill and
  drain every batch many times, whatever the rate (not a fixed request count).
- **Warm-up.** Every run starts empty; the cut is MSER-5 on the other replications'
  average TTFT series (:func:`servingcap.stats.warmup_cuts`). Only requests after it
  count.
- **Replications and verdicts.** ``min(10, budget)`` replications first (the first
  look), then doubling, up to ``budget``, until the sequential check decides
  (:func:`servingcap.stats.sequential_check`, repeated t-intervals with a Bonferroni
  split of the error across the looks, on one attainment per replication): ``meets`` /
  ``misses`` are wrong with probability at most ``1 - confidence`` when the true
  attainment lies outside ``target +- delta`` (default ``delta`` a quarter of a
  percentage point); a point still undecided at ``budget`` is ``open``. (Batur & Kim's
  fully sequential check, :func:`servingcap.stats.feasibility`, stays open far from
  the target when the replications vary a lot, as they do past a knee.) A single
  replication (``budget=1``, or a :class:`Replay` of a short table) is decided on 10
  batch means of its misses instead. The attainment interval printed is a Student-t
  interval across replications (the requests of one run are correlated); the p99
  interval is sectioning around the pooled p99
  (:func:`servingcap.stats.replicated_quantile_ci`).
- **Common random numbers.** Replication *i* uses the same seed (requests, random
  router) at every fleet size and rate, so sizes and rates are compared on the same
  traffic. A :class:`PoissonWorkload` draws fresh requests per replication; a fixed
  request table (a trace) gives replication *i* a block bootstrap of it drawn from its
  seed (:func:`servingcap.traffic.block_bootstrap`: Politis & Romano's stationary
  bootstrap, contiguous segments of about a minute of the trace with their gaps, so
  bursts and the length mix are kept), rescaled to the rate. The number of
  replications is set by ``budget`` alone, never by the trace's length (a trace
  shorter than a replication is drawn from again: its segments repeat). Wrapped in
  :class:`Replay`, a table is replayed as recorded instead: replication *i* is its
  *i*-th consecutive block, so its length caps the replications.
- **Executors.** The replications of a point run on ``executor`` (see
  :mod:`servingcap.parallel`): the local process pool by default, ``None`` for this
  process, any ``concurrent.futures.Executor`` or a Dask ``distributed.Client``. The
  answer is the same whatever runs it.

Units: rates in requests/s, times in seconds, tokens, replicas.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from . import _check, kvcache, parallel, stats
from .fleet import FleetSizing, size_fleet
from .params import LOCKED
from .routers import DEFAULT_ROUTER
from .serving import Replica, StepDetail, check_fleet, simulate
from .traffic import BOOTSTRAP_SEGMENT_S, block_bootstrap, mean_rate, rescale_to_rate

__all__ = [
    "Lengths", "PoissonWorkload", "Replay", "CapacityResult", "capacity_search", "evaluate",
    "fluid_rate", "hold_time", "slo_floor", "infeasible", "goodput_curve", "CurveKnee", "curve_knee",
    "FleetResult", "smallest_fleet", "Plan", "plan", "CURVE_COLUMNS", "VERDICTS",
    "MAX_REQUESTS_PER_RUN", "FLUID_GUESS_BETA", "PERCENTILES", "LATENCY_METRICS",
]

CURVE_COLUMNS = ("rate_rps", "throughput_rps", "ttft_goodput_rps", "goodput_rps",
                 "goodput_low", "goodput_high", "attainment", "attainment_low",
                 "attainment_high", "ttft_p99_s", "ttft_p99_low", "ttft_p99_high",
                 "tpot_p99_s", "prefix_hit_rate", "replications", "needed", "run_s",
                 "requests", "warmup_s", "verdict", "meets", "backlog_rps",
                 "ttft_p50_s", "ttft_p90_s", "ttft_p999_s", "tpot_p50_s", "tpot_p90_s",
                 "tpot_p999_s", "max_gap_p50_s", "max_gap_p90_s", "max_gap_p99_s",
                 "max_gap_p999_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "e2e_p999_s")
"""Columns of :func:`evaluate`, :func:`goodput_curve` and ``CapacityResult.evaluations``.

Estimates are means over replications; ``*_low`` / ``*_high`` are the ends of their
confidence interval, except for the latencies: ``ttft_p99_s`` and ``tpot_p99_s`` are the
p99 of the kept requests of *all* replications pooled (the companion of the attainment,
which pools them too, so a replication that fails shows in the p99 instead of being
averaged away), and ``ttft_p99_low`` / ``ttft_p99_high`` the ends of a sectioning
interval *around that pooled p99* (:func:`servingcap.stats.replicated_quantile_ci`: the
spread of each replication's p99 about it); NaN when there is one replication or a
replication holds fewer than 1,000 kept requests (too few beyond its p99 for
sectioning). Rates (``throughput_rps``, ``goodput_rps``, ...) count requests
*finishing* (and meeting the limits) inside the kept arrival window, from one hold time
after its start (the batches fill) to its last arrival, per second of it.
``prefix_hit_rate`` is the fraction of the kept requests' prompt tokens served from the
replicas' prefix caches (pooled over replications; NaN without a prefix cache, see
``Replica.prefix_cache_blocks``). ``replications`` are those simulated; ``needed`` is
how many the sequential check is sure to decide by (from the first stage's variance:
compare it with ``replications`` for an ``open`` point). ``run_s`` and ``requests`` are
the simulated seconds and requests per replication *after* warm-up; ``warmup_s`` the seconds deleted;
``verdict`` one of :data:`VERDICTS`; ``meets`` is ``verdict == "meets"``.
``backlog_rps`` is how fast the requests in the system (arrived, not yet finished) grew
over the window the rates are counted in, per second (mean over replications): the
departures in a window are its arrivals minus that growth, so ``throughput_rps`` runs
below the arrival rate by it, and ``goodput_rps`` below attainment x rate, when a
load near the fleet's limit is still filling (no steady occupancy within the run).
The latency percentiles ``{metric}_{p50,p90,p99,p999}_s`` (:data:`PERCENTILES`; ``ttft``,
``tpot``, ``max_gap``: each request's longest gap between two consecutive tokens, the
simulator keeps no other inter-token gap, so its percentiles are of a *worst* ITL per
request; ``e2e``: arrival to last token) pool the kept requests of all replications like
``ttft_p99_s``; a rejected or unfinished request counts as ``inf`` (as in
:mod:`servingcap.slo`), a one-token answer has no TPOT or gap and is left out of those;
NaN when fewer than ``1 / (1 - q)`` requests are pooled (no request lies beyond the
quantile ``q``)."""

PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
"""Latency quantiles of the evaluation rows (name in the column -> quantile)."""
LATENCY_METRICS = ("ttft", "tpot", "max_gap", "e2e")
"""Per-request latencies whose :data:`PERCENTILES` the evaluation rows carry (s)."""

VERDICTS = ("meets", "misses", "open", "unstable")
"""``meets``/``misses``: the sequential check (:func:`servingcap.stats.sequential_check`)
decided the attainment is at/above or below the target, each with error at most
``1 - confidence`` outside ``target +- delta``; ``open``: not decided within the
replication budget (report its interval; it is *not* a miss);
``unstable``: at least half the replications have no steady state
(:func:`servingcap.stats.steady_state` on each run's TTFT series and on its series of
SLO misses), so no attainment is claimed."""

MAX_REQUESTS_PER_RUN = 2_000_000
"""Largest replication simulated (requests): larger runs are refused, not attempted."""

_MAX_BRACKET_STEPS = 40     # halvings allowed while bracketing a capacity (a factor 2^40)
_REFERENCE_REQUESTS = 20_000   # requests drawn from a PoissonWorkload to read its means
_MIN_SERIES = 200           # shorter runs get no warm-up cut, verdict or interval


# --------------------------------------------------------------------------- workloads


_DISTRIBUTIONS = {
    "fixed": ("value",),
    "exponential": ("mean",),
    "lognormal": ("mean", "cv"),
    "gamma": ("mean", "cv"),
    "uniform": ("low", "high"),
}
_CV_RANGE = (1e-3, 100.0)


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: ``fixed`` (value), ``exponential`` (mean),
    ``lognormal`` / ``gamma`` (mean, cv), ``uniform`` (low, high); tokens.

    Samples are rounded to whole tokens >= 1. The coefficient of variation ``cv`` must
    lie in [0.001, 100] (use ``fixed`` for constant lengths).
    """

    kind: str
    params: Mapping

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in _DISTRIBUTIONS:
            raise ValueError(f"kind must be one of {', '.join(_DISTRIBUTIONS)}, got {self.kind!r}")
        keys = _DISTRIBUTIONS[self.kind]
        if not isinstance(self.params, Mapping) or set(self.params) != set(keys):
            raise ValueError(f"params of {self.kind} must be exactly {', '.join(keys)}, "
                             f"got {self.params!r}")
        clean = {}
        for key in keys:
            value = self.params[key]
            clean[key] = (_check.nonnegative(key, value) if key == "low"
                          else _check.positive(key, value))
        if "cv" in clean and not _CV_RANGE[0] <= clean["cv"] <= _CV_RANGE[1]:
            raise ValueError(f"cv must be between {_CV_RANGE[0]:g} and {_CV_RANGE[1]:g} "
                             f"(use fixed for constant lengths), got {clean['cv']!r}")
        if self.kind == "fixed" and (clean["value"] < 1 or not clean["value"].is_integer()):
            raise ValueError(f"value must be a whole number of tokens >= 1, got {clean['value']!r}")
        if self.kind == "uniform" and not clean["low"] < clean["high"]:
            raise ValueError(f"low must be < high, got low={clean['low']!r}, high={clean['high']!r}")
        object.__setattr__(self, "params", clean)

    @property
    def mean(self) -> float:
        """Mean before rounding (tokens)."""
        p = self.params
        return p["value"] if self.kind == "fixed" else (
            0.5 * (p["low"] + p["high"]) if self.kind == "uniform" else p["mean"])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` whole token counts >= 1 (int64) drawn with ``rng``."""
        n = _check.size("n", n, minimum=0)
        rng = _check.generator("rng", rng)
        p = self.params
        if self.kind == "fixed":
            x = np.full(n, p["value"])
        elif self.kind == "exponential":
            x = rng.exponential(p["mean"], n)
        elif self.kind == "lognormal":
            sigma2 = math.log1p(p["cv"] ** 2)
            x = rng.lognormal(math.log(p["mean"]) - sigma2 / 2, math.sqrt(sigma2), n)
        elif self.kind == "gamma":
            shape = 1.0 / p["cv"] ** 2
            x = rng.gamma(shape, p["mean"] / shape, n)
        else:
            x = rng.uniform(p["low"], p["high"], n)
        return np.maximum(1, np.round(x)).astype(np.int64)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.params['value']:g} tokens"
        inner = ", ".join(f"{k} {v:g}" for k, v in self.params.items())
        return f"{self.kind} ({inner}) tokens"


def _lengths(name: str, value) -> Lengths:
    if isinstance(value, Lengths):
        return value
    return Lengths("fixed", {"value": _check.whole(name, value)})


@dataclass(frozen=True)
class PoissonWorkload:
    """Poisson arrivals with independent prompt and output lengths (tokens).

    ``prompt`` and ``output`` are :class:`Lengths` or a whole number of tokens. Each
    replication draws its own requests from its seed; a replication's requests at a
    higher rate are the same draws with the gaps shrunk (common random numbers).
    """

    prompt: Lengths | int
    output: Lengths | int

    def __post_init__(self):
        object.__setattr__(self, "prompt", _lengths("prompt", self.prompt))
        object.__setattr__(self, "output", _lengths("output", self.output))

    def sample(self, rate: float, n: int, seed: np.random.SeedSequence) -> pd.DataFrame:
        """``n`` requests at ``rate`` requests/s drawn from ``seed`` (first arrival after
        one gap): ``arrival_s``, ``prompt_tokens``, ``output_tokens``."""
        rate = _check.positive("rate", rate)
        n = _check.size("n", n, minimum=0)
        if not isinstance(seed, np.random.SeedSequence):
            raise ValueError(f"seed must be a numpy SeedSequence, got {seed!r}")

        def stream(j):
            return np.random.default_rng(np.random.SeedSequence(
                seed.entropy, spawn_key=(*seed.spawn_key, j)))
        gaps = stream(0).exponential(1.0, n)
        with np.errstate(over="ignore"):
            arrival = np.cumsum(gaps) / rate
        if not np.isfinite(arrival).all():
            raise _check.NumericOverflowError(
                f"rate={rate!r} req/s spreads {n} arrivals past floating point; use a "
                "larger rate")
        return pd.DataFrame({"arrival_s": arrival,
                             "prompt_tokens": self.prompt.sample(n, stream(1)),
                             "output_tokens": self.output.sample(n, stream(2))})

    def __str__(self) -> str:
        return f"Poisson arrivals; prompts {self.prompt}; outputs {self.output}"


class _Trace:
    """A fixed request table; replication i is a block bootstrap of it, rescaled.

    Each replication draws ``n`` rows with :func:`servingcap.traffic.block_bootstrap`
    (Politis & Romano's stationary bootstrap: contiguous segments of about
    :data:`~servingcap.traffic.BOOTSTRAP_SEGMENT_S` seconds of the trace, gaps kept
    inside them) from its own seed, then :func:`servingcap.traffic.rescale_to_rate`
    sets the rate. The same seed gives the same rows at every fleet size, and a longer
    run at a higher rate extends a shorter one (common random numbers). The number of
    replications is limited by the budget alone, not by the trace's length."""

    def __init__(self, frame: pd.DataFrame):
        order = np.argsort(frame["arrival_s"].to_numpy(dtype=float), kind="stable")
        self.frame = frame.iloc[order]      # in time order: segments are time-contiguous

    @property
    def segment_rows(self) -> float:
        """Mean segment length of the bootstrap (rows of the trace)."""
        return max(1.0, BOOTSTRAP_SEGMENT_S * mean_rate(self.frame))

    def sample(self, rate: float, n: int, seed: np.random.SeedSequence) -> pd.DataFrame:
        rng = np.random.default_rng(np.random.SeedSequence(
            seed.entropy, spawn_key=(*seed.spawn_key, 4)))
        block = block_bootstrap(self.frame, n, rng)
        if n < 2 or not block["arrival_s"].iloc[-1] > 0:
            return block        # no gap to rescale (all drawn gaps zero): as drawn
        return rescale_to_rate(block, rate)


@dataclass(frozen=True, eq=False)
class Replay:
    """A request table replayed as recorded rather than resampled (opt-in).

    The table is cut into ``k = max(1, len(table) // n)`` consecutive blocks of equal
    size (``n`` from ``holds`` and ``min_requests``), so every row is replayed and each
    block holds at least ``n`` rows unless the whole table is shorter; replication *i*
    is block *i*, rescaled to the rate. So a table holds at most ``k`` replications
    whatever the budget, and a table shorter than two runs is replayed whole as one
    replication, decided on batch means within it. Use it to ask about one stretch of
    traffic exactly (a recorded bad hour, a slice, a bad day injected into one); for a
    capacity answer pass the table itself, whose replications are block bootstraps
    (:func:`servingcap.traffic.block_bootstrap`) limited by the budget alone.

    A replay is a finite scenario, not a sample of a steady state, so two rules of the
    synthetic sources do not apply: its verdict is decided on attainment alone (a
    trend along a recorded or injected bad minute is the scenario, not a run-length
    artefact, so no point is called ``unstable``), and its warm-up cut is at most the
    requests arriving in the first hold time of a block (the empty fleet filling; a
    burst at the start of the recording is traffic, and MSER-5 would delete it).
    ``requests``: a table as :func:`evaluate` takes."""

    requests: pd.DataFrame

    def __post_init__(self):
        _workload(self.requests)


class _Replay:
    """Replication i is the i-th block of n rows of a table, rescaled (see Replay)."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame

    def blocks(self, n: int) -> int:
        return max(1, len(self.frame) // n)

    def sample(self, rate: float, n: int, index: int) -> pd.DataFrame:
        k, rows = self.blocks(n), len(self.frame)      # k equal blocks cover every row
        block = self.frame.iloc[index * rows // k:(index + 1) * rows // k]
        block = rescale_to_rate(block, rate)
        return block.assign(arrival_s=block["arrival_s"] - block["arrival_s"].iloc[0])


def _source(requests):
    """(source, reference table for means) from a request table, a Replay or a
    PoissonWorkload."""
    if isinstance(requests, PoissonWorkload):
        ref = requests.sample(1.0, _REFERENCE_REQUESTS, np.random.SeedSequence(0))
        return requests, ref
    if isinstance(requests, Replay):
        return _Replay(requests.requests), requests.requests
    frame = _workload(requests)
    return _Trace(frame), frame


def _workload(requests) -> pd.DataFrame:
    _check.requests(requests, minimum=2)  # a rate needs at least one gap
    _check.request_tokens(requests)
    mean_rate(requests)     # raises if every arrival is at the same instant
    return requests


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
        if limit is not True and column not in _LIMIT_COLUMNS:
            raise ValueError(f"limits key {column!r} is not a latency column of the "
                             f"simulation; allowed: {', '.join(_LIMIT_COLUMNS)}")
        clean[column] = True if limit is True else _check.positive(f"limits[{column!r}]", limit)
    return clean


_LIMIT_COLUMNS = ("ttft_s", "tpot_s", "max_gap_s", "e2e_s")
"""Latency columns of :func:`servingcap.serving.simulate` a ``limits`` entry may bound (s)."""


def _seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return int(seed)


MIN_RTOL = 1e-6
"""Smallest relative tolerance of a capacity search (each halving costs simulations)."""
MIN_RATE = 1e-9
"""Smallest search bound (req/s): one request in about 30 years."""
MAX_FLEET = 10**6
"""Most replicas one simulated fleet may have: far past any fleet (the engine keeps state
per replica, so a typo such as 10**12 would never finish)."""


def _rtol(rtol) -> float:
    tol = _check.positive("rtol", rtol)
    if not MIN_RTOL <= tol < 1:
        raise ValueError(f"rtol must be in [{MIN_RTOL:g}, 1), got {rtol!r}")
    return tol


def _rate_bound(name: str, value) -> float:
    rate = _check.positive(name, value)
    if rate < MIN_RATE:
        raise ValueError(f"{name} must be >= {MIN_RATE:g} req/s, got {value!r}")
    return rate


def _fleet_size(replicas: int) -> int:
    if replicas > MAX_FLEET:
        raise ValueError(f"replicas must be <= {MAX_FLEET:.0e}, got {replicas!r}")
    return replicas


def _target(target) -> float:
    value = _check.number("target", target)
    if not 0 < value <= 1:
        raise ValueError(f"target must be in (0, 1], got {target!r}")
    return value


@dataclass(frozen=True)
class _Design:
    """How each point is simulated (validated once per call)."""

    confidence: float
    budget: int
    holds: float
    min_requests: int
    seed: int
    executor: object
    delta: float = stats.INDIFFERENCE

    @property
    def alpha(self) -> float:
        """Error probability of a meets/misses verdict outside the indifference zone."""
        return 1.0 - self.confidence

    def first(self, available: int) -> int:
        """First-stage replications of the sequential check at a point."""
        return min(stats.FIRST_STAGE, available)


def _design(confidence, budget, holds, min_requests, seed, executor,
            delta=stats.INDIFFERENCE) -> _Design:
    conf = _check.probability("confidence", confidence)
    if conf <= 0.5:
        raise ValueError(f"confidence must be > 0.5 (a verdict's error 1 - confidence must "
                         f"be below a coin's), got {confidence!r}")
    parallel.resolve(executor)              # raises ValueError naming executor
    least = _check.whole("min_requests", min_requests, minimum=100)
    if least > MAX_REQUESTS_PER_RUN:
        raise ValueError(f"min_requests must be <= {MAX_REQUESTS_PER_RUN:,} (the most one "
                         f"replication simulates), got {min_requests!r}")
    zone = _check.positive("delta", delta)
    if zone >= 0.5:
        raise ValueError(f"delta must be < 0.5 (a half-width of attainment, a fraction), "
                         f"got {delta!r}")
    return _Design(confidence=conf, budget=_check.size("budget", budget),
                   holds=_check.positive("holds", holds), min_requests=least,
                   seed=_seed(seed), executor=executor, delta=zone)


@dataclass(frozen=True)
class _Setup:
    """Everything fixed across the points of one search."""

    source: object
    ref: pd.DataFrame
    replica: Replica
    router: str
    policy: str
    limits: dict
    target: float
    design: _Design
    hold_s: float
    activity: Callable | None = None     # on_replication: called after each replication


def _setup(requests, replica, router, policy, limits, target, design) -> _Setup:
    source, ref = _source(requests)
    check_fleet(replica, 1, router, policy)
    return _Setup(source=source, ref=ref, replica=replica, router=router, policy=policy,
                  limits=_limits(limits), target=_target(target), design=design,
                  hold_s=_hold(ref, replica))


def _progress(progress, name: str = "progress"):
    if progress is not None and not callable(progress):
        raise ValueError(f"{name} must be callable or None, got {progress!r}")
    return progress


def _watched(s: _Setup, on_replication) -> _Setup:
    """``s`` reporting each replication to ``on_replication`` (validated; see
    :func:`evaluate`)."""
    return dataclasses.replace(s, activity=_progress(on_replication, "on_replication"))


# --------------------------------------------------------------------------- fluid


def _mean_tokens(frame: pd.DataFrame) -> tuple[float, float]:
    return float(frame["prompt_tokens"].mean()), float(frame["output_tokens"].mean())


def _step_cost(replica: Replica, prefill: float, decode_batch: int, context: float,
               cached: float = 0.0) -> float:
    chunks = np.array([prefill]) if prefill > 0 else np.array([], dtype=float)
    detail = StepDetail(prefill_chunks=chunks, prefill_cached=np.full(chunks.size, cached),
                        decode_context=np.full(decode_batch, context))
    return replica.cost(detail)


def _replica(replica) -> Replica:
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    return replica


def _hold(frame: pd.DataFrame, replica: Replica) -> float:
    prompt, output = _mean_tokens(frame)
    prefill = _step_cost(replica, prompt, 0, 0.0)
    step = _step_cost(replica, 0.0, replica.max_batch, prompt + output / 2)
    return prefill + output * step


def hold_time(requests, replica: Replica) -> float:
    """T_hold (s): how long a mean request holds a batch slot when the batch is full.

    Prefill of the mean prompt plus the mean output's decode steps at ``max_batch``
    sequences, from the replica's own cost model. With the book's locked numbers:
    2,000 / 8,000 + 300 x 0.030 = 9.25 s. ``requests`` is a request table or a
    :class:`PoissonWorkload` (its means are read off 20,000 draws).
    """
    _, ref = _source(requests)
    return _hold(ref, _replica(replica))


def _uncached_prompts(frame: pd.DataFrame, replica: Replica) -> np.ndarray:
    """Prompt tokens each request must prefill at the least (tokens): with a prefix cache
    (``replica.prefix_cache_blocks`` and a ``hash_ids`` column), the prompt minus what an
    *unbounded* cache shared by the whole fleet would serve (:func:`servingcap.kvcache.
    prefix_hits` in arrival order). Per-replica LRU caches of finite size hit no more
    often, so bounds built on these tokens stay bounds."""
    prompts = frame["prompt_tokens"].to_numpy(dtype=np.int64)
    if not replica.prefix_cache_blocks or "hash_ids" not in frame.columns:
        return prompts
    order = np.argsort(frame["arrival_s"].to_numpy(), kind="stable")
    ids = frame["hash_ids"].tolist()
    hits = np.empty(len(ids), dtype=np.int64)
    hits[order] = kvcache.prefix_hits([ids[i] for i in order])
    saved = kvcache.saved_prefill_tokens(hits, prompts, replica.prefix_block_tokens)
    return prompts - saved


def _fluid(frame: pd.DataFrame, replica: Replica, replicas: int) -> float:
    prompt, output = _mean_tokens(frame)
    prompt = float(_uncached_prompts(frame, replica).mean())
    if replica.step_time is None:            # the built-in cost's own (fused: lower) bound
        return replicas / float(replica.full_batch_work_s(prompt, output))
    bound = getattr(replica.step_time, "fluid_work_s", None)
    if callable(bound):                      # a cost model's own lower bound (roofline)
        return replicas / float(bound(frame["prompt_tokens"].to_numpy(dtype=float),
                                      frame["output_tokens"].to_numpy(dtype=float),
                                      replica.max_batch,
                                      _uncached_prompts(frame, replica).astype(float)))
    prefill = _step_cost(replica, prompt, 0, 0.0)
    step = _step_cost(replica, 0.0, replica.max_batch, prompt + output / 2)
    per_request = prefill + max(output - 1.0, 0.0) * step / replica.max_batch
    return replicas / per_request


def fluid_rate(requests, replica: Replica, replicas: int = 1) -> float:
    """Fluid throughput bound (requests/s): GPU time per request at a full batch.

    Each request costs its prefill plus ``output_tokens - 1`` decode steps shared with
    ``max_batch - 1`` others, so a replica completes ``1 / (prefill + (N - 1) * step /
    max_batch)`` requests per second when it is never idle. Queueing and SLOs are
    ignored: no fleet carries more, so a fleet whose bound is below the arrival rate is
    overloaded and is never simulated or recommended. With a prefix cache
    (``replica.prefix_cache_blocks`` and a ``hash_ids`` column) each prompt counts only
    the tokens an unbounded fleet-wide cache would not serve, so it stays a bound.

    That work is a true lower bound -- so the rate a true upper bound, in every mode --
    for the built-in cost (:meth:`~servingcap.serving.Replica.full_batch_work_s`) and for
    a ``step_time`` that states its own bound as a method ``fluid_work_s(prompt_tokens,
    output_tokens, max_batch, uncached_tokens)`` (seconds per request, as
    :meth:`servingcap.roofline.Roofline.fluid_work_s`: a fused step shares one weight
    read among the prefill chunks and the decodes it carries, which the prefill-step
    estimate above does not see). For any other ``step_time`` the estimate above is
    used: a bound when a step's prefill and decode costs add up (nothing shared), an
    estimate otherwise.
    """
    _, ref = _source(requests)
    return _fluid(ref, _replica(replica), _check.whole("replicas", replicas))


def _fluid_min(ref, replica, rate) -> int:
    """Fewest replicas whose fluid bound exceeds ``rate``."""
    with _check.overflow(f"rate={rate!r} req/s over one replica's fluid bound"):
        return math.floor(rate / _fluid(ref, replica, 1)) + 1


FLUID_GUESS_BETA = 0.14
"""Headroom of :func:`plan`'s first simulated size over the fluid bound, in square roots
of the busy replicas ``a``: the book's workload (2,000/300 tokens, the default replica and
router) needed 16, 144 and 479 replicas at 30, 300 and 1,000 req/s (the README's plan at
30 req/s on 2026-12-03; the others measured on 2026-12-02) against fluid loads of 14.2,
142.2 and 474.2, so ``ceil(a + 0.14 sqrt(a))`` (15, 144 and 478) lands on the answer or
the size below it. Starting there rather than at the bound saved five of seven simulated points at
1,000 req/s; the search checks both sides, so the answer does not depend on it."""


def _seconds(limit) -> bool:
    """True for a numeric limit (seconds), False for None or a boolean column flag."""
    return isinstance(limit, float)


_EXACT_CHUNKS = 1_000       # idle prefill is summed chunk by chunk up to this many chunks


def _idle_prefill(replica: Replica, prompt: int) -> float:
    """Seconds to prefill ``prompt`` tokens alone on ``replica``, chunk by chunk.

    The built-in cost is summed by ``Replica.idle_prefill_s`` (additive: ``prompt /
    prefill_rate`` however it is chunked; fused: each chunk at least one weight read),
    in the mode's chunks (``Replica.idle_chunk_tokens``). A custom ``step_time`` is summed
    exactly (each chunk at its cached context) up to 1,000 chunks; beyond that the full
    chunks are costed at an evenly spaced sample of 1,000 positions (bounded time).
    """
    if replica.step_time is None:
        return float(replica.idle_prefill_s(prompt))
    chunk = min(replica.idle_chunk_tokens, prompt)
    full, rest = divmod(prompt, chunk)
    weight = 1.0
    if full > _EXACT_CHUNKS:
        weight = full / _EXACT_CHUNKS
        starts = np.linspace(0, full - 1, _EXACT_CHUNKS).astype(np.int64) * chunk
    else:
        starts = np.arange(full, dtype=np.int64) * chunk
    total = weight * sum(_step_cost(replica, chunk, 0, 0.0, cached=float(a))
                         for a in starts.tolist())
    if rest:
        total += _step_cost(replica, rest, 0, 0.0, cached=float(full * chunk))
    return total


def slo_floor(requests, replica: Replica, limits=None) -> pd.DataFrame:
    """Each request's latency on an idle replica: the floor no fleet size can lower.

    Returns one row per request (of the table, or of 20,000 draws of a
    :class:`PoissonWorkload`): ``prompt_tokens`` (what must be prefilled: with a prefix
    cache, the prompt less what an unbounded fleet-wide cache would serve), ``ttft_s``
    (prefill alone, chunk by chunk with chunked prefill), ``tpot_s`` (one decode step
    with the batch to itself) and ``meets``
    (within ``limits``; only ``ttft_s`` and ``tpot_s`` limits are checked here).
    """
    _, ref = _source(requests)
    rep = _replica(replica)
    lim = _limits(limits)
    prompts = _uncached_prompts(ref, rep)
    outputs = ref["output_tokens"].to_numpy(dtype=np.int64)
    idle = {p: _idle_prefill(rep, p) for p in np.unique(prompts).tolist()}
    ttft = np.array([idle[p] for p in prompts.tolist()])
    alone = {p: _step_cost(rep, 0.0, 1, float(p)) for p in np.unique(prompts).tolist()}
    tpot = np.array([alone[p] if o > 1 else 0.0
                     for p, o in zip(prompts.tolist(), outputs.tolist(), strict=True)])
    meets = np.ones(len(ref), dtype=bool)
    if _seconds(lim.get("ttft_s")):
        meets &= ttft <= lim["ttft_s"]
    if _seconds(lim.get("tpot_s")):
        meets &= (outputs <= 1) | (tpot <= lim["tpot_s"])
    return pd.DataFrame({"prompt_tokens": prompts, "ttft_s": ttft, "tpot_s": tpot,
                         "meets": meets})


def infeasible(requests, replica: Replica, limits=None, target: float = 0.99
               ) -> tuple[str, str] | None:
    """Why no fleet size can meet ``target``, or None if an idle replica can.

    Checked from :func:`slo_floor` without simulating: when more than ``1 - target`` of
    the requests miss the limits even alone on a replica, adding replicas cannot help.
    Returns ``(column, reason)``: the limit's column (``"ttft_s"``, ``"tpot_s"`` or
    ``""`` for the two together) and a one-line reason, e.g. ``"p99 prompt (9790
    tokens) needs 1.22 s of prefill on an idle replica > TTFT limit 1 s"``.
    """
    goal = _target(target)
    lim = _limits(limits)
    floor = slo_floor(requests, replica, lim)
    miss = 1.0 - float(floor["meets"].mean())
    if miss <= 1.0 - goal:
        return None
    q = f"p{100 * goal:g}"
    ttft_lim, tpot_lim = lim.get("ttft_s"), lim.get("tpot_s")
    if _seconds(ttft_lim) and (floor["ttft_s"] > ttft_lim).mean() > 1 - goal:
        need = float(np.quantile(floor["ttft_s"], goal, method="inverted_cdf"))
        tokens = float(np.quantile(floor["prompt_tokens"], goal, method="inverted_cdf"))
        return "ttft_s", (f"{q} prompt ({tokens:.0f} tokens) needs {need:.3g} s of prefill "
                          f"on an idle replica > TTFT limit {ttft_lim:g} s")
    if _seconds(tpot_lim) and (floor["tpot_s"] > tpot_lim).mean() > 1 - goal:
        step = float(np.quantile(floor["tpot_s"], goal, method="inverted_cdf"))
        return "tpot_s", (f"a decode step alone takes {step:.3g} s > TPOT limit "
                          f"{tpot_lim:g} s")
    return "", (f"{miss:.2%} of requests miss the limits on an idle replica, more than "
                f"the {1 - goal:.2%} the target allows")


def _check_feasible(s: _Setup) -> None:
    """Raise (before any simulation) when idle-replica latency already misses the target."""
    found = infeasible(s.ref, s.replica, s.limits, s.target)
    if found is not None:
        raise ValueError(f"no fleet can meet the target {s.target:g}: {found[1]}")


# --------------------------------------------------------------------------- one point


class _ReplicaSpec:
    """A picklable recipe for a Replica (its init fields), rebuilt in the worker."""

    def __init__(self, replica: Replica):
        self.kwargs = {f.name: getattr(replica, f.name) for f in fields(replica) if f.init}

    def build(self) -> Replica:
        return Replica(**self.kwargs)


def _run_one(task) -> dict:
    """One replication (module level, so process pools and Dask can run it)."""
    source, spec, rate, n, index, seed, replicas, router, policy, limits = task
    frame = source.sample(rate, n, index if isinstance(source, _Replay) else seed)
    router_seed = int(np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, 3))
                      .generate_state(1)[0])
    replica = spec.build() if isinstance(spec, _ReplicaSpec) else spec
    out = simulate(frame, replica, replicas=replicas, router=router, policy=policy,
                   seed=router_seed)
    order = np.argsort(out["arrival_s"].to_numpy(), kind="stable")
    out = out.iloc[order]
    done = (out["outcome"] == "done").to_numpy()
    ttft = out["ttft_s"].to_numpy(dtype=float)
    ok_ttft = done.copy()
    ok_all = done.copy()
    for column, limit in limits.items():
        values = out[column].to_numpy(dtype=float)
        within = np.isnan(values) | (values <= limit) if limit is not True else values.astype(bool)
        if column == "ttft_s":
            ok_ttft &= within
        ok_all &= within
    return {"arrival": out["arrival_s"].to_numpy(dtype=float),
            "finish": out["finish_s"].to_numpy(dtype=float),
            "ttft": np.where(done, ttft, np.inf),
            "tpot": np.where(done, out["tpot_s"].to_numpy(dtype=float), np.inf),
            "max_gap": np.where(done, out["max_gap_s"].to_numpy(dtype=float), np.inf),
            "e2e": np.where(done, out["e2e_s"].to_numpy(dtype=float), np.inf),
            "ok": ok_all, "ok_ttft": ok_ttft,
            "cached": out["cached_tokens"].to_numpy(dtype=float),
            "prompt": out["prompt_tokens"].to_numpy(dtype=float)}


def _p99(values: np.ndarray) -> float:
    finite = values[~np.isnan(values)]
    return float(np.quantile(finite, 0.99, method="inverted_cdf")) if finite.size else math.nan


def _quantile(values: np.ndarray, q: float) -> float:
    """Inverted-CDF quantile of the non-NaN values (inf counts); NaN with fewer than
    ``1 / (1 - q)`` of them (no value would lie beyond the quantile)."""
    finite = values[~np.isnan(values)]
    if finite.size == 0 or finite.size * (1.0 - q) < 1.0 - 1e-9:
        return math.nan
    return float(np.quantile(finite, q, method="inverted_cdf"))


def _percentiles(runs: list[dict], kept: list[int]) -> dict:
    """The :data:`PERCENTILES` of each :data:`LATENCY_METRICS` over the kept requests of
    all replications pooled (s), without the p99 of TTFT and TPOT (already columns)."""
    row = {}
    for metric in LATENCY_METRICS:
        pooled = np.concatenate([r[metric][c:] for r, c in zip(runs, kept, strict=True)])
        for name, q in PERCENTILES.items():
            column = f"{metric}_{name}_s"
            if column not in ("ttft_p99_s", "tpot_p99_s"):
                row[column] = _quantile(pooled, q)
    return row


def _signal(run: dict) -> np.ndarray:
    """TTFT in arrival order with failures at the run's worst finite TTFT (for MSER)."""
    t = run["ttft"]
    finite = t[np.isfinite(t)]
    return np.where(np.isfinite(t), t, finite.max() if finite.size else 0.0)


def _steady(run: dict, s: _Setup) -> bool:
    """Steady-state verdict of one replication on two signals: TTFT (movement measured
    against the TTFT limit, or the mean TTFT without one) and the per-request miss
    indicator (movement measured against the miss fraction the target allows). A
    synchronizing router shows as misses that keep rising along the run; an overloaded
    fleet as TTFT that keeps rising."""
    limit = s.limits.get("ttft_s")
    ttft = stats.steady_state(_signal(run), scale=limit if _seconds(limit) else None)
    allowed = max(1.0 - s.target, 1e-3)
    misses = stats.steady_state((~run["ok"]).astype(float), scale=allowed)
    return ttft.steady and misses.steady


def _interval(values, confidence) -> stats.Estimate:
    finite = np.asarray(values, dtype=float)
    if not np.isfinite(finite).all():
        v = float(np.mean(finite))
        return stats.Estimate(v, v, v, confidence, finite.size, "not finite")
    if finite.size < 2:        # an interval needs two independent replications: NaN ends
        return stats.Estimate(float(finite.mean()), math.nan, math.nan, confidence,
                              finite.size, "one replication: no interval (needs 2 or more)")
    return stats.mean_ci(finite, confidence)


def _pooled_interval(parts: list[np.ndarray], confidence: float) -> tuple[float, float]:
    """Sectioning interval around the pooled p99 (NaN, NaN when not computable)."""
    if len(parts) < 2 or min(p.size for p in parts) * 0.01 < stats.MIN_TAIL:
        return math.nan, math.nan
    ci = stats.replicated_quantile_ci(parts, 0.99, confidence)
    return ci.low, ci.high


def _summarize(runs: list[dict], s: _Setup, rate: float, stage: int, cap: int) -> dict:
    """The evaluation row from replications (warm-up cut, intervals, verdict); ``stage``
    and ``cap`` are the first and last looks of the sequential check, fixed before any
    replication ran."""
    conf = s.design.confidence
    short = min(r["arrival"].size for r in runs) < _MIN_SERIES
    cuts = [0] * len(runs) if short else stats.warmup_cuts([_signal(r) for r in runs])
    replay = isinstance(s.source, _Replay)
    if replay:      # only the empty fleet's fill is warm-up: at most one hold time
        cuts = [min(c, int(np.searchsorted(r["arrival"], r["arrival"][0] + s.hold_s)))
                for r, c in zip(runs, cuts, strict=True)]
    per = []
    for run, cut in zip(runs, cuts, strict=True):
        cut = min(cut, run["arrival"].size - 2)
        start, end = run["arrival"][cut], run["arrival"][-1]
        # departures in the kept arrival window, from one p99 sojourn (at least one hold
        # time) after its start: the batches fill (a run starts empty) and a request
        # leaving then arrived inside the run, so in steady state departures match
        # arrivals (from one hold time alone, a run with no warm-up cut undercounts by
        # the part of the sojourn past a hold time); an overloaded run cannot count
        # more than it served
        e2e = run["e2e"][cut:]
        e2e = e2e[np.isfinite(e2e)]
        settle = max(s.hold_s, _p99(e2e) if e2e.size else 0.0)
        first = start + settle if end - start > 2 * settle else start
        span = max(end - first, 1e-12)
        out = np.nan_to_num(run["finish"], nan=np.inf)
        inside = (out >= first) & (out <= end) & np.isfinite(run["ttft"])
        # requests in the system (arrived, not finished) at the ends of that window
        held = [np.searchsorted(run["arrival"], t, side="right") - int((out <= t).sum())
                for t in (first, end)]
        ok = run["ok"][cut:]
        per.append({"attainment": float(ok.mean()),
                    "goodput": float((run["ok"] & inside).sum()) / span,
                    "ttft_goodput": float((run["ok_ttft"] & inside).sum()) / span,
                    "throughput": float(inside.sum()) / span,
                    "backlog": float(held[1] - held[0]) / span,
                    "ttft_p99": _p99(run["ttft"][cut:]),
                    "run_s": float(run["arrival"][-1] - start), "requests": ok.size,
                    "warmup_s": float(start - run["arrival"][0]),
                    "steady": short or replay or _steady(run, s)})
    table = pd.DataFrame(per)
    kept = [min(c, r["arrival"].size - 2) for r, c in zip(runs, cuts, strict=True)]
    ttft_parts = [r["ttft"][c:] for r, c in zip(runs, kept, strict=True)]
    pooled_ttft = _p99(np.concatenate(ttft_parts))
    pooled_tpot = _p99(np.concatenate([r["tpot"][c:] for r, c in zip(runs, kept,
                                                                     strict=True)]))
    ttft_low, ttft_high = _pooled_interval(ttft_parts, conf)
    hit_rate = math.nan
    if s.replica.prefix_cache_blocks:
        cached = sum(float(r["cached"][c:].sum()) for r, c in zip(runs, kept, strict=True))
        prompt = sum(float(r["prompt"][c:].sum()) for r, c in zip(runs, kept, strict=True))
        hit_rate = cached / prompt
    design = s.design
    if len(runs) >= 2 or short:
        units = table["attainment"].to_numpy(dtype=float)
    else:
        # one replication (budget=1, or a short Replay): its misses in 10 consecutive batches are the
        # units (batch means), all in at once, so the first stage is all of them
        ok = runs[0]["ok"][kept[0]:].astype(float)
        size = ok.size // 10
        units = (ok[ok.size - 10 * size:].reshape(10, size).mean(axis=1) if size
                 else np.array([ok.mean()]))
        stage = cap = 10
    stage = max(stage, 2)
    decision = stats.sequential_check(units, s.target, cap=max(cap, stage),
                                      delta=design.delta, alpha=design.alpha, first=stage,
                                      confidence=conf)
    attain = decision.estimate
    good = _interval(table["goodput"], conf)
    unstable = (~table["steady"]).sum() * 2 >= len(runs)
    verdict = "unstable" if unstable else decision.verdict
    return {"rate_rps": rate, "throughput_rps": float(table["throughput"].mean()),
            "ttft_goodput_rps": float(table["ttft_goodput"].mean()),
            "goodput_rps": good.value, "goodput_low": good.low, "goodput_high": good.high,
            "attainment": attain.value, "attainment_low": max(attain.low, 0.0),
            "attainment_high": min(attain.high, 1.0), "ttft_p99_s": pooled_ttft,
            "ttft_p99_low": ttft_low, "ttft_p99_high": ttft_high,
            "tpot_p99_s": pooled_tpot, "prefix_hit_rate": hit_rate,
            "replications": len(runs),
            "needed": int(decision.needed),
            "run_s": float(table["run_s"].mean()), "requests": float(table["requests"].mean()),
            "warmup_s": float(table["warmup_s"].mean()), "verdict": verdict,
            "meets": verdict == "meets", "backlog_rps": float(table["backlog"].mean()),
            **_percentiles(runs, kept)}


def _run_length(s: _Setup, rate: float) -> int:
    """Requests per replication: ``holds`` hold times at ``rate``, >= ``min_requests``."""
    span = rate * s.design.holds * s.hold_s
    n = s.design.min_requests if not span < MAX_REQUESTS_PER_RUN else max(
        s.design.min_requests, math.ceil(span))
    if not span < MAX_REQUESTS_PER_RUN or n > MAX_REQUESTS_PER_RUN:
        shown = f"{max(n, span):,.0f}" if max(n, span) < 1e15 else f"{max(n, span):.3g}"
        raise ValueError(
            f"rate {rate:.4g} req/s needs {shown} requests per replication "
            f"(holds={s.design.holds:g} hold times of {s.hold_s:.3g} s, at least "
            f"min_requests={s.design.min_requests:,}), above the limit of "
            f"{MAX_REQUESTS_PER_RUN:,}; plan for a lower rate (a fleet is linear in the rate "
            "well past the knee)")
    return n


def _point(s: _Setup, rate: float, replicas: int) -> dict:
    """Evaluate (rate, replicas): replications until the sequential check decides, the
    runs are unstable, or the budget runs out (then ``open``).

    The looks of :func:`servingcap.stats.sequential_check` are fixed before the first
    replication: ``min(10, budget)``, then doubling, then ``budget`` (for a trace too:
    its replications are block bootstraps, as many as asked); each look's replications
    run at once (in parallel)."""
    n = _run_length(s, rate)
    design = s.design
    available = design.budget
    if isinstance(s.source, _Replay):       # as recorded: the table's blocks at most
        available = min(available, s.source.blocks(n))
        n = min(n, len(s.source.frame))
    seeds = stats.replication_seeds(design.seed, design.budget)
    spec = _ReplicaSpec(s.replica)
    runs: list[dict] = []
    first = design.first(available)
    looks = stats.look_schedule(first, available) if first >= 2 else [available]
    met: list[float] = []                   # each replication's attainment, no warm-up cut

    def report(index: int, run: dict) -> None:
        met.append(float(run["ok"].mean()))
        s.activity({"replicas": replicas, "rate_rps": rate, "done": len(met),
                    "total": available, "attainment": float(np.mean(met))})

    for want in looks:
        tasks = [(s.source, spec, rate, n, i, seeds[i], replicas, s.router, s.policy, s.limits)
                 for i in range(len(runs), want)]
        runs += parallel.run_all(_run_one, tasks, design.executor,
                                 on_result=None if s.activity is None else report)
        row = _summarize(runs, s, rate, first, available)
        if row["verdict"] != "open":
            break
    return row


def evaluate(requests, replica: Replica, rate: float, *, replicas: int = 1,
             router: str = DEFAULT_ROUTER, policy: str = "fcfs", limits=None,
             target: float = 0.99, seed=0, confidence: float = 0.95, budget: int = 16,
             delta: float = stats.INDIFFERENCE, holds: float = 20.0,
             min_requests: int = 2000, executor=parallel.AUTO,
             on_replication: Callable | None = None) -> dict:
    """Simulate ``requests`` at ``rate`` on ``replicas`` replicas, as replications.

    Parameters
    ----------
    requests : pandas.DataFrame or PoissonWorkload
        A request table (``arrival_s`` (s), ``prompt_tokens``, ``output_tokens``; at least
        two rows, sorted by arrival), or a workload to draw from. Replication *i* of a
        table is its block bootstrap (:func:`servingcap.traffic.block_bootstrap`, from
        the replication's seed: contiguous segments of about a minute of the table, gaps
        kept, any other column such as ``hash_ids`` carried), rescaled to ``rate``; a
        table shorter than one replication is drawn from again. A :class:`Replay` of a
        table replays its consecutive blocks as recorded instead (at most
        ``len // n`` replications).
    replica : Replica
        The replica model (its cost model and scheduling mode).
    replicas, router, policy
        Passed to :func:`servingcap.serving.simulate` (any router or policy it knows).
    limits : mapping, optional
        Output column -> limit (s) each request must meet (default: the locked
        ``{"ttft_s": 1.0, "tpot_s": 0.05}``); failures always miss.
    target : float
        Attainment to reach, in (0, 1].
    seed : int
        Root of the replications' seeds (:func:`servingcap.stats.replication_seeds`).
    confidence : float
        Level of every interval, in (0.5, 1); ``1 - confidence`` is also the error
        probability of a meets/misses verdict outside the indifference zone.
    budget : int
        Most replications at the point, >= 1 (the sequential check's cap: a point not
        decided by then is ``open``).
    delta : float
        Half-width of the indifference zone around ``target`` (attainment, a fraction;
        default 0.0025, a quarter of a percentage point): a true attainment inside
        ``target +- delta`` may get either verdict.
    holds : float
        Simulated span per replication, in hold times (:func:`hold_time`).
    min_requests : int
        Fewest requests per replication (>= 100), for low rates.
    executor
        Runs the replications: ``"auto"``, ``None``, an Executor or a Dask Client.
    on_replication : callable, optional
        Called in this process after each replication, in order, as
        ``on_replication(event)``: ``event`` a dict with ``replicas`` and ``rate_rps`` (the
        point), ``done`` (replications run at the point so far, from 1), ``total`` (the
        most the point may run: ``budget``, or the blocks of a :class:`Replay`) and
        ``attainment`` (the mean SLO attainment of those replications, a fraction,
        before the warm-up cut the verdict makes). A progress report inside a point.

    Returns
    -------
    dict
        The :data:`CURVE_COLUMNS`: estimates with interval ends, replications, run
        length after warm-up, and the verdict. With one replication (``budget=1``, or a
        :class:`Replay` holding one block) there is no goodput interval: ``goodput_low`` and
        ``goodput_high`` are NaN (a second independent replication is what is missing);
        the attainment interval comes from batch means within the run, or is its whole
        range [0, 1] (verdict ``"undecided"``) when the run is too short for them.
    """
    design = _design(confidence, budget, holds, min_requests, seed, executor, delta)
    s = _watched(_setup(requests, replica, router, policy, limits, target, design),
                 on_replication)
    n = _fleet_size(check_fleet(replica, replicas, router, policy))
    return _point(s, _check.positive("rate", rate), n)


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class CapacityResult:
    """The capacity as an interval: the largest rate shown to meet the SLO target and the
    smallest shown to miss it, with every rate simulated."""

    rate: float
    """Largest rate shown to meet the target (requests/s); 0.0 if none is. The lower end
    of the capacity."""
    attainment: float
    """Estimated SLO attainment at ``rate`` (mean over replications)."""
    target: float
    """The attainment target the search used."""
    replicas: int
    """Replicas simulated."""
    limits: dict
    """The limits (column -> seconds) a request had to meet."""
    fluid: float
    """The fleet's fluid throughput bound (requests/s): the bracket's ceiling, never
    simulated."""
    evaluations: pd.DataFrame = field(repr=False)
    """One row per rate simulated, in the order tried (:data:`CURVE_COLUMNS`)."""

    @property
    def upper(self) -> float:
        """Smallest rate above :attr:`rate` shown to miss the target (``misses`` or
        ``unstable``), or the fluid bound when none is (requests/s). The upper end of
        the capacity; ``open`` rates between the two ends are :attr:`open`."""
        table = self.evaluations
        shown = table["verdict"].isin(["misses", "unstable"]) & (table["rate_rps"] > self.rate)
        rows = table.loc[shown, "rate_rps"]
        return float(rows.min()) if len(rows) else self.fluid

    @property
    def open(self) -> list[float]:
        """Rates between :attr:`rate` and :attr:`upper` left ``open`` (not decided within
        the replication budget), increasing. They are not misses."""
        table = self.evaluations
        inside = ((table["verdict"] == "open") & (table["rate_rps"] > self.rate)
                  & (table["rate_rps"] < self.upper))
        return sorted(set(table.loc[inside, "rate_rps"].tolist()))

    @property
    def at_rate(self) -> pd.Series:
        """The evaluation row at :attr:`rate` (goodput, p99s, intervals, ...)."""
        rows = self.evaluations.loc[self.evaluations["rate_rps"] == self.rate]
        return rows.iloc[-1]

    @property
    def undecided(self) -> list[float]:
        """Every rate simulated and left ``open`` (the name before verdicts were
        sequential); see :attr:`open` for those inside the capacity interval."""
        table = self.evaluations
        return table.loc[table["verdict"] == "open", "rate_rps"].tolist()

    def __str__(self) -> str:
        limits = ", ".join(f"{k} <= {v:g} s" if v is not True else k
                           for k, v in self.limits.items())
        if self.rate == 0:
            return (f"no rate meets {self.target:.1%} attainment of ({limits}) on "
                    f"{self.replicas} replica(s); {len(self.evaluations)} points simulated")
        row = self.at_rate
        tpot = "n/a" if math.isnan(row["tpot_p99_s"]) else f"{row['tpot_p99_s']:.3g} s"
        return (f"capacity {self.rate:.4g} req/s on {self.replicas} replica(s): attainment "
                f"{self.attainment:.2%} ({row['attainment_low']:.2%} to "
                f"{row['attainment_high']:.2%}) >= {self.target:.1%} of ({limits}); "
                f"p99 TTFT {row['ttft_p99_s']:.3g} s, p99 TPOT {tpot}, goodput "
                f"{row['goodput_rps']:.4g} req/s; capacity between {self.rate:.4g} and "
                f"{self.upper:.4g} req/s{_open_note(self.open)} "
                f"({len(self.evaluations)} points, {int(self.evaluations['replications'].sum())} "
                "replications)")


def _open_note(rates: list[float]) -> str:
    if not rates:
        return ""
    shown = ", ".join(f"{r:.4g}" for r in rates)
    return f" (open at {shown} req/s)"


def capacity_search(requests, replica: Replica, *, replicas: int = 1,
                    router: str = DEFAULT_ROUTER, policy: str = "fcfs", limits=None,
                    target: float = 0.99, lo: float | None = None, hi: float | None = None,
                    rtol: float = 0.02, seed=0, confidence: float = 0.95, budget: int = 16,
                    delta: float = stats.INDIFFERENCE, holds: float = 20.0,
                    min_requests: int = 2000, executor=parallel.AUTO,
                    progress: Callable | None = None) -> CapacityResult:
    """The capacity (requests/s) as an interval: the largest rate shown to meet
    ``target`` and the smallest shown to miss it.

    Each probe is an :func:`evaluate` point decided sequentially (meets / misses, each
    wrong with probability at most ``1 - confidence`` outside ``target +- delta``;
    ``open`` when ``budget`` replications did not decide; ``unstable``, which counts as
    shown to miss). The bracket is ``lo`` (largest rate shown to meet) < open rates <
    ``hi`` (smallest shown to miss, at first the fleet's fluid throughput bound
    (:func:`fluid_rate`), never simulated; the floor is found by halving from 3/4 of
    it). Each step bisects the wider of the gaps ``lo`` to the lowest open rate and the
    highest open rate to ``hi`` (the whole bracket while nothing is open), until both
    are within ``rtol * hi``: an open probe is never taken for a miss. The result's
    :attr:`CapacityResult.rate` and :attr:`CapacityResult.upper` are the two ends, and
    :attr:`CapacityResult.open` the open rates between. Several probes are made, each
    with its error, so the ends are estimates too.

    Parameters as in :func:`evaluate`, plus:

    lo, hi : float, optional
        A rate known to meet and one known not to (requests/s); both are checked by
        simulation. ``hi`` above the fluid bound is lowered to it.
    rtol : float
        Relative width of the final bracket, in (0, 1).
    progress : callable, optional
        Called as ``progress(row)`` after each point (row: dict of :data:`CURVE_COLUMNS`).

    Raises
    ------
    ValueError
        For bad input (naming the parameter), a ``lo`` that does not meet, a ``hi`` that
        meets, or limits that no fleet can meet (said before simulating).
    """
    design = _design(confidence, budget, holds, min_requests, seed, executor, delta)
    s = _setup(requests, replica, router, policy, limits, target, design)
    n = _fleet_size(check_fleet(replica, replicas, router, policy))
    tol = _rtol(rtol)
    if lo is not None:
        lo = _rate_bound("lo", lo)
    if hi is not None:
        hi = _rate_bound("hi", hi)
    if lo is not None and hi is not None and not lo < hi:
        raise ValueError(f"lo must be < hi, got lo={lo!r}, hi={hi!r}")
    _check_feasible(s)
    return _capacity(s, n, tol, lo, hi, _progress(progress), {})


def _capacity(s: _Setup, n: int, tol, lo, hi, progress, known) -> CapacityResult:
    """Bracket and bisect on decided probes, keeping open ones between the ends;
    ``known`` maps rates already evaluated to their rows."""
    rows: list[dict] = []
    fluid = _fluid(s.ref, s.replica, n)
    opens: list[float] = []

    def verdict(rate: float) -> str:
        row = known[rate] if rate in known else _point(s, rate, n)
        rows.append(row)
        if progress is not None and rate not in known:
            progress(row)
        return row["verdict"]

    def result(rate: float) -> CapacityResult:
        table = pd.DataFrame(rows, columns=list(CURVE_COLUMNS))
        at = table.loc[table["rate_rps"] == rate, "attainment"]
        attainment = float(at.iloc[-1]) if len(at) else math.nan
        return CapacityResult(rate=rate, attainment=attainment, target=s.target,
                              replicas=n, limits=s.limits, fluid=fluid, evaluations=table)

    if lo is not None and verdict(lo) != "meets":
        raise ValueError(f"lo must be a rate that meets the target, but lo={lo!r} req/s "
                         f"is '{rows[-1]['verdict']}' (attainment {rows[-1]['attainment']:.4g}, "
                         f"target {s.target!r})")
    if hi is not None and hi < fluid:
        said = verdict(hi)
        if said == "meets":
            raise ValueError(f"hi must be a rate that misses the target, but hi={hi!r} "
                             f"req/s meets it on replicas={n!r} (attainment "
                             f"{rows[-1]['attainment']:.4g} >= {s.target!r})")
        if said == "open":
            opens.append(hi)
            hi = None
    hi = fluid if hi is None else min(hi, fluid)
    if lo is None:
        probe = 0.75 * min([hi, *opens])
        for _ in range(_MAX_BRACKET_STEPS):
            said = verdict(probe)
            if said == "meets":
                lo = probe
                break
            if said == "open":
                opens.append(probe)
            else:
                hi = probe
                opens = [r for r in opens if r < hi]
            probe = probe / 2.0
        else:
            return result(0.0)
    while True:
        inside = [r for r in opens if lo < r < hi]
        gaps = [(lo, min(inside)), (max(inside), hi)] if inside else [(lo, hi)]
        a, b = max(gaps, key=lambda g: g[1] - g[0])
        if b - a <= tol * hi:
            return result(lo)
        mid = 0.5 * (a + b)
        said = verdict(mid)
        if said == "meets":
            lo = mid
        elif said == "open":
            opens.append(mid)
        else:
            hi = mid


# --------------------------------------------------------------------------- curve


def goodput_curve(requests, replica: Replica, rates: Iterable[float], *, replicas: int = 1,
                  router: str = DEFAULT_ROUTER, policy: str = "fcfs", limits=None,
                  target: float = 0.99, seed=0, confidence: float = 0.95, budget: int = 16,
                  delta: float = stats.INDIFFERENCE, holds: float = 20.0,
                  min_requests: int = 2000, executor=parallel.AUTO,
                  progress: Callable | None = None) -> pd.DataFrame:
    """Throughput, goodput, attainment and p99s of the workload at each rate.

    One :func:`evaluate` point per rate (same design, same replication seeds at every
    rate). Returns one row per rate, in increasing order, with the
    :data:`CURVE_COLUMNS` (estimates, interval ends, replications, run length after
    warm-up, verdict).
    """
    design = _design(confidence, budget, holds, min_requests, seed, executor, delta)
    s = _setup(requests, replica, router, policy, limits, target, design)
    n = _fleet_size(check_fleet(replica, replicas, router, policy))
    if isinstance(rates, (str, bytes)) or not isinstance(rates, Iterable):
        raise ValueError(f"rates must be an iterable of rates (requests/s), got {rates!r}")
    grid = [_check.positive("rates", r) for r in rates]
    if not grid:
        raise ValueError("rates must not be empty, got []")
    if any(b <= a for a, b in zip(grid, grid[1:], strict=False)):
        raise ValueError(f"rates must be strictly increasing, got {grid!r}")
    callback = _progress(progress)
    rows = []
    for rate in grid:
        rows.append(_point(s, rate, n))
        if callback is not None:
            callback(rows[-1])
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
    with _check.naming("curve"):
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
    """Smallest replica count shown to meet the SLO target at one rate."""

    replicas: int
    """Smallest count shown to meet the target (before spares); the count one below is
    shown to miss, is ``open`` (:attr:`below_verdict`), or is under the fluid bound."""
    rate: float
    """The arrival rate simulated (requests/s)."""
    fluid_min: int
    """Fewest replicas whose fluid throughput bound exceeds ``rate``; smaller fleets are
    overloaded and were not simulated."""
    evaluations: pd.DataFrame = field(repr=False)
    """One row per replica count simulated: ``replicas`` plus the :data:`CURVE_COLUMNS`."""

    def row(self, replicas: int) -> pd.Series | None:
        """The evaluation of a fleet of this size, or None if it was not simulated."""
        rows = self.evaluations.loc[self.evaluations["replicas"] == replicas]
        return None if rows.empty else rows.iloc[-1]

    @property
    def open(self) -> list[int]:
        """Sizes simulated and left ``open`` (not decided within the replication budget),
        increasing. They are not misses."""
        table = self.evaluations
        return sorted(table.loc[table["verdict"] == "open", "replicas"].tolist())

    @property
    def undecided(self) -> list[int]:
        """Same as :attr:`open` (the name before verdicts were sequential)."""
        return self.open

    @property
    def below_verdict(self) -> str:
        """What is known of one replica fewer: ``"misses"``, ``"unstable"``, ``"open"``,
        ``"overloaded"`` (under the fluid bound, not simulated) or ``"none"`` (the
        answer is 1)."""
        n = self.replicas - 1
        if n == 0:
            return "none"
        if n < self.fluid_min:
            return "overloaded"
        row = self.row(n)
        return "not simulated" if row is None else str(row["verdict"])

    @property
    def shown_to_miss(self) -> int:
        """Largest size below :attr:`replicas` shown to miss (``misses`` / ``unstable``),
        or ``fluid_min - 1`` (overloaded) when none was simulated."""
        table = self.evaluations
        shown = (table["verdict"].isin(["misses", "unstable"])
                 & (table["replicas"] < self.replicas))
        return int(table.loc[shown, "replicas"].max()) if shown.any() else self.fluid_min - 1

    def __str__(self) -> str:
        reps = int(self.evaluations["replications"].sum())
        below = self.below_verdict
        note = {"misses": f"{self.replicas - 1} shown to miss",
                "unstable": f"{self.replicas - 1} unstable",
                "open": f"{self.replicas - 1} open, {self.shown_to_miss} shown to miss",
                "overloaded": f"{self.replicas - 1} under the fluid bound",
                "none": "one replica suffices"}.get(below, below)
        return (f"{self.replicas} replica(s) meet the target at {self.rate:.4g} req/s "
                f"({note}; fluid bound needs >= {self.fluid_min}; "
                f"{len(self.evaluations)} sizes, {reps} replications)")


def smallest_fleet(requests, replica: Replica, rate: float, *, router: str = DEFAULT_ROUTER,
                   policy: str = "fcfs", limits=None, target: float = 0.99, seed=0,
                   start: int | None = None, max_replicas: int = 4096,
                   confidence: float = 0.95, budget: int = 16,
                   delta: float = stats.INDIFFERENCE, holds: float = 20.0,
                   min_requests: int = 2000, executor=parallel.AUTO,
                   progress: Callable | None = None,
                   on_replication: Callable | None = None) -> FleetResult:
    """Smallest replica count whose simulated SLO attainment at ``rate`` meets ``target``.

    Every size is an :func:`evaluate` point on the same replications (common random
    numbers), decided sequentially: ``meets``, ``misses`` (or ``unstable``, shown not to
    meet) or ``open`` (not decided within ``budget``; never taken for a miss). Sizes
    below the fluid bound (:func:`fluid_rate` < ``rate``) are overloaded: they are not
    simulated, and the search starts at ``max(start, fluid_min)``. From there it walks
    up (or down) by doubling steps until it has a size shown to meet above one shown to
    miss, with any open sizes between; then it bisects between the highest open size
    (or the size shown to miss) and the one shown to meet until they are adjacent. The
    answer is the smallest size shown to meet; the size one below it is shown to miss,
    is ``open`` (:attr:`FleetResult.below_verdict` says which), or is under the fluid
    bound.

    Parameters as in :func:`evaluate`, plus ``start`` (first size tried),
    ``max_replicas`` (refuse larger fleets) and ``progress`` (called as
    ``progress(row)`` after each simulated size, ``row`` its evaluation with
    ``replicas``). Raises ``ValueError`` before simulating
    when the fluid bound alone needs more than ``max_replicas``, or no fleet can meet
    the limits (e.g. a prompt whose prefill alone exceeds the TTFT limit).
    """
    design = _design(confidence, budget, holds, min_requests, seed, executor, delta)
    s = _watched(_setup(requests, replica, router, policy, limits, target, design),
                 on_replication)
    lam = _check.positive("rate", rate)
    cap = _check.whole("max_replicas", max_replicas)
    if start is not None:
        start = _check.whole("start", start)
        if start > cap:
            raise ValueError(f"start must be <= max_replicas={cap}, got {start!r}")
    callback = _progress(progress)
    _check_feasible(s)
    return _fleet(s, lam, start, cap, callback)


def _fleet(s: _Setup, lam: float, start, cap: int, progress) -> FleetResult:
    floor = _fluid_min(s.ref, s.replica, lam)
    if floor > cap:
        shown = f"{floor:,}" if floor < 10**15 else f"{floor:.3g}"
        raise ValueError(f"max_replicas={cap} is below the {shown} replicas the fluid "
                         f"throughput bound needs for rate={lam:.4g} req/s "
                         f"({_fluid(s.ref, s.replica, 1):.4g} req/s per replica)")
    _run_length(s, lam)                       # refuse an oversized run before simulating
    first = floor if start is None else max(start, floor)
    rows: list[dict] = []
    seen: dict[int, str] = {}

    def verdict(n: int) -> str:
        if n < floor:
            return "misses"                   # overloaded: not simulated
        if n not in seen:
            row = {"replicas": n, **_point(s, lam, n)}
            rows.append(row)
            seen[n] = row["verdict"]
            if progress is not None:
                progress(row)
        return seen[n]

    opens: list[int] = []
    said = verdict(first)
    if said == "meets":
        good, bad, step = first, floor - 1, 1
        while good - step >= floor:
            said = verdict(good - step)
            if said == "meets":
                good -= step
                opens = [m for m in opens if m < good]
            elif said == "open":
                opens.append(good - step)
            else:
                bad = good - step
                break
            step *= 2
    else:
        bad, step = first - 1, 1
        if said == "open":
            opens.append(first)
        else:
            bad = first
        last = first
        while True:
            n = min(cap, last + step)
            said = verdict(n)
            if said == "meets":
                good = n
                break
            if n == cap:
                raise ValueError(f"max_replicas={cap} replicas still do not meet the target "
                                 f"{s.target!r} at {lam:.4g} req/s ({rows[-1]['verdict']}, "
                                 f"attainment {rows[-1]['attainment']:.4g})")
            if said == "open":
                opens.append(n)
            else:
                bad = n
            last, step = n, step * 2
    # narrow the gap just below the answer until it is one replica wide; open sizes are
    # kept between the size shown to miss and the answer, never counted as misses
    while True:
        below = max([bad, *[m for m in opens if bad < m < good]])
        if good - below <= 1:
            break
        mid = (good + below) // 2
        said = verdict(mid)
        if said == "meets":
            good = mid
        elif said == "open":
            opens.append(mid)
        else:
            bad = mid
    table = pd.DataFrame(rows, columns=["replicas", *CURVE_COLUMNS])
    return FleetResult(replicas=good, rate=lam, fluid_min=floor,
                       evaluations=table.sort_values("replicas").reset_index(drop=True))


# --------------------------------------------------------------------------- plan


def _plain(value):
    """JSON-ready copy: numpy scalars to Python, Series to dicts, NaN/inf to None."""
    if isinstance(value, pd.Series):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    return value


@dataclass(frozen=True)
class Plan:
    """A fleet plan: the closed-form guess, the simulator's answer, and its capacity."""

    rate: float
    """Arrival rate planned for (requests/s)."""
    hold_s: float
    """T_hold used by the closed form and the run length (s): see :func:`hold_time`."""
    sizing: FleetSizing
    """Little + square-root staffing + spares (:func:`servingcap.fleet.size_fleet`)."""
    fleet: FleetResult
    """Smallest simulated fleet meeting the target at ``rate`` (spares not included)."""
    spares: int
    """Whole replicas added for failures."""
    capacity: CapacityResult
    """Largest rate the ``fleet.replicas`` serving replicas are shown to carry."""
    confidence: float
    """Level of every interval in the plan."""
    budget: int
    """Most replications per point."""

    @property
    def replicas(self) -> int:
        """Replicas to order: the simulator's count plus spares."""
        return self.fleet.replicas + self.spares

    @property
    def at_size(self) -> pd.Series:
        """Evaluation at the simulator's count (p99s, goodput, attainment, interval)."""
        return self.fleet.row(self.fleet.replicas)

    @property
    def below(self) -> pd.Series | None:
        """Evaluation one replica fewer, or None when it was not simulated (the answer
        is 1, or one fewer is under the fluid bound)."""
        return self.fleet.row(self.fleet.replicas - 1)

    @property
    def capacity_upper(self) -> float:
        """Smallest rate shown to miss on ``fleet.replicas`` replicas (requests/s), or
        their fluid bound: the capacity lies between :attr:`CapacityResult.rate` and this."""
        return self.capacity.upper

    @property
    def headroom(self) -> float:
        """Capacity over planned rate, minus one (0.10 = 10 % growth before it misses)."""
        return self.capacity.rate / self.rate - 1.0

    def to_dict(self) -> dict:
        """The plan as plain JSON-ready data (requests/s, seconds, replicas): the closed
        form, the answer with its evaluation row, the row one below, the plan rate, and
        every simulated point (``fleet_points``, ``capacity_points``; columns
        :data:`CURVE_COLUMNS`, plus ``replicas``). NaN and infinities become None."""
        sz = self.sizing
        return _plain({
            "rate_rps": self.rate, "hold_s": self.hold_s, "replicas": self.replicas,
            "serving_replicas": self.fleet.replicas, "spares": self.spares,
            "closed_form": {"offered_load": sz.offered_load, "slots": sz.slots,
                            "replicas_for_slots": sz.replicas_for_slots,
                            "replicas": sz.replicas, "beta": sz.beta},
            "fluid_min_replicas": self.fleet.fluid_min,
            "at_size": self.at_size, "below": self.below,
            "plan_rate_rps": self.capacity.rate, "headroom": self.headroom,
            "at_plan_rate": self.capacity.at_rate if self.capacity.rate > 0 else None,
            "confidence": self.confidence, "budget": self.budget,
            "simulations": self.simulations,
            "fleet_points": self.fleet.evaluations.to_dict("records"),
            "capacity_points": self.capacity.evaluations.to_dict("records"),
        })

    @property
    def simulations(self) -> int:
        """Replications simulated for the plan (the plan-rate point at the answer size,
        shared by the fleet and capacity searches, counted once)."""
        cap = self.capacity.evaluations
        again = cap.loc[cap["rate_rps"] != self.rate, "replications"]
        return int(self.fleet.evaluations["replications"].sum() + again.sum())


def plan(requests, replica: Replica, rate: float, *, router: str = DEFAULT_ROUTER,
         policy: str = "fcfs", limits=None, target: float = 0.99, spares: int = 1,
         beta: float = 2.0, seed=0, rtol: float = 0.02, confidence: float = 0.95,
         budget: int = 16, delta: float = stats.INDIFFERENCE, holds: float = 20.0,
         min_requests: int = 2000, max_replicas: int = 4096, executor=parallel.AUTO,
         progress: Callable | None = None, on_replication: Callable | None = None) -> Plan:
    """Size a fleet for ``rate`` and check it by simulation (what ``servingcap plan`` prints).

    0. Before simulating: no fleet can meet limits that an idle replica misses
       (:func:`slo_floor`), and no fleet below the fluid bound carries the rate.
    1. Closed form: ``size_fleet(rate, hold_time(requests, replica), replica.max_batch,
       beta, spares)``.
    2. Simulation: :func:`smallest_fleet` from the larger of the closed form's count
       (without spares) and a first guess from the fluid bound, ``a + 0.14 sqrt(a)``
       replicas for ``a = rate / fluid_rate(one replica)`` (:data:`FLUID_GUESS_BETA`;
       only where the search starts, so only how many sizes it simulates).
    3. Capacity: :func:`capacity_search` on that many replicas, from ``rate`` (which
       meets) up to ``rate * (1 + 1.5 / (n - 1))`` or, if that meets too, the fleet's
       fluid bound, to relative tolerance ``rtol``: the plan rate is the largest rate
       shown to meet, :attr:`Plan.capacity_upper` the smallest shown to miss.

    Every point is decided sequentially (:func:`evaluate`): an ``open`` point is
    reported as open, never counted as a miss.

    Parameters as in :func:`smallest_fleet` and :func:`capacity_search` (``progress``
    after every point of both searches, ``on_replication`` after every replication of
    every point, as in :func:`evaluate`); ``requests`` a
    request table (each replication a block bootstrap of it, as many as ``budget``: see
    :func:`evaluate`), a :class:`Replay` of one (its consecutive blocks as recorded) or
    a :class:`PoissonWorkload`.
    """
    design = _design(confidence, budget, holds, min_requests, seed, executor, delta)
    s = _watched(_setup(requests, replica, router, policy, limits, target, design),
                 on_replication)
    lam = _check.positive("rate", rate)
    n_spares = _check.whole("spares", spares, minimum=0)
    cap = _check.whole("max_replicas", max_replicas)
    tol = _rtol(rtol)
    callback = _progress(progress)
    sizing = size_fleet(lam, s.hold_s, replica.max_batch, beta=beta, spares=n_spares, p=0.99)
    _check_feasible(s)
    busy = lam / _fluid(s.ref, s.replica, 1)              # replicas kept busy, at least
    guess = math.ceil(busy + FLUID_GUESS_BETA * math.sqrt(busy))
    fleet = _fleet(s, lam, min(max(sizing.replicas_for_slots, guess), cap), cap, callback)
    n = fleet.replicas
    at_rate = {k: v for k, v in fleet.row(n).items() if k != "replicas"}
    # The fleet one smaller does not meet at ``rate``, so the capacity is rarely far above
    # rate * n / (n - 1): try a modest step up first and bisect below it if it does not meet.
    step_up = min(lam * (1.0 + 1.5 / max(n - 1, 1)), _fluid(s.ref, s.replica, n))
    probe = _point(s, step_up, n)
    if callback is not None:
        callback(probe)
    known = {lam: at_rate, step_up: probe}
    if probe["meets"]:
        capacity = _capacity(s, n, tol, step_up, None, callback, known)
    else:       # shown to miss: the upper end; open: kept between the ends, not a miss
        capacity = _capacity(s, n, tol, lam, step_up, callback, known)
    return Plan(rate=lam, hold_s=s.hold_s, sizing=sizing, fleet=fleet, spares=n_spares,
                capacity=capacity, confidence=design.confidence, budget=design.budget)
