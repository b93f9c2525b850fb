"""pytest configuration shared by the unit tests and nbval over chapters/.

nbval compares every stored text output of a chapter with a fresh execution, so each
printed number is checked. Figures are compared by their text description (their titles,
see servingcap.plots.use_book_style), not by PNG bytes, and widget views (live only in
a running kernel) are not compared.
"""


def pytest_collectstart(collector):
    if getattr(collector, "skip_compare", None) is not None:
        collector.skip_compare += ("image/png", "image/svg+xml",
                                   "application/vnd.jupyter.widget-view+json")
