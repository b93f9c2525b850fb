"""Bad days as workload transforms: the cases a capacity plan must survive.

A capacity plan is a workload experiment, and its bad days are workloads too. Each
function here takes a request table (``arrival_s`` in s, ``prompt_tokens``,
``output_tokens``, plus any extra columns, which are kept) and returns a *new* table
with the bad day injected, ready for :func:`servingcap.serving.simulate` or
:func:`servingcap.planning.capacity_search`. Nothing is dropped: every input request
appears exactly once as an original (``attempt == 0``), and every added request is
labelled, so the extra offered load can be counted.

Columns added to the output:

=============  =========================================================================
``request``    id of the user request: the input row's position for originals and
               their retries; new ids (``n``, ``n + 1``, ...) for extra user requests
``attempt``    0 for the first try, 1 for a client's re-submission
``burst``      True for the extra requests of a tenant burst
=============  =========================================================================

The output is sorted by ``arrival_s`` (ties keep input order) with a fresh index.

- :func:`scale_prompts`: every prompt ``factor`` times longer (prompts twice as long);
- :func:`retry_storm`: a downstream dependency times out for a while and clients
  re-submit those requests after a delay;
- :func:`assign_tenants` and :func:`tenant_burst`: one tenant multiplies its rate for
  a window, with the same burst shape.

Times are in the input's clock (s): when a table is later rescaled to another rate
with :func:`servingcap.traffic.rescale_to_rate`, the windows and delays stretch with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from . import _check

__all__ = ["scale_prompts", "retry_storm", "assign_tenants", "tenant_burst", "label"]

MAX_BURST = 1000.0
"""Largest tenant_burst factor: a thousand times the usual rate is already another workload
(and builds a table a thousand times the tenant's)."""


def _frame(requests) -> pd.DataFrame:
    frame = _check.requests(requests)
    _check.request_tokens(frame)
    return frame


def label(requests) -> pd.DataFrame:
    """A copy with ``request`` (row position), ``attempt`` (0) and ``burst`` (False) added.

    Columns already present are kept, so labelling an already-labelled table is a no-op
    for those columns.
    """
    out = _frame(requests).reset_index(drop=True).copy()
    if "request" in out.columns:
        ids = _check.array("requests['request']", _check.column(out, "request", "requests"),
                           nonnegative_values=True)
        if (ids != np.round(ids)).any():
            raise ValueError("requests['request'] must be whole-number request ids")
    if "attempt" in out.columns:
        tries = _check.array("requests['attempt']", _check.column(out, "attempt", "requests"),
                             nonnegative_values=True)
        if (tries != np.round(tries)).any():
            raise ValueError("requests['attempt'] must be whole numbers (0 = first try)")
    if "request" not in out.columns:
        out["request"] = np.arange(len(out), dtype=np.int64)
    if "attempt" not in out.columns:
        out["attempt"] = 0
    if "burst" not in out.columns:
        out["burst"] = False
    return out


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def _window(start_s, duration_s) -> tuple[float, float]:
    start = _check.number("start_s", start_s)
    length = _check.positive("duration_s", duration_s)
    return start, start + length


@_check.guarded
def scale_prompts(requests, factor: float = 2.0) -> pd.DataFrame:
    """Every prompt ``factor`` times as long (tokens, rounded, at least 1).

    The prefix blocks (``hash_ids``), if any, are kept: the added tokens are new text
    that no cache holds. Arrival times and output lengths are unchanged.
    """
    f = _check.positive("factor", factor)
    out = label(requests)
    out["prompt_tokens"] = np.maximum(1, np.rint(_check.column(out, "prompt_tokens", "requests") * f)
                                      ).astype(np.int64)
    return _sorted(out)


@_check.guarded
def retry_storm(requests, start_s: float, duration_s: float, delay_s: float,
                share: float = 1.0, seed=0) -> pd.DataFrame:
    """A downstream timeout makes clients re-submit requests: extra offered load.

    Every original request arriving in ``[start_s, start_s + duration_s)`` is sent again,
    with probability ``share``, ``delay_s`` seconds after its arrival (the client's
    timeout plus back-off). The model still serves the first attempt: the timeout was
    downstream, so the retry is duplicate work for the serving fleet.

    Parameters
    ----------
    requests : DataFrame
        The normal day's requests.
    start_s, duration_s : float
        The incident window (s, in the table's clock).
    delay_s : float
        Time from an original arrival to its retry (s), >= 0.
    share : float
        Fraction of the window's requests that are retried, in [0, 1].
    seed : int or numpy.random.Generator
        For the draw of which requests retry when ``share < 1``.

    Returns
    -------
    DataFrame
        Originals plus retries (``attempt == 1``, same ``request`` id and token
        counts), sorted by arrival.
    """
    lo, hi = _window(start_s, duration_s)
    delay = _check.nonnegative("delay_s", delay_s)
    p = _check.number("share", share)
    if not 0 <= p <= 1:
        raise ValueError(f"share must be in [0, 1], got {share!r}")
    base = label(requests)
    t = _check.column(base, "arrival_s", "requests")
    hit = (t >= lo) & (t < hi) & (base["attempt"].to_numpy() == 0)
    if p < 1:
        hit &= _check.generator("seed", seed).random(len(base)) < p
    retries = base[hit].copy()
    retries["arrival_s"] = retries["arrival_s"] + delay
    retries["attempt"] = retries["attempt"] + 1
    return _sorted(pd.concat([base, retries], ignore_index=True))


@_check.guarded
def assign_tenants(requests, shares: Mapping[str, float], seed=0) -> pd.DataFrame:
    """Label each request with a tenant drawn at random with the given shares.

    ``shares`` maps tenant name -> share of requests (positive, summing to 1 within
    1e-9). Returns a copy with a ``tenant`` column (and the labels of :func:`label`).
    """
    if not isinstance(shares, Mapping) or not shares:
        raise ValueError(f"shares must be a non-empty mapping tenant -> share, got {shares!r}")
    names = list(shares)
    weights = np.array([_check.positive(f"shares[{n!r}]", shares[n]) for n in names])
    if abs(weights.sum() - 1.0) > 1e-9:
        raise ValueError(f"shares must sum to 1, got {weights.sum()!r}")
    out = label(requests)
    draw = _check.generator("seed", seed).choice(len(names), size=len(out), p=weights)
    out["tenant"] = np.array(names, dtype=object)[draw]
    return out


@_check.guarded
def tenant_burst(requests, tenant: str, start_s: float, duration_s: float,
                 factor: float = 2.0, seed=0) -> pd.DataFrame:
    """One tenant sends ``factor`` times its usual rate during a window.

    Inside ``[start_s, start_s + duration_s)``, each original request of ``tenant`` gets
    ``factor - 1`` extra sibling requests on average (the whole part always, the
    fractional part with that probability). A sibling copies the request's token counts
    and arrives uniformly at random between the request and the tenant's next request
    (or the window's end), so the tenant's own burst shape is kept, only denser.

    Parameters
    ----------
    requests : DataFrame
        Requests with a ``tenant`` column (see :func:`assign_tenants`).
    tenant : str
        The tenant that bursts.
    start_s, duration_s : float
        The burst window (s, in the table's clock).
    factor : float
        The tenant's rate multiplier in the window, >= 1.
    seed : int or numpy.random.Generator
        For the siblings' arrival times and the fractional part.

    Returns
    -------
    DataFrame
        Originals plus the extra requests (``burst == True``, new ``request`` ids),
        sorted by arrival.
    """
    base = label(requests)
    if "tenant" not in base.columns:
        raise ValueError("requests must have a 'tenant' column; label them with assign_tenants")
    if isinstance(tenant, (list, dict, set)) or tenant not in set(base["tenant"]):
        raise ValueError(f"tenant must be one of {sorted(set(base['tenant']))}, got {tenant!r}")
    lo, hi = _window(start_s, duration_s)
    f = _check.number("factor", factor)
    if not 1 <= f <= MAX_BURST:
        raise ValueError(f"factor must be in [1, {MAX_BURST:g}] (a rate multiplier; each "
                         f"request gets factor - 1 siblings), got {factor!r}")
    rng = _check.generator("seed", seed)
    mine = base[(base["tenant"] == tenant) & (base["attempt"] == 0)].sort_values(
        "arrival_s", kind="stable")
    t = _check.column(mine, "arrival_s", "requests")
    inside = (t >= lo) & (t < hi)
    rows = mine[inside]
    times = t[inside]
    nxt = np.append(times[1:], hi) if times.size else times
    whole, frac = int(np.floor(f - 1.0)), (f - 1.0) - np.floor(f - 1.0)
    copies = np.full(times.size, whole) + (rng.random(times.size) < frac)
    extra = rows.loc[rows.index.repeat(copies)].copy()
    gap = np.repeat(np.maximum(nxt - times, 0.0), copies)
    extra["arrival_s"] = np.repeat(times, copies) + rng.random(gap.size) * gap
    first_id = int(base["request"].max()) + 1
    extra["request"] = np.arange(first_id, first_id + len(extra), dtype=np.int64)
    extra["burst"] = True
    return _sorted(pd.concat([base, extra], ignore_index=True))
