"""servingcap.plots (house style, figure descriptions, SLO/knee marks) and
servingcap.widgets (the explorer: sliders -> compute function -> Output)."""

import matplotlib

matplotlib.use("Agg")

import ipywidgets as w  # noqa: E402
import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from servingcap import plots, widgets  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_rc_and_close():
    with mpl.rc_context():
        yield
    plt.close("all")


# --------------------------------------------------------------------------- plots


def test_use_book_style_sets_rcparams():
    mpl.rcParams.update({"axes.grid": False, "figure.figsize": (3.0, 2.0),
                         "axes.spines.top": True, "lines.linewidth": 0.5})
    plots.use_book_style()
    assert mpl.rcParams["axes.grid"] is True
    assert tuple(mpl.rcParams["figure.figsize"]) == (7.0, 4.0)
    assert mpl.rcParams["axes.spines.top"] is False
    assert mpl.rcParams["axes.spines.right"] is False
    assert mpl.rcParams["lines.linewidth"] == 2.0
    assert mpl.rcParams["svg.hashsalt"] == "servingcap"
    fig, ax = plt.subplots()
    assert tuple(fig.get_size_inches()) == (7.0, 4.0)


def test_describe_returns_titles():
    fig, ax = plt.subplots()
    ax.set_title("M/M/1 response time vs utilization")
    assert plots.describe(fig) == "[figure: M/M/1 response time vs utilization]"


def test_describe_suptitle_first_and_all_axes():
    fig, (a, b) = plt.subplots(1, 2)
    a.set_title("mean")
    b.set_title("p99")
    fig.suptitle("The knee")
    assert plots.describe(fig) == "[figure: The knee | mean | p99]"


def test_describe_untitled_and_label():
    fig = plt.figure()
    fig.add_subplot()
    assert plots.describe(fig) == "[figure: untitled]"
    fig.set_label("knee-sweep")
    assert plots.describe(fig) == "[figure: knee-sweep]"


def test_mark_slo_draws_red_dashed_line():
    fig, ax = plt.subplots()
    plots.mark_slo(ax, 1.0, "TTFT SLO")
    line = ax.lines[-1]
    assert list(line.get_ydata()) == [1.0, 1.0]
    assert line.get_label() == "TTFT SLO" and line.get_linestyle() == "--"
    assert mpl.colors.to_hex(line.get_color()) == plots.COLORS["slo"]
    plots.mark_slo(ax, 0.05, "TPOT SLO", axis="x")
    assert list(ax.lines[-1].get_xdata()) == [0.05, 0.05]


@pytest.mark.parametrize("axis", ["z", "Y", "", None])
def test_mark_slo_bad_axis_raises(axis):
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="axis must be 'x' or 'y'") as info:
        plots.mark_slo(ax, 1.0, "SLO", axis=axis)
    assert repr(axis) in str(info.value)
    assert len(ax.lines) == 0


def test_mark_knee():
    fig, ax = plt.subplots()
    plots.mark_knee(ax, 0.8)
    line = ax.lines[-1]
    assert list(line.get_xdata()) == [0.8, 0.8] and line.get_label() == "knee"
    assert mpl.colors.to_hex(line.get_color()) == plots.COLORS["knee"]


def test_close_all():
    plt.figure()
    plots.close_all()
    assert plt.get_fignums() == []


# --------------------------------------------------------------------------- widgets


def _controls():
    return dict(rho=widgets.slider(0.5, 0.1, 0.99, 0.01, "utilization"),
                servers=widgets.slider(4, 1, 64, 1, "servers", integer=True))


def test_slider_types():
    c = _controls()
    assert isinstance(c["rho"], w.FloatSlider) and isinstance(c["servers"], w.IntSlider)
    assert c["rho"].value == 0.5 and c["servers"].value == 4
    assert c["rho"].continuous_update is False


def test_explorer_calls_compute_with_slider_values_and_shows_text():
    calls = []

    def compute(rho, servers):
        calls.append((rho, servers))
        return f"rho={rho:.2f} c={servers}"

    ex = widgets.explorer(compute, "Knee", **_controls())
    assert calls == [(0.5, 4)]
    assert ex.output.outputs[-1]["text"] == "rho=0.50 c=4\n"
    ex.controls["rho"].value = 0.9
    ex.controls["servers"].value = 8
    assert calls[-1] == (0.9, 8)
    assert ex.values == {"rho": 0.9, "servers": 8}
    assert len(ex.output.outputs) == 1  # replaced, not appended
    assert ex.output.outputs[0] == {"output_type": "stream", "name": "stdout",
                                    "text": "rho=0.90 c=8\n"}


def test_explorer_shows_dataframe():
    def compute(rho, servers):
        return pd.DataFrame({"rho": [rho], "servers": [servers]})

    ex = widgets.explorer(compute, "Table", **_controls())
    ex.controls["servers"].value = 16
    (out,) = ex.output.outputs
    assert out["output_type"] == "display_data"
    assert "<table" in out["data"]["text/html"] and "16" in out["data"]["text/html"]


def test_explorer_shows_figure_and_closes_it():
    def compute(rho, servers):
        fig, ax = plt.subplots()
        ax.set_title(f"rho {rho}")
        return fig

    ex = widgets.explorer(compute, "Plot", **_controls())
    ex.controls["rho"].value = 0.75
    (out,) = ex.output.outputs
    assert out["output_type"] == "display_data"
    assert "Figure" in out["data"]["text/plain"]
    assert plt.get_fignums() == []  # the explorer closes what it displayed


def test_explorer_title_and_repr():
    ex = widgets.explorer(lambda rho, servers: "x", "My explorer", **_controls())
    assert "<b>My explorer</b>" in ex.children[0].value
    assert repr(ex) == ("Interactive explorer 'My explorer' (rho, servers): "
                        "move the sliders in a live Jupyter kernel.")


def test_explorer_without_controls_raises():
    with pytest.raises(ValueError, match="at least one control"):
        widgets.explorer(lambda: "x", "Empty")
