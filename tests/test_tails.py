"""servingcap.tails: segment quantiles, tail shares, timeouts counted vs dropped, retries."""

import math

import numpy as np
import pandas as pd
import pytest
from servingcap import slo, tails
from servingcap.serving import Replica


def frame(ttft, outcome=None, seg=None):
    n = len(ttft)
    outcome = outcome or ["done"] * n
    arrival = np.arange(n, dtype=float)
    ttft = np.asarray(ttft, dtype=float)
    done = np.array([o == "done" for o in outcome])
    finish = np.where(done, arrival + ttft + 1.0, arrival + 10.0)   # failures known after 10 s
    out = pd.DataFrame({"arrival_s": arrival, "ttft_s": np.where(done, ttft, np.nan),
                        "e2e_s": np.where(done, ttft + 1.0, np.nan), "finish_s": finish,
                        "outcome": outcome})
    if seg is not None:
        out["seg"] = seg
    return out


def test_segment_quantiles_and_counts():
    f = frame([1, 2, 3, 4, 10, 20, 30, 40], seg=list("aaaabbbb"))
    t = tails.tail_by_segment(f, "seg", columns="ttft_s", quantiles=(0.5, 0.99), tail_p=0.75)
    assert list(t.segment) == ["a", "b"]
    assert list(t.requests) == [4, 4]
    assert t.share.tolist() == [0.5, 0.5]
    assert t.ttft_s_p50.tolist() == [2.0, 20.0]          # inverted-CDF quantile
    assert t.ttft_s_p99.tolist() == [4.0, 40.0]
    # overall p75 = 20: the tail is {20, 30, 40}, all from b
    assert t.ttft_s_tail_share.tolist() == [0.0, 1.0]
    assert (t.dimension == "seg").all()


def test_tail_counts_and_chance_of_overrepresentation():
    # 8 requests, tail {20, 30, 40} (3 of 8), all 3 from b (4 of 8): by hand, a random
    # 3-subset is all-b with probability C(4,3)/C(8,3) = 4/56; any subset holds >= 0 a's
    f = frame([1, 2, 3, 4, 10, 20, 30, 40], seg=list("aaaabbbb"))
    t = tails.tail_by_segment(f, "seg", columns="ttft_s", tail_p=0.75).set_index("segment")
    assert t.ttft_s_tail_requests.to_dict() == {"a": 0, "b": 3}
    assert t.loc["b", "ttft_s_tail_p"] == pytest.approx(4 / 56)
    assert t.loc["a", "ttft_s_tail_p"] == pytest.approx(1.0)
    # a segment spread evenly through the ranks is not flagged: one of b's 4 in a
    # 2-request tail; P(>= 1 of b) = 1 - C(4,2)/C(8,2) = 1 - 6/28
    g = frame([1, 2, 3, 4, 5, 6, 7, 8], seg=list("abababab"))
    u = tails.tail_by_segment(g, "seg", columns="ttft_s", tail_p=0.8).set_index("segment")
    assert u.ttft_s_tail_requests.to_dict() == {"a": 1, "b": 1}
    assert u.loc["b", "ttft_s_tail_p"] == pytest.approx(1 - 6 / 28)
    # dropped failures are outside the population a tail is drawn from
    h = frame([1, 2, 3, 0], ["done", "done", "done", "timed_out"], seg=list("aabb"))
    d = tails.tail_by_segment(h, "seg", columns="ttft_s", tail_p=0.6,
                              failures="drop").set_index("segment")
    # kept {1, 2, 3}, p60 = 2: tail {2, 3}, one a and one b; b has 1 kept request:
    # P(>= 1 of b's 1 in a 2-subset of 3) = 2/3
    assert d.ttft_s_tail_requests.to_dict() == {"a": 1, "b": 1}
    assert d.loc["b", "ttft_s_tail_p"] == pytest.approx(2 / 3)


def test_tail_shares_sum_to_one_and_follow_categories():
    rng = np.random.default_rng(1)
    x = rng.exponential(1.0, 1000)
    labels = pd.Categorical(rng.choice(["z", "y", "x"], 1000), categories=["z", "y", "x"])
    f = frame(x)
    s = tails.tail_shares(f, labels, p=0.9)
    assert list(s.index) == ["z", "y", "x"]
    assert math.isclose(s.sum(), 1.0)
    mask, thr = tails.tail_mask(f, 0.9)
    assert mask.sum() == 101 and thr == pytest.approx(np.quantile(x, 0.9, method="inverted_cdf"))


def test_timeouts_counted_vs_dropped():
    # 98 fast requests and 2 timeouts: dropping them flatters p99
    f = frame(list(np.linspace(0.1, 1.0, 98)) + [0, 0], ["done"] * 98 + ["timed_out"] * 2)
    w = tails.quantile_ways(f, 0.99)
    assert w["drop"] == pytest.approx(1.0)
    assert w["censor"] == pytest.approx(10.0)              # known to have failed at 10 s
    assert math.isinf(w["inf"])
    assert w["inf"] == slo.latency_quantile(f, 0.99)        # the same rule as slo
    assert w["failed_share"] == pytest.approx(0.02)
    t = tails.tail_by_segment(f, f.outcome.astype(str), columns="ttft_s", quantiles=(0.5,))
    assert t.set_index("segment").ttft_s_tail_share.to_dict() == {"done": 0.0, "timed_out": 1.0}
    dropped = tails.tail_by_segment(f, f.outcome.astype(str), columns="ttft_s", failures="drop")
    assert np.isnan(dropped.set_index("segment").loc["timed_out", "ttft_s_p99"])


def test_length_buckets_and_burst_windows():
    b = tails.length_buckets([10, 500, 511, 512, 5000], [500, 512])
    assert list(b.categories) == ["< 500 tokens", "500-511 tokens", ">= 512 tokens"]
    assert list(b.codes) == [0, 1, 1, 2, 2]
    arrivals = np.r_[np.linspace(0, 9.9, 50), np.linspace(10, 19.9, 5), np.linspace(20, 29.9, 5)]
    labels, counts = tails.burst_windows(arrivals, 10.0, busy_share=0.34)
    assert counts.tolist() == [50, 5, 5]
    assert (labels[:50] == "burst window").all() and (labels[50:] == "ordinary window").all()


def test_sequential_paths():
    calls = pd.DataFrame({"task": [0, 0, 1], "arrival_s": [0.0, 5.0, 1.0],
                          "start_s": [1.0, 5.0, 1.0], "finish_s": [4.0, 7.0, 3.0]})
    p = tails.sequential_paths(calls)
    assert p.loc[0].tolist() == [2, 1.0, 6.0, 4.0, 7.0, 1.0]
    assert p.loc[1, "span_s"] == 2.0


def test_simulate_with_retries_tags_retries():
    # one slot, 10 s jobs: the second and third requests time out after 1 s and retry
    req = pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [8, 8, 8],
                        "output_tokens": [2, 2, 2], "priority": [0, 1, 1]})
    rep = Replica(prefill_rate=8000, decode_step_s=5.0, max_batch=1, timeout_s=1.0)
    out = tails.simulate_with_retries(req, rep, retry_delay_s=20.0)
    assert out.attempt.tolist() == [0, 0, 0, 1, 1]
    assert out.request.tolist() == [0, 1, 2, 1, 2]
    assert out.outcome.astype(str).tolist()[:3] == ["done", "timed_out", "timed_out"]
    assert out.arrival_s.tolist()[3:] == pytest.approx([21.1, 21.2])
    assert out.priority.tolist() == [0, 1, 1, 1, 1]
    assert out.attrs["converged"] and out.attrs["missing_retries"] == 0
    assert out.user_e2e_s.iloc[3] == pytest.approx(out.finish_s.iloc[3] - 0.1)


@pytest.mark.parametrize("call, needle", [
    (lambda f: tails.tail_by_segment(f, "seg", tail_p=1.5), "tail_p"),
    (lambda f: tails.tail_by_segment(f, "seg", quantiles=(0.5, 0.0)), "quantiles"),
    (lambda f: tails.tail_by_segment(f, "nope"), "'nope'"),
    (lambda f: tails.tail_by_segment(f, ["a"]), "one label per request"),
    (lambda f: tails.tail_by_segment(f, "seg", failures="ignore"), "'ignore'"),
    (lambda f: tails.tail_shares(f, "seg", p=-0.1), "p must"),
    (lambda f: tails.quantile_ways(f, p=1.0), "p must"),
    (lambda f: tails.length_buckets([1, 2], [5, 3]), "edges"),
    (lambda f: tails.burst_windows([0.0, 1.0], -2.0), "window_s"),
    (lambda f: tails.request_latencies(f.assign(outcome="lost")), "'lost'"),
    (lambda f: tails.request_latencies(f.drop(columns="ttft_s")), "ttft_s"),
    (lambda f: tails.simulate_with_retries(f, retry_delay_s=-1.0), "retry_delay_s"),
    (lambda f: tails.simulate_with_retries(f, retry_delay_s=1.0, retry_on=("done",)), "retry_on"),
])
def test_bad_input_names_parameter_and_value(call, needle):
    f = frame([1.0, 2.0], seg=["a", "b"])
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        call(f)


def test_missing_label_and_done_without_latency():
    f = frame([1.0, 2.0], seg=["a", None])
    with pytest.raises(ValueError, match="missing label"):
        tails.tail_by_segment(f, "seg")
    g = frame([1.0, 2.0]).assign(ttft_s=[1.0, np.nan])
    with pytest.raises(ValueError, match="ttft_s must be a finite number"):
        tails.request_latencies(g)
