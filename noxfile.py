"""The suite on every Python the package claims beside the one ``make test`` uses.

``make test`` runs ruff, mypy and the suite on the machine's ``python3``
(3.11 on the reference machine and in CI); ``make test-pythons`` runs this
file: a session per other Python, each in a venv of its own under ``.nox/``,
running the suite exactly as ``make pytest`` does. ``nox -l`` lists them,
``nox -s tests-3.13 -- -k flood`` passes pytest arguments on.

An interpreter is looked for as ``python3.X`` on ``PATH`` and then among
pyenv's versions (``$PYENV_ROOT``, default ``~/.pyenv``), whose shims only
answer for the selected version. A Python the machine does not have is
skipped with a line that says so; none is ever downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

# requires-python is ">=3.11": every CPython from 3.11 to the newest release
# (pyproject classifiers, README "Development"). 3.11 runs in make test.
PYTHONS = ("3.12", "3.13")
WORKERS = os.environ.get("WORKERS", "4")

nox.options.sessions = [f"tests-{version}" for version in PYTHONS]
nox.options.error_on_missing_interpreters = False
nox.options.download_python = "never"


def interpreter(version: str) -> str:
    """The path of a working ``python{version}``, or ``version`` itself (nox: not found)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(map(str, root.glob(f"versions/{version}.*/bin/python{version}")))
    for candidate in candidates:
        if candidate is None:
            continue
        # A pyenv shim exists for every installed version but runs only the selected one.
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            return probe.stdout.strip()
    return version


def suite(session: nox.Session) -> None:
    """Install the package with its test extra, then run ``make pytest``'s two commands."""
    session.install("-e", ".[test,demo]")
    session.run("python", "-m", "pytest", "-q", "-n", WORKERS, "-m", "not forks", *session.posargs)
    # With pytest arguments, the forks run may select no test (pytest's exit 5).
    codes = [0, 5] if session.posargs else [0]
    session.run(
        "python", "-m", "pytest", "-q", "-m", "forks", *session.posargs, success_codes=codes
    )


for _version in PYTHONS:
    nox.session(name=f"tests-{_version}", python=interpreter(_version), venv_backend="venv")(suite)
