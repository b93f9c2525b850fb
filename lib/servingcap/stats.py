"""Output analysis: how long to simulate, and how sure to be of a simulated number.

A simulation starts empty and its requests are correlated (a slow request delays the ones
queued behind it), so a number read off one run is an *estimate* with an error the run
itself does not show. This module holds the standard remedies:

- :func:`mser` finds the warm-up to delete with MSER-5, the Marginal Standard Error
  Rule on batch means of 5 (White 1997; White, Cobb & Spratt 2000): delete the prefix
  that minimizes the standard error of the mean of what is left.
- :func:`mean_ci` is a Student-t interval across *independent replications* (one
  estimate per run, each run with its own seed); :func:`batch_means_ci` is the
  single-long-run substitute (means of consecutive batches treated as independent).
  These are the intervals to report for a simulated mean or attainment fraction (for a
  percentile, see :func:`quantile_ci` below).
- :func:`percentile_ci` (distribution-free, order statistics) and :func:`proportion_ci`
  (Wilson or Clopper-Pearson, from :func:`scipy.stats.binomtest`) assume *independent*
  observations. Applied to one run's requests they are too narrow; apply them to
  independent data (or to one observation per replication).
- :func:`replication_seeds` gives each replication its own stream with
  :meth:`numpy.random.SeedSequence.spawn`; reusing replication *i*'s seed for every
  configuration compared is the common-random-numbers design.
- :func:`sequential_check` and :func:`feasibility` decide "mean >= target" (an SLO
  attainment; equivalently "the p-quantile <= its limit") sequentially with an
  indifference zone: meets / misses with a stated error probability, or ``"open"`` when
  the replications allowed run out first. :func:`sequential_check` (repeated
  t-intervals at fixed looks, Bonferroni across looks) is what planning uses;
  :func:`feasibility` is Batur & Kim's (2010) fully sequential check, which with a
  narrow zone stays open far from the target when replications vary a lot.
- :func:`quantile_ci` and :func:`replicated_quantile_ci` put an interval on a quantile
  *as printed* (the p99 of the whole run, or of all replications pooled), by sectioning
  (Asmussen & Glynn 2007): never a mean of batch p99s presented as the p99's interval.
- :func:`replicate` runs one or more designs on each replication's requests, puts
  each output in arrival order and deletes its warm-up (:func:`warmup_cuts`), each
  design on its own or paired designs at a common cut.
- :func:`steady_state` returns a :class:`Verdict`: ``"unstable"`` when the warm-up does
  not end by mid-run or the latency keeps climbing across the run (a queue with
  utilization >= 1, or a fleet whose routing synchronizes), so that no number is
  reported for a system that has no steady state.

Every interval is an :class:`Estimate`; :meth:`Estimate.decide` says whether it meets,
misses or cannot yet tell a target; a :class:`Decision` is the sequential answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from . import _check

__all__ = ["Estimate", "mser", "Warmup", "mean_ci", "batch_means_ci", "percentile_ci",
           "proportion_ci", "replication_seeds", "Verdict", "steady_state", "warmup_cuts",
           "replicate",
           "Decision", "feasibility", "feasibility_constants", "sequential_check",
           "look_schedule", "sectioning_ci", "quantile_ci",
           "replicated_quantile_ci", "INDIFFERENCE", "FIRST_STAGE", "MIN_TAIL"]

MSER_BATCH = 5
"""Observations per batch in MSER-5 (White, Cobb & Spratt 2000)."""


def _confidence(confidence) -> float:
    return _check.probability("confidence", confidence)


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided confidence interval."""

    value: float
    """The estimate (same unit as the data)."""
    low: float
    """Lower end of the interval (-inf when it cannot be computed, e.g. one replication)."""
    high: float
    """Upper end of the interval (+inf likewise)."""
    confidence: float
    """Nominal coverage of the interval, in (0, 1)."""
    n: int
    """Independent units behind it: replications, batches or observations (see method)."""
    method: str
    """How the interval was made, e.g. ``"t over 5 replications"``."""

    @property
    def half_width(self) -> float:
        """Half the interval's width (same unit as the data)."""
        return 0.5 * (self.high - self.low)

    def decide(self, target: float) -> str:
        """``"meets"`` when the whole interval is at or above ``target``, ``"misses"``
        when it is below, ``"undecided"`` when it straddles it (run more replications)."""
        goal = _check.number("target", target)
        if self.low >= goal:
            return "meets"
        if self.high < goal:
            return "misses"
        return "undecided"

    def decide_at_most(self, limit: float) -> str:
        """The verdict for a lower-is-better estimate (a latency, a miss rate):
        ``"meets"`` when the whole interval is at or below ``limit``, ``"misses"`` when it
        is above, ``"undecided"`` when it straddles it (run more replications)."""
        bound = _check.number("limit", limit)
        if self.high <= bound:
            return "meets"
        if self.low > bound:
            return "misses"
        return "undecided"

    def __str__(self) -> str:
        return (f"{self.value:.4g} ({self.confidence:.0%} CI {self.low:.4g} to "
                f"{self.high:.4g}; {self.method})")


# --------------------------------------------------------------------------- warm-up


@dataclass(frozen=True)
class Warmup:
    """Where MSER-5 cuts a run."""

    delete: int
    """Leading observations to delete."""
    observations: int
    """Observations in the series."""
    settled: bool
    """False when the minimizer lies in the second half of the run: the run is too short
    to have reached steady state, or there is none (White, Cobb & Spratt 2000)."""


def mser(values, batch: int = MSER_BATCH) -> Warmup:
    """MSER-k warm-up deletion point of an output series (default k = 5: MSER-5).

    The series (e.g. each request's TTFT in arrival order, seconds) is cut into batches
    of ``batch`` observations; for each candidate cut ``d`` (in batches) the statistic
    ``sum_{j>=d} (z_j - mean_d)^2 / (m - d)^2`` over the ``m`` batch means ``z`` estimates
    the squared standard error of the mean of what is kept. The cut minimizing it is
    the warm-up to delete (White 1997, "An effective truncation heuristic for bias
    reduction in simulation output", Simulation 69(6); White, Cobb & Spratt 2000, "A
    comparison of five steady-state truncation heuristics", Proc. Winter Simulation
    Conference). Cuts are searched in the first half of the run only: near the end the
    statistic is computed from a few batches and its noise, not the warm-up, picks the
    minimum (the "end effect"). A minimizer at mid-run, the edge of the search, means
    the run never settled (:attr:`Warmup.settled` is False).

    Parameters
    ----------
    values : array of float
        The output series in time order (finite).
    batch : int
        Observations per batch, >= 1.

    Returns
    -------
    Warmup
    """
    x = _check.array("values", values)
    k = _check.whole("batch", batch)
    m = x.size // k
    if m < 4:
        raise ValueError(f"values must hold at least {4 * k} observations for MSER-{k}, "
                         f"got {x.size} (batch={k})")
    z = x[: m * k].reshape(m, k).mean(axis=1)
    # suffix sums give mean and sum of squares of z[d:] for every d in one pass
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    count = np.arange(m, 0, -1, dtype=float)
    sse = np.maximum(s2 - s1 * s1 / count, 0.0)
    half = m // 2                    # cuts searched in the first half only (end effect)
    stat = sse[: half + 1] / count[: half + 1] ** 2
    d = int(np.argmin(stat))
    return Warmup(delete=d * k, observations=int(x.size), settled=d < half)


# --------------------------------------------------------------------------- intervals


def _bounds(bounds) -> tuple[float, float]:
    """``bounds`` as (low, high): numbers, not NaN, low < high; +-inf allowed."""
    try:
        low, high = bounds
        low, high = float(low), float(high)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bounds must be a pair (low, high) of numbers, got {bounds!r}"
                         ) from exc
    if isinstance(bounds, (str, bytes)) or math.isnan(low) or math.isnan(high):
        raise ValueError(f"bounds must be a pair (low, high) of numbers, got {bounds!r}")
    if not low < high:
        raise ValueError(f"bounds must have low < high, got {bounds!r}")
    return low, high


def mean_ci(estimates, confidence: float = 0.95, *, what: str = "replications",
            bounds=None) -> Estimate:
    """Student-t interval for the mean of independent estimates (one per replication).

    This is the interval to use for a simulated mean or attainment: each replication
    (its own seed, warm-up deleted) gives one estimate, and replications are
    independent even though requests within one are not. Over per-replication
    percentiles it is an interval for their *mean*, which is not the percentile of the
    pooled requests (for a p99, lower): to put an interval on the pooled percentile, use
    :func:`replicated_quantile_ci`. With one estimate the
    interval is (-inf, inf); with identical estimates it has zero width.

    ``bounds=(low, high)`` is the range the estimated quantity can take (same unit as
    the estimates; either end may be infinite): ``(0, 1)`` for a proportion such as a
    miss rate or an attainment, ``(0, math.inf)`` for a rate or a latency. The
    symmetric t-interval is then clipped to that range, so a miss rate near zero gets
    a lower end of 0 instead of a negative one, and ``method`` says so (e.g. ``"t over
    8 replications, clipped to [0, 1]"``). Clipping does not change the coverage: the
    true value lies inside ``bounds``, so it lies inside the clipped interval exactly
    when it lies inside the unclipped one; the point estimate is unchanged. Every
    estimate must itself lie inside ``bounds``. The default ``None`` leaves the
    interval as it is.
    """
    x = _check.array("estimates", estimates)
    conf = _confidence(confidence)
    if x.size == 0:
        raise ValueError("estimates must hold at least 1 value, got 0")
    if bounds is not None:
        lo_b, hi_b = _bounds(bounds)
        outside = (x < lo_b) | (x > hi_b)
        if outside.any():
            i = int(np.argmax(outside))
            raise ValueError(f"estimates must lie within bounds [{lo_b:g}, {hi_b:g}], "
                             f"got {x[i]!r} at index {i}")
    with np.errstate(over="ignore", invalid="ignore"):
        mean = float(x.mean())
    _check.finite_result(mean, f"the mean of estimates of magnitude up to "
                         f"{float(np.abs(x).max()):.3g}")
    if x.size == 1:
        low, high, n, method = -math.inf, math.inf, 1, f"t over 1 {what[:-1]}"
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            half = float(_st.t.ppf(0.5 + conf / 2, x.size - 1) * x.std(ddof=1)
                         / math.sqrt(x.size))
        _check.finite_result(mean + half + (mean - half),
                             f"estimates of magnitude up to "
                             f"{float(np.abs(x).max()):.3g}")
        low, high, n = mean - half, mean + half, int(x.size)
        method = f"t over {x.size} {what}"
    if bounds is not None:
        mean = min(max(mean, lo_b), hi_b)   # rounding only: every estimate is inside
        low, high = max(low, lo_b), min(high, hi_b)
        method += f", clipped to [{lo_b:g}, {hi_b:g}]"
    return Estimate(mean, low, high, conf, n, method)


def batch_means_ci(values, confidence: float = 0.95, batches: int = 10) -> Estimate:
    """Batch-means interval for the mean of one long, correlated run.

    The series is cut into ``batches`` consecutive batches of equal length (the
    remainder at the start is dropped) and their means are treated as independent:
    :func:`mean_ci` over the batch means. Valid when each batch is much longer than the
    run's correlation time; use independent replications when you can.
    """
    x = _check.array("values", values)
    b = _check.whole("batches", batches, minimum=2)
    if x.size < b:
        raise ValueError(f"values must hold at least batches={b} observations, got {x.size}")
    size = x.size // b
    means = x[x.size - b * size:].reshape(b, size).mean(axis=1)
    return mean_ci(means, confidence, what="batch means")


def percentile_ci(values, p: float, confidence: float = 0.95) -> Estimate:
    """Distribution-free interval for the ``p``-quantile of *independent* observations.

    Order statistics: with ``n`` i.i.d. values the number below the true quantile is
    Binomial(n, p), so ranks ``l`` and ``u`` with ``P(l <= B < u) >= confidence`` bound it
    whatever the distribution. ``+inf`` values (failed requests) are allowed. Requests
    of one simulated run are *not* independent: for those, use :func:`quantile_ci`
    (one run, sectioning) or :func:`replicated_quantile_ci` (replications). Ends that
    fall outside the sample are +-inf.
    """
    x = np.sort(_check.array("values", values, allow_inf=True))
    q = _check.probability("p", p)
    conf = _confidence(confidence)
    n = x.size
    if n == 0:
        raise ValueError("values must hold at least 1 value, got 0")
    alpha = 1 - conf
    lo_rank = int(_st.binom.ppf(alpha / 2, n, q))                    # 0-based order stats
    hi_rank = int(_st.binom.ppf(1 - alpha / 2, n, q))
    low = float(x[lo_rank - 1]) if lo_rank >= 1 else -math.inf
    high = float(x[hi_rank]) if hi_rank < n else math.inf
    value = float(np.quantile(x, q, method="inverted_cdf"))
    return Estimate(value, low, high, conf, n, f"order statistics of {n} observations")


def proportion_ci(successes: int, trials: int, confidence: float = 0.95,
                  method: str = "wilson") -> Estimate:
    """Interval for a success fraction from *independent* trials (scipy's binomtest).

    ``method`` is ``"wilson"`` (score interval) or ``"exact"`` (Clopper-Pearson). The
    requests of one simulated run are correlated, so this interval is too narrow for
    a run's SLO attainment; use it for independent units (e.g. replications that meet).
    """
    n = _check.whole("trials", trials)
    k = _check.whole("successes", successes, minimum=0)
    if k > n:
        raise ValueError(f"successes must be <= trials={n}, got {successes!r}")
    conf = _confidence(confidence)
    if method not in ("wilson", "exact"):
        raise ValueError(f"method must be 'wilson' or 'exact', got {method!r}")
    if n >= 2**63:
        raise ValueError(f"trials must be below 2**63 (scipy counts in int64), "
                         f"got {trials!r}")
    ci = _st.binomtest(k, n).proportion_ci(confidence_level=conf, method=method)
    name = "Wilson" if method == "wilson" else "Clopper-Pearson"
    return Estimate(k / n, float(ci.low), float(ci.high), conf, n, f"{name} over {n} trials")


# --------------------------------------------------------------------------- replications


def replication_seeds(seed, replications: int) -> list[np.random.SeedSequence]:
    """Independent seeds for ``replications`` runs, from ``SeedSequence(seed).spawn``.

    The first ``k`` seeds are the same whatever ``replications`` is, so adding runs
    keeps the earlier ones; giving replication ``i`` the same seed in every configuration
    compared (fleet sizes, rates) is the common-random-numbers design.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    r = _check.size("replications", replications)
    return np.random.SeedSequence(int(seed)).spawn(r)


# --------------------------------------------------------------------------- steady state


@dataclass(frozen=True)
class Verdict:
    """Is a run in steady state? If not, report "unstable", never a number."""

    steady: bool
    """True when neither test below fired."""
    reason: str
    """One line: what was measured and which test fired (or that none did)."""
    warmup: Warmup
    """The MSER-5 cut of the series."""
    growth: float
    """Rise of the fitted trend across the kept run, relative to the kept mean."""
    p_value: float
    """One-sided p-value of the slope of the batch means (small: a rising trend)."""

    @property
    def label(self) -> str:
        """``"steady"`` or ``"unstable"``."""
        return "steady" if self.steady else "unstable"

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}"


def steady_state(values, *, batches: int = 20, alpha: float = 0.01,
                 max_growth: float = 0.5, scale: float | None = None) -> Verdict:
    """Steady-state verdict for a latency series in arrival order (seconds).

    Three tests, any of which makes the run ``"unstable"``:

    1. the MSER-5 warm-up (:func:`mser`) does not end by mid-run;
    2. after deleting it, the means of ``batches`` consecutive batches rise: the OLS
       slope is positive with one-sided p-value < ``alpha`` *and* the fitted rise across
       the kept run exceeds ``max_growth`` times the kept mean (by Little's law a rising
       latency at a steady arrival rate is a rising backlog: throughput below the
       arrival rate);
    3. the batch means are strongly autocorrelated: lag-1 correlation above
       ``z_(1-alpha) / sqrt(batches)``, its one-sided critical value for independent
       means. The run is then not much longer than the queue's memory, as for a queue at
       utilization 1, whose backlog wanders like a random walk with no mean to return to.

    With ``scale`` given (in the unit of ``values``), growth is measured against it
    instead of the kept mean, and tests 1 and 3 count only when the batch means span
    more than ``max_growth * scale``: a drift too small to matter is not called
    unstable. Use it to measure movement in a unit that matters, e.g. the TTFT limit, or
    the miss fraction a target allows when ``values`` are per-request misses (0/1).

    A queue with utilization >= 1 fails at least one; so does a fleet whose router
    keeps synchronizing its replicas (latency climbing along the run). A stable queue
    observed for many times its relaxation time passes with probability about
    ``1 - 2 alpha``; one observed too briefly may be called unstable, which is the
    honest answer for that run length.
    """
    x = _check.array("values", values)
    b = _check.whole("batches", batches, minimum=4)
    a = _check.probability("alpha", alpha)
    g = _check.positive("max_growth", max_growth)
    unit = None if scale is None else _check.positive("scale", scale)
    warm = mser(x)
    kept = x[warm.delete:]

    def batch_means(series):
        size = series.size // b
        return series[series.size - b * size:].reshape(b, size).mean(axis=1)

    def moves(means) -> float:
        if unit is None:
            return math.inf                      # no materiality gate without a scale
        spread = float(means.max() - means.min())
        return spread / unit

    if not warm.settled and x.size >= 2 * b and moves(batch_means(x)) > g:
        return Verdict(False, f"warm-up not over by mid-run (MSER-5 cut at {warm.delete} of "
                       f"{warm.observations} observations)", warm, math.nan, math.nan)
    if kept.size < 2 * b:
        return Verdict(True, f"too few observations after warm-up ({kept.size}) for a trend "
                       "test", warm, 0.0, 1.0)
    means = batch_means(kept)
    fit = _st.linregress(np.arange(b, dtype=float), means)
    ref = unit if unit is not None else abs(float(means.mean()))
    growth = float(fit.slope) * (b - 1) / ref if ref > 0 else 0.0
    _check.finite_result(growth, f"the rise of the batch means relative to scale={scale!r}")
    if fit.stderr > 0:
        p_value = float(_st.t.sf(fit.slope / fit.stderr, b - 2))
    else:
        p_value = 0.0 if fit.slope > 0 else 1.0
    if p_value < a and growth > g:
        return Verdict(False, f"latency keeps rising: {growth:+.0%} across the run after "
                       f"warm-up (slope p = {p_value:.2g})", warm, growth, p_value)
    centred = means - means.mean()
    denom = float(centred @ centred)
    lag1 = float(centred[:-1] @ centred[1:]) / denom if denom > 0 else 0.0
    if lag1 > _st.norm.isf(a) / math.sqrt(b) and moves(means) > g:
        return Verdict(False, f"batch means wander (lag-1 correlation {lag1:.2f} over {b} "
                       "batches): no level to settle at in this run", warm, growth, p_value)
    return Verdict(True, f"no trend after a warm-up of {warm.delete} observations "
                   f"({growth:+.0%} across the run, slope p = {p_value:.2g})", warm, growth,
                   p_value)


def warmup_cuts(runs) -> list[int]:
    """Observations to delete from the start of each of several replications.

    Every replication starts empty, so they share one initial transient. The cut for
    replication ``i`` is MSER-5 (:func:`mser`) of the average, index by index, of the
    *other* replications (over their common length): averaging removes most of the
    run-to-run noise, and leaving run ``i`` out keeps its cut independent of its own
    data. (A cut chosen on a run's own data tends to land just after a burst, keeping a
    quiet suffix and biasing that run's percentile low.) A single run gets its own cut.

    Parameters
    ----------
    runs : sequence of arrays of float
        One output series per replication (e.g. TTFT in arrival order, seconds).
    """
    if isinstance(runs, np.ndarray) and runs.ndim == 1:
        raise ValueError("runs must be a sequence of series (one per replication), got "
                         "one 1-D array")
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Iterable):
        raise ValueError(f"runs must be a sequence of series (one per replication), got "
                         f"{runs!r}")
    series = [_check.array(f"runs[{i}]", r) for i, r in enumerate(runs)]
    if not series:
        raise ValueError("runs must hold at least 1 series, got 0")
    with _check.naming("runs"):
        if len(series) == 1:
            return [mser(series[0]).delete]
        length = min(s.size for s in series)
        stacked = np.stack([s[:length] for s in series])
        total = stacked.sum(axis=0)
        others = len(series) - 1
        return [mser((total - row) / others).delete for row in stacked]


_CUTS = ("each", "common")


def replicate(requests, designs, *, signal: str = "ttft_s", cut: str = "each"):
    """Run designs on replications' requests and delete each run's warm-up.

    The output analysis of a replicated experiment, in one place: for every design and
    every replication, ``design(requests[i])`` gives a per-request table; it is put in
    arrival order (stable sort on ``arrival_s``, so tied arrivals keep their order);
    the warm-up of replication ``i`` is cut by :func:`warmup_cuts` on the ``signal``
    column over the design's replications (MSER-5 on the other replications' average);
    the requests after the cut are kept. Designs given the same ``requests[i]`` are
    paired (common random numbers), and ``cut`` says how paired designs are cut:

    - ``"each"``: every design its own cuts;
    - ``"common"``: replication ``i`` of every design is cut at the latest of the
      designs' cuts for it, so all designs keep the same requests;
    - a design's name: that design's cuts for all (e.g. a baseline order); only its
      ``signal`` is read (another design's may hold NaN, e.g. a rejected request).

    Parameters
    ----------
    requests : sequence of pandas.DataFrame
        One request table per replication (``arrival_s`` in s, plus whatever the
        designs read), e.g. :func:`servingcap.traffic.bootstrap_windows` of a trace, or
        tables drawn from :func:`replication_seeds`.
    designs : callable or mapping of name to callable
        ``design(table) -> per-request DataFrame`` with one row per request, an
        ``arrival_s`` column (s) and the ``signal`` column (e.g. a
        :func:`servingcap.serving.simulate` call with its replica and options).
    signal : str
        Output column MSER-5 reads (seconds, finite), default ``"ttft_s"``.
    cut : str
        ``"each"``, ``"common"`` or one of the designs' names (a mapping only).

    Returns
    -------
    list of DataFrame, or dict of name to list of DataFrame
        For one callable, the kept rows of each replication (arrival order, original
        index and columns); for a mapping, that list per design name. Replication ``i``
        dropped ``len(requests[i]) - len(kept[i])`` requests as warm-up.
    """
    import pandas as pd

    if isinstance(requests, pd.DataFrame) or isinstance(requests, (str, bytes)) or (
            not isinstance(requests, Iterable)):
        raise ValueError(f"requests must be a sequence of request tables (one per "
                         f"replication), got {type(requests).__name__}")
    tables = [_check.table(f"requests[{i}]", t, ("arrival_s",), minimum=1)
              for i, t in enumerate(requests)]
    if not tables:
        raise ValueError("requests must hold at least 1 request table, got 0")
    single = callable(designs)
    named = {"design": designs} if single else designs
    if not isinstance(named, Mapping) or not named or not all(
            callable(d) for d in named.values()):
        raise ValueError(f"designs must be a callable or a non-empty mapping of names to "
                         f"callables, got {designs!r}")
    if not isinstance(signal, str):
        raise ValueError(f"signal must be a column name, got {signal!r}")
    if not isinstance(cut, str) or cut not in _CUTS and (single or cut not in named):
        allowed = ", ".join(repr(c) for c in (*_CUTS, *(() if single else named)))
        raise ValueError(f"cut must be one of {allowed}, got {cut!r}")
    outs, cuts = {}, {}
    for name, design in named.items():
        runs, series = [], []
        for i, table in enumerate(tables):
            label = (f"designs(requests[{i}])" if single
                     else f"designs[{name!r}](requests[{i}])")
            out = design(table)
            if isinstance(out, pd.DataFrame) and signal not in out.columns:
                raise ValueError(f"signal must be a column of {label}'s output, got "
                                 f"{signal!r}; it has {list(out.columns)}")
            out = _check.table(label, out, ("arrival_s", signal))
            if len(out) != len(table):
                raise ValueError(f"{label} must return one row per request "
                                 f"({len(table)}), got {len(out)}")
            runs.append(out.sort_values("arrival_s", kind="stable"))
            if cut in _CUTS or cut == name:     # this design's cuts are used
                series.append(_check.array(f"{label}[{signal!r}] (the signal)",
                                           _check.column(runs[-1], signal, label)))
        if series:
            cuts[name] = warmup_cuts(series)
        outs[name] = runs
    if cut == "common":
        shared = np.max([cuts[n] for n in named], axis=0).tolist()
        cuts = {n: shared for n in named}
    elif cut != "each":
        cuts = {n: cuts[cut] for n in named}
    kept = {n: [r.iloc[c:] for r, c in zip(outs[n], cuts[n], strict=True)]
            for n in named}
    return kept["design"] if single else kept


# --------------------------------------------------------------------------- sequential decision


INDIFFERENCE = 0.0025
"""Default half-width of the indifference zone of :func:`feasibility`: a quarter of a
percentage point of attainment (0.0025 as a fraction). Inside ``target +- delta`` either
verdict is acceptable; outside it the verdict is wrong with probability <= ``alpha``."""

FIRST_STAGE = 10
"""Default first-stage size ``n0`` of :func:`feasibility` (replications whose sample
variance sets the continuation region). Batur & Kim (2010) require ``n0 >= 2``; a larger
``n0`` buys a smaller ``h^2`` (5: 8.65, 10: 6.01 at ``alpha = 0.05``) and robustness to
skewed units at a larger minimum cost per point. Measured on M/M/2 attainments (500
customers per replication, left-skewed): wrong verdicts at the zone's edge in 18 of 200
experiments (9 %) with ``n0 = 5``, 12 (6 %) with 10, 6 (3 %) with 20; with 1,000
customers per replication and ``n0 = 10``, 2 of 200 (tests/test_stats.py)."""

MIN_TAIL = 10
"""Fewest observations a section must hold beyond its quantile (``m * min(p, 1 - p)``)
for :func:`quantile_ci`: with fewer, a section's quantile is set by a handful of
order statistics, is biased and far from normal, and sectioning is not valid."""

@dataclass(frozen=True)
class Decision:
    """A sequential meets / misses / open verdict (:func:`feasibility`)."""

    verdict: str
    """``"meets"``, ``"misses"`` or ``"open"`` (not decided within the units given)."""
    estimate: Estimate
    """Mean of all units given, with its t-interval (what to print next to the verdict)."""
    target: float
    """The threshold decided against (unit of the data)."""
    delta: float
    """Half-width of the indifference zone (unit of the data)."""
    alpha: float
    """Bound on the probability of a wrong verdict outside ``target +- delta``."""
    used: int
    """Units the verdict rests on: where the procedure stopped, or all given when open."""
    needed: int
    """Units by which the procedure is sure to stop (where its triangular region
    closes, from the first-stage variance); ``first`` until the first stage is in."""
    method: str
    """One line: the procedure and its constants."""

    @property
    def decided(self) -> bool:
        """True for ``"meets"`` or ``"misses"``."""
        return self.verdict != "open"

    def __str__(self) -> str:
        e = self.estimate
        return (f"{self.verdict}: {e.value:.4g} ({e.confidence:.0%} CI {e.low:.4g} to "
                f"{e.high:.4g}) vs {self.target:.4g} +- {self.delta:.2g}, error <= "
                f"{self.alpha:.2g}; {self.used} of {self.needed} units ({self.method})")


def feasibility_constants(alpha: float = 0.05, first: int = FIRST_STAGE
                          ) -> tuple[float, float]:
    """``(eta, h2)`` of the single-constraint feasibility check (Batur & Kim 2010).

    For one system and one constraint (``c = 1``), ``eta`` solves
    ``(1/2) (1 + 2 eta)^(-(n0 - 1)/2) = alpha``, i.e.
    ``eta = ((2 alpha)^(-2/(n0 - 1)) - 1) / 2``, and ``h2 = 2 c eta (n0 - 1)``; these are
    the constants of Kim & Nelson's (2001) fully sequential procedure KN with ``k = 2``.
    ``alpha`` in (0, 1/2), ``first`` (``n0``) >= 2.
    """
    a = _check.probability("alpha", alpha)
    if a >= 0.5:
        raise ValueError(f"alpha must be < 0.5 (a verdict no better than a coin), "
                         f"got {alpha!r}")
    n0 = _check.whole("first", first, minimum=2)
    eta = 0.5 * ((2.0 * a) ** (-2.0 / (n0 - 1)) - 1.0)
    return eta, 2.0 * eta * (n0 - 1)


def feasibility(values, target: float, *, delta: float = INDIFFERENCE,
                alpha: float = 0.05, first: int = FIRST_STAGE, at_most: bool = False,
                confidence: float = 0.95) -> Decision:
    """Sequential verdict on "the mean of ``values`` is >= ``target``", with an
    indifference zone: ``"meets"``, ``"misses"`` or ``"open"``.

    ``values`` are independent, roughly normal units in the order they were produced,
    one per replication (e.g. each replication's SLO attainment, a fraction): "attainment
    >= target" is the same claim as "the target-quantile of the latency <= its limit".
    With ``at_most=True`` the claim is "mean <= ``target``" (a miss rate, a latency).

    The procedure is Batur & Kim's (2010) feasibility check for one system and one
    constraint, the fully sequential triangular region of Kim & Nelson (2001) (see also
    Law 2015, ch. 9 and 10, on sequential procedures for a mean). With ``n0 = first``
    units the first-stage variance ``S^2`` is computed once; then for ``r = n0, n0 + 1,
    ...`` the sum ``D_r = sum_{j <= r} (X_j - target)`` (sign flipped for ``at_most``) is
    compared with ``R(r) = max(0, h2 S^2 / (2 delta) - delta r / 2)``: ``D_r >= R(r)``
    meets, ``D_r <= -R(r)`` misses, else one more unit. ``eta`` and ``h2`` are
    :func:`feasibility_constants`. For normal units the verdict is wrong with probability
    at most ``alpha`` whenever the true mean lies outside ``target +- delta`` (inside it,
    either verdict is acceptable), and the region closes by ``r = h2 S^2 / delta^2``.
    Units far from normal (a replication's attainment is skewed when it is short and
    misses come in bursts) can err more often when ``first`` is small: a small first
    stage tends to miss the rare bad replication and underestimate ``S^2`` (see
    :data:`FIRST_STAGE`); make replications long and ``first`` >= 10.

    Every look ``r`` from ``n0`` to ``len(values)`` is scanned and the first crossing is
    the verdict, so a caller may add units in batches (e.g. to run them in parallel): the
    verdict is the one the one-at-a-time procedure would give, and extra units past the
    stop change nothing. When the units run out first, the verdict is ``"open"``: report
    it with its interval; it is not a miss.

    Parameters
    ----------
    values : array of float
        One estimate per replication, in replication order (finite).
    target : float
        The threshold (unit of ``values``).
    delta : float
        Half-width of the indifference zone, > 0 (unit of ``values``; default a quarter
        of a percentage point of attainment, :data:`INDIFFERENCE`).
    alpha : float
        Error probability outside the zone, in (0, 0.5).
    first : int
        First-stage size ``n0`` >= 2; fewer values than that give ``"open"``.
    at_most : bool
        Decide "mean <= target" instead.
    confidence : float
        Level of the reported t-interval (:func:`mean_ci`), in (0, 1).

    Returns
    -------
    Decision
    """
    x = _check.array("values", values)
    goal = _check.number("target", target)
    d = _check.positive("delta", delta)
    eta, h2 = feasibility_constants(alpha, first)
    n0 = int(first)
    if not isinstance(at_most, (bool, np.bool_)):
        raise ValueError(f"at_most must be True or False, got {at_most!r}")
    conf = _confidence(confidence)
    if x.size == 0:
        raise ValueError("values must hold at least 1 value, got 0")
    with _check.naming("values"):
        estimate = mean_ci(x, conf)
    claim = "<=" if at_most else ">="
    method = (f"Batur-Kim feasibility, n0 = {n0}, h2 = {h2:.3g}, mean {claim} target")
    if x.size < n0:
        return Decision("open", estimate, goal, d, float(alpha), int(x.size), n0,
                        method + f"; first stage incomplete ({x.size} of {n0})")
    with np.errstate(over="ignore", invalid="ignore"):
        y = (goal - x) if at_most else (x - goal)
        s2 = float(np.var(x[:n0], ddof=1))
        sums = np.cumsum(y)
    if not (np.isfinite(sums).all() and math.isfinite(s2)):
        raise _check.NumericOverflowError(
            f"values (magnitude up to {float(np.abs(x).max()):.3g}) minus target={target!r} "
            "overflow floating point; use smaller units")
    r = np.arange(1, x.size + 1, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        dd = np.float64(d)
        closes = float(h2 * s2 / dd / dd) if s2 > 0 else 0.0
        bound = np.maximum(0.0, h2 * s2 / (2.0 * dd) - 0.5 * dd * r)
    if not (math.isfinite(closes) and np.isfinite(bound).all()) or closes > 1e15:
        raise ValueError(f"delta={delta!r} with alpha={alpha!r} (h2 = {h2:.3g}) is out of "
                         f"scale with the spread of values (variance {s2:.3g}): the "
                         f"procedure would need {closes:.3g} units; use delta in the unit "
                         "of values and alpha >= 1e-6")
    needed = max(n0, math.ceil(closes))
    look = np.arange(x.size) >= n0 - 1
    meets = look & (sums >= bound)
    misses = look & (sums <= -bound) & ~meets
    stop = meets | misses
    if not stop.any():
        return Decision("open", estimate, goal, d, float(alpha), int(x.size), needed,
                        method)
    i = int(np.argmax(stop))
    verdict = "meets" if meets[i] else "misses"
    return Decision(verdict, estimate, goal, d, float(alpha), i + 1, needed, method)


def look_schedule(first: int, cap: int) -> list[int]:
    """Replication counts at which :func:`sequential_check` looks: ``first``, then
    doubling (``2 first``, ``4 first``, ...), and ``cap`` itself; all <= ``cap``.
    ``first`` >= 2, ``cap`` >= ``first``."""
    n0 = _check.whole("first", first, minimum=2)
    top = _check.whole("cap", cap)
    if top < n0:
        raise ValueError(f"cap must be >= first={n0} (the first look), got cap={cap!r}")
    out = [n0]
    while 2 * out[-1] < top:
        out.append(2 * out[-1])
    if out[-1] != top:
        out.append(top)
    return out


def sequential_check(values, target: float, *, cap: int, delta: float = INDIFFERENCE,
                     alpha: float = 0.05, first: int = FIRST_STAGE, at_most: bool = False,
                     confidence: float = 0.95) -> Decision:
    """Sequential verdict on "the mean of ``values`` is >= ``target``" by repeated
    t-intervals at fixed looks: ``"meets"``, ``"misses"`` or ``"open"``.

    ``values`` are independent units in replication order (e.g. each replication's SLO
    attainment, a fraction; "attainment >= target" is "the target-quantile of the latency
    <= its limit"). The looks are fixed in advance by ``first`` and ``cap``
    (:func:`look_schedule`: ``n0, 2 n0, 4 n0, ..., cap``, ``K`` looks). At each look ``r``
    whose units are in, the one-sided bounds ``L, U = mean -+ t_{1 - alpha/K, r-1} S /
    sqrt(r)`` are compared with the indifference zone ``target +- delta``:

    - ``L >= target - delta``: "meets" is allowed; ``U <= target + delta``: "misses" is
      allowed; the first look allowing one verdict gives it (when both are allowed the
      interval lies inside the zone, where either is right: the sign of ``mean -
      target`` picks).
    - A wrong verdict outside the zone needs a bound on the wrong side of the truth at
      some look: probability <= ``alpha / K`` per look (t-interval, normal units), so
      <= ``alpha`` in all (Bonferroni across looks; repeated confidence intervals,
      Jennison & Turnbull 2000, ch. 9).
    - The check is sure to decide at the first look whose half-width is below
      ``delta`` (Law 2015, sec. 9.4.1, the sequential procedure for a fixed absolute
      precision, with ``delta`` as the precision); far from the target it decides at
      the first look.

    With ``at_most=True`` the claim is "mean <= ``target``". Fewer than ``first``
    values, or no decisive look among those whose units are in, give ``"open"``: report
    it with its interval; it is not a miss. Values past ``cap`` are ignored.

    Parameters
    ----------
    values : array of float
        One estimate per replication, in replication order (finite).
    target : float
        The threshold (unit of ``values``).
    cap : int
        Most units the caller will produce (the last look), >= ``first``.
    delta, alpha, first, at_most, confidence
        As in :func:`feasibility`.

    Returns
    -------
    Decision
        ``needed`` is the look by which the half-width (at the current spread) falls
        below ``delta`` (may exceed ``cap``: then the point will likely stay open).
    """
    x = _check.array("values", values)
    goal = _check.number("target", target)
    d = _check.positive("delta", delta)
    a = _check.probability("alpha", alpha)
    if not 1e-9 <= a < 0.5:
        raise ValueError(f"alpha must be in [1e-9, 0.5) (below 0.5: better than a coin), "
                         f"got {alpha!r}")
    schedule = look_schedule(first, cap)
    n0 = schedule[0]
    if not isinstance(at_most, (bool, np.bool_)):
        raise ValueError(f"at_most must be True or False, got {at_most!r}")
    conf = _confidence(confidence)
    if x.size == 0:
        raise ValueError("values must hold at least 1 value, got 0")
    x = x[: schedule[-1]]
    with _check.naming("values"):
        estimate = mean_ci(x, conf)
    k = len(schedule)
    claim = "<=" if at_most else ">="
    method = (f"repeated t-intervals at {k} looks ({', '.join(map(str, schedule))}), "
              f"Bonferroni alpha/{k}, mean {claim} target")
    sign = -1.0 if at_most else 1.0
    y = sign * x                       # "mean of y >= sign * target" in both cases
    goal_y = sign * goal
    def quantile(r: int) -> float:
        return float(_st.t.isf(a / k, r - 1))

    needed = schedule[-1]
    for r in schedule:
        if r > x.size:
            break
        part = y[:r]
        with np.errstate(over="ignore", invalid="ignore"):
            mean = float(part.mean())
            spread = float(part.std(ddof=1))
            half = quantile(r) * spread / math.sqrt(r)
        if not (math.isfinite(mean) and math.isfinite(half)):
            raise _check.NumericOverflowError(
                f"values (magnitude up to {float(np.abs(x).max()):.3g}) overflow floating "
                "point; use smaller units")
        can_meet = mean - half >= goal_y - d
        can_miss = mean + half <= goal_y + d
        if can_meet or can_miss:
            verdict = ("meets" if mean >= goal_y else "misses") if can_meet and can_miss \
                else ("meets" if can_meet else "misses")
            return Decision(verdict, estimate, goal, d, a, r, r, method)
        for later in schedule:
            if later >= r and quantile(later) * spread / math.sqrt(later) < d:
                needed = later
                break
        else:
            with np.errstate(over="ignore", divide="ignore"):
                z = float(_st.norm.isf(a / k))
                guess = (z * spread / d) ** 2
            needed = int(min(max(guess, schedule[-1] + 1), 1e15))
    if x.size < n0:
        return Decision("open", estimate, goal, d, a, int(x.size), n0,
                        method + f"; first stage incomplete ({x.size} of {n0})")
    return Decision("open", estimate, goal, d, a, int(x.size), needed, method)


# --------------------------------------------------------------------------- quantile intervals


def _section_quantiles(sections: list[np.ndarray], p: float, min_tail: int,
                       what: str) -> np.ndarray:
    tail = min(p, 1.0 - p)
    for i, part in enumerate(sections):
        if part.size * tail < min_tail * (1 - 1e-9):      # 1e-9: 50 * 0.1 is 4.99...
            raise ValueError(
                f"{what}[{i}] holds {part.size} observations, so m * min(p, 1 - p) = "
                f"{part.size * tail:.3g} < min_tail={min_tail} for p={p!r}: its quantile is "
                f"set by too few order statistics for sectioning; use fewer, longer "
                f"{what} (at least {min_tail / tail:.4g} observations each)")
    return np.array([np.quantile(part, p, method="inverted_cdf") for part in sections])


def sectioning_ci(whole: float, sections, confidence: float = 0.95, *,
                  what: str = "sections") -> Estimate:
    """Sectioning interval: centred on the estimate from *all* the data, ``whole``, with
    the spread of the same estimator on each section about it.

    ``sections`` holds the estimator applied to each of ``b >= 2`` independent (or
    long, nearly independent) sections of the data: replications, or consecutive
    batches of one run. The interval is ``whole -+ t_{b-1} S / sqrt(b)`` with ``S^2 =
    sum_j (section_j - whole)^2 / (b - 1)`` (Asmussen & Glynn 2007, "Stochastic
    Simulation", sec. III.5; Law 2015, sec. 9.5). Use it for a nonlinear estimator whose
    section values are biased, such as a p99 (:func:`quantile_ci` and
    :func:`replicated_quantile_ci` call it) or a *difference of p99s* between two
    configurations run on common random numbers (``whole``: the difference of the
    whole-run p99s; ``sections``: the per-section differences). The mean of the section
    values is never the point: it carries their bias. An infinite ``whole`` or section
    (a failed request as a quantile) gives an infinite upper end.
    """
    conf = _confidence(confidence)
    if isinstance(whole, bool) or not isinstance(whole, (int, float, np.integer, np.floating)) \
            or math.isnan(float(whole)) or float(whole) == -math.inf:
        raise ValueError(f"whole must be a number (or +inf), got {whole!r}")
    value = float(whole)
    parts = _check.array("sections", sections, allow_inf=True)
    b = parts.size
    if b < 2:
        raise ValueError(f"sections must hold at least 2 values for a sectioning interval, "
                         f"got {b}")
    method = f"sectioning over {b} {what}"
    if not (math.isfinite(value) and np.isfinite(parts).all()):
        # a quantile that is a failed request (+inf): no spread to measure
        low = float(parts.min()) if math.isfinite(float(parts.min())) else value
        return Estimate(value, min(low, value), math.inf, conf, b,
                        method + "; an estimate is infinite")
    with np.errstate(over="ignore", invalid="ignore"):
        spread = float(np.sqrt(np.sum((parts - value) ** 2) / (b - 1)))
        half = float(_st.t.ppf(0.5 + conf / 2, b - 1)) * spread / math.sqrt(b)
    _check.finite_result(value + half - (value - half),
                         f"sections (estimates of magnitude up to "
                         f"{float(np.abs(parts).max()):.3g}) around whole={whole!r}")
    return Estimate(value, value - half, value + half, conf, b, method)


def _sectioning(sections: list[np.ndarray], p: float, confidence: float, min_tail: int,
                what: str) -> Estimate:
    """Sectioning (:func:`sectioning_ci`) for the ``p``-quantile: the point is the
    quantile of all sections pooled."""
    b = len(sections)
    if b < 2:
        raise ValueError(f"{what} must number at least 2 for a sectioning interval, got {b}")
    parts = _section_quantiles(sections, p, min_tail, what)
    pooled = np.concatenate(sections)
    value = float(np.quantile(pooled, p, method="inverted_cdf"))
    with _check.naming(what):
        est = sectioning_ci(value, parts, confidence, what=what)
    return dataclasses.replace(est, method=est.method.replace(
        f"sectioning over {b} {what}", f"sectioning over {b} {what} (pooled quantile)"))


def quantile_ci(values, p: float, confidence: float = 0.95, *, batches: int = 10,
                min_tail: int = MIN_TAIL) -> Estimate:
    """Interval for the ``p``-quantile of one long, correlated run, *centred on that
    run's quantile* (the number printed), by sectioning.

    The series (warm-up already deleted, e.g. TTFT in arrival order, seconds; +inf for
    failures) is cut into ``batches`` consecutive batches (the remainder at the start is
    dropped). The point estimate is the quantile of the whole kept series (inverted
    CDF); the half-width is ``t_{b-1} * sqrt(sum_j (q_j - q)^2 / (b - 1)) / sqrt(b)`` with
    ``q_j`` the batch quantiles and ``q`` the whole-run one (Asmussen & Glynn 2007,
    "Stochastic Simulation", sec. III.5, sectioning; Law 2015, sec. 9.5). A *mean* of
    batch quantiles is not used as the point: a batch quantile is biased (low for a
    p99 of a right-skewed latency), and the bias does not shrink with more batches.

    Each batch must hold ``m`` observations with ``m * min(p, 1 - p) >= min_tail``
    (e.g. >= 1,000 per batch for a p99 at the default 10): shorter batches raise
    ``ValueError`` saying how long they must be. Batches must also be much longer than
    the run's correlation time, as for :func:`batch_means_ci`.
    """
    x = _check.array("values", values, allow_inf=True)
    q = _check.probability("p", p)
    conf = _confidence(confidence)
    b = _check.whole("batches", batches, minimum=2)
    tail = _check.whole("min_tail", min_tail)
    size = x.size // b
    if size == 0:
        raise ValueError(f"values must hold at least batches={b} observations, got {x.size}")
    kept = x[x.size - b * size:]
    return _sectioning(list(kept.reshape(b, size)), q, conf, tail, "batches")


def replicated_quantile_ci(runs, p: float, confidence: float = 0.95, *,
                           min_tail: int = MIN_TAIL) -> Estimate:
    """Interval for the ``p``-quantile of independent replications pooled, centred on
    the pooled quantile (the number printed).

    ``runs`` holds one array per replication (warm-up deleted; +inf for failures). The
    replications are the sections of :func:`quantile_ci` (Asmussen & Glynn 2007, sec.
    III.5): the point is the quantile of all of them together, the half-width the
    t-spread of each replication's quantile around it. Each replication needs
    ``m * min(p, 1 - p) >= min_tail`` observations. (A t-interval over the replication
    quantiles, :func:`mean_ci`, is an interval for their *mean*, a different and, for a
    p99, lower number than the pooled p99.)
    """
    if isinstance(runs, np.ndarray) and runs.ndim == 1:
        raise ValueError("runs must be a sequence of arrays (one per replication), got "
                         "one 1-D array")
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Iterable):
        raise ValueError(f"runs must be a sequence of arrays (one per replication), got "
                         f"{runs!r}")
    parts = [_check.array(f"runs[{i}]", r, allow_inf=True) for i, r in enumerate(runs)]
    q = _check.probability("p", p)
    conf = _confidence(confidence)
    tail = _check.whole("min_tail", min_tail)
    return _sectioning(parts, q, conf, tail, "runs")
