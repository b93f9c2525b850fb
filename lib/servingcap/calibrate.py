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
import heapq
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import _check
from .costmodel import PhaseCost, _nonnegative_fit
from .serving import Replica, simulate

__all__ = ["load_vllm_result", "fit_timeline", "calibrate", "Calibration",
           "simulated_vllm_result", "main", "REQUIRED_FIELDS"]

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
    lens = {f: len(data[f]) for f in REQUIRED_FIELDS}
    if len(set(lens.values())) != 1 or not lens["ttfts"]:
        raise ValueError(f"{where}: per-request lists must be non-empty and equally long, got {lens}")
    n = lens["ttfts"]
    errors = data.get("errors") or [""] * n
    ok = np.array([not e for e in errors]) & np.array([t is not None and t > 0 for t in data["ttfts"]])
    prompt = np.array(data["input_lens"], dtype=np.int64)
    output = np.array(data["output_lens"], dtype=np.int64)
    ttft = np.array([t if t else np.nan for t in data["ttfts"]], dtype=float)
    tpot = np.array([float(np.mean(g)) if g else np.nan for g in data["itls"]], dtype=float)
    gap = np.array([float(np.median(g)) if g else np.nan for g in data["itls"]], dtype=float)
    if (prompt < 1).any() or (output[ok] < 1).any():
        raise ValueError(f"{where}: input_lens and output_lens must be >= 1 token")
    rate = _rate(data.get("request_rate", "inf"))
    concurrency = data.get("max_concurrency")
    if concurrency is not None:
        concurrency = _check.whole("max_concurrency", concurrency)
    if data.get("start_times"):
        start = np.array(data["start_times"], dtype=float)
        arrival, how = start - start.min(), "recorded start_times"
    else:
        paced = np.zeros(n) if math.isinf(rate) else np.arange(n) / rate
        latency = np.nan_to_num(ttft) + np.array([sum(g) for g in data["itls"]])
        arrival = paced if concurrency is None else _semaphore(paced, latency, concurrency)
        how = ("all sent at once" if math.isinf(rate) else f"evenly paced at {rate:g} req/s") + (
            "" if concurrency is None else f", at most {concurrency} in flight")
    requests = pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt,
                             "output_tokens": np.maximum(output, 1), "ttft_s": ttft,
                             "tpot_s": tpot, "itl_median_s": gap, "ok": ok,
                             "itls": [list(map(float, g)) for g in data["itls"]]})
    meta = {"request_rate": rate, "max_concurrency": concurrency, "arrivals": how,
            "model_id": data.get("model_id"), "backend": data.get("backend")}
    return requests, meta


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

    def report(self) -> str:
        """Human-readable summary (ms units for the coefficients)."""
        p, d = self.cost.prefill, self.cost.decode
        return "\n".join([
            f"cost model source: your benchmark ({self.steps} steps rebuilt from "
            f"{self.requests} requests' token times; arrivals: {self.arrivals})",
            f"prefill step (ms) = {p[0] * 1e3:.3f} + {p[1] * 1e3:.4g} * L + {p[2] * 1e3:.4g} * L^2",
            f"decode step (ms)  = {d[0] * 1e3:.3f} + {d[1] * 1e3:.4g} * sum(context) "
            f"+ {d[2] * 1e3:.4g} * batch",
            "replayed in the simulator, error per request vs measured:",
            f"  TTFT: median {self.ttft_error:.1%}, p90 {self.ttft_error_p90:.1%}",
            f"  TPOT: median {self.tpot_error:.1%}, p90 {self.tpot_error_p90:.1%}",
            f"use it: Replica(step_time=PhaseCost(prefill={p!r}, decode={d!r}))",
        ])


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
    usable = [i for i in np.flatnonzero(requests.ok.to_numpy())
              if len(requests.itls.iat[i]) == requests.output_tokens.iat[i] - 1]
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
    if tolerance_s is None:
        gaps = requests.itl_median_s[requests.ok & requests.itl_median_s.gt(0)]
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
        vLLM's ``--max-num-seqs``, ``kv_capacity_tokens``).

    Returns a :class:`Calibration`: the cost model, how many steps and requests it was
    fitted on, and the replay's per-request TTFT and TPOT errors against the measured.
    """
    loaded = source if isinstance(source, tuple) else load_vllm_result(source)
    requests, meta = loaded
    if "step_time" in replica_options:
        raise ValueError("calibrate fits step_time itself; do not pass step_time")
    Replica(**replica_options)                      # fail fast on bad knobs
    cost, steps, used = fit_timeline(loaded, tolerance_s)
    out = simulate(requests[["arrival_s", "prompt_tokens", "output_tokens"]],
                   Replica(step_time=cost, **replica_options))
    ok = requests.ok.to_numpy() & (out.outcome == "done").to_numpy()
    has_tpot = ok & requests.tpot_s.notna().to_numpy()
    e_ttft = np.abs(out.ttft_s.to_numpy()[ok] / requests.ttft_s.to_numpy()[ok] - 1)
    e_tpot = np.abs(out.tpot_s.to_numpy()[has_tpot] / requests.tpot_s.to_numpy()[has_tpot] - 1)
    return Calibration(cost=cost, requests=used, steps=steps,
                       ttft_error=float(np.median(e_ttft)), tpot_error=float(np.median(e_tpot)),
                       ttft_error_p90=float(np.quantile(e_ttft, 0.9)),
                       tpot_error_p90=float(np.quantile(e_tpot, 0.9)), arrivals=meta["arrivals"])


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


def main(argv=None) -> int:
    """``python -m servingcap calibrate RESULT.json [--max-batch N] [--chunk-tokens N] ...``"""
    parser = argparse.ArgumentParser(
        prog="python -m servingcap calibrate",
        description="Fit the simulator's step cost to a `vllm bench serve --save-result "
                    "--save-detailed` JSON file by replaying its requests.")
    parser.add_argument("result", help="the benchmark's JSON result file")
    parser.add_argument("--max-batch", type=int, default=256,
                        help="the engine's --max-num-seqs (default 256, vLLM's default)")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="prefill tokens per step (the engine's chunked-prefill budget)")
    parser.add_argument("--kv-capacity-tokens", type=int, default=None,
                        help="KV-cache capacity in tokens (from the engine's startup log)")
    parser.add_argument("--mode", default=None, help="the replica's scheduling mode, if it has one")
    parser.add_argument("--tolerance-ms", type=float, default=None,
                        help="merge token times this close into one step (default: a fifth "
                             "of the smallest median inter-token gap)")
    args = parser.parse_args(argv)
    options = {"max_batch": args.max_batch, "chunk_tokens": args.chunk_tokens,
               "kv_capacity_tokens": args.kv_capacity_tokens}
    if args.mode is not None:
        options["mode"] = args.mode
    try:
        tolerance = None if args.tolerance_ms is None else args.tolerance_ms / 1e3
        result = calibrate(args.result, tolerance_s=tolerance, **options)
    except (ValueError, TypeError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(result.report())
    return 0
