"""The demo's child processes: the harness's command, their environment, starting one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

__all__ = ["HARNESS", "child_env", "start_process"]

#: The harness the demo runs, as a child: ``python -m`` this module.
HARNESS = ("-m", "walchannel.demo.bandit_harness")


def child_env(token: str) -> dict[str, str]:
    """This process's environment for a child, with walchannel importable and the run token.

    Args:
        token: the run token, put in ``$DEMO_TOKEN`` (the harness's ``--token-env``).

    Returns:
        A new environment: ``PYTHONPATH`` starts with the folder holding this
        walchannel package, so a child imports the same one.
    """
    env = dict(os.environ)
    package_parent = Path(__file__).resolve().parent.parent.parent
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(package_parent), env.get("PYTHONPATH")) if p
    )
    env["DEMO_TOKEN"] = token
    return env


def start_process(
    args: list[str], env: dict[str, str], log: IO[str]
) -> tuple[subprocess.Popen[str], Any]:
    """Start ``python ARGS`` and read the JSON line it prints once it serves.

    Args:
        args: the interpreter's arguments (``["-m", "walchannel.testing.engine", ...]``).
        env: the child's environment.
        log: where the child's stderr goes.

    Returns:
        The running process and its first stdout line, decoded (the local
        engine's and discovery's addresses).

    Raises:
        RuntimeError: the child exited before printing a line.
    """
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=log, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"{' '.join(args)} did not start (see {log.name})")
    return proc, json.loads(line)
