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
