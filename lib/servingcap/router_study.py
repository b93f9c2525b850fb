"""Routers compared on real length mixes: TTFT p99 with an interval, per mix and load.

The experiment behind the router table of chapter "Sizing the fleet" (issue 21). Each
mix is a request table (a trace, or sampled traffic of fixed lengths); replication ``i``
replays its ``i``-th block of ``requests`` rows, shifted to start at 0 and rescaled to
the rate (the trace's burst shape kept, as :mod:`servingcap.planning` replays traces).
Every router sees the same blocks (common random numbers), so their differences are
not sampling noise between workloads. The rate is a fraction ``load`` of the fleet's
fluid throughput bound with every prompt prefilled in full, on the rows replayed
(:func:`servingcap.planning.fluid_rate` of the replica without its prefix cache): the
same meaning of "load" for every mix, and what a prefix cache saves shows up as lower
latency, not as a different rate.

Per (mix, load, router) the TTFT of each replication in arrival order has its warm-up
cut by MSER-5 across replications (:func:`servingcap.stats.warmup_cuts`); the printed
number is the p99 of all kept requests pooled, its interval from the spread of each
replication's p99 about it (:func:`servingcap.stats.replicated_quantile_ci`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from . import _check, parallel, stats
from .planning import _signal, fluid_rate
from .routers import REALISTIC, ROUTERS, check_router
from .serving import Replica, simulate
from .traffic import rescale_to_rate

__all__ = ["compare_routers", "STUDY_COLUMNS", "best_realistic", "direction"]

STUDY_COLUMNS = ("mix", "load", "rate_rps", "router", "ttft_p99_s", "ttft_p99_low",
                 "ttft_p99_high", "x_pooled", "prefix_hit_rate", "replications",
                 "requests")
"""Columns of :func:`compare_routers`: ``rate_rps`` in req/s; ``ttft_p99_*`` in s (the
pooled p99 and its interval); ``x_pooled`` the p99 over the ``pooled`` router's at the
same mix and load (NaN without it); ``prefix_hit_rate`` the fraction of kept prompt
tokens served from the replicas' prefix caches (NaN without one); ``requests`` kept
after the warm-up, all replications together."""


def _block(frame: pd.DataFrame, index: int, n: int, rate: float) -> pd.DataFrame:
    block = rescale_to_rate(frame.iloc[index * n:(index + 1) * n], rate)
    return block.assign(arrival_s=block["arrival_s"] - block["arrival_s"].iloc[0])


def _run(task) -> dict:
    """One replication (module level, so a process pool can run it)."""
    frame, replica, replicas, router, seed = task
    out = simulate(frame, replica, replicas=replicas, router=router, seed=seed)
    out = out.iloc[np.argsort(out["arrival_s"].to_numpy(), kind="stable")]
    done = (out["outcome"] == "done").to_numpy()
    return {"ttft": np.where(done, out["ttft_s"].to_numpy(dtype=float), np.inf),
            "cached": out["cached_tokens"].to_numpy(dtype=float),
            "prompt": out["prompt_tokens"].to_numpy(dtype=float)}


def _summary(runs: list[dict], quantile: float, confidence: float, cached: bool) -> dict:
    # failures (inf) at the run's worst finite TTFT, for MSER, as the planner does
    cuts = stats.warmup_cuts([_signal(r) for r in runs])
    parts = [r["ttft"][c:] for r, c in zip(runs, cuts, strict=True)]
    ci = stats.replicated_quantile_ci(parts, quantile, confidence)
    hit = math.nan
    if cached:
        hit = (sum(r["cached"][c:].sum() for r, c in zip(runs, cuts, strict=True))
               / sum(r["prompt"][c:].sum() for r, c in zip(runs, cuts, strict=True)))
    return {"ttft_p99_s": ci.value, "ttft_p99_low": ci.low, "ttft_p99_high": ci.high,
            "prefix_hit_rate": float(hit), "replications": len(runs),
            "requests": int(sum(p.size for p in parts))}


def _replica_for(replica, name: str) -> Replica:
    chosen = replica.get(name) if isinstance(replica, Mapping) else replica
    if not isinstance(chosen, Replica):
        raise ValueError(f"replica must be a Replica or a mapping of mix name to Replica "
                         f"covering every mix, got {chosen!r} for mix {name!r}")
    return chosen


def compare_routers(mixes: Mapping[str, pd.DataFrame], replica, *, replicas: int,
                    loads: Sequence[float], routers: Sequence[str] = ROUTERS,
                    replications: int = 4, requests: int = 2_000,
                    quantile: float = 0.99, confidence: float = 0.95, seed: int = 0,
                    executor=parallel.AUTO) -> pd.DataFrame:
    """TTFT p99 (s) of every router on every mix at every load, with intervals.

    Parameters
    ----------
    mixes : mapping of name to request table
        Columns ``arrival_s`` (s), ``prompt_tokens``, ``output_tokens`` (tokens >= 1) and
        optionally ``hash_ids`` (prompt block ids, for a prefix cache); at least
        ``replications * requests`` rows each, in arrival order.
    replica : Replica or mapping of mix name to Replica
        The replica of every mix (e.g. one with ``prefix_cache_blocks`` for the mix with
        ``hash_ids``).
    replicas : int
        Fleet size, replicas.
    loads : sequence of float in (0, 1)
        Arrival rates as fractions of the fleet's fluid bound with every prompt
        prefilled in full; a load of 1 or more is an overloaded fleet and is refused.
    routers : sequence of str
        Router names (:data:`servingcap.routers.ROUTERS`); include ``"pooled"`` for the
        ``x_pooled`` column.
    replications, requests : int
        Replications per point (>= 2, for an interval) and requests in each (its
        ``1 - quantile`` tail must hold at least twice :data:`servingcap.stats.MIN_TAIL`,
        as the warm-up cut may take half of a run: 2,000 for a p99).
    seed : int
        Root seed of the routers' random choices (``random``, ``power_of_two``).
    executor : see :mod:`servingcap.parallel`.

    Returns a DataFrame with :data:`STUDY_COLUMNS`, one row per mix, load and router.
    """
    if not isinstance(mixes, Mapping) or not mixes:
        raise ValueError(f"mixes must be a non-empty mapping of name to request table, "
                         f"got {mixes!r}")
    reps = _check.whole("replications", replications, minimum=2)
    n = _check.whole("requests", requests)
    q = _check.probability("quantile", quantile)
    tail = min(q, 1 - q)
    if n * tail < 2 * stats.MIN_TAIL * (1 - 1e-9):    # MSER-5 may cut up to half a run
        raise ValueError(f"requests must leave at least {2 * stats.MIN_TAIL} beyond the "
                         f"{q:g}-quantile in each replication (MSER-5 may cut half of "
                         f"it), so at least {2 * stats.MIN_TAIL / tail:.4g}, got "
                         f"{requests!r}")
    fleet = _check.whole("replicas", replicas)
    if fleet > n:
        raise ValueError(f"replicas must be <= requests ({n:,}) so that every replica "
                         f"can be reached, got {replicas!r}")
    if isinstance(loads, (str, bytes)) or not isinstance(loads, Sequence) or not loads:
        raise ValueError(f"loads must be a non-empty sequence of fractions, got {loads!r}")
    for load in loads:
        x = _check.positive("loads", load)
        if x >= 1:
            raise ValueError(f"loads must be < 1 (a fleet at or above its fluid bound is "
                             f"unstable), got {load!r}")
    if isinstance(routers, (str, bytes)) or not isinstance(routers, Sequence) or not routers:
        raise ValueError(f"routers must be a non-empty sequence of names, got {routers!r}")
    try:
        names = [check_router(r) for r in routers]
    except ValueError as exc:
        raise ValueError(f"routers: {exc}") from None
    _check.whole("seed", seed, minimum=0)
    seeds = [int(s.generate_state(1)[0]) for s in stats.replication_seeds(seed, reps)]
    tasks, keys = [], []
    for mix, frame in mixes.items():
        try:
            _check.requests(frame, minimum=reps * n)
            _check.request_tokens(frame)
        except ValueError as exc:
            raise ValueError(f"mixes[{mix!r}]: {exc} (replications x requests = "
                             f"{reps * n:,} rows needed)") from None
        rep = _replica_for(replica, mix)
        full = dataclasses.replace(rep, prefix_cache_blocks=0)
        replayed = frame.iloc[:reps * n].drop(columns=["hash_ids"], errors="ignore")
        bound = fluid_rate(replayed, full, fleet)      # on the rows replayed, not the rest
        for load in loads:
            rate = float(load) * bound
            blocks = [_block(frame, i, n, rate) for i in range(reps)]
            for router in names:
                keys.append((mix, float(load), rate, router, bool(rep.prefix_cache_blocks)))
                tasks += [(b, rep, fleet, router, s) for b, s in zip(blocks, seeds,
                                                                     strict=True)]
    results = parallel.run_all(_run, tasks, executor)
    rows = []
    for k, (mix, load, rate, router, cached) in enumerate(keys):
        runs = results[k * reps:(k + 1) * reps]
        rows.append({"mix": mix, "load": load, "rate_rps": rate, "router": router,
                     **_summary(runs, q, confidence, cached)})
    table = pd.DataFrame(rows)
    pooled = table[table.router == "pooled"].set_index(["mix", "load"])["ttft_p99_s"]
    ref = [pooled.get((m, lo), math.nan) for m, lo in zip(table.mix, table.load, strict=True)]
    table["x_pooled"] = table["ttft_p99_s"] / np.asarray(ref, dtype=float)
    return table[list(STUDY_COLUMNS)]


def _study(table) -> pd.DataFrame:
    if not isinstance(table, pd.DataFrame) or not set(STUDY_COLUMNS) <= set(table.columns):
        raise ValueError(f"table must be a compare_routers() result (columns "
                         f"{', '.join(STUDY_COLUMNS)}), got {table!r}")
    try:
        _check.array("load", table["load"])
        for column in ("ttft_p99_s", "ttft_p99_low", "ttft_p99_high"):
            _check.array(column, table[column], allow_inf=True)   # inf: > 1 % failed
        x = np.asarray(table["x_pooled"], dtype=float)   # NaN: no pooled row
    except (TypeError, ValueError) as exc:
        raise ValueError(f"table must be a compare_routers() result: {exc}") from None
    if np.isinf(x).any():
        raise ValueError("table must be a compare_routers() result: x_pooled holds inf")
    return table


def best_realistic(table: pd.DataFrame) -> pd.DataFrame:
    """Per mix and load of a :func:`compare_routers` table: the realistic router with
    the lowest p99 TTFT (``router``, ``x_pooled``) and ``tied``, the other realistic
    routers whose interval reaches below its upper end (not told apart from it)."""
    real = _study(table)[table["router"].isin(REALISTIC)]
    rows = []
    for (mix, load), group in real.groupby(["mix", "load"], sort=False):
        top = group.loc[group["ttft_p99_s"].idxmin()]
        tied = group.loc[(group["router"] != top["router"])
                         & (group["ttft_p99_low"] <= top["ttft_p99_high"]), "router"]
        rows.append({"mix": mix, "load": load, "router": top["router"],
                     "x_pooled": float(top["x_pooled"]), "tied": list(tied)})
    return pd.DataFrame(rows, columns=["mix", "load", "router", "x_pooled", "tied"])


def direction(table: pd.DataFrame, mix: str, load: float, router: str, other: str) -> str:
    """How ``router``'s p99 TTFT compares with ``other``'s at ``mix`` and ``load``:
    ``"worse than"`` or ``"better than"`` only when their intervals do not overlap,
    else ``"not told apart from"``."""
    for name, value in (("mix", mix), ("router", router), ("other", other)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a name in the table, got {value!r}")
    load = _check.positive("load", load)
    study = _study(table)
    if mix not in set(study["mix"]):
        raise ValueError(f"mix must be a mix of the table, got {mix!r}")
    if load not in set(study.loc[study["mix"] == mix, "load"]):
        raise ValueError(f"load must be a load of the table at mix={mix!r}, got {load!r}")
    at = study.set_index(["mix", "load", "router"]).sort_index()
    keys = [(mix, load, router), (mix, load, other)]
    for name, key in zip(("router", "other"), keys, strict=True):
        if key not in at.index:
            raise ValueError(f"{name} must be a router of the table at mix={mix!r}, "
                             f"load={load!r}, got {key[2]!r}")
    a, b = at.loc[keys[0]], at.loc[keys[1]]
    if a["ttft_p99_low"] > b["ttft_p99_high"]:
        return "worse than"
    return "better than" if a["ttft_p99_high"] < b["ttft_p99_low"] else "not told apart from"
