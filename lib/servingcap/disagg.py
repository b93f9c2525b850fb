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
from .serving import OUTCOMES, Replica, StepDetail, detailed, simulate

__all__ = ["kv_bytes_per_token", "kv_transfer_s", "decode_pool_replica",
           "simulate_disaggregated"]


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
    """
    if not isinstance(replica, Replica):
        raise ValueError(f"replica must be a servingcap.serving.Replica, got {replica!r}")

    @detailed
    def step_time(detail: StepDetail) -> float:
        context = 1 + np.concatenate([detail.decode_context,
                                      detail.prefill_cached + detail.prefill_chunks])
        pure_decode = StepDetail(prefill_chunks=np.zeros(0, dtype=np.int64),
                                 prefill_cached=np.zeros(0, dtype=np.int64),
                                 decode_context=context)
        return replica.cost(pure_decode)

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
