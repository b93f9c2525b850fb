"""Offered-load inputs: the book's real request traces.

``load_trace(name)`` returns one DataFrame shape for every trace, so chapters and the
simulators never care where a trace came from:

========================  =======  ==========================================
column                    unit     meaning
========================  =======  ==========================================
``arrival_s``             s        arrival time, seconds after the first request
``prompt_tokens``         tokens   input (context) length
``output_tokens``         tokens   generated length
``hash_ids`` (Mooncake)   ids      512-token prompt blocks; a repeated id is a
                                   reusable prefix block
========================  =======  ==========================================
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["TRACES", "data_dir", "load_trace"]

TRACES = {
    "azure_conv": "AzureLLMInferenceTrace_conv_2023.csv",
    "azure_code": "AzureLLMInferenceTrace_code_2023.csv",
    "mooncake": "mooncake_conversation_trace.jsonl",
}
"""Trace names accepted by :func:`load_trace`, and their files in ``data/``."""


def data_dir() -> Path:
    """The folder holding the traces: ``$SERVINGCAP_DATA`` if set, else the repo's ``data/``."""
    env = os.environ.get("SERVINGCAP_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


def load_trace(name: str) -> pd.DataFrame:
    """Load a request trace as ``arrival_s, prompt_tokens, output_tokens`` (+ extras).

    Parameters
    ----------
    name : str
        One of :data:`TRACES` (``"azure_conv"``, ``"azure_code"``, ``"mooncake"``), or
        a path to a file in one of the two formats: an Azure-style CSV with columns
        ``TIMESTAMP, ContextTokens, GeneratedTokens``, or a Mooncake-style JSON-lines
        file with ``timestamp`` (ms), ``input_length``, ``output_length``.

    Returns
    -------
    pandas.DataFrame
        One row per request, sorted by ``arrival_s`` (seconds from the first request).

    Raises
    ------
    ValueError
        For an unknown name, a missing column, or values that are not valid
        (unparseable times, negative or non-integer token counts).
    FileNotFoundError
        When the file is not there.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise ValueError(f"name must be a trace name or a path, got {name!r}")
    path = data_dir() / TRACES[name] if name in TRACES else Path(name)
    if name not in TRACES and path.suffix not in (".csv", ".jsonl"):
        raise ValueError(
            f"name must be one of {sorted(TRACES)} or a .csv/.jsonl path, got {name!r}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    raw = _read_azure(path) if path.suffix == ".csv" else _read_mooncake(path)
    return _tidy(raw, path)


def _require(frame: pd.DataFrame, columns, path: Path) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path.name}: missing column(s) {missing}; found {list(frame.columns)}")


def _read_azure(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    _require(frame, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path)
    try:
        stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path.name}: TIMESTAMP has a value that is not a date-time ({exc})") from exc
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return pd.DataFrame({"arrival_s": seconds, "prompt_tokens": frame["ContextTokens"],
                         "output_tokens": frame["GeneratedTokens"]})


def _read_mooncake(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_json(path, lines=True)
    except ValueError as exc:
        raise ValueError(f"{path.name}: not valid JSON lines ({exc})") from exc
    _require(frame, ["timestamp", "input_length", "output_length"], path)
    stamps = pd.to_numeric(frame["timestamp"], errors="coerce")
    out = pd.DataFrame({"arrival_s": (stamps - stamps.min()) / 1000.0,
                        "prompt_tokens": frame["input_length"],
                        "output_tokens": frame["output_length"]})
    if "hash_ids" in frame.columns:
        out["hash_ids"] = frame["hash_ids"]
    return out


def _tidy(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    if frame.empty:
        raise ValueError(f"{path.name}: the trace has no requests")
    if frame["arrival_s"].isna().any():
        row = int(frame["arrival_s"].isna().to_numpy().argmax())
        raise ValueError(f"{path.name}: row {row} has a missing or unparseable timestamp")
    for column in ("prompt_tokens", "output_tokens"):
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values))
        if bad.any():
            row = int(bad.argmax())
            raise ValueError(f"{path.name}: row {row} has {column} = {frame[column].iloc[row]!r}, "
                             "expected a whole number of tokens >= 0")
        frame[column] = values.astype(np.int64)
    frame["arrival_s"] = frame["arrival_s"].astype(float)
    return frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
