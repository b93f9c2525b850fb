"""A roofline step-time model: a model's ``config.json`` plus a GPU's spec sheet.

Source of the cost: first principles (Williams et al.'s roofline), not a measurement. A
step is **one fused forward pass** over every token it carries -- the prefill chunks and
one token per decoding sequence together -- as vLLM V1, SGLang (mixed chunks),
Sarathi-Serve, TensorRT-LLM in-flight batching and Orca run it. Following Vidur's
execution-time predictor (microsoft/vidur, ``vidur/execution_time_predictor/
base_execution_time_predictor.py`` and ``sklearn_execution_time_predictor.py``: every
matmul-like op is looked up at the batch's *total* token count, prefill and decode
attention separately, and the per-op times add up, ``vidur/entities/execution_time.py``),
the step is priced **by op group**, each group bounded by its own roofline:

    group_s = max(FLOPs / (flops_efficiency * peak FLOP/s),
                  bytes / (bandwidth_efficiency * HBM bytes/s))
    step_s  = linear_s + lm_head_s + prefill_attention_s + decode_attention_s
              + all-reduce time (tensor parallelism) + overhead_s.

Groups add: a decode's KV read does not overlap a compute-bound GEMM (they are different
kernels). The groups (``L`` layers, hidden ``H``, ``V`` vocabulary):

* **linear** (Q, K, V, O projections and the MLP of every layer) on the step's *total*
  tokens ``T``: ``2 * T * params_per_layer * L`` FLOPs, and the weights read from HBM
  **once per step**, whatever ``T``. Below the compute ridge (:attr:`Roofline.ridge_tokens`,
  about 170 tokens for a bf16 model on an A100-80GB at the measured efficiencies) the
  group is memory-bound and extra tokens ride almost free; above it each token costs its
  FLOPs.
* **lm_head**: ``2 * H * V`` FLOPs per sequence that samples a token (one per chunk and
  per decode: engines compute logits only at those positions), its ``H * V`` weights read
  once.
* **prefill_attention**, over all chunks of the step (one varlen kernel): a chunk of ``n``
  new tokens after ``k`` cached ones does ``4 * L * heads * head_dim`` FLOPs per (query,
  key) pair, ``n * (k + (n + 1) / 2)`` pairs (causal), and moves its ``k + n`` context
  tokens' KV (``2 * L * kv_heads * head_dim * bytes`` each) through HBM once.
* **decode_attention**, over all decoding sequences: a sequence at context ``c`` does ``c``
  pairs and reads ``c`` tokens' KV -- memory-bound at any batch.
* **Tensor parallelism** over ``tp`` GPUs splits FLOPs, weights and KV evenly and adds
  two ring all-reduces per layer of ``T * H`` activations: each GPU sends
  ``2 (tp - 1) / tp`` of the message over its link at *half* the spec sheet's NVLink /
  PCIe figure (vendors quote the bidirectional total; a ring uses one direction), not
  overlapped with compute.

Ignored (small at serving sizes): norms, biases, rotary embeddings, activations' HBM
traffic, the embedding gather. The two efficiency factors (fraction of peak FLOP/s and of
HBM bandwidth that real kernels reach) default to the values measured on Vidur's
Llama-2-7B A100-80GB linear-operation profile (:data:`FLOPS_EFFICIENCY`,
:data:`BANDWIDTH_EFFICIENCY`); 1.0 gives the pure roofline, a lower bound on the step
time. :func:`fit_efficiency` infers them from measured times, :func:`linear_op_check`
states the linear group's error against every measured profile.

GPU figures ship in ``data/gpus.csv`` (each cited to the vendor's spec sheet, dense
tensor-core FLOP/s without sparsity); model configs in ``data/model_configs/``.
Units: seconds, bytes, FLOP, tokens.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

from . import _check
from .serving import MAX_STEP_BATCH, StepDetail, largest_chunk
from .traffic import data_dir

__all__ = ["GPU", "ModelSpec", "Roofline", "gpu", "gpu_table", "load_gpus", "GPU_COLUMNS",
           "model_config",
           "model_names", "fit_efficiency", "step", "measured_steps", "linear_op_check",
           "FLOPS_EFFICIENCY", "BANDWIDTH_EFFICIENCY", "GROUPS"]

FLOPS_EFFICIENCY = 0.62
"""Default fraction of peak dense FLOP/s the GEMMs reach: :func:`fit_efficiency` on Vidur's
measured linear-operation times of Llama-2-7B on one A100-80GB (``data/gpus_measured.csv``,
259 token counts from 1 to 4,096, per-layer profiles so no LM head), rounded to two
digits (the fit gives 0.618). The same fit gives 0.61 for Llama-3-8B on A100 and 0.57 for
Llama-2-7B on H100-SXM (see :func:`linear_op_check`). Earlier versions quoted 0.64 / 0.54:
that fit wrongly counted the prefill's attention FLOPs, which Vidur's linear-op profiles
do not contain."""

BANDWIDTH_EFFICIENCY = 0.55
"""Default fraction of HBM bandwidth the weight and KV reads reach: the same fit as
:data:`FLOPS_EFFICIENCY` (0.551; 0.55 for Llama-3-8B on A100, 0.52 for Llama-2-7B on
H100-SXM)."""

GROUPS = ("linear", "lm_head", "prefill_attention", "decode_attention")
"""The op groups a step is priced by, each with its own roofline bound (module docstring)."""

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


GPU_COLUMNS = ("gpu", "memory_gb", "hbm_gb_per_s", "bf16_dense_tflops", "fp8_dense_tflops",
               "interconnect", "link_gb_per_s", "source")
"""Columns of a GPU spec table (``data/gpus.csv`` and a user's file, :func:`load_gpus`):
name; memory, GB; HBM bandwidth, GB/s; dense (no sparsity) tensor-core bf16 and fp8
TFLOP/s (fp8 empty when the GPU has none); interconnect name; its per-GPU bandwidth, GB/s
(bidirectional total, as spec sheets quote it); where the figures come from."""

def _spec_number(where: str, column: str, value, optional: bool = False) -> float:
    """A positive finite number from a spec-table cell (NaN for an empty optional one)."""
    empty = value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, float) and math.isnan(value))
    if empty and optional:
        return math.nan
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{where}: column {column!r} must be a positive number"
                         f"{' or empty' if optional else ''}, got {value!r}")
    return number


def _spec_records(path: Path) -> list[dict]:
    """The rows of a GPU spec file as dicts (CSV, TOML or JSON, by suffix)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            rows = [dict(row) for row in reader]
        if None in header or any(None in row for row in rows):
            raise ValueError(f"GPU spec file {path}: a row has more cells than the header")
        missing = [c for c in GPU_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"GPU spec file {path} is missing the column {missing[0]!r} "
                             f"(columns: {', '.join(GPU_COLUMNS)})")
        return rows
    if suffix == ".toml":
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        raise ValueError(f"GPU spec file {path} must end in .csv, .toml or .json")
    if isinstance(data, Mapping) and "gpus" in data:
        data = data["gpus"]
    elif isinstance(data, Mapping) and "gpu" in data:
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, Mapping) for r in data):
        raise ValueError(f"GPU spec file {path} must hold a list of GPU tables (TOML "
                         "[[gpus]], JSON [{...}] or {\"gpus\": [...]}), each with the keys "
                         f"{', '.join(GPU_COLUMNS)}")
    return [dict(r) for r in data]


def load_gpus(path: str | Path) -> pd.DataFrame:
    """A user's GPU spec table (e.g. MI300X, B200), validated, in :data:`GPU_COLUMNS`.

    Parameters
    ----------
    path : str or Path
        A ``.csv`` file with the columns of ``data/gpus.csv`` (:data:`GPU_COLUMNS`), or a
        ``.toml`` / ``.json`` file holding a list of tables with those keys (TOML
        ``[[gpus]]``; JSON a list or ``{"gpus": [...]}``; one table alone also works).
        ``fp8_dense_tflops`` may be empty (no fp8 tensor cores; TOML and JSON tables may
        leave it out), ``interconnect`` may be empty; every other number must be
        positive, and ``source`` must say where the figures come from. Other columns
        are kept as given. ``data/gpus_example_user.csv`` is an example.

    Returns one row per GPU, numbers as floats (fp8 NaN when empty). Raises a one-line
    ValueError naming the file, the GPU and the column for any bad cell, a missing
    column, a repeated name, or an empty file.
    """
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise ValueError(f"path must name a GPU spec file (.csv, .toml or .json), got {path!r}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path={str(path)!r}: GPU spec file not found")
    try:
        records = _spec_records(path)
    except (OSError, UnicodeDecodeError, csv.Error, tomllib.TOMLDecodeError,
            json.JSONDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"GPU spec file {path} could not be read: {reason}") from None
    if not records:
        raise ValueError(f"GPU spec file {path} has no GPU rows")
    rows, seen = [], set()
    for i, record in enumerate(records, start=1):
        missing = [c for c in GPU_COLUMNS if c not in record and c != "fp8_dense_tflops"]
        if missing:
            raise ValueError(f"GPU spec file {path}, row {i}: missing the column "
                             f"{missing[0]!r} (columns: {', '.join(GPU_COLUMNS)})")
        name = record["gpu"]
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"GPU spec file {path}, row {i}: column 'gpu' must be a "
                             f"non-empty name without surrounding spaces, got {name!r}")
        if name.lower() in seen:
            raise ValueError(f"GPU spec file {path}: gpu {name!r} appears twice")
        seen.add(name.lower())
        where = f"GPU spec file {path}, gpu {name!r}"
        row = {k: v for k, v in record.items() if k not in GPU_COLUMNS}   # kept as given
        row["gpu"] = name
        for column in GPU_COLUMNS[1:5] + ("link_gb_per_s",):
            row[column] = _spec_number(where, column, record.get(column),
                                       optional=column == "fp8_dense_tflops")
        for column in ("interconnect", "source"):
            value = record[column]
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise ValueError(f"{where}: column {column!r} must be text, got {value!r}")
            if column == "source" and not value.strip():
                raise ValueError(f"{where}: column 'source' must say where the figures come "
                                 "from (a datasheet URL, a measurement), got an empty cell")
            row[column] = value
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame[list(GPU_COLUMNS) + [c for c in frame.columns if c not in GPU_COLUMNS]]


def gpu_table(extra: str | Path | None = None) -> pd.DataFrame:
    """The GPU spec table, one row per GPU, vendor units (:data:`GPU_COLUMNS`).

    The shipped ``data/gpus.csv``, plus the rows of a user's spec file ``extra`` (any
    file :func:`load_gpus` reads) when given: a row of ``extra`` whose name matches a
    shipped one (case-insensitive) replaces it.
    """
    shipped = load_gpus(data_dir() / "gpus.csv")
    if extra is None:
        return shipped
    with _check.naming("extra"):
        user = load_gpus(extra)
    keep = ~shipped["gpu"].str.lower().isin(user["gpu"].str.lower())
    return pd.concat([shipped[keep], user], ignore_index=True)


def gpu(name: str, extra: str | Path | None = None) -> GPU:
    """Look a GPU up by name (case-insensitive), e.g. ``"A100-80GB"`` or ``"H100-SXM"``,
    in :func:`gpu_table` (``extra``: a user's spec file whose rows are added, and replace
    shipped rows of the same name)."""
    if not isinstance(name, str):
        raise ValueError(f"gpu name must be a string, got {name!r}")
    table = gpu_table(extra)
    match = table[table.gpu.str.lower() == name.lower()]
    if match.empty:
        where = "data/gpus.csv" if extra is None else f"data/gpus.csv or extra={str(extra)!r}"
        hint = ("; describe a GPU of your own in a spec file passed as extra (see load_gpus)"
                if extra is None else "")
        raise ValueError(f"gpu name {name!r} is not in {where}; known: "
                         f"{', '.join(table.gpu)}{hint}")
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


MAX_BATCH = MAX_STEP_BATCH
"""Largest decode batch :meth:`Roofline.decode_s` evaluates (it builds one context length
per sequence); no engine batches anywhere near a million sequences."""


@dataclass(frozen=True)
class Roofline:
    """Fused roofline step time for a model on ``tp`` GPUs; a ``Replica(step_time=...)``
    model (one forward pass per step priced by op group, see the module docstring).

    Parameters
    ----------
    model : ModelSpec or str
        A :class:`ModelSpec` or anything :func:`model_config` reads.
    gpu : GPU or str
        A :class:`GPU` or a name in ``data/gpus.csv``.
    tp : int
        Tensor-parallel degree (GPUs per replica).
    flops_efficiency, bandwidth_efficiency : float in (0, 1]
        Achievable fraction of peak dense FLOP/s and of HBM bandwidth. Default: the
        measured :data:`FLOPS_EFFICIENCY` (0.62) and :data:`BANDWIDTH_EFFICIENCY` (0.55);
        1.0 and 1.0 give the pure roofline, a lower bound on the step time.
    overhead_s : float
        Fixed time added to every non-empty step (kernel launches, scheduling), seconds.
    fp8 : bool
        Weights and KV cache in fp8 (1 byte), GEMMs at the fp8 peak (H100, H200, L40S).
    """

    model: ModelSpec | str
    gpu: GPU | str
    tp: int = 1
    flops_efficiency: float = FLOPS_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
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

    def _arrays(self, detail: StepDetail):
        if not isinstance(detail, StepDetail):
            raise TypeError(f"detail must be a StepDetail (build one with roofline.step), "
                            f"got {detail!r}")
        return (np.asarray(detail.prefill_chunks, dtype=float),
                np.asarray(detail.prefill_cached, dtype=float),
                np.asarray(detail.decode_context, dtype=float))

    def _linear_work(self, tokens):
        """FLOPs and HBM bytes of the linear group at these total tokens (array-wise)."""
        t = np.asarray(tokens, dtype=float)
        per_layer = self.model.layers * self.model.params_per_layer
        return 2 * t * per_layer, np.where(t > 0, per_layer * self._bytes(), 0.0)

    def _group_work(self, n, k, ctx, lm_head: bool):
        """(tokens, FLOPs per group, HBM bytes per group) of one step, whole replica."""
        m, size = self.model, self._bytes()
        tokens = float(n.sum()) + ctx.size
        sequences = n.size + ctx.size
        kv = m.kv_bytes_per_token(size)
        pair_flops = 4 * m.layers * m.heads * m.head_dim
        decode_ctx = float(ctx.sum())
        head = m.lm_head_params if lm_head and sequences else 0
        linear_flops, linear_bytes = self._linear_work(tokens)
        flops = np.array([linear_flops, 2 * sequences * head,
                          pair_flops * float((n * (k + (n + 1) / 2)).sum()),
                          pair_flops * decode_ctx])
        hbm = np.array([linear_bytes, head * size, kv * float((k + n).sum()), kv * decode_ctx])
        return tokens, flops, hbm

    def _times(self, flops: np.ndarray, hbm: np.ndarray):
        compute = flops / (self.tp * self.flops_efficiency * self.peak_flops)
        memory = hbm / (self.tp * self.bandwidth_efficiency * self.gpu.hbm_bytes_per_s)
        return compute, memory

    def _allreduce_bytes(self, tokens: float) -> float:
        """Bytes each GPU sends per step: two ring all-reduces per layer of tokens x H."""
        ring = 2 * (self.tp - 1) / self.tp
        return 2 * self.model.layers * ring * tokens * self.model.hidden * self.model.dtype_bytes

    def _comm_s(self, tokens: float) -> float:
        return self._allreduce_bytes(tokens) / (self.gpu.link_bytes_per_s / 2)

    def work(self, detail: StepDetail, lm_head: bool = True) -> dict:
        """FLOPs and HBM bytes (whole replica) of one step, in total and per op group
        (``<group>_flops``, ``<group>_bytes`` for each of :data:`GROUPS`), and its
        all-reduce bytes per GPU (``lm_head=False`` leaves the LM head out, as per-layer
        profiles do)."""
        tokens, flops, hbm = self._group_work(*self._arrays(detail), lm_head)
        out = {"tokens": tokens, "flops": float(flops.sum()), "hbm_bytes": float(hbm.sum()),
               "allreduce_bytes": float(self._allreduce_bytes(tokens))}
        for name, f, b in zip(GROUPS, flops, hbm, strict=True):
            out[f"{name}_flops"], out[f"{name}_bytes"] = float(f), float(b)
        return out

    def breakdown(self, detail: StepDetail, lm_head: bool = True) -> dict:
        """The step's time per op group and which bound each hits, plus totals.

        Keys: everything :meth:`work` returns; ``<group>_s`` (seconds) and
        ``<group>_bound`` (``"compute"``, ``"memory"`` or ``"idle"`` for a group with no
        work) for each of :data:`GROUPS`; ``compute_s`` and ``memory_s``, the step's whole
        FLOPs and bytes at the achievable peak and bandwidth (what one unfused max would
        use); ``comm_s`` (all-reduce); ``step_s`` (the sum of the group times, the
        all-reduce and the overhead; 0 for an empty step); ``bound``, the bound of the
        group that takes longest; and ``intensity_flop_per_byte`` (0 for an empty step).
        """
        w = self.work(detail, lm_head)
        flops = np.array([w[f"{g}_flops"] for g in GROUPS])
        hbm = np.array([w[f"{g}_bytes"] for g in GROUPS])
        compute, memory = self._times(flops, hbm)
        out = dict(w)
        for name, c, b, f, h in zip(GROUPS, compute, memory, flops, hbm, strict=True):
            out[f"{name}_s"] = float(max(c, b))
            out[f"{name}_bound"] = ("idle" if f == 0 and h == 0
                                    else "compute" if c >= b else "memory")
        group_s = np.maximum(compute, memory)
        comm = self._comm_s(w["tokens"])
        empty = w["tokens"] == 0
        out.update({
            "compute_s": float(compute.sum()), "memory_s": float(memory.sum()), "comm_s": comm,
            "step_s": 0.0 if empty else float(group_s.sum()) + comm + self.overhead_s,
            "bound": out[f"{GROUPS[int(np.argmax(group_s))]}_bound"] if not empty else "idle",
            "intensity_flop_per_byte": w["flops"] / w["hbm_bytes"] if w["hbm_bytes"] else 0.0})
        return out

    def __call__(self, detail: StepDetail) -> float:
        tokens, flops, hbm = self._group_work(*self._arrays(detail), True)
        if tokens == 0:
            return 0.0
        compute, memory = self._times(flops, hbm)
        return float(np.maximum(compute, memory).sum()) + self._comm_s(tokens) + self.overhead_s

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
        """Arithmetic intensity (FLOP/byte) above which an op group is compute-bound."""
        return (self.flops_efficiency * self.peak_flops
                / (self.bandwidth_efficiency * self.gpu.hbm_bytes_per_s))

    @property
    def ridge_tokens(self) -> float:
        """Tokens per step at which the linear group turns compute-bound (tokens).

        Each weight read once per step does 2 FLOPs per token, so the linear group's
        intensity is ``2 * tokens / bytes_per_weight`` and the ridge is
        ``ridge_flop_per_byte * bytes_per_weight / 2`` -- independent of the model's size
        and of ``tp`` (both split evenly). Below it a step's extra tokens ride on the
        weight read almost free; above it each costs its FLOPs.
        """
        return self.ridge_flop_per_byte * self._bytes() / 2

    @_check.guarded
    def largest_chunk(self, budget_s: float, batch: int, context_tokens: float,
                      cached_tokens: int = 0) -> int:
        """Largest prefill chunk (tokens) a fused step with ``batch`` decoding sequences
        at ``context_tokens`` each can carry within ``budget_s`` seconds (e.g. the TPOT
        SLO), the chunk following ``cached_tokens`` already cached; 0 when the decodes
        alone exceed the budget (:func:`servingcap.serving.largest_chunk` on this
        roofline, at most :data:`MAX_BATCH` sequences)."""
        return largest_chunk(self, budget_s, batch, context_tokens, cached_tokens)

    def efficiency_source(self) -> str:
        """Where this roofline's efficiency factors come from, in words."""
        if (self.flops_efficiency, self.bandwidth_efficiency) == (1.0, 1.0):
            return "pure roofline (efficiency 1.0: a lower bound on the step time)"
        if (self.flops_efficiency, self.bandwidth_efficiency) == (FLOPS_EFFICIENCY,
                                                                  BANDWIDTH_EFFICIENCY):
            return ("measured: fit to Vidur's Llama-2-7B A100-80GB linear-op profile "
                    "(data/gpus_measured.csv)")
        return "given by the caller"

    def describe(self) -> str:
        """One line naming the cost model's source and its assumptions."""
        return (f"roofline, one fused pass per step priced by op group: {self.model.name} on "
                f"{self.tp} x {self.gpu.name} ({'fp8' if self.fp8 else 'bf16/fp16'}), efficiency "
                f"{self.flops_efficiency:.2f} of peak FLOP/s and {self.bandwidth_efficiency:.2f} "
                f"of HBM bandwidth ({self.efficiency_source()}), compute ridge "
                f"{self.ridge_tokens:.0f} tokens/step, overhead {self.overhead_s * 1e3:.2f} ms/step")


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
    """Efficiency factors that make the roofline's GEMMs reproduce measured linear-op times.

    Parameters
    ----------
    tokens : sequence of int
        Tokens in each measured step.
    seconds : sequence of float
        Measured time of that step's linear operations (s): the projections and MLP of
        every layer, as Vidur's per-layer profiles give them (attention not included).
    lm_head : bool
        Whether the measured times include the LM head, one sequence per step (Vidur's
        per-layer profiles do not).

    Returns ``(flops_efficiency, bandwidth_efficiency)`` minimizing the squared log error
    of the linear group (plus the LM head group if ``lm_head``), each group
    ``max(FLOPs / (e_f peak), bytes / (e_b bandwidth))``, each factor capped at 1.
    """
    t = _check.array("tokens", tokens, nonnegative_values=True)
    s = _check.array("seconds", seconds)
    if t.shape != s.shape or t.size < 2:
        raise ValueError(f"tokens and seconds must be equal-length sequences of >= 2, got {t.size}, {s.size}")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"seconds must be finite and > 0, got {s.tolist()!r}")
    with _check.naming("gpu_name"):
        base = Roofline(model, gpu_name, tp=tp, flops_efficiency=1.0, bandwidth_efficiency=1.0)
    groups = GROUPS[:2] if lm_head else GROUPS[:1]
    parts = [base.breakdown(step(prefill=[x]), lm_head=lm_head) for x in t]
    times = [base._times(np.array([p[f"{g}_flops"] for g in groups]),
                         np.array([p[f"{g}_bytes"] for g in groups])) for p in parts]
    compute = np.array([c for c, _ in times])           # points x groups
    memory = np.array([m for _, m in times])

    def loss(log_eff):
        e_f, e_b = np.exp(np.minimum(log_eff, 0.0))
        model_s = np.maximum(compute / e_f, memory / e_b).sum(axis=1)
        return float(np.sum(np.log(model_s / s) ** 2))

    start = np.log([min(1.0, float(np.median(compute.sum(axis=1) / s))),
                    min(1.0, float(np.median(memory.sum(axis=1) / s)))])
    best = optimize.minimize(loss, start, method="Nelder-Mead",
                             options={"xatol": 1e-6, "fatol": 1e-12, "maxiter": 2000})
    e_f, e_b = np.exp(np.minimum(best.x, 0.0))
    if not (math.isfinite(e_f) and math.isfinite(e_b)):
        raise ValueError("fit_efficiency did not converge on these measurements")
    return float(e_f), float(e_b)


TOKEN_RANGES = ((1, 64), (65, 512), (513, 4096))
"""Token ranges :func:`linear_op_check` reports separately (tokens per step): deep in the
memory-bound region, around the compute ridge, and compute-bound."""


def linear_op_check(fitted: bool = False) -> pd.DataFrame:
    """The linear group of the fused roofline against Vidur's measured linear-op times.

    For each measured (model, GPU) in ``data/gpus_measured.csv`` (Vidur's per-layer
    profiles x 32 layers, TP 1, no LM head) and each of :data:`TOKEN_RANGES`: the
    number of measured token counts, the median and worst relative error
    ``|roofline / measured - 1|``, the median signed error (> 0: the roofline is slower),
    and the compute ridge (tokens per step) the efficiencies imply.

    Parameters
    ----------
    fitted : bool
        False (default): the default efficiencies :data:`FLOPS_EFFICIENCY`,
        :data:`BANDWIDTH_EFFICIENCY` (fit on Llama-2-7B / A100-80GB) for every GPU;
        True: efficiencies fit by :func:`fit_efficiency` to each (model, GPU) profile.
    """
    if not isinstance(fitted, (bool, np.bool_)):
        raise ValueError(f"fitted must be True or False, got {fitted!r}")
    vidur = measured_steps().query("source == 'vidur' and phase == 'linear_ops'")
    rows = []
    for (model, gpu_name), g in vidur.groupby(["model", "gpu"], sort=True):
        measured = g.measured_ms.to_numpy() / 1e3
        effs = (fit_efficiency(model, gpu_name, g.tokens, measured, lm_head=False) if fitted
                else (FLOPS_EFFICIENCY, BANDWIDTH_EFFICIENCY))
        roof = Roofline(model, gpu_name, flops_efficiency=effs[0], bandwidth_efficiency=effs[1])
        predicted = np.maximum(*roof._times(*roof._linear_work(g.tokens.to_numpy())))
        err = predicted / measured - 1
        for lo, hi in TOKEN_RANGES:
            inside = (g.tokens.to_numpy() >= lo) & (g.tokens.to_numpy() <= hi)
            e = err[inside]
            rows.append({"gpu": gpu_name, "model": model,
                         "measured_model": g.measured_model.iloc[0],
                         "tokens": f"{lo}-{hi}", "points": int(inside.sum()),
                         "median_abs_error": float(np.median(np.abs(e))),
                         "worst_abs_error": float(np.abs(e).max()),
                         "median_signed_error": float(np.median(e)),
                         "flops_efficiency": float(effs[0]),
                         "bandwidth_efficiency": float(effs[1]),
                         "ridge_tokens": float(roof.ridge_tokens)})
    return pd.DataFrame(rows)
