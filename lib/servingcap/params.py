"""The book's locked worked-example parameters, in one frozen dataclass.

Every chapter starts from :data:`LOCKED`, so all worked numbers agree. To re-run the book
with your own fleet, change the numbers here once, or in a chapter's ``parameters``
cell with ``LOCKED.replace(prefill_rate=12_000)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import _check
from .llm import decode_step_time, fused_token_budget

__all__ = ["ServingParams", "LOCKED"]


@dataclass(frozen=True)
class ServingParams:
    """One replica's speeds, a typical request, and the SLOs (seconds, tokens, tokens/s)."""

    prefill_rate: float = 8_000.0
    """Prompt tokens one replica prefills per second (tokens/s)."""
    decode_step_s: float = 0.030
    """Duration of one decode step at ``decode_batch`` sequences (s)."""
    decode_batch: int = 32
    """Batch size at which ``decode_step_s`` was measured (sequences); slots per replica."""
    prompt_tokens: int = 2_000
    """A typical prompt (tokens)."""
    long_prompt_tokens: int = 4_000
    """A long-tail prompt (tokens)."""
    output_tokens: int = 300
    """A typical response length (tokens)."""
    ttft_slo_s: float = 1.0
    """Time-to-first-token objective, p99 (s)."""
    tpot_slo_s: float = 0.050
    """Time-per-output-token objective, p99 (s)."""
    decode_curve: tuple[tuple[float, float], ...] = ((16, 0.020), (32, 0.030), (64, 0.055))
    """The decode step-time curve's measured points, ((batch, s), ...): the book's one
    batch curve (chapter "Two SLOs" derives t(B) = 10 + 0.625 B ms from the first two).
    Only its shape is used: :attr:`decode_step_table` scales it to pass through
    (``decode_batch``, ``decode_step_s``), so changing ``decode_step_s`` moves the curve."""

    def __post_init__(self):
        for name in ("prefill_rate", "decode_step_s", "ttft_slo_s", "tpot_slo_s"):
            _check.positive(name, getattr(self, name))
        for name in ("decode_batch", "prompt_tokens", "long_prompt_tokens", "output_tokens"):
            _check.whole(name, getattr(self, name))
        try:
            points = dict(self.decode_curve)
        except (TypeError, ValueError):
            raise ValueError("decode_curve must be ((batch, seconds), ...), got "
                             f"{self.decode_curve!r}") from None
        if len(points) < 2:
            raise ValueError(f"decode_curve needs at least two points, got {self.decode_curve!r}")
        for batch, seconds in points.items():
            _check.positive("decode_curve batch", batch)
            _check.positive(f"decode_curve seconds at batch {batch}", seconds)

    def replace(self, **changes) -> ServingParams:
        """A copy with some fields changed, validated like the original."""
        return dataclasses.replace(self, **changes)

    @property
    def decode_step_table(self) -> dict[float, float]:
        """Decode step time (s) by batch (sequences), for ``Replica(decode_step_s=...)``.

        The points of :attr:`decode_curve` plus batch 1 (extrapolated along the line
        through the two smallest points, as :func:`servingcap.llm.decode_step_time`
        does), all scaled by ``decode_step_s / curve(decode_batch)`` so that the table
        gives ``decode_step_s`` at ``decode_batch``. For the locked set the scale is 1.
        """
        points = dict(self.decode_curve)
        scale = self.decode_step_s / decode_step_time(self.decode_batch, points)
        table = {1: decode_step_time(1, points), **points}
        return {b: scale * t for b, t in sorted(table.items())}

    def decode_step_at(self, batch) -> float:
        """Decode step time (s) at ``batch`` sequences on :attr:`decode_step_table`, read
        as the simulator reads a table (``servingcap.serving._table_step_s``: linear
        between points, extended along the last segment past the largest batch)."""
        from .serving import _table_step_s

        b = _check.positive("batch", batch)
        table = self.decode_step_table
        return _table_step_s(b, np.array(list(table), dtype=float),
                            np.array(list(table.values()), dtype=float))

    @property
    def weight_read_s(self) -> float:
        """Fixed part of every step (s): the decode curve extended to batch 0 along the
        line through its two smallest points (10 ms for the locked curve), read as the
        time to stream the weights once. Below ``weight_read_s * prefill_rate`` tokens
        a fused step's linear ops are memory-bound (see :func:`servingcap.llm.fused_step_s`)."""
        points = dict(self.decode_curve)
        scale = self.decode_step_s / decode_step_time(self.decode_batch, points)
        (b0, t0), (b1, t1) = sorted(points.items())[:2]
        intercept = scale * (t0 - (t1 - t0) / (b1 - b0) * b0)
        return float(min(max(intercept, 1e-6), scale * t0))

    @property
    def ridge_tokens(self) -> float:
        """Tokens per step at which a fused step's linear ops turn compute-bound
        (``weight_read_s * prefill_rate``: 80 for the locked numbers)."""
        return self.weight_read_s * self.prefill_rate

    @property
    def token_budget(self) -> int:
        """Tokens per step (decodes plus prefill chunk) whose fused pass keeps a full
        batch (``decode_batch`` decodes) inside the TPOT objective: the default
        ``max_batched_tokens`` of the book's replica (240 for the locked numbers,
        :func:`servingcap.llm.fused_token_budget`)."""
        return fused_token_budget(self.tpot_slo_s, self.decode_step_s, self.weight_read_s,
                                  self.prefill_rate, self.decode_batch)

    @property
    def prefill_s(self) -> float:
        """Unqueued prefill time of the typical prompt (s): prompt / prefill rate."""
        return self.prompt_tokens / self.prefill_rate

    @property
    def e2e_s(self) -> float:
        """Unqueued end-to-end time of the typical request (s): TTFT + (N - 1) TPOT."""
        return self.prefill_s + (self.output_tokens - 1) * self.decode_step_s

    @property
    def hold_s(self) -> float:
        """Time a request holds a batch slot (s): prefill + N decode steps."""
        return self.prefill_s + self.output_tokens * self.decode_step_s


LOCKED = ServingParams()
"""The locked parameter set every worked example in the book uses."""
