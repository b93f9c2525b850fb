"""Every worked number of chapters 1-3 (and the locked-parameter numbers they lean on),
reproduced through servingcap and compared at the precision the seed essays print:
round the computed value to the printed digits, then compare for equality.
"""

import math

import pytest
from servingcap import LOCKED, llm
from servingcap.queues import MM1, little, little_check

# --------------------------------------------------------------------------- Little

def test_little_20_per_second_times_half_second():
    # "completes 20 requests per second ... 0.5 second ... average 10 in-flight requests"
    assert little(arrival_rate=20, time_in_system=0.5) == 10


def test_dashboard_with_100_in_flight_is_inconsistent():
    # "20 completed requests per second, 0.5-second mean response, and 100 mean in flight"
    check = little_check(L=100, arrival_rate=20, time_in_system=0.5)
    assert not check.consistent
    assert round(check.implied_L) == 10
    assert round(check.ratio) == 10
    assert little_check(L=10, arrival_rate=20, time_in_system=0.5).consistent


# --------------------------------------------------------------------------- the knee

# Seed 1, mu = 1 job/s: utilization -> (mean response, illustrative p95 response), 2 dp.
SEED1_TABLE = [
    (0.50, 2.00, 5.99),
    (0.80, 5.00, 14.98),
    (0.90, 10.00, 29.96),
    (0.95, 20.00, 59.91),
    (0.99, 100.00, 299.57),
]


@pytest.mark.parametrize("rho, mean, p95", SEED1_TABLE)
def test_mm1_table_mean_and_p95(rho, mean, p95):
    q = MM1(arrival_rate=rho, service_rate=1.0)
    assert round(q.mean_response, 2) == mean
    assert round(q.response_quantile(0.95), 2) == p95
    assert f"{q.mean_response:.2f} s" == f"{mean:.2f} s"


# Seed 2: rho -> (mean W in units of S, p99 in units of S), 1 dp.
SEED2_TABLE = [
    (0.50, 2.0, 9.2),
    (0.70, 3.3, 15.4),
    (0.90, 10.0, 46.1),
    (0.95, 20.0, 92.1),
]


@pytest.mark.parametrize("service_s", [1.0, 0.25, 9.25])
@pytest.mark.parametrize("rho, mean_x, p99_x", SEED2_TABLE)
def test_mm1_table_in_units_of_service_time(rho, mean_x, p99_x, service_s):
    # The table is in multiples of S, so it must hold for any mean service time S.
    q = MM1(arrival_rate=rho / service_s, service_rate=1.0 / service_s)
    assert round(q.mean_response / service_s, 1) == mean_x
    assert round(q.response_quantile(0.99) / service_s, 1) == p99_x


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9, 0.95, 0.99])
def test_p99_is_ln100_times_mean(rho):
    q = MM1(rho, 1.0)
    ratio = q.response_quantile(0.99) / q.mean_response
    assert ratio == pytest.approx(math.log(100), rel=1e-12)
    assert round(ratio, 1) == 4.6


def test_90_to_95_percent_doubles_the_tail():
    # "Going from 90% to 95% utilization buys 5% more traffic and doubles the tail."
    p99 = {rho: MM1(rho, 1.0).response_quantile(0.99) for rho in (0.90, 0.95)}
    assert round(p99[0.95] / p99[0.90], 2) == 2.00


# --------------------------------------------------------------------------- locked set

def test_typical_prefill_250_ms_and_e2e_9220_ms():
    # "t_prefill = 2000/8000 = 250 ms and E2E = 250 + 299 x 30 = 9,220 ms"
    assert round(LOCKED.prefill_s * 1000) == 250
    assert round(LOCKED.e2e_s * 1000) == 9_220
    assert round(llm.prefill_s(LOCKED.prompt_tokens, LOCKED.prefill_rate) * 1000) == 250
    e2e = llm.e2e_s(LOCKED.prefill_s, LOCKED.output_tokens, LOCKED.decode_step_s)
    assert round(e2e * 1000) == 9_220
    # "TTFT is 3% of the total"
    assert round(100 * LOCKED.prefill_s / LOCKED.e2e_s) == 3


def test_unchunked_long_prefill_step_530_ms_is_10_6x_tpot_slo():
    # "prefill step = 30 + 500 = 530 ms -> 10.6x over the 50 ms SLO"
    pure = LOCKED.long_prompt_tokens / LOCKED.prefill_rate
    assert round(pure * 1000) == 500
    step = LOCKED.decode_step_s + pure
    assert round(step * 1000) == 530
    assert round(step / LOCKED.tpot_slo_s, 1) == 10.6
    via_llm = llm.stalled_step_s(LOCKED.long_prompt_tokens, LOCKED.prefill_rate,
                                 LOCKED.decode_step_s)
    assert round(via_llm * 1000) == 530
    # victims: all 32 in-flight sequences; averaged over 300 steps the stall is 1.7 ms
    assert LOCKED.decode_batch == 32
    amortized = llm.amortized_stall_s(LOCKED.long_prompt_tokens, LOCKED.prefill_rate,
                                      LOCKED.output_tokens)
    assert round(amortized * 1000, 1) == 1.7


def test_slot_hold_time_9_25_s():
    # "T_hold = 0.25 + 300 x 0.030 = 9.25 s"
    assert round(LOCKED.hold_s, 2) == 9.25
