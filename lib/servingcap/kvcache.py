"""KV-cache memory arithmetic: what fits, what paging wastes, what a prefix cache saves.

A transformer keeps, for every token of every admitted sequence, one key and one value
vector per layer and per KV head. That state is the KV cache, and its size, not compute,
often decides how many sequences a replica can admit. This module holds the arithmetic:

* :class:`AttentionShape` -- a model's attention dimensions and its KV bytes per token;
* :func:`weights_bytes`, :func:`kv_budget_tokens`, :func:`sequences_that_fit` -- the
  memory left beside the weights, in tokens and in whole sequences;
* :func:`blocks_per_sequence`, :func:`internal_fragmentation`, :func:`contiguous_reserved`,
  :func:`paged_reserved`, :func:`used_fraction` -- contiguous max-length reservation
  versus paged allocation (the PagedAttention argument);
* :func:`prefix_hits`, :func:`hit_rate`, :func:`saved_prefill_tokens` -- prefix-cache
  reuse measured directly on a trace's block ids (``hash_ids``), with an unbounded or an
  LRU cache;
* :func:`sticky_routes`, :func:`replay_routed` -- a conversation-sticky router, so that
  a conversation's turns find their prefix in one replica's cache, and its replay.

Units: bytes, tokens, blocks (a block holds ``block_tokens`` tokens). Memory sizes are
plain byte counts; the chapters use decimal gigabytes (1 GB = 10**9 bytes).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _check
from .serving import simulate

__all__ = [
    "AttentionShape", "LLAMA_3_1_8B", "LLAMA_3_1_8B_PARAMS", "weights_bytes",
    "kv_budget_tokens", "sequences_that_fit", "blocks_per_sequence",
    "internal_fragmentation", "contiguous_reserved", "paged_reserved", "used_fraction",
    "prefix_hits", "hit_rate", "saved_prefill_tokens", "sticky_routes", "replay_routed",
]


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class AttentionShape:
    """The attention dimensions that set a model's KV-cache size.

    Parameters
    ----------
    layers : int
        Transformer layers (``num_hidden_layers`` in a Hugging Face ``config.json``).
    kv_heads : int
        Key/value heads per layer (``num_key_value_heads``; fewer than the query heads
        under grouped-query attention).
    head_dim : int
        Dimension of one head (``head_dim``, or ``hidden_size / num_attention_heads``).
    dtype_bytes : float
        Bytes per stored element: 2 for bf16/fp16, 1 for an fp8 KV cache.
    name : str
        A label for tables.
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: float = 2
    name: str = ""

    def __post_init__(self):
        _check.whole("layers", self.layers)
        _check.whole("kv_heads", self.kv_heads)
        _check.whole("head_dim", self.head_dim)
        _check.positive("dtype_bytes", self.dtype_bytes)

    @property
    def bytes_per_token(self) -> float:
        """KV-cache bytes per token: 2 (K and V) x layers x KV heads x head dim x bytes."""
        value = 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes
        return int(value) if float(value).is_integer() else float(value)

    def kv_bytes(self, tokens) -> float:
        """KV-cache bytes held by ``tokens`` tokens of context."""
        return _check.nonnegative("tokens", tokens) * self.bytes_per_token


LLAMA_3_1_8B = AttentionShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2,
                              name="Llama-3.1-8B (bf16)")
"""Llama-3.1-8B's published config.json: 32 layers, 8 KV heads (GQA), head dim 128, bf16."""

LLAMA_3_1_8B_PARAMS = 8.03e9
"""Llama-3.1-8B parameter count (8.03 billion), as published with the model."""


@_check.guarded
def weights_bytes(params: float, dtype_bytes: float = 2) -> float:
    """Bytes the weights occupy: parameter count x bytes per parameter."""
    return _check.positive("params", params) * _check.positive("dtype_bytes", dtype_bytes)


@_check.guarded
def kv_budget_tokens(memory_bytes: float, bytes_per_token: float, weights_bytes: float = 0.0,
                     reserve_bytes: float = 0.0) -> int:
    """Tokens of KV cache that fit beside the weights (whole tokens, rounded down).

    ``(memory_bytes - weights_bytes - reserve_bytes) / bytes_per_token``, where the reserve
    covers activations, the runtime and any other footprint (adapters, a safety margin).
    Raises ``ValueError`` when the weights and the reserve leave no room at all.
    """
    memory = _check.positive("memory_bytes", memory_bytes)
    per_token = _check.positive("bytes_per_token", bytes_per_token)
    weights = _check.nonnegative("weights_bytes", weights_bytes)
    reserve = _check.nonnegative("reserve_bytes", reserve_bytes)
    free = memory - weights - reserve
    if free <= 0:
        raise ValueError(
            f"memory_bytes={memory_bytes!r} leaves no KV room: weights_bytes={weights_bytes!r} "
            f"plus reserve_bytes={reserve_bytes!r} use {weights + reserve:.4g} bytes")
    return int(math.floor(free / per_token))


@_check.guarded
def sequences_that_fit(capacity_tokens: int, sequence_tokens: int, block_tokens: int = 1) -> int:
    """Whole sequences of ``sequence_tokens`` that fit in ``capacity_tokens``.

    With paging (``block_tokens`` > 1) capacity is counted in whole blocks and each
    sequence takes ``ceil(sequence_tokens / block_tokens)`` of them.
    """
    capacity = _check.whole("capacity_tokens", capacity_tokens, minimum=0)
    size = _check.whole("sequence_tokens", sequence_tokens)
    block = _check.whole("block_tokens", block_tokens)
    return (capacity // block) // (-(-size // block))


# --------------------------------------------------------------------------- paging


def _lengths(name: str, tokens) -> np.ndarray:
    if isinstance(tokens, (str, bytes)):
        raise ValueError(f"{name} must be token counts, got {tokens!r}")
    values = np.atleast_1d(_check.array(name, np.atleast_1d(tokens), nonnegative_values=True))
    bad = (values != np.round(values)) | (values > _check.MAX_TOKENS)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must be whole numbers of tokens <= {_check.MAX_TOKENS:.0e}, "
                         f"got {values[i]!r} at index {i}")
    return values.astype(np.int64)


@_check.guarded
def blocks_per_sequence(tokens, block_tokens: int = 16) -> np.ndarray:
    """Blocks a sequence of ``tokens`` tokens occupies under paging: ``ceil(tokens / B)``."""
    block = _check.whole("block_tokens", block_tokens)
    return -(-_lengths("tokens", tokens) // block)


@_check.guarded
def internal_fragmentation(tokens, block_tokens: int = 16) -> np.ndarray:
    """Tokens of slack in each sequence's last block: ``B * ceil(tokens / B) - tokens``.

    Between 0 and ``B - 1`` per sequence; about ``B / 2`` on average when lengths are
    spread over many blocks.
    """
    block = _check.whole("block_tokens", block_tokens)
    lengths = _lengths("tokens", tokens)
    return -(-lengths // block) * block - lengths


@_check.guarded
def contiguous_reserved(tokens, max_tokens: int) -> np.ndarray:
    """Tokens reserved per sequence by a contiguous allocator: ``max_tokens`` each.

    A contiguous KV buffer must be sized for the longest the sequence may become, before
    its output length is known. Raises ``ValueError`` if a sequence is longer than
    ``max_tokens`` (it could not have been admitted).
    """
    cap = _check.whole("max_tokens", max_tokens)
    lengths = _lengths("tokens", tokens)
    if (lengths > cap).any():
        i = int(np.argmax(lengths > cap))
        raise ValueError(f"max_tokens={max_tokens!r} is shorter than tokens[{i}]={lengths[i]}")
    return np.full(lengths.shape, cap, dtype=np.int64)


@_check.guarded
def paged_reserved(tokens, block_tokens: int = 16) -> np.ndarray:
    """Tokens reserved per sequence by a paged allocator: whole blocks, ``B * ceil(tokens / B)``."""
    return blocks_per_sequence(tokens, block_tokens) * _check.whole("block_tokens", block_tokens)


@_check.guarded
def used_fraction(tokens, reserved) -> float:
    """Fraction of reserved KV memory that holds real tokens: ``sum(tokens) / sum(reserved)``."""
    lengths = _lengths("tokens", tokens)
    held = _lengths("reserved", reserved)
    if held.shape != lengths.shape:
        raise ValueError(
            f"reserved must match tokens in shape, got {held.shape} vs {lengths.shape}")
    if (held < lengths).any():
        i = int(np.argmax(held < lengths))
        raise ValueError(f"reserved[{i}]={held[i]} is smaller than tokens[{i}]={lengths[i]}")
    total = int(held.sum())
    if total == 0:
        raise ValueError("reserved must not sum to zero")
    return float(lengths.sum() / total)


# --------------------------------------------------------------------------- prefix reuse


def _iterable(name: str, value):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a sequence of per-request block-id lists, got {value!r}")
    return value


def prefix_hits(hash_ids: Iterable[Sequence], cache_blocks: int | None = None) -> np.ndarray:
    """Leading prompt blocks of each request already in a prefix cache (blocks).

    Requests are taken in the given (arrival) order. Each request looks up its block ids
    from the start and counts hits until the first miss: a block's keys and values depend
    on every token before it, so only a cached *prefix* can skip prefill. The request's
    blocks are then inserted (most recently used). ``cache_blocks=None`` is an unbounded
    cache; an integer keeps that many blocks and evicts the least recently used -- the
    policy of :class:`servingcap.serving.Replica` with ``prefix_cache_blocks``.
    """
    limit = None if cache_blocks is None else _check.whole("cache_blocks", cache_blocks)
    _iterable("hash_ids", hash_ids)
    cache: OrderedDict = OrderedDict()
    hits = []
    for k, ids in enumerate(hash_ids):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | np.ndarray):
            raise ValueError(f"hash_ids[{k}] must be a sequence of block ids, got {ids!r}")
        count = 0
        for block in ids:
            if block not in cache:
                break
            cache.move_to_end(block)
            count += 1
        hits.append(count)
        for block in ids:
            cache[block] = True
            cache.move_to_end(block)
        if limit is not None:
            while len(cache) > limit:
                cache.popitem(last=False)
    return np.asarray(hits, dtype=np.int64)


def hit_rate(hash_ids: Sequence[Sequence], cache_blocks: int | None = None) -> float:
    """Fraction of all prompt blocks served from the prefix cache (see :func:`prefix_hits`)."""
    ids = list(_iterable("hash_ids", hash_ids))
    for k, h in enumerate(ids):
        if isinstance(h, (str, bytes)) or not isinstance(h, Sequence | np.ndarray):
            raise ValueError(f"hash_ids[{k}] must be a sequence of block ids, got {h!r}")
    total = sum(len(h) for h in ids)
    if total == 0:
        raise ValueError("hash_ids must hold at least one block, got none")
    return float(prefix_hits(ids, cache_blocks).sum() / total)


@_check.guarded
def saved_prefill_tokens(hits, prompt_tokens, block_tokens: int = 512) -> np.ndarray:
    """Prefill tokens each request skips: ``min(hits * B, prompt_tokens - 1)``.

    The last prompt token is always computed, because its forward pass produces the first
    output token (the simulator follows the same rule).
    """
    block = _check.whole("block_tokens", block_tokens)
    n_hits = _lengths("hits", hits)
    prompts = _lengths("prompt_tokens", prompt_tokens)
    if n_hits.shape != prompts.shape:
        raise ValueError(f"hits and prompt_tokens must match in shape, got {n_hits.shape} "
                         f"vs {prompts.shape}")
    if (prompts < 1).any():
        i = int(np.argmax(prompts < 1))
        raise ValueError(f"prompt_tokens must be >= 1, got {prompts[i]} at index {i}")
    return np.minimum(n_hits * block, prompts - 1)


# --------------------------------------------------------------------------- routing


def sticky_routes(hash_ids: Sequence[Sequence], prompt_tokens, replicas: int,
                  key_block: int = 1) -> np.ndarray:
    """Replica index (0 .. replicas-1) for each request of a conversation-sticky router.

    A conversation is named by its block id at position ``key_block`` of ``hash_ids``
    (1 for the Mooncake trace, whose block 0 is a system prompt every request shares).
    The first request of a conversation goes to the replica that has been given the
    fewest prompt tokens so far (ties: lowest index); every later request of that
    conversation follows it, so its prefix is in that replica's cache. Requests with no
    block at ``key_block`` are routed like a first turn and start no conversation.
    Requests are taken in the given (arrival) order; ``prompt_tokens`` in tokens.

    The engine's ``affinity`` router (:func:`servingcap.serving.simulate`) hashes the
    *first* block, which on such a trace is the same for every request; this router
    keys on the conversation instead, without a load bound.
    """
    n_replicas = _check.whole("replicas", replicas)
    key = _check.whole("key_block", key_block, minimum=0)
    prompts = _lengths("prompt_tokens", prompt_tokens)
    if isinstance(hash_ids, (str, bytes)) or not hasattr(hash_ids, "__iter__"):
        raise ValueError(f"hash_ids must be a sequence of block-id sequences, one per request, "
                         f"got {hash_ids!r}")
    ids_list = list(hash_ids)
    if len(ids_list) != prompts.size:
        raise ValueError(f"hash_ids has {len(ids_list)} requests but prompt_tokens has "
                         f"{prompts.size}")
    home: dict = {}
    # more replicas than requests: the extra ones never receive work, so leave them out
    work = np.zeros(min(n_replicas, max(prompts.size, 1)))
    routes = np.empty(prompts.size, dtype=np.int64)
    for k, (ids, prompt) in enumerate(zip(ids_list, prompts, strict=True)):
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | np.ndarray):
            raise ValueError(f"hash_ids[{k}] must be a sequence of block ids, got {ids!r}")
        conversation = ids[key] if len(ids) > key else None
        target = home.get(conversation) if conversation is not None else None
        if target is None:
            target = int(np.argmin(work))
            if conversation is not None:
                home[conversation] = target
        work[target] += prompt
        routes[k] = target
    return routes


def replay_routed(requests, replica, routes, **options):
    """Simulate each replica's routed share of ``requests`` on its own copy of ``replica``.

    ``routes`` gives each request's replica index (e.g. from :func:`sticky_routes`);
    ``options`` go to :func:`servingcap.serving.simulate` (one replica each, so not
    ``replicas`` or ``router``). Returns the per-request table in input order, with the
    ``replica`` column set to the routed index. Equivalent to a fleet whose router made
    exactly these choices, because replicas share nothing once a request is placed.
    """
    for name in ("replicas", "router"):
        if name in options:
            raise ValueError(f"replay_routed runs one replica per share; drop {name}="
                             f"{options[name]!r}")
    requests = _check.requests(requests)
    _check.request_tokens(requests)
    routes = np.asarray(routes)
    if routes.shape != (len(requests),):
        raise ValueError(f"routes must give one replica per request ({len(requests)}), "
                         f"got shape {routes.shape}")
    if routes.size and (routes.dtype.kind not in "iu" or routes.min() < 0):
        raise ValueError(f"routes must be replica indices >= 0, got {routes[:5]!r}...")
    parts = [simulate(requests[routes == k], replica, **options).assign(replica=int(k))
             for k in np.unique(routes)]
    return pd.concat(parts).loc[requests.index]
