"""On ``PYTHONPATH``: every log ``RunLog.initialize`` lays out is marked for takeover.

``tools/sim.py`` predates the writer identity (issue 34): its lost logs and
its older copies are fresh or rolled-back images that meet an engine holding
the run's rows, which the channel now refuses with ``WriterFencedError``.
Until the simulator models that refusal and the operator's choice itself,
tests/test_simulation.py runs it with a simulated operator who takes over
every log the world lays out (what ``walchannel takeover`` marks): the
channel then renumbers past the engine as it did before, and the world
stays the one its checks were written for. Python imports this module at
start-up (``site``); it patches ``walchannel.log`` when that is imported,
whichever copy of walchannel is on the path (the planted copies of
tests/plants.py too). In a test's own process, tests/helpers/sim_operator.py does it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any


def take_over_every_new_log(run_log: Any) -> None:
    """Make ``run_log.initialize`` (``RunLog``'s) also mark the new log for takeover."""
    original = run_log.initialize

    def initialize(conn: Any, run_id: str, correlation_id: str) -> None:
        original(conn, run_id, correlation_id)
        conn.execute("UPDATE meta SET takeover_at = created_at WHERE id = 1")

    run_log.initialize = staticmethod(initialize)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "walchannel.log":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            take_over_every_new_log(module.RunLog)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PatchOnImport())
