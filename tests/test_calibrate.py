"""Calibrating the step cost from a `vllm bench serve` result file."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from servingcap import calibrate as cal
from servingcap.costmodel import PhaseCost
from servingcap.serving import Replica

FIXTURE = Path(__file__).parent / "data" / "vllm_bench_serve_result.json"
TRUE = PhaseCost(prefill=(0.010, 1.0e-4, 2.0e-9), decode=(0.012, 4.0e-7, 2.0e-4))


def benchmark(seed, n=120, rate=1.5, jitter_s=0.0):
    """A benchmark file the simulator writes for an engine whose cost is TRUE; each
    token time optionally moved by Gaussian jitter (network and client timing noise)."""
    rng = np.random.default_rng(seed)
    req = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                        "prompt_tokens": rng.integers(50, 4000, n),
                        "output_tokens": rng.integers(2, 200, n)})
    data = cal.simulated_vllm_result(req, Replica(step_time=TRUE, max_batch=32, mode="combined"),
                                     request_rate=rate)
    if jitter_s:
        for i, gaps in enumerate(data["itls"]):
            times = data["ttfts"][i] + np.concatenate([[0.0], np.cumsum(gaps)])
            times = times + rng.normal(0.0, jitter_s, times.size)
            data["ttfts"][i], data["itls"][i] = float(times[0]), np.diff(times).tolist()
    return data


def test_simulated_file_has_the_vllm_fields_and_consistent_timings():
    data = benchmark(0, n=30)
    assert set(cal.REQUIRED_FIELDS) <= set(data)
    requests, meta = cal.load_vllm_result(data)
    assert meta["arrivals"] == "recorded start_times"
    assert [len(g) for g in data["itls"]] == [k - 1 for k in data["output_lens"]]
    assert requests.arrival_s.iloc[0] == pytest.approx(0.0) and requests.ok.all()


def test_fit_recovers_known_coefficients_exactly_without_noise():
    result = cal.calibrate(benchmark(1), max_batch=32)
    assert result.cost.prefill == pytest.approx(TRUE.prefill, rel=1e-6)
    assert result.cost.decode == pytest.approx(TRUE.decode, rel=1e-6)
    assert result.ttft_error < 1e-6 and result.tpot_error < 1e-6


def test_fit_with_timing_jitter_predicts_step_times_within_five_percent():
    # 0.5 ms of jitter on every token time (about 4 % of a 12 ms step). Over seeds 0-9 the
    # worst error at these points was 4 % (standard deviation 1.4 %); the checked points
    # stay inside the batch sizes this load produces (about 1-10), where the fit has data.
    result = cal.calibrate(benchmark(1, jitter_s=5e-4), max_batch=32)
    for length in (500, 2000, 4000):
        assert result.cost.prefill_s([length]) == pytest.approx(TRUE.prefill_s([length]), rel=0.05)
    for batch in (1, 8):
        context = np.full(batch, 1500)
        assert result.cost.decode_s(context) == pytest.approx(TRUE.decode_s(context), rel=0.05)


def test_real_format_fixture_loads_and_rebuilds_send_times():
    requests, meta = cal.load_vllm_result(FIXTURE)
    assert meta["max_concurrency"] == 2 and meta["request_rate"] == np.inf
    assert meta["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    # No start_times: two client slots, each freed at the measured latency
    # (TTFT + sum of ITLs): latencies 0.1121, 0.0746, 0.1872, 0.0566, 0.2753, 0.0693 s.
    # By hand: r0 and r1 start at 0; r2 takes r1's slot (0.0746), r3 r0's (0.1121),
    # r4 r3's (0.1121 + 0.0566 = 0.1687), r5 r2's (0.0746 + 0.1872 = 0.2618).
    assert requests.arrival_s.tolist() == pytest.approx([0, 0, 0.0746, 0.1121, 0.1687, 0.2618])
    assert requests.tpot_s.iloc[0] == pytest.approx((0.0171 + 0.0168 + 0.0170) / 3)
    result = cal.calibrate((requests, meta), max_batch=2)
    assert result.requests == 6
    assert np.isfinite([result.ttft_error, result.tpot_error]).all()


def test_cli_prints_the_fit_and_its_error(capsys):
    assert cal.main([str(FIXTURE), "--max-batch", "2", "--force"]) == 0
    out = capsys.readouterr().out
    assert "your benchmark" in out and "prefill step (ms)" in out and "TTFT: median" in out


@pytest.mark.parametrize("drop", ["itls", "ttfts", "input_lens"])
def test_wrong_format_names_the_missing_field(tmp_path, drop):
    data = json.loads(FIXTURE.read_text())
    del data[drop]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"missing the field.*{drop}.*--save-detailed"):
        cal.load_vllm_result(path)


def test_summary_only_result_is_refused_by_the_cli(tmp_path, capsys):
    data = {k: v for k, v in json.loads(FIXTURE.read_text()).items() if not isinstance(v, list)}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    assert cal.main([str(path)]) == 2
    assert "input_lens" in capsys.readouterr().err


def test_not_json_and_missing_file_are_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("Serving Benchmark Result\n")
    with pytest.raises(ValueError, match="not JSON"):
        cal.load_vllm_result(bad)
    with pytest.raises(ValueError, match="does not exist"):
        cal.load_vllm_result(tmp_path / "nope.json")


def test_unequal_lists_are_refused():
    data = json.loads(FIXTURE.read_text())
    data["ttfts"] = data["ttfts"][:-1]
    with pytest.raises(ValueError, match="equally long"):
        cal.load_vllm_result(data)


def test_step_time_cannot_be_passed():
    with pytest.raises(ValueError, match="step_time"):
        cal.calibrate(FIXTURE, step_time=TRUE)


# ---------------------------------------------------------------- calibrate -> plan

EXAMPLE = Path(__file__).parent / "data" / "vllm_bench_serve_example.json"
EXAMPLE_COST = PhaseCost(prefill=(0.008, 6.0e-5, 3.0e-9), decode=(0.010, 3.0e-7, 1.5e-4))
EXAMPLE_ENGINE = {"max_batch": 64, "mode": "mixed", "max_batched_tokens": 8192}


def example_benchmark():
    """The shipped example (tests/data/vllm_bench_serve_example.json): 200 Poisson
    requests at 4 req/s through a vLLM-V1-like engine (mixed steps, 8,192-token budget,
    64 slots) whose cost is EXAMPLE_COST, 0.5 ms of Gaussian jitter on every token time,
    times rounded to the microsecond."""
    rng = np.random.default_rng(7)
    n, rate = 200, 4.0
    req = pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                        "prompt_tokens": rng.integers(100, 3000, n),
                        "output_tokens": rng.integers(2, 150, n)})
    data = cal.simulated_vllm_result(req, Replica(step_time=EXAMPLE_COST, **EXAMPLE_ENGINE),
                                     request_rate=rate)
    for i, gaps in enumerate(data["itls"]):
        times = data["ttfts"][i] + np.concatenate([[0.0], np.cumsum(gaps)])
        times = times + rng.normal(0.0, 5e-4, times.size)
        data["ttfts"][i] = round(float(times[0]), 6)
        data["itls"][i] = [round(float(x), 6) for x in np.diff(times)]
    return data


def test_shipped_example_is_what_the_simulator_writes():
    assert json.loads(EXAMPLE.read_text()) == json.loads(json.dumps(example_benchmark()))


def test_cli_output_writes_a_cost_file_plan_and_replica_read(tmp_path, capsys):
    path = tmp_path / "cost.json"
    assert cal.main([str(EXAMPLE), "--max-batch", "64", "--mode", "mixed",
                     "--max-batched-tokens", "8192", "--output", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["format"] == cal.COST_FORMAT
    assert data["replica"] == {"mode": "mixed", "max_batch": 64, "max_batched_tokens": 8192}
    # 0.5 ms jitter on ~10 ms steps: the replay stays within a few per cent (measured
    # 1.5 % TTFT, 0.2 % TPOT), far below the refusal threshold
    assert data["replay_error"]["ttft_median"] < 0.05
    assert data["replay_error"]["tpot_median"] < 0.05
    loaded = cal.load_cost(path)
    replica = loaded.replica()
    assert replica.mode == "mixed" and replica.max_batched_tokens == 8192
    assert replica.max_batch == 64 and replica.step_time == loaded.cost
    assert loaded.cost.decode_s(np.full(8, 1500)) == pytest.approx(
        EXAMPLE_COST.decode_s(np.full(8, 1500)), rel=0.02)
    assert loaded.replica(max_batch=8).max_batch == 8


def test_large_replay_error_is_refused_unless_forced(capsys):
    # the hand-made fixture's timings are not those of any one step cost: 80.9 % TTFT error
    assert cal.main([str(FIXTURE), "--max-batch", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "above 25%" in err and "--force" in err
    assert cal.main([str(FIXTURE), "--max-batch", "2", "--force"]) == 0
    assert "WARNING: median replay error" in capsys.readouterr().out


def test_paced_result_without_start_times_is_refused(tmp_path, capsys):
    data = benchmark(2, n=40)
    del data["start_times"]
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(data))
    assert cal.main([str(path), "--max-batch", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no start_times" in err and "--force" in err


def test_per_chunk_itls_get_a_one_line_error(tmp_path, capsys):
    data = benchmark(3, n=40)
    # speculative decoding / stream interval 3: every gap covers three tokens
    data["itls"] = [[sum(g[j:j + 3]) for j in range(0, len(g), 3)] for g in data["itls"]]
    data["output_lens"] = [max(k, 4) for k in data["output_lens"]]
    requests, _ = cal.load_vllm_result(data)
    assert not requests.per_token_itls.any()
    path = tmp_path / "chunks.json"
    path.write_text(json.dumps(data))
    assert cal.main([str(path), "--max-batch", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "per streamed chunk" in err and "speculative" in err


def test_tpot_counts_tokens_not_chunks():
    data = json.loads(FIXTURE.read_text())
    data["itls"][0] = [0.0339, 0.017]          # 3 gaps merged into 2 chunks, 4 tokens
    requests, _ = cal.load_vllm_result(data)
    assert requests.tpot_s.iloc[0] == pytest.approx(0.0509 / 3)
    assert not requests.per_token_itls.iloc[0]


def test_all_failed_run_gets_a_one_line_error(tmp_path, capsys):
    data = json.loads(FIXTURE.read_text())
    data["errors"] = ["HTTP 500"] * len(data["ttfts"])
    data["ttfts"] = [0.0] * len(data["ttfts"])
    data["itls"] = [[] for _ in data["ttfts"]]
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(data))
    assert cal.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every one of the 6 requests failed" in err


@pytest.mark.parametrize("field, value, match", [
    ("ttfts", "fast", "field ttfts must be a list"),
    ("input_lens", [512, "128", 1024, 256, 2048, 64], "field input_lens must hold numbers"),
    ("itls", [[0.01], "x", [], [], [], []], r"field itls\[1\] must be a list"),
    ("itls", [[0.01], ["a"], [], [], [], []], r"field itls\[1\] must hold numbers"),
    ("output_lens", [4.5, 3, 5, 2, 4, 3], "whole token counts"),
])
def test_wrong_field_types_are_one_line_errors(tmp_path, capsys, field, value, match):
    data = json.loads(FIXTURE.read_text())
    data[field] = value
    with pytest.raises(ValueError, match=match):
        cal.load_vllm_result(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert cal.main([str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("argv, match", [
    (["--tolerance-ms", "-1"], "--tolerance-ms must be a number > 0, got '-1'"),
    (["--max-batch", "0"], "--max-batch must be a whole number >= 1"),
    (["--mode", "mixed"], "--mode 'mixed' needs --max-batched-tokens"),
    (["--mode", "combined", "--max-batched-tokens", "512"], "--max-batched-tokens 512"),
    (["--mode", "warp"], "--mode must be one of"),
])
def test_cli_errors_name_the_options(capsys, argv, match):
    assert cal.main([str(FIXTURE), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
    assert "tolerance_s" not in err and "max_batch" not in err


def test_max_batched_tokens_reaches_the_replay():
    plain = cal.calibrate(EXAMPLE, **EXAMPLE_ENGINE)
    assert plain.replica_options["max_batched_tokens"] == 8192
    assert plain.ttft_error < 0.05
    # the same fit replayed with a far smaller budget runs a different engine: worse replay
    small = cal.calibrate(EXAMPLE, max_batch=64, mode="mixed", max_batched_tokens=512)
    assert small.ttft_error > 2 * plain.ttft_error


@pytest.mark.parametrize("content, match", [
    ("{}", "not a servingcap cost file"),
    ("[1]", "not a servingcap cost file"),
    ("nope", "not a readable JSON file"),
    ('{"format": "servingcap-cost/1", "step_time": {"prefill_s": [1]}}', "broken step_time"),
    ('{"format": "servingcap-cost/1", "step_time": {"prefill_s": [0.01, 0, 0], '
     '"decode_s": [0.01, 0, 0]}, "replica": {"warp": 1}}', "unknown replica keys"),
])
def test_bad_cost_files_are_refused(tmp_path, content, match):
    path = tmp_path / "cost.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        cal.load_cost(path)


def test_plan_cost_option_reads_the_file_and_its_knobs(tmp_path):
    from servingcap.__main__ import InputError, settings

    path = cal.save_cost(cal.calibrate(EXAMPLE, **EXAMPLE_ENGINE), tmp_path / "cost.json")
    s = settings({"cost": str(path), "rate": 2})
    assert s.replica.step_time == cal.load_cost(path).cost
    assert (s.replica.mode, s.replica.max_batch, s.replica.max_batched_tokens) == ("mixed", 64, 8192)
    assert s.cost.startswith("calibrated cost from calibrate") and "replay error" in s.cost
    assert settings({"cost": str(path), "rate": 2, "max_batch": 16}).replica.max_batch == 16
    memory = settings({"cost": str(path), "rate": 2, "model_config": "Llama-3.1-8B",
                       "gpu": "H100-SXM"})
    assert memory.replica.kv_capacity_tokens == 442_304
    assert memory.replica.step_time == cal.load_cost(path).cost
    for bad, match in [({"decode_step_ms": 20}, "--cost and --decode-step-ms are alternatives"),
                       ({"gpu": "H100-SXM"}, "--model-config is needed with --cost"),
                       ({"tp": 2}, "--tp applies with --cost only")]:
        with pytest.raises(InputError, match=match):
            settings({"cost": str(path), "rate": 2, **bad})
    with pytest.raises(InputError, match="--cost: cost file .* does not exist"):
        settings({"cost": str(tmp_path / "nope.json")})
