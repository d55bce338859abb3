from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from walchannel.testing.engine import LocalEngine

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


def new_run(engine: LocalEngine, prefix: str = "run") -> tuple[str, str]:
    """Register a fresh run with ``engine``; return ``(run_id, token)``."""
    run_id = f"{prefix}-{secrets.token_hex(4)}"
    token = "tok-" + secrets.token_urlsafe(18)
    engine.register_run(run_id, token)
    return run_id, token


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Wait until ``check()`` is true, polling every 20 ms; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that fork a child as another user (``helpers.users.as_user``).

    A fork without exec in a process that has gRPC threads (any earlier test
    in the same worker that dialed or served) can crash the child: these
    run apart, in a pytest process of their own (Makefile ``pytest``).
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if item.path.name == "test_readers.py" or "nobody_dir" in fixtures:
            item.add_marker(pytest.mark.forks)
