"""Benchmark: servingcap's vectorized FCFS simulator against Ciw on the same queues.

For M/M/1 (rho = 0.8) and M/M/8 (rho = 0.8), in one run on one machine:

* Ciw (a general discrete-event simulator) simulates ``--ciw-customers`` customers;
* servingcap (``sim.mmc_sample``: Poisson arrivals + exponential service sampling +
  ``fcfs_waits``) simulates ``--customers`` customers;

and the script prints customers/s for each (best of ``--repeats`` timed runs), the speed
ratio against the DESIGN.md targets (>= 300x on M/M/1, >= 50x on M/M/8), and each
simulator's mean and p99 of wait and response next to the closed form, with batch-means
standard errors (waits in a queue are autocorrelated, so iid standard errors would be
too small). Times are CPU seconds of this process (``time.process_time``), so other
work on a shared machine does not distort the ratio; both simulators are single-threaded.
Exit status is 0 when every target is met, 1 otherwise.

Not run by CI. Usage::

    .venv/bin/python bench/fcfs_vs_ciw.py [--customers 10000000] [--ciw-customers 50000]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import ciw
import numpy as np
from scipy import optimize
from servingcap.queues import MM1, MMc
from servingcap.sim import fcfs_waits, mmc_sample

TARGETS = {1: 300.0, 8: 50.0}   # DESIGN.md: speed ratio servingcap / Ciw
RHO, MU = 0.8, 1.0
BATCHES = 20                    # batch means for the standard errors
Z = 4.5                         # agreement band, in standard errors


# --------------------------------------------------------------------------- closed forms


def closed_form(c):
    """Mean and p99 of wait and response for M/M/c at rho = 0.8, mu = 1 (s)."""
    lam = RHO * c * MU
    if c == 1:
        q = MM1(lam, MU)
        return {"wait_mean": q.mean_wait, "wait_p99": q.wait_quantile(0.99),
                "resp_mean": q.mean_response, "resp_p99": q.response_quantile(0.99)}
    q = MMc(lam, MU, c)
    cw, theta = q.prob_wait, c * MU - lam

    def tail(t):  # P(response > t): service, plus an Exp(theta) wait with prob. C
        hypo = (theta * math.exp(-MU * t) - MU * math.exp(-theta * t)) / (theta - MU)
        return (1 - cw) * math.exp(-MU * t) + cw * hypo

    p99 = optimize.brentq(lambda t: tail(t) - 0.01, 0.0, 100.0, xtol=1e-12)
    return {"wait_mean": q.mean_wait, "wait_p99": q.wait_quantile(0.99),
            "resp_mean": q.mean_response, "resp_p99": p99}


# --------------------------------------------------------------------------- statistics


def batch_stats(waits, service):
    """Point estimates on the whole run and batch-means standard errors."""
    resp = waits + service
    out = {}
    for name, x in (("wait", waits), ("resp", resp)):
        batches = np.array_split(x, BATCHES)
        means = np.array([b.mean() for b in batches])
        p99s = np.array([np.quantile(b, 0.99) for b in batches])
        out[f"{name}_mean"] = (float(x.mean()), float(means.std(ddof=1) / math.sqrt(BATCHES)))
        out[f"{name}_p99"] = (float(np.quantile(x, 0.99)),
                              float(p99s.std(ddof=1) / math.sqrt(BATCHES)))
    return out


# --------------------------------------------------------------------------- runners


def run_ciw(c, n, seed):
    network = ciw.create_network(
        arrival_distributions=[ciw.dists.Exponential(RHO * c * MU)],
        service_distributions=[ciw.dists.Exponential(MU)],
        number_of_servers=[c],
    )
    ciw.seed(seed)
    sim = ciw.Simulation(network)
    w0, t0 = time.perf_counter(), time.process_time()
    sim.simulate_until_max_customers(n, method="Finish")
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    records = sorted(sim.get_all_records(), key=lambda r: r.arrival_date)
    waits = np.array([r.waiting_time for r in records])
    service = np.array([r.service_time for r in records])
    return (len(records) / cpu, len(records) / wall), waits, service


def run_servingcap(c, n, seed):
    rng = np.random.default_rng(seed)
    w0, t0 = time.perf_counter(), time.process_time()
    _, service, waits = mmc_sample(RHO * c * MU, MU, n, rng, servers=c)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    return (n / cpu, n / wall), waits, service


def split_timing(c, n, seed):
    """How the servingcap time divides between sampling and fcfs_waits (s)."""
    rng = np.random.default_rng(seed)
    t0 = time.process_time()
    arrivals = np.cumsum(rng.exponential(1.0 / (RHO * c * MU), n))
    service = rng.exponential(1.0 / MU, n)
    t1 = time.process_time()
    fcfs_waits(arrivals, service, servers=c)
    t2 = time.process_time()
    return t1 - t0, t2 - t1


def best_of(runner, c, n, repeats, seed):
    """Fastest of ``repeats`` runs (CPU and wall clock, customers/s); the statistics
    come from the first timed run. One untimed warm-up run goes first, for both
    simulators: numpy's first passes over fresh n-long arrays pay the operating
    system's page faults (the process growing its heap), which measures the machine's
    memory setup rather than the simulator and varies 2x from run to run."""
    runner(c, n, seed - 1)
    cpu_rates, wall_rates, first = [], [], None
    for k in range(repeats):
        (cpu, wall), waits, service = runner(c, n, seed + k)
        cpu_rates.append(cpu)
        wall_rates.append(wall)
        if first is None:
            first = (waits, service)
    return (max(cpu_rates), max(wall_rates)), first


# --------------------------------------------------------------------------- report


def report_case(c, n_sc, n_ciw, repeats, seed, warmup):
    label = "M/M/1" if c == 1 else f"M/M/{c}"
    print(f"\n=== {label}, rho = {RHO}, mu = {MU}/s, lambda = {RHO * c * MU:g}/s ===")
    (ciw_rate, ciw_wall), (ciw_w, ciw_s) = best_of(run_ciw, c, n_ciw, repeats, seed)
    (sc_rate, sc_wall), (sc_w, sc_s) = best_of(run_servingcap, c, n_sc, repeats, seed + 1000)
    sample_s, fcfs_s = split_timing(c, n_sc, seed + 2000)
    ratio = sc_rate / ciw_rate
    print(f"{'':<11}{'customers':>10}  {'CPU customers/s':>16}  {'wall customers/s':>16}")
    print(f"{'Ciw':<11}{n_ciw:>10,d}  {ciw_rate:>16,.0f}  {ciw_wall:>16,.0f}")
    print(f"{'servingcap':<11}{n_sc:>10,d}  {sc_rate:>16,.0f}  {sc_wall:>16,.0f}")
    print(f"servingcap split (one run, CPU): sampling {sample_s:.2f} s + fcfs_waits "
          f"{fcfs_s:.2f} s (fcfs_waits alone {n_sc / fcfs_s:,.0f} customers/s)")
    target = TARGETS[c]
    ok_speed = ratio >= target
    print(f"speed ratio {ratio:,.0f}x CPU ({sc_wall / ciw_wall:,.0f}x wall)  "
          f"(target >= {target:.0f}x)  {'PASS' if ok_speed else 'FAIL'}")

    exact = closed_form(c)
    stats = {"Ciw": batch_stats(ciw_w[warmup:], ciw_s[warmup:]),
             "servingcap": batch_stats(sc_w[warmup // 10 * 10:], sc_s[warmup // 10 * 10:])}
    print(f"{'metric':<16}{'closed form':>12}  {'Ciw (± SE)':>22}  {'dev/SE':>6}"
          f"  {'servingcap (± SE)':>22}  {'dev/SE':>6}")
    ok_stats = True
    for key, name in (("wait_mean", "mean wait (s)"), ("wait_p99", "p99 wait (s)"),
                      ("resp_mean", "mean resp. (s)"), ("resp_p99", "p99 resp. (s)")):
        row = f"{name:<16}{exact[key]:>12.4f}"
        for sim in ("Ciw", "servingcap"):
            est, se = stats[sim][key]
            dev = (est - exact[key]) / se
            ok_stats &= abs(dev) < Z
            row += f"  {est:>12.4f} ± {se:<7.4f}  {dev:>+6.2f}"
        print(row)
    print(f"agreement with closed form within {Z} SE: {'PASS' if ok_stats else 'FAIL'}")
    return ok_speed, ok_stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=10_000_000,
                        help="customers servingcap simulates on M/M/1 (M/M/8 uses 1/2)")
    parser.add_argument("--ciw-customers", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best counts")
    parser.add_argument("--seed", type=int, default=20241129)
    args = parser.parse_args(argv)

    print("fcfs_vs_ciw: servingcap.sim vs Ciw")
    coretype = os.environ.get("OPENBLAS_CORETYPE", "(unset)")
    print(f"python {platform.python_version()}  numpy {np.__version__}  ciw {ciw.__version__}"
          f"  cpus {os.cpu_count()}  OPENBLAS_CORETYPE={coretype}")
    print(f"standard errors: batch means over {BATCHES} batches after a warm-up;"
          f" timings: CPU time, best of {args.repeats}")
    results = {}
    for c, n_sc in ((1, args.customers), (8, args.customers // 2)):
        results[c] = report_case(c, n_sc, args.ciw_customers, args.repeats, args.seed,
                                 warmup=min(2_000, args.ciw_customers // 10))
    print("\n=== summary ===")
    all_speed = True
    for c, (ok_speed, ok_stats) in results.items():
        label = "M/M/1" if c == 1 else f"M/M/{c}"
        all_speed &= ok_speed
        print(f"{label}: speed {'PASS' if ok_speed else 'FAIL'} (target {TARGETS[c]:.0f}x),"
              f" agreement {'PASS' if ok_stats else 'FAIL'}")
    overall = all_speed and all(ok for _, ok in results.values())
    print(f"OVERALL: {'PASS' if overall else 'FAIL'}")
    return 0 if overall else 1


if __name__ == "__main__":
    sys.exit(main())
