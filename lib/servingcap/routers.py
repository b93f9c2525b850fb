"""Routers: which replica of a fleet takes each arrival (used by :func:`servingcap.serving.simulate`).

A production gateway sees what a replica exports and what the gateway itself sent, and
nothing more: the waiting queue depth, the running requests, the free batch slots, the
KV-cache tokens in use (prompt plus the tokens generated so far), and which prompt blocks
a replica has (from its own record of the prompts it routed, or from the replica's KV
events). It never sees how many tokens a request will generate. The *realistic* routers
below (:data:`REALISTIC`) read only those signals, through the engines' "gateway signals"
(``queue_depth``, ``running_requests``, ``free_slots``, ``kv_tokens``,
``pending_prefill``, ``prefix_match``); ``tests/test_routers.py`` checks that none of
them changes its pick when only the remaining output lengths change. Two *bounds*
(:data:`BOUNDS`) are kept for comparison and no gateway reaches them: ``pooled`` (one
queue shared by every slot) and ``oracle_work`` (outstanding work counted with every
request's output length known in advance).

The realistic routers, each after a deployed one:

* ``"jsq"`` (the default): join the shortest queue, a replica with a free slot first.
* ``"least_requests"``: the fewest outstanding requests (waiting + running).
* ``"endpoint_picker"``: the Gateway API Inference Extension's weighted scorers.
* ``"cache_aware"``: SGLang router's cache-aware policy.
* ``"kv_cost"``: NVIDIA Dynamo's KV router cost.
* ``"power_of_two"``: two replicas at random, the one with fewer requests.
* ``"affinity"``: prefix affinity on the request's blocks with bounded load.
* ``"random"``, ``"round_robin"``.

Why ``jsq`` is the default: on the scenario of issue 21 (11 replicas x 32 slots at 30
req/s, exponential outputs of mean 300 tokens, one-token prompts, 30 ms steps, TTFT p99
after a 60 s warm-up, 600 s; ``python bench/routers.py``) it ties the pooled bound: 0.060
s against 0.060 s, as do ``least_requests``, ``power_of_two``, ``cache_aware`` and
``kv_cost`` (1.01x), while ``endpoint_picker`` (0.41 s: with no KV limit its queue
scorer sees empty queues and picks at random among ties), ``affinity`` (0.59 s),
``round_robin`` (1.18 s), ``oracle_work`` (1.46 s: blind to free slots) and ``random``
(3.7 s) are far behind; ``tests/test_routers.py`` asserts the default within 2x of
``pooled`` with a fixed seed. Among those that tie, ``jsq`` and ``least_requests`` keep
their choice in a heap refreshed on events, so routing costs O(log replicas) per
arrival (``bench/router_cost.py``: about 4 us at 10 replicas, 10 us at 1,000), where the
others scan every replica; and ``jsq`` sends an arrival where it can start now.
Its known weakness is that of every request-count router: on identical requests (the
book's 2,000 / 300-token workload, 6 replicas at 8 req/s) requests admitted together
finish together and the emptied replica takes the next cohort, whose prompts prefill
together: TTFT p99 by thirds of the run 0.78 / 1.05 / 1.39 s, as ``least_requests``;
``kv_cost``, which also weighs pending prefill, stays at 0.51 / 0.54 / 0.48 s there
(``oracle_work`` 0.34 / 0.37 / 0.37 s) but costs a scan of every running request.

Units: tokens, seconds.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from collections import OrderedDict

from . import _check

__all__ = ["ROUTERS", "REALISTIC", "BOUNDS", "PREFIX_AWARE", "DEFAULT_ROUTER", "OPTIONS",
           "check_router", "Router"]

#: Routers a gateway can run: they read only queue depth, running requests, free slots,
#: KV tokens in use and prefix matches.
REALISTIC = ("jsq", "least_requests", "endpoint_picker", "cache_aware", "kv_cost",
             "power_of_two", "affinity", "random", "round_robin")
#: Bounds no gateway reaches: one shared queue, and outstanding work known in advance.
BOUNDS = ("pooled", "oracle_work")
ROUTERS = REALISTIC + BOUNDS
#: Realistic routers that read the prefix match of a request's blocks (``hash_ids``).
PREFIX_AWARE = ("endpoint_picker", "cache_aware", "kv_cost", "affinity")
DEFAULT_ROUTER = "jsq"
_RENAMED = {"least_loaded": "oracle_work"}

#: Options each router takes (``simulate(router_options=...)``) and their defaults.
OPTIONS = {
    "endpoint_picker": {"queue_weight": 2.0, "kv_weight": 2.0, "prefix_weight": 3.0},
    "cache_aware": {"balance_abs": 64, "balance_rel": 1.5, "cache_threshold": 0.3},
    "kv_cost": {"overlap_weight": 1.0, "temperature": 0.0},
}


def check_router(router) -> str:
    """The router name if known; a ValueError naming it otherwise (``least_loaded``
    was renamed ``oracle_work``: it reads output lengths no gateway knows)."""
    if not isinstance(router, str):
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if router in _RENAMED:
        raise ValueError(
            f"router {router!r} was renamed {_RENAMED[router]!r}: it counts every request's "
            f"output tokens in advance, which no gateway knows, so it is a bound, not a "
            f"router to deploy; the default is now {DEFAULT_ROUTER!r}")
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    return router


def _options(name: str, given) -> dict:
    """Validated ``router_options`` for router ``name`` (defaults filled in)."""
    defaults = OPTIONS.get(name, {})
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise ValueError(f"router_options must be a dict, got {given!r}")
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"router_options for {name!r} takes {sorted(defaults) or 'nothing'}, "
                         f"got {sorted(unknown)}")
    out = dict(defaults, **given)
    for key, value in out.items():
        out[key] = _check.nonnegative(f"router_options[{key!r}]", value)
    if name == "cache_aware" and out["balance_rel"] < 1:
        raise ValueError(f"router_options['balance_rel'] must be >= 1, got {out['balance_rel']!r}")
    if name == "cache_aware" and out["cache_threshold"] > 1:
        raise ValueError("router_options['cache_threshold'] must be in [0, 1], got "
                         f"{out['cache_threshold']!r}")
    return out


def _stable_hash(key) -> int:
    """A 64-bit hash that is the same in every process (Python's str hash is salted)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "big")


SCANNED = 4
"""Fleets of up to this many replicas: ``jsq`` and ``least_requests`` scan the replicas at
each arrival instead of keeping a heap of their keys."""


def _count_order(e) -> int:
    """``least_requests``: outstanding requests (:meth:`Router._count_key` less the index)."""
    return e.queue_depth() + e.running_requests()


def _jsq_order(e) -> int:
    """``jsq``'s order in one number (:meth:`Router._jsq_key` less the index): minus the
    free slots when there are some, else the waiting queue (>= 0 > any minus free)."""
    free = e.free_slots()
    return -free if free else e.queue_depth()


class Router:
    """Picks the replica for each arrival; see the module docstring and
    :func:`servingcap.serving.simulate`'s ``router``.

    ``engines`` expose the gateway signals (ties go to the lowest index unless a router
    says otherwise). :meth:`update` must be called after an engine's queue or running
    set changed (an arrival, a step's admissions, finishes, preemptions, timeouts):
    ``jsq`` and ``least_requests`` keep a heap of replica keys refreshed only there.
    """

    POINTS = 64                                     # ring points per replica (affinity)

    def __init__(self, name: str, engines: list, req, rng, bound: float = 1.25,
                 options: dict | None = None):
        self.name, self.engines, self.req, self.rng = check_router(name), engines, req, rng
        self.options = _options(name, options)
        self.next_rr = 0
        self.spec = engines[0].spec
        self.heap: list | None = None
        # jsq and least_requests over a small fleet: a scan at each arrival (cheaper than
        # keeping a heap of keys fresh after every step); over a large one, the heap
        self.scan = name in ("jsq", "least_requests") and 1 < len(engines) <= SCANNED
        self.key = self._jsq_key if name == "jsq" else self._count_key
        if name in ("jsq", "least_requests") and len(engines) > SCANNED:
            self.jsq, self.batch = name == "jsq", self.spec.max_batch
            self.version = [0] * len(engines)
            # each replica's key in the heap: one number (:func:`_jsq_order`, the
            # outstanding count), ties to the lowest index by the heap entry's second
            order = _jsq_order if self.jsq else _count_order
            self.keys = [order(e) for e in engines]
            self.heap = [(key, e.index, 0) for key, e in zip(self.keys, engines, strict=True)]
            heapq.heapify(self.heap)
            self.pick = self._top
        if name in ("affinity", "cache_aware", "endpoint_picker"):
            # the gateway's own record of the prompt blocks it sent to each replica (an
            # LRU of the replica's prefix-cache size, unbounded when it has none)
            self.index = [OrderedDict() for _ in engines]
            self.capacity = self.spec.prefix_cache_blocks or math.inf
        if name == "oracle_work":
            self.arrival = req.arrival.tolist()   # (Python floats: read at every arrival)
        # the routers a simulation calls most, bound once (:meth:`pick` otherwise)
        if name not in PREFIX_AWARE and (name == "pooled" or len(engines) == 1):
            self.pick = self._only
        elif self.scan and name == "least_requests":
            self.pick = self._least_requests
        elif name == "oracle_work" and len(engines) > 1:
            self.pick = self._least_work
        if name == "affinity":
            self.bound = _check.number("affinity_bound", bound)
            if self.bound < 1:
                raise ValueError(f"affinity_bound must be >= 1, got {bound!r}")
            ring = sorted((_stable_hash(("replica", e.index, p)), e.index)
                          for e in engines for p in range(self.POINTS))
            self.ring_keys = [h for h, _ in ring]
            self.ring_replicas = [k for _, k in ring]

    # ---- the indexed routers: a heap of (key, replica, version), stale entries skipped
    @staticmethod
    def _count_key(e) -> tuple:
        return (e.queue_depth() + e.running_requests(), e.index)

    @staticmethod
    def _jsq_key(e) -> tuple:
        free = e.free_slots()
        return (0, -free, e.index) if free else (1, e.queue_depth(), e.index)

    def update(self, engine) -> None:
        """``engine``'s queue or running set may have changed: refresh its key (the
        keys of :meth:`_jsq_key` and :meth:`_count_key`, from the same signals, written
        in: a simulation calls this after every step)."""
        if self.heap is None:
            return
        k = engine.index
        # queue_depth() and running_requests(), read directly (each replica has its own
        # queue when there is a heap)
        depth = len(engine.queue.heap)
        if self.jsq:
            free = self.batch - len(engine.running) - depth    # (free_slots, before its
            key = -free if free > 0 else depth                 # max: _jsq_order)
        else:
            key = depth + len(engine.running)
        if key == self.keys[k]:
            return                  # most steps change neither free slots nor the queue
        self.keys[k] = key
        self.version[k] += 1
        heapq.heappush(self.heap, (key, k, self.version[k]))
        if len(self.heap) > 4 * len(self.engines) + 64:      # drop stale entries
            self.heap = [(self.keys[e.index], e.index, self.version[e.index])
                         for e in self.engines]
            heapq.heapify(self.heap)

    def _top(self, i: int | None = None):
        """The replica at the top of the key heap (``i``, the arrival, is not read)."""
        heap, version = self.heap, self.version
        while heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        return self.engines[heap[0][1]]

    # ---- picking
    def pick(self, i: int):
        """The engine that takes request ``i`` (arriving now)."""
        engines, name = self.engines, self.name
        if name == "pooled" or len(engines) == 1:
            target = engines[0]
        elif self.heap is not None:
            target = self._top()
        elif self.scan and name == "jsq":   # the least key (the first: the lowest index)
            target = min(engines, key=_jsq_order)
        elif self.scan:
            target = self._least_requests(i)
        elif name == "oracle_work":
            target = self._least_work(i)
        elif name == "random":
            target = engines[int(self.rng.integers(len(engines)))]
        elif name == "power_of_two":
            a = int(self.rng.integers(len(engines)))
            b = int(self.rng.integers(len(engines) - 1))
            b += b >= a
            target = min(engines[a], engines[b], key=self._count_key)
        elif name == "round_robin":
            target = engines[self.next_rr % len(engines)]
            self.next_rr += 1
        else:
            target = getattr(self, "_" + name)(i)
        if name in ("affinity", "cache_aware", "endpoint_picker"):
            self._remember(target.index, i)
        return target

    def _least_requests(self, i: int):
        """``least_requests`` over a scanned fleet: :meth:`_count_key`'s count written
        in (each replica has its own queue here), the first least."""
        target, least = None, math.inf
        for e in self.engines:
            count = len(e.queue.heap) + len(e.running)
            if count < least:
                target, least = e, count
        return target

    def _least_work(self, i: int):
        """``oracle_work``: the least outstanding work at the arrival, the first least."""
        t = self.arrival[i]
        target, least = None, math.inf
        for e in self.engines:
            work = e.work_at(t)
            if work < least:
                target, least = e, work
        return target

    def _only(self, i: int):
        return self.engines[0]

    # ---- the gateway's prefix index
    def _blocks(self, i: int) -> list:
        ids = self.req.hash_ids
        return [] if ids is None else ids[i]

    def _matched(self, k: int, blocks) -> int:
        """Leading blocks of ``blocks`` the gateway has sent to replica ``k``."""
        index, n = self.index[k], 0
        for block in blocks:
            if block not in index:
                break
            n += 1
        return n

    def _remember(self, k: int, i: int) -> None:
        index = self.index[k]
        for block in self._blocks(i):
            index[block] = None
            index.move_to_end(block)
        while len(index) > self.capacity:
            index.popitem(last=False)

    # ---- the score-based routers
    def _endpoint_picker(self, i: int):
        """Gateway API Inference Extension endpoint picker (the scheduler of llm-d and
        Envoy AI Gateway; kubernetes-sigs/gateway-api-inference-extension,
        pkg/epp/scheduling/framework/plugins/scorer/queue.go, kvcache_utilization.go and
        plugins/multi/prefix/plugin.go): score = queue_weight x (max q - q)/(max q - min q)
        (1 when all queues are equal) + kv_weight x (1 - KV usage) + prefix_weight x
        (matched / total prompt blocks, on the gateway's own LRU index of the blocks it
        routed); the highest score wins, ties at random (its max-score picker shuffles).
        KV usage is tokens in use over ``kv_capacity_tokens`` (0 for an unlimited
        cache). Defaults: weights 2, 2, 3. Its saturation detector (queue depth 5, KV
        usage 0.8) gates admission of sheddable requests, not the pick, and is not
        modelled here."""
        o, engines = self.options, self.engines
        t = self.req.arrival[i]
        queues = [e.queue_depth() for e in engines]
        lo, hi = min(queues), max(queues)
        cap = self.spec.kv_capacity_tokens
        blocks = self._blocks(i)
        scores = []
        for e, q in zip(engines, queues, strict=True):
            score = o["queue_weight"] * ((hi - q) / (hi - lo) if hi > lo else 1.0)
            usage = 0.0 if cap is None else min(e.kv_tokens(t) / cap, 1.0)
            score += o["kv_weight"] * (1.0 - usage)
            if blocks:
                score += o["prefix_weight"] * self._matched(e.index, blocks) / len(blocks)
            scores.append(score)
        best = max(scores)
        top = [k for k, s in enumerate(scores) if s == best]
        return engines[top[int(self.rng.integers(len(top)))] if len(top) > 1 else top[0]]

    def _cache_aware(self, i: int):
        """SGLang router's ``cache_aware`` policy (sgl-project/sglang,
        sgl-router/src/policies/cache_aware.rs): loads are outstanding requests per
        replica; when max - min > ``balance_abs`` (64) and max > ``balance_rel`` (1.5)
        x min the fleet is imbalanced and the least-loaded replica takes the request;
        otherwise the replica whose (approximate, router-side) prefix tree matches the
        largest fraction of the prompt's blocks takes it if that fraction exceeds
        ``cache_threshold`` (0.3), else the replica with the smallest tree. Blocks stand
        for SGLang's characters; ties go to the fewer requests, then the lower index."""
        o, engines = self.options, self.engines
        loads = [e.queue_depth() + e.running_requests() for e in engines]
        lo, hi = min(loads), max(loads)
        if hi - lo > o["balance_abs"] and hi > o["balance_rel"] * lo:
            return engines[loads.index(lo)]
        blocks = self._blocks(i)
        if blocks:
            matched = [self._matched(e.index, blocks) for e in engines]
            best = max(matched)
            if best / len(blocks) > o["cache_threshold"]:
                return min((e for e in engines if matched[e.index] == best),
                           key=lambda e: (loads[e.index], e.index))
        return min(engines, key=lambda e: (len(self.index[e.index]), loads[e.index], e.index))

    def _kv_cost(self, i: int):
        """NVIDIA Dynamo's KV router (ai-dynamo/dynamo, lib/llm/src/kv_router/
        scheduler.rs; docs/router/kv_cache_routing.md): cost = ``overlap_weight`` x
        potential prefill blocks + potential decode blocks. Prefill: the request's
        prompt tokens not in the replica's prefix cache (its KV events: the replica's own
        cache) plus the prefill still pending there (admitted prompts' remainder and the
        waiting requests' context). Decode: the prompt blocks of the requests active
        there (running or waiting; Dynamo's router tracks each request's prompt blocks
        from routing to completion, deduplicated, which is not done here) plus the
        request's own. Blocks are ``kv_block_tokens``. The lowest cost wins
        (temperature 0, Dynamo's default); with a temperature > 0 a replica is drawn
        with probability softmax(-cost / (temperature x the costs' range))."""
        o, engines, req = self.options, self.engines, self.req
        t, prompt = req.arrival[i], int(req.prompt[i])
        block = self.spec.kv_block_tokens
        hit = self.spec.prefix_block_tokens
        costs = []
        for e in engines:
            cached = min(e.prefix_match(i) * hit, prompt - 1)
            prefill = (prompt - cached + e.pending_prefill(t) + e.queued_tokens()) / block
            decode = e.active_prompt_blocks() + -(-prompt // block)
            costs.append(o["overlap_weight"] * prefill + decode)
        if o["temperature"] == 0:
            return engines[costs.index(min(costs))]
        lo, hi = min(costs), max(costs)
        span = (hi - lo) or 1.0
        weights = [math.exp(-(c - lo) / span / o["temperature"]) for c in costs]
        total = sum(weights)
        u, acc = float(self.rng.random()) * total, 0.0
        for e, w in zip(engines, weights, strict=True):
            acc += w
            if u < acc:
                return e
        return engines[-1]

    def _affinity(self, i: int):
        """Prefix affinity with bounded load, on the request's prompt blocks (vLLM
        production-stack's prefix-aware router, src/vllm_router/routers/routing_logic.py,
        and AIBrix's prefix-cache router, pkg/plugins/gateway/algorithms/prefix_cache.go,
        with the bound of consistent hashing with bounded loads, Mirrokni, Thorup and
        Zadimoghaddam 2018). Among replicas whose outstanding requests are below
        ``ceil(affinity_bound x (total + 1) / replicas)``, the one the gateway sent the
        longest run of this prompt's leading blocks (``hash_ids``, all of them, not the
        first alone: a first block shared by every prompt, such as Mooncake's system
        prompt, matches everywhere once every replica has seen one, and then only
        breaks no tie, while a conversation's later turns match their own replica
        longer); ties go to the fewer requests, then the lower index. Without a match
        the ``session_id`` (else the row) hashes onto a ring of replicas (64 points
        each) and the first one clockwise under the bound takes it.
        """
        engines = self.engines
        loads = [e.queue_depth() + e.running_requests() for e in engines]
        cap = math.ceil(self.bound * (sum(loads) + 1) / len(engines))
        blocks = self._blocks(i)
        if blocks:
            best, target = 0, None
            for e in engines:
                if loads[e.index] + 1 <= cap:
                    m = self._matched(e.index, blocks)
                    if m > best or (m == best and target is not None
                                    and loads[e.index] < loads[target.index]):
                        best, target = m, e
            if target is not None:
                return target
        session = self.req.session
        key = ("session", session[i]) if session is not None else ("row", i)
        start = bisect.bisect(self.ring_keys, _stable_hash(key))
        size = len(self.ring_keys)
        for step in range(size):
            k = self.ring_replicas[(start + step) % size]
            if loads[k] + 1 <= cap:
                return engines[k]
        return min(engines, key=lambda e: (loads[e.index], e.index))   # unreachable
