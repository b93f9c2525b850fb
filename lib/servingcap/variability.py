"""Service-time variability: distributions with a chosen mean and C_v, and what variance costs.

The Pollaczek–Khinchine (P-K) formula says the mean FCFS wait of an M/G/1 queue is the
M/M/1 wait times the *variance penalty* ``(1 + C_v**2) / 2``, where ``C_v = sigma_S / S``
is the coefficient of variation of service time. This module holds the pieces a chapter
or a planner needs around that fact:

- seeded samplers of service times (or output lengths) with a given mean and C_v:
  :class:`Lognormal`, :class:`Gamma`, :class:`Bimodal`, :class:`CappedLognormal`, and
  :class:`Empirical` (bootstrap from a measured sample, e.g. a trace's output lengths);
- :func:`coefficient_of_variation` of a sample and :func:`variance_penalty`;
- :func:`utilization_for_equal_wait`: where the knee moves for a given C_v;
- :func:`speedup_for_wait`: the service-rate increase ("hardware") that buys a wait;
- :func:`cap_lengths` and :func:`max_cv_under_cap`: token caps;
- :func:`simulate_fcfs` and :func:`batch_means`: a seeded queue run with warm-up removed,
  and the standard error of a mean of autocorrelated waits.

Units: every sampler returns values in the unit of its ``mean`` (seconds for service
times, tokens for output lengths; multiply tokens by a decode step time in s/token to get
seconds). Rates are requests/s, utilizations are fractions in [0, 1). Bad input raises
``ValueError`` naming the parameter and its value; an unstable queue raises
:class:`~servingcap.UnstableQueueError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

from . import _check
from .queues import MMc
from .sim import fcfs_waits, poisson_arrivals

__all__ = [
    "coefficient_of_variation",
    "variance_penalty",
    "mean_residual_service",
    "Lognormal",
    "Gamma",
    "Bimodal",
    "CappedLognormal",
    "Empirical",
    "service_distribution",
    "utilization_for_equal_wait",
    "speedup_for_wait",
    "mgc_mean_wait",
    "max_arrival_rate_for_wait",
    "cap_lengths",
    "max_cv_under_cap",
    "simulate_fcfs",
    "batch_means",
]


# --------------------------------------------------------------------------- moments


@_check.guarded
def coefficient_of_variation(samples) -> float:
    """C_v = standard deviation / mean of a sample (dimensionless).

    Uses the population standard deviation (``ddof=0``), so the C_v of a sample is the
    C_v of the bootstrap distribution that resamples it (what :class:`Empirical` draws).

    Parameters
    ----------
    samples : array of float
        At least 2 values, each >= 0 (service times in s, or output lengths in tokens),
        with a positive mean.
    """
    x = _check.array("samples", samples, nonnegative_values=True)
    if x.size < 2:
        raise ValueError(f"samples needs at least 2 values, got {x.size}")
    mean = float(x.mean())
    if mean <= 0:
        raise ValueError(f"samples must have a positive mean, got {mean!r}")
    return float(x.std()) / mean


@_check.guarded
def variance_penalty(service_cv) -> float:
    """(1 + C_v**2) / 2: the P-K factor by which M/G/1's mean wait exceeds M/M/1's.

    1 for exponential service (C_v = 1), 0.5 for deterministic service (C_v = 0),
    2.5 for C_v = 2.
    """
    cv = _check.nonnegative("service_cv", service_cv)
    return (1.0 + cv * cv) / 2.0


@_check.guarded
def mean_residual_service(mean_service: float, service_cv: float) -> float:
    """E[S**2] / (2 E[S]) = S (1 + C_v**2) / 2: mean remaining service seen by an arrival (s).

    An arrival that finds the server busy lands in a service chosen with probability
    proportional to its length (the inspection paradox), so the remaining work it sees
    is on average E[S**2] / (2 E[S]), not S / 2.
    """
    s = _check.positive("mean_service", mean_service)
    return s * variance_penalty(service_cv)


# --------------------------------------------------------------------------- samplers


def _rng(rng):
    return _check.generator("rng", rng)


def _n(n):
    return _check.size("n", n, minimum=0)


@dataclass(frozen=True)
class Lognormal:
    """Lognormal values with a given ``mean`` and coefficient of variation ``cv``.

    sigma**2 = ln(1 + cv**2) and mu = ln(mean) - sigma**2 / 2 for the underlying normal.
    ``cv = 0`` gives the constant ``mean`` (deterministic service).

    Parameters
    ----------
    mean : float
        Mean (s, or tokens), > 0.
    cv : float
        Coefficient of variation, >= 0.
    """

    mean: float
    cv: float

    def __post_init__(self):
        object.__setattr__(self, "mean", _check.positive("mean", self.mean))
        object.__setattr__(self, "cv", _check.nonnegative("cv", self.cv))

    @property
    def sigma(self) -> float:
        """Standard deviation of ln(value)."""
        return math.sqrt(math.log1p(self.cv**2))

    @property
    def median(self) -> float:
        """Median, in the unit of ``mean``: mean / sqrt(1 + cv**2)."""
        return self.mean / math.sqrt(1.0 + self.cv**2)

    @property
    def second_moment(self) -> float:
        """E[X**2] = mean**2 (1 + cv**2), in the unit of ``mean`` squared."""
        return self.mean**2 * (1.0 + self.cv**2)

    def quantile(self, p: float) -> float:
        """The p-quantile, in the unit of ``mean``."""
        p = _check.probability("p", p)
        return float(self.median * math.exp(self.sigma * stats.norm.ppf(p)))

    def sample(self, n: int, rng) -> np.ndarray:
        """``n`` independent draws (unit of ``mean``); ``rng`` is a Generator or a seed."""
        n, rng = _n(n), _rng(rng)
        if self.cv == 0:
            return np.full(n, self.mean)
        return rng.lognormal(math.log(self.median), self.sigma, n)


@dataclass(frozen=True)
class Gamma:
    """Gamma values with a given ``mean`` and ``cv``: shape 1/cv**2, scale mean * cv**2.

    ``cv = 1`` is the exponential (M/M/1 service); ``cv = 0`` is the constant ``mean``.
    """

    mean: float
    cv: float

    def __post_init__(self):
        object.__setattr__(self, "mean", _check.positive("mean", self.mean))
        object.__setattr__(self, "cv", _check.nonnegative("cv", self.cv))

    @property
    def second_moment(self) -> float:
        """E[X**2] = mean**2 (1 + cv**2)."""
        return self.mean**2 * (1.0 + self.cv**2)

    def sample(self, n: int, rng) -> np.ndarray:
        """``n`` independent draws (unit of ``mean``)."""
        n, rng = _n(n), _rng(rng)
        if self.cv == 0:
            return np.full(n, self.mean)
        return rng.gamma(1.0 / self.cv**2, self.mean * self.cv**2, n)


@dataclass(frozen=True)
class Bimodal:
    """A short mode and a long mode: a two-component gamma mixture with a given mean and cv.

    A fraction ``long_fraction`` of values come from the long mode; each mode is gamma
    with coefficient of variation ``mode_cv``. The two mode means are solved so that the
    mixture has exactly ``mean`` and ``cv``: with d**2 = (1 + cv**2) / (1 + mode_cv**2) - 1,
    short = mean (1 - d sqrt(p / (1 - p))) and long = mean (1 + d sqrt((1 - p) / p)).

    Parameters
    ----------
    mean : float
        Mean (s, or tokens), > 0.
    cv : float
        Overall coefficient of variation, >= mode_cv.
    long_fraction : float
        p, share of values in the long mode, in (0, 1) and <= 1 / (1 + d**2) so the
        short mode's mean is not negative.
    mode_cv : float
        Coefficient of variation inside each mode, >= 0.
    """

    mean: float
    cv: float
    long_fraction: float = 0.05
    mode_cv: float = 0.25

    def __post_init__(self):
        with _check.overflow(f"Bimodal(mean={self.mean!r}, cv={self.cv!r}, "
                             f"long_fraction={self.long_fraction!r}, mode_cv={self.mode_cv!r})"):
            self._validate()

    def _validate(self):
        object.__setattr__(self, "mean", _check.positive("mean", self.mean))
        object.__setattr__(self, "cv", _check.nonnegative("cv", self.cv))
        object.__setattr__(self, "long_fraction",
                           _check.probability("long_fraction", self.long_fraction))
        object.__setattr__(self, "mode_cv", _check.nonnegative("mode_cv", self.mode_cv))
        if self.cv < self.mode_cv:
            raise ValueError(
                f"cv must be >= mode_cv={self.mode_cv!r} (the modes alone are that variable), "
                f"got cv={self.cv!r}"
            )
        p_max = 1.0 / (1.0 + self._d2)
        if self.long_fraction > p_max:
            raise ValueError(
                f"long_fraction must be <= {p_max:.4g} for cv={self.cv:g}, "
                f"mode_cv={self.mode_cv:g} (else the short mode's mean is negative), "
                f"got {self.long_fraction!r}"
            )

    @property
    def _d2(self) -> float:
        return (1.0 + self.cv**2) / (1.0 + self.mode_cv**2) - 1.0

    @property
    def short_mean(self) -> float:
        """Mean of the short mode (unit of ``mean``)."""
        p = self.long_fraction
        return self.mean * (1.0 - math.sqrt(self._d2 * p / (1.0 - p)))

    @property
    def long_mean(self) -> float:
        """Mean of the long mode (unit of ``mean``)."""
        p = self.long_fraction
        return self.mean * (1.0 + math.sqrt(self._d2 * (1.0 - p) / p))

    @property
    def second_moment(self) -> float:
        """E[X**2] = mean**2 (1 + cv**2)."""
        return self.mean**2 * (1.0 + self.cv**2)

    def sample(self, n: int, rng) -> np.ndarray:
        """``n`` independent draws (unit of ``mean``)."""
        n, rng = _n(n), _rng(rng)
        long = rng.random(n) < self.long_fraction
        means = np.where(long, self.long_mean, self.short_mean)
        if self.mode_cv == 0:
            return means
        k = 1.0 / self.mode_cv**2
        return rng.gamma(k, 1.0, n) * means / k


def _capped_lognormal_moments(mu: float, sigma: float, cap: float):
    """E[min(Y, cap)], E[min(Y, cap)**2] and P(Y >= cap) for Y = exp(N(mu, sigma**2))."""
    z = (math.log(cap) - mu) / sigma
    tail = float(stats.norm.sf(z))
    # exp(k mu + k**2 sigma**2 / 2) * Phi(z - k sigma), in log space so large sigma cannot overflow
    m1 = math.exp(mu + sigma**2 / 2 + stats.norm.logcdf(z - sigma)) + cap * tail
    m2 = math.exp(2 * mu + 2 * sigma**2 + stats.norm.logcdf(z - 2 * sigma)) + cap**2 * tail
    return float(m1), float(m2), tail


@dataclass(frozen=True)
class CappedLognormal:
    """Output lengths that would be lognormal but stop at a hard ``cap`` (a max-token limit).

    X = min(Y, cap) with Y lognormal; Y's median and log-spread sigma are solved so that
    X has exactly ``mean`` and ``cv``. Values that would run past the cap are cut at it,
    which puts an atom of probability ``fraction_at_cap`` at ``cap``.

    Parameters
    ----------
    mean : float
        Mean of the capped values (tokens, or s), > 0 and < cap.
    cv : float
        Coefficient of variation of the capped values, > 0 and below
        :func:`max_cv_under_cap` (mean, cap).
    cap : float
        The cap, same unit as ``mean``.
    """

    mean: float
    cv: float
    cap: float
    median: float = field(init=False)
    sigma: float = field(init=False)

    def __post_init__(self):
        with _check.overflow(f"CappedLognormal(mean={self.mean!r}, cv={self.cv!r}, "
                             f"cap={self.cap!r})"):
            self._fit()

    def _fit(self):
        m = _check.positive("mean", self.mean)
        cv = _check.positive("cv", self.cv)
        cap = _check.positive("cap", self.cap)
        if m >= cap:
            raise ValueError(f"mean must be < cap={cap!r}, got {m!r}")
        limit = max_cv_under_cap(m, cap)
        if cv >= limit:
            raise ValueError(
                f"cv must be < {limit:.4g}, the largest C_v any values in [0, {cap:g}] with "
                f"mean {m:g} can have, got {cv!r}"
            )
        object.__setattr__(self, "mean", m)
        object.__setattr__(self, "cv", cv)
        object.__setattr__(self, "cap", cap)

        def mu_for(sigma):
            lo, hi = math.log(m) - 10 * sigma - 50, math.log(cap) + 10 * sigma + 1
            return optimize.brentq(
                lambda mu: _capped_lognormal_moments(mu, sigma, cap)[0] - m, lo, hi, xtol=1e-12)

        def cv_gap(log_sigma):
            sigma = math.exp(log_sigma)
            m1, m2, _ = _capped_lognormal_moments(mu_for(sigma), sigma, cap)
            return math.sqrt(max(m2 - m1 * m1, 0.0)) / m1 - cv

        log_sigma = optimize.brentq(cv_gap, math.log(1e-4), math.log(30.0), xtol=1e-12)
        sigma = math.exp(log_sigma)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "median", math.exp(mu_for(sigma)))

    @property
    def fraction_at_cap(self) -> float:
        """Share of values that hit the cap (and would have run longer without it)."""
        return _capped_lognormal_moments(math.log(self.median), self.sigma, self.cap)[2]

    @property
    def second_moment(self) -> float:
        """E[X**2] = mean**2 (1 + cv**2)."""
        return self.mean**2 * (1.0 + self.cv**2)

    def sample(self, n: int, rng) -> np.ndarray:
        """``n`` independent draws (unit of ``mean``), each <= ``cap``."""
        n, rng = _n(n), _rng(rng)
        return np.minimum(rng.lognormal(math.log(self.median), self.sigma, n), self.cap)


class Empirical:
    """Bootstrap sampler: draws with replacement from measured values.

    Parameters
    ----------
    values : array of float
        Measured values, >= 0, at least 2 (e.g. a trace's output lengths in tokens, or
        service times in s). ``mean`` and ``cv`` are those of the values themselves
        (population standard deviation), i.e. of the distribution the sampler draws from.
    """

    def __init__(self, values):
        x = _check.array("values", values, nonnegative_values=True)
        if x.size < 2:
            raise ValueError(f"values needs at least 2 values, got {x.size}")
        with np.errstate(over="ignore"):
            mean, std = float(x.mean()), float(x.std())
        _check.finite_result(mean + std, "the mean and standard deviation of values")
        if mean <= 0:
            raise ValueError(f"values must have a positive mean, got {mean!r}")
        self.values = x

    @property
    def mean(self) -> float:
        """Mean of the values (their unit)."""
        return float(self.values.mean())

    @property
    def cv(self) -> float:
        """Coefficient of variation of the values."""
        return coefficient_of_variation(self.values)

    @property
    def second_moment(self) -> float:
        """E[X**2] of the values (their unit squared)."""
        return float(np.mean(self.values**2))

    def scaled(self, factor: float) -> Empirical:
        """The same distribution in another unit, e.g. tokens x (s/token) -> seconds."""
        factor = _check.positive("factor", factor)
        with np.errstate(over="ignore"):
            scaled = self.values * factor
        _check.finite_result(float(scaled.max()), f"values x factor={factor!r}")
        with _check.naming("factor"):
            return Empirical(scaled)

    def capped(self, cap: float) -> Empirical:
        """The distribution after a hard cap: every value above ``cap`` becomes ``cap``."""
        return Empirical(cap_lengths(self.values, cap))

    def below(self, threshold: float, inclusive: bool = True) -> Empirical:
        """The values <= ``threshold`` (or < when ``inclusive=False``), e.g. a short bucket."""
        t = _check.number("threshold", threshold)
        keep = self.values <= t if inclusive else self.values < t
        return self._subset(keep, f"<{'=' if inclusive else ''} threshold={t!r}")

    def _subset(self, keep, rule: str) -> Empirical:
        if keep.sum() < 2:
            raise ValueError(f"only {int(keep.sum())} of {self.values.size} values are {rule}; "
                             "an empirical distribution needs at least 2")
        return Empirical(self.values[keep])

    def above(self, threshold: float) -> Empirical:
        """The values > ``threshold``, e.g. a long bucket."""
        t = _check.number("threshold", threshold)
        return self._subset(self.values > t, f"> threshold={t!r}")

    def sample(self, n: int, rng) -> np.ndarray:
        """``n`` draws with replacement (unit of the values)."""
        n, rng = _n(n), _rng(rng)
        return self.values[rng.integers(0, self.values.size, n)]

    def __repr__(self) -> str:
        return f"Empirical(n={self.values.size}, mean={self.mean:.4g}, cv={self.cv:.3f})"


_KINDS = {"lognormal": Lognormal, "gamma": Gamma, "bimodal": Bimodal}


def service_distribution(kind: str, mean: float, cv: float, **options):
    """A sampler by name: ``"lognormal"``, ``"gamma"`` or ``"bimodal"`` (``options`` go to it)."""
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    return _KINDS[kind](mean, cv, **options)


# --------------------------------------------------------------------------- planning


@_check.guarded
def utilization_for_equal_wait(reference_utilization: float, service_cv: float,
                               reference_cv: float = 1.0) -> float:
    """The utilization at which service with ``service_cv`` waits as long as the reference.

    Both queues are M/G/1 with the same mean service time S. P-K gives
    W_q = S * rho * k / (1 - rho) with k = (1 + C_v**2) / 2, so equal waits need
    rho * k / (1 - rho) = r, r = rho_ref * k_ref / (1 - rho_ref), i.e.
    ``rho = r / (r + k)``. With the defaults (reference = M/M/1, C_v = 1) at
    rho_ref = 0.8 and C_v = 2: r = 4, k = 2.5, rho = 4 / 6.5 = 0.615.

    Parameters
    ----------
    reference_utilization : float
        rho_ref in [0, 1) of the reference queue (default: an M/M/1).
    service_cv : float
        C_v >= 0 of the queue whose utilization is wanted.
    reference_cv : float
        C_v >= 0 of the reference queue's service (1.0 = exponential).

    Returns
    -------
    float
        The equal-wait utilization in [0, 1). Mean response W = W_q + S is then equal too.
    """
    rho_ref = _check.nonnegative("reference_utilization", reference_utilization)
    _check.stable(rho_ref, f"reference_utilization={rho_ref:g}")
    with _check.naming("reference_cv"):
        r = rho_ref * variance_penalty(reference_cv) / (1.0 - rho_ref)
    k = variance_penalty(service_cv)
    return r / (r + k)


@_check.guarded
def mgc_mean_wait(arrival_rate: float, mean_service: float, service_cv: float,
                  servers: int = 1) -> float:
    """Mean FCFS wait of an M/G/c queue (s): exact P-K for c = 1, else the standard
    approximation W_q(M/G/c) ~ (1 + C_v**2) / 2 * W_q(M/M/c) (Lee and Longton).

    Parameters
    ----------
    arrival_rate : float
        lambda (requests/s), > 0.
    mean_service : float
        S (s), > 0; needs lambda * S < servers.
    service_cv : float
        C_v of service time, >= 0.
    servers : int
        c >= 1.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    s = _check.positive("mean_service", mean_service)
    k = variance_penalty(service_cv)
    c = _check.whole("servers", servers)
    return k * MMc(lam, _check.finite_result(1.0 / s, f"1 / mean_service={s!r}"), c).mean_wait


@_check.guarded
def speedup_for_wait(arrival_rate: float, mean_service: float, service_cv: float,
                     target_wait: float, servers: int = 1) -> float:
    """The factor by which service must get faster (hardware) to bring the mean wait to target.

    Every service time is divided by the factor x (C_v unchanged), so S -> S / x and
    rho -> rho / x. For one server P-K gives W_q(x) = lambda E[S**2] / (2 x (x - rho)),
    and W_q(x) = target solves to x = (rho + sqrt(rho**2 + 4 A)) / 2 with
    A = lambda E[S**2] / (2 target). For several servers the M/G/c approximation of
    :func:`mgc_mean_wait` is solved numerically.

    Parameters
    ----------
    arrival_rate : float
        lambda (requests/s), > 0.
    mean_service : float
        S before the speed-up (s), > 0. The queue may be unstable before it.
    service_cv : float
        C_v of service time, >= 0.
    target_wait : float
        Desired mean wait (s), > 0.
    servers : int
        c >= 1.

    Returns
    -------
    float
        x > rho / c. x > 1 means more capacity is needed; x < 1 means the target
        is met with capacity to spare.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    s = _check.positive("mean_service", mean_service)
    k = variance_penalty(service_cv)
    target = _check.positive("target_wait", target_wait)
    c = _check.whole("servers", servers)
    rho = lam * s
    if c == 1:
        a = lam * s * s * 2 * k / (2 * target)
        return (rho + math.sqrt(rho * rho + 4 * a)) / 2
    lo = rho / c * (1 + 1e-12)
    hi = max(2 * lo, 1.0)
    while mgc_mean_wait(lam, s / hi, service_cv, c) > target:
        hi *= 2
    return optimize.brentq(lambda x: mgc_mean_wait(lam, s / x, service_cv, c) - target,
                           lo, hi, xtol=1e-12, rtol=1e-12)


@_check.guarded
def max_arrival_rate_for_wait(mean_service: float, service_cv: float, target_wait: float,
                              servers: int = 1) -> float:
    """The largest arrival rate (requests/s) whose mean FCFS wait stays within ``target_wait``.

    Inverts :func:`mgc_mean_wait` (exact P-K for one server, the M/G/c approximation for
    several). For one server it is closed form: rho k / (1 - rho) = target / S with
    k = (1 + C_v**2) / 2 gives rho = t / (t + k), t = target / S, and lambda = rho / S.

    Parameters
    ----------
    mean_service : float
        S (s), > 0.
    service_cv : float
        C_v of service time, >= 0.
    target_wait : float
        Mean-wait budget (s), > 0.
    servers : int
        c >= 1.

    Returns
    -------
    float
        lambda_max (requests/s), always below servers / S (a stable queue).
    """
    s = _check.positive("mean_service", mean_service)
    k = variance_penalty(service_cv)
    target = _check.positive("target_wait", target_wait)
    c = _check.whole("servers", servers)
    if c == 1:
        t = target / s
        return t / (t + k) / s
    top = c / s * (1 - 1e-12)
    return optimize.brentq(lambda lam: mgc_mean_wait(lam, s, service_cv, c) - target,
                           top * 1e-9, top, xtol=1e-12, rtol=1e-12)


@_check.guarded
def cap_lengths(values, cap: float) -> np.ndarray:
    """Apply a hard length cap: every value above ``cap`` becomes ``cap`` (same unit).

    Parameters
    ----------
    values : array of float
        Output lengths (tokens) or service times (s), >= 0.
    cap : float
        The cap, > 0, same unit.
    """
    x = _check.array("values", values, nonnegative_values=True)
    c = _check.positive("cap", cap)
    return np.minimum(x, c)


@_check.guarded
def max_cv_under_cap(mean: float, cap: float) -> float:
    """The largest C_v values in [0, cap] with this mean can have: sqrt(cap / mean - 1).

    Because X <= cap, E[X**2] <= cap * E[X], so C_v**2 = E[X**2] / mean**2 - 1 <=
    cap / mean - 1, with equality for the two-point distribution on {0, cap}.
    """
    m = _check.positive("mean", mean)
    c = _check.positive("cap", cap)
    if m > c:
        raise ValueError(f"mean must be <= cap={c!r}, got {m!r}")
    return math.sqrt(c / m - 1.0)


# --------------------------------------------------------------------------- simulation


def simulate_fcfs(arrival_rate: float, distribution, n: int, rng, warmup: int = 0,
                  servers: int = 1):
    """Simulate ``n`` Poisson arrivals through a FCFS queue; drop the first ``warmup``.

    Parameters
    ----------
    arrival_rate : float
        lambda (requests/s), > 0.
    distribution : object with ``sample(n, rng)``
        Service-time sampler returning seconds (any sampler of this module).
    n : int
        Requests kept after the warm-up, >= 1.
    rng : numpy.random.Generator or seed
    warmup : int
        Requests simulated first and discarded (the queue starts empty), >= 0.
    servers : int
        Servers sharing the queue, >= 1.

    Returns
    -------
    (waits, services) : tuple of numpy.ndarray
        Waiting times and service times (s) of the ``n`` kept requests, in arrival order.
        Response times are ``waits + services``.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    n = _check.size("n", n)
    warmup = _check.size("warmup", warmup, minimum=0)
    if not callable(getattr(distribution, "sample", None)):
        raise ValueError("distribution must have a sample(n, rng) method (e.g. "
                         f"variability.Lognormal), got {distribution!r}")
    rng = _rng(rng)
    total = _check.size("n + warmup", n + warmup)
    arrivals = poisson_arrivals(lam, total, rng)
    services = _check.array("distribution.sample(n, rng)", distribution.sample(total, rng),
                            nonnegative_values=True)
    if services.size != total:
        raise ValueError(f"distribution.sample(n, rng) must return {total} values, "
                         f"got {services.size}")
    waits = fcfs_waits(arrivals, services, servers)
    return waits[warmup:], services[warmup:]


def batch_means(values, batches: int = 20):
    """Mean of a (possibly autocorrelated) series and its standard error by batch means.

    Consecutive waits in a queue are strongly correlated, so the naive standard error
    s / sqrt(n) is far too small. Cutting the series into ``batches`` contiguous batches
    long compared with the correlation time makes the batch averages nearly independent;
    their spread gives the standard error: sd(batch means) / sqrt(batches).

    Parameters
    ----------
    values : array of float
        The series, in arrival order (e.g. waits in s), length >= 2 * batches.
    batches : int
        Number of batches, >= 2 (10-30 is usual).

    Returns
    -------
    (mean, standard_error) : tuple of float
        In the unit of ``values``. Leftover values that do not fill a batch are dropped.
    """
    x = _check.array("values", values)
    b = _check.whole("batches", batches, minimum=2)
    if x.size < 2 * b:
        raise ValueError(f"values needs at least 2 * batches = {2 * b} values, got {x.size}")
    size = x.size // b
    means = x[: size * b].reshape(b, size).mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(b))
