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
the reference does, so every time is the same float. A chunk run also takes the
prompt's last chunk when nothing could be admitted at its start, and in mixed mode
(without timeouts, memory limit, preemption or prefix cache) the decode steps that the
prompt's first token leads into, up to the next finish (its *tail*): then a prompt
prefilled in one step (its only chunk, with budget to spare) and its tail are one run
too. An arrival that
could join cuts either kind of run at the next step boundary at or after it (in mixed
mode, a chunk run only before a last chunk that leaves budget, or in its tail: a
full-budget step admits nothing). A reader's cost model
(``Replica(step_time=...)``) gets the reference's step detail every step, and steps
are never taken together, as in the reference: there the gain is smaller (about 1.7x
with DistServe's profile), bounded by the cost model's own time.

Step times of the built-in cost are remembered by composition (decode batch, prefill
tokens), once per run for all its replicas (:meth:`Shared.memo`). In mixed mode without
timeouts, memory limit, preemption, prefix cache, cost model or ``until_s`` (the
default ``Replica()``'s case), a request is never preempted and no
step can be cut by a horizon: :meth:`FastEngine._plan_tail`, :meth:`FastEngine._tail_run`,
:meth:`FastEngine._finish_tail` and :meth:`FastEngine._cut_tail` then stand for the
general methods, with the branches those features need taken out (issue 19: there a
plan and a step's end are paid per request, so their overhead is the replay's time).

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


def _summed(start: float, duration: float, n: int) -> tuple[float, float]:
    """``start`` plus ``duration`` added ``n`` times one at a time (the reference's
    step ends), and the largest difference between consecutive sums (s), by numpy's
    ``add.accumulate``, which adds in order as Python does (for long runs: a short
    one is summed in a Python loop by the caller, faster there)."""
    ends = np.full(n + 1, duration)
    ends[0] = start
    ends = np.add.accumulate(ends)
    return float(ends[-1]), float((ends[1:] - ends[:-1]).max())


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
        self.memos: dict = {}                 # id(spec) -> (spec, decode times, step times)

    def memo(self, spec) -> tuple[list[float], list]:
        """The decode-step times by batch (s) and the step times by composition of
        ``spec``, shared by the replicas of a run (each step time is a function of the
        spec and the composition only): per decode batch (0 to ``max_batch``, or to
        the number of requests when that is smaller), a row indexed by prefill tokens
        whose entry is None until that step time is known (a list up to the step's
        token bound, or a :class:`_Row` when that is large or not an int)."""
        kept = self.memos.get(id(spec))
        if kept is None:
            bound = spec.token_cap()
            if bound == math.inf:
                bound = spec.chunk_tokens or math.inf
            rows = int(min(spec.max_batch, len(self.left))) + 1     # decode batches
            if type(bound) is int and bound * rows <= 1 << 17:   # (not 256.0: an index)
                table = [[None] * (bound + 1) for _ in range(rows)]
            else:
                table = [_Row() for _ in range(rows)]
            kept = self.memos[id(spec)] = (spec, [], table)
        return kept[1], kept[2]


class _Row(dict):
    """A row of step times (prefill tokens -> s) that reads None where not known."""

    def __missing__(self, tokens: int) -> None:
        return None


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
        decodes, steps = shared.memo(spec)
        self.decode_cache: list[float] | None = None if callable(spec.decode_step_s) else decodes
        # step times by composition (by decode batch, then prefill tokens), when
        # compositions repeat (a token cap or chunks)
        self.step_memo: list | None = (
            steps if self.decode_cache is not None and (spec.token_cap() != math.inf
                                                        or spec.chunk_tokens) else None)
        # the additive cost without a memo: decode step plus prefill, summed in place
        self.additive = self.decode_cache is not None and spec.step_cost == "additive"
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
        self.chunk_run = False                # the step in flight is a chunk run
        self.bounds: list[float] | None = None    # its step ends, summed (when asked)
        self.run_gap: float | None = None     # its largest step (None: recount)
        self.run_full_end = 0.0               # end of its full-budget steps (s)
        self.run_full_gap = 0.0               # their largest step (s)
        self.step_work = 0                    # work done by one step of a chunk run
        self.run_last = 0                     # a chunk run's last chunk (0: not in it)
        self.last_admits = False              # could admit at that chunk's start
        self.run_steps = 0                    # the chunk run's steps
        # mixed mode: the decode steps the prompt's first token leads into, taken with
        # the chunk run when nothing can join in between (:meth:`_tail_run`)
        self.tail = 0                         # how many (0: none)
        self.tail_start = self.tail_s = 0.0   # their start and duration (s)
        # mixed mode without timeouts, a memory limit or preemption, a cost model, a
        # prefix cache or until_s: every step admits, plans and runs as in
        # :meth:`_plan_tail` (the general :meth:`plan` with its branches decided)
        self.tail_fast = (self.mixed and not (self.expires or self.evicts or self.user_cost
                                              or spec.prefix_cache_blocks)
                          and shared.horizon == math.inf)
        if self.tail_fast:                    # (instance attributes: hot calls)
            self.plan, self.finish_step, self.cut = (self._plan_tail, self._finish_tail,
                                                     self._cut_tail)

    # ---- the router's view
    def _step_batch(self) -> int:
        return self.step_decode

    def work_at(self, t: float) -> int:
        """Outstanding work (tokens) at ``t``, as if the steps of a run ending before
        ``t`` had been applied one by one."""
        repeat = self.repeat
        if repeat <= 1 or self.busy_until == math.inf:
            return self.work
        if not self.chunk_run:              # (the reference's, written in: oracle_work
            ended = math.ceil((t - self.step_start) / self.step_duration) - 1   # asks
            if ended < 0:                   # every replica at every arrival)
                ended = 0
            elif ended > repeat:
                ended = repeat
            return self.work - ended * self.step_decode
        if self.tail and t > self.tail_start:          # the chunk run is over
            decoding = self.step_decode
            done = (self.run_steps - 1) * self.step_work + self.run_last + decoding + 1
            ended = math.ceil((t - self.tail_start) / self.tail_s) - 1      # (_tail_ended)
            if ended < 0:
                ended = 0
            elif ended > self.tail:
                ended = self.tail
            return self.work - done - ended * (decoding + 1)
        return self.work - bisect.bisect_left(self._run_bounds(), t) * self.step_work

    def enqueue(self, i: int) -> None:
        """The reference's, reading Python numbers instead of numpy scalars (the fcfs
        key too: the same value, so the same order, cheaper to compare in the heap)."""
        s = self.s
        if self.policy == "fcfs":
            heapq.heappush(self.queue.heap, ((s.arrival[i], i), i))
        else:
            self.queue.push(self.req.key(i, self.policy), i)
        self.work += s.prompt[i] + s.output[i]

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
        room, left = self.cap - len(self.joined), self.s.left
        for i in self.prefilling:
            room -= left[i]
        return room

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
            if capped and (room <= 0 if self.mixed else not self._fits(i, room)):
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

    def _step_time(self, decoding: int, tokens: int) -> float:
        """The built-in cost of a step of ``decoding`` decodes and ``tokens`` prefill
        tokens (:meth:`servingcap.serving.Replica.step_s`), remembered by composition
        when the decode curve is a table or a constant."""
        memo = self.step_memo
        if memo is None:
            return self.spec.step_s(decoding, tokens, self._decode_time(decoding))
        row = memo[decoding]
        seconds = row[tokens]
        if seconds is None:
            seconds = row[tokens] = self.spec.step_s(decoding, tokens,
                                                     self._decode_time(decoding))
        return seconds

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
        self.chunk_run = False
        if not chunks and not decoding:
            self.busy_until = math.inf
            self.step_chunks, self.step_decode = [], 0
            return
        repeat = 1
        if self.user_cost:
            duration = self._user_cost(chunks)
            self.busy_until = now + duration
        elif not chunks:
            cache = self.decode_cache
            duration = (cache[decoding] if cache is not None and decoding < len(cache)
                        else self._decode_time(decoding))
            repeat = (self._next_finish() if self.evicts else self.finishes[0][0]) - self.ticks
            if repeat < 1:
                repeat = 1
            elif repeat > 1 and self.limit != math.inf:
                repeat = self._fits_ahead(repeat)
            self.busy_until = now + repeat * duration
        else:
            memo = self.step_memo
            if memo is not None:
                duration = memo[decoding][tokens]
                if duration is None:
                    duration = self._step_time(decoding, tokens)
            elif self.additive:               # (Replica.step_s written in: a hot path)
                cache = self.decode_cache
                duration = (cache[decoding] if decoding < len(cache)
                            else self._decode_time(decoding)) + tokens / self.rate
            else:
                duration = self._step_time(decoding, tokens)
            self.busy_until = now + duration
            if len(chunks) == 1 and budget <= 0 and not self.evicted:   # may repeat
                repeat = self._chunk_run(now, duration, *chunks[0])
        self.step_chunks, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration

    def _plan_tail(self, now: float) -> None:
        """:meth:`plan` when :attr:`tail_fast` (mixed mode without timeouts, memory
        limit, preemption, prefix cache, cost model or ``until_s``): the same step with
        the branches those settle taken out. Admission fills free slots while the
        step's budget has room (:meth:`_fill_free_slots`; a request is never preempted,
        so it starts with its whole prompt to prefill); a step with one chunk may be a
        run (:meth:`_tail_run`)."""
        r, s, heap = self.req, self.s, self.queue.heap
        left, running, prefilling = s.left, self.running, self.prefilling
        decoding = len(self.joined)
        if heap and len(running) < self.max_batch:
            room = self.cap - decoding
            for i in prefilling:
                room -= left[i]
            prompt, index = s.prompt, self.index
            while room > 0 and heap and len(running) < self.max_batch:
                i = heapq.heappop(heap)[1]
                r.replica[i], r.admitted[i] = index, now     # (:meth:`_start`)
                room -= prompt[i]
                left[i] = prompt[i]
                s.prefilled[i] = 0
                running[i] = None
                prefilling.append(i)
        budget = self.cap - decoding
        single = len(prefilling) == 1 and budget > 0
        if single:                                     # (the common case: one prompt)
            i = prefilling[0]
            take = tokens = left[i] if left[i] < budget else budget
            chunks = [(i, take)]
        else:
            chunks, tokens = [], 0
            for i in prefilling:
                if budget <= 0:
                    break
                take = left[i] if left[i] < budget else budget
                chunks.append((i, take))
                budget -= take
                tokens += take
        self.chunk_run = False
        repeat = 1
        if chunks:
            memo = self.step_memo
            duration = None if memo is None else memo[decoding][tokens]
            if duration is None:
                duration = self._step_time(decoding, tokens)
            self.busy_until = now + duration
            if single:                                 # may be a run, with its tail
                repeat = self._tail_run(now, duration, i, take)
            elif len(chunks) == 1:
                repeat = self._tail_run(now, duration, *chunks[0])
        elif decoding:
            cache = self.decode_cache
            duration = (cache[decoding] if cache is not None and decoding < len(cache)
                        else self._decode_time(decoding))
            repeat = self.finishes[0][0] - self.ticks
            if repeat < 1:
                repeat = 1
            self.busy_until = now + repeat * duration
        else:
            self.busy_until = math.inf
            self.step_chunks, self.step_decode = [], 0
            return
        self.step_chunks, self.step_decode, self.repeat = chunks, decoding, repeat
        self.step_start, self.step_duration = now, duration

    def _tail_run(self, now: float, duration: float, i: int, take: int) -> int:
        """:meth:`_chunk_run` when :attr:`tail_fast`: the same run (its chunks, its
        last chunk, its tail) with the branches of timeouts, memory, preemption and
        ``until_s`` taken out."""
        n, rest = divmod(self.s.left[i], take)
        if rest == 0:
            n, rest = n - 1, take                       # its last chunk emits a token
        heap = self.queue.heap
        last = len(self.prefilling) == 1 and not (heap and len(self.running) < self.max_batch)
        steps = n + 1 if last else n
        decoding = len(self.joined)
        tail = 0
        if decoding:                                    # ticks to the next finish
            finish = self.finishes[0][0] - self.ticks
            if finish < steps:
                steps, last = finish, False
        if last:                                        # the tail
            tail = self.s.output[i] - 1
            if decoding and finish - steps < tail:
                tail = finish - steps
        if steps <= 1 and tail < 1:
            return 1
        full = steps - 1 if last else steps
        end, largest = now, 0.0                         # summed as in _chunk_run
        if full > 24:
            end, largest = _summed(now, duration, full)
        else:
            for _ in range(full):
                after = end + duration
                if after - end > largest:
                    largest = after - end
                end = after
        self.run_full_end, self.run_full_gap = end, largest
        if last:
            if rest == take:
                after = end + duration
            else:
                memo = self.step_memo
                seconds = None if memo is None else memo[decoding][rest]
                after = end + (self._step_time(decoding, rest) if seconds is None
                               else seconds)
            if after - end > largest:
                largest = after - end
            end = after
            n = full + 1
        else:
            n = full
            if n == 1:
                return 1
        self.chunk_run, self.busy_until = True, end
        self.run_gap, self.step_work = largest, take + decoding
        self.run_last = rest if last else 0
        self.last_admits = last and rest < take
        self.run_steps, self.tail = n, 0
        if tail >= 1:
            cache = self.decode_cache
            tail_s = (cache[decoding + 1] if cache is not None and decoding + 1 < len(cache)
                      else self._decode_time(decoding + 1))
            self.tail, self.tail_start, self.tail_s = tail, end, tail_s
            self.busy_until = end + tail * tail_s
            n += tail
        return n

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
        until its last chunk (included when nothing could be admitted at its start,
        see below), the first finish (after which the batch changes) or the last step
        whose decodes fit in memory. Taken only when no step of the run could admit or
        preempt: the queue is empty, or the batch is full (with ``preemptive``, the
        running sequences' policy keys only improve as they decode), or the head of
        the queue waits for memory, which only fills up during the run (and no timeout
        can take it meanwhile); in mixed mode a full chunk fills the budget, so no
        waiting request can be admitted before the last chunk (and none times out
        meanwhile, as then the reference would pop it at a boundary).

        The last chunk (which emits the prompt's first token, and in mixed mode may
        leave budget for a waiting request) ends the run when no other prompt waits
        to prefill behind it and, at its start, nothing could be admitted either: in
        combined mode whenever the run is taken, in mixed mode when the queue is empty
        (an arrival cuts the run before that step, :meth:`cut`) or the batch is full
        and nothing preempts; and with a KV limit, when its emitting step fits in
        memory. Arrivals cut the run (:meth:`cut`); a
        queue shared with replicas that preempt is never run ahead.

        In mixed mode without timeouts, memory limit, preemption, prefix cache or
        ``until_s`` (:attr:`tail_fast`), :meth:`_plan_tail` runs :meth:`_tail_run`
        instead, which also takes the run's *tail*: the decode steps the prompt's
        first token leads into."""
        limit, heap, mixed, evicts = self.limit, self.queue.heap, self.mixed, self.evicts
        if evicts and len(self.queue.replicas) > 1:
            return 1                     # another replica may requeue a preempted one
        full_batch = len(self.running) >= self.max_batch
        if heap and not full_batch and (self.expires or not (limit != math.inf or mixed)):
            return 1
        n, rest = divmod(self.s.left[i], take)
        if rest == 0:
            n, rest = n - 1, take                       # its last chunk emits a token
        last = len(self.prefilling) == 1 and not (     # no prompt waits behind it
            mixed and heap and (self.preemptive or not full_batch))
        steps = n + 1 if last else n
        decoding = len(self.joined)
        if decoding:                                    # ticks to the next finish
            finish = (self._next_finish() if evicts else self.finishes[0][0]) - self.ticks
            if finish < steps:
                steps, last = finish, False
        if limit != math.inf and steps > 1:
            if last and self._kv(steps, (i,)) > limit:
                last, steps = False, n
            if not last and steps > 1:
                steps = self._fits_ahead(steps)
        horizon = self.s.horizon
        if steps <= 1:
            return 1
        full = steps - 1 if last else steps
        # the steps' ends, summed one at a time as the reference does, and the largest
        # step (its inter-token gap); the list itself is built only if asked for
        end, largest = now, 0.0
        if horizon == math.inf:
            if full > 24:
                end, largest = _summed(now, duration, full)
            else:
                for _ in range(full):
                    after = end + duration
                    if after - end > largest:
                        largest = after - end
                    end = after
        else:
            for k in range(full):
                after = end + duration
                if after > horizon and k:
                    full, last = k, False   # until_s: the reference applies those before
                    break
                if after - end > largest:
                    largest = after - end
                end = after
        self.run_full_end, self.run_full_gap = end, largest
        if last:
            if rest == take:
                after = end + duration
            else:                        # (the step-time memo read here: a hot path)
                memo = self.step_memo
                seconds = None if memo is None else memo[decoding][rest]
                after = end + (self._step_time(decoding, rest) if seconds is None
                               else seconds)
            if after > horizon:
                last = False
            else:
                if after - end > largest:
                    largest = after - end
                end = after
        n = full + 1 if last else full
        if n == 1:
            return 1
        self.chunk_run, self.busy_until = True, end     # (bounds: None since the last)
        self.run_gap, self.step_work = largest, take + decoding
        # the run's last chunk (0: none), and whether a request could be admitted at
        # its start had one arrived (mixed mode, budget left beside it)
        self.run_last = rest if last else 0
        self.last_admits = last and mixed and rest < take
        self.run_steps = n
        return n

    def _tail_ended(self, t: float) -> int:
        """Steps of the tail that ended before ``t`` (after its start), as the
        reference's ``_steps_ended`` counts a decode run's."""
        return min(max(math.ceil((t - self.tail_start) / self.tail_s) - 1, 0), self.tail)

    def _run_bounds(self) -> list[float]:
        """The ends of the chunk run's steps (s), summed as :meth:`_chunk_run` did."""
        if self.bounds is None:
            bounds, end, duration = [], self.step_start, self.step_duration
            for _ in range(self.run_steps - 1 if self.run_last else self.run_steps):
                end += duration
                bounds.append(end)
            if self.run_last:
                bounds.append(self.busy_until)
            self.bounds = bounds
        return self.bounds

    def cut(self, t: float) -> None:
        """A request that could join arrived at ``t``: end the run at the first step
        boundary at or after ``t``. In mixed mode without timeouts the full-budget
        steps of a chunk run admit nothing: only a last chunk that leaves budget is
        cut (the run then ends before it), and only when ``t`` is at or before its
        start."""
        if self.repeat <= 1:
            return
        if not self.chunk_run:
            _Engine.cut(self, t)                        # (super() costs more: hot path)
            return
        if self.busy_until == math.inf or (len(self.running) >= self.max_batch
                                           and not self.preemptive):
            return
        if self.mixed and not self.expires:
            if self.last_admits and t <= self.run_full_end:
                self.repeat = self.run_steps = self.run_steps - 1
                self.busy_until, self.run_gap = self.run_full_end, self.run_full_gap
                self.run_last, self.last_admits, self.bounds = 0, False, None
            return
        bounds = self._run_bounds()
        keep = max(1, bisect.bisect_left(bounds, t) + 1)
        if keep < self.repeat:
            del bounds[keep:]
            self.repeat = self.run_steps = keep
            self.busy_until = bounds[-1]
            self.run_last, self.last_admits, self.run_gap = 0, False, None

    def _kept_gap(self) -> float:
        """The largest step (s) of a chunk run cut to the step ends in :attr:`bounds`."""
        previous, largest = self.step_start, 0.0
        for end in self.bounds:
            if end - previous > largest:
                largest = end - previous
            previous = end
        return largest

    def finish_step(self) -> None:
        """Apply the step (or run) that ends at ``busy_until``."""
        now, s = self.busy_until, self.s
        repeat, decoding, gaps = self.repeat, self.step_decode, self.gaps
        if self.chunk_run:                             # a chunk run
            self.chunk_run = False
            repeat = self.run_steps
            if decoding:
                # one entry for the run, its largest gap: no sequence joins or leaves
                # inside a run, so every later max over the log sees all of it
                largest = self.run_gap
                if largest is None:                    # cut: the steps kept
                    largest = self._kept_gap()
                gaps.append(largest)
                self.ticks += repeat
            (i, take), = self.step_chunks
            rest = self.run_last
            self.bounds = None
            if rest:                                   # the last chunk: first token
                s.left[i] = 0
                self.work -= self.step_work * (repeat - 1) + rest + decoding
                del self.prefilling[0]
                self._first_token(i, now)
            else:
                s.left[i] -= take * repeat
                self.work -= self.step_work * repeat
        else:
            if decoding:                               # a run of decode steps
                if repeat > 1:
                    step = (now - self.step_start) / repeat
                    after = now - (now - step)
                    gaps.append(after if after > step else step)
                else:
                    gaps.append(now - self.step_start)
                self.ticks += repeat
                self.work -= repeat * decoding
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
        if finishes and finishes[0][0] <= self.ticks:
            self._retire(now)

    def _finish_tail(self) -> None:
        """:meth:`finish_step` when :attr:`tail_fast`: the same updates, with
        :meth:`_first_token` (a request is never preempted, so its prefill ends with its
        first token) and :meth:`_retire` written in, and one block for a run of decode
        steps (a chunk run's tail, or a plain run)."""
        now, s, gaps = self.busy_until, self.s, self.gaps
        decoding = self.step_decode
        if self.chunk_run:                             # a chunk run
            self.chunk_run = False
            tail, repeat = self.tail, self.run_steps
            if decoding:
                largest = self.run_gap
                if largest is None:                    # cut: the steps kept
                    largest = self._kept_gap()
                gaps.append(largest)
                self.ticks += repeat
            (i, take), = self.step_chunks
            rest = self.run_last
            self.bounds = None
            if rest:                                   # the last chunk: first token
                s.left[i] = 0
                self.work -= self.step_work * (repeat - 1) + rest + decoding + 1
                del self.prefilling[0]
                first = self.tail_start if tail else now
                self.req.first[i] = first
                output = s.output[i]
                if output <= 1:
                    self._done(i, first, 1)
                else:
                    base = 1 - self.ticks
                    self.joined[i] = (base, len(gaps))
                    heapq.heappush(self.finishes, (output - base, i))
            else:
                s.left[i] -= take * repeat
                self.work -= self.step_work * repeat
            chunks = ()
            if tail:                                   # then the decode steps after it
                self.tail = 0
                start, repeat, decoding = self.tail_start, tail, decoding + 1
            else:
                decoding = 0
        else:
            start, repeat, chunks = self.step_start, self.repeat, self.step_chunks
        if decoding:                                   # a run of decode steps
            if repeat > 1:
                step = (now - start) / repeat
                after = now - (now - step)
                gaps.append(after if after > step else step)
            else:
                gaps.append(now - start)
            self.ticks += repeat
            self.work -= repeat * decoding
        if chunks:                                     # after the decodes, as the
            done = 0                                   # reference orders them
            for i, take in chunks:
                self.work -= take
                left = s.left[i] = s.left[i] - take
                if left == 0:
                    done += 1
                    self._first_token(i, now)
            if done:
                del self.prefilling[:done]
        finishes = self.finishes                       # :meth:`_retire`, written in
        if finishes and finishes[0][0] <= self.ticks:
            r, joined, output, ticks = self.req, self.joined, s.output, self.ticks
            running, generated, logged = self.running, s.generated, len(gaps)
            while finishes and finishes[0][0] <= ticks:
                i = heapq.heappop(finishes)[1]
                at = joined.pop(i)[1]
                g = generated[i] = output[i]
                r.finish[i], r.outcome[i], r.generated[i] = now, "done", g
                del running[i]
                if at < logged:              # (its largest gap is 0 until now: a request
                    r.max_gap[i] = max(gaps[at:])      # is never preempted or recomputed)

    def _cut_tail(self, t: float) -> None:
        """:meth:`cut` when :attr:`tail_fast`, with :meth:`servingcap.serving._Engine.cut`
        written in for a run of decode steps."""
        if self.repeat <= 1 or self.busy_until == math.inf:
            return
        if len(self.running) >= self.max_batch:
            return
        if not self.chunk_run:
            keep = math.ceil((t - self.step_start) / self.step_duration)
            if keep < self.repeat:
                if keep < 1:
                    keep = 1
                self.repeat = keep
                self.busy_until = self.step_start + keep * self.step_duration
            return
        if self.tail:
            if t > self.tail_start:                     # in the tail: as a decode run
                keep = max(1, math.ceil((t - self.tail_start) / self.tail_s))
                if keep < self.tail:
                    self.repeat -= self.tail - keep
                    self.tail = keep
                    self.busy_until = self.tail_start + keep * self.tail_s
                return
            self.repeat, self.tail = self.run_steps, 0  # admitted at its start
            self.busy_until = self.tail_start
        if self.last_admits and t <= self.run_full_end:
            self.repeat = self.run_steps = self.run_steps - 1
            self.busy_until, self.run_gap = self.run_full_end, self.run_full_gap
            self.run_last, self.last_admits, self.bounds = 0, False, None

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
        if not self.chunk_run:
            return super()._steps_ended(t)
        return bisect.bisect_left(self._run_bounds(), t)

    def kv_tokens(self, t: float) -> int:
        """KV-cache tokens in use at ``t``: prompt plus tokens generated so far."""
        s, joined, ticks = self.s, self.joined, self.ticks
        prompt, generated = s.prompt, s.generated
        used = 0
        for i in self.running:
            j = joined.get(i)
            used += prompt[i] + (generated[i] if j is None else j[0] + ticks)
        if self.tail and self.chunk_run and t > self.tail_start:
            decoding = self.step_decode                # the chunk run's, then i's first
            return (used + self.run_steps * decoding + 1
                    + self._tail_ended(t) * (decoding + 1))
        return used + self._steps_ended(t) * self.step_decode

    def pending_prefill(self, t: float) -> int:
        """Prompt tokens still to prefill at ``t``: what admitted requests have left."""
        left = self.s.left
        pending = sum(left[i] for i in self.running)
        if self.chunk_run:
            if self.tail and t > self.tail_start:      # the prompt is prefilled
                return pending - left[self.step_chunks[0][0]]
            # each step of a chunk run prefills the run's chunk (step_work less decodes)
            take = self.step_work - self.step_decode
            pending -= bisect.bisect_left(self._run_bounds(), t) * take
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
        self.chunk_run, repeat = False, 1
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
