"""Step-time cost models for the serving simulator, and a fitter for your own measurements.

The book's default cost (``Replica``'s) is ``decode(batch) + prefill_tokens / prefill_rate``.
Real engines are better described by the fitted form DistServe uses {Zhong et al. 2024}:

* prefill of a batch of prompts:  ``a_p + b_p * sum(L) + c_p * sum(L^2)``
  (the linear term is the GEMMs, the quadratic one attention);
* decode step:  ``a_d + b_d * sum(context) + c_d * batch``
  (KV reads grow with total context, the rest with the batch).

With chunked prefill a chunk of ``n`` tokens whose first ``k`` context tokens are already
cached does the attention work ``(k + n)^2 - k^2`` (the rows it adds to the triangle), so
``sum(L^2)`` generalizes to ``sum(n * (n + 2k))`` and an unchunked prompt (``k = 0``)
recovers ``L^2`` exactly. A mixed step costs the prefill part plus the decode part
(additive: a conservative upper bound, as in the book's chapters).

:func:`fit` turns measured points into such a model: prefill points as
(prompt tokens, seconds), decode points as (batch, total context tokens, seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize

from . import _check
from .serving import StepDetail

__all__ = ["PhaseCost", "fit"]


@dataclass(frozen=True)
class PhaseCost:
    """DistServe-form step cost (seconds); use as ``Replica(step_time=PhaseCost(...))``.

    Parameters
    ----------
    prefill : (a, b, c)
        Seconds, seconds per token, seconds per token^2 for a prefill batch.
    decode : (a, b, c)
        Seconds, seconds per context token, seconds per sequence for a decode step.
    """

    prefill: tuple[float, float, float]
    decode: tuple[float, float, float]
    wants_detail = True          # the simulator passes a StepDetail

    def __post_init__(self):
        for phase in ("prefill", "decode"):
            with _check.naming(phase):
                terms = tuple(getattr(self, phase))
            if len(terms) != 3:
                raise ValueError(f"{phase} must be three coefficients (a, b, c), got {terms!r}")
            clean = tuple(_check.nonnegative(f"{phase}[{i}]", t) for i, t in enumerate(terms))
            object.__setattr__(self, phase, clean)

    @_check.guarded
    def prefill_s(self, chunks, cached=None) -> float:
        """Time of a prefill batch (s): chunk lengths (tokens) with cached context before each."""
        n = _check.array("chunks", chunks, nonnegative_values=True)
        k = None if cached is None else _check.array("cached", cached, nonnegative_values=True)
        if k is not None and k.shape != n.shape:
            raise ValueError(f"cached must have one entry per element of chunks, got {k.size} "
                             f"for {n.size}")
        return self._prefill_s(n, k)

    def _prefill_s(self, n: np.ndarray, k: np.ndarray | None) -> float:
        if n.size == 0:
            return 0.0
        k = np.zeros_like(n) if k is None else k
        a, b, c = self.prefill
        return float(a + b * n.sum() + c * (n * (n + 2 * k)).sum())

    @_check.guarded
    def decode_s(self, context) -> float:
        """Time of a decode step (s) over sequences with these context lengths (tokens)."""
        return self._decode_s(_check.array("context", context, nonnegative_values=True))

    def _decode_s(self, ctx: np.ndarray) -> float:
        if ctx.size == 0:
            return 0.0
        a, b, c = self.decode
        return float(a + b * ctx.sum() + c * ctx.size)

    def __call__(self, detail: StepDetail) -> float:
        if not isinstance(detail, StepDetail):
            raise TypeError(f"detail must be a StepDetail (build one with roofline.step), "
                            f"got {detail!r}")
        # the engine's (and roofline.step's) arrays are already finite and >= 0
        return (self._prefill_s(np.asarray(detail.prefill_chunks, dtype=float),
                                np.asarray(detail.prefill_cached, dtype=float))
                + self._decode_s(np.asarray(detail.decode_context, dtype=float)))


def _nonnegative_fit(design: np.ndarray, seconds: np.ndarray, what: str) -> tuple:
    if design.shape[0] < 3:
        raise ValueError(f"{what} needs at least 3 measured points, got {design.shape[0]}")
    if (seconds <= 0).any():
        raise ValueError(f"{what} must have measured seconds > 0, got {seconds.tolist()!r}")
    # Relative residuals: timing noise is roughly proportional to the time measured, so
    # each point is weighted by 1 / seconds (short steps count as much as long ones).
    weighted = design / seconds[:, None]
    # Scale columns so the tiny per-token coefficients are not lost to conditioning.
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = optimize.nnls(weighted / scale, np.ones_like(seconds))
    return tuple(float(x) for x in coef / scale)


def fit(prefill_points, decode_points) -> PhaseCost:
    """Fit a :class:`PhaseCost` to measurements by non-negative least squares on
    relative error (each point weighted by 1 / its measured seconds).

    Parameters
    ----------
    prefill_points : sequence of (prompt_tokens, seconds)
        Time to prefill one prompt of that length alone.
    decode_points : sequence of (batch, context_tokens, seconds)
        Time of one decode step with ``batch`` sequences holding ``context_tokens`` in total.
    """
    with _check.naming("prefill_points"):
        p = np.asarray(prefill_points, dtype=float)
    with _check.naming("decode_points"):
        d = np.asarray(decode_points, dtype=float)
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"prefill_points must be rows of (prompt_tokens, seconds), got shape {p.shape}")
    if d.ndim != 2 or d.shape[1] != 3:
        raise ValueError("decode_points must be rows of (batch, context_tokens, seconds), "
                         f"got shape {d.shape}")
    for name, arr in (("prefill_points", p), ("decode_points", d)):
        if not np.isfinite(arr).all() or (arr < 0).any():
            raise ValueError(f"{name} must be finite and >= 0, got {arr.tolist()!r}")
    length, seconds = p[:, 0], p[:, 1]
    prefill = _nonnegative_fit(np.column_stack([np.ones_like(length), length, length**2]),
                               seconds, "prefill_points")
    batch, context, seconds = d[:, 0], d[:, 1], d[:, 2]
    decode = _nonnegative_fit(np.column_stack([np.ones_like(batch), context, batch]),
                              seconds, "decode_points")
    return PhaseCost(prefill=prefill, decode=decode)
