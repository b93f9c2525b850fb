"""The worked example of appendices/rerun.md: re-run a chapter with your own numbers.

papermill executes chapters/utilization_knee.ipynb into a temporary directory with two
parameters changed from the command line, exactly as the appendix shows, and the test
checks that the printed results follow the new numbers (and differ from the book's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
from servingcap.knee import max_utilization_for_quantile

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "utilization_knee.ipynb"
# The appendix's command, less the paths: the p99 targets to invert, and fewer simulated
# customers per replication so the re-run takes seconds.
NEW_TARGETS_S = (30.0, 100.0)
ARGS = ["-y", f"P99_TARGETS_S: [{NEW_TARGETS_S[0]}, {NEW_TARGETS_S[1]}]",
        "-p", "SIM_CUSTOMERS", "50000"]


def printed(nb) -> str:
    """All text a notebook printed (stream outputs of its code cells)."""
    return "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.get("outputs", []) if out.get("output_type") == "stream")


def target_line(target: float, ok: bool) -> str:
    rho_max = max_utilization_for_quantile(target, 0.99, 1.0)
    return (f"p99 <= {target:g} s at rho = 0.95? {'yes' if ok else 'no'} "
            f"(max rho {rho_max:.3f})")


def test_papermill_rerun_with_new_parameters(tmp_path):
    out = tmp_path / "knee_mine.ipynb"
    subprocess.run([sys.executable, "-m", "papermill", str(CHAPTER), str(out), *ARGS,
                    "--cwd", str(CHAPTER.parent), "--no-progress-bar", "--log-level", "WARNING"],
                   check=True, capture_output=True, text=True, timeout=300)
    mine, book = nbformat.read(out, as_version=4), nbformat.read(CHAPTER, as_version=4)

    injected = [c for c in mine.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "P99_TARGETS_S" in injected[0].source

    text, book_text = printed(mine), printed(book)
    # The book's targets (10, 20, 50 s) are gone; the new ones are inverted instead.
    assert target_line(10.0, ok=False) in book_text
    assert "p99 <= 10 s" not in text
    assert target_line(30.0, ok=False) in text   # 92 s at rho 0.95 misses a 30 s target
    assert target_line(100.0, ok=True) in text   # ... and meets a 100 s one
    # The simulation used the smaller sample, and says so.
    assert "x 50,000 customers" in text and "x 500,000 customers" in book_text
    # Everything that does not depend on the two parameters is unchanged.
    assert "p99 / W = -ln(0.01) = 4.605" in text


def test_appendix_shows_the_tested_command_and_lines():
    appendix = (ROOT / "appendices" / "rerun.md").read_text(encoding="utf-8")
    assert f'-y "P99_TARGETS_S: [{NEW_TARGETS_S[0]}, {NEW_TARGETS_S[1]}]"' in appendix
    assert "-p SIM_CUSTOMERS 50000" in appendix
    assert target_line(30.0, ok=False) in appendix
    assert target_line(100.0, ok=True) in appendix
