"""A log that cannot be opened is never called corrupt (issue 26, item 2).

SQLite reports only SQLITE_CANTOPEN ("unable to open database file") for a
path longer than it accepts, a descriptor limit reached and other causes
that say nothing about the file's content. ``WalCorruptError`` is kept for
content that proves it; every other failure names its cause, found by asking
the OS (``walchannel.log.files.open_failure``), in the owner's open, ``inspect``,
``export`` and ``flush``. Every cause here holds for root too (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from walchannel import WalCorruptError, WalLocationError, WalWriteError
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.files import SQLITE_MAX_PATH_BYTES, log_path


def folder_for(base: Path, run_id: str, total: int) -> Path:
    """A folder under ``base`` in which ``run_id``'s log path is ``total`` bytes long."""
    name = len(f"/{run_id}.wal.sqlite3")
    room = total - len(str(base)) - name
    parts: list[str] = []
    while room > 0:
        take = min(200, room - 1)  # "/" + up to 200 characters (a name is at most 255)
        if room - 1 - take == 1:  # never leave room for "/" alone
            take -= 1
        parts.append("d" * take)
        room -= take + 1
    folder = base.joinpath(*parts)
    assert len(str(folder)) + name == total
    return folder


def make_log(folder: Path, run_id: str, rows: int = 3) -> Path:
    with RunLog.open(folder, run_id, correlation_id="c") as wal:
        wal.append_many([("finding", {"n": i}) for i in range(rows)])
    return log_path(folder, run_id)


def files_in(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walchannel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("total", [560, SQLITE_MAX_PATH_BYTES + 1], ids=["560", "limit+1"])
def test_a_healthy_log_moved_to_a_too_long_path_is_named_as_such_never_corrupt(
    tmp_path: Path, total: int
) -> None:
    short = tmp_path / "s"
    make_log(short, "run-1")
    folder = folder_for(tmp_path, "run-1", total)
    folder.parent.mkdir(parents=True)
    shutil.move(short, folder)
    path = log_path(folder, "run-1")
    before = files_in(folder)

    with pytest.raises(WalWriteError) as raised:
        RunLog.open(folder, "run-1", correlation_id="c")
    said = str(raised.value)
    assert f"its path is {total} bytes long" in said and f"{SQLITE_MAX_PATH_BYTES} bytes" in said
    assert str(path) in said
    assert files_in(folder) == before  # nothing written, not even the lock

    report = inspect_log(path)
    assert report.state == "unreadable", report
    assert report.reason is not None and f"its path is {total} bytes long" in report.reason

    inspected = cli("inspect", str(path), "--json")
    assert inspected.returncode == 1
    assert json.loads(inspected.stdout)[0]["state"] == "unreadable"
    exported = cli("export", str(path))
    assert exported.returncode == 2
    assert f"its path is {total} bytes long" in exported.stderr
    flushed = cli(
        "flush",
        "--grpc-addr",
        "127.0.0.1:9",
        "--token-env",
        "T",
        str(path),
        env=dict(os.environ, T="tok-never-shown-123"),
    )
    assert flushed.returncode != 0
    assert f"its path is {total} bytes long" in flushed.stderr
    assert "tok-never-shown-123" not in flushed.stderr + flushed.stdout
    assert files_in(folder) == before

    # Moved back to a short path, it is the same healthy log.
    shutil.move(folder, tmp_path / "back")
    with RunLog.open(tmp_path / "back", "run-1", correlation_id="c") as wal:
        assert [r.body for r in wal.unacked()] == [{"n": 0}, {"n": 1}, {"n": 2}]


@pytest.mark.parametrize("total", [483, SQLITE_MAX_PATH_BYTES], ids=["483", "at-the-limit"])
def test_a_log_whose_path_fits_is_created_there_temporary_and_all(
    tmp_path: Path, total: int
) -> None:
    folder = folder_for(tmp_path, "run-2", total)
    path = make_log(folder, "run-2", rows=2)
    assert len(str(path)) == total
    with RunLog.open(folder, "run-2", correlation_id="c") as wal:
        assert wal.next_seq == 3
    assert inspect_log(path).state == "orphaned"


@pytest.mark.parametrize("over", [1, 60], ids=["one-byte-over", "far-over"])
def test_a_new_log_too_long_for_sqlite_is_refused_before_anything_is_written(
    tmp_path: Path, over: int
) -> None:
    folder = folder_for(tmp_path, "run-3", SQLITE_MAX_PATH_BYTES + over)
    with pytest.raises(WalWriteError, match=f"{SQLITE_MAX_PATH_BYTES + over} bytes long"):
        RunLog.open(folder, "run-3", correlation_id="c")
    assert not folder.exists()  # not even the folder
    assert list(tmp_path.iterdir()) == []


def test_something_else_where_the_log_or_its_folder_should_be_is_named(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    # A file where the folder should be: the log cannot live there (no retry mends it).
    with pytest.raises(WalLocationError, match="exists and is not a folder"):
        RunLog.open(tmp_path / "a-file", "run-4", correlation_id="c")
    with pytest.raises(WalLocationError, match="a part of its path is a file, not a folder"):
        RunLog.open(tmp_path / "a-file" / "below", "run-4", correlation_id="c")
    log_path(tmp_path / "f", "run-4").mkdir(parents=True)
    with pytest.raises(WalCorruptError, match="is a folder, not a log file"):
        RunLog.open(tmp_path / "f", "run-4", correlation_id="c")


EMFILE_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys
    from pathlib import Path
    from walchannel import WalchannelError
    from walchannel.log import RunLog
    from walchannel.cli.inspection import inspect_log

    folder, run_id, spare = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    log = folder / f"{run_id}.wal.sqlite3"
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    for fd in held[:spare]:
        os.close(fd)
    out = {}
    try:
        RunLog.open(folder, run_id, correlation_id="c").close()
        out["open"] = "opened"
    except WalchannelError as exc:
        out["open"] = f"{type(exc).__name__}: {exc}"
    report = inspect_log(log)
    out["inspect"] = [report.state, report.reason]
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("spare", [0, 1, 2], ids=["no-fd-left", "one-fd-left", "two-fds-left"])
def test_running_out_of_file_descriptors_is_named_never_corrupt(tmp_path: Path, spare: int) -> None:
    path = make_log(tmp_path, "run-5")
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", EMFILE_SCRIPT, str(tmp_path), "run-5", str(spare)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["open"].startswith("WalWriteError") and "EMFILE" in out["open"], out
    state, reason = out["inspect"]
    # A reader needs fewer descriptors: it reads, or names the cause.
    assert state == "orphaned" or (state == "unreadable" and "EMFILE" in reason), out
    assert path.read_bytes() == before
    assert inspect_log(path).state == "orphaned"


LATE_IMPORTS_SCRIPT = textwrap.dedent(
    """
    import json, shutil, sys, tempfile
    from pathlib import Path
    from walchannel.log import RunLog
    from walchannel.cli.inspection import inspect_log

    late = []
    folder, copied = Path(sys.argv[1]), Path(sys.argv[2])
    # From here on, any import reads a module file: one more descriptor.
    sys.addaudithook(lambda event, args: event == "import" and late.append(args[0]))
    with RunLog.open(folder, "run-6", correlation_id="c") as wal:  # created
        wal.append_many([("finding", {"n": i}) for i in range(3)])
        late.append(("live", inspect_log(wal.path).state))  # mode=ro, through the -shm
        shutil.copyfile(wal.path, copied / wal.path.name)
        shutil.copyfile(f"{wal.path}-wal", copied / f"{wal.path.name}-wal")
    late.append(("copied", inspect_log(copied / wal.path.name).state))  # a private copy
    with RunLog.open(folder, "run-6", correlation_id="c") as wal:  # reopened
        wal.ack(3)
        wal.checkpoint()
    late.append(("closed", inspect_log(wal.path).state))  # immutable=1
    print(json.dumps(late))
    """
)


def test_opening_and_inspecting_a_log_import_nothing_late(tmp_path: Path) -> None:
    # A module imported on first use needs a descriptor to read its file: with
    # none left its OSError would escape unnamed (Python 3.13's Path.as_uri
    # imports urllib.parse so; a text file's codec is looked up so too).
    copied = tmp_path / "copied"
    copied.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", LATE_IMPORTS_SCRIPT, str(tmp_path / "wal"), str(copied)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["live", "active"],
        ["copied", "orphaned"],
        ["closed", "idle"],
    ]


@pytest.mark.parametrize(
    "name", ["a?b#c", "50%20 off", "été"], ids=["query-mark", "percent", "utf-8"]
)
def test_a_folder_name_that_means_something_in_a_uri_holds_a_log(tmp_path: Path, name: str) -> None:
    # SQLite opens logs by file: URI: "?", "#" and "%" in the path are quoted.
    path = make_log(tmp_path / name, "run-8", rows=2)
    with RunLog.open(tmp_path / name, "run-8", correlation_id="c") as wal:
        assert wal.next_seq == 3
        assert inspect_log(path).state == "active"
    assert inspect_log(path).state == "orphaned"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
