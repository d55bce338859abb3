# `make test` and `make demo` each set up .venv by themselves (pip only).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-stress demo lint typecheck pytest chaos sim bench proto clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,demo]'
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check walchannel tests tools examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

# The suite RUNS times beside two busy-loop processes: a flake fails here.
RUNS ?= 3
test-stress: $(STAMP)
	$(PY) tools/stress.py --runs $(RUNS)

demo: $(STAMP)
	$(VENV)/bin/walchannel demo

lint: $(STAMP)
	$(VENV)/bin/ruff check walchannel tests tools examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(PY) -m pytest -q

proto: $(STAMP)
	$(PY) tools/gen_proto.py

chaos: $(STAMP)
	$(PY) tools/chaos.py --all

sim: $(STAMP)
	$(PY) tools/sim.py --seeds 100000

bench: $(STAMP)
	$(PY) -m tools.bench

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
