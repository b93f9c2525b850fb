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


# `make test` spreads tests over every core with pytest-xdist's `--dist loadscope`, with
# the scope chosen here: a test runs with the rest of its file, on one worker, in order
# (a notebook's cells run top to bottom in one kernel; a module fixture is built once),
# except in the files in SPREAD, whose tests each run a whole chapter or a README
# command for up to a minute (together about 7 minutes): each of those is a scope of
# its own, so xdist spreads them one by one instead of queueing them behind one worker.
# Work is handed out in collection order, longest first: those re-runs, then the
# notebooks, then the unit test files, whose many short tests even out the end.
SPREAD = frozenset({"test_rerun.py", "test_readme.py"})


def _longest_first(item) -> int:
    return 0 if item.path.name in SPREAD else 1 if item.path.suffix == ".ipynb" else 2


def pytest_collection_modifyitems(config, items):
    items.sort(key=_longest_first)      # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None                       # any other --dist mode: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False   # keep the collection order set above

    class FileOrTestScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.rsplit("/", 1)[-1] in SPREAD else path

    return FileOrTestScheduling(config, log)
