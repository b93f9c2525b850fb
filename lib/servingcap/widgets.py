"""ipywidgets builders for the chapters' "Try your own numbers" sections.

:func:`explorer` turns a pure function of a few numbers into sliders plus an output
area. The function is the whole model: it returns text, a DataFrame or a figure, and
it can be called (and tested) without any widget. The widget itself only lives in a
running Jupyter kernel; the static book shows a parameter-sweep table instead.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as w
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from . import _check

__all__ = ["Explorer", "explorer", "slider"]


def slider(value: float, min: float, max: float, step: float, description: str,
           integer: bool = False):
    """A labelled slider (``integer=True`` for whole numbers such as servers)."""
    if not isinstance(integer, bool):
        raise ValueError(f"integer must be True or False, got {integer!r}")
    check = (lambda n, v: _check.whole(n, v, minimum=-(2**31))) if integer else _check.number
    value, min, max, step = (check(n, v) for n, v in
                             (("value", value), ("min", min), ("max", max), ("step", step)))
    if not min < max:
        raise ValueError(f"min must be < max, got min={min!r}, max={max!r}")
    if not min <= value <= max:
        raise ValueError(f"value must be within [min, max] = [{min!r}, {max!r}], got {value!r}")
    if step <= 0 or step > max - min:
        raise ValueError(f"step must be in (0, max - min], got {step!r}")
    if not isinstance(description, str):
        raise ValueError(f"description must be a string, got {description!r}")
    cls = w.IntSlider if integer else w.FloatSlider
    return cls(value=value, min=min, max=max, step=step, description=description,
               continuous_update=False, style={"description_width": "initial"},
               layout=w.Layout(width="420px"))


class Explorer(w.VBox):
    """Sliders on top, the function's result below; re-computed when a slider moves."""

    def __init__(self, compute: Callable, controls: dict, title: str):
        if not callable(compute):
            raise ValueError(f"compute must be a function of the controls, got {compute!r}")
        self.compute = compute
        self.controls = dict(controls)
        self.title = title
        self.output = w.Output()
        super().__init__([w.HTML(f"<b>{title}</b>"), *self.controls.values(), self.output])
        for control in self.controls.values():
            control.observe(lambda _change: self.refresh(), names="value")
        self.refresh()

    @property
    def values(self) -> dict:
        """The current slider values, keyed by the function's argument names."""
        return {name: control.value for name, control in self.controls.items()}

    def refresh(self) -> None:
        """Re-run the function with the current values and show its result."""
        result = self.compute(**self.values)
        self.output.outputs = ()
        if isinstance(result, Figure):
            self.output.append_display_data(result)
            plt.close(result)
        elif hasattr(result, "_repr_html_"):
            self.output.append_display_data(result)
        else:
            self.output.append_stdout(f"{result}\n")

    def __repr__(self) -> str:
        names = ", ".join(self.controls)
        return f"Interactive explorer '{self.title}' ({names}): move the sliders in a live Jupyter kernel."


def explorer(compute: Callable, title: str, **controls) -> Explorer:
    """Build an :class:`Explorer` for ``compute(**values)`` with one control per argument.

    Example: ``explorer(knee_table, "M/M/1 knee", rho=slider(0.8, 0.1, 0.99, 0.01, "rho"))``.
    """
    if not controls:
        raise ValueError("explorer needs at least one control, got none")
    return Explorer(compute, controls, title)
