"""Command line: ``python -m servingcap sweep`` prints and plots goodput against the rate.

For a fixed fleet (``--replicas``, default 1) and the same replica, traffic, SLO and
statistics options as ``plan`` (:mod:`servingcap.__main__` builds both parsers from one
list of option groups and validates both with its ``settings()``), each rate of
``--rates`` is one :func:`servingcap.planning.goodput_curve` point: replications until
the sequential check decides meets / misses, or the point stays open or is unstable.
The command prints one row per rate (attainment and goodput with their intervals, the
verdict, the p99s), the knee (:func:`servingcap.planning.curve_knee`) and the goodput
peak, and with ``--plot FILE.png`` draws goodput against the offered rate, the way
DistServe (Zhong et al., OSDI 2024, Fig. 1) and the book's chapter *Goodput* draw it.

Rates at or above the fleet's fluid throughput bound
(:func:`servingcap.planning.fluid_rate`) are listed as ``overloaded`` and not simulated:
no queue is stable there, so a replication would only measure how long it ran (the
same rule ``plan`` applies to fleet sizes). The rest of the sweep still runs, so one
command shows the whole curve up to the bound.

Unlike :mod:`servingcap.sweep` (the chapters' one-simulation-per-knob loop), every point
here is a replicated, sequentially decided estimate, as in ``plan``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import pandas as pd

__all__ = ["parse_rates", "goodput_figure", "MAX_RATES", "PLOT_SUFFIXES"]

MAX_RATES = 200
"""Most rates one sweep accepts (each is up to --budget replications)."""

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""File types --plot writes (matplotlib's Agg-backed savefig)."""

OUTPUT_HELP = ("also write the result: .json (the settings, the knee, the peak and one "
               "record per rate) or .csv (one row per rate, the goodput_curve columns plus "
               "replicas; overloaded rates have verdict 'overloaded' and no numbers)")

VERDICT_STYLE = {          # marker, face color key, label
    "meets": ("o", "sim", "meets the target"),
    "misses": ("X", "slo", "misses the target"),
    "open": ("o", None, "open (not decided within --budget)"),
    "unstable": ("^", "muted", "unstable (no steady state)"),
}

_PLAN_ONLY = ("rate", "spares", "max_replicas", "beta", "rtol")
_NUMBER = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


# --------------------------------------------------------------------------- parser


def add_sweep_parser(commands) -> argparse.ArgumentParser:
    """The ``sweep`` subparser (its options are added by ``__main__._add_options``)."""
    return commands.add_parser(
        "sweep", prog="python -m servingcap sweep",
        allow_abbrev=False,     # else plan's --rate would silently mean --rates here
        help="goodput and SLO attainment of a fixed fleet at a list of rates, printed "
             "and plotted",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Goodput of a fixed fleet (--replicas) at each rate of --rates, with the\n"
            "replica, traffic, SLO and statistics options of `plan`.\n\n"
            "Each rate is simulated as plan simulates a point: replications of --holds\n"
            "hold times (same traffic at every rate), decided meets / misses by the\n"
            "sequential check, or open (not decided within --budget, never a miss), or\n"
            "unstable. Rates at or above the fleet's fluid throughput bound are listed as\n"
            "overloaded and not simulated. Prints one row per rate (attainment and\n"
            "goodput with intervals, verdict, p99 TTFT/TPOT, replications), the knee (where\n"
            "the attainment estimate crosses --target; plan there) and the goodput peak\n"
            "(past the knee goodput may still rise only because more requests are\n"
            "offered while a growing share of them misses). --plot FILE.png draws\n"
            "goodput against the offered rate."),
        epilog=("Example:\n  python -m servingcap sweep --rates 1:5:1 --replicas 1 "
                "--prompt-tokens 200 --output-tokens 20 \\\n      --max-batch 8 --no-progress "
                "--plot goodput.png"))


def add_rates_option(group) -> None:
    group.add_argument("--rates", type=str, metavar="LIST|START:STOP:STEP",
                       default=argparse.SUPPRESS,
                       help="arrival rates to simulate, requests/s, increasing: a list "
                            "10,20,30 or a range 10:40:5 (start:stop:step, stop included) "
                            f"or both, e.g. 5,10:40:10; at most {MAX_RATES} rates (required)")


def add_replicas_option(group) -> None:
    group.add_argument("--replicas", type=str, metavar="REPLICAS", default=argparse.SUPPRESS,
                       help="serving replicas of the fleet, all of them taking traffic "
                            "(default 1)")


def add_plot_option(group) -> None:
    group.add_argument("--plot", type=str, metavar="FILE.png", default=argparse.SUPPRESS,
                       help="also draw goodput against the offered rate (.png, .svg or .pdf): "
                            "interval bars, verdict markers, the knee, the lines goodput = "
                            "rate and target x rate")


# --------------------------------------------------------------------------- input


def _range(token: str, spec) -> list[float]:
    parts = token.split(":")
    if len(parts) != 3 or not all(_NUMBER.match(p.strip()) for p in parts):
        raise ValueError(f"--rates has {token!r}, neither a number nor start:stop:step; "
                         f"write 10,20,30 or 10:40:5, got {spec!r}")
    start, stop, step = (float(p) for p in parts)
    if start <= 0 or step <= 0:
        raise ValueError(f"--rates range {token!r} needs start > 0 and step > 0 (req/s), "
                         f"got {spec!r}")
    if stop < start:
        raise ValueError(f"--rates range {token!r} must not decrease (stop >= start), "
                         f"got {spec!r}")
    count = math.floor((stop - start) / step + 1e-9) + 1
    if count > MAX_RATES:
        raise ValueError(f"--rates range {token!r} has {count:,} rates, more than "
                         f"{MAX_RATES}; take a larger step, got {spec!r}")
    return [float(f"{start + i * step:.12g}") for i in range(count)]


def parse_rates(rates) -> list[float]:
    """The rates (requests/s) of ``--rates``: ``"10,20,30"``, ``"10:40:5"`` (start, stop,
    step; stop included when the steps land on it), a mix such as ``"5,10:40:10"``, or a
    list of numbers (a TOML config). Raises ValueError naming ``--rates`` unless the
    rates are finite, > 0, strictly increasing and at most :data:`MAX_RATES`."""
    spec = rates
    if isinstance(spec, (list, tuple)):
        tokens = list(spec)
    elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
        tokens = [spec]
    elif isinstance(spec, str):
        tokens = [t.strip() for t in spec.split(",")]
        if not spec.strip():
            raise ValueError("--rates must list at least one rate, req/s (e.g. 10,20,30 or "
                             f"10:40:5), got {spec!r}")
    else:
        raise ValueError(f"--rates must be rates like 10,20,30 or 10:40:5, got {spec!r}")
    out: list[float] = []
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, (str, int, float)):
            raise ValueError(f"--rates must be numbers (req/s), got {spec!r}")
        if isinstance(token, str) and ":" in token:
            out += _range(token, spec)
            continue
        text = str(token).strip()
        if not text:
            raise ValueError(f"--rates has an empty entry; write 10,20,30, got {spec!r}")
        try:
            rate = float(text)
        except ValueError:
            raise ValueError(f"--rates has {text!r}, neither a number nor start:stop:step; "
                             f"write 10,20,30 or 10:40:5, got {spec!r}") from None
        if not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"--rates must be finite rates > 0 req/s, got {text!r} in {spec!r}")
        out.append(rate)
    if not out:
        raise ValueError(f"--rates must list at least one rate, req/s, got {spec!r}")
    if len(out) > MAX_RATES:
        raise ValueError(f"--rates has {len(out):,} rates, more than {MAX_RATES}, got {spec!r}")
    for a, b in zip(out, out[1:], strict=False):
        if b <= a:
            raise ValueError(f"--rates must be strictly increasing, got {b:g} after {a:g} "
                             f"in {spec!r}")
    return out


def _plot_path(path) -> str | None:
    if path is None:
        return None
    if not isinstance(path, str) or Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--plot must be a file name ending in "
                         f"{', '.join(PLOT_SUFFIXES)}, got {path!r}")
    if not Path(path).resolve().parent.is_dir():
        raise ValueError(f"--plot must be in an existing directory, got {path!r}")
    return path


# --------------------------------------------------------------------------- figure


def goodput_figure(curve: pd.DataFrame, *, target: float, replicas: int = 1,
                   fluid_bound: float | None = None, knee: float | None = None):
    """Goodput against the offered rate (both requests/s), as a matplotlib Figure.

    ``curve`` holds :func:`servingcap.planning.goodput_curve` rows (``rate_rps``,
    ``goodput_rps``, ``goodput_low``, ``goodput_high``, ``verdict``); rows with verdict
    ``overloaded`` are skipped. Draws the goodput with its interval bars and one marker
    per verdict, the line goodput = offered rate (every request meets the SLO), the
    line ``target`` x rate (the least goodput at which the target can hold), the knee
    (``knee``, req/s, dotted purple, :func:`servingcap.plots.mark_knee`) and the fleet's
    fluid bound (``fluid_bound``, req/s) when they fall inside the swept range. The
    house style of :mod:`servingcap.plots`; no pyplot state (safe in scripts)."""
    import matplotlib as mpl
    import numpy as np
    from matplotlib.figure import Figure

    from . import _check, plots

    if not isinstance(curve, pd.DataFrame):
        raise ValueError(f"curve must be a DataFrame from goodput_curve, "
                         f"got {type(curve).__name__}")
    need = ["rate_rps", "goodput_rps", "goodput_low", "goodput_high", "verdict"]
    missing = [c for c in need if c not in curve.columns]
    if missing:
        raise ValueError(f"curve is missing column(s) {missing}; has {list(curve.columns)}")
    target = _check.number("target", target)
    if not 0 < target <= 1:
        raise ValueError(f"target must be in (0, 1], got {target!r}")
    replicas = _check.whole("replicas", replicas)
    for name, value in (("fluid_bound", fluid_bound), ("knee", knee)):
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            _check.positive(name, value)
    rows = curve.loc[curve["verdict"] != "overloaded"]
    if rows.empty:
        raise ValueError("curve must have at least one simulated (not overloaded) rate")
    values = {}
    for column in ("rate_rps", "goodput_rps", "goodput_low", "goodput_high"):
        try:
            values[column] = rows[column].to_numpy(dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"curve {column} must be numbers, got "
                             f"{rows[column].tolist()!r}") from None
        bad = (np.isinf(values[column]) | (values[column] < 0)
               | (np.isnan(values[column]) if column in ("rate_rps", "goodput_rps") else False))
        if bad.any():
            raise ValueError(f"curve {column} must be finite numbers >= 0 (interval ends may be "
                             f"NaN), got {values[column].tolist()!r}")
    rates = values["rate_rps"]
    if (rates <= 0).any():
        raise ValueError(f"curve rate_rps must be > 0, got {rates.tolist()!r}")
    with mpl.rc_context(plots._STYLE):
        fig = Figure()
        ax = fig.add_subplot()
        top = float(rates.max())
        grid = np.array([0.0, top * 1.05])
        ax.plot(grid, grid, color=plots.COLORS["muted"], linewidth=1.0,
                label="goodput = offered rate")
        ax.plot(grid, target * grid, color=plots.COLORS["slo"], linestyle="--",
                linewidth=1.0, label=f"{target:.2%} x offered rate (target)")
        good, low, high = (values[c] for c in ("goodput_rps", "goodput_low", "goodput_high"))
        err = np.vstack([np.where(np.isfinite(low), good - low, 0.0),
                         np.where(np.isfinite(high), high - good, 0.0)])
        ax.errorbar(rates, good, yerr=np.clip(err, 0, None), color=plots.COLORS["sim"],
                    linewidth=1.2, capsize=3, zorder=2)
        for verdict, (marker, color, label) in VERDICT_STYLE.items():
            pick = (rows["verdict"] == verdict).to_numpy()
            if pick.any():
                face = "white" if color is None else plots.COLORS[color]
                ax.scatter(rates[pick], good[pick], marker=marker, s=50, zorder=3,
                           facecolors=face, edgecolors=plots.COLORS["sim"], label=label)
        known = set(VERDICT_STYLE) | {"overloaded"}
        other = ~rows["verdict"].isin(known).to_numpy()
        if other.any():
            ax.scatter(rates[other], good[other], marker="s", s=40, zorder=3,
                       color=plots.COLORS["muted"], label="undecided")
        if knee is not None and math.isfinite(knee) and knee <= top * 1.05:
            plots.mark_knee(ax, knee, label=f"knee {knee:.4g} req/s (plan here)")
        if fluid_bound is not None and math.isfinite(fluid_bound) and fluid_bound <= top * 1.05:
            ax.axvline(fluid_bound, color=plots.COLORS["muted"], linestyle="-.",
                       linewidth=1.2, label=f"fluid bound {fluid_bound:.4g} req/s")
        ax.set_xlim(0, top * 1.05)
        ax.set_ylim(0, None)
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("goodput (requests/s meeting the SLO)")
        fleet = f"{replicas} replica" if replicas == 1 else f"{replicas} replicas"
        ax.set_title(f"Goodput vs offered rate, {fleet}")
        ax.legend(loc="upper left")
        fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- run


def _options(args):
    """(sweep settings, rates, replicas, plot path) from the parsed command line."""
    from . import __main__ as cli

    merged = cli._merge(args, extra=("rates", "replicas", "plot"))
    for name in _PLAN_ONLY:
        if name in merged:       # only a config file can set them: the parser has none
            raise cli.InputError(f"--config: key {name.replace('_', '-')!r} is a plan "
                                 "option; sweep takes rates and replicas")
    if "rates" not in merged:
        raise cli.InputError("--rates is required: the arrival rates to simulate, req/s, "
                             "e.g. --rates 10,20,30 or --rates 10:40:5")
    try:
        rates = parse_rates(merged.pop("rates"))
        plot = _plot_path(merged.pop("plot", None))
    except ValueError as exc:
        raise cli.InputError(str(exc)) from None
    replicas = cli._whole("replicas", merged.pop("replicas", 1))
    if replicas > cli.DEFAULTS["max_replicas"]:
        raise cli._bad("replicas", replicas, f"must be <= {cli.DEFAULTS['max_replicas']:,}")
    # plan's checks at the first rate; the fleet search's limit does not apply
    merged.update(rate=rates[0], max_replicas=sys.maxsize)
    try:
        s = cli.settings(merged)
    except cli.InputError as exc:
        raise cli.InputError(re.sub(r"--rate\b", "--rates", str(exc))) from None
    return s, rates, replicas, plot


def _too_long(s, rates: list[float]) -> None:
    """Refuse, before simulating, a rate whose replication exceeds the run limit."""
    from . import __main__ as cli
    from .planning import MAX_REQUESTS_PER_RUN, hold_time

    hold = hold_time(s.requests, s.replica)
    for rate in rates:
        per_run = math.ceil(rate * s.holds * hold)
        if per_run > MAX_REQUESTS_PER_RUN:
            raise cli.InputError(f"--rates {rate:g} req/s over --holds {s.holds:g} hold "
                                 f"times of {hold:.4g} s needs {per_run:,} requests per "
                                 f"replication, above the {MAX_REQUESTS_PER_RUN:,} this "
                                 "command simulates; lower --holds or the rates")


def _table(s, rates, replicas, bound, progress) -> pd.DataFrame:
    """One row per rate: goodput_curve's row, or an 'overloaded' row not simulated."""
    from .planning import CURVE_COLUMNS, goodput_curve

    simulated = [r for r in rates if r < bound]
    executor, close = _executor(s)
    try:
        curve = goodput_curve(s.requests, s.replica, simulated, replicas=replicas,
                              router=s.router, policy=s.policy, limits=s.limits,
                              target=s.target, seed=s.seed, confidence=s.confidence,
                              budget=s.budget, delta=s.delta, holds=s.holds,
                              executor=executor, progress=progress)
    finally:
        close()
    over = pd.DataFrame([{c: math.nan for c in CURVE_COLUMNS} | {
        "rate_rps": r, "verdict": "overloaded", "meets": False, "replications": 0,
        "needed": 0} for r in rates if r >= bound], columns=list(CURVE_COLUMNS))
    parts = [p for p in (curve, over) if len(p)]
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    table = table.sort_values("rate_rps", ignore_index=True)
    return table.assign(replicas=replicas)


def _executor(s):
    from . import __main__ as cli

    return cli._executor(s)


def _interval(value: float, low: float, high: float, digits: int = 2) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{value:.{digits}f} (no interval)"
    return f"{value:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _row(r) -> str:
    from . import __main__ as cli

    rate = f"{r['rate_rps']:g} req/s"
    if r["verdict"] == "overloaded":
        return f"   {rate:>11}  {'(not simulated)':>24}  overloaded"
    return (f"   {rate:>11}  {cli._attainment(r):>24}  {r['verdict']:<10}  "
            f"{_interval(r['goodput_rps'], r['goodput_low'], r['goodput_high']):>24}  "
            f"{cli._ms(r['ttft_p99_s']):>8}  {cli._ms_or_na(r['tpot_p99_s']):>8}  "
            f"{int(r['replications']):>4}")


def _knee_lines(s, table: pd.DataFrame):
    """(lines, knee rate or None, CurveKnee) read off the simulated rows."""
    from .planning import curve_knee

    sim = table.loc[table["verdict"] != "overloaded"]
    knee = curve_knee(sim, s.target)
    first, last = sim["rate_rps"].iloc[0], sim["rate_rps"].iloc[-1]
    if knee.slo_rate is None:
        where = (f"beyond the grid: the attainment estimate stays at or above "
                 f"{s.target:.2%} up to {last:g} req/s; sweep higher rates to find it")
        rate = None
    elif math.isnan(knee.slo_rate):
        where = (f"below the grid: the attainment estimate is already under {s.target:.2%} "
                 f"at {first:g} req/s; sweep lower rates to find it")
        rate = None
    else:
        rate = knee.slo_rate
        where = (f"{rate:.4g} req/s, where the attainment estimate crosses the "
                 f"{s.target:.2%} target (planning.curve_knee, interpolated between rates)")
    meets = sim.loc[sim["verdict"] == "meets", "rate_rps"]
    shown = (f"largest rate shown to meet by the sequential check: {meets.max():g} req/s"
             if len(meets) else "no rate shown to meet by the sequential check")
    lines = [f"Knee: {where}; {shown}",
             f"Goodput peak: {knee.peak_goodput:.4g} req/s of goodput when offered "
             f"{knee.peak_rate:g} req/s",
             "Plan at the knee, not at the peak: past the knee goodput may still rise, but "
             "only because more requests are offered while a growing share of them misses "
             "the SLO (chapter Goodput)."]
    return lines, rate, knee


def _partial(rows: list[dict], total: int) -> str:
    """The rows finished before a stop (Ctrl-C), under the table's header."""
    lines = [f"Stopped: {len(rows)} of {total} rates simulated",
             f"   {'rate':>11}  {'attainment (CI)':>24}  {'verdict':<10}  "
             f"{'goodput req/s (CI)':>24}  {'TTFT p99':>8}  {'TPOT p99':>8}  {'reps':>4}"]
    return "\n".join(lines + [_row(row) for row in rows])


def render(s, table: pd.DataFrame, replicas: int, bound: float, hold_s: float) -> str:
    """The report printed by ``sweep`` (plain text, one number per claim)."""
    from . import __main__ as cli

    r = s.replica
    rates = table["rate_rps"]
    fleet = cli._replicas(replicas)
    over = table.loc[table["verdict"] == "overloaded", "rate_rps"]
    lines = [
        (f"Sweep of {fleet} over {len(table)} rates from {rates.iloc[0]:g} to "
         f"{rates.iloc[-1]:g} req/s ({s.workload})" if len(table) > 1 else
         f"Sweep of {fleet} at one rate, {rates.iloc[0]:g} req/s ({s.workload})"),
        f"Replica: {r.max_batch} slots, {cli._steps_text(r)}; router {s.router}, "
        f"policy {s.policy}",
        f"Cost model: {s.cost}",
        *([f"Memory: {s.memory}"] if s.memory else []),
        *([f"Prefix cache: {s.prefix}"] if s.prefix else []),
        f"SLO: TTFT <= {cli._ms(s.limits['ttft_s'])} and TPOT <= {cli._ms(s.limits['tpot_s'])}"
        f" for >= {s.target:.1%} of requests",
        f"Statistics: {cli._reps(s.budget).replace('per point', 'per rate')} (the same "
        f"traffic at every rate), each {s.holds:g} hold times (T_hold = {hold_s:.3g} s) or "
        "2,000 requests, warm-up cut by MSER-5; meets/misses decided by the sequential "
        f"check as in plan (error <= {1 - s.confidence:.0%} outside {s.target:.2%} +- "
        f"{100 * s.delta:.2g} points); 'open': not decided within --budget, never a miss; "
        f"intervals {s.confidence:.0%}",
        f"Fluid throughput bound: {bound:.4g} req/s for {fleet} (rates at or above it are "
        "overloaded and not simulated)",
        "",
        f"   {'rate':>11}  {'attainment (CI)':>24}  {'verdict':<10}  "
        f"{'goodput req/s (CI)':>24}  {'TTFT p99':>8}  {'TPOT p99':>8}  {'reps':>4}",
        *(_row(row) for _, row in table.iterrows()),
        "",
    ]
    lines += _knee_lines(s, table)[0]
    if len(over):
        lines.append(f"Overloaded, not simulated: {', '.join(f'{x:g}' for x in over)} req/s "
                     f"(at or above the fluid bound {bound:.4g} req/s)")
    return "\n".join(lines)


def _where(knee) -> str:
    """Where the knee lies relative to the swept rates, for the JSON output."""
    if knee is None or knee.slo_rate is None:
        return "above the grid"
    return "below the grid" if math.isnan(knee.slo_rate) else "on the grid"


def write_output(s, table: pd.DataFrame, replicas: int, bound: float, knee) -> None:
    """Write the sweep to ``s.output``: JSON (settings, knee, peak, one record per rate,
    NaN as null) or CSV (one row per rate)."""
    import json

    from . import __main__ as cli
    from .planning import _plain

    path = Path(s.output)
    if path.suffix.lower() == ".json":
        data = {"settings": {"replicas": replicas, "rates_rps": table["rate_rps"].tolist(),
                             **cli._settings_dict(s)},
                "fluid_bound_rps": bound,
                "knee_rps": None if knee is None else knee.slo_rate,
                "knee_where": _where(knee),
                "peak_rate_rps": None if knee is None else knee.peak_rate,
                "peak_goodput_rps": None if knee is None else knee.peak_goodput,
                "points": table.to_dict("records")}
        path.write_text(json.dumps(_plain(data), indent=1) + "\n")
        return
    table.to_csv(path, index=False)


def main(args: argparse.Namespace) -> int:
    """Run ``sweep`` for parsed arguments; exit status 0, 2 (bad input) or 128 + signal."""
    from . import __main__ as cli
    from .planning import fluid_rate, hold_time

    name = f"{cli.PROG} sweep"
    try:
        s, rates, replicas, plot = _options(args)
        _too_long(s, rates)
        bound = fluid_rate(s.requests, s.replica, replicas)
        if rates[0] >= bound:
            raise cli.InputError(f"--rates: every rate is at or above the fluid throughput "
                                 f"bound of {cli._replicas(replicas)}, {bound:.4g} req/s "
                                 "(overloaded, nothing to simulate); lower the rates or "
                                 "raise --replicas")
    except (cli.InputError, ValueError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    bar = cli._Progress(s.progress)
    if bar.bar is not None:
        bar.bar.total = sum(r < bound for r in rates)
    done: list[dict] = []

    def progress(row: dict) -> None:
        done.append(row)
        bar({**row, "replicas": replicas})

    try:
        with cli._stopped_by_signals():
            table = _table(s, rates, replicas, bound, progress)
    except cli._Stopped as stop:
        bar.close()
        print(_partial(done, len(rates)), flush=True)
        print(f"{name}: stopped by {stop.name} after {len(done)} of {len(rates)} rates "
              "(the rows printed are complete points); its pool workers were stopped too",
              file=sys.stderr)
        return 128 + stop.signum
    except ValueError as exc:
        bar.close()
        message = str(exc).replace("replicas=", "--replicas ")
        print(f"{name}: error: {message}", file=sys.stderr)
        return 2
    bar.close()
    print(render(s, table, replicas, bound, hold_time(s.requests, s.replica)))
    _, knee_rate, knee = _knee_lines(s, table)
    for option, path, write in (
            ("--output", s.output, lambda: write_output(s, table, replicas, bound, knee)),
            ("--plot", plot, lambda: goodput_figure(
                table, target=s.target, replicas=replicas, fluid_bound=bound,
                knee=knee_rate).savefig(plot))):
        if path is None:
            continue
        try:
            write()
        except OSError as exc:
            print(f"{name}: error: {option} {path!r} could not be written ({exc})",
                  file=sys.stderr)
            return 2
    return 0
