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
  These are the intervals to report for a simulated percentile or attainment fraction.
- :func:`percentile_ci` (distribution-free, order statistics) and :func:`proportion_ci`
  (Wilson or Clopper-Pearson, from :func:`scipy.stats.binomtest`) assume *independent*
  observations. Applied to one run's requests they are too narrow; apply them to
  independent data (or to one observation per replication).
- :func:`replication_seeds` gives each replication its own stream with
  :meth:`numpy.random.SeedSequence.spawn`; reusing replication *i*'s seed for every
  configuration compared is the common-random-numbers design.
- :func:`steady_state` returns a :class:`Verdict`: ``"unstable"`` when the warm-up does
  not end by mid-run or the latency keeps climbing across the run (a queue with
  utilization >= 1, or a fleet whose routing synchronizes), so that no number is
  reported for a system that has no steady state.

Every interval is an :class:`Estimate`; :meth:`Estimate.decide` says whether it meets,
misses or cannot yet tell a target.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from . import _check

__all__ = ["Estimate", "mser", "Warmup", "mean_ci", "batch_means_ci", "percentile_ci",
           "proportion_ci", "replication_seeds", "Verdict", "steady_state", "warmup_cuts"]

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

    This is the interval to use for a simulated percentile or attainment: each
    replication (its own seed, warm-up deleted) gives one estimate, and replications are
    independent even though requests within one are not. With one estimate the
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
    of one simulated run are *not* independent: for those, use one percentile per
    replication and :func:`mean_ci`. Ends that fall outside the sample are +-inf.
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
