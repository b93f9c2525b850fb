"""Sequential decisions with an indifference zone, and intervals on a printed quantile
(servingcap.stats.feasibility, quantile_ci, replicated_quantile_ci)."""

import math

import numpy as np
import pytest
from servingcap import stats
from servingcap.queues import MMc
from servingcap.sim import fcfs_waits

LAM, MU, SERVERS = 1.2, 1.0, 2          # M/M/2 at rho = 0.6
CUSTOMERS, WARMUP = 1000, 100           # per replication; first 100 deleted


def _attainment(rng, limit):
    """One replication's share of customers (after warm-up) waiting <= limit (s)."""
    arrivals = np.cumsum(rng.exponential(1.0 / LAM, CUSTOMERS))
    waits = fcfs_waits(arrivals, rng.exponential(1.0 / MU, CUSTOMERS), SERVERS)
    return float((waits[WARMUP:] <= limit).mean())


CAP = 640                               # sequential_check looks at 10, 20, ..., 640


def _decide(procedure, rng, limit, target, delta, alpha):
    """Add replications until the procedure decides: one at a time for feasibility (it
    looks at every count), up to the next look for sequential_check."""
    x = [_attainment(rng, limit) for _ in range(stats.FIRST_STAGE)]
    looks = stats.look_schedule(stats.FIRST_STAGE, CAP)
    while True:
        if procedure == "feasibility":
            d = stats.feasibility(x, target, delta=delta, alpha=alpha)
        else:
            d = stats.sequential_check(x, target, cap=CAP, delta=delta, alpha=alpha)
        if d.decided or len(x) >= CAP:
            return d, len(x)
        more = 1 if procedure == "feasibility" else min(r for r in looks if r > len(x))
        x += [_attainment(rng, limit) for _ in range(max(more - len(x), 1))]


@pytest.mark.parametrize("procedure", ["feasibility", "sequential_check"])
def test_wrong_decisions_outside_the_zone_stay_within_alpha_on_mm2(procedure):
    # Known answer: the M/M/2 wait's 90th percentile t (Erlang C), so P(wait <= t) = 0.90
    # exactly. "Attainment >= target" (the same claim as "p-quantile of the wait <= t" at
    # p = target) is decided with delta = 0.02 (a replication's attainment has sd about
    # 0.035 here, so a few to ~40 replications decide) and alpha = 0.05. Targets 1.1 delta
    # above and below the truth put it just outside the zone, where errors are likeliest:
    # target 0.878 must be "meets", 0.922 "misses". The start-empty bias is negligible:
    # 4,000 replications of 500 customers gave a mean attainment of 0.8998 +- 0.0008.
    # 100 experiments per side, 200 in all. Wrong verdicts are Binomial(200, <= 0.05) if
    # the procedure is right: mean <= 10, sd 3.1, so <= 17 is within 2.3 sd (one-sided
    # 1 %); per side Binomial(100, <= 0.05): mean <= 5, sd 2.2, so <= 10 (2.3 sd).
    # Measured: 0 and 1 wrong for each procedure.
    limit = MMc(LAM, MU, SERVERS).wait_quantile(0.90)
    truth = float(MMc(LAM, MU, SERVERS).wait_cdf(limit))
    assert truth == pytest.approx(0.90, abs=1e-12)
    delta, alpha, experiments = 0.02, 0.05, 100
    total = 0
    for target, right in ((truth - 1.1 * delta, "meets"), (truth + 1.1 * delta, "misses")):
        wrong = 0
        for e in range(experiments):
            rng = np.random.default_rng([e, right == "meets"])
            d, simulated = _decide(procedure, rng, limit, target, delta, alpha)
            assert d.decided and d.used == simulated and d.used <= d.needed
            wrong += d.verdict != right
        assert wrong <= 10, (right, wrong)
        total += wrong
    assert total <= 17


def test_feasibility_scans_every_look_so_batches_give_the_one_at_a_time_verdict():
    rng = np.random.default_rng(3)
    x = 0.994 + 0.004 * rng.standard_normal(64)
    one_at_a_time = None
    for k in range(stats.FIRST_STAGE, x.size + 1):
        d = stats.feasibility(x[:k], 0.99)
        if d.decided:
            one_at_a_time = d
            break
    batch = stats.feasibility(x, 0.99)          # all 64 at once: same stop, same verdict
    assert one_at_a_time is not None and batch.verdict == one_at_a_time.verdict == "meets"
    assert batch.used == one_at_a_time.used
    # the lower-is-better form is the mirror image
    mirror = stats.feasibility(1 - x, 0.01, at_most=True)
    assert (mirror.verdict, mirror.used) == (batch.verdict, batch.used)


def test_open_at_the_cap_is_not_a_miss_and_reports_its_interval():
    rng = np.random.default_rng(5)
    x = 0.99 + 0.005 * rng.standard_normal(12)   # truth on the target: inside the zone
    d = stats.feasibility(x, 0.99)
    assert d.verdict == "open" and not d.decided and d.used == 12
    assert d.needed > 12 and d.estimate.low < 0.99 < d.estimate.high
    assert "open" in str(d) and "Batur-Kim" in str(d)
    # fewer values than the first stage: open, and needed is the first stage
    short = stats.feasibility(x[:3], 0.99)
    assert short.verdict == "open" and short.needed == stats.FIRST_STAGE
    # zero variance: decided at the first stage, ties at the target meet
    assert stats.feasibility(np.ones(10), 1.0).verdict == "meets"
    assert stats.feasibility(np.full(10, 0.98), 0.99).verdict == "misses"


def test_far_from_the_target_the_repeated_t_check_decides_at_its_first_look():
    # A planning probe far past the knee: attainment 0.74 +- 0.1 per replication against a
    # 0.95 target. Batur-Kim's region starts h2 S^2 / (2 delta) wide, about 15 here with
    # delta = 0.0025, against a sum of -1.3 after 6 replications: open. The repeated
    # t-interval check sees the whole interval far below the zone and says "misses".
    rng = np.random.default_rng(8)
    x = 0.74 + 0.1 * rng.standard_normal(6)
    assert stats.feasibility(x, 0.95, first=6).verdict == "open"
    d = stats.sequential_check(x, 0.95, cap=6, first=6)
    assert (d.verdict, d.used) == ("misses", 6)
    near = 0.96 + 0.01 * rng.standard_normal(16)   # 1 point above: decided at look 10
    assert stats.sequential_check(near, 0.95, cap=16).verdict == "meets"
    inside = np.full(16, 0.95) + 0.01 * rng.standard_normal(16)
    open_ = stats.sequential_check(inside, 0.95, cap=16)
    assert open_.verdict == "open" and open_.needed > 16 and open_.used == 16


def test_look_schedule_doubles_from_the_first_stage_to_the_cap():
    assert stats.look_schedule(10, 16) == [10, 16]
    assert stats.look_schedule(10, 100) == [10, 20, 40, 80, 100]
    assert stats.look_schedule(4, 4) == [4]
    with pytest.raises(ValueError, match="cap"):
        stats.look_schedule(10, 5)


def test_feasibility_constants_solve_the_batur_kim_equation():
    for n0 in (2, 5, 10, 20):
        eta, h2 = stats.feasibility_constants(0.05, n0)
        assert 0.5 * (1 + 2 * eta) ** (-(n0 - 1) / 2) == pytest.approx(0.05)
        assert h2 == pytest.approx(2 * eta * (n0 - 1))
    assert stats.feasibility_constants(0.05, 10)[1] == pytest.approx(6.0129, abs=1e-4)


def test_sectioning_interval_is_centred_on_the_printed_quantile_and_covers():
    # i.i.d. Exp(1): exact p99 = ln 100. 300 experiments of 15,000 values in 10 sections of
    # 1,500 (m(1 - p) = 15 >= 10). Coverage is Binomial(300, ~0.95): sd 1.26 %, so 0.92 is
    # -2.4 sd. The mean of the section p99s is biased low (each section's p99 rests on
    # ~20 tail points): it lies below the whole-run p99 on average.
    exact = math.log(100.0)
    rng = np.random.default_rng(11)
    hits, below = 0, 0
    for _ in range(300):
        x = rng.exponential(1.0, 15_000)
        ci = stats.quantile_ci(x, 0.99)
        assert ci.value == float(np.quantile(x, 0.99, method="inverted_cdf"))
        assert ci.low < ci.value < ci.high and "sectioning" in ci.method
        hits += ci.low <= exact <= ci.high
        sections = np.quantile(x.reshape(10, 1500), 0.99, axis=1, method="inverted_cdf")
        below += sections.mean() < ci.value
    assert 0.92 <= hits / 300 <= 0.99
    assert below > 180                      # biased low in most experiments (60 % +)


def test_replicated_quantile_ci_pools_the_replications():
    rng = np.random.default_rng(2)
    runs = [rng.exponential(1.0, 3000) for _ in range(6)]
    ci = stats.replicated_quantile_ci(runs, 0.99)
    pooled = float(np.quantile(np.concatenate(runs), 0.99, method="inverted_cdf"))
    assert ci.value == pooled and ci.n == 6 and ci.low < pooled < ci.high
    # a failed request (+inf) as a replication's p99: no finite upper end
    runs[0][:100] = np.inf
    assert stats.replicated_quantile_ci(runs, 0.99).high == math.inf


def test_sectioning_a_difference_of_p99s_centres_on_the_whole_run_difference():
    rng = np.random.default_rng(4)
    a, b = rng.exponential(1.0, 20_000), rng.exponential(1.2, 20_000)
    whole = (np.quantile(b, 0.99, method="inverted_cdf")
             - np.quantile(a, 0.99, method="inverted_cdf"))
    parts = [np.quantile(y, 0.99, method="inverted_cdf")
             - np.quantile(x, 0.99, method="inverted_cdf")
             for x, y in zip(a.reshape(10, 2000), b.reshape(10, 2000), strict=True)]
    ci = stats.sectioning_ci(whole, parts)
    assert ci.value == whole and ci.low < 0.2 * math.log(100) < ci.high   # exact 0.92
    assert stats.sectioning_ci(math.inf, parts).high == math.inf


@pytest.mark.parametrize("call, named", [
    (lambda: stats.feasibility([0.99] * 10, 0.99, delta=0), "delta"),
    (lambda: stats.feasibility([0.99] * 10, 0.99, alpha=0.5), "alpha"),
    (lambda: stats.feasibility([0.99] * 10, 0.99, first=1), "first"),
    (lambda: stats.feasibility([], 0.99), "values"),
    (lambda: stats.feasibility([0.99] * 10, math.nan), "target"),
    (lambda: stats.feasibility([0.99] * 10, 0.99, at_most="yes"), "at_most"),
    (lambda: stats.sequential_check([0.99] * 10, 0.99, cap=5), "cap"),
    (lambda: stats.sequential_check([0.99] * 10, 0.99, cap=10, delta=-1), "delta"),
    (lambda: stats.sequential_check([0.99] * 10, 0.99, cap=10, alpha=0.7), "alpha"),
    (lambda: stats.quantile_ci(np.ones(5000), 0.99), r"min_tail=10.*at least 1000 "),
    (lambda: stats.quantile_ci(np.ones(5000), 0.99, batches=1), "batches"),
    (lambda: stats.sectioning_ci(math.nan, [1.0, 2.0]), "whole"),
    (lambda: stats.sectioning_ci(1.0, [1.0]), "sections"),
    (lambda: stats.replicated_quantile_ci([np.ones(2000)], 0.99), "at least 2"),
    (lambda: stats.replicated_quantile_ci(np.ones(2000), 0.99), "runs"),
    (lambda: stats.replicated_quantile_ci([np.ones(2000)] * 2, 1.0), "p must be"),
])
def test_bad_input_names_the_parameter(call, named):
    with pytest.raises(ValueError, match=named):
        call()
