"""Admission-control arithmetic: how much queue, batch and prompt an SLO can afford.

A request that waits in a queue spends its time-to-first-token budget before any GPU
work starts, so the TTFT objective caps the *wait*, and the rate at which a replica
releases batch slots turns that wait into a *queue depth*:

* wait budget ``= ttft_slo_s - prefill_s`` (s);
* drain rate ``mu`` (requests/s): how fast queued requests reach a slot;
* queue-depth cap ``k* = (wait budget - head wait) * mu`` (requests): an arrival that
  finds ``k`` requests ahead waits on average about ``head_wait + k / mu`` seconds (the
  ``k`` ahead need a slot each, then the arrival waits for one more to free), so once
  ``k > k*`` it is doomed on average the moment it arrives. The seed's arithmetic drops
  the head wait (``k* = wait budget * mu``); a memoryless stream of completions gives a
  head wait of ``1 / mu``, i.e. ``k* = wait budget * mu - 1``.

Two drain rates appear in the book. :func:`slot_drain_rate` is the seed essay's
``slots / T_hold`` (each slot an independent server held ``T_hold`` seconds). On a
replica whose prompt prefills share the forward pass with the running decodes (the
locked, colocated replica of :mod:`servingcap.serving`), each admission also stalls
every running sequence for one prefill, so the replica drains more slowly:
:func:`colocated_drain_rate`. The same stalls set the TPOT a full batch sees
(:func:`saturated_tpot_s`) and hence the largest batch that keeps TPOT inside its
objective (:func:`tpot_batch_cap`).

Units: seconds, tokens, requests, requests/s, tokens/s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from . import _check, slo, stats

__all__ = [
    "wait_budget_s", "slot_drain_rate", "colocated_drain_rate", "queue_depth_cap",
    "max_queue_setting", "saturated_tpot_s", "tpot_batch_cap", "max_prompt_tokens_for_ttft",
    "queue_positions", "kept_goodput",
]


@_check.guarded
def wait_budget_s(ttft_slo_s: float, prefill_s: float) -> float:
    """Time a request may wait before its prefill starts and still meet TTFT (s).

    ``ttft_slo_s - prefill_s``. Example: ``wait_budget_s(1.0, 0.25)`` is 0.75 s.

    Raises ``ValueError`` when the prefill alone uses the whole objective (no request
    of this size can meet it, queued or not).
    """
    slo = _check.positive("ttft_slo_s", ttft_slo_s)
    prefill = _check.nonnegative("prefill_s", prefill_s)
    if prefill >= slo:
        raise ValueError(
            f"prefill_s = {prefill!r} s leaves no wait budget under ttft_slo_s = {slo!r} s: "
            "such a request misses the objective even on an idle replica"
        )
    return slo - prefill


@_check.guarded
def slot_drain_rate(slots: int, hold_s: float) -> float:
    """Requests/s a replica admits at saturation if each slot is held ``hold_s`` seconds.

    ``slots / hold_s``: the seed's 32 slots / 9.25 s = 3.46 requests/s. Treats the
    slots as independent servers, i.e. ignores that one request's prefill stalls the
    others (see :func:`colocated_drain_rate`).
    """
    b = _check.whole("slots", slots)
    hold = _check.positive("hold_s", hold_s)
    return b / hold


@_check.guarded
def colocated_drain_rate(prefill_s: float, output_tokens: float, decode_step_s: float,
                         slots: int) -> float:
    """Requests/s a saturated colocated replica completes (and so admits).

    With every slot busy, each completion frees one slot and each admission runs one
    unchunked prefill of ``prefill_s`` seconds in a step that every running sequence
    must wait for; the ``output_tokens`` decode steps of ``decode_step_s`` are shared by
    the ``slots`` sequences. Per request the replica therefore spends
    ``prefill_s + output_tokens * decode_step_s / slots`` seconds, and

    ``mu = 1 / (prefill_s + output_tokens * decode_step_s / slots)``.

    Locked numbers: 1 / (0.25 + 300 x 0.030 / 32) = 1.88 requests/s.

    The formula takes one step time: when the step depends on the batch (the book's
    decode curve), pass the step at the full batch, ``LOCKED.decode_step_at(slots)``
    (exactly 0.030 s at the locked 32 slots).
    """
    prefill = _check.nonnegative("prefill_s", prefill_s)
    n = _check.positive("output_tokens", output_tokens)
    step = _check.positive("decode_step_s", decode_step_s)
    b = _check.whole("slots", slots)
    return 1.0 / (prefill + n * step / b)


@_check.guarded
def queue_depth_cap(ttft_slo_s: float, prefill_s: float, drain_rate: float,
                    head_wait_s: float = 0.0) -> float:
    """Queue depth (requests) beyond which an arrival misses its TTFT on average.

    ``k* = (ttft_slo_s - prefill_s - head_wait_s) * drain_rate``. Requests ahead of an
    arrival reach a slot at ``drain_rate`` requests/s, so ``k`` of them take
    ``k / drain_rate`` seconds; after them the arrival still waits ``head_wait_s``
    seconds (s) on average for a slot of its own to free. Its expected wait exceeds the
    budget once ``k > k*``.

    ``head_wait_s = 0`` (the default) is the seed's arithmetic:
    ``queue_depth_cap(1.0, 0.25, 32 / 9.25)`` is 2.59 requests (0.75 x 3.5 = 2.6 with
    the rate rounded). Completions of a full batch whose sequences sit at scattered
    stages arrive roughly as a Poisson stream, whose residual time to the next
    completion is ``1 / drain_rate``; passing that gives ``k* = budget x mu - 1``.
    A negative result means that even an arrival at the head of the queue misses on
    average. Returns a float; see :func:`max_queue_setting` for the integer setting.
    """
    budget = wait_budget_s(ttft_slo_s, prefill_s)
    mu = _check.positive("drain_rate", drain_rate)
    head = _check.nonnegative("head_wait_s", head_wait_s)
    return (budget - head) * mu


@_check.guarded
def max_queue_setting(ttft_slo_s: float, prefill_s: float, drain_rate: float,
                      head_wait_s: float = 0.0) -> int:
    """The ``Replica(max_queue=...)`` that refuses the arrivals doomed on average.

    A replica with ``max_queue = m`` refuses an arrival that finds ``m`` or more
    requests waiting. Arrivals finding ``k <= floor(k*)`` waiting (``k*`` from
    :func:`queue_depth_cap` with the same arguments) expect to make the wait budget,
    so ``m = max(floor(k*) + 1, 0)``; ``m = 0`` admits only into free slots. Seed
    numbers (no head wait): ``k* = 2.59`` gives 3; with the head wait ``1 / mu``,
    ``k* = 1.59`` gives 2. The setting is judged on the mean wait; a simulation sweep
    at the overload that matters confirms it.
    """
    k = queue_depth_cap(ttft_slo_s, prefill_s, drain_rate, head_wait_s)
    return max(int(math.floor(k)) + 1, 0)


@_check.guarded
def saturated_tpot_s(batch: int, prefill_s: float, output_tokens: float,
                     decode_step_s: float) -> float:
    """Mean time per output token (s) of a sequence in a full colocated batch.

    Each of the ``batch`` sequences sees one decode step per token plus, on average,
    ``batch / output_tokens`` admissions per token (one admission per completion, and
    the batch completes ``batch`` sequences every ``output_tokens`` steps), each of
    which stalls the step by ``prefill_s``:

    ``TPOT = decode_step_s + batch * prefill_s / output_tokens``.

    Locked numbers: 0.030 + 32 x 0.25 / 300 = 0.0567 s, over the 50 ms objective.
    On a batch-dependent decode curve pass the step at ``batch``
    (``LOCKED.decode_step_at(batch)``).
    It slightly overstates the simulated TPOT (by a few per cent), because the
    prefills that share a sequence's own first step fall before its first token.
    """
    b = _check.whole("batch", batch)
    prefill = _check.nonnegative("prefill_s", prefill_s)
    n = _check.positive("output_tokens", output_tokens)
    step = _check.positive("decode_step_s", decode_step_s)
    return step + b * prefill / n


@_check.guarded
def tpot_batch_cap(tpot_slo_s: float, prefill_s: float, output_tokens: float,
                   decode_step_s: float) -> int:
    """Largest batch whose saturated TPOT (:func:`saturated_tpot_s`) meets ``tpot_slo_s``.

    ``floor((tpot_slo_s - decode_step_s) * output_tokens / prefill_s)``. Locked numbers:
    (0.050 - 0.030) x 300 / 0.25 = 24 sequences. This closed form assumes one step
    time at every batch; on a decode curve that is faster at smaller batches, the
    largest batch with ``saturated_tpot_s(b, ..., decode_step_at(b)) <= tpot_slo_s``
    is larger (27 on the locked curve). Raises ``ValueError`` if a decode step
    alone exceeds the objective; returns a very large int when ``prefill_s`` is 0.
    """
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    prefill = _check.nonnegative("prefill_s", prefill_s)
    n = _check.positive("output_tokens", output_tokens)
    step = _check.positive("decode_step_s", decode_step_s)
    if step > slo:
        raise ValueError(
            f"decode_step_s = {step!r} s already exceeds tpot_slo_s = {slo!r} s: no batch meets it"
        )
    if prefill == 0:
        return 2**31 - 1
    # a tiny tolerance keeps exact ratios such as 24.0 from rounding down to 23
    return max(int(math.floor((slo - step) * n / prefill * (1 + 1e-12))), 0)


@_check.guarded
def max_prompt_tokens_for_ttft(ttft_slo_s: float, prefill_rate: float,
                               decode_step_s: float = 0.0) -> int:
    """Longest prompt (tokens) whose first token can meet TTFT, queue empty.

    The first token comes out of the step that runs the whole prefill, plus the decode
    step of whatever batch is running alongside (``decode_step_s``, s), so a prompt
    longer than ``(ttft_slo_s - decode_step_s) * prefill_rate`` misses even with an
    empty queue. On an idle replica nothing else decodes: leave ``decode_step_s`` at 0
    (locked numbers: 1.0 x 8000 = 8,000 tokens, *impossible work* beyond it, which can
    be refused before prefill starts). Next to a running batch pass that batch's step
    (with a 30 ms step: (1.0 - 0.030) x 8000 = 7,760 tokens).
    """
    slo = _check.positive("ttft_slo_s", ttft_slo_s)
    rate = _check.positive("prefill_rate", prefill_rate)
    step = _check.nonnegative("decode_step_s", decode_step_s)
    if step >= slo:
        raise ValueError(
            f"decode_step_s = {step!r} s leaves no time for prefill under ttft_slo_s = {slo!r} s"
        )
    return int(math.floor((slo - step) * rate * (1 + 1e-12)))


def queue_positions(requests: pd.DataFrame) -> np.ndarray:
    """Requests waiting ahead of each arrival (requests), for an FCFS single queue.

    ``requests`` is the output of :func:`servingcap.serving.simulate` (columns
    ``arrival_s``, ``admitted_s``, ``outcome``) for one replica, or one pooled queue,
    under FCFS. An earlier request is counted as ahead of request ``i`` if it was
    admitted to the queue (not rejected) and reached a slot after ``i`` arrived.
    Returns an integer array in the input's row order; rejected requests get the depth
    they found (which made them rejected).
    """
    if not isinstance(requests, pd.DataFrame):
        raise ValueError(f"requests must be a pandas DataFrame, got {type(requests).__name__}")
    missing = [c for c in ("arrival_s", "admitted_s", "outcome") if c not in requests.columns]
    if missing:
        raise ValueError(
            f"requests is missing column(s) {missing}; it has {list(requests.columns)}"
        )
    arrival = _check.column(requests, "arrival_s", "requests")
    admitted = _check.column(requests, "admitted_s", "requests")
    queued = (requests["outcome"] != "rejected").to_numpy()
    order = np.argsort(arrival, kind="stable")
    a, s, q = arrival[order], admitted[order], queued[order]
    s = np.where(np.isnan(s), np.inf, s)          # queued but never admitted: still ahead
    out = np.zeros(a.size, dtype=np.int64)
    # FCFS admits in arrival order, so the admitted times of queued requests are
    # non-decreasing; the ones still waiting at a_i are the queued j < i with s_j > a_i.
    qs = s[q]
    qi = np.cumsum(q) - q                         # queued requests before each i
    left = np.searchsorted(qs, a, side="right")   # queued requests admitted by a_i
    out_sorted = np.maximum(qi - np.minimum(left, qi), 0)
    out[order] = out_sorted
    return out


def kept_goodput(runs, run_s: float, **limits) -> tuple[list[float], float]:
    """SLO goodput (requests/s) of each replication after its warm-up; mean kept span (s).

    ``runs`` is a sequence of per-request outputs of :func:`servingcap.serving.simulate`
    (one per replication, each covering arrivals in ``[0, run_s)`` seconds). Each run's
    SLO-met indicator (:func:`servingcap.slo.meets_slo` with ``limits``, e.g.
    ``ttft_s=1.0, tpot_s=0.05``), in arrival order, is cut with
    :func:`servingcap.stats.warmup_cuts`; the goodput of run ``i`` is the number of kept
    arrivals that meet every limit divided by the kept window ``run_s - t_i``, where
    ``t_i`` is the arrival time (s) of its first kept request. Returns the per-run
    goodputs and the mean kept window over runs (s).

    Raises ``ValueError`` if ``runs`` is empty, ``run_s`` is not positive, or a run's
    first kept arrival is not before ``run_s`` (no window left to divide by).
    """
    window = _check.positive("run_s", run_s)
    if isinstance(runs, (pd.DataFrame, str, bytes)) or not isinstance(runs, Iterable):
        raise ValueError("runs must be a sequence of simulate() outputs (one per "
                         f"replication), got {type(runs).__name__}")
    frames = [_check.table(f"runs[{i}]", r, ("arrival_s", "outcome"), minimum=1)
              for i, r in enumerate(runs)]
    if not frames:
        raise ValueError("runs must hold at least 1 simulate() output, got 0")
    ordered = [f.sort_values("arrival_s", kind="stable") for f in frames]
    met = [slo.meets_slo(f, **limits).astype(float) for f in ordered]
    cuts = stats.warmup_cuts(met)
    goodputs, spans = [], []
    for i, (f, m, c) in enumerate(zip(ordered, met, cuts, strict=True)):
        start = float(f["arrival_s"].iloc[c])
        span = window - start
        if not span > 0:
            raise ValueError(f"runs[{i}]: first kept arrival at {start!r} s is not before "
                             f"run_s = {window!r} s")
        goodputs.append(float(m[c:].sum()) / span)
        spans.append(span)
    return goodputs, float(sum(s / len(spans) for s in spans))   # no overflow near 1e308
