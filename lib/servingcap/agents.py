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
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import _check
from .sim import fcfs_waits, measure_little

__all__ = ["AgentSystem", "AgentRun", "simulate", "BOUNDARIES"]

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


@dataclass(frozen=True)
class AgentSystem:
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

    def replace(self, **changes) -> AgentSystem:
        """A copy with some fields changed, validated like the original."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_params(cls, params, **changes) -> AgentSystem:
        """Take the engine's speeds and request shape from a :class:`~servingcap.ServingParams`."""
        base = dict(slots=params.decode_batch, prompt_tokens=params.prompt_tokens,
                    output_tokens=float(params.output_tokens), prefill_rate=params.prefill_rate,
                    decode_step_s=params.decode_step_s)
        base.update(changes)
        return cls(**base)

    @property
    def mean_hold_s(self) -> float:
        """Mean time a call holds an engine slot (s): prefill + mean output * step."""
        return self.prompt_tokens / self.prefill_rate + self.output_tokens * self.decode_step_s

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
    rng = np.random.default_rng(seed)

    # Task arrivals: Poisson on [0, horizon).
    n_guess = int(sysm.task_rate * horizon + 10 * math.sqrt(sysm.task_rate * horizon) + 10)
    arrivals = np.cumsum(rng.exponential(1.0 / sysm.task_rate, n_guess))
    while arrivals[-1] < horizon:
        more = arrivals[-1] + np.cumsum(rng.exponential(1.0 / sysm.task_rate, n_guess))
        arrivals = np.concatenate([arrivals, more])
    arrivals = arrivals[arrivals < horizon]
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
