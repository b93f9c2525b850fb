"""Running many independent simulations: in this process, on local cores, or on Dask.

Every function of the package that runs many independent simulations (replications,
sweeps, searches) takes ``executor=`` and hands its tasks to :func:`run_all`:

- ``"auto"`` (the default): a process pool on this machine's cores, shared by every
  call (started on first use, stopped at exit). Its workers are forked when this
  process runs a single thread (a plain script needs no ``if __name__ == "__main__"``
  guard) and spawned otherwise (a Jupyter kernel runs threads, and forking a threaded
  process is unsafe). It falls back to running in this process when
  the machine has one core, when there is a single task, or when a task cannot be
  pickled (e.g. a cost model written as a ``lambda``).
- ``None``: run in this process, one task after another (the serial path).
- any :class:`concurrent.futures.Executor` you made (``ThreadPoolExecutor``,
  ``ProcessPoolExecutor(4)``, ...);
- a Dask ``distributed.Client`` (``Client("tcp://scheduler:8786")``): tasks go to the
  cluster through its :meth:`~distributed.Client.get_executor`.

A task carries its own seed (derived with ``numpy.random.SeedSequence.spawn``, see
:func:`servingcap.stats.replication_seeds`) and results come back in task order, so the
answer is identical whatever runs it.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from . import _check

__all__ = ["AUTO", "run_all", "resolve", "default_workers", "max_workers", "local_pool",
           "stop_pool"]

AUTO = "auto"
"""The default ``executor``: the shared local process pool (see the module docstring)."""

_POOL: ProcessPoolExecutor | None = None
_POOL_WORKERS = 0


def default_workers() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                       # not on Linux
        return max(1, os.cpu_count() or 1)


def max_workers() -> int:
    """Most processes :func:`local_pool` starts: 4 x :func:`default_workers`, at least
    64. A pool starts all its workers at its first task, so a typo such as
    ``workers=10**6`` would otherwise fork a million processes."""
    return max(64, 4 * default_workers())


def local_pool(workers: int | None = None) -> ProcessPoolExecutor:
    """The shared local process pool with ``workers`` processes (default: every core).

    Reused across calls (a new one is started only when the size changes or a worker
    died) and shut down when Python exits.
    """
    global _POOL, _POOL_WORKERS
    n = default_workers() if workers is None else _check.whole("workers", workers)
    limit = max_workers()
    if n > limit:
        raise ValueError(f"workers must be <= {limit} (4 x the {default_workers()} cores this "
                         f"process may use, at least 64), got {workers!r}")
    if _POOL is None or _POOL_WORKERS != n:
        _shutdown()
        method = ("fork" if threading.active_count() == 1
                  and "fork" in multiprocessing.get_all_start_methods() else "spawn")
        _POOL = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context(method),
                                    initializer=_worker_start, initargs=(os.getpid(),))
        _POOL_WORKERS = n
    return _POOL


PARENT_POLL_S = 0.5
"""How often a pool worker checks that the process that started it is still alive (s)."""


def _worker_start(parent: int) -> None:
    """Run in every pool worker as it starts: a worker must not outlive its parent.

    A parent stopped by SIGTERM or SIGKILL runs no cleanup, and its workers would finish
    (and take) every task already queued to them: minutes of CPU for nobody. A daemon
    thread polls the parent's pid every :data:`PARENT_POLL_S` and ends the worker
    (``os._exit``) once the worker has been re-parented. Ctrl-C is the parent's to
    handle (it stops the pool with :func:`stop_pool`): workers ignore SIGINT, so the
    terminal's process-group SIGINT prints no traceback from each of them; and SIGTERM
    (how :func:`stop_pool` ends them) gets its default action back, since a forked
    worker inherits whatever handler the parent had installed (``plan``'s raises an
    exception, which would print a traceback from every worker it stops).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="servingcap-parent-watch", daemon=True).start()


STOP_GRACE_S = 2.0
"""How long :func:`stop_pool` waits for a terminated worker before killing it (s)."""


def stop_pool() -> None:
    """Stop the shared local pool at once: terminate its workers (their running tasks
    are lost) and drop it; the next ``"auto"`` call starts a new one. For a program
    interrupted mid-run (Ctrl-C, SIGTERM); a normal exit waits for the workers instead."""
    global _POOL
    pool, _POOL = _POOL, None
    if pool is None:
        return
    threading.excepthook = _quiet_cancelled
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:      # a worker still starting may not yet obey SIGTERM
        process.join(STOP_GRACE_S)
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


_EXCEPTHOOK = threading.excepthook


def _quiet_cancelled(args) -> None:
    """Thread exception hook while a pool is stopped: the pool's management thread may
    try to fail a future that ``cancel_futures`` has just cancelled (CPython 3.11 raises
    ``InvalidStateError`` there and prints its traceback); that race is expected when
    stopping mid-run and says nothing to the reader. Anything else is reported."""
    from concurrent.futures import InvalidStateError
    if issubclass(args.exc_type, InvalidStateError):
        return
    _EXCEPTHOOK(args)


def _shutdown() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None


atexit.register(_shutdown)


def _is_dask_client(obj) -> bool:
    return type(obj).__module__.startswith("distributed") and hasattr(obj, "get_executor")


def resolve(executor) -> Executor | None:
    """The :class:`~concurrent.futures.Executor` that ``executor`` stands for, or None
    for the serial path. Raises ``ValueError`` naming ``executor`` for anything else."""
    if executor is None:
        return None
    if isinstance(executor, str) and executor == AUTO:
        return local_pool() if default_workers() > 1 else None
    if isinstance(executor, Executor):
        return executor
    if _is_dask_client(executor):
        return executor.get_executor()
    raise ValueError("executor must be a concurrent.futures.Executor, a dask "
                     f"distributed.Client, 'auto' or None, got {executor!r}")


def _picklable(*objects) -> bool:
    try:
        pickle.dumps(objects)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def run_all(fn: Callable, tasks: Iterable, executor=AUTO,
            on_result: Callable | None = None) -> list:
    """``[fn(task) for task in tasks]``, run by ``executor`` (see the module docstring).

    ``fn`` must be a module-level function and each task picklable for a process pool
    or Dask (with ``"auto"`` an unpicklable task runs in this process instead). Results
    are in task order. ``on_result``, if given, is called in this process as
    ``on_result(index, result)`` as each result arrives, in task order (a progress
    report inside a batch of tasks).
    """
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Iterable):
        raise ValueError(f"tasks must be an iterable of task arguments, got {tasks!r}")
    items = list(tasks)
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    if on_result is not None and not callable(on_result):
        raise ValueError(f"on_result must be callable or None, got {on_result!r}")
    pool = resolve(executor)
    if pool is None or len(items) <= 1 or (isinstance(executor, str)
                                            and not _picklable(fn, items)):
        results = (fn(item) for item in items)
    else:
        results = pool.map(fn, items)
    out = []
    try:
        for result in results:
            out.append(result)
            if on_result is not None:
                on_result(len(out) - 1, result)
    except BrokenProcessPool:
        if pool is _POOL:
            _shutdown()                # a worker died (e.g. out of memory): start afresh
        raise
    return out
