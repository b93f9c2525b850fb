"""Per-arrival routing cost of each router at 10, 100 and 1,000 replicas.

Builds a fleet of real engines (``serving._Engine``, 32 slots each) in a steady state:
every replica runs 24 to 32 requests and some hold a short queue. Then, per arrival,
times what :func:`servingcap.serving.simulate` spends on routing: one ``pick`` plus the
``update`` calls of an arrival (the target's queue grew) and of a step elsewhere (one
replica's running set changed). ``jsq`` and ``least_requests`` keep a heap of replica
keys refreshed only on those events, so their cost grows as log(replicas); a router
that scans every replica grows linearly. Prints microseconds per arrival (CPU time).

    PYTHONPATH=lib python bench/router_cost.py [--arrivals 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from servingcap.routers import ROUTERS, Router
from servingcap.serving import Replica, _Engine, _Queue, _Requests

SLOTS = 32


def fleet(replicas: int, arrivals: int, seed: int = 0):
    """Engines in a steady state and the requests still to arrive."""
    rng = np.random.default_rng(seed)
    held = replicas * SLOTS
    n = held + arrivals
    frame = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 10, n)),
                          "prompt_tokens": rng.integers(100, 2000, n),
                          "output_tokens": rng.integers(50, 600, n),
                          "hash_ids": [[0, int(g), 100 + k] for k, g in
                                       enumerate(rng.integers(1, 50, n))]})
    spec = Replica(max_batch=SLOTS, prefix_cache_blocks=64)
    req = _Requests(frame, spec, "fcfs")
    engines = []
    for k in range(replicas):
        queue = _Queue()
        engine = _Engine(k, spec, req, queue, "fcfs", None)
        queue.replicas.append(engine)
        engines.append(engine)
    i = 0
    for engine in engines:
        for _ in range(int(rng.integers(24, SLOTS + 4))):
            if len(engine.running) < SLOTS:
                engine.running.append(i)
                req.generated[i] = rng.integers(0, 50)
            else:
                engine.enqueue(i)
            i += 1
    return engines, req, list(range(held, n))


def cost_us(router: str, replicas: int, arrivals: int) -> float:
    """CPU microseconds of routing per arrival."""
    engines, req, rows = fleet(replicas, arrivals)
    route = Router(router, engines, req, np.random.default_rng(1))
    other = np.random.default_rng(2).integers(replicas, size=len(rows)).tolist()
    start = time.process_time()
    for i, k in zip(rows, other, strict=True):
        target = route.pick(i)
        route.update(target)               # its queue grew (not enqueued: state kept steady)
        route.update(engines[k])           # a step ended elsewhere
    return (time.process_time() - start) / len(rows) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrivals", type=int, default=2000)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    args = parser.parse_args()
    sizes = (10, 100, 1000)
    print(f"routing cost per arrival (us of CPU), {args.arrivals} arrivals")
    print(f"{'router':<16}" + "".join(f"{n:>12,}" for n in sizes))
    for router in args.routers.split(","):
        # the scanning routers at 1,000 replicas: fewer arrivals keep the bench short
        cells = [cost_us(router, n, args.arrivals if n < 1000 else max(args.arrivals // 10, 50))
                 for n in sizes]
        print(f"{router:<16}" + "".join(f"{c:12.1f}" for c in cells))


if __name__ == "__main__":
    main()
