"""servingcap.params: the locked worked-example parameters and their derived values."""

import dataclasses
import math

import pytest
from servingcap import LOCKED, ServingParams
from servingcap.params import LOCKED as LOCKED_FROM_MODULE


def test_locked_values_from_the_seed():
    assert LOCKED.prefill_rate == 8_000          # tok/s per replica
    assert LOCKED.decode_step_s == 0.030         # 30 ms per decode step ...
    assert LOCKED.decode_batch == 32             # ... at batch 32
    assert LOCKED.prompt_tokens == 2_000
    assert LOCKED.long_prompt_tokens == 4_000
    assert LOCKED.output_tokens == 300
    assert LOCKED.ttft_slo_s == 1.0              # TTFT p99 <= 1,000 ms
    assert LOCKED.tpot_slo_s == 0.050            # TPOT p99 <= 50 ms


def test_locked_is_the_default_and_one_object():
    assert LOCKED == ServingParams()
    assert LOCKED is LOCKED_FROM_MODULE


def test_derived_values():
    assert LOCKED.prefill_s == pytest.approx(0.25)             # 2000 / 8000
    assert LOCKED.e2e_s == pytest.approx(0.25 + 299 * 0.030)   # TTFT + (N-1) TPOT
    assert LOCKED.e2e_s == pytest.approx(9.22)
    assert LOCKED.hold_s == pytest.approx(0.25 + 300 * 0.030)  # prefill + N decode steps
    assert LOCKED.hold_s == pytest.approx(9.25)
    assert LOCKED.hold_s - LOCKED.e2e_s == pytest.approx(LOCKED.decode_step_s)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LOCKED.prefill_rate = 1.0


def test_replace_returns_a_changed_copy():
    faster = LOCKED.replace(prefill_rate=12_000)
    assert faster.prefill_rate == 12_000 and LOCKED.prefill_rate == 8_000
    assert faster.prefill_s == pytest.approx(2_000 / 12_000)
    assert faster.e2e_s == pytest.approx(2_000 / 12_000 + 299 * 0.030)
    assert dataclasses.replace(faster, prefill_rate=8_000) == LOCKED
    longer = LOCKED.replace(output_tokens=500, decode_step_s=0.02)
    assert longer.hold_s == pytest.approx(0.25 + 500 * 0.02)


@pytest.mark.parametrize("field, value", [
    ("prefill_rate", -1.0),
    ("prefill_rate", 0.0),
    ("prefill_rate", math.nan),
    ("decode_step_s", math.inf),
    ("ttft_slo_s", 0),
    ("tpot_slo_s", -0.05),
    ("decode_batch", 0),
    ("decode_batch", 2.5),
    ("decode_batch", True),
    ("prompt_tokens", -2_000),
    ("long_prompt_tokens", 0),
    ("output_tokens", 300.5),
    ("output_tokens", "300"),
])
def test_replace_validates(field, value):
    with pytest.raises(ValueError) as info:
        LOCKED.replace(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_constructor_validates_too():
    with pytest.raises(ValueError, match="prefill_rate"):
        ServingParams(prefill_rate=-8_000)


def test_replace_rejects_unknown_field():
    with pytest.raises(TypeError):
        LOCKED.replace(prefil_rate=1.0)


# --- the book's one decode step-time curve (issue 12 item 2) -------------------------

def test_decode_step_table_is_the_two_slos_line_through_the_locked_step():
    table = LOCKED.decode_step_table
    assert table[LOCKED.decode_batch] == pytest.approx(LOCKED.decode_step_s)   # 30 ms at 32
    # t(B) = 10 + 0.625 B ms through (16, 20 ms) and (32, 30 ms); B = 1 from that line
    assert table[16] == pytest.approx(0.020) and table[1] == pytest.approx(0.010625)
    assert table[64] == pytest.approx(0.055)
    assert LOCKED.decode_step_at(24) == pytest.approx(0.010 + 0.000625 * 24)
    assert LOCKED.decode_step_at(48) == pytest.approx((0.030 + 0.055) / 2)


def test_decode_step_table_scales_with_decode_step_s():
    slower = LOCKED.replace(decode_step_s=0.045)
    for b, t in LOCKED.decode_step_table.items():
        assert slower.decode_step_table[b] == pytest.approx(1.5 * t)
    moved = LOCKED.replace(decode_batch=16)           # 30 ms now at batch 16
    assert moved.decode_step_table[16] == pytest.approx(0.030)


def test_the_simulator_reads_the_table():
    import pandas as pd
    from servingcap.serving import Replica, simulate
    one = pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [100], "output_tokens": [11]})
    out = simulate(one, Replica(decode_step_s=LOCKED.decode_step_table)).iloc[0]
    assert out.tpot_s == pytest.approx(LOCKED.decode_step_table[1])   # alone: batch 1


@pytest.mark.parametrize("curve", [(), ((32, 0.03),), ((16, -0.02), (32, 0.03)),
                                   ((0, 0.02), (32, 0.03)), "bad", ((1, 2, 3),)])
def test_bad_decode_curve(curve):
    with pytest.raises(ValueError, match="decode_curve"):
        LOCKED.replace(decode_curve=curve)


def test_decode_step_at_rejects_bad_batch():
    with pytest.raises(ValueError, match="batch"):
        LOCKED.decode_step_at(0)
