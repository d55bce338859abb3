"""A fork beside an open channel warns once (gRPC's fork handlers can crash the child).

Multiprocessing's default start method on Linux before Python 3.14 is
``fork``: with a channel open the forked child segfaulted inside
``os.fork()`` in about 1 fork in 6-12 under load (0 in 16 with
``GRPC_ENABLE_FORK_SUPPORT=false``). The warning is tested, not the crash:
each scenario runs in a fresh Python process (``helpers/fork_warn.py``), so
this test's own process never forks beside gRPC threads.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import HELPERS, PYTHON, child_env

SCRIPT = HELPERS / "fork_warn.py"


def run(mode: str, tmp_path: Path, **env: str) -> list[dict[str, Any]]:
    base = child_env(**env)
    if "GRPC_ENABLE_FORK_SUPPORT" not in env:
        base.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    out = subprocess.run(
        [PYTHON, str(SCRIPT), mode, str(tmp_path / "wal")],
        capture_output=True,
        text=True,
        env=base,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def check_the_advice(warning: dict[str, Any]) -> None:
    assert warning["category"] == "RuntimeWarning"
    message = warning["message"]
    assert "open walchannel channel" in message
    assert "GRPC_ENABLE_FORK_SUPPORT=false before grpc is imported" in message
    assert "'spawn' or 'forkserver'" in message


def test_os_fork_with_a_channel_open_warns_once_at_the_forking_line(tmp_path: Path) -> None:
    found = run("fork", tmp_path)
    assert len(found) == 1, found  # two forks, one warning
    check_the_advice(found[0])
    assert Path(found[0]["file"]) == SCRIPT  # the caller of os.fork(), not walchannel


def test_a_multiprocessing_fork_process_with_a_channel_open_warns_once(tmp_path: Path) -> None:
    found = run("mp", tmp_path)
    assert len(found) == 1, found
    check_the_advice(found[0])
    assert Path(found[0]["file"]).parent.name == "multiprocessing"


@pytest.mark.parametrize("mode", ["closed", "never"])
def test_no_warning_without_an_open_channel(mode: str, tmp_path: Path) -> None:
    assert run(mode, tmp_path) == []


@pytest.mark.parametrize("value", ["false", "0", "No"])
def test_no_warning_when_grpc_fork_support_is_already_off(value: str, tmp_path: Path) -> None:
    assert run("fork", tmp_path, GRPC_ENABLE_FORK_SUPPORT=value) == []


def test_an_unparsable_value_leaves_grpc_fork_support_on_and_still_warns(tmp_path: Path) -> None:
    # gRPC reads "off" as no bool at all and keeps its fork handlers.
    found = run("fork", tmp_path, GRPC_ENABLE_FORK_SUPPORT="off")
    assert len(found) == 1, found
