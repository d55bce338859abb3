# `make test` and `make demo` each set up .venv by themselves (pip only).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-stress demo demo-hostloss lint typecheck pytest chaos chaos-hostloss sim bench proto clean

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

# The log replicated with Litestream; the whole machine lost, restored, resumed.
demo-hostloss: $(STAMP)
	$(VENV)/bin/walchannel demo --host-loss

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

# 20 host losses at random times, each restored and resumed (not in make test).
LOSSES ?= 20
SYNC_INTERVALS ?= 1
chaos-hostloss: $(STAMP)
	$(PY) tools/chaos_hostloss.py --losses $(LOSSES) --sync-intervals $(SYNC_INTERVALS)

sim: $(STAMP)
	$(PY) tools/sim.py --seeds 100000

bench: $(STAMP)
	$(PY) -m tools.bench

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
