"""Fuzz every public entry point outside the serving engine and the plan command.

Each entry point of each module's ``__all__`` (modules ``queues``, ``sim``,
``traffic``, ``llm``, ``slo``, ``fleet``, ``kvcache``, ``variability``, ``agents``,
``tails``, ``admission``, ``autoscale``, ``policies``, ``goodput``, ``knee``,
``sweep``, ``control``, ``baddays``, ``plots``, ``widgets``, ``params``, ``stats``,
``oplaws``, ``roofline``, ``profiles``, ``costmodel``, ``parallel``, ``calibrate``,
``disagg``, ``planning``, ``routers``, ``memory``, ``sweepcli``; the engine ``serving``
and the command line ``__main__`` / ``calibrate.main`` are fuzzed by their own tests) is
listed below with one valid call.
The fuzz replaces one argument at a time by bad values chosen by the argument's kind --
NaN, +-inf, negative, zero, huge, wrong types, ``None``, empty, unsorted, nested,
missing or broken columns of a table, broken files -- and, for numeric arguments, by
random numbers from hypothesis.

Every call must end, within a deadline of one second, in either

* a ``ValueError`` or ``TypeError`` whose message names the parameter (or the table
  column that was broken), or
* a result with no NaN and no infinity anywhere in it (``inf`` only where the entry
  says it is a meaningful answer), raising no warning.

A hang is caught by an interval timer that interrupts the call at the deadline; a
warning (``RuntimeWarning: overflow``, pandas casts, ...) is turned into an error.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import signal
import tempfile
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from servingcap import (  # noqa: E402
    _check,  # noqa: E402
    admission,
    agents,
    autoscale,
    baddays,
    calibrate,
    configsearch,
    control,
    costmodel,
    disagg,
    fleet,
    goodput,
    knee,
    kvcache,
    llm,
    memory,
    oplaws,
    parallel,
    params,
    planning,
    plots,
    policies,
    profiles,
    queues,
    roofline,
    router_study,
    routers,
    serving,
    sim,
    slo,
    stats,
    sweep,
    sweepcli,
    tails,
    traffic,
    variability,
    widgets,
)
from servingcap._check import UnstableQueueError  # noqa: E402

FUZZED_MODULES = ("queues", "sim", "traffic", "llm", "slo", "fleet", "kvcache",
                  "variability", "agents", "tails", "admission", "autoscale", "policies",
                  "goodput", "knee", "sweep", "control", "baddays", "plots", "widgets",
                  "params", "stats", "oplaws", "roofline",
                  "profiles", "costmodel", "parallel",
                  "calibrate", "disagg", "planning", "routers", "memory", "router_study",
                  "sweepcli", "configsearch")
DEADLINE_S = 1.0
# An entry that runs simulations (heavy) gets more time: a planning call decides each
# point by a sequential check over several replications, and on a shared 2-core machine
# its good call alone takes about a second. A hang still ends it.
HEAVY_DEADLINE_S = 5.0
NAN, INF = math.nan, math.inf


class DeadlineExceeded(Exception):
    """Raised inside a call that runs past DEADLINE_S (a hang)."""


def _alarm(signum, frame):
    raise DeadlineExceeded("no answer within the deadline")


# --------------------------------------------------------------------------- fixtures

_RNG = np.random.default_rng(0)
REQUESTS = sweep.poisson_requests(2.0, 30, 0)
REPLICA = serving.Replica()
STUDY = pd.DataFrame({"mix": "m", "load": 0.5, "rate_rps": 1.0, "router": ["random", "pooled"],
                      "ttft_p99_s": [2.0, 1.0], "ttft_p99_low": [1.5, 0.9],
                      "ttft_p99_high": [2.5, 1.1], "x_pooled": [2.0, 1.0],
                      "prefix_hit_rate": np.nan, "replications": 2, "requests": 400})
RESULT, STEPS = serving.simulate(REQUESTS, REPLICA, step_log=True)
RESULT = RESULT.assign(verified=True)
ARRIVALS = np.cumsum(_RNG.exponential(1.0, 50))
SERVICES = _RNG.exponential(0.5, 50)
MEASURED = {1: 0.02, 16: 0.025, 32: 0.03, 64: 0.045}
TRACE_DIR = Path(__file__).parent / "_fuzz_traces"
CALLS = pd.DataFrame({"task": [0, 0, 1], "arrival_s": [0.0, 1.0, 0.5],
                      "start_s": [0.1, 1.0, 0.6], "finish_s": [0.5, 1.7, 0.9]})


def _latency(rate):
    return queues.MM1(rate, 10.0).response_quantile(0.99) if rate < 10 else math.inf


def _run(rate):
    return serving.simulate(sweep.poisson_requests(rate, 20, 1), REPLICA)


@dataclasses.dataclass
class Entry:
    """One public entry point, a valid call, and what its result may contain."""

    name: str
    func: Callable
    good: dict
    allow_inf: bool = False      # inf is a meaningful answer (a failed request's latency)
    allow_nan: bool = False      # NaN marks "not applicable" cells in a returned table
    heavy: bool = False          # runs a simulation: skip the random-number fuzz

    def __str__(self):
        return self.name


def E(entry_name, func, /, *, allow_inf=False, allow_nan=False, heavy=False, **good):
    return Entry(entry_name, func, good, allow_inf, allow_nan, heavy)


AGENT_RUN = agents.simulate(agents.AgentSystem(), 120.0, 1)
FANOUT_RUN = agents.simulate_fanout(agents.FanOut(), 120.0, 1)
FLEET_SEARCH = fleet.smallest_fleet(lambda n: serving.simulate(REQUESTS, REPLICA, replicas=n),
                                    1, 3, ttft_s=1.0, tpot_s=0.05, p=0.9)
MM1 = queues.MM1(0.5, 1.0)
TINY_SEARCH = configsearch.search(   # one configuration, 2 replications of >= 100 requests
    "Llama-3.1-8B", planning.PoissonWorkload(100, 10), 1.0, gpus=["L40S"], tps=[1],
    dtypes=["bf16"], budgets=[512], max_batches=[8], budget=2, holds=1.0, min_requests=100,
    executor=None)
SEARCH_TABLE = pd.DataFrame({
    "label": ["a", "b"], "status": ["ranked", "ranked"], "usd_per_mtok": [1.0, 1.5],
    "ttft_p99_s": [0.2, 0.1], "replicas": [2, 3], "spares": [1, 1], "gpus": [3, 4],
    "usd_per_hour": [3.0, 4.0], "usd_per_mtok_low": [0.9, 1.4], "usd_per_mtok_high": [1.1, 1.6],
    "min_separating_usd_per_mtok": [0.8, 1.2]})
SERIES = _RNG.exponential(1.0, 200)
ROOF = roofline.Roofline("Llama-2-7b-hf", "A100-80GB")
MOE_ROOF = roofline.Roofline("Mixtral-8x7B-v0.1", "H100-SXM", tp=2)
VIDUR_COST = profiles.vidur_cost("Llama-3.1-8B", "A100-80GB")
MEMORY = memory.memory_plan("Llama-3.1-8B", "H100-SXM")
USER_GPUS = traffic.data_dir() / "gpus_example_user.csv"     # a user's GPU spec file (MI300X, B200)
CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "bfloat16"}
DS_COST = profiles.distserve_profile()
PHASE_COST = costmodel.PhaseCost((0.01, 1e-4, 1e-8), (0.02, 1e-6, 1e-4))
VLLM_RESULT = Path(__file__).parent / "data" / "vllm_bench_serve_result.json"
CALIBRATION = calibrate.calibrate(VLLM_RESULT, max_batch=4)
COST_PATH = calibrate.save_cost(CALIBRATION, Path(tempfile.mkdtemp()) / "cost.json")
COST_FILE = calibrate.load_cost(COST_PATH)
LENGTHS = planning.Lengths("exponential", {"mean": 100.0})
WORKLOAD = planning.PoissonWorkload(500, 50)
TINY = dict(confidence=0.9, budget=2, holds=2.0, min_requests=100, executor=None)
CURVE = planning.goodput_curve(WORKLOAD, REPLICA, [1.0, 2.0], limits={"ttft_s": 1.0},
                               target=0.9, **TINY)
ESTIMATE = stats.mean_ci([1.0, 1.2, 0.9, 1.1])
MMC = queues.MMc(1.0, 1.0, 2)
LOGN = variability.Lognormal(1.0, 1.0)
EMP = variability.Empirical([1.0, 2.0, 3.0, 10.0])

ENTRIES = [
    # queues
    E("queues.little", queues.little, L=10.0, arrival_rate=2.0),
    E("queues.little_check", queues.little_check, L=10.0, arrival_rate=2.0, time_in_system=5.0,
      rtol=0.05),
    E("queues.MM1", queues.MM1, arrival_rate=0.5, service_rate=1.0),
    E("queues.MM1.response_cdf", lambda t: MM1.response_cdf(t), t=0.3),
    E("queues.MM1.wait_cdf", lambda t: MM1.wait_cdf(t), t=0.3),
    E("queues.MM1.response_quantile", lambda p: MM1.response_quantile(p), p=0.99),
    E("queues.MM1.wait_quantile", lambda p: MM1.wait_quantile(p), p=0.99),
    E("queues.MG1", queues.MG1, arrival_rate=0.5, mean_service=1.0, service_cv=1.0),
    E("queues.MG1.from_service_times", queues.MG1.from_service_times, arrival_rate=0.5,
      service_times=[0.5, 1.5, 1.0]),
    E("queues.MMc", queues.MMc, arrival_rate=1.0, service_rate=1.0, servers=2),
    E("queues.MMc.wait_cdf", lambda t: MMC.wait_cdf(t), t=0.3),
    E("queues.MMc.wait_quantile", lambda p: MMC.wait_quantile(p), p=0.99),
    E("queues.MMc.response_cdf", lambda t: MMC.response_cdf(t), t=0.3),
    E("queues.MMc.response_quantile", lambda p: MMC.response_quantile(p), p=0.99),
    E("queues.erlang_b", queues.erlang_b, servers=10, offered_load=8.0),
    E("queues.erlang_c", queues.erlang_c, servers=10, offered_load=8.0),
    E("queues.sqrt_staffing", queues.sqrt_staffing, offered_load=100.0, beta=2.0),
    E("queues.sqrt_staffing_beta", queues.sqrt_staffing_beta, servers=120.0,
      offered_load=100.0),
    E("queues.sqrt_staffing_load", queues.sqrt_staffing_load, servers=120.0, beta=2.0),
    E("queues.halfin_whitt_prob_wait", queues.halfin_whitt_prob_wait, beta=1.0),
    *([E("queues.GG1", queues.GG1, arrival_rate=0.5, mean_service=1.0, arrival_cv=1.0,
         service_cv=1.0),
       E("queues.GG1.from_samples", queues.GG1.from_samples, arrival_times=ARRIVALS,
         service_times=SERVICES)] if hasattr(queues, "GG1") else []),
    # sim
    E("sim.fcfs_waits", sim.fcfs_waits, arrival_times=ARRIVALS, service_times=SERVICES,
      servers=2),
    E("sim.poisson_arrivals", sim.poisson_arrivals, arrival_rate=2.0, n=100, rng=1),
    E("sim.mmc_sample", sim.mmc_sample, arrival_rate=1.0, service_rate=1.5, n=100, rng=1,
      servers=1),
    E("sim.time_average_in_system", sim.time_average_in_system, entry_times=ARRIVALS,
      exit_times=ARRIVALS + 1.0, start=0.0, end=20.0),
    E("sim.measure_little", sim.measure_little, entry_times=ARRIVALS,
      exit_times=ARRIVALS + 1.0, start=1.0, end=20.0, weights=np.ones(50)),
    E("sim.running_little", sim.running_little, entry_times=ARRIVALS,
      exit_times=ARRIVALS + 1.0, times=[5.0, 10.0], start=0.0, weights=np.ones(50)),
    # traffic
    E("traffic.load_trace", traffic.load_trace, name="azure_code"),
    E("traffic.burst_backlog", traffic.burst_backlog, arrival_rate=180.0, capacity=100.0,
      duration_s=60.0),
    E("traffic.drain_time", traffic.drain_time, backlog=4800.0, arrival_rate=55.0,
      capacity=100.0),
    E("traffic.balancing_rate", traffic.balancing_rate, mean_rate=10.0, rates=[20.0, 5.0],
      durations_s=[10.0, 10.0], total_s=60.0),
    E("traffic.fluid_backlog", traffic.fluid_backlog, rates=[20.0, 5.0], durations_s=[10.0, 10.0],
      capacity=10.0, times_s=[0.0, 5.0, 30.0], initial_backlog=0.0),
    E("traffic.piecewise_poisson", traffic.piecewise_poisson, rates=[2.0, 5.0],
      durations_s=[10.0, 10.0], rng=1),
    E("traffic.window_counts", traffic.window_counts, arrival_s=ARRIVALS, window_s=5.0,
      start=0.0),
    E("traffic.index_of_dispersion", traffic.index_of_dispersion, arrival_s=ARRIVALS,
      window_s=5.0, start=0.0),
    E("traffic.peak_to_mean", traffic.peak_to_mean, arrival_s=ARRIVALS, window_s=5.0, start=0.0),
    E("traffic.window_utilization", traffic.window_utilization, arrival_s=ARRIVALS, window_s=5.0,
      capacity=2.0, start=0.0),
    E("traffic.mean_rate", traffic.mean_rate, arrival_s=ARRIVALS),
    E("traffic.rescale_to_rate", traffic.rescale_to_rate, trace=REQUESTS, target_rate=5.0),
    E("traffic.poisson_like", traffic.poisson_like, trace=REQUESTS, seed=1),
    E("traffic.block_bootstrap", traffic.block_bootstrap, trace=REQUESTS, n=50, seed=1,
      segment_s=5.0),
    E("traffic.bootstrap_windows", traffic.bootstrap_windows, trace=REQUESTS,
      replications=2, seed=1, n=50, segment_s=5.0),
    E("traffic.agent_request_rate", traffic.agent_request_rate, task_rate=2.0, calls_per_task=6.0,
      retry_multiplier=1.15),
    E("traffic.retry_multiplier", traffic.retry_multiplier, failure_prob=0.1, max_retries=2),
    # llm
    E("llm.prefill_s", llm.prefill_s, prompt_tokens=2000.0, prefill_rate=8000.0),
    E("llm.ttft_s", llm.ttft_s, prompt_tokens=2000.0, prefill_rate=8000.0, queue_s=0.1),
    E("llm.e2e_s", llm.e2e_s, ttft_s=0.3, output_tokens=300, tpot_s=0.03),
    E("llm.stalled_step_s", llm.stalled_step_s, prompt_tokens=2000.0, prefill_rate=8000.0,
      decode_step_s=0.03),
    E("llm.amortized_stall_s", llm.amortized_stall_s, prompt_tokens=2000.0, prefill_rate=8000.0,
      output_tokens=300),
    E("llm.max_chunk_tokens", llm.max_chunk_tokens, tpot_slo_s=0.05, decode_step_s=0.03,
      prefill_rate=8000.0),
    E("llm.chunk_count", llm.chunk_count, prompt_tokens=2000.0, chunk_tokens=512.0),
    E("llm.chunked_ttft_s", llm.chunked_ttft_s, prompt_tokens=2000.0, chunk_tokens=512.0,
      prefill_rate=8000.0, decode_step_s=0.03, queue_s=0.0),
    E("llm.decode_step_time", llm.decode_step_time, batch=[1, 8, 32], measured=MEASURED),
    E("llm.linear_s", llm.linear_s, tokens=240.0, weight_read_s=0.01, prefill_rate=8000.0),
    E("llm.fused_step_s", llm.fused_step_s, decode_batch=32, prefill_tokens=208.0,
      decode_step_s=0.03, weight_read_s=0.01, prefill_rate=8000.0),
    E("llm.fused_token_budget", llm.fused_token_budget, tpot_slo_s=0.05, decode_step_s=0.03,
      weight_read_s=0.01, prefill_rate=8000.0, decode_batch=32),
    E("llm.overlapped_token_budget", llm.overlapped_token_budget, tpot_slo_s=0.05,
      decode_step_s=0.03, prefill_rate=8000.0, decode_batch=32),
    E("llm.fused_chunked_ttft_s", llm.fused_chunked_ttft_s, prompt_tokens=4000,
      token_budget=240, decode_batch=32, decode_step_s=0.03, weight_read_s=0.01,
      prefill_rate=8000.0, queue_s=0.0),
    # slo
    E("slo.latencies", slo.latencies, allow_inf=True, requests=RESULT, column="ttft_s"),
    E("slo.latency_quantile", slo.latency_quantile, allow_inf=True, requests=RESULT, p=0.99,
      column="ttft_s"),
    E("slo.meets_slo", lambda requests, ttft_s: slo.meets_slo(requests, ttft_s=ttft_s),
      requests=RESULT, ttft_s=1.0),
    E("slo.slo_attainment", lambda requests, ttft_s: slo.slo_attainment(requests, ttft_s=ttft_s),
      requests=RESULT, ttft_s=1.0),
    E("slo.offered_rate", slo.offered_rate, requests=RESULT, duration_s=20.0),
    E("slo.throughput", slo.throughput, requests=RESULT, duration_s=20.0),
    E("slo.goodput", lambda requests, duration_s, ttft_s: slo.goodput(requests, duration_s,
                                                                      ttft_s=ttft_s),
      requests=RESULT, duration_s=20.0, ttft_s=1.0),
    E("slo.operations_page", lambda requests, duration_s, verified, ttft_s: slo.operations_page(
        requests, duration_s, verified, ttft_s=ttft_s),
      requests=RESULT, duration_s=20.0, verified="verified", ttft_s=1.0),
    E("slo.max_rate", slo.max_rate, latency_at=_latency, target_s=1.0, upper=9.0, rtol=1e-6),
    E("slo.capped_fcfs", slo.capped_fcfs, allow_inf=True, allow_nan=True, arrival_times=ARRIVALS,
      service_times=SERVICES, servers=1, queue_cap=3),
    # fleet
    E("fleet.size_fleet", fleet.size_fleet, arrival_rate=30.0, hold_s=9.25, slots_per_replica=32,
      beta=2.0, spares=1, p=0.99),
    E("fleet.pooled_queue", fleet.pooled_queue, arrival_rate=30.0, hold_s=9.25,
      slots_per_replica=32, replicas=10),
    E("fleet.split_queue", fleet.split_queue, arrival_rate=30.0, hold_s=9.25,
      slots_per_replica=32, replicas=10),
    E("fleet.gpu_busy", fleet.gpu_busy, arrival_rate=30.0, replicas=22, prefill_s=0.25,
      output_tokens=300.0, decode_step_s=0.03, batch=32),
    E("routers.check_router", routers.check_router, router="jsq"),
    E("router_study.compare_routers", router_study.compare_routers, heavy=True,
      allow_nan=True, mixes={"m": sweep.poisson_requests(2.0, 400, 0)}, replica=REPLICA,
      replicas=1, loads=[0.5], routers=["pooled", "random"], replications=2,
      requests=200, quantile=0.9, seed=0, executor=None),
    E("router_study.best_realistic", router_study.best_realistic, allow_nan=True,
      table=STUDY),
    E("router_study.direction", router_study.direction, table=STUDY, mix="m", load=0.5,
      router="random", other="pooled"),
    E("fleet.routed_waits", fleet.routed_waits, arrival_times=ARRIVALS, service_times=SERVICES,
      replicas=2, slots_per_replica=1, router="pooled", rng=1),
    E("fleet.slot_requests", fleet.slot_requests, arrival_rate=2.0, n=20, hold_s=1.0, rng=1,
      step_s=0.001, service="exponential"),
    E("fleet.slot_replica", fleet.slot_replica, slots=4, step_s=0.001),
    E("fleet.smallest_fleet", fleet.smallest_fleet, heavy=True,
      run=lambda n: serving.simulate(REQUESTS, REPLICA, replicas=n), lo=1, hi=3, ttft_s=1.0,
      tpot_s=0.05, p=0.9),
    E("fleet.serving_cost", fleet.serving_cost, replicas=22, good_rate=27.0,
      price_per_replica_hour=2.0, per=1000),
    E("fleet.FleetSearch.meets", lambda replicas: FLEET_SEARCH.meets(replicas), replicas=3),
    E("fleet.replicated_attainment", fleet.replicated_attainment, allow_nan=True,
      runs=[RESULT, RESULT], limits={"ttft_s": 1.0}, target=0.9, confidence=0.95,
      delta=0.0025, first=2, cap=4),
    # kvcache
    E("kvcache.AttentionShape", kvcache.AttentionShape, layers=32, kv_heads=8, head_dim=128,
      dtype_bytes=2),
    E("kvcache.AttentionShape.kv_bytes", lambda tokens: kvcache.LLAMA_3_1_8B.kv_bytes(tokens),
      tokens=2000),
    E("kvcache.weights_bytes", kvcache.weights_bytes, params=8e9, dtype_bytes=2),
    E("kvcache.kv_budget_tokens", kvcache.kv_budget_tokens, memory_bytes=80e9,
      bytes_per_token=131072.0, weights_bytes=16e9, reserve_bytes=1e9),
    E("kvcache.sequences_that_fit", kvcache.sequences_that_fit, capacity_tokens=100000,
      sequence_tokens=2300, block_tokens=16),
    E("kvcache.blocks_per_sequence", kvcache.blocks_per_sequence, tokens=[10, 100],
      block_tokens=16),
    E("kvcache.internal_fragmentation", kvcache.internal_fragmentation, tokens=[10, 100],
      block_tokens=16),
    E("kvcache.contiguous_reserved", kvcache.contiguous_reserved, tokens=[10, 100], max_tokens=4096),
    E("kvcache.paged_reserved", kvcache.paged_reserved, tokens=[10, 100], block_tokens=16),
    E("kvcache.used_fraction", kvcache.used_fraction, tokens=[10, 100], reserved=[16, 112]),
    E("kvcache.prefix_hits", kvcache.prefix_hits, hash_ids=[[0, 1, 2], [0, 1, 3]], cache_blocks=10),
    E("kvcache.sticky_routes", kvcache.sticky_routes, hash_ids=[[0, 1, 2], [0, 1, 3], [0, 4]],
      prompt_tokens=[10, 20, 30], replicas=2, key_block=1),
    E("kvcache.replay_routed", kvcache.replay_routed, heavy=True, requests=REQUESTS,
      replica=REPLICA, routes=np.arange(len(REQUESTS)) % 2),
    E("kvcache.hit_rate", kvcache.hit_rate, hash_ids=[[0, 1, 2], [0, 1, 3]], cache_blocks=10),
    E("kvcache.saved_prefill_tokens", kvcache.saved_prefill_tokens, hits=[0, 2],
      prompt_tokens=[1500, 1500], block_tokens=512),
    # variability
    E("variability.coefficient_of_variation", variability.coefficient_of_variation,
      samples=[1.0, 2.0, 3.0]),
    E("variability.variance_penalty", variability.variance_penalty, service_cv=1.0),
    E("variability.mean_residual_service", variability.mean_residual_service, mean_service=1.0,
      service_cv=1.0),
    E("variability.Lognormal", variability.Lognormal, mean=1.0, cv=1.0),
    E("variability.Lognormal.quantile", lambda p: LOGN.quantile(p), p=0.99),
    E("variability.Lognormal.sample", lambda n, rng: LOGN.sample(n, rng), n=10, rng=1),
    E("variability.Gamma", variability.Gamma, mean=1.0, cv=0.5),
    E("variability.Bimodal", variability.Bimodal, mean=1.0, cv=2.0, long_fraction=0.05,
      mode_cv=0.25),
    E("variability.CappedLognormal", variability.CappedLognormal, mean=1.0, cv=1.0, cap=5.0),
    E("variability.Empirical", variability.Empirical, values=[1.0, 2.0, 3.0]),
    E("variability.Empirical.scaled", lambda factor: EMP.scaled(factor), factor=2.0),
    E("variability.Empirical.capped", lambda cap: EMP.capped(cap), cap=5.0),
    E("variability.Empirical.below", lambda threshold: EMP.below(threshold), threshold=5.0),
    E("variability.Empirical.above", lambda threshold: EMP.above(threshold), threshold=1.5),
    E("variability.service_distribution", variability.service_distribution, kind="lognormal",
      mean=1.0, cv=1.0),
    E("variability.utilization_for_equal_wait", variability.utilization_for_equal_wait,
      reference_utilization=0.8, service_cv=2.0, reference_cv=1.0),
    E("variability.speedup_for_wait", variability.speedup_for_wait, arrival_rate=0.5,
      mean_service=1.0, service_cv=2.0, target_wait=1.0, servers=1),
    E("variability.mgc_mean_wait", variability.mgc_mean_wait, arrival_rate=0.5, mean_service=1.0,
      service_cv=2.0, servers=2),
    E("variability.max_arrival_rate_for_wait", variability.max_arrival_rate_for_wait,
      mean_service=1.0, service_cv=2.0, target_wait=1.0, servers=1),
    E("variability.cap_lengths", variability.cap_lengths, values=[1.0, 10.0], cap=5.0),
    E("variability.max_cv_under_cap", variability.max_cv_under_cap, mean=1.0, cap=5.0),
    E("variability.simulate_fcfs", variability.simulate_fcfs, arrival_rate=0.5, distribution=LOGN,
      n=200, rng=1, warmup=10, servers=1),
    E("variability.batch_means", variability.batch_means, values=np.arange(100.0), batches=10),
    # agents
    E("agents.AgentSystem", agents.AgentSystem, task_rate=0.6, calls_per_task=6.0, slots=32,
      queue_cap=64, tool_s=2.2, reviewers=10),
    E("agents.simulate", agents.simulate, heavy=True, allow_nan=True,
      system=agents.AgentSystem(), horizon_s=60.0, seed=1),
    E("agents.replicated_little", agents.replicated_little, heavy=True, allow_nan=True,
      system=agents.AgentSystem(), horizon_s=60.0, runs=2, seed=1),
    E("agents.FanOut", agents.FanOut, task_rate=0.3, branches=3, accept_prob=0.6, max_rounds=5),
    E("agents.simulate_fanout", agents.simulate_fanout, heavy=True, allow_nan=True,
      system=agents.FanOut(), horizon_s=60.0, seed=1),
    E("agents.branch_attempts", agents.branch_attempts, failure_probs={"timeout": 0.1},
      retries={"timeout": 2}),
    E("agents.peak_in_flight", agents.peak_in_flight, entry_s=ARRIVALS, exit_s=ARRIVALS + 1.0,
      start=0.0, end=20.0),
    E("agents.AgentRun.boundary", lambda name: AGENT_RUN.boundary(name),
      name="tasks in orchestrator"),
    E("agents.AgentRun.little_table", lambda warmup_s: AGENT_RUN.little_table(warmup_s),
      allow_nan=True, warmup_s=10.0),
    E("agents.FanOutRun.window", lambda warmup_s: FANOUT_RUN.window(warmup_s), allow_nan=True,
      warmup_s=10.0),
    E("agents.FanOutRun.critical_path_quantile", lambda p, warmup_s:
      FANOUT_RUN.critical_path_quantile(p, warmup_s), p=0.9, warmup_s=10.0),
    E("agents.FanOutRun.utilization", lambda warmup_s: FANOUT_RUN.utilization(warmup_s),
      warmup_s=10.0),
    E("agents.FanOutRun.busy_breakdown", lambda warmup_s: FANOUT_RUN.busy_breakdown(warmup_s),
      warmup_s=10.0),
    E("agents.FanOutRun.task_metrics", lambda warmup_s: FANOUT_RUN.task_metrics(warmup_s),
      allow_nan=True, warmup_s=10.0),
    # tails
    E("tails.request_latencies", tails.request_latencies, allow_inf=True, frame=RESULT,
      column="ttft_s", failures="inf"),
    E("tails.tail_mask", tails.tail_mask, allow_inf=True, frame=RESULT, p=0.99, column="ttft_s",
      failures="inf"),
    E("tails.tail_shares", tails.tail_shares, frame=RESULT.assign(seg=["a", "b"] * 15), by="seg",
      p=0.9, column="ttft_s"),
    E("tails.tail_by_segment", tails.tail_by_segment, allow_inf=True, allow_nan=True,
      frame=RESULT.assign(seg=["a", "b"] * 15), by="seg", tail_p=0.9),
    E("tails.quantile_ways", tails.quantile_ways, allow_inf=True, frame=RESULT, p=0.99,
      column="ttft_s"),
    E("tails.length_buckets", tails.length_buckets, tokens=[10, 100, 1000],
      edges=[50.0, 500.0, 5000.0], unit="tokens"),
    E("tails.burst_windows", tails.burst_windows, arrival_s=ARRIVALS, window_s=5.0,
      busy_share=0.2, start=0.0),
    E("tails.simulate_with_retries", tails.simulate_with_retries, heavy=True, allow_nan=True,
      requests=REQUESTS, replica=serving.Replica(timeout_s=5.0), retry_delay_s=1.0,
      max_retries=1, max_rounds=10),
    E("tails.sequential_paths", tails.sequential_paths, calls=CALLS, task="task"),
    # admission
    E("admission.wait_budget_s", admission.wait_budget_s, ttft_slo_s=1.0, prefill_s=0.25),
    E("admission.slot_drain_rate", admission.slot_drain_rate, slots=32, hold_s=9.25),
    E("admission.colocated_drain_rate", admission.colocated_drain_rate, prefill_s=0.25,
      output_tokens=300.0, decode_step_s=0.03, slots=32),
    E("admission.queue_depth_cap", admission.queue_depth_cap, ttft_slo_s=1.0, prefill_s=0.25,
      drain_rate=3.0, head_wait_s=0.3),
    E("admission.max_queue_setting", admission.max_queue_setting, ttft_slo_s=1.0, prefill_s=0.25,
      drain_rate=3.0, head_wait_s=0.3),
    E("admission.saturated_tpot_s", admission.saturated_tpot_s, batch=32, prefill_s=0.25,
      output_tokens=300.0, decode_step_s=0.03),
    E("admission.tpot_batch_cap", admission.tpot_batch_cap, tpot_slo_s=0.05, prefill_s=0.25,
      output_tokens=300.0, decode_step_s=0.03),
    E("admission.max_prompt_tokens_for_ttft", admission.max_prompt_tokens_for_ttft,
      ttft_slo_s=1.0, prefill_rate=8000.0, decode_step_s=0.03),
    E("admission.queue_positions", admission.queue_positions, requests=RESULT),
    E("admission.kept_goodput", admission.kept_goodput, runs=[RESULT, RESULT], run_s=30.0),
    # autoscale
    E("autoscale.reactive_ready_times", autoscale.reactive_ready_times, base_servers=2,
      added_servers=2, overload_start_s=10.0, detect_s=5.0, startup_s=30.0),
    E("autoscale.fcfs_time_varying", autoscale.fcfs_time_varying, allow_nan=True, allow_inf=True,
      arrival_s=ARRIVALS, service_s=SERVICES, server_ready_s=[0.0, 10.0], queue_cap=5,
      max_wait_s=10.0),
    E("autoscale.fluid_wait", autoscale.fluid_wait, t_s=[0.0, 10.0, 100.0], arrival_rate=12.0,
      base_capacity=10.0, added_capacity=5.0, ready_s=30.0),
    # policies
    E("policies.unqueued_e2e_s", policies.unqueued_e2e_s, requests=REQUESTS, replica=REPLICA),
    E("policies.full_batch_work_s", policies.full_batch_work_s, requests=REQUESTS,
      replica=REPLICA),
    E("policies.capacity_rate", policies.capacity_rate, requests=REQUESTS, replica=REPLICA),
    E("policies.saturated_rate", policies.saturated_rate, heavy=True, requests=REQUESTS,
      replica=REPLICA, n=40, replications=2, trim=0.2, seed=1),
    E("policies.bootstrap_workload", policies.bootstrap_workload, source=REQUESTS, n=20, load=0.8,
      replica=REPLICA, rng=1, capacity=2.0),
    E("policies.slo_deadlines", policies.slo_deadlines, requests=REQUESTS, ttft_slo_s=1.0,
      tpot_slo_s=0.05),
    E("policies.noisy_predictions", policies.noisy_predictions, output_tokens=[300, 30],
      sigma=0.5, rng=1),
    E("policies.queue_wait_s", policies.queue_wait_s, allow_nan=True, allow_inf=True,
      result=RESULT),
    E("policies.slowdown", policies.slowdown, allow_nan=True, result=RESULT, replica=REPLICA),
    E("policies.length_buckets", policies.length_buckets, tokens=[10, 100, 1000, 50],
      quantiles=(0.5, 0.9)),
    E("policies.bucket_summary", policies.bucket_summary, allow_nan=True, allow_inf=True,
      result=RESULT,
      replica=REPLICA),
    E("policies.latency_summary", policies.latency_summary, allow_nan=True, result=RESULT),
    E("policies.deadline_miss_rate", policies.deadline_miss_rate, result=RESULT,
      deadline_s=np.full(30, 10.0)),
    E("policies.priority_waits", policies.priority_waits, arrival_rate=0.5,
      service_s=[1.0, 2.0, 0.5], keys=[2.0, 1.0, 0.0]),
    E("policies.mean_unfinished_work_s", policies.mean_unfinished_work_s, result=RESULT,
      service_s=np.full(30, 9.0)),
    E("policies.busy_time_s", policies.busy_time_s, result=RESULT),
    # goodput
    E("goodput.tokens_per_s", goodput.tokens_per_s, batch=[1, 32], step_s=[0.02, 0.03]),
    E("goodput.batch_curve", goodput.batch_curve, measured=MEASURED, tpot_slo_s=0.05),
    E("goodput.best_feasible_batch", goodput.best_feasible_batch, measured=MEASURED,
      tpot_slo_s=0.05),
    E("goodput.max_feasible_batch", goodput.max_feasible_batch, allow_inf=True, measured=MEASURED,
      tpot_slo_s=0.05),
    E("goodput.metric_table", goodput.metric_table, requests=RESULT, duration_s=20.0, ttft_s=1.0,
      tpot_s=0.05),
    E("goodput.load_sweep", goodput.load_sweep, heavy=True, allow_nan=True, rates=[1.0, 2.0],
      run=_run, ttft_slo_s=1.0, tpot_slo_s=0.05, warmup_fraction=0.1),
    E("goodput.goodput_knee", goodput.goodput_knee, offered=[1.0, 2.0, 3.0],
      goodput_rps=[1.0, 1.9, 1.5]),
    E("goodput.slo_capacity", goodput.slo_capacity, allow_nan=True, rates=[1.0, 2.0, 3.0],
      attainment=[1.0, 0.95, 0.5], target=0.9),
    E("goodput.capacity_on_grid", goodput.capacity_on_grid, allow_nan=True,
      rates=[1.0, 2.0, 3.0], attainment=[1.0, 0.95, 0.5], target=0.9),
    E("goodput.capacity_table", goodput.capacity_table, allow_nan=True,
      runs={("w", "d"): [RESULT, RESULT]}, rates={"w": [1.0, 2.0]}, target=0.9,
      warmup_fraction=0.1),
    E("goodput.contest_board", goodput.contest_board, allow_inf=True, allow_nan=True,
      table=pd.DataFrame({"workload": ["w", "w"], "design": ["c", "d"],
                          "capacity": [1.0, 1.2], "where": ["on the grid"] * 2}),
      colocated=["c"], tie_band=0.05, label="split"),
    E("goodput.pool_split", goodput.pool_split, gpus=8, prefill_rps=4.0, decode_rps=2.0),
    E("goodput.attainment", goodput.attainment, requests=RESULT, warmup_fraction=0.1),
    # knee
    E("knee.marginal_cost", knee.marginal_cost, rho=[0.5, 0.9], mean_service=1.0),
    E("knee.mm1_knee", knee.mm1_knee, cost_per_point=1.0, point=0.01),
    E("knee.find_knee", knee.find_knee, utilization=[0.1, 0.5, 0.9, 0.99],
      mean_response=[1.1, 2.0, 10.0, 100.0], mean_service=1.0, cost_per_point=1.0, point=0.01),
    E("knee.max_utilization_for_quantile", knee.max_utilization_for_quantile, target=10.0,
      p=0.99, mean_service=1.0),
    E("knee.headroom_gain", knee.headroom_gain, rho=[0.5, 0.9], p=0.99, mean_service=1.0,
      point=0.01),
    # sweep
    E("sweep.poisson_requests", sweep.poisson_requests, rate=2.0, n=20, seed=1, prompt_tokens=2000,
      output_tokens=300),
    E("sweep.summarize", sweep.summarize, allow_nan=True, result=RESULT, warmup_fraction=0.1,
      ttft_slo_s=1.0, tpot_slo_s=0.05),
    E("sweep.sweep", sweep.sweep, heavy=True, allow_nan=True, values=[1.0, 2.0], run=_run,
      name="rate"),
    E("sweep.ttft_parts", sweep.ttft_parts, allow_nan=True, requests=RESULT, replica=REPLICA),
    E("sweep.tpot_parts", sweep.tpot_parts, allow_nan=True, requests=RESULT, steps=STEPS,
      replica=REPLICA),
    E("sweep.first_crossing", sweep.first_crossing, x=[1.0, 2.0, 3.0], y=[0.1, 0.5, 2.0],
      limit=1.0),
    # control
    E("control.Controller", control.Controller, target_utilization=0.8, window_s=60.0,
      startup_s=90.0, scale_down_delay_s=300.0, min_replicas=1, max_replicas=10),
    E("control.Controller.desired", lambda predicted_rps, backlog, replica_rate:
      control.Controller(backlog_drain_s=60.0).desired(predicted_rps, backlog, replica_rate),
      predicted_rps=10.0, backlog=5.0, replica_rate=2.0),
    E("control.simulate_control", control.simulate_control, allow_nan=True, allow_inf=True,
      arrivals=np.full(60, 20.0), dt_s=1.0, replica_rate=10.0, controller=control.Controller(),
      initial_replicas=2, cold_factor=1.0, warmup_s=0.0),
    E("control.poisson_counts", control.poisson_counts, rates_rps=[1.0, 2.0], dt_s=1.0, rng=1),
    E("control.diurnal_rates", control.diurnal_rates, duration_s=3600.0, dt_s=60.0, mean_rps=10.0,
      swing=0.5, period_s=3600.0, trough_at_s=0.0),
    # baddays
    E("baddays.scale_prompts", baddays.scale_prompts, requests=REQUESTS, factor=2.0),
    E("baddays.retry_storm", baddays.retry_storm, requests=REQUESTS, start_s=1.0, duration_s=5.0,
      delay_s=1.0, share=1.0, seed=0),
    E("baddays.assign_tenants", baddays.assign_tenants, requests=REQUESTS,
      shares={"a": 0.7, "b": 0.3}, seed=0),
    E("baddays.tenant_burst", baddays.tenant_burst,
      requests=baddays.assign_tenants(REQUESTS, {"a": 0.7, "b": 0.3}), tenant="a", start_s=1.0,
      duration_s=5.0, factor=2.0, seed=0),
    E("baddays.label", baddays.label, allow_nan=True,
      requests=baddays.assign_tenants(REQUESTS, {"a": 0.7, "b": 0.3})),
    # plots, widgets, params
    E("plots.mark_slo", lambda value, label, axis: plots.mark_slo(plt.gca(), value, label, axis),
      value=1.0, label="SLO", axis="y"),
    E("plots.mark_knee", lambda x, label: plots.mark_knee(plt.gca(), x, label), x=0.8,
      label="knee"),
    E("plots.describe", plots.describe, fig=plt.figure()),
    # sweepcli (its main is fuzzed by tests/test_sweep_cli.py's bad inputs)
    E("sweepcli.parse_rates", sweepcli.parse_rates, rates="5,10:40:10"),
    # only the columns the figure reads: every bad value of every other column of a
    # goodput_curve frame draws the same figure (0.2 s each, 18 s in all)
    E("sweepcli.goodput_figure", sweepcli.goodput_figure, heavy=True,
      curve=CURVE[["rate_rps", "goodput_rps", "goodput_low", "goodput_high", "verdict"]],
      target=0.99,
      replicas=1, fluid_bound=5.0, knee=1.5),
    E("widgets.slider", widgets.slider, value=1.0, min=0.0, max=2.0, step=0.1, description="x",
      integer=False),
    E("widgets.explorer", lambda compute, title, rate: widgets.explorer(
        compute, title, rate=widgets.slider(1.0, 0.0, 2.0, 0.1, "rate")),
      compute=lambda rate: f"{rate:.1f}", title="t", rate=1.0),
    E("params.ServingParams", params.ServingParams, prefill_rate=8000.0, decode_step_s=0.03,
      decode_batch=32, prompt_tokens=2000, ttft_slo_s=1.0, tpot_slo_s=0.05),
    E("params.ServingParams.replace", lambda prefill_rate: params.LOCKED.replace(
        prefill_rate=prefill_rate), prefill_rate=9000.0),
    # stats
    E("stats.mser", stats.mser, values=SERIES, batch=5),
    E("stats.mean_ci", stats.mean_ci, allow_inf=True, estimates=[1.0, 1.2, 0.9, 1.1], confidence=0.95,
      what="replications"),
    E("stats.batch_means_ci", stats.batch_means_ci, values=SERIES, confidence=0.95,
      batches=10),
    E("stats.percentile_ci", stats.percentile_ci, allow_inf=True, values=SERIES, p=0.9, confidence=0.95),
    E("stats.proportion_ci", stats.proportion_ci, successes=90, trials=100, confidence=0.95,
      method="wilson"),
    E("stats.Estimate.decide", lambda target: ESTIMATE.decide(target), target=0.9),
    E("stats.Estimate.decide_at_most", lambda limit: ESTIMATE.decide_at_most(limit),
      limit=0.9),
    E("stats.replication_seeds", stats.replication_seeds, seed=1, replications=3),
    E("stats.steady_state", stats.steady_state, allow_nan=True, values=SERIES, batches=20, alpha=0.01,
      max_growth=0.5, scale=1.0),
    E("stats.feasibility", stats.feasibility, allow_inf=True,
      values=[0.991, 0.995, 0.993, 0.994, 0.996, 0.992, 0.995, 0.994, 0.993, 0.996],
      target=0.99, delta=0.0025, alpha=0.05, first=10, at_most=False, confidence=0.95),
    E("stats.feasibility_constants", stats.feasibility_constants, alpha=0.05, first=10),
    E("stats.sequential_check", stats.sequential_check, allow_inf=True,
      values=[0.991, 0.995, 0.993, 0.994, 0.996, 0.992, 0.995, 0.994, 0.993, 0.996],
      target=0.99, cap=16, delta=0.0025, alpha=0.05, first=10, at_most=False,
      confidence=0.95),
    E("stats.look_schedule", stats.look_schedule, first=10, cap=100),
    E("stats.sectioning_ci", stats.sectioning_ci, allow_inf=True, whole=1.0,
      sections=[0.9, 1.1, 1.05, 0.95], confidence=0.95, what="sections"),
    E("stats.quantile_ci", stats.quantile_ci, allow_inf=True, values=SERIES, p=0.9,
      confidence=0.95, batches=4, min_tail=5),
    E("stats.replicated_quantile_ci", stats.replicated_quantile_ci, allow_inf=True,
      runs=[SERIES, SERIES[::-1].copy()], p=0.9, confidence=0.95, min_tail=5),
    # oplaws
    E("oplaws.utilization_law", oplaws.utilization_law, throughput=2.0, demand=0.3),
    E("oplaws.throughput_bound", oplaws.throughput_bound, demand=[0.3, 0.1]),
    E("oplaws.closed_loop_throughput", oplaws.closed_loop_throughput, users=10.0,
      response_time=2.0, think_time=3.0),
    E("oplaws.response_time_law", oplaws.response_time_law, users=10.0, throughput=2.0,
      think_time=3.0),
    E("oplaws.closed_loop_bounds", oplaws.closed_loop_bounds, users=10.0, lone_response=0.5,
      demand=[0.3, 0.1], think_time=3.0),
    E("oplaws.mva", oplaws.mva, users=5, demand=0.3, think_time=3.0),
    # roofline
    E("roofline.Roofline", roofline.Roofline, model="Llama-3.1-8B", gpu="H100-SXM", tp=2,
      flops_efficiency=0.7, bandwidth_efficiency=0.8, overhead_s=0.001, fp8=False),
    E("roofline.Roofline.prefill_s", lambda prompt_tokens, cached_tokens: ROOF.prefill_s(
        prompt_tokens, cached_tokens), prompt_tokens=2000, cached_tokens=100),
    E("roofline.Roofline.decode_s", lambda batch, context_tokens: ROOF.decode_s(
        batch, context_tokens), batch=8, context_tokens=1000.0),
    E("roofline.Roofline.breakdown", lambda detail, lm_head: ROOF.breakdown(detail, lm_head),
      detail=roofline.step([100], [0], [50, 60]), lm_head=True),
    E("roofline.gpu", roofline.gpu, name="H100-SXM"),
    E("roofline.gpu_table", roofline.gpu_table, allow_nan=True),
    E("roofline.gpu[extra]", roofline.gpu, name="MI300X", extra=str(USER_GPUS)),
    E("roofline.gpu_table[extra]", roofline.gpu_table, extra=str(USER_GPUS), allow_nan=True),
    E("roofline.load_gpus", roofline.load_gpus, path=str(USER_GPUS)),
    E("roofline.model_names", roofline.model_names),
    E("roofline.measured_steps", roofline.measured_steps, allow_nan=True),
    E("roofline.model_config", roofline.model_config, source="Llama-3.1-8B", name="llama"),
    E("roofline.model_config[mapping]", lambda source: roofline.model_config(source),
      source=CONFIG),
    E("roofline.read_config", roofline.read_config, source="Llama-3.1-8B", name="llama",
      param="source"),
    E("roofline.fit_efficiency", roofline.fit_efficiency, model="Llama-2-7b-hf",
      gpu_name="A100-80GB", tokens=[128, 512, 2048], seconds=[0.01, 0.03, 0.12], tp=1,
      lm_head=False),
    E("roofline.expected_experts", roofline.expected_experts, experts=8,
      experts_per_token=2, tokens=[0, 1, 8, 256]),
    E("roofline.Roofline.weight_read_bytes", lambda tokens: MOE_ROOF.weight_read_bytes(tokens),
      tokens=64.0),
    E("roofline.Roofline.fluid_work_s", lambda prompt_tokens, output_tokens, max_batch,
      uncached_tokens: MOE_ROOF.fluid_work_s(prompt_tokens, output_tokens, max_batch,
                                             uncached_tokens),
      prompt_tokens=[2000.0, 500.0], output_tokens=[300.0, 20.0], max_batch=32,
      uncached_tokens=[1500.0, 500.0]),
    E("roofline.Roofline.weight_read_s", lambda tokens: MOE_ROOF.weight_read_s(tokens),
      tokens=64.0),
    E("roofline.step", roofline.step, prefill=[100, 200], cached=[0, 50], decode=[50, 60]),
    E("roofline.linear_op_check", roofline.linear_op_check, fitted=False),
    # the step-cost helpers of serving (the engine itself is fuzzed by its own tests)
    E("serving.largest_chunk", serving.largest_chunk, step_cost=REPLICA.cost, budget_s=0.05,
      batch=32, context_tokens=2300.0, cached_tokens=0),
    E("serving.mixed_token_budget", serving.mixed_token_budget, replica=REPLICA, tpot_s=0.05,
      context_tokens=2150.0),
    E("roofline.Roofline.largest_chunk", lambda budget_s, batch, context_tokens, cached_tokens:
      ROOF.largest_chunk(budget_s, batch, context_tokens, cached_tokens), budget_s=0.05,
      batch=32, context_tokens=2300.0, cached_tokens=0),
    # configsearch (a tiny grid: one configuration, 2 replications of >= 100 requests)
    E("configsearch.search", configsearch.search, heavy=True, allow_nan=True, allow_inf=True,
      model="Llama-3.1-8B", requests=planning.PoissonWorkload(100, 10), rate=1.0,
      gpus=["L40S"], tps=[1],
      dtypes=["bf16"], modes=["mixed"], budgets=[512], max_batches=[8],
      designs=["colocated"], kv_link_gb_per_s=50.0,     # disaggregated: smallest_pools
      prices=configsearch.load_prices().query("gpu == 'L40S'").reset_index(drop=True),
      price_overrides={"L40S": 1.0}, limits={"ttft_s": 1.0, "tpot_s": 0.05}, target=0.99,
      router="jsq", policy="fcfs", spares=1, seed=0, confidence=0.95, budget=2, delta=0.0025,
      holds=1.0, min_requests=100, max_replicas=64, flops_efficiency=0.62,
      bandwidth_efficiency=0.55, gpu_memory_utilization=0.9, prune=True, wave=1,
      executor=None, progress=None),     # cache_dir left out: "x" would be a valid directory
    E("configsearch.confirm", configsearch.confirm, heavy=True, allow_nan=True,
      allow_inf=True, result=TINY_SEARCH, top=1, most=1, budget=2, holds=1.0,
      min_requests=100, wave=1, executor=None, progress=None),   # cache_dir: as search
    E("configsearch.grid", configsearch.grid, gpus=["L40S", "H100-SXM"], tps=[1, 2],
      dtypes=["bf16", "fp8"], modes=["mixed"], budgets=[512], max_batches=[8],
      designs=["colocated", "disaggregated"]),
    E("configsearch.DisaggConfig", configsearch.DisaggConfig, gpu="L40S", dtype="bf16",
      prefill_tp=1, decode_tp=2, prefill_budget=512, max_batch=8),
    E("configsearch.kv_link_gb_per_s", configsearch.kv_link_gb_per_s, gpu="H100-SXM",
      prefill_tp=1, decode_tp=2, override=None),
    E("configsearch.Config", configsearch.Config, gpu="L40S", tp=1, dtype="bf16",
      mode="mixed", max_batched_tokens=512, max_batch=8),
    E("configsearch.load_model", configsearch.load_model, model="Llama-3.1-8B"),
    E("configsearch.load_prices", configsearch.load_prices, path=None),
    E("configsearch.resolve_prices", configsearch.resolve_prices, prices=None,
      price_overrides={"L40S": 1.0}, override_source="command line"),
    E("configsearch.parse_price", configsearch.parse_price, price="L40S=1.5"),
    E("configsearch.usd_per_mtok", configsearch.usd_per_mtok, allow_inf=True,
      usd_per_hour=20.0, rate=10.0,
      attainment=0.99, mean_output_tokens=300.0),
    E("configsearch.rank", configsearch.rank, allow_inf=True, allow_nan=True,
      table=SEARCH_TABLE),
    E("configsearch.pareto_front", configsearch.pareto_front, table=SEARCH_TABLE,
      x="usd_per_mtok", y="ttft_p99_s"),
    E("configsearch.conclusion", configsearch.conclusion, table=SEARCH_TABLE,
      price_tolerance=0.1),
    # memory
    E("memory.memory_plan", memory.memory_plan, model="Llama-3.1-8B", gpu="H100-SXM", tp=2,
      gpu_memory_utilization=0.9, fp8=False, reserve_gib=3.0, block_tokens=16),
    E("memory.MemoryPlan.max_batch", lambda mean_context_tokens: MEMORY.max_batch(
        mean_context_tokens), mean_context_tokens=2000.0),
    E("memory.MemoryPlan.check_batch", lambda slots, mean_context_tokens: MEMORY.check_batch(
        slots, mean_context_tokens), slots=8, mean_context_tokens=2000.0),
    # profiles
    E("profiles.distserve_profile", profiles.distserve_profile, model="opt-13b", tp=2,
      engine="vllm", path=str(profiles._profile_dir() / "profiler-a100-80g.vllm.json"),
      overheads=True, hybrid="distserve"),
    E("profiles.distserve_replica", profiles.distserve_replica, model="opt-13b", tp=1,
      engine="distserve", kv_capacity_tokens=100000),
    E("profiles.distserve_max_num_tokens", profiles.distserve_max_num_tokens, model="opt-13b",
      tp=1, pp=1),
    E("profiles.DistServeCost.prefill_ms", lambda chunks, cached: DS_COST.prefill_ms(
        chunks, cached), chunks=[100.0, 200.0], cached=[0.0, 0.0]),
    E("profiles.DistServeCost.decode_ms", lambda context: DS_COST.decode_ms(context),
      context=[100.0, 200.0]),
    E("profiles.DistServeCost.step_ms", lambda detail: DS_COST.step_ms(detail),
      detail=roofline.step([100], [0], [50, 60])),
    E("profiles.vidur_cost", profiles.vidur_cost, model="Llama-3.1-8B", gpu="A100-80GB",
      overhead_s=0.001, flops_efficiency=0.7, bandwidth_efficiency=0.8),
    E("profiles.vidur_profiles", profiles.vidur_profiles),
    E("profiles.VidurCost.linear_s", lambda tokens: VIDUR_COST.linear_s(tokens), tokens=100),
    E("profiles.VidurCost.__call__", lambda detail: VIDUR_COST(detail),
      detail=roofline.step([100], [0], [50, 60])),
    # costmodel
    E("costmodel.PhaseCost", costmodel.PhaseCost, prefill=(0.01, 1e-4, 1e-8),
      decode=(0.02, 1e-6, 1e-4)),
    E("costmodel.PhaseCost.prefill_s", lambda chunks, cached: PHASE_COST.prefill_s(
        chunks, cached), chunks=[100.0, 200.0], cached=[0.0, 50.0]),
    E("costmodel.PhaseCost.decode_s", lambda context: PHASE_COST.decode_s(context),
      context=[100.0, 200.0]),
    E("costmodel.PhaseCost.__call__", lambda detail: PHASE_COST(detail),
      detail=roofline.step([100], [0], [50, 60])),
    E("costmodel.fit", costmodel.fit,
      prefill_points=[(100, 0.02), (500, 0.06), (1000, 0.12), (2000, 0.25)],
      decode_points=[(1, 500, 0.02), (8, 4000, 0.025), (32, 16000, 0.03), (64, 32000, 0.045)]),
    # parallel (serial or one-worker pools only: the fuzz starts no worker processes)
    E("parallel.run_all", parallel.run_all, allow_nan=True, fn=str, tasks=[1.0, 2.0],
      executor=None, on_result=lambda index, result: None),
    E("parallel.resolve", parallel.resolve, executor=None),
    E("parallel.default_workers", parallel.default_workers),
    E("parallel.max_workers", parallel.max_workers),
    E("parallel.local_pool", parallel.local_pool, workers=1),
    E("parallel.stop_pool", parallel.stop_pool),
    # calibrate
    E("calibrate.load_vllm_result", calibrate.load_vllm_result, allow_nan=True,
      allow_inf=True,
      source=str(VLLM_RESULT)),
    E("calibrate.load_vllm_result[mapping]", lambda source: calibrate.load_vllm_result(source),
      allow_nan=True, allow_inf=True, source=json.loads(VLLM_RESULT.read_text())),
    E("calibrate.fit_timeline", calibrate.fit_timeline, source=str(VLLM_RESULT),
      tolerance_s=0.002),
    E("calibrate.calibrate", calibrate.calibrate, heavy=True, source=str(VLLM_RESULT),
      tolerance_s=0.002, max_batch=4),
    E("calibrate.simulated_vllm_result", calibrate.simulated_vllm_result, heavy=True,
      requests=REQUESTS, replica=REPLICA, request_rate=2.0),
    # the path is fixed: fuzzing it would write files named by the bad values
    E("calibrate.save_cost", lambda calibration: calibrate.save_cost(
        calibration, COST_PATH.with_name("written.json")), calibration=CALIBRATION),
    E("calibrate.load_cost", calibrate.load_cost, path=str(COST_PATH)),
    E("calibrate.CostFile.replica", lambda max_batch, mode: COST_FILE.replica(
        max_batch=max_batch, mode=mode), max_batch=8, mode="combined"),
    # disagg
    E("disagg.kv_bytes_per_token", disagg.kv_bytes_per_token, layers=32, kv_heads=8,
      head_dim=128, bytes_per_value=2.0),
    E("disagg.kv_transfer_s", disagg.kv_transfer_s, prompt_tokens=[100, 2000],
      kv_bytes_per_token=131072.0, link_bytes_per_s=25e9, link_latency_s=0.001),
    E("disagg.decode_pool_replica", disagg.decode_pool_replica, replica=REPLICA),
    E("disagg.pool_fluid_bounds", disagg.pool_fluid_bounds, requests=REQUESTS,
      prefill_replica=REPLICA, decode_replica=REPLICA, rate=2.0),
    E("disagg.smallest_pools", disagg.smallest_pools, heavy=True, allow_nan=True,
      requests=planning.PoissonWorkload(100, 10),
      prefill_replica=serving.Replica(mode="prefill_first", max_batched_tokens=512),
      decode_replica=REPLICA, rate=1.0, kv_bytes_per_token=131072.0, link_bytes_per_s=25e9,
      link_latency_s=0.001, router="jsq", policy="fcfs",
      limits={"ttft_s": 1.0, "tpot_s": 0.05}, target=0.99, seed=0, confidence=0.95,
      budget=2, delta=0.0025, holds=1.0, min_requests=100, max_replicas=64),
    E("disagg.simulate_disaggregated", disagg.simulate_disaggregated, heavy=True,
      allow_nan=True, requests=REQUESTS, prefill_replica=REPLICA, decode_replica=REPLICA,
      prefill_replicas=1, decode_replicas=2, kv_bytes_per_token=131072.0,
      link_bytes_per_s=25e9, link_latency_s=0.001, router="round_robin", policy="sjf",
      seed=1, until_s=60.0),
    # planning (tiny designs: 2 replications of >= 100 requests, serial)
    E("planning.Lengths", planning.Lengths, kind="lognormal",
      params={"mean": 300.0, "cv": 1.0}),
    E("planning.Lengths.sample", lambda n, rng: LENGTHS.sample(n, rng), n=10,
      rng=np.random.default_rng(1)),
    E("planning.PoissonWorkload", planning.PoissonWorkload, prompt=500, output=50),
    E("planning.PoissonWorkload.sample", lambda rate, n: WORKLOAD.sample(
        rate, n, np.random.SeedSequence(0)), rate=2.0, n=10),
    E("planning.Replay", planning.Replay, requests=REQUESTS),
    E("planning.hold_time", planning.hold_time, requests=REQUESTS, replica=REPLICA),
    E("planning.fluid_rate", planning.fluid_rate, requests=REQUESTS, replica=REPLICA,
      replicas=2),
    E("planning.slo_floor", planning.slo_floor, requests=REQUESTS, replica=REPLICA,
      limits={"ttft_s": 1.0}),
    E("planning.infeasible", planning.infeasible, requests=REQUESTS, replica=REPLICA,
      limits={"ttft_s": 1.0}, target=0.9),
    E("planning.evaluate", planning.evaluate, heavy=True, allow_nan=True, requests=WORKLOAD,
      replica=REPLICA, rate=1.0, replicas=1, limits={"ttft_s": 1.0}, target=0.9, seed=0,
      on_replication=lambda event: None, **TINY),
    E("planning.capacity_search", planning.capacity_search, heavy=True, allow_nan=True,
      requests=WORKLOAD, replica=REPLICA, replicas=1, limits={"ttft_s": 1.0}, target=0.9,
      lo=0.5, hi=30.0, rtol=0.2, **TINY),
    E("planning.goodput_curve", planning.goodput_curve, heavy=True, allow_nan=True,
      requests=WORKLOAD, replica=REPLICA, rates=[1.0, 2.0], limits={"ttft_s": 1.0},
      target=0.9, **TINY),
    E("planning.curve_knee", planning.curve_knee, allow_nan=True, curve=CURVE, target=0.9),
    E("planning.smallest_fleet", planning.smallest_fleet, heavy=True, allow_nan=True,
      requests=WORKLOAD, replica=REPLICA, rate=2.0, limits={"ttft_s": 1.0}, target=0.9,
      start=1, max_replicas=4, **TINY),
    E("planning.plan", planning.plan, heavy=True, allow_nan=True, requests=WORKLOAD,
      replica=REPLICA, rate=2.0, limits={"ttft_s": 1.0}, target=0.9, spares=1, beta=2.0,
      rtol=0.2, max_replicas=4, **TINY),
    E("stats.warmup_cuts", stats.warmup_cuts, runs=[SERIES, SERIES[::-1].copy()]),
    E("stats.replicate", stats.replicate, requests=[REQUESTS, REQUESTS.iloc[::-1]],
      designs=lambda t: t.assign(ttft_s=t["arrival_s"] % 1.0), signal="ttft_s",
      cut="each"),
]


# --------------------------------------------------------------------------- bad values


def _kind(value):
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "str"
    if isinstance(value, pd.DataFrame):
        return "frame"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (np.ndarray, list, tuple)):
        return "array"
    if callable(value):
        return "callable"
    return "object"


BAD = {
    "real": [NAN, INF, -INF, -1.0, 0.0, 1e308, -1e308, 5e-324, "1", None, True, [1.0], 1j],
    "int": [0, -1, 1.5, NAN, INF, 10**12, 2**64, "3", None, True, 3.0, [1]],
    "flag": ["no", None, NAN, 2],
    "str": ["", "no-such-name", None, 3, b"bytes", ["x"]],
    "array": [[], [NAN], [INF], [-1.0], [3.0, 1.0, 2.0], [[1.0, 2.0], [3.0, 4.0]], "abc",
              None, ["a", "b"], [1e308, 1e308], 5.0, [1e308, -1e308]],
    "mapping": [{}, None, 3, {"a": NAN}, {1: -1.0}, {"x": "y"}],
    "callable": [None, 3, lambda *a, **k: NAN, lambda *a, **k: -1.0, lambda *a, **k: "x"],
    "object": [None, 3, "x", NAN],
}


def _frame_mutations(frame: pd.DataFrame):
    """(description, bad frame, names the message may use) for a valid table."""
    yield "not a DataFrame", frame.to_dict("list"), ()
    yield "no rows", frame.iloc[0:0], ()
    for col in frame.columns:
        yield f"without {col}", frame.drop(columns=[col]), (col,)
        values = frame[col]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            for label, bad in (("NaN", NAN), ("inf", INF), ("negative", -1.0), ("huge", 1e300)):
                broken = frame.copy()
                broken[col] = broken[col].astype(float)
                broken.loc[broken.index[0], col] = bad
                yield f"{col} {label}", broken, (col,)
            yield f"{col} strings", frame.assign(**{col: "x"}), (col,)
    if "arrival_s" in frame.columns and len(frame) > 1:
        yield "arrivals reversed", frame.iloc[::-1].reset_index(drop=True), ("arrival_s",)


def _bad_files(tmp: Path):
    tmp.mkdir(exist_ok=True)
    files = {
        "empty.csv": "", "header_only.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
        "garbled.csv": 'a,b\n"x,1\n', "wrong_columns.csv": "a,b\n1,2\n",
        "bad_time.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\nlater,1,2\n",
        "huge_tokens.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,1e30,2\n",
        "empty.jsonl": "", "garbled.jsonl": "{not json\n",
        "no_length.jsonl": '{"timestamp": 0}\n',
        "epoch_s.jsonl": '{"timestamp": 1700000000, "input_length": 1, "output_length": 1}\n',
        "mixed.jsonl": ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
                        '{"timestamp": "noon", "input_length": 1, "output_length": 1}\n'),
        "neg.jsonl": '{"timestamp": 0, "input_length": -5, "output_length": 1}\n',
        "trace.txt": "x",
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "binary.csv").write_bytes(b"\xff\xfe\x00\x80garbage")
    return [str(tmp / n) for n in [*files, "binary.csv"]] + [str(tmp / "missing.csv"), str(tmp)]


def _bad_values(entry: Entry, param: str, tmp: Path):
    """(description, bad value, extra names the message may use) for one parameter."""
    good = entry.good[param]
    kind = _kind(good)
    if entry.name == "traffic.load_trace":
        for path in _bad_files(tmp):
            yield Path(path).name, path, (Path(path).name,)
    if kind == "frame":
        yield from _frame_mutations(good)
        return
    for value in BAD[kind]:
        yield repr(value)[:40], value, ()


class Garbage(Exception):
    """A NaN or an infinity in a result that should hold neither."""


def _check_sane(result, entry: Entry, where="result"):
    """No NaN (unless allowed) and no inf (unless allowed) anywhere in the result."""
    if result is None or isinstance(result, (str, bool, np.bool_, pd.Categorical)):
        return
    if isinstance(result, (int, np.integer)):
        return
    if isinstance(result, (float, np.floating)):
        if math.isnan(result) and not entry.allow_nan:
            raise Garbage(f"{where} is NaN")
        if math.isinf(result) and not entry.allow_inf:
            raise Garbage(f"{where} is {result}")
        return
    if isinstance(result, np.ndarray):
        if result.dtype.kind == "f":
            if not entry.allow_nan and np.isnan(result).any():
                raise Garbage(f"{where} holds NaN")
            if not entry.allow_inf and np.isinf(result).any():
                raise Garbage(f"{where} holds inf")
        elif result.dtype.kind == "O":
            for i, v in enumerate(result.ravel()[:1000]):
                _check_sane(v, entry, f"{where}[{i}]")
        return
    if isinstance(result, pd.Series):
        _check_sane(result.to_numpy(), entry, where)
        return
    if isinstance(result, pd.DataFrame):
        for col in result.columns:
            if pd.api.types.is_numeric_dtype(result[col]):
                _check_sane(result[col].to_numpy(dtype=float), entry, f"{where}[{col!r}]")
        return
    if dataclasses.is_dataclass(result):
        for f in dataclasses.fields(result):
            if f.name.startswith("_"):  # a cache (Replica._cap: inf means "no cap")
                continue
            _check_sane(getattr(result, f.name), entry, f"{where}.{f.name}")
        return
    if isinstance(result, Mapping):
        for k, v in result.items():
            _check_sane(v, entry, f"{where}[{k!r}]")
        return
    if isinstance(result, (tuple, list)):
        for i, v in enumerate(result):
            _check_sane(v, entry, f"{where}[{i}]")


def outcome(entry: Entry, kwargs: dict, param: str, names=()) -> str | None:
    """Run one call; return a description of what went wrong, or None if it is fine."""
    deadline = HEAVY_DEADLINE_S if entry.heavy else DEADLINE_S
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = entry.func(**kwargs)
    except DeadlineExceeded:
        return f"no answer within {deadline} s (hang)"
    except UnstableQueueError:
        return None                     # "utilization >= 1" is the clear, correct answer
    except FileNotFoundError as exc:    # a path that is not there: say which
        if any(_check.mentions(str(exc), n) for n in names):
            return None
        return f"FileNotFoundError not naming the file: {exc}"
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if any(_check.mentions(message, n) for n in (param, *names)):
            return None
        return f"{type(exc).__name__} not naming {param!r}: {message[:300]}"
    except Exception as exc:                                    # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        _check_sane(result, entry)
    except Garbage as exc:
        return f"silent garbage: {exc}"
    finally:
        plt.close("all")
    return None


# --------------------------------------------------------------------------- the tests


# Result records (what an entry point returns; their methods are listed as entries when
# they take arguments) and argument-free helpers.
NOT_ENTRY_POINTS = {
    "queues.LittleCheck", "sim.LittleMeasurement", "slo.OperationsPage", "fleet.FleetSizing",
    "fleet.GpuBusy", "fleet.FleetSearch", "fleet.ServingCost", "agents.AgentRun",
    "agents.FanOutRun", "agents.BranchAttempts", "control.ControlRun", "widgets.Explorer",
    "traffic.data_dir", "plots.use_book_style", "goodput.GridCapacity",
    "stats.Estimate", "stats.Warmup", "stats.Verdict", "stats.Decision", "oplaws.ClosedLoop",
    # spec records read from data/ (roofline.gpu, roofline.model_config build them)
    "roofline.GPU", "roofline.ModelSpec",
    "profiles.DistServeCost",    # built by profiles.distserve_profile
    "profiles.VidurCost",        # built by profiles.vidur_cost
    "calibrate.Calibration", "calibrate.CostFile", "memory.MemoryPlan",
    "planning.CapacityResult", "planning.CurveKnee", "planning.FleetResult", "planning.Plan",
    "calibrate.main",            # the CLI (argparse exits): fuzzed by tests/test_cli.py
    "routers.Router",            # built by serving.simulate on its engines; fuzzed there
    "configsearch.SearchResult",  # returned by configsearch.search
    "disagg.PoolsResult",        # returned by disagg.smallest_pools
}


def test_every_public_entry_point_is_listed():
    listed = {e.name for e in ENTRIES}
    missing = []
    for module_name in FUZZED_MODULES:
        module = importlib.import_module(f"servingcap.{module_name}")
        for name in module.__all__:
            full = f"{module_name}.{name}"
            if callable(getattr(module, name)) and full not in listed | NOT_ENTRY_POINTS:
                missing.append(full)
    assert not missing, f"public entry points without a fuzz entry: {missing}"


@pytest.mark.parametrize("entry", ENTRIES, ids=str)
def test_valid_call_gives_a_sane_result(entry):
    assert outcome(entry, dict(entry.good), "-") is None


FUZZ_CASES = [(e, p) for e in ENTRIES for p in e.good]


@pytest.mark.parametrize("entry, param", FUZZ_CASES, ids=[f"{e}-{p}" for e, p in FUZZ_CASES])
def test_bad_values_end_in_a_clear_error_or_a_sane_result(entry, param, tmp_path):
    failures = []
    for label, value, names in _bad_values(entry, param, tmp_path / "files"):
        problem = outcome(entry, {**entry.good, param: value}, param, names)
        if problem:
            failures.append(f"{param}={label}: {problem}")
    assert not failures, "\n".join(failures)


# Random floats (any magnitude, NaN, +-inf) for every real-valued argument of the cheap
# entries. Whole-number arguments (counts, sizes) get the fixed bad values above: random
# integers in the millions are valid sample sizes that simply take longer than a second.
REAL_CASES = [(e, p) for e in ENTRIES if not e.heavy for p, v in e.good.items()
              if _kind(v) == "real"]
NUMBERS = st.floats(allow_nan=True, allow_infinity=True)


@pytest.mark.parametrize("entry, param", REAL_CASES, ids=[f"{e}-{p}" for e, p in REAL_CASES])
@settings(max_examples=12, deadline=timedelta(seconds=DEADLINE_S), derandomize=True,
          database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=NUMBERS)
def test_random_numbers_end_in_a_clear_error_or_a_sane_result(entry, param, value):
    problem = outcome(entry, {**entry.good, param: value}, param)
    assert problem is None, f"{param}={value!r}: {problem}"
