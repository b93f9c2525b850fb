"""Benchmark: today's serving engine in its three modes, and against the engine at
commit 7d8bff9 (issues 14 and 19).

Each configuration runs on the baseline engine (which had only the combined mode) and
on today's in each scheduling mode, interleaved (baseline, combined, mixed,
prefill_first, baseline, ...), best of ``--repeats``, each run in a fresh Python
process so that its peak memory is its own. A configuration's replica options are
written for the combined mode; the other modes take the nearest schedule:

* ``combined``: the options as written, with the additive step cost (the baseline's
  schedule and cost: like for like);
* ``mixed`` (today's default, with the default fused step cost): a ``chunk_tokens``
  of C becomes a token budget of C + 32 (the chunk beside a full decode batch); whole
  prompts become the default budget (``LOCKED.token_budget``, 240 tokens);
* ``prefill_first`` (fused cost): whole prompts with no token cap (DistServe's
  colocated baseline), so its rows with and without chunks are the same schedule.

The workloads:

* the full Azure conversation trace (19,366 requests) at its own arrival times on 4
  locked replicas, whole prompts and 256-token chunks. Like for like, today's
  ``least_requests`` router against 7d8bff9's ``least_loaded`` (the same request-count
  router, renamed since); also today's ``oracle_work`` (named ``least_loaded`` in
  between), which counts work (not the same schedule, so its ratio is not like for like);
* the same trace rescaled to half the saturation rate of ONE locked replica (where a
  replay takes the most steps), whole prompts and 256-token chunks. Saturation is
  ``admission.colocated_drain_rate`` at the trace's mean prompt and output lengths;
* the Mooncake conversation trace (12,031 requests, prompt block ``hash_ids``) on 10
  replicas with a KV limit of 160,000 tokens, a 4,096-block prefix cache, 512-token
  chunks and preemptive SRPT (so KV preemption and policy preemption both happen).

The baseline is ``git archive 7d8bff9 lib/servingcap`` unpacked in a temporary
directory and imported by path under another name; traces are loaded by today's
``servingcap.traffic`` for both. Times are CPU seconds of the ``simulate`` call
(``time.process_time``; a busy shared machine inflates wall time, not CPU time); peak
memory is the worker process's maximum resident set size (``ru_maxrss``: the
interpreter, numpy, pandas, the trace and the simulation). Each configuration also
says whether the two engines' output rows are identical (a hash of the frame).

A second old engine, the one at commit 4fd7c44 (the last before issue 19's work; it
too had only the combined mode and the additive step), runs each configuration as well,
with its router names (``least_requests``; today's ``oracle_work`` was its
``least_loaded``).

Targets: issue 14, today's combined engine >= 5x the baseline's speed on the full-trace,
4-replica runs, with peak memory within 2x of the baseline's; issue 19, "mixed + fused
at least as fast as combined is today" (written when 4fd7c44 was the engine): today's
mixed mode with the fused cost at most the CPU time of 4fd7c44's combined mode on every
configuration. The ratio to today's combined mode (faster since) is printed beside it.
Exit status 0 when both are met, 1 otherwise.

Not run by CI. Usage::

    .venv/bin/python bench/engine_speedup.py [--repeats 3] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

BASELINE = "7d8bff9"
ISSUE19 = "4fd7c44"              # the engine when issue 19 was written (combined only)
ISSUE19_ROUTERS = {"least_requests": "least_requests", "oracle_work": "least_loaded"}
TARGET_RATIO, MEMORY_RATIO = 5.0, 2.0
MOONCAKE = {"kv_capacity_tokens": 160_000, "prefix_cache_blocks": 4096, "chunk_tokens": 512,
            "preemptive": True}
# name: (trace, rate, replica options, simulate options today, baseline router, target)
CONFIGS = {
    "azure 4 replicas, whole, requests": ("azure_conv", None, {}, {"replicas": 4,
                                          "router": "least_requests"}, "least_loaded", True),
    "azure 4 replicas, chunk 256, requests": ("azure_conv", None, {"chunk_tokens": 256},
                                              {"replicas": 4, "router": "least_requests"},
                                              "least_loaded", True),
    "azure 4 replicas, whole, work*": ("azure_conv", None, {}, {"replicas": 4,
                                       "router": "oracle_work"}, "least_loaded", False),
    "azure 4 replicas, chunk 256, work*": ("azure_conv", None, {"chunk_tokens": 256},
                                           {"replicas": 4, "router": "oracle_work"},
                                           "least_loaded", False),
    "azure 1 replica at 50% load, whole": ("azure_conv", 0.5, {}, {}, "least_loaded", False),
    "azure 1 replica at 50% load, chunk 256": ("azure_conv", 0.5, {"chunk_tokens": 256}, {},
                                               "least_loaded", False),
    "mooncake 10 replicas, KV+prefix+preempt": ("mooncake", None, MOONCAKE,
                                                {"replicas": 10, "router": "least_requests",
                                                 "policy": "srpt"}, "least_loaded", False),
}


# --------------------------------------------------------------------------- one run


MODES = ("combined", "mixed", "prefill_first")
OLD = {"baseline": BASELINE, "issue19": ISSUE19}     # old engines: their commits
ENGINES = ("baseline", "issue19") + MODES


def replica_options(which: str, options: dict) -> dict:
    """The replica options of a configuration for engine ``which`` (see the docstring)."""
    options = dict(options)
    if which in OLD:
        return options
    if which == "combined":
        return {"mode": "combined", "step_cost": "additive", **options}
    chunk = options.pop("chunk_tokens", None)
    if which == "mixed" and chunk is not None:
        options["max_batched_tokens"] = chunk + options.get("max_batch", 32)
    return {"mode": which, **options}


def load_engine(which: str, old_root: str | None):
    """Today's ``servingcap.serving``, or an old engine's imported by path, with the
    ``_fast_engine`` module its ``simulate`` imports on first use imported here, so
    that the clock does not time compiling it (no bytecode is cached when
    PYTHONDONTWRITEBYTECODE is set, and today's module is the longer)."""
    if which not in OLD:
        from servingcap import _fast_engine, serving  # noqa: F401
        return serving
    init = Path(old_root) / OLD[which] / "lib" / "servingcap" / "__init__.py"
    package = f"servingcap_{which}"
    spec = importlib.util.spec_from_file_location(
        package, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)
    serving = importlib.import_module(f"{package}.serving")
    if (init.parent / "_fast_engine.py").exists():            # (7d8bff9 has none)
        importlib.import_module(f"{package}._fast_engine")
    return serving


def workload(name: str):
    """The trace of configuration ``name`` (rescaled when it names a load)."""
    from servingcap import admission
    from servingcap.params import LOCKED
    from servingcap.traffic import load_trace, rescale_to_rate
    trace_name, load = CONFIGS[name][:2]
    trace = load_trace(trace_name)
    if load is None:
        return trace
    saturation = admission.colocated_drain_rate(
        trace.prompt_tokens.mean() / LOCKED.prefill_rate, trace.output_tokens.mean(),
        LOCKED.decode_step_s, LOCKED.decode_batch)
    return rescale_to_rate(trace, load * saturation)


def worker(which: str, name: str, old_root: str | None) -> dict:
    """Run one configuration once on one engine; what the parent prints."""
    import pandas as pd
    serving = load_engine(which, old_root)
    trace = workload(name)
    _, _, replica_opts, options, base_router, _ = CONFIGS[name]
    options = dict(options)
    if which == "baseline" and "router" in options:
        options["router"] = base_router
    if which == "issue19" and "router" in options:
        options["router"] = ISSUE19_ROUTERS[options["router"]]
    replica = serving.Replica(**replica_options(which, replica_opts))
    wall, cpu = time.perf_counter(), time.process_time()
    out = serving.simulate(trace, replica, **options)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rows = pd.util.hash_pandas_object(out, index=True).to_numpy()
    return {"cpu_s": cpu, "wall_s": wall, "requests": len(out),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rows": int(rows.sum() % (1 << 61)), "accounted": bool(out.outcome.notna().all()),
            "rate": len(trace) / float(trace.arrival_s.max() - trace.arrival_s.min())}


# --------------------------------------------------------------------------- the run


def old_trees(directory: str) -> str:
    """Unpack ``lib/servingcap`` at each old engine's commit into ``directory/<commit>``."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    for commit in OLD.values():
        archive = subprocess.run(["git", "archive", commit, "lib/servingcap"], cwd=root,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(Path(directory) / commit, filter="data")
    return directory


def run(which: str, name: str, old_root: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", which, name, old_root],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{which} run of {name!r} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    with tempfile.TemporaryDirectory(prefix="engine_baseline_") as tmp:
        lib = old_trees(tmp)
        best: dict = {}
        for name in args.only:
            for _ in range(args.repeats):
                for which in ENGINES:                        # interleaved
                    result = run(which, name, lib)
                    kept = best.setdefault((name, which), result)
                    if result["cpu_s"] < kept["cpu_s"]:
                        best[(name, which)] = {**result, "rss_mb": max(result["rss_mb"],
                                                                       kept["rss_mb"])}
                    else:
                        kept["rss_mb"] = max(kept["rss_mb"], result["rss_mb"])
    print(f"CPU s of simulate(), best of {args.repeats} interleaved runs; the engines at "
          f"{BASELINE} and {ISSUE19} (combined) and today's in each mode; peak RSS of the "
          "worker process")
    print(f"{'configuration':42s} {'req/s in':>8s} {BASELINE:>8s} {ISSUE19:>8s} "
          f"{'combined':>8s} {'mixed':>8s} {'pf':>8s} {'speedup':>7s} {'mix/old':>7s} "
          f"{'mix/comb':>8s} {'MB base':>7s} {'MB comb':>7s}  same rows ({BASELINE}/{ISSUE19})")
    speed = mixed_ok = True
    for name in args.only:
        base, old, *today = (best[(name, which)] for which in ENGINES)
        combined, mixed, _ = today
        ratio = base["cpu_s"] / combined["cpu_s"]
        mixed_old = mixed["cpu_s"] / old["cpu_s"]
        mixed_ratio = mixed["cpu_s"] / combined["cpu_s"]
        same = "/".join("yes" if t["rows"] == combined["rows"] else "no" for t in (base, old))
        print(f"{name:42s} {combined['rate']:8.2f} {base['cpu_s']:8.2f} {old['cpu_s']:8.2f} "
              + " ".join(f"{t['cpu_s']:8.2f}" for t in today)
              + f" {ratio:6.1f}x {mixed_old:6.2f}x {mixed_ratio:7.2f}x {base['rss_mb']:7.0f} "
              f"{combined['rss_mb']:7.0f}  {same}")
        for which, t in zip(MODES + ("issue19",), today + [old], strict=True):
            if not (t["accounted"] and t["requests"] == base["requests"]):
                speed = False
                print(f"  {name}, {which}: some request is missing or has no outcome")
        if combined["rss_mb"] > MEMORY_RATIO * base["rss_mb"]:
            speed = False
        if CONFIGS[name][5] and ratio < TARGET_RATIO:
            speed = False
        mixed_ok = mixed_ok and mixed["cpu_s"] <= old["cpu_s"]
    print(f"pf: prefill_first; speedup: {BASELINE} / today's combined; mix/old: today's mixed "
          f"(fused) / {ISSUE19}'s combined (additive); mix/comb: today's mixed / today's "
          f"combined (additive) CPU time; same rows: the output rows of {BASELINE}'s and of "
          f"{ISSUE19}'s engine equal today's combined mode's")
    print(f"* today's oracle_work counts outstanding work, {BASELINE}'s counted requests: "
          "different schedules, the speedup is indicative only")
    print(f"issue 14: >= {TARGET_RATIO:.0f}x on the like-for-like 4-replica runs, peak memory "
          f"<= {MEMORY_RATIO:.0f}x the baseline's: {'PASS' if speed else 'FAIL'}")
    print(f"issue 19: today's mixed (fused) at least as fast as combined when the issue was "
          f"written ({ISSUE19}) on every configuration: {'PASS' if mixed_ok else 'FAIL'}")
    return 0 if speed and mixed_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
