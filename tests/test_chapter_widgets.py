"""Each chapter's "Try your own numbers" explorer works with numbers other than the defaults.

A chapter builds its widget with ``explorer(callback, title, name=slider(...), ...)``. The
callback is the whole model behind the sliders, so this test calls it directly, without a
browser: for every notebook in chapters/ it runs only the code cells the explorer call
needs (a dependency slice computed from the names each cell defines and uses, so the
chapter's simulations and figures are skipped), records the ``explorer(...)`` calls, and
then

- calls each callback with the sliders' defaults and with every slider moved (half way
  towards the middle of its range, on its step grid), and checks that both results are
  the kind a widget can show (text, a DataFrame or a Figure), are of the same kind, and
  differ;
- moves one slider at a time, and checks that the callback still returns such a result;
- builds the real ipywidgets explorer and moves a slider, and checks that its output
  area is refreshed.

New chapters are picked up automatically; a chapter without an explorer fails.
"""

from __future__ import annotations

import symtable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import servingcap.widgets  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("*.ipynb"))
RESULT_KINDS = (str, pd.DataFrame, Figure)


def _names(source: str) -> tuple[set[str], set[str], set[str]]:
    """(names a cell binds at top level, names its top-level code reads, global names
    its functions read: those are looked up when the function is called)."""
    table = symtable.symtable(source, "<cell>", "exec")
    defined = {s.get_name() for s in table.get_symbols()
               if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    late = set()
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        stack.extend(child.get_children())
        if child.get_type() == "function":
            late |= set(child.get_globals())
        else:  # a class body reads like module code
            used |= {s.get_name() for s in child.get_symbols()
                     if s.is_referenced() and (s.is_global() or s.is_free())}
    return defined, used, late


def explorer_slice(nb) -> list[str]:
    """Sources of the code cells needed to reach (and run) every explorer(...) call.

    A backward slice over reaching definitions, cells run top to bottom: a name a
    kept cell's top-level code reads comes from the last cell before it that binds
    the name; a name a function reads comes from the last cell before the last
    explorer call (a callback runs there, and later). A name rebound by many cells
    (``rows``, ``out``) so pulls in only the binding that is live, not every cell
    that ever bound it. (A cell that only mutates an object, ``rows.append(...)``,
    binds nothing: it is kept only if the slice needs it for another name.)"""
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    last = max((i for i, src in enumerate(cells) if "explorer(" in src), default=None)
    if last is None:
        return []
    cells = cells[:last + 1]
    info = [_names(src) for src in cells]

    def binder(name: str, before: int) -> int | None:
        return next((i for i in range(before - 1, -1, -1) if name in info[i][0]), None)

    keep = {i for i, src in enumerate(cells) if "explorer(" in src}
    keep.add(0)  # the imports cell (and the book's figure style)
    todo = sorted(keep)
    while todo:
        j = todo.pop()
        wanted = [(name, j) for name in info[j][1]]
        wanted += [(name, last + 1) for name in info[j][2]]
        for name, before in wanted:
            i = binder(name, before)
            if i is not None and i not in keep:
                keep.add(i)
                todo.append(i)
    return [cells[i] for i in sorted(keep)]


def other_value(control):
    """A slider value other than the default: half way towards the middle of the range."""
    lo, hi, step, value = control.min, control.max, control.step, control.value
    target = value + 0.5 * ((lo + hi) / 2 - value)
    target = lo + round((target - lo) / step) * step
    if abs(target - value) < step / 2:
        target = value + 2 * step if value + 2 * step <= hi else value - 2 * step
    target = min(max(target, lo), hi)
    return int(round(target)) if isinstance(value, int) else float(round(target, 10))


def kind(result) -> type:
    for k in RESULT_KINDS:
        if isinstance(result, k):
            return k
    raise AssertionError(f"callback returned {type(result).__name__}; a widget shows "
                         f"text, a DataFrame or a matplotlib Figure")


def pixels(fig: Figure) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).copy()


def same(a, b) -> bool:
    if isinstance(a, pd.DataFrame):
        return a.shape == b.shape and a.equals(b)
    if isinstance(a, Figure):
        pa, pb = pixels(a), pixels(b)
        return pa.shape == pb.shape and bool((pa == pb).all())
    return a == b


@pytest.fixture(scope="module")
def explorers():
    """{notebook name: [(callback, title, controls), ...]} from each chapter's slice."""
    found = {}
    with matplotlib.rc_context():
        original_show = plt.show
        plt.show = lambda *args, **kwargs: plt.close("all")
        try:
            for path in NOTEBOOKS:
                calls = []

                def record(compute, title, _calls=calls, **controls):
                    _calls.append((compute, title, controls))

                namespace = {"__name__": "__main__"}
                for source in explorer_slice(nbformat.read(path, as_version=4)):
                    if "explorer(" in source:
                        namespace["explorer"] = record
                    exec(compile(source, f"{path.name}:cell", "exec"), namespace)  # noqa: S102
                found[path.stem] = calls
        finally:
            plt.show = original_show
            plt.close("all")
    return found


@pytest.fixture(autouse=True)
def _chapter_cwd(monkeypatch):
    monkeypatch.chdir(CHAPTERS)  # where the book executes each chapter


@pytest.mark.parametrize("chapter", [p.stem for p in NOTEBOOKS])
def test_explorer_callbacks_respond_to_new_numbers(chapter, explorers):
    calls = explorers[chapter]
    assert calls, f"{chapter}: no explorer(...) call found in a code cell"
    for compute, title, controls in calls:
        assert callable(compute) and controls, f"{chapter}: explorer {title!r} has no controls"
        defaults = {name: c.value for name, c in controls.items()}
        moved = {name: other_value(c) for name, c in controls.items()}
        assert moved != defaults
        try:
            base = compute(**defaults)
            new = compute(**moved)
            base_kind, new_kind = kind(base), kind(new)
            assert new_kind is base_kind, (f"{chapter}: {title!r} returned {base_kind.__name__} "
                                           f"at the defaults but {new_kind.__name__} at {moved}")
            assert not same(base, new), (f"{chapter}: {title!r} gave the same result at the "
                                         f"defaults {defaults} and at {moved}")
            for name in controls:
                kind(compute(**{**defaults, name: moved[name]}))
        finally:
            plt.close("all")


@pytest.mark.parametrize("chapter", [p.stem for p in NOTEBOOKS])
def test_explorer_widget_refreshes(chapter, explorers):
    for compute, title, controls in explorers[chapter]:
        widget = servingcap.widgets.Explorer(compute, controls, title)
        name, control = next(iter(controls.items()))
        defaults_value = control.value
        before = widget.output.outputs
        control.value = other_value(control)
        assert widget.values[name] == control.value
        assert widget.output.outputs, f"{chapter}: {title!r} shows nothing after a slider moved"
        assert widget.output.outputs != before or kind(compute(**widget.values)) is Figure
        control.value = defaults_value  # put the slider back for other tests
        plt.close("all")


def test_the_slice_keeps_only_the_live_binding_of_a_rebound_name():
    cells = ["import math",                    # 0: always kept
             "rows = [1]\nslow = 1",           # 1: rebound below: not live
             "rows = [2]",                     # 2: the binding cell 4 reads
             "scale = 3",                      # 3: read by the callback at call time
             "def f(x):\n    return x * scale\nfirst = rows[0]",
             "unused = math.pi",               # 5: nobody reads it
             "explorer(f, 't', x=first)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    assert explorer_slice(nb) == [cells[i] for i in (0, 2, 3, 4, 6)]
