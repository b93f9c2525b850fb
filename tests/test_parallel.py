"""Executors (servingcap.parallel): the same answers whatever runs the tasks."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from servingcap import parallel, stats


def _draw(seed) -> float:
    """A stand-in simulation: a statistic of 1,000 draws from the task's own stream."""
    return float(np.quantile(np.random.default_rng(seed).exponential(1.0, 1000), 0.99))


SEEDS = stats.replication_seeds(7, 6)


def test_thread_pool_and_process_pool_give_the_serial_answer():
    serial = parallel.run_all(_draw, SEEDS, executor=None)
    assert len(set(serial)) == len(serial)                 # six different streams
    with ThreadPoolExecutor(2) as pool:
        assert parallel.run_all(_draw, SEEDS, executor=pool) == serial
    assert parallel.run_all(_draw, SEEDS, executor=parallel.local_pool(2)) == serial
    assert parallel.run_all(_draw, SEEDS) == serial        # "auto"


def test_auto_runs_unpicklable_tasks_here():
    assert parallel.run_all(lambda s: _draw(s), SEEDS[:2]) == parallel.run_all(_draw, SEEDS[:2],
                                                                              executor=None)


def test_dask_local_cluster_gives_the_serial_answer():
    distributed = pytest.importorskip("distributed")
    serial = parallel.run_all(_draw, SEEDS, executor=None)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        assert parallel.run_all(_draw, SEEDS, executor=client) == serial


@pytest.mark.parametrize("bad", ["pool", 4, object()])
def test_an_executor_that_is_not_one_is_named(bad):
    with pytest.raises(ValueError, match="executor must be a concurrent.futures.Executor"):
        parallel.run_all(_draw, SEEDS, executor=bad)
    with pytest.raises(ValueError, match="workers must be a whole number"):
        parallel.local_pool(0)
