"""``walchannel inspect``'s human output fits 120 columns, and docs/operations.md shows it as it is.

Real logs (RunLog, SQLite files, the CLI as a process); the documented
example is rendered from real logs written under a set clock, with what
depends on the machine (paths, owners' pids and hosts, bytes on disk) set
to the example's.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_inspect_next_step import build_every_state

from conftest import PYTHON, ROOT, child_env
from walchannel.cli.inspection import RunReport, inspect_log, next_step
from walchannel.cli.logs import table_lines
from walchannel.cli.watch import Rates, render
from walchannel.log import RunLog
from walchannel.log.lock import LockOwner

WIDTH = 120


def ages(text: str) -> str:
    """``text`` with every age (``45s``, ``3m12s``, ``2h05m``, ``3d04h``) as ``AGE``."""
    return re.sub(r"\b\d+(?:s|m\d\ds|h\d\dm|d\d\dh)\b", "AGE", text)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )


@pytest.fixture
def owned() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_the_table_fits_120_columns_and_wide_keeps_one_line_per_run(
    tmp_path: Path, owned: ExitStack
) -> None:
    logs = build_every_state(tmp_path / "wal", owned)
    folder = str(tmp_path / "wal")
    runs = json.loads(cli("inspect", folder, "--json").stdout)
    table = cli("inspect", folder)
    assert table.returncode == 1, table.stderr
    lines = table.stdout.splitlines()
    too_long = [line for line in lines if len(line) > WIDTH]
    assert not too_long, "\n".join(too_long)
    # The wrapped notes, unwrapped; ages may have moved on since --json ran.
    text = ages(" ".join(line.strip() for line in lines))
    for run in runs:
        if run["next_step"] != "nothing":  # an active run with nothing to do has no line
            assert run["next_step"] in text, run["next_step"]
        assert run["reason"] is None or ages(run["reason"]) in text, run["reason"]
    # Each run's row starts a line; its notes are indented under it.
    rows = [line for line in lines[1:] if not line.startswith(" ")]
    assert len(rows) == len(logs) == len(runs)
    assert all(line.startswith("    ") for line in lines[1:] if line not in rows)

    wide = cli("inspect", folder, "--wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["DETAIL", "NEXT", "STEP"]
    assert len(wide) == len(runs) + 1
    assert max(len(line) for line in wide) > WIDTH  # nothing cut or wrapped
    for run in runs:
        (line,) = [ln for ln in wide if f" {run['run_id']} " in ln]
        assert line.endswith(run["next_step"]), line


# -- docs/operations.md's examples are the real output ------------------------------------

#: The moment the example's inspect runs (unix seconds).
NOW = 1_760_000_000.0
#: Where the example's logs are (the harness user's default folder).
DOC_DIR = "/home/scan/.local/state/walchannel"


class SetClock:
    """A clock the test sets: the wall time of every write and of inspect's "now".

    No boot id, so ages are read off the wall clock (SPEC "Ages survive
    wall-clock steps": a record of another boot).
    """

    def __init__(self) -> None:
        self.now = NOW

    def monotonic_ms(self) -> float:
        return self.now * 1000

    def wall_s(self) -> float:
        return self.now

    def boot_s(self) -> float:
        return self.now

    def boot_id(self) -> str | None:
        return None


def finding(n: int) -> dict[str, Any]:
    paths = ("tools/run.py", "app/settings.py", "app/db.py", "lib/shell.py")
    return {
        "fields": {
            "test_id": ("B602", "B105", "B608", "B404")[n % 4],
            "path": paths[n % 4],
            "line": 7 + n % 97,
        }
    }


def rows(first: int, count: int) -> list[tuple[str, dict[str, Any]]]:
    return [("finding", finding(n)) for n in range(first, first + count)]


DONE = {"status": "completed", "findings": 1046, "coverage": ["src"], "exit_reason": ""}


def example_logs(folder: Path, owned: ExitStack) -> dict[str, tuple[Path, LockOwner | None, int]]:
    """The example's runs as real logs: run id -> (log, owner shown, bytes on disk shown)."""
    clock = SetClock()
    logs: dict[str, tuple[Path, LockOwner | None, int]] = {}
    here = socket.gethostname()

    def log(run_id: str, *, keep: bool = False) -> RunLog:
        wal = RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}", clock=clock)
        if keep:  # its harness is alive: the lock stays held
            owned.enter_context(wal)
        return wal

    def at(ago_s: float) -> None:
        clock.now = NOW - ago_s

    folder.mkdir(parents=True)
    corrupt = folder / "scan-0413.wal.sqlite3"
    corrupt.write_bytes(b"\x00garbage, not SQLite" * 250)
    logs["scan-0413"] = (corrupt, None, 5_000)

    at(4_000)
    with log("scan-0412") as wal:  # its harness died: 125 rows wait for a restart or a flush
        wal.append_many(rows(1, 9_018))
        at(195)
        wal.ack(9_018)
        at(192)
        wal.append_many(rows(9_019, 125))
        at(190)
        wal.update_meta(
            last_engine_addr="10.0.3.7:50051",
            last_error="10.0.3.7:50051: UNAVAILABLE: failed to connect to all addresses",
            last_error_at=clock.now,
        )
    logs["scan-0412"] = (wal.path, None, 261_530)

    at(9_000)
    wal = log("scan-0415", keep=True)  # alive, but the engine refuses its token
    wal.append_many(rows(1, 3_300))
    at(7_505)
    wal.ack(3_300)
    at(7_500)
    wal.append_many(rows(3_301, 42))
    at(31)
    wal.update_meta(
        last_error="10.0.3.9:50051: UNAUTHENTICATED: unknown run or token", last_error_at=clock.now
    )
    logs["scan-0415"] = (wal.path, LockOwner(81233, here), 122_880)

    at(600)
    wal = log("scan-0410", keep=True)  # its Done waits for the engine's ack
    wal.append_many(rows(1, 9_143))
    at(5)
    wal.ack(9_143)
    at(4)
    wal.append("done", DONE)
    logs["scan-0410"] = (wal.path, LockOwner(80110, here), 71_680)

    at(60)
    wal = log("scan-0416", keep=True)  # streaming, on another host's mount
    wal.append_many(rows(1, 2_000))
    at(0)
    wal.ack(2_000)
    wal.append_many(rows(2_001, 3))
    logs["scan-0416"] = (wal.path, LockOwner(81502, "worker-7"), 4_299_161)

    at(100_000)
    with log("scan-0409") as wal:  # stopped between batches, all acked
        wal.append_many(rows(1, 500))
        at(93_600)
        wal.ack(500)
    logs["scan-0409"] = (wal.path, None, 20_480)

    at(280_000)
    with log("scan-0401") as wal:  # finished: a tombstone
        wal.append_many(rows(1, 1_046))
        seq = wal.append("done", DONE)
        at(273_600)
        wal.ack(seq)
    logs["scan-0401"] = (wal.path, None, 20_480)
    clock.now = NOW
    return logs


def as_documented(path: Path, owner: LockOwner | None, disk: int, *, show: int = 0) -> RunReport:
    """The real report of ``path`` at NOW, with the machine's parts set to the example's."""
    report = inspect_log(path, show=show, clock=SetClock())
    report = replace(report, file=f"{DOC_DIR}/{path.name}", locked_by=owner, file_bytes=disk)
    return replace(report, next_step=next_step(report))


def documented(command: str) -> list[str]:
    """The lines docs/operations.md shows under ``$ command``."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split(f"```\n$ {command}\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_operations_examples_are_what_inspect_prints(tmp_path: Path, owned: ExitStack) -> None:
    logs = example_logs(tmp_path / "wal", owned)
    reports = sorted((as_documented(*spec) for spec in logs.values()), key=lambda r: r.sort_key)
    real = table_lines(reports, NOW)
    assert documented("walchannel inspect") == real, "\n" + "\n".join(real)
    assert max(len(line) for line in real) <= WIDTH

    orphaned = as_documented(*logs["scan-0412"], show=2)
    real = table_lines([orphaned], NOW)
    shown = documented("walchannel inspect scan-0412.wal.sqlite3 --show 2")
    assert shown == real, "\n" + "\n".join(real)
    assert max(len(line) for line in real) <= WIDTH


def test_the_watch_example_is_what_the_live_view_prints(tmp_path: Path, owned: ExitStack) -> None:
    logs = example_logs(tmp_path / "wal", owned)
    reports = [as_documented(*logs[run]) for run in ("scan-0415", "scan-0410", "scan-0416")]
    rates = [Rates(0.0, 0.0), Rates(0.0, 0.0), Rates(212.4, 212.8)]
    real = render(reports, rates, where="/var/lib/scan/wal", interval_s=5, now=NOW)
    shown = documented("walchannel inspect /var/lib/scan/wal --watch 5")
    # The header's clock is local time: only its shape is compared.
    assert re.fullmatch(
        r"walchannel inspect --watch 5s  /var/lib/scan/wal  \d\d:\d\d:\d\d  \(Ctrl-C to stop\)",
        shown[0],
    )
    assert shown[1:] == real[1:], "\n" + "\n".join(real)
    assert max(len(line) for line in real) <= WIDTH
