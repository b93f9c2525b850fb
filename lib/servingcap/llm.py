"""Phase arithmetic of one LLM request: prefill, decode, and how they collide.

A request has two phases. *Prefill* reads the whole prompt in one (or a few) batched
forward passes and produces the first token; *decode* then emits one token per engine
step. The book's timing identities, in seconds:

    TTFT = t_queue + t_prefill,        t_prefill = prompt_tokens / prefill_rate
    E2E  = TTFT + (output_tokens - 1) * TPOT

When a prefill shares an engine step with running decodes, that step takes
``t_decode + prompt_tokens / prefill_rate``: every decoding sequence waits that long
for its next token (the *interference stall*). Chunked prefill caps the prefill tokens
per step at ``C_max = (tpot_slo - t_decode) * prefill_rate`` so each step stays inside
the TPOT budget, at the price of a longer TTFT for the chunked request.

That additive step is the seed essay's *conservative floor*, and what a prefill-first
engine pays over two steps. Engines that mix decodes and a chunk in one step (vLLM V1,
SGLang, Sarathi-Serve, TensorRT-LLM, Orca) run **one fused forward pass** over all the
step's tokens, priced by op group ({func}`fused_step_s`):

* the matmul-like (linear) ops see the step's *total* tokens ``n = B + C`` and read the
  weights once: ``linear(n) = max(w, n / prefill_rate)``, where ``w`` is the weight-read
  time (the decode curve at batch 0). Below the ridge ``n* = w * prefill_rate`` a chunk
  rides along almost free; above it each token costs its FLOPs.
* the per-sequence part of a decode step (attention over each sequence's KV cache, a
  memory-bound read that does not overlap a compute-bound GEMM) is what the measured
  decode curve has on top of its linear ops: ``a(B) = t(B) - linear(B)``.

So ``step(B, C) = a(B) + linear(B + C)``: exactly ``t(B)`` for a pure decode step and
``max(w, C / prefill_rate)`` for a prefill-only one.

Units: tokens, tokens/s, seconds. Every function validates its inputs and raises a
``ValueError`` naming the bad parameter.
"""

from __future__ import annotations

import math

import numpy as np

from . import _check

__all__ = [
    "prefill_s", "ttft_s", "e2e_s", "stalled_step_s", "amortized_stall_s",
    "max_chunk_tokens", "chunk_count", "chunked_ttft_s", "decode_step_time",
    "linear_s", "fused_step_s", "fused_token_budget", "fused_chunked_ttft_s",
    "overlapped_token_budget",
]


@_check.guarded
def prefill_s(prompt_tokens: float, prefill_rate: float) -> float:
    """Unqueued prefill time (s) of a prompt: ``prompt_tokens / prefill_rate``.

    Parameters
    ----------
    prompt_tokens : float
        Prompt length (tokens), >= 0.
    prefill_rate : float
        Prompt tokens the replica processes per second (tokens/s), > 0.

    Example: 2,000 tokens at 8,000 tokens/s take 0.25 s.
    """
    p = _check.nonnegative("prompt_tokens", prompt_tokens)
    rate = _check.positive("prefill_rate", prefill_rate)
    return p / rate


@_check.guarded
def ttft_s(prompt_tokens: float, prefill_rate: float, queue_s: float = 0.0) -> float:
    """Time to first token (s): queueing delay plus unqueued prefill.

    ``TTFT = queue_s + prompt_tokens / prefill_rate``. ``queue_s`` (s, >= 0) is the time
    the request waits before its prefill starts.
    """
    q = _check.nonnegative("queue_s", queue_s)
    return q + prefill_s(prompt_tokens, prefill_rate)


@_check.guarded
def e2e_s(ttft_s: float, output_tokens: int, tpot_s: float) -> float:
    """End-to-end latency (s): ``ttft_s + (output_tokens - 1) * tpot_s``.

    Parameters
    ----------
    ttft_s : float
        Time to first token (s), >= 0.
    output_tokens : int
        Tokens generated, >= 1 (the first one arrives at TTFT).
    tpot_s : float
        Mean time per output token after the first (s), >= 0.

    Example: 0.25 s + 299 x 0.030 s = 9.22 s.
    """
    t = _check.nonnegative("ttft_s", ttft_s)
    n = _check.whole("output_tokens", output_tokens, minimum=1)
    tpot = _check.nonnegative("tpot_s", tpot_s)
    return t + (n - 1) * tpot


@_check.guarded
def stalled_step_s(prompt_tokens: float, prefill_rate: float, decode_step_s: float) -> float:
    """Duration (s) of one engine step that runs a whole prefill next to the decodes.

    ``decode_step_s + prompt_tokens / prefill_rate`` (the additive cost model). Every
    sequence decoding in that step sees this as its inter-token gap. Example: a
    4,000-token prompt at 8,000 tokens/s on a 0.030 s decode step gives 0.530 s.
    """
    t_dec = _check.positive("decode_step_s", decode_step_s)
    return t_dec + prefill_s(prompt_tokens, prefill_rate)


@_check.guarded
def amortized_stall_s(prompt_tokens: float, prefill_rate: float, output_tokens: int) -> float:
    """How much one unchunked prefill raises a victim's *mean* TPOT (s).

    The stall ``prompt_tokens / prefill_rate`` spread over the victim's
    ``output_tokens`` steps. Example: 0.5 s over 300 tokens is 1.7 ms, which is why the
    stall hides from the mean and shows up only in the tail.
    """
    n = _check.whole("output_tokens", output_tokens, minimum=1)
    return prefill_s(prompt_tokens, prefill_rate) / n


@_check.guarded
def max_chunk_tokens(tpot_slo_s: float, decode_step_s: float, prefill_rate: float) -> int:
    """Largest prefill chunk (tokens) that keeps a mixed step within the TPOT budget.

    ``C_max = floor((tpot_slo_s - decode_step_s) * prefill_rate)``. Example:
    (0.050 - 0.030) s x 8,000 tokens/s = 160 tokens. Raises ``ValueError`` when the
    decode step alone already uses the whole budget (``decode_step_s >= tpot_slo_s``).
    """
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    t_dec = _check.positive("decode_step_s", decode_step_s)
    rate = _check.positive("prefill_rate", prefill_rate)
    if t_dec >= slo:
        raise ValueError(
            f"decode_step_s must be < tpot_slo_s to leave room for prefill, got "
            f"decode_step_s={t_dec!r} >= tpot_slo_s={slo!r}"
        )
    budget = (slo - t_dec) * rate
    return int(math.floor(budget + 1e-9 * max(budget, 1.0)))  # tolerate round-off


@_check.guarded
def chunk_count(prompt_tokens: float, chunk_tokens: float) -> int:
    """Number of engine steps (chunks) a prompt needs: ``ceil(prompt_tokens / chunk_tokens)``."""
    p = _check.nonnegative("prompt_tokens", prompt_tokens)
    c = _check.positive("chunk_tokens", chunk_tokens)
    ratio = p / c
    return int(math.ceil(ratio - 1e-9 * max(ratio, 1.0)))


@_check.guarded
def chunked_ttft_s(prompt_tokens: float, chunk_tokens: float, prefill_rate: float,
                   decode_step_s: float, queue_s: float = 0.0) -> float:
    """TTFT (s) of a prompt prefilled in chunks, each riding a decode step.

    Each of the ``ceil(P / C)`` steps costs ``decode_step_s`` plus its chunk's prefill,
    so ``TTFT = queue_s + ceil(P / C) * decode_step_s + P / prefill_rate``. Example:
    4,000 tokens in 160-token chunks: 25 x 0.030 + 0.5 = 1.25 s (each full step 50 ms).
    """
    steps = chunk_count(prompt_tokens, chunk_tokens)
    t_dec = _check.positive("decode_step_s", decode_step_s)
    return ttft_s(prompt_tokens, prefill_rate, queue_s) + steps * t_dec


@_check.guarded
def decode_step_time(batch, measured) -> np.ndarray | float:
    """Decode step time (s) at ``batch`` sequences, interpolated from measurements.

    Parameters
    ----------
    batch : float or array of float
        Decode batch size(s) (sequences), > 0.
    measured : mapping {batch: seconds}
        At least one measured point. Between points the step time is linear in batch;
        outside them it is extrapolated linearly from the two nearest points (held
        constant when only one point is given).

    Returns a float for a scalar ``batch``, else an array (s).
    """
    if not hasattr(measured, "items") or len(measured) == 0:
        raise ValueError(
            f"measured must be a non-empty mapping {{batch: seconds}}, got {measured!r}"
        )
    pts = sorted((_check.positive("measured batch", b), _check.positive("measured seconds", s))
                 for b, s in measured.items())
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    scalar = np.ndim(batch) == 0
    b = _check.array("batch", np.atleast_1d(batch))
    if (b <= 0).any():
        i = int(np.argmax(b <= 0))
        raise ValueError(f"batch must be > 0, got {b[i]!r} at index {i}")
    if xs.size == 1:
        out = np.full_like(b, ys[0])
    else:
        out = np.interp(b, xs, ys)
        lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(b < xs[0], ys[0] + lo_slope * (b - xs[0]), out)
        out = np.where(b > xs[-1], ys[-1] + hi_slope * (b - xs[-1]), out)
        out = np.maximum(out, 0.0)
    return float(out[0]) if scalar else out


@_check.guarded
def linear_s(tokens: float, weight_read_s: float, prefill_rate: float) -> float:
    """Time (s) of a step's linear (matmul-like) ops over ``tokens`` tokens, fused.

    ``max(weight_read_s, tokens / prefill_rate)``: the weights are read once per step
    (memory-bound below the ridge ``weight_read_s * prefill_rate`` tokens), and past the
    ridge every token costs its FLOPs at the prefill rate (tokens/s).
    """
    n = _check.nonnegative("tokens", tokens)
    w = _check.positive("weight_read_s", weight_read_s)
    rate = _check.positive("prefill_rate", prefill_rate)
    return max(w, n / rate)


@_check.guarded
def fused_step_s(decode_batch: int, prefill_tokens: float, decode_step_s: float,
                 weight_read_s: float, prefill_rate: float) -> float:
    """Duration (s) of one fused forward pass over ``decode_batch`` decoding sequences
    and ``prefill_tokens`` chunk tokens (the book's default step cost).

    ``a(B) + linear(B + C)`` with ``a(B) = max(decode_step_s - linear(B), 0)`` the
    per-sequence (attention) part of the measured decode step ``decode_step_s`` = t(B),
    and ``linear`` as in :func:`linear_s`. ``a(0) = 0``. Example (locked numbers,
    ``w`` = 10 ms, t(32) = 30 ms, 8,000 tokens/s): 32 decodes plus a 208-token chunk
    take 20 ms + 240 / 8,000 s = 50 ms; the additive step would take 56 ms.
    """
    b = _check.whole("decode_batch", decode_batch, minimum=0)
    c = _check.nonnegative("prefill_tokens", prefill_tokens)
    w = _check.positive("weight_read_s", weight_read_s)
    rate = _check.positive("prefill_rate", prefill_rate)
    t_dec = _check.nonnegative("decode_step_s", decode_step_s)
    if b > 0 and t_dec <= 0:
        raise ValueError(f"decode_step_s must be > 0 for decode_batch={b}, got {t_dec!r}")
    attention = max(t_dec - max(w, b / rate), 0.0) if b else 0.0
    return attention + max(w, (b + c) / rate)


@_check.guarded
def fused_token_budget(tpot_slo_s: float, decode_step_s: float, weight_read_s: float,
                       prefill_rate: float, decode_batch: int) -> int:
    """Largest step (tokens: decodes plus chunk) whose fused pass fits the TPOT budget.

    With ``B`` decodes at step time ``t(B) = decode_step_s`` the step may hold
    ``T = floor((tpot_slo_s - a(B)) * prefill_rate)`` tokens, ``a(B)`` the decode step's
    per-sequence part (see :func:`fused_step_s`); the largest chunk is ``T - B``.
    Example: (50 - 20) ms x 8,000 tokens/s = 240 tokens, a 208-token chunk beside 32
    decodes (the additive floor allows 160). This is the token budget vLLM V1 calls
    ``--max-num-batched-tokens`` and SGLang ``--chunked-prefill-size``.
    Raises ``ValueError`` when the decode step alone fills the budget.
    """
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    b = _check.whole("decode_batch", decode_batch)
    w = _check.positive("weight_read_s", weight_read_s)
    rate = _check.positive("prefill_rate", prefill_rate)
    t_dec = _check.positive("decode_step_s", decode_step_s)
    attention = max(t_dec - max(w, b / rate), 0.0)
    room = slo - attention
    if room < max(w, b / rate) or t_dec >= slo:
        raise ValueError(
            f"decode_step_s={t_dec!r} at decode_batch={b} (weight_read_s={w!r}, "
            f"prefill_rate={rate!r}) leaves no room for a prefill chunk within "
            f"tpot_slo_s={slo!r}")
    budget = room * rate
    return int(math.floor(budget + 1e-9 * max(budget, 1.0)))


@_check.guarded
def overlapped_token_budget(tpot_slo_s: float, decode_step_s: float, prefill_rate: float,
                            decode_batch: int) -> int:
    """Token budget (decodes plus chunk) if the decode step hid entirely under the
    chunk's compute, ``max(t(B), (B + C) / prefill_rate) <= tpot_slo_s``: an
    *optimistic* bound (a decode's KV reads do not really overlap a compute-bound GEMM).
    Example: 50 ms x 8,000 tokens/s = 400 tokens, a 368-token chunk beside 32 decodes.
    """
    slo = _check.positive("tpot_slo_s", tpot_slo_s)
    b = _check.whole("decode_batch", decode_batch)
    rate = _check.positive("prefill_rate", prefill_rate)
    t_dec = _check.positive("decode_step_s", decode_step_s)
    if t_dec >= slo:
        raise ValueError(f"decode_step_s must be < tpot_slo_s, got decode_step_s={t_dec!r} "
                         f">= tpot_slo_s={slo!r}")
    budget = slo * rate
    return max(int(math.floor(budget + 1e-9 * max(budget, 1.0))), b)


@_check.guarded
def fused_chunked_ttft_s(prompt_tokens: float, token_budget: int, decode_batch: int,
                         decode_step_s: float, weight_read_s: float, prefill_rate: float,
                         queue_s: float = 0.0) -> float:
    """TTFT (s) of a prompt prefilled in chunks beside ``decode_batch`` decodes, each
    step one fused pass holding at most ``token_budget`` tokens (vLLM V1's mixed steps).

    Every step gives the chunk ``token_budget - decode_batch`` tokens (the last one what
    is left), and costs :func:`fused_step_s`. Example: 4,000 tokens at a 240-token
    budget beside 32 decodes: 19 steps of 50 ms and a 48-token last step of 30 ms,
    0.98 s.
    """
    p = _check.whole("prompt_tokens", prompt_tokens)
    budget = _check.whole("token_budget", token_budget)
    b = _check.whole("decode_batch", decode_batch, minimum=0)
    if budget <= b:
        raise ValueError(f"token_budget must exceed decode_batch to leave room for a chunk, "
                         f"got token_budget={budget!r} <= decode_batch={b!r}")
    q = _check.nonnegative("queue_s", queue_s)
    chunk = budget - b
    full, last = divmod(p, chunk)
    total = full * fused_step_s(b, chunk, decode_step_s, weight_read_s, prefill_rate)
    if last:
        total += fused_step_s(b, last, decode_step_s, weight_read_s, prefill_rate)
    return q + total
