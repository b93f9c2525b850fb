"""A seeded simulator of an agent system, for measuring Little's law at every boundary.

The system (units: seconds, tokens, tasks/s):

- **Tasks** arrive as a Poisson process at ``task_rate``. Each task runs an agent loop of
  ``K`` inference calls, ``K = 1 + Poisson(calls_per_task - 1)``, with one tool operation
  between consecutive calls (``K - 1`` tool operations), strictly in sequence: a call is
  issued when the previous tool operation returns.
- **Gateway and engine.** A call waits in one FCFS queue at the gateway for one of the
  engine's ``slots`` admitted-sequence slots (the pooled M/G/c queue that
  :func:`servingcap.sim.fcfs_waits` computes with ``servers=slots``). An admitted call
  holds its slot for ``prompt_tokens / prefill_rate + output_tokens * decode_step_s``
  (prefill, then one decode step per output token); its output length is geometric
  with mean ``output_tokens``. If ``queue_cap`` calls are already waiting, the gateway
  rejects the call (HTTP 429) and its task ends as rejected.
- **KV blocks.** An admitted sequence holds ``ceil(tokens / block_tokens)`` KV blocks:
  its prompt blocks from admission, then one more block each time its generated tokens
  cross a block boundary (output token ``j`` is written ``prefill + (j - 1) * decode_step_s``
  after admission). All its blocks are freed when it leaves its slot.
- **Tools.** A tool operation waits in a FCFS queue for one of ``tool_limit`` concurrent
  operations the external service allows (its rate limit), then takes an exponential
  time with mean ``tool_s``.
- **Humans.** A task that finishes its loop escalates to a human with probability
  ``escalation_prob``; exceptions wait FCFS for one of ``reviewers`` people, who take an
  exponential time with mean ``human_s``.

The loop feeds back (a call's arrival time depends on the engine and tool waits before
it), so the simulator processes events in time order. Each queue is served exactly like
:func:`servingcap.sim.fcfs_waits`: feeding a queue's recorded arrival and service times
to ``fcfs_waits(..., servers=slots)`` reproduces its waits (the tests check this). The
human queue has no feedback and is computed with ``fcfs_waits`` directly.

The second half of the module (chapter "Agents multiply traffic") simulates **fan-out**:
an orchestrator sends ``k`` parallel branches of one task to a shared route, keeps the
first acceptable answer, retries failed requests by failure class, and cancels the
losing branches some time after the winner (:class:`FanOut`, :func:`simulate_fanout`,
:func:`branch_attempts`, :func:`peak_in_flight`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import pandas as pd

from . import _check, stats
from .sim import fcfs_waits, measure_little, poisson_arrivals_until

__all__ = ["AgentSystem", "AgentRun", "simulate", "replicated_little", "BOUNDARIES",
           "FanOut", "FanOutRun", "simulate_fanout", "BranchAttempts", "branch_attempts",
           "peak_in_flight"]

BOUNDARIES = (
    "tasks in orchestrator",
    "requests at gateway",
    "waiting at gateway",
    "sequences in engine",
    "KV blocks in memory",
    "tool operations",
    "exceptions with humans",
)
"""The boundaries :meth:`AgentRun.boundary` knows, from the outside in."""


class _EngineShape:
    """What a simulated route shares: slots, prompt/output shape and engine speeds.

    Mixed into the frozen dataclasses below, which define the fields ``slots``,
    ``prompt_tokens``, ``output_tokens``, ``prefill_rate`` and ``decode_step_s``.
    """

    def replace(self, **changes):
        """A copy with some fields changed, validated like the original."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_params(cls, params, **changes):
        """Take the engine's speeds and request shape from a :class:`~servingcap.ServingParams`."""
        base = dict(slots=params.decode_batch, prompt_tokens=params.prompt_tokens,
                    output_tokens=float(params.output_tokens), prefill_rate=params.prefill_rate,
                    decode_step_s=params.decode_step_s)
        base.update(changes)
        return cls(**base)

    @property
    def mean_hold_s(self) -> float:
        """Mean time a request holds an engine slot (s): prefill + mean output * step."""
        return self.prompt_tokens / self.prefill_rate + self.output_tokens * self.decode_step_s


@dataclass(frozen=True)
class AgentSystem(_EngineShape):
    """The parameters of one agent system (seconds, tokens, tokens/s, tasks/s)."""

    task_rate: float = 0.6
    """User tasks arriving per second (Poisson), tasks/s."""
    calls_per_task: float = 6.0
    """Mean inference calls per task (>= 1); one tool operation between consecutive calls."""
    slots: int = 32
    """Sequences the engine admits at once (its batch slots)."""
    queue_cap: int | None = 64
    """Calls allowed to wait at the gateway; the next one is rejected. None: unbounded."""
    prompt_tokens: int = 2_000
    """Prompt length of every call (tokens)."""
    output_tokens: float = 300.0
    """Mean output length (tokens); lengths are geometric, so their CV is about 1."""
    prefill_rate: float = 8_000.0
    """Prompt tokens prefilled per second (tokens/s)."""
    decode_step_s: float = 0.030
    """Time per output token of an admitted sequence (s)."""
    block_tokens: int = 16
    """Tokens per KV-cache block (PagedAttention-style paging)."""
    tool_s: float = 2.2
    """Mean duration of one tool operation at the external service (s)."""
    tool_limit: int = 7
    """Tool operations the external service runs at once (its concurrency limit)."""
    escalation_prob: float = 0.05
    """Probability that a finished task escalates to a human (0 <= p < 1)."""
    human_s: float = 300.0
    """Mean time a human takes to resolve one exception (s)."""
    reviewers: int = 10
    """Humans resolving exceptions in parallel."""

    def __post_init__(self):
        for name in ("task_rate", "output_tokens", "prefill_rate", "decode_step_s",
                     "tool_s", "human_s"):
            object.__setattr__(self, name, _check.positive(name, getattr(self, name)))
        calls = _check.number("calls_per_task", self.calls_per_task)
        if calls < 1:
            raise ValueError(f"calls_per_task must be >= 1, got {self.calls_per_task!r}")
        object.__setattr__(self, "calls_per_task", calls)
        for name in ("slots", "prompt_tokens", "block_tokens", "tool_limit", "reviewers"):
            object.__setattr__(self, name, _check.whole(name, getattr(self, name)))
        if self.queue_cap is not None:
            object.__setattr__(self, "queue_cap", _check.whole("queue_cap", self.queue_cap, 0))
        p = _check.number("escalation_prob", self.escalation_prob)
        if not 0 <= p < 1:
            raise ValueError(f"escalation_prob must be in [0, 1), got {self.escalation_prob!r}")
        object.__setattr__(self, "escalation_prob", p)
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens!r}")

    @property
    def call_rate(self) -> float:
        """Offered inference calls per second (calls/s), before any rejection."""
        return self.task_rate * self.calls_per_task

    @property
    def engine_load(self) -> float:
        """Offered engine load (busy slots): call rate x mean hold."""
        return self.call_rate * self.mean_hold_s

    @property
    def tool_load(self) -> float:
        """Offered tool load (busy tool operations) if no task is rejected."""
        return self.task_rate * (self.calls_per_task - 1) * self.tool_s

    @property
    def human_load(self) -> float:
        """Offered human load (busy reviewers) if no task is rejected."""
        return self.task_rate * self.escalation_prob * self.human_s


@dataclass(frozen=True)
class AgentRun:
    """The output of :func:`simulate`: one DataFrame per kind of item (times in s)."""

    system: AgentSystem
    horizon_s: float
    tasks: pd.DataFrame
    """One row per task: ``arrival_s, finish_s, planned_calls, outcome``, ``escalated``.

    ``outcome`` is 'done' or 'rejected' (a call got a 429)."""
    calls: pd.DataFrame
    """One row per call issued: ``task, arrival_s, start_s, finish_s, output_tokens, rejected``."""
    tools: pd.DataFrame
    """One row per tool operation: ``task, arrival_s, start_s, finish_s``."""
    humans: pd.DataFrame
    """One row per exception: ``task, arrival_s, start_s, finish_s``."""

    def boundary(self, name: str):
        """Entry times, exit times and weights (items per row) at one boundary.

        ``name`` is one of :data:`BOUNDARIES`. Rejected calls spend no time at the
        gateway and are left out of the gateway and engine boundaries.
        """
        ok = self.calls[~self.calls["rejected"]]
        if name == "tasks in orchestrator":
            return self.tasks["arrival_s"].to_numpy(), self.tasks["finish_s"].to_numpy(), None
        if name == "requests at gateway":
            return ok["arrival_s"].to_numpy(), ok["finish_s"].to_numpy(), None
        if name == "waiting at gateway":
            return ok["arrival_s"].to_numpy(), ok["start_s"].to_numpy(), None
        if name == "sequences in engine":
            return ok["start_s"].to_numpy(), ok["finish_s"].to_numpy(), None
        if name == "KV blocks in memory":
            return kv_blocks(ok["start_s"].to_numpy(), ok["finish_s"].to_numpy(),
                             ok["output_tokens"].to_numpy(), self.system)
        if name == "tool operations":
            return self.tools["arrival_s"].to_numpy(), self.tools["finish_s"].to_numpy(), None
        if name == "exceptions with humans":
            return self.humans["arrival_s"].to_numpy(), self.humans["finish_s"].to_numpy(), None
        raise ValueError(f"name must be one of {BOUNDARIES}, got {name!r}")

    def little_table(self, warmup_s: float = 0.0, boundaries=BOUNDARIES) -> pd.DataFrame:
        """Little's law at each boundary over [warmup_s, horizon_s].

        Columns: ``boundary``, ``lambda_per_s`` (completions/s), ``W_s`` (mean time
        inside, s), ``L_measured`` (time-average count, items), ``lambda_W`` (items),
        ``rel_error`` ((lambda W - L) / L). Values are not rounded.
        """
        warm = _check.nonnegative("warmup_s", warmup_s)
        if warm >= self.horizon_s:
            raise ValueError(f"warmup_s must be < horizon_s={self.horizon_s!r}, got {warmup_s!r}")
        rows = []
        for name in boundaries:
            entry, exit_, w = self.boundary(name)
            if entry.size == 0:
                rows.append(dict(boundary=name, lambda_per_s=0.0, W_s=0.0, L_measured=0.0,
                                 lambda_W=0.0, rel_error=0.0))
                continue
            m = measure_little(entry, exit_, warm, self.horizon_s, weights=w)
            rows.append(dict(boundary=name, lambda_per_s=m.arrival_rate, W_s=m.time_in_system,
                             L_measured=m.L, lambda_W=m.implied_L, rel_error=m.rel_error))
        return pd.DataFrame(rows)


MAX_RUNS = 10_000
"""Most independent runs :func:`replicated_little` takes (each is a whole simulation)."""


def replicated_little(system: AgentSystem, horizon_s: float, runs: int, seed, *,
                      warmup_s: float = 0.0, confidence: float = 0.95,
                      boundaries=BOUNDARIES) -> pd.DataFrame:
    """Long-run lambda, W and L at each boundary, from ``runs`` independent runs.

    Each run is :func:`simulate` with its own seed (``stats.replication_seeds(seed,
    runs)``) over [0, ``horizon_s``) and measured by :meth:`AgentRun.little_table` over
    [``warmup_s``, ``horizon_s``]. One path satisfies L = lambda W whatever its values;
    how far those values are from the system's long-run ones is a question for
    independent runs, as one run's consecutive sections are correlated over the
    relaxation time of a heavily loaded queue (hours for ten reviewers at 90 %).

    Returns one row per boundary: ``boundary``, and for ``lambda`` (completions/s),
    ``W`` (s) and ``L`` (items) the mean over the runs (``lambda_per_s``, ``W_s``,
    ``L``) with its Student-t ``confidence`` interval (``*_low``, ``*_high``,
    :func:`servingcap.stats.mean_ci`); ``runs``. The warm-up deletes the start-up
    bias only as far as ``warmup_s`` outlasts it.
    """
    n = _check.whole("runs", runs, minimum=2)
    if n > MAX_RUNS:
        raise ValueError(f"runs must be <= {MAX_RUNS:,} (each is a whole simulation), "
                         f"got {runs!r}")
    tables = [simulate(system, horizon_s, seed=s).little_table(warmup_s, boundaries)
              for s in stats.replication_seeds(seed, n)]
    rows = []
    for k, name in enumerate(tables[0]["boundary"]):
        row = {"boundary": name}
        for key, column, bounds in (("lambda_per_s", "lambda_per_s", (0, math.inf)),
                                    ("W_s", "W_s", (0, math.inf)),
                                    ("L", "L_measured", (0, math.inf))):
            est = stats.mean_ci([t[column].iloc[k] for t in tables], confidence,
                                bounds=bounds)
            stem = key.split("_")[0]
            row[key], row[f"{stem}_low"], row[f"{stem}_high"] = est.value, est.low, est.high
        rows.append({**row, "runs": n})
    return pd.DataFrame(rows)


def kv_blocks(start_s, finish_s, output_tokens, system: AgentSystem):
    """KV blocks of admitted sequences as (entry, exit, weight) rows, times in s.

    Each sequence contributes one row for its prompt blocks (weight
    ``ceil(prompt / block)``, entering at admission) and one row per block its output
    adds (entering when the first token that needs it is written). Every block exits
    when its sequence leaves the engine.
    """
    start = _check.array("start_s", start_s)
    finish = _check.array("finish_s", finish_s)
    out = _check.array("output_tokens", output_tokens, nonnegative_values=True).astype(np.int64)
    if not (start.shape == finish.shape == out.shape):
        raise ValueError("start_s, finish_s and output_tokens must have the same length, got "
                         f"{start.size}, {finish.size} and {out.size}")
    b, p = system.block_tokens, system.prompt_tokens
    prefill = p / system.prefill_rate
    prompt_blocks = math.ceil(p / b)
    total_blocks = -(-(p + out) // b)                       # ceil((P + N) / b)
    extra = total_blocks - prompt_blocks                    # blocks the output adds
    seq = np.repeat(np.arange(start.size), extra)
    # index m (1-based) of each extra block within its sequence
    first = np.cumsum(extra) - extra
    m = np.arange(seq.size) - np.repeat(first, extra) + prompt_blocks + 1
    token = (m - 1) * b - p + 1                             # output token that opens block m
    entry = np.concatenate([start, start[seq] + prefill + (token - 1) * system.decode_step_s])
    exit_ = np.concatenate([finish, finish[seq]])
    weight = np.concatenate([np.full(start.size, float(prompt_blocks)), np.ones(seq.size)])
    return entry, exit_, weight


def simulate(system: AgentSystem, horizon_s: float, seed) -> AgentRun:
    """Simulate the agent system for tasks arriving in [0, horizon_s) (s).

    Every task is followed to its end, so items still inside a boundary at
    ``horizon_s`` finish later; measure over a window ending at ``horizon_s``.
    ``seed`` seeds ``numpy.random.default_rng``; the same seed gives the same run.
    """
    sysm = system
    if not isinstance(sysm, AgentSystem):
        raise ValueError(f"system must be an AgentSystem, got {system!r}")
    horizon = _check.positive("horizon_s", horizon_s)
    rng = _check.generator("seed", seed)

    arrivals = poisson_arrivals_until(sysm.task_rate, horizon, rng)   # tasks on [0, horizon)
    n = arrivals.size

    calls = 1 + rng.poisson(sysm.calls_per_task - 1, n)
    first_call = np.cumsum(calls) - calls
    last_call = first_call + calls - 1
    n_calls = int(calls.sum())
    task_of = np.repeat(np.arange(n), calls)
    out_tokens = rng.geometric(1.0 / sysm.output_tokens, n_calls)
    hold = sysm.prompt_tokens / sysm.prefill_rate + out_tokens * sysm.decode_step_s
    tool_time = rng.exponential(sysm.tool_s, n_calls)      # op after call j (unused after last)
    escalate = rng.random(n) < sysm.escalation_prob
    human_time = rng.exponential(sysm.human_s, n)

    call_arr = np.full(n_calls, np.nan)
    call_start = np.full(n_calls, np.nan)
    rejected = np.zeros(n_calls, dtype=bool)
    tool_arr = np.full(n_calls, np.nan)
    tool_start = np.full(n_calls, np.nan)
    task_finish = np.full(n, np.nan)
    task_rejected = np.zeros(n, dtype=bool)

    hold_l, tool_l, last_l = hold.tolist(), tool_time.tolist(), last_call.tolist()
    cap = sysm.queue_cap
    engine_free = [0.0] * sysm.slots        # heap of slot free times
    tool_free = [0.0] * sysm.tool_limit     # heap of tool-service free times
    waiting: list[float] = []               # heap of start times of queued calls
    # events: (time, kind, call index, task); kind 0 = call reaches gateway, 1 = tool op
    events = [(t, 0, j, i) for i, (t, j) in
              enumerate(zip(arrivals.tolist(), first_call.tolist(), strict=True))]
    heapq.heapify(events)
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    while events:
        t, kind, j, i = pop(events)
        if kind == 0:
            while waiting and waiting[0] <= t:
                pop(waiting)
            call_arr[j] = t
            if cap is not None and len(waiting) >= cap:
                rejected[j] = True
                task_finish[i] = t
                task_rejected[i] = True
                continue
            free = engine_free[0]
            start = t if t > free else free
            done = start + hold_l[j]
            replace(engine_free, done)
            if start > t:
                push(waiting, start)
            call_start[j] = start
            if j == last_l[i]:
                task_finish[i] = done
            else:
                push(events, (done, 1, j, i))
        else:
            free = tool_free[0]
            start = t if t > free else free
            done = start + tool_l[j]
            replace(tool_free, done)
            tool_arr[j] = t
            tool_start[j] = start
            push(events, (done, 0, j + 1, i))

    issued = ~np.isnan(call_arr)                 # calls after a rejection are never issued
    call_start[rejected] = call_arr[rejected]    # a rejected call leaves the instant it arrives
    call_finish = np.where(rejected, call_arr, call_start + hold)
    call_df = pd.DataFrame({
        "task": task_of[issued], "arrival_s": call_arr[issued], "start_s": call_start[issued],
        "finish_s": call_finish[issued], "output_tokens": out_tokens[issued],
        "rejected": rejected[issued],
    })
    has_tool = ~np.isnan(tool_arr)
    tool_df = pd.DataFrame({
        "task": task_of[has_tool], "arrival_s": tool_arr[has_tool],
        "start_s": tool_start[has_tool], "finish_s": tool_start[has_tool] + tool_time[has_tool],
    }).sort_values("arrival_s", kind="stable").reset_index(drop=True)

    esc = escalate & ~task_rejected
    order = np.argsort(task_finish[esc], kind="stable")
    h_task = np.flatnonzero(esc)[order]
    h_arr = task_finish[h_task]
    h_svc = human_time[h_task]
    h_wait = fcfs_waits(h_arr, h_svc, servers=sysm.reviewers) if h_arr.size else np.zeros(0)
    human_df = pd.DataFrame({"task": h_task, "arrival_s": h_arr, "start_s": h_arr + h_wait,
                             "finish_s": h_arr + h_wait + h_svc})
    task_df = pd.DataFrame({
        "arrival_s": arrivals, "finish_s": task_finish, "planned_calls": calls,
        "outcome": np.where(task_rejected, "rejected", "done"), "escalated": esc,
    })
    return AgentRun(system=sysm, horizon_s=horizon, tasks=task_df,
                    calls=call_df.sort_values("arrival_s", kind="stable").reset_index(drop=True),
                    tools=tool_df, humans=human_df)


# =======================================================================================
# Fan-out: parallel branches, retries by failure class, late cancellation
# =======================================================================================


def peak_in_flight(entry_s, exit_s, start: float | None = None, end: float | None = None) -> int:
    """Largest number of items inside a boundary at any instant of [start, end] (items).

    An item is inside on ``[entry, exit)``; at a tie an exit is counted before an entry.
    Defaults: the window runs from the first entry to the last exit.
    """
    entry = _check.array("entry_s", entry_s)
    exit_ = _check.array("exit_s", exit_s)
    if entry.shape != exit_.shape:
        raise ValueError("entry_s and exit_s must have the same length, "
                         f"got {entry.size} and {exit_.size}")
    if entry.size == 0:
        return 0
    if (exit_ < entry).any():
        i = int(np.argmax(exit_ < entry))
        raise ValueError(f"exit_s must be >= entry_s, got {exit_[i]!r} < {entry[i]!r} at index {i}")
    lo = float(entry.min()) if start is None else _check.number("start", start)
    hi = float(exit_.max()) if end is None else _check.number("end", end)
    if hi < lo:
        raise ValueError(f"end must be >= start, got start={lo!r}, end={hi!r}")
    at_start = int(((entry <= lo) & (exit_ > lo)).sum())
    times = np.concatenate([exit_, entry])
    steps = np.concatenate([-np.ones(exit_.size), np.ones(entry.size)])
    order = np.lexsort((steps, times))                     # by time, exits (-1) first
    times, level = times[order], np.cumsum(steps[order])
    inside = (times > lo) & (times <= hi)
    return max(at_start, int(level[inside].max()) if inside.any() else 0)


def _failure_classes(failure_probs, retries):
    if not isinstance(failure_probs, dict):
        raise ValueError(
            f"failure_probs must be a dict {{class: probability}}, got {failure_probs!r}")
    if not isinstance(retries, dict):
        raise ValueError(f"retries must be a dict {{class: max retries}}, got {retries!r}")
    names = tuple(failure_probs)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"failure_probs keys must be non-empty class names, got {name!r}")
        if name in ("accepted", "unacceptable", "cancelled"):
            raise ValueError(f"failure_probs may not use the reserved class name {name!r}")
    probs = []
    for name in names:
        p = _check.number(f"failure_probs[{name!r}]", failure_probs[name])
        if not 0 <= p < 1:
            raise ValueError(
                f"failure_probs[{name!r}] must be in [0, 1), got {failure_probs[name]!r}")
        probs.append(p)
    if sum(probs) >= 1:
        raise ValueError(
            f"failure_probs must sum to < 1 (some requests must answer), got {sum(probs)!r}")
    for name in retries:
        if name not in failure_probs:
            raise ValueError(
                f"retries has class {name!r}, which is not in failure_probs {list(names)}")
    budget = tuple(_check.whole(f"retries[{name!r}]", retries.get(name, 0), minimum=0)
                   for name in names)
    return names, tuple(probs), budget


@dataclass(frozen=True)
class BranchAttempts:
    """What one branch costs in requests under retries by failure class (exact)."""

    mean_requests: float
    """Mean requests one branch sends, first try included (requests/branch): retry multiplier."""
    retries_by_class: dict
    """Mean retries per branch caused by each failure class (requests/branch)."""
    p_exhausted: float
    """Probability the branch ends on a failure whose class has no retries left."""


def branch_attempts(failure_probs: dict, retries: dict) -> BranchAttempts:
    """Exact retry multiplier of one branch with per-class retry budgets.

    Each request independently fails with class ``c`` with probability
    ``failure_probs[c]`` (and otherwise returns an answer). A failure of class ``c`` is
    retried while the branch has used fewer than ``retries[c]`` retries of that class
    (missing classes get 0); otherwise the branch ends without an answer. The
    expectations follow from the recursion over the remaining budgets ``b``:
    ``E[requests | b] = 1 + sum_c p_c [b_c > 0] E[requests | b - e_c]``.
    With one class and budget ``r`` this is :func:`servingcap.traffic.retry_multiplier`.
    """
    names, probs, budget = _failure_classes(failure_probs, retries)
    m = len(names)

    @cache
    def expect(b):
        mean, by_class, exhausted = 1.0, [0.0] * m, 0.0
        for c in range(m):
            if b[c] > 0:
                nxt = b[:c] + (b[c] - 1,) + b[c + 1:]
                n_mean, n_by, n_ex = expect(nxt)
                mean += probs[c] * n_mean
                exhausted += probs[c] * n_ex
                for c2 in range(m):
                    by_class[c2] += probs[c] * (n_by[c2] + (c2 == c))
            else:
                exhausted += probs[c]
        return mean, tuple(by_class), exhausted

    mean, by_class, exhausted = expect(budget)
    return BranchAttempts(mean_requests=mean,
                          retries_by_class=dict(zip(names, by_class, strict=True)),
                          p_exhausted=exhausted)


@dataclass(frozen=True)
class FanOut(_EngineShape):
    """An orchestrator that fans each task out to parallel branches on one shared route.

    Units: seconds, tokens, tokens/s, tasks/s. The model (simulated by
    :func:`simulate_fanout`):

    - **Tasks** arrive as a Poisson process at ``task_rate``. A task sends ``branches``
      (``k``) requests at once, one per branch: a *round*.
    - **Route.** Every request waits in one FCFS queue for one of ``slots`` engine slots
      and holds it for ``prompt_tokens / prefill_rate + N * decode_step_s``. The output
      length ``N`` has mean ``output_tokens`` and coefficient of variation ``output_cv``:
      geometric for ``output_cv = 1`` (as in :class:`AgentSystem`; memoryless, so racing
      copies and cancelling the rest costs no extra work), a constant for 0, otherwise a
      gamma length rounded to whole tokens (>= 1). Branches of one task sample their
      lengths independently.
    - **Failures and retries.** A finished request failed with class ``c`` with
      probability ``failure_probs[c]`` (time-outs, 429s, server errors); the branch
      re-sends it after ``retry_backoff_s`` while it has retries of that class left
      (``retries[c]``), else the branch ends with no answer. A request that did not fail
      returned an answer, acceptable with probability ``accept_prob``.
    - **Winner.** The first acceptable answer completes the task (its critical path ends).
      If every branch of a round ends without an acceptable answer, the orchestrator
      starts a new round of ``k`` branches, up to ``max_rounds``; then the task fails.
    - **Cancellation.** ``cancel_delay_s`` after the winner, every request of the task
      still queued is dropped and every one still running is stopped (its slot frees
      then); retries not yet sent are not sent. ``0`` cancels at the winner's instant,
      ``math.inf`` never cancels (losers run to the end, retries included).
    """

    task_rate: float = 0.3
    """User tasks arriving per second (Poisson), tasks/s."""
    branches: int = 3
    """Parallel branches per round (k >= 1)."""
    accept_prob: float = 0.6
    """Probability that an answer is acceptable (0 < q <= 1)."""
    failure_probs: dict = field(default_factory=dict)
    """Failure class -> probability that a request fails with it (sum < 1)."""
    retries: dict = field(default_factory=dict)
    """Failure class -> retries a branch may spend on it (missing: 0)."""
    retry_backoff_s: float = 0.0
    """Delay between a failed request and its retry (s)."""
    max_rounds: int = 5
    """Rounds of ``k`` branches before the task gives up."""
    cancel_delay_s: float = 0.0
    """Delay from the winner to cancelling the task's other requests (s); inf = never."""
    slots: int = 32
    """Requests the route serves at once (engine slots)."""
    prompt_tokens: int = 2_000
    """Prompt length of every request (tokens)."""
    output_tokens: float = 300.0
    """Mean output length (tokens)."""
    output_cv: float = 1.0
    """Coefficient of variation of output length: 1 geometric, 0 constant, else gamma."""
    prefill_rate: float = 8_000.0
    """Prompt tokens prefilled per second (tokens/s)."""
    decode_step_s: float = 0.030
    """Time per output token (s)."""

    def __post_init__(self):
        for name in ("task_rate", "output_tokens", "prefill_rate", "decode_step_s"):
            object.__setattr__(self, name, _check.positive(name, getattr(self, name)))
        object.__setattr__(self, "output_cv", _check.nonnegative("output_cv", self.output_cv))
        for name in ("branches", "max_rounds", "slots", "prompt_tokens"):
            object.__setattr__(self, name, _check.whole(name, getattr(self, name)))
        q = _check.number("accept_prob", self.accept_prob)
        if not 0 < q <= 1:
            raise ValueError(f"accept_prob must be in (0, 1], got {self.accept_prob!r}")
        object.__setattr__(self, "accept_prob", q)
        _failure_classes(self.failure_probs, self.retries)
        object.__setattr__(self, "failure_probs", dict(self.failure_probs))
        object.__setattr__(self, "retries", dict(self.retries))
        object.__setattr__(self, "retry_backoff_s",
                           _check.nonnegative("retry_backoff_s", self.retry_backoff_s))
        d = self.cancel_delay_s
        if isinstance(d, bool) or not isinstance(d, (int, float, np.integer, np.floating)) \
                or math.isnan(d) or d < 0:
            raise ValueError(f"cancel_delay_s must be >= 0 (s) or math.inf (never), got {d!r}")
        object.__setattr__(self, "cancel_delay_s", float(d))
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens!r}")

    @property
    def capacity(self) -> float:
        """Requests per second the route completes when every slot is busy (requests/s)."""
        return self.slots / self.mean_hold_s

    @property
    def attempts(self) -> BranchAttempts:
        """Requests per branch under the retry budgets (see :func:`branch_attempts`)."""
        return branch_attempts(self.failure_probs, self.retries)

    @property
    def branch_win_prob(self) -> float:
        """Probability that one branch ends with an acceptable answer."""
        return (1.0 - self.attempts.p_exhausted) * self.accept_prob

    @property
    def mean_rounds(self) -> float:
        """Mean rounds per task: a round fails when none of its k branches wins."""
        fail = (1.0 - self.branch_win_prob) ** self.branches
        return sum(fail ** r for r in range(self.max_rounds))

    @property
    def requests_per_task_uncancelled(self) -> float:
        """Mean requests per task if nothing is ever cancelled (requests/task).

        ``k * (retry multiplier) * (mean rounds)``: an upper bound on what the route sees
        per task; cancellation removes some of the losers' requests and time.
        """
        return self.branches * self.attempts.mean_requests * self.mean_rounds

    @property
    def offered_utilization(self) -> float:
        """Route utilization if nothing is ever cancelled: tasks/s x requests x hold / slots."""
        return self.task_rate * self.requests_per_task_uncancelled * self.mean_hold_s / self.slots


@dataclass(frozen=True)
class FanOutRun:
    """The output of :func:`simulate_fanout` (times in s, work in slot-seconds)."""

    system: FanOut
    horizon_s: float
    tasks: pd.DataFrame
    """One row per task: ``arrival_s, finish_s, critical_path_s, outcome`` ('done' or
    'failed'), ``rounds, branches, requests, busy_s, winner_busy_s, loser_busy_s,
    busy_after_finish_s, tokens, work_end_s`` (when its last request left the route)."""
    requests: pd.DataFrame
    """One row per request sent, in FCFS order: ``task, round, branch, attempt, cause``
    (failure class that caused this retry, '' for a first try), ``arrival_s, start_s``
    (NaN if dropped from the queue), ``end_s, hold_s`` (planned slot time), ``busy_s``
    (slot time used), ``busy_after_finish_s`` (slot time after its task finished),
    ``prompt_tokens, output_tokens`` (planned), ``tokens`` (processed before it ended),
    ``result`` ('accepted', 'unacceptable', a failure class, or 'cancelled'),
    ``status`` ('completed', 'stopped' or 'dropped'), ``winner``."""

    def window(self, warmup_s: float = 0.0):
        """Tasks arriving in [warmup_s, horizon_s) and their requests: (tasks, requests)."""
        warm = _check.nonnegative("warmup_s", warmup_s)
        if warm >= self.horizon_s:
            raise ValueError(f"warmup_s must be < horizon_s={self.horizon_s!r}, got {warmup_s!r}")
        keep = self.tasks["arrival_s"] >= warm
        if not keep.any():
            last = float(self.tasks["arrival_s"].max()) if len(self.tasks) else math.nan
            raise ValueError(f"warmup_s must leave at least one task in the window (the last "
                             f"arrives at {last:.6g} s), got {warmup_s!r}")
        tasks = self.tasks[keep]
        return tasks, self.requests[self.requests["task"].isin(tasks.index)]

    def critical_path_quantile(self, p: float, warmup_s: float = 0.0) -> float:
        """p-quantile of time to the first acceptable answer (s); failed tasks count as inf."""
        p = _check.probability("p", p)
        tasks, _ = self.window(warmup_s)
        cp = np.where(tasks["outcome"] == "done", tasks["critical_path_s"], np.inf)
        return float(np.quantile(cp, p, method="higher"))

    def utilization(self, warmup_s: float = 0.0) -> float:
        """Slot-seconds used by the window's tasks over slots x window length (fraction)."""
        tasks, _ = self.window(warmup_s)
        return float(tasks["busy_s"].sum()) / (self.system.slots * (self.horizon_s - warmup_s))

    def busy_breakdown(self, warmup_s: float = 0.0) -> dict:
        """Where the window's slot-seconds went (slot-s per task, and utilization shares).

        Keys: ``winner`` (the winning requests), ``before_answer`` (every other request
        until the task finished: parallel losers, failed tries, failed rounds),
        ``after_answer`` (slot time after the task finished: late cancellation), each
        in slot-s per task, and ``*_util`` (the same as a share of slots x window).
        """
        tasks, _ = self.window(warmup_s)
        n = len(tasks)
        span = self.system.slots * (self.horizon_s - warmup_s)
        parts = {"winner": tasks["winner_busy_s"].sum(),
                 "before_answer": (tasks["loser_busy_s"] - tasks["busy_after_finish_s"]).sum(),
                 "after_answer": tasks["busy_after_finish_s"].sum()}
        out = {k: float(v) / n for k, v in parts.items()}
        out.update({f"{k}_util": float(v) / span for k, v in parts.items()})
        return out

    def task_metrics(self, warmup_s: float = 0.0) -> pd.DataFrame:
        """The per-task numbers to track, measured on the window (unrounded).

        Columns ``metric, value, unit``: requests, tokens and branches per user task;
        the retry multiplier overall and by failure class (requests per first try);
        peak concurrent tasks; and the work spent after each task already had its answer.
        """
        tasks, reqs = self.window(warmup_s)
        n = len(tasks)
        first = float((reqs["attempt"] == 0).sum())
        rows = [("requests per user task", len(reqs) / n, "requests/task"),
                ("tokens per user task", float(reqs["tokens"].sum()) / n, "tokens/task"),
                ("parallel branches per task", float(tasks["branches"].mean()), "branches/task"),
                ("retry multiplier, all classes", len(reqs) / first, "requests/first try")]
        for name in self.system.failure_probs:
            caused = float((reqs["cause"] == name).sum())
            rows.append((f"retry multiplier, {name}", 1.0 + caused / first, "requests/first try"))
        rows.append(("peak concurrent tasks",
                     float(peak_in_flight(tasks["arrival_s"], tasks["finish_s"],
                                          warmup_s, self.horizon_s)), "tasks"))
        after = float(tasks["busy_after_finish_s"].sum())
        rows.append(("work after task completion", after / n, "slot-s/task"))
        rows.append(("work after task completion, share", after / float(tasks["busy_s"].sum()),
                     "fraction of busy slot-s"))
        return pd.DataFrame(rows, columns=["metric", "value", "unit"])


_QUEUED, _RUNNING, _DONE, _STOPPED, _DROPPED = range(5)


def _output_lengths(mean: float, cv: float, size: int, rng) -> np.ndarray:
    """Output lengths (tokens, >= 1) with the given mean and coefficient of variation."""
    if cv == 1:
        return rng.geometric(1.0 / mean, size) if mean > 1 else np.ones(size, dtype=np.int64)
    if cv == 0:
        return np.full(size, max(1, round(mean)), dtype=np.int64)
    shape = 1.0 / cv**2
    return np.maximum(1, np.rint(rng.gamma(shape, mean / shape, size))).astype(np.int64)


def simulate_fanout(system: FanOut, horizon_s: float, seed) -> FanOutRun:
    """Simulate fan-out tasks arriving in [0, horizon_s) through the shared route (s).

    Every task is followed to its end (and its requests until they leave the route), so
    measure over tasks arriving after a warm-up (:meth:`FanOutRun.window`). ``seed``
    seeds ``numpy.random.default_rng``. The random draws of request ``a`` of branch
    ``b`` in round ``r`` of task ``i`` are fixed by ``(i, r, b, a)``, so runs that differ
    only in ``cancel_delay_s`` see the same tasks, lengths and outcomes (common random
    numbers). The route is the FCFS multi-server queue of :func:`servingcap.sim.fcfs_waits`:
    with nothing cancelled, feeding the recorded ``arrival_s`` and ``hold_s`` to it
    reproduces every wait.
    """
    sysm = system
    if not isinstance(sysm, FanOut):
        raise ValueError(f"system must be a FanOut, got {system!r}")
    horizon = _check.positive("horizon_s", horizon_s)
    rng = _check.generator("seed", seed)

    arrivals = poisson_arrivals_until(sysm.task_rate, horizon, rng)   # tasks on [0, horizon)
    n = arrivals.size

    names, probs, budget = _failure_classes(sysm.failure_probs, sysm.retries)
    m = len(names)
    k, rounds_max = sysm.branches, sysm.max_rounds
    per_branch = 1 + sum(budget)
    shape = n * rounds_max * k * per_branch
    u_res = rng.random(shape)                 # outcome draw of each possible request
    lengths = _output_lengths(sysm.output_tokens, sysm.output_cv, shape, rng)
    cum = np.cumsum(probs).tolist() if m else []
    fail_total = cum[-1] if m else 0.0
    reject_below = fail_total + (1.0 - fail_total) * (1.0 - sysm.accept_prob)
    prefill = sysm.prompt_tokens / sysm.prefill_rate
    step = sysm.decode_step_s
    delay, backoff = sysm.cancel_delay_s, sysm.retry_backoff_s

    # request records
    r_task, r_round, r_branch, r_try, r_cause = [], [], [], [], []
    r_arr, r_start, r_end, r_hold, r_out, r_result, r_status = [], [], [], [], [], [], []
    # branch records
    b_task, b_round, b_index, b_used, b_tries = [], [], [], [], []
    # task state
    t_done = [False] * n
    t_finish = [math.nan] * n
    t_failed = [False] * n
    t_rounds = [0] * n
    t_alive = [0] * n
    t_live: list[set] = [set() for _ in range(n)]
    t_cancelled = [False] * n
    t_winner = [-1] * n

    queue: deque = deque()
    free = sysm.slots
    events = [(float(t), 2, i, i) for i, t in enumerate(arrivals.tolist())]
    heapq.heapify(events)
    seq = n
    push, pop = heapq.heappush, heapq.heappop

    def start(j, t):
        nonlocal free, seq
        free -= 1
        r_start[j] = t
        r_status[j] = _RUNNING
        seq += 1
        push(events, (t + r_hold[j], 0, seq, j))

    def fill(t):
        while free > 0 and queue:
            j = queue.popleft()
            if r_status[j] == _QUEUED:
                start(j, t)

    def send(br, t, cause):
        i = b_task[br]
        if t_cancelled[i]:
            return
        a = b_tries[br]
        b_tries[br] = a + 1
        idx = ((i * rounds_max + b_round[br]) * k + b_index[br]) * per_branch + a
        out = lengths.item(idx)
        j = len(r_task)
        r_task.append(i)
        r_round.append(b_round[br])
        r_branch.append(br)
        r_try.append(a)
        r_cause.append(cause)
        r_arr.append(t)
        r_start.append(math.nan)
        r_end.append(math.nan)
        r_hold.append(prefill + out * step)
        r_out.append(out)
        r_result.append("")
        r_status.append(_QUEUED)
        t_live[i].add(j)
        if free > 0:
            start(j, t)
        else:
            queue.append(j)

    def new_round(i, t):
        t_rounds[i] += 1
        t_alive[i] = k
        first = len(b_task)
        for b in range(k):
            b_task.append(i)
            b_round.append(t_rounds[i] - 1)
            b_index.append(b)
            b_used.append([0] * m)
            b_tries.append(0)
        for br in range(first, first + k):
            send(br, t, "")

    def cancel(i, t):
        nonlocal free
        t_cancelled[i] = True
        for j in sorted(t_live[i]):
            if r_status[j] == _QUEUED:
                r_status[j] = _DROPPED
            else:
                r_status[j] = _STOPPED
                free += 1
            r_end[j] = t
            r_result[j] = "cancelled"
        t_live[i].clear()
        fill(t)

    while events:
        t, kind, _, x = pop(events)
        if kind == 2:                                   # task arrives
            new_round(x, t)
            continue
        if kind == 3:                                   # delayed retry is sent
            br, cause = x
            send(br, t, cause)
            continue
        if kind == 1:                                   # late cancellation
            cancel(x, t)
            continue
        j = x                                           # kind 0: a request finishes
        if r_status[j] != _RUNNING:
            continue                                    # stopped earlier: stale event
        i, br = r_task[j], r_branch[j]
        r_status[j] = _DONE
        r_end[j] = t
        t_live[i].discard(j)
        free += 1
        fill(t)
        idx = ((i * rounds_max + b_round[br]) * k + b_index[br]) * per_branch + r_try[j]
        u = u_res.item(idx)
        if u < fail_total:
            c = next(c for c in range(m) if u < cum[c])
            r_result[j] = names[c]
            if b_used[br][c] < budget[c]:
                b_used[br][c] += 1
                if backoff == 0:
                    send(br, t, names[c])
                else:
                    seq += 1
                    push(events, (t + backoff, 3, seq, (br, names[c])))
                continue
            won = False
        elif u < reject_below:
            r_result[j] = "unacceptable"
            won = False
        else:
            r_result[j] = "accepted"
            won = True
        if t_done[i]:
            continue                                    # a loser ending after the answer
        if won:
            t_done[i] = True
            t_finish[i] = t
            t_winner[i] = j
            if delay == 0:
                cancel(i, t)
            elif math.isfinite(delay):
                seq += 1
                push(events, (t + delay, 1, seq, i))
            continue
        t_alive[i] -= 1
        if t_alive[i] == 0:
            if t_rounds[i] < rounds_max:
                new_round(i, t)
            else:
                t_done[i] = True
                t_failed[i] = True
                t_finish[i] = t

    status_name = np.array(["queued", "running", "completed", "stopped", "dropped"])
    start_a = np.array(r_start, dtype=float)
    end_a = np.array(r_end, dtype=float)
    task_a = np.array(r_task, dtype=np.int64)
    finish_t = np.array(t_finish, dtype=float)
    busy = np.where(np.isnan(start_a), 0.0, end_a - start_a)
    after = np.where(np.isnan(start_a), 0.0,
                     np.clip(end_a - np.maximum(start_a, finish_t[task_a]), 0.0, None))
    out_a = np.array(r_out, dtype=np.int64)
    prompt_done = np.minimum(sysm.prompt_tokens, np.floor(busy * sysm.prefill_rate + 1e-6))
    out_done = np.clip(np.floor((busy - prefill) / step + 1e-6), 0, out_a)
    winner = np.zeros(task_a.size, dtype=bool)
    won_idx = np.array([w for w in t_winner if w >= 0], dtype=np.int64)
    winner[won_idx] = True
    req = pd.DataFrame({
        "task": task_a, "round": np.array(r_round, dtype=np.int64),
        "branch": np.array(r_branch, dtype=np.int64), "attempt": np.array(r_try, dtype=np.int64),
        "cause": r_cause, "arrival_s": np.array(r_arr, dtype=float), "start_s": start_a,
        "end_s": end_a, "hold_s": np.array(r_hold, dtype=float), "busy_s": busy,
        "busy_after_finish_s": after, "prompt_tokens": sysm.prompt_tokens,
        "output_tokens": out_a, "tokens": (prompt_done + out_done).astype(np.int64),
        "result": r_result, "status": status_name[np.array(r_status, dtype=np.int64)],
        "winner": winner,
    })
    req = req.sort_values(["arrival_s"], kind="stable").reset_index(drop=True)

    def per_task(values):
        return np.bincount(task_a, weights=values, minlength=n)

    win_busy = per_task(np.where(winner, busy, 0.0))
    total_busy = per_task(busy)
    work_end = np.full(n, -np.inf)
    np.maximum.at(work_end, task_a, end_a)
    tasks = pd.DataFrame({
        "arrival_s": arrivals, "finish_s": finish_t, "critical_path_s": finish_t - arrivals,
        "outcome": np.where(np.array(t_failed), "failed", "done"),
        "rounds": np.array(t_rounds, dtype=np.int64),
        "branches": np.array(t_rounds, dtype=np.int64) * k,
        "requests": np.bincount(task_a, minlength=n),
        "busy_s": total_busy, "winner_busy_s": win_busy, "loser_busy_s": total_busy - win_busy,
        "busy_after_finish_s": per_task(after),
        "tokens": per_task(prompt_done + out_done).astype(np.int64),
        "work_end_s": work_end,
    })
    return FanOutRun(system=sysm, horizon_s=horizon, tasks=tasks, requests=req)
