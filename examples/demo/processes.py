"""The demo's child processes: the harness's command, their environment, starting one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import walchannel

__all__ = ["HARNESS", "child_env", "start_engine_and_discovery", "start_process"]

#: The harness the demo runs, as a child: ``python -m`` this module.
HARNESS = ("-m", "demo.bandit_harness")


def child_env(token: str) -> dict[str, str]:
    """This process's environment for a child, with walchannel importable and the run token.

    Args:
        token: the run token, put in ``$DEMO_TOKEN`` (the harness's ``--token-env``).

    Returns:
        A new environment: ``PYTHONPATH`` starts with the folder holding this
        demo package and the one holding walchannel, so a child imports the same ones.
    """
    env = dict(os.environ)
    # The folder holding this demo package, and the one holding the walchannel
    # this process imported (a checkout or an installed wheel).
    examples = Path(__file__).resolve().parent.parent
    package_parent = Path(walchannel.__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(examples), str(package_parent), env.get("PYTHONPATH")) if p
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


def start_engine_and_discovery(
    store_path: Path, run_id: str, env: dict[str, str], log: IO[str], procs: list[Any]
) -> tuple[subprocess.Popen[str], dict[str, Any], dict[str, Any]]:
    """Start a local engine and a discovery process on one store; register ``run_id``.

    Both demos start this way; each process is appended to ``procs`` as soon
    as it runs, so the caller's cleanup stops it whatever fails next.

    Args:
        store_path: the engine store (SQLite file), shared by both processes.
        run_id: the run to register; its token is ``env["DEMO_TOKEN"]``.
        env: the children's environment (:func:`child_env`).
        log: where the children's stderr goes.
        procs: the caller's list of started processes.

    Returns:
        The engine process, and what the engine and discovery printed once
        serving (their addresses).

    Raises:
        RuntimeError: a process exited before it served.
        subprocess.CalledProcessError: the run could not be registered.
    """
    engine, info = start_process(
        ["-m", "walchannel.testing.engine", "--store", str(store_path)], env, log
    )
    procs.append(engine)
    discovery, dinfo = start_process(
        ["-m", "walchannel.testing.discovery", "--store", str(store_path)], env, log
    )
    procs.append(discovery)
    subprocess.run(
        [sys.executable, "-m", "walchannel.testing.engine", "register", "--store",
         str(store_path), "--run-id", run_id, "--token-env", "DEMO_TOKEN"],
        check=True, env=env, stdout=log, stderr=log,
    )  # fmt: skip
    return engine, info, dinfo
