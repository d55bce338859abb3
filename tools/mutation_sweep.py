"""The simulator's sweep as pytest tests: the half of the mutation run's test command pytest lacks.

mutmut runs only pytest, so ``tools/mutation.py`` (``make mutation``) hands it
this file beside the fast tests of the driver and the log. It is not under
``tests/``, so ``make test`` does not collect it (tests/test_simulation.py runs
its own, longer sweep there). Each test drives ``tools/sim.py`` through its
command line, as a person would, and fails on the first violating schedule:

- the corpus (``tools/sim_corpus.txt``): few seeds that execute every line of
  the channel a 20,000-seed sweep does (docs/reliability.md, "What it
  executes");
- the seeds the 1,000,000-schedule runs found (tests/test_simulation.py);
- the first ``MUTATION_SEEDS`` seeds (default 300, the plants' bound), stopping
  at the first failing one.

Run by hand: ``python -m pytest -q tools/mutation_sweep.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent

#: Schedules of the sweep (env ``MUTATION_SEEDS``): the plants' bound
#: (tests/test_simulation.py ``BOUND``), about 2.5 s on one core.
SEEDS = int(os.environ.get("MUTATION_SEEDS", "300"))

#: The seeds the long runs found (docs/reliability.md "Findings").
FOUND = (
    "83523,97222,100834,105191,121843,291100,242852,293762,303342,479022,"
    "531948,728438,776480,911652,1023789,1041755,551526,556453,642715,1439882"
)


def _load_sim() -> ModuleType:
    # By path, as tests/test_simulation.py does: tools/ is no package. Under
    # mutmut this file and sim.py are copies in mutants/, which import the
    # mutated walchannel.
    spec = importlib.util.spec_from_file_location("walchannel_sim", ROOT / "tools" / "sim.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sim = _load_sim()


def _run(*argv: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = sim.main([*argv, "--quiet"])
    assert status == 0, out.getvalue()[-4000:]


def test_the_corpus_finds_no_violation() -> None:
    _run("--seed-list", f"@{ROOT / 'tools' / 'sim_corpus.txt'}")


def test_the_seeds_the_long_runs_found_hold() -> None:
    _run("--seed-list", FOUND)


def test_a_short_sweep_finds_no_violation() -> None:
    _run("--seeds", str(SEEDS), "--jobs", "1", "--stop-at-first")
