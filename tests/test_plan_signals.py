"""A plan stopped by a signal, or whose process dies, leaves no pool worker behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

LIB = Path(__file__).resolve().parents[1] / "lib"
# A plan that takes minutes: the workers are busy simulating when the signal comes.
PLAN = [sys.executable, "-m", "servingcap", "plan", "--rate", "30", "--workers", "2",
        "--no-progress"]


def _start_plan():
    env = {**os.environ, "PYTHONPATH": str(LIB)}
    proc = subprocess.Popen(PLAN, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and len(workers) < 2:
        workers = [c for c in parent.children(recursive=True) if "python" in c.name()]
        time.sleep(0.2)
    assert len(workers) >= 2, "the plan started no pool workers within 60 s"
    return proc, workers


def _kill_group(proc):
    """Whatever is left of the plan's session (its own process group), even on failure."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _survivors(workers, within_s=10.0):
    gone, alive = psutil.wait_procs(workers, timeout=within_s)
    return alive


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                          (signal.SIGINT, 128 + signal.SIGINT)])
def test_signal_stops_plan_and_its_workers(signum, code):
    proc, workers = _start_plan()
    try:
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == code
        text = err.decode()
        assert text.count("\n") == 1 and "stopped by" in text and "Traceback" not in text
        assert not _survivors(workers)
    finally:
        _kill_group(proc)


def test_workers_of_a_killed_plan_exit_on_their_own():
    # SIGKILL: the parent runs no cleanup at all; the workers notice they were orphaned
    proc, workers = _start_plan()
    proc.kill()
    proc.wait(timeout=10)
    alive = _survivors(workers)
    _kill_group(proc)
    assert not alive, f"workers survived their parent: {[p.pid for p in alive]}"
