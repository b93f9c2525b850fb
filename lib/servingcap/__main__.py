"""Command line: ``python -m servingcap plan`` sizes a fleet and checks it by simulation.

Run ``python -m servingcap plan --help`` for every option and its unit. Options can
also come from a TOML file (``--config plan.toml``) whose keys are the long option
names (``rate = 30``, ``prompt-dist = "lognormal:mean=2000,cv=1"``, ``no-progress =
true``); options given on the command line win over the file. Bad input, and a plan no
fleet can meet, exit with status 2 and a one-line message naming the option.
``python -m servingcap sweep`` (:mod:`servingcap.sweepcli`) takes the same options for a
fixed fleet at a list of rates.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .params import LOCKED
from .planning import MAX_REQUESTS_PER_RUN, Lengths, PoissonWorkload

PROG = "python -m servingcap"

# Every plan option: name -> (default, help). Defaults are the book's locked numbers.
_LOCKED_TABLE_TEXT = ", ".join(f"{1000 * t:g} ms at batch {b:g}"
                               for b, t in LOCKED.decode_step_table.items())
"""The book's decode curve (``LOCKED.decode_step_table``) as the help text shows it."""

DEFAULTS = {
    "rate": 30.0,
    "requests": None,
    "prompt_tokens": None,
    "prompt_dist": "fixed:2000",
    "output_tokens": None,
    "output_dist": "fixed:300",
    "trace": None,
    "prefill_rate": 8000.0,
    "decode_step_ms": None,
    "decode_table": None,
    "chunk_tokens": None,
    "max_batch": 32,
    "prefix_cache_tokens": None,
    "mode": "mixed",
    "max_batched_tokens": None,
    "step_cost": "fused",
    "model_config": None,
    "gpu": None,
    "gpu_spec": None,
    "fp8": False,
    "tp": 1,
    "gpu_memory_utilization": 0.9,
    "flops_efficiency": None,       # None: roofline.FLOPS_EFFICIENCY, the measured fit
    "bandwidth_efficiency": None,   # None: roofline.BANDWIDTH_EFFICIENCY
    "profile": None,
    "cost": None,
    "ttft_p99_ms": 1000.0,
    "tpot_p99_ms": 50.0,
    "target": 0.99,
    "router": "jsq",
    "policy": "fcfs",
    "spares": 1,
    "beta": 2.0,
    "seed": 0,
    "rtol": 0.02,
    "budget": 16,
    "confidence": 0.95,
    "indifference": 0.25,
    "holds": 20.0,
    "max_replicas": 4096,
    "workers": None,
    "scheduler": None,
    "progress": True,
    "output": None,
}

DISTRIBUTIONS = {
    "fixed": ("value",),
    "exponential": ("mean",),
    "lognormal": ("mean", "cv"),
    "gamma": ("mean", "cv"),
    "uniform": ("low", "high"),
}

MAX_BATCH = 65_536          # batch slots per replica accepted (--max-batch)
MAX_TRACE_ROWS = 10_000_000  # --requests accepted (rows of a trace)


def _model_names() -> list[str]:
    from .roofline import model_names
    return model_names()


def _gpu_names() -> list[str]:
    from .roofline import gpu_table
    return [str(g) for g in gpu_table()["gpu"]]


class InputError(Exception):
    """Bad user input: reported as one line, exit status 2."""


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bad(name: str, value, why: str) -> InputError:
    return InputError(f"{_option(name)} {why}, got {value!r}")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _routers() -> tuple:
    """(realistic routers, bounds), from :mod:`servingcap.routers`."""
    from .routers import BOUNDS, REALISTIC

    return REALISTIC, BOUNDS


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Capacity planning for an LLM serving fleet, "
                     "from the book Capacity Is a Queue.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    p = commands.add_parser(
        "plan", prog=f"{PROG} plan",
        help="size a fleet for an arrival rate and check it by simulation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Size a fleet of LLM serving replicas for an arrival rate and a latency SLO.\n\n"
            "Prints (1) the closed-form first guess: Little's law a = rate x T_hold busy\n"
            "slots, square-root staffing c = a + beta sqrt(a), whole replicas plus spares,\n"
            "and the fluid throughput bound (fewer replicas cannot carry the rate at all);\n"
            "(2) the smallest replica count shown to meet --target by simulation\n"
            "(continuous-batching simulator), with a confidence interval, p99 TTFT/TPOT,\n"
            "goodput, replications and run length, and the count one below (shown to\n"
            "miss, or open); (3) the capacity of that many serving replicas (spares held\n"
            "back) as an interval: the largest rate shown to meet (the plan rate) and the\n"
            "smallest shown to miss, found by bisection on the simulator.\n\n"
            "A request meets the SLO when it finishes with TTFT <= --ttft-p99-ms and mean\n"
            "TPOT <= --tpot-p99-ms. Whether a fleet's attainment reaches --target (0.99: a\n"
            "joint p99) is decided sequentially: replications are added (10, then doubling,\n"
            "up to --budget) until a one-sided t-interval across them clears the\n"
            "indifference zone --target +- --indifference; the verdict (meets / misses) is\n"
            "wrong with probability at most 1 - --confidence outside the zone. A point not\n"
            "decided within --budget is 'open' (never counted as a miss), and one whose\n"
            "runs have no steady state (latency or misses keep rising) is 'unstable'.\n"
            "Each replication simulates --holds hold times of traffic at the rate (at least\n"
            "2,000 requests), its warm-up cut by MSER-5; replication i replays the same\n"
            "traffic at every size and rate (common random numbers), so the answer does not\n"
            "depend on a request count (a --trace is resampled by a block bootstrap, one\n"
            "fresh sample per replication, so --budget works on traces too). Rejected or\n"
            "unfinished requests count as misses.\n"
            "Limits no fleet can meet (a prompt whose prefill alone exceeds the TTFT limit)\n"
            "are refused before simulating."),
        epilog=(
            "Distributions (--prompt-dist, --output-dist), in tokens, rounded to whole "
            "tokens >= 1:\n"
            "  fixed:2000   exponential:mean=2000   lognormal:mean=2000,cv=1\n"
            "  gamma:mean=300,cv=0.5   uniform:low=100,high=4000   (cv in [0.001, 100])\n\n"
            "Config file: keys are the long option names, e.g.\n"
            "  rate = 30\n  prompt-dist = \"lognormal:mean=2000,cv=1\"\n"
            "  decode-table = \"16:20,32:30,64:55\"   # or a table {16 = 20, 32 = 30}\n"
            "  no-progress = true\n"
            "Command-line options override the file.\n\n"
            "Example:\n  python -m servingcap plan --rate 30 --prompt-tokens 2000 "
            "--output-tokens 300 \\\n      --ttft-p99-ms 1000 --tpot-p99-ms 50 --max-batch 32"),
    )
    commands.add_parser(
        "search", add_help=False,
        help="find the cheapest GPU / parallelism / mode / batch configuration that meets "
             "the SLO (python -m servingcap search --help)")
    commands.add_parser(
        "calibrate", add_help=False,
        help="fit the simulator's step cost to a `vllm bench serve --save-result "
             "--save-detailed` JSON file (python -m servingcap calibrate --help)")
    from .sweepcli import add_sweep_parser

    _add_options(p, "plan")
    _add_options(add_sweep_parser(commands), "sweep")
    return parser


def _add_options(p: argparse.ArgumentParser, command: str) -> None:
    """The options of ``plan``, shared by ``sweep`` (``command``), which replaces --rate
    by --rates and the fleet search's options by --replicas (:mod:`servingcap.sweepcli`)."""
    from . import sweepcli

    plan = command == "plan"
    S = argparse.SUPPRESS      # absent options stay absent, so the config file can fill them
    d = DEFAULTS
    from .roofline import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, GPU_COLUMNS
    p.add_argument("--config", metavar="FILE", default=S,
                   help="TOML file of options (keys = long option names); command line wins")
    g = p.add_argument_group("traffic")
    if plan:
        g.add_argument("--rate", type=str, metavar="REQ_PER_S|native", default=S,
                       help="mean arrival rate to plan for, requests/s, or native (with "
                            "--trace only): the trace's own mean rate; each replication (a "
                            "block bootstrap of the trace) is rescaled to it, so its gaps keep "
                            f"their recorded proportions (default {d['rate']:g})")
    else:
        sweepcli.add_rates_option(g)
    g.add_argument("--requests", type=str, metavar="N", default=S,
                   help="with --trace only: use the first N requests of the trace "
                        "(default: all of it). Sampled traffic needs no request count: "
                        "see --holds and --budget")
    g.add_argument("--prompt-tokens", type=str, metavar="TOKENS", default=S,
                   help="every prompt this many tokens (shorthand for --prompt-dist fixed:TOKENS)")
    g.add_argument("--prompt-dist", type=str, metavar="SPEC", default=S,
                   help=f"prompt length distribution, tokens (default {d['prompt_dist']})")
    g.add_argument("--output-tokens", type=str, metavar="TOKENS", default=S,
                   help="every output this many tokens (shorthand for --output-dist fixed:TOKENS)")
    g.add_argument("--output-dist", type=str, metavar="SPEC", default=S,
                   help=f"output length distribution, tokens (default {d['output_dist']})")
    g.add_argument("--trace", type=str, metavar="NAME|PATH", default=S,
                   help="replay a trace instead: azure_conv, azure_code, mooncake, or a "
                        ".csv (Azure columns) / .jsonl (Mooncake fields) file; arrivals are "
                        "rescaled to --rate keeping the burst shape; token counts from the "
                        "trace (0 becomes 1); replication i is a block bootstrap of the "
                        "trace from its own seed (contiguous segments of about 60 s of the "
                        "trace, gaps kept; as many replications as the budget asks, "
                        "whatever the trace's length); a trace's hash_ids (Mooncake's prompt block ids) feed "
                        "each replica's prefix cache (see --prefix-cache-tokens)")
    g = p.add_argument_group("replica cost model")
    g.add_argument("--prefill-rate", type=str, metavar="TOKENS_PER_S", default=S,
                   help="prompt tokens prefilled per second, tokens/s "
                        f"(default {d['prefill_rate']:g})")
    g.add_argument("--decode-step-ms", type=str, metavar="MS", default=S,
                   help="one decode step time at every batch size, milliseconds "
                        "(replaces the default decode curve, see --decode-table)")
    g.add_argument("--decode-table", type=str, metavar="B:MS,...", default=S,
                   help="decode step time by batch size, batch:milliseconds pairs, "
                        "interpolated linearly (replaces --decode-step-ms; default: the "
                        f"book's decode curve, {_LOCKED_TABLE_TEXT})")
    g.add_argument("--chunk-tokens", type=str, metavar="TOKENS", default=S,
                   help="chunked prefill: prompt tokens per step, tokens (default: whole prompts)")
    g.add_argument("--max-batch", type=str, metavar="SLOTS", default=S,
                   help="batch slots per replica, concurrent sequences, at most "
                        f"{MAX_BATCH:,} (default {d['max_batch']})")
    g.add_argument("--prefix-cache-tokens", type=str, metavar="TOKENS", default=S,
                   help="with a trace that has hash_ids (mooncake): prompt tokens each "
                        "replica keeps in its LRU prefix cache, in whole 512-token blocks "
                        "(0: off). Default: the replica's KV capacity with --model-config/"
                        "--gpu (vLLM and SGLang keep finished prompts' blocks in the KV "
                        "pool until the memory is needed: an upper end, since running "
                        "sequences hold part of it), else unbounded (the default replica "
                        "has no KV limit)")
    g.add_argument("--mode", type=str, metavar="NAME", default=S,
                   help="scheduling mode of each step: combined (decodes plus prefill in one "
                        "step, Orca-style), prefill_first (prefill-only steps first, vLLM V0 / "
                        "DistServe colocated) or mixed (decodes first, then prefill chunks "
                        "fill a token budget, vLLM V1 / Sarathi-Serve / SGLang) "
                        f"(default {d['mode']})")
    g.add_argument("--max-batched-tokens", type=str, metavar="TOKENS", default=S,
                   help="most tokens in one step (vLLM --max-num-batched-tokens): the "
                        "token budget of mixed mode (default: derived from --tpot-p99-ms on "
                        "the replica's step cost, roofline, profile or --cost file: a full "
                        "batch of decodes at the workload's mean context plus a prompt chunk "
                        f"fills it; {LOCKED.token_budget} on the book's locked replica), the "
                        "prefill cap of prefill_first (default: none)")
    g.add_argument("--step-cost", type=str, metavar="NAME", default=S,
                   help="built-in step cost: fused (one forward pass over all the step's "
                        "tokens, as vLLM V1 / SGLang / TensorRT-LLM run it) or additive "
                        "(decode step plus prefill step: the seed essay's conservative "
                        f"floor) (default {d['step_cost']}; ignored by --model-config/--gpu "
                        "and --profile, which price steps themselves)")
    g = p.add_argument_group(
        "step time from hardware or a published profile (instead of --prefill-rate and "
        "--decode-step-ms/--decode-table)")
    g.add_argument("--model-config", type=str, metavar="NAME|PATH", default=S,
                   help="roofline cost model: a Hugging Face config.json, or a shipped one ("
                        + ", ".join(_model_names()) + "); needs --gpu")
    g.add_argument("--gpu", type=str, metavar="NAME", default=S,
                   help="GPU of the roofline (" + ", ".join(_gpu_names()) + ", or one "
                        "--gpu-spec describes)")
    g.add_argument("--gpu-spec", type=str, metavar="FILE", default=S,
                   help="your own GPUs (e.g. MI300X, B200): a .csv with the columns of "
                        "data/gpus.csv (" + ", ".join(GPU_COLUMNS) + "; memory GB, "
                        "bandwidths GB/s, dense TFLOP/s) or a .toml/.json list of tables with "
                        "those keys; its GPUs become --gpu names and replace shipped ones of "
                        "the same name (example: data/gpus_example_user.csv)")
    g.add_argument("--fp8", action="store_const", const="true", default=S,
                   help="fp8 weights and KV cache (1 byte each): the roofline reads 1-byte "
                        "weights and prices GEMMs at the GPU's fp8 dense peak, the memory "
                        "check holds 1-byte weights and KV; needs --gpu with fp8 tensor cores")
    g.add_argument("--tp", type=str, metavar="GPUS", default=S,
                   help=f"tensor-parallel degree of a replica, GPUs (default {d['tp']})")
    g.add_argument("--gpu-memory-utilization", type=str, metavar="FRACTION", default=S,
                   help="fraction of each GPU's memory the engine may use, in (0, 1], as "
                        "vLLM's flag: weights, a 3.05 GiB runtime reserve per GPU and the KV "
                        "cache share it; sets the replica's KV capacity (default "
                        f"{d['gpu_memory_utilization']:g})")
    g.add_argument("--flops-efficiency", type=str, metavar="FRACTION", default=S,
                   help="roofline: achievable fraction of peak FLOP/s, in (0, 1] (default "
                        f"{FLOPS_EFFICIENCY:g}, measured: fit to Vidur's Llama-2-7B "
                        "A100-80GB linear-op profile, data/gpus_measured.csv; 1 with "
                        "--bandwidth-efficiency 1 is the pure roofline, a lower bound on the "
                        "step time; the report prints which)")
    g.add_argument("--bandwidth-efficiency", type=str, metavar="FRACTION", default=S,
                   help="roofline: achievable fraction of HBM bandwidth, in (0, 1] (default "
                        f"{BANDWIDTH_EFFICIENCY:g}, measured by the same fit)")
    g.add_argument("--profile", type=str, metavar="SPEC", default=S,
                   help="DistServe's published A100-80GB step-time fit: MODEL[:ENGINE] with "
                        "MODEL opt-13b or opt-66b and ENGINE distserve (default) or vllm, or "
                        "FILE.json:MODEL for your own fit in the same layout; uses --tp")
    g.add_argument("--cost", type=str, metavar="FILE", default=S,
                   help="a cost file written by `calibrate --output FILE`: the step time "
                        "fitted to your benchmark, and its engine knobs (--max-batch, --mode, "
                        "--max-batched-tokens, --chunk-tokens) unless given here; with "
                        "--model-config/--gpu those size the memory only")
    g = p.add_argument_group("service-level objective")
    g.add_argument("--ttft-p99-ms", type=str, metavar="MS", default=S,
                   help=f"time-to-first-token limit, milliseconds (default {d['ttft_p99_ms']:g})")
    g.add_argument("--tpot-p99-ms", type=str, metavar="MS", default=S,
                   help=f"time-per-output-token limit, milliseconds (default {d['tpot_p99_ms']:g})")
    g.add_argument("--target", type=str, metavar="FRACTION", default=S,
                   help="fraction of requests that must meet both limits, in (0, 1] "
                        f"(default {d['target']:g})")
    g = p.add_argument_group("fleet")
    if not plan:
        sweepcli.add_replicas_option(g)
    g.add_argument("--router", type=str, metavar="NAME", default=S,
                   help="how arrivals are spread over replicas (servingcap.routers). "
                        "Realistic, on signals a gateway has (queue depth, running "
                        "requests, free slots, KV tokens in use, prefix matches): "
                        + ", ".join(_routers()[0]) + ". Bounds no gateway reaches: "
                        "pooled (one queue shared by every slot), oracle_work (outstanding "
                        "work with output lengths known in advance; formerly least_loaded) "
                        f"(default {d['router']})")
    g.add_argument("--policy", type=str, metavar="NAME", default=S,
                   help=f"queue order on each replica: fcfs, sjf or srpt (default {d['policy']})")
    if plan:
        g.add_argument("--spares", type=str, metavar="REPLICAS", default=S,
                       help=f"whole replicas added for failures, replicas (default "
                            f"{d['spares']}, N+1)")
        g.add_argument("--max-replicas", type=str, metavar="REPLICAS", default=S,
                       help="largest fleet searched, replicas; a rate whose fluid bound needs "
                            f"more is refused before simulating (default {d['max_replicas']})")
        g.add_argument("--beta", type=str, metavar="BETA", default=S,
                       help="square-root staffing headroom for the closed form, dimensionless "
                            f"(default {d['beta']:g})")
    g = p.add_argument_group("simulation and statistics")
    g.add_argument("--budget", type=str, metavar="REPLICATIONS", default=S,
                   help="most independent replications per simulated point; 10 first, "
                        "doubling until the sequential check decides; a point still "
                        f"undecided is 'open' (default {d['budget']})")
    g.add_argument("--confidence", type=str, metavar="FRACTION", default=S,
                   help="level of every confidence interval, in (0, 1); 1 - confidence is "
                        "the error of a meets/misses verdict (must be > 0.5) "
                        f"(default {d['confidence']:g})")
    g.add_argument("--indifference", type=str, metavar="PERCENTAGE_POINTS", default=S,
                   help="half-width of the indifference zone around --target, in "
                        "percentage points of attainment: a fleet within it may be called "
                        f"either way (default {d['indifference']:g})")
    g.add_argument("--holds", type=str, metavar="HOLD_TIMES", default=S,
                   help="simulated traffic per replication, in hold times T_hold at the "
                        f"rate (at least 2,000 requests) (default {d['holds']:g})")
    g.add_argument("--seed", type=str, metavar="INT", default=S,
                   help="root seed of the replications (arrivals, lengths, random router) "
                        f"(default {d['seed']})")
    if plan:
        g.add_argument("--rtol", type=str, metavar="FRACTION", default=S,
                       help=f"relative precision of the capacity search (default {d['rtol']:g})")
    g.add_argument("--workers", type=str, metavar="N", default=S,
                   help="local processes running replications (1: in this process; "
                        "default: one per core)")
    g.add_argument("--scheduler", type=str, metavar="ADDRESS", default=S,
                   help="run replications on a Dask cluster, e.g. tcp://10.0.0.5:8786 "
                        "(replaces --workers; same answer)")
    g.add_argument("--output", type=str, metavar="FILE.json|FILE.csv", default=S,
                   help="also write the result: .json (Plan.to_dict() plus the settings) or "
                        ".csv (one row per simulated point)" if plan else sweepcli.OUTPUT_HELP)
    if not plan:
        sweepcli.add_plot_option(g)
    g.add_argument("--no-progress", dest="progress", action="store_const", const="false",
                   default=S, help="no progress bar on stderr")


# --------------------------------------------------------------------------- settings


def _load_config(path: str, extra: tuple = (), table: str = "plan") -> dict:
    """Options from a TOML file; keys are DEFAULTS' long names, or ``extra`` ones (a
    subcommand's own options); a lone ``[table]`` table is read as the file."""
    file = Path(path)
    if not file.is_file():
        raise _bad("config", path, "must be a readable TOML file")
    try:
        raw = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"--config {path!r} is not valid TOML: {exc}") from exc
    if table in raw and isinstance(raw[table], dict) and len(raw) == 1:
        raw = raw[table]                        # allow a [plan] table
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name == "no_progress":               # the flag --no-progress, as a key
            out["progress"] = not _flag("no_progress", value)
            continue
        if name not in DEFAULTS and name not in extra:
            raise InputError(f"--config {path!r}: unknown key {key!r}; keys are the long "
                             "option names, e.g. rate, prompt-dist, max-batch, no-progress")
        out[name] = value
    return out


def _number(name, value, *, positive=True, allow_zero=False, upper=None) -> float:
    if isinstance(value, bool):
        raise _bad(name, value, "must be a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _bad(name, value, "must be a number") from None
    if not math.isfinite(x):
        raise _bad(name, value, "must be finite")
    if positive and (x < 0 or (x == 0 and not allow_zero)):
        raise _bad(name, value, "must be >= 0" if allow_zero else "must be > 0")
    if upper is not None and x > upper:
        raise _bad(name, value, f"must be <= {upper:g}")
    return x


def _whole(name, value, minimum=1) -> int:
    if isinstance(value, bool):
        raise _bad(name, value, f"must be a whole number >= {minimum}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _bad(name, value, f"must be a whole number >= {minimum}") from None
    if not math.isfinite(x) or x != int(x) or x < minimum:
        raise _bad(name, value, f"must be a whole number >= {minimum}")
    return int(x)


def _flag(name, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise _bad(name, value, "must be true or false")


Dist = Lengths
"""A token-length distribution (:class:`servingcap.planning.Lengths`)."""


def parse_dist(name: str, spec) -> Lengths:
    """Parse ``2000``, ``fixed:2000`` or ``kind:key=value,...`` (see DISTRIBUTIONS)."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        spec = f"fixed:{spec}"
    if not isinstance(spec, str) or not spec.strip():
        raise _bad(name, spec, "must be a distribution like lognormal:mean=2000,cv=1")
    text = spec.strip()
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if not rest and kind not in DISTRIBUTIONS:
        kind, rest = "fixed", text
    if kind not in DISTRIBUTIONS:
        raise _bad(name, spec, f"must name one of {', '.join(DISTRIBUTIONS)}")
    keys = DISTRIBUTIONS[kind]
    params = {}
    if kind == "fixed" and "=" not in rest:
        params["value"] = rest
    else:
        for part in filter(None, (s.strip() for s in rest.split(","))):
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in keys:
                raise _bad(name, spec,
                           f"must give {kind} parameters {', '.join(keys)} as key=value")
            if key in params:
                raise _bad(name, spec, f"must give {key} once")
            params[key] = value
    if set(params) != set(keys):
        raise _bad(name, spec, f"must give {kind} parameters {', '.join(keys)}")
    clean = {}
    for key, value in params.items():
        try:
            x = float(value)
        except ValueError:
            raise _bad(name, spec, f"has a {key} that is not a number") from None
        if not math.isfinite(x) or x < (0 if key == "low" else 1e-300):
            raise _bad(name, spec, f"must have {key} > 0")
        clean[key] = x
    if kind == "fixed" and clean["value"] != round(clean["value"]):
        raise _bad(name, spec, "must be a whole number of tokens")
    if kind == "fixed" and clean["value"] < 1:
        raise _bad(name, spec, "must be >= 1 token")
    try:
        return Lengths(kind, clean)
    except ValueError as exc:
        raise _bad(name, spec, f"is not a valid {kind} distribution ({exc})") from None


def parse_table(name: str, spec) -> dict:
    """``16:20,32:30`` or a TOML table {16 = 20} -> {batch: seconds}."""
    if isinstance(spec, dict):
        pairs = list(spec.items())
    elif isinstance(spec, str) and spec.strip():
        pairs = []
        for part in spec.split(","):
            batch, colon, ms = part.partition(":")
            if not colon:
                raise _bad(name, spec, "must be batch:milliseconds pairs like 16:20,32:30")
            pairs.append((batch, ms))
    else:
        raise _bad(name, spec, "must be batch:milliseconds pairs like 16:20,32:30")
    table = {}
    for batch, ms in pairs:
        try:
            b, t = float(str(batch).strip()), float(str(ms).strip())
        except ValueError:
            raise _bad(name, spec, "must be batch:milliseconds pairs of numbers") from None
        if not (math.isfinite(b) and b >= 1 and b == int(b)):
            raise _bad(name, spec, "must have whole batch sizes >= 1")
        if not (math.isfinite(t) and t > 0):
            raise _bad(name, spec, "must have step times > 0 ms")
        if int(b) in table:
            raise _bad(name, spec, f"must not repeat batch size {int(b)}")
        table[int(b)] = t / 1000.0
    return table


@dataclass(frozen=True)
class Settings:
    """Validated plan inputs, ready for :func:`servingcap.planning.plan`."""

    rate: float
    requests: object
    workload: str
    replica: object
    limits: dict
    target: float
    router: str
    policy: str
    spares: int
    beta: float
    seed: int
    rtol: float
    budget: int
    confidence: float
    delta: float
    holds: float
    max_replicas: int
    workers: int | None
    scheduler: str | None
    progress: bool
    cost: str
    memory: str = ""
    output: str | None = None
    prefix: str = ""
    native_rate: bool = False
    gpu: str = ""


def settings(options: dict) -> Settings:
    """Merge defaults with ``options`` (already merged config + command line) and validate."""
    from .serving import MODES, ROUTERS, STEP_COSTS, Replica

    given = dict(options)
    o = {**DEFAULTS, **given}
    native = isinstance(o["rate"], str) and o["rate"].strip().lower() == "native"
    if native and o["trace"] is None:
        raise _bad("rate", o["rate"], "native replays a trace at its own timing: it needs "
                   "--trace")
    rate = None if native else _number("rate", o["rate"])
    seed = _whole("seed", o["seed"], minimum=0)
    for short, dist in (("prompt_tokens", "prompt_dist"), ("output_tokens", "output_dist")):
        if short in given and dist in given:
            raise InputError(f"{_option(short)} and {_option(dist)} are alternatives; give one, "
                             f"got {given[short]!r} and {given[dist]!r}")
    prompt = (parse_dist("prompt_tokens", o["prompt_tokens"]) if "prompt_tokens" in given
              else parse_dist("prompt_dist", o["prompt_dist"]))
    output = (parse_dist("output_tokens", o["output_tokens"]) if "output_tokens" in given
              else parse_dist("output_dist", o["output_dist"]))
    if o["trace"] is not None:
        for name in ("prompt_tokens", "prompt_dist", "output_tokens", "output_dist"):
            if name in given:
                raise InputError(f"{_option(name)} cannot be combined with --trace "
                                 f"(the trace has its own lengths), got {given[name]!r}")
        n = (None if o["requests"] is None
             else _whole("requests", o["requests"], minimum=2))
        if n is not None and n > MAX_TRACE_ROWS:
            raise _bad("requests", o["requests"], f"must be <= {MAX_TRACE_ROWS:,} trace rows")
        workload, text = _trace_requests(o["trace"], n)
        if native:
            from .traffic import mean_rate
            rate = mean_rate(workload["arrival_s"])
    else:
        if o["requests"] is not None:
            raise _bad("requests", o["requests"],
                       "applies only to --trace: sampled traffic is simulated for --holds "
                       "hold times per replication, up to --budget replications")
        workload = PoissonWorkload(prompt, output)
        text = str(workload)
    calibrated = _cost_file(o, given)
    chunk = None if o["chunk_tokens"] is None else _whole("chunk_tokens", o["chunk_tokens"])
    max_batch = _whole("max_batch", o["max_batch"])
    if max_batch > MAX_BATCH:
        raise _bad("max_batch", o["max_batch"], f"must be <= {MAX_BATCH:,} sequences")
    mode = o["mode"]
    if mode not in MODES:
        raise _bad("mode", mode, f"must be one of {', '.join(MODES)}")
    budget_tokens = (None if o["max_batched_tokens"] is None
                     else _whole("max_batched_tokens", o["max_batched_tokens"]))
    card, gpu_text = _gpu_card(o, given)
    step_time, decode, cost_text = _cost_model(o, given, card)
    try:
        if o["step_cost"] not in STEP_COSTS:
            raise _bad("step_cost", o["step_cost"], f"must be one of {', '.join(STEP_COSTS)}")
        cost = ({"step_time": step_time} if step_time is not None else
                {"prefill_rate": _number("prefill_rate", o["prefill_rate"]),
                 "decode_step_s": decode, "step_cost": o["step_cost"]})
        if mode == "mixed":
            if budget_tokens is None:       # the cost alone: a combined replica has no cap
                budget_tokens, note = _derived_budget(
                    o, Replica(max_batch=max_batch, mode="combined", **cost),
                    _is_roofline(step_time), workload)
                if budget_tokens is None and max_batch > LOCKED.token_budget:
                    raise InputError(
                        f"--max-batch {max_batch}: no token budget follows from "
                        f"--tpot-p99-ms (a full batch of {max_batch} decodes alone overruns "
                        f"it) and the book's default of {LOCKED.token_budget} tokens cannot "
                        "hold one token of every decoding sequence; give "
                        "--max-batched-tokens (your engine's) or a lower --max-batch")
            else:
                note = (f"token budget {budget_tokens:,} tokens per step, "
                        + ("set by --max-batched-tokens" if "max_batched_tokens" in given
                           else f"from --cost {o['cost']}"))
            cost_text += "; " + note
        replica = Replica(max_batch=max_batch, chunk_tokens=chunk, mode=mode,
                          max_batched_tokens=budget_tokens, **cost)
    except ValueError as exc:
        raise InputError(f"--mode {mode}: {exc}") from None
    if calibrated is not None and "kv_capacity_tokens" in calibrated.replica_options:
        replica = dataclasses.replace(
            replica, kv_capacity_tokens=calibrated.replica_options["kv_capacity_tokens"])
    replica, memory_text = _memory(o, given, replica, workload, card)
    replica, workload, prefix_text = _prefix_cache(given, replica, workload)
    limits = {"ttft_s": _number("ttft_p99_ms", o["ttft_p99_ms"]) / 1000.0,
              "tpot_s": _number("tpot_p99_ms", o["tpot_p99_ms"]) / 1000.0}
    target = _number("target", o["target"], upper=1.0)
    router = o["router"]
    if router == "least_loaded":
        raise _bad("router", router, "was renamed oracle_work: a bound that knows output "
                   "lengths in advance, which no gateway does")
    if router not in ROUTERS:
        raise _bad("router", router, f"must be one of {', '.join(ROUTERS)}")
    policy = o["policy"]
    if policy not in ("fcfs", "sjf", "srpt"):
        raise _bad("policy", policy, "must be one of fcfs, sjf, srpt")
    rtol = _number("rtol", o["rtol"])
    if rtol >= 1:
        raise _bad("rtol", o["rtol"], "must be < 1")
    confidence = _number("confidence", o["confidence"])
    if not 0.5 < confidence < 1:
        raise _bad("confidence", o["confidence"], "must be in (0.5, 1)")
    zone = _number("indifference", o["indifference"])
    if zone >= 50:
        raise _bad("indifference", o["indifference"],
                   "must be < 50 percentage points")
    holds = _number("holds", o["holds"])
    workers = None if o["workers"] is None else _whole("workers", o["workers"])
    scheduler = o["scheduler"]
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise _bad("scheduler", scheduler, "must be a Dask scheduler address")
    if scheduler is not None and workers is not None:
        raise InputError(f"--workers and --scheduler are alternatives; give one, got "
                         f"{workers!r} and {scheduler!r}")
    out = Settings(rate=rate, requests=workload, workload=text, replica=replica,
                   limits=limits, target=target, router=router, policy=policy,
                   spares=_whole("spares", o["spares"], minimum=0),
                   beta=_number("beta", o["beta"], allow_zero=True), seed=seed, rtol=rtol,
                   budget=_whole("budget", o["budget"]), confidence=confidence,
                   delta=zone / 100.0, holds=holds,
                   max_replicas=_whole("max_replicas", o["max_replicas"]), workers=workers,
                   scheduler=scheduler, progress=_flag("progress", o["progress"]),
                   cost=cost_text, memory=memory_text, output=_output(o["output"]),
                   prefix=prefix_text, native_rate=native, gpu=gpu_text)
    _feasible(out)
    return out


def _is_roofline(step_time) -> bool:
    from .roofline import Roofline
    return isinstance(step_time, Roofline)


def _derived_budget(o: dict, costed, roofline: bool, workload) -> tuple[int | None, str]:
    """The mixed-mode token budget a replica gets when --max-batched-tokens is not
    given, and a sentence saying where it came from: the largest step (a full batch of
    decodes at the workload's mean context, one token each, plus a prompt chunk) within
    the TPOT objective on the replica's own step cost
    (:func:`servingcap.serving.mixed_token_budget`, the derivation the book makes for
    its locked replica, ``LOCKED.token_budget``: 240 tokens there). A replica several
    times faster than the locked one fits a far larger chunk, and keeping the book's
    240 tokens would starve its prefill. When a full batch of decodes alone overruns
    the objective nothing is derived (``None``, the replica's default budget stays) and
    the sentence says so: lighter batches may still meet it. ``costed`` is a replica
    with the step cost and ``max_batch`` (its mode does not matter)."""
    import numpy as np

    from .serving import StepDetail, mixed_token_budget

    tpot = _number("tpot_p99_ms", o["tpot_p99_ms"]) / 1000.0
    context = _mean_context(workload)
    max_batch = costed.max_batch
    where = "on this roofline" if roofline else "with this step cost"
    budget = mixed_token_budget(costed, tpot, context)
    if budget is None:
        none = np.zeros(0)
        decodes = costed.cost(StepDetail(none, none, np.full(max_batch, float(context))))
        return None, (f"token budget not derived: a full batch of {max_batch} decodes at the "
                      f"mean context ({context:,.0f} tokens) alone takes "
                      f"{1000 * decodes:.1f} ms per step {where}, over the "
                      f"{1000 * tpot:g} ms TPOT objective, so the book's default of "
                      f"{LOCKED.token_budget} tokens stays "
                      "(--max-batched-tokens sets your engine's)")
    return budget, (f"token budget {budget:,} tokens per step, derived: a full batch of "
                    f"{max_batch} decodes at the mean context ({context:,.0f} tokens) plus "
                    f"a {budget - max_batch:,}-token prompt chunk fills the {1000 * tpot:g} ms "
                    f"TPOT objective {where} (--max-batched-tokens sets your engine's)")


def _output(path) -> str | None:
    """--output: a writable .json or .csv path (checked before simulating)."""
    if path is None:
        return None
    if not isinstance(path, str) or Path(path).suffix.lower() not in (".json", ".csv"):
        raise _bad("output", path, "must be a file name ending in .json or .csv")
    if not Path(path).resolve().parent.is_dir():
        raise _bad("output", path, "must be in an existing directory")
    return path


def write_output(s: Settings, result) -> None:
    """Write ``result`` (a :class:`~servingcap.planning.Plan`) to ``s.output``: JSON
    (``to_dict()`` plus the settings) or CSV (every simulated point, ``search`` =
    fleet or capacity)."""
    import json

    import pandas as pd

    path = Path(s.output)
    if path.suffix.lower() == ".json":
        data = {"settings": {"rate_rps": s.rate, "native_rate": s.native_rate,
                             **_settings_dict(s)}, **result.to_dict()}
        path.write_text(json.dumps(data, indent=1) + "\n")
        return
    fleet = result.fleet.evaluations.assign(search="fleet")
    capacity = result.capacity.evaluations.assign(search="capacity")
    pd.concat([fleet, capacity], ignore_index=True).to_csv(path, index=False)


def _settings_dict(s: Settings) -> dict:
    """The settings a JSON result records (rates aside): workload, cost, SLO, replica."""
    return {"workload": s.workload, "cost": s.cost, "memory": s.memory or None,
            "limits_s": s.limits, "target": s.target, "router": s.router,
            "policy": s.policy, "max_batch": s.replica.max_batch, "mode": s.replica.mode}


def _mean_context(workload) -> float:
    """Mean KV context of a decoding sequence, tokens: its prompt plus half its output
    (the context grows by one token per step from the prompt to prompt + output)."""
    if isinstance(workload, PoissonWorkload):
        return workload.prompt.mean + workload.output.mean / 2
    return float(workload["prompt_tokens"].mean() + workload["output_tokens"].mean() / 2)


def _memory(o: dict, given: dict, replica, workload, card):
    """(replica with its KV capacity, report line) from --model-config/--gpu/--tp,
    --gpu-memory-utilization and --fp8 (:func:`servingcap.memory.memory_plan`) on
    ``card`` (the --gpu, from --gpu-spec when it names one); unchanged without a model and
    GPU. Refuses weights that do not fit; warns when the slots do not."""
    from .memory import GIB, memory_plan

    if "model_config" not in given or "gpu" not in given:
        if "gpu_memory_utilization" in given:
            raise _bad("gpu_memory_utilization", given["gpu_memory_utilization"],
                       "applies only with --model-config and --gpu")
        return replica, ""
    util = _number("gpu_memory_utilization", o["gpu_memory_utilization"], upper=1.0)
    try:
        memory = memory_plan(o["model_config"], card, tp=_whole("tp", o["tp"]),
                             gpu_memory_utilization=util, fp8=_flag("fp8", o["fp8"]))
    except ValueError as exc:
        raise InputError(f"--model-config/--gpu/--tp/--gpu-memory-utilization: {exc}") from None
    context = _mean_context(workload)
    fits = memory.max_batch(context)
    if fits < 1:
        raise InputError(f"--model-config/--gpu/--tp/--gpu-memory-utilization: the KV cache "
                         f"holds {memory.kv_capacity_tokens:,} tokens, less than one "
                         f"sequence at the workload's mean context of {context:,.0f} tokens")
    text = memory.describe()
    if fits < replica.max_batch:
        need = replica.max_batch * context * memory.kv_bytes_per_token / GIB
        text += (f"\nWARNING: --max-batch {replica.max_batch} slots at the workload's mean "
                 f"context of {context:,.0f} tokens (prompt + half the output) need "
                 f"{need:.1f} GiB of KV cache, more than the {memory.kv_bytes / GIB:.1f} GiB "
                 f"left: at most {fits} run at once; the simulation holds the KV capacity, "
                 "so batches stop growing there (lower --max-batch or raise --tp)")
    elif fits > replica.max_batch:
        text += (f"\nKV capacity: {fits:,} sequences at the workload's mean context of "
                 f"{context:,.0f} tokens (prompt + half the output) fit in the KV cache, "
                 f"against --max-batch {replica.max_batch} slots: a larger --max-batch "
                 f"(up to {fits:,}) may need fewer replicas, though each step of a larger "
                 f"batch is slower (plan again with it to see; vLLM's default "
                 f"--max-num-seqs on the {card.name} is {_vllm_max_num_seqs(card)})")
    return dataclasses.replace(replica, kv_capacity_tokens=memory.kv_capacity_tokens), text


def _vllm_max_num_seqs(card) -> int:
    """vLLM's default ``--max-num-seqs`` on this GPU, quoted beside the KV capacity as a
    reference: 1024 on a GPU with at least 70 GiB of memory that is not an A100, else 256
    (``EngineArgs.get_batch_defaults`` in vllm/engine/arg_utils.py, the same for its
    ``LLM`` class and its OpenAI server)."""
    from .memory import GIB

    big = card.memory_bytes >= 70 * GIB and "a100" not in card.name.lower()
    return 1024 if big else 256


PREFIX_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` block in the Mooncake trace format."""


def _prefix_cache(given: dict, replica, workload):
    """(replica, workload, report line) with the prefix cache --prefix-cache-tokens
    asks for (default: the KV capacity, or unbounded without one) when the trace has
    ``hash_ids``; the ``hash_ids`` column is dropped when the cache is off."""
    import pandas as pd

    has_ids = isinstance(workload, pd.DataFrame) and "hash_ids" in workload.columns
    if "prefix_cache_tokens" in given:
        value = given["prefix_cache_tokens"]
        if not has_ids:
            raise _bad("prefix_cache_tokens", value, "applies only to a --trace with "
                       "hash_ids (prompt block ids), such as mooncake")
        tokens = _whole("prefix_cache_tokens", value, minimum=0)
        source = "set by --prefix-cache-tokens"
    elif not has_ids:
        return replica, workload, ""
    elif replica.kv_capacity_tokens is not None:
        tokens = int(replica.kv_capacity_tokens)
        source = ("the replica's KV capacity: finished prompts' blocks stay cached in the "
                  "KV pool until the memory is needed")
    else:
        tokens = None
    if tokens is None:
        blocks = max(1, len({b for ids in workload["hash_ids"] for b in ids}))
        text = ("per-replica LRU, unbounded: the replica has no KV limit (bound it with "
                "--prefix-cache-tokens, or size the KV cache with --model-config/--gpu)")
    else:
        blocks = tokens // PREFIX_BLOCK_TOKENS
        text = (f"per-replica LRU of {blocks:,} blocks of {PREFIX_BLOCK_TOKENS} tokens "
                f"({blocks * PREFIX_BLOCK_TOKENS:,} tokens), {source}")
    if blocks == 0:
        return (replica, workload.drop(columns=["hash_ids"]),
                f"off ({tokens:,} tokens, less than one {PREFIX_BLOCK_TOKENS}-token block, "
                f"{source}); every prompt prefilled in full")
    replica = dataclasses.replace(replica, prefix_cache_blocks=blocks,
                                  prefix_block_tokens=PREFIX_BLOCK_TOKENS)
    return replica, workload, text


def _cost_file(o: dict, given: dict):
    """The --cost file (:func:`servingcap.calibrate.load_cost`), its knobs copied into
    ``o`` where the command line and config did not set them; None without --cost."""
    if "cost" not in given:
        return None
    from .calibrate import load_cost

    try:
        calibrated = load_cost(o["cost"])
    except ValueError as exc:
        raise InputError(f"--cost: {exc}") from None
    for name, value in calibrated.replica_options.items():
        if name in DEFAULTS and name not in given:
            o[name] = value
    return calibrated


def _gpu_card(o: dict, given: dict):
    """(GPU, report line) for --gpu, looked up in data/gpus.csv plus the --gpu-spec file
    (:func:`servingcap.roofline.gpu`); (None, "") without --gpu. Checks --fp8 against it."""
    from .roofline import gpu, gpu_table, load_gpus

    spec, fp8 = o["gpu_spec"], _flag("fp8", o["fp8"])
    if "gpu" not in given:
        if spec is not None:
            raise _bad("gpu_spec", spec, "applies only with --gpu (name one of its GPUs)")
        if fp8:
            raise _bad("fp8", o["fp8"], "applies only with --model-config and --gpu (a "
                       "roofline or a memory check to put in fp8)")
        return None, ""
    if spec is not None:
        if not isinstance(spec, str) or not spec.strip():
            raise _bad("gpu_spec", spec, "must be a .csv, .toml or .json file")
        try:
            user = load_gpus(spec)
        except ValueError as exc:
            raise InputError(f"--gpu-spec: {exc}") from None
    try:
        card = gpu(o["gpu"], extra=spec)
    except ValueError as exc:
        if not isinstance(o["gpu"], str):
            raise InputError(f"--gpu: {exc}") from None
        known = ", ".join(gpu_table(spec)["gpu"])
        where = "data/gpus.csv" if spec is None else f"data/gpus.csv or --gpu-spec {spec}"
        hint = "" if spec is not None else "; describe your own GPU with --gpu-spec FILE"
        raise InputError(f"--gpu {o['gpu']} is not in {where} (known: {known}){hint}") from None
    if fp8 and card.fp8_flops is None:
        with_fp8 = gpu_table(spec).dropna(subset=["fp8_dense_tflops"])["gpu"]
        raise InputError(f"--fp8: GPU {card.name} has no fp8 tensor cores (its "
                         f"fp8_dense_tflops is empty); drop --fp8 or use a --gpu with fp8: "
                         f"{', '.join(with_fp8)}")
    if spec is None or card.name.lower() not in set(user["gpu"].str.lower()):
        return card, ""
    shipped = set(gpu_table()["gpu"].str.lower())
    fp8_text = "no fp8" if card.fp8_flops is None else f"{card.fp8_flops / 1e12:g} fp8"
    text = (f"{card.name} from --gpu-spec {spec}"
            + (" (replaces the shipped data/gpus.csv row of that name)"
               if card.name.lower() in shipped else "")
            + f": {card.memory_bytes / 1e9:g} GB, {card.hbm_bytes_per_s / 1e9:g} GB/s HBM, "
            f"{card.bf16_flops / 1e12:g} bf16 / {fp8_text} dense TFLOP/s, "
            f"{card.interconnect or 'interconnect unnamed'} "
            f"{card.link_bytes_per_s / 1e9:g} GB/s; source: {card.source}")
    return card, text


def _cost_model(o: dict, given: dict, card):
    """(step_time, decode, text): the replica's cost model from the options, and its
    source; ``card`` is the --gpu (:func:`_gpu_card`)."""
    if "cost" in given:
        others = [n for n in ("prefill_rate", "decode_step_ms", "decode_table", "profile",
                              "flops_efficiency", "bandwidth_efficiency") if n in given]
        if others:
            raise InputError(f"--cost and {_option(others[0])} are alternatives (the cost "
                             f"file is the step time); give one, got {given['cost']!r} and "
                             f"{given[others[0]]!r}")
        hardware = [n for n in ("model_config", "gpu") if n in given]
        if len(hardware) == 1:
            missing = "gpu" if hardware == ["model_config"] else "model_config"
            raise _bad(missing, None, "is needed with --cost to size the memory (give both "
                       "--model-config and --gpu, or neither)")
        if "tp" in given and not hardware:
            raise _bad("tp", given["tp"], "applies with --cost only to the memory of "
                       "--model-config/--gpu")
        from .calibrate import load_cost

        calibrated = load_cost(o["cost"])          # already checked by _cost_file
        return calibrated.cost, None, calibrated.describe()
    hardware = [n for n in ("model_config", "gpu", "profile") if n in given]
    if hardware:
        simple = [n for n in ("prefill_rate", "decode_step_ms", "decode_table") if n in given]
        if simple:
            raise InputError(f"{_option(simple[0])} and {_option(hardware[0])} are alternatives "
                             "(a hardware or profile cost model replaces the prefill rate and "
                             f"decode step); give one, got {given[simple[0]]!r} and "
                             f"{given[hardware[0]]!r}")
        tp = _whole("tp", o["tp"])
        if "profile" in given:
            if "model_config" in given or "gpu" in given:
                other = "model_config" if "model_config" in given else "gpu"
                raise InputError(f"--profile and {_option(other)} are alternatives; give one, got "
                                 f"{given['profile']!r} and {given[other]!r}")
            cost = _profile(o["profile"], tp)
            return cost, None, cost.source
        if "model_config" not in given or "gpu" not in given:
            missing = "gpu" if "model_config" in given else "model_config"
            raise _bad(missing, None, "is needed by the roofline cost model (give both "
                       "--model-config and --gpu)")
        from .roofline import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, Roofline
        efficiency = {
            name: measured if o[name] is None else _number(name, o[name], upper=1.0)
            for name, measured in (("flops_efficiency", FLOPS_EFFICIENCY),
                                   ("bandwidth_efficiency", BANDWIDTH_EFFICIENCY))}
        try:
            cost = Roofline(o["model_config"], card, tp=tp, fp8=_flag("fp8", o["fp8"]),
                            **efficiency)
        except (ValueError, OSError) as exc:
            raise InputError(f"--model-config/--gpu: {exc}") from None
        return cost, None, cost.describe()
    for name in ("tp", "flops_efficiency", "bandwidth_efficiency"):
        if name in given:
            raise _bad(name, given[name], "applies only with --model-config/--gpu or --profile")
    if "decode_table" in given and "decode_step_ms" in given:
        raise InputError(f"--decode-step-ms and --decode-table are alternatives; give one, got "
                         f"{given['decode_step_ms']!r} and {given['decode_table']!r}")
    if o["decode_table"] is not None:
        decode = parse_table("decode_table", o["decode_table"])
        text = "decode step " + ", ".join(f"{1000 * s:g} ms at {b}" for b, s in decode.items())
    elif o["decode_step_ms"] is not None:
        decode = _number("decode_step_ms", o["decode_step_ms"]) / 1000.0
        text = f"decode step {1000 * decode:g} ms at every batch"
    else:
        decode = LOCKED.decode_step_table
        text = f"the book's decode curve ({_LOCKED_TABLE_TEXT})"
    prefill = _number("prefill_rate", o["prefill_rate"])
    how = ("fused: one forward pass, max(weight read, tokens / prefill rate) plus the "
           "decode curve's per-sequence part" if o["step_cost"] == "fused" else
           "additive: decode step plus prefill step, the seed's conservative floor")
    return None, decode, f"{how}; prefill {prefill:g} tokens/s, {text}"


def _profile(spec, tp: int):
    """A DistServe-layout profile from ``MODEL[:ENGINE]`` or ``FILE.json:MODEL``."""
    from .profiles import distserve_profile

    if not isinstance(spec, str) or not spec.strip():
        raise _bad("profile", spec, "must be MODEL[:ENGINE] or FILE.json:MODEL")
    head, _, tail = spec.rpartition(":")
    try:
        if head.endswith(".json"):
            return distserve_profile(tail, tp, path=head)
        if head:
            return distserve_profile(head, tp, engine=tail)
        return distserve_profile(tail, tp)
    except (ValueError, OSError) as exc:
        raise InputError(f"--profile {spec}: {exc}") from None


def _feasible(s: Settings) -> None:
    """Refuse, before simulating, plans no fleet can meet or too large to simulate."""
    from .planning import fluid_rate, hold_time, infeasible

    found = infeasible(s.requests, s.replica, s.limits, s.target)
    if found is not None:
        column, why = found
        option = {"ttft_s": "--ttft-p99-ms", "tpot_s": "--tpot-p99-ms"}.get(column, "--target")
        raise InputError(f"{option}: no fleet can meet the target {s.target:g}: {why}")
    per_replica = fluid_rate(s.requests, s.replica)
    need = math.floor(s.rate / per_replica) + 1
    if need > s.max_replicas:
        raise InputError(f"--rate {s.rate:g} req/s needs at least {need:,} replicas by the "
                         f"fluid throughput bound ({per_replica:.4g} req/s each), above "
                         f"--max-replicas {s.max_replicas:,}")
    hold = hold_time(s.requests, s.replica)
    per_run = math.ceil(s.rate * s.holds * hold)
    if per_run > MAX_REQUESTS_PER_RUN:
        raise InputError(f"--rate {s.rate:g} req/s over --holds {s.holds:g} hold times of "
                         f"{hold:.4g} s needs {per_run:,} requests per replication, above the "
                         f"{MAX_REQUESTS_PER_RUN:,} this command simulates; lower --holds "
                         "or --rate")


def _trace_requests(name, n: int | None):
    from .traffic import BOOTSTRAP_SEGMENT_S, TRACES, load_trace, mean_rate

    if not isinstance(name, str) or not name:
        raise _bad("trace", name, "must be a trace name or a file path")
    if name not in TRACES and Path(name).suffix not in (".csv", ".jsonl"):
        raise _bad("trace", name, f"must be one of {', '.join(TRACES)} or a .csv/.jsonl file")
    try:
        frame = load_trace(name)
    except FileNotFoundError as exc:
        raise _bad("trace", name, f"names a file that is not there ({exc})") from None
    except ValueError as exc:
        raise _bad("trace", name, f"could not be read ({exc})") from None
    total = len(frame)
    frame = frame.iloc[:n].copy() if n is not None else frame.copy()
    if len(frame) < 2 or frame["arrival_s"].iloc[-1] <= frame["arrival_s"].iloc[0]:
        raise _bad("trace", name, "must hold at least 2 requests spread over time")
    zeros = int(((frame["prompt_tokens"] < 1) | (frame["output_tokens"] < 1)).sum())
    frame["prompt_tokens"] = frame["prompt_tokens"].clip(lower=1)
    frame["output_tokens"] = frame["output_tokens"].clip(lower=1)
    notes = [f"{zeros} zero lengths set to 1"] if zeros else []
    note = "".join(f"; {x}" for x in notes)
    segment = max(1.0, BOOTSTRAP_SEGMENT_S * mean_rate(frame))
    text = (f"trace {name}: {len(frame)} of {total} requests, resampled by a block "
            f"bootstrap of the trace (stationary bootstrap, Politis & Romano 1994: each "
            f"replication draws contiguous segments of {segment:.0f} requests on average, "
            f"{BOOTSTRAP_SEGMENT_S:g} s of the trace, gaps kept inside them) and rescaled "
            f"to the rate{note}; mean prompt "
            f"{frame['prompt_tokens'].mean():.0f} tokens, mean output "
            f"{frame['output_tokens'].mean():.0f} tokens")
    keep = ["arrival_s", "prompt_tokens", "output_tokens"]
    return frame[keep + (["hash_ids"] if "hash_ids" in frame.columns else [])], text


# --------------------------------------------------------------------------- output


class _Progress:
    """A progress bar on stderr, one tick per simulated point (tqdm); it also keeps every
    point's row (``rows``), so a plan stopped by a signal can say what it saw."""

    def __init__(self, enabled: bool):
        self.bar = None
        self.rows: list[dict] = []
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(desc="simulating", unit=" point", file=sys.stderr, leave=False,
                            dynamic_ncols=True)

    def __call__(self, row: dict) -> None:
        self.rows.append(dict(row))
        if self.bar is not None:
            self.bar.set_postfix_str(_progress_text(row), refresh=False)
            self.bar.update(1)
            self.bar.refresh()   # every point shows, however fast (tqdm's update waits 0.1 s)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _PlanProgress(_Progress):
    """plan's progress bar on stderr (tqdm). Inside each point it counts the
    replications run out of the most the point may run (``--budget``), names the size
    and rate being tried and the attainment of the replications so far
    (:func:`_activity_text`); when a point finishes, a line above the bar says its
    attainment and verdict (:func:`_progress_text`). It keeps every point's row
    (``rows``), as :class:`_Progress` does. Called with ``on_replication`` events
    (:func:`servingcap.planning.evaluate`) through :meth:`replication`, and with each
    finished point's row as the ``progress`` callback."""

    def __init__(self, enabled: bool, budget: int):
        self.bar = None
        self.rows: list[dict] = []
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=budget, desc="simulating point 1", unit=" rep",
                            file=sys.stderr, leave=False, dynamic_ncols=True)

    def replication(self, event: dict) -> None:
        if self.bar is None:
            return
        if event["done"] == 1:                  # a new point
            self.bar.reset(total=event["total"])
            self.bar.set_description_str(f"simulating point {len(self.rows) + 1}",
                                         refresh=False)
        self.bar.set_postfix_str(_activity_text(event), refresh=False)
        self.bar.update(event["done"] - self.bar.n)
        self.bar.refresh()           # every replication shows (a point has at most --budget)

    def __call__(self, row: dict) -> None:
        self.rows.append(dict(row))
        if self.bar is not None:
            self.bar.write(f"point {len(self.rows)}: {_progress_text(row)}", file=sys.stderr)
            self.bar.set_description_str(f"simulating point {len(self.rows) + 1}",
                                         refresh=False)
            self.bar.set_postfix_str("", refresh=False)


def _activity_text(event: dict) -> str:
    """One replication for the progress bar: ``16 replicas @ 30 req/s: rep 7/16,
    attainment so far 98.90%`` (the mean attainment of the point's replications run so
    far, before the warm-up cut)."""
    return (f"{_replicas(int(event['replicas']))} @ {event['rate_rps']:.4g} req/s: rep "
            f"{event['done']}/{event['total']}, attainment so far {event['attainment']:.2%}")


def _progress_text(row) -> str:
    """One point for the progress bar: ``15 replicas @ 30 req/s: attainment 97.10%,
    misses (16 reps)`` (the percentage is the attainment, the word the verdict)."""
    where = (_replicas(int(row["replicas"])) if "replicas" in row
             else "capacity probe")
    return (f"{where} @ {row['rate_rps']:.4g} req/s: attainment {row['attainment']:.2%}, "
            f"{row['verdict']} ({row['replications']} reps)")


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _ms(seconds: float) -> str:
    return "inf" if not math.isfinite(seconds) else f"{1000 * seconds:.0f} ms"


def _ms_or_na(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else _ms(seconds)


def _reps(budget: int) -> str:
    """The replication schedule of a point: ``"up to 16 independent replications per
    point (looks at 10, 16)"``."""
    from .stats import FIRST_STAGE, look_schedule

    first = min(FIRST_STAGE, budget)
    if first == budget:
        return f"{first} independent replication{'s' if first > 1 else ''} per point"
    looks = look_schedule(first, budget) if first >= 2 else [budget]
    return (f"up to {budget} independent replications per point (looks at "
            f"{', '.join(map(str, looks))})")


def _counts(result) -> list[int]:
    """Replications run at each simulated point of a plan (the plan-rate point at the
    answer size, shared by the fleet and capacity searches, counted once)."""
    cap = result.capacity.evaluations
    again = cap.loc[cap["rate_rps"] != result.rate, "replications"]
    return [int(c) for c in (*result.fleet.evaluations["replications"], *again)]


def _ran(result) -> str:
    """How many replications the plan's points really ran: ``"10 to 16 ran per point,
    146 in 11 points"``, or ``"10 ran at each of the 3 points, 30 in all"``."""
    counts = _counts(result)
    total, points = sum(counts), len(counts)
    if min(counts) == max(counts):
        return f"{counts[0]} ran at each of the {points} points, {total} in all"
    return f"{min(counts)} to {max(counts)} ran per point, {total} in {points} points"


def _sizes(sizes) -> str:
    text = ", ".join(map(str, sizes))
    return f"{text} replica" if list(sizes) == [1] else f"{text} replicas"


def _attainment(row) -> str:
    """``99.52% (98.69-100.00%)``: estimate and confidence interval."""
    return (f"{row['attainment']:.2%} ({100 * row['attainment_low']:.2f}-"
            f"{100 * row['attainment_high']:.2f}%)")


def _fleet_row(n: int, row) -> str:
    return (f"   {n:>8}  {_attainment(row):>24}  {_ms(row['ttft_p99_s']):>8}  "
            f"{_ms_or_na(row['tpot_p99_s']):>8}  {row['goodput_rps']:>7.2f} req/s  "
            f"{int(row['replications']):>4}  {row['run_s']:>5.0f} s  {row['verdict']}")


def _prompt_range(workload) -> tuple[float, float]:
    """(mean, longest) prompt of the workload, tokens (longest inf when unbounded)."""
    if isinstance(workload, PoissonWorkload):
        d = workload.prompt
        top = {"fixed": d.params.get("value"), "uniform": d.params.get("high")}.get(d.kind)
        return d.mean, math.inf if top is None else math.floor(top + 0.5)
    prompts = workload["prompt_tokens"]
    return float(prompts.mean()), float(prompts.max())


def _steps_text(r, workload=None) -> str:
    """How one step of this replica is composed, in words; with the ``workload``, how
    its prompts are split, and when mixed steps are the same as combined ones."""
    if r.mode == "mixed":
        cap = r.token_cap()
        text = (f"mixed steps of at most {cap:g} tokens (decodes first, one token each; "
                "prompts split into chunks that fill the rest, so a prompt longer than "
                "what the decodes leave runs over several steps")
        if workload is None:
            return text + ")"
        mean, top = _prompt_range(workload)
        if mean > cap - 1:
            text += (f": the mean prompt of {mean:,.0f} tokens takes at least "
                     f"{math.ceil(mean / cap)} steps")
        if r.max_batch * (top + 1) <= cap and r.kv_capacity_tokens is None:
            text += (f"; here the budget never binds ({r.max_batch} slots x the longest "
                     f"prompt of {top:,.0f} tokens + 1 fit in it), so every step holds all "
                     "decodes and all pending prefill, as combined mode's does, and the "
                     "two modes give the same numbers")
        return text + ")"
    if r.mode == "prefill_first":
        cap = r.token_cap()
        return ("prefill-first steps (whole prompts"
                + (f" up to {cap:g} tokens a step" if cap != float("inf") else "")
                + "; decodes wait)")
    return ("combined steps (all decodes plus "
            + (f"{r.chunk_tokens}-token prefill chunks)" if r.chunk_tokens
               else "whole prompts)"))


def _shared_hit_rate(s: Settings) -> float:
    """Fraction of the trace's prompt tokens one unbounded fleet-wide prefix cache serves
    over the whole trace in arrival order (warm from every earlier request): a reference
    for the simulated share, which counts each replication's bootstrap sample from cold
    caches."""
    from .planning import slo_floor

    prompts = s.requests["prompt_tokens"].to_numpy(dtype=float)
    return 1.0 - slo_floor(s.requests, s.replica)["prompt_tokens"].sum() / prompts.sum()


def render(s: Settings, result) -> str:
    """The report printed by ``plan`` (plain text, one number per claim)."""
    from .planning import fluid_rate
    from .routers import PREFIX_AWARE

    sz = result.sizing
    r = s.replica
    fleet = result.fleet
    ttft, tpot = s.limits["ttft_s"], s.limits["tpot_s"]
    per_replica = fluid_rate(s.requests, r)
    rows = fleet.evaluations
    lines = [
        (f"Plan for {s.rate:.4g} req/s, the trace's native mean rate (--rate native: each "
         f"replication is rescaled to it, its gaps keeping their recorded proportions) "
         f"({s.workload})" if s.native_rate
         else f"Plan for {s.rate:g} req/s ({s.workload})"),
        f"Replica: {r.max_batch} slots, {_steps_text(r, s.requests)}; router {s.router}, "
        f"policy {s.policy}",
        *([f"GPU: {s.gpu}"] if s.gpu else []),
        f"Cost model: {s.cost}",
        *([f"Memory: {s.memory}"] if s.memory else []),
        *([f"Prefix cache: {s.prefix}"] if s.prefix else []),
        f"SLO: TTFT <= {_ms(ttft)} and TPOT <= {_ms(tpot)} for >= {s.target:.1%} of requests",
        f"Statistics: {_reps(s.budget)}; {_ran(result)}; the same traffic at every size "
        f"and rate; each replication {s.holds:g} hold times ({s.holds * result.hold_s:.0f} s at "
        f"{s.rate:g} req/s) or 2,000 requests, warm-up cut by MSER-5; repeated one-sided "
        "t-intervals across replications decide meets/misses at each look, each verdict "
        f"wrong with probability <= {1 - s.confidence:.0%} when the attainment is outside "
        f"{s.target:.2%} +- {100 * s.delta:.2g} points (Bonferroni across looks); 'open': "
        f"not decided within --budget, never counted as a miss; intervals {s.confidence:.0%}",
        "",
        f"1. Closed-form first guess (Little + square-root staffing, beta = {sz.beta:g})",
        f"   T_hold = mean prefill + mean decode steps at a full batch = {result.hold_s:.3g} s "
        "per request",
        f"   a = {s.rate:g} req/s x {result.hold_s:.3g} s = {sz.offered_load:.1f} busy slots; "
        f"c = {sz.slots} slots / {r.max_batch} per replica",
        f"   first guess: {_replicas(sz.replicas_for_slots)} + {sz.spares} spare = "
        f"{_replicas(sz.replicas)}",
        f"   fluid throughput bound: {per_replica:.4g} req/s per replica, so at least "
        f"{_replicas(fleet.fluid_min)} (fewer are overloaded and are not simulated)",
        "",
        f"2. Simulator-confirmed fleet: {_replicas(fleet.replicas)} + {result.spares} "
        f"spare = {_replicas(result.replicas)} ({_below(fleet)})",
        f"   {'replicas':>8}  {'attainment (CI)':>24}  {'TTFT p99':>8}  {'TPOT p99':>8}  "
        f"{'goodput':>13}  {'reps':>4}  {'run':>7}  verdict",
        _fleet_row(fleet.replicas, result.at_size),
    ]
    below = result.below
    if below is not None:
        lines.append(_fleet_row(fleet.replicas - 1, below))
    elif fleet.replicas == 1:
        lines.append(f"   {0:>8}  (one replica already meets the target)")
    else:
        lines.append(f"   {fleet.replicas - 1:>8}  below the fluid bound: overloaded, not "
                     "simulated")
    lines += _backlog_note(f"at {_replicas(fleet.replicas)}", result.at_size)
    others = rows.loc[~rows["replicas"].isin([fleet.replicas, fleet.replicas - 1])]
    if len(others):
        lines.append("   also simulated: " + ", ".join(
            _point_text(int(row["replicas"]), row) for _, row in others.iterrows()))
    diff = fleet.replicas - sz.replicas_for_slots
    lines.append(f"   closed form said {sz.replicas_for_slots}; simulation says "
                 f"{fleet.replicas} ({diff:+d})")
    if s.prefix and r.prefix_cache_blocks:
        lines.append(f"   prefix cache at {_replicas(fleet.replicas)}: "
                     f"{result.at_size['prefix_hit_rate']:.1%} of prompt tokens served from "
                     f"the replicas' caches, each replication starting cold (for reference, "
                     f"one unbounded cache shared by the fleet and warm from the whole trace "
                     f"serves {_shared_hit_rate(s):.1%}"
                     + ("" if s.router in PREFIX_AWARE else
                        f"; router {s.router} ignores prefixes, a prefix-aware one ("
                        + ", ".join(PREFIX_AWARE) + ") sends a prompt where its blocks are")
                     + ")")
    if fleet.open:
        ran = int(rows.loc[rows["verdict"] == "open", "replications"].max())
        more = (", a larger --budget may decide them" if ran >= s.budget else "")
        lines.append(f"   open (not decided within {ran} replications; not counted as "
                     f"misses{more}): {_sizes(fleet.open)}")
    unstable = rows.loc[rows["verdict"] == "unstable", "replicas"].tolist()
    if unstable:
        lines.append("   unstable (no steady state: latency or misses keep rising along the "
                     f"run): {_sizes(unstable)}")
    cap = result.capacity
    row = cap.at_rate
    total = sum(_counts(result))
    upper = cap.upper
    shown = _verdict_at(cap, upper)
    lines += [
        "",
        f"3. Plan rate: {_replicas(fleet.replicas)} (spares held back) "
        f"{'carries' if fleet.replicas == 1 else 'carry'} up to "
        f"{cap.rate:.4g} req/s ({result.headroom:+.1%} over {s.rate:g} req/s): capacity "
        f"between {cap.rate:.4g} and {upper:.4g} req/s",
        f"   at {cap.rate:.4g} req/s (shown to meet): attainment {_attainment(row)}, TTFT p99 "
        f"{_ms(row['ttft_p99_s'])}, TPOT p99 {_ms_or_na(row['tpot_p99_s'])}, goodput "
        f"{row['goodput_rps']:.2f} req/s",
        (f"   at {upper:.4g} req/s: the fleet's fluid throughput bound (not simulated)"
         if shown == "fluid bound" else
         f"   at {upper:.4g} req/s (shown to {'miss' if shown == 'misses' else 'be unstable'})"
         f": attainment {_attainment(_row_at(cap, upper))}"),
    ]
    lines += _backlog_note(f"at {cap.rate:.4g} req/s", row)
    if cap.open:
        lines.append("   open between them (not decided within --budget; not misses): "
                     + ", ".join(f"{r:.4g}" for r in cap.open) + " req/s")
    lines += [
        f"   ({total} replications in {len(_counts(result))} points; run = "
        "simulated seconds per replication after warm-up; goodput = requests finishing "
        "within the SLO per second of that window, counted from one p99 end-to-end "
        "latency after its start: attainment x the arrivals' rate in steady state; the "
        "replications' arrivals run at the rate only on average)",
        "",
        f"4. Latency percentiles on {_replicas(fleet.replicas)} (requests after warm-up, "
        "all replications pooled; a rejected or unfinished request counts as inf; "
        "worst ITL = each request's longest gap between two tokens, the only "
        "inter-token gap the simulator keeps; E2E = arrival to last token; n/a: too "
        "few requests for the quantile)",
        *_percentile_lines(s.rate, result.at_size),
    ]
    if cap.rate != s.rate:
        lines += _percentile_lines(cap.rate, row)
    return "\n".join(lines)


def _backlog_note(where: str, row) -> list[str]:
    """A line saying why goodput is below attainment x rate, when the requests in the
    system grew materially over the counting window (``backlog_rps`` > 0.5 % of the
    rate): departures are arrivals minus that growth."""
    growth = row.get("backlog_rps", math.nan) if hasattr(row, "get") else math.nan
    if not growth > 0.005 * row["rate_rps"]:
        return []
    return [f"   goodput {where} is below attainment x rate by about {growth:.3g} req/s: "
            "requests in the system grew that fast over the window (more in service at "
            "its end than at its start), a load near the fleet's limit still filling"]


def _point_text(n: int, row) -> str:
    """``14 misses (97.10%)``: a simulated size, its verdict and attainment (none is
    claimed for an unstable point)."""
    if row["verdict"] == "unstable":
        return f"{n} unstable (no steady state, no attainment claimed)"
    return f"{n} {row['verdict']} ({row['attainment']:.2%})"


def _latency(seconds: float) -> str:
    """A latency cell: ``n/a`` (not computed), ``inf``, ``312 ms`` or ``12.4 s``."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    if not math.isfinite(seconds):
        return "inf"
    return f"{1000 * seconds:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


_LATENCY_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "max_gap": "worst ITL",
                   "e2e": "E2E"}


def _percentile_lines(rate: float, row) -> list[str]:
    """The latency percentiles of one evaluation row as a small table."""
    from .planning import LATENCY_METRICS, PERCENTILES

    head = "".join(f"{'p' + name[1:3] + ('.' + name[3:] if len(name) > 3 else ''):>9}"
                   for name in PERCENTILES)
    where = f"at {rate:.4g} req/s"
    lines = [f"   {where:<20}{head}"]
    for metric in LATENCY_METRICS:
        cells = "".join(f"{_latency(row.get(f'{metric}_{name}_s', math.nan)):>9}"
                        for name in PERCENTILES)
        lines.append(f"   {_LATENCY_LABELS[metric]:<20}{cells}")
    return lines


def _verdict_at(cap, rate: float) -> str:
    rows = cap.evaluations.loc[cap.evaluations["rate_rps"] == rate, "verdict"]
    return rows.iloc[-1] if len(rows) else "fluid bound"


def _row_at(cap, rate: float):
    rows = cap.evaluations.loc[cap.evaluations["rate_rps"] == rate]
    return rows.iloc[-1]


def _below(fleet) -> str:
    """What is known of one replica fewer than the answer, in words."""
    n = fleet.replicas - 1
    said = fleet.below_verdict
    if said == "none":
        return "one replica is the least"
    if said == "overloaded":
        return f"{n} under the fluid bound"
    if said == "misses":
        return f"{n} shown to miss"
    if said == "unstable":
        return f"{n} shown unstable"
    if said == "open":
        miss = fleet.shown_to_miss
        known = (f"{miss} shown to miss" if miss >= fleet.fluid_min
                 else f"{miss} under the fluid bound")
        return f"{n} open: not decided, may meet; {known}"
    return f"{n} {said}"


def interrupted_text(s: Settings, rows: list[dict], signal_name: str = "SIGINT") -> str:
    """What a plan stopped by a signal had shown, from the rows of the points it
    simulated (the progress callback's, in order): the smallest size shown to meet so
    far with its attainment, the largest shown to miss below it, what is not decided,
    and the capacity probes if the search had reached them. Plain text, one claim a
    line; nothing is claimed that the points do not show."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"rows must be a list of evaluation rows (dicts), got {rows!r}")
    fleet = [r for r in rows if "replicas" in r]
    probes = [r for r in rows if "replicas" not in r]
    lines = [f"Interrupted ({signal_name}) after {len(rows)} simulated "
             f"point{'' if len(rows) == 1 else 's'} of the plan for {s.rate:g} req/s "
             "(the search did not finish); what they showed:"]
    if not fleet:
        lines.append("   no fleet size simulated yet: nothing shown to meet or to miss")
        return "\n".join(lines)
    meets = sorted((r for r in fleet if r["verdict"] == "meets"), key=lambda r: r["replicas"])
    if meets:
        best = meets[0]
        k = int(best["replicas"])
        lines.append(f"   smallest size shown to meet so far: {_replicas(k)} (attainment "
                     f"{_attainment(best)}, TTFT p99 {_ms(best['ttft_p99_s'])}, TPOT p99 "
                     f"{_ms_or_na(best['tpot_p99_s'])}, {best['replications']} replications)")
    else:
        k = None
        lines.append("   no size shown to meet yet")
    below = [r for r in fleet if r["verdict"] in ("misses", "unstable")
             and (k is None or r["replicas"] < k)]
    if below:
        worst = max(below, key=lambda r: r["replicas"])
        lines.append(f"   largest size shown not to meet: "
                     f"{_point_text(int(worst['replicas']), worst)}")
    from .planning import fluid_rate

    floor = math.floor(s.rate / fluid_rate(s.requests, s.replica)) + 1   # fluid bound
    low = int(max(r["replicas"] for r in below)) if below else floor - 1
    if k is not None and not probes:
        start = low + 1
        if start >= k:
            lines.append(f"   {_replicas(k)} is the fleet's answer: "
                         + (f"{k - 1} shown not to meet" if below and low == k - 1 else
                            "fewer are under the fluid bound (overloaded)" if k > 1 else
                            "one replica is the least"))
        else:
            opened = sorted(int(r["replicas"]) for r in fleet
                            if r["verdict"] == "open" and start <= r["replicas"] < k)
            span = f"{start}" if start == k - 1 else f"{start} to {k - 1}"
            rest = (k - start) - len(opened)
            lines.append(f"   not decided: {span} replicas ("
                         + "; ".join(([f"open: {', '.join(map(str, opened))}"] if opened
                                      else [])
                                     + ([f"{rest} not simulated"] if rest else [])) + ")")
    if probes:
        lines.append("   the fleet search had finished: "
                     + ("" if k is None else f"{_replicas(k)}, ")
                     + "the capacity search was running")
        met = [r["rate_rps"] for r in probes if r["verdict"] == "meets"]
        missed = [r["rate_rps"] for r in probes if r["verdict"] in ("misses", "unstable")]
        if met:
            lines.append(f"   capacity probes shown to meet up to {max(met):.4g} req/s")
        if missed:
            lines.append(f"   capacity probes shown to miss from {min(missed):.4g} req/s")
    others = [r for r in fleet if k is None or r["replicas"] != k]
    if others:
        lines.append("   simulated sizes: " + ", ".join(
            _point_text(int(r["replicas"]), r) for r in sorted(others,
                                                               key=lambda r: r["replicas"])))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def _merge(namespace: argparse.Namespace, extra: tuple = ()) -> dict:
    given = {k: v for k, v in vars(namespace).items() if k != "command"}
    config = given.pop("config", None)
    merged = (_load_config(config, extra, namespace.command) if config is not None
              else {})
    merged.update(given)
    return merged


def _executor(s: Settings):
    """(executor, closer) for the replications: Dask, a local pool, or this process."""
    from . import parallel

    if s.scheduler is not None:
        try:
            from distributed import Client
        except ImportError:
            raise _bad("scheduler", s.scheduler, "needs dask.distributed installed") from None
        try:
            client = Client(s.scheduler, timeout=10)
        except (OSError, TimeoutError, ValueError) as exc:
            raise _bad("scheduler", s.scheduler, f"could not be reached ({exc})") from None
        return client, client.close
    if s.workers == 1:
        return None, lambda: None
    if s.workers is None:
        return parallel.AUTO, lambda: None
    return parallel.local_pool(s.workers), lambda: None


class _Stopped(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM arrived while ``plan`` ran."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_by_signals():
    """Within the block SIGINT and SIGTERM raise :class:`_Stopped`; on the way out of
    it the shared pool's workers are terminated (:func:`servingcap.parallel.stop_pool`),
    so no worker keeps simulating for a plan nobody waits for."""
    from . import parallel

    def stop(signum, frame):
        raise _Stopped(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    saved = {}
    if main_thread:
        for signum in (signal.SIGINT, signal.SIGTERM):
            saved[signum] = signal.signal(signum, stop)
    try:
        yield
    except KeyboardInterrupt:
        parallel.stop_pool()
        raise _Stopped(signal.SIGINT) from None
    except BaseException:
        parallel.stop_pool()
        raise
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def main(argv=None) -> int:
    from .planning import plan

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "calibrate":
        from .calibrate import main as calibrate
        return calibrate(argv[1:])
    if argv and argv[0] == "search":
        from ._search_cli import main as search
        return search(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "sweep":
        from .sweepcli import main as sweep
        return sweep(args)
    try:
        s = settings(_merge(args))
        executor, close = _executor(s)
    except (InputError, ValueError) as exc:     # ValueError: library validation
        print(f"{PROG} plan: error: {exc}", file=sys.stderr)
        return 2
    bar = _PlanProgress(s.progress, s.budget)
    try:
        with _stopped_by_signals():
            result = plan(s.requests, s.replica, s.rate, router=s.router, policy=s.policy,
                          limits=s.limits, target=s.target, spares=s.spares, beta=s.beta,
                          seed=s.seed, rtol=s.rtol, confidence=s.confidence,
                          budget=s.budget, delta=s.delta, holds=s.holds,
                          max_replicas=s.max_replicas, executor=executor, progress=bar,
                          on_replication=bar.replication if s.progress else None)
    except _Stopped as stop:
        bar.close()
        close()
        print(interrupted_text(s, bar.rows, stop.name), flush=True)
        print(f"{PROG} plan: stopped by {stop.name}; its pool workers were stopped too",
              file=sys.stderr)
        return 128 + stop.signum
    except ValueError as exc:
        bar.close()
        close()
        message = str(exc).replace("max_replicas=", "--max-replicas ")
        print(f"{PROG} plan: error: {message}", file=sys.stderr)
        return 2
    bar.close()
    close()
    print(render(s, result))
    if s.output is not None:
        try:
            write_output(s, result)
        except OSError as exc:
            print(f"{PROG} plan: error: --output {s.output!r} could not be written ({exc})",
                  file=sys.stderr)
            return 2
    return 0


def _exit(code: int) -> None:
    """Leave the process with ``code``. A run stopped by a signal (128 + signal number)
    has printed its report and terminated its pool's workers; it leaves at once
    (``os._exit``, after flushing), since the interpreter's own shutdown joins the
    pool's management threads, and a pool stopped mid-task can keep that join waiting
    (CI saw a SIGTERM'd plan print its report and then not exit for 30 s)."""
    if code > 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
