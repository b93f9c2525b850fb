"""plan --output FILE.json|.csv and Plan.to_dict()."""

import json
import math

import pandas as pd
import pytest
from servingcap.__main__ import main

FAST = ["--rate", "4", "--prompt-tokens", "1000", "--output-tokens", "40",
        "--decode-step-ms", "20", "--max-batch", "8", "--ttft-p99-ms", "1000",
        "--tpot-p99-ms", "50", "--budget", "4", "--holds", "5", "--no-progress",
        "--workers", "1"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    json_path, csv_path = folder / "plan.json", folder / "plan.csv"
    assert main(["plan", *FAST, "--output", str(json_path)]) == 0
    assert main(["plan", *FAST, "--output", str(csv_path)]) == 0
    return json.loads(json_path.read_text()), pd.read_csv(csv_path)


def test_json_holds_the_answer_and_every_point(written):
    data, _ = written
    assert data["replicas"] == data["serving_replicas"] + data["spares"]
    assert data["settings"]["rate_rps"] == 4 and data["settings"]["limits_s"]["tpot_s"] == 0.05
    assert data["at_size"]["verdict"] == "meets"
    sizes = [row["replicas"] for row in data["fleet_points"]]
    assert data["serving_replicas"] in sizes
    assert data["plan_rate_rps"] >= 4 * (1 - 0.02)
    # strict JSON: no NaN or infinity anywhere
    text = json.dumps(data, allow_nan=False)
    assert "NaN" not in text


def test_csv_has_one_row_per_simulated_point(written):
    data, table = written
    assert set(table["search"]) == {"fleet", "capacity"}
    assert len(table) == len(data["fleet_points"]) + len(data["capacity_points"])
    assert {"rate_rps", "attainment", "attainment_low", "ttft_p99_s", "verdict"} <= set(table)
    assert not table["attainment"].map(math.isnan).any()


@pytest.mark.parametrize("name", ["plan.txt", "plan"])
def test_output_must_be_json_or_csv(tmp_path, capsys, name):
    assert main(["plan", *FAST, "--output", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--output must be a file name ending in .json or .csv" in err


def test_output_directory_must_exist(tmp_path, capsys):
    assert main(["plan", *FAST, "--output", str(tmp_path / "nope" / "plan.json")]) == 2
    assert "existing directory" in capsys.readouterr().err
