"""servingcap: the tested arithmetic behind *Capacity Is a Queue*.

Modules, one idea each:

- :mod:`servingcap.queues`      closed forms: Little's law, M/M/1, M/G/1, M/M/c, Erlang B/C,
                                Kingman's G/G/1
- :mod:`servingcap.oplaws`      operational laws, the closed-loop law, mean value analysis
- :mod:`servingcap.knee`        the utilization knee, defined and located
- :mod:`servingcap.variability` service-time distributions, the variance penalty
- :mod:`servingcap.sim`         vectorized FCFS queue simulation, Little's-law measurement
- :mod:`servingcap.agents`      agent systems (tasks, calls, slots, tools, humans; fan-out)
- :mod:`servingcap.traffic`     real request traces, burst and window arithmetic, rescaling
- :mod:`servingcap.llm`         prefill/decode phase arithmetic
- :mod:`servingcap.serving`     iteration-level continuous-batching fleet simulator
- :mod:`servingcap.costmodel`   fitted step-time models (DistServe form) for the simulator
- :mod:`servingcap.roofline`    step time from a model config and a GPU spec sheet
- :mod:`servingcap.profiles`    DistServe's published step-time profiles as cost models
- :mod:`servingcap.calibrate`   a cost model fitted to a ``vllm bench serve`` result
- :mod:`servingcap.disagg`      prefill/decode disaggregation on top of the simulator
- :mod:`servingcap.kvcache`     KV bytes per token, paging, prefix-cache hit rates
- :mod:`servingcap.slo`         goodput and percentiles that keep failures
- :mod:`servingcap.goodput`     batch-size feasibility, goodput curves and knees
- :mod:`servingcap.sweep`       load sweeps and TTFT/TPOT decompositions
- :mod:`servingcap.policies`    scheduling-policy workloads and slowdown measures
- :mod:`servingcap.admission`   queue-depth caps and drain rates
- :mod:`servingcap.autoscale`   a fleet whose servers arrive late
- :mod:`servingcap.tails`       tail segmentation and honest percentiles
- :mod:`servingcap.fleet`       fleet sizing: Little + square-root staffing + spares, routing
- :mod:`servingcap.routers`     gateway routers on signals a gateway sees, and two bounds
- :mod:`servingcap.router_study` routers compared on length mixes, TTFT p99 with intervals
- :mod:`servingcap.memory`      weights, runtime reserve and KV cache on a GPU
- :mod:`servingcap.planning`    capacity search and the ``python -m servingcap plan`` command
- :mod:`servingcap.stats`       output analysis: warm-up, replications, intervals, steady state
- :mod:`servingcap.parallel`    independent simulations on any executor (local pool, Dask)
- :mod:`servingcap.control`     the capacity control loop (a lagging autoscaler)
- :mod:`servingcap.baddays`     bad-day workload transforms
- :mod:`servingcap.params`      the book's locked worked-example parameters
- :mod:`servingcap.plots`       the book's figure style
- :mod:`servingcap.widgets`     "Try your own numbers" explorers
"""

from ._check import UnstableQueueError
from .params import LOCKED, ServingParams
from .queues import MG1, MM1, MMc, erlang_b, erlang_c, little, sqrt_staffing

__all__ = [
    "UnstableQueueError", "LOCKED", "ServingParams", "MM1", "MG1", "MMc",
    "erlang_b", "erlang_c", "little", "sqrt_staffing",
]
__version__ = "0.1.0"
