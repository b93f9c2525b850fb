"""servingcap: the tested arithmetic behind *Capacity Is a Queue*.

Modules, one idea each:

- :mod:`servingcap.queues`      closed forms: Little's law, M/M/1, M/G/1, M/M/c, Erlang B/C
- :mod:`servingcap.knee`        the utilization knee, defined and located
- :mod:`servingcap.variability` service-time distributions, the variance penalty
- :mod:`servingcap.sim`         vectorized FCFS queue simulation, Little's-law measurement
- :mod:`servingcap.agents`      an agent system (tasks, calls, slots, tools, humans) simulated
- :mod:`servingcap.traffic`     real request traces, burst and window arithmetic
- :mod:`servingcap.llm`         prefill/decode phase arithmetic
- :mod:`servingcap.serving`     iteration-level continuous-batching simulator
- :mod:`servingcap.slo`         goodput and percentiles that keep failures
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
