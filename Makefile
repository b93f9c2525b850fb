# Everything runs inside .venv, created from requirements.txt on first use.
# `make book` builds the HTML book (every chapter executed, warnings are errors);
# `make test` runs the unit tests and nbval over every chapter.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP_VERSION := 26.3

.PHONY: book test test-unit test-notebooks bench lint clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "Open _build/html/index.html in a browser."

test: test-unit test-notebooks

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest --nbval chapters

bench: $(STAMP)
	$(BIN)/python bench/fcfs_vs_ciw.py
	$(BIN)/python bench/serving_replay.py

lint: $(STAMP)
	$(BIN)/ruff check lib tests bench

clean:
	rm -rf _build
	find . -name __pycache__ -prune -exec rm -rf {} +
