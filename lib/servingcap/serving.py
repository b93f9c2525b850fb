"""An iteration-level simulator of a continuous-batching LLM replica fleet.

The model is the one Orca, vLLM and Sarathi-Serve share. Time advances in *steps*
(forward passes); a step's duration comes from a cost model. Arrivals that land during
a step wait for the next step boundary. A sequence emits its first token at the end of
the step that finishes its prefill, then one token per step until it has emitted
``output_tokens``. What goes into a step is the replica's *scheduling mode*
(``Replica.mode``), each named after the real scheduler it imitates:

* ``"mixed"`` (the default): token-budget steps. Every decoding sequence takes one
  token of a ``max_batched_tokens`` budget first, then prompt chunks fill what is left,
  oldest first. vLLM V1's default chunked prefill, Sarathi-Serve's stall-free batching
  and SGLang's ``--chunked-prefill-size``.
* ``"combined"``: every decoding sequence plus up to ``chunk_tokens`` of prompt
  prefill (all pending prefill when ``chunk_tokens`` is None) in one step, with no
  token cap: Orca-style iteration-level batching, and the hybrid batch of the seed
  essay's worked examples.
* ``"prefill_first"``: a step with prompts to prefill runs only prefill (whole prompts,
  oldest first, up to ``max_batched_tokens`` prompt tokens); the decodes wait for the
  next step without prefill. vLLM V0's default scheduler (no chunked prefill) and
  DistServe's colocated baseline (``simdistserve``'s ``VLLMCluster``).

A step's duration comes from ``Replica.step_cost`` unless the reader passes a cost
model: ``"fused"`` (default) prices it as one forward pass over all its tokens, as the
engines above run it; ``"additive"`` as a decode step plus a prefill step, the seed
essay's conservative floor.

Around that core: a waiting queue ordered by a policy (``fcfs``, ``sjf``, ``srpt``,
``edf``, ``priority``), admission by batch slots and KV-cache capacity (reserving the
prompt, the expected or the maximum output), preemption with recompute when memory runs
out, an optional prefix cache keyed by prompt block ids, a queue-depth cap and timeouts
(recorded as ``rejected`` / ``timed_out``, never dropped), and several replicas behind a
router (:mod:`servingcap.routers`: routers on the signals a gateway has, the default
``jsq``, and two bounds, ``pooled`` and ``oracle_work``; see :func:`simulate`).

Units: seconds, tokens, tokens/s. Every request given appears exactly once in the
output of :func:`simulate`.

Two engines run this model. ``_Engine`` here is the step-by-step reference. In every
mode with no step log (KV limits, prefix cache, preemption, timeouts and ``until_s``
included), :func:`simulate` runs ``_fast_engine.FastEngine`` (or its
``PrefillFirstEngine``) instead. It accounts for decodes lazily and takes runs of identical steps at once, and
gives the same rows bit for bit (``tests/test_fast_engine.py``).
"""

from __future__ import annotations

import heapq
import inspect
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import _check
from .params import LOCKED
from .routers import DEFAULT_ROUTER, ROUTERS, Router, check_router

__all__ = ["Replica", "StepDetail", "simulate", "check_fleet", "largest_chunk",
           "mixed_token_budget", "OUTCOMES", "POLICIES", "ROUTERS", "MODES", "STEP_COSTS"]

MODES = ("combined", "prefill_first", "mixed")
STEP_COSTS = ("fused", "additive")
OUTCOMES = ("done", "rejected", "timed_out", "unfinished")
POLICIES = ("fcfs", "sjf", "srpt", "edf", "priority")
RESERVES = ("prompt", "expected", "max")
# Run eligible configurations on the lazy engine in _fast_engine (same outputs, faster);
# tests switch it off to compare with the step-by-step reference, _Engine.
_FAST_PATH = True


@dataclass(frozen=True)
class StepDetail:
    """Per-sequence composition of one step, for cost models that need it.

    Attributes
    ----------
    prefill_chunks : numpy.ndarray
        Length of each prefill chunk in the step (tokens).
    prefill_cached : numpy.ndarray
        Context already in the KV cache before each chunk (tokens).
    decode_context : numpy.ndarray
        Context length of each decoding sequence (tokens).
    """

    prefill_chunks: np.ndarray
    prefill_cached: np.ndarray
    decode_context: np.ndarray

    @property
    def prefill_tokens(self) -> int:
        return int(self.prefill_chunks.sum())

    @property
    def decode_batch(self) -> int:
        return int(self.decode_context.size)


def detailed(cost: Callable[[StepDetail], float]) -> Callable[[StepDetail], float]:
    """Mark a cost model as taking a :class:`StepDetail` instead of three totals."""
    cost.wants_detail = True
    return cost


@dataclass(frozen=True)
class Replica:
    """One serving replica: its speed, its batch and memory limits, its scheduler knobs.

    Parameters
    ----------
    prefill_rate : float
        Prompt tokens prefilled per second (tokens/s), used by the default cost model.
    decode_step_s : float, mapping or callable
        Decode step time (s): a constant, a ``{batch: seconds}`` table (linear between
        its points, extended along its last segment past the largest batch, held below
        the smallest: ``_table_step_s``), or a function ``batch -> seconds``. Default: the
        book's decode curve, ``LOCKED.decode_step_table`` (30 ms at the locked batch of
        32, faster at smaller batches), so ``Replica()`` is the book's replica.
    max_batch : int
        Most sequences admitted at once (prefilling or decoding); vLLM's
        ``--max-num-seqs``, SGLang's ``--max-running-requests``. **Defaults to the
        book's locked 32 even when you pass your own** ``step_time`` **or**
        ``decode_step_s``: set it to your engine's value when you calibrate.
    chunk_tokens : int or None
        ``mode="combined"`` only: prefill tokens per step (chunked prefill); None runs
        each prompt whole.
    step_time : callable, optional
        Replaces the default cost model. Either
        ``step_time(prefill_tokens, decode_batch, decode_context_tokens) -> seconds``
        (totals for the step), or a function decorated with :func:`detailed` that takes
        a :class:`StepDetail`. Default: the built-in cost named by ``step_cost``.
    kv_capacity_tokens : int or None
        KV-cache capacity in tokens (None: unlimited).
    kv_block_tokens : int
        Allocation granularity (tokens per block); usage is rounded up to blocks.
    kv_reserve : {"prompt", "expected", "max"}
        What admission reserves besides the prompt: nothing (grow on demand), the
        expected output (column ``predicted_output_tokens`` or ``expected_output_tokens``)
        or the maximum output (column ``max_output_tokens`` or ``max_output_tokens``).
    expected_output_tokens, max_output_tokens : int, optional
        Fleet-wide defaults for the reservation when the request has no such column.
    prefix_cache_blocks : int
        Prompt blocks kept in a per-replica LRU prefix cache (0: off). Needs a
        ``hash_ids`` column; a prompt's leading cached blocks skip prefill.
    prefix_block_tokens : int
        Tokens per ``hash_ids`` block (512 in the Mooncake trace).
    max_queue : int, mapping or None
        Queue-depth cap: an arrival that finds this many requests already waiting for a
        batch slot (queued beyond the free slots) is rejected at once (a fast 429);
        ``max_queue=0`` admits only into free slots. A mapping ``{priority: cap}``
        gives each priority class its own threshold on the shared queue's depth
        (tiered shedding); classes not listed are never rejected.
    max_prompt_tokens : int or None
        Admission limit on prompt length: longer prompts are rejected on arrival.
    timeout_s : float or None
        A request still waiting this long after arrival leaves as ``timed_out``. This
        includes waiting to be readmitted after a preemption: **a request preempted
        after producing tokens can later leave as** ``timed_out`` **with**
        ``first_token_s`` **(and** ``ttft_s``**) set**; its ``finish_s`` is then the
        timeout, or its last token if that came later.
    shed_past_deadline : bool
        Drop a waiting request as ``timed_out`` once its ``deadline_s`` has passed
        (deadline shedding); otherwise late requests are still served.
    preemptive : bool
        When the batch is full and the head of the queue has a smaller policy key than
        a running sequence (e.g. fewer remaining tokens under ``srpt``, a higher
        class under ``priority``), preempt the running one (recompute). Off: a started
        request keeps its slot.
    mode : {"combined", "prefill_first", "mixed"}
        What one step holds (see the module docstring for the engine each imitates).

        * ``"mixed"`` (default): a token budget of ``max_batched_tokens`` per step
          (default: the book's ``LOCKED.token_budget``, 240 tokens, derived from the
          TPOT objective in chapter "Chunked prefill"); each decoding sequence takes
          one token of it first, then prefill chunks fill the rest, oldest admission
          first; waiting requests are admitted only while budget is left. vLLM V1
          (``--max-num-batched-tokens`` with chunked prefill, its default),
          Sarathi-Serve, SGLang (``--chunked-prefill-size``). It is the default
          because it is what production engines run.
        * ``"combined"``: all decodes plus up to ``chunk_tokens`` of prefill
          (everything pending when None), no token cap: Orca's iteration-level
          batching with whole or fixed-size chunks, and the hybrid batch of the
          seed essay's worked examples (the 530 ms stall, ``C_max``).
        * ``"prefill_first"``: if any admitted sequence has prefill left, the step
          runs only prefill: whole prompts, oldest admission first, as long as their
          total stays within ``max_batched_tokens`` (the first always runs, so that a
          recomputed preempted sequence longer than the cap still progresses);
          decoding sequences wait. Admission stops at the first prompt that does not
          fit the cap; a prompt longer than ``max_batched_tokens`` is rejected on
          arrival (vLLM V0 ignores it the same way). vLLM V0 (no chunked prefill) and
          DistServe's colocated baseline, whose ``simdistserve`` worker batches whole
          prompts FIFO up to ``max_num_tokens`` (66,144 for OPT-13B on one A100) and
          has no batch-size cap.
    max_batched_tokens : int or None
        Tokens per step for ``mode="prefill_first"`` (prompt tokens; None: no cap) and
        ``mode="mixed"`` (decode plus prefill tokens; None: the book's
        ``LOCKED.token_budget``, set it to your engine's value when you calibrate; it
        must be at least ``max_batch``). vLLM's ``--max-num-batched-tokens``;
        DistServe's ``max_num_tokens``.
    step_cost : {"fused", "additive"}
        The built-in cost model (used when ``step_time`` is None). ``"fused"``
        (default): one forward pass over all the step's tokens, as vLLM V1, SGLang,
        Sarathi-Serve, TensorRT-LLM and Orca run it: the linear ops see the step's
        total tokens and read the weights once, ``max(weight_read_s, tokens /
        prefill_rate)``, plus the decode curve's per-sequence (attention) part
        (:func:`servingcap.llm.fused_step_s`). ``"additive"``: decode step plus
        ``prefill_tokens / prefill_rate``, the seed essay's conservative floor and
        what a prefill-first engine pays over two steps.
    weight_read_s : float or None
        Fixed part of a fused step (s), the time to read the weights once. None:
        the decode curve extended to batch 0 along the line through its two smallest
        batches (10 ms for the book's curve; a constant ``decode_step_s`` is all
        weight read).
    """

    prefill_rate: float = LOCKED.prefill_rate
    decode_step_s: float | Mapping | Callable = field(
        default_factory=lambda: LOCKED.decode_step_table)
    max_batch: int = LOCKED.decode_batch
    chunk_tokens: int | None = None
    step_time: Callable | None = None
    kv_capacity_tokens: int | None = None
    kv_block_tokens: int = 16
    kv_reserve: str = "prompt"
    expected_output_tokens: int | None = None
    max_output_tokens: int | None = None
    prefix_cache_blocks: int = 0
    prefix_block_tokens: int = 512
    max_queue: int | Mapping | None = None
    max_prompt_tokens: int | None = None
    timeout_s: float | None = None
    shed_past_deadline: bool = False
    preemptive: bool = False
    mode: str = "mixed"
    max_batched_tokens: int | None = None
    step_cost: str = "fused"
    weight_read_s: float | None = None
    _decode: Callable = field(init=False, repr=False, compare=False)
    _weight: float = field(init=False, repr=False, compare=False)
    _cap: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        _check.positive("prefill_rate", self.prefill_rate)
        # whole-number fields are stored as int (256.0 -> 256): the engines index and
        # range over them
        optional = ("chunk_tokens", "kv_capacity_tokens", "max_batched_tokens")
        for name, minimum in (("max_batch", 1), ("chunk_tokens", 1),
                              ("kv_capacity_tokens", 1), ("kv_block_tokens", 1),
                              ("max_batched_tokens", 1), ("prefix_cache_blocks", 0),
                              ("prefix_block_tokens", 1)):
            if name not in optional or getattr(self, name) is not None:
                object.__setattr__(self, name,
                                   _check.whole(name, getattr(self, name), minimum))
        if self.kv_reserve not in RESERVES:
            raise ValueError(f"kv_reserve must be one of {RESERVES}, got {self.kv_reserve!r}")
        for name in ("expected_output_tokens", "max_output_tokens", "max_prompt_tokens"):
            if getattr(self, name) is not None:
                _check.whole(name, getattr(self, name), minimum=0)
        if isinstance(self.max_queue, Mapping):
            for tier, cap in self.max_queue.items():
                _check.whole(f"max_queue[{tier!r}]", cap, minimum=0)
        elif self.max_queue is not None:
            _check.whole("max_queue", self.max_queue, minimum=0)
        _check.whole("prefix_cache_blocks", self.prefix_cache_blocks, minimum=0)
        _check.whole("prefix_block_tokens", self.prefix_block_tokens)
        if self.timeout_s is not None:
            _check.positive("timeout_s", self.timeout_s)
        if self.step_time is not None and not callable(self.step_time):
            raise ValueError(f"step_time must be callable, got {self.step_time!r}")
        self._check_mode()
        # the step's token cap, computed once: LOCKED.token_budget re-derives it from the
        # locked numbers, and the engine asks for it twice per planned step
        object.__setattr__(self, "_cap", self._token_cap())
        _flag("shed_past_deadline", self.shed_past_deadline)
        _flag("preemptive", self.preemptive)
        if self.step_time is not None and not getattr(self.step_time, "wants_detail", False):
            _check_totals_signature(self.step_time)
        object.__setattr__(self, "_decode", _decode_curve(self.decode_step_s))
        if self.step_cost not in STEP_COSTS:
            raise ValueError(f"step_cost must be one of {STEP_COSTS}, got {self.step_cost!r}")
        if self.weight_read_s is not None:
            _check.positive("weight_read_s", self.weight_read_s)
        object.__setattr__(self, "_weight", self.weight_read_s if self.weight_read_s is not None
                           else _weight_read(self.decode_step_s, self._decode))
        if self.mode == "mixed" and self.token_cap() < self.max_batch:
            raise ValueError(
                f"max_batched_tokens={self.token_cap()!r} is below max_batch={self.max_batch!r}: "
                "a mixed step must hold one token of every decoding sequence (vLLM refuses "
                "max_num_batched_tokens < max_num_seqs too)")

    def _check_mode(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.max_batched_tokens is not None:
            _check.whole("max_batched_tokens", self.max_batched_tokens)
        if self.mode == "combined":
            if self.max_batched_tokens is not None:
                raise ValueError(
                    f"max_batched_tokens={self.max_batched_tokens!r} is the step cap of "
                    "mode='prefill_first' or 'mixed'; mode='combined' caps prefill per "
                    "step with chunk_tokens")
            return
        if self.chunk_tokens is not None:
            raise ValueError(
                f"chunk_tokens={self.chunk_tokens!r} applies to mode='combined' only; "
                f"mode={self.mode!r} sizes its steps with max_batched_tokens")

    def token_cap(self) -> float:
        """Tokens one step may hold in this mode (inf: no cap). ``mixed`` without a
        ``max_batched_tokens`` uses the book's budget, ``LOCKED.token_budget``."""
        return self._cap

    def _token_cap(self) -> float:
        if self.mode == "combined":
            return math.inf
        if self.max_batched_tokens is None:
            return LOCKED.token_budget if self.mode == "mixed" else math.inf
        return self.max_batched_tokens

    def step_s(self, batch: int, tokens: int, decode_s: float) -> float:
        """Duration (s) of a step of ``batch`` decodes (whose decode step alone takes
        ``decode_s``, :meth:`decode_time`) and ``tokens`` prefill tokens, on the
        built-in cost (``step_cost``): ``"fused"``, one forward pass priced by op group
        (:func:`servingcap.llm.fused_step_s`), or ``"additive"``, decode step plus
        prefill step (the seed's conservative floor)."""
        rate = self.prefill_rate
        if self.step_cost == "additive":
            return decode_s + tokens / rate
        if tokens == 0:
            return decode_s                       # a pure decode step is the curve itself
        w = self._weight
        linear = (batch + tokens) / rate
        if linear < w:
            linear = w
        if batch == 0:
            return linear
        own = batch / rate
        attention = decode_s - (own if own > w else w)
        return (attention if attention > 0 else 0.0) + linear

    @property
    def idle_chunk_tokens(self) -> float:
        """Prompt tokens one step prefills when the replica has nothing else to run
        (inf: the whole prompt): ``chunk_tokens`` in combined mode, the whole token
        budget in mixed mode, whole prompts in prefill_first."""
        if self.mode == "combined":
            return self.chunk_tokens or math.inf
        if self.mode == "mixed":
            return self.token_cap()
        return math.inf

    def idle_prefill_s(self, prompt_tokens) -> np.ndarray:
        """Seconds to prefill each prompt alone on an idle replica, chunk by chunk as
        the mode prescribes, on the built-in cost (``step_time`` None). Additive:
        ``prompt / prefill_rate``; fused: each chunk ``max(weight_read_s, chunk /
        prefill_rate)``."""
        if self.step_time is not None:
            raise ValueError("idle_prefill_s needs the built-in cost model, got a custom "
                             "step_time (sum its steps instead)")
        p = np.asarray(prompt_tokens, dtype=float)
        rate = self.prefill_rate
        if self.step_cost == "additive":
            return p / rate
        w, c = self._weight, self.idle_chunk_tokens
        if c == math.inf:
            return np.maximum(w, p / rate)
        full, rest = np.floor_divide(p, c), np.mod(p, c)
        return full * max(w, c / rate) + np.where(rest > 0, np.maximum(w, rest / rate), 0.0)

    def full_batch_work_s(self, prompt_tokens, output_tokens) -> np.ndarray:
        """Replica time each request needs when the replica is never idle (s), on the
        built-in cost: the fluid work behind a replica's throughput bound.

        Additive: its prefill plus ``N - 1`` decode steps shared by ``max_batch``
        sequences, ``P / prefill_rate + (N - 1) t(B) / B``. Fused, a lower bound: the
        linear ops cost at least ``max(weight_read_s * (N - 1) / B, (P + N - 1) /
        prefill_rate)`` (every token at the compute rate, and at least one weight read
        per ``B`` decode tokens), plus ``N - 1`` decode tokens' per-sequence part at its
        cheapest batch, ``min_b a(b) / b``."""
        if self.step_time is not None:
            raise ValueError("full_batch_work_s needs the built-in cost model, got a custom "
                             "step_time")
        p = np.asarray(prompt_tokens, dtype=float)
        n = np.asarray(output_tokens, dtype=float)
        b, rate = self.max_batch, self.prefill_rate
        decode_tokens = np.maximum(n - 1.0, 0.0)
        if self.step_cost == "additive":
            return p / rate + decode_tokens * self.decode_time(b) / b
        w = self._weight
        per_sequence = min(max(self.decode_time(k) - max(w, k / rate), 0.0) / k
                           for k in range(1, b + 1))
        linear = np.maximum(w * decode_tokens / b, (p + decode_tokens) / rate)
        return linear + decode_tokens * per_sequence

    def queue_cap(self, priority: float) -> float:
        """Waiting requests at which an arrival of this priority is rejected."""
        if self.max_queue is None:
            return math.inf
        if isinstance(self.max_queue, Mapping):
            return self.max_queue.get(priority, math.inf)
        return self.max_queue

    def decode_time(self, batch: int) -> float:
        """Decode step time at ``batch`` sequences (s); 0 for an empty batch. A
        ``decode_step_s`` function that returns NaN, inf or a time <= 0 is an error."""
        if batch <= 0:
            return 0.0
        seconds = self._decode(batch)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"decode_step_s {_name(self.decode_step_s)} returned {seconds!r} "
                             f"for a decode batch of {batch}; it must return a finite number "
                             "of seconds > 0")
        return seconds

    def cost(self, detail: StepDetail) -> float:
        """Duration of a step with this composition (s)."""
        if self.step_time is None:
            batch = detail.decode_batch
            return self.step_s(batch, detail.prefill_tokens, self.decode_time(batch))
        if getattr(self.step_time, "wants_detail", False):
            seconds = self.step_time(detail)
        else:
            seconds = self.step_time(detail.prefill_tokens, detail.decode_batch,
                                     int(detail.decode_context.sum()))
        try:
            seconds = float(seconds)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(
                f"step_time {_name(self.step_time)} returned {seconds!r} for a step of "
                f"{detail.prefill_chunks.size} prefill chunk(s) ({detail.prefill_tokens} tokens) "
                f"and {detail.decode_batch} decoding sequence(s) "
                f"({int(detail.decode_context.sum())} context tokens); it must return a "
                "finite number of seconds > 0")
        return seconds


MAX_STEP_BATCH = 10**6
"""Most decoding sequences :func:`largest_chunk` prices in one step (it builds one context
length per sequence); no engine batches anywhere near a million sequences."""

_FIT_RTOL = 1e-9
"""Relative slack of "a step fits the budget": rounding in a sum of step parts must not
cost a token (the locked replica's 20 ms + 240 / 8,000 tokens/s is exactly 50 ms)."""


def largest_chunk(step_cost: Callable[[StepDetail], float], budget_s: float, batch: int,
                  context_tokens: float, cached_tokens: int = 0) -> int:
    """Largest prefill chunk (tokens) a step with ``batch`` decoding sequences at
    ``context_tokens`` each can carry within ``budget_s`` seconds (e.g. the TPOT
    objective), the chunk following ``cached_tokens`` already cached; 0 when the
    decodes alone exceed the budget.

    ``step_cost`` prices a :class:`StepDetail` in seconds (:meth:`Replica.cost`, a
    :class:`~servingcap.roofline.Roofline`, a profile). Found by bisection, assuming the
    step never gets cheaper as its chunk grows; a step within ``budget_s * (1 + 1e-9)``
    fits. Raises ``ValueError`` when more than ``10**12`` tokens fit (a cost model with
    no practical limit)."""
    if not callable(step_cost):
        raise ValueError(f"step_cost must be callable (StepDetail -> seconds), got "
                         f"{step_cost!r}")
    budget = _check.positive("budget_s", budget_s)
    return _largest_chunk(step_cost, budget, batch, context_tokens, cached_tokens,
                          ("step_cost", "budget_s"))


def _largest_chunk(step_cost, budget: float, batch, context_tokens, cached_tokens,
                   names: tuple[str, str]) -> int:
    """:func:`largest_chunk` with ``names`` = (the cost's, the budget's) for messages."""
    b = _check.whole("batch", batch, minimum=0)
    if b > MAX_STEP_BATCH:
        raise ValueError(f"batch must be <= {MAX_STEP_BATCH:.0e} sequences, got {batch!r}")
    ctx = _check.positive("context_tokens", context_tokens) if b else 0.0
    cached = _check.whole("cached_tokens", cached_tokens, minimum=0)
    decodes = np.full(b, float(ctx))
    limit = budget * (1.0 + _FIT_RTOL)

    def fits(chunk: int) -> bool:
        detail = StepDetail(prefill_chunks=np.array([float(chunk)]),
                            prefill_cached=np.array([float(cached)]), decode_context=decodes)
        seconds = step_cost(detail)
        try:
            seconds = float(seconds)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"{names[0]} must price a step in seconds (finite, >= 0), got "
                             f"{step_cost(detail)!r} for a {chunk}-token chunk beside {b} "
                             "decodes")
        return seconds <= limit

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, 2 * hi
        if hi > _check.MAX_TOKENS:
            raise ValueError(f"{names[1]}={budget!r} fits more than {_check.MAX_TOKENS:.0e} "
                             f"tokens on {names[0]}: its step cost has no practical limit "
                             "there")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def mixed_token_budget(replica: Replica, tpot_s: float, context_tokens: float) -> int | None:
    """The token budget (``max_batched_tokens``, tokens per step) that keeps a full
    mixed step inside the TPOT objective on ``replica``'s own step cost: a full batch of
    ``replica.max_batch`` decodes at ``context_tokens`` each (e.g. the workload's mean
    prompt plus half its output), one token each, plus the largest prompt chunk
    :func:`largest_chunk` fits in ``tpot_s`` seconds. None when the decodes alone
    overrun ``tpot_s`` (lighter batches may still meet it: no budget follows).

    The book's rule for its locked replica (``LOCKED.token_budget``: (50 - 20) ms x
    8,000 tokens/s = 240 tokens, :func:`servingcap.llm.fused_token_budget`), applied to
    any cost model: the built-in one, a roofline, a profile or a calibrated cost file.
    Sarathi-Serve picks its token budget the same way, from the TPOT SLO and profiled
    step times (Agrawal et al., OSDI 2024, "Determining token budget")."""
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a Replica, got {replica!r}")
    tpot = _check.positive("tpot_s", tpot_s)
    context = _check.positive("context_tokens", context_tokens)
    chunk = _largest_chunk(replica.cost, tpot, replica.max_batch, context, 0,
                           ("replica", "tpot_s"))
    return None if chunk == 0 else replica.max_batch + chunk


def _check_totals_signature(fn) -> None:
    """A totals cost model takes three numbers; a one-argument one wants @detailed."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return                                    # builtins without a signature: trust
    try:
        signature.bind(0, 0, 0)
    except TypeError:
        try:
            signature.bind(StepDetail(*(np.zeros(0, dtype=np.int64),) * 3))
        except TypeError:
            raise ValueError(
                f"step_time {_name(fn)} must accept (prefill_tokens, decode_batch, "
                "decode_context_tokens), or take one StepDetail and be decorated with "
                "@servingcap.serving.detailed") from None
        raise ValueError(
            f"step_time {_name(fn)} takes one argument: if it expects a StepDetail, decorate "
            "it with @servingcap.serving.detailed (otherwise it must accept prefill_tokens, "
            "decode_batch, decode_context_tokens)") from None


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _table_step_s(batch: float, batches, seconds) -> float:
    """Decode step time (s) at ``batch`` from a measured table (``batches`` ascending,
    ``seconds`` > 0): linear between points; past the largest batch, extended along the
    last segment (a step never gets cheaper as the batch grows, so a replica allowed a
    larger batch than was measured is not given free tokens); below the smallest batch,
    held at its time (the cautious choice, and never <= 0)."""
    if batch > batches[-1] and len(batches) > 1:
        slope = (seconds[-1] - seconds[-2]) / (batches[-1] - batches[-2])
        return float(seconds[-1] + max(slope, 0.0) * (batch - batches[-1]))
    return float(np.interp(batch, batches, seconds))


def _weight_read(spec, decode: Callable[[int], float]) -> float:
    """Weight-read time (s) implied by a decode curve: a constant step is all weight
    read; a table or function is extended to batch 0 along the line through its two
    smallest batches (clamped into (0, step at the smallest batch])."""
    if callable(spec) and not isinstance(spec, Mapping):
        (b0, t0), (b1, t1) = (1, decode(1)), (2, decode(2))   # decode names bad returns
    elif isinstance(spec, Mapping):
        batches = sorted(spec)
        if len(batches) == 1:
            return float(spec[batches[0]])
        (b0, t0), (b1, t1) = ((b, float(spec[b])) for b in batches[:2])
    else:
        return float(spec)
    intercept = t0 - (t1 - t0) / (b1 - b0) * b0
    return float(min(max(intercept, 1e-9), t0)) if t0 > 0 else 1e-9


def _decode_curve(spec) -> Callable[[int], float]:
    if callable(spec):
        def seconds(b):
            value = spec(b)
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ValueError(f"decode_step_s {_name(spec)} must return seconds (a number) "
                                 f"for a batch size, got {value!r} at batch {b}") from None
        return seconds
    if isinstance(spec, Mapping):
        if not spec:
            raise ValueError("decode_step_s table must not be empty, got {}")
        try:
            batches = np.array(sorted(spec), dtype=float)
        except (TypeError, ValueError):
            raise ValueError("decode_step_s table must map batch sizes (numbers) to seconds, "
                             f"got keys {list(spec)!r}") from None
        seconds = np.array([_check.positive(f"decode_step_s[{b}]", spec[b]) for b in sorted(spec)])
        for b in batches:
            _check.positive("decode_step_s batch", b)
        return lambda b: _table_step_s(b, batches, seconds)
    value = _check.positive("decode_step_s", spec)
    return lambda b: value


# --------------------------------------------------------------------------- requests


class _Requests:
    """Column arrays of the input, plus the per-request state the simulation mutates."""

    def __init__(self, frame: pd.DataFrame, replica: Replica, policy: str):
        if not isinstance(frame, pd.DataFrame):
            raise ValueError(f"requests must be a pandas DataFrame, got {type(frame).__name__}")
        for column in ("arrival_s", "prompt_tokens", "output_tokens"):
            if column not in frame.columns:
                raise ValueError(f"requests is missing column {column!r}; has {list(frame.columns)}")
        self.n = n = len(frame)
        self.arrival = _column(frame, "arrival_s")
        self.prompt = self._tokens(frame, "prompt_tokens", minimum=1)
        self.output = self._tokens(frame, "output_tokens", minimum=1)
        self.predicted = (self._tokens(frame, "predicted_output_tokens", minimum=0)
                          if "predicted_output_tokens" in frame else self.output)
        self.priority = _column(frame, "priority") if "priority" in frame else np.zeros(n)
        self.deadline = _column(frame, "deadline_s") if "deadline_s" in frame else np.full(n, np.inf)
        if policy == "edf" and "deadline_s" not in frame:
            raise ValueError("policy 'edf' needs a deadline_s column in requests")
        self.hash_ids = _block_ids(frame["hash_ids"]) if "hash_ids" in frame else None
        self.session = frame["session_id"].tolist() if "session_id" in frame else None
        if replica.prefix_cache_blocks and self.hash_ids is None:
            raise ValueError("prefix_cache_blocks > 0 needs a hash_ids column in requests")
        self.reserve = self._reservation(frame, replica)
        # state
        self.replica = np.full(n, -1, dtype=np.int64)
        self.admitted = np.full(n, np.nan)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last_token = np.full(n, np.nan)
        self.max_gap = np.zeros(n)
        self.generated = np.zeros(n, dtype=np.int64)
        self.prefill_left = np.zeros(n, dtype=np.int64)
        self.prefill_done = np.zeros(n, dtype=np.int64)   # context cached so far (tokens)
        self.cached = np.zeros(n, dtype=np.int64)         # prefix-cache hits (tokens)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.outcome = np.array(["unfinished"] * n, dtype=object)

    @staticmethod
    def _tokens(frame, column, minimum):
        values = _column(frame, column)
        bad = (values < minimum) | (values != np.round(values)) | (values > _check.MAX_TOKENS)
        if bad.any():
            i = int(bad.argmax())
            raise ValueError(f"{column} must be whole numbers from {minimum} to "
                             f"{_check.MAX_TOKENS:.0e}, got {values[i]!r} at row {i}")
        return values.astype(np.int64)

    def _reservation(self, frame, replica) -> np.ndarray:
        if replica.kv_reserve == "prompt":
            return np.zeros(self.n, dtype=np.int64)
        if replica.kv_reserve == "expected":
            column, default = "predicted_output_tokens", replica.expected_output_tokens
        else:
            column, default = "max_output_tokens", replica.max_output_tokens
        if column in frame:
            return self._tokens(frame, column, minimum=0)
        if default is None:
            raise ValueError(f"kv_reserve={replica.kv_reserve!r} needs a {column} column or "
                             f"Replica({column.replace('predicted', 'expected')}=...)")
        return np.full(self.n, int(default), dtype=np.int64)

    def key(self, i: int, policy: str) -> tuple:
        """Queue order: smaller first; ties by arrival then index."""
        if policy == "fcfs":
            return (self.arrival[i], i)
        if policy == "sjf":
            return (self.predicted[i], self.arrival[i], i)
        if policy == "srpt":
            return (self.predicted[i] - self.generated[i], self.arrival[i], i)
        if policy == "edf":
            return (self.deadline[i], self.arrival[i], i)
        return (self.priority[i], self.arrival[i], i)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A numeric request column as finite floats, refusing dates, booleans and text."""
    column = frame[name]
    kind = column.dtype.kind
    if kind in "mM":
        raise ValueError(f"{name} must be numbers of seconds (or tokens), got dtype {column.dtype}; "
                         "convert times with (t - t.min()).dt.total_seconds()")
    if kind not in "iufO":
        raise ValueError(f"{name} must hold numbers, got dtype {column.dtype}")
    try:
        values = column.to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must hold numbers, got {column.iloc[0]!r} ...: {exc}") from exc
    return _check.array(name, values)


def _block_ids(column: pd.Series) -> list:
    """``hash_ids``: per request, a list of prompt-block ids (ints or strings)."""
    ids = column.tolist()
    rows, blocks = set(map(type, ids)), set()     # each type checked once, when all pass
    if all(issubclass(t, (list, tuple, np.ndarray)) for t in rows):
        for value in ids:
            blocks.update(map(type, value))
        if not any(issubclass(t, (bool, np.bool_)) or not issubclass(t, (int, np.integer, str))
                   for t in blocks):
            return ids
    for row, value in enumerate(ids):             # else the first bad one, named
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
            raise ValueError(f"hash_ids must hold a list of block ids per request, got {value!r} "
                             f"at row {row}")
        for block in value:
            if isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer, str)):
                raise ValueError(f"hash_ids must hold block ids (ints or strings), got {block!r} "
                                 f"in row {row}")
    return ids


def _flag(name: str, value) -> bool:
    """A true/false option: only a real boolean (``'no'`` is not False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_seed(seed):
    """None, a whole number >= 0, a SeedSequence or a Generator (what default_rng takes)."""
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.Generator)):
        return seed
    return _check.whole("seed", seed, minimum=0)


class _Queue:
    """A waiting queue ordered by the policy key (a heap), shared when routing is pooled."""

    def __init__(self):
        self.heap: list = []
        self.replicas: list = []

    def __len__(self):
        return len(self.heap)

    def push(self, key, i):
        heapq.heappush(self.heap, (key, i))


# --------------------------------------------------------------------------- one replica


class _Engine:
    """The mutable state of one replica during a simulation."""

    def __init__(self, index: int, spec: Replica, req: _Requests, queue: _Queue,
                 policy: str, steps: list | None):
        self.index, self.spec, self.req, self.queue = index, spec, req, queue
        self.policy = policy
        self.running: list[int] = []       # admission order (newest last)
        self.prefilling: list[int] = []    # FIFO of sequences with prefill left
        self.busy_until = math.inf          # end of the step in flight (inf: idle)
        self.step_decode = np.zeros(0, dtype=np.int64)
        self.step_prefill: list[tuple[int, int]] = []
        self.steps = steps
        self.prefix: OrderedDict = OrderedDict()
        self.kv_used_blocks = 0
        self.busy_time = 0.0
        self.repeat = 1
        self.step_start = self.step_duration = 0.0
        self.log_row = -1
        self.work = 0            # tokens still to process for requests routed here

    # ---- memory
    def _blocks(self, tokens) -> np.ndarray:
        return -(-np.asarray(tokens) // self.spec.kv_block_tokens)

    def _held(self, idx, extra=0) -> np.ndarray:
        """KV blocks held by sequences ``idx``: prompt plus the larger of the tokens
        generated (``+ extra`` for a step about to run) and the output reserved."""
        r = self.req
        idx = np.asarray(idx, dtype=np.int64)
        return self._blocks(r.prompt[idx] + np.maximum(r.generated[idx] + extra, r.reserve[idx]))

    def _kv_blocks_in_use(self) -> int:
        return int(self._held(self.running).sum()) if self.running else 0

    @property
    def _kv_limit(self) -> float:
        cap = self.spec.kv_capacity_tokens
        return math.inf if cap is None else cap // self.spec.kv_block_tokens

    def load(self) -> int:
        """Outstanding requests (waiting here + admitted), for ``least_requests``."""
        return len(self.running) + (len(self.queue.heap) if len(self.queue.replicas) == 1 else 0)

    def work_at(self, t: float) -> int:
        """Outstanding work (tokens) at time ``t``, for ``oracle_work``: what
        :attr:`work` would be had the repeated decode steps ending before ``t`` been
        applied one by one (they are applied together when the run ends)."""
        if self.repeat <= 1 or self.busy_until == math.inf:
            return self.work
        ended = math.ceil((t - self.step_start) / self.step_duration) - 1
        return self.work - min(max(ended, 0), self.repeat) * self._step_batch()

    def _step_batch(self) -> int:
        """Decoding sequences in the step in flight."""
        return int(self.step_decode.size)

    def enqueue(self, i: int) -> None:
        """Route request ``i`` to this replica's queue and count its work."""
        r = self.req
        self.queue.push(r.key(i, self.policy), i)
        self.work += int(r.prompt[i] + r.output[i])

    # ---- admission
    def _admit(self, now: float) -> None:
        """Fill free slots from the queue; with ``preemptive``, displace worse-keyed work."""
        r, spec, heap = self.req, self.spec, self.queue.heap
        while True:
            self._fill_free_slots(now)
            if not (spec.preemptive and heap and len(self.running) >= spec.max_batch):
                return
            keys = [r.key(j, self.policy) for j in self.running]
            worst = max(range(len(keys)), key=keys.__getitem__)
            if not heap[0][0] < keys[worst]:
                return
            if not self._fits_step(heap[0][1], self._token_room()):
                return                        # no room in this step: do not evict for nothing
            self._evict(self.running.pop(worst))

    def _evict(self, victim: int) -> None:
        """Preempt a running sequence: free its KV, requeue it to recompute later."""
        r = self.req
        if victim in self.prefilling:
            self.prefilling.remove(victim)
        r.preemptions[victim] += 1
        self.work += int(r.prompt[victim] + r.generated[victim] - r.prefill_left[victim])
        r.prefill_done[victim] = 0
        r.prefill_left[victim] = 0
        self.queue.push(r.key(victim, self.policy), victim)

    def _token_room(self) -> float:
        """Tokens of this step's cap not yet claimed by admitted work (inf: no cap).

        ``prefill_first`` counts the prefill left of admitted sequences; ``mixed`` also
        one token per decoding sequence."""
        cap = self.spec.token_cap()
        if cap == math.inf:
            return cap
        left = self.req.prefill_left
        used = sum(int(left[i]) for i in self.prefilling)
        if self.spec.mode == "mixed":
            used += sum(1 for i in self.running if left[i] == 0)
        return cap - used

    def _fits_step(self, i: int, room: float) -> bool:
        """Whether admitting ``i`` now keeps this step within the mode's token cap."""
        if room == math.inf:
            return True
        if self.spec.mode == "mixed":
            return room > 0                      # any leftover budget takes a chunk
        need = self.req.prompt[i] + self.req.generated[i] - self._prefix_hit(i, touch=False)
        return need <= room or not self.prefilling    # the first prompt always runs

    def _fill_free_slots(self, now: float) -> None:
        r, spec = self.req, self.spec
        heap = self.queue.heap
        room = self._token_room()
        while heap and len(self.running) < spec.max_batch:
            _, i = heap[0]
            expiry = min(r.deadline[i] if spec.shed_past_deadline else math.inf,
                         math.inf if spec.timeout_s is None else r.arrival[i] + spec.timeout_s)
            if expiry <= now:
                heapq.heappop(heap)
                self.work -= int(r.prompt[i] + r.output[i])
                r.outcome[i] = "timed_out"
                # preempted after producing tokens: it leaves no earlier than its last one
                r.finish[i] = expiry if r.generated[i] == 0 else max(expiry, r.last_token[i])
                r.replica[i] = self.index if r.replica[i] < 0 else r.replica[i]
                continue
            need = int(self._held([i])[0])
            if need > self._kv_limit:
                raise ValueError(
                    f"request {i} needs {int(need)} KV blocks (prompt {r.prompt[i]} tokens) but "
                    f"kv_capacity_tokens={spec.kv_capacity_tokens} holds only {int(self._kv_limit)}")
            if self._kv_blocks_in_use() + need > self._kv_limit:
                break                                     # head of line waits for memory
            if not self._fits_step(i, room):
                break                                     # the step's token cap is full
            heapq.heappop(heap)
            self._start(i, now)
            if room != math.inf:
                room -= r.prefill_left[i]

    def _start(self, i: int, now: float) -> None:
        r = self.req
        r.replica[i] = self.index
        if np.isnan(r.admitted[i]):
            r.admitted[i] = now
        cached = self._prefix_hit(i) if r.generated[i] == 0 else 0
        r.cached[i] = max(r.cached[i], cached)
        r.prefill_done[i] = cached
        r.prefill_left[i] = r.prompt[i] + r.generated[i] - cached   # recompute after preemption
        self.work -= cached
        self.running.append(i)
        self.prefilling.append(i)

    def _prefix_hit(self, i: int, touch: bool = True) -> int:
        """Prompt tokens of ``i`` already in the prefix cache (``touch``: mark them used)."""
        if not self.spec.prefix_cache_blocks or self.req.generated[i]:
            return 0
        hits = 0
        for block in self.req.hash_ids[i]:
            if block not in self.prefix:
                break
            if touch:
                self.prefix.move_to_end(block)
            hits += 1
        # always prefill at least one token: the last one produces the first output token
        return int(min(hits * self.spec.prefix_block_tokens, self.req.prompt[i] - 1))

    def _remember_prefix(self, i: int) -> None:
        cap, prefix = self.spec.prefix_cache_blocks, self.prefix
        if not cap:
            return
        for block in self.req.hash_ids[i]:                # most recently used last
            if block in prefix:
                prefix.move_to_end(block)
            else:
                prefix[block] = True
        for _ in range(len(prefix) - cap):                # least recently used out
            prefix.popitem(last=False)

    # ---- one step
    def plan(self, now: float) -> None:
        """Admit what fits and start the next step at ``now`` (or go idle).

        When the step is pure decode with a batch-only cost, the same step repeats
        until the first sequence finishes or memory runs out; those identical steps are
        taken at once (``self.repeat`` of them). An arrival that could join cuts the run
        short at the next step boundary (:meth:`cut`).
        """
        self._admit(now)
        r = self.req
        ready = np.array([i for i in self.running if r.prefill_left[i] == 0], dtype=np.int64)
        decoding, chunks = self._compose(ready)
        every_decode = decoding.size == ready.size         # mixed may leave some out
        decoding, chunks = self._make_room(decoding, chunks)
        if self.spec.mode == "prefill_first" and not chunks and decoding.size == 0:
            # memory preempted every prompt of a prefill-only step: decode instead
            ready = np.array([i for i in self.running if r.prefill_left[i] == 0],
                             dtype=np.int64)
            decoding, chunks = self._make_room(ready, [])
        if not chunks and decoding.size == 0:
            self.busy_until = math.inf
            self.step_prefill, self.step_decode = [], decoding
            return
        detail = StepDetail(
            prefill_chunks=np.array([t for _, t in chunks], dtype=np.int64),
            prefill_cached=np.array([r.prefill_done[i] for i, _ in chunks], dtype=np.int64),
            decode_context=r.prompt[decoding] + r.generated[decoding],
        )
        duration = self.spec.cost(detail)
        repeat = 1
        if not chunks and self.spec.step_time is None and every_decode:
            repeat = self._identical_steps(decoding)
        self.step_prefill, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration
        self.busy_until = now + repeat * duration
        self.busy_time += repeat * duration
        if self.steps is not None:
            growth = np.arange(repeat)[:, None]            # KV grows during repeated steps
            kv = self._held(self.running, growth).sum(axis=1) * self.spec.kv_block_tokens
            self.log_row = len(self.steps)
            self.steps.append((now, self.index, duration, detail.decode_batch,
                               detail.prefill_tokens, len(self.running), len(self.queue),
                               kv, repeat))

    def cut(self, t: float) -> None:
        """A request that could join arrived at ``t``: end the repeated steps at the first
        step boundary at or after ``t`` so that it is admitted there."""
        if self.repeat <= 1 or self.busy_until == math.inf:
            return
        if len(self.running) >= self.spec.max_batch and not self.spec.preemptive:
            return
        keep = max(1, math.ceil((t - self.step_start) / self.step_duration))
        if keep >= self.repeat:
            return
        self.busy_time -= (self.repeat - keep) * self.step_duration
        self.repeat = keep
        self.busy_until = self.step_start + keep * self.step_duration
        if self.steps is not None:
            row = list(self.steps[self.log_row])
            row[7], row[8] = row[7][:keep], keep
            self.steps[self.log_row] = tuple(row)

    def _identical_steps(self, decoding) -> int:
        """How many copies of this pure-decode step run before the batch can change by
        itself (a finish, or memory running out); arrivals cut it later."""
        r = self.req
        k = int((r.output[decoding] - r.generated[decoding]).min())     # first finish
        if k > 1 and self._kv_limit < math.inf:
            lo, hi = 1, k                                                 # memory still fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int(self._held(self.running, mid).sum()) <= self._kv_limit:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        return max(k, 1)

    def _compose(self, decoding: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The step the mode prescribes: (decoding sequences, prefill chunks)."""
        mode = self.spec.mode
        if mode == "combined":
            return decoding, self._chunks(self.spec.chunk_tokens or math.inf)
        cap = self.spec.token_cap()
        if mode == "prefill_first":
            chunks, used = [], 0
            for i in self.prefilling:              # whole prompts, oldest first
                need = int(self.req.prefill_left[i])
                if chunks and used + need > cap:
                    break
                chunks.append((i, need))
                used += need
            return (decoding[:0] if chunks else decoding), chunks
        decoding = decoding[:int(min(decoding.size, cap))]      # mixed: decodes first
        return decoding, self._chunks(cap - decoding.size)

    def _chunks(self, budget: float) -> list[tuple[int, int]]:
        """Prefill work for this step: (sequence, tokens), oldest admission first, at
        most ``budget`` tokens in total."""
        chunks = []
        for i in self.prefilling:
            if budget <= 0:
                break
            take = int(min(self.req.prefill_left[i], budget))
            chunks.append((i, take))
            budget -= take
        return chunks

    def _make_room(self, decoding, chunks):
        """Preempt (recompute) the newest sequences until the tokens this step emits fit."""
        if self._kv_limit == math.inf:
            return decoding, chunks
        r = self.req
        while len(self.running) > 1:
            emitting = set(decoding.tolist())
            emitting.update(i for i, take in chunks if take == r.prefill_left[i])
            grow = np.array([1 if i in emitting else 0 for i in self.running])
            if int(self._held(self.running, grow).sum()) <= self._kv_limit:
                break
            victim = self.running.pop()
            self._evict(victim)
            decoding = decoding[decoding != victim]
            chunks = [(i, take) for i, take in chunks if i != victim]
        return decoding, chunks

    def finish_step(self) -> None:
        """Apply the step that ends at ``busy_until``: tokens out, prefill progress, exits."""
        now, r = self.busy_until, self.req
        if self.repeat > 1:                      # identical decode steps taken at once
            d = self.step_decode
            step = (now - self.step_start) / self.repeat
            # a sequence that sat out prefill-only steps waited before the run began
            waited = self.step_start - r.last_token[d]
            r.max_gap[d] = np.maximum(r.max_gap[d], step + waited)
            r.generated[d] += self.repeat - 1
            r.last_token[d] = now - step
            self.work -= (self.repeat - 1) * d.size
        emitted = [self.step_decode]
        for i, take in self.step_prefill:
            self.work -= take
            r.prefill_left[i] -= take
            r.prefill_done[i] += take
            if r.prefill_left[i] == 0:
                self.prefilling.remove(i)
                emitted.append(np.array([i]))
                if r.generated[i] == 0:
                    r.first[i] = now
                    self._remember_prefix(i)
        out = np.concatenate(emitted) if len(emitted) > 1 else emitted[0]
        if out.size:
            gaps = now - r.last_token[out]
            seen = ~np.isnan(gaps)
            r.max_gap[out[seen]] = np.maximum(r.max_gap[out[seen]], gaps[seen])
            r.last_token[out] = now
            r.generated[out] += 1
            self.work -= out.size
            done = out[r.generated[out] >= r.output[out]]
            if done.size:
                r.finish[done] = now
                r.outcome[done] = "done"
                gone = set(done.tolist())
                self.running = [i for i in self.running if i not in gone]

    # ---- gateway signals: what a router may read (servingcap.routers); never output lengths
    def queue_depth(self) -> int:
        """Requests waiting here, not yet admitted (0 when the queue is shared)."""
        return len(self.queue.heap) if len(self.queue.replicas) == 1 else 0

    def running_requests(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        return len(self.running)

    def free_slots(self) -> int:
        """Batch slots not claimed by a running or a waiting request."""
        return max(self.spec.max_batch - len(self.running) - self.queue_depth(), 0)

    def _steps_ended(self, t: float) -> int:
        """Steps of the run in flight that ended before ``t`` (not yet applied)."""
        if self.repeat <= 1 or self.busy_until == math.inf:
            return 0
        return min(max(math.ceil((t - self.step_start) / self.step_duration) - 1, 0),
                   self.repeat)

    def kv_tokens(self, t: float) -> int:
        """KV-cache tokens in use at ``t``: prompt plus tokens generated so far, summed
        over the admitted requests."""
        r, run = self.req, self.running
        used = int((r.prompt[run] + r.generated[run]).sum()) if run else 0
        return used + self._steps_ended(t) * self._step_batch()

    def pending_prefill(self, t: float) -> int:
        """Prompt tokens still to prefill at ``t``: what admitted requests have left."""
        left = self.req.prefill_left
        return int(sum(int(left[i]) for i in self.running))

    def queued_tokens(self) -> int:
        """Context tokens of the requests waiting here (prompt, plus the tokens to
        recompute of a preempted one)."""
        if self.queue_depth() == 0:
            return 0
        r = self.req
        return int(sum(int(r.prompt[i] + r.generated[i]) for _, i in self.queue.heap))

    def active_prompt_blocks(self) -> int:
        """KV blocks (``kv_block_tokens``) of the prompts of the requests admitted or
        waiting here: what a router that counts the blocks it sent sees."""
        prompt, block = self.req.prompt, self.spec.kv_block_tokens
        waiting = [i for _, i in self.queue.heap] if self.queue_depth() else []
        return sum(-(-int(prompt[i]) // block) for i in [*self.running, *waiting])

    def prefix_match(self, i: int) -> int:
        """Leading prompt blocks of request ``i`` in this replica's prefix cache (what
        its KV events tell a router)."""
        if not self.spec.prefix_cache_blocks:
            return 0
        n = 0
        for block in self.req.hash_ids[i]:
            if block not in self.prefix:
                break
            n += 1
        return n


# --------------------------------------------------------------------------- the fleet


def check_fleet(replica, replicas, router: str, policy: str) -> int:
    """Validate a fleet description; returns the replica count (raises ValueError)."""
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    n = _check.whole("replicas", replicas)
    check_router(router)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return n


def simulate(requests: pd.DataFrame, replica: Replica | None = None, *, replicas: int = 1,
             router: str = DEFAULT_ROUTER, policy: str = "fcfs", seed=None,
             until_s: float | None = None, step_log: bool = False,
             affinity_bound: float = 1.25, router_options: dict | None = None):
    """Replay ``requests`` through ``replicas`` copies of ``replica``.

    Parameters
    ----------
    requests : pandas.DataFrame
        One row per request: ``arrival_s`` (s), ``prompt_tokens``, ``output_tokens``;
        optional ``predicted_output_tokens`` (SJF/SRPT key, ``expected`` reservation),
        ``max_output_tokens`` (``max`` reservation), ``priority`` (lower first),
        ``deadline_s`` (EDF key and shedding time), ``hash_ids`` (prefix cache).
    replica : Replica
        The replica model (default: the book's locked replica).
    replicas : int
        Number of identical replicas.
    router : str
        How arrivals are assigned to replicas (:mod:`servingcap.routers`; ties go to the
        lowest index unless said). Realistic routers read only what a gateway sees:
        queue depth, running requests, free slots, KV tokens in use and prefix matches.

        * ``"jsq"`` (default): a replica with a free slot first (the most free
          slots), else the shortest waiting queue.
        * ``"least_requests"``: the fewest outstanding requests (waiting + admitted).
          With equal output lengths it synchronizes a fleet: requests admitted
          together finish together, the emptied replica takes every new arrival until
          its count catches up, and those prompts are prefilled together.
        * ``"endpoint_picker"``: the Gateway API Inference Extension's weighted score
          (queue 2, KV 2, prefix 3; ``router_options``: ``queue_weight``,
          ``kv_weight``, ``prefix_weight``), ties at random (``seed``).
        * ``"cache_aware"``: SGLang's rule (``balance_abs`` 64, ``balance_rel`` 1.5,
          ``cache_threshold`` 0.3).
        * ``"kv_cost"``: Dynamo's cost ``overlap_weight`` x prefill blocks + decode
          blocks, lowest wins (``temperature`` 0).
        * ``"power_of_two"``: two distinct replicas drawn at random (``seed``), the one
          with fewer outstanding requests wins (Mitzenmacher's power of two choices).
        * ``"affinity"``: prefix affinity on the request's ``hash_ids`` (the longest
          run of leading blocks the router sent there) with bounded load (consistent
          hashing with bounded loads): no replica takes a request once its outstanding
          requests reach ``ceil(affinity_bound * (total + 1) / replicas)``; without a
          match, a ring keyed by ``session_id`` (else the row).
        * ``"random"`` (``seed``), ``"round_robin"``.
        * Bounds, not routers: ``"pooled"``, one queue shared by all replicas (a perfect
          balancer), and ``"oracle_work"``, the least outstanding *work* in tokens
          counted with every output length known in advance (what ``least_loaded``
          was; that name now raises ValueError).
    policy : {"fcfs", "sjf", "srpt", "edf", "priority"}
        Order of each waiting queue.
    seed : int, optional
        Seed for the ``random`` and ``power_of_two`` routers.
    until_s : float, optional
        Stop at this time; requests not finished by then are ``unfinished``.
    step_log : bool
        Also return a per-step DataFrame (start time, replica, duration, decode batch,
        prefill tokens, running, waiting, KV tokens in use).
    affinity_bound : float
        Load bound ``c >= 1`` of the ``affinity`` router: no replica takes more than
        ``c`` times the mean outstanding requests (1.25 by default).
    router_options : dict, optional
        Parameters of the ``endpoint_picker``, ``cache_aware`` and ``kv_cost`` routers
        (:data:`servingcap.routers.OPTIONS` lists them with their defaults).

    Returns
    -------
    pandas.DataFrame, or (DataFrame, DataFrame) with ``step_log=True``
        One row per request, in input order: ``arrival_s, prompt_tokens,
        output_tokens, replica, admitted_s, first_token_s, finish_s, ttft_s, tpot_s,
        max_gap_s, e2e_s, outcome, preemptions, cached_tokens`` (times in s; NaN where
        the event did not happen, e.g. the first token of a rejected request). A
        ``timed_out`` row has ``first_token_s`` set when the request was preempted after
        its first token and then timed out waiting to be readmitted.

    Raises
    ------
    ValueError
        For bad input, naming it: a missing or non-numeric column (dates, booleans,
        text), NaN or infinite values, malformed ``hash_ids``, an unknown router or
        policy, a ``seed`` numpy cannot use, a non-boolean ``step_log``, or a cost
        model that returns NaN, infinity or a time <= 0 for a step (the message gives
        the step's composition).
    """
    replica = Replica() if replica is None else replica
    n_rep = check_fleet(replica, replicas, router, policy)
    seed = _check_seed(seed)
    _flag("step_log", step_log)
    horizon = math.inf if until_s is None else _check.positive("until_s", until_s)
    req = _Requests(requests, replica, policy)
    if replica.kv_capacity_tokens is not None and req.n:
        longest = -(-(req.prompt + np.maximum(req.output, req.reserve)) // replica.kv_block_tokens)
        limit = replica.kv_capacity_tokens // replica.kv_block_tokens
        if longest.max() > limit:
            i = int(longest.argmax())
            raise ValueError(
                f"request {i} needs {int(longest[i])} KV blocks at full length (prompt "
                f"{req.prompt[i]} + output {req.output[i]} tokens) but kv_capacity_tokens="
                f"{replica.kv_capacity_tokens} holds {limit} blocks of {replica.kv_block_tokens}")
    order = np.argsort(req.arrival, kind="stable")
    rng = np.random.default_rng(seed)
    steps: list | None = [] if step_log else None

    from . import _fast_engine  # here, not at the top: it subclasses _Engine

    shared = _Queue() if router == "pooled" else None
    fast = _FAST_PATH and _fast_engine.usable(replica, step_log, horizon)
    lists = _fast_engine.Shared(req, horizon) if fast else None
    engines = []
    for k in range(n_rep):
        queue = shared if shared is not None else _Queue()
        engine = (_fast_engine.engine(k, replica, req, queue, policy, lists) if fast
                  else _Engine(k, replica, req, queue, policy, steps))
        queue.replicas.append(engine)
        engines.append(engine)
    route = Router(router, engines, req, rng, affinity_bound, router_options)
    touched: list[_Queue] = []                          # queues fed since the last wake-up
    times, rows, prompts = req.arrival[order].tolist(), order.tolist(), req.prompt.tolist()
    longest = min(math.inf if replica.max_prompt_tokens is None else replica.max_prompt_tokens,
                  replica.token_cap() if replica.mode == "prefill_first" else math.inf)
    capped = replica.max_queue is not None
    # next step end of every replica: a heap of (busy_until, index), refreshed after each
    # call that moves a replica's busy_until; an entry is stale once the replica's
    # busy_until differs from it (O(log replicas) per event, ties to the lowest index).
    # One replica needs no heap; routers without a key heap need no update (hot loop).
    ends = [(e.busy_until, e.index) for e in engines]
    heapq.heapify(ends)
    heaped, indexed = n_rep > 1, route.heap is not None
    a, n_req, inf = 0, req.n, math.inf
    times.append(inf)                                   # (arrival times are finite)
    bounded = horizon != inf
    engine = engines[0]
    heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
    pick = route.pick

    while True:
        if heaped:
            top = ends[0]
            engine = engines[top[1]]
            while engine.busy_until != top[0]:
                heappop(ends)
                top = ends[0]
                engine = engines[top[1]]
        now = engine.busy_until
        t_arrival = times[a]
        if bounded and min(t_arrival, now) > horizon:
            break
        if t_arrival <= now and a < n_req:
            i = rows[a]
            a += 1
            target = pick(i)
            queue = target.queue
            # requests that will wait for a slot: the queue beyond the free slots it feeds
            if prompts[i] > longest or (capped and (
                    len(queue.heap) - sum(replica.max_batch - len(e.running)
                                          for e in queue.replicas)
                    >= replica.queue_cap(req.priority[i]))):
                req.outcome[i], req.finish[i], req.replica[i] = "rejected", t_arrival, target.index
            else:
                target.enqueue(i)
                if indexed:
                    route.update(target)
                if queue not in touched:
                    touched.append(queue)
            if times[a] == t_arrival:
                continue                                # simultaneous arrivals join one step
            for q in touched:
                for server in q.replicas:
                    busy = server.busy_until
                    if busy == inf:
                        server.plan(t_arrival)          # wake an idle replica
                        if indexed:
                            route.update(server)
                    else:
                        server.cut(t_arrival)           # or let it admit at its next boundary
                    if heaped and server.busy_until != busy:   # (else: still there)
                        heappush(ends, (server.busy_until, server.index))
            touched.clear()
            continue
        if now == inf:
            break                                   # every replica idle, no arrivals left
        engine.finish_step()
        engine.plan(now)
        if indexed:
            route.update(engine)
        if heaped:                                  # (its entry is the top: replace it)
            heapreplace(ends, (engine.busy_until, engine.index))
    if fast:
        for engine in engines:
            engine.settle()                 # write out the lazily counted decode state
    return _result(requests, req, steps)


def _result(frame: pd.DataFrame, req: _Requests, steps):
    ttft = req.first - req.arrival
    done = req.outcome == "done"
    decode_tokens = req.output - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(done & (decode_tokens > 0), (req.finish - req.first) / decode_tokens, np.nan)
    e2e = np.where(done, req.finish - req.arrival, np.nan)
    out = pd.DataFrame({
        "arrival_s": req.arrival,
        "prompt_tokens": req.prompt,
        "output_tokens": req.output,
        "replica": req.replica,
        "admitted_s": req.admitted,
        "first_token_s": req.first,
        "finish_s": req.finish,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "max_gap_s": np.where(req.generated > 1, req.max_gap, np.nan),
        "e2e_s": e2e,
        "outcome": pd.Categorical(req.outcome, categories=list(OUTCOMES)),
        "preemptions": req.preemptions,
        "cached_tokens": req.cached,
    }, index=frame.index)
    if steps is None:
        return out
    columns = ["start_s", "replica", "duration_s", "decode_batch", "prefill_tokens",
               "running", "waiting", "kv_tokens"]
    if not steps:                                   # nothing ran: an empty log, typed
        return out, pd.DataFrame({c: pd.Series(dtype=float if c.endswith("_s") else np.int64)
                                  for c in columns})
    raw = pd.DataFrame(steps, columns=columns + ["repeat"])
    log = raw.loc[raw.index.repeat(raw["repeat"]), columns].reset_index(drop=True)
    nth = raw["repeat"].to_numpy()
    offset = np.arange(nth.sum()) - np.repeat(np.cumsum(nth) - nth, nth)
    log["start_s"] = log["start_s"].to_numpy() + offset * log["duration_s"].to_numpy()
    log["kv_tokens"] = np.concatenate(raw["kv_tokens"].to_list()).astype(np.int64)
    log = log.sort_values(["start_s", "replica"], kind="stable").reset_index(drop=True)
    return out, log
