"""Closed-form queueing results: Little's law, M/M/1, M/G/1, M/M/c, Erlang B and C.

Units: rates in items per second, times in seconds, loads in Erlangs (busy servers).
Every class is a frozen description of one queue, in the style of scipy.stats' frozen
distributions: ``MM1(arrival_rate=0.9, service_rate=1.0).mean_response`` reads like the
math. Constructing an unstable queue (utilization >= 1) raises
:class:`~servingcap.UnstableQueueError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from . import _check

__all__ = [
    "little",
    "LittleCheck",
    "little_check",
    "MM1",
    "MG1",
    "MMc",
    "erlang_b",
    "erlang_c",
    "sqrt_staffing",
    "sqrt_staffing_beta",
    "sqrt_staffing_load",
    "halfin_whitt_prob_wait",
]


# --------------------------------------------------------------------------- Little


def little(L=None, arrival_rate=None, time_in_system=None) -> float:
    """Solve Little's law ``L = arrival_rate * time_in_system`` for the missing term.

    Give exactly two of the three; the third is returned.

    Parameters
    ----------
    L : float, optional
        Mean number of items inside the boundary (items).
    arrival_rate : float, optional
        Rate at which items pass through the boundary (items/s), > 0.
    time_in_system : float, optional
        Mean time an item spends inside the boundary (s).

    Examples
    --------
    >>> little(arrival_rate=20, time_in_system=0.5)
    10.0
    """
    given = {k: v for k, v in
             {"L": L, "arrival_rate": arrival_rate, "time_in_system": time_in_system}.items()
             if v is not None}
    if len(given) != 2:
        raise ValueError(
            "little() needs exactly two of L, arrival_rate, time_in_system; "
            f"got {sorted(given) or 'none'}"
        )
    if L is not None:
        L = _check.nonnegative("L", L)
    if arrival_rate is not None:
        arrival_rate = _check.positive("arrival_rate", arrival_rate)
    if time_in_system is not None:
        time_in_system = _check.nonnegative("time_in_system", time_in_system)
    if L is None:
        return _check.finite_result(arrival_rate * time_in_system,
                                    f"arrival_rate={arrival_rate!r} * time_in_system={time_in_system!r}")
    if arrival_rate is None:
        if time_in_system == 0:
            raise ValueError("time_in_system must be > 0 to solve for arrival_rate, got 0.0")
        return _check.finite_result(L / time_in_system, f"L={L!r} / time_in_system={time_in_system!r}")
    return _check.finite_result(L / arrival_rate, f"L={L!r} / arrival_rate={arrival_rate!r}")


@dataclass(frozen=True)
class LittleCheck:
    """Result of checking three measured numbers against ``L = lambda * W``."""

    L: float
    arrival_rate: float
    time_in_system: float
    rtol: float

    @property
    def implied_L(self) -> float:
        """The in-flight count the rate and time imply (items)."""
        return self.arrival_rate * self.time_in_system

    @property
    def ratio(self) -> float:
        """Measured L over implied L (1.0 when consistent)."""
        return self.L / self.implied_L if self.implied_L > 0 else math.inf

    @property
    def consistent(self) -> bool:
        """True when measured and implied L agree within ``rtol``."""
        return math.isclose(self.L, self.implied_L, rel_tol=self.rtol)

    def __str__(self) -> str:
        verdict = "consistent" if self.consistent else "INCONSISTENT"
        return (f"{verdict}: lambda*W = {self.arrival_rate:g}/s x {self.time_in_system:g} s "
                f"= {self.implied_L:g} in flight, dashboard says {self.L:g} "
                f"(ratio {self.ratio:.2f})")


def little_check(L, arrival_rate, time_in_system, rtol: float = 0.05) -> LittleCheck:
    """Check a dashboard's in-flight count, throughput and mean time against each other.

    Parameters
    ----------
    L : float
        Reported mean number in flight (items).
    arrival_rate : float
        Reported completion (or arrival) rate at the same boundary (items/s).
    time_in_system : float
        Reported mean time inside the same boundary (s).
    rtol : float
        Relative disagreement tolerated before the numbers are called inconsistent.
    """
    return LittleCheck(
        L=_check.nonnegative("L", L),
        arrival_rate=_check.positive("arrival_rate", arrival_rate),
        time_in_system=_check.nonnegative("time_in_system", time_in_system),
        rtol=_check.positive("rtol", rtol),
    )


# --------------------------------------------------------------------------- M/M/1


class _ExponentialWait:
    """Queueing delay of M/M/1 and M/M/c: zero with probability 1 - P(wait), otherwise
    exponential with the drain rate (c mu - lambda). Subclasses give ``prob_wait`` and
    ``_drain`` (1/s)."""

    @property
    def mean_wait(self) -> float:
        """W_q = P(wait) / (c mu - lambda): mean time queued before service (s)."""
        return self.prob_wait / self._drain

    def wait_cdf(self, t):
        """P(wait <= t) = 1 - P(wait) exp(-(c mu - lambda) t) for t >= 0.

        ``t`` in seconds, a number or an array (any shape; +-inf allowed, NaN is not).
        """
        t = _check.points("t", t)
        return np.where(t < 0, 0.0,
                        1 - self.prob_wait * np.exp(-self._drain * np.maximum(t, 0)))

    def wait_quantile(self, p: float) -> float:
        """The p-quantile of queueing delay (s); 0 when p <= 1 - P(wait) (no wait)."""
        p = _check.probability("p", p)
        waits = self.prob_wait
        if p <= 1 - waits:
            return 0.0
        return math.log(waits / (1 - p)) / self._drain


@dataclass(frozen=True)
class MM1(_ExponentialWait):
    """One FCFS server, Poisson arrivals, exponential service.

    Parameters
    ----------
    arrival_rate : float
        lambda, requests/s, > 0.
    service_rate : float
        mu, requests/s one server completes when busy, > arrival_rate.
    """

    arrival_rate: float
    service_rate: float

    def __post_init__(self):
        lam = _check.positive("arrival_rate", self.arrival_rate)
        mu = _check.positive("service_rate", self.service_rate)
        object.__setattr__(self, "arrival_rate", lam)
        object.__setattr__(self, "service_rate", mu)
        _check.stable(lam / mu, f"arrival_rate={lam:g}/s, service_rate={mu:g}/s")

    @property
    def utilization(self) -> float:
        """rho = lambda / mu (fraction of time the server is busy)."""
        return self.arrival_rate / self.service_rate

    @property
    def mean_service(self) -> float:
        """S = 1 / mu (s)."""
        return 1.0 / self.service_rate

    @property
    def _drain(self) -> float:
        return self.service_rate - self.arrival_rate

    @property
    def mean_response(self) -> float:
        """W = 1 / (mu - lambda) = S / (1 - rho): mean time in system (s)."""
        return 1.0 / self._drain

    @property
    def prob_wait(self) -> float:
        """P(an arrival waits) = rho (Poisson arrivals see the time average)."""
        return self.utilization

    @property
    def mean_in_system(self) -> float:
        """L = rho / (1 - rho): mean number in system (requests)."""
        return self.utilization / (1 - self.utilization)

    def response_cdf(self, t):
        """P(response <= t): response time is exponential with rate mu - lambda.

        ``t`` in seconds, a number or an array (any shape; +-inf allowed, NaN is not).
        """
        t = _check.points("t", t)
        return np.where(t < 0, 0.0, -np.expm1(-self._drain * np.maximum(t, 0)))

    def response_quantile(self, p: float) -> float:
        """The p-quantile of response time: -ln(1 - p) / (mu - lambda) (s)."""
        p = _check.probability("p", p)
        return -math.log1p(-p) / self._drain


# --------------------------------------------------------------------------- M/G/1


class _FromMeanWait:
    """W and L_q of a single-server queue that knows W_q, S and lambda."""

    @property
    def mean_response(self) -> float:
        """W = W_q + S (s)."""
        return self.mean_wait + self.mean_service

    @property
    def mean_queue_length(self) -> float:
        """L_q = lambda * W_q (requests waiting, by Little's law)."""
        return self.arrival_rate * self.mean_wait


@dataclass(frozen=True)
class MG1(_FromMeanWait):
    """One FCFS server, Poisson arrivals, general service (Pollaczek–Khinchine).

    Parameters
    ----------
    arrival_rate : float
        lambda, requests/s, > 0.
    mean_service : float
        S, mean service time (s), > 0; needs lambda * S < 1.
    service_cv : float
        C_v = sigma_S / S, coefficient of variation of service time, >= 0
        (0 is deterministic service, 1 recovers M/M/1).
    """

    arrival_rate: float
    mean_service: float
    service_cv: float

    def __post_init__(self):
        lam = _check.positive("arrival_rate", self.arrival_rate)
        s = _check.positive("mean_service", self.mean_service)
        cv = _check.nonnegative("service_cv", self.service_cv)
        for name, value in (("arrival_rate", lam), ("mean_service", s), ("service_cv", cv)):
            object.__setattr__(self, name, value)
        _check.stable(lam * s, f"arrival_rate={lam:g}/s, mean_service={s:g} s")
        _check.finite_result(self.mean_wait, f"the mean wait with arrival_rate={lam:g}/s, "
                                             f"mean_service={s:g} s, service_cv={cv:g}")

    @classmethod
    def from_service_times(cls, arrival_rate: float, service_times) -> MG1:
        """An M/G/1 whose S and C_v are measured from a sample of service times (s)."""
        x = _check.array("service_times", service_times, nonnegative_values=True)
        if x.size < 2:
            raise ValueError(f"service_times needs at least 2 values, got {x.size}")
        with np.errstate(over="ignore"):
            mean, std = float(x.mean()), float(x.std())
        _check.finite_result(mean + std, "the mean and standard deviation of service_times")
        return cls(arrival_rate, mean, std / mean if mean > 0 else 0.0)

    @property
    def utilization(self) -> float:
        """rho = lambda * S."""
        return self.arrival_rate * self.mean_service

    @property
    def variance_penalty(self) -> float:
        """(1 + C_v^2) / 2: the factor by which the mean wait exceeds M/M/1's at equal rho."""
        return (1 + self.service_cv * self.service_cv) / 2      # inf, not OverflowError

    @property
    def mean_wait(self) -> float:
        """W_q = rho * S * (1 + C_v^2) / (2 (1 - rho)) (s): Pollaczek–Khinchine."""
        rho = self.utilization
        return rho * self.mean_service * self.variance_penalty / (1 - rho)

# --------------------------------------------------------------------------- Erlang


def _servers_and_load(servers, offered_load):
    c = _check.whole("servers", servers)
    if c > _check.MAX_SERVERS:
        raise ValueError(f"servers must be <= {_check.MAX_SERVERS:.0e} (far past any fleet), "
                         f"got {servers!r}")
    return c, _check.positive("offered_load", offered_load)


# Up to this many servers the overloaded Erlang B uses the exact O(c) recursion (a few
# milliseconds); past it, a bounded-cost method (see _erlang_b_overloaded).
_RECURSION_SERVERS = 100_000


def _erlang_b_overloaded(c: int, a: float) -> float:
    """Erlang B for a > c > _RECURSION_SERVERS at a cost that does not grow with c alone.

    When P(N <= c), N ~ Poisson(a), is not tiny, the log-space ratio pmf/cdf is exact.
    Otherwise a >> c (relative to sqrt(c)), and 1/B = sum_k prod_{j<k} (c - j)/a is summed
    in blocks until the terms drop below 1e-17 of the sum: they fall at least like
    (c/a)^k * exp(-k^2 / 2c), so about 40 / ln(a/c) or 9 sqrt(c) terms at most.
    """
    log_cdf = float(stats.poisson.logcdf(c, a))
    if log_cdf > -600:
        return float(np.exp(stats.poisson.logpmf(c, a) - log_cdf))
    total, log_t, k = 0.0, 0.0, 0
    block = 65_536
    while k <= c:
        j = np.arange(k, min(k + block, c + 1), dtype=float)
        # log t_k for k in this block: running sum of log((c - j + 1)/a), t_0 = 1.
        steps = np.log1p(-(a - c + j - 1) / a)
        steps[j == 0] = 0.0
        logs = log_t + np.cumsum(steps)
        terms = np.exp(logs)
        total += float(terms.sum())
        log_t, k = float(logs[-1]), k + j.size
        if terms[-1] < 1e-17 * total:
            break
    return 1.0 / total


def erlang_b(servers: int, offered_load: float) -> float:
    """Erlang B: probability an arrival finds all ``servers`` busy in a loss system.

    Computed as P(N = c) / P(N <= c) for N ~ Poisson(offered_load) in log space when
    a <= c, and by the classic recursion when a > c, so it is exact and stable for
    thousands of servers at any load.

    Parameters
    ----------
    servers : int
        c, number of servers, >= 1.
    offered_load : float
        a = lambda / mu in Erlangs, > 0.
    """
    c, a = _servers_and_load(servers, offered_load)
    if a <= c:
        # P(N <= c) >= 1/2 here, so the log-space ratio cannot underflow.
        return float(np.exp(stats.poisson.logpmf(c, a) - stats.poisson.logcdf(c, a)))
    if c > _RECURSION_SERVERS:
        return _erlang_b_overloaded(c, a)
    # Overloaded loss system: the stable recursion 1/B(k) = 1 + (k/a) / B(k-1) stays
    # bounded (1/B <= a / (a - c)), where the Poisson CDF would underflow.
    inverse = 1.0
    for k in range(1, c + 1):
        inverse = 1.0 + inverse * k / a
    return 1.0 / inverse


def erlang_c(servers: int, offered_load: float) -> float:
    """Erlang C: probability an arrival must wait in an M/M/c queue.

    C = c B / (c - a (1 - B)) with B = Erlang B, stable for thousands of servers.
    Raises :class:`~servingcap.UnstableQueueError` when a >= c.
    """
    c, a = _servers_and_load(servers, offered_load)
    _check.stable(a / c, f"offered_load={a:g} Erlangs on servers={c}")
    b = erlang_b(c, a)
    return min(1.0, c * b / (c - a * (1 - b)))


@_check.guarded
def sqrt_staffing(offered_load: float, beta: float) -> int:
    """Square-root staffing: the smallest whole c >= a + beta * sqrt(a).

    Parameters
    ----------
    offered_load : float
        a in Erlangs (busy servers needed on average), > 0.
    beta : float
        Quality-of-service parameter, >= 0; beta = 2 keeps the chance of waiting
        near 3 %. The result is always > a, so the queue is stable.
    """
    a = _check.positive("offered_load", offered_load)
    beta = _check.nonnegative("beta", beta)
    target = a + beta * math.sqrt(a)
    c = math.ceil(target - 1e-9 * target)  # tolerate round-off when target is whole
    return max(c, math.floor(a) + 1)


@_check.guarded
def sqrt_staffing_beta(servers: float, offered_load: float) -> float:
    """The beta at which ``servers`` carry ``offered_load``: beta = (c - a) / sqrt(a),
    the staffing rule c = a + beta * sqrt(a) read backwards (before any rounding).

    Parameters
    ----------
    servers : float
        c, > 0, in the unit of the load (replicas, slots); need not be whole.
    offered_load : float
        a, in the same unit, 0 < a < c. Raises :class:`~servingcap.UnstableQueueError`
        when a >= c (no headroom: the rule does not apply to an unstable queue).
    """
    c = _check.positive("servers", servers)
    a = _check.positive("offered_load", offered_load)
    _check.stable(a / c, f"offered_load={a:g} on servers={c:g}")
    return (c - a) / math.sqrt(a)


@_check.guarded
def sqrt_staffing_load(servers: float, beta: float) -> float:
    """The offered load ``servers`` carry at ``beta``: the root a of
    a + beta * sqrt(a) = c, sqrt(a) = (sqrt(beta^2 + 4c) - beta) / 2
    = 2c / (sqrt(beta^2 + 4c) + beta).

    The inverse of :func:`sqrt_staffing` in the load, without its rounding: what a
    fleet of c servers can take at the same quality of service (beta from
    :func:`sqrt_staffing_beta`). A larger fleet carries more per server: a / c rises
    towards 1 as c grows at fixed beta.

    Parameters
    ----------
    servers : float
        c, > 0, in the unit of the load; need not be whole.
    beta : float
        Quality-of-service parameter, > 0 (at 0 the load would equal c: unstable).
    """
    c = _check.positive("servers", servers)
    beta = _check.positive("beta", beta)
    root = 2 * c / (math.sqrt(beta * beta + 4 * c) + beta)    # (no cancellation)
    return root * root


def halfin_whitt_prob_wait(beta: float) -> float:
    """Halfin–Whitt (1981) limit of P(wait) under c = a + beta * sqrt(a) staffing.

    P(wait) -> 1 / (1 + beta * Phi(beta) / phi(beta)), beta > 0.
    """
    beta = _check.positive("beta", beta)
    # Phi/phi via the scaled complementary error function, stable for large beta.
    ratio = math.sqrt(math.pi / 2) * special.erfcx(-beta / math.sqrt(2))
    return 1.0 / (1.0 + beta * ratio)


# --------------------------------------------------------------------------- M/M/c


@dataclass(frozen=True)
class MMc(_ExponentialWait):
    """``servers`` FCFS servers sharing one queue, Poisson arrivals, exponential service.

    Parameters
    ----------
    arrival_rate : float
        lambda, requests/s, > 0.
    service_rate : float
        mu, requests/s per busy server, > 0.
    servers : int
        c >= 1; needs lambda < c * mu.
    """

    arrival_rate: float
    service_rate: float
    servers: int

    def __post_init__(self):
        lam = _check.positive("arrival_rate", self.arrival_rate)
        mu = _check.positive("service_rate", self.service_rate)
        c = _check.whole("servers", self.servers)
        object.__setattr__(self, "arrival_rate", lam)
        object.__setattr__(self, "service_rate", mu)
        object.__setattr__(self, "servers", c)
        _check.stable(lam / (c * mu),
                      f"arrival_rate={lam:g}/s, service_rate={mu:g}/s, servers={c}")

    @property
    def offered_load(self) -> float:
        """a = lambda / mu (Erlangs: busy servers on average)."""
        return self.arrival_rate / self.service_rate

    @property
    def utilization(self) -> float:
        """rho = lambda / (c mu), the busy fraction of each server."""
        return self.offered_load / self.servers

    @property
    def prob_wait(self) -> float:
        """Erlang C: probability an arrival finds every server busy."""
        return erlang_c(self.servers, self.offered_load)

    @property
    def _drain(self) -> float:
        return self.servers * self.service_rate - self.arrival_rate


    @property
    def mean_response(self) -> float:
        """W = W_q + 1 / mu (s)."""
        return self.mean_wait + 1.0 / self.service_rate

    @property
    def mean_queue_length(self) -> float:
        """L_q = lambda W_q (requests waiting)."""
        return self.arrival_rate * self.mean_wait

    def _response_sf(self, t: np.ndarray) -> np.ndarray:
        # T = W_q + S: with prob 1 - C only the exponential(mu) service; with prob C an
        # exponential(delta) wait plus it, a hypoexponential (equal rates: Erlang-2).
        mu, delta, c = self.service_rate, self._drain, self.prob_wait
        t = np.maximum(t, 0.0)
        service = np.exp(-mu * t)
        if math.isclose(delta, mu, rel_tol=1e-9):
            with np.errstate(invalid="ignore", over="ignore"):   # t = inf: 0, not inf * 0
                both = np.where(np.isfinite(t), (1.0 + mu * t) * service, 0.0)
        else:
            both = (delta * service - mu * np.exp(-delta * t)) / (delta - mu)
        return (1.0 - c) * service + c * both

    def response_cdf(self, t):
        """P(response <= t), response = queueing delay + exponential(mu) service.

        The wait is 0 with probability 1 - C (Erlang C), else exponential with rate
        c mu - lambda, independent of the request's own service (Kleinrock 1975,
        vol. 1, section 3.5). ``t`` in seconds, a number or an array.
        """
        t = _check.points("t", t)
        return np.where(t < 0, 0.0, 1.0 - self._response_sf(t))

    def response_quantile(self, p: float) -> float:
        """The p-quantile of response time (s), by root finding on response_cdf."""
        p = _check.probability("p", p)
        hi = -math.log1p(-p) * (1.0 / self.service_rate + 1.0 / self._drain)
        while float(self._response_sf(np.array(hi))) > 1 - p:   # widen until bracketed
            hi *= 2.0
        return float(optimize.brentq(
            lambda t: float(self._response_sf(np.array(t))) - (1 - p), 0.0, hi,
            xtol=1e-12, rtol=1e-12))



# --------------------------------------------------------------------------- G/G/1


@dataclass(frozen=True)
class GG1(_FromMeanWait):
    """One FCFS server, general arrivals and general service: Kingman's approximation.

    Kingman's heavy-traffic formula prices both kinds of variability at once,

        W_q ~= rho / (1 - rho) * (C_a^2 + C_s^2) / 2 * S,

    where C_a is the coefficient of variation of the gaps between arrivals and C_s that
    of the service times. With Poisson arrivals (C_a = 1) it *is* the
    Pollaczek–Khinchine mean of :class:`MG1`; otherwise it is an approximation that
    becomes exact as rho -> 1 (tests/test_gg1.py measures a few per cent of error at
    rho = 0.9 for gamma gaps and services). It assumes independent gaps (a renewal
    arrival process): correlated bursts, as in real traces, add waiting it does not see.

    Parameters
    ----------
    arrival_rate : float
        lambda, requests/s, > 0.
    mean_service : float
        S, mean service time (s), > 0; needs lambda * S < 1.
    arrival_cv : float
        C_a = sd / mean of the inter-arrival gaps, >= 0 (1 for Poisson, 0 for clockwork).
    service_cv : float
        C_s = sd / mean of the service times, >= 0 (1 for exponential, 0 for fixed).
    """

    arrival_rate: float
    mean_service: float
    arrival_cv: float
    service_cv: float

    def __post_init__(self):
        lam = _check.positive("arrival_rate", self.arrival_rate)
        s = _check.positive("mean_service", self.mean_service)
        ca = _check.nonnegative("arrival_cv", self.arrival_cv)
        cs = _check.nonnegative("service_cv", self.service_cv)
        for name, value in (("arrival_rate", lam), ("mean_service", s),
                            ("arrival_cv", ca), ("service_cv", cs)):
            object.__setattr__(self, name, value)
        _check.stable(lam * s, f"arrival_rate={lam:g}/s, mean_service={s:g} s")

    @classmethod
    def from_samples(cls, arrival_times, service_times) -> GG1:
        """A G/G/1 whose rates and CVs are measured from arrival times (s, non-decreasing)
        and service times (s): lambda = 1 / mean gap, C_a = sd / mean of the gaps."""
        a, s = _check.arrivals_and_services(arrival_times, service_times)
        if a.size < 3:
            raise ValueError(f"arrival_times needs at least 3 values, got {a.size}")
        gaps = np.diff(a)
        mean_gap = float(gaps.mean())
        if mean_gap <= 0:
            raise ValueError("arrival_times must span a positive time, got all equal values")
        mean_s = float(s.mean())
        return cls(1.0 / mean_gap, mean_s, float(gaps.std()) / mean_gap,
                   float(s.std()) / mean_s if mean_s > 0 else 0.0)

    @property
    def utilization(self) -> float:
        """rho = lambda * S."""
        return self.arrival_rate * self.mean_service

    @property
    def variability_factor(self) -> float:
        """(C_a^2 + C_s^2) / 2: the wait relative to M/M/1's at the same rho (M/M/1 = 1)."""
        return (self.arrival_cv**2 + self.service_cv**2) / 2

    @property
    def mean_wait(self) -> float:
        """W_q ~= rho / (1 - rho) * (C_a^2 + C_s^2) / 2 * S (s): Kingman."""
        rho = self.utilization
        return rho / (1 - rho) * self.variability_factor * self.mean_service


__all__ += ["GG1"]
