"""Calibrate the simulator's step cost on your own engine, from a ``vllm bench serve`` run.

Source of the cost: the reader's benchmark. ``vllm bench serve --save-result
--save-detailed`` writes one JSON object holding, per request, ``input_lens``,
``output_lens``, ``ttfts`` (s), ``itls`` (list of inter-token gaps, s), ``errors``
(empty string when it succeeded) and, in recent versions, ``start_times`` (client send
times, ``time.perf_counter`` seconds), plus the load settings ``request_rate`` (a number
or ``"inf"``) and ``max_concurrency`` (None or an int). Older ``benchmarks/
benchmark_serving.py`` writes the same per-request lists without ``start_times``.

:func:`calibrate` fits a DistServe-form :class:`~servingcap.costmodel.PhaseCost`
(prefill ``a + b L + c L^2``, decode ``a + b * sum(context) + c * batch``) in two steps:

1. *Rebuild the steps* (:func:`fit_timeline`): every streamed token leaves the engine at
   the end of a step, so the union of all requests' token times marks the step ends, and
   who emitted a token at each end says what the step held (a first token: that prompt's
   prefill; a later one: a decode at known context). The step durations are fitted by
   the non-negative, relative-error least squares :func:`servingcap.costmodel.fit` uses.
   This is exact for whole-prompt scheduling (prefill-first or combined steps); with
   chunked prefill the earlier chunks of a prompt are invisible in token times and their
   cost is absorbed by the steps they shared.
2. *Replay* the benchmark's requests through :func:`servingcap.serving.simulate` with the
   fitted cost and the engine's scheduler knobs, and report each request's TTFT and TPOT
   error against the measured ones: the check that cost *and* knobs are right.

Arrival times replayed: the recorded ``start_times`` when present (exact). Without them:
requests sent at ``i / request_rate`` (the benchmark drew Poisson gaps from a seed the
file does not hold, so this is an approximation), all at 0 for ``request_rate = inf``; and
under ``max_concurrency = C`` each request waits for one of ``C`` client slots, freed when
an earlier request finishes at its *measured* latency (how the benchmark's semaphore
behaves). The replay is only as right as the replica's scheduler knobs (``max_batch``,
``chunk_tokens``, KV capacity, scheduling mode): set them to the engine's. Client-side
time (HTTP, tokenization) is part of what the benchmark measured, so it ends up in the
fitted constants, as it does in the TTFT your users see.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import _check
from .costmodel import PhaseCost, _nonnegative_fit
from .serving import Replica, simulate

__all__ = ["load_vllm_result", "fit_timeline", "calibrate", "Calibration",
           "simulated_vllm_result", "main", "REQUIRED_FIELDS", "save_cost", "load_cost",
           "CostFile", "MAX_REPLAY_ERROR", "COST_FORMAT"]

MAX_REPLAY_ERROR = 0.25
"""Largest median replay error (TTFT or TPOT, relative) ``calibrate`` accepts without
``--force``. A cost whose replay misses the median request's latency by a quarter moves
every latency the planner simulates by about as much, which is the width of a typical
SLO's headroom; on files the simulator wrote with 0.5 ms of token-time jitter the error
stays under 5 % (tests/test_calibrate.py)."""

COST_FORMAT = "servingcap-cost/1"
"""The ``format`` field of a cost file written by ``calibrate --output``."""

REPLICA_KNOBS = ("max_batch", "chunk_tokens", "kv_capacity_tokens", "mode",
                 "max_batched_tokens")
"""Scheduler knobs a cost file carries (the replay's, so the plan runs the same engine)."""

REQUIRED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls")
"""Per-request lists a ``vllm bench serve`` result must hold to calibrate from."""


def _rate(value) -> float:
    if value is None or value == "inf":
        return math.inf
    return _check.positive("request_rate", value)


def load_vllm_result(source) -> tuple[pd.DataFrame, dict]:
    """Read a ``vllm bench serve --save-result --save-detailed`` JSON file.

    Parameters
    ----------
    source : str, Path or dict
        The file, or its parsed content.

    Returns
    -------
    (requests, meta)
        ``requests``: one row per request with ``arrival_s`` (s, replayed send time),
        ``prompt_tokens``, ``output_tokens``, measured ``ttft_s``, ``tpot_s`` (mean
        inter-token gap, s) and ``itl_median_s`` (median gap, s; both NaN for one-token
        outputs) and ``ok`` (no error).
        ``meta``: ``request_rate`` (req/s, inf when unpaced), ``max_concurrency``,
        ``arrivals`` (how arrival times were obtained), ``model_id``, ``backend``.
    """
    if isinstance(source, dict):
        data, where = source, "benchmark result (source)"
    elif not isinstance(source, (str, Path)):
        raise ValueError(f"source must be a benchmark result file or its parsed dict, got "
                         f"{source!r}")
    else:
        path = Path(source)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"benchmark result {str(source)!r} does not exist "
                             "(source)") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"benchmark result {str(source)!r} is not JSON (source): "
                             f"{err}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read benchmark result source={str(source)!r}: "
                             f"{err}") from None
        where = f"benchmark result source={str(source)!r}"
    if not isinstance(data, dict):
        raise ValueError(f"{where} must hold one JSON object, got {type(data).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        raise ValueError(
            f"{where} is missing the field(s) {', '.join(missing)}: not a per-request "
            "vllm bench serve result (run it with --save-result --save-detailed)")
    for f in REQUIRED_FIELDS:
        if not isinstance(data[f], list):
            raise ValueError(f"{where}: field {f} must be a list (one entry per request), "
                             f"got {type(data[f]).__name__}")
    lens = {f: len(data[f]) for f in REQUIRED_FIELDS}
    if len(set(lens.values())) != 1 or not lens["ttfts"]:
        raise ValueError(f"{where}: per-request lists must be non-empty and equally long, got {lens}")
    n = lens["ttfts"]
    errors = data.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n:
        raise ValueError(f"{where}: field errors must be a list of {n} strings (one per request)")
    prompt = _field_numbers(where, "input_lens", data["input_lens"], whole=True)
    output = _field_numbers(where, "output_lens", data["output_lens"], whole=True)
    ttft = _field_numbers(where, "ttfts", data["ttfts"])
    itls = [_field_numbers(where, f"itls[{i}]", g) for i, g in enumerate(data["itls"])]
    ok = np.array([not e for e in errors]) & (np.nan_to_num(ttft) > 0)
    ttft[~(ttft > 0)] = np.nan
    if (np.nan_to_num(prompt[ok], nan=0) < 1).any() or (np.nan_to_num(output[ok], nan=0) < 1).any():
        raise ValueError(f"{where}: input_lens and output_lens must be >= 1 token")
    prompt = np.nan_to_num(prompt, nan=1).astype(np.int64)
    output = np.nan_to_num(output, nan=1).astype(np.int64)
    # TPOT as vLLM defines it: (latency - TTFT) / (output tokens - 1), whatever the
    # streamed chunks; a per-token median gap only when there is one gap per token.
    per_token = np.array([len(g) == k - 1 for g, k in zip(itls, output, strict=True)])
    tpot = np.array([g.sum() / (k - 1) if k > 1 and len(g) else np.nan
                     for g, k in zip(itls, output, strict=True)])
    gap = np.array([np.median(g) if len(g) and t else np.nan
                    for g, t in zip(itls, per_token, strict=True)])
    rate = _rate(data.get("request_rate", "inf"))
    concurrency = data.get("max_concurrency")
    if concurrency is not None:
        concurrency = _check.whole("max_concurrency", concurrency)
    if data.get("start_times"):
        start = _field_numbers(where, "start_times", data["start_times"])
        if len(start) != n or not np.isfinite(start).all():
            raise ValueError(f"{where}: field start_times must hold {n} finite numbers")
        arrival, how, exact = start - start.min(), "recorded start_times", True
    else:
        paced = np.zeros(n) if math.isinf(rate) else np.arange(n) / rate
        latency = np.nan_to_num(ttft) + np.array([g.sum() for g in itls])
        arrival = paced if concurrency is None else _semaphore(paced, latency, concurrency)
        how = ("all sent at once" if math.isinf(rate) else f"evenly paced at {rate:g} req/s") + (
            "" if concurrency is None else f", at most {concurrency} in flight")
        # Unpaced sends are known exactly (at 0, or when a client slot frees); paced ones
        # were Poisson gaps drawn from a seed the file does not hold.
        exact = math.isinf(rate)
    requests = pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt,
                             "output_tokens": np.maximum(output, 1), "ttft_s": ttft,
                             "tpot_s": tpot, "itl_median_s": gap, "ok": ok,
                             "per_token_itls": per_token,
                             "itls": [g.tolist() for g in itls]})
    meta = {"request_rate": rate, "max_concurrency": concurrency, "arrivals": how,
            "exact_arrivals": exact, "model_id": data.get("model_id"),
            "backend": data.get("backend"), "date": data.get("date")}
    return requests, meta


def _field_numbers(where: str, field: str, values, whole: bool = False) -> np.ndarray:
    """A per-request list of numbers (None -> NaN) or a one-line error naming the field."""
    if not isinstance(values, list):
        raise ValueError(f"{where}: field {field} must be a list of numbers, got "
                         f"{type(values).__name__}")
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{where}: field {field} must hold numbers, got {v!r}")
        if whole and v is not None and not float(v).is_integer():
            raise ValueError(f"{where}: field {field} must hold whole token counts, got {v!r}")
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _semaphore(paced: np.ndarray, latency: np.ndarray, slots: int) -> np.ndarray:
    """Send times when at most ``slots`` requests may be in flight (FIFO slot handoff)."""
    busy: list[float] = []
    sent = np.empty_like(paced)
    for i, t in enumerate(paced):
        if len(busy) == slots:
            t = max(t, heapq.heappop(busy))
        sent[i] = t
        heapq.heappush(busy, t + latency[i])
    return sent


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model and how well it reproduces the benchmark.

    ``ttft_error`` and ``tpot_error`` are the median absolute relative errors of the
    per-request TTFT and TPOT simulated with ``cost`` (replaying the benchmark's
    arrivals) against the measured ones (0.05 = 5 %), and
    ``ttft_error_p90`` / ``tpot_error_p90`` their 90th percentiles.
    """

    cost: PhaseCost
    requests: int
    ttft_error: float
    tpot_error: float
    ttft_error_p90: float
    tpot_error_p90: float
    steps: int
    arrivals: str
    exact_arrivals: bool = True
    skipped: int = 0
    replica_options: dict = field(default_factory=dict)
    source: str = "a benchmark result"

    @property
    def replay_error(self) -> float:
        """The larger median replay error, TTFT or TPOT (0.05 = 5 %)."""
        return max(self.ttft_error, self.tpot_error)

    def to_dict(self) -> dict:
        """The cost file :func:`save_cost` writes (JSON-ready; seconds, tokens)."""
        return {
            "format": COST_FORMAT,
            "source": self.source,
            "step_time": {"kind": "PhaseCost", "prefill_s": list(self.cost.prefill),
                          "decode_s": list(self.cost.decode),
                          "units": "prefill step = a + b*L + c*L^2 (L prompt tokens in the "
                                   "step); decode step = a + b*sum(context) + c*batch; "
                                   "seconds"},
            "replica": {"mode": "combined", **{k: v for k, v in self.replica_options.items()
                                                if v is not None}},
            "replay_error": {"ttft_median": self.ttft_error, "ttft_p90": self.ttft_error_p90,
                             "tpot_median": self.tpot_error, "tpot_p90": self.tpot_error_p90},
            "fitted_on": {"steps": self.steps, "requests": self.requests,
                          "requests_skipped": self.skipped, "arrivals": self.arrivals,
                          "exact_arrivals": self.exact_arrivals},
        }

    def report(self) -> str:
        """Human-readable summary (ms units for the coefficients)."""
        p, d = self.cost.prefill, self.cost.decode
        return "\n".join([
            f"cost model source: your benchmark, {self.source} ({self.steps} steps rebuilt from "
            f"{self.requests} requests' token times"
            + (f", {self.skipped} skipped (failed or ITLs per chunk)" if self.skipped else "")
            + f"; arrivals: {self.arrivals})",
            f"prefill step (ms) = {p[0] * 1e3:.3f} + {p[1] * 1e3:.4g} * L + {p[2] * 1e3:.4g} * L^2",
            f"decode step (ms)  = {d[0] * 1e3:.3f} + {d[1] * 1e3:.4g} * sum(context) "
            f"+ {d[2] * 1e3:.4g} * batch",
            "replayed in the simulator, error per request vs measured:",
            f"  TTFT: median {self.ttft_error:.1%}, p90 {self.ttft_error_p90:.1%}",
            f"  TPOT: median {self.tpot_error:.1%}, p90 {self.tpot_error_p90:.1%}",
            "use it: python -m servingcap calibrate ... --output cost.json, then "
            "python -m servingcap plan --cost cost.json, or in Python "
            "servingcap.calibrate.load_cost('cost.json').replica()",
        ])


def _usable(requests: pd.DataFrame) -> np.ndarray:
    """Requests whose token times mark step ends: succeeded, one ITL per output token."""
    return (requests.ok & requests.per_token_itls).to_numpy()


def _why_unusable(requests: pd.DataFrame) -> str:
    """One line on why no request can be used (all failed, or ITLs per chunk)."""
    n = len(requests)
    if not requests.ok.any():
        return (f"every one of the {n} requests failed (errors set or no first token); "
                "nothing to calibrate from: fix the benchmark run first")
    i = int(np.flatnonzero(requests.ok & ~requests.per_token_itls)[0])
    return (f"the ITLs are per streamed chunk, not per token (request {i}: "
            f"{len(requests.itls.iat[i])} gaps for {requests.output_tokens.iat[i]} output "
            "tokens): speculative decoding or a stream interval above 1 sends several tokens "
            "at once, so token times no longer mark step ends; benchmark without them "
            "(no speculative decoding, stream interval 1) to calibrate")


def _timeline(requests: pd.DataFrame, tolerance_s: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Rebuild the engine's steps from the measured token times.

    Every token a request streams is emitted at the end of a step, so the union of all
    requests' token times (send time + TTFT + cumulative ITLs), merged within
    ``tolerance_s``, is the sequence of step ends. A step holds the prefill of each
    request whose first token it emitted and the decode of each request whose later
    token it emitted (context = prompt + tokens before it). It starts at the previous
    step's end if a request was running then, else at the first arrival it serves.

    Returns the design matrix (columns: has prefill, sum L, sum L^2, has decode,
    sum context, batch), the step durations (s), and the number of requests used
    (those with one ITL per output token, as vLLM streams by default).
    """
    usable = list(np.flatnonzero(_usable(requests)))
    events = []                                     # (time, request, token index)
    for i in usable:
        first = requests.arrival_s.iat[i] + requests.ttft_s.iat[i]
        times = first + np.concatenate([[0.0], np.cumsum(requests.itls.iat[i])])
        events.extend((t, i, m) for m, t in enumerate(times))
    events.sort()
    times = np.array([e[0] for e in events])
    new_step = np.concatenate([[True], np.diff(times) > tolerance_s])
    step_of = np.cumsum(new_step) - 1
    ends = np.maximum.reduceat(times, np.flatnonzero(new_step))
    n = len(ends)
    x = np.zeros((n, 6))
    first_arrival = np.full(n, np.inf)
    for (_, i, m), k in zip(events, step_of, strict=True):
        prompt = requests.prompt_tokens.iat[i]
        if m == 0:
            x[k, :3] += (1, prompt, prompt ** 2)
            first_arrival[k] = min(first_arrival[k], requests.arrival_s.iat[i])
        else:
            x[k, 3:] += (1, prompt + m, 1)
    x[:, 0] = x[:, 0] > 0
    x[:, 3] = x[:, 3] > 0
    # busy before step k: some usable request had arrived and not yet finished by then
    used = requests.iloc[usable]
    arrive = np.sort(used.arrival_s.to_numpy())
    finish = np.sort((used.arrival_s + used.ttft_s + used.itls.map(sum)).to_numpy())
    previous = np.concatenate([[-np.inf], ends[:-1]])
    running = (np.searchsorted(arrive, previous, side="right")
               - np.searchsorted(finish, previous + tolerance_s, side="right")) > 0
    starts = np.where(running, previous, np.maximum(previous, first_arrival))
    return x, ends - starts, len(usable)


def fit_timeline(source, tolerance_s: float | None = None) -> tuple[PhaseCost, int, int]:
    """Fit a :class:`PhaseCost` to the steps rebuilt from a benchmark's token times.

    A non-negative least-squares fit on relative error (the one
    :func:`servingcap.costmodel.fit` uses) of each step's duration against its
    composition: ``a_p [prefill] + b_p sum L + c_p sum L^2 + a_d [decode] + b_d
    sum context + c_d batch``. Exact for a whole-prompt (unchunked) scheduler that emits
    tokens at step ends; ``tolerance_s`` (default: a fifth of the smallest median
    inter-token gap) merges token times of one step that the network spread apart.

    Returns ``(cost, steps, requests)``: the fit, how many steps and requests it used.
    """
    requests, _ = source if isinstance(source, tuple) else load_vllm_result(source)
    if not _usable(requests).any():
        raise ValueError(_why_unusable(requests))
    if tolerance_s is None:
        gaps = requests.itl_median_s[_usable(requests) & requests.itl_median_s.gt(0)]
        tolerance_s = 0.2 * float(gaps.min()) if len(gaps) else 1e-3
    _check.positive("tolerance_s", tolerance_s)
    x, seconds, used = _timeline(requests, tolerance_s)
    keep = seconds > 0
    if keep.sum() < 6:
        raise ValueError(f"only {int(keep.sum())} steps could be rebuilt from the token times "
                         f"merged within tolerance_s={tolerance_s:g}; a fit needs at least 6 "
                         "(are ITLs recorded per token?)")
    coef = _nonnegative_fit(x[keep], seconds[keep], "benchmark steps")
    return PhaseCost(prefill=coef[:3], decode=coef[3:]), int(keep.sum()), used


def calibrate(source, *, tolerance_s: float | None = None, **replica_options) -> Calibration:
    """Fit a :class:`PhaseCost` to a ``vllm bench serve`` result, then check it by
    replaying the benchmark's requests through the simulator.

    Parameters
    ----------
    source : str, Path, dict or (requests, meta)
        The result file, its parsed content, or what :func:`load_vllm_result` returned.
    tolerance_s : float, optional
        Passed to :func:`fit_timeline`.
    **replica_options
        Scheduler knobs of the engine measured, passed to
        :class:`~servingcap.serving.Replica` for the replay (e.g. ``max_batch`` =
        vLLM's ``--max-num-seqs``, ``kv_capacity_tokens``; ``mode`` defaults to
        ``"combined"``, the step the fitted form prices, not the Replica default).

    Returns a :class:`Calibration`: the cost model, how many steps and requests it was
    fitted on, and the replay's per-request TTFT and TPOT errors against the measured.
    """
    loaded = source if isinstance(source, tuple) else load_vllm_result(source)
    requests, meta = loaded
    if "step_time" in replica_options:
        raise ValueError("calibrate fits step_time itself; do not pass step_time")
    # a fitted PhaseCost adds a prefill part and a decode part, so the replay runs the
    # engine's steps as combined ones unless the caller names the engine's mode
    replica_options = {"mode": "combined", **replica_options}
    Replica(**replica_options)                      # fail fast on bad knobs
    cost, steps, used = fit_timeline(loaded, tolerance_s)
    out = simulate(requests[["arrival_s", "prompt_tokens", "output_tokens"]],
                   Replica(step_time=cost, **replica_options))
    ok = requests.ok.to_numpy() & (out.outcome == "done").to_numpy()
    has_tpot = ok & requests.tpot_s.notna().to_numpy()
    e_ttft = np.abs(out.ttft_s.to_numpy()[ok] / requests.ttft_s.to_numpy()[ok] - 1)
    e_tpot = np.abs(out.tpot_s.to_numpy()[has_tpot] / requests.tpot_s.to_numpy()[has_tpot] - 1)
    label = meta.get("model_id") or "your benchmark"
    where = str(source) if isinstance(source, (str, Path)) else "a benchmark result"
    return Calibration(cost=cost, requests=used, steps=steps,
                       exact_arrivals=bool(meta.get("exact_arrivals", True)),
                       skipped=int(len(requests) - used), replica_options=dict(replica_options),
                       source=f"calibrate {where} ({label}, {meta.get('backend') or 'engine'}"
                              + (f", {meta['date']}" if meta.get("date") else "") + ")",
                       ttft_error=float(np.median(e_ttft)), tpot_error=float(np.median(e_tpot)),
                       ttft_error_p90=float(np.quantile(e_ttft, 0.9)),
                       tpot_error_p90=float(np.quantile(e_tpot, 0.9)), arrivals=meta["arrivals"])


def save_cost(calibration: Calibration, path) -> Path:
    """Write ``calibration`` as a JSON cost file (see :meth:`Calibration.to_dict`) that
    ``plan --cost`` and :func:`load_cost` read. Returns the path."""
    if not isinstance(calibration, Calibration):
        raise ValueError(f"calibration must be a Calibration, got {calibration!r}")
    if not isinstance(path, (str, Path)) or not str(path):
        raise ValueError(f"path must be a file path, got {path!r}")
    out = Path(path)
    try:
        out.write_text(json.dumps(calibration.to_dict(), indent=1) + "\n")
    except OSError as err:
        raise ValueError(f"cannot write the cost file path={str(path)!r}: {err}") from None
    return out


@dataclass(frozen=True)
class CostFile:
    """A cost file read back: the fitted step cost and the engine knobs it was fitted with."""

    cost: PhaseCost
    replica_options: dict
    source: str
    replay_error: dict

    def replica(self, **overrides) -> Replica:
        """A :class:`~servingcap.serving.Replica` with this step cost and the file's
        knobs; ``overrides`` (any Replica parameter) win over the file."""
        if "step_time" in overrides:
            raise ValueError("overrides must not hold step_time: the cost file is the step time")
        return Replica(step_time=self.cost, **{**self.replica_options, **overrides})

    def describe(self) -> str:
        e = self.replay_error
        return (f"calibrated cost from {self.source}; replay error median TTFT "
                f"{e.get('ttft_median', math.nan):.1%}, TPOT {e.get('tpot_median', math.nan):.1%}")


def load_cost(path) -> CostFile:
    """Read a cost file written by ``calibrate --output`` (:func:`save_cost`)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ValueError(f"path must be a cost file path, got {path!r}")
    where = f"cost file {str(path)!r}"
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{where} does not exist (path)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not a readable JSON file (path): {err}") from None
    if not isinstance(data, dict) or data.get("format") != COST_FORMAT:
        raise ValueError(f"{where} is not a servingcap cost file (path): its format field must "
                         f"be {COST_FORMAT!r}; write one with calibrate --output")
    try:
        step = data["step_time"]
        cost = PhaseCost(prefill=tuple(step["prefill_s"]), decode=tuple(step["decode_s"]))
        knobs = dict(data.get("replica") or {})
        error = dict(data.get("replay_error") or {})
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where} has a broken step_time (path): {err!r}") from None
    unknown = sorted(set(knobs) - set(REPLICA_KNOBS))
    if unknown:
        raise ValueError(f"{where} has unknown replica keys {unknown} (path); allowed: "
                         f"{', '.join(REPLICA_KNOBS)}")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in error.values()):
        raise ValueError(f"{where} has a broken replay_error (path): {error!r}")
    try:
        Replica(step_time=cost, **knobs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where} has bad replica knobs (path): {err}") from None
    return CostFile(cost=cost, replica_options=knobs, source=str(data.get("source", path)),
                    replay_error=error)


def _gaps(out: pd.DataFrame, log: pd.DataFrame) -> list[np.ndarray]:
    """Each request's inter-token gaps (s): the ends of the steps it decoded in, one
    replica. A token is emitted at the end of a step; 1 ns absorbs float rounding."""
    ends = (log.start_s + log.duration_s).to_numpy()
    first = np.searchsorted(ends, out.first_token_s.to_numpy() - 1e-9, side="left")
    last = np.searchsorted(ends, out.finish_s.to_numpy() - 1e-9, side="left")
    return [np.diff(ends[lo:hi + 1]) if hi > lo else np.array([])
            for lo, hi in zip(first, last, strict=True)]


def simulated_vllm_result(requests: pd.DataFrame, replica: Replica, *,
                          request_rate: float | None = None) -> dict:
    """What ``vllm bench serve --save-result --save-detailed`` would have written had
    the engine behaved exactly like ``replica`` (a known cost model to calibrate back).

    ``requests`` needs ``arrival_s, prompt_tokens, output_tokens``; arrivals are
    written as ``start_times`` (offset by 1,000 s, as ``perf_counter`` values are).
    """
    requests = _check.requests(requests)
    _check.request_tokens(requests)
    if request_rate is not None:
        request_rate = _check.positive("request_rate", request_rate)
    out, log = simulate(requests, replica, step_log=True)
    done = (out.outcome == "done").to_numpy()
    return {
        "backend": "servingcap-simulator", "model_id": "simulated",
        "request_rate": "inf" if request_rate is None else float(request_rate),
        "burstiness": 1.0, "max_concurrency": None,
        "completed": int(done.sum()), "failed": int((~done).sum()),
        "input_lens": out.prompt_tokens.astype(int).tolist(),
        "output_lens": out.output_tokens.astype(int).tolist(),
        "ttfts": [float(t) if ok else 0.0 for t, ok in zip(out.ttft_s, done, strict=True)],
        "itls": [g.tolist() for g in _gaps(out, log)],
        "start_times": (out.arrival_s + 1000.0).tolist(),
        "errors": ["" if ok else str(o) for o, ok in zip(out.outcome, done, strict=True)],
    }


_CLI_NAMES = {"tolerance_s": "--tolerance-ms", "max_batch": "--max-batch",
              "chunk_tokens": "--chunk-tokens", "kv_capacity_tokens": "--kv-capacity-tokens",
              "max_batched_tokens": "--max-batched-tokens", "mode": "--mode",
              "source": "RESULT"}


def _cli_names(message: str) -> str:
    """Python parameter names in a library message -> the command's options."""
    for name, option in _CLI_NAMES.items():
        message = re.sub(rf"\b{name}=", f"{option} ", message)
        message = re.sub(rf"(?<![-\w]){name}\b", option, message)
    return message


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None) -> int:
    """``python -m servingcap calibrate RESULT.json [--max-batch N] [--mode M] ... [--output FILE]``"""
    parser = _Parser(
        prog="python -m servingcap calibrate",
        description="Fit the simulator's step cost to a `vllm bench serve --save-result "
                    "--save-detailed` JSON file, check it by replaying the file's requests, "
                    "and write it as a cost file for `plan --cost`.")
    parser.add_argument("result", help="the benchmark's JSON result file")
    parser.add_argument("--max-batch", default="256",
                        help="the engine's --max-num-seqs (default 256, vLLM's default)")
    parser.add_argument("--chunk-tokens", default=None,
                        help="--mode combined only: prefill tokens per step")
    parser.add_argument("--kv-capacity-tokens", default=None,
                        help="KV-cache capacity in tokens (from the engine's startup log)")
    parser.add_argument("--mode", default=None,
                        help="the engine's step scheduling: combined (default), prefill_first "
                             "(vLLM V0) or mixed (vLLM V1, needs --max-batched-tokens)")
    parser.add_argument("--max-batched-tokens", default=None,
                        help="the engine's --max-num-batched-tokens: the token budget of "
                             "--mode mixed, the prefill cap of --mode prefill_first")
    parser.add_argument("--tolerance-ms", default=None,
                        help="merge token times this close into one step, milliseconds "
                             "(default: a fifth of the smallest median inter-token gap)")
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="write the fitted cost and the knobs above as JSON, for "
                             "`plan --cost FILE` and servingcap.calibrate.load_cost")
    parser.add_argument("--force", action="store_true",
                        help=f"accept a median replay error above {MAX_REPLAY_ERROR:.0%} and "
                             "send times rebuilt from a paced rate (printed as a warning)")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2

    def whole(option: str, value):
        if value is None:
            return None
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x == int(x) and x >= 1):
            raise ValueError(f"{option} must be a whole number >= 1, got {value!r}")
        return int(x)

    try:
        options = {"max_batch": whole("--max-batch", args.max_batch),
                   "chunk_tokens": whole("--chunk-tokens", args.chunk_tokens),
                   "kv_capacity_tokens": whole("--kv-capacity-tokens", args.kv_capacity_tokens),
                   "max_batched_tokens": whole("--max-batched-tokens", args.max_batched_tokens)}
        tolerance = None
        if args.tolerance_ms is not None:
            try:
                tolerance = float(args.tolerance_ms)
            except ValueError:
                tolerance = math.nan
            if not (math.isfinite(tolerance) and tolerance > 0):
                raise ValueError(f"--tolerance-ms must be a number > 0, got {args.tolerance_ms!r}")
            tolerance /= 1e3
    except ValueError as err:
        return fail(str(err))
    if args.mode is not None:
        options["mode"] = args.mode
    if args.mode == "mixed" and options["max_batched_tokens"] is None:
        # the simulator's own default budget (the book's) does not describe your engine
        return fail("--mode 'mixed' needs --max-batched-tokens (the engine's "
                    "--max-num-batched-tokens)")
    try:
        loaded = load_vllm_result(args.result)
        if not loaded[1]["exact_arrivals"] and not args.force:
            return fail(f"{args.result} has no start_times and was paced at "
                        f"{loaded[1]['request_rate']:g} req/s: its send times (Poisson gaps "
                        "from an unrecorded seed) cannot be rebuilt, so the replay cannot "
                        "check the fit; rerun vllm bench serve (recent versions record "
                        "start_times), or pass --force")
        result = calibrate(loaded, tolerance_s=tolerance, **options)
    except (ValueError, TypeError) as err:
        return fail(_cli_names(str(err)).replace("\n", " "))
    result = dataclasses.replace(result, source=result.source.replace(
        "a benchmark result", str(args.result)))
    if result.replay_error > MAX_REPLAY_ERROR and not args.force:
        return fail(f"the fitted cost replays the benchmark with a median error of "
                    f"{result.ttft_error:.1%} (TTFT) and {result.tpot_error:.1%} (TPOT), above "
                    f"{MAX_REPLAY_ERROR:.0%}: the step cost or the engine knobs (--max-batch, "
                    "--mode, --max-batched-tokens, --chunk-tokens) do not match this engine; "
                    "pass --force to keep it anyway")
    print(result.report())
    warnings = []
    if result.replay_error > MAX_REPLAY_ERROR:
        warnings.append(f"median replay error {result.replay_error:.1%} is above "
                        f"{MAX_REPLAY_ERROR:.0%} (kept because of --force)")
    if not result.exact_arrivals:
        warnings.append("send times were rebuilt from the paced rate, not recorded "
                        "(kept because of --force)")
    for text in warnings:
        print(f"WARNING: {text}")
    if args.output is not None:
        try:
            path = save_cost(result, args.output)
        except ValueError as err:
            return fail(_cli_names(str(err)).replace("path=", "--output "))
        print(f"wrote {path}: use it with python -m servingcap plan --cost {path}")
    return 0
