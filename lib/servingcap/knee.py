"""The utilization knee: marginal latency cost, a computed knee, and headroom for a tail target.

Units: utilizations are fractions in [0, 1); times are seconds; ``mean_service`` is the
mean service time S (s) of one job on one server. A "point" of utilization is a step of
``point`` in rho (0.01 by default, one percentage point).

The book's definition of the knee (chapter "The utilization knee"):

    the knee is the utilization at which one more point of utilization raises the mean
    response time by ``cost_per_point`` mean service times (one S by default).

For M/M/1, W = S / (1 - rho), so dW/drho = S / (1 - rho)**2 and the knee solves
``point * S / (1 - rho)**2 = cost_per_point * S``, i.e.
``rho_knee = 1 - sqrt(point / cost_per_point)`` (0.90 with the defaults). The definition
is in units of S, so it does not depend on how fast the server is, and it applies to any
mean-response curve (see :func:`find_knee`), e.g. an M/G/1 curve whose knee moves left as
service-time variance grows.
"""

from __future__ import annotations

import math

import numpy as np

from . import _check

__all__ = [
    "marginal_cost",
    "mm1_knee",
    "find_knee",
    "max_utilization_for_quantile",
    "headroom_gain",
]


def _utilizations(name: str, rho) -> np.ndarray:
    """Validate a utilization or an array of them: finite, >= 0 and < 1 (stable)."""
    scalar = np.ndim(rho) == 0
    if scalar:
        values = np.array([_check.number(name, rho)])
    else:
        values = _check.array(name, rho)
    if (values < 0).any():
        bad = values[np.argmax(values < 0)]
        raise ValueError(f"{name} must be >= 0, got {float(bad)!r}")
    if (values >= 1).any():
        bad = float(values[np.argmax(values >= 1)])
        _check.stable(bad, f"{name}={bad:g}")
    return values


@_check.guarded
def marginal_cost(rho, mean_service: float = 1.0):
    """dW/drho = S / (1 - rho)**2: the M/M/1 mean-response cost of more utilization.

    Parameters
    ----------
    rho : float or array of float
        Utilization(s), 0 <= rho < 1. rho >= 1 raises :class:`~servingcap.UnstableQueueError`.
    mean_service : float
        S, mean service time (s), > 0.

    Returns
    -------
    float or numpy.ndarray
        Seconds of mean response time per unit of utilization (multiply by 0.01 for
        the cost of one percentage point). A float for a scalar ``rho``.
    """
    s = _check.positive("mean_service", mean_service)
    values = _utilizations("rho", rho)
    out = s / (1.0 - values) ** 2
    return float(out[0]) if np.ndim(rho) == 0 else out


@_check.guarded
def mm1_knee(cost_per_point: float = 1.0, point: float = 0.01) -> float:
    """The M/M/1 knee: the utilization where one more ``point`` costs ``cost_per_point`` S.

    Solves ``point * S / (1 - rho)**2 = cost_per_point * S``:
    ``rho_knee = 1 - sqrt(point / cost_per_point)``. Independent of S.

    Parameters
    ----------
    cost_per_point : float
        Threshold, in mean service times S of extra mean response per ``point``, > 0.
        Must exceed ``point``, the cost of a point at zero load.
    point : float
        Size of one step of utilization, 0 < point < 1 (0.01 = one percentage point).

    Returns
    -------
    float
        The knee utilization, in (0, 1).
    """
    c = _check.positive("cost_per_point", cost_per_point)
    d = _check.probability("point", point)
    if c <= d:
        raise ValueError(
            f"cost_per_point must exceed point (the cost of one point at zero load, in S), "
            f"got cost_per_point={c!r} <= point={d!r}"
        )
    return 1.0 - math.sqrt(d / c)


@_check.guarded
def find_knee(utilization, mean_response, mean_service: float,
              cost_per_point: float = 1.0, point: float = 0.01) -> float:
    """The knee of any mean-response curve, by the book's definition, found numerically.

    The slope dW/drho is estimated with ``numpy.gradient`` and the first utilization
    where ``point * dW/drho`` reaches ``cost_per_point * mean_service`` is located by
    linear interpolation between grid points. Use a fine grid (e.g. 0.001 steps).

    Parameters
    ----------
    utilization : array of float
        Increasing utilizations, each in [0, 1), at least 3 of them.
    mean_response : array of float
        Mean response time (s) at each utilization, > 0.
    mean_service : float
        S (s), > 0, the unit in which the threshold is stated.
    cost_per_point, point : float
        As in :func:`mm1_knee`.

    Returns
    -------
    float
        The knee utilization. Raises ``ValueError`` if the curve never gets that steep
        on the grid given.
    """
    rho = _utilizations("utilization", utilization)
    if rho.size < 3:
        raise ValueError(f"utilization needs at least 3 points, got {rho.size}")
    if (np.diff(rho) <= 0).any():
        i = int(np.argmax(np.diff(rho) <= 0)) + 1
        raise ValueError(f"utilization must be increasing, got {rho[i]!r} after {rho[i - 1]!r}")
    w = _check.array("mean_response", mean_response)
    if w.shape != rho.shape:
        raise ValueError(
            f"utilization and mean_response must have the same length, got {rho.size} and {w.size}"
        )
    if (w <= 0).any():
        raise ValueError(f"mean_response must be > 0, got {float(w[np.argmax(w <= 0)])!r}")
    s = _check.positive("mean_service", mean_service)
    c = _check.positive("cost_per_point", cost_per_point)
    d = _check.probability("point", point)
    excess = d * np.gradient(w, rho) / s - c          # >= 0 past the knee
    above = np.flatnonzero(excess >= 0)
    if above.size == 0:
        raise ValueError(
            f"mean_response never costs cost_per_point={c:g} x mean_service={s:g} s per "
            f"point={d:g} of utilization on this grid "
            f"(max {float(excess.max() + c):.3g} S at rho={float(rho[np.argmax(excess)]):.3g}); "
            "extend the grid toward 1"
        )
    j = int(above[0])
    if j == 0:
        return float(rho[0])
    x0, x1, y0, y1 = rho[j - 1], rho[j], excess[j - 1], excess[j]
    return float(x0 + (x1 - x0) * (0 - y0) / (y1 - y0))


@_check.guarded
def max_utilization_for_quantile(target: float, p: float = 0.99,
                                 mean_service: float = 1.0) -> float:
    """The highest M/M/1 utilization whose p-quantile response meets ``target``.

    Inverts ``q_p = -ln(1 - p) * S / (1 - rho) <= target``:
    ``rho_max = 1 - (-ln(1 - p)) * S / target``.

    Parameters
    ----------
    target : float
        The response-time objective for the p-quantile (s), > 0.
    p : float
        Quantile level, 0 < p < 1 (0.99 for a p99 SLO).
    mean_service : float
        S, mean service time (s), > 0.

    Returns
    -------
    float
        rho_max in (0, 1). Raises ``ValueError`` when ``target`` is at or below the
        zero-load quantile ``-ln(1 - p) * S``: then no utilization meets it.
    """
    t = _check.positive("target", target)
    p = _check.probability("p", p)
    s = _check.positive("mean_service", mean_service)
    floor = -math.log1p(-p) * s
    if t <= floor:
        raise ValueError(
            f"target must exceed the zero-load p{100 * p:g} response -ln(1-p)*S = {floor:.4g} s "
            f"(mean_service={s!r} s), "
            f"got target={t!r}: no utilization meets it"
        )
    return 1.0 - floor / t


@_check.guarded
def headroom_gain(rho, p: float = 0.99, mean_service: float = 1.0,
                  point: float = 0.01):
    """Seconds of p-quantile response bought back by running one ``point`` lower.

    ``q_p(rho) - q_p(rho - point)`` for M/M/1, with ``q_p(rho) = -ln(1-p) S / (1 - rho)``.

    Parameters
    ----------
    rho : float or array of float
        Current utilization(s), point <= rho < 1.
    p : float
        Quantile level, 0 < p < 1.
    mean_service : float
        S (s), > 0.
    point : float
        Headroom step, 0 < point < 1 (0.01 = one percentage point).

    Returns
    -------
    float or numpy.ndarray
        Latency gained (s), > 0. A float for a scalar ``rho``.
    """
    p = _check.probability("p", p)
    s = _check.positive("mean_service", mean_service)
    d = _check.probability("point", point)
    values = _utilizations("rho", rho)
    if (values < d).any():
        bad = float(values[np.argmax(values < d)])
        raise ValueError(f"rho must be >= point={d:g} to give up one point, got {bad!r}")
    k = -math.log1p(-p) * s
    out = k / (1.0 - values) - k / (1.0 - (values - d))
    return float(out[0]) if np.ndim(rho) == 0 else out
