"""Reading a log as another user, or as root, never breaks its writer (issue 13, item 2).

``inspect``, ``export``, ``prune --dry-run`` and ``flush``'s first read run
in a forked child that drops to another uid without exec (as in
tests/test_catalogue.py: CI runs as root and Python lives under a 0700
home), on real logs written by a "harness" child running as uid 4242.
After every read the test checks that nothing the writer needs changed
(names, owners, modes, bytes of every file in the folder) and that the
harness reopens its own log and writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# flush imports these inside its code path; a child of another uid cannot
# import anything from the 0700 home Python lives in, so load them here.
import grpc  # noqa: F401
import httpx  # noqa: F401
import pytest

import walchannel.channel.grpc_channel
import walchannel.config  # noqa: F401
from conftest import PYTHON, child_env
from helpers.users import as_user
from walchannel.cli import build_parser, main
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.reader import LogReader

HARNESS = 4242
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def cli_as(uid: int, *args: str | Path, tmpdir: Path | None = None) -> Result:
    """``walchannel ARGS`` (the real ``main``) in a child running as ``uid``."""

    def run() -> tuple[int, str, str]:
        if tmpdir is not None:
            tempfile.tempdir = str(tmpdir)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
        return rc, out.getvalue(), err.getvalue()

    # The parser imports the commands' modules: import them here, as root,
    # so the child need not read the source tree (a 0700 checkout folder).
    build_parser()
    answer = as_user(uid, run)
    assert answer[0] != "raised", answer
    return Result(*answer)


def tree(folder: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every file in ``folder``: owner, group, mode and a hash of its bytes.

    A ``-shm`` is SQLite's shared index, which any reader allowed to write
    it updates (WAL recovery, read marks): only its owner and mode count.
    """
    out = {}
    for path in sorted(folder.iterdir()):
        st = path.lstat()
        digest = "-" if path.name.endswith("-shm") else sha(path)
        out[path.name] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), digest)
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def write_log(folder: Path, run_id: str, rows: int, *, done: bool = False) -> None:
    """As the harness: a log with ``rows`` unacked findings (a tombstone with ``done``)."""

    def harness() -> None:
        with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as wal:
            wal.update_meta(connector_version="1", harness_name="h", harness_version="1")
            for i in range(rows):
                wal.append("finding", {"fields": {"n": i}})
            if done:
                seq = wal.append("done", {"status": "completed", "findings": rows})
                wal.ack(seq)

    assert as_user(HARNESS, harness) is None


def crash_log(folder: Path, run_id: str, rows: int) -> None:
    """As the harness: commit ``rows`` findings and die without closing (they stay in the -wal)."""

    def harness() -> None:
        wal = RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}")
        for i in range(rows):
            wal.append("finding", {"fields": {"n": i}})
        for path in folder.iterdir():
            path.chmod(0o644)
        os._exit(0)

    assert as_user(HARNESS, harness) == ("exited", 0)
    assert Path(f"{folder / run_id}.wal.sqlite3-wal").stat().st_size > 0


def harness_reopens(folder: Path, run_id: str) -> object:
    """As the harness: reopen the log and write a row (a tombstone only reopens)."""

    def harness() -> object:
        with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as wal:
            if wal.completed:
                return "completed"
            return wal.append("finding", {"fields": {"again": True}})

    return as_user(HARNESS, harness)


def readable(folder: Path, folder_mode: int) -> None:
    """As the harness: make its files readable by others, then set the folder's mode."""

    def harness() -> None:
        for path in folder.iterdir():
            path.chmod(0o644)
        folder.chmod(folder_mode)

    assert as_user(HARNESS, harness) is None


@pytest.fixture
def folder() -> Iterator[Path]:
    """``<tmp>/wal``, owned by the harness uid, reachable by every uid."""
    base = Path(tempfile.mkdtemp(prefix="walchannel-readers-", dir="/tmp"))
    base.chmod(0o755)
    wal = base / "wal"
    wal.mkdir()
    os.chown(wal, HARNESS, HARNESS)
    yield wal
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def private_tmp() -> Iterator[Path]:
    """A TMPDIR for the reading child, to see that it leaves nothing there."""
    path = Path(tempfile.mkdtemp(prefix="walchannel-readers-tmp-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def log_of(folder: Path, run_id: str) -> Path:
    return folder / f"{run_id}.wal.sqlite3"


# -- (a) a read-only folder -------------------------------------------------------------


def test_read_only_folder_another_user_sees_the_real_states(folder: Path) -> None:
    write_log(folder, "idle-run", 0)
    write_log(folder, "orphaned-run", 3)
    write_log(folder, "done-run", 2, done=True)
    readable(folder, 0o555)
    before = tree(folder)

    listed = cli_as(NOBODY, "inspect", folder, "--json")
    states = {item["run_id"]: item["state"] for item in listed.json()}
    assert states == {"idle-run": "idle", "orphaned-run": "orphaned", "done-run": "completed"}
    assert listed.rc == 1, listed.err  # the orphaned run, and only it
    orphaned = next(i for i in listed.json() if i["run_id"] == "orphaned-run")
    assert orphaned["unacked_count"] == 3 and orphaned["next_seq"] == 4

    healthy = cli_as(NOBODY, "inspect", log_of(folder, "idle-run"))
    assert healthy.rc == 0, healthy.out + healthy.err
    assert healthy.out.splitlines()[1].startswith("idle")

    exported = cli_as(NOBODY, "export", log_of(folder, "orphaned-run"))
    assert exported.rc == 0, exported.err
    assert [json.loads(line)["seq"] for line in exported.out.splitlines()] == [1, 2, 3]

    # The tombstone is found, and named as one this user may not remove
    # (the folder is read-only): exit 1, as prune itself would.
    dry = cli_as(NOBODY, "prune", folder, "--older-than", "0", "--dry-run")
    assert dry.rc == 1, dry.err
    assert f"cannot remove {log_of(folder, 'done-run')}" in dry.err
    assert "idle-run" not in dry.out + dry.err and "orphaned-run" not in dry.out + dry.err

    assert tree(folder) == before
    folder.chmod(0o755)
    assert harness_reopens(folder, "orphaned-run") == 4
    assert harness_reopens(folder, "done-run") == "completed"


# -- (b) a writable folder ----------------------------------------------------------------


def test_writable_folder_another_user_reads_and_the_harness_reopens_its_log(
    folder: Path, private_tmp: Path
) -> None:
    write_log(folder, "idle-run", 0)
    write_log(folder, "orphaned-run", 2)
    crash_log(folder, "crashed-run", 3)
    readable(folder, 0o777)
    before = tree(folder)

    listed = cli_as(NOBODY, "inspect", folder, "--json", tmpdir=private_tmp)
    states = {item["run_id"]: (item["state"], item["unacked_count"]) for item in listed.json()}
    assert states == {
        "idle-run": ("idle", 0),
        "orphaned-run": ("orphaned", 2),
        "crashed-run": ("orphaned", 3),
    }
    for run_id, rows in (("orphaned-run", 2), ("crashed-run", 3)):
        exported = cli_as(NOBODY, "export", log_of(folder, run_id), tmpdir=private_tmp)
        assert exported.rc == 0 and len(exported.out.splitlines()) == rows, exported.err
    dry = cli_as(NOBODY, "prune", folder, "--older-than", "0", "--dry-run", tmpdir=private_tmp)
    assert dry.rc == 0 and "nothing to prune" in dry.out, dry.out + dry.err

    # Nothing created, nothing re-owned, no byte changed: the -wal of the
    # crashed run was neither checkpointed nor removed by a reader.
    assert tree(folder) == before
    assert list(private_tmp.iterdir()) == []
    assert harness_reopens(folder, "idle-run") == 1
    assert harness_reopens(folder, "orphaned-run") == 3
    assert harness_reopens(folder, "crashed-run") == 4


# -- (c) root reading a user's log ---------------------------------------------------------


def test_root_reading_a_users_log_changes_nothing_the_harness_needs(folder: Path) -> None:
    folder.chmod(0o700)  # the default: only the harness (and root) get in
    write_log(folder, "idle-run", 0)
    crash_log(folder, "crashed-run", 2)
    for path in folder.iterdir():
        path.chmod(0o600)
    before = tree(folder)

    # As `sudo walchannel inspect` does: a real process running as root.
    proc = subprocess.run(
        [PYTHON, "-m", "walchannel", "inspect", str(folder), "--json"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    states = {i["run_id"]: (i["state"], i["unacked_count"]) for i in json.loads(proc.stdout)}
    assert states == {"idle-run": ("idle", 0), "crashed-run": ("orphaned", 2)}, proc.stderr
    for args in (
        ["export", log_of(folder, "crashed-run")],
        ["prune", folder, "--older-than", "0", "--dry-run"],
    ):
        assert main([str(a) for a in args]) == 0

    assert tree(folder) == before
    assert harness_reopens(folder, "idle-run") == 1
    assert harness_reopens(folder, "crashed-run") == 3


def test_root_reading_a_live_run_leaves_its_files_alone(folder: Path) -> None:
    folder.chmod(0o700)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setgroups([])
        os.setgid(HARNESS)
        os.setuid(HARNESS)
        with RunLog.open(folder, "live-run", correlation_id="c") as wal:
            wal.append("finding", {"fields": {"n": 1}})
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            wal.append("finding", {"fields": {"n": 2}})
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"x"
        before = {name: entry[:3] for name, entry in tree(folder).items()}
        assert "live-run.wal.sqlite3-shm" in before
        report = inspect_log(log_of(folder, "live-run"))
        assert (report.state, report.unacked_count) == ("active", 1), report
        assert {name: entry[:3] for name, entry in tree(folder).items()} == before
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert harness_reopens(folder, "live-run") == 3


# -- (d) a live -wal in a read-only folder ----------------------------------------------------


def test_a_crashed_runs_wal_in_a_read_only_folder_is_read_not_called_corrupt(
    folder: Path, private_tmp: Path
) -> None:
    crash_log(folder, "crashed-run", 3)
    readable(folder, 0o555)
    log = log_of(folder, "crashed-run")
    before = tree(folder)
    report = cli_as(NOBODY, "inspect", log, "--json").json()[0]
    assert (report["state"], report["unacked_count"]) == ("orphaned", 3), report
    assert tree(folder) == before

    # Without its -shm, SQLite would have to create one: the reader reads a
    # private copy instead (and removes it), and still gets every row.
    Path(f"{log}-shm").unlink()
    before = tree(folder)
    report = cli_as(NOBODY, "inspect", log, "--json", tmpdir=private_tmp).json()[0]
    assert (report["state"], report["unacked_count"]) == ("orphaned", 3), report
    exported = cli_as(NOBODY, "export", log, tmpdir=private_tmp)
    assert [json.loads(line)["seq"] for line in exported.out.splitlines()] == [1, 2, 3]
    assert tree(folder) == before
    assert list(private_tmp.iterdir()) == []

    # No room for the copy: a clear reason, not "corrupt".
    private_tmp.chmod(0o755)
    report = cli_as(NOBODY, "inspect", log, "--json", tmpdir=private_tmp).json()[0]
    assert report["state"] == "unreadable", report
    assert "its -shm is missing" in report["reason"], report
    assert f"{private_tmp}/walchannel-read-" in report["reason"], report
    assert "Permission denied" in report["reason"], report
    assert tree(folder) == before
    folder.chmod(0o755)
    assert harness_reopens(folder, "crashed-run") == 4


def test_a_log_this_user_cannot_read_is_unreadable_not_corrupt(folder: Path) -> None:
    crash_log(folder, "shm-private-run", 1)  # made readable, but for its -shm:
    Path(f"{log_of(folder, 'shm-private-run')}-shm").chmod(0o600)
    write_log(folder, "private-run", 1)  # 0600, as the harness made it
    folder.chmod(0o755)
    before = tree(folder)

    listed = cli_as(NOBODY, "inspect", folder, "--json")
    assert listed.rc == 1
    items = {item["run_id"]: item for item in listed.json()}
    private = items["private-run"]
    assert private["state"] == "unreadable"
    assert "Permission denied" in private["reason"] and f"uid {HARNESS}" in private["reason"]
    shm = items["shm-private-run"]
    assert shm["state"] == "unreadable"
    assert "-shm" in shm["reason"] and "Permission denied" in shm["reason"]
    table = cli_as(NOBODY, "inspect", folder)
    assert "corrupt" not in table.out and "unreadable" in table.out

    exported = cli_as(NOBODY, "export", log_of(folder, "private-run"))
    assert exported.rc == 2 and "Permission denied" in exported.err
    assert "corrupt" not in exported.err and "not a usable" not in exported.err
    assert tree(folder) == before


# -- (e) prune as a user who may not remove a tombstone ----------------------------------------


def test_prune_as_a_user_who_cannot_take_the_lock_exits_1_naming_the_log(folder: Path) -> None:
    """The operator's day, item 1: not "nothing to prune" and exit 0 while a tombstone stays."""
    write_log(folder, "done-run", 2, done=True)
    write_log(folder, "idle-run", 0)
    readable(folder, 0o777)  # every file 0644: readable, but the lock only the harness may take
    log, lock = log_of(folder, "done-run"), Path(f"{log_of(folder, 'done-run')}.lock")
    before = tree(folder)

    # The dry run says what the real one will do, and both exit 1 naming the log and why.
    dry = cli_as(NOBODY, "prune", folder, "--older-than", "0", "--dry-run")
    real = cli_as(NOBODY, "prune", folder, "--older-than", "0")
    for result in (dry, real):
        assert result.rc == 1, result
        assert f"cannot remove {log}" in result.err, result.err
        assert str(lock) in result.err and "Permission denied" in result.err, result.err
        assert f"uid {NOBODY}" in result.err, result.err
        assert "nothing to prune" not in result.out and "would remove" not in result.out
        assert "idle-run" not in result.out + result.err
    assert tree(folder) == before

    # A read-only folder: the files cannot be removed even with the lock open to all.
    lock.chmod(0o666)
    folder.chmod(0o555)
    before = tree(folder)
    for args in (("--dry-run",), ()):
        result = cli_as(NOBODY, "prune", folder, "--older-than", "0", *args)
        assert result.rc == 1, result
        assert f"cannot remove {log}" in result.err and "Permission denied" in result.err
        assert "nothing to prune" not in result.out and "would remove" not in result.out
    assert tree(folder) == before

    # As the log's owner the same command removes it and exits 0.
    folder.chmod(0o755)
    owner = cli_as(HARNESS, "prune", folder, "--older-than", "0")
    assert owner.rc == 0, owner.err
    assert f"removed {log}" in owner.out and not log.exists()


# -- (f) flush's first read -------------------------------------------------------------------


def test_flush_as_another_user_reads_without_creating_files_and_is_refused_clearly(
    folder: Path,
) -> None:
    write_log(folder, "orphaned-run", 2)
    readable(folder, 0o555)
    before = tree(folder)

    def flush() -> tuple[int, str]:
        os.environ["RUN_TOKEN"] = "tok-not-checked-before-the-lock"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(
                [
                    "flush",
                    str(log_of(folder, "orphaned-run")),
                    "--grpc-addr",
                    "127.0.0.1:9",
                    "--token-env",
                    "RUN_TOKEN",
                    "--timeout",
                    "5",
                ]
            )
        return rc, err.getvalue()

    rc, err = as_user(NOBODY, flush)
    assert rc == 2, err
    assert "refused" in err and "not writable by uid" in err and "EACCES" in err, err
    assert "run flush as the log's owner" in err, err
    assert "not a usable" not in err and "readonly database" not in err, err
    assert tree(folder) == before


# -- a harness opening the log while a reader reads ---------------------------------------------


def test_a_harness_opening_the_log_while_it_is_read_gives_a_current_view(folder: Path) -> None:
    folder.chmod(0o755)
    write_log(folder, "run-1", 2)
    log = log_of(folder, "run-1")
    with LogReader(log, "run-1") as reader:
        assert reader.snapshot().top_seq == 2

        def harness() -> None:
            with RunLog.open(folder, "run-1", correlation_id="c") as wal:
                for i in range(3):
                    wal.append("finding", {"fields": {"n": i}})
                wal.ack(1)
                wal.checkpoint()  # writes the new pages into the main file

        assert as_user(HARNESS, harness) is None
        # The reader notices the writer came and went and reads again.
        snap = reader.snapshot()
        assert (snap.top_seq, snap.meta.last_acked_seq) == (5, 1)
        assert [row.seq for row, _ in reader.rows(1)] == [2, 3, 4, 5]
    # It held the log open meanwhile, so the writer left its -wal (as with any
    # reader open at its close); the next writer uses it as usual.
    assert harness_reopens(folder, "run-1") == 6
    assert inspect_log(log).unacked_count == 5
