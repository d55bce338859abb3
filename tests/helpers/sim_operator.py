"""The simulated operator of tests/test_simulation.py: it takes over every log of the world.

See ``sim_site/sitecustomize.py``: ``tools/sim.py`` predates the writer
identity, so its lost logs and older copies would meet the channel's new
refusal (``WriterFencedError``). :func:`take_over_in` marks the fresh image
of a simulator loaded in this process; :func:`env` is the environment that
does the same in a simulator process (``--replay``, coverage, the planted
copies).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from types import ModuleType

#: The folder whose ``sitecustomize`` patches ``walchannel.log`` in a process.
SITE = Path(__file__).resolve().parent / "sim_site"


def take_over_in(sim: ModuleType) -> None:
    """Give the simulator loaded as ``sim`` a fresh-log image marked for takeover."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    sim.RunLog.initialize(conn, sim.RUN_ID, sim.CORRELATION_ID)
    conn.execute("UPDATE meta SET takeover_at = created_at WHERE id = 1")
    sim._FRESH = conn.serialize()
    conn.close()


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :data:`SITE` first on ``PYTHONPATH``."""
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), out.get("PYTHONPATH", "")) if p)
    return out
