"""End to end: ``python -m servingcap plan`` in a subprocess, checked against the library."""

import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from servingcap.__main__ import main
from servingcap.fleet import size_fleet
from servingcap.planning import hold_time, plan
from servingcap.serving import Replica

# A small, fast plan: 400 requests, short outputs, 8 slots per replica.
RATE, N, SEED = 4.0, 400, 5
FAST = ["--rate", "4", "--requests", "400", "--prompt-tokens", "1000", "--output-tokens", "40",
        "--prefill-rate", "8000", "--decode-step-ms", "20", "--max-batch", "8",
        "--ttft-p99-ms", "1000", "--tpot-p99-ms", "50", "--target", "0.9",
        "--seed", str(SEED), "--no-progress"]


def main_in_process(args, capsys):
    """(exit status, stdout, stderr) of the command run in this process (fast)."""
    try:
        status = main(list(args))
    except SystemExit as exc:          # argparse: --help, usage errors
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "servingcap", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def parse(stdout: str) -> dict:
    """The numbers a planner reads off the report."""
    def grab(pattern):
        match = re.search(pattern, stdout, re.MULTILINE)
        assert match, f"{pattern!r} not found in:\n{stdout}"
        return match.groups()

    guess = grab(r"first guess: (\d+) replicas? \+ (\d+) spare = (\d+) replicas?")
    fleet = grab(r"Simulator-confirmed fleet: (\d+) replicas? \+ (\d+) spare = (\d+) replicas?")
    rows = re.findall(r"^\s+(\d+)\s+(\d+) ms\s+(\d+) ms\s+([\d.]+)%\s+([\d.]+) req/s"
                      r"\s+(meets|misses)$", stdout, re.MULTILINE)
    capacity = grab(r"carr(?:y|ies) up to ([\d.]+) req/s")
    slots = grab(r"a = [\d.]+ req/s x [\d.]+ s = ([\d.]+) busy slots; c = (\d+) slots")
    return {"guess": tuple(map(int, guess)), "fleet": tuple(map(int, fleet)),
            "rows": rows, "capacity": float(capacity[0]),
            "offered_load": float(slots[0]), "slots": int(slots[1])}


def fast_requests() -> pd.DataFrame:
    """The workload the FAST options describe: Poisson arrivals from the seed, fixed lengths."""
    rng = np.random.default_rng(SEED)
    return pd.DataFrame({"arrival_s": np.cumsum(rng.exponential(1.0 / RATE, N)),
                         "prompt_tokens": 1000, "output_tokens": 40})


@pytest.fixture(scope="module")
def fast_run():
    done = run("plan", *FAST)
    assert done.returncode == 0, done.stderr
    return done


def test_plan_prints_what_the_library_computes(fast_run):
    got = parse(fast_run.stdout)
    replica = Replica(prefill_rate=8000, decode_step_s=0.020, max_batch=8)
    requests = fast_requests()
    expected = plan(requests, replica, RATE, limits={"ttft_s": 1.0, "tpot_s": 0.050},
                    target=0.9, spares=1, seed=SEED)
    sizing = size_fleet(RATE, hold_time(requests, replica), 8, beta=2.0, spares=1)
    assert got["guess"] == (sizing.replicas_for_slots, 1, sizing.replicas)
    assert got["offered_load"] == pytest.approx(sizing.offered_load, abs=0.05)
    assert got["slots"] == sizing.slots
    n = expected.fleet.replicas
    assert got["fleet"] == (n, 1, n + 1)
    assert got["capacity"] == pytest.approx(expected.capacity.rate, rel=1e-3)
    # the table shows the answer (meets) and, when n > 1, one fewer (misses)
    (size, ttft, tpot, attain, good, verdict), *rest = got["rows"]
    row = expected.at_size
    assert (int(size), verdict) == (n, "meets")
    assert int(ttft) == round(1000 * row["ttft_p99_s"])
    assert int(tpot) == round(1000 * row["tpot_p99_s"])
    assert float(attain) == pytest.approx(100 * row["attainment"], abs=0.006)
    assert float(good) == pytest.approx(row["goodput_rps"], abs=0.006)
    if n > 1:
        assert rest and int(rest[0][0]) == n - 1 and rest[0][-1] == "misses"
        assert float(rest[0][3]) < 90.0
    assert fast_run.stderr == ""          # --no-progress: nothing on stderr


def test_config_file_gives_the_same_plan_and_the_command_line_wins(fast_run, tmp_path):
    config = tmp_path / "plan.toml"
    config.write_text(
        "# the FAST options as a config file\n"
        "rate = 4\nrequests = 400\nprompt-tokens = 1000\noutput_tokens = 40\n"
        "prefill-rate = 8000\ndecode-table = { 1 = 20, 64 = 20 }\nmax-batch = 8\n"
        "ttft-p99-ms = 1000\ntpot-p99-ms = 50\ntarget = 0.9\n"
        f"seed = {SEED}\nprogress = false\n")
    done = run("plan", "--config", str(config))
    assert done.returncode == 0, done.stderr
    # a flat 20 ms decode table is the 20 ms decode step: same numbers as the flags
    assert parse(done.stdout) == parse(fast_run.stdout)
    overridden = run("plan", "--config", str(config), "--rate", "2")
    assert overridden.returncode == 0, overridden.stderr
    assert overridden.stdout.startswith("Plan for 2 req/s")


def test_trace_replay_runs():
    done = run("plan", "--trace", "azure_code", "--requests", "300", "--rate", "2",
               "--max-batch", "16", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "trace azure_code: first 300 requests" in done.stdout
    assert parse(done.stdout)["fleet"][0] >= 1


def test_progress_bar_goes_to_stderr(capsys):
    status, out, err = main_in_process(
        ["plan", *[a for a in FAST if a != "--no-progress"], "--requests", "100"], capsys)
    assert status == 0, err
    assert "simulating" in err
    assert "simulating" not in out


@pytest.mark.parametrize("args, named", [
    (["--rate", "-3"], "--rate"),
    (["--rate", "fast"], "--rate"),
    (["--requests", "2.5"], "--requests"),
    (["--prompt-dist", "lognormal:mean=2000"], "--prompt-dist"),
    (["--output-dist", "zipf:a=2"], "--output-dist"),
    (["--prompt-tokens", "0"], "--prompt-tokens"),
    (["--prompt-tokens", "10", "--prompt-dist", "exponential:mean=10"], "--prompt-tokens"),
    (["--decode-table", "16-20"], "--decode-table"),
    (["--decode-table", "16:20", "--decode-step-ms", "30"], "--decode-step-ms"),
    (["--max-batch", "0"], "--max-batch"),
    (["--target", "1.5"], "--target"),
    (["--router", "fastest"], "--router"),
    (["--trace", "no_such_trace.csv"], "--trace"),
    (["--trace", "azure_conv", "--prompt-tokens", "10"], "--prompt-tokens"),
    (["--config", "no_such.toml"], "--config"),
    (["--bogus", "3"], "--bogus"),
])
def test_bad_input_exits_2_with_one_line_naming_the_option(args, named, capsys):
    status, out, err = main_in_process(["plan", *args], capsys)
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert named in lines[0]


@pytest.mark.parametrize("args, named", [
    (["--rate", "-3"], "--rate"), (["--bogus", "3"], "--bogus"),
    (["--trace", "no_such_trace.csv"], "--trace"),
])
def test_bad_input_in_a_real_process_has_no_traceback(args, named):
    done = run("plan", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_config_key_is_named(tmp_path, capsys):
    config = tmp_path / "plan.toml"
    config.write_text("rate = 4\nreplicas = 3\n")
    status, _, err = main_in_process(["plan", "--config", str(config)], capsys)
    assert status == 2
    assert "unknown key 'replicas'" in err and len(err.splitlines()) == 1
    config.write_text("rate = \n")
    status, _, err = main_in_process(["plan", "--config", str(config)], capsys)
    assert status == 2 and "not valid TOML" in err and len(err.splitlines()) == 1
    config.write_text("rate = -4\n")
    status, _, err = main_in_process(["plan", "--config", str(config)], capsys)
    assert status == 2 and "--rate must be > 0, got -4" in err


def _option_help(help_text: str) -> dict:
    """Option -> its help entry (the option's line and its continuation lines)."""
    entries, current = {}, None
    for line in help_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            current = stripped.split()[0].rstrip(",")
            if current in entries:      # e.g. the example in the epilog
                current = None
                continue
            entries[current] = stripped
        elif current and line.startswith("   ") and stripped:
            entries[current] += " " + stripped
        else:
            current = None
    return entries


def test_help_documents_every_option_with_units(capsys):
    status, out, _ = main_in_process(["plan", "--help"], capsys)
    assert status == 0
    entries = _option_help(out)
    for option, unit in [("--rate", "requests/s"), ("--requests", "requests"),
                         ("--prompt-tokens", "tokens"), ("--prompt-dist", "tokens"),
                         ("--output-tokens", "tokens"), ("--output-dist", "tokens"),
                         ("--trace", "rescaled"), ("--prefill-rate", "tokens/s"),
                         ("--decode-step-ms", "milliseconds"),
                         ("--decode-table", "milliseconds"), ("--chunk-tokens", "tokens"),
                         ("--max-batch", "sequences"), ("--ttft-p99-ms", "milliseconds"),
                         ("--tpot-p99-ms", "milliseconds"), ("--target", "fraction"),
                         ("--router", "pooled"), ("--policy", "fcfs"),
                         ("--spares", "replicas"), ("--beta", "dimensionless"),
                         ("--seed", "seed"), ("--rtol", "relative"),
                         ("--no-progress", "stderr"), ("--config", "TOML")]:
        assert option in entries, (option, sorted(entries))
        assert unit in entries[option], (option, unit, entries[option])
    status, out, _ = main_in_process(["--help"], capsys)
    assert status == 0 and "plan" in out
