"""Bad input found by fuzzing the public API (issue 23, "Also")."""

import math

import pytest
from servingcap import planning, queues, serving


def test_one_replication_gives_nan_goodput_bounds_not_infinities():
    row = planning.evaluate(planning.PoissonWorkload(500, 50), serving.Replica(), 1.0,
                            budget=1, holds=2, min_requests=100, executor=None)
    assert row["replications"] == 1
    assert math.isnan(row["goodput_low"]) and math.isnan(row["goodput_high"])
    assert not any(isinstance(v, float) and math.isinf(v) for v in row.values())


@pytest.mark.parametrize("call", [
    lambda limits: planning.infeasible(planning.PoissonWorkload(500, 50), serving.Replica(),
                                       limits, 0.99),
    lambda limits: planning.evaluate(planning.PoissonWorkload(500, 50), serving.Replica(), 1.0,
                                     limits=limits, budget=1, holds=2, min_requests=100,
                                     executor=None),
])
def test_unknown_limits_key_names_it_and_the_allowed_ones(call):
    with pytest.raises(ValueError, match=r"limits key 'ttft' .* allowed: ttft_s, tpot_s"):
        call({"ttft": 1.0})


@pytest.mark.parametrize("cv", [1e155, 1e300])
def test_mg1_with_a_huge_service_cv_is_a_value_error_naming_it(cv):
    with pytest.raises(ValueError, match="service_cv"):
        queues.MG1(0.5, 1.0, cv)


GOOD = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{10 + i:02d}.5,{300 + i},{40 + i}\n" for i in range(40)))


@pytest.mark.parametrize("line, what", [
    ("garbage,,x", "line 22: TIMESTAMP is 'garbage'"),
    ("2023-11-16 18:15:31.5,abc,12", "row 20 has prompt_tokens = 'abc'"),
    ("2023-11-16 18:15:31.5,12,13,14", "Expected 3 fields in line 22"),
])
def test_one_garbage_line_in_a_trace_csv_is_a_one_line_error(tmp_path, capsys, line, what):
    from servingcap.__main__ import main

    rows = GOOD.splitlines(keepends=True)
    path = tmp_path / "trace.csv"
    path.write_text("".join(rows[:21] + [line + "\n"] + rows[21:]))
    assert main(["plan", "--trace", str(path), "--no-progress", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and what in err


def test_make_test_runs_lint_first():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text().splitlines()
    rule = next(line for line in makefile if line.startswith("test:"))
    assert rule.split(":", 1)[1].split()[0] == "lint"
    lint = makefile[makefile.index(next(x for x in makefile if x.startswith("lint:"))) + 1]
    assert "ruff check lib tests bench" in lint
