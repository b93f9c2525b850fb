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
* **Mixture of experts** (Mixtral, Qwen-MoE; :class:`ModelSpec`): the linear group's
  FLOPs use the *active* weights (attention, router, shared expert and the top-``k``
  experts of each token), its bytes the weights the step *touches*: the dense part
  and, per layer, ``E (1 - (1 - k/E) ** T)`` of the ``E`` experts for ``T`` tokens
  (:func:`expected_experts`, uniform routing). A decode step of batch 1 reads ``k``
  experts per layer, a large batch all ``E``: the memory-bound floor rises with the
  batch until every expert is read, while memory (:mod:`servingcap.memory`) holds all
  of them. Experts are sharded over ``tp`` like the dense weights (no expert
  parallelism).
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
           "model_config", "read_config", "expected_experts",
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
    """The shape of a decoder-only transformer, as a roofline needs it: dense, or a
    mixture of experts (``experts > 0``).

    A mixture-of-experts layer replaces the MLP by ``experts`` routed expert MLPs (each
    ``expert_intermediate`` wide) of which each token uses ``experts_per_token`` (top-k),
    a router (``hidden x experts``) and, Qwen-MoE style, a shared expert every token uses
    (``shared_intermediate`` wide, 0 for none; its one-output gate is counted too).
    Every layer is a mixture-of-experts layer (:func:`model_config` refuses other
    layouts). Parameter counts leave out norms and biases.
    """

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
    tied_embeddings: bool = False
    """Whether the input embedding shares the LM head's weights (``tie_word_embeddings``):
    if not, the embedding table is stored too (:mod:`servingcap.memory`)."""
    experts: int = 0
    """Routed experts per layer (0: a dense model)."""
    experts_per_token: int = 0
    """Experts each token is routed to (top-k)."""
    expert_intermediate: int = 0
    """MLP width of one routed expert."""
    shared_intermediate: int = 0
    """MLP width of the always-active shared expert (0: none)."""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def _mlp(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert's MLP (0 for a dense model)."""
        return self._mlp(self.expert_intermediate) if self.is_moe else 0

    @property
    def dense_params_per_layer(self) -> int:
        """Weights of one layer that every token uses: Q, K, V, O projections and the MLP
        (dense), or the router and the shared expert (mixture of experts)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if not self.is_moe:
            return attn + self._mlp(self.intermediate)
        shared = self._mlp(self.shared_intermediate) + self.hidden if self.shared_intermediate else 0
        return attn + self.hidden * self.experts + shared

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer's GEMMs, every expert included (what memory holds)."""
        return self.dense_params_per_layer + self.experts * self.expert_params

    @property
    def active_params_per_layer(self) -> int:
        """Weights of one layer one token multiplies by (top-k experts only): its FLOPs
        are twice this."""
        return self.dense_params_per_layer + self.experts_per_token * self.expert_params

    @property
    def lm_head_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def _embedding_params(self) -> int:
        return 0 if self.tied_embeddings else self.hidden * self.vocab

    @property
    def total_params(self) -> int:
        """Every weight the model stores: all layers (all experts), the LM head and the
        input embedding unless tied (the "46.7 B" of Mixtral-8x7B)."""
        return self.layers * self.params_per_layer + self.lm_head_params + self._embedding_params

    @property
    def active_params(self) -> int:
        """Weights one token uses, counted as model cards count "active" parameters:
        all layers with top-k experts, the LM head and the embedding unless tied (the
        "12.9 B" of Mixtral-8x7B). Equals :attr:`total_params` for a dense model."""
        return (self.layers * self.active_params_per_layer + self.lm_head_params
                + self._embedding_params)

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights a step reads when it touches every expert: every layer's
        GEMMs plus the LM head (a dense model reads this every step)."""
        return float((self.layers * self.params_per_layer + self.lm_head_params) * self.dtype_bytes)

    def experts_touched(self, tokens):
        """Expected distinct routed experts per layer a step of ``tokens`` tokens reads
        (:func:`expected_experts`; 0 for a dense model). Array-wise."""
        if not self.is_moe:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        return _expected_experts(self.experts, self.experts_per_token, tokens)

    def linear_params_read(self, tokens):
        """Weights of the layers' GEMMs a step of ``tokens`` tokens reads from HBM: the
        dense part of every layer and the experts its tokens touch (0 for an empty
        step). Array-wise."""
        t = np.asarray(tokens, dtype=float)
        per_layer = self.dense_params_per_layer + self.experts_touched(t) * self.expert_params
        return np.where(t > 0, self.layers * per_layer, 0.0)

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> float:
        """KV-cache bytes one context token holds across all layers (K and V)."""
        size = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return float(2 * self.layers * self.kv_heads * self.head_dim * size)


def _expected_experts(experts: int, per_token: int, tokens):
    t = np.asarray(tokens, dtype=float)
    return experts * -np.expm1(t * np.log1p(-per_token / experts)) if per_token < experts \
        else np.where(t > 0, float(experts), 0.0)


def expected_experts(experts: int, experts_per_token: int, tokens):
    """Expected number of distinct experts (of ``experts`` per layer) that ``tokens``
    tokens, each routed to ``experts_per_token`` of them, touch:

        E * (1 - (1 - k / E) ** T)

    Under **uniform, independent routing** (each token picks k distinct experts uniformly
    at random, independently of the other tokens) an expert is missed by one token with
    probability ``1 - k/E``, by all ``T`` with ``(1 - k/E) ** T``. ``T = 1`` gives ``k``;
    it approaches ``E`` as ``T`` grows (Mixtral's 8 experts, top-2: 3.5 at 2 tokens, 7.2
    at 8, 7.999 at 32). This is the occupancy expectation of balls in bins, from
    first principles. Routing that is skewed but independent across tokens touches
    *fewer* distinct experts in expectation (``1 - (1 - p) ** T`` is concave in an
    expert's share ``p``, so equal shares maximize the sum): for such routers the
    formula overstates the weight bytes a step reads. Why only touched experts cost
    bytes: a fused MoE kernel sorts the step's tokens by expert and runs one GEMM tile
    per (expert, block of its tokens), so an expert no token chose is never loaded
    (vLLM, ``vllm/model_executor/layers/fused_moe/fused_moe.py`` and
    ``moe_align_block_size.py``; SGLang's ``fused_moe_triton`` is adapted from it).

    Parameters
    ----------
    experts : int
        Routed experts per layer, E >= 1.
    experts_per_token : int
        Experts per token, 1 <= k <= E.
    tokens : int, float or array
        Tokens in the step, >= 0 (array-wise).

    Returns a float, or an array shaped like ``tokens``.
    """
    e = _check.whole("experts", experts)
    k = _check.whole("experts_per_token", experts_per_token)
    if k > e:
        raise ValueError(f"experts_per_token must be <= experts={e}, got {experts_per_token!r}")
    with _check.naming("tokens"):
        t = np.asarray(tokens, dtype=float)
    if not (np.isfinite(t).all() and (t >= 0).all()):
        raise ValueError(f"tokens must be finite and >= 0, got {tokens!r}")
    out = _expected_experts(e, k, t)
    return float(out) if np.ndim(out) == 0 else out


def model_names() -> list[str]:
    """Names of the model configs shipped in ``data/model_configs/``."""
    return sorted(p.stem for p in (data_dir() / "model_configs").glob("*.json"))


def _field(config: Mapping, name: str):
    for key in _FIELDS[name]:
        if key in config and config[key] is not None:
            return config[key]
    aliases = " or ".join(repr(k) for k in _FIELDS[name])
    raise ValueError(f"model config (source) is missing the field {aliases}")


def read_config(source, name: str | None = None, param: str = "source") -> tuple[dict, str]:
    """(config dict, label) of a model: the one place a model's ``config.json`` is found
    and read (:func:`model_config`, :func:`servingcap.memory.memory_plan` and
    :func:`servingcap.configsearch.load_model` all come here).

    ``source`` is a shipped name (:func:`model_names`), a path to a ``config.json`` or the
    parsed mapping; the label is ``name``, else the mapping's ``_name_or_path`` or the
    file's stem (its folder's name for a file called ``config.json``). Every error is one
    line naming ``param``, the caller's name for ``source``.
    """
    if not isinstance(param, str) or not param:
        raise ValueError(f"param must be a parameter name, got {param!r}")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be a string or None, got {name!r}")
    if isinstance(source, Mapping):
        return dict(source), name or str(source.get("_name_or_path", "model"))
    if not isinstance(source, (str, Path)):
        raise ValueError(f"{param} must be a shipped model name, a path to a config.json or "
                         f"a mapping, got {source!r}")
    path = Path(source)
    if str(source) in model_names():
        path = data_dir() / "model_configs" / f"{source}.json"
    if not path.is_file():
        raise ValueError(f"{param}={str(source)!r} is neither a shipped model config "
                         f"({', '.join(model_names())}) nor a file")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"{param}={str(source)!r} is not a readable JSON config.json "
                         f"({reason})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{param}={str(source)!r} must hold a JSON object")
    label = path.stem if path.stem != "config" else path.parent.name or "model"
    return config, name or label


def model_config(source: str | Path | Mapping, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face style ``config.json``.

    Parameters
    ----------
    source : str, Path or mapping
        A shipped name (see :func:`model_names`, e.g. ``"Llama-2-7b-hf"``), a path to a
        ``config.json``, or the parsed dict (:func:`read_config`).
    name : str, optional
        Label for the model (default: the file's stem or ``_name_or_path``).

    Required fields: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``intermediate_size`` (or OPT's ``ffn_dim``), ``vocab_size``, ``torch_dtype`` (or
    ``dtype``). ``num_key_value_heads`` defaults to the head count (no grouped-query
    attention), ``head_dim`` to hidden / heads; the MLP is gated (three matrices, as in
    Llama) unless ``model_type`` is a two-matrix family such as ``opt``;
    ``tie_word_embeddings`` defaults to True (Hugging Face's default).
    """
    config, label = read_config(source, name)
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
                     gated_mlp=config.get("model_type") not in _NOT_GATED,
                     tied_embeddings=bool(config.get("tie_word_embeddings", True)),
                     **_moe_fields(config, ints["intermediate_size"]))


_DENSE_VALUES = (None, 0, 1, False)
# Mixture-of-experts layouts not modelled: field -> why (the first one present is named).
_MOE_REFUSED = {
    "n_routed_experts": "DeepSeek-style (multi-head latent attention, first_k_dense_replace "
                        "dense layers, grouped routing)",
    "moe_num_experts": "this layout (moe_num_experts)",
}


def _moe_fields(config: Mapping, intermediate: int) -> dict:
    """The mixture-of-experts fields of a ``config.json`` (empty for a dense model).

    Mixtral (``num_local_experts``; each expert ``intermediate_size`` wide) and Qwen-MoE
    (``qwen2_moe``, ``qwen3_moe``: ``num_experts``, ``moe_intermediate_size``, optional
    ``shared_expert_intermediate_size``; every layer sparse) are read, both with
    ``num_experts_per_tok``; any other layout is refused naming its field.
    """
    for key, what in _MOE_REFUSED.items():
        if config.get(key) not in _DENSE_VALUES:
            raise ValueError(f"model config field {key}={config[key]!r}: {what} "
                             "mixture-of-experts models are not modelled (supported: Mixtral's "
                             "num_local_experts, Qwen-MoE's num_experts with "
                             "moe_intermediate_size)")
    mixtral, qwen = config.get("num_local_experts"), config.get("num_experts")
    if mixtral in _DENSE_VALUES and qwen in _DENSE_VALUES:
        return {}
    if mixtral not in _DENSE_VALUES and qwen not in _DENSE_VALUES:
        raise ValueError(f"model config has both num_local_experts={mixtral!r} and "
                         f"num_experts={qwen!r}; give one")
    key = "num_local_experts" if mixtral not in _DENSE_VALUES else "num_experts"
    experts = _check.whole(key, config[key])
    if config.get("num_experts_per_tok") is None:
        raise ValueError(f"model config field {key}={experts} makes a mixture of experts, "
                         "but the field 'num_experts_per_tok' (top-k) is missing")
    top_k = _check.whole("num_experts_per_tok", config["num_experts_per_tok"])
    if top_k > experts:
        raise ValueError(f"model config field num_experts_per_tok={top_k} exceeds "
                         f"{key}={experts}")
    if key == "num_local_experts":
        return {"experts": experts, "experts_per_token": top_k,
                "expert_intermediate": intermediate}
    if config.get("moe_intermediate_size") is None:
        raise ValueError(f"model config field num_experts={experts} needs the field "
                         "'moe_intermediate_size' (Qwen-MoE's expert width)")
    step = config.get("decoder_sparse_step", 1)
    if step not in (None, 1):
        raise ValueError(f"model config field decoder_sparse_step={step!r}: only every "
                         "layer a mixture of experts (1) is modelled")
    if config.get("mlp_only_layers"):
        raise ValueError(f"model config field mlp_only_layers={config['mlp_only_layers']!r}: "
                         "dense layers among mixture-of-experts layers are not modelled")
    shared = config.get("shared_expert_intermediate_size") or 0
    return {"experts": experts, "experts_per_token": top_k,
            "expert_intermediate": _check.whole("moe_intermediate_size",
                                                config["moe_intermediate_size"]),
            "shared_intermediate": _check.whole("shared_expert_intermediate_size", shared,
                                                minimum=0)}


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
        """FLOPs and HBM bytes of the linear group at these total tokens (array-wise): each
        token multiplies by the active weights, the step reads the dense weights and, of
        a mixture of experts, the experts its tokens touch (:func:`expected_experts`)."""
        t = np.asarray(tokens, dtype=float)
        m = self.model
        return (2 * t * m.layers * m.active_params_per_layer,
                m.linear_params_read(t) * self._bytes())

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

        Dense model: each weight read once per step does 2 FLOPs per token, so the
        linear group's intensity is ``2 * tokens / bytes_per_weight`` and the ridge is
        ``ridge_flop_per_byte * bytes_per_weight / 2`` -- independent of the model's size
        and of ``tp`` (both split evenly). Below it a step's extra tokens ride on the
        weight read almost free; above it each costs its FLOPs. Mixture of experts: the
        tokens at which the active weights' FLOPs take as long as reading the weights
        those tokens touch (found by root finding; higher than the dense ridge by up to
        total / active weights, because a large step reads every expert but each token
        multiplies by only its top-k).
        """
        dense = self.ridge_flop_per_byte * self._bytes() / 2
        if not self.model.is_moe:
            return dense

        def gap(t: float) -> float:
            compute, memory = self._times(*self._linear_work(t))
            return float(compute - memory)

        hi = dense * self.model.params_per_layer / self.model.active_params_per_layer + 1
        return float(optimize.brentq(gap, 1e-9, hi, xtol=1e-6))

    @_check.guarded
    def weight_read_bytes(self, tokens: float) -> float:
        """HBM bytes of weights a step of ``tokens`` tokens reads (whole replica): every
        layer's dense weights, the routed experts its tokens touch in expectation
        (:func:`expected_experts`; all of a dense model's MLP) and the LM head.
        Grows with ``tokens`` for a mixture of experts, constant for a dense model;
        0 for ``tokens == 0``."""
        t = _check.nonnegative("tokens", tokens)
        if t == 0:
            return 0.0
        return float((self.model.linear_params_read(t) + self.model.lm_head_params)
                     * self._bytes())

    @_check.guarded
    def weight_read_s(self, tokens: float) -> float:
        """Time to read :meth:`weight_read_bytes` at the achievable HBM bandwidth of the
        ``tp`` GPUs (s): the memory-bound floor of a step of ``tokens`` tokens."""
        return self.weight_read_bytes(tokens) / (
            self.tp * self.bandwidth_efficiency * self.gpu.hbm_bytes_per_s)

    @_check.guarded
    def largest_chunk(self, budget_s: float, batch: int, context_tokens: float,
                      cached_tokens: int = 0) -> int:
        """Largest prefill chunk (tokens) a fused step with ``batch`` decoding sequences
        at ``context_tokens`` each can carry within ``budget_s`` seconds (e.g. the TPOT
        SLO), the chunk following ``cached_tokens`` already cached; 0 when the decodes
        alone exceed the budget (:func:`servingcap.serving.largest_chunk` on this
        roofline, at most :data:`MAX_BATCH` sequences)."""
        return largest_chunk(self, budget_s, batch, context_tokens, cached_tokens)

    def fluid_work_s(self, prompt_tokens, output_tokens, max_batch: int,
                     uncached_tokens=None) -> float:
        """A lower bound on the replica time per request (s) when the replica is never
        idle, whatever the scheduler (mixed chunks, combined, prefill first): the work
        behind :func:`servingcap.planning.fluid_rate`'s upper bound on throughput.

        Parameters
        ----------
        prompt_tokens, output_tokens : array-like
            Each request's prompt and output lengths (tokens).
        max_batch : int
            Most sequences decoding in one step (the replica's batch slots).
        uncached_tokens : array-like, optional
            Prompt tokens each request must prefill at the least (default: all of them).

        A step costs ``sum over groups of max(compute_g, memory_g)`` plus the all-reduce
        and the overhead, and ``sum_steps max(c, m) >= max(sum c, sum m)`` for each group,
        so over any schedule of the requests' steps (``D = N - 1`` decode tokens each,
        ``P`` prompt, ``U`` of it uncached, ``B = max_batch``):

        * linear: compute of ``U + D`` tokens at the active weights; memory at least
          ``D / B`` reads of a full decode batch's weights -- a step carries at most
          ``B`` decodes, and the weights a step touches are a concave function of its
          tokens (:func:`expected_experts`; constant for a dense model), so ``d``
          decodes cost at least ``d / B`` of ``B``'s read;
        * LM head: ``D`` sampled tokens' FLOPs; at least ``D / B`` reads of its weights;
        * prefill attention: the causal pairs of the uncached tokens (chunking does not
          change their sum); the ``P`` context tokens' KV at least once;
        * decode attention: the ``j``-th decode reads at least ``P + j - 1`` tokens;
        * all-reduce: ``U + D`` tokens; overhead: at least ``D / B`` steps.

        Means over the requests are taken of each group's FLOPs and bytes (a bound for a
        mix of lengths too: ``sum max >= max of sums``). The earlier estimate -- a
        prefill-only step of the mean prompt plus ``D / B`` full decode steps -- charged
        a prompt its own weight read and step, which a fused step shares with the
        decodes it rides on: it was not a bound (a simulated Llama-3.1-8B H100 replica,
        mixed mode, 512-token budget, 2,000 / 300 tokens, carried 7.0 req/s against its
        5.9 req/s).
        """
        b = _check.whole("max_batch", max_batch)
        with _check.naming("prompt_tokens"):
            p = np.asarray(prompt_tokens, dtype=float).ravel()
        with _check.naming("output_tokens"):
            n = np.asarray(output_tokens, dtype=float).ravel()
        with _check.naming("uncached_tokens"):
            u = p if uncached_tokens is None else np.asarray(uncached_tokens, dtype=float).ravel()
        if not (p.size and p.shape == n.shape == u.shape):
            raise ValueError(f"prompt_tokens, output_tokens and uncached_tokens must be "
                             f"non-empty and of one length, got {p.size}, {n.size}, {u.size}")
        for label, arr in (("prompt_tokens", p), ("output_tokens", n), ("uncached_tokens", u)):
            if not (np.isfinite(arr).all() and (arr >= 0).all()
                    and (arr <= _check.MAX_TOKENS).all()):
                raise ValueError(f"{label} must be token counts in [0, "
                                 f"{_check.MAX_TOKENS:.0e}]")
        if (u > p).any():
            raise ValueError("uncached_tokens must not exceed prompt_tokens")
        m, size = self.model, self._bytes()
        d = np.maximum(n - 1.0, 0.0)
        steps = float(d.mean()) / b                 # steps with decodes, at the least
        tokens = float((u + d).mean())
        kv = m.kv_bytes_per_token(size)
        pair_flops = 4 * m.layers * m.heads * m.head_dim
        pairs = float((u * (p - u) + u * (u + 1) / 2).mean())
        decode_ctx = float((d * p + d * (d - 1) / 2).mean())
        flops = np.array([2 * tokens * m.layers * m.active_params_per_layer,
                          2 * float(d.mean()) * m.lm_head_params,
                          pair_flops * pairs, pair_flops * decode_ctx])
        hbm = np.array([steps * float(m.linear_params_read(b)) * size,
                        steps * m.lm_head_params * size,
                        kv * float(np.where(u > 0, p, 0.0).mean()), kv * decode_ctx])
        compute, memory = self._times(flops, hbm)
        return (float(np.maximum(compute, memory).sum()) + self._comm_s(tokens)
                + self.overhead_s * steps)

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
        m = self.model
        moe = (f" (mixture of experts: {m.experts} experts, top-{m.experts_per_token}, "
               f"{m.total_params / 1e9:.1f} B total / {m.active_params / 1e9:.1f} B active "
               "parameters, uniform routing)" if m.is_moe else "")
        return (f"roofline, one fused pass per step priced by op group: {m.name}{moe} on "
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
