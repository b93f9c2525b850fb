"""``python -m servingcap sweep``: printed table, knee, plot and output files, bad input.

Run in process (``main(argv)``) for speed; a fast configuration (200-token prompts,
20-token outputs, 8 slots, 5 hold times, at most 4 replications a rate, one worker).
"""

import contextlib
import io
import json
import math
import re

import pandas as pd
import pytest
from servingcap.__main__ import main
from servingcap.planning import CURVE_COLUMNS, PoissonWorkload, curve_knee, fluid_rate, goodput_curve
from servingcap.serving import Replica, mixed_token_budget
from servingcap.sweepcli import MAX_RATES, goodput_figure, parse_rates

FAST = ["--prompt-tokens", "200", "--output-tokens", "20", "--max-batch", "8",
        "--holds", "5", "--budget", "4", "--workers", "1", "--seed", "3"]
WORK = PoissonWorkload(200, 20)
# the defaults FAST leaves in place; the mixed token budget is derived from the 50 ms TPOT
# objective on this replica (8 decodes at the mean context, 210 tokens, plus a chunk)
REPLICA = Replica(max_batch=8, max_batched_tokens=mixed_token_budget(
    Replica(max_batch=8, mode="combined"), 0.050, 200 + 20 / 2))
BOUND = fluid_rate(WORK, REPLICA)         # 25.48 req/s: 26 is overloaded
RATES = [12.0, 18.0]
ROW = (r"^\s+([\d.]+) req/s\s+([\d.]+)% \(([\d.]+)-([\d.]+)%\)\s+(meets|misses|open|unstable)"
       r"\s+([\d.]+) \(([\d.]+)-([\d.]+)\)\s+(\d+) ms\s+(\d+) ms\s+(\d+)$")


def sweep(args, capsys):
    """(exit status, stdout, stderr) of ``sweep args`` run in this process."""
    try:
        status = main(["sweep", *args])
    except SystemExit as exc:           # argparse: --help, usage errors
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def fast_sweep(tmp_path_factory):
    """One sweep with an overloaded rate, writing a PNG and a CSV."""
    tmp = tmp_path_factory.mktemp("sweep")
    png, csv = tmp / "goodput.png", tmp / "sweep.csv"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["sweep", *FAST, "--rates", "12,18,26", "--no-progress",
                       "--plot", str(png), "--output", str(csv)])
    return status, out.getvalue(), err.getvalue(), png, csv


def test_sweep_prints_the_library_curve(fast_sweep):
    status, stdout, stderr, _, _ = fast_sweep
    assert status == 0, stderr
    rows = re.findall(ROW, stdout, re.MULTILINE)
    assert [float(r[0]) for r in rows] == RATES
    curve = goodput_curve(WORK, REPLICA, RATES, seed=3, budget=4, holds=5, executor=None)
    for printed, (_, row) in zip(rows, curve.iterrows(), strict=True):
        assert float(printed[1]) == pytest.approx(100 * row["attainment"], abs=0.005)
        assert printed[4] == row["verdict"]
        assert float(printed[5]) == pytest.approx(row["goodput_rps"], abs=0.005)
        assert float(printed[6]) == pytest.approx(row["goodput_low"], abs=0.005)
        assert int(printed[8]) == round(1000 * row["ttft_p99_s"])
        assert int(printed[10]) == row["replications"]
    # the rate at the fluid bound is listed, not simulated
    assert re.search(r"^\s+26 req/s\s+\(not simulated\)\s+overloaded$", stdout, re.MULTILINE)
    assert f"Fluid throughput bound: {BOUND:.4g} req/s for 1 replica" in stdout
    assert "Overloaded, not simulated: 26 req/s" in stdout
    knee = curve_knee(curve, 0.99)
    if knee.slo_rate is not None and not math.isnan(knee.slo_rate):
        assert f"Knee: {knee.slo_rate:.4g} req/s" in stdout
    assert (f"Goodput peak: {knee.peak_goodput:.4g} req/s of goodput when offered "
            f"{knee.peak_rate:g} req/s") in stdout
    assert "Plan at the knee, not at the peak" in stdout


def test_sweep_writes_a_png_and_a_csv_row_per_rate(fast_sweep):
    status, _, _, png, csv = fast_sweep
    assert status == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = pd.read_csv(csv)
    assert list(table.columns) == [*CURVE_COLUMNS, "replicas"]
    assert table["rate_rps"].tolist() == [*RATES, 26.0]
    assert table["verdict"].iloc[-1] == "overloaded"
    assert table["replications"].iloc[-1] == 0 and math.isnan(table["goodput_rps"].iloc[-1])
    assert (table["replicas"] == 1).all()


def test_sweep_json_and_progress(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    status, stdout, stderr = sweep([*FAST[:-4], "--budget", "2", "--workers", "1",
                                    "--rates", "6", "--replicas", "2",
                                    "--output", str(path)], capsys)
    assert status == 0, stderr
    assert "Sweep of 2 replicas at one rate, 6 req/s" in stdout
    assert "2 replicas @ 6 req/s" in stderr           # the progress bar names fleet and rate
    data = json.loads(path.read_text())
    assert data["settings"]["replicas"] == 2 and data["settings"]["target"] == 0.99
    assert data["fluid_bound_rps"] == pytest.approx(2 * BOUND)
    assert data["knee_rps"] is None                 # every estimate meets: beyond the grid
    assert data["knee_where"] == "above the grid"
    assert data["settings"]["rates_rps"] == [6.0]
    assert [p["rate_rps"] for p in data["points"]] == [6.0]
    assert set(data["points"][0]) == {*CURVE_COLUMNS, "replicas"}


def test_sweep_help_lists_its_options_and_plan_keeps_its_own(capsys):
    status, out, _ = sweep(["--help"], capsys)
    assert status == 0
    for option in ("--rates", "--replicas", "--plot", "--prompt-tokens", "--ttft-p99-ms",
                   "--budget", "--router", "--no-progress", "--output"):
        assert option in out
    for option in ("--rate", "--spares", "--max-replicas", "--beta", "--rtol"):
        assert not re.search(rf"^\s+{option}\b", out, re.MULTILINE), option
    try:
        main(["plan", "--help"])
    except SystemExit:
        pass
    plan = capsys.readouterr().out
    assert "--rates" not in plan and "--plot" not in plan and "--spares" in plan


@pytest.mark.parametrize("args, option", [
    (["--rates", ""], "--rates"),
    (["--rates", " , "], "--rates"),
    (["--rates", "0,5"], "--rates"),
    (["--rates", "-3"], "--rates"),
    (["--rates", "10,5"], "--rates"),
    (["--rates", "10,10"], "--rates"),
    (["--rates", "abc"], "--rates"),
    (["--rates", "10:20"], "--rates"),
    (["--rates", "10:5:1"], "--rates"),
    (["--rates", "1:2:0"], "--rates"),
    (["--rates", "nan"], "--rates"),
    (["--rates", f"1:{MAX_RATES + 1}:1"], "--rates"),
    (["--rates", "30,40"], "--rates"),              # all above the fluid bound
    ([], "--rates"),                                # missing
    (["--rates", "5", "--replicas", "0"], "--replicas"),
    (["--rates", "5", "--replicas", "1.5"], "--replicas"),
    (["--rates", "5", "--plot", "goodput.txt"], "--plot"),
    (["--rates", "5", "--plot", "/no/such/dir/g.png"], "--plot"),
    (["--rates", "5", "--output", "sweep.txt"], "--output"),
    (["--rates", "5", "--rate", "3"], "--rate"),    # a plan option
    (["--rates", "5", "--holds", "1e9"], "--rates"),  # replications too long
])
def test_bad_input_exits_2_with_one_line_naming_the_option(args, option, capsys):
    status, out, err = sweep([*FAST, *args, "--no-progress"], capsys)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert re.search(rf"{re.escape(option)}\b", err), err


def test_rates_and_replicas_from_a_config_file(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text('[sweep]\nrates = [6]\nreplicas = 2\nbudget = 2\nno-progress = true\n')
    status, out, err = sweep([*FAST[:8], "--workers", "1", "--config", str(config)], capsys)
    assert status == 0, err
    assert out.startswith("Sweep of 2 replicas at one rate, 6 req/s")


def test_a_plan_key_in_a_sweep_config_is_refused(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text('rates = [5, 10]\nrate = 30\n')
    status, _, err = sweep([*FAST, "--config", str(config)], capsys)
    assert status == 2 and err.count("\n") == 1
    assert "--config" in err and "'rate'" in err


@pytest.mark.parametrize("spec, rates", [
    ("10,20,30", [10, 20, 30]),
    ("10:40:10", [10, 20, 30, 40]),
    ("10:45:10", [10, 20, 30, 40]),
    ("0.1:0.3:0.1", [0.1, 0.2, 0.3]),     # no float drift drops the stop
    ("5, 10:30:10", [5, 10, 20, 30]),
    ([2, 4.5], [2, 4.5]),                 # a TOML list
    (7, [7]),
])
def test_parse_rates(spec, rates):
    assert parse_rates(spec) == rates


def test_goodput_figure_draws_the_reference_lines_and_knee():
    curve = pd.DataFrame({"rate_rps": [1.0, 2.0, 3.0], "goodput_rps": [1.0, 1.9, 2.0],
                          "goodput_low": [0.9, 1.8, float("nan")],
                          "goodput_high": [1.1, 2.0, float("nan")],
                          "verdict": ["meets", "open", "misses"]})
    fig = goodput_figure(curve, target=0.99, replicas=2, fluid_bound=3.1, knee=2.2)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "goodput = offered rate" in labels
    assert "99.00% x offered rate (target)" in labels
    assert "knee 2.2 req/s (plan here)" in labels
    assert {"meets the target", "misses the target"} <= set(labels)
    assert ax.get_title() == "Goodput vs offered rate, 2 replicas"
    assert "req" in ax.get_xlabel() and "req" in ax.get_ylabel()
    with pytest.raises(ValueError, match="curve"):
        goodput_figure(curve.drop(columns="verdict"), target=0.99)


def test_ctrl_c_prints_the_rates_finished(monkeypatch, capsys):
    # SIGINT delivered to this process right after the first rate's point is done: the
    # command stops, prints that row, names the signal and exits 128 + 2.
    import os
    import signal

    from servingcap import __main__ as cli

    tick = cli._Progress.__call__

    def tick_then_interrupt(self, row):
        tick(self, row)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cli._Progress, "__call__", tick_then_interrupt)
    status, out, err = sweep([*FAST, "--rates", "6,8", "--no-progress"], capsys)
    assert status == 128 + signal.SIGINT
    assert out.startswith("Stopped: 1 of 2 rates simulated")
    assert re.search(r"^\s+6 req/s\s+[\d.]+% \(", out, re.MULTILINE)
    assert "8 req/s" not in out
    assert err.count("\n") == 1 and "stopped by SIGINT after 1 of 2 rates" in err
