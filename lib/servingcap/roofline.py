"""A roofline step-time model: a model's ``config.json`` plus a GPU's spec sheet.

Source of the cost: first principles (Williams et al.'s roofline), not a measurement. A
forward step over a batch does some floating-point work and moves some bytes through
HBM; it cannot finish faster than either allows, so

    step_s = max(FLOPs / (flops_efficiency * peak FLOP/s),
                 bytes / (bandwidth_efficiency * HBM bytes/s))
             + all-reduce time (tensor parallelism) + overhead_s.

What is counted, per step (``L`` layers, hidden ``H``, ``V`` vocabulary):

* **Linear layers (GEMMs)**: ``2 * tokens * params_per_layer * L`` FLOPs for every token
  in the step (prefill chunks plus one per decoding sequence), plus the LM head
  ``2 * H * V`` per sequence that samples a token (one per chunk and per decode).
* **Weights** are read from HBM **once per step**, whatever the batch: this is what
  batching amortizes, and why a decode step is memory-bound.
* **Attention**, per sequence: ``4 * L * heads * head_dim`` FLOPs per (query, key) pair
  -- a chunk of ``n`` new tokens after ``k`` cached ones has ``n * (k + (n + 1) / 2)``
  pairs (causal), a decoding sequence at context ``c`` has ``c`` -- and its KV cache,
  ``2 * L * kv_heads * head_dim * bytes`` per context token, crosses HBM once.
* **Tensor parallelism** over ``tp`` GPUs splits FLOPs, weights and KV evenly and adds
  two ring all-reduces per layer of ``tokens * H`` activations: each GPU sends
  ``2 (tp - 1) / tp`` of the message over its link at *half* the spec sheet's NVLink /
  PCIe figure (vendors quote the bidirectional total; a ring uses one direction), not
  overlapped with compute.

Ignored (small at serving sizes): norms, biases, rotary embeddings, activations' HBM
traffic, the embedding gather. The two efficiency factors (fraction of peak FLOP/s and of
HBM bandwidth that real kernels reach) are named parameters: 1.0 gives the pure roofline,
a lower bound on the step time; :func:`fit_efficiency` infers them from measured times.

GPU figures ship in ``data/gpus.csv`` (each cited to the vendor's spec sheet, dense
tensor-core FLOP/s without sparsity); model configs in ``data/model_configs/``.
Units: seconds, bytes, FLOP, tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

from . import _check
from .serving import StepDetail
from .traffic import data_dir

__all__ = ["GPU", "ModelSpec", "Roofline", "gpu", "gpu_table", "model_config",
           "model_names", "fit_efficiency", "step", "measured_steps"]

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "int8": 1}
_NOT_GATED = ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon")
# config.json field -> accepted names (OPT calls the MLP width ffn_dim; newer
# transformers versions write "dtype" instead of "torch_dtype").
_FIELDS = {
    "num_hidden_layers": ("num_hidden_layers",),
    "hidden_size": ("hidden_size",),
    "num_attention_heads": ("num_attention_heads",),
    "intermediate_size": ("intermediate_size", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "torch_dtype": ("torch_dtype", "dtype"),
}


@dataclass(frozen=True)
class GPU:
    """One GPU's spec-sheet figures (SI units: FLOP/s, bytes/s, bytes).

    ``fp8_flops`` is None for GPUs without fp8 tensor cores (A100). ``link_bytes_per_s``
    is the spec sheet's per-GPU interconnect figure (bidirectional total).
    """

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None
    interconnect: str
    link_bytes_per_s: float
    source: str


def measured_steps() -> pd.DataFrame:
    """Measured step times to compare with the roofline (``data/gpus_measured.csv``):
    Vidur's linear-operation profiles and DistServe's fitted OPT-13B profile, in ms."""
    return pd.read_csv(data_dir() / "gpus_measured.csv")


def gpu_table() -> pd.DataFrame:
    """The shipped GPU spec table (``data/gpus.csv``), one row per GPU, vendor units."""
    return pd.read_csv(data_dir() / "gpus.csv")


def gpu(name: str) -> GPU:
    """Look a GPU up by name (case-insensitive), e.g. ``"A100-80GB"`` or ``"H100-SXM"``."""
    table = gpu_table()
    if not isinstance(name, str):
        raise ValueError(f"gpu name must be a string, got {name!r}")
    match = table[table.gpu.str.lower() == name.lower()]
    if match.empty:
        raise ValueError(f"gpu name {name!r} is not in data/gpus.csv; known: "
                         f"{', '.join(table.gpu)}")
    row = match.iloc[0]
    fp8 = None if pd.isna(row.fp8_dense_tflops) else float(row.fp8_dense_tflops) * 1e12
    return GPU(name=row.gpu, memory_bytes=float(row.memory_gb) * 1e9,
               hbm_bytes_per_s=float(row.hbm_gb_per_s) * 1e9,
               bf16_flops=float(row.bf16_dense_tflops) * 1e12, fp8_flops=fp8,
               interconnect=row.interconnect, link_bytes_per_s=float(row.link_gb_per_s) * 1e9,
               source=row.source)


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a dense decoder-only transformer, as a roofline needs it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    gated_mlp: bool

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer's GEMMs: Q, K, V, O projections and the MLP."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def lm_head_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights read per step: every layer's GEMMs plus the LM head."""
        return float((self.layers * self.params_per_layer + self.lm_head_params) * self.dtype_bytes)

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> float:
        """KV-cache bytes one context token holds across all layers (K and V)."""
        size = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return float(2 * self.layers * self.kv_heads * self.head_dim * size)


def model_names() -> list[str]:
    """Names of the model configs shipped in ``data/model_configs/``."""
    return sorted(p.stem for p in (data_dir() / "model_configs").glob("*.json"))


def _field(config: Mapping, name: str):
    for key in _FIELDS[name]:
        if key in config and config[key] is not None:
            return config[key]
    aliases = " or ".join(repr(k) for k in _FIELDS[name])
    raise ValueError(f"model config (source) is missing the field {aliases}")


def model_config(source: str | Path | Mapping, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face style ``config.json``.

    Parameters
    ----------
    source : str, Path or mapping
        A shipped name (see :func:`model_names`, e.g. ``"Llama-2-7b-hf"``), a path to a
        ``config.json``, or the parsed dict.
    name : str, optional
        Label for the model (default: the file's stem or ``_name_or_path``).

    Required fields: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``intermediate_size`` (or OPT's ``ffn_dim``), ``vocab_size``, ``torch_dtype`` (or
    ``dtype``). ``num_key_value_heads`` defaults to the head count (no grouped-query
    attention), ``head_dim`` to hidden / heads; the MLP is gated (three matrices, as in
    Llama) unless ``model_type`` is a two-matrix family such as ``opt``.
    """
    if not isinstance(source, (str, Path, Mapping)):
        raise ValueError(f"source must be a shipped model name, a path to a config.json or "
                         f"a mapping, got {source!r}")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string or None, got {name!r}")
    if isinstance(source, Mapping):
        config, label = dict(source), name or source.get("_name_or_path", "model")
    else:
        path = Path(source)
        if str(source) in model_names():
            path = data_dir() / "model_configs" / f"{source}.json"
        if not path.is_file():
            raise ValueError(f"model config source={str(source)!r} is neither a shipped name "
                             f"({', '.join(model_names())}) nor a file")
        config, label = json.loads(path.read_text()), name or path.stem
    values = {key: _field(config, key) for key in _FIELDS}
    dtype = str(values["torch_dtype"]).removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"model config torch_dtype {dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    ints = {key: _check.whole(key, values[key]) for key in _FIELDS if key != "torch_dtype"}
    heads = ints["num_attention_heads"]
    kv_heads = _check.whole("num_key_value_heads", config.get("num_key_value_heads") or heads)
    head_dim = config.get("head_dim") or ints["hidden_size"] // heads
    return ModelSpec(name=label, layers=ints["num_hidden_layers"], hidden=ints["hidden_size"],
                     heads=heads, kv_heads=kv_heads, head_dim=_check.whole("head_dim", head_dim),
                     intermediate=ints["intermediate_size"], vocab=ints["vocab_size"],
                     dtype_bytes=_DTYPE_BYTES[dtype],
                     gated_mlp=config.get("model_type") not in _NOT_GATED)


MAX_BATCH = 10**6
"""Largest decode batch :meth:`Roofline.decode_s` evaluates (it builds one context length
per sequence); no engine batches anywhere near a million sequences."""


@dataclass(frozen=True)
class Roofline:
    """Roofline step time for a model on ``tp`` GPUs; a ``Replica(step_time=...)`` model.

    Parameters
    ----------
    model : ModelSpec or str
        A :class:`ModelSpec` or anything :func:`model_config` reads.
    gpu : GPU or str
        A :class:`GPU` or a name in ``data/gpus.csv``.
    tp : int
        Tensor-parallel degree (GPUs per replica).
    flops_efficiency, bandwidth_efficiency : float in (0, 1]
        Achievable fraction of peak dense FLOP/s and of HBM bandwidth (1.0: pure roofline).
    overhead_s : float
        Fixed time added to every non-empty step (kernel launches, scheduling), seconds.
    fp8 : bool
        Weights and KV cache in fp8 (1 byte), GEMMs at the fp8 peak (H100, H200, L40S).
    """

    model: ModelSpec | str
    gpu: GPU | str
    tp: int = 1
    flops_efficiency: float = 1.0
    bandwidth_efficiency: float = 1.0
    overhead_s: float = 0.0
    fp8: bool = False
    wants_detail = True          # the simulator passes a StepDetail (see serving.detailed)

    def __post_init__(self):
        if not isinstance(self.model, ModelSpec):
            with _check.naming("model"):
                object.__setattr__(self, "model", model_config(self.model))
        if not isinstance(self.gpu, GPU):
            object.__setattr__(self, "gpu", gpu(self.gpu))
        _check.whole("tp", self.tp)
        if not isinstance(self.fp8, (bool, np.bool_)):
            raise ValueError(f"fp8 must be True or False, got {self.fp8!r}")
        for name in ("flops_efficiency", "bandwidth_efficiency"):
            value = _check.positive(name, getattr(self, name))
            if value > 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        _check.nonnegative("overhead_s", self.overhead_s)
        if self.fp8 and self.gpu.fp8_flops is None:
            raise ValueError(f"fp8=True but gpu {self.gpu.name!r} has no fp8 tensor cores")

    @property
    def peak_flops(self) -> float:
        """Peak dense FLOP/s of one GPU at the weights' precision."""
        return self.gpu.fp8_flops if self.fp8 else self.gpu.bf16_flops

    def _bytes(self) -> int:
        return 1 if self.fp8 else self.model.dtype_bytes

    def work(self, detail: StepDetail, lm_head: bool = True) -> dict:
        """FLOPs, HBM bytes (whole replica) and all-reduce bytes per GPU of one step
        (``lm_head=False`` leaves the LM head out, as per-layer profiles do)."""
        if not isinstance(detail, StepDetail):
            raise TypeError(f"detail must be a StepDetail (build one with roofline.step), "
                            f"got {detail!r}")
        m = self.model
        n = np.asarray(detail.prefill_chunks, dtype=float)
        k = np.asarray(detail.prefill_cached, dtype=float)
        ctx = np.asarray(detail.decode_context, dtype=float)
        tokens = n.sum() + ctx.size
        sequences = n.size + ctx.size
        pairs = float((n * (k + (n + 1) / 2)).sum() + ctx.sum())
        context_tokens = float((k + n).sum() + ctx.sum())
        head = m.lm_head_params if lm_head else 0
        flops = (2 * tokens * m.layers * m.params_per_layer + 2 * sequences * head
                 + 4 * m.layers * m.heads * m.head_dim * pairs)
        weight_bytes = (m.layers * m.params_per_layer + head) * self._bytes()
        hbm = weight_bytes + context_tokens * m.kv_bytes_per_token(self._bytes())
        ring = 2 * (self.tp - 1) / self.tp
        allreduce = 2 * m.layers * ring * tokens * m.hidden * m.dtype_bytes
        return {"tokens": float(tokens), "flops": float(flops), "hbm_bytes": float(hbm),
                "allreduce_bytes": float(allreduce)}

    def breakdown(self, detail: StepDetail, lm_head: bool = True) -> dict:
        """The step's compute, memory and communication times (s) and which bound wins."""
        w = self.work(detail, lm_head)
        compute = w["flops"] / (self.tp * self.flops_efficiency * self.peak_flops)
        memory = w["hbm_bytes"] / (self.tp * self.bandwidth_efficiency * self.gpu.hbm_bytes_per_s)
        comm = w["allreduce_bytes"] / (self.gpu.link_bytes_per_s / 2)
        empty = w["tokens"] == 0
        step = 0.0 if empty else max(compute, memory) + comm + self.overhead_s
        return {**w, "compute_s": compute, "memory_s": memory, "comm_s": comm, "step_s": step,
                "bound": "compute" if compute >= memory else "memory",
                "intensity_flop_per_byte": w["flops"] / w["hbm_bytes"]}

    def __call__(self, detail: StepDetail) -> float:
        return self.breakdown(detail)["step_s"]

    @_check.guarded
    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Time of a prefill-only step over one prompt (s)."""
        _check.whole("prompt_tokens", prompt_tokens)
        _check.whole("cached_tokens", cached_tokens, minimum=0)
        return self(step(prefill=[prompt_tokens], cached=[cached_tokens]))

    @_check.guarded
    def decode_s(self, batch: int, context_tokens: float) -> float:
        """Time of a decode step over ``batch`` sequences (at most :data:`MAX_BATCH`) at
        this mean context (s)."""
        b = _check.whole("batch", batch)
        if b > MAX_BATCH:
            raise ValueError(f"batch must be <= {MAX_BATCH:.0e} sequences, got {batch!r}")
        _check.positive("context_tokens", context_tokens)
        return self(step(decode=np.full(b, float(context_tokens))))

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a step is compute-bound."""
        return (self.flops_efficiency * self.peak_flops
                / (self.bandwidth_efficiency * self.gpu.hbm_bytes_per_s))

    def describe(self) -> str:
        """One line naming the cost model's source and its assumptions."""
        return (f"roofline: {self.model.name} on {self.tp} x {self.gpu.name} "
                f"({'fp8' if self.fp8 else 'bf16/fp16'}), efficiency "
                f"{self.flops_efficiency:.2f} of peak FLOP/s and {self.bandwidth_efficiency:.2f} "
                f"of HBM bandwidth, overhead {self.overhead_s * 1e3:.2f} ms/step")


def step(prefill=(), cached=None, decode=()) -> StepDetail:
    """A :class:`StepDetail` from prefill chunk lengths, their cached context, and decode
    context lengths (tokens), for evaluating a cost model by hand."""
    def tokens(name, values):
        with _check.naming(name):
            return np.asarray(values, dtype=float).ravel()

    n = tokens("prefill", prefill)
    k = np.zeros_like(n) if cached is None else tokens("cached", cached)
    ctx = tokens("decode", decode)
    if k.shape != n.shape:
        raise ValueError(f"cached must have one entry per prefill chunk, got {k.size} for {n.size}")
    for label, arr in (("prefill", n), ("cached", k), ("decode", ctx)):
        if not np.isfinite(arr).all() or (arr < 0).any():
            raise ValueError(f"{label} token counts must be finite and >= 0, got {arr.tolist()!r}")
    return StepDetail(prefill_chunks=n, prefill_cached=k, decode_context=ctx)


def fit_efficiency(model, gpu_name, tokens, seconds, tp: int = 1,
                   lm_head: bool = True) -> tuple[float, float]:
    """Efficiency factors that make the roofline reproduce measured GEMM-dominated steps.

    Parameters
    ----------
    tokens : sequence of int
        Tokens in each measured step (a prefill-like step: attention negligible).
    seconds : sequence of float
        Measured time of that step's linear layers (s).
    lm_head : bool
        Whether the measured times include the LM head (Vidur's per-layer profiles do not).

    Returns ``(flops_efficiency, bandwidth_efficiency)`` minimizing the squared log error
    of ``max(FLOPs / (e_f peak), bytes / (e_b bandwidth))``, each capped at 1.
    """
    t = _check.array("tokens", tokens, nonnegative_values=True)
    s = _check.array("seconds", seconds)
    if t.shape != s.shape or t.size < 2:
        raise ValueError(f"tokens and seconds must be equal-length sequences of >= 2, got {t.size}, {s.size}")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"seconds must be finite and > 0, got {s.tolist()!r}")
    with _check.naming("gpu_name"):
        base = Roofline(model, gpu_name, tp=tp)
    parts = [base.breakdown(step(prefill=[x]), lm_head=lm_head) for x in t]
    compute = np.array([p["compute_s"] for p in parts])
    memory = np.array([p["memory_s"] for p in parts])

    def loss(log_eff):
        e_f, e_b = np.exp(np.minimum(log_eff, 0.0))
        model_s = np.maximum(compute / e_f, memory / e_b)
        return float(np.sum(np.log(model_s / s) ** 2))

    start = np.log([min(1.0, float(np.median(compute / s))), min(1.0, float(np.median(memory / s)))])
    best = optimize.minimize(loss, start, method="Nelder-Mead",
                             options={"xatol": 1e-6, "fatol": 1e-12, "maxiter": 2000})
    e_f, e_b = np.exp(np.minimum(best.x, 0.0))
    if not (math.isfinite(e_f) and math.isfinite(e_b)):
        raise ValueError("fit_efficiency did not converge on these measurements")
    return float(e_f), float(e_b)
