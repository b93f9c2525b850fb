"""Code cells read well on the rendered page (issue 12).

The book's HTML theme clips code lines wider than 88 columns (the reader has to scroll
sideways inside the cell), and a long cell hides its idea: DESIGN.md asks for short
cells with prose between them. Logic longer than a cell belongs in ``servingcap`` with
tests. These checks cover every executed page: the chapters and the appendix notebooks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted(
    (ROOT / "appendices").glob("*.ipynb"))

MAX_COLUMNS = 88          # the page's code width before it clips
MAX_LINES = 40            # lines of one code cell


def code_cells(path: Path):
    """(index, lines) of each code cell, the lines as the notebook editor shows them:
    split on newlines, so a trailing newline is an empty last line (``splitlines`` would
    drop it, and a 40-line cell ending in a newline, 41 lines on screen, passed)."""
    nb = nbformat.read(path, as_version=4)
    return [(i, c.source.split("\n")) for i, c in enumerate(nb.cells)
            if c.cell_type == "code"]


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_code_lines_fit_the_page(path):
    wide = [(i, n + 1, len(line)) for i, lines in code_cells(path)
            for n, line in enumerate(lines) if len(line) > MAX_COLUMNS]
    assert not wide, (f"{path.stem}: code lines wider than {MAX_COLUMNS} columns "
                      f"(cell, line, width): {wide}")


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_code_cells_are_short(path):
    long = [(i, len(lines)) for i, lines in code_cells(path) if len(lines) > MAX_LINES]
    assert not long, (f"{path.stem}: code cells longer than {MAX_LINES} lines "
                      f"(cell, lines): {long}; move the logic into servingcap")


def test_the_checks_see_a_wide_and_a_long_cell(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1\n" + "y" * (MAX_COLUMNS + 1)),
                nbformat.v4.new_code_cell("\n".join(["z = 0"] * (MAX_LINES + 1))),
                nbformat.v4.new_code_cell("\n".join(["z = 0"] * MAX_LINES)),
                nbformat.v4.new_code_cell("\n".join(["z = 0"] * MAX_LINES) + "\n")]
    page = tmp_path / "page.ipynb"
    nbformat.write(nb, page)
    with pytest.raises(AssertionError, match=r"\(0, 2, 89\)"):
        test_code_lines_fit_the_page(page)
    # 41 lines, and 40 lines plus a trailing newline (41 in the editor); 40 lines pass
    with pytest.raises(AssertionError, match=r": \[\(1, 41\), \(3, 41\)\];"):
        test_code_cells_are_short(page)
