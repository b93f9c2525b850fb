"""TTFT p99 of every router on issue 21's scenario: the measurement behind the default.

11 replicas x 32 slots at 30 req/s (Poisson), output lengths exponential with mean 300
tokens (geometric, >= 1), one-token prompts (negligible prefill), 30 ms decode steps in
``mode="combined"`` (set explicitly, so a change of ``Replica``'s defaults does not move
these numbers); TTFT p99 of the requests arriving after a 60 s warm-up. The offered load
is 30 x 300 x 0.030 = 270 busy slots of 352 (77 %).

    PYTHONPATH=lib python bench/routers.py [--seconds 600] [--seed 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from servingcap.routers import BOUNDS, DEFAULT_ROUTER, ROUTERS
from servingcap.serving import Replica, simulate

REPLICAS, SLOTS, RATE, MEAN_OUT, STEP_S, WARMUP_S = 11, 32, 30.0, 300, 0.030, 60.0


def scenario(seconds: float, seed: int) -> pd.DataFrame:
    """The issue's requests: Poisson arrivals for ``seconds`` (s)."""
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    return pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1 / RATE, n)),
                         "prompt_tokens": 1,
                         "output_tokens": rng.geometric(1 / MEAN_OUT, n)})


def replica() -> Replica:
    return Replica(decode_step_s=STEP_S, mode="combined", max_batch=SLOTS)


def ttft_p99(router: str, requests: pd.DataFrame, seed: int) -> float:
    """TTFT p99 (s) after the warm-up."""
    out = simulate(requests, replica(), replicas=REPLICAS, router=router, seed=seed)
    return float(out.ttft_s[out.arrival_s >= WARMUP_S].quantile(0.99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    requests = scenario(args.seconds, args.seed)
    rows = []
    for router in ROUTERS:
        start = time.process_time()
        p99 = ttft_p99(router, requests, args.seed)
        rows.append((router, p99, time.process_time() - start))
    pooled = dict((r, p) for r, p, _ in rows)["pooled"]
    print(f"{len(requests)} requests over {args.seconds:g} s, seed {args.seed}; "
          f"TTFT p99 after {WARMUP_S:g} s")
    print(f"{'router':<16} {'TTFT p99 (s)':>12} {'x pooled':>9} {'CPU (s)':>8}")
    for router, p99, cpu in sorted(rows, key=lambda row: row[1]):
        tag = " (default)" if router == DEFAULT_ROUTER else " (bound)" if router in BOUNDS else ""
        print(f"{router:<16} {p99:12.3f} {p99 / pooled:9.2f} {cpu:8.1f}{tag}")


if __name__ == "__main__":
    main()
