"""The book's locked worked-example parameters, in one frozen dataclass.

Every chapter starts from :data:`LOCKED`, so all worked numbers agree. To re-run the book
with your own fleet, change the numbers here once, or in a chapter's ``parameters``
cell with ``LOCKED.replace(prefill_rate=12_000)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import _check

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

    def __post_init__(self):
        for name in ("prefill_rate", "decode_step_s", "ttft_slo_s", "tpot_slo_s"):
            _check.positive(name, getattr(self, name))
        for name in ("decode_batch", "prompt_tokens", "long_prompt_tokens", "output_tokens"):
            _check.whole(name, getattr(self, name))

    def replace(self, **changes) -> ServingParams:
        """A copy with some fields changed, validated like the original."""
        return dataclasses.replace(self, **changes)

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
