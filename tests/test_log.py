"""RunLog against real SQLite files (SPEC "The log")."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, child_env
from walchannel import (
    ChannelClosedError,
    PayloadError,
    RunCompletedError,
    WalCorruptError,
    WalLockedError,
    WalWriteError,
)
from walchannel.log import RunLog
from walchannel.log.format import APPLICATION_ID, ROW_LOST_TYPE, SCHEMA_VERSION

FINDING = {"fields": {"test_id": "B101", "line": 3, "path": "a/b.py"}}
DONE = {"status": "completed", "findings": 1, "coverage": ["a"], "exit_reason": ""}


def finding(n: int) -> dict[str, Any]:
    return {"fields": {"n": n, "text": "x" * (n % 7)}}


def open_log(wal_dir: Path, run_id: str = "run-1", **kw: Any) -> RunLog:
    return RunLog.open(wal_dir, run_id, correlation_id=kw.pop("correlation_id", "corr-1"), **kw)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- creation and layout ----------------------------------------------------


def test_new_log_is_0600_in_a_0700_folder_with_our_header(wal_dir: Path) -> None:
    old = os.umask(0)
    try:
        with open_log(wal_dir) as wal:
            assert wal.path == wal_dir / "run-1.wal.sqlite3"
            assert wal.next_seq == 1 and wal.last_acked_seq == 0 and wal.unacked_count == 0
            wal.append("finding", FINDING)
            for p in (wal.path, Path(f"{wal.path}-wal"), Path(f"{wal.path}.lock")):
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        os.umask(old)
    assert stat.S_IMODE(wal_dir.stat().st_mode) == 0o700
    conn = sqlite3.connect(wal_dir / "run-1.wal.sqlite3")
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = [r[1] for r in conn.execute("PRAGMA table_info(rows)")]
    assert cols == ["seq", "kind", "body", "crc32", "appended_at", "appended_boot"]
    conn.close()


def test_unsafe_run_id_creates_nothing(wal_dir: Path) -> None:
    with pytest.raises(ValueError, match="run_id"):
        RunLog.open(wal_dir, "../escape", correlation_id="c")
    assert not wal_dir.exists()


def test_bad_durability_and_correlation_are_value_errors(wal_dir: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        open_log(wal_dir, durability="disk")
    with pytest.raises(ValueError, match="correlation_id"):
        RunLog.open(wal_dir, "r", correlation_id="")


@pytest.mark.parametrize(("durability", "level"), [("process", 1), ("power", 2)])
def test_durability_sets_synchronous(wal_dir: Path, durability: Any, level: int) -> None:
    with open_log(wal_dir, durability=durability) as wal:
        assert wal._conn.execute("PRAGMA synchronous").fetchone()[0] == level


# -- append, ack, reopen ----------------------------------------------------


def test_append_ack_reopen_cycle(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        assert [wal.append("finding", finding(i)) for i in range(1, 4)] == [1, 2, 3]
        assert wal.append_many([("finding", finding(4)), ("finding", finding(5))]) == [4, 5]
        assert wal.unacked_count == 5
        assert wal.ack(2) == 2
        assert [r.seq for r in wal.unacked()] == [3, 4, 5]
        assert wal.unacked_count == 3
    with open_log(wal_dir) as wal:
        assert wal.last_acked_seq == 2 and wal.next_seq == 6
        rows = list(wal.unacked())
        assert [(r.seq, r.kind, r.body) for r in rows] == [
            (s, "finding", finding(s)) for s in (3, 4, 5)
        ]
        assert all(r.size > 0 and r.appended_at > 0 for r in rows)


def test_seq_is_never_reused_after_everything_was_acked(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        for i in range(10):
            wal.append("finding", finding(i))
        assert wal.ack(10) == 10
        assert wal.unacked_count == 0
    with open_log(wal_dir) as wal:
        assert wal.next_seq == 11
        assert wal.append("finding", finding(11)) == 11


def test_ack_rules(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(5)])
        assert wal.ack(3) == 3
        assert wal.ack(2) == 0 and wal.ack(3) == 0
        assert wal.last_acked_seq == 3
        with pytest.raises(ValueError, match="above the high-water"):
            wal.ack(6)
        assert wal.unacked_count == 2


def test_unacked_pages_through_big_logs_with_after_and_limit(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 1301)])
        assert [r.seq for r in wal.unacked()] == list(range(1, 1301))
        assert [r.seq for r in wal.unacked(after_seq=1000)] == list(range(1001, 1301))
        assert [r.seq for r in wal.unacked(after_seq=10, limit=600)] == list(range(11, 611))
        assert list(wal.unacked(limit=0)) == []
        wal.ack(700)
        assert next(iter(wal.unacked())).seq == 701


def test_unacked_bytes_follow_appends_and_acks(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 21)])
        sizes = {r.seq: r.size for r in wal.unacked()}
        assert wal.unacked_bytes == sum(sizes.values())
        wal.append("finding", finding(21))
        wal.ack(5)
        expected = sum(r.size for r in wal.unacked())
        assert wal.unacked_bytes == expected
    with open_log(wal_dir) as wal:
        assert wal.unacked_bytes == expected


def test_progress_commits_with_rows_and_outlives_acks(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        assert wal.progress is None
        wal.append("finding", finding(1), progress={"file": 1})
        wal.append("finding", finding(2))
        assert wal.progress == {"file": 1}
        wal.append_many([("finding", finding(3))], progress={"file": 3, "name": "é"})
        wal.ack(3)
    with open_log(wal_dir) as wal:
        assert wal.progress == {"file": 3, "name": "é"}
        assert wal.meta().progress == {"file": 3, "name": "é"}


def test_bad_item_in_a_batch_logs_nothing_and_uses_no_seq(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append("finding", finding(1), progress={"p": 1})
        with pytest.raises(PayloadError, match="finding"):
            wal.append_many(
                [("finding", finding(2)), ("finding", {"fields": {"x": object()}})],
                progress={"p": 2},
            )
        with pytest.raises(PayloadError, match="progress"):
            wal.append("finding", finding(2), progress={"p": float("nan")})
        with pytest.raises(ValueError, match="unknown row kind"):
            wal.append("heartbeat", {})
        with pytest.raises(ValueError, match="no rows and no progress"):
            wal.append_many([])
        assert wal.next_seq == 2 and wal.progress == {"p": 1}
        # A stretch of the scan with nothing to report still moves the marker.
        assert wal.append_many([], progress={"p": 1.5}) == []
        assert wal.next_seq == 2 and wal.progress == {"p": 1.5}
        assert wal.append("finding", finding(2)) == 2
        assert [r.seq for r in wal.unacked()] == [1, 2]


def test_a_failed_commit_uses_no_seq_and_keeps_what_was_committed(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append("finding", finding(1))
        # A real SQLite failure inside the transaction, from a second connection.
        other = sqlite3.connect(wal.path)
        other.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON rows WHEN NEW.seq = 3"
            " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        other.commit()
        with pytest.raises(WalWriteError, match="disk says no") as info:
            wal.append_many([("finding", finding(2)), ("finding", finding(3))], progress={"p": 3})
        assert info.value.path == str(wal.path)
        assert str(wal.path) in str(info.value)  # the message names the file too
        assert wal.next_seq == 2 and wal.progress is None
        assert wal.append("finding", finding(2)) == 2
        with pytest.raises(WalWriteError):
            wal.append("finding", finding(3))
        other.execute("DROP TRIGGER refuse")
        other.commit()
        other.close()
        assert wal.append("finding", finding(3)) == 3
        assert [r.body for r in wal.unacked()] == [finding(1), finding(2), finding(3)]


# -- completion ---------------------------------------------------------------


def test_done_then_its_ack_makes_a_tombstone(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append("finding", finding(1), progress={"at": "end"})
        assert wal.append("done", DONE) == 2
        assert wal.done_seq == 2
        with pytest.raises(ChannelClosedError, match="Done is logged at seq 2"):
            wal.append("finding", finding(3))
        wal.ack(1)
        assert not wal.completed
        wal.ack(2)
        assert wal.completed and wal.unacked_count == 0
        assert wal.meta().completed_at is not None
    with open_log(wal_dir) as wal:
        assert wal.completed and wal.progress == {"at": "end"}
        with pytest.raises(RunCompletedError):
            wal.append("finding", finding(3))


def test_rows_after_done_in_one_batch_are_refused(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        with pytest.raises(ChannelClosedError):
            wal.append_many([("done", DONE), ("finding", finding(2))])
        assert wal.next_seq == 1


def test_unacked_done_survives_reopen(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append("finding", finding(1))
        wal.append("done", DONE)
    with open_log(wal_dir) as wal:
        assert wal.done_seq == 2 and not wal.completed
        with pytest.raises(ChannelClosedError):
            wal.append("event", {"type": "t", "severity": "info", "payload": {}, "ts": "x"})


# -- verification rule ----------------------------------------------------------


def test_open_sets_unverified_from_to_min_of_stored_and_next(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        assert wal.unverified_from == 1
        wal.append_many([("finding", finding(i)) for i in range(3)])
    with open_log(wal_dir) as wal:
        assert wal.unverified_from == 1  # never verified: the stored value wins
        assert wal.verify(0) == 0
        assert wal.unverified_from is None
        wal.append("finding", finding(4))
    with open_log(wal_dir) as wal:
        assert wal.unverified_from == 5
        assert wal.meta().unverified_from == 5


def test_verify_shifts_unverified_rows_past_the_engine(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 4)])
        wal.append("done", DONE)
        # The engine already holds seqs 1..10 from a log this one lost.
        assert wal.verify(10) == 10
        assert [(r.seq, r.body) for r in wal.unacked()] == [
            (11, finding(1)),
            (12, finding(2)),
            (13, finding(3)),
            (14, DONE),
        ]
        assert wal.last_acked_seq == 10 and wal.next_seq == 15 and wal.done_seq == 14
        assert wal.unverified_from is None
        with pytest.raises(ValueError, match="already verified"):
            wal.verify(12)
        wal.ack(14)
        assert wal.completed


def test_last_ack_at_moves_only_when_an_ack_covers_new_rows(wal_dir: Path) -> None:
    # Issue 14: a handshake answer that acked nothing new showed "LAST ACK 0s ago".
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 4)])
        assert wal.verify(0) == 0
        assert wal.meta().last_ack_at is None
        wal.ack(2)
        first = wal.meta().last_ack_at
        assert first is not None
    with open_log(wal_dir) as wal:
        wal.verify(2)  # the next process's handshake: Ack(2) again
        assert wal.meta().last_ack_at == first
        wal.ack(3)
        later = wal.meta().last_ack_at
        assert later is not None and later >= first


def test_verify_keeps_verified_rows_and_acks_them(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 4)])
        wal.verify(0)
        wal.append_many([("finding", finding(i)) for i in range(4, 6)])
    with open_log(wal_dir) as wal:
        assert wal.unverified_from == 6
        wal.append("finding", finding(6))  # provisional: seq 6
        assert wal.verify(7) == 2
        assert [(r.seq, r.body) for r in wal.unacked()] == [(8, finding(6))]
        assert wal.last_acked_seq == 7 and wal.next_seq == 9


def test_verify_refuses_an_engine_behind_the_cursor(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 6)])
        wal.verify(0)
        wal.ack(4)
    with open_log(wal_dir) as wal:
        with pytest.raises(ValueError, match="below the stored cursor"):
            wal.verify(2)
        assert [r.seq for r in wal.unacked()] == [5]


# -- meta -----------------------------------------------------------------------


def test_update_meta_only_for_caller_fields(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.update_meta(harness_name="bandit", last_error="boom", reconnects=3)
        meta = wal.meta()
        assert (meta.harness_name, meta.last_error, meta.reconnects) == ("bandit", "boom", 3)
        with pytest.raises(ValueError, match="last_acked_seq"):
            wal.update_meta(last_acked_seq=9)
        with pytest.raises(ValueError, match="nonsense"):
            wal.update_meta(nonsense=1)


def test_changed_correlation_id_is_warned_and_stored(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    open_log(wal_dir, correlation_id="first").close()
    with (
        caplog.at_level(logging.WARNING, logger="walchannel.log.writer"),
        open_log(wal_dir, correlation_id="second") as wal,
    ):
        assert wal.meta().correlation_id == "second"
    assert "'first' to 'second'" in caplog.text


def test_closed_log_refuses_everything(wal_dir: Path) -> None:
    wal = open_log(wal_dir)
    wal.close()
    wal.close()
    for call in (lambda: wal.append("finding", FINDING), lambda: wal.ack(1), wal.meta):
        with pytest.raises(ChannelClosedError, match="closed"):
            call()


# -- owner lock -----------------------------------------------------------------


def test_second_open_in_this_process_is_refused_naming_the_owner(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        with pytest.raises(WalLockedError) as info:
            open_log(wal_dir)
        assert info.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(info.value)
        wal.append("finding", FINDING)
    with open_log(wal_dir):
        pass


HOLD = """
import sys, time
from walchannel.log import RunLog
wal = RunLog.open(sys.argv[1], "run-1", correlation_id="c")
wal.append("finding", {"fields": {"n": 1}})
print("ready", flush=True)
time.sleep(60)
"""


def test_other_process_is_refused_and_a_sigkilled_owner_frees_the_lock(wal_dir: Path) -> None:
    child = subprocess.Popen(
        [PYTHON, "-c", HOLD, str(wal_dir)], stdout=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(WalLockedError) as info:
            open_log(wal_dir)
        assert info.value.pid == child.pid
        child.kill()
        child.wait()
        with open_log(wal_dir) as wal:  # at once: no stale-lock timeout
            assert [r.body for r in wal.unacked()] == [{"fields": {"n": 1}}]
    finally:
        child.kill()
        child.wait()


def test_forked_child_cannot_write_and_parent_carries_on(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append("finding", finding(1))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read)
            verdict = b"wrote"
            try:
                wal.append("finding", finding(99))
            except WalLockedError as exc:
                verdict = b"locked" if "forked child" in str(exc) else b"other"
            except BaseException:
                verdict = b"other"
            try:
                wal.ack(1)
            except WalLockedError:
                pass
            else:
                verdict = b"acked"
            os.write(write, verdict)
            os._exit(0)
        os.close(write)
        assert os.read(read, 16) == b"locked"
        os.close(read)
        os.waitpid(pid, 0)
        assert wal.append("finding", finding(2)) == 2
        assert [r.seq for r in wal.unacked()] == [1, 2]
        with pytest.raises(WalLockedError):
            open_log(wal_dir)


# -- bad files --------------------------------------------------------------------


def make_foreign_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    conn.close()


def set_header(path: Path, *, user_version: int | None = None, run_id: str | None = None) -> None:
    conn = sqlite3.connect(path)
    if user_version is not None:
        conn.execute(f"PRAGMA user_version = {user_version}")
    if run_id is not None:
        conn.execute("UPDATE meta SET run_id = ?", (run_id,))
    conn.commit()
    conn.close()


def good_log(wal_dir: Path) -> Path:
    with open_log(wal_dir) as wal:
        wal.append("finding", FINDING)
        return wal.path


#: Meta values no walchannel writes (an editor's or a bug's), as SQL assignments.
BAD_META = {
    "bad-progress": "progress = 'not json'",
    "text-acked": "last_acked_seq = 'abc'",
    "float-acked": "last_acked_seq = 2.5",
    "negative-high": "high_water = -1",
    "text-time": "created_at = 'yesterday'",
    "list-progress": "progress = '[1, 2]'",
}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("foreign", "not a walchannel log (application_id 0x0)"),
        ("empty", "not a walchannel log (an empty file)"),
        ("garbage", "not a usable SQLite database"),
        ("newer", "newer schema version 2"),
        ("other-run", "belongs to run 'run-2'"),
        ("truncated", ""),
        ("no-meta", "broken meta: 0 meta rows"),
        ("bad-progress", "broken meta: progress is not JSON (Expecting value"),
        ("text-acked", "broken meta: last_acked_seq is 'abc'"),
        ("float-acked", "broken meta: last_acked_seq is 2.5"),
        ("negative-high", "broken meta: high_water is -1"),
        ("text-time", "broken meta: created_at is 'yesterday'"),
        ("list-progress", "broken meta: progress is [1, 2]"),
    ],
)
def test_bad_files_raise_wal_corrupt_and_are_left_untouched(
    wal_dir: Path, damage: str, reason: str
) -> None:
    path = wal_dir / "run-1.wal.sqlite3"
    if damage == "foreign":
        wal_dir.mkdir()
        make_foreign_sqlite(path)
    elif damage == "empty":
        wal_dir.mkdir()
        path.touch()
    elif damage == "garbage":
        wal_dir.mkdir()
        path.write_bytes(b"this is not a database, " * 300)
    elif damage == "newer":
        set_header(good_log(wal_dir), user_version=2)
    elif damage == "other-run":
        set_header(good_log(wal_dir), run_id="run-2")
    elif damage == "truncated":
        good_log(wal_dir)
        with open_log(wal_dir) as wal:
            wal.append_many([("finding", finding(i)) for i in range(2000)])
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif damage == "no-meta":
        good_log(wal_dir)
        conn = sqlite3.connect(path)
        conn.execute("DELETE FROM meta")
        conn.commit()
        conn.close()
    elif damage in BAD_META:
        good_log(wal_dir)
        conn = sqlite3.connect(path)
        conn.execute(f"UPDATE meta SET {BAD_META[damage]}")
        conn.commit()
        conn.close()
    before = digest(path)
    with pytest.raises(WalCorruptError) as info:
        open_log(wal_dir)
    assert info.value.path == str(path)
    assert reason in info.value.reason
    assert str(path) in str(info.value)
    assert digest(path) == before
    assert not Path(f"{path}-wal").exists() or damage in ("truncated",)


def test_symlink_where_the_log_should_be_is_refused(wal_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.sqlite3"
    wal_dir.mkdir()
    (wal_dir / "run-1.wal.sqlite3").symlink_to(target)
    with pytest.raises(WalCorruptError, match="symbolic link"):
        open_log(wal_dir)
    assert not target.exists()


def test_stale_temporaries_are_removed_and_never_mistaken_for_a_log(wal_dir: Path) -> None:
    wal_dir.mkdir()
    stale = wal_dir / ".run-1.~deadbeef"
    stale.write_bytes(b"half made")
    Path(f"{stale}-wal").write_bytes(b"x")
    unrelated = wal_dir / ".run-10.~0000beef"
    unrelated.write_bytes(b"someone else's")
    with open_log(wal_dir) as wal:
        assert wal.next_seq == 1
    assert not stale.exists() and not Path(f"{stale}-wal").exists()
    assert unrelated.exists()


def test_a_damaged_row_is_quarantined_and_replaced_by_row_lost(
    wal_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 4)])
        path = wal.path
    conn = sqlite3.connect(path)
    body = bytearray(conn.execute("SELECT body FROM rows WHERE seq = 2").fetchone()[0])
    body[-1] ^= 0x01
    conn.execute("UPDATE rows SET body = ? WHERE seq = 2", (bytes(body),))
    conn.commit()
    conn.close()
    with caplog.at_level(logging.ERROR), open_log(wal_dir) as wal:
        rows = list(wal.unacked())
        assert [r.seq for r in rows] == [1, 2, 3]
        lost = rows[1]
        assert lost.kind == "event" and lost.body["type"] == ROW_LOST_TYPE
        assert lost.body["severity"] == "error"
        assert lost.body["payload"]["seq"] == 2
        assert "crc32 mismatch" in lost.body["payload"]["reason"]
        assert wal.quarantined() == [(2, lost.body["payload"]["reason"])]
        assert [r.kind for r in wal.unacked()] == ["finding", "event", "finding"]
    assert "seq 2" in caplog.text and "quarantined" in caplog.text


def test_a_damaged_page_read_by_unacked_bytes_is_wal_corrupt_not_a_sqlite_error(
    wal_dir: Path,
) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", {"fields": {"n": i, "text": "x" * 200}}) for i in range(2000)])
        path = wal.path
    data = bytearray(path.read_bytes())
    page = 4096
    # Zero a page in the middle, among the rows' leaves: opening reads only
    # the newest row, the backlog's size is summed on first use.
    middle = len(data) // page // 2
    data[middle * page : (middle + 1) * page] = bytes(page)
    path.write_bytes(bytes(data))
    with open_log(wal_dir) as wal:
        with pytest.raises(WalCorruptError, match="cannot read the rows' sizes") as info:
            _ = wal.unacked_bytes
        assert info.value.path == str(path)
        assert "malformed" in info.value.reason


def test_reads_on_a_failing_connection_raise_wal_corrupt_not_a_sqlite_error(
    wal_dir: Path,
) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(3)])
        # Every statement now fails in SQLite (sqlite3.ProgrammingError).
        wal._conn.close()
        reads = {
            "the rows' sizes": lambda: wal.unacked_bytes,
            "the quarantine": wal.quarantined,
            "row seq 2": lambda: wal.set_aside(2, "too big"),
        }
        for what, read in reads.items():
            with pytest.raises(WalCorruptError, match=f"cannot read {what}"):
                read()


def test_backlog_figures_above_a_received_ack_only_read(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(1, 6)])
        wal.ack(1)
        rows = list(wal.unacked())  # seqs 2..5
        changes = wal._conn.total_changes
        sizes = [r.size for r in rows]
        assert wal.unacked_bytes_above(0) == wal.unacked_bytes == sum(sizes)
        assert wal.unacked_bytes_above(3) == sum(sizes[2:])
        assert wal.unacked_bytes_above(5) == 0
        for after in (0, 3):
            age = wal.oldest_unacked_age_s(after)
            assert age is not None and 0 <= age < 60
        assert wal.oldest_unacked_age_s(5) is None
        assert wal._conn.total_changes == changes and wal.last_acked_seq == 1


def test_quick_check_finds_damage_inside_a_page(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(3000)])
        assert wal.quick_check() == []
        wal.checkpoint()
        path = wal.path
    data = bytearray(path.read_bytes())
    page = 4096
    # Scribble over the middle of an interior page: headers stay fine.
    for i in range(page * 5 + 8, page * 5 + 300):
        data[i] = 0xFF
    path.write_bytes(bytes(data))
    with open_log(wal_dir) as wal:
        assert wal.quick_check() != []


def test_checkpoint_keeps_disk_bounded_by_the_backlog(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        big = {"fields": {"blob": "x" * 4000}}
        for start in range(0, 2000, 100):
            wal.append_many([("finding", big)] * 100)
            wal.ack(start + 100)
        wal.checkpoint()
        size = wal.path.stat().st_size + Path(f"{wal.path}-wal").stat().st_size
    assert size < 2_000_000, size


def test_log_opens_fast_enough_to_not_scan(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(20_000)])
    start = time.monotonic()
    with open_log(wal_dir) as wal:
        assert wal.unacked_count == 20_000
    assert time.monotonic() - start < 5


def test_engine_word_turns_a_log_holding_done_into_a_tombstone(wal_dir: Path) -> None:
    with open_log(wal_dir) as wal:
        wal.append_many([("finding", finding(i)) for i in range(3)])
        with pytest.raises(ValueError, match="no Done"):
            wal.complete_by_engine()
        wal.append("done", DONE)
        wal.ack(1)
        assert wal.complete_by_engine() == 3
        assert wal.completed and wal.unacked_count == 0
        assert wal.last_acked_seq == 1  # the cursor did not move
        assert list(wal.unacked()) == []
    with open_log(wal_dir) as wal:
        assert wal.completed and wal.last_acked_seq == 1 and wal.next_seq == 5
        assert "run is completed" in (wal.meta().last_error or "")
