"""The serving engine's fast path: one replica whose decodes are accounted lazily.

:class:`servingcap.serving._Engine` is the reference: it updates every decoding
sequence's counters (tokens generated, last token time, largest gap) at the end of every
step, with numpy fancy indexing on arrays of a few dozen entries. Most of a replay's time
went there. This engine runs the same schedule for the configurations where a decoding
sequence emits a token in *every* step of its replica until it finishes:
``mode="combined"``, no KV limit, no preemption, no step log and no ``until_s``
(:func:`usable` says when). Then all of a replica's decoding sequences share one token
clock, and a sequence's state follows from where it joined it:

* tokens generated = 1 + (ticks now - ticks when its first token came out);
* it finishes when the clock reaches ``join + output_tokens - 1`` (a heap of those);
* its largest inter-token gap is the largest per-step gap the replica logged since it
  joined (one float per step, computed with the reference engine's own arithmetic, so
  the result is the same float).

Runs of identical steps are also taken at once, as the reference does for pure-decode
steps, and additionally for prefill-chunk steps (a prompt prefilled ``chunk_tokens`` at a
time with an unchanging decode batch): their boundaries are summed one step at a time, as
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

__all__ = ["usable", "FastEngine", "Shared"]


def usable(spec, step_log: bool, horizon: float) -> bool:
    """Whether :class:`FastEngine` reproduces the reference for this replica and run."""
    return (spec.mode == "combined" and spec.kv_capacity_tokens is None and not spec.preemptive
            and not step_log and horizon == math.inf)


class Shared:
    """Per-request inputs as Python lists (fast scalar reads) and the prefill left."""

    def __init__(self, req):
        self.prompt = req.prompt.tolist()
        self.output = req.output.tolist()
        self.arrival = req.arrival.tolist()
        self.deadline = req.deadline.tolist()
        self.left = [0] * req.n
        self.prefilled = [0] * req.n          # context cached so far (user cost models)


class FastEngine(_Engine):
    """One replica (see the module docstring); the reference's interface, routing
    counters and prefix cache, a lazy token clock for its decodes."""

    def __init__(self, index: int, spec, req, queue, policy: str, shared: Shared):
        super().__init__(index, spec, req, queue, policy, None)
        self.s = shared
        self.running: set[int] = set()        # (the reference keeps admission order)
        self.chunk = spec.chunk_tokens or math.inf
        self.rate = spec.prefill_rate
        self.max_batch = spec.max_batch
        self.expires = spec.timeout_s is not None or spec.shed_past_deadline
        self.decode_cache: list[float] | None = None if callable(spec.decode_step_s) else []
        # a user cost model sees each step's detail (and steps never repeat, as in the
        # reference): keep the running sequences in admission order for it
        self.user_cost = spec.step_time is not None
        self.order: list[int] = []
        # the shared token clock of the decoding sequences
        self.ticks = 0                        # tokens each continuing decoder has emitted
        self.gaps: list[float] = []           # per logged step: its inter-token gap (s)
        self.finishes: list = []              # heap of (tick at which it finishes, i)
        self.joined: dict[int, tuple[int, int]] = {}   # i -> (tick, gap index) at join
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

    # ---- admission
    def _admit(self, now: float) -> None:
        r, s, spec, heap = self.req, self.s, self.spec, self.queue.heap
        while heap and len(self.running) < self.max_batch:
            i = heap[0][1]
            if self.expires:
                expiry = min(s.deadline[i] if spec.shed_past_deadline else math.inf,
                             math.inf if spec.timeout_s is None
                             else r.arrival[i] + spec.timeout_s)
                if expiry <= now:
                    heapq.heappop(heap)
                    self.work -= s.prompt[i] + s.output[i]
                    r.outcome[i], r.finish[i] = "timed_out", expiry
                    if r.replica[i] < 0:
                        r.replica[i] = self.index
                    continue
            heapq.heappop(heap)
            r.replica[i] = self.index
            r.admitted[i] = now
            cached = self._prefix_hit(i) if self.spec.prefix_cache_blocks else 0
            r.cached[i] = cached
            s.left[i] = s.prompt[i] - cached
            if self.user_cost:
                s.prefilled[i] = cached
                self.order.append(i)
            self.work -= cached
            self.running.add(i)
            self.prefilling.append(i)

    # ---- one step
    def _decode_time(self, batch: int) -> float:
        cache = self.decode_cache
        if cache is None:
            return self.spec.decode_time(batch)
        while len(cache) <= batch:
            cache.append(self.spec.decode_time(len(cache)))
        return cache[batch]

    def plan(self, now: float) -> None:
        """Admit what fits and start the next step (or run of identical steps) at
        ``now``, or go idle."""
        self._admit(now)
        left, budget = self.s.left, self.chunk
        chunks, tokens = [], 0
        for i in self.prefilling:
            if budget <= 0:
                break
            take = left[i] if left[i] < budget else budget
            chunks.append((i, take))
            budget -= take
            tokens += take
        decoding = len(self.finishes)
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
            repeat = max(self.finishes[0][0] - self.ticks, 1)
            self.busy_until = now + repeat * duration
        else:
            duration = self._decode_time(decoding) + tokens / self.rate
            self.busy_until = now + duration
            if len(chunks) == 1 and budget <= 0:          # one full chunk: may repeat
                repeat = self._chunk_run(now, duration, chunks[0][0])
        self.step_chunks, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration

    def _user_cost(self, chunks) -> float:
        """The step's duration from the reader's cost model, given the same detail the
        reference builds (decodes in admission order)."""
        prompt, joined, ticks = self.s.prompt, self.joined, self.ticks
        context = [prompt[i] + 1 + ticks - joined[i][0] for i in self.order if i in joined]
        return self.spec.cost(StepDetail(
            prefill_chunks=np.array([take for _, take in chunks], dtype=np.int64),
            prefill_cached=np.array([self.s.prefilled[i] for i, _ in chunks], dtype=np.int64),
            decode_context=np.array(context, dtype=np.int64)))

    def _chunk_run(self, now: float, duration: float, i: int) -> int:
        """Steps that prefill ``chunk_tokens`` of prompt ``i`` with the same decodes,
        until its last chunk or the first finish (after which the batch changes).
        Admission cannot change them: the queue is empty or the batch full."""
        if self.queue.heap and len(self.running) < self.max_batch:
            return 1
        n = self.s.left[i] // self.chunk
        if self.s.left[i] % self.chunk == 0:
            n -= 1                                      # its last chunk emits a token
        if self.finishes:
            n = min(n, self.finishes[0][0] - self.ticks)
        if n <= 1:
            return 1
        bounds, end = [], now
        for _ in range(n):
            end += duration
            bounds.append(end)
        self.bounds, self.busy_until = bounds, end
        self.step_work = self.chunk + len(self.finishes)
        return n

    def cut(self, t: float) -> None:
        """A request that could join arrived at ``t``: end the run at the first step
        boundary at or after ``t``."""
        if self.repeat <= 1:
            return
        if self.bounds is None:
            super().cut(t)
            return
        if self.busy_until == math.inf or len(self.running) >= self.max_batch:
            return
        keep = max(1, bisect.bisect_left(self.bounds, t) + 1)
        if keep < self.repeat:
            del self.bounds[keep:]
            self.repeat, self.busy_until = keep, self.bounds[-1]

    def finish_step(self) -> None:
        """Apply the step (or run) that ends at ``busy_until``."""
        now, r, s = self.busy_until, self.req, self.s
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
        finishes = self.finishes
        while finishes and finishes[0][0] <= self.ticks:
            i = heapq.heappop(finishes)[1]
            self._done(i, now, s.output[i])
            r.max_gap[i] = max(gaps[self.joined.pop(i)[1]:])

    def _first_token(self, i: int, now: float) -> None:
        r = self.req
        r.first[i] = now
        if self.spec.prefix_cache_blocks:
            self._remember_prefix(i)
        self.work -= 1
        output = self.s.output[i]
        if output == 1:
            self._done(i, now, 1)
            return
        self.joined[i] = (self.ticks, len(self.gaps))
        heapq.heappush(self.finishes, (self.ticks + output - 1, i))

    def _done(self, i: int, now: float, generated: int) -> None:
        r = self.req
        r.finish[i], r.outcome[i], r.generated[i] = now, "done", generated
        self.running.discard(i)
        if self.user_cost:
            self.order.remove(i)
