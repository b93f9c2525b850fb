"""Unit tests for servingcap.queues: every closed form against an independent computation.

References are computed here from first principles (the textbook formulas, the classic
Erlang B recursion, exact decimal arithmetic), never by calling the function under test
a second way and never by typing in the value the package prints.
"""

import math
import re
from decimal import Decimal, getcontext

import numpy as np
import pytest
import servingcap
from scipy import special, stats
from servingcap import queues, sim
from servingcap.queues import (
    MG1,
    MM1,
    MMc,
    erlang_b,
    erlang_c,
    halfin_whitt_prob_wait,
    little,
    little_check,
    sqrt_staffing,
    sqrt_staffing_beta,
    sqrt_staffing_load,
)


def erlang_b_recursion(c, a):
    """Erlang B by the classic recursion B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1))."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c_logsum(c, a):
    """Erlang C from its defining sum, in log space (independent of Erlang B).

    C = [a^c/c! * c/(c-a)] / [sum_{k<c} a^k/k! + a^c/c! * c/(c-a)].
    """
    k = np.arange(c)
    log_terms = k * math.log(a) - special.gammaln(k + 1)
    log_top = c * math.log(a) - special.gammaln(c + 1) + math.log(c / (c - a))
    log_bottom = special.logsumexp(np.append(log_terms, log_top))
    return math.exp(log_top - log_bottom)


def erlang_c_decimal(c, a, digits=60):
    """Erlang C via the Erlang B recursion in 60-digit decimal arithmetic."""
    getcontext().prec = digits
    a_d, b = Decimal(str(a)), Decimal(1)
    for k in range(1, c + 1):
        b = a_d * b / (k + a_d * b)
    c_d = Decimal(c)
    return float(c_d * b / (c_d - a_d * (1 - b)))


# --------------------------------------------------------------------------- Little


class TestLittle:
    def test_seed_example_20_per_s_times_half_second_is_10(self):
        assert little(arrival_rate=20, time_in_system=0.5) == 10.0

    def test_solves_each_term(self):
        assert little(L=10, arrival_rate=20) == pytest.approx(0.5)
        assert little(L=10, time_in_system=0.5) == pytest.approx(20.0)
        assert little(arrival_rate=3.0, time_in_system=7.0) == pytest.approx(21.0)

    @pytest.mark.parametrize("kwargs", [{}, {"L": 1.0}, {"L": 1.0, "arrival_rate": 2.0,
                                                         "time_in_system": 0.5}])
    def test_needs_exactly_two_terms(self, kwargs):
        with pytest.raises(ValueError, match="exactly two"):
            little(**kwargs)

    def test_zero_time_cannot_give_a_rate(self):
        with pytest.raises(ValueError, match="time_in_system"):
            little(L=3.0, time_in_system=0.0)

    def test_consistent_dashboard(self):
        check = little_check(L=10, arrival_rate=20, time_in_system=0.5)
        assert check.consistent
        assert check.implied_L == pytest.approx(10.0)
        assert check.ratio == pytest.approx(1.0)
        assert str(check).startswith("consistent")

    def test_seed_inconsistent_dashboard_100_in_flight(self):
        # 20 req/s x 0.5 s implies 10 in flight; a dashboard showing 100 is off by 10x.
        check = little_check(L=100, arrival_rate=20, time_in_system=0.5)
        assert not check.consistent
        assert check.implied_L == pytest.approx(10.0)
        assert check.ratio == pytest.approx(10.0)
        text = str(check)
        assert text.startswith("INCONSISTENT")
        assert "100" in text and "10 in flight" in text

    def test_rtol_boundary(self):
        # 4 % off passes the default 5 % tolerance, 6 % off does not.
        assert little_check(10.4, 20, 0.5).consistent
        assert not little_check(10.6, 20, 0.5).consistent
        assert little_check(10.6, 20, 0.5, rtol=0.1).consistent


# --------------------------------------------------------------------------- M/M/1


class TestMM1:
    def test_textbook_values(self):
        q = MM1(arrival_rate=0.8, service_rate=1.0)
        assert q.utilization == pytest.approx(0.8)
        assert q.mean_service == pytest.approx(1.0)
        assert q.mean_response == pytest.approx(1 / (1.0 - 0.8))
        assert q.mean_wait == pytest.approx(0.8 / (1.0 - 0.8))
        assert q.mean_in_system == pytest.approx(0.8 / 0.2)

    def test_littles_law_holds_inside_the_model(self):
        q = MM1(3.0, 4.0)
        assert q.mean_in_system == pytest.approx(q.arrival_rate * q.mean_response)
        assert q.mean_response == pytest.approx(q.mean_wait + q.mean_service)

    def test_response_quantile_is_exponential_quantile(self):
        q = MM1(0.9, 1.0)
        for p in (0.5, 0.95, 0.99, 0.999):
            expected = stats.expon(scale=1 / (1.0 - 0.9)).ppf(p)
            assert q.response_quantile(p) == pytest.approx(expected, rel=1e-12)

    def test_response_cdf(self):
        q = MM1(0.5, 1.0)
        t = np.array([-1.0, 0.0, 1.0, 3.0])
        expected = np.where(t < 0, 0.0, 1 - np.exp(-0.5 * np.maximum(t, 0)))
        np.testing.assert_allclose(q.response_cdf(t), expected, rtol=1e-14)

    def test_wait_quantile_has_atom_at_zero(self):
        q = MM1(0.8, 1.0)  # P(wait = 0) = 1 - rho = 0.2
        assert q.wait_quantile(0.1) == 0.0
        assert q.wait_quantile(0.2) == 0.0
        assert q.wait_quantile(0.99) == pytest.approx(math.log(0.8 / 0.01) / 0.2)
        assert q.wait_cdf(0.0) == pytest.approx(0.2)
        assert q.wait_cdf(-0.1) == 0.0

    def test_scales_with_service_time(self):
        # Halving every time (doubling both rates) halves every latency.
        a, b = MM1(0.7, 1.0), MM1(1.4, 2.0)
        assert b.mean_response == pytest.approx(a.mean_response / 2)
        assert b.response_quantile(0.99) == pytest.approx(a.response_quantile(0.99) / 2)


# --------------------------------------------------------------------------- M/G/1


class TestMG1:
    def test_cv_one_equals_mm1(self):
        g, m = MG1(0.8, 1.0, 1.0), MM1(0.8, 1.0)
        assert g.mean_wait == pytest.approx(m.mean_wait)
        assert g.mean_response == pytest.approx(m.mean_response)
        assert g.utilization == pytest.approx(m.utilization)
        assert g.variance_penalty == 1.0

    def test_pollaczek_khinchine_formula(self):
        lam, s, cv = 2.0, 0.3, 1.7
        rho = lam * s
        expected = rho * s * (1 + cv**2) / (2 * (1 - rho))
        g = MG1(lam, s, cv)
        assert g.mean_wait == pytest.approx(expected)
        assert g.mean_response == pytest.approx(expected + s)
        assert g.mean_queue_length == pytest.approx(lam * expected)

    @pytest.mark.parametrize("cv, penalty", [(0.0, 0.5), (1.0, 1.0), (2.0, 2.5), (3.0, 5.0)])
    def test_variance_penalty(self, cv, penalty):
        g, m = MG1(0.8, 1.0, cv), MM1(0.8, 1.0)
        assert g.variance_penalty == pytest.approx(penalty)
        # The waiting component scales by (1 + C_v^2)/2 relative to M/M/1 at equal rho.
        assert g.mean_wait / m.mean_wait == pytest.approx(penalty)

    def test_seed_cv_two_is_two_and_a_half_times(self):
        for rho in (0.5, 0.7, 0.9, 0.95):
            assert MG1(rho, 1.0, 2.0).mean_wait == pytest.approx(2.5 * MM1(rho, 1.0).mean_wait)

    def test_from_service_times(self):
        x = np.array([1.0, 2.0, 3.0, 6.0])
        g = MG1.from_service_times(0.1, x)
        assert g.mean_service == pytest.approx(3.0)
        assert g.service_cv == pytest.approx(x.std() / 3.0)

    def test_from_service_times_needs_two(self):
        with pytest.raises(ValueError, match="service_times"):
            MG1.from_service_times(0.1, [1.0])


# --------------------------------------------------------------------------- M/M/c


class TestMMc:
    @pytest.mark.parametrize("lam, mu", [(0.3, 1.0), (0.8, 1.0), (4.5, 5.0)])
    def test_one_server_equals_mm1(self, lam, mu):
        c, m = MMc(lam, mu, 1), MM1(lam, mu)
        assert c.prob_wait == pytest.approx(m.utilization)
        assert c.mean_wait == pytest.approx(m.mean_wait)
        assert c.mean_response == pytest.approx(m.mean_response)
        for p in (0.1, 0.5, 0.9, 0.99):
            assert c.wait_quantile(p) == pytest.approx(m.wait_quantile(p), abs=1e-12)

    def test_two_servers_textbook(self):
        # M/M/2 with a = 1: C = 1/3 (hand computation), W_q = C / (2 mu - lam) = 1/3.
        q = MMc(1.0, 1.0, 2)
        assert q.prob_wait == pytest.approx(1 / 3)
        assert q.mean_wait == pytest.approx(1 / 3)
        assert q.utilization == pytest.approx(0.5)
        assert q.offered_load == pytest.approx(1.0)
        assert q.mean_queue_length == pytest.approx(1 / 3)

    def test_wait_distribution(self):
        q = MMc(6.8, 1.0, 8)
        cw = erlang_c_logsum(8, 6.8)
        assert q.prob_wait == pytest.approx(cw, rel=1e-12)
        assert q.mean_wait == pytest.approx(cw / (8 - 6.8), rel=1e-12)
        assert q.wait_cdf(0.0) == pytest.approx(1 - cw)
        assert q.wait_quantile(0.99) == pytest.approx(math.log(cw / 0.01) / 1.2)
        assert q.wait_quantile(1 - q.prob_wait) == 0.0
        assert q.wait_quantile(0.999 * (1 - q.prob_wait)) == 0.0

    @pytest.mark.parametrize("lam, mu", [(0.3, 1.0), (0.8, 1.0), (4.5, 5.0)])
    def test_one_server_response_equals_mm1(self, lam, mu):
        c, m = MMc(lam, mu, 1), MM1(lam, mu)
        for p in (0.1, 0.5, 0.95, 0.99):
            assert c.response_quantile(p) == pytest.approx(m.response_quantile(p), rel=1e-9)
        assert c.response_cdf(1.3) == pytest.approx(m.response_cdf(1.3), rel=1e-12)

    def test_response_quantile_matches_simulation(self):
        # M/M/8 at rho = 0.85, 400,000 customers (5 % warm-up): the p95's sampling error
        # with correlated waits is well under 1 %; 2 % leaves room for it.
        q = MMc(6.8, 1.0, 8)
        rng = np.random.default_rng(7)
        _, service, waits = sim.mmc_sample(6.8, 1.0, 400_000, rng, servers=8)
        resp = (waits + service)[20_000:]
        for p in (0.5, 0.95, 0.99):
            assert np.quantile(resp, p) == pytest.approx(q.response_quantile(p), rel=0.02)
        assert q.response_cdf(q.response_quantile(0.95)) == pytest.approx(0.95, abs=1e-9)
        assert q.response_cdf(-1.0) == 0.0

    def test_response_when_drain_equals_service_rate(self):
        # c mu - lambda = mu (M/M/2, lam = mu): the wait-plus-service term is Erlang-2.
        q = MMc(1.0, 1.0, 2)
        t = 2.0
        sf = (1 - 1 / 3) * math.exp(-t) + (1 / 3) * (1 + t) * math.exp(-t)
        assert 1 - q.response_cdf(t) == pytest.approx(sf, rel=1e-12)

    def test_accepts_integer_valued_float_servers(self):
        assert MMc(1.0, 1.0, 2.0).servers == 2
        assert MMc(1.0, 1.0, np.int64(2)).servers == 2


# --------------------------------------------------------------------------- Erlang


ERLANG_GRID = [(c, a) for c in (1, 2, 3, 5, 8, 13, 32, 100, 311, 1000)
               for a in (0.01, 0.5, 1.0, 2.7, 7.9, 31.0, 99.5, 277.5, 500.0)]


@pytest.mark.parametrize("c, a", ERLANG_GRID)
def test_erlang_b_matches_recursion(c, a):
    assert erlang_b(c, a) == pytest.approx(erlang_b_recursion(c, a), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("c, a", [(c, a) for c, a in ERLANG_GRID if a < c])
def test_erlang_c_matches_defining_sum(c, a):
    assert erlang_c(c, a) == pytest.approx(erlang_c_logsum(c, a), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("c, a", [(1, 800.0), (10, 1000.0), (100, 2000.0), (1000, 1e5)])
def test_erlang_b_heavily_overloaded_loss_system(c, a):
    b = erlang_b(c, a)
    assert 0 < b <= 1
    assert b == pytest.approx(erlang_b_recursion(c, a), rel=1e-9)


@pytest.mark.parametrize("c, a", [(5000, 4900.0), (3000, 2990.0), (20000, 19700.5)])
def test_erlang_c_stable_for_thousands_of_servers(c, a):
    got = erlang_c(c, a)
    assert math.isfinite(got) and 0 < got < 1
    assert got == pytest.approx(erlang_c_decimal(c, a), rel=1e-9)
    assert got == pytest.approx(erlang_c_logsum(c, a), rel=1e-9)


def test_erlang_c_in_halfin_whitt_regime():
    # Under c = a + 2 sqrt(a), Erlang C tends to the Halfin-Whitt limit as a grows.
    a = 40_000.0
    c = sqrt_staffing(a, 2.0)
    assert c == 40_400
    assert erlang_c(c, a) == pytest.approx(halfin_whitt_prob_wait(2.0), abs=2e-3)


def test_sqrt_staffing_seed_example():
    c = sqrt_staffing(277.5, 2)
    assert c == 311 and isinstance(c, int)
    assert 310 < 277.5 + 2 * math.sqrt(277.5) <= 311


@pytest.mark.parametrize("a, beta, expected", [
    (4.0, 0.0, 5),      # a whole: beta = 0 still needs one more than a to be stable
    (4.5, 0.0, 5),
    (100.0, 1.0, 110),  # target exactly 110: no spurious extra server
    (100.0, 1.01, 111),
    (0.3, 2.0, 2),      # 0.3 + 2*0.548 = 1.395 -> 2
])
def test_sqrt_staffing_values(a, beta, expected):
    assert sqrt_staffing(a, beta) == expected


def test_sqrt_staffing_inverses_on_the_halfin_whitt_example():
    # 40,000 Erlangs at beta = 2 need exactly 40,000 + 2 * 200 = 40,400 servers, so
    # the inverses must recover each number from the other two (to round-off)
    assert sqrt_staffing_beta(40_400, 40_000.0) == pytest.approx(2.0, rel=1e-12)
    assert sqrt_staffing_load(40_400, 2.0) == pytest.approx(40_000.0, rel=1e-12)
    assert sqrt_staffing(sqrt_staffing_load(40_400, 2.0), 2.0) == 40_400


@pytest.mark.parametrize("c", [0.5, 3, 8, 7.5, 256, 1e6])
@pytest.mark.parametrize("beta", [1e-3, 0.8, 2.0, 50.0])
def test_sqrt_staffing_load_inverts_beta_and_pools(c, beta):
    a = sqrt_staffing_load(c, beta)
    assert 0 < a < c
    assert a + beta * math.sqrt(a) == pytest.approx(c, rel=1e-12)
    assert sqrt_staffing_beta(c, a) == pytest.approx(beta, rel=1e-9)
    # pooling: one server more carries more per server at the same beta
    assert sqrt_staffing_load(c + 1, beta) / (c + 1) > a / c


def test_halfin_whitt_beta_two():
    phi, Phi = stats.norm.pdf(2.0), stats.norm.cdf(2.0)
    expected = 1 / (1 + 2.0 * Phi / phi)
    assert halfin_whitt_prob_wait(2.0) == pytest.approx(expected, rel=1e-12)
    assert round(halfin_whitt_prob_wait(2.0), 3) == 0.027


@pytest.mark.parametrize("beta", [0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0])
def test_halfin_whitt_matches_normal_ratio(beta):
    expected = 1 / (1 + beta * stats.norm.cdf(beta) / stats.norm.pdf(beta))
    assert halfin_whitt_prob_wait(beta) == pytest.approx(expected, rel=1e-10)


def test_halfin_whitt_decreasing_and_finite_for_large_beta():
    values = [halfin_whitt_prob_wait(b) for b in (0.5, 1, 2, 5, 10, 20, 30)]
    assert all(math.isfinite(v) and 0 < v < 1 for v in values)
    assert all(x > y for x, y in zip(values, values[1:], strict=False))


def test_pooled_311_slots_wait_about_three_percent():
    p = erlang_c(311, 277.5)
    assert p == pytest.approx(erlang_c_logsum(311, 277.5), rel=1e-9)
    assert round(p, 2) == 0.03


# --------------------------------------------------------------------------- bad input


BAD_INPUTS = [
    # (callable, args, parameter named in the message, repr of the bad value)
    (MM1, (-1.0, 1.0), "arrival_rate", "-1.0"),
    (MM1, (0.5, float("nan")), "service_rate", "nan"),
    (MM1, (float("inf"), 1.0), "arrival_rate", "inf"),
    (MM1, (True, 2.0), "arrival_rate", "True"),
    (MM1, ("1", 2.0), "arrival_rate", "'1'"),
    (MM1, (0.0, 1.0), "arrival_rate", "0.0"),
    (MG1, (0.5, -2.0, 1.0), "mean_service", "-2.0"),
    (MG1, (0.5, 1.0, -0.1), "service_cv", "-0.1"),
    (MG1, (0.5, 1.0, float("nan")), "service_cv", "nan"),
    (MMc, (1.0, 1.0, 0), "servers", "0"),
    (MMc, (1.0, 1.0, 2.5), "servers", "2.5"),
    (MMc, (1.0, 1.0, True), "servers", "True"),
    (MMc, (1.0, 1.0, float("nan")), "servers", "nan"),
    (MMc, (-3.0, 1.0, 4), "arrival_rate", "-3.0"),
    (erlang_b, (0, 1.0), "servers", "0"),
    (erlang_b, (-2, 1.0), "servers", "-2"),
    (erlang_b, (3.5, 1.0), "servers", "3.5"),
    (erlang_b, (3, -1.0), "offered_load", "-1.0"),
    (erlang_c, (3, float("nan")), "offered_load", "nan"),
    (erlang_c, (0, 1.0), "servers", "0"),
    (sqrt_staffing, (-5.0, 2.0), "offered_load", "-5.0"),
    (sqrt_staffing, (5.0, -1.0), "beta", "-1.0"),
    (sqrt_staffing, (5.0, float("inf")), "beta", "inf"),
    (sqrt_staffing_beta, (0, 1.0), "servers", "0"),
    (sqrt_staffing_beta, (8, -1.0), "offered_load", "-1.0"),
    (sqrt_staffing_load, (-8.0, 1.0), "servers", "-8.0"),
    (sqrt_staffing_load, (8, 0.0), "beta", "0.0"),
    (sqrt_staffing_load, (8, float("nan")), "beta", "nan"),
    (halfin_whitt_prob_wait, (0.0,), "beta", "0.0"),
    (little_check, (-1.0, 20.0, 0.5), "L", "-1.0"),
    (little_check, (10.0, 0.0, 0.5), "arrival_rate", "0.0"),
]


@pytest.mark.parametrize("func, args, name, shown", BAD_INPUTS,
                         ids=[f"{f.__name__}-{n}-{s}" for f, _, n, s in BAD_INPUTS])
def test_bad_input_names_parameter_and_value(func, args, name, shown):
    with pytest.raises(ValueError) as info:
        func(*args)
    assert not isinstance(info.value, servingcap.UnstableQueueError)
    message = str(info.value)
    assert message.startswith(name + " "), message
    assert shown in message, message


@pytest.mark.parametrize("kwargs, name, shown", [
    ({"L": -1.0, "arrival_rate": 2.0}, "L", "-1.0"),
    ({"arrival_rate": float("nan"), "time_in_system": 2.0}, "arrival_rate", "nan"),
    ({"arrival_rate": 2.0, "time_in_system": -0.5}, "time_in_system", "-0.5"),
    ({"arrival_rate": 2.0, "time_in_system": False}, "time_in_system", "False"),
])
def test_little_bad_input(kwargs, name, shown):
    with pytest.raises(ValueError) as info:
        little(**kwargs)
    assert name in str(info.value) and shown in str(info.value)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.5, 1.5, float("nan"), True])
def test_quantile_level_outside_open_unit_interval(p):
    for q in (MM1(0.5, 1.0), MMc(1.0, 1.0, 2)):
        methods = [q.wait_quantile] + ([q.response_quantile] if isinstance(q, MM1) else [])
        for method in methods:
            with pytest.raises(ValueError) as info:
                method(p)
            assert str(info.value).startswith("p ") and repr(p) in str(info.value)


@pytest.mark.parametrize("func, args, rho", [
    (MM1, (1.0, 1.0), "1"),
    (MM1, (2.0, 1.0), "2"),
    (MG1, (2.0, 0.6, 1.0), "1.2"),
    (MMc, (8.0, 1.0, 8), "1"),
    (MMc, (9.0, 1.0, 8), "1.125"),
    (erlang_c, (8, 8.0), "1"),
    (erlang_c, (8, 10.0), "1.25"),
    (sqrt_staffing_beta, (8, 8.0), "1"),
    (sqrt_staffing_beta, (8, 10.0), "1.25"),
])
def test_unstable_queue_raises_and_shows_rho(func, args, rho):
    with pytest.raises(servingcap.UnstableQueueError) as info:
        func(*args)
    assert isinstance(info.value, ValueError)
    assert f"rho = {rho} " in str(info.value)
    assert "unstable" in str(info.value)


def test_public_names():
    for name in ("little", "little_check", "MM1", "MG1", "MMc", "erlang_b", "erlang_c",
                 "sqrt_staffing", "sqrt_staffing_beta", "sqrt_staffing_load",
                 "halfin_whitt_prob_wait"):
        assert name in queues.__all__


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("bad", [math.nan, None, "1", [0.5, math.nan], True])
def test_cdfs_refuse_nan_and_non_numbers(bad):
    for cdf in (MM1(0.5, 1.0).response_cdf, MM1(0.5, 1.0).wait_cdf, MMc(1.0, 1.0, 2).wait_cdf):
        with pytest.raises(ValueError, match="^t must"):
            cdf(bad)


def test_cdfs_at_infinity_are_exact():
    m = MM1(0.5, 1.0)
    assert m.response_cdf(math.inf) == 1.0 and m.response_cdf(-math.inf) == 0.0
    np.testing.assert_array_equal(m.wait_cdf([-math.inf, math.inf]), [0.0, 1.0])


@pytest.mark.parametrize("kwargs, names", [
    ({"L": 1e308, "time_in_system": 1e-308}, "L=1e+308 / time_in_system=1e-308"),
    ({"arrival_rate": 1e200, "time_in_system": 1e200}, "arrival_rate=1e+200 * time_in_system"),
    ({"L": 1e308, "arrival_rate": 1e-10}, "L=1e+308 / arrival_rate=1e-10"),
])
def test_little_overflow_is_an_error_naming_the_inputs(kwargs, names):
    with pytest.raises(servingcap._check.NumericOverflowError, match=re.escape(names)):
        little(**kwargs)


def test_erlang_b_past_the_recursion_limit_matches_the_recursion():
    # The bounded-cost path (c > 100,000, a > c) against the classic O(c) recursion,
    # which is exact; scipy's log-space Poisson ratio is good to ~1e-9 relative.
    for c, a in ((100_001, 100_011.0), (150_000, 1.1 * 150_000), (120_000, 5e6)):
        assert erlang_b(c, a) == pytest.approx(erlang_b_recursion(c, a), rel=1e-8)


def test_erlang_b_huge_is_fast_and_bounded():
    # Used to loop 10**9 times. B(c, 2c) -> 1/2 as c grows (1/B = sum (1/2)^k ...).
    assert erlang_b(10**9, 2e9) == pytest.approx(0.5, rel=1e-8)
    assert erlang_b(10**12, 1e15) == pytest.approx(1 - 1e-3, rel=1e-9)
    with pytest.raises(ValueError, match="servers must be <="):
        erlang_b(10**13, 2e13)
