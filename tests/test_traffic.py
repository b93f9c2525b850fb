"""servingcap.traffic.load_trace: the three real traces, checked against the raw files
parsed independently here (csv / json from the standard library), and clear errors on
malformed inputs.
"""

import csv
import json
from datetime import datetime
from decimal import Decimal
from functools import cache

import numpy as np
import pandas as pd
import pytest
from servingcap import traffic
from servingcap.traffic import TRACES, data_dir, load_trace

BASE_COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens"]


def _azure_seconds(stamp):
    """'2023-11-16 18:17:03.9799600' -> seconds since the epoch, exact to 100 ns."""
    whole, _, frac = stamp.partition(".")
    dt = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return Decimal(int(dt.timestamp())) + Decimal("0." + (frac or "0"))


@cache
def raw_trace(name):
    """(arrival_s, prompt, output) straight from the file, sorted like the loader sorts."""
    path = data_dir() / TRACES[name]
    if path.suffix == ".csv":
        with open(path, newline="") as fh:
            rows = [r for r in csv.reader(fh) if r]  # the file ends without a newline
        header, body = rows[0], rows[1:]
        assert header == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        stamps = [_azure_seconds(r[0]) for r in body]
        first = min(stamps)
        t = np.array([float(s - first) for s in stamps])
        prompt = np.array([int(r[1]) for r in body])
        output = np.array([int(r[2]) for r in body])
        extra = None
    else:
        with open(path) as fh:
            body = [json.loads(line) for line in fh if line.strip()]
        ms = np.array([r["timestamp"] for r in body], dtype=float)
        t = (ms - ms.min()) / 1000.0
        prompt = np.array([r["input_length"] for r in body])
        output = np.array([r["output_length"] for r in body])
        extra = [r["hash_ids"] for r in body]
    order = np.argsort(t, kind="stable")
    extra = None if extra is None else [extra[i] for i in order]
    return t[order], prompt[order], output[order], extra


def raw_row_count(name):
    """Data rows in the raw file: non-empty lines, minus the header for a CSV."""
    text = (data_dir() / TRACES[name]).read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    return len(lines) - (1 if name.startswith("azure") else 0)


@pytest.fixture(scope="module", params=sorted(TRACES))
def trace(request):
    return request.param, load_trace(request.param)


def test_row_count_matches_raw_file(trace):
    name, frame = trace
    assert len(frame) == raw_row_count(name) == len(raw_trace(name)[0])


def test_azure_conv_keeps_its_unterminated_last_row():
    # The conversation CSV has no trailing newline: the final request must still load.
    path = data_dir() / TRACES["azure_conv"]
    text = path.read_text()
    assert not text.endswith("\n")
    last = text.splitlines()[-1].split(",")
    frame = load_trace("azure_conv")
    assert frame["prompt_tokens"].iloc[-1] == int(last[1])
    assert frame["output_tokens"].iloc[-1] == int(last[2])
    assert len(frame) == text.count("\n")  # header + N rows joined by N newlines


def test_columns_and_dtypes(trace):
    name, frame = trace
    expected = BASE_COLUMNS + (["hash_ids"] if name == "mooncake" else [])
    assert list(frame.columns) == expected
    assert frame["arrival_s"].dtype == np.float64
    assert frame["prompt_tokens"].dtype == np.int64
    assert frame["output_tokens"].dtype == np.int64
    assert isinstance(frame.index, pd.RangeIndex) and frame.index[0] == 0


def test_arrivals_start_at_zero_and_never_decrease(trace):
    _, frame = trace
    t = frame["arrival_s"].to_numpy()
    assert t[0] == 0.0
    assert np.all(np.diff(t) >= 0)
    assert np.all(np.isfinite(t))
    # every trace is about one hour long
    assert 3000 < t[-1] < 4000


def test_token_counts_positive_integers(trace):
    _, frame = trace
    for column in ("prompt_tokens", "output_tokens"):
        assert (frame[column] > 0).all()


def test_values_match_raw_file(trace):
    name, frame = trace
    t, prompt, output, extra = raw_trace(name)
    np.testing.assert_allclose(frame["arrival_s"], t, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(frame["prompt_tokens"], prompt)
    np.testing.assert_array_equal(frame["output_tokens"], output)
    if extra is not None:
        assert [list(h) for h in frame["hash_ids"]] == extra


def test_mooncake_keeps_hash_ids():
    frame = load_trace("mooncake")
    first = json.loads((data_dir() / TRACES["mooncake"]).read_text().splitlines()[0])
    assert list(frame["hash_ids"].iloc[0]) == first["hash_ids"]
    # 512-token blocks: a prompt of P tokens spans ceil(P / 512) blocks
    blocks = frame["hash_ids"].map(len).to_numpy()
    np.testing.assert_array_equal(blocks, np.ceil(frame["prompt_tokens"] / 512).astype(int))


def test_load_by_path_equals_load_by_name():
    by_path = load_trace(str(data_dir() / TRACES["azure_code"]))
    pd.testing.assert_frame_equal(by_path, load_trace("azure_code"))


def test_data_dir_env_override(tmp_path, monkeypatch):
    (tmp_path / TRACES["azure_code"]).write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:01.5000000,10,3\n"
        "2023-11-16 18:00:00.2500000,20,4\n")
    monkeypatch.setenv("SERVINGCAP_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    frame = load_trace("azure_code")
    # sorted by arrival, seconds after the first request
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 1.25])
    assert frame["prompt_tokens"].tolist() == [20, 10]
    assert frame["output_tokens"].tolist() == [4, 3]


# --------------------------------------------------------------------------- bad files

GOOD_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROW = "2023-11-16 18:00:00.0000000,10,3\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_missing_column(tmp_path):
    path = _write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,10\n")
    with pytest.raises(ValueError, match=r"t\.csv: missing column\(s\) \['GeneratedTokens'\]"):
        load_trace(path)


@pytest.mark.parametrize("stamp", ["not-a-date", "2023-13-45 99:00:00"])
def test_bad_timestamp(tmp_path, stamp):
    path = _write(tmp_path, "t.csv", GOOD_HEADER + GOOD_ROW + f"{stamp},10,3\n")
    with pytest.raises(ValueError, match="TIMESTAMP"):
        load_trace(path)


def test_empty_timestamp(tmp_path):
    path = _write(tmp_path, "t.csv", GOOD_HEADER + GOOD_ROW + ",10,3\n")
    with pytest.raises(ValueError, match="row 1 has a missing or unparseable timestamp"):
        load_trace(path)


@pytest.mark.parametrize("row, column, shown", [
    ("2023-11-16 18:00:01,-5,3\n", "prompt_tokens", "-5"),
    ("2023-11-16 18:00:01,10,-1\n", "output_tokens", "-1"),
    ("2023-11-16 18:00:01,10.5,3\n", "prompt_tokens", "10.5"),
    ("2023-11-16 18:00:01,ten,3\n", "prompt_tokens", "'ten'"),
    ("2023-11-16 18:00:01,10,\n", "output_tokens", "nan"),
])
def test_bad_token_counts(tmp_path, row, column, shown):
    path = _write(tmp_path, "t.csv", GOOD_HEADER + GOOD_ROW + row)
    with pytest.raises(ValueError) as info:
        load_trace(path)
    message = str(info.value)
    assert f"row 1 has {column} = " in message and shown in message


def test_header_only_csv(tmp_path):
    with pytest.raises(ValueError, match="no requests"):
        load_trace(_write(tmp_path, "t.csv", GOOD_HEADER))


def test_mooncake_style_errors(tmp_path):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
    with pytest.raises(ValueError, match="missing column"):
        load_trace(_write(tmp_path, "a.jsonl", '{"timestamp": 0, "input_length": 5}\n'))
    with pytest.raises(ValueError, match="not valid JSON lines"):
        load_trace(_write(tmp_path, "b.jsonl", good + "{not json\n"))
    with pytest.raises(ValueError, match="row 1 has a missing or unparseable timestamp"):
        load_trace(_write(tmp_path, "c.jsonl",
                          good + '{"timestamp": "soon", "input_length": 5, "output_length": 2}\n'))
    with pytest.raises(ValueError, match=r"d\.jsonl: row 0 has output_tokens = .*-2"):
        load_trace(_write(tmp_path, "d.jsonl",
                          '{"timestamp": 0, "input_length": 5, "output_length": -2}\n'))
    later = good.replace('"timestamp": 0', '"timestamp": 1500')
    frame = load_trace(_write(tmp_path, "e.jsonl", later + good))
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 1.5])
    assert "hash_ids" not in frame.columns


def test_bad_token_count_message_shows_plain_number(tmp_path):
    path = _write(tmp_path, "t.csv", GOOD_HEADER + "2023-11-16 18:00:01,-5,3\n")
    with pytest.raises(ValueError, match=r"row 0 has prompt_tokens = -5, expected"):
        load_trace(path)


@pytest.mark.parametrize("name", ["azure_chat", "Azure_Conv", "trace.txt"])
def test_unknown_name(name):
    with pytest.raises(ValueError) as info:
        load_trace(name)
    assert repr(name) in str(info.value) and "azure_conv" in str(info.value)


@pytest.mark.parametrize("name", [None, 3, ["azure_conv"]])
def test_name_of_wrong_type(name):
    with pytest.raises(ValueError, match="name must be"):
        load_trace(name)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_trace(str(tmp_path / "nope.csv"))
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "nope.jsonl")


def test_named_trace_missing_from_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVINGCAP_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=TRACES["mooncake"]):
        load_trace("mooncake")


def test_trace_names():
    assert set(traffic.TRACES) == {"azure_conv", "azure_code", "mooncake"}


# --------------------------------------------------------------------------- robustness


def test_token_counts_past_the_limit_are_refused(tmp_path):
    for name, text in (("big.csv", GOOD_HEADER + "2023-11-16 18:00:00.0,1e30,3\n"),
                       ("big.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1e30}\n')):
        with pytest.raises(ValueError, match=rf"{name}: row 0 has \w+_tokens = 1e\+30"):
            load_trace(_write(tmp_path, name, text))


def _jsonl(stamps):
    return "".join(json.dumps({"timestamp": t, "input_length": 5, "output_length": 2}) + "\n"
                   for t in stamps)


def test_jsonl_timestamps_epoch_ms_and_iso_strings(tmp_path):
    epoch_ms = load_trace(_write(tmp_path, "ms.jsonl", _jsonl([1_700_000_000_000, 1_700_000_001_500])))
    assert epoch_ms["arrival_s"].tolist() == [0.0, 1.5]
    iso = load_trace(_write(tmp_path, "iso.jsonl", _jsonl(["2023-11-16T18:15:46.5Z",
                                                          "2023-11-16T19:15:47+01:00"])))
    assert iso["arrival_s"].tolist() == [0.0, 0.5]     # the offset is honoured
    for stamps, match in (([1_700_000_000, 1_700_000_001], "Unix time in seconds"),
                          ([1.7e15, 1.7e15 + 1], "microseconds or nanoseconds"),
                          (["2023-11-16T18:15:46Z", "yesterday"], "ISO 8601"),
                          ([True, False], "row 0")):
        with pytest.raises(ValueError, match=match):
            load_trace(_write(tmp_path, "bad.jsonl", _jsonl(stamps)))


@pytest.mark.parametrize("name, text", [
    ("empty.csv", ""), ("garbled.csv", 'a,b\n"x,1\n'), ("bytes.csv", None),
    ("empty.jsonl", ""),
])
def test_empty_or_garbled_files_name_the_file(tmp_path, name, text):
    path = tmp_path / name
    if text is None:
        path.write_bytes(b"\xff\xfe\x00garbage\x80\x81")
    else:
        path.write_text(text)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_trace(str(path))
