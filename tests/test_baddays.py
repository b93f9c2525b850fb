"""Bad-day workload transforms (servingcap.baddays): every request accounted for, the
extra load where and when it should be, and bad input rejected."""

import numpy as np
import pandas as pd
import pytest
from servingcap import LOCKED, baddays
from servingcap.serving import Replica, simulate


@pytest.fixture
def day():
    rng = np.random.default_rng(0)
    n = 400
    return pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 100, n)),
                         "prompt_tokens": rng.integers(100, 3000, n),
                         "output_tokens": rng.integers(5, 400, n),
                         "note": np.arange(n)})


def originals_once(out, n):
    first = out[out["attempt"] == 0]
    base = first[~first["burst"]]
    assert sorted(base["request"]) == list(range(n))


def test_label_is_idempotent(day):
    once = baddays.label(day)
    assert list(once["request"]) == list(range(len(day)))
    assert (once["attempt"] == 0).all() and not once["burst"].any()
    assert baddays.label(once).equals(once)
    assert "note" in once.columns


def test_scale_prompts(day):
    out = baddays.scale_prompts(day, 2.0)
    originals_once(out, len(day))
    assert len(out) == len(day)
    assert (out.sort_values("request")["prompt_tokens"].to_numpy()
            == 2 * day["prompt_tokens"].to_numpy()).all()
    assert np.array_equal(out.sort_values("request")["arrival_s"], day["arrival_s"])
    assert baddays.scale_prompts(day, 1e-6)["prompt_tokens"].min() == 1


def test_retry_storm_adds_the_window_again(day):
    out = baddays.retry_storm(day, start_s=20.0, duration_s=10.0, delay_s=5.0)
    originals_once(out, len(day))
    in_window = day[(day.arrival_s >= 20) & (day.arrival_s < 30)]
    retries = out[out["attempt"] == 1]
    assert len(out) == len(day) + len(in_window)
    assert len(retries) == len(in_window)
    merged = retries.merge(baddays.label(day)[["request", "arrival_s", "prompt_tokens"]],
                           on="request", suffixes=("", "_orig"))
    assert np.allclose(merged["arrival_s"] - merged["arrival_s_orig"], 5.0)
    assert (merged["prompt_tokens"] == merged["prompt_tokens_orig"]).all()
    assert out["arrival_s"].is_monotonic_increasing


def test_retry_storm_share_is_seeded(day):
    a = baddays.retry_storm(day, 0.0, 100.0, 1.0, share=0.3, seed=4)
    b = baddays.retry_storm(day, 0.0, 100.0, 1.0, share=0.3, seed=4)
    assert a.equals(b)
    extra = (a["attempt"] == 1).sum()
    assert 0.2 * len(day) < extra < 0.4 * len(day)
    none = baddays.retry_storm(day, 0.0, 100.0, 1.0, share=0.0)
    assert len(none) == len(day)


def test_tenant_burst_doubles_the_tenant_in_the_window(day):
    tagged = baddays.assign_tenants(day, {"big": 0.4, "small": 0.6}, seed=1)
    assert set(tagged["tenant"]) == {"big", "small"}
    out = baddays.tenant_burst(tagged, "big", start_s=40.0, duration_s=20.0, factor=2.0, seed=2)
    originals_once(out, len(day))
    big_in = ((tagged.tenant == "big") & (tagged.arrival_s >= 40) & (tagged.arrival_s < 60)).sum()
    extra = out[out["burst"]]
    assert len(extra) == big_in                              # factor 2: one sibling each
    assert (extra["tenant"] == "big").all()
    assert extra["arrival_s"].between(40.0, 60.0).all()
    assert sorted(extra["request"]) == list(range(len(day), len(day) + len(extra)))
    # outside the window, nothing changes
    outside = out[(out.arrival_s < 40) | (out.arrival_s >= 60)]
    assert not outside["burst"].any()


def test_tenant_burst_fractional_factor(day):
    tagged = baddays.assign_tenants(day, {"a": 1.0})
    out = baddays.tenant_burst(tagged, "a", 0.0, 100.0, factor=1.5, seed=3)
    assert 0.35 * len(day) < out["burst"].sum() < 0.65 * len(day)
    triple = baddays.tenant_burst(tagged, "a", 0.0, 100.0, factor=3.0, seed=3)
    assert triple["burst"].sum() == 2 * len(day)


def test_transforms_feed_the_simulator(day):
    out = baddays.retry_storm(day, 10.0, 10.0, 2.0)
    sim = simulate(out, Replica(decode_step_s=LOCKED.decode_step_table), replicas=2)
    assert len(sim) == len(out)
    assert (sim.index == out.index).all()


@pytest.mark.parametrize("call, match", [
    (lambda d: baddays.scale_prompts(d, 0.0), "factor"),
    (lambda d: baddays.retry_storm(d, 0.0, 0.0, 1.0), "duration_s"),
    (lambda d: baddays.retry_storm(d, 0.0, 1.0, -1.0), "delay_s"),
    (lambda d: baddays.retry_storm(d, 0.0, 1.0, 1.0, share=1.5), "share"),
    (lambda d: baddays.assign_tenants(d, {}), "shares"),
    (lambda d: baddays.assign_tenants(d, {"a": 0.5, "b": 0.4}), "sum to 1"),
    (lambda d: baddays.tenant_burst(d, "a", 0.0, 1.0), "tenant"),
    (lambda d: baddays.tenant_burst(baddays.assign_tenants(d, {"a": 1.0}), "b", 0.0, 1.0),
     "tenant must be one of"),
    (lambda d: baddays.tenant_burst(baddays.assign_tenants(d, {"a": 1.0}), "a", 0.0, 1.0,
                                    factor=0.5), "factor"),
    (lambda d: baddays.label(d.drop(columns="prompt_tokens")), "prompt_tokens"),
    (lambda d: baddays.label(d.iloc[0:0]), "at least 1 request, got 0"),
    (lambda d: baddays.label([1, 2]), "DataFrame"),
])
def test_bad_input(day, call, match):
    with pytest.raises(ValueError, match=match):
        call(day)
