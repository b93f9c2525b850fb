"""Command line: ``python -m servingcap search``, the cost-optimal configuration search.

Traffic, SLO, fleet and statistics options are the ``plan`` command's own (their argparse
actions are copied from its parser, so the help and the validation match); the grid,
prices, cache and outputs are this command's. Bad input exits with status 2 and a
one-line message naming the option. The search itself is
:func:`servingcap.configsearch.search`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from . import __main__ as cli

PROG = f"{cli.PROG} search"

# plan options this command takes, by argparse group title
_PLAN_OPTIONS = {
    "traffic": ("rate", "requests", "prompt_tokens", "prompt_dist", "output_tokens",
                "output_dist", "trace"),
    "service-level objective": ("ttft_p99_ms", "tpot_p99_ms", "target"),
    "fleet": ("router", "policy", "spares", "max_replicas"),
    "simulation and statistics": ("budget", "confidence", "indifference", "holds", "seed",
                                  "workers", "scheduler", "progress"),
}
DEFAULT_CACHE = ".servingcap-cache"


def _confirm_default(name: str):
    """Default of a parameter of :func:`servingcap.configsearch.confirm`."""
    import inspect

    from .configsearch import confirm
    return inspect.signature(confirm).parameters[name].default


def _plan_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["plan"]


def build_parser() -> argparse.ArgumentParser:
    from .configsearch import DTYPES, TP_DEGREES
    from .roofline import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, gpu_table, model_names

    S = argparse.SUPPRESS
    p = cli._Parser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Find the cheapest serving configuration (GPU, tensor parallelism, weight dtype,\n"
            "scheduling mode and token budget, batch slots) that meets the SLO at --rate.\n\n"
            "Each configuration of the grid is checked for memory (weights, runtime reserve\n"
            "and --max-batch sequences of KV at the workload's mean context; refusals are\n"
            "listed with their reason), bounded below by the fluid throughput bound\n"
            "(configurations whose bound already costs more than the best found are pruned,\n"
            "not simulated), then sized by the plan command's decided search (smallest\n"
            "replica count shown to meet --target). Cost = (replicas + spares) x tp x the\n"
            "GPU's price; $ per million good output tokens = $/hour x 1e6 / (3600 x rate x\n"
            "attainment x mean output tokens). Ranked cheapest first (ties: lower p99 TTFT),\n"
            "with the Pareto front of cost vs p99 TTFT and whether the cheapest is separated\n"
            "from the runner-up. The step time is the roofline of --model-config on each GPU\n"
            "(efficiencies 0.62 / 0.55 measured by default; a mixture of experts fits by its\n"
            "total weights and steps by its active ones). --designs colocated,disaggregated\n"
            "adds prefill/decode pools of one GPU type (a TP degree per pool from --tp, the\n"
            "prefill batch cap from --budgets, decode slots from --max-batch), sized by a\n"
            "heuristic two-pool search and priced for both pools with --spares in each."),
        epilog=("Example:\n  python -m servingcap search --model-config Llama-3.1-8B --rate 30 "
                "\\\n      --gpus L40S,A100-80GB,H100-SXM --tp 1,2 --budgets 512,2048"))
    plan = _plan_parser()
    wanted = {name for names in _PLAN_OPTIONS.values() for name in names}
    groups = {}
    for group in plan._action_groups:
        if group.title not in _PLAN_OPTIONS:
            continue
        target = groups.setdefault(group.title, p.add_argument_group(group.title))
        for action in group._group_actions:
            if action.dest in wanted:
                target._add_action(action)
    g = p.add_argument_group("configurations searched")
    g.add_argument("--model-config", type=str, metavar="NAME|PATH", default=S,
                   help="the model: a Hugging Face config.json (dense, Mixtral or Qwen-MoE), or a shipped "
                        "one (" + ", ".join(model_names()) + ") (required)")
    g.add_argument("--gpus", type=str, metavar="LIST", default=S,
                   help="comma-separated GPU names (" + ", ".join(map(str, gpu_table()["gpu"]))
                        + "); default: every GPU with a price")
    g.add_argument("--tp", type=str, metavar="LIST", default=S,
                   help="tensor-parallel degrees, GPUs per replica (default "
                        + ",".join(map(str, TP_DEGREES)) + "; kept where the heads divide)")
    g.add_argument("--dtypes", type=str, metavar="LIST", default=S,
                   help="weight dtypes: " + ", ".join(DTYPES) + " (fp8 only on GPUs with fp8 "
                        "tensor cores; bf16 is the config's own dtype) (default bf16,fp8)")
    g.add_argument("--modes", type=str, metavar="LIST", default=S,
                   help="scheduling modes: mixed, combined, prefill_first (default mixed)")
    g.add_argument("--budgets", type=str, metavar="LIST", default=S,
                   help="token budgets per step, tokens (vLLM --max-num-batched-tokens) for "
                        "mixed and prefill_first (default 2048)")
    g.add_argument("--max-batch", type=str, metavar="LIST", default=S,
                   help="batch slots per replica, sequences (default 32)")
    g.add_argument("--designs", type=str, metavar="LIST", default=S,
                   help="fleet designs: colocated, disaggregated (prefill and decode pools of "
                        "one GPU type, each pool's TP from --tp) (default colocated)")
    g.add_argument("--kv-link-gbps", type=str, metavar="GB/S", default=S,
                   help="prefill-to-decode KV link of disaggregated designs, GB/s (default: "
                        "half the GPU's interconnect figure in data/gpus.csv per GPU of the "
                        "smaller replica: pools in one NVLink domain)")
    g.add_argument("--gpu-memory-utilization", type=str, metavar="FRACTION", default=S,
                   help="fraction of each GPU's memory the engine may use, in (0, 1] "
                        "(default 0.9)")
    g.add_argument("--flops-efficiency", type=str, metavar="FRACTION", default=S,
                   help=f"roofline: fraction of peak FLOP/s reached (default {FLOPS_EFFICIENCY}, "
                        "measured)")
    g.add_argument("--bandwidth-efficiency", type=str, metavar="FRACTION", default=S,
                   help="roofline: fraction of HBM bandwidth reached (default "
                        f"{BANDWIDTH_EFFICIENCY}, measured)")
    g.add_argument("--no-prune", dest="prune", action="store_const", const=False, default=S,
                   help="simulate every configuration that fits (no fluid-bound pruning)")
    g.add_argument("--wave", type=str, metavar="N", default=S,
                   help="configurations simulated between two pruning decisions (default 4; "
                        "fixed, so the answer does not depend on --workers or --scheduler)")
    g = p.add_argument_group("confirmation (screen, then confirm)")
    g.add_argument("--confirm", type=str, metavar="K", default=S,
                   help="after the search (the screen), size again at the confirmation's "
                        "statistics the K cheapest configurations, the others the screen "
                        f"did not separate from its cheapest (max(K, {_confirm_default('most')})"
                        " in all), then every configuration whose fluid bound undercuts the "
                        "confirmed answer; print that ranking and its "
                        "conclusion after the screen's (default: no confirmation)")
    g.add_argument("--confirm-budget", type=str, metavar="REPLICATIONS", default=S,
                   help="the confirmation's --budget: most replications per size "
                        f"(default {cli.DEFAULTS['budget']}, plan's)")
    g.add_argument("--confirm-holds", type=str, metavar="HOLD_TIMES", default=S,
                   help="the confirmation's --holds: simulated traffic per replication, "
                        "in hold times at the rate (at least as many requests as the "
                        f"screen's) (default {cli.DEFAULTS['holds']:g}, plan's)")
    g = p.add_argument_group("prices")
    g.add_argument("--prices", type=str, metavar="FILE", default=S,
                   help="price CSV (gpu, usd_per_gpu_hour, source, date); default: the "
                        "shipped data/gpu_prices.csv")
    g.add_argument("--price", type=str, metavar="GPU=USD", action="append", default=S,
                   help="override one GPU's price, US dollars per GPU-hour (repeatable)")
    g.add_argument("--price-tolerance", type=str, metavar="PERCENT", default=S,
                   help="cost gap below which the last line calls a configuration a tie on "
                        "price with the cheapest, percent (default 10, a convention)")
    g = p.add_argument_group("output")
    g.add_argument("--config", type=str, metavar="FILE.toml", default=S,
                   help="options from a TOML file: keys are the long option names (gpus = "
                        "\"L40S,H200\" or a list; price = { H100-SXM = 2.5 }; a lone "
                        "[search] table is read as the file); the command line wins")
    g.add_argument("--output", type=str, metavar="FILE.csv|FILE.json", default=S,
                   help="also write every configuration's row (.csv) or the whole result (.json)")
    g.add_argument("--plot", type=str, metavar="FILE.png", default=S,
                   help="plot cost per million good tokens vs p99 TTFT, Pareto front highlighted")
    g.add_argument("--cache-dir", type=str, metavar="DIR", default=S,
                   help="per-configuration result cache: an interrupted or repeated search "
                        f"reuses it (default {DEFAULT_CACHE})")
    g.add_argument("--no-cache", dest="cache", action="store_const", const=False, default=S,
                   help="neither read nor write the cache")
    return p


def _list(name: str, value, kind=str) -> list:
    items = [s.strip() for s in str(value).split(",")] if value is not None else []
    if not items or any(not s for s in items):
        raise cli._bad(name, value, "must be a comma-separated list with no empty item")
    if kind is int:
        return [cli._whole(name, s) for s in items]
    return items


def _path(name: str, value, suffixes) -> str:
    if not isinstance(value, str) or Path(value).suffix.lower() not in suffixes:
        raise cli._bad(name, value, f"must be a file name ending in {' or '.join(suffixes)}")
    if not Path(value).resolve().parent.is_dir():
        raise cli._bad(name, value, "must be in an existing directory")
    return value


#: Key of the merged options that says where ``price`` came from when not the command line.
PRICE_FROM = "price_from"


def with_config(given: dict, parser: argparse.ArgumentParser) -> dict:
    """The parsed options ``given``, under the options of their ``config`` TOML file
    (the command line wins). A list value is a comma-separated list; ``price`` may be a
    table of GPU names to US dollars per GPU-hour, or a list of ``GPU=USD``."""
    if "config" not in given:
        return given
    keys = tuple(a.dest for a in parser._actions if a.dest not in ("help", "config"))
    raw = cli._load_config(given["config"], keys, "search")
    for key, value in raw.items():
        if key == "price" and isinstance(value, dict):
            raw[key] = [f"{gpu}={usd}" for gpu, usd in value.items()]
        elif key == "price" and isinstance(value, str):
            raw[key] = [value]
        elif isinstance(value, list) and key != "price":
            raw[key] = ",".join(str(v) for v in value)
    merged = {**raw, **{k: v for k, v in given.items() if k != "config"}}
    if "price" in raw and "price" not in given:        # the report names the file
        merged[PRICE_FROM] = f"config file {given['config']}"
    return merged


def settings(given: dict) -> dict:
    """Validated keyword arguments of :func:`servingcap.configsearch.search`, plus
    ``output``, ``plot``, ``progress``, ``scheduler``, ``workers``, ``text`` (the
    workload in words) and ``confirm`` (None, or :func:`servingcap.configsearch.confirm`'s
    ``top``, ``most``, ``budget`` and ``holds``)."""
    from .configsearch import DESIGNS, DTYPES, load_model, parse_price, resolve_prices
    from .planning import PoissonWorkload
    from .roofline import gpu_table
    from .serving import MODES, ROUTERS

    o = {**cli.DEFAULTS, **given}
    if "model_config" not in given:
        raise cli.InputError("--model-config is required (a config.json or a shipped name)")
    try:
        load_model(given["model_config"])
    except ValueError as exc:
        raise cli.InputError(f"--model-config: {exc}") from None
    rate = cli._number("rate", o["rate"])
    for short, dist in (("prompt_tokens", "prompt_dist"), ("output_tokens", "output_dist")):
        if short in given and dist in given:
            raise cli.InputError(f"{cli._option(short)} and {cli._option(dist)} are "
                                 "alternatives; give one")
    if o["trace"] is not None:
        for name in ("prompt_tokens", "prompt_dist", "output_tokens", "output_dist"):
            if name in given:
                raise cli.InputError(f"{cli._option(name)} cannot be combined with --trace")
        n = None if o["requests"] is None else cli._whole("requests", o["requests"], minimum=2)
        requests, text = cli._trace_requests(o["trace"], n)
    else:
        if o["requests"] is not None:
            raise cli._bad("requests", o["requests"], "applies only to --trace")
        prompt = (cli.parse_dist("prompt_tokens", o["prompt_tokens"]) if "prompt_tokens" in given
                  else cli.parse_dist("prompt_dist", o["prompt_dist"]))
        output = (cli.parse_dist("output_tokens", o["output_tokens"]) if "output_tokens" in given
                  else cli.parse_dist("output_dist", o["output_dist"]))
        requests = PoissonWorkload(prompt, output)
        text = str(requests)
    known = {str(g).lower(): str(g) for g in gpu_table()["gpu"]}
    gpus = None
    if "gpus" in given:
        gpus = []
        for name in _list("gpus", given["gpus"]):
            if name.lower() not in known:
                raise cli._bad("gpus", given["gpus"], f"names the unknown GPU {name!r} "
                               f"(known: {', '.join(known.values())})")
            gpus.append(known[name.lower()])
    dtypes = _list("dtypes", given.get("dtypes", "bf16,fp8"))
    for d in dtypes:
        if d not in DTYPES:
            raise cli._bad("dtypes", given.get("dtypes"), f"must list {' / '.join(DTYPES)}")
    designs = _list("designs", given.get("designs", "colocated"))
    for d in designs:
        if d not in DESIGNS:
            raise cli._bad("designs", given.get("designs"), f"must list {' / '.join(DESIGNS)}")
    link = (None if "kv_link_gbps" not in given
            else cli._number("kv_link_gbps", given["kv_link_gbps"]))
    modes = _list("modes", given.get("modes", "mixed"))
    for m in modes:
        if m not in MODES:
            raise cli._bad("modes", given.get("modes"), f"must list modes from {', '.join(MODES)}")
    overrides = {}
    for text_price in given.get("price", []) or []:
        try:
            name, value = parse_price(text_price)
        except ValueError as exc:
            raise cli.InputError(f"--price: {exc}") from None
        if name.lower() not in known:
            raise cli._bad("price", text_price, f"names the unknown GPU {name!r}")
        overrides[known[name.lower()]] = value
    try:
        prices = resolve_prices(given.get("prices"), overrides,
                                given.get(PRICE_FROM, "command line"))
    except ValueError as exc:
        option = "--prices" if "prices" in given else "--price"
        raise cli.InputError(f"{option}: {exc}") from None
    priced = set(prices["gpu"])
    if gpus is not None:
        missing = [g for g in gpus if g not in priced]
        if missing:
            raise cli._bad("gpus", given["gpus"], f"includes {', '.join(missing)} without a "
                           "price (add it with --price GPU=USD or --prices FILE, or leave it out)")
    router = o["router"]
    if router not in ROUTERS:
        raise cli._bad("router", router, f"must be one of {', '.join(ROUTERS)}")
    policy = o["policy"]
    if policy not in ("fcfs", "sjf", "srpt"):
        raise cli._bad("policy", policy, "must be one of fcfs, sjf, srpt")
    confidence = cli._number("confidence", o["confidence"])
    if not 0.5 < confidence < 1:
        raise cli._bad("confidence", o["confidence"], "must be in (0.5, 1)")
    tolerance = cli._number("price_tolerance", given.get("price_tolerance", 10),
                            allow_zero=True)
    if tolerance >= 100:
        raise cli._bad("price_tolerance", given.get("price_tolerance"),
                       "must be < 100 percent")
    zone = cli._number("indifference", o["indifference"])
    if zone >= 50:
        raise cli._bad("indifference", o["indifference"], "must be < 50 percentage points")
    fractions = {}
    for name, default in (("gpu_memory_utilization", 0.9), ("flops_efficiency", None),
                          ("bandwidth_efficiency", None)):
        if name in given:
            fractions[name] = cli._number(name, given[name], upper=1.0)
        elif default is not None:
            fractions[name] = default
    workers = None if o["workers"] is None else cli._whole("workers", o["workers"])
    scheduler = o["scheduler"]
    if scheduler is not None and workers is not None:
        raise cli.InputError("--workers and --scheduler are alternatives; give one")
    confirm = None
    if "confirm" in given:
        top = cli._whole("confirm", given["confirm"])
        confirm = {"top": top, "most": max(top, _confirm_default("most")),
                   "budget": cli._whole("confirm_budget",
                                        given.get("confirm_budget", cli.DEFAULTS["budget"])),
                   "holds": cli._number("confirm_holds",
                                        given.get("confirm_holds", cli.DEFAULTS["holds"]))}
    else:
        for name in ("confirm_budget", "confirm_holds"):
            if name in given:
                raise cli._bad(name, given[name], "applies only to --confirm")
    cache = None
    if given.get("cache", True) is not False:
        cache = given.get("cache_dir", DEFAULT_CACHE)
        if not isinstance(cache, str) or not cache.strip():
            raise cli._bad("cache_dir", cache, "must be a directory path")
    elif "cache_dir" in given:
        raise cli.InputError("--cache-dir and --no-cache are alternatives; give one")
    return {
        "model": given["model_config"], "requests": requests, "rate": rate,
        "gpus": gpus, "tps": _list("tp", given["tp"], int) if "tp" in given else (1, 2, 4, 8),
        "dtypes": dtypes, "modes": modes, "designs": designs, "kv_link_gb_per_s": link,
        "budgets": _list("budgets", given["budgets"], int) if "budgets" in given else (2048,),
        "max_batches": (_list("max_batch", given["max_batch"], int)
                        if "max_batch" in given else (32,)),
        "prices": prices,
        "limits": {"ttft_s": cli._number("ttft_p99_ms", o["ttft_p99_ms"]) / 1000.0,
                   "tpot_s": cli._number("tpot_p99_ms", o["tpot_p99_ms"]) / 1000.0},
        "target": cli._number("target", o["target"], upper=1.0), "router": router,
        "policy": policy, "spares": cli._whole("spares", o["spares"], minimum=0),
        "seed": cli._whole("seed", o["seed"], minimum=0), "confidence": confidence,
        "budget": cli._whole("budget", o["budget"]), "delta": zone / 100.0,
        "holds": cli._number("holds", o["holds"]),
        "max_replicas": cli._whole("max_replicas", o["max_replicas"]),
        "prune": given.get("prune", True), "cache_dir": cache, **fractions,
        "price_tolerance": tolerance / 100.0,
        "wave": cli._whole("wave", given.get("wave", 4)),
        "output": None if "output" not in given else _path("output", given["output"],
                                                           (".csv", ".json")),
        "plot": None if "plot" not in given else _path("plot", given["plot"], (".png",)),
        "progress": cli._flag("progress", o["progress"]), "scheduler": scheduler,
        "workers": workers, "text": text, "confirm": confirm}


# --------------------------------------------------------------------------- output


def _ms(seconds) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{1000 * seconds:.0f} ms"


def _statistics(result) -> str:
    """A search's statistics in words: replications, hold times, requests."""
    c = result.context
    return (f"up to {c.budget} replications of {c.holds:g} hold times, at least "
            f"{c.min_requests:,} requests each")


def _header(width: int, extra: str = "") -> str:
    return (f"{'rank':>4}  {'configuration':<{width}} {'replicas':>9} {'GPUs':>5} "
            f"{'$/hour':>9} {'$/M good tokens (CI)':>22} {'attainment (CI)':>24} "
            f"{'TTFT p99':>9} {'TPOT p99':>9}  one size below{extra}")


def _ranking(ranked, width: int, screened: bool = False) -> list[str]:
    """One line per ranked row; with ``screened``, each row's screening result after it
    (a :func:`servingcap.configsearch.confirm` table)."""
    lines = []
    for row in ranked.itertuples():
        star = "*" if row.pareto else " "
        ci = f"{row.usd_per_mtok:.3g} ({row.usd_per_mtok_low:.3g}-{row.usd_per_mtok_high:.3g})"
        att = (f"{row.attainment:.2%} ({100 * row.attainment_low:.2f}-"
               f"{100 * row.attainment_high:.2f}%)")
        size = (f"{int(row.prefill_replicas)}P+{int(row.decode_replicas)}D"
                if row.design == "disaggregated" else f"{int(row.replicas)}")
        line = (f"{row.rank:>4}{star} {row.label:<{width}} {size:>4} + {int(row.spares)} "
                f"{int(row.gpus):>{max(5 - max(len(size) - 4, 0), 1)}} "
                f"{row.usd_per_hour:>9.2f} {ci:>22} {att:>24} "
                f"{_ms(row.ttft_p99_s):>9} {_ms(row.tpot_p99_s):>9}  {row.below_verdict}")
        if screened:
            line += ("  (screen: " + (f"#{int(row.screened_rank)} "
                                      f"{row.screened_usd_per_mtok:.3g})"
                                      if row.screened_status == "ranked"
                                      else f"{row.screened_status})"))
        lines.append(line)
    return lines


def _listed(t, prefix: str = "", where: str = "") -> list[str]:
    """The refused, pruned and failed rows of a table, with their reasons."""
    lines = []
    for status in ("refused", "pruned", "failed"):
        rows = t.loc[t["status"] == status]
        if len(rows):
            lines.append(f"{status.capitalize()}{where}:")
            lines += [f"  {r.label}: {r.reason.removeprefix(prefix)}"
                      for r in rows.itertuples()]
    return lines


def render(result, s: dict, confirmed=None) -> str:
    """The report printed by ``search`` (plain text); with ``confirmed`` (the
    :func:`servingcap.configsearch.confirm` of ``result``), the confirmation's ranking
    after the screen's, and both conclusions last, each naming its statistics."""
    from .configsearch import PRICE_TOLERANCE, conclusion

    t = result.table
    counts = {k: int((t["status"] == k).sum()) for k in ("ranked", "refused", "pruned",
                                                         "failed")}
    lim = s["limits"]
    labels = list(result.ranked["label"])
    if confirmed is not None:
        labels += list(confirmed.ranked["label"])
    width = max([34, *map(len, labels)])
    tolerance = s.get("price_tolerance", PRICE_TOLERANCE)
    lines = [
        f"Configuration search: {result.model} at {result.rate:g} req/s ({s['text']})",
        f"SLO: TTFT <= {_ms(lim['ttft_s'])} and TPOT <= {_ms(lim['tpot_s'])} for >= "
        f"{s['target']:.1%} of requests; {s['spares']} spare replica(s) paid for; router "
        f"{s['router']}, policy {s['policy']}",
        f"Statistics: each size decided as in `plan` (up to {s['budget']} replications of "
        f"{s['holds']:g} hold times, intervals {s['confidence']:.0%}, indifference "
        f"+-{100 * s['delta']:.2g} points)",
        "Prices used (US dollars per GPU-hour):",
        *[f"  {row.gpu:<10} {row.usd_per_gpu_hour:>7.3f}  {row.source} ({row.date or 'no date'})"
          for row in result.prices.itertuples()],
        f"Grid: {len(t)} configurations: {counts['ranked']} meet, {counts['refused']} refused, "
        f"{counts['pruned']} pruned, {counts['failed']} failed; {result.simulated} simulated, "
        f"{result.from_cache} read from the cache",
        "",
        _header(width),
        *_ranking(result.ranked, width),
        "   (* on the Pareto front of cost per million good tokens vs p99 TTFT)",
    ]
    split = t.loc[t["design"] == "disaggregated"]
    if len(split):
        links = ", ".join(f"{gpu} {gbps:g} GB/s" for gpu, gbps in split.groupby(
            "gpu", sort=False)["kv_link_gb_per_s"].first().dropna().items())
        lines.append(
            "   disagg: a prefill pool (P, whole prompts up to the budget) and a decode pool "
            "(D) of one GPU type, a spare in each; sized by a heuristic two-pool search "
            f"(one size below: each pool one fewer); KV link {links or 'n/a'}")
    lines += _listed(t, prefix="pruned: ")
    if confirmed is None:
        lines += ["", conclusion(t, tolerance)]
        return "\n".join(lines)
    c = confirmed.table
    done = c["status"].isin(["ranked", "failed"])
    again = c["status"] == "pruned"
    k = s["confirm"]
    lines += [
        "",
        f"Confirmation (--confirm {k['top']}): the screen's {k['top']} cheapest, the others "
        f"it did not separate from its cheapest ({k['most']} at most), then every "
        "configuration whose fluid bound is below the confirmed answer, sized again at "
        f"{_statistics(confirmed)}, starting at the screen's answer",
        f"Confirmed: {int(done.sum())} configuration(s): {int((c['status'] == 'ranked').sum())}"
        f" meet, {int((c['status'] == 'failed').sum())} failed; {int(again.sum())} pruned "
        f"at confirmation; {confirmed.simulated} simulated, {confirmed.from_cache} read "
        "from the cache",
        "",
        _header(width, "  (screen: rank $/M)"),
        *_ranking(confirmed.ranked, width, screened=True),
        "   (* on the Pareto front of the confirmed costs per million good tokens vs p99 "
        "TTFT)",
        *_listed(c.loc[c["status"] != "refused"], prefix="pruned at confirmation: ",
                 where=" at confirmation"),
        "",
        f"Screen ({_statistics(result)}): {conclusion(t, tolerance)}",
        f"Confirmed ({_statistics(confirmed)}): {conclusion(c, tolerance)}",
    ]
    return "\n".join(lines)


def plot(result, path: str, stage: str = "screen") -> None:
    """Cost per million good tokens vs p99 TTFT, every ranked configuration labelled, the
    Pareto front drawn as a line; ``stage`` ("screen" or "confirmed") goes in the title,
    so a reader knows which statistics the points carry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = result.ranked
    fig, ax = plt.subplots(figsize=(8, 5))
    other = ranked.loc[~ranked["pareto"]]
    front = ranked.loc[ranked["pareto"]].sort_values("usd_per_mtok")
    ax.scatter(other["usd_per_mtok"], 1000 * other["ttft_p99_s"], color="0.6",
               label="meets the SLO")
    ax.plot(front["usd_per_mtok"], 1000 * front["ttft_p99_s"], "o-", color="C3",
            label="Pareto front")
    for row in ranked.itertuples():
        ax.annotate(row.label, (row.usd_per_mtok, 1000 * row.ttft_p99_s), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("US dollars per million good output tokens")
    ax.set_ylabel("p99 TTFT (ms)")
    ax.set_title(f"{result.model} at {result.rate:g} req/s ({stage})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _stage_statistics(result) -> dict:
    c = result.context
    return {"budget": c.budget, "holds": c.holds, "min_requests": c.min_requests,
            "confidence": c.confidence, "delta": c.delta}


def write_output(result, path: str, price_tolerance: float | None = None,
                 confirmed=None) -> None:
    """Write ``result`` as ``.json`` (:meth:`SearchResult.to_dict`) or ``.csv`` (its table).
    With ``confirmed`` (its :func:`servingcap.configsearch.confirm`), every row gets a
    ``stage`` (``"screen"`` or ``"confirm"``): the CSV holds the screen's rows then the
    confirmation's, the JSON the confirmation under ``"confirmation"``, each stage with
    its ``"statistics"``."""
    import json

    import pandas as pd

    from .configsearch import PRICE_TOLERANCE

    if path.lower().endswith(".json"):
        tol = PRICE_TOLERANCE if price_tolerance is None else price_tolerance
        data = result.to_dict(tol)
        if confirmed is not None:
            second = confirmed.to_dict(tol)
            for stage, rows in (("screen", data["configurations"]),
                                ("confirm", second["configurations"])):
                for row in rows:
                    row["stage"] = stage
            data["statistics"] = _stage_statistics(result)
            data["confirmation"] = {
                "statistics": _stage_statistics(confirmed),
                **{k: second[k] for k in ("configurations", "conclusion", "simulated",
                                          "from_cache")}}
        Path(path).write_text(json.dumps(data, indent=1) + "\n")
    elif confirmed is None:
        result.table.to_csv(path, index=False)
    else:
        both = pd.concat([result.table.assign(stage="screen"),
                          confirmed.table.assign(stage="confirm")], ignore_index=True)
        both[["stage", *both.columns[:-1]]].to_csv(path, index=False)


# --------------------------------------------------------------------------- main


def _executor(s: dict):
    from . import parallel

    if s["scheduler"] is not None:
        try:
            from distributed import Client
        except ImportError:
            raise cli._bad("scheduler", s["scheduler"], "needs dask.distributed installed") from None
        try:
            client = Client(s["scheduler"], timeout=10)
        except (OSError, TimeoutError, ValueError) as exc:
            raise cli._bad("scheduler", s["scheduler"], f"could not be reached ({exc})") from None
        return client, client.close
    if s["workers"] == 1:
        return None, lambda: None
    if s["workers"] is None:
        return parallel.AUTO, lambda: None
    return parallel.local_pool(s["workers"]), lambda: None


class _Bar:
    """One tick per configuration (tqdm on stderr); ``total`` None when not known ahead
    (the confirmation's)."""

    def __init__(self, enabled: bool, total: int | None, desc: str = "configurations"):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit=" config",
                            file=sys.stderr, leave=False, dynamic_ncols=True)

    def __call__(self, row: dict) -> None:
        if self.bar is not None:
            what = (f"{int(row['replicas'])} replicas" if row["status"] == "ranked"
                    else row["status"])
            self.bar.set_postfix_str(f"{row['label']}: {what}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(argv=None) -> int:
    from .configsearch import confirm, grid, search

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        given = with_config(vars(args), parser)
        s = settings(given)
        executor, close = _executor(s)
    except (cli.InputError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    keys = ("model", "requests", "rate", "gpus", "tps", "dtypes", "modes", "budgets",
            "max_batches", "designs", "kv_link_gb_per_s", "prices", "limits", "target",
            "router", "policy", "spares",
            "seed", "confidence", "budget", "delta", "holds", "max_replicas", "prune", "wave",
            "cache_dir", "flops_efficiency", "bandwidth_efficiency",
            "gpu_memory_utilization")
    kwargs = {k: s[k] for k in keys if k in s}
    try:
        names = s["gpus"] if s["gpus"] is not None else list(s["prices"]["gpu"])
        total = len(grid(names, tps=s["tps"], dtypes=s["dtypes"], modes=s["modes"],
                         budgets=s["budgets"], max_batches=s["max_batches"],
                         designs=s["designs"]))
    except ValueError as exc:
        close()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if total == 0:
        close()
        print(f"{PROG}: error: --gpus/--dtypes leave an empty grid (fp8 needs a GPU with fp8 "
              "tensor cores)", file=sys.stderr)
        return 2
    bar = _Bar(s["progress"], total)
    confirmed = None
    try:
        with cli._stopped_by_signals():
            result = search(**kwargs, executor=executor, progress=bar)
            bar.close()
            if s["confirm"] is not None and not result.ranked.empty:
                bar = _Bar(s["progress"], None, desc="confirming")
                confirmed = confirm(result, **s["confirm"], wave=s["wave"],
                                    min_requests=result.context.min_requests,
                                    executor=executor, cache_dir=s["cache_dir"],
                                    progress=bar)
    except cli._Stopped as stop:
        bar.close()
        close()
        print(f"{PROG}: stopped by {stop.name}; finished configurations are in the cache "
              f"({s['cache_dir']}): run the same command again to resume", file=sys.stderr)
        return 128 + stop.signum
    except ValueError as exc:
        bar.close()
        close()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    bar.close()
    close()
    t = result.table
    if (t["status"] == "refused").all():
        print(f"{PROG}: error: --model-config {s['model']} fits no configuration of the grid "
              f"(first: {t['label'].iloc[0]}: {t['reason'].iloc[0]})", file=sys.stderr)
        return 2
    print(render(result, s, confirmed))
    if s["confirm"] is not None and confirmed is None:
        print(f"\nConfirmation (--confirm {s['confirm']['top']}): nothing to confirm, the "
              "screen ranks no configuration")
    try:
        if s["output"] is not None:
            write_output(result, s["output"], s["price_tolerance"], confirmed)
        if s["plot"] is not None:          # the confirmed answers when there are any
            plot(*((result, s["plot"]) if confirmed is None
                   else (confirmed, s["plot"], "confirmed")))
    except OSError as exc:
        print(f"{PROG}: error: could not write an output file ({exc})", file=sys.stderr)
        return 2
    return 0
