"""One figure style for the whole book.

Call :func:`use_book_style` once in a chapter's imports cell. It sets the house
rcParams and makes a displayed figure's plain-text fallback its title (instead of a
``<Figure size ...>`` repr), so stored notebook outputs stay readable and stable.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from . import _check

__all__ = ["COLORS", "use_book_style", "mark_slo", "mark_knee", "describe"]

COLORS = {
    "formula": "#1f4e79",    # closed forms: dark blue
    "sim": "#e07b00",        # simulations: orange
    "trace": "#2e7d32",      # real traces: green
    "slo": "#c62828",        # SLO lines: red
    "knee": "#6a1b9a",       # the knee: purple
    "muted": "#7f7f7f",
}

_STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "svg.hashsalt": "servingcap",
}


def describe(fig) -> str:
    """A one-line plain-text description of a figure: its titles, or its label."""
    if not isinstance(fig, Figure):
        raise ValueError(f"fig must be a matplotlib Figure, got {fig!r}")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    if getattr(fig, "_suptitle", None) is not None and fig._suptitle.get_text():
        titles.insert(0, fig._suptitle.get_text())
    text = " | ".join(titles) or fig.get_label() or "untitled"
    return f"[figure: {text}]"


def use_book_style() -> None:
    """Apply the house style; in IPython, show figures' text fallback as their titles."""
    mpl.rcParams.update(_STYLE)
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with the book's venv
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        # Activate the inline backend now: activation clears any Figure formatter
        # registered before it, so ours must come after.
        shell.run_line_magic("matplotlib", "inline")
        plain = shell.display_formatter.formatters["text/plain"]
        plain.for_type(mpl.figure.Figure, lambda fig, p, cycle: p.text(describe(fig)))


def mark_slo(ax, value: float, label: str, axis: str = "y") -> None:
    """Draw an SLO threshold as a dashed red line with a label (same units as the axis)."""
    value = _check.number("value", value)
    if axis == "y":
        ax.axhline(value, color=COLORS["slo"], linestyle="--", linewidth=1.2, label=label)
    elif axis == "x":
        ax.axvline(value, color=COLORS["slo"], linestyle="--", linewidth=1.2, label=label)
    else:
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")


def mark_knee(ax, x: float, label: str = "knee") -> None:
    """Mark the knee of a curve with a dotted purple vertical line at ``x``."""
    x = _check.number("x", x)
    ax.axvline(x, color=COLORS["knee"], linestyle=":", linewidth=1.5, label=label)


def close_all() -> None:
    """Close every open figure (keeps long chapters' memory flat)."""
    plt.close("all")
