"""servingcap: the tested arithmetic behind *Capacity Is a Queue*.

Modules, one idea each:

- :mod:`servingcap.queues`  closed forms: Little's law, M/M/1, M/G/1, M/M/c, Erlang B/C
- :mod:`servingcap.sim`     vectorized FCFS queue simulation
- :mod:`servingcap.params`  the book's locked worked-example parameters
- :mod:`servingcap.traffic` the real request traces
- :mod:`servingcap.plots`   the book's figure style
"""

from ._check import UnstableQueueError
from .params import LOCKED, ServingParams
from .queues import MG1, MM1, MMc, erlang_b, erlang_c, little, sqrt_staffing

__all__ = [
    "UnstableQueueError", "LOCKED", "ServingParams", "MM1", "MG1", "MMc",
    "erlang_b", "erlang_c", "little", "sqrt_staffing",
]
__version__ = "0.1.0"
