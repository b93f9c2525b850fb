"""Phase arithmetic (servingcap.llm): the seed essays' worked numbers and bad input."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from servingcap import LOCKED, llm


def test_prefill_of_typical_and_long_prompt():
    assert llm.prefill_s(2_000, 8_000) == pytest.approx(0.25)
    assert llm.prefill_s(4_000, 8_000) == pytest.approx(0.50)
    assert llm.prefill_s(0, 8_000) == 0.0


def test_ttft_adds_queue_wait():
    assert llm.ttft_s(2_000, 8_000) == pytest.approx(0.25)
    assert llm.ttft_s(2_000, 8_000, queue_s=0.75) == pytest.approx(1.0)


def test_e2e_of_locked_request_is_9_22_s():
    assert llm.e2e_s(0.25, 300, 0.030) == pytest.approx(9.22)
    locked = llm.e2e_s(LOCKED.prefill_s, LOCKED.output_tokens, LOCKED.decode_step_s)
    assert locked == pytest.approx(LOCKED.e2e_s)
    assert llm.e2e_s(0.4, 1, 0.030) == pytest.approx(0.4)  # one token: E2E is TTFT


def test_interference_stall_is_530_ms_and_hides_from_the_mean():
    step = llm.stalled_step_s(4_000, 8_000, 0.030)
    assert step == pytest.approx(0.530)
    assert step / 0.050 == pytest.approx(10.6)
    assert llm.amortized_stall_s(4_000, 8_000, 300) == pytest.approx(0.5 / 300)


def test_max_chunk_is_160_tokens():
    assert llm.max_chunk_tokens(0.050, 0.030, 8_000) == 160
    assert llm.max_chunk_tokens(0.060, 0.030, 8_000) == 240
    # the chunk and the decode step fill the budget exactly
    assert 0.030 + 160 / 8_000 == pytest.approx(0.050)


def test_chunked_ttft_of_long_prompt_is_1_25_s():
    assert llm.chunk_count(4_000, 160) == 25
    assert llm.chunk_count(4_001, 160) == 26
    assert llm.chunk_count(0, 160) == 0
    assert llm.chunked_ttft_s(4_000, 160, 8_000, 0.030) == pytest.approx(1.25)
    assert llm.chunked_ttft_s(4_000, 160, 8_000, 0.030, queue_s=0.1) == pytest.approx(1.35)


def test_decode_step_time_interpolates_measured_points():
    curve = {16: 0.020, 32: 0.030, 64: 0.055}
    assert llm.decode_step_time(32, curve) == pytest.approx(0.030)
    assert llm.decode_step_time(24, curve) == pytest.approx(0.025)
    assert llm.decode_step_time(48, curve) == pytest.approx(0.0425)
    assert llm.decode_step_time(8, curve) == pytest.approx(0.015)      # extrapolated
    assert llm.decode_step_time(96, curve) == pytest.approx(0.080)
    out = llm.decode_step_time([16, 64], curve)
    assert isinstance(out, np.ndarray) and out.tolist() == pytest.approx([0.020, 0.055])
    assert llm.decode_step_time(100, {32: 0.030}) == pytest.approx(0.030)
    assert isinstance(llm.decode_step_time(32, curve), float)


@given(p=st.integers(0, 200_000), c=st.integers(1, 8_192),
       rate=st.floats(100, 1e6), t_dec=st.floats(1e-4, 0.2))
def test_chunked_ttft_is_at_least_unchunked(p, c, rate, t_dec):
    chunked = llm.chunked_ttft_s(p, c, rate, t_dec)
    assert chunked >= llm.prefill_s(p, rate)
    assert chunked == pytest.approx(math.ceil(p / c) * t_dec + p / rate)


@given(slo=st.floats(0.011, 1.0), t_dec=st.floats(0.001, 0.01), rate=st.floats(100, 1e6))
def test_max_chunk_keeps_step_within_budget(slo, t_dec, rate):
    c = llm.max_chunk_tokens(slo, t_dec, rate)
    assert t_dec + c / rate <= slo * (1 + 1e-9)
    assert t_dec + (c + 1) / rate > slo


@pytest.mark.parametrize("call, name", [
    (lambda: llm.prefill_s(-1, 8_000), "prompt_tokens"),
    (lambda: llm.prefill_s(2_000, 0), "prefill_rate"),
    (lambda: llm.prefill_s(2_000, float("nan")), "prefill_rate"),
    (lambda: llm.ttft_s(2_000, 8_000, queue_s=-0.1), "queue_s"),
    (lambda: llm.e2e_s(0.25, 0, 0.030), "output_tokens"),
    (lambda: llm.e2e_s(0.25, 2.5, 0.030), "output_tokens"),
    (lambda: llm.e2e_s(-0.25, 300, 0.030), "ttft_s"),
    (lambda: llm.e2e_s(0.25, 300, -0.03), "tpot_s"),
    (lambda: llm.stalled_step_s(4_000, 8_000, 0), "decode_step_s"),
    (lambda: llm.amortized_stall_s(4_000, 8_000, 0), "output_tokens"),
    (lambda: llm.max_chunk_tokens(0.030, 0.030, 8_000), "decode_step_s"),
    (lambda: llm.max_chunk_tokens(0, 0.030, 8_000), "tpot_slo_s"),
    (lambda: llm.max_chunk_tokens(0.05, 0.030, -1), "prefill_rate"),
    (lambda: llm.chunk_count(4_000, 0), "chunk_tokens"),
    (lambda: llm.chunked_ttft_s(4_000, 160, 8_000, -0.03), "decode_step_s"),
    (lambda: llm.decode_step_time(0, {32: 0.03}), "batch"),
    (lambda: llm.decode_step_time(32, {}), "measured"),
    (lambda: llm.decode_step_time(32, [0.03]), "measured"),
    (lambda: llm.decode_step_time(32, {32: -0.03}), "measured seconds"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --------------------------------------------------------------------------- fused steps


def test_fused_step_by_hand_and_against_the_additive_floor():
    # locked numbers: w = 10 ms, t(32) = 30 ms, 8,000 tokens/s (ridge 80 tokens)
    w, rate = 0.010, 8000.0
    assert llm.fused_step_s(32, 0, 0.030, w, rate) == pytest.approx(0.030)     # the curve
    assert llm.fused_step_s(0, 50, 0.0, w, rate) == pytest.approx(0.010)       # one weight read
    assert llm.fused_step_s(0, 2000, 0.0, w, rate) == pytest.approx(0.250)
    # below the ridge a chunk rides free: 32 decodes + 48 tokens = 80 tokens
    assert llm.fused_step_s(32, 48, 0.030, w, rate) == pytest.approx(0.030)
    # past it, every token at the prefill rate: 20 ms per-sequence part + 240 / 8,000 s
    assert llm.fused_step_s(32, 208, 0.030, w, rate) == pytest.approx(0.050)
    for batch, chunk in [(1, 1), (8, 100), (32, 160), (32, 4000), (64, 10)]:
        t_dec = 0.010 + 0.000625 * batch
        fused = llm.fused_step_s(batch, chunk, t_dec, w, rate)
        assert t_dec - 1e-12 <= fused <= t_dec + chunk / rate + 1e-12


def test_fused_budget_chunk_and_ttft_of_the_locked_example():
    assert LOCKED.weight_read_s == pytest.approx(0.010)
    assert LOCKED.ridge_tokens == pytest.approx(80.0)
    budget = llm.fused_token_budget(0.050, 0.030, 0.010, 8000, 32)
    assert budget == LOCKED.token_budget == 240                      # a 208-token chunk
    assert llm.max_chunk_tokens(0.050, 0.030, 8000) == 160           # the seed's floor
    assert llm.overlapped_token_budget(0.050, 0.030, 8000, 32) - 32 == 368  # optimistic
    # 4,000 tokens: 19 steps of 50 ms and a 48-token last chunk of 30 ms
    assert llm.fused_chunked_ttft_s(4000, 240, 32, 0.030, 0.010, 8000) == pytest.approx(0.98)
    assert llm.chunked_ttft_s(4000, 160, 8000, 0.030) == pytest.approx(1.25)


@pytest.mark.parametrize("call, match", [
    (lambda: llm.fused_step_s(-1, 0, 0.03, 0.01, 8000), "decode_batch"),
    (lambda: llm.fused_step_s(2, 0, 0.03, 0.0, 8000), "weight_read_s"),
    (lambda: llm.fused_step_s(2, 0, 0.0, 0.01, 8000), "decode_step_s"),
    (lambda: llm.fused_token_budget(0.05, 0.06, 0.01, 8000, 32), "no room"),
    (lambda: llm.fused_chunked_ttft_s(4000, 32, 32, 0.03, 0.01, 8000), "token_budget"),
    (lambda: llm.overlapped_token_budget(0.05, 0.05, 8000, 32), "decode_step_s"),
    (lambda: llm.linear_s(float("nan"), 0.01, 8000), "tokens"),
])
def test_fused_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
