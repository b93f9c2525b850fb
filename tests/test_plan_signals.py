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


def test_ctrl_c_after_a_point_prints_the_best_answer_so_far():
    # Issue 23: Ctrl-C printed a 42-line traceback and no partial answer. A fast plan
    # (about ten 1-second points) is interrupted once the progress bar shows its first
    # point: stdout says what that point showed, the exit status is 130, no traceback,
    # and the pool's workers are gone.
    import select

    env = {**os.environ, "PYTHONPATH": str(LIB)}
    command = [sys.executable, "-m", "servingcap", "plan", "--rate", "4",
               "--prompt-tokens", "1000", "--output-tokens", "40", "--decode-step-ms", "20",
               "--max-batch", "8", "--budget", "8", "--holds", "5", "--workers", "2"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        seen, deadline = b"", time.monotonic() + 120
        while b"reps)" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
        assert b"reps)" in seen, f"no point was reported on stderr: {seen[-500:]!r}"
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "python" in c.name()]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130
        text = out.decode()
        assert text.startswith("Interrupted (SIGINT) after ")
        # the first point is the 1-replica fleet at 4 req/s; its verdict is in the report
        first = seen.decode(errors="replace").split("1 replica @ 4 req/s: attainment ")[1]
        verdict = first.split(",")[1].split("(")[0].strip()
        if verdict == "meets":
            assert "smallest size shown to meet so far: 1 replica (attainment" in text
            assert "1 replica is the fleet's answer: one replica is the least" in text
        else:
            assert "no size shown to meet yet" in text
        assert "Traceback" not in text + err.decode()
        assert "stopped by SIGINT" in err.decode()
        assert not _survivors(workers)
    finally:
        _kill_group(proc)
