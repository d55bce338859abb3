"""``inspect`` says what to do, not only what is (issue 28, item 3).

Every state, and every cause of ``failed``, gets its next step, in the table
and in ``--json`` (``next_step``); an ``active`` run in an outage shows its
last error; an explicit ``$WALCHANNEL_DIR`` that names no folder is an error
like an explicit PATH.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from conftest import PYTHON, child_env
from walchannel import RunLog
from walchannel.files import log_path
from walchannel.inspection import JSON_KEYS, inspect_log
from walchannel.log_state import (
    FAILED_CORRUPT,
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_INTERNAL,
    FAILED_UNDELIVERABLE,
)

FINDING = {"test_id": "B101", "n": 1}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *args],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=60,
    )


@pytest.fixture
def owned() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def make(folder: Path, run_id: str, rows: int = 2, *, ack: bool = False) -> Path:
    with RunLog.open(folder, run_id, correlation_id="c") as wal:
        seqs = wal.append_many([("finding", FINDING)] * rows)
        if ack and seqs:
            wal.ack(seqs[-1])
    return log_path(folder, run_id)


def failed(folder: Path, run_id: str, reason: str) -> Path:
    with RunLog.open(folder, run_id, correlation_id="c") as wal:
        wal.append("finding", FINDING)
        wal.update_meta(failed_at=time.time(), failed_reason=reason, last_error="boom")
    return log_path(folder, run_id)


EXPECTED = {
    "corrupt": "move ",
    "unreadable": "shorter path",
    "failed-behind": "restore its store",
    "failed-done": "raise the engine's receive limit, then 'walchannel flush",
    "failed-undeliverable": "'walchannel export",
    "failed-damaged": "aside and keep it",
    "failed-internal": "a walchannel bug: report",
    "orphaned": "restart the harness for run-orphaned",
    "stuck": "fix what the last error names",
    "done-pending": "wait (usually seconds)",
    "active-outage": "the engine is not answering",
    "active": "nothing",
    "idle": "restart the harness to finish it",
    "completed": "'walchannel prune --older-than DAYS",
}


def build_every_state(folder: Path, owned: ExitStack) -> dict[str, Path]:
    logs: dict[str, Path] = {}
    folder.mkdir()
    logs["corrupt"] = folder / "run-corrupt.wal.sqlite3"
    logs["corrupt"].write_bytes(b"not a database at all" * 100)
    logs["failed-behind"] = failed(folder, "run-f1", FAILED_ENGINE_BEHIND)
    logs["failed-done"] = failed(folder, "run-f2", f"{FAILED_DONE_REFUSED}: seq 9")
    logs["failed-undeliverable"] = failed(folder, "run-f3", FAILED_UNDELIVERABLE)
    logs["failed-damaged"] = failed(folder, "run-f4", FAILED_CORRUPT)
    logs["failed-internal"] = failed(folder, "run-f5", f"{FAILED_INTERNAL}: KeyError: 'x'")
    logs["orphaned"] = make(folder, "run-orphaned")
    logs["idle"] = make(folder, "run-idle", ack=True)
    done = owned.enter_context(RunLog.open(folder, "run-completed", correlation_id="c"))
    done.append("done", {"status": "completed", "findings": 0, "coverage": [], "summary": ""})
    done.complete_by_engine()
    done.close()
    logs["completed"] = done.path
    # Owned by this process (a live owner): stuck, done-pending, active.
    stuck = owned.enter_context(RunLog.open(folder, "run-stuck", correlation_id="c"))
    stuck.append("finding", FINDING)
    stuck.update_meta(last_error="10.0.0.1:50051: UNAVAILABLE", last_error_at=time.time() - 500)
    stuck._conn.execute("UPDATE rows SET appended_at = appended_at - 600, appended_boot = NULL")
    logs["stuck"] = stuck.path
    pending = owned.enter_context(RunLog.open(folder, "run-pending", correlation_id="c"))
    pending.append("done", {"status": "completed", "findings": 0, "coverage": [], "summary": ""})
    logs["done-pending"] = pending.path
    outage = owned.enter_context(RunLog.open(folder, "run-outage", correlation_id="c"))
    outage.append("finding", FINDING)
    outage.update_meta(last_error="engine: Connection refused", last_error_at=time.time())
    logs["active-outage"] = outage.path
    fine = owned.enter_context(RunLog.open(folder, "run-active", correlation_id="c"))
    fine.append("finding", FINDING)
    logs["active"] = fine.path
    return logs


def test_every_state_and_every_failed_cause_has_its_next_step(
    tmp_path: Path, owned: ExitStack
) -> None:
    logs = build_every_state(tmp_path / "wal", owned)
    for name, path in logs.items():
        report = inspect_log(path, stuck_after_s=120)
        want_state = name.split("-")[0] if name != "done-pending" else name
        assert report.state == want_state, (name, report)
        assert EXPECTED[name] in report.next_step, (name, report.next_step)
        if "'walchannel " in EXPECTED[name] or name == "corrupt":
            assert str(path.parent) in report.next_step  # commands name the file
    outage = inspect_log(logs["active-outage"])
    assert "Connection refused" in outage.detail(time.time())  # an outage shows its error
    assert "Connection refused" not in inspect_log(logs["active"]).detail(time.time())

    # --json carries next_step; the table has it under each run (--wide: a column).
    listed = cli("inspect", str(tmp_path / "wal"), "--json")
    assert listed.returncode == 1, listed.stderr
    objects = json.loads(listed.stdout)
    assert all(tuple(o) == JSON_KEYS and o["next_step"] for o in objects)
    by_run = {o["run_id"]: o for o in objects}
    assert "restore its store" in by_run["run-f1"]["next_step"]
    table = cli("inspect", str(tmp_path / "wal"))
    assert sum(line.startswith("    next step: ") for line in table.stdout.splitlines()) == len(
        [o for o in objects if o["next_step"] != "nothing"]
    )
    assert "restart the harness for run-orphaned" in table.stdout
    wide = cli("inspect", str(tmp_path / "wal"), "--wide")
    assert wide.stdout.splitlines()[0].rstrip().endswith("NEXT STEP")


def test_an_unreadable_log_names_the_fix(tmp_path: Path) -> None:
    short = tmp_path / "s"
    make(short, "run-long")
    deep = tmp_path.joinpath(*["d" * 200] * 2, "e" * 100)
    deep.parent.mkdir(parents=True)
    short.rename(deep)
    report = inspect_log(log_path(deep, "run-long"))
    assert report.state == "unreadable"
    assert EXPECTED["unreadable"] in report.next_step


def test_an_explicit_walchannel_dir_that_is_missing_is_an_error(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    for args in (("inspect",), ("inspect", "--json"), ("prune", "--older-than", "7", "--dry-run")):
        result = cli(*args, WALCHANNEL_DIR=str(typo))
        assert result.returncode == 2, (args, result)
        assert f"WALCHANNEL_DIR={typo}: no such folder" in result.stderr
    # The same typo as PATH was already an error.
    assert cli("inspect", str(typo)).returncode == 2
    # Only the default folder may be missing quietly (no run logged here yet).
    quiet = cli("inspect", WALCHANNEL_DIR="", XDG_STATE_HOME=str(tmp_path / "state"))
    assert quiet.returncode == 0 and "does not exist yet" in quiet.stdout
