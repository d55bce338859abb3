# `make test` and `make demo` each set up .venv by themselves (pip only).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The demo needs only the package and bandit, not the test toolchain.
DEMO_STAMP     := $(VENV)/.installed-demo
HOSTLOSS_STAMP := $(VENV)/.installed-hostloss
MUTATION_STAMP := $(VENV)/.installed-mutation

.PHONY: help test test-pythons test-stress demo demo-hostloss lint typecheck pytest chaos chaos-hostloss sim mutation bench proto clean

help:
	@echo "make demo           a real bandit scan through an engine kill and a harness SIGKILL, audited"
	@echo "make test           ruff, mypy --strict and the whole suite (parallel workers)"
	@echo "make test-pythons   the suite on Python 3.12 and 3.13 too (nox; one missing is skipped)"
	@echo "make test-stress    the suite RUNS=3 times beside two busy loops: the flake hunt"
	@echo "make demo-hostloss  the log replicated with Litestream, the machine lost, restored, resumed"
	@echo "make chaos          every kill point, SIGKILL at random moments, the runner through 20 kills (docs/reliability.md)"
	@echo "make chaos-hostloss LOSSES=20 host losses at random times"
	@echo "make sim            100,000 simulated schedules (docs/reliability.md)"
	@echo "make mutation       mutmut on the driver and the log, MUTATION_MIN=240 at most, resumable"
	@echo "make bench          the benchmarks, side by side with their baselines (docs/performance.md)"
	@echo "make lint | typecheck | pytest | proto | clean"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,demo]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

$(HOSTLOSS_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[demo,replicate]'
	touch $(HOSTLOSS_STAMP)

# mutmut is the mutation extra's alone: make test and CI never install it.
$(MUTATION_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[test,mutation]'
	touch $(MUTATION_STAMP)

# The suite mostly waits (engines, subprocesses, timeouts): four workers on
# two cores keep the CPUs busy (pytest-xdist). WORKERS=0 runs it serially.
WORKERS ?= 4

test: $(STAMP)
	$(VENV)/bin/ruff check walchannel tests tools examples
	$(VENV)/bin/mypy
	$(MAKE) --no-print-directory pytest

# The suite on the other Pythons the package claims (noxfile.py: a venv per
# Python under .nox/); one the machine lacks is skipped, saying so.
test-pythons: $(STAMP)
	WORKERS=$(WORKERS) $(VENV)/bin/nox --no-error-on-missing-interpreters

# The suite RUNS times beside two busy-loop processes: a flake fails here.
RUNS ?= 3
test-stress: $(STAMP)
	$(PY) tools/stress.py --runs $(RUNS) -- -n $(WORKERS) -m "not forks"

demo: $(DEMO_STAMP)
	PYTHONPATH=examples $(PY) -m demo

# The log replicated with Litestream; the whole machine lost, restored, resumed.
demo-hostloss: $(HOSTLOSS_STAMP)
	PYTHONPATH=examples $(PY) -m demo --host-loss

lint: $(STAMP)
	$(VENV)/bin/ruff check walchannel tests tools examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Tests that fork a child as another user run in a process of their own:
# a fork beside gRPC threads (another test's, in the same worker) can crash.
pytest: $(STAMP)
	$(PY) -m pytest -q -n $(WORKERS) -m "not forks"
	$(PY) -m pytest -q -m forks

proto: $(STAMP)
	$(PY) tools/gen_proto.py

chaos: $(STAMP)
	$(PY) tools/chaos.py --all
	$(PY) tools/chaos_runner.py

# 20 host losses at random times, each restored and resumed (not in make test).
LOSSES ?= 20
SYNC_INTERVALS ?= 1
chaos-hostloss: $(STAMP)
	$(PY) tools/chaos_hostloss.py --losses $(LOSSES) --sync-intervals $(SYNC_INTERVALS)

sim: $(STAMP)
	$(PY) tools/sim.py --seeds 100000

# The mutation score of walchannel/core/driver.py and walchannel/log/state.py (not
# in make test): stops after MUTATION_MIN minutes, and the next run goes on
# where it stopped (mutants/); writes docs/mutation-survivors.md.
MUTATION_MIN ?= 240
mutation: $(MUTATION_STAMP)
	$(PY) tools/mutation.py run --budget-min $(MUTATION_MIN)
	$(PY) tools/mutation.py report

bench: $(STAMP)
	$(PY) -m tools.bench

clean:
	rm -rf $(VENV) .nox build dist .pytest_cache .mypy_cache .ruff_cache
