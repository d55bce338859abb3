"""`walchannel demo` narrowed to a small tree: the kills happen and the audit holds."""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, child_env


@pytest.mark.slow
def test_demo_on_a_small_tree_passes_its_audit(tmp_path: Path) -> None:
    tree = Path(sysconfig.get_paths()["stdlib"]) / "email"
    out = subprocess.run(
        [
            PYTHON,
            "-m",
            "walchannel",
            "demo",
            "--tree",
            str(tree),
            "--pace",
            "0.05",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=300,
    )
    text = out.stdout
    assert out.returncode == 0, text + out.stderr[-3000:]
    assert ">>> SIGKILL engine" in text and ">>> SIGKILL harness" in text
    phases = re.search(r"findings at engine: (\d+) -> (\d+) -> (\d+)", text)
    assert phases, text
    first, second, final = map(int, phases.groups())
    assert first <= second <= final and final > 50
    for line in ("gaps:                            0", "lost:                            0"):
        assert line in text
    assert "applied twice by content:        0" in text
    assert re.search(r"applied exactly once by content: (\d+) / \1 ", text)
    assert "Done acked:                      yes" in text
    assert "PASS" in text


def test_demo_refuses_an_empty_tree(tmp_path: Path) -> None:
    out = subprocess.run(
        [PYTHON, "-m", "walchannel", "demo", "--tree", str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert out.returncode == 2
    assert "no Python files" in out.stderr
