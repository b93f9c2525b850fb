"""The serving engine refuses bad input in one clear line, and keeps its accounting."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servingcap.serving import MODES, POLICIES, ROUTERS, Replica, StepDetail, detailed, simulate


def small(n=5):
    return pd.DataFrame({"arrival_s": np.arange(n) * 0.5, "prompt_tokens": 200,
                         "output_tokens": 20})


# --------------------------------------------------------------------------- cost models


@pytest.mark.parametrize("bad", [math.nan, -0.03, math.inf, 0.0])
def test_a_decode_curve_returning_garbage_is_named(bad):
    replica = Replica(decode_step_s=lambda b: bad)
    with pytest.raises(ValueError, match=r"decode_step_s .*lambda.* returned .* decode batch of 1"):
        simulate(small(), replica)


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf, "fast", None])
def test_a_step_time_returning_garbage_names_the_step(bad):
    replica = Replica(step_time=lambda p, b, c: bad)
    with pytest.raises(ValueError, match=r"step_time .* for a step of 1 prefill chunk\(s\) "
                                         r"\(200 tokens\) and 0 decoding"):
        simulate(small(), replica)


def test_a_detail_cost_without_the_decorator_says_to_use_it():
    def cost(detail: StepDetail) -> float:
        return 0.01

    with pytest.raises(ValueError, match="@servingcap.serving.detailed"):
        Replica(step_time=cost)
    Replica(step_time=detailed(cost))                  # decorated: accepted
    with pytest.raises(ValueError, match="must accept"):
        Replica(step_time=lambda: 0.01)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize("column, values, match", [
    ("arrival_s", pd.date_range("2026-01-01", periods=5, freq="s"), "arrival_s .*total_seconds"),
    ("arrival_s", ["0", "a", "b", "c", "d"], "arrival_s must hold numbers"),
    ("prompt_tokens", [True] * 5, "prompt_tokens must hold numbers"),
    ("priority", [0, 1, np.nan, 0, 1], "priority must be finite"),
    ("deadline_s", [1.0, 2.0, np.inf, 3.0, 4.0], "deadline_s must be finite"),
    ("hash_ids", ["abc"] * 5, "hash_ids must hold a list"),
    ("hash_ids", [None] * 5, "hash_ids must hold a list"),
    ("hash_ids", [7] * 5, "hash_ids must hold a list"),
    ("hash_ids", [[1, 2.5]] * 5, "block ids"),
])
def test_bad_request_columns_are_named(column, values, match):
    reqs = small().assign(**{column: values})
    with pytest.raises(ValueError, match=match):
        simulate(reqs, Replica())


@pytest.mark.parametrize("bad, match", [
    (True, r"block ids \(ints or strings\), got True in row 3"),
    (np.bool_(False), r"got (np\.)?False_? in row 3"),
    (2.0, r"got 2.0 in row 3"),
    ([1], r"got \[1\] in row 3"),
    ("ab", None),                                       # strings are block ids
    (np.int32(9), None),
])
def test_the_first_bad_block_id_is_named_with_its_row(bad, match):
    # rows of every accepted kind (list, tuple, array; ints, numpy ints, strings) before
    # the row with the block in question, a float row after it
    ids = [[1, 2], (3, "x"), np.array([4, 5]), [6, bad], [7.5]]
    reqs = small().assign(hash_ids=ids)
    with pytest.raises(ValueError, match=match or r"got 7.5 in row 4"):
        simulate(reqs, Replica(prefix_cache_blocks=8))


@pytest.mark.parametrize("kwargs, match", [
    ({"seed": "x"}, "seed"),
    ({"seed": -1}, "seed"),
    ({"step_log": "yes"}, "step_log"),
    ({"router": "affinity", "replicas": 2, "affinity_bound": 0.9}, "affinity_bound"),
])
def test_bad_simulate_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(small(), Replica(), **kwargs)


@pytest.mark.parametrize("flag", ["shed_past_deadline", "preemptive"])
def test_truthy_strings_are_not_booleans(flag):
    with pytest.raises(ValueError, match=f"{flag} must be True or False, got 'no'"):
        Replica(**{flag: "no"})


def test_seeds_accept_what_numpy_accepts():
    reqs = small(20)
    a = simulate(reqs, Replica(), replicas=3, router="random", seed=np.random.SeedSequence(4))
    b = simulate(reqs, Replica(), replicas=3, router="random", seed=np.random.SeedSequence(4))
    assert a.replica.tolist() == b.replica.tolist()


@pytest.mark.parametrize("case", ["empty", "all rejected", "before the first arrival"])
def test_an_empty_step_log_is_a_typed_empty_frame(case):
    reqs = small()
    replica, until = Replica(), None
    if case == "empty":
        reqs = reqs.iloc[:0]
    elif case == "all rejected":
        replica = Replica(max_prompt_tokens=100)
    else:
        reqs, until = reqs.assign(arrival_s=reqs.arrival_s + 10), 5.0
    out, log = simulate(reqs, replica, step_log=True, until_s=until)
    assert len(out) == len(reqs) and log.empty
    assert list(log.columns)[:3] == ["start_s", "replica", "duration_s"]
    assert log.dtypes["decode_batch"] == np.int64 and log.dtypes["start_s"] == np.float64


def test_a_request_preempted_after_its_first_token_can_time_out_with_first_token_set():
    # Documented semantics: the timeout also applies while a preempted request waits to
    # be readmitted; it leaves as timed_out, keeps its first_token_s, and its finish_s is
    # never before its last token.
    reqs = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": 100, "output_tokens": [300, 200]})
    out = simulate(reqs, Replica(max_batch=1, preemptive=True, timeout_s=2.0), policy="srpt")
    first = out.iloc[0]
    assert first.outcome == "timed_out" and first.preemptions == 1
    assert not math.isnan(first.first_token_s) and first.finish_s >= first.first_token_s


# --------------------------------------------------------------------------- property


@st.composite
def configurations(draw):
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    reqs = pd.DataFrame({"arrival_s": np.cumsum(gaps), "prompt_tokens": prompts,
                         "output_tokens": outputs,
                         "priority": draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)),
                         "deadline_s": np.cumsum(gaps) + draw(st.floats(0.5, 30.0))})
    reqs["hash_ids"] = [[k % 3, 100 + k] for k in range(n)]
    mode = draw(st.sampled_from(MODES))
    spec = {"mode": mode, "max_batch": draw(st.integers(1, 16)),
            "preemptive": draw(st.booleans()), "shed_past_deadline": draw(st.booleans()),
            "prefix_cache_blocks": draw(st.sampled_from([0, 4]))}
    if mode == "combined":
        spec["chunk_tokens"] = draw(st.sampled_from([None, 64, 512]))
    else:
        spec["max_batched_tokens"] = draw(st.sampled_from([256, 2048, 8192]))
    if draw(st.booleans()):
        spec["kv_capacity_tokens"] = 4000                   # holds the largest request
    if draw(st.booleans()):
        spec["timeout_s"] = draw(st.floats(0.5, 20.0))
    if draw(st.booleans()):
        spec["max_queue"] = draw(st.integers(0, 5))
    options = {"replicas": draw(st.integers(1, 3)), "router": draw(st.sampled_from(ROUTERS)),
               "policy": draw(st.sampled_from(POLICIES)), "seed": draw(st.integers(0, 9))}
    return reqs, spec, options


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configurations())
def test_every_request_once_with_ordered_finite_times(config):
    reqs, spec, options = config
    out = simulate(reqs, Replica(**spec), **options)
    assert len(out) == len(reqs) and (out.index == reqs.index).all()
    assert out.outcome.notna().all() and (out.outcome != "unfinished").all()
    done = out[out.outcome == "done"]
    times = done[["arrival_s", "admitted_s", "first_token_s", "finish_s"]].to_numpy()
    assert np.isfinite(times).all()
    assert (np.diff(times, axis=1) >= 0).all()
    started = out[out.first_token_s.notna()]
    assert (started.first_token_s <= started.finish_s).all()
    assert (started.admitted_s >= started.arrival_s).all()


def test_token_counts_past_the_limit_are_refused_not_wrapped():
    # 1e300 tokens used to become an int64 (with a RuntimeWarning) and a garbage schedule
    reqs = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [100, 1e300],
                         "output_tokens": [10, 10]})
    with pytest.raises(ValueError, match="prompt_tokens must be whole numbers from 1 to"):
        simulate(reqs, Replica())
