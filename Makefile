# Everything runs inside .venv, created from requirements.txt on first use.
# `make book` builds the HTML book (every chapter executed, warnings are errors);
# `make test` runs `make lint` (ruff), then the unit tests and nbval over every chapter
# in one pytest-xdist session.
# `make test-browser` drives headless Chromium over every page of the built book.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP_VERSION := 26.3

.PHONY: book test test-unit test-notebooks test-browser chromium bench lint clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

# Every kernel ipykernel starts from this .venv (jupyter-book, nbval, papermill, nbconvert,
# JupyterLab) logs "Kernel is running over TCP without encryption" to the terminal: 15
# lines per `make book`, not a Sphinx warning, so -W does not catch it. The kernels talk
# to their client over 127.0.0.1 only. The real fix, CurveZMQ keys, is jupyter_client's
# KernelManager.transport_encryption="auto", but myst-nb, nbval and papermill create
# their KernelManager without any configuration, so nothing can switch it on. Instead
# the venv's IPython kernel config (IPython reads <prefix>/etc/ipython for every kernel
# of this interpreter) drops exactly that one log record; other kernel messages stay.
KERNEL_CONFIG := $(VENV)/etc/ipython/ipython_kernel_config.py
define KERNEL_CONFIG_PY
# Written by the Makefile (target $(KERNEL_CONFIG)); see the comment there.
import logging


class _LoopbackTcpNotice(logging.Filter):
    def filter(self, record):
        return "Kernel is running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_LoopbackTcpNotice())
endef
export KERNEL_CONFIG_PY

$(KERNEL_CONFIG): $(STAMP) Makefile
	mkdir -p $(@D)
	printf '%s\n' "$$KERNEL_CONFIG_PY" > $@

# What the HTML book is built from: a change to any of these makes _build/html stale.
BOOK_SOURCES := _config.yml _toc.yml intro.md references.bib \
	$(wildcard chapters/*.ipynb appendices/*.md appendices/*.ipynb lib/servingcap/*.py)
BOOK_INDEX   := _build/html/index.html
CHROMIUM     := /usr/bin/chromium

# Build the book, then serve MathJax from the book itself (no CDN: the book works
# offline). MathJax 3 comes from the pinned PyPI package django-static-mathjax;
# _config.yml's mathjax_path points at _static/mathjax/tex-mml-chtml.js.
define build-book
$(BIN)/jupyter-book build . -W -n --keep-going || { rm -f $(BOOK_INDEX); exit 1; }
rm -rf _build/html/_static/mathjax
cp -R "$$($(BIN)/python -c 'import mathjax, pathlib; print(pathlib.Path(mathjax.__file__).parent / "static" / "mathjax" / "es5")')" _build/html/_static/mathjax
touch $(BOOK_INDEX)
endef

book: $(STAMP) $(KERNEL_CONFIG)
	$(build-book)
	@echo "Open _build/html/index.html in a browser."

# The browser test rebuilds the book only when it is missing or older than its sources.
$(BOOK_INDEX): $(STAMP) $(KERNEL_CONFIG) $(BOOK_SOURCES)
	$(build-book)

# lint first: a ruff error fails `make test` before minutes of tests run
test: lint $(STAMP) $(KERNEL_CONFIG)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadscope --durations=30 $(NBVAL) chapters appendices tests

# All run on every core (pytest-xdist). `make test` runs the unit tests and nbval in
# one session so that neither waits for the other's slowest file; chapters come first,
# so the longest notebooks start early. --dist loadscope keeps each file on one worker
# (conftest.py: a notebook's cells in order) but spreads the chapter re-runs of
# tests/test_rerun.py and the README commands one by one.
JOBS ?= auto
NBVAL := --nbval --nbval-sanitize-with nbval_sanitize.cfg

test-unit: $(STAMP) $(KERNEL_CONFIG)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadscope tests

test-notebooks: $(STAMP) $(KERNEL_CONFIG)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadscope $(NBVAL) chapters appendices

# Headless Debian Chromium (CI runs as root; Playwright never downloads a browser).
chromium:
	@test -x $(CHROMIUM) || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# Every page of the built book in Chromium: console errors, images, math, links,
# solution dropdowns, notebook downloads, no request leaving 127.0.0.1; screenshots
# land in _build/screenshots/.
test-browser: $(STAMP) chromium $(BOOK_INDEX)
	$(BIN)/python -m pytest tests/browser --run-browser

bench: $(STAMP)
	$(BIN)/python bench/fcfs_vs_ciw.py
	$(BIN)/python bench/serving_replay.py
	$(BIN)/python bench/engine_speedup.py
	$(BIN)/python bench/plan_speed.py

lint: $(STAMP)
	$(BIN)/ruff check lib tests bench

clean:
	rm -rf _build
	find . -name __pycache__ -prune -exec rm -rf {} +
