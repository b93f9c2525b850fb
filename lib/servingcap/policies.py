"""Scheduling-policy arithmetic: workloads, deadlines, predictions, and who pays for an order.

Helpers for comparing queue orders (FCFS, SJF, SRPT, EDF, priority classes) on the
output of :func:`servingcap.serving.simulate`:

- the workload: :func:`unqueued_e2e_s` (a request alone on an idle replica),
  :func:`full_batch_work_s` and :func:`capacity_rate` (replica time per request when the
  batch is full, and the saturation rate it implies), :func:`saturated_rate` (the
  completion rate a simulated backlog measures), :func:`bootstrap_workload`
  (real (prompt, output) pairs at a chosen fraction of that capacity);
- the inputs a policy needs: :func:`slo_deadlines` (E2E deadline from the TTFT and TPOT
  objectives), :func:`noisy_predictions` (an output-length predictor with lognormal error);
- who pays: :func:`queue_wait_s`, :func:`slowdown`, :func:`length_buckets`,
  :func:`bucket_summary`, :func:`latency_summary`, :func:`deadline_miss_rate`;
- the closed forms: :func:`priority_waits` (Cobham's non-preemptive priority M/G/1, of
  which SJF is the case "class = job length") and :func:`mean_unfinished_work_s` (the
  quantity that every work-conserving order leaves unchanged) and :func:`busy_time_s`.

Units: seconds, tokens, requests/s. A request that did not finish (rejected, timed out,
unfinished) counts as infinitely late in every latency, slowdown and wait here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import _check, stats
from ._check import UnstableQueueError
from .serving import Replica, StepDetail, simulate
from .slo import latencies

__all__ = [
    "unqueued_e2e_s", "full_batch_work_s", "capacity_rate", "saturated_rate",
    "bootstrap_workload",
    "slo_deadlines", "noisy_predictions", "queue_wait_s", "slowdown", "length_buckets",
    "bucket_summary", "latency_summary", "deadline_miss_rate", "priority_waits",
    "mean_unfinished_work_s", "busy_time_s",
]


# --------------------------------------------------------------------------- inputs


def _tokens(requests, column: str) -> np.ndarray:
    values = _check.array(column, _check.column(requests, column, "requests"))
    bad = (values < 1) | (values != np.round(values))
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(f"{column} must be whole numbers >= 1, got {values[i]!r} at row {i}")
    return values


def _replica(replica) -> Replica:
    replica = Replica() if replica is None else replica
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    return replica


def unqueued_e2e_s(requests, replica: Replica | None = None) -> np.ndarray:
    """End-to-end time of each request alone on an idle replica (s): its service time.

    Prefill of the whole prompt (in the mode's chunks, ``Replica.idle_chunk_tokens``),
    then ``N - 1`` decode steps at batch 1, with no prefix-cache hits. With the built-in
    cost this is ``Replica.idle_prefill_s(prompt_tokens) + (output_tokens - 1) *
    decode_time(1)`` (additive: ``prompt_tokens / prefill_rate`` for the prefill); with a custom
    ``step_time`` the replica's own cost of each step is summed (a Python loop: slower).
    Slowdown is measured against this number.
    """
    prompt = _tokens(requests, "prompt_tokens")
    output = _tokens(requests, "output_tokens")
    rep = _replica(replica)
    if rep.step_time is None:
        return rep.idle_prefill_s(prompt) + (output - 1) * rep.decode_time(1)
    out = np.empty(prompt.size)
    chunk = rep.idle_chunk_tokens
    for i, (p, n) in enumerate(zip(prompt.astype(int), output.astype(int), strict=True)):
        total, done = 0.0, 0
        while done < p:
            take = int(min(chunk, p - done))
            total += rep.cost(StepDetail(np.array([take]), np.array([done]), np.zeros(0, int)))
            done += take
        for k in range(n - 1):
            total += rep.cost(StepDetail(np.zeros(0, int), np.zeros(0, int), np.array([p + k + 1])))
        out[i] = total
    return out


def full_batch_work_s(requests, replica: Replica | None = None) -> np.ndarray:
    """Replica time each request uses when the batch is full (s).

    ``Replica.full_batch_work_s``: with the additive cost ``prompt_tokens /
    prefill_rate + (output_tokens - 1) * decode_time(B) / B`` with ``B = max_batch``
    (its prefill occupies the whole replica, and each decode step is shared by ``B``
    sequences); with the fused cost a lower bound in which the prompt's tokens ride the
    decodes' weight reads. Needs the built-in cost model (a custom ``step_time`` raises
    ``ValueError``).
    """
    prompt = _tokens(requests, "prompt_tokens")
    output = _tokens(requests, "output_tokens")
    rep = _replica(replica)
    if rep.step_time is not None:
        raise ValueError("full_batch_work_s needs the default cost model, got a custom step_time")
    return rep.full_batch_work_s(prompt, output)


def capacity_rate(requests, replica: Replica | None = None) -> float:
    """Saturation arrival rate of one replica for this request mix (requests/s).

    ``1 / mean(full_batch_work_s)``: the rate at which a replica that always runs a full
    batch is busy 100 % of the time. Offered load ``rho = arrival_rate / capacity_rate``.
    Exact for the additive step; for the fused step an estimate (see
    :func:`saturated_rate`, which measures it).
    """
    work = full_batch_work_s(requests, replica)
    if work.size == 0:
        raise ValueError("requests must not be empty")
    return float(1.0 / work.mean())


@_check.guarded
def saturated_rate(requests, replica: Replica | None = None, n: int = 2_000,
                   replications: int = 5, trim: float = 0.2,
                   seed: int = 0) -> stats.Estimate:
    """Completion rate of one replica kept saturated by a backlog (requests/s), measured.

    Each replication draws ``n`` (prompt, output) pairs jointly, with replacement, from
    ``requests``, lets them all arrive at ``t = 0`` (a backlog that keeps the batch full)
    and simulates them FCFS on ``replica``. Its rate is the completions per second between
    the finish of the ``trim * n``-th and the ``(1 - trim) * n``-th request, so the
    batch filling at the start (warm-up) and the drain at the end are cut. The estimate is
    the mean over ``replications`` (seeds ``stats.replication_seeds(seed, ...)``) with a
    Student-t interval (:func:`servingcap.stats.mean_ci`, clipped at 0).

    :func:`capacity_rate` is exact for the additive step, but for the fused step it is
    an estimate, not a proven bound: it averages each request's own
    ``max(weight-read share, FLOP time)`` although the weight read is shared by every
    request in a step, and a fused step packs prompt chunks and decodes imperfectly (on
    the Azure conversation mix it overstates what a saturated replica finishes by about
    2 % at 32 slots and about 11 % at 8, as admission_control and scheduling_policies
    print); this measures it. Use it as
    ``bootstrap_workload(..., capacity=saturated_rate(...).value)``.

    Parameters
    ----------
    requests : DataFrame with ``prompt_tokens`` and ``output_tokens`` (tokens).
    replica : Replica (default: the locked replica).
    n : int, requests per replication, >= 10.
    replications : int, >= 2 (for an interval).
    trim : float, share of the requests cut at each end, in [0, 0.45].
    seed : int >= 0.
    """
    prompt = _tokens(requests, "prompt_tokens")
    output = _tokens(requests, "output_tokens")
    if prompt.size == 0:
        raise ValueError("requests must not be empty")
    rep = _replica(replica)
    n = _check.size("n", n, minimum=10)
    replications = _check.size("replications", replications, minimum=2)
    trim = _check.nonnegative("trim", trim)
    if trim > 0.45:
        raise ValueError(f"trim must be in [0, 0.45], got {trim!r}")
    lo = int(np.floor(trim * n))
    hi = n - 1 - lo
    rates = []
    for ss in stats.replication_seeds(seed, replications):
        pick = np.random.default_rng(ss).integers(0, prompt.size, n)
        backlog = pd.DataFrame({"arrival_s": np.zeros(n),
                                "prompt_tokens": prompt[pick].astype(np.int64),
                                "output_tokens": output[pick].astype(np.int64)})
        finish = np.sort(simulate(backlog, rep).finish_s.to_numpy())
        span = finish[hi] - finish[lo]                  # s
        if span <= 0:
            raise ValueError(f"n={n!r} is too small for this replica: the kept requests "
                             "all finish in one step; use n well above max_batch")
        rates.append((hi - lo) / span)
    return stats.mean_ci(rates, bounds=(0.0, np.inf))


@_check.renames("source")
@_check.guarded
def bootstrap_workload(source, n: int, load: float, replica: Replica | None = None,
                       rng=None, capacity: float | None = None) -> pd.DataFrame:
    """``n`` requests resampled from ``source``, Poisson arrivals at ``load`` x capacity.

    Parameters
    ----------
    source : DataFrame
        Real requests with ``prompt_tokens`` and ``output_tokens`` (e.g. a trace from
        :func:`servingcap.traffic.load_trace`); (prompt, output) pairs are drawn jointly,
        with replacement, so their correlation is kept.
    n : int
        Number of requests, >= 1.
    load : float
        Offered load rho > 0 as a fraction of :func:`capacity_rate` of ``source`` on
        ``replica`` (values above 1 are overload, allowed).
    replica : Replica
        Defines the capacity (default: the locked replica).
    rng : numpy.random.Generator or seed
    capacity : float, optional
        The saturation rate ``load`` is a fraction of (requests/s, > 0), e.g. a measured
        :func:`saturated_rate`; default :func:`capacity_rate` of ``source`` on ``replica``.

    Returns
    -------
    DataFrame with ``arrival_s`` (s, first arrival after one inter-arrival gap),
    ``prompt_tokens``, ``output_tokens`` (tokens).
    """
    prompt = _tokens(source, "prompt_tokens")
    output = _tokens(source, "output_tokens")
    if prompt.size == 0:
        raise ValueError("source must not be empty")
    n = _check.size("n", n)
    load = _check.positive("load", load)
    cap = (capacity_rate(source, replica) if capacity is None
           else _check.positive("capacity", capacity))
    rate = load * cap
    _check.finite_result(1.0 / rate, f"1 / (load={load!r} x capacity={cap!r})")
    rng = _check.generator("rng", rng)
    pick = rng.integers(0, prompt.size, n)
    return pd.DataFrame({
        "arrival_s": np.cumsum(rng.exponential(1.0 / rate, n)),
        "prompt_tokens": prompt[pick].astype(np.int64),
        "output_tokens": output[pick].astype(np.int64),
    })


@_check.guarded
def slo_deadlines(requests, ttft_slo_s: float, tpot_slo_s: float) -> np.ndarray:
    """Per-request E2E deadline (s, absolute): ``arrival + TTFT_slo + (N - 1) * TPOT_slo``.

    The latest finish that is consistent with the two latency objectives: first token
    within ``ttft_slo_s``, then ``N - 1`` more at ``tpot_slo_s`` each. Long answers get
    proportionally more time.
    """
    ttft = _check.positive("ttft_slo_s", ttft_slo_s)
    tpot = _check.positive("tpot_slo_s", tpot_slo_s)
    output = _tokens(requests, "output_tokens")
    if "arrival_s" not in requests.columns:
        raise ValueError(f"requests is missing column 'arrival_s'; has {list(requests.columns)}")
    arrival = _check.array("arrival_s", _check.column(requests, "arrival_s", "requests"))
    return arrival + ttft + (output - 1) * tpot


@_check.guarded
def noisy_predictions(output_tokens, sigma: float, rng=None) -> np.ndarray:
    """Predicted output lengths with multiplicative lognormal error (tokens).

    ``max(1, round(N * exp(sigma * Z)))`` with ``Z ~ Normal(0, 1)``: the prediction is
    right in median, and off by a factor ``exp(sigma)`` one standard deviation out
    (sigma = 1: a factor 2.7; sigma = 2: a factor 7.4). ``sigma = 0`` is the oracle.
    """
    tokens = _check.array("output_tokens", output_tokens)
    if (tokens < 1).any():
        i = int(np.argmax(tokens < 1))
        raise ValueError(f"output_tokens must be >= 1, got {tokens[i]!r} at index {i}")
    s = _check.nonnegative("sigma", sigma)
    z = _check.generator("rng", rng).standard_normal(tokens.size)
    return np.maximum(1, np.round(tokens * np.exp(s * z))).astype(np.int64)


# --------------------------------------------------------------------------- who pays


@_check.renames("result")
def queue_wait_s(result) -> np.ndarray:
    """Time from arrival to first admission (s); ``inf`` for a request never admitted."""
    arrival = _check.array("arrival_s", _check.column(result, "arrival_s", "result"))
    wait = _check.column(result, "admitted_s", "result") - arrival
    return np.where(np.isnan(wait), np.inf, wait)


@_check.renames("result")
def slowdown(result, replica: Replica | None = None) -> np.ndarray:
    """E2E / unqueued E2E per request (dimensionless, >= 1 up to step rounding).

    1 means the request ran as if alone; 10 means the system made it ten times slower
    than its own service time. ``inf`` for a request that did not finish.
    """
    return latencies(result, "e2e_s") / unqueued_e2e_s(result, replica)


@_check.guarded
def length_buckets(tokens, quantiles=(0.5, 0.9, 0.99)) -> pd.Categorical:
    """Bucket each length by the quantiles of ``tokens`` itself.

    With the default quantiles the buckets are ``p0-p50, p50-p90, p90-p99, p99-p100``:
    the shortest half, ..., the longest 1 %. A length equal to an edge falls in the
    lower bucket, so the top bucket holds lengths strictly above the p99 value.
    """
    x = _check.array("tokens", tokens)
    if x.size == 0:
        raise ValueError("tokens must not be empty")
    if isinstance(quantiles, (str, bytes)) or not hasattr(quantiles, "__iter__"):
        raise ValueError(f"quantiles must be a sequence of levels in (0, 1), got {quantiles!r}")
    qs = [_check.probability("quantiles", q) for q in quantiles]
    if list(qs) != sorted(set(qs)):
        raise ValueError(f"quantiles must be strictly increasing, got {tuple(quantiles)!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        edges = np.quantile(x, qs)
    _check.finite_result(float(np.sum(np.abs(edges))), "quantiles of tokens")
    names = [f"p{100 * a:g}-p{100 * b:g}" for a, b in zip([0.0, *qs], [*qs, 1.0], strict=True)]
    codes = np.searchsorted(edges, x, side="left")
    return pd.Categorical.from_codes(codes, categories=names, ordered=True)


@_check.renames("result")
def bucket_summary(result, replica: Replica | None = None, quantiles=(0.5, 0.9, 0.99),
                   buckets=None) -> pd.DataFrame:
    """Per output-length bucket: requests, token range, slowdown and queue wait.

    Columns: ``requests``, ``tokens`` (min-max output tokens), ``mean slowdown``,
    ``p99 slowdown`` (dimensionless), ``mean wait (s)``, ``max wait (s)``. Values are
    rounded for display. ``buckets`` overrides the grouping (one label per request).
    """
    _check.table("result", result, ("output_tokens", "arrival_s", "admitted_s"), minimum=1)
    groups = (length_buckets(result["output_tokens"], quantiles) if buckets is None
              else pd.Categorical(buckets))
    sd = slowdown(result, replica)
    wait = queue_wait_s(result)
    tokens = result["output_tokens"].to_numpy()
    rows = []
    for name in groups.categories:
        m = np.asarray(groups == name)
        if not m.any():
            continue
        rows.append({"bucket": name, "requests": int(m.sum()),
                     "tokens": f"{int(tokens[m].min())}-{int(tokens[m].max())}",
                     "mean slowdown": round(float(sd[m].mean()), 2),
                     "p99 slowdown": round(float(np.quantile(sd[m], 0.99)), 2),
                     "mean wait (s)": round(float(wait[m].mean()), 1),
                     "max wait (s)": round(float(wait[m].max()), 1)})
    return pd.DataFrame(rows).set_index("bucket")


@_check.renames("result")
def latency_summary(result) -> dict:
    """Mean, p99 and p99.9 of E2E and TTFT over all requests (s); failures count as inf.

    Returns plain floats keyed ``mean E2E (s)``, ``p99 E2E (s)``, ``p99.9 E2E (s)``,
    ``mean TTFT (s)``, ``p99 TTFT (s)``.
    """
    e2e = latencies(result, "e2e_s")
    ttft = latencies(result, "ttft_s")
    if e2e.size == 0:
        raise ValueError("result must not be empty")

    def q(x, p):
        return float(np.quantile(x, p, method="inverted_cdf"))

    return {"mean E2E (s)": float(e2e.mean()), "p99 E2E (s)": q(e2e, 0.99),
            "p99.9 E2E (s)": q(e2e, 0.999), "mean TTFT (s)": float(ttft.mean()),
            "p99 TTFT (s)": q(ttft, 0.99)}


@_check.renames("result")
def deadline_miss_rate(result, deadline_s) -> float:
    """Fraction of requests not ``done`` by their deadline (absolute times, s).

    A rejected, timed-out (shed) or unfinished request is a miss.
    """
    _check.table("result", result, ("finish_s", "outcome"), minimum=1)
    deadline = _check.array("deadline_s", deadline_s) if not np.isscalar(deadline_s) else None
    if deadline is None or deadline.size != len(result):
        raise ValueError(f"deadline_s must have one value per request ({len(result)}), "
                         f"got {np.size(deadline_s)}")
    _check.table("result", result, ("finish_s", "outcome"), minimum=1)
    finish = _check.column(result, "finish_s", "result")
    done = (result["outcome"] == "done").to_numpy()
    return float(1.0 - (done & (finish <= deadline)).mean())


# --------------------------------------------------------------------------- closed forms


@_check.guarded
def priority_waits(arrival_rate: float, service_s, keys) -> np.ndarray:
    """Mean queue wait of each job under non-preemptive priority M/G/1 (s), Cobham's formula.

    Jobs are grouped into classes by ``keys`` (smaller key served first, FCFS within a
    class); ``service_s`` is a sample of the job mix, one service time per job, and class
    ``k`` gets the share of ``arrival_rate`` its sample fraction implies. Then

    ``W_k = W0 / ((1 - sigma_{k-1}) (1 - sigma_k))``, with ``W0 = lambda E[S^2] / 2`` and
    ``sigma_k`` the load of classes 1..k.

    SJF is the case ``keys = job length``; FCFS is one class, where the formula is
    Pollaczek-Khinchine. Returns the wait of each job's class, in the order given.
    Raises :class:`~servingcap.UnstableQueueError` if the total load is >= 1.
    """
    lam = _check.positive("arrival_rate", arrival_rate)
    s = _check.array("service_s", service_s, nonnegative_values=True)
    k = _check.array("keys", keys)
    if s.size != k.size or s.size == 0:
        raise ValueError(f"service_s and keys must be non-empty and the same length, "
                         f"got {s.size} and {k.size}")
    rho = lam * s.mean()
    if rho >= 1:
        raise UnstableQueueError(
            f"unstable queue: utilization rho = {rho:.4g} >= 1 (arrival_rate {lam:.4g}/s x "
            f"mean service {s.mean():.4g} s); the lowest class waits forever")
    w0 = lam * (s**2).mean() / 2
    classes, inverse = np.unique(k, return_inverse=True)
    load = np.bincount(inverse, weights=s, minlength=classes.size) * lam / s.size
    upto = np.cumsum(load)
    before = upto - load
    wait = w0 / ((1 - before) * (1 - upto))
    return wait[inverse]


@_check.renames("result")
def mean_unfinished_work_s(result, service_s) -> float:
    """Time-average unfinished work in a one-slot, non-preemptive system (s).

    Each request holds ``S`` seconds of work while it waits ``W_q`` and drains it while
    in service, so the integral of unfinished work is ``sum(S W_q + S^2 / 2)``; divided
    by the span from the first arrival to the last finish. For every work-conserving
    order (FCFS, SJF, EDF, priority) on the same arrivals this is the same number: the
    order changes who waits, not how much work is waiting. Needs every request ``done``.
    """
    _check.table("result", result, ("arrival_s", "admitted_s", "finish_s", "outcome"), minimum=1)
    s = _check.array("service_s", service_s, nonnegative_values=True)
    if s.size != len(result) or s.size == 0:
        raise ValueError(f"service_s must have one value per request ({len(result)}), got {s.size}")
    if not (result["outcome"] == "done").all():
        raise ValueError("mean_unfinished_work_s needs every request done")
    wait = _check.array("admitted_s - arrival_s", queue_wait_s(result))
    finish = _check.array("finish_s", _check.column(result, "finish_s", "result"))
    span = float(finish.max() - _check.column(result, "arrival_s", "result").min())
    return float((s * wait + s**2 / 2).sum() / span)


@_check.renames("result")
def busy_time_s(result) -> float:
    """Time with at least one request in the system (s): the union of ``[arrival, finish]``.

    For a work-conserving replica (it never idles while a request waits) this is its
    busy time, whatever the order; preemption with recompute lengthens it. Every request
    needs a finite ``finish_s`` (done, rejected or timed out, not unfinished).
    """
    a = _check.array("arrival_s", _check.column(result, "arrival_s", "result"))
    f = _check.array("finish_s", _check.column(result, "finish_s", "result"))
    if a.size == 0:
        raise ValueError("result must not be empty")
    if (f < a).any():
        i = int(np.argmax(f < a))
        raise ValueError(f"finish_s must be >= arrival_s, got {f[i]!r} < {a[i]!r} at row {i}")
    order = np.argsort(a, kind="stable")
    a, f = a[order], f[order]
    reach = np.maximum.accumulate(f)
    starts = np.r_[True, a[1:] > reach[:-1]]          # a new busy period begins
    first = np.nonzero(starts)[0]
    ends = np.r_[first[1:] - 1, a.size - 1]
    return float((reach[ends] - a[first]).sum())
