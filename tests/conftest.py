from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"


@pytest.fixture
def wal_dir(tmp_path: Path) -> Path:
    """A fresh log folder (not yet created: RunLog.open makes it 0700)."""
    return tmp_path / "wal"


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a Python child that imports walchannel from this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


PYTHON = sys.executable
