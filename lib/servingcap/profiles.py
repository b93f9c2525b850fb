"""Published step-time profiles as cost models: DistServe's fitted OPT coefficients, and
Vidur's measured linear-operation times fused with a roofline for attention.

Vidur {Agrawal et al., MLSys 2024} (:func:`vidur_cost`, :class:`VidurCost`): a step is one
fused forward pass; its linear operations (projections, MLP, norms, activation, residual
add of every layer) are looked up in Vidur's measured per-layer profiles at the step's
*total* token count rounded up to a multiple of 8, as Vidur's predictor does
(``vidur/entities/batch.py``: ``_total_num_tokens_rounded``), interpolated linearly between
measured counts and never extrapolated; the LM head, prefill and decode attention, the
all-reduce and the overhead come from :class:`~servingcap.roofline.Roofline`, group by
group. The measured medians ship in ``data/gpus_measured.csv`` (``data/gpus_measured.md``).

Source: DistServe {Zhong et al., OSDI 2024}, its simulator ``simdistserve`` (repository
LLMServe/DistServe, Apache-2.0). The coefficients were fitted by DistServe's authors to
step times measured on A100-80GB GPUs, for OPT-13B and OPT-66B at several tensor-parallel
degrees, on DistServe's own engine and on vLLM. They are shipped unchanged in
``data/distserve_profiles/`` with their license and provenance.

:func:`distserve_profile` loads one (model, TP, engine) entry and returns a
:class:`DistServeCost`, a detailed cost model for ``Replica(step_time=...)`` that
evaluates a step exactly as ``simdistserve`` does (pipeline degree 1), in milliseconds
converted to seconds:

* a prefill step over prompts ``L_1..L_n``: ``a + b*sum(L) + c*sum(L^2)`` from the
  profile's ``prefill`` set, plus 1 ms (the simulator's per-prefill-step constant);
* a decode step over ``B`` sequences: ``a + b*sum(C) + c*B`` with ``C`` the context
  each sequence attends over *including the token being decoded* (prompt + tokens
  generated so far, the engine's ``decode_context``), using ``decoding_smallbs`` when
  ``B < decoding_large_small_bs_threshold`` (95) and ``decoding_largebs`` otherwise;
* every step: 2 ms + 1e-4 ms per context token held by the step's sequences (the
  simulator's "ray overhead"), where a prefilling sequence holds its prompt and a
  decoding one ``C - 1`` tokens (the token being decoded is not yet cached).

Two things the DistServe simulator never does are defined here as follows. A *hybrid*
step (prefill and decode together, ``mode="combined"`` or ``"mixed"``) costs the prefill
formula plus the decode formula plus one set of overheads (``hybrid="additive"``,
default); ``hybrid="distserve"`` instead charges the decodes only their overhead, as
``simdistserve``'s chunked-prefill worker does (an underestimate: decode compute is not
free). A *chunk* of ``n`` tokens after ``k`` cached ones counts ``n^2`` in the quadratic
term and ``k + n`` context tokens, as ``simdistserve`` counts its chunks (whole prompts,
the only case DistServe's published runs use, are exact).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _check
from .roofline import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, GROUPS, Roofline, measured_steps
from .serving import Replica, StepDetail
from .traffic import data_dir

__all__ = ["DistServeCost", "distserve_profile", "distserve_replica", "distserve_max_num_tokens",
           "ENGINES", "NO_BATCH_LIMIT", "VidurCost", "vidur_cost", "vidur_profiles"]

ENGINES = ("distserve", "vllm")
PREFILL_STEP_MS = 1.0        # simdistserve: pp_const = 1 ms per prefill step (pp = 1)
STEP_OVERHEAD_MS = 2.0       # simdistserve: "ray overhead", base per step
OVERHEAD_PER_TOKEN_MS = 1e-4  # ... plus this per context token in the step
HYBRIDS = ("additive", "distserve")
_CHECK_TOKENS = 2 ** 20      # prefill range checked when the profile has no token cap
NO_BATCH_LIMIT = 10 ** 7     # simdistserve's "no limit" batch size


def _profile_dir() -> Path:
    return data_dir() / "distserve_profiles"     # data_dir honours $SERVINGCAP_DATA


def _model_key(model: str, available) -> str:
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a model name such as 'opt-13b', got {model!r}")
    for key in (model, f"facebook/{model}", model.replace("_", "-"),
                f"facebook/{model.replace('_', '-')}"):
        if key in available:
            return key
    raise ValueError(f"model={model!r} is not in the profile; it has {sorted(available)}")


def distserve_max_num_tokens(model: str = "opt-13b", tp: int = 1, pp: int = 1) -> int:
    """Most prompt tokens one prefill step may hold in DistServe's simulator (tokens).

    From ``data/distserve_profiles/max_num_tokens.csv`` (``simdistserve``'s memory
    estimate of the KV room left on the GPUs); 66,144 for OPT-13B at TP 1, PP 1. Use it
    as ``Replica(max_batched_tokens=...)`` to match DistServe's prefill batches.
    """
    tp = _check.whole("tp", tp)
    pp = _check.whole("pp", pp)
    with open(_profile_dir() / "max_num_tokens.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    key = _model_key(model, {r["model"] for r in rows})
    for r in rows:
        if r["model"] == key and int(r["tp"]) == tp and int(r["pp"]) == pp:
            return int(r["max_num_tokens"])
    have = sorted((int(r["tp"]), int(r["pp"])) for r in rows if r["model"] == key)
    raise ValueError(f"no max_num_tokens for model={model!r} with tp={tp}, pp={pp}; "
                     f"(tp, pp) available: {have}")


@dataclass(frozen=True)
class DistServeCost:
    """DistServe's step-time formula for one model, TP degree and engine (see the
    module docstring); call it with a :class:`~servingcap.serving.StepDetail`.

    Coefficients are in milliseconds (``a``), ms per token (``b``) and ms per token^2
    or per sequence (``c``), exactly as published. ``max_num_tokens`` is DistServe's
    prefill token cap for this model and TP at PP 1 (None when the table has none).
    """

    model: str
    tp: int
    engine: str
    prefill: tuple[float, float, float]
    decode_small: tuple[float, float, float]
    decode_large: tuple[float, float, float]
    threshold: int
    max_num_tokens: int | None = None
    overheads: bool = True
    hybrid: str = "additive"
    wants_detail = True

    @property
    def source(self) -> str:
        """Where the numbers come from, for printing next to a result."""
        return (f"DistServe published profile ({self.engine} engine, {self.model}, TP {self.tp}, "
                "A100-80GB; simdistserve step-time formula)")

    @_check.guarded
    def prefill_ms(self, chunks, cached=None) -> float:
        """Prefill part of a step (ms): ``a + b*sum(n) + c*sum(n^2)`` (+1 ms with
        overheads); 0 for no chunks. ``cached`` is accepted for symmetry and unused."""
        return self._prefill_ms(_check.array("chunks", chunks, nonnegative_values=True))

    def _prefill_ms(self, n: np.ndarray) -> float:
        if n.size == 0:
            return 0.0
        a, b, c = self.prefill
        return float(a + b * n.sum() + c * (n * n).sum()) + (PREFILL_STEP_MS if self.overheads else 0.0)

    @_check.guarded
    def decode_ms(self, context) -> float:
        """Decode part of a step (ms) over sequences with these contexts (tokens,
        including the token being decoded); the coefficient set switches at
        ``threshold`` sequences. 0 for an empty batch."""
        return self._decode_ms(_check.array("context", context, nonnegative_values=True))

    def _decode_ms(self, ctx: np.ndarray) -> float:
        if ctx.size == 0:
            return 0.0
        a, b, c = self.decode_small if ctx.size < self.threshold else self.decode_large
        return float(a + b * ctx.sum() + c * ctx.size)

    def overhead_ms(self, detail: StepDetail) -> float:
        """DistServe's per-step overhead (ms): 2 ms + 1e-4 ms per context token held."""
        if not self.overheads:
            return 0.0
        held = float((detail.prefill_cached + detail.prefill_chunks).sum()
                     + (detail.decode_context - 1).sum())
        return STEP_OVERHEAD_MS + OVERHEAD_PER_TOKEN_MS * held

    def step_ms(self, detail: StepDetail) -> float:
        """Duration of a step (ms)."""
        if not isinstance(detail, StepDetail):
            raise TypeError(f"detail must be a StepDetail (build one with roofline.step), "
                            f"got {detail!r}")
        # the engine's (and roofline.step's) arrays are already finite and >= 0
        prefill = self._prefill_ms(np.asarray(detail.prefill_chunks, dtype=float))
        decode = self._decode_ms(np.asarray(detail.decode_context, dtype=float))
        if prefill and self.hybrid == "distserve":
            decode = 0.0
        return prefill + decode + self.overhead_ms(detail)

    def __call__(self, detail: StepDetail) -> float:
        return self.step_ms(detail) / 1000.0


def _coefficients(entry: dict, name: str, where: str) -> tuple[float, float, float]:
    if name not in entry:
        raise ValueError(f"profile {where} has no {name!r} coefficients; it has {sorted(entry)}")
    terms = entry[name]
    if not isinstance(terms, (list, tuple)) or len(terms) != 3:
        raise ValueError(f"profile {where} {name} must be three numbers (a, b, c), got {terms!r}")
    return tuple(_check.number(f"{where} {name}[{i}]", t) for i, t in enumerate(terms))


def _check_positive_times(cost: DistServeCost, where: str) -> None:
    """Refuse a profile that predicts a step time <= 0 in its operating range."""
    top = cost.max_num_tokens or _CHECK_TOKENS
    a, b, c = cost.prefill
    lengths = [1.0, float(top)]
    if c > 0 and 1 < -b / (2 * c) < top:
        lengths.append(-b / (2 * c))                     # the parabola's minimum
    for length in lengths:
        ms = a + b * length + c * length * length
        if not ms > 0:
            raise ValueError(f"profile {where} prefill gives a step time of {ms:.4g} ms for a "
                             f"{length:.0f}-token prompt; step times must be > 0")
    for name, terms in (("decoding_smallbs", cost.decode_small),
                        ("decoding_largebs", cost.decode_large)):
        if terms[0] <= 0 or min(terms[1:]) < 0:
            raise ValueError(f"profile {where} {name} = {terms!r} gives step times <= 0 "
                             "(the intercept must be > 0 and the slopes >= 0)")


def distserve_profile(model: str = "opt-13b", tp: int = 1, engine: str = "distserve", *,
                      path=None, overheads: bool = True, hybrid: str = "additive") -> DistServeCost:
    """DistServe's published step-time profile as a cost model for ``Replica``.

    Parameters
    ----------
    model : str
        ``"opt-13b"`` or ``"opt-66b"`` (or the full ``"facebook/opt-13b"``).
    tp : int
        Tensor-parallel degree: 1, 2, 4 for OPT-13B; 2, 3, 4, 8 for OPT-66B.
    engine : {"distserve", "vllm"}
        Which engine's measurements: DistServe's own or vLLM's.
    path : str or Path, optional
        A profile JSON of the same layout (your own fit); default: the shipped file
        ``data/distserve_profiles/profiler-a100-80g.<engine>.json``.
    overheads : bool
        Add DistServe's fixed per-step overheads (1 ms per prefill step; 2 ms +
        1e-4 ms per context token every step), as its simulator does. Default True.
    hybrid : {"additive", "distserve"}
        How a step holding both prefill and decode is charged (see the module docstring).

    Returns
    -------
    DistServeCost
        Use as ``Replica(step_time=cost, mode="prefill_first",
        max_batched_tokens=cost.max_num_tokens, max_batch=...)`` to imitate DistServe's
        colocated baseline.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if hybrid not in HYBRIDS:
        raise ValueError(f"hybrid must be one of {HYBRIDS}, got {hybrid!r}")
    if not isinstance(overheads, bool):
        raise ValueError(f"overheads must be True or False, got {overheads!r}")
    tp = _check.whole("tp", tp)
    if path is not None and not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a file path or None, got {path!r}")
    file = Path(path) if path is not None else _profile_dir() / f"profiler-a100-80g.{engine}.json"
    try:
        with open(file) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read profile path={str(file)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"profile {str(file)!r} must map model names to TP entries")
    key = _model_key(model, data)
    if str(tp) not in data[key]:
        raise ValueError(f"profile has no tp={tp} for model {key!r}; it has tp "
                         f"{sorted(data[key], key=int)}")
    entry, where = data[key][str(tp)], f"{key} tp={tp}"
    threshold = _check.whole(f"{where} decoding_large_small_bs_threshold",
                             entry.get("decoding_large_small_bs_threshold"))
    try:
        cap = distserve_max_num_tokens(key, tp, 1)
    except ValueError:
        cap = None
    cost = DistServeCost(
        model=key, tp=tp, engine=engine,
        prefill=_coefficients(entry, "prefill", where),
        decode_small=_coefficients(entry, "decoding_smallbs", where),
        decode_large=_coefficients(entry, "decoding_largebs", where),
        threshold=threshold, max_num_tokens=cap, overheads=overheads, hybrid=hybrid)
    _check_positive_times(cost, where)
    return cost



def distserve_replica(model: str = "opt-13b", tp: int = 1, engine: str = "distserve",
                      **replica_options) -> Replica:
    """A replica that schedules and costs its steps as DistServe's simulator does.

    ``mode="prefill_first"`` (prefill-only steps of whole prompts, FIFO, decodes wait),
    DistServe's prefill token cap for the model and TP (``max_batched_tokens``), no
    batch-size limit (``max_batch`` = 10^7, simdistserve's "unlimited"), no KV limit,
    and :func:`distserve_profile` as the cost. This is DistServe's colocated
    (``VLLMCluster``) instance; for its disaggregated pair, pass it as both pools of
    :func:`servingcap.disagg.simulate_disaggregated`. ``replica_options`` override any
    :class:`~servingcap.serving.Replica` field (e.g. ``kv_capacity_tokens``).
    """
    cost = distserve_profile(model, tp, engine)
    options = {"step_time": cost, "mode": "prefill_first", "max_batched_tokens": cost.max_num_tokens,
               "max_batch": NO_BATCH_LIMIT, **replica_options}
    return Replica(**options)


VIDUR_ROUNDING = 8           # Vidur looks linear ops up at the token count rounded up to this
_VIDUR_ALIASES = {"meta-llama-3-8b": "Llama-3.1-8B", "meta-llama/meta-llama-3-8b": "Llama-3.1-8B",
                  "meta-llama/llama-2-7b-hf": "Llama-2-7b-hf"}


def vidur_profiles():
    """The (model, GPU) pairs with a measured Vidur linear-op profile, TP 1, as a
    DataFrame: model, measured_model (Vidur's name), gpu, points, min_tokens, max_tokens."""
    v = measured_steps().query("source == 'vidur' and phase == 'linear_ops' and tp == 1")
    g = v.groupby(["model", "measured_model", "gpu"], sort=True).tokens
    return g.agg(points="size", min_tokens="min", max_tokens="max").reset_index()


@dataclass(frozen=True)
class VidurCost:
    """A fused step cost: Vidur's measured linear-op times plus a roofline for the rest.

    Build it with :func:`vidur_cost`. Call it with a
    :class:`~servingcap.serving.StepDetail` (seconds); use as ``Replica(step_time=cost,
    mode="mixed", max_batched_tokens=cost.max_tokens)`` (in ``mode="combined"`` keep
    ``chunk_tokens + max_batch`` within :attr:`max_tokens`). A step whose total tokens
    fall outside the measured range raises ``ValueError`` (no extrapolation).

    Attributes
    ----------
    roofline : Roofline
        Prices the LM head, prefill and decode attention, all-reduce and overhead.
    tokens, linear_ms : tuple of float
        The measured token counts and the linear operations' time of all layers there (ms).
    measured_model : str
        The model Vidur profiled (Meta-Llama-3-8B stands for Llama-3.1-8B: same shapes).
    """

    roofline: Roofline
    tokens: tuple
    linear_ms: tuple
    measured_model: str
    wants_detail = True

    @property
    def max_tokens(self) -> int:
        """Most tokens one step may carry: the largest measured count (tokens)."""
        return int(self.tokens[-1])

    @property
    def source(self) -> str:
        """Where the numbers come from, for printing next to a result."""
        r = self.roofline
        return (f"Vidur measured linear ops ({self.measured_model} on 1 x {r.gpu.name}, "
                f"{int(self.tokens[0])}-{self.max_tokens} tokens, rounded up to a multiple of "
                f"{VIDUR_ROUNDING}) + roofline LM head and attention (efficiency "
                f"{r.flops_efficiency:.2f} FLOP/s, {r.bandwidth_efficiency:.2f} bandwidth), "
                f"overhead {r.overhead_s * 1e3:.2f} ms/step")

    def describe(self) -> str:
        """One line naming the cost model's source (same as :attr:`source`)."""
        return self.source

    def linear_s(self, tokens) -> float:
        """Measured time of the linear operations of all layers for a step of ``tokens``
        total tokens (seconds); 0 for 0 tokens. Refuses counts beyond the measured range."""
        t = _check.number("tokens", tokens)
        if t == 0:
            return 0.0
        if not (t == int(t) and 1 <= t <= self.max_tokens):
            raise ValueError(f"tokens={tokens!r} is outside the measured range 1 to "
                             f"{self.max_tokens} tokens (whole) of Vidur's {self.measured_model} "
                             f"/ {self.roofline.gpu.name} linear-op profile; no extrapolation")
        rounded = min(-(-int(t) // VIDUR_ROUNDING) * VIDUR_ROUNDING, self.max_tokens)
        return float(np.interp(rounded, self.tokens, self.linear_ms)) / 1000.0

    def breakdown(self, detail: StepDetail) -> dict:
        """The roofline's :meth:`~servingcap.roofline.Roofline.breakdown` with the linear
        group replaced by the measured time (``linear_bound`` becomes ``"measured"``)."""
        out = self.roofline.breakdown(detail)
        out["linear_s"] = self.linear_s(out["tokens"])
        out["linear_bound"] = "measured" if out["tokens"] else "idle"
        if out["tokens"]:
            out["step_s"] = (sum(out[f"{g}_s"] for g in GROUPS) + out["comm_s"]
                             + self.roofline.overhead_s)
        return out

    def __call__(self, detail: StepDetail) -> float:
        return self.breakdown(detail)["step_s"]


def vidur_cost(model: str = "Llama-3.1-8B", gpu: str = "A100-80GB", *,
               overhead_s: float = 0.0, flops_efficiency: float = FLOPS_EFFICIENCY,
               bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY) -> VidurCost:
    """A fused step cost from Vidur's measured linear-operation profile (TP 1).

    Parameters
    ----------
    model : str
        ``"Llama-2-7b-hf"`` or ``"Llama-3.1-8B"`` (Vidur profiled Meta-Llama-3-8B, the same
        shapes; that name is accepted too). See :func:`vidur_profiles`.
    gpu : str
        ``"A100-80GB"`` (both models) or ``"H100-SXM"`` (Llama-2-7B).
    overhead_s : float
        Fixed time added to every non-empty step (seconds).
    flops_efficiency, bandwidth_efficiency : float in (0, 1]
        Efficiencies of the roofline that prices the LM head and attention.

    Returns
    -------
    VidurCost
        Refuses (``ValueError``) a step of more tokens than were measured (4,096).
    """
    available = vidur_profiles()
    if not isinstance(model, str):
        raise ValueError(f"model must be a model name such as 'Llama-3.1-8B', got {model!r}")
    names = {m.lower(): m for m in available.model}
    key = names.get(model.lower()) or _VIDUR_ALIASES.get(model.lower())
    if key is None:
        raise ValueError(f"model={model!r} has no Vidur linear-op profile; profiled: "
                         f"{sorted(set(available.model))}")
    if not isinstance(gpu, str):
        raise ValueError(f"gpu must be a GPU name such as 'A100-80GB', got {gpu!r}")
    rows = available[(available.model == key) & (available.gpu.str.lower() == gpu.lower())]
    if rows.empty:
        raise ValueError(f"gpu={gpu!r} has no Vidur linear-op profile for {key}; profiled: "
                         f"{sorted(available[available.model == key].gpu)}")
    row = rows.iloc[0]
    with _check.naming("gpu"):
        roof = Roofline(key, row.gpu, flops_efficiency=flops_efficiency,
                        bandwidth_efficiency=bandwidth_efficiency, overhead_s=overhead_s)
    v = measured_steps().query("source == 'vidur' and phase == 'linear_ops' and tp == 1 "
                               "and model == @key and gpu == @row.gpu").sort_values("tokens")
    return VidurCost(roofline=roof, tokens=tuple(float(t) for t in v.tokens),
                     linear_ms=tuple(float(x) for x in v.measured_ms),
                     measured_model=str(row.measured_model))
