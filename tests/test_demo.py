"""`walchannel demo`'s usage errors (the demo itself runs from the wheel: test_wheel.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, child_env


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
