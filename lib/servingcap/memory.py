"""GPU memory of one replica: do the weights fit, and how many KV-cache tokens are left.

Source of the accounting: vLLM's startup memory profile (``vllm/worker/worker.py``
``determine_num_available_blocks``, and its V1 successor), which logs

    total_gpu_memory x gpu_memory_utilization = what the instance may use
    - model weights - non-torch memory - PyTorch activation peak = KV-cache memory

and divides the KV-cache memory into blocks of ``block_size`` (16) tokens. Here:

* **GPU memory**: the spec sheet's figure in ``data/gpus.csv`` or a user's GPU file
  (:func:`servingcap.roofline.gpu`, :func:`servingcap.roofline.load_gpus`),
  read as GiB: HBM comes in binary sizes (an "80 GB" H100 reports 79.22 GiB in vLLM's
  log, an "80 GB" A100 81,920 MiB in ``nvidia-smi``).
* **Weights** from the model's ``config.json`` (:func:`servingcap.roofline.model_config`):
  every layer's GEMMs and the LM head (:attr:`~servingcap.roofline.ModelSpec.weight_bytes`)
  plus the input embedding table (stored, though a step does not read it all) unless
  the config ties it to the LM head (``tie_word_embeddings``):
  :attr:`~servingcap.roofline.ModelSpec.total_params`. A mixture-of-experts model holds
  **every** expert (Mixtral-8x7B: 46.7 B parameters, 87 GiB in bf16), though a token
  uses only its top-k (12.9 B active): memory is priced by the total, the step's FLOPs
  by the active parameters (:mod:`servingcap.roofline`). Split evenly over ``tp`` GPUs
  (each expert sharded, as vLLM's fused MoE layer does without expert parallelism).
  Norms and biases are ignored (under 0.01 % of Llama-3.1-8B).
* **Runtime reserve** per GPU, :data:`RUNTIME_RESERVE_GIB` = 3.05 GiB: vLLM's measured
  non-torch memory (1.79 GiB: CUDA context, NCCL, CUDA graphs) plus PyTorch activation
  peak (1.26 GiB) for Llama-3-8B on one H100 with the default token budget, as logged in
  vLLM pull request #10511 ("overhaul memory profiling"). Activations grow with
  ``--max-num-batched-tokens`` and NCCL buffers with ``tp`` (3.58 GiB non-torch at tp=2
  in the same log): pass ``reserve_gib`` for your engine's logged figure.
* **KV per token**: :meth:`~servingcap.roofline.ModelSpec.kv_bytes_per_token` (K and V,
  every layer); with ``tp`` GPUs each holds ``ceil(kv_heads / tp)`` heads (vLLM
  replicates KV heads when ``tp`` exceeds them).
* **fp8** halves both: 1-byte weights (fp8 quantization) and a 1-byte KV cache
  (``--kv-cache-dtype fp8``).

Check against the log above (Llama-3-8B, one H100, utilization 0.90): vLLM left
53.29 GiB for the KV cache; this model leaves 53.99 GiB (+1.3 %: vLLM's 79.22 GiB total
vs the spec sheet's 80). The subtraction itself is :func:`servingcap.kvcache.kv_budget_tokens`
(the KV-cache chapter's budget), per GPU. Units: bytes and GiB (2**30 bytes), tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import _check
from .kvcache import kv_budget_tokens
from .roofline import GPU, ModelSpec, model_config
from .roofline import gpu as _gpu

__all__ = ["MemoryPlan", "memory_plan", "DEFAULT_GPU_MEMORY_UTILIZATION",
           "RUNTIME_RESERVE_GIB", "GIB"]

GIB = 2 ** 30
"""Bytes in a GiB."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``--gpu-memory-utilization``: the fraction of a GPU's memory it may use."""

RUNTIME_RESERVE_GIB = 1.79 + 1.26
"""Per-GPU memory neither weights nor KV (GiB): vLLM's logged non-torch memory plus
activation peak for Llama-3-8B on one H100 (vLLM pull request #10511)."""


def _context(value) -> float:
    context = _check.positive("mean_context_tokens", value)
    if context < 1:
        raise ValueError(f"mean_context_tokens must be >= 1 token, got {value!r}")
    return context


@dataclass(frozen=True)
class MemoryPlan:
    """One replica's memory: ``tp`` GPUs holding the weights, a reserve and the KV cache.

    Byte fields are per replica (all ``tp`` GPUs) unless named ``per_gpu``.
    """

    model: str
    gpu: str
    tp: int
    gpu_memory_utilization: float
    usable_bytes_per_gpu: float
    weight_bytes: float
    reserve_bytes_per_gpu: float
    kv_bytes: float
    kv_bytes_per_token: float
    kv_capacity_tokens: int
    block_tokens: int
    fp8: bool = False

    def max_batch(self, mean_context_tokens: float) -> int:
        """Most sequences whose KV fits at once when each holds ``mean_context_tokens``
        tokens (prompt plus tokens generated so far)."""
        return int(self.kv_capacity_tokens // _context(mean_context_tokens))

    def check_batch(self, slots: int, mean_context_tokens: float) -> None:
        """Raise ValueError (one line, with the numbers) if ``slots`` sequences of
        ``mean_context_tokens`` tokens each do not fit in the KV cache."""
        slots = _check.whole("slots", slots)
        context = _context(mean_context_tokens)
        need = slots * context * self.kv_bytes_per_token
        if need > self.kv_bytes:
            raise ValueError(
                f"slots={slots} at mean_context_tokens={context:.6g} need "
                f"{need / GIB:.1f} GiB of KV cache; {self.describe_gpus()} leaves "
                f"{self.kv_bytes / GIB:.1f} GiB ({self.kv_capacity_tokens:,} tokens): at "
                f"most {self.max_batch(context)} such sequences fit")

    def describe_gpus(self) -> str:
        return f"{self.tp} x {self.gpu} at gpu_memory_utilization {self.gpu_memory_utilization:g}"

    def describe(self) -> str:
        """One line: where the memory goes and the KV capacity."""
        dtype = " (fp8)" if self.fp8 else ""
        return (f"{self.describe_gpus()} = {self.tp * self.usable_bytes_per_gpu / GIB:.1f} "
                f"GiB: weights{dtype} {self.weight_bytes / GIB:.1f} GiB, runtime reserve "
                f"{self.tp * self.reserve_bytes_per_gpu / GIB:.2f} GiB, KV cache{dtype} "
                f"{self.kv_bytes / GIB:.1f} GiB = {self.kv_capacity_tokens:,} tokens "
                f"({self.kv_bytes_per_token / 1024:g} KiB per token)")


def memory_plan(model, gpu, *, tp: int = 1,
                gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                fp8: bool = False, reserve_gib: float = RUNTIME_RESERVE_GIB,
                block_tokens: int = 16) -> MemoryPlan:
    """How much KV cache a replica of ``model`` on ``tp`` x ``gpu`` holds.

    Parameters
    ----------
    model : ModelSpec, str, Path or mapping
        Anything :func:`servingcap.roofline.model_config` reads (a shipped name such as
        ``"Llama-3.1-8B"``, a ``config.json`` path or its dict).
    gpu : GPU or str
        A :class:`~servingcap.roofline.GPU` or a name in ``data/gpus.csv``; a GPU of your
        own is ``roofline.gpu(name, extra="my_gpus.csv")`` (see
        :func:`servingcap.roofline.load_gpus`), its ``memory_gb`` is what fits.
    tp : int
        Tensor-parallel degree (GPUs per replica).
    gpu_memory_utilization : float in (0, 1]
        Fraction of each GPU's memory the engine may use (vLLM's flag; default 0.9).
    fp8 : bool
        1-byte weights and KV cache instead of the config's dtype.
    reserve_gib : float
        Per-GPU memory for the CUDA context, NCCL, CUDA graphs and activations, GiB
        (default :data:`RUNTIME_RESERVE_GIB`, measured by vLLM; see the module docstring).
    block_tokens : int
        KV block size, tokens (vLLM's default 16); the capacity is whole blocks.

    Returns a :class:`MemoryPlan`. Raises ValueError naming what does not fit when the
    weights and reserve leave no KV cache.
    """
    tp = _check.whole("tp", tp)
    util = _check.positive("gpu_memory_utilization", gpu_memory_utilization)
    if util > 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if not isinstance(fp8, bool):
        raise ValueError(f"fp8 must be True or False, got {fp8!r}")
    reserve = _check.nonnegative("reserve_gib", reserve_gib) * GIB
    block_tokens = _check.whole("block_tokens", block_tokens)
    spec = model if isinstance(model, ModelSpec) else model_config(model)
    card = gpu if isinstance(gpu, GPU) else _gpu(gpu)
    dtype = 1 if fp8 else spec.dtype_bytes
    weights = float(spec.total_params * dtype)      # every expert of a mixture of experts
    usable = util * card.memory_bytes / 1e9 * GIB        # spec-sheet GB are GiB of HBM
    per_gpu_kv = usable - weights / tp - reserve
    if per_gpu_kv <= 0:
        raise ValueError(
            f"{spec.name} weights need {weights / GIB:.1f} GiB ({weights / tp / GIB:.1f} GiB "
            f"per GPU at tp={tp}) plus a runtime reserve of reserve_gib {reserve / GIB:.2f} GiB "
            f"per GPU; {tp} x {card.name} at gpu_memory_utilization {util:g} gives "
            f"{usable / GIB:.1f} GiB per GPU (raise tp, use a larger GPU or fp8)")
    heads_per_gpu = math.ceil(spec.kv_heads / tp)
    per_gpu_token = 2 * spec.layers * heads_per_gpu * spec.head_dim * dtype
    tokens = kv_budget_tokens(usable, per_gpu_token, weights / tp, reserve)
    tokens = tokens // block_tokens * block_tokens
    if tokens < block_tokens:
        raise ValueError(
            f"{spec.name} on {tp} x {card.name} (tp={tp}) at gpu_memory_utilization {util:g} "
            f"with reserve_gib {reserve / GIB:.2f} leaves {per_gpu_kv / GIB:.3g} GiB per GPU "
            f"for the KV cache: less than one block of block_tokens={block_tokens} tokens")
    return MemoryPlan(model=spec.name, gpu=card.name, tp=tp, gpu_memory_utilization=util,
                      usable_bytes_per_gpu=usable, weight_bytes=weights,
                      reserve_bytes_per_gpu=reserve, kv_bytes=per_gpu_kv * tp,
                      kv_bytes_per_token=float(per_gpu_token * tp),
                      kv_capacity_tokens=tokens, block_tokens=block_tokens, fp8=fp8)
