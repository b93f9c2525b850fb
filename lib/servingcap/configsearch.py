"""Which GPU, which parallelism, which mode, how many: a cost-optimal configuration search.

For one model (a ``config.json``: dense, or a Mixtral / Qwen-MoE mixture of experts),
one arrival rate, one workload and one SLO, the search walks a grid of serving
configurations -- GPU (``data/gpus.csv``), tensor-parallel degree ``tp``, weight dtype
(``bf16``: the config's own dtype; ``fp8``: 1-byte weights and KV cache, only on GPUs
with fp8 tensor cores), scheduling mode and token budget, batch slots -- and for each
one answers *how many replicas, at what price*:

1. **Fit.** ``num_attention_heads`` must divide by ``tp`` (as vLLM requires); the weights,
   a runtime reserve and the KV cache must fit (:func:`servingcap.memory.memory_plan`),
   and ``max_batch`` sequences at the workload's mean context (prompt plus half the
   output, tokens) must fit in that KV cache (:meth:`~servingcap.memory.MemoryPlan.
   check_batch`); a configuration whose idle replica already misses the SLO is refused
   too (:func:`servingcap.planning.infeasible`). A refusal is recorded with its reason
   (``status == "refused"``), never raised.
2. **Fluid bound.** The fewest replicas that can carry the rate at all,
   ``fluid_min = floor(rate / fluid_rate(one replica)) + 1``
   (:func:`servingcap.planning.fluid_rate`, from the roofline's own lower bound on a
   request's work, :meth:`servingcap.roofline.Roofline.fluid_work_s`, valid in every
   scheduling mode). Its cost is a hard lower bound on the configuration's cost: no
   simulation can answer fewer replicas, and attainment is at most 1.
3. **Pruning.** Configurations are simulated in *waves* of ``wave`` configurations, in
   increasing order of that lower bound. Before each wave, a configuration whose lower
   bound on the cost per million good tokens (its fluid fleet, ``fluid_min + spares``
   replicas, at attainment 1) exceeds the *upper end* of the best configuration found so
   far (its answer at the low end of its attainment interval) is not simulated:
   ``status == "pruned"``, reason ``"pruned: fluid bound costs more than X"``. It could
   not have ranked first, so pruning never changes the cheapest configuration (the
   tests check it on a small grid). The waves have a fixed size, so which
   configurations are pruned does not depend on the executor either.
4. **Simulation.** :func:`servingcap.planning.smallest_fleet` (the decided procedure of
   the ``plan`` command: replications until a sequential check decides meets / misses,
   ``open`` never counted as a miss), started, like :func:`servingcap.planning.plan`, at
   ``ceil(a + 0.14 sqrt(a))`` for ``a = rate / fluid_rate``.

Cost of a configuration that meets (``status == "ranked"``)::

    gpus                = (replicas + spares) x tp
    usd_per_hour        = gpus x usd_per_gpu_hour
    good tokens / hour  = 3600 x rate x attainment x mean_output_tokens
    usd_per_mtok        = usd_per_hour x 10**6 / good tokens per hour

``attainment`` is the simulated fraction of requests meeting both limits at the answer's
size (spares held back), so "good" tokens are those of requests that meet the SLO,
counted at the workload's mean output length (a request's length and whether it meets
are treated as independent: long outputs miss a TPOT limit no more often than short
ones, which holds for a per-token limit). ``usd_per_mtok_low`` / ``_high`` use the ends of
the attainment interval; ``replicas_low`` is the smallest size not shown to miss (the
sizes between it and ``replicas`` are ``open``: they may meet), and ``usd_per_hour_low``
its cost.

Ranking: cheapest ``usd_per_mtok`` first, ties broken by the lower p99 TTFT
(:func:`rank`); the Pareto front of ``usd_per_mtok`` against p99 TTFT
(:func:`pareto_front`); and a one-line :func:`conclusion` that says whether the cheapest
is *separated* from each other configuration (the runner-up and every one after it): it
is when the cheapest's cost at the low end of its attainment interval is below the
other's cost at the low end of everything that is still undecided about it -- its
smallest size not shown to miss, minus one more replica when that size's neighbour below
was simulated (a "misses" verdict is only decided outside the indifference zone, so the
size below may be within ``delta`` of the target), at the high end of its attainment
interval.
Separated is a statement about the simulation only: the line also names every
configuration whose cost is within a price tolerance of the cheapest's
(:data:`PRICE_TOLERANCE`, 10 % by convention) as *a tie on price*: a gap that small
may rank the quotes rather than the hardware, and the choice then turns on the reader's
prices (and, when the line says so, on the spare replicas paid for).

**Parallelism: configurations in parallel, replications serial.** Each configuration is
one task on ``executor`` (:mod:`servingcap.parallel`: ``"auto"`` local pool, ``None``,
any Executor, or a Dask ``distributed.Client``), and inside it ``smallest_fleet`` runs
with ``executor=None``. One level only, because nesting would start a pool in every
worker (oversubscribed cores, or a Dask task waiting on Dask tasks); and this level,
because a search has many configurations of minutes each (coarse, independent tasks)
while one configuration's replications come in looks of 10, then 20, with a summary
between looks that leaves a replication-level pool idle. Each task carries its seed,
so the table is identical whatever runs it.

**Cache.** With ``cache_dir``, each simulated configuration's result is a JSON file named
by the SHA-256 of everything it depends on (the configuration, the model config, the
workload, rate, SLO, router, policy, spares, statistics settings, efficiencies, memory
settings and the package version); a repeated or interrupted search reuses it
(``SearchResult.from_cache`` counts them, ``SearchResult.simulated`` counts the rest).

**Screen, then confirm.** A search at reduced statistics is cheap but its costs are
noisy and biased low (short replications drain after their last arrival).
:func:`confirm` sizes its shortlist again at longer statistics -- the cheapest few, every
configuration not separated from the cheapest, then every configuration whose fluid bound
is below the confirmed answer -- and ranks them by the confirmed costs.

Prices are data the user owns: ``data/gpu_prices.csv`` (``gpu, usd_per_gpu_hour,
source, date``; :func:`load_prices`), overridden per GPU (:func:`resolve_prices`).

Mixture-of-experts models fit by their *total* weights (every expert,
:func:`servingcap.memory.memory_plan`) and step by their *active* FLOPs and the experts
a step touches (:class:`servingcap.roofline.Roofline`, uniform routing).

**Disaggregated designs** (``designs=("colocated", "disaggregated")``; colocated only by
default). A :class:`DisaggConfig` is a prefill pool and a decode pool of one GPU type and
dtype, each pool with its own tensor-parallel degree (both from ``tps``): the prefill
pool runs whole prompts batched up to a token cap (:data:`DISAGG_PREFILL_MODE`, as
DistServe's prefill instances), the decode pool only decode steps
(:func:`servingcap.disagg.decode_pool_replica`), and each prompt's KV cache crosses a
link between them (:func:`kv_link_gb_per_s`: the GPU's interconnect from
``data/gpus.csv`` unless given). Each pool is fitted in memory (the prefill replica
holds ``max_batch`` mean prompts, the decode replica ``max_batch`` sequences at the mean
context) and refused by name; the TTFT limit is checked against the prefill pool's idle
replica and the others against the decode pool's. Its fluid bound is the two pools'
(:func:`servingcap.disagg.pool_fluid_bounds`, proven for the roofline), its lower cost
bound the two fluid pools with ``spares`` in *each* (a failed replica of either kind
needs a spare of its kind), and it is pruned, cached and run on the executor as a
colocated configuration is. It is sized by :func:`servingcap.disagg.smallest_pools`, a
*heuristic coordinate search* (grow the pool whose limit is missed, TTFT -> prefill,
the others -> decode; then shrink either pool while the size still meets), each size
decided by the same replications, warm-up cut, interval and meets / misses / open
verdict (:func:`servingcap.fleet.replicated_attainment`); so its answer is the smallest
on the search's path, not necessarily the fewest GPUs of every split. Cost::

    gpus = (prefill replicas + spares) x prefill_tp + (decode replicas + spares) x decode_tp

and the same ``usd_per_mtok``. Its ``replicas_low`` and lowest still possible cost
(:func:`conclusion`) take each pool's one-fewer verdict (the other pool at its answer):
one fewer when it misses (within the indifference zone it may meet), the pool's fluid
bound when it is open.

Not done: expert parallelism (experts are sharded over ``tp``); disaggregated pools of
two GPU types; KV transfers contending for the link (each gets the whole link).

Inspired by Vidur-Search (microsoft/vidur, ``vidur/config_optimizer/config_explorer``:
a grid over device, parallelism, scheduler and batch size, each point simulated to its
capacity under an SLO, ranked by QPS per dollar) and by Mélange (Griggs et al., 2024:
GPU-type choice as a cost minimization under an SLO). Units: requests/s, seconds,
tokens, US dollars per GPU-hour.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from . import __version__, _check, disagg, parallel, planning, stats
from .memory import DEFAULT_GPU_MEMORY_UTILIZATION, memory_plan
from .roofline import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, Roofline, gpu_table
from .roofline import model_config as _model_config
from .roofline import read_config as _read_config
from .routers import DEFAULT_ROUTER
from .serving import MODES, Replica, check_fleet
from .traffic import data_dir

__all__ = ["Config", "DisaggConfig", "SearchResult", "grid", "search", "load_model", "load_prices",
           "resolve_prices", "parse_price", "rank", "pareto_front", "conclusion",
           "usd_per_mtok", "PRICE_TOLERANCE", "DTYPES", "TP_DEGREES", "MIN_EFFICIENCY",
           "RESULT_COLUMNS", "PRICE_COLUMNS", "STATUSES", "DESIGNS", "kv_link_gb_per_s",
           "confirm", "SCREENED_COLUMNS"]

DTYPES = ("bf16", "fp8")
"""Weight dtypes searched: ``bf16`` (the config's own 2-byte dtype) and ``fp8`` (1-byte
weights and KV cache, GEMMs at the fp8 peak; GPUs with fp8 tensor cores only)."""

TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees searched by default (GPUs per replica, one node)."""

DESIGNS = ("colocated", "disaggregated")
"""Fleet designs searched: ``colocated`` replicas (:class:`Config`: every replica runs
prefill and decode) and ``disaggregated`` prefill / decode pools (:class:`DisaggConfig`)."""

PRICE_COLUMNS = ("gpu", "usd_per_gpu_hour", "source", "date")
"""Columns of a price file (:func:`load_prices`)."""

STATUSES = ("ranked", "refused", "pruned", "failed")
"""``ranked``: simulated and met the target at some size; ``refused``: does not fit, or
no fleet can meet the SLO (reason given); ``pruned``: not simulated, its fluid bound
already costs more than the best found (reason given); ``failed``: simulated, but no
size up to ``max_replicas`` was shown to meet."""

RESULT_COLUMNS = (
    "label", "design", "gpu", "tp", "prefill_tp", "dtype", "mode", "max_batched_tokens",
    "max_batch", "status", "reason", "kv_capacity_tokens", "kv_link_gb_per_s", "fluid_min",
    "replicas", "prefill_replicas", "decode_replicas", "replicas_low", "spares", "gpus",
    "usd_per_gpu_hour", "usd_per_hour", "usd_per_hour_low", "usd_per_mtok",
    "usd_per_mtok_low", "usd_per_mtok_high", "min_usd_per_mtok",
    "min_separating_usd_per_mtok", "attainment",
    "attainment_low", "attainment_high", "ttft_p99_s", "ttft_p99_low", "ttft_p99_high",
    "tpot_p99_s", "goodput_rps", "replications", "below_verdict", "sizes_simulated",
    "cached", "rank", "pareto")
"""Columns of ``SearchResult.table`` (one row per configuration; NaN where a step did
not run). Costs in US dollars: ``usd_per_hour`` for the whole fleet with spares,
``usd_per_mtok`` per million good output tokens (module docstring), ``min_usd_per_mtok``
the fluid bound's (the lower bound pruning uses), ``min_separating_usd_per_mtok`` the
lowest cost still possible (:func:`conclusion`). ``replicas`` is the smallest size shown
to meet (before spares); ``replicas_low`` the smallest size not shown to miss;
``below_verdict`` what is known of ``replicas - 1`` (as
:attr:`servingcap.planning.FleetResult.below_verdict`); ``rank`` 1 = cheapest (ranked
rows only); ``pareto`` whether the row is on the cost / p99 TTFT front.

A ``disaggregated`` row (:class:`DisaggConfig`) reads: ``tp`` the decode pool's degree,
``prefill_tp`` the prefill pool's (NaN on colocated rows), ``mode`` empty,
``max_batched_tokens`` the prefill pool's batch cap, ``kv_capacity_tokens`` the decode
replica's, ``kv_link_gb_per_s`` the KV link assumed (GB/s, :func:`kv_link_gb_per_s`);
``fluid_min``, ``replicas``, ``replicas_low`` and ``spares`` add up both pools (split in
``prefill_replicas`` / ``decode_replicas``; ``spares`` per pool, so twice the option),
``below_verdict`` names each pool's one-fewer verdict."""

MIN_EFFICIENCY = 0.01
"""Smallest roofline efficiency :func:`search` accepts (1 % of peak): below it a step takes
longer than any engine would, and the arithmetic overflows."""

_CACHE_FORMAT = 1


# --------------------------------------------------------------------------- inputs


def load_model(model) -> tuple[dict, str]:
    """(config dict, label) of a model: a shipped name (``"Llama-3.1-8B"``,
    ``"Mixtral-8x7B-v0.1"``), a path to a ``config.json`` or the parsed dict
    (:func:`servingcap.roofline.read_config`), validated by
    :func:`servingcap.roofline.model_config` (dense, Mixtral or Qwen-MoE; other
    mixture-of-experts layouts are refused naming their field). Errors name ``model``."""
    config, label = _read_config(model, param="model")
    with _check.naming("model"):
        _model_config(config, name=label)        # validates the fields the roofline needs
    return config, label


def load_prices(path=None) -> pd.DataFrame:
    """The price table: ``data/gpu_prices.csv`` by default, or your own CSV file with the
    columns :data:`PRICE_COLUMNS` (``usd_per_gpu_hour``: US dollars per GPU-hour, > 0;
    ``source``: where the number comes from; ``date``: when, ``YYYY-MM`` or
    ``YYYY-MM-DD``). One row per GPU name (case-insensitive). Raises ValueError naming
    the file and the row for anything else."""
    if path is not None and not isinstance(path, (str, Path)):
        raise ValueError(f"path must be a CSV file path or None, got {path!r}")
    file = data_dir() / "gpu_prices.csv" if path is None else Path(path)
    try:
        with open(file, newline="") as handle:
            lines = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"prices file path={str(file)!r} could not be read as CSV ({exc})") from None
    if not lines:
        raise ValueError(f"prices file path={str(file)!r} is empty")
    header, body = lines[0], [line for line in lines[1:] if line]
    for number, line in enumerate(body, start=2):
        if len(line) != len(header):
            raise ValueError(f"prices file path={str(file)!r} row {number} has {len(line)} fields, "
                             f"the header {len(header)} (quote a source that holds commas)")
    table = pd.DataFrame(body, columns=header)
    missing = [c for c in PRICE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"prices file path={str(file)!r} lacks the column(s) {', '.join(missing)} "
                         f"(needs {', '.join(PRICE_COLUMNS)})")
    table = table[list(PRICE_COLUMNS)].copy()
    if table.empty:
        raise ValueError(f"prices file path={str(file)!r} has no rows")
    seen = set()
    for i, row in table.iterrows():
        where = f"prices file path={str(file)!r} row {int(i) + 2}"
        name = row["gpu"]
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: gpu must be a name, got {name!r}")
        if name.lower() in seen:
            raise ValueError(f"{where}: gpu {name!r} appears twice")
        seen.add(name.lower())
        try:
            price = float(row["usd_per_gpu_hour"])
        except (TypeError, ValueError):
            price = math.nan
        if not (math.isfinite(price) and price > 0):
            raise ValueError(f"{where}: usd_per_gpu_hour must be a price > 0 US dollars per "
                             f"GPU-hour, got {row['usd_per_gpu_hour']!r}")
        if not isinstance(row["source"], str) or not row["source"].strip():
            raise ValueError(f"{where}: source must say where the price comes from (or "
                             f"'example value, unverified'), got {row['source']!r}")
        if not isinstance(row["date"], str) or not re.fullmatch(
                r"\d{4}-\d{2}(-\d{2})?", row["date"].strip()):
            raise ValueError(f"{where}: date must be YYYY-MM or YYYY-MM-DD, got {row['date']!r}")
    table["usd_per_gpu_hour"] = table["usd_per_gpu_hour"].astype(float)
    return table.reset_index(drop=True)


def parse_price(price: str) -> tuple[str, float]:
    """``"H100-SXM=2.5"`` -> ``("H100-SXM", 2.5)`` (US dollars per GPU-hour, > 0)."""
    text = price
    if not isinstance(text, str) or text.count("=") != 1:
        raise ValueError(f"price must be GPU=USD_PER_GPU_HOUR like H100-SXM=2.5, got {text!r}")
    name, value = (part.strip() for part in text.split("="))
    try:
        price = float(value)
    except ValueError:
        price = math.nan
    if not name or not (math.isfinite(price) and price > 0):
        raise ValueError(f"price must be GPU=USD_PER_GPU_HOUR with a price > 0, got {text!r}")
    return name, price


def _known_gpu(name, param: str = "gpus") -> str:
    names = [str(g) for g in gpu_table()["gpu"]]
    if isinstance(name, str):
        for known in names:
            if known.lower() == name.lower():
                return known
    raise ValueError(f"{param}: gpu {name!r} is not in data/gpus.csv; known: {', '.join(names)}")


def resolve_prices(prices=None, price_overrides: Mapping | None = None,
                   override_source: str = "command line") -> pd.DataFrame:
    """The price table used: ``prices`` (a table from :func:`load_prices`, a path, or None
    for the shipped file) with ``price_overrides`` (``{gpu: usd_per_gpu_hour}``) replacing or
    adding rows whose source is ``override_source`` (where the overrides came from, e.g.
    ``"command line"`` or ``"config file search.toml"``). Every GPU named must be in
    ``data/gpus.csv``; names come back spelled as there."""
    if not isinstance(override_source, str) or not override_source.strip():
        raise ValueError(f"override_source must be a non-empty string naming where the "
                         f"prices came from, got {override_source!r}")
    if isinstance(prices, pd.DataFrame):
        missing = [c for c in PRICE_COLUMNS if c not in prices.columns]
        if missing:
            raise ValueError(f"prices lacks the column(s) {', '.join(missing)}")
        table = prices[list(PRICE_COLUMNS)].copy()
        if table.empty:
            raise ValueError("prices has no rows")
        values = pd.to_numeric(table["usd_per_gpu_hour"], errors="coerce").to_numpy(dtype=float)
        if not (np.isfinite(values) & (values > 0)).all():
            raise ValueError("prices column usd_per_gpu_hour must hold prices > 0 US dollars "
                             "per GPU-hour")
        table["usd_per_gpu_hour"] = values
    elif prices is None or isinstance(prices, (str, Path)):
        table = load_prices(prices)
    else:
        raise ValueError(f"prices must be a price table, a CSV path or None, got {prices!r}")
    table["gpu"] = [_known_gpu(g, "prices") for g in table["gpu"]]
    overrides = price_overrides
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            raise ValueError(f"price_overrides must be a mapping gpu -> US dollars per "
                             f"GPU-hour, got {overrides!r}")
        for name, value in overrides.items():
            gpu = _known_gpu(name, "price_overrides")
            price = _check.positive(f"price_overrides[{name!r}]", value)
            table = table[table["gpu"] != gpu]
            table = pd.concat([table, pd.DataFrame([{
                "gpu": gpu, "usd_per_gpu_hour": price, "source": override_source,
                "date": ""}])], ignore_index=True)
    if table["gpu"].duplicated().any():
        raise ValueError(f"prices name gpu {table.loc[table['gpu'].duplicated(), 'gpu'].iloc[0]!r} twice")
    return table.reset_index(drop=True)


# --------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class Config:
    """One serving configuration: a replica of ``tp`` x ``gpu`` with these knobs.

    ``dtype`` is ``"bf16"`` (the model config's dtype) or ``"fp8"``; ``mode`` one of
    :data:`servingcap.serving.MODES`; ``max_batched_tokens`` the token budget of a step
    (mixed: the budget decodes and prefill chunks share; prefill_first: the prefill cap;
    None for combined); ``max_batch`` the batch slots (sequences)."""

    gpu: str
    tp: int
    dtype: str
    mode: str
    max_batched_tokens: int | None
    max_batch: int

    def __post_init__(self):
        object.__setattr__(self, "gpu", _known_gpu(self.gpu, "gpu"))
        object.__setattr__(self, "tp", _check.whole("tp", self.tp))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.max_batched_tokens is not None:
            object.__setattr__(self, "max_batched_tokens",
                               _check.whole("max_batched_tokens", self.max_batched_tokens))
        object.__setattr__(self, "max_batch", _check.whole("max_batch", self.max_batch))

    design = "colocated"

    @property
    def label(self) -> str:
        """Short name, e.g. ``H100-SXM tp2 fp8 mixed/2048 B64``."""
        budget = "" if self.max_batched_tokens is None else f"/{self.max_batched_tokens}"
        return f"{self.gpu} tp{self.tp} {self.dtype} {self.mode}{budget} B{self.max_batch}"

    @property
    def tps(self) -> tuple[int, ...]:
        """GPUs per replica of each pool (one pool)."""
        return (self.tp,)

    def fields(self) -> dict:
        """This configuration's columns of the result table (:data:`RESULT_COLUMNS`)."""
        return {"design": self.design, **asdict(self), "prefill_tp": math.nan}


DISAGG_PREFILL_MODE = "prefill_first"
"""Scheduling mode of a disaggregated prefill pool: whole prompts, oldest first, batched
up to ``max_batched_tokens`` prompt tokens (at least one prompt) -- as DistServe's
prefill instances batch them (Zhong et al., OSDI 2024: whole prompts, batched until
their total length reaches the length past which the GPU is compute bound, so a larger
batch only lengthens every TTFT). There are no decodes to protect, so nothing to chunk
for."""

DEFAULT_LINK_NOTE = ("half the GPU's interconnect figure in data/gpus.csv (its spec sheet's "
                     "bidirectional total) per GPU of the smaller replica: both pools in one "
                     "NVLink domain, each GPU sending its own KV shard, as DistServe places "
                     "paired prefill and decode instances within a node")
"""How :func:`kv_link_gb_per_s` sets the KV link when the caller gives none."""


@dataclass(frozen=True)
class DisaggConfig:
    """A disaggregated design: a prefill pool and a decode pool of one GPU type and dtype.

    Both pools run ``gpu`` at ``dtype`` (one model checkpoint, one hardware type: the
    comparison with colocated replicas is then about the split alone; mixing GPU types
    is Mélange's question, not searched). The prefill pool's replicas are ``prefill_tp``
    GPUs each and run prompts only (:data:`DISAGG_PREFILL_MODE`, batches of whole prompts
    up to ``prefill_budget`` tokens, ``max_batch`` slots; a longer prompt is rejected, as
    vLLM's scheduler without chunked prefill refuses it, so :func:`search` refuses the
    configuration when more than ``1 - target`` of the prompts are longer); the decode
    pool's are
    ``decode_tp`` GPUs each with ``max_batch`` slots, every step a decode step
    (:func:`servingcap.disagg.decode_pool_replica`). The prompt's KV cache crosses a
    link between them (:func:`kv_link_gb_per_s`)."""

    gpu: str
    dtype: str
    prefill_tp: int
    decode_tp: int
    prefill_budget: int
    max_batch: int

    design = "disaggregated"

    def __post_init__(self):
        object.__setattr__(self, "gpu", _known_gpu(self.gpu, "gpu"))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("prefill_tp", "decode_tp", "prefill_budget", "max_batch"):
            object.__setattr__(self, name, _check.whole(name, getattr(self, name)))

    @property
    def label(self) -> str:
        """Short name, e.g. ``H100-SXM fp8 disagg P tp2/2048 / D tp1 B64``."""
        return (f"{self.gpu} {self.dtype} disagg P tp{self.prefill_tp}/{self.prefill_budget}"
                f" / D tp{self.decode_tp} B{self.max_batch}")

    @property
    def tps(self) -> tuple[int, ...]:
        """GPUs per replica of each pool: (prefill, decode)."""
        return (self.prefill_tp, self.decode_tp)

    def fields(self) -> dict:
        """This configuration's columns of the result table (:data:`RESULT_COLUMNS`)."""
        return {"design": self.design, "gpu": self.gpu, "tp": self.decode_tp,
                "prefill_tp": self.prefill_tp, "dtype": self.dtype, "mode": "",
                "max_batched_tokens": self.prefill_budget, "max_batch": self.max_batch}


def _choices(name: str, values, allowed=None, whole=False) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a list, got {values!r}")
    out = []
    for v in values:
        if whole:
            v = _check.whole(name, v)
        elif allowed is not None and v not in allowed:
            raise ValueError(f"{name} must hold values from {', '.join(map(str, allowed))}, "
                             f"got {v!r}")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError(f"{name} must not be empty, got {values!r}")
    return out


def grid(gpus, *, tps=TP_DEGREES, dtypes=DTYPES, modes=("mixed",), budgets=(2048,),
         max_batches=(32,), designs=("colocated",)) -> list[Config | DisaggConfig]:
    """Every configuration of the lists, in a fixed order.

    ``fp8`` is kept only on GPUs with fp8 tensor cores (``data/gpus.csv``); ``budgets``
    (tokens per step) apply to ``mixed`` and ``prefill_first``, and ``combined`` gets
    one configuration per ``max_batches`` value (no budget). Head divisibility and
    memory are checked by :func:`search` (recorded as refusals, not dropped here).

    ``designs`` (:data:`DESIGNS`): the colocated configurations come first; with
    ``"disaggregated"``, then every :class:`DisaggConfig` of each GPU and dtype with a
    prefill and a decode degree from ``tps``, a prefill batch cap from ``budgets`` and
    decode slots from ``max_batches`` (``modes`` do not apply: each pool's mode is fixed)."""
    names = [_known_gpu(g, "gpus") for g in _choices("gpus", gpus)]
    table = gpu_table().set_index("gpu")
    tp_list = _choices("tps", tps, whole=True)
    dtype_list = _choices("dtypes", dtypes, DTYPES)
    mode_list = _choices("modes", modes, MODES)
    budget_list = _choices("budgets", budgets, whole=True)
    batch_list = _choices("max_batches", max_batches, whole=True)
    design_list = _choices("designs", designs, DESIGNS)
    out = []
    if "colocated" in design_list:
        for gpu in names:
            has_fp8 = not pd.isna(table.loc[gpu, "fp8_dense_tflops"])
            for tp in tp_list:
                for dtype in dtype_list:
                    if dtype == "fp8" and not has_fp8:
                        continue
                    for mode in mode_list:
                        for budget in (budget_list if mode != "combined" else [None]):
                            for batch in batch_list:
                                out.append(Config(gpu, tp, dtype, mode, budget, batch))
    if "disaggregated" in design_list:
        for gpu in names:
            has_fp8 = not pd.isna(table.loc[gpu, "fp8_dense_tflops"])
            for dtype in dtype_list:
                if dtype == "fp8" and not has_fp8:
                    continue
                for prefill_tp in tp_list:
                    for decode_tp in tp_list:
                        for budget in budget_list:
                            for batch in batch_list:
                                out.append(DisaggConfig(gpu, dtype, prefill_tp, decode_tp,
                                                        budget, batch))
    return out


# --------------------------------------------------------------------------- one config


@dataclass(frozen=True)
class _Context:
    """Everything but the configuration (shipped to workers once per task)."""

    model: dict
    model_label: str
    requests: object
    rate: float
    limits: dict
    target: float
    router: str
    policy: str
    spares: int
    seed: int
    confidence: float
    budget: int
    delta: float
    holds: float
    min_requests: int
    max_replicas: int
    flops_efficiency: float
    bandwidth_efficiency: float
    gpu_memory_utilization: float
    kv_link_gb_per_s: float | None = None


def _mean_tokens(requests) -> tuple[float, float]:
    _, ref = planning._source(requests)
    return float(ref["prompt_tokens"].mean()), float(ref["output_tokens"].mean())


def _built(gpu: str, tp: int, dtype: str, max_batch: int, context: float, ctx: _Context,
           **knobs) -> tuple[Replica, int]:
    """(replica, KV capacity tokens) of ``tp`` x ``gpu`` holding ``max_batch`` sequences
    of ``context`` tokens; ValueError says why it does not fit."""
    heads = int(ctx.model.get("num_attention_heads", 0))
    if heads % tp:
        raise ValueError(f"num_attention_heads {heads} does not divide by tp={tp}")
    fp8 = dtype == "fp8"
    spec = _model_config(ctx.model, name=ctx.model_label)
    memory = memory_plan(spec, gpu, tp=tp, fp8=fp8,
                         gpu_memory_utilization=ctx.gpu_memory_utilization)
    memory.check_batch(max_batch, context)
    cost = Roofline(spec, gpu, tp=tp, fp8=fp8, flops_efficiency=ctx.flops_efficiency,
                    bandwidth_efficiency=ctx.bandwidth_efficiency)
    replica = Replica(max_batch=max_batch, step_time=cost,
                      kv_capacity_tokens=memory.kv_capacity_tokens, **knobs)
    return replica, memory.kv_capacity_tokens


def _replica(cfg: Config, ctx: _Context) -> tuple[Replica, int]:
    """(replica, KV capacity tokens) of a configuration; ValueError says why it does not fit."""
    prompt, output = _mean_tokens(ctx.requests)
    return _built(cfg.gpu, cfg.tp, cfg.dtype, cfg.max_batch, prompt + output / 2, ctx,
                  mode=cfg.mode, max_batched_tokens=cfg.max_batched_tokens)


def _pools(cfg: DisaggConfig, ctx: _Context) -> tuple[Replica, Replica, int]:
    """(prefill replica, decode replica, decode KV capacity tokens) of a disaggregated
    configuration. The prefill replica must hold ``max_batch`` mean prompts; the decode
    replica ``max_batch`` sequences at the mean context, as a colocated one. ValueError
    names the pool that does not fit."""
    prompt, output = _mean_tokens(ctx.requests)
    try:
        prefill, _ = _built(cfg.gpu, cfg.prefill_tp, cfg.dtype, cfg.max_batch, prompt, ctx,
                            mode=DISAGG_PREFILL_MODE, max_batched_tokens=cfg.prefill_budget)
    except ValueError as exc:
        raise ValueError(f"prefill pool: {exc}") from None
    try:
        decode, kv = _built(cfg.gpu, cfg.decode_tp, cfg.dtype, cfg.max_batch,
                            prompt + output / 2, ctx, mode="combined")
    except ValueError as exc:
        raise ValueError(f"decode pool: {exc}") from None
    return prefill, decode, kv


def kv_link_gb_per_s(gpu: str, prefill_tp: int, decode_tp: int,
                     override: float | None = None) -> float:
    """Bandwidth of the prefill-to-decode KV link (GB/s) of a disaggregated configuration.

    ``override`` when given (GB/s, > 0); otherwise :data:`DEFAULT_LINK_NOTE`:
    ``min(prefill_tp, decode_tp) x link_gb_per_s / 2`` from ``data/gpus.csv`` (e.g. an
    H100-SXM's NVLink 4, 900 GB/s bidirectional: 450 GB/s per GPU pair; an L40S has no
    NVLink, so its PCIe Gen4 x16, 32 GB/s). Optimistic when the pools sit on different
    nodes (a 400 Gb/s InfiniBand NIC per GPU moves 50 GB/s): pass ``override`` then."""
    if override is not None:
        return _check.positive("override", override)
    name = _known_gpu(gpu, "gpu")
    per_gpu = float(gpu_table().set_index("gpu").loc[name, "link_gb_per_s"]) / 2
    return min(_check.whole("prefill_tp", prefill_tp),
               _check.whole("decode_tp", decode_tp)) * per_gpu


def _link(cfg: DisaggConfig, ctx: _Context) -> dict:
    """:func:`servingcap.disagg.simulate_disaggregated`'s link arguments of ``cfg``."""
    spec = _model_config(ctx.model, name=ctx.model_label)
    size = 1 if cfg.dtype == "fp8" else None
    gbps = kv_link_gb_per_s(cfg.gpu, cfg.prefill_tp, cfg.decode_tp, ctx.kv_link_gb_per_s)
    return {"kv_bytes_per_token": spec.kv_bytes_per_token(size),
            "link_bytes_per_s": gbps * 1e9}


def _bound(cfg, ctx: _Context) -> dict:
    """Fit, feasibility and fluid bound of a configuration (no simulation):
    ``kv_capacity_tokens``, ``fluid_min`` (replicas, both pools together),
    ``fluid_gpus`` (GPUs of the fluid fleet with spares) and, disaggregated,
    ``kv_link_gb_per_s``. ValueError says why the configuration is refused."""
    if isinstance(cfg, DisaggConfig):
        prefill, decode, kv = _pools(cfg, ctx)
        _, ref = planning._source(ctx.requests)
        longer = float((ref["prompt_tokens"] > cfg.prefill_budget).mean())
        if longer > 1 - ctx.target:
            raise ValueError(f"prefill pool: {longer:.1%} of prompts are longer than its batch "
                             f"cap of {cfg.prefill_budget} tokens (it runs whole prompts and "
                             "rejects longer ones); search a larger budget")
        split = (("prefill pool", prefill, {k: v for k, v in ctx.limits.items() if k == "ttft_s"}),
                 ("decode pool", decode, {k: v for k, v in ctx.limits.items() if k != "ttft_s"}))
        for name, replica, limits in split:
            found = limits and planning.infeasible(ctx.requests, replica, limits, ctx.target)
            if found:
                raise ValueError(f"no fleet can meet the target {ctx.target:g}: {name}: "
                                 f"{found[1]}")
        busy = disagg.pool_fluid_bounds(ctx.requests, prefill, decode, ctx.rate)
        extra = {"kv_link_gb_per_s": _link(cfg, ctx)["link_bytes_per_s"] / 1e9}
    else:
        replica, kv = _replica(cfg, ctx)
        found = planning.infeasible(ctx.requests, replica, ctx.limits, ctx.target)
        if found is not None:
            raise ValueError(f"no fleet can meet the target {ctx.target:g}: {found[1]}")
        busy = (ctx.rate / planning.fluid_rate(ctx.requests, replica),)
        extra = {}
    if not max(busy) < ctx.max_replicas:
        raise ValueError(f"the fluid bound needs more than max_replicas="
                         f"{ctx.max_replicas} replicas ({max(busy):.4g} busy)")
    floors = [math.floor(b) + 1 for b in busy]
    return {"kv_capacity_tokens": kv, "fluid_min": sum(floors),
            "fluid_gpus": _gpus(floors, cfg, ctx.spares), **extra}


def _gpus(counts, cfg, spares: int) -> int:
    """GPUs of a fleet of ``counts`` replicas per pool plus ``spares`` in each pool."""
    return sum((int(n) + spares) * tp for n, tp in zip(counts, cfg.tps, strict=True))


def _fraction(name: str, value, zero: bool = False, least: float = 0.0) -> float:
    """A fraction in (0, 1] ([0, 1] with ``zero``; [least, 1] with ``least``)."""
    x = _check.number(name, value)
    if not (0 <= x <= 1) or (x == 0 and not zero):
        raise ValueError(f"{name} must be in {'[0' if zero else '(0'}, 1], got {value!r}")
    if x < least:
        raise ValueError(f"{name} must be >= {least:g} (no kernel reaches less), got {value!r}")
    return x


def usd_per_mtok(usd_per_hour: float, rate: float, attainment: float,
                 mean_output_tokens: float) -> float:
    """US dollars per million good output tokens: ``usd_per_hour * 1e6 / (3600 * rate *
    attainment * mean_output_tokens)`` (rate in requests/s; attainment the fraction of
    requests meeting the SLO, in [0, 1]; inf when it is 0)."""
    cost = _check.nonnegative("usd_per_hour", usd_per_hour)
    lam = _check.positive("rate", rate)
    share = _fraction("attainment", attainment, zero=True)
    out = _check.positive("mean_output_tokens", mean_output_tokens)
    good = 3600.0 * lam * share * out
    return math.inf if good == 0 else cost * 1e6 / good


def _simulate(task) -> dict:
    """One configuration's smallest fleet (module level: pools and Dask run it).
    ``task`` is ``(cfg, ctx)``, or ``(cfg, ctx, start)`` to start a colocated fleet at
    ``start`` replicas (:func:`confirm`) instead of the fluid guess; a disaggregated
    configuration always starts its pools at their fluid bounds."""
    cfg, ctx, *first = task
    if isinstance(cfg, DisaggConfig):
        return _simulate_pools(cfg, ctx)
    replica, _ = _replica(cfg, ctx)
    busy = ctx.rate / planning.fluid_rate(ctx.requests, replica)
    start = first[0] if first else math.ceil(busy + planning.FLUID_GUESS_BETA * math.sqrt(busy))
    try:
        fleet = planning.smallest_fleet(
            ctx.requests, replica, ctx.rate, router=ctx.router, policy=ctx.policy,
            limits=ctx.limits, target=ctx.target, seed=ctx.seed,
            start=min(start, ctx.max_replicas), max_replicas=ctx.max_replicas,
            confidence=ctx.confidence, budget=ctx.budget, delta=ctx.delta,
            holds=ctx.holds, min_requests=ctx.min_requests, executor=None)
    except ValueError as exc:
        return {"status": "failed", "reason": str(exc)}
    row = fleet.row(fleet.replicas)
    table = fleet.evaluations
    low = fleet.shown_to_miss + 1
    simulated_below = bool((table["replicas"] == low - 1).any())
    return {"status": "ranked", "reason": "", "replicas": int(fleet.replicas),
            "replicas_low": int(low), "replicas_floor": int(low - 1 if simulated_below
                                                            and low - 1 >= 1 else low),
            "attainment": float(row["attainment"]),
            "attainment_low": float(row["attainment_low"]),
            "attainment_high": float(row["attainment_high"]),
            "ttft_p99_s": float(row["ttft_p99_s"]), "ttft_p99_low": float(row["ttft_p99_low"]),
            "ttft_p99_high": float(row["ttft_p99_high"]), "tpot_p99_s": float(row["tpot_p99_s"]),
            "goodput_rps": float(row["goodput_rps"]), "replications": int(row["replications"]),
            "below_verdict": fleet.below_verdict, "sizes_simulated": int(len(table))}


def _simulate_pools(cfg: DisaggConfig, ctx: _Context) -> dict:
    """A disaggregated configuration's smallest pools (:func:`servingcap.disagg.
    smallest_pools`, replications serial), as :func:`_simulate`'s row plus each pool's
    sizes: ``pool_replicas`` (the answer), ``pool_low`` (smallest not shown to miss,
    each pool with the other at its answer) and ``pool_floor`` (lowest still possible:
    one fewer when the size below misses -- within the indifference zone it may meet --,
    the fluid bound when it is open, the answer when it is under the fluid bound)."""
    prefill, decode, _ = _pools(cfg, ctx)
    try:
        pools = disagg.smallest_pools(
            ctx.requests, prefill, decode, ctx.rate, **_link(cfg, ctx), router=ctx.router,
            policy=ctx.policy, limits=ctx.limits, target=ctx.target, seed=ctx.seed,
            confidence=ctx.confidence, budget=ctx.budget, delta=ctx.delta, holds=ctx.holds,
            min_requests=ctx.min_requests, max_replicas=ctx.max_replicas)
    except ValueError as exc:
        return {"status": "failed", "reason": str(exc)}
    row = pools.row()
    sizes = [pools.prefill_replicas, pools.decode_replicas]
    floors = [pools.prefill_fluid_min, pools.decode_fluid_min]
    below = [pools.prefill_below, pools.decode_below]
    low = [n - 1 if b == "open" else n for n, b in zip(sizes, below, strict=True)]
    lowest = [n if b == "fluid bound" else (n - 1 if b == "misses" else f)
              for n, b, f in zip(sizes, below, floors, strict=True)]
    return {"status": "ranked", "reason": "", "replicas": int(sum(sizes)),
            "prefill_replicas": int(sizes[0]), "decode_replicas": int(sizes[1]),
            "replicas_low": int(sum(low)), "pool_replicas": sizes, "pool_low": low,
            "pool_floor": lowest,
            "attainment": float(row["attainment"]),
            "attainment_low": float(row["attainment_low"]),
            "attainment_high": float(row["attainment_high"]),
            "ttft_p99_s": float(row["ttft_p99_s"]), "ttft_p99_low": float(row["ttft_p99_low"]),
            "ttft_p99_high": float(row["ttft_p99_high"]), "tpot_p99_s": float(row["tpot_p99_s"]),
            "goodput_rps": ctx.rate * float(row["attainment"]),
            "replications": int(row["replications"]),
            "below_verdict": f"P-1 {below[0]}, D-1 {below[1]}",
            "sizes_simulated": int(len(pools.evaluations))}


# --------------------------------------------------------------------------- cache


def _workload_key(requests) -> object:
    if isinstance(requests, planning.PoissonWorkload):
        return {"poisson": [requests.prompt.kind, dict(requests.prompt.params),
                            requests.output.kind, dict(requests.output.params)]}
    frame = pd.DataFrame(requests)
    cols = [c for c in ("arrival_s", "prompt_tokens", "output_tokens") if c in frame]
    digest = hashlib.sha256(pd.util.hash_pandas_object(frame[cols], index=False)
                            .to_numpy().tobytes())
    if "hash_ids" in frame:
        digest.update(json.dumps([list(map(int, x)) for x in frame["hash_ids"]]).encode())
    return {"table": digest.hexdigest()}


def _cache_key(cfg: Config | DisaggConfig, ctx: _Context) -> str:
    config = asdict(cfg)
    if isinstance(cfg, DisaggConfig):
        config.update(design=cfg.design, link=_link(cfg, ctx))
    payload = {"format": _CACHE_FORMAT, "version": __version__, "config": config,
               **{k: v for k, v in asdict(ctx).items()
                  if k not in ("requests", "kv_link_gb_per_s")},
               "requests": _workload_key(ctx.requests)}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cache_read(directory: Path | None, key: str) -> dict | None:
    if directory is None:
        return None
    file = directory / f"{key}.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("status") in STATUSES else None


def _cache_write(directory: Path | None, key: str, result: dict) -> None:
    if directory is None:
        return
    file = directory / f"{key}.json"
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, allow_nan=True))
    tmp.replace(file)                       # atomic: an interrupted write leaves no half file


# --------------------------------------------------------------------------- ranking


def rank(table: pd.DataFrame) -> pd.DataFrame:
    """The ranked rows (``status == "ranked"``) cheapest first: by ``usd_per_mtok``, ties
    broken by the lower ``ttft_p99_s``, then by ``label``; ``rank`` set to 1, 2, ..."""
    _columns(table, ("status", "usd_per_mtok", "ttft_p99_s", "label"))
    ranked = table.loc[table["status"] == "ranked"].copy()
    _numbers(ranked, ("usd_per_mtok",))
    _numbers(ranked, ("ttft_p99_s",), allow_inf=True)
    ranked = ranked.sort_values(["usd_per_mtok", "ttft_p99_s", "label"], kind="mergesort")
    ranked["rank"] = np.arange(1, len(ranked) + 1)
    return ranked


def pareto_front(table: pd.DataFrame, x: str = "usd_per_mtok",
                 y: str = "ttft_p99_s") -> pd.Series:
    """Boolean mask of the rows no other row beats on both ``x`` and ``y`` (lower is
    better for both; a row equal on both to another is on the front with it). Rows with a
    NaN in either column are never on the front."""
    for name, column in (("x", x), ("y", y)):
        if not isinstance(column, str):
            raise ValueError(f"{name} must be a column name, got {column!r}")
        _columns(table, (column,), name)
    xs = _as_float(table, x)
    ys = _as_float(table, y)
    ok = ~(np.isnan(xs) | np.isnan(ys))
    front = np.zeros(len(table), dtype=bool)
    for i in np.flatnonzero(ok):
        beaten = ok & (xs <= xs[i]) & (ys <= ys[i]) & ((xs < xs[i]) | (ys < ys[i]))
        front[i] = not beaten.any()
    return pd.Series(front, index=table.index, name="pareto")


def _columns(table, names, param: str = "table") -> None:
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"table must be a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in names if c not in table.columns]
    if missing:
        raise ValueError(f"{param}: table lacks the column(s) {', '.join(missing)}")


def _as_float(table: pd.DataFrame, column: str) -> np.ndarray:
    try:
        return table[column].to_numpy(dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"table column {column} must hold numbers") from None


def _numbers(table: pd.DataFrame, columns, allow_inf: bool = False) -> None:
    """Ranked rows' ``columns`` must be numbers >= 0 (finite unless ``allow_inf``)."""
    _columns(table, columns)
    for column in columns:
        values = _as_float(table, column)
        ok = (values >= 0) & (np.isfinite(values) | allow_inf)
        if not ok.all():
            raise ValueError(f"table column {column} must hold numbers >= 0"
                             f"{'' if allow_inf else ' (finite)'} in ranked rows, got "
                             f"{values[~ok][0]!r}")


def _money(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.3g}"


PRICE_TOLERANCE = 0.10
"""Default relative cost gap (10 %) below which :func:`conclusion` calls two
configurations a tie on price. A convention, not a measurement: the shipped prices
(``data/gpu_prices.csv``) mix providers, pricing models (reserved blocks, on-demand) and
dates, so a small gap between configurations on different GPUs may rank those quotes
rather than the hardware. Pass your own (``--price-tolerance``)."""


def conclusion(table: pd.DataFrame, price_tolerance: float = PRICE_TOLERANCE) -> str:
    """One line: the cheapest configuration, how far the runner-up is behind, every
    configuration not separated from the cheapest, and every one tied with it on price.

    *Separated* (module docstring): the cheapest's ``usd_per_mtok_high`` is below the
    other's ``min_separating_usd_per_mtok``, its lowest still possible cost; every ranked
    configuration is checked, not only the runner-up. *A tie on price*: the other's
    ``usd_per_mtok`` is less than ``price_tolerance`` (a fraction, default
    :data:`PRICE_TOLERANCE`) above the cheapest's, so the choice turns on the reader's
    prices; when the spare replicas (paid for, ``spares`` x ``tp`` GPUs) decide such a
    pair's order, the line says so, and it says so too for a configuration outside the
    tolerance that would be cheaper than the cheapest without the spares.
    """
    tol = _check.number("price_tolerance", price_tolerance)
    if not 0 <= tol < 1:
        raise ValueError(f"price_tolerance must be a fraction in [0, 1), got {price_tolerance!r}")
    ranked = rank(table)
    _numbers(ranked, ("replicas", "spares", "gpus", "usd_per_hour", "usd_per_mtok_low",
                      "usd_per_mtok_high", "min_separating_usd_per_mtok"))
    if ranked.empty:
        return "No configuration meets the SLO at this rate (see the refused, pruned and failed rows)."
    best = ranked.iloc[0]
    head = (f"Cheapest: {best['label']}, {_fleet_words(best)} = {int(best['gpus'])} GPUs, "
            f"{_money(best['usd_per_hour'])}/h, "
            f"{_money(best['usd_per_mtok'])} per million good output tokens "
            f"({_money(best['usd_per_mtok_low'])}-{_money(best['usd_per_mtok_high'])})")
    if len(ranked) == 1:
        pruned = int((table["status"] == "pruned").sum())
        if pruned:          # a pruned row's lower bound costs more than the cheapest's
            return (head + f"; no other configuration was shown to meet the SLO ({pruned} "
                    "pruned: a lower bound on each one's cost is above this one's).")
        return head + "; no other configuration meets the SLO."
    others = ranked.iloc[1:]
    gaps = others["usd_per_mtok"] / best["usd_per_mtok"] - 1
    floors = others["min_separating_usd_per_mtok"]
    apart = best["usd_per_mtok_high"] < floors
    second = others.iloc[0]
    verdict = ("separated: the runner-up costs more even at its lowest still possible "
               f"cost, {_money(floors.iloc[0])}" if apart.iloc[0] else
               f"not separated: the runner-up could cost as little as {_money(floors.iloc[0])} "
               "(its open sizes, one replica of indifference and its attainment interval), "
               f"within the cheapest's {_money(best['usd_per_mtok_high'])}")
    parts = [f"{head}; runner-up {second['label']} {_money(second['usd_per_mtok'])} "
             f"({gaps.iloc[0]:+.1%}), {verdict}"]
    more = others.iloc[1:].loc[~apart.iloc[1:]]
    if len(more):
        parts.append("also not separated from the cheapest: " + ", ".join(
            f"{r['label']} {_money(r['usd_per_mtok'])} (as little as "
            f"{_money(r['min_separating_usd_per_mtok'])})" for _, r in more.iterrows()))
    tied = others.loc[gaps < tol]
    if len(tied):
        names = ", ".join(f"{r['label']} ({g:+.1%})" for (_, r), g in
                          zip(tied.iterrows(), gaps.loc[tied.index], strict=True))
        text = (f"a tie on price: {names} within the {tol:.0%} price tolerance of the "
                "cheapest, so the choice turns on your prices")
        spare = _spare_decides(best, tied)
        if spare:
            text += f"; the spare replicas decide the order ({spare} cheaper without them)"
        parts.append(text)
    spare = _spare_decides(best, others.loc[gaps >= tol])
    if spare:
        parts.append(f"outside the price tolerance, the spare replicas alone decide the order: "
                     f"{spare} cheaper than the cheapest without them")
    return "; ".join(parts) + "."


def _disaggregated(row) -> bool:
    return row.get("design", "colocated") == "disaggregated"


def _fleet_words(row) -> str:
    """``"15 + 1 spare replicas"``, or for a disaggregated row ``"3 prefill + 5 decode
    + 2 spare replicas"``."""
    if _disaggregated(row):
        return (f"{int(row['prefill_replicas'])} prefill + {int(row['decode_replicas'])} "
                f"decode + {int(row['spares'])} spare replicas")
    return f"{int(row['replicas'])} + {int(row['spares'])} spare replicas"


def _spare_decides(best, rows: pd.DataFrame) -> str:
    """Labels of ``rows`` that cost less than ``best`` per good token without the spare
    replicas (same attainment, the GPUs of the replicas that serve only)."""
    def bare(r):
        if _disaggregated(r):        # one spare per pool in each: prefill_tp + tp GPUs
            spare = float(r["spares"]) / 2 * (float(r["prefill_tp"]) + float(r["tp"]))
            return float(r["usd_per_mtok"]) * (1 - spare / float(r["gpus"]))
        n = float(r["replicas"])
        return float(r["usd_per_mtok"]) * n / (n + float(r["spares"]))
    if float(best["spares"]) == 0:
        return ""
    return ", ".join(str(r["label"]) for _, r in rows.iterrows() if bare(r) < bare(best))


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class SearchResult:
    """A configuration search: every configuration's row, the prices used, and counts."""

    table: pd.DataFrame = field(repr=False)
    """One row per configuration (:data:`RESULT_COLUMNS`), in :func:`grid` order."""
    prices: pd.DataFrame = field(repr=False)
    """The price rows used (:data:`PRICE_COLUMNS`)."""
    rate: float
    model: str
    workload: str
    simulated: int
    """Configurations simulated by this call (not read from the cache)."""
    from_cache: int
    """Configurations whose simulation was read from the cache."""
    context: _Context | None = field(default=None, repr=False, compare=False)
    """Everything but the grid the search ran with (model, workload, SLO, statistics),
    so that :func:`confirm` can re-run its configurations."""

    @property
    def ranked(self) -> pd.DataFrame:
        """The configurations that meet, cheapest first (:func:`rank`)."""
        return rank(self.table)

    @property
    def front(self) -> pd.DataFrame:
        """The Pareto front (cost per million good tokens vs p99 TTFT), cheapest first."""
        ranked = self.ranked
        return ranked.loc[ranked["pareto"]]

    @property
    def conclusion(self) -> str:
        """:func:`conclusion` of the table at the default price tolerance."""
        return conclusion(self.table)

    @property
    def pruned(self) -> int:
        return int((self.table["status"] == "pruned").sum())

    def to_dict(self, price_tolerance: float = PRICE_TOLERANCE) -> dict:
        """JSON-ready: settings, prices, rows (NaN as None) and the conclusion (at
        ``price_tolerance``, :func:`conclusion`)."""
        rows = json.loads(self.table.to_json(orient="records"))
        return {"rate_rps": self.rate, "model": self.model, "workload": self.workload,
                "prices": json.loads(self.prices.to_json(orient="records")),
                "configurations": rows,
                "conclusion": conclusion(self.table, price_tolerance),
                "price_tolerance": price_tolerance,
                "simulated": self.simulated, "from_cache": self.from_cache}


def _cost_row(out: dict, cfg: Config | DisaggConfig, ctx: _Context, price: float,
              mean_out: float) -> dict:
    def gpus_of(key: str) -> int:     # pool sizes: disaggregated pool_*, colocated replicas*
        counts = out[f"pool_{key}"] if f"pool_{key}" in out else [
            out["replicas" if key == "replicas" else f"replicas_{key}"]]
        return _gpus(counts, cfg, ctx.spares)

    def hour_of(key: str) -> float:   # US dollars per hour of those sizes
        return gpus_of(key) * price

    gpus = gpus_of("replicas")
    hour = gpus * price
    att, att_lo, att_hi = out["attainment"], out["attainment_low"], out["attainment_high"]
    floor_hour = hour_of("floor")
    return {"gpus": gpus, "usd_per_hour": hour, "usd_per_hour_low": hour_of("low"),
            "usd_per_mtok": usd_per_mtok(hour, ctx.rate, att, mean_out),
            "usd_per_mtok_low": usd_per_mtok(hour, ctx.rate, att_hi, mean_out),
            "usd_per_mtok_high": usd_per_mtok(hour, ctx.rate, att_lo, mean_out),
            "min_separating_usd_per_mtok": usd_per_mtok(floor_hour, ctx.rate, att_hi, mean_out)}


def _run(items: list, executor, done: Callable) -> None:
    """Run :func:`_simulate` on each ``(key, task)`` of ``items``; ``done(key, result)``
    as each ends (in completion order: a progress bar moves per configuration)."""
    pool = parallel.resolve(executor)
    if pool is None or len(items) <= 1:
        for key, task in items:
            done(key, _simulate(task))
        return
    futures = {pool.submit(_simulate, task): key for key, task in items}
    try:
        for future in cf.as_completed(futures):
            done(futures[future], future.result())
    except BaseException:
        for future in futures:
            future.cancel()
        raise


def search(model, requests, rate: float, *, gpus=None, tps=TP_DEGREES, dtypes=DTYPES,
           modes=("mixed",), budgets=(2048,), max_batches=(32,),
           designs=("colocated",), kv_link_gb_per_s: float | None = None, prices=None,
           price_overrides: Mapping | None = None, limits=None, target: float = 0.99,
           router: str = DEFAULT_ROUTER, policy: str = "fcfs", spares: int = 1, seed=0,
           confidence: float = 0.95, budget: int = 16, delta: float = stats.INDIFFERENCE,
           holds: float = 20.0, min_requests: int = 2000, max_replicas: int = 4096,
           flops_efficiency: float = FLOPS_EFFICIENCY,
           bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY,
           gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
           prune: bool = True, wave: int = 4, executor=parallel.AUTO, cache_dir=None,
           progress: Callable | None = None) -> SearchResult:
    """The cheapest configuration of ``model`` serving ``requests`` at ``rate`` req/s.

    Parameters
    ----------
    model : str, Path or mapping
        A model config, dense or mixture of experts (:func:`load_model`).
    requests : PoissonWorkload or pandas.DataFrame
        The workload, as :func:`servingcap.planning.smallest_fleet` takes it.
    rate : float
        Arrival rate to serve, requests/s.
    gpus : list of str, optional
        GPU names (``data/gpus.csv``); default: every GPU with a price. A GPU without a
        price is refused by name.
    tps, dtypes, modes, budgets, max_batches
        The grid (:func:`grid`): tensor-parallel degrees, ``bf16``/``fp8``, scheduling
        modes, token budgets (tokens per step), batch slots.
    designs : list of str
        :data:`DESIGNS` to search (default colocated only): with ``"disaggregated"`` the
        grid adds a :class:`DisaggConfig` for each GPU, dtype, prefill and decode degree
        (both from ``tps``), prefill batch cap (from ``budgets``) and decode slots (from
        ``max_batches``), sized by :func:`servingcap.disagg.smallest_pools` (a heuristic
        coordinate search over the two pools, each decided as a colocated size is) and
        priced for both pools' GPUs with ``spares`` in each pool.
    kv_link_gb_per_s : float, optional
        Prefill-to-decode KV link of the disaggregated designs (GB/s); default: from
        ``data/gpus.csv`` (:func:`kv_link_gb_per_s`).
    prices, price_overrides
        The price table (:func:`resolve_prices`: a table, a CSV path or None for
        ``data/gpu_prices.csv``) and per-GPU overrides, US dollars per GPU-hour.
    limits, target, router, policy, spares, seed, confidence, budget, delta, holds,
    min_requests, max_replicas
        As :func:`servingcap.planning.smallest_fleet` (``spares`` replicas are added to
        each answer and paid for).
    flops_efficiency, bandwidth_efficiency
        The roofline's efficiencies (default: the measured 0.62 / 0.55).
    gpu_memory_utilization
        Fraction of each GPU's memory the engine may use (vLLM's flag).
    prune : bool
        Skip configurations whose fluid bound already costs more than the best found.
    wave : int
        Configurations simulated between two pruning decisions (fixed, so the table
        does not depend on the executor).
    executor
        Runs the configurations (module docstring): ``"auto"``, None, an Executor or a
        Dask ``distributed.Client``.
    cache_dir : str or Path, optional
        Directory of cached per-configuration results (created if missing).
    progress : callable, optional
        Called with each configuration's finished row (a dict), as it finishes.

    Returns a :class:`SearchResult`. Raises ValueError for bad input (naming it), never
    for a configuration that does not fit.
    """
    config, label = load_model(model)
    lam = _check.positive("rate", rate)
    if not isinstance(prune, bool):
        raise ValueError(f"prune must be True or False, got {prune!r}")
    wave = _check.whole("wave", wave)
    parallel.resolve(executor)                  # raises ValueError naming executor
    check_fleet(Replica(), 1, router, policy)   # raises ValueError naming router / policy
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        raise ValueError(f"cache_dir must be a directory path or None, got {cache_dir!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be callable or None, got {progress!r}")
    table = resolve_prices(prices, price_overrides)
    price_of = dict(zip(table["gpu"], table["usd_per_gpu_hour"], strict=True))
    names = (list(price_of) if gpus is None
             else [_known_gpu(g, "gpus") for g in _choices("gpus", gpus)])
    unpriced = [g for g in names if g not in price_of]
    if unpriced:
        raise ValueError(f"gpus: no price for {', '.join(unpriced)} (add it to the prices "
                         "file or override it, or leave the GPU out)")
    configs = grid(names, tps=tps, dtypes=dtypes, modes=modes, budgets=budgets,
                   max_batches=max_batches, designs=designs)
    link = None if kv_link_gb_per_s is None else _check.positive("kv_link_gb_per_s",
                                                                 kv_link_gb_per_s)
    if not configs:
        raise ValueError(f"the grid is empty: dtypes={list(dtypes)!r} on gpus={names!r} "
                         "leaves no configuration (fp8 needs a GPU with fp8 tensor cores)")
    ctx = _Context(model=config, model_label=label, requests=requests, rate=lam,
                   limits=planning._limits(limits), target=planning._target(target),
                   router=router, policy=policy,
                   spares=_check.whole("spares", spares, minimum=0),
                   seed=planning._seed(seed),
                   confidence=_check.probability("confidence", confidence),
                   budget=_check.whole("budget", budget), delta=_check.positive("delta", delta),
                   holds=_check.positive("holds", holds),
                   min_requests=_check.whole("min_requests", min_requests, minimum=100),
                   max_replicas=_check.whole("max_replicas", max_replicas),
                   flops_efficiency=_fraction("flops_efficiency", flops_efficiency,
                                              least=MIN_EFFICIENCY),
                   bandwidth_efficiency=_fraction("bandwidth_efficiency",
                                                  bandwidth_efficiency, least=MIN_EFFICIENCY),
                   gpu_memory_utilization=_fraction("gpu_memory_utilization",
                                                             gpu_memory_utilization),
                   kv_link_gb_per_s=link)
    planning._design(ctx.confidence, ctx.budget, ctx.holds, ctx.min_requests, ctx.seed,
                     None, ctx.delta)
    _, mean_out = _mean_tokens(requests)
    directory = None
    if cache_dir is not None:
        directory = Path(cache_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cache_dir {str(cache_dir)!r} could not be created ({exc})") from None

    rows: list[dict] = []
    candidates: list[int] = []
    for cfg in configs:
        price = price_of[cfg.gpu]
        row = {"label": cfg.label, **cfg.fields(), "status": "", "reason": "",
               "spares": ctx.spares * len(cfg.tps), "usd_per_gpu_hour": price,
               "cached": False}
        try:
            bound = _bound(cfg, ctx)
            gpus_min = bound.pop("fluid_gpus")
            row.update(bound)
            row["min_usd_per_mtok"] = usd_per_mtok(gpus_min * price, lam, 1.0, mean_out)
            candidates.append(len(rows))
        except ValueError as exc:
            row.update(status="refused", reason=str(exc))
        rows.append(row)

    order = sorted(candidates, key=lambda i: (rows[i]["min_usd_per_mtok"], i))
    best_high = math.inf
    best_label = ""
    simulated = from_cache = 0
    position = 0

    def finish(i: int, out: dict, cached: bool) -> None:
        nonlocal best_high, best_label
        cfg = configs[i]
        row = rows[i]
        row.update({k: v for k, v in out.items()
                    if k != "replicas_floor" and not k.startswith("pool_")})
        row["cached"] = cached
        if out["status"] == "ranked":
            row.update(_cost_row(out, cfg, ctx, price_of[cfg.gpu], mean_out))
            if row["usd_per_mtok_high"] < best_high:
                best_high, best_label = row["usd_per_mtok_high"], row["label"]
        if progress is not None:
            progress(dict(row))

    def save(i: int, out: dict) -> None:
        _cache_write(directory, _cache_key(configs[i], ctx), out)
        finish(i, out, False)

    while position < len(order):
        batch: list[int] = []
        while position < len(order) and len(batch) < wave:
            i = order[position]
            position += 1
            if prune and rows[i]["min_usd_per_mtok"] > best_high:
                rows[i].update(status="pruned", reason=(
                    f"pruned: fluid bound costs more than {_money(best_high)} per million "
                    f"good tokens ({rows[i]['fluid_min']} + {rows[i]['spares']} replicas at "
                    f"attainment 1: {_money(rows[i]['min_usd_per_mtok'])}; best so far "
                    f"{best_label})"))
                if progress is not None:
                    progress(dict(rows[i]))
                continue
            batch.append(i)
        keys = {i: _cache_key(configs[i], ctx) for i in batch}
        todo = []
        for i in batch:
            hit = _cache_read(directory, keys[i])
            if hit is not None:
                from_cache += 1
                finish(i, hit, True)
            else:
                todo.append(i)

        _run([(i, (configs[i], ctx)) for i in todo], executor, save)
        simulated += len(todo)

    frame = pd.DataFrame(rows)
    for column in RESULT_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    ranked = rank(frame)
    frame["rank"] = np.nan
    frame.loc[ranked.index, "rank"] = ranked["rank"]
    frame["pareto"] = pareto_front(frame.where(frame["status"] == "ranked"))
    frame = frame[list(RESULT_COLUMNS)]
    used = table[table["gpu"].isin(names)].reset_index(drop=True)
    return SearchResult(table=frame, prices=used, rate=lam, model=label,
                        workload=str(requests) if isinstance(requests, planning.PoissonWorkload)
                        else f"request table of {len(requests)} rows",
                        simulated=simulated, from_cache=from_cache, context=ctx)


# --------------------------------------------------------------------------- confirm

SCREENED_COLUMNS = ("screened_status", "screened_rank", "screened_usd_per_mtok")
"""Columns :func:`confirm` adds after :data:`RESULT_COLUMNS`: each configuration's
status, rank and US dollars per million good output tokens in the screening search."""

_FROM_GRID = ("label", "design", "gpu", "tp", "prefill_tp", "dtype", "mode",
              "max_batched_tokens", "max_batch", "kv_capacity_tokens", "kv_link_gb_per_s",
              "fluid_min", "spares", "usd_per_gpu_hour",
              "min_usd_per_mtok")
"""Columns of a row that do not depend on the statistics (kept by :func:`confirm`)."""


def _config_of(row) -> Config | DisaggConfig:
    """The configuration of a result-table row (the inverse of ``fields()``)."""
    budget = row["max_batched_tokens"]
    if row.get("design", "colocated") == "disaggregated":
        return DisaggConfig(row["gpu"], row["dtype"], int(row["prefill_tp"]), int(row["tp"]),
                            int(budget), int(row["max_batch"]))
    return Config(row["gpu"], int(row["tp"]), row["dtype"], row["mode"],
                  None if pd.isna(budget) else int(budget), int(row["max_batch"]))


def confirm(result: SearchResult, *, top: int = 3, most: int = 6, budget: int = 16,
            holds: float = 20.0, min_requests: int = 2000, wave: int = 4,
            executor=parallel.AUTO, cache_dir=None,
            progress: Callable | None = None) -> SearchResult:
    """Size a search's shortlist again at longer statistics and rank it by those answers:
    the second stage of a screen-then-confirm search (ranking and selection).

    A search at reduced statistics (few, short replications) is a cheap *screen*: its
    costs are noisy, and biased low (a short replication drains after its last arrival,
    so its last requests see a falling load). ``confirm`` runs the smallest-fleet search
    again, at ``budget`` / ``holds`` / ``min_requests`` and otherwise the screening's
    settings and seed, starting each configuration the screening ranked at its screened
    fleet (which saves the sizes far below it; the answer is the row :func:`search` gives
    at these statistics unless an undecided size lies on the way), for

    1. the shortlist: the ``top`` cheapest ranked configurations of ``result``, and every
       other one the screening did not separate from its cheapest (its
       ``min_separating_usd_per_mtok`` at most the cheapest's ``usd_per_mtok_high``,
       :func:`conclusion`), cheapest first, ``most`` in all at most;
    2. then, in waves of ``wave`` configurations, lowest fluid bound first, every other
       configuration not refused (the screening ranked it lower, pruned it, or it
       failed) whose fluid bound ``min_usd_per_mtok`` (a lower bound that no statistics
       move) is at most the confirmed best's ``usd_per_mtok_high``: when the confirmed
       costs come out above the screened ones, a configuration the screening pruned may
       be cheaper than the confirmed answer.

    The rest are ``pruned`` against the confirmed best (reason given) and refusals are
    kept, so, as in :func:`search`, pruning cannot change the cheapest configuration.

    Parameters
    ----------
    result : SearchResult
        The screening: a :func:`search` result, usually at reduced statistics.
    top : int
        Cheapest screened configurations confirmed whatever their intervals (>= 1).
    most : int
        Most configurations on the shortlist (>= ``top``); step 2 may add more.
    budget, holds, min_requests
        The confirmation's statistics (replications at most, hold times and requests
        per replication at least), as :func:`servingcap.planning.smallest_fleet`; the
        defaults are its own.
    wave, executor, cache_dir, progress
        As :func:`search` (the cache key holds the statistics: screened and confirmed
        results of one configuration are cached apart).

    Returns a :class:`SearchResult` over the same configurations, ranked by the confirmed
    costs (``rank``, :func:`conclusion`), with :data:`SCREENED_COLUMNS` after
    :data:`RESULT_COLUMNS`; ``simulated`` and ``from_cache`` count the confirmations.
    Raises ValueError naming the parameter for bad input, and ``result`` when it ranks
    no configuration.
    """
    if not isinstance(result, SearchResult) or result.context is None:
        raise ValueError(f"result must be the SearchResult of configsearch.search, got "
                         f"{type(result).__name__}")
    top = _check.whole("top", top)
    most = _check.whole("most", most)
    if most < top:
        raise ValueError(f"most must be >= top={top}, got {most!r}")
    wave = _check.whole("wave", wave)
    parallel.resolve(executor)                  # raises ValueError naming executor
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        raise ValueError(f"cache_dir must be a directory path or None, got {cache_dir!r}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be callable or None, got {progress!r}")
    screen = result.context
    design = planning._design(screen.confidence, budget, holds, min_requests, screen.seed,
                              None, screen.delta)
    ctx = replace(screen, budget=design.budget, holds=design.holds,
                  min_requests=design.min_requests)
    screened = result.table
    ranked = rank(screened)
    if ranked.empty:
        raise ValueError("result ranks no configuration: there is nothing to confirm")
    directory = None if cache_dir is None else Path(cache_dir)
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cache_dir {str(cache_dir)!r} could not be created ({exc})") from None
    head = ranked.iloc[0]
    shortlist = [i for i in ranked.index if ranked.loc[i, "rank"] <= top
                 or ranked.loc[i, "min_separating_usd_per_mtok"] <= head["usd_per_mtok_high"]]
    shortlist = shortlist[:most]
    _, mean_out = _mean_tokens(ctx.requests)
    rows = {i: {k: screened.loc[i, k] for k in _FROM_GRID} | {
        "status": screened.loc[i, "status"], "reason": screened.loc[i, "reason"],
        "cached": False} for i in screened.index}
    counts = {"simulated": 0, "from_cache": 0}

    def finish(i: int, out: dict, cached: bool) -> None:
        row = rows[i]
        row.update({k: v for k, v in out.items() if k != "replicas_floor"}, cached=cached)
        if out["status"] == "ranked":
            row.update(_cost_row(out, _config_of(row), ctx, row["usd_per_gpu_hour"],
                                 mean_out))
        if progress is not None:
            progress(dict(row))

    def task(i: int) -> tuple:
        """The simulation of row ``i``: at the screened answer's size when it has one."""
        n = screened.loc[i, "replicas"] if screened.loc[i, "status"] == "ranked" else None
        return (_config_of(rows[i]), ctx) if n is None else (_config_of(rows[i]), ctx, int(n))

    def key(i: int) -> str:
        start = task(i)[2:]
        return hashlib.sha256(f"{_cache_key(_config_of(rows[i]), ctx)} start {start}"
                              .encode()).hexdigest()

    def save(i: int, out: dict) -> None:
        _cache_write(directory, key(i), out)
        finish(i, out, False)

    def confirm_wave(batch: list[int]) -> None:
        todo = []
        for i in batch:
            hit = _cache_read(directory, key(i))
            if hit is None:
                todo.append(i)
            else:
                finish(i, hit, True)
        _run([(i, task(i)) for i in todo], executor, save)
        counts["simulated"] += len(todo)
        counts["from_cache"] += len(batch) - len(todo)

    def best() -> tuple[float, str]:
        """(usd_per_mtok_high, label) of the confirmed row with the lowest high end."""
        met = [rows[i] for i in confirmed if rows[i]["status"] == "ranked"]
        low = min(met, key=lambda r: r["usd_per_mtok_high"], default=None)
        return (math.inf, "") if low is None else (low["usd_per_mtok_high"], low["label"])

    confirmed = set(shortlist)
    confirm_wave(shortlist)
    rest = sorted((i for i in screened.index if i not in confirmed
                   and rows[i]["status"] != "refused"),
                  key=lambda i: (rows[i]["min_usd_per_mtok"], i))
    while rest and rows[rest[0]]["min_usd_per_mtok"] <= best()[0]:
        high = best()[0]
        batch = [i for i in rest[:wave] if rows[i]["min_usd_per_mtok"] <= high]
        confirmed.update(batch)
        rest = rest[len(batch):]
        confirm_wave(batch)
    high, label = best()
    for i in rest:
        rows[i].update(status="pruned", reason=(
            f"pruned at confirmation: fluid bound {_money(rows[i]['min_usd_per_mtok'])} "
            f"costs more than {_money(high)} per million good tokens (confirmed {label})"))
    frame = pd.DataFrame([rows[i] for i in screened.index], index=screened.index)
    for column in RESULT_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    frame["rank"] = rank(frame)["rank"]
    frame["pareto"] = pareto_front(frame.where(frame["status"] == "ranked"))
    frame = frame[list(RESULT_COLUMNS)].assign(
        screened_status=screened["status"], screened_rank=screened["rank"],
        screened_usd_per_mtok=screened["usd_per_mtok"])
    return SearchResult(table=frame.reset_index(drop=True), prices=result.prices,
                        rate=result.rate, model=result.model, workload=result.workload,
                        context=ctx, **counts)
