"""The README's runnable example runs as written (a newcomer copies it first)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, ROOT, child_env


def _python_block_after(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_the_local_engine_example_runs_without_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(_python_block_after("### Trying it against the local engine"))
    proc = subprocess.run(
        [PYTHON, "-W", "error", str(script)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[1, 2]", proc.stdout
    assert "B101" in lines[1], proc.stdout
