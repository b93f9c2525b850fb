"""Prefill/decode disaggregation: two replica pools joined by a KV-cache transfer.

DistServe, Splitwise and Mooncake run the two phases of a request on different
replicas. A *prefill pool* reads the prompt and produces the first token; the prompt's
KV cache is then copied over a link to a *decode pool*, which emits the remaining
tokens. Long prompts then never share a forward pass with somebody else's decode step,
so they cannot stall it; the price is a second pool to size and the KV transfer.

The model here is built from two runs of :func:`servingcap.serving.simulate`:

1. **Prefill stage.** Every request is replayed on the prefill pool with
   ``output_tokens = 1``: its first token is emitted when its prefill ends, and TTFT is
   measured there (arrival to first token).
2. **Transfer.** The prompt's KV cache (``prompt_tokens * kv_bytes_per_token`` bytes)
   crosses a link of ``link_bytes_per_s`` after a fixed ``link_latency_s``. Each transfer
   gets the whole link (no contention between transfers): an optimistic assumption
   when many long prompts leave the prefill pool at once.
3. **Decode stage.** The request arrives at the decode pool when its transfer ends,
   with its prompt already cached, and needs ``output_tokens - 1`` more tokens. Its
   prompt costs no prefill time there: a step's duration is the decode replica's cost
   of a pure decode step in which the newcomers count as decoding sequences (their
   context is the transferred prompt). The newcomer's first decode-pool token is the
   request's second token.

Units: seconds, tokens, bytes, bytes/s. Every request given appears exactly once in
the output, with the outcome of the stage where it stopped.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from . import _check
from .routers import DEFAULT_ROUTER
from .serving import OUTCOMES, Replica, StepDetail, simulate

__all__ = ["kv_bytes_per_token", "kv_transfer_s", "decode_pool_replica", "smallest_pools",
           "PoolsResult", "pool_fluid_bounds",
           "simulate_disaggregated"]


MAX_TRANSFER_S = 1e6
"""Longest KV transfer :func:`simulate_disaggregated` accepts (s, about 11 days): a
longer one is a typo in the link's numbers, and at clock readings far past it a step's
duration would be lost in the floating-point time (the run would never end)."""

MAX_POOL_REPLICAS = 10**6
"""Largest pool :func:`simulate_disaggregated` accepts: far past any fleet (the engine
keeps state for every replica, so a typo such as 10**12 would never finish)."""


@_check.guarded
def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int,
                       bytes_per_value: float = 2.0) -> float:
    """KV-cache size of one token (bytes): ``2 * layers * kv_heads * head_dim * bytes_per_value``.

    The factor 2 is one key and one value vector per layer and KV head. Example: a
    Llama-3-8B-shaped model (32 layers, 8 KV heads of dimension 128, 16-bit values)
    holds 2 x 32 x 8 x 128 x 2 = 131,072 bytes (128 KiB) per token.
    """
    n_layers = _check.whole("layers", layers)
    heads = _check.whole("kv_heads", kv_heads)
    dim = _check.whole("head_dim", head_dim)
    width = _check.positive("bytes_per_value", bytes_per_value)
    return 2.0 * n_layers * heads * dim * width


@_check.guarded
def kv_transfer_s(prompt_tokens, kv_bytes_per_token: float, link_bytes_per_s: float,
                  link_latency_s: float = 0.0):
    """Time (s) to move a prompt's KV cache between replicas.

    ``link_latency_s + prompt_tokens * kv_bytes_per_token / link_bytes_per_s``.

    Parameters
    ----------
    prompt_tokens : float or array of float
        Tokens whose KV cache moves (tokens), >= 0.
    kv_bytes_per_token : float
        Bytes of KV cache per token (bytes), >= 0; see :func:`kv_bytes_per_token`.
    link_bytes_per_s : float
        Link bandwidth (bytes/s), > 0; may be ``math.inf`` (a free transfer).
    link_latency_s : float
        Fixed setup time per transfer (s), >= 0.

    Returns a float for a scalar ``prompt_tokens``, else an array (s). Example: 4,000
    tokens x 131,072 bytes over 12.5 GB/s (100 Gb/s) take 0.042 s.
    """
    width = _check.nonnegative("kv_bytes_per_token", kv_bytes_per_token)
    if isinstance(link_bytes_per_s, (int, float)) and link_bytes_per_s == math.inf:
        bandwidth = math.inf
    else:
        bandwidth = _check.positive("link_bytes_per_s", link_bytes_per_s)
    latency = _check.nonnegative("link_latency_s", link_latency_s)
    scalar = np.ndim(prompt_tokens) == 0
    tokens = _check.array("prompt_tokens", np.atleast_1d(prompt_tokens), nonnegative_values=True)
    seconds = latency + (tokens * width / bandwidth if bandwidth < math.inf else 0.0 * tokens)
    return float(seconds[0]) if scalar else seconds


class _DecodePoolStep:
    """Step cost of a decode pool: ``replica``'s cost of the pure decode step
    (:func:`decode_pool_replica`). A class, so pools and Dask can pickle it."""

    wants_detail = True

    def __init__(self, replica: Replica):
        self.replica = replica

    def __call__(self, detail: StepDetail) -> float:
        context = 1 + np.concatenate([detail.decode_context,
                                      detail.prefill_cached + detail.prefill_chunks])
        pure_decode = StepDetail(prefill_chunks=np.zeros(0, dtype=np.int64),
                                 prefill_cached=np.zeros(0, dtype=np.int64),
                                 decode_context=context)
        return self.replica.cost(pure_decode)


class _BoundedDecodePoolStep(_DecodePoolStep):
    """A decode-pool step whose model states its own fluid bound (the base replica's
    built-in cost, or a ``step_time`` with ``fluid_work_s`` such as the roofline)."""

    def fluid_work_s(self, prompt_tokens, output_tokens, max_batch: int,
                     uncached_tokens=None) -> float:
        """Lower bound on the decode pool's time per request (s), read by
        :func:`servingcap.planning.fluid_rate`.

        A decode-pool request (``output_tokens`` = the request's output minus the one
        the prefill pool emitted) runs ``output_tokens`` pure decode steps of the base
        model, the newcomer's first included, at contexts of at least its prompt, with
        nothing to prefill. That is the base model's bound for a request of
        ``output_tokens + 1`` tokens (``D = N - 1`` decodes) and no uncached prompt:
        :meth:`servingcap.roofline.Roofline.fluid_work_s` (linear ops: ``D`` tokens'
        compute, ``D / B`` weight reads; decode attention over at least the prompt), or
        :meth:`servingcap.serving.Replica.full_batch_work_s` of an empty prompt for the
        built-in cost. ``uncached_tokens`` is ignored: nothing is prefilled here.
        """
        with _check.naming("output_tokens"):
            n = np.asarray(output_tokens, dtype=float).ravel() + 1.0
        base = self.replica
        if base.step_time is None:
            return float(np.mean(base.full_batch_work_s(np.zeros_like(n), n)))
        with _check.naming("prompt_tokens"):
            p = np.asarray(prompt_tokens, dtype=float).ravel()
        return float(base.step_time.fluid_work_s(p, n, max_batch, np.zeros_like(p)))


def decode_pool_replica(replica: Replica) -> Replica:
    """The decode-pool version of ``replica``: prompts arrive already in the KV cache.

    A newcomer's prompt costs no prefill time; in its first step it decodes like every
    other sequence. The step time is ``replica``'s own cost of that pure decode step
    (its ``decode_step_s`` curve, or its ``step_time``), evaluated on a step detail in
    which every sequence's context counts the whole request so far, as it would on a
    colocated replica: prompt + first token for a newcomer, + one per token the decode
    pool has emitted since (the decode pool's own run counts from zero, hence the +1).
    Chunking and the prefix cache are switched off (there is no prefill left to chunk
    or reuse), and the pool runs ``mode="combined"`` (every step is a decode step).

    When ``replica``'s cost states a fluid bound (the built-in cost, or a ``step_time``
    with ``fluid_work_s`` such as :class:`servingcap.roofline.Roofline`), the decode
    pool's step states one too (``fluid_work_s``: the base bound of the decode steps
    alone), so :func:`servingcap.planning.fluid_rate` of the decode pool is a proven
    upper bound rather than an estimate.
    """
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")
    bounded = replica.step_time is None or callable(
        getattr(replica.step_time, "fluid_work_s", None))
    step_time = (_BoundedDecodePoolStep if bounded else _DecodePoolStep)(replica)
    return dataclasses.replace(replica, step_time=step_time, chunk_tokens=None,
                               prefix_cache_blocks=0, mode="combined", max_batched_tokens=None)


def simulate_disaggregated(requests: pd.DataFrame, prefill_replica: Replica | None = None,
                           decode_replica: Replica | None = None, *,
                           prefill_replicas: int = 1, decode_replicas: int = 1,
                           kv_bytes_per_token: float = 0.0,
                           link_bytes_per_s: float = math.inf,
                           link_latency_s: float = 0.0,
                           router: str = DEFAULT_ROUTER, policy: str = "fcfs",
                           seed=None, until_s: float | None = None) -> pd.DataFrame:
    """Replay ``requests`` through a prefill pool, a KV transfer and a decode pool.

    Parameters
    ----------
    requests : pandas.DataFrame
        One row per request: ``arrival_s`` (s), ``prompt_tokens``, ``output_tokens``
        (tokens), plus the optional columns :func:`servingcap.serving.simulate` uses.
    prefill_replica, decode_replica : Replica
        The replica model of each pool (default: the book's locked replica). The
        prefill pool runs each prompt as configured (``chunk_tokens`` applies there);
        the decode pool is turned into :func:`decode_pool_replica` of its model.
    prefill_replicas, decode_replicas : int
        Replicas in each pool, >= 1.
    kv_bytes_per_token : float
        KV-cache bytes per prompt token moved between the pools (bytes), >= 0.
    link_bytes_per_s : float
        Bandwidth of the prefill-to-decode link (bytes/s), > 0; ``inf`` for free.
    link_latency_s : float
        Fixed time added to every transfer (s), >= 0.
    router, policy, seed
        As in :func:`servingcap.serving.simulate`, used in both pools.
    until_s : float, optional
        Stop both pools at this time (s); requests not finished are ``unfinished``.

    Returns
    -------
    pandas.DataFrame
        One row per request, in input order, with the columns of
        :func:`servingcap.serving.simulate` (``replica`` is the decode replica, -1 when
        the request never reached the decode pool; ``admitted_s`` is the admission to
        the prefill pool) plus ``prefill_replica``, ``transfer_s`` (s) and
        ``decode_arrival_s`` (s; NaN when the request did not go to the decode pool).
        ``ttft_s`` ends at the prefill pool's first token; ``tpot_s`` and ``max_gap_s``
        include the transfer and the decode pool's queue in the gap between the first
        and the second token.
    """
    # a prefill pool runs whole prompts (DistServe's prefill instances batch them whole):
    # there are no decodes to protect, so nothing to chunk for
    prefill_replica = Replica(mode="combined") if prefill_replica is None else prefill_replica
    decode_replica = Replica() if decode_replica is None else decode_replica
    for name, value in (("prefill_replica", prefill_replica), ("decode_replica", decode_replica)):
        if not isinstance(value, Replica):
            raise ValueError(f"{name} must be a servingcap.serving.Replica, got {value!r}")
    n_pre = _check.whole("prefill_replicas", prefill_replicas)
    n_dec = _check.whole("decode_replicas", decode_replicas)
    for name, count in (("prefill_replicas", n_pre), ("decode_replicas", n_dec)):
        if count > MAX_POOL_REPLICAS:
            raise ValueError(f"{name} must be <= {MAX_POOL_REPLICAS:.0e} (the engine keeps "
                             f"state per replica), got {count!r}")
    requests = _check.requests(requests, minimum=0)
    _check.request_tokens(requests)
    output = _check.array("output_tokens", requests["output_tokens"].to_numpy(dtype=float))
    bad = (output < 1) | (output != np.round(output))
    if bad.any():
        i = int(bad.argmax())
        raise ValueError(f"output_tokens must be whole numbers >= 1, got {output[i]!r} at row {i}")
    output = output.astype(np.int64)
    kv_transfer_s(0, kv_bytes_per_token, link_bytes_per_s, link_latency_s)   # validates
    options = dict(router=router, policy=policy, seed=seed, until_s=until_s)

    # 1. prefill pool: one token each
    first_stage = requests.assign(output_tokens=1)
    pre = simulate(first_stage, prefill_replica, replicas=n_pre, **options)

    # 2. transfer the prompt's KV cache of every prefilled request that needs more tokens
    moves = (pre["outcome"] == "done").to_numpy() & (output > 1)
    transfer = np.full(len(requests), np.nan)
    transfer[moves] = kv_transfer_s(pre["prompt_tokens"].to_numpy(dtype=float)[moves],
                                    kv_bytes_per_token, link_bytes_per_s, link_latency_s)
    if moves.any() and not float(transfer[moves].max()) <= MAX_TRANSFER_S:
        raise ValueError(
            f"a KV transfer takes {float(transfer[moves].max()):.3g} s, more than "
            f"{MAX_TRANSFER_S:.0e} s: check kv_bytes_per_token={kv_bytes_per_token!r}, "
            f"link_bytes_per_s={link_bytes_per_s!r} and link_latency_s={link_latency_s!r}")
    decode_arrival = pre["first_token_s"].to_numpy() + transfer

    # 3. decode pool: the remaining output_tokens - 1 tokens, prompt already cached
    n = len(requests)
    arrival = pre["arrival_s"].to_numpy()
    first = pre["first_token_s"].to_numpy()
    outcome = pre["outcome"].astype(str).to_numpy().copy()
    replica = np.full(n, -1, dtype=np.int64)
    finish = pre["finish_s"].to_numpy().copy()
    tpot = np.full(n, np.nan)
    gap = np.full(n, np.nan)
    preemptions = pre["preemptions"].to_numpy().copy()
    if moves.any():
        second = requests.loc[moves].drop(columns=["hash_ids"], errors="ignore").assign(
            arrival_s=decode_arrival[moves], output_tokens=output[moves] - 1)
        dec = simulate(second, decode_pool_replica(decode_replica), replicas=n_dec, **options)
        rows = np.flatnonzero(moves)
        dec_first = dec["first_token_s"].to_numpy()
        dec_done = (dec["outcome"] == "done").to_numpy()
        replica[rows] = dec["replica"].to_numpy()
        outcome[rows] = dec["outcome"].astype(str).to_numpy()
        finish[rows] = dec["finish_s"].to_numpy()
        tpot[rows] = np.where(dec_done, (finish[rows] - first[rows]) / (output[rows] - 1), np.nan)
        # the gap before the second token holds the transfer and the decode-pool queue
        gap[rows] = np.where(np.isnan(dec_first), np.nan,
                             np.fmax(dec_first - first[rows], dec["max_gap_s"].to_numpy()))
        preemptions[rows] += dec["preemptions"].to_numpy()
    done = outcome == "done"
    return pd.DataFrame({
        "arrival_s": arrival,
        "prompt_tokens": pre["prompt_tokens"].to_numpy(),
        "output_tokens": output,
        "replica": replica,
        "admitted_s": pre["admitted_s"].to_numpy(),
        "first_token_s": first,
        "finish_s": finish,
        "ttft_s": pre["ttft_s"].to_numpy(),
        "tpot_s": tpot,
        "max_gap_s": gap,
        "e2e_s": np.where(done, finish - arrival, np.nan),
        "outcome": pd.Categorical(outcome, categories=list(OUTCOMES)),
        "preemptions": preemptions,
        "cached_tokens": pre["cached_tokens"].to_numpy(),
        "prefill_replica": pre["replica"].to_numpy(),
        "transfer_s": transfer,
        "decode_arrival_s": decode_arrival,
    }, index=requests.index)


# --------------------------------------------------------------------------- two-pool sizing


@dataclasses.dataclass(frozen=True)
class PoolsResult:
    """The smallest disaggregated fleet found by :func:`smallest_pools`."""

    prefill_replicas: int
    """Prefill-pool replicas of the answer (shown to meet with ``decode_replicas``)."""
    decode_replicas: int
    """Decode-pool replicas of the answer."""
    prefill_fluid_min: int
    """Fewest prefill replicas whose fluid bound exceeds the rate (never simulated below)."""
    decode_fluid_min: int
    """Fewest decode replicas whose fluid bound exceeds the decode pool's rate."""
    prefill_below: str
    """Verdict of one prefill replica fewer (decode pool as answered): ``misses``,
    ``open`` or ``fluid bound`` (below the prefill pool's fluid bound, not simulated)."""
    decode_below: str
    """Verdict of one decode replica fewer (prefill pool as answered), as above."""
    evaluations: pd.DataFrame = dataclasses.field(repr=False)
    """One row per simulated ``(prefill_replicas, decode_replicas)``, in the order tried:
    :func:`servingcap.fleet.replicated_attainment`'s columns plus ``ttft_miss`` (share of
    all simulated requests, warm-up included, without a first token or over the TTFT
    limit: the prefill pool's misses) and ``other_miss`` (with a first token but not
    finished, or over another limit: the decode pool's), which steer the search."""

    def row(self) -> pd.Series:
        """The answer's evaluation."""
        t = self.evaluations
        hit = t[(t["prefill_replicas"] == self.prefill_replicas)
                & (t["decode_replicas"] == self.decode_replicas)]
        return hit.iloc[-1]


def _pool_run(task) -> pd.DataFrame:
    """One replication of a disaggregated fleet (module level, so pools can run it)."""
    source, frame_seed, router_seed, n, rate, pre, dec, n_pre, n_dec, link, router, \
        policy = task
    frame = source.sample(rate, n, frame_seed)
    out = simulate_disaggregated(frame, pre, dec, prefill_replicas=n_pre,
                                 decode_replicas=n_dec, router=router, policy=policy,
                                 seed=router_seed, **link)
    return out[["arrival_s", "ttft_s", "tpot_s", "max_gap_s", "e2e_s", "outcome"]]


def _busy(ref: pd.DataFrame, prefill_replica: Replica, decode_replica: Replica,
          rate: float) -> tuple[float, float]:
    from . import planning

    more = ref["output_tokens"].to_numpy() > 1
    stages = ((prefill_replica, ref.assign(output_tokens=1), rate),
              (decode_pool_replica(decode_replica),
               ref.loc[more].assign(output_tokens=ref.loc[more, "output_tokens"] - 1),
               rate * float(more.mean())))
    with _check.overflow(f"rate={rate!r} req/s over a pool's fluid bound"):
        return tuple(0.0 if frame.empty else float(lam / planning._fluid(frame, pool, 1))
                     for pool, frame, lam in stages)


def pool_fluid_bounds(requests, prefill_replica: Replica, decode_replica: Replica,
                      rate: float) -> tuple[float, float]:
    """Busy replicas of each pool at ``rate`` (req/s) by the fluid bound: ``(rate /
    fluid_rate(prefill pool), rate' / fluid_rate(decode pool))``.

    The prefill pool carries every request with one output token; the decode pool
    (:func:`decode_pool_replica`) the rest of each output, at the rate ``rate'`` of the
    requests with more than one token (0.0 when there are none). Each is a proven
    bound for the roofline and the built-in cost (:func:`servingcap.planning.
    fluid_rate`): no pool of ``floor(busy)`` replicas or fewer carries the rate.
    ``requests`` is a request table or a :class:`servingcap.planning.PoissonWorkload`.
    """
    from . import planning

    for name, value in (("prefill_replica", prefill_replica), ("decode_replica", decode_replica)):
        if not isinstance(value, Replica):
            raise ValueError(f"{name} must be a servingcap.serving.Replica, got {value!r}")
    _, ref = planning._source(requests)
    return _busy(ref, prefill_replica, decode_replica, _check.positive("rate", rate))


def smallest_pools(requests, prefill_replica: Replica, decode_replica: Replica, rate: float,
                   *, kv_bytes_per_token: float = 0.0, link_bytes_per_s: float = math.inf,
                   link_latency_s: float = 0.0, router: str = DEFAULT_ROUTER,
                   policy: str = "fcfs", limits=None, target: float = 0.99, seed=0,
                   confidence: float = 0.95, budget: int = 16, delta: float = 0.0025,
                   holds: float = 20.0, min_requests: int = 2000,
                   max_replicas: int = 4096) -> PoolsResult:
    """The smallest prefill and decode pools found to meet the SLO at ``rate``.

    A **heuristic coordinate search** over the two pool sizes (the fewest GPUs is not
    guaranteed: the pools trade off only through the SLO, and sizes not on the search's
    path are never simulated):

    1. Each pool starts at its fluid bound's guess, ``ceil(a + 0.14 sqrt(a))`` for
       ``a = rate / fluid_rate`` (:data:`servingcap.planning.FLUID_GUESS_BETA`, as
       :func:`servingcap.planning.plan` starts): the prefill pool on the requests with
       one output token each, the decode pool (:func:`decode_pool_replica`, whose bound
       is proven for the roofline and the built-in cost) on the rest of each output at
       the rate of requests with more than one token. Sizes below either pool's fluid
       bound are overloaded: never simulated, and counted as misses.
    2. **Grow** until a size is shown to meet: the pool whose limit is missed more often
       gets one more replica -- TTFT misses (and requests never given a first token)
       are the prefill pool's (TTFT ends there), misses of every other limit (TPOT, the
       worst gap, end-to-end) and requests stopped after their first token the decode
       pool's; when both miss, the larger share of requests decides. A size that is
       ``open`` is grown the same way (it is not a miss, but not shown to meet either).
    3. **Shrink**: try one prefill replica fewer, then one decode replica fewer; move to
       the first that is shown to meet and repeat, until neither is. The answer's two
       neighbours below are then each ``misses``, ``open`` or under the fluid bound
       (``prefill_below``, ``decode_below``).

    Each size is decided as :func:`servingcap.planning.evaluate` decides one: replications
    of ``holds`` hold times of ``decode_replica`` (at least ``min_requests`` requests)
    on common random numbers across sizes, in looks of ``min(10, budget)`` then
    doubling up to ``budget``, each look judged by
    :func:`servingcap.fleet.replicated_attainment` (warm-up cut, Student-t interval,
    ``meets`` / ``misses`` / ``open`` with the indifference zone ``delta``, ``unstable``
    counted as not meeting). Replications run serially (the caller parallelizes over
    configurations).

    Parameters as :func:`simulate_disaggregated` (the pools' replicas and the link) and
    :func:`servingcap.planning.smallest_fleet` (``limits`` ... ``max_replicas``, which
    caps each pool). Raises ValueError when either pool's fluid bound needs more than
    ``max_replicas``, when no request meets at the first sizes tried (something more
    replicas cannot fix), or when no size up to ``max_replicas`` is shown to meet.
    """
    from . import fleet, planning, stats

    for name, value in (("prefill_replica", prefill_replica), ("decode_replica", decode_replica)):
        if not isinstance(value, Replica):
            raise ValueError(f"{name} must be a servingcap.serving.Replica, got {value!r}")
    link = {"kv_bytes_per_token": kv_bytes_per_token, "link_bytes_per_s": link_bytes_per_s,
            "link_latency_s": link_latency_s}
    kv_transfer_s(0, **link)                                     # validates the link
    lam = _check.positive("rate", rate)
    cap = _check.whole("max_replicas", max_replicas)
    design = planning._design(confidence, budget, holds, min_requests, seed, None, delta)
    setup = planning._setup(requests, decode_replica, router, policy, limits, target, design)
    lim = setup.limits
    source, ref = setup.source, setup.ref
    starts, floors = [], []
    for name, busy in zip(("prefill", "decode"),
                          _busy(ref, prefill_replica, decode_replica, lam), strict=True):
        if not busy < cap:
            raise ValueError(f"rate={lam:.4g} req/s keeps {busy:.4g} {name} replicas busy by "
                             f"the fluid bound, more than max_replicas={cap}")
        floors.append(math.floor(busy) + 1)
        starts.append(max(floors[-1], min(cap, math.ceil(
            busy + planning.FLUID_GUESS_BETA * math.sqrt(busy)))))
    n = planning._run_length(setup, lam)
    available = design.budget
    if isinstance(source, planning._Replay):
        available = min(available, source.blocks(n))
        n = min(n, len(source.frame))
    seeds = stats.replication_seeds(design.seed, design.budget)
    first = design.first(available)
    looks = stats.look_schedule(first, available) if first >= 2 else [available]
    rows: list[dict] = []
    seen: dict[tuple[int, int], dict] = {}

    def evaluate(n_pre: int, n_dec: int) -> dict:
        if n_pre < floors[0] or n_dec < floors[1]:
            return {"verdict": "fluid bound"}
        if (n_pre, n_dec) in seen:
            return seen[n_pre, n_dec]
        runs: list[pd.DataFrame] = []
        for want in looks:
            for i in range(len(runs), want):
                frame_seed = i if isinstance(source, planning._Replay) else seeds[i]
                router_seed = int(np.random.SeedSequence(
                    seeds[i].entropy, spawn_key=(*seeds[i].spawn_key, 3)).generate_state(1)[0])
                runs.append(_pool_run((source, frame_seed, router_seed, n, lam,
                                       prefill_replica, decode_replica, n_pre, n_dec, link,
                                       router, policy)))
            out = fleet.replicated_attainment(runs, lim, setup.target, design.confidence,
                                              delta=design.delta, first=first,
                                              cap=available)
            if out["verdict"] != "open":
                break
        everything = pd.concat(runs, ignore_index=True)
        ttft = everything["ttft_s"].to_numpy(dtype=float)
        emitted = ~np.isnan(ttft)                # the prefill pool gave a first token
        late = ~emitted | (ttft > lim.get("ttft_s", np.inf))
        other = emitted & (everything["outcome"] != "done").to_numpy()
        for column, limit in lim.items():
            if column != "ttft_s":
                other |= everything[column].to_numpy(dtype=float) > limit
        row = {"prefill_replicas": n_pre, "decode_replicas": n_dec, **out,
               "ttft_miss": float(late.mean()), "other_miss": float(other.mean())}
        rows.append(row)
        seen[n_pre, n_dec] = row
        return row

    size = list(starts)
    if evaluate(*size)["attainment_high"] == 0:
        raise ValueError(
            f"no request met the limits with prefill_replicas={size[0]} and decode_replicas="
            f"{size[1]}, at or above both fluid bounds, in any replication: more replicas "
            "will not help (a prompt longer than prefill_replica's token cap in "
            "prefill_first mode, for one, is rejected)")
    while evaluate(*size)["verdict"] != "meets":
        row = seen[tuple(size)]
        grow = 0 if row["ttft_miss"] >= row["other_miss"] else 1
        if size[grow] >= cap:
            grow = 1 - grow
        if size[grow] >= cap:
            raise ValueError(f"max_replicas={cap} replicas per pool still do not meet the "
                             f"target {setup.target!r} at {lam:.4g} req/s ({row['verdict']}, "
                             f"attainment {row['attainment']:.4g})")
        size[grow] += 1
    while True:
        for pool in (0, 1):
            fewer = list(size)
            fewer[pool] -= 1
            if evaluate(*fewer)["verdict"] == "meets":
                size = fewer
                break
        else:
            break
    below = []
    for pool in (0, 1):
        fewer = list(size)
        fewer[pool] -= 1
        said = evaluate(*fewer)["verdict"]
        below.append("misses" if said == "unstable" else said)
    return PoolsResult(prefill_replicas=size[0], decode_replicas=size[1],
                       prefill_fluid_min=floors[0], decode_fluid_min=floors[1],
                       prefill_below=below[0], decode_below=below[1],
                       evaluations=pd.DataFrame(rows))
