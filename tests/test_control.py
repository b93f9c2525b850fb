"""The capacity control loop (servingcap.control): fluid queue arithmetic, controller
timing (window, startup, stabilization), conservation, admission, and bad input."""

import math

import numpy as np
import pytest
from servingcap import traffic
from servingcap.control import (
    Controller,
    diurnal_rates,
    poisson_counts,
    simulate_control,
)

FIXED = dict(window_s=10.0, startup_s=0.0, scale_down_delay_s=0.0)


def fixed_fleet(n):
    """A controller that can only keep n replicas."""
    return Controller(min_replicas=n, max_replicas=n, **FIXED)


def test_fluid_backlog_matches_traffic_fluid_backlog():
    # 15 req/s offered for 100 s to one replica serving 10 req/s, then 5 req/s
    dt = 10.0
    rates = np.r_[np.full(10, 15.0), np.full(20, 5.0)]
    run = simulate_control(rates * dt, dt, 10.0, fixed_fleet(1), initial_replicas=1)
    ends = (np.arange(rates.size) + 1) * dt
    expected = traffic.fluid_backlog([15.0, 5.0], [100.0, 200.0], 10.0, ends)
    assert np.allclose(run.timeline["backlog"], expected)
    assert run.timeline["backlog"].max() == pytest.approx(500.0)          # 5 req/s x 100 s
    # the backlog drains at 5 req/s: empty 100 s after the burst ends
    assert run.timeline.loc[run.timeline.t_s == 190.0, "backlog"].item() == pytest.approx(0.0)
    assert run.timeline["wait_s"].max() == pytest.approx(50.0)            # 500 / 10 req/s


def test_conservation_and_ample_fleet_has_no_late_work():
    rng = np.random.default_rng(1)
    counts = poisson_counts(np.full(200, 8.0), 5.0, rng)
    run = simulate_control(counts, 5.0, 1.0, fixed_fleet(12), initial_replicas=12,
                           wait_budget_s=1.0)
    t = run.timeline
    assert t["served"].sum() + t["shed"].sum() + t.attrs["final_backlog"] == pytest.approx(counts.sum())
    assert run.late_share == 0.0 and run.shed_share == 0.0 and run.good_share == 1.0
    assert run.replica_hours == pytest.approx(12 * 200 * 5.0 / 3600)
    assert run.scale_events == 0


def test_late_fraction_inside_an_interval():
    # one interval: 0 backlog, 20 arrivals, capacity 10 -> backlog grows linearly 0 -> 10;
    # a wait budget of 0.5 s at 10 req/s is a backlog of 5 -> the second half is late
    run = simulate_control([20.0], 1.0, 10.0, fixed_fleet(1), initial_replicas=1,
                           wait_budget_s=0.5)
    assert run.timeline["late"].item() == pytest.approx(10.0)
    assert run.late_share == pytest.approx(0.5)


def test_startup_delay_and_window():
    # load steps from 5 to 20 req/s at t = 100 s; replica_rate 10, target 1.0
    dt = 10.0
    rates = np.r_[np.full(10, 5.0), np.full(30, 20.0)]
    ctrl = Controller(target_utilization=1.0, window_s=10.0, startup_s=60.0,
                      scale_down_delay_s=0.0)
    run = simulate_control(rates * dt, dt, 10.0, ctrl, initial_replicas=1)
    t = run.timeline.set_index("t_s")
    assert t.loc[100.0, "desired"] == 2            # seen at the end of the first busy interval
    assert t.loc[110.0, "booting"] == 1
    assert t.loc[160.0, "serving"] == 1            # still booting: ready at 110 + 60 = 170
    assert t.loc[170.0, "serving"] == 2
    # a longer window predicts slower: the desired count lags
    slow = simulate_control(rates * dt, dt, 10.0,
                            Controller(target_utilization=1.0, window_s=100.0, startup_s=60.0,
                                       scale_down_delay_s=0.0), initial_replicas=1)
    assert slow.timeline.set_index("t_s").loc[100.0, "desired"] == 1
    assert slow.timeline["backlog"].max() > run.timeline["backlog"].max()


def test_scale_down_waits_for_the_stabilization_window():
    dt = 10.0
    rates = np.r_[np.full(10, 30.0), np.full(40, 5.0)]
    common = dict(target_utilization=1.0, window_s=10.0, startup_s=0.0)
    quick = simulate_control(rates * dt, dt, 10.0, Controller(scale_down_delay_s=0.0, **common),
                             initial_replicas=3)
    held = simulate_control(rates * dt, dt, 10.0, Controller(scale_down_delay_s=120.0, **common),
                            initial_replicas=3)
    q = quick.timeline.set_index("t_s")["serving"]
    h = held.timeline.set_index("t_s")["serving"]
    assert q.loc[110.0] == 1                       # shrank right after the load fell
    assert h.loc[110.0] == 3 and h.loc[200.0] == 3
    assert h.iloc[-1] == 1
    assert held.replica_hours > quick.replica_hours


def test_cold_replicas_serve_less():
    dt = 10.0
    counts = np.full(30, 150.0)                       # 15 req/s
    warm = simulate_control(counts, dt, 10.0, fixed_fleet(2), initial_replicas=2)
    assert warm.timeline["backlog"].max() == 0.0
    # a fleet that starts at 0 and launches 2 cold replicas (half speed for 100 s)
    ctrl = Controller(target_utilization=1.0, min_replicas=2, max_replicas=2, **FIXED)
    cold = simulate_control(counts, dt, 10.0, ctrl, initial_replicas=0, cold_factor=0.5,
                            warmup_s=100.0)
    t = cold.timeline.set_index("t_s")
    assert t.loc[0.0, "serving"] == 0 and t.loc[10.0, "serving"] == 2
    assert t.loc[10.0, "capacity_rps"] == pytest.approx(10.0)      # 2 x 10 x 0.5
    assert t.loc[110.0, "capacity_rps"] == pytest.approx(20.0)
    assert cold.cold_share > 0 and cold.launches == 2


def test_fast_controller_oscillates_and_tuned_one_does_not():
    rng = np.random.default_rng(7)
    dt = 10.0
    counts = poisson_counts(np.full(360, 12.0), dt, rng)
    fast = Controller(target_utilization=0.8, window_s=10.0, startup_s=90.0,
                      scale_down_delay_s=0.0)
    tuned = Controller(target_utilization=0.8, window_s=60.0, startup_s=90.0,
                       scale_down_delay_s=600.0)
    f = simulate_control(counts, dt, 1.2, fast, cold_factor=0.6, warmup_s=300.0)
    g = simulate_control(counts, dt, 1.2, tuned, cold_factor=0.6, warmup_s=300.0)
    assert f.scale_events > 10 * max(g.scale_events, 1)
    assert f.launches > g.launches
    assert f.cold_share > g.cold_share


def test_shedding_bounds_the_wait():
    dt = 10.0
    counts = np.full(20, 300.0)                       # 30 req/s onto 10 req/s
    run = simulate_control(counts, dt, 10.0, fixed_fleet(1), initial_replicas=1,
                           wait_budget_s=2.0, shed_wait_s=1.0)
    t = run.timeline
    assert t["wait_s"].max() <= 1.0 + 1e-9
    assert run.late_share == 0.0
    assert run.shed_share == pytest.approx((counts.sum() - t["served"].sum()
                                            - t.attrs["final_backlog"]) / counts.sum())
    assert run.shed_share == pytest.approx(2 / 3, abs=0.01)


def test_no_serving_replicas_means_everything_waits():
    run = simulate_control([10.0, 10.0], 1.0, 5.0, Controller(min_replicas=0, max_replicas=0,
                                                                **FIXED),
                           initial_replicas=0, wait_budget_s=1.0)
    assert run.late_share == 1.0
    assert math.isinf(run.max_wait_s)


def test_diurnal_rates_shape():
    r = diurnal_rates(86_400, 3_600, 10.0, 0.5, trough_at_s=1_800)
    assert r.size == 24
    assert r.min() == pytest.approx(5.0) and r[0] == pytest.approx(5.0)
    assert r.max() == pytest.approx(15.0) and int(np.argmax(r)) == 12
    assert r.mean() == pytest.approx(10.0)


def test_poisson_counts_are_seeded():
    a = poisson_counts([1.0, 2.0, 3.0], 10.0, 3)
    b = poisson_counts([1.0, 2.0, 3.0], 10.0, np.random.default_rng(3))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    (dict(target_utilization=0.0), "target_utilization"),
    (dict(target_utilization=1.5), "target_utilization"),
    (dict(window_s=0.0), "window_s"),
    (dict(startup_s=-1.0), "startup_s"),
    (dict(scale_down_delay_s=-1.0), "scale_down_delay_s"),
    (dict(backlog_drain_s=0.0), "backlog_drain_s"),
    (dict(min_replicas=3, max_replicas=2), "max_replicas"),
])
def test_controller_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Controller(**kwargs)


@pytest.mark.parametrize("args, kwargs, match", [
    (([], 1.0, 1.0), {}, "arrivals"),
    (([-1.0], 1.0, 1.0), {}, "arrivals"),
    (([1.0], 0.0, 1.0), {}, "dt_s"),
    (([1.0], 1.0, float("nan")), {}, "replica_rate"),
    (([1.0], 1.0, 1.0), dict(cold_factor=1.5), "cold_factor"),
    (([1.0], 1.0, 1.0), dict(warmup_s=-1), "warmup_s"),
    (([1.0], 1.0, 1.0), dict(wait_budget_s=0), "wait_budget_s"),
    (([1.0], 1.0, 1.0), dict(shed_wait_s=-1), "shed_wait_s"),
    (([1.0], 1.0, 1.0), dict(initial_replicas=-1), "initial_replicas"),
])
def test_simulate_control_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate_control(*args, Controller(), **kwargs)


def test_simulate_control_needs_a_controller():
    with pytest.raises(ValueError, match="controller"):
        simulate_control([1.0], 1.0, 1.0, {"window_s": 1})
