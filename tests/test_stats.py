"""Output analysis (servingcap.stats): warm-up, intervals, replications, steady state."""

import math

import numpy as np
import pytest
from servingcap import stats
from servingcap.queues import MMc
from servingcap.sim import fcfs_waits, mmc_sample


def _mmc_waits(lam, mu, c, n, seed):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / lam, n))
    return fcfs_waits(arrivals, rng.exponential(1.0 / mu, n), c)


def test_replicated_percentile_interval_covers_the_erlang_c_value():
    # M/M/2 at rho = 0.6, the 90th percentile of the wait (above the atom at zero:
    # P(wait > 0) = 0.45). Each experiment: 10 replications of 4,000 customers started
    # empty, warm-up cut by leave-one-out MSER-5, one sample p90 per replication, and a
    # t-interval across replications. Coverage over E experiments is Binomial(E, 0.95)
    # if the interval is right: with E = 240 its sd is sqrt(.95 * .05 / 240) = 1.4 %, so
    # 90-99 % is -3.5 to +2.8 sd. (Cutting each run on its own data instead gives about
    # 75 %, and cutting nothing under-covers at short run lengths.)
    lam, mu, c, p = 1.2, 1.0, 2, 0.9
    exact = MMc(lam, mu, c).wait_quantile(p)
    experiments, covered = 240, 0
    for e in range(experiments):
        runs = [_mmc_waits(lam, mu, c, 4000, s) for s in stats.replication_seeds(e, 10)]
        cuts = stats.warmup_cuts(runs)
        ci = stats.mean_ci([np.quantile(w[d:], p) for w, d in zip(runs, cuts, strict=True)])
        covered += ci.low <= exact <= ci.high
    assert 0.90 <= covered / experiments <= 0.99


def test_estimate_decides_a_lower_is_better_limit():
    est = stats.mean_ci([0.20, 0.22, 0.21])           # p99 TTFT (s), t-interval
    assert est.high < 0.3 and est.decide_at_most(0.3) == "meets"
    assert est.low > 0.1 and est.decide_at_most(0.1) == "misses"
    assert est.low < 0.21 < est.high and est.decide_at_most(0.21) == "undecided"
    # the two verdicts are mirror images: at_most(x) for v is decide(-x) for -v
    neg = stats.Estimate(-est.value, -est.high, -est.low, est.confidence, est.n, "neg")
    for limit in (0.1, 0.205, 0.21, 0.3):
        assert est.decide_at_most(limit) == neg.decide(-limit)
    with pytest.raises(ValueError, match="limit"):
        est.decide_at_most(float("nan"))


def test_order_statistic_interval_covers_an_exact_quantile_of_iid_data():
    # i.i.d. exponential samples: the order-statistic interval is exact (>= 95 %);
    # over 400 experiments coverage sd is 1.1 %, so 0.93 is -2 sd of a 95.5 % interval.
    exact = -math.log(1 - 0.99)              # p99 of Exp(1)
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        ci = stats.percentile_ci(rng.exponential(1.0, 2000), 0.99)
        hits += ci.low <= exact <= ci.high
    assert 0.93 <= hits / 400 <= 0.995
    # +inf (failed requests) are allowed and push the upper end out
    ci = stats.percentile_ci([1.0] * 90 + [math.inf] * 10, 0.95)
    assert ci.high == math.inf


def test_proportion_interval_is_scipys_wilson_and_clopper_pearson():
    wilson = stats.proportion_ci(990, 1000)
    exact = stats.proportion_ci(990, 1000, method="exact")
    assert wilson.value == 0.99
    assert wilson.low == pytest.approx(0.98165, abs=1e-4)    # Wilson score, 95 %
    assert exact.low < wilson.low < 0.99 < wilson.high
    assert "Clopper-Pearson" in exact.method


def test_mser_deletes_an_initial_transient():
    rng = np.random.default_rng(0)
    series = np.concatenate([np.linspace(10, 0, 500), np.zeros(4500)]) + rng.normal(0, 1, 5000)
    cut = stats.mser(series)
    assert 300 <= cut.delete <= 700 and cut.settled
    # a trend to the end never settles
    assert not stats.mser(np.arange(1000.0)).settled


def test_instability_verdict_fires_at_rho_one_and_above_not_for_a_stable_queue():
    # 20,000 customers of M/M/2. Stable queues (rho 0.7, 0.9) pass each of the three
    # tests with probability about 0.99 (we saw 1 alarm in 40 seeds at each), so at most
    # 1 false alarm in 20 seeds. rho > 1 fires every time. rho = 1 exactly is null
    # recurrent: its backlog is a reflected random walk that sometimes looks level for a
    # whole run; we measured the verdict firing in 36 of 40 seeds (90 %), so >= 16 of 20
    # (binomial sd 1.3 around 18) is the bound.
    def flagged(rho):
        return sum(not stats.steady_state(mmc_sample(2 * rho, 1.0, 20_000, s, servers=2)[2]).steady
                   for s in range(20))

    assert flagged(0.7) <= 1
    assert flagged(0.9) <= 1
    assert flagged(1.0) >= 16
    assert flagged(1.2) == 20
    verdict = stats.steady_state(mmc_sample(2.4, 1.0, 20_000, 0, servers=2)[2])
    assert verdict.label == "unstable" and "unstable" in str(verdict)


def test_estimate_decides_by_its_interval():
    est = stats.mean_ci([0.992, 0.995, 0.993, 0.994])
    assert est.decide(0.99) == "meets"
    assert est.decide(0.999) == "misses"
    assert stats.mean_ci([0.98, 0.999, 0.99]).decide(0.99) == "undecided"
    one = stats.mean_ci([0.5])
    assert one.low == -math.inf and one.decide(0.1) == "undecided"
    assert stats.batch_means_ci(np.ones(100)).half_width == 0.0


def test_mean_ci_default_is_the_plain_t_interval_and_bounds_none_changes_nothing():
    x = [0.0, 0.0, 0.001, 0.0, 0.002, 0.0, 0.0, 0.0]    # miss rates near zero
    est = stats.mean_ci(x)
    half = stats._st.t.ppf(0.975, 7) * np.std(x, ddof=1) / math.sqrt(8)
    assert est.value == pytest.approx(np.mean(x), abs=1e-15)
    assert est.low == pytest.approx(np.mean(x) - half, abs=1e-15) and est.low < 0
    assert est.high == pytest.approx(np.mean(x) + half, abs=1e-15)
    assert est.method == "t over 8 replications"
    assert stats.mean_ci(x, bounds=None) == est


def test_mean_ci_bounds_clip_a_rate_to_its_range_and_say_so():
    x = [0.0, 0.0, 0.001, 0.0, 0.002, 0.0, 0.0, 0.0]
    plain, clipped = stats.mean_ci(x), stats.mean_ci(x, bounds=(0, 1))
    assert clipped.low == 0.0 and clipped.high == plain.high
    assert clipped.value == plain.value and clipped.n == plain.n == 8
    assert clipped.method == "t over 8 replications, clipped to [0, 1]"
    # an interval already inside the range is untouched (only the method says bounds)
    inside = stats.mean_ci([0.4, 0.5, 0.6], bounds=(0, 1))
    assert (inside.low, inside.high) == (stats.mean_ci([0.4, 0.5, 0.6]).low,
                                         stats.mean_ci([0.4, 0.5, 0.6]).high)
    # one replication: the infinite interval becomes the whole range
    one = stats.mean_ci([0.3], bounds=(0, 1))
    assert (one.low, one.high) == (0.0, 1.0) and one.method.endswith("[0, 1]")
    # a half-infinite range clips only one side
    pos = stats.mean_ci([0.0, 0.0, 3.0], bounds=(0, math.inf))
    assert pos.low == 0.0 and pos.high == stats.mean_ci([0.0, 0.0, 3.0]).high
    assert pos.method.endswith("clipped to [0, inf]")


def test_clipping_to_the_parameter_range_does_not_change_coverage():
    # Small Bernoulli miss rates: 8 replications of 300 requests at p = 0.002, so many
    # replications see no miss and the plain t-interval often dips below zero. For the
    # true p (inside [0, 1]) the covered / not-covered outcome is the same experiment by
    # experiment, so the two coverages are identical, not merely close.
    rng = np.random.default_rng(7)
    p, hits_plain, hits_clip, dipped = 0.002, 0, 0, 0
    for _ in range(500):
        rates = rng.binomial(300, p, size=8) / 300
        a, b = stats.mean_ci(rates), stats.mean_ci(rates, bounds=(0, 1))
        dipped += a.low < 0
        hits_plain += a.low <= p <= a.high
        hits_clip += b.low <= p <= b.high
        assert b.low >= 0 and b.high <= 1
        for limit in (0.001, 0.002, 0.01):      # verdicts against limits in range
            assert a.decide_at_most(limit) == b.decide_at_most(limit)
    assert dipped > 100 and hits_plain == hits_clip


def test_replication_seeds_are_prefix_stable():
    a = [s.generate_state(1)[0] for s in stats.replication_seeds(3, 4)]
    b = [s.generate_state(1)[0] for s in stats.replication_seeds(3, 8)]
    assert a == b[:4] and len(set(b)) == 8


@pytest.mark.parametrize("call, named", [
    (lambda: stats.mean_ci([1.0, 2.0], confidence=1.0), "confidence"),
    (lambda: stats.mean_ci([1.0, 2.0], confidence=0.0), "confidence"),
    (lambda: stats.percentile_ci([1.0, 2.0], 0.5, confidence=1.5), "confidence"),
    (lambda: stats.proportion_ci(1, 2, confidence=-0.1), "confidence"),
    (lambda: stats.proportion_ci(3, 2), "successes"),
    (lambda: stats.percentile_ci([1.0, math.nan], 0.5), "values"),
    (lambda: stats.percentile_ci([1.0], 1.0), "p must be"),
    (lambda: stats.replication_seeds(0, 0), "replications"),
    (lambda: stats.replication_seeds(-1, 2), "seed"),
    (lambda: stats.mser([1.0, 2.0]), "values"),
    (lambda: stats.batch_means_ci([1.0], batches=1), "batches"),
    (lambda: stats.steady_state(np.ones(100), alpha=2), "alpha"),
    (lambda: stats.warmup_cuts([]), "runs"),
    (lambda: stats.mean_ci([0.1, 0.2], bounds=(1, 0)), "bounds"),
    (lambda: stats.mean_ci([0.1, 0.2], bounds=(0, math.nan)), "bounds"),
    (lambda: stats.mean_ci([0.1, 0.2], bounds=0.5), "bounds"),
    (lambda: stats.mean_ci([0.1, 0.2], bounds="01"), "bounds"),
    (lambda: stats.mean_ci([0.1, 1.2], bounds=(0, 1)), "bounds"),
])
def test_bad_input_names_the_parameter(call, named):
    with pytest.raises(ValueError, match=named):
        call()
