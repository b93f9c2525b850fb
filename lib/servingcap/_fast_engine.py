"""The serving engine's fast path: one replica whose decodes are accounted lazily.

:class:`servingcap.serving._Engine` is the reference: it updates every decoding
sequence's counters (tokens generated, last token time, largest gap) at the end of every
step, with numpy fancy indexing on arrays of a few dozen entries, and sums every running
sequence's KV blocks with numpy several times a step. Most of a replay's time went
there. This engine runs the same schedule in every mode without a step log
(:func:`usable` says when; ``until_s`` included): with or without a KV limit (tokens,
blocks, reservations), prefix cache, preemption (by memory or by policy) and timeouts.
In ``combined`` and ``mixed`` mode a decoding sequence emits a token in *every* step of
its replica until it finishes or is preempted (in ``prefill_first``, in every decode
step: :class:`PrefillFirstEngine`), so all of a replica's decoding sequences share one
token clock, and a sequence's state follows from where it joined it:

* tokens generated = (tokens it had when it joined) + (ticks now - ticks at join);
* it finishes when the clock reaches ``join + output_tokens - tokens at join`` (a heap of
  those; a preempted sequence's entry is left there and skipped as stale);
* its largest inter-token gap is the largest per-step gap the replica logged since it
  joined (one float per step, computed with the reference engine's own arithmetic, so
  the result is the same float), or an earlier one when it was preempted and recomputed.

A preemption settles the victim's lazy counters into the request arrays, as the
reference holds them. KV blocks in use are summed in Python ints over the running
sequences only when admission, preemption or a run length needs them.

Runs of identical steps are also taken at once, as the reference does for pure-decode
steps (to the first finish or the last step whose decodes fit in memory), and
additionally for prefill-chunk steps (a prompt prefilled ``chunk_tokens`` at a time with
an unchanging decode batch) when no step of the run could admit or preempt anything
(see :meth:`FastEngine._chunk_run`): their boundaries are summed one step at a time, as
the reference does, so every time is the same float. An arrival that could join cuts
either kind of run at the next step boundary at or after it. A reader's cost model
(``Replica(step_time=...)``) gets the reference's step detail every step, and steps
are never taken together, as in the reference: there the gain is smaller (about 1.7x
with DistServe's profile), bounded by the cost model's own time.

Outputs are identical to the reference engine's, bit for bit (``tests/test_fast_engine.py``).
Units: seconds, tokens.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from .serving import StepDetail, _Engine

__all__ = ["usable", "engine", "FastEngine", "PrefillFirstEngine", "Shared"]


def usable(spec, step_log: bool, horizon: float) -> bool:
    """Whether :func:`engine` reproduces the reference for this replica and run."""
    return not step_log


def engine(index: int, spec, req, queue, policy: str, shared: Shared) -> FastEngine:
    """The fast engine for ``spec.mode``: :class:`PrefillFirstEngine` for
    ``"prefill_first"``, :class:`FastEngine` otherwise."""
    kind = PrefillFirstEngine if spec.mode == "prefill_first" else FastEngine
    return kind(index, spec, req, queue, policy, shared)


class Shared:
    """Per-request inputs as Python lists (fast scalar reads) and the prefill left."""

    def __init__(self, req, horizon: float = math.inf):
        self.horizon = horizon                # until_s (s): steps ending later never apply
        self.prompt = req.prompt.tolist()
        self.output = req.output.tolist()
        self.arrival = req.arrival.tolist()
        self.deadline = req.deadline.tolist()
        self.reserve = req.reserve.tolist()
        self.left = [0] * req.n
        self.prefilled = [0] * req.n          # context cached so far (user cost models)
        self.generated = [0] * req.n          # tokens emitted when it last stopped decoding


class FastEngine(_Engine):
    """One replica (see the module docstring); the reference's interface, routing
    counters and prefix cache, a lazy token clock for its decodes."""

    def __init__(self, index: int, spec, req, queue, policy: str, shared: Shared):
        super().__init__(index, spec, req, queue, policy, None)
        self.s = shared
        self.running: dict[int, None] = {}    # admission order (newest last), as a dict
        self.chunk = spec.chunk_tokens or math.inf
        # mixed: one token budget per step, decodes first (max_batch <= cap, so every
        # decoding sequence is in every step and the token clock below holds)
        self.mixed = spec.mode == "mixed"
        self.cap = spec.token_cap()
        self.capped = self.cap != math.inf    # admission checks the step's token cap
        self.rate = spec.prefill_rate
        self.max_batch = spec.max_batch
        self.expires = spec.timeout_s is not None or spec.shed_past_deadline
        self.decode_cache: list[float] | None = None if callable(spec.decode_step_s) else []
        # a user cost model sees each step's detail (and steps never repeat, as in the
        # reference)
        self.user_cost = spec.step_time is not None
        # memory (blocks) and preemption
        self.limit = self._kv_limit
        self.block = spec.kv_block_tokens
        self.preemptive = spec.preemptive
        self.evicts = self.limit != math.inf or self.preemptive   # can preempt at all
        self.evicted = False                  # whether this plan preempted a sequence
        # the shared token clock of the decoding sequences
        self.ticks = 0                        # decode steps taken (by any decoder)
        self.gaps: list[float] = []           # per logged step: its inter-token gap (s)
        self.finishes: list = []              # heap of (tick at which it finishes, i)
        # i -> (tokens emitted - ticks, gap index at join); stale heap entries are skipped
        self.joined: dict[int, tuple[int, int]] = {}
        # the step (or run of identical steps) in flight; step_decode counts its decodes
        self.step_decode = 0
        self.step_chunks: list[tuple[int, int]] = []
        self.bounds: list[float] | None = None    # a chunk run's step ends, summed
        self.step_work = 0                    # work done by one step of a chunk run

    # ---- the router's view
    def _step_batch(self) -> int:
        return self.step_decode

    def work_at(self, t: float) -> int:
        """Outstanding work (tokens) at ``t``, as if the steps of a run ending before
        ``t`` had been applied one by one."""
        if self.repeat <= 1 or self.busy_until == math.inf:
            return self.work
        if self.bounds is None:
            return super().work_at(t)
        return self.work - bisect.bisect_left(self.bounds, t) * self.step_work

    def enqueue(self, i: int) -> None:
        """The reference's, reading Python ints instead of numpy scalars."""
        self.queue.push(self.req.key(i, self.policy), i)
        self.work += self.s.prompt[i] + self.s.output[i]

    # ---- memory
    def _kv(self, ahead: int = 0, emit=()) -> int:
        """KV blocks the running sequences hold after ``ahead`` more tokens of each
        decoding sequence and one more of each prefilling sequence in ``emit`` (the
        reference's ``_held`` summed, in Python ints)."""
        s, joined, block = self.s, self.joined, self.block
        prompt, reserve, generated = s.prompt, s.reserve, s.generated
        total, base = 0, self.ticks + ahead
        for i in self.running:
            j = joined.get(i)
            if j is not None:
                g = j[0] + base
            else:
                g = generated[i] + 1 if i in emit else generated[i]
            r = reserve[i]
            total += -(-(prompt[i] + (g if g > r else r)) // block)
        return total

    def _fits_ahead(self, n: int) -> int:
        """The most steps (1 to ``n``) whose decodes still fit in memory, as the
        reference's binary search finds them (1 when none does)."""
        if self._kv(n) <= self.limit:
            return n
        lo, hi = 1, n - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._kv(mid) <= self.limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _generated(self, i: int) -> int:
        j = self.joined.get(i)
        return self.s.generated[i] if j is None else j[0] + self.ticks

    # ---- admission
    def _admit(self, now: float) -> None:
        """The reference's: fill free slots, then (``preemptive``) displace running
        sequences whose policy key is worse than the head of the queue."""
        r, heap = self.req, self.queue.heap
        while True:
            self._fill_free_slots(now)
            if not (self.preemptive and heap and len(self.running) >= self.max_batch):
                return
            running = list(self.running)
            for j in running:
                if j in self.joined:
                    r.generated[j] = self._generated(j)   # the srpt key reads it
            keys = [r.key(j, self.policy) for j in running]
            worst = max(range(len(keys)), key=keys.__getitem__)
            if not heap[0][0] < keys[worst]:
                return
            if self.capped and not self._fits(heap[0][1], self._room()):
                return                        # no room in this step: do not evict for nothing
            victim = running[worst]
            del self.running[victim]
            self._evict(victim, now)

    def _room(self) -> int:
        """Tokens of a capped step's budget not yet claimed by admitted work: the
        reference's ``_token_room``."""
        left = self.s.left
        return self.cap - sum(left[i] for i in self.prefilling) - len(self.joined)

    def _fits(self, i: int, room: int) -> bool:
        """The reference's ``_fits_step`` for a capped step: in mixed mode any budget
        left takes a chunk."""
        return room > 0

    def _fill_free_slots(self, now: float) -> None:
        r, s, spec, heap = self.req, self.s, self.spec, self.queue.heap
        limit, used = self.limit, None
        capped = self.capped
        room = self._room() if capped else math.inf
        while heap and len(self.running) < self.max_batch:
            i = heap[0][1]
            if self.expires:
                expiry = min(s.deadline[i] if spec.shed_past_deadline else math.inf,
                             math.inf if spec.timeout_s is None
                             else r.arrival[i] + spec.timeout_s)
                if expiry <= now:
                    heapq.heappop(heap)
                    self.work -= s.prompt[i] + s.output[i]
                    r.outcome[i] = "timed_out"
                    r.finish[i] = (expiry if s.generated[i] == 0
                                   else max(expiry, r.last_token[i]))
                    if r.replica[i] < 0:
                        r.replica[i] = self.index
                    continue
            if limit != math.inf:
                g, reserve = s.generated[i], s.reserve[i]
                need = -(-(s.prompt[i] + (g if g > reserve else reserve)) // self.block)
                if need > limit:
                    raise ValueError(
                        f"request {i} needs {need} KV blocks (prompt {s.prompt[i]} tokens) "
                        f"but kv_capacity_tokens={spec.kv_capacity_tokens} holds only "
                        f"{int(limit)}")
                if used is None:
                    used = self._kv()
                if used + need > limit:
                    break                                 # head of line waits for memory
                used += need
            if capped and not self._fits(i, room):
                break                                     # the step's token cap is full
            heapq.heappop(heap)
            self._start(i, now)
            if capped:
                room -= s.left[i]

    def _start(self, i: int, now: float) -> None:
        r, s = self.req, self.s
        r.replica[i] = self.index
        g = s.generated[i]
        if g == 0 and not (self.evicts and r.preemptions[i]):
            r.admitted[i] = now                          # (first admission only)
        cached = self._prefix_hit(i) if self.spec.prefix_cache_blocks and g == 0 else 0
        if cached and cached > r.cached[i]:
            r.cached[i] = cached
        s.left[i] = s.prompt[i] + g - cached             # recompute after preemption
        s.prefilled[i] = cached
        self.work -= cached
        self.running[i] = None
        self.prefilling.append(i)

    def _evict(self, victim: int, now: float) -> None:
        """Preempt a running sequence (already out of ``running``): free its KV and
        requeue it to recompute, settling its lazily counted tokens and gaps."""
        r, s = self.req, self.s
        if victim in self.prefilling:
            self.prefilling.remove(victim)
        r.preemptions[victim] += 1
        j = self.joined.pop(victim, None)
        if j is not None:                       # decoding: its last token came out now
            g = j[0] + self.ticks
            if j[1] < len(self.gaps):
                r.max_gap[victim] = max(r.max_gap[victim], max(self.gaps[j[1]:]))
            r.last_token[victim] = self._last_token(victim, now)
            s.generated[victim] = r.generated[victim] = g
        else:
            g = s.generated[victim]
        self.work += s.prompt[victim] + g - s.left[victim]
        s.left[victim] = s.prefilled[victim] = 0
        self.queue.push(r.key(victim, self.policy), victim)
        self.evicted = True

    def _last_token(self, i: int, now: float) -> float:
        """When decoding sequence ``i`` (being preempted at ``now``) emitted its last
        token: here every step decodes, so at the end of the step that ended now."""
        return now

    def _make_room(self, chunks, now: float, ahead: int = 1):
        """The reference's: preempt the newest sequences until the tokens this step
        emits fit in memory (``ahead``: 1 when the decoding sequences emit in it)."""
        left = self.s.left
        while len(self.running) > 1:
            emit = {i for i, take in chunks if take == left[i]}
            if self._kv(ahead, emit) <= self.limit:
                break
            victim = next(reversed(self.running))
            del self.running[victim]
            self._evict(victim, now)
            chunks = [(i, take) for i, take in chunks if i != victim]
        return chunks

    # ---- one step
    def _decode_time(self, batch: int) -> float:
        cache = self.decode_cache
        if cache is None:
            return self.spec.decode_time(batch)
        while len(cache) <= batch:
            cache.append(self.spec.decode_time(len(cache)))
        return cache[batch]

    def _next_finish(self) -> int:
        """Tick of the next decode to finish (stale heap entries dropped first)."""
        finishes, joined, output = self.finishes, self.joined, self.s.output
        if not self.evicts:
            return finishes[0][0]
        while True:
            tick, i = finishes[0]
            j = joined.get(i)
            if j is not None and output[i] - j[0] == tick:
                return tick
            heapq.heappop(finishes)

    def plan(self, now: float) -> None:
        """Admit what fits and start the next step (or run of identical steps) at
        ``now``, or go idle."""
        self.evicted = False
        if self.preemptive:
            self._admit(now)
        elif self.queue.heap and len(self.running) < self.max_batch:
            self._fill_free_slots(now)
        left = self.s.left
        budget = self.cap - len(self.joined) if self.mixed else self.chunk
        chunks, tokens = [], 0
        for i in self.prefilling:
            if budget <= 0:
                break
            take = left[i] if left[i] < budget else budget
            chunks.append((i, take))
            budget -= take
            tokens += take
        if self.limit != math.inf:
            chunks = self._make_room(chunks, now)
            if self.evicted:
                tokens = sum(take for _, take in chunks)
        decoding = len(self.joined)
        self.bounds = None
        if not chunks and not decoding:
            self.busy_until = math.inf
            self.step_chunks, self.step_decode = [], 0
            return
        repeat = 1
        if self.user_cost:
            duration = self._user_cost(chunks)
            self.busy_until = now + duration
        elif not chunks:
            duration = self._decode_time(decoding)
            repeat = max(self._next_finish() - self.ticks, 1)
            if repeat > 1 and self.limit != math.inf:
                repeat = self._fits_ahead(repeat)
            self.busy_until = now + repeat * duration
        else:
            duration = self.spec.step_s(decoding, tokens, self._decode_time(decoding))
            self.busy_until = now + duration
            if len(chunks) == 1 and budget <= 0 and not self.evicted:  # may repeat
                repeat = self._chunk_run(now, duration, *chunks[0])
        self.step_chunks, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration

    def _user_cost(self, chunks, decodes: bool = True) -> float:
        """The step's duration from the reader's cost model, given the same detail the
        reference builds (decodes in admission order; none when not ``decodes``)."""
        prompt, joined, ticks = self.s.prompt, self.joined, self.ticks
        context = ([prompt[i] + joined[i][0] + ticks for i in self.running if i in joined]
                   if decodes else [])
        return self.spec.cost(StepDetail(
            prefill_chunks=np.array([take for _, take in chunks], dtype=np.int64),
            prefill_cached=np.array([self.s.prefilled[i] for i, _ in chunks], dtype=np.int64),
            decode_context=np.array(context, dtype=np.int64)))

    def _chunk_run(self, now: float, duration: float, i: int, take: int) -> int:
        """Steps that prefill ``take`` tokens of prompt ``i`` with the same decodes,
        until its last chunk, the first finish (after which the batch changes) or the
        last step whose decodes fit in memory. Taken only when no step of the run
        could admit or preempt: the queue is empty, or the batch is full (with
        ``preemptive``, the running sequences' policy keys only improve as they
        decode), or the head of the queue waits for memory, which only fills up
        during the run (and no timeout can take it meanwhile); in mixed mode the run's
        chunk fills the budget, so no waiting request can be admitted before its last
        chunk (and none times out meanwhile, as then the reference would pop it at a
        boundary). Arrivals cut the run
        (:meth:`cut`); a queue shared with replicas that preempt is never run ahead."""
        limited = self.limit != math.inf
        if self.evicts and len(self.queue.replicas) > 1:
            return 1                     # another replica may requeue a preempted one
        if (self.queue.heap and len(self.running) < self.max_batch
                and (self.expires or not (limited or self.mixed))):
            return 1
        n = self.s.left[i] // take
        if self.s.left[i] % take == 0:
            n -= 1                                      # its last chunk emits a token
        if self.joined:
            n = min(n, self._next_finish() - self.ticks)
        if n > 1 and limited:
            n = self._fits_ahead(n)
        if n <= 1:
            return 1
        bounds, end, horizon = [], now, self.s.horizon
        for _ in range(n):
            end += duration
            if end > horizon and bounds:
                break                # until_s: the reference applies the steps before it
            bounds.append(end)
        n = len(bounds)
        if n == 1:
            return 1
        self.bounds, self.busy_until = bounds, bounds[-1]
        self.step_work = take + len(self.joined)
        return n

    def cut(self, t: float) -> None:
        """A request that could join arrived at ``t``: end the run at the first step
        boundary at or after ``t``."""
        if self.repeat <= 1:
            return
        if self.bounds is None:
            super().cut(t)
            return
        if self.busy_until == math.inf or (len(self.running) >= self.max_batch
                                           and not self.preemptive):
            return
        keep = max(1, bisect.bisect_left(self.bounds, t) + 1)
        if keep < self.repeat:
            del self.bounds[keep:]
            self.repeat, self.busy_until = keep, self.bounds[-1]

    def finish_step(self) -> None:
        """Apply the step (or run) that ends at ``busy_until``."""
        now, s = self.busy_until, self.s
        repeat, decoding, gaps = self.repeat, self.step_decode, self.gaps
        if self.bounds is not None:                    # a chunk run
            if decoding:
                previous = self.step_start
                for end in self.bounds:
                    gaps.append(end - previous)
                    previous = end
                self.ticks += repeat
            (i, take), = self.step_chunks
            s.left[i] -= take * repeat
            self.work -= self.step_work * repeat
            self.bounds = None
        else:
            if decoding:
                if repeat > 1:
                    step = (now - self.step_start) / repeat
                    gaps.append(max(step, now - (now - step)))
                    self.work -= (repeat - 1) * decoding
                else:
                    gaps.append(now - self.step_start)
                self.ticks += repeat
                self.work -= decoding
            done = 0
            for i, take in self.step_chunks:
                self.work -= take
                left = s.left[i] = s.left[i] - take
                if self.user_cost:
                    s.prefilled[i] += take
                if left == 0:
                    done += 1
                    self._first_token(i, now)
            if done:
                del self.prefilling[:done]
        self._retire(now)

    def _retire(self, now: float) -> None:
        """Decoding sequences whose last token the clock has reached are done at ``now``."""
        r, gaps = self.req, self.gaps
        finishes, joined, output = self.finishes, self.joined, self.s.output
        while finishes and finishes[0][0] <= self.ticks:
            tick, i = heapq.heappop(finishes)
            if self.evicts:
                j = joined.get(i)
                if j is None or output[i] - j[0] != tick:
                    continue                            # preempted since: stale
                del joined[i]
            else:
                j = joined.pop(i)
            self._done(i, now, output[i])
            if j[1] < len(gaps):
                r.max_gap[i] = max(r.max_gap[i], max(gaps[j[1]:]))

    def _first_token(self, i: int, now: float) -> None:
        """Prefill of ``i`` is complete: its first token, or (recomputed after a
        preemption) its next one."""
        r, s = self.req, self.s
        g = s.generated[i]
        if g == 0:
            r.first[i] = now
            if self.spec.prefix_cache_blocks:
                self._remember_prefix(i)
        else:
            r.max_gap[i] = max(r.max_gap[i], now - r.last_token[i])
        self.work -= 1
        g += 1
        output = s.output[i]
        if g >= output:
            self._done(i, now, g)
            return
        base = g - self.ticks
        self.joined[i] = (base, len(self.gaps))
        heapq.heappush(self.finishes, (output - base, i))

    def settle(self) -> None:
        """At the end of a run cut by ``until_s``: write the tokens and largest gap of
        each sequence still decoding into the request arrays, as the reference has them."""
        r, gaps = self.req, self.gaps
        for i, (base, at) in self.joined.items():
            r.generated[i] = base + self.ticks
            if at < len(gaps):
                r.max_gap[i] = max(r.max_gap[i], max(gaps[at:]))

    def _done(self, i: int, now: float, generated: int) -> None:
        r = self.req
        r.finish[i], r.outcome[i], r.generated[i] = now, "done", generated
        self.s.generated[i] = generated
        del self.running[i]

    # ---- gateway signals: the reference's (servingcap.routers), on the lazy state
    def _steps_ended(self, t: float) -> int:
        """Steps of the run in flight that ended before ``t`` (not yet applied)."""
        if self.bounds is None:
            return super()._steps_ended(t)
        return bisect.bisect_left(self.bounds, t)

    def kv_tokens(self, t: float) -> int:
        """KV-cache tokens in use at ``t``: prompt plus tokens generated so far."""
        s, joined, ticks = self.s, self.joined, self.ticks
        prompt, generated = s.prompt, s.generated
        used = 0
        for i in self.running:
            j = joined.get(i)
            used += prompt[i] + (generated[i] if j is None else j[0] + ticks)
        return used + self._steps_ended(t) * self.step_decode

    def pending_prefill(self, t: float) -> int:
        """Prompt tokens still to prefill at ``t``: what admitted requests have left."""
        left = self.s.left
        pending = sum(left[i] for i in self.running)
        if self.bounds is not None:
            # each step of a chunk run prefills the run's chunk (step_work less decodes)
            take = self.step_work - self.step_decode
            pending -= bisect.bisect_left(self.bounds, t) * take
        return pending

    def queued_tokens(self) -> int:
        """Context tokens of the requests waiting here (prompt, plus the tokens to
        recompute of a preempted one)."""
        if self.queue_depth() == 0:
            return 0
        prompt, generated = self.s.prompt, self.s.generated
        return sum(prompt[i] + generated[i] for _, i in self.queue.heap)

class PrefillFirstEngine(FastEngine):
    """:class:`FastEngine` for ``mode="prefill_first"``: a step with prompts to
    prefill runs only prefill (whole prompts, oldest first, up to the token cap), and
    the decoding sequences wait for the next step without prefill.

    The token clock ticks on decode steps only: every decoding sequence is in every
    decode step (the mode has no per-step decode budget), so tokens generated and
    finishes follow from the tick at which a sequence joined, as in the parent. The
    inter-token gaps differ. At a decode step (or run of ``n`` identical decode steps
    from ``start`` to ``end``, ``step = (end - start) / n``) a sequence whose previous
    token came out at ``last`` has the gap ``end - last`` (``n = 1``) or
    ``max(step + (start - last), end - (end - step))`` (a run, the reference's
    arithmetic). For every sequence that decoded in the replica's previous decode step,
    ``last`` is that step's end (:attr:`decode_end`): one gap per decode step, logged
    as in the parent. A sequence that got its first token (or, recomputed after a
    preemption, its next one) at the end of a prefill-only step at ``T`` since then
    has ``last = T``: its first decode gap is computed and folded at once (a few per
    prefill step), and it reads the shared log from the next decode step on.

    A prefill-only step preempts for memory without growing the waiting decodes; when
    that preempts every prompt of the step, the step decodes instead, once (the
    reference's fallback, never repeated). Runs of identical decode steps are taken as
    in the parent, and cut by arrivals; prefill-only steps are taken one at a time.
    """

    def __init__(self, index: int, spec, req, queue, policy: str, shared: Shared):
        super().__init__(index, spec, req, queue, policy, shared)
        self.decode_end = math.nan            # end of the last decode step (s)
        self.fresh: dict[int, float] = {}     # joined since then -> its last token's time

    # ---- admission against the prefill cap
    def _room(self) -> float:
        """Prompt tokens of the cap not yet claimed by admitted prefill."""
        left = self.s.left
        return self.cap - sum(left[i] for i in self.prefilling)

    def _fits(self, i: int, room: float) -> bool:
        """The reference's ``_fits_step``: the prompt (with its recomputed tokens, less
        its prefix-cache hit) fits what is left, or nothing else is prefilling."""
        s = self.s
        need = s.prompt[i] + s.generated[i] - self._prefix_hit(i, touch=False)
        return need <= room or not self.prefilling

    # ---- one step
    def plan(self, now: float) -> None:
        """Admit what fits, then start a prefill-only step of whole prompts, or a
        decode step (or run of identical ones), or go idle."""
        self.evicted = False
        if self.preemptive:
            self._admit(now)
        elif self.queue.heap and len(self.running) < self.max_batch:
            self._fill_free_slots(now)
        left, cap = self.s.left, self.cap
        chunks, tokens = [], 0
        for i in self.prefilling:                     # whole prompts, oldest first
            if chunks and tokens + left[i] > cap:
                break
            chunks.append((i, left[i]))
            tokens += left[i]
        fallback = False
        if chunks and self.limit != math.inf:
            chunks = self._make_room(chunks, now, ahead=0)    # the decodes wait
            if not chunks:
                fallback = True              # memory preempted every prompt: decode
            elif self.evicted:
                tokens = sum(take for _, take in chunks)
        self.bounds, repeat = None, 1
        if chunks:
            decoding = 0
            duration = (self._user_cost(chunks, decodes=False) if self.user_cost
                        else self.spec.step_s(0, tokens, self._decode_time(0)))
            self.busy_until = now + duration
        else:
            if self.limit != math.inf:
                self._make_room([], now)
            decoding = len(self.joined)
            if not decoding:
                self.busy_until = math.inf
                self.step_chunks, self.step_decode = [], 0
                return
            if self.user_cost:
                duration = self._user_cost([])
            else:
                duration = self._decode_time(decoding)
                if not fallback:
                    repeat = max(self._next_finish() - self.ticks, 1)
                    if repeat > 1 and self.limit != math.inf:
                        repeat = self._fits_ahead(repeat)
            self.busy_until = now + repeat * duration
        self.step_chunks, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration

    def finish_step(self) -> None:
        """Apply the prefill-only step, or the decode step (or run), ending at
        ``busy_until``."""
        now, s = self.busy_until, self.s
        if self.step_decode:
            self._decode_gaps(now)
            self.ticks += self.repeat
            self.work -= self.repeat * self.step_decode
        else:
            for i, take in self.step_chunks:
                self.work -= take
                s.left[i] -= take                       # whole prompts: now 0
                if self.user_cost:
                    s.prefilled[i] += take
                self._first_token(i, now)
            del self.prefilling[:len(self.step_chunks)]
        self._retire(now)

    def _decode_gaps(self, now: float) -> None:
        """Log the gap of the decode step (or run) ending at ``now`` for the sequences
        that decoded in the previous one, and fold the first gap of those that joined
        since (see the class docstring)."""
        r, start, n = self.req, self.step_start, self.repeat
        step = (now - start) / n
        tail = now - (now - step)

        def gap(last: float) -> float:
            if n == 1:
                return now - last
            waited = step + (start - last)
            return waited if waited > tail else tail

        if len(self.joined) > len(self.fresh):          # some decoded in the last one
            self.gaps.append(gap(self.decode_end))
        at = len(self.gaps)
        for i, last in self.fresh.items():
            r.max_gap[i] = max(r.max_gap[i], gap(last))
            self.joined[i] = (self.joined[i][0], at)
        self.fresh.clear()
        self.decode_end = now

    def _first_token(self, i: int, now: float) -> None:
        super()._first_token(i, now)
        if i in self.joined:
            self.fresh[i] = now

    def _last_token(self, i: int, now: float) -> float:
        """A preempted decoding sequence's last token came at the end of the last
        decode step, or when it joined if it has not decoded since."""
        last = self.fresh.pop(i, None)
        return self.decode_end if last is None else last
