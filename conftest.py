"""pytest configuration shared by the unit tests, nbval over chapters/ and tests/browser.

nbval compares every stored text output of a chapter with a fresh execution, so each
printed number is checked. Figures are compared by their text description (their titles,
see servingcap.plots.use_book_style), not by PNG bytes, and widget views (live only in
a running kernel) are not compared.
"""


def pytest_collectstart(collector):
    if getattr(collector, "skip_compare", None) is not None:
        collector.skip_compare += ("image/png", "image/svg+xml",
                                   "application/vnd.jupyter.widget-view+json")


# tests/browser drives headless Chromium over the built book; it runs only under
# `make test-browser` (pytest tests/browser --run-browser), never in `make test`.
BROWSER_TESTS = "browser"


def pytest_addoption(parser):
    parser.addoption("--run-browser", action="store_true", default=False,
                     help="collect tests/browser (needs the built book and /usr/bin/chromium)")


def pytest_ignore_collect(collection_path, config):
    if collection_path.name == BROWSER_TESTS and collection_path.parent.name == "tests":
        return not config.getoption("--run-browser")
    return None
