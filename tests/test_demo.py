"""The demo's usage errors and its lines (examples/demo; it runs whole in test_wheel.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, child_env


def test_demo_refuses_an_empty_tree(tmp_path: Path) -> None:
    out = subprocess.run(
        [PYTHON, "-m", "demo", "--tree", str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert out.returncode == 2
    assert "no Python files" in out.stderr


# -- the progress line and the resume line count the same thing, labelled ---------------


def scan_event(index: int, total: int) -> dict[str, object]:
    """A ``scan.file`` event as ``LocalEngine.bodies`` returns it (numbers as floats)."""
    payload = {"path": f"m{index}.py", "index": float(index), "total": float(total)}
    return {"seq": 0, "kind": "event", "body": {"type": "scan.file", "payload": payload}}


def test_the_progress_line_and_the_resume_line_agree_on_the_harness_marker(
    tmp_path: Path,
) -> None:
    from demo.progress import engine_progress, progress_line, read_marker, resume_line

    from walchannel.log import RunLog

    total = 734
    # The killed harness committed file 371's rows with its marker; the engine
    # holds the events of 370 files (one of them twice, as an older harness
    # killed between a file's event and its findings sent) and 1,018 findings.
    with RunLog.open(tmp_path / "wal", "demo-run", correlation_id="c") as wal:
        for index in range(371):
            wal.append(
                "event",
                {"type": "scan.file", "severity": "info", "payload": {"index": index}, "ts": ""},
                progress={"runner": 1, "work": "t", "next": index + 1, "findings": 1_020},
            )
        wal.ack(300)
    bodies = [scan_event(i, total) for i in range(370)] + [scan_event(369, total)]
    bodies += [{"seq": 0, "kind": "finding", "body": {"fields": {}}}] * 1_018
    assert engine_progress(bodies) == (1_018, 370)

    meta = read_marker(tmp_path / "wal", "demo-run")
    line = progress_line(bodies, total, meta)
    resume = resume_line(meta, total)
    marker = "harness marker: 371/734 files scanned"
    assert line == f"engine holds 1018 findings from 370/734 files; {marker}", line
    assert resume == (
        f"{marker}, 1020 findings logged (seqs up to 371 logged, up to 300 acked): "
        "it resumes with file 372"
    ), resume

    # No log yet, or no marker yet: both say so, alike.
    none = read_marker(tmp_path / "none", "demo-run")
    assert progress_line([], total, none).endswith("harness marker: none yet")
    assert resume_line(none, total) == "harness marker: none yet: it starts with file 1"
