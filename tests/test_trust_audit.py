"""The run-design audit of the trust appendix (appendices/run_design.toml) follows the
chapters: every chapter in _toc.yml has a row, and every name a row's expressions use
is still defined by that chapter's ``parameters`` cell (or imported before it), so a
renamed parameter breaks this test instead of silently breaking the appendix table.
No notebook is executed: the cells are parsed with :mod:`ast`."""

import ast
import builtins
import functools
import json
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DESIGN = tomllib.loads((ROOT / "appendices" / "run_design.toml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [c["file"].removeprefix("chapters/") for part in TOC["parts"]
            for c in part["chapters"] if c["file"].startswith("chapters/")]
APPENDIX = "trust_the_simulator"
HELPERS = set(DESIGN["helpers"])     # names the appendix adds to every namespace
EXPRESSIONS = ("requests", "runs", "sections", "quantile")


def _notebook(stem: str) -> Path:
    return ROOT / ("appendices" if stem == APPENDIX else "chapters") / f"{stem}.ipynb"


@functools.cache
def defined_names(stem: str) -> frozenset[str]:
    """Names bound by the parameters cell and by the imports of the cells before it."""
    cells = [c for c in json.loads(_notebook(stem).read_text())["cells"]
             if c["cell_type"] == "code"]
    at = next(i for i, c in enumerate(cells)
              if "parameters" in c.get("metadata", {}).get("tags", []))
    names = set()
    for i, cell in enumerate(cells[: at + 1]):
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif i == at and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(names)


def test_every_chapter_in_the_toc_has_a_row():
    assert CHAPTERS, "no chapters found in _toc.yml"
    covered = {row["chapter"] for row in DESIGN["row"]}
    assert not set(CHAPTERS) - covered, f"chapters without a run-design row: " \
        f"{sorted(set(CHAPTERS) - covered)}"
    assert covered <= {*CHAPTERS, APPENDIX}, f"rows for unknown notebooks: " \
        f"{sorted(covered - {*CHAPTERS, APPENDIX})}"


@pytest.mark.parametrize("index", range(len(DESIGN["row"])))
def test_row_refers_only_to_defined_names(index):
    row = DESIGN["row"][index]
    known = defined_names(row["chapter"]) | HELPERS | set(dir(builtins))
    assert row["method"] in DESIGN["methods"], row
    assert row["warmup"] in DESIGN["warmups"], row
    assert "runs" in row, f"row {index} ({row['printed']}) states no replications"
    for key in EXPRESSIONS:
        if isinstance(row.get(key), str):
            used = {n.id for n in ast.walk(ast.parse(row[key], mode="eval"))
                    if isinstance(n, ast.Name)}
            assert used <= known, (f"{row['chapter']}: {key} = {row[key]!r} uses "
                                   f"{sorted(used - known)}, not defined by its "
                                   f"parameters cell")
    if row.get("estimate", True) is False:
        assert row.get("note"), f"row {index}: a non-estimate must say why in `note`"


def test_a_renamed_parameter_is_caught():
    # the check itself: a name the parameters cell does not define is not known
    assert "N_REQUESTS" in defined_names("two_slos")
    assert "N_REQUESTS_RENAMED" not in defined_names("two_slos")
