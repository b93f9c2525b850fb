"""Benchmark of the configuration search (:mod:`servingcap.configsearch`), issue 24.

Target: a grid of at least 48 configurations at 30 req/s in under 10 minutes on this
2-core machine. The grid: Llama-3.1-8B on the 6 GPUs of ``data/gpus.csv`` x TP 1, 2, 4
x bf16 / fp8 (where the GPU has fp8) x token budgets 512 and 2,048 (mixed mode, 32
slots) = 60 configurations; the book's workload (2,000-token prompts, 300-token
outputs), TTFT <= 1 s and TPOT <= 50 ms for 99 % of requests, 1 spare, the shipped
prices.

Two runs:

1. **with pruning**, into a fresh cache directory: wall time, CPU time (this process
   and its pool workers), configurations simulated / pruned / refused, the answer;
2. **without pruning**, on the same cache: it reads every configuration run 1
   simulated and simulates only those run 1 pruned, so its wall time is what pruning
   saved (plus cache reads), and its answer must equal run 1's (pruning never drops the
   cheapest configuration).

Statistics are reduced by default (2 hold times and at least 300 requests per replication,
up to 10 replications, instead of ``plan``'s 20 / 2,000 / 16): this machine is shared by
several jobs, and the benchmark times the search machinery (pruning, waves, cache,
executor), not the statistics. Measured 2026-12-02 on the shared 2-core machine (load
average 2.5-5 from other jobs), ``bench/search_speed.py`` with these defaults: 60
configurations; with pruning (waves of 4) 62 s wall, 42 s CPU, 4 simulated, 56 pruned;
the second run simulated the 56 pruned ones in 425 s wall (507 s CPU), so the whole grid
without pruning takes about 487 s and pruning saved about 425 s (87 %); same cheapest
configuration (L40S tp1 fp8, 10 + 1 replicas). Re-measured the same day after the fluid
bound became a proven bound for roofline replicas (``Roofline.fluid_work_s``, higher
capacities, so lower cost floors): with pruning 79 s wall, 42 s CPU, still 4 simulated
and 56 pruned; the 56 pruned ones took 602 s wall (486 s CPU, load average about 4), so
the whole grid without pruning takes about 681 s and pruning saved about 602 s (88 %);
same cheapest configuration with and without pruning (L40S tp1 fp8 mixed/512, 8 + 1
replicas). An earlier run under load average 8-10
with waves of 8: 223 s with pruning (8 simulated, 52 pruned), 1,341 s for the 52 pruned.

**With disaggregated designs** (``--designs colocated,disaggregated --tp 1,2 --budgets
2048``): 20 colocated configurations and 40 disaggregated ones (each GPU and dtype, the
prefill and the decode pool at TP 1 or 2 each, prefill cap 2,048 tokens, 32 decode slots),
60 in all. Measured twice on 2026-12-02, on the shared 2-core machine while another helper
executed a chapter (and, in the first, this helper's own tests ran beside the unpruned
run), with the default statistics above:

* first: with pruning 19 s wall, 16 s CPU (load average 1.3 at the start, 2.0 at the
  end), 4 simulated, 56 pruned -- every disaggregated design among them: its fluid bound,
  both pools with a spare each, already costs more than the best colocated answer; the
  56 pruned ones then took 430 s wall (305 s CPU, load average 4.5 at the end);
* second: with pruning 24 s wall, 17 s CPU (load average 3.9), the same 4 simulated and
  56 pruned; the 56 pruned ones took 445 s wall (310 s CPU, load average 4.9).

So the whole 60-configuration grid takes about 450-470 s without pruning (under the
600 s target even so) and 19-24 s with it: pruning saved about 430-445 s (95-96 %). Same
cheapest configuration with and without pruning: L40S tp1 fp8 mixed/2048, 9 + 1 replicas,
10 GPUs, $0.432 per million good tokens; the cheapest disaggregated design of the whole
grid, L40S fp8 with both pools at TP 1, needs 12 GPUs and $0.519 per million good tokens
(+20 %, third of the grid).

**At plan's full statistics** (``--holds 20 --budget 16 --min-requests 2000``, the
colocated 60-configuration grid), measured 2026-12-02 with load average 2-3 from other
jobs: with pruning 134 s wall, 156 s CPU, 4 simulated and 56 pruned, under the 600 s
target; cheapest L40S tp1 fp8 mixed/512 B32, 8 + 1 replicas, $0.39 per million good
tokens ($0.389-$0.393), runner-up L40S tp1 fp8 mixed/2048 not separated from it. (The
run without pruning was stopped: at these statistics it takes well over the target.)

Not run by CI (minutes). Usage::

    .venv/bin/python bench/search_speed.py                   # defaults below
    .venv/bin/python bench/search_speed.py --holds 20 --budget 16 --min-requests 2000
    .venv/bin/python bench/search_speed.py --designs colocated,disaggregated --tp 1,2 \\
        --budgets 2048
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

from servingcap import configsearch, parallel, planning, roofline

TARGET_S = 600.0


def cpu_s() -> float:
    """CPU seconds of this process and its joined children (the pool's workers, joined
    after each run)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run(args, cache: str, prune: bool):
    start, cpu = time.perf_counter(), cpu_s()
    ticks = []

    def progress(row):
        ticks.append(time.perf_counter() - start)
        if args.verbose:
            print(f"  {ticks[-1]:7.1f} s  {row['label']:<34} {row['status']:<8} "
                  f"{row.get('replicas', '')}", flush=True)

    result = configsearch.search(
        "Llama-3.1-8B", planning.PoissonWorkload(2000, 300), args.rate,
        gpus=list(roofline.gpu_table()["gpu"]), tps=args.tp, dtypes=("bf16", "fp8"),
        modes=("mixed",), budgets=args.budgets, max_batches=(32,), designs=args.designs,
        limits={"ttft_s": 1.0, "tpot_s": 0.05}, target=0.99, spares=1,
        budget=args.budget, holds=args.holds, min_requests=args.min_requests,
        prune=prune, cache_dir=cache, progress=progress)
    wall = time.perf_counter() - start
    parallel._shutdown()        # join the pool's workers so their CPU time is counted
    print(f"  load average (1, 5, 15 min) at the end of the run: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return result, wall, cpu_s() - cpu


def _items(kind, allowed=None):
    """argparse type of a comma-separated list of ``kind`` (values from ``allowed``)."""
    def parse(text: str) -> tuple:
        try:
            items = tuple(kind(s.strip()) for s in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None
        if allowed is not None and not set(items) <= set(allowed):
            raise argparse.ArgumentTypeError(f"must list {', '.join(allowed)}: {text!r}")
        return items
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", type=_items(str, configsearch.DESIGNS),
                        default=("colocated",),
                        help="fleet designs searched (default colocated)")
    parser.add_argument("--tp", type=_items(int), default=(1, 2, 4),
                        help="tensor-parallel degrees (default 1,2,4)")
    parser.add_argument("--budgets", type=_items(int), default=(512, 2048),
                        help="token budgets, tokens (default 512,2048)")
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--holds", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=10)
    parser.add_argument("--min-requests", type=int, default=300)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        first, wall1, cpu1 = run(args, cache, prune=True)
        t = first.table
        n = len(t)
        split = int((t["design"] == "disaggregated").sum())
        print(f"grid: {n} configurations ({split} disaggregated) at {args.rate:g} req/s "
              f"(holds {args.holds:g}, budget {args.budget}, min_requests "
              f"{args.min_requests})")
        print(f"with pruning: {wall1:.0f} s wall, {cpu1:.0f} s CPU; simulated "
              f"{first.simulated}, pruned {first.pruned}, refused "
              f"{int((t['status'] == 'refused').sum())}, failed "
              f"{int((t['status'] == 'failed').sum())}; target {TARGET_S:.0f} s: "
              f"{'met' if wall1 < TARGET_S else 'MISSED'}")
        for design, rows in t.groupby("design", sort=False):
            counts = rows["status"].value_counts()
            print(f"  {design}: " + ", ".join(f"{counts.get(k, 0)} {k}"
                                              for k in configsearch.STATUSES))
        print("  " + first.conclusion, flush=True)
        second, wall2, cpu2 = run(args, cache, prune=False)
        print(f"without pruning (same cache: simulates only what was pruned): {wall2:.0f} s "
              f"wall, {cpu2:.0f} s CPU for {second.simulated} configurations, "
              f"{second.from_cache} from the cache -> pruning saved about {wall2:.0f} s")
        same = (first.ranked["label"].iloc[0] == second.ranked["label"].iloc[0]
                if len(first.ranked) and len(second.ranked) else len(second.ranked) == 0)
        print(f"same cheapest configuration with and without pruning: {same}")
        full = second.ranked
        for design, rows in full.groupby("design", sort=False):
            top = rows.iloc[0]
            print(f"  cheapest {design} of the whole grid: {top['label']}, "
                  f"{top['gpus']:.0f} GPUs, ${top['usd_per_mtok']:.3f} per million good "
                  f"tokens (rank {top['rank']:.0f}, "
                  f"{top['usd_per_mtok'] / full['usd_per_mtok'].iloc[0] - 1:+.0%})")
        print(first.ranked[["rank", "label", "replicas", "gpus", "usd_per_hour",
                            "usd_per_mtok", "ttft_p99_s", "pareto"]].head(10).to_string(
                                index=False))


if __name__ == "__main__":
    main()
