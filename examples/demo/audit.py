"""The demo's audit: an independent bandit run, and findings keyed by content to compare."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO, Any

__all__ = ["Key", "applied_findings", "bandit_installed", "expected_findings", "start_audit_scan"]

#: A finding's content: (path relative to the tree, line_number, col_offset, test_id).
Key = tuple[str, int, int, str]


def bandit_installed() -> bool:
    """True when bandit can be imported; else say how to get it (stderr) and return False."""
    if importlib.util.find_spec("bandit") is not None:
        return True
    print(
        "demo: bandit is not installed: the demo scans with it."
        ' Install walchannel with its demo extra (README "Installing it"),'
        " or `pip install bandit`",
        file=sys.stderr,
    )
    return False


def start_audit_scan(files: list[Path], out: Path, log: IO[str]) -> subprocess.Popen[bytes]:
    """Start the independent bandit run (``python -m bandit``) over ``files``.

    Args:
        files: the files the harness scans.
        out: where bandit writes its JSON report.
        log: where its stdout and stderr go.

    Returns:
        The running process; wait for it before :func:`expected_findings`.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "bandit", "-q", "-f", "json", "-o", str(out), *map(str, files)],
        stdout=log,
        stderr=log,
    )


def expected_findings(report: Path, tree: Path) -> Counter[Key]:
    """The findings of the independent run's JSON report, counted by content.

    Args:
        report: the report :func:`start_audit_scan` wrote.
        tree: the scanned tree (paths are made relative to it).
    """
    data = json.loads(report.read_text())
    return Counter(
        (
            str(Path(r["filename"]).resolve().relative_to(tree)),
            int(r["line_number"]),
            int(r["col_offset"]),
            str(r["test_id"]),
        )
        for r in data["results"]
    )


def applied_findings(bodies: list[dict[str, Any]]) -> Counter[Key]:
    """The findings the engine applied, counted by content.

    Args:
        bodies: the engine's applied messages (``LocalEngine.bodies`` shape).
    """
    return Counter(
        (
            str(f["path"]),
            int(f["line_number"]),
            int(f["col_offset"]),
            str(f["test_id"]),
        )
        for b in bodies
        if b["kind"] == "finding"
        for f in [b["body"]["fields"]]
    )
