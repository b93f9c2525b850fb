"""The capacity control loop: an autoscaler that lags, simulated interval by interval.

Capacity management is a feedback loop::

    observe arrivals -> predict short-horizon load -> admit or shed -> serve
    -> measure queue and goodput -> scale (with a startup delay) -> update

:func:`simulate_control` runs that loop in discrete time, one interval of ``dt_s``
seconds at a time, so a reader can see what a controller's settings do to a fleet:
react too fast and the replica count oscillates (new replicas start cold, booting ones
are paid for, and cost rises); react too slowly and the queue grows.

The model (and its assumptions)
-------------------------------
**Service.** Each ready replica serves up to ``replica_rate`` requests/s *inside the
SLO*: the rate one replica carries at its SLO knee, measured beforehand with the
serving simulator (for example a capacity search on one replica, or a fleet's capacity
divided by its replicas). Below that rate the queueing inside a replica is already
priced into ``replica_rate``; above it, the excess backs up. A replica younger than
``warmup_s`` (since it became ready) serves only ``cold_factor`` of that rate: its
prefix cache and compiled kernels are cold.

**Queue.** Work that the fleet cannot serve inside an interval waits in one pooled
FIFO backlog (a least-loaded router keeps a fleet close to one pool). Within an
interval arrivals and capacity are constant rates, so the backlog is the fluid path
``Q(s) = max(0, Q_0 + (A - C) s)`` for the interval's fraction ``s`` in ``[0, 1]``
(``A`` arrivals and ``C`` capacity of the interval, both in requests): exact for a
fluid, and the same reflected-path arithmetic as :func:`servingcap.traffic.fluid_backlog`.
A request arriving at ``s`` waits ``Q(s) / (C / dt_s)`` seconds (FIFO drain at the
interval's capacity). It is **late** if that wait exceeds ``wait_budget_s``.
Assumptions: service capacity does not depend on the backlog's mix; a replica that is
removed finishes its work elsewhere without loss; Poisson-scale noise inside an
interval is inside ``replica_rate``.

**Admission.** With ``shed_wait_s`` set, the backlog never holds more than
``shed_wait_s`` seconds of work at the current capacity: excess arrivals are rejected
at once (counted as ``shed``, never dropped silently).

**Controller** (:class:`Controller`), evaluated at the end of every interval:

* *observe / predict*: the predicted rate is the mean arrival rate over the trailing
  ``window_s`` seconds;
* *decide*: ``desired = ceil(predicted / (target_utilization * replica_rate)
  + backlog / (replica_rate * backlog_drain_s))`` (the second term only when
  ``backlog_drain_s`` is set), clipped to ``[min_replicas, max_replicas]``;
* *scale up* at once to ``desired`` (counting replicas still booting); a launched
  replica is paid for immediately and serves from ``startup_s`` later;
* *scale down* to the largest ``desired`` of the trailing ``scale_down_delay_s``
  (a stabilization window, as Kubernetes' autoscaler uses), cancelling booting
  replicas first and then removing the youngest ones.

Units: seconds, requests, requests/s; replicas are whole numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _check

__all__ = ["Controller", "ControlRun", "simulate_control", "poisson_counts",
           "diurnal_rates"]


@dataclass(frozen=True)
class Controller:
    """Settings of a reactive autoscaler.

    Parameters
    ----------
    target_utilization : float
        Share of each replica's SLO capacity the controller plans to use, in (0, 1];
        ``1 - target_utilization`` is the headroom it keeps.
    window_s : float
        Trailing window over which arrivals are averaged to predict the rate (s), > 0.
        Short windows react fast and chase noise.
    startup_s : float
        Time from the decision to scale out until the new replica serves (s), >= 0.
    scale_down_delay_s : float
        Stabilization window for scaling in (s), >= 0: the fleet shrinks only to the
        largest ``desired`` seen over this window. 0 scales in at once.
    backlog_drain_s : float or None
        If set (s, > 0), the controller adds enough replicas to drain the current
        backlog in about this many seconds. Small values react hard to queues.
    min_replicas, max_replicas : int
        Bounds on the fleet (``max_replicas=None``: no upper bound).
    """

    target_utilization: float = 0.8
    window_s: float = 60.0
    startup_s: float = 90.0
    scale_down_delay_s: float = 300.0
    backlog_drain_s: float | None = None
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self):
        u = _check.positive("target_utilization", self.target_utilization)
        if u > 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization!r}")
        _check.positive("window_s", self.window_s)
        _check.nonnegative("startup_s", self.startup_s)
        _check.nonnegative("scale_down_delay_s", self.scale_down_delay_s)
        if self.backlog_drain_s is not None:
            _check.positive("backlog_drain_s", self.backlog_drain_s)
        low = _check.whole("min_replicas", self.min_replicas, minimum=0)
        if self.max_replicas is not None:
            high = _check.whole("max_replicas", self.max_replicas, minimum=0)
            if high < low:
                raise ValueError(f"max_replicas must be >= min_replicas = {low}, "
                                 f"got {self.max_replicas!r}")

    def desired(self, predicted_rps: float, backlog: float, replica_rate: float) -> int:
        """Replicas this controller wants for a predicted rate (requests/s) and backlog."""
        predicted_rps = _check.nonnegative("predicted_rps", predicted_rps)
        backlog = _check.nonnegative("backlog", backlog)
        replica_rate = _check.positive("replica_rate", replica_rate)
        with _check.overflow(f"Controller.desired(predicted_rps={predicted_rps!r}, "
                             f"backlog={backlog!r}, replica_rate={replica_rate!r})"):
            return self._desired(predicted_rps, backlog, replica_rate)

    def _desired(self, predicted_rps: float, backlog: float, replica_rate: float) -> int:
        need = predicted_rps / (self.target_utilization * replica_rate)
        if self.backlog_drain_s is not None:
            need += backlog / (replica_rate * self.backlog_drain_s)
        n = max(self.min_replicas, math.ceil(need - 1e-9))
        return n if self.max_replicas is None else min(n, self.max_replicas)


@dataclass(frozen=True)
class ControlRun:
    """The result of :func:`simulate_control`: one row per interval plus totals.

    ``timeline`` columns: ``t_s`` (interval start, s), ``arrivals`` (requests),
    ``offered_rps``, ``predicted_rps``, ``capacity_rps`` (requests/s), ``desired``,
    ``serving``, ``booting``, ``cold`` (replicas), ``backlog`` (requests at the end),
    ``wait_s`` (wait of work arriving at the end, s; ``inf`` when work waits and no
    replica serves),
    ``served``, ``late``, ``shed``
    (requests).
    """

    timeline: pd.DataFrame
    dt_s: float
    replica_rate: float

    @property
    def arrivals(self) -> float:
        """Requests offered over the run."""
        return float(self.timeline["arrivals"].sum())

    @property
    def replica_hours(self) -> float:
        """Replica-hours paid: serving plus booting replicas, every interval (h)."""
        t = self.timeline
        return float((t["serving"] + t["booting"]).sum()) * self.dt_s / 3600.0

    @property
    def scale_events(self) -> int:
        """Intervals in which the committed fleet (serving + booting) changed size."""
        committed = (self.timeline["serving"] + self.timeline["booting"]).to_numpy()
        return int(np.count_nonzero(np.diff(committed)))

    @property
    def launches(self) -> int:
        """Replicas started over the run (each one boots and starts cold)."""
        return int(self.timeline.attrs.get("launches", 0))

    @property
    def late_share(self) -> float:
        """Share of offered requests that waited longer than the wait budget."""
        return float(self.timeline["late"].sum()) / self.arrivals if self.arrivals else 0.0

    @property
    def shed_share(self) -> float:
        """Share of offered requests rejected by admission control."""
        return float(self.timeline["shed"].sum()) / self.arrivals if self.arrivals else 0.0

    @property
    def good_share(self) -> float:
        """Share of offered requests served in time: not late, not shed."""
        return 1.0 - self.late_share - self.shed_share

    @property
    def cold_share(self) -> float:
        """Share of serving replica-time spent cold (younger than ``warmup_s``)."""
        serving = float(self.timeline["serving"].sum())
        return float(self.timeline["cold"].sum()) / serving if serving else 0.0

    @property
    def max_wait_s(self) -> float:
        """Longest fluid wait at any interval end (s)."""
        return float(self.timeline["wait_s"].max())

    def summary(self) -> dict:
        """The run's totals as plain Python numbers."""
        t = self.timeline
        return {
            "replica_hours": self.replica_hours,
            "mean_serving": float(t["serving"].mean()),
            "min_serving": int(t["serving"].min()),
            "max_serving": int(t["serving"].max()),
            "scale_events": self.scale_events,
            "launches": self.launches,
            "cold_share": self.cold_share,
            "max_backlog": float(t["backlog"].max()),
            "max_wait_s": self.max_wait_s,
            "late_share": self.late_share,
            "shed_share": self.shed_share,
            "good_share": self.good_share,
        }


def _late_fraction(q0: float, slope: float, threshold: float) -> float:
    """Fraction of s in [0, 1] with max(0, q0 + slope * s) > threshold."""
    end = q0 + slope
    if q0 > threshold and end > threshold:
        return 1.0
    if q0 <= threshold and end <= threshold:
        return 0.0
    cross = (threshold - q0) / slope          # slope != 0 here
    return 1.0 - cross if slope > 0 else cross


@_check.guarded
def simulate_control(arrivals, dt_s: float, replica_rate: float, controller: Controller,
                     *, initial_replicas: int | None = None, cold_factor: float = 1.0,
                     warmup_s: float = 0.0, wait_budget_s: float | None = None,
                     shed_wait_s: float | None = None) -> ControlRun:
    """Run the observe-predict-admit-serve-measure-scale loop over an arrival series.

    Parameters
    ----------
    arrivals : array of float
        Requests arriving in each interval (requests, >= 0), e.g. from
        :func:`poisson_counts` or :func:`servingcap.traffic.window_counts`.
    dt_s : float
        Interval length (s), > 0; decisions are taken once per interval.
    replica_rate : float
        Requests/s one warm replica serves inside the SLO, > 0.
    controller : Controller
        The autoscaler's settings.
    initial_replicas : int or None
        Replicas serving (warm) at time 0; default: what the controller would want for
        the first interval's rate.
    cold_factor : float
        Share of ``replica_rate`` a replica delivers during its first ``warmup_s``
        seconds of service, in (0, 1].
    warmup_s : float
        How long a new replica stays cold (s), >= 0.
    wait_budget_s : float or None
        Requests whose fluid wait exceeds this (s) count as late; None: nobody is late.
    shed_wait_s : float or None
        Admission control: reject arrivals that would wait longer than this (s).

    Returns
    -------
    ControlRun
        The per-interval timeline and the run's totals. Every offered request ends as
        served, shed, or still in the backlog at the end (``timeline.attrs
        ["final_backlog"]``), so ``arrivals = served + shed + final backlog``.
    """
    a = _check.array("arrivals", arrivals, nonnegative_values=True)
    if a.size == 0:
        raise ValueError("arrivals must hold at least one interval, got an empty array")
    dt = _check.positive("dt_s", dt_s)
    mu = _check.positive("replica_rate", replica_rate)
    if not isinstance(controller, Controller):
        raise ValueError(f"controller must be a servingcap.control.Controller, got {controller!r}")
    cold = _check.positive("cold_factor", cold_factor)
    if cold > 1:
        raise ValueError(f"cold_factor must be in (0, 1], got {cold_factor!r}")
    warm_s = _check.nonnegative("warmup_s", warmup_s)
    budget = math.inf if wait_budget_s is None else _check.positive("wait_budget_s", wait_budget_s)
    shed_s = math.inf if shed_wait_s is None else _check.nonnegative("shed_wait_s", shed_wait_s)
    if initial_replicas is None:
        n0 = controller.desired(a[0] / dt, 0.0, mu)
    else:
        n0 = _check.whole("initial_replicas", initial_replicas, minimum=0)

    window = max(1, math.ceil(controller.window_s / dt - 1e-9))
    hold = max(1, math.ceil(controller.scale_down_delay_s / dt - 1e-9))
    ready_at = [-math.inf] * n0        # ready time of each committed replica (s); warm at 0
    launches = 0
    backlog = 0.0
    history_desired: list[int] = []
    rows = []
    cum = np.concatenate([[0.0], np.cumsum(a)])
    for k, arriving in enumerate(a.tolist()):
        t = k * dt
        serving = [r for r in ready_at if r <= t + 1e-9]
        n_cold = sum(1 for r in serving if t - r < warm_s - 1e-9)
        capacity = mu * dt * (len(serving) - n_cold + cold * n_cold)    # requests this interval
        rate = capacity / dt
        net = backlog + arriving - capacity          # uncapped fluid backlog at the end
        limit = shed_s * rate if math.isfinite(shed_s) else math.inf
        shed = max(0.0, net - limit)
        end = min(max(0.0, net), limit)
        threshold = budget * rate                    # backlog (requests) that means late
        if not math.isfinite(budget) or threshold >= limit:
            late_frac = 0.0
        elif rate > 0:
            # the capped path exceeds the threshold exactly when the uncapped one does
            late_frac = _late_fraction(backlog, net - backlog, threshold)
        else:
            late_frac = 1.0
        wait = end / rate if rate > 0 else (math.inf if end > 0 else 0.0)
        late = late_frac * max(0.0, arriving - shed)
        served = backlog + arriving - shed - end
        backlog = end

        # observe and predict
        lo = max(0, k + 1 - window)
        predicted = (cum[k + 1] - cum[lo]) / ((k + 1 - lo) * dt)
        desired = controller.desired(predicted, backlog, mu)
        history_desired.append(desired)
        committed = len(ready_at)
        booting = committed - len(serving)
        rows.append({"t_s": t, "arrivals": arriving, "offered_rps": arriving / dt,
                     "predicted_rps": predicted, "capacity_rps": rate, "desired": desired,
                     "serving": len(serving), "booting": booting, "cold": n_cold,
                     "backlog": backlog, "wait_s": wait, "served": served, "late": late,
                     "shed": shed})
        # scale for the next interval
        if desired > committed:
            ready_at.extend([t + dt + controller.startup_s] * (desired - committed))
            launches += desired - committed
        else:
            target = max(history_desired[-hold:])
            if target < committed:
                ready_at.sort()                # youngest (latest ready) at the end
                del ready_at[target:]
    timeline = pd.DataFrame(rows)
    for column in ("t_s", "capacity_rps", "offered_rps"):
        if column in timeline.columns:
            _check.finite_result(float(timeline[column].abs().max()),
                                 f"timeline {column} from dt_s={dt!r}, replica_rate={mu!r}")
    timeline.attrs["launches"] = launches
    timeline.attrs["final_backlog"] = backlog
    return ControlRun(timeline=timeline, dt_s=dt, replica_rate=mu)


@_check.guarded
def poisson_counts(rates_rps, dt_s: float, rng) -> np.ndarray:
    """Poisson arrivals per interval for a rate profile (requests per interval).

    ``rates_rps`` gives the mean rate (requests/s) of each interval of ``dt_s``
    seconds; ``rng`` is a ``numpy.random.Generator`` or a seed.
    """
    r = _check.array("rates_rps", rates_rps, nonnegative_values=True)
    dt = _check.positive("dt_s", dt_s)
    return _check.generator("rng", rng).poisson(r * dt).astype(float)


MAX_INTERVALS = 1_000_000
"""Most intervals :func:`diurnal_rates` builds (a year at 30 s steps, about)."""


@_check.guarded
def diurnal_rates(duration_s: float, dt_s: float, mean_rps: float, swing: float,
                  period_s: float = 86_400.0, trough_at_s: float = 0.0) -> np.ndarray:
    """A sinusoidal daily load profile, one rate (requests/s) per interval.

    ``mean_rps * (1 - swing * cos(2 pi (t - trough_at_s) / period_s))`` at each
    interval's midpoint ``t``: the rate is lowest at ``trough_at_s`` and peaks half a
    period later at ``mean_rps * (1 + swing)``; ``swing`` in [0, 1).
    """
    total = _check.positive("duration_s", duration_s)
    dt = _check.positive("dt_s", dt_s)
    mean = _check.positive("mean_rps", mean_rps)
    s = _check.nonnegative("swing", swing)
    if s >= 1:
        raise ValueError(f"swing must be in [0, 1), got {swing!r}")
    period = _check.positive("period_s", period_s)
    trough = _check.number("trough_at_s", trough_at_s)
    n = math.ceil(total / dt - 1e-9)
    if n > MAX_INTERVALS:
        raise ValueError(f"duration_s / dt_s must give at most {MAX_INTERVALS:,} intervals, got "
                         f"duration_s={duration_s!r} and dt_s={dt_s!r} ({n:,} intervals)")
    mid = (np.arange(n) + 0.5) * dt
    return mean * (1.0 - s * np.cos(2.0 * np.pi * (mid - trough) / period))
