"""Fitted step-time cost models (DistServe form) and their use in the simulator."""

import numpy as np
import pandas as pd
import pytest
from servingcap import costmodel
from servingcap.serving import Replica, simulate

TRUE = costmodel.PhaseCost(prefill=(0.010, 1.0e-4, 2.0e-9), decode=(0.012, 4.0e-7, 2.0e-4))


def test_chunked_attention_work_adds_up_to_the_unchunked_prompt():
    # Splitting a prompt into chunks keeps the total quadratic work of the whole prompt:
    # sum over chunks of n(n + 2k) = L^2, so only the per-step constant differs.
    whole = TRUE.prefill_s([4000])
    chunks = np.full(25, 160)
    cached = np.arange(25) * 160
    pieces = sum(TRUE.prefill_s([n], [k]) for n, k in zip(chunks, cached, strict=True))
    assert pieces - 24 * TRUE.prefill[0] == pytest.approx(whole, rel=1e-12)


def test_fit_recovers_known_coefficients_from_noiseless_points():
    lengths = np.array([128, 256, 512, 1024, 2048, 4096, 8192])
    prefill_points = [(L, TRUE.prefill_s([L])) for L in lengths]
    rng = np.random.default_rng(0)
    decode_points = []
    for batch in (1, 4, 8, 16, 32, 64):
        ctx = rng.integers(200, 3000, batch)
        decode_points.append((batch, ctx.sum(), TRUE.decode_s(ctx)))
    fitted = costmodel.fit(prefill_points, decode_points)
    assert fitted.prefill == pytest.approx(TRUE.prefill, rel=1e-6)
    assert fitted.decode == pytest.approx(TRUE.decode, rel=1e-6)


def test_fit_with_noise_predicts_within_the_noise():
    # 1 % multiplicative noise on 200 points per phase. A 3-parameter relative-error fit
    # predicts with a standard error of about sigma * sqrt(3 / n) ~ 0.12 % of the value
    # (0.10-0.15 % measured over 50 seeds at the points checked), so a 1 % tolerance is
    # ~7 standard errors, while a wrong model form would miss by far more.
    rng = np.random.default_rng(1)
    lengths = rng.integers(100, 8000, 200)
    prefill_points = [(L, TRUE.prefill_s([L]) * (1 + 0.01 * rng.standard_normal())) for L in lengths]
    decode_points = []
    for _ in range(200):
        batch = int(rng.integers(1, 64))
        ctx = rng.integers(200, 3000, batch)
        decode_points.append((batch, ctx.sum(), TRUE.decode_s(ctx) * (1 + 0.01 * rng.standard_normal())))
    fitted = costmodel.fit(prefill_points, decode_points)
    for L in (500, 2000, 6000):
        assert fitted.prefill_s([L]) == pytest.approx(TRUE.prefill_s([L]), rel=0.01)
    assert fitted.decode_s(np.full(32, 1500)) == pytest.approx(TRUE.decode_s(np.full(32, 1500)), rel=0.01)


def test_phase_cost_drives_the_simulator():
    reqs = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [2000], "output_tokens": [3]})
    out = simulate(reqs, Replica(step_time=TRUE, mode="combined")).iloc[0]   # whole prompt
    assert out.ttft_s == pytest.approx(TRUE.prefill_s([2000]))
    # two decode steps, at context 2001 and 2002 tokens
    assert out.finish_s - out.first_token_s == pytest.approx(TRUE.decode_s([2001]) + TRUE.decode_s([2002]))


@pytest.mark.parametrize("kwargs, match", [
    ({"prefill": (1, 2), "decode": (0, 0, 0)}, "prefill"),
    ({"prefill": (0, 0, 0), "decode": (0, -1, 0)}, r"decode\[1\]"),
])
def test_bad_coefficients_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        costmodel.PhaseCost(**kwargs)


def test_bad_points_are_named():
    with pytest.raises(ValueError, match="prefill_points"):
        costmodel.fit([(1, 2, 3)], [(1, 2, 3)] * 3)
    with pytest.raises(ValueError, match="at least 3"):
        costmodel.fit([(100, 0.1), (200, 0.2)], [(1, 100, 0.01)] * 3)
    with pytest.raises(ValueError, match="decode_points"):
        costmodel.fit([(100, 0.1)] * 3, [(1, -100, 0.01)] * 3)
