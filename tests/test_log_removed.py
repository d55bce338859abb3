"""The log's files removed while the channel has them open: no seq is returned silently (issue 52).

A tmp cleaner, ``rm -rf $WALCHANNEL_DIR/*``, an emptyDir wiped by a sidecar
(better-sqlite3 #1237; sqlite.org's "How to corrupt" §2.4): SQLite goes on
committing into the unlinked file, which a crash then takes with it. After
every commit the log checks that its path still names the files it has open;
on a mismatch the send raises ``WalRemovedError`` naming the path, the run is
``FAILED`` and every later call raises it (SPEC "The log").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import new_run
from walchannel import (
    ChannelState,
    GroupCommit,
    GroupCommitError,
    GrpcEngineChannel,
    WalRemovedError,
)
from walchannel.log import RunLog
from walchannel.log.files import lock_path
from walchannel.log.state import FAILED_LOG_REMOVED
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def remove_the_files(log: Path) -> None:
    """``rm $WALCHANNEL_DIR/*``: the log, its -wal and -shm, its lock file."""
    for path in log.parent.iterdir():
        path.unlink()


def remove_the_folder(log: Path) -> None:
    """``rm -rf $WALCHANNEL_DIR``."""
    shutil.rmtree(log.parent)


def remove_the_lock_file(log: Path) -> None:
    """A cleaner of ``*.lock`` files: a second opener would take a fresh lock beside ours."""
    lock_path(log).unlink()


REMOVALS: dict[str, Callable[[Path], None]] = {
    "the files": remove_the_files,
    "the whole folder": remove_the_folder,
    "the lock file alone": remove_the_lock_file,
}


@pytest.mark.asyncio
@pytest.mark.parametrize("removal", sorted(REMOVALS))
async def test_a_send_after_the_files_are_removed_raises_naming_the_path(
    local_engine: LocalEngine, tmp_path: Path, removal: str
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        # No handshake: the engine is away; the rows wait in the log.
        returned = [ch.send_finding({"n": n}) for n in range(1, 31)]
        path = ch.log.path
        REMOVALS[removal](path)
        with pytest.raises(WalRemovedError) as caught:
            ch.send_finding({"n": 31})
        error = caught.value
        assert error.path == str(path)
        assert str(path) in str(error)
        assert ch.state is ChannelState.FAILED
        # Every later send raises it too: none returns a seq only the unlinked file holds.
        for n in range(32, 35):
            with pytest.raises(WalRemovedError):
                ch.send_finding({"n": n})
        with pytest.raises(WalRemovedError):
            ch.send_findings([{"n": 40}], progress={"next": 41})
        stats = ch.stats()
        assert stats.last_error is not None and str(path) in stats.last_error
        # The 31st committed into the unlinked file only: the log's memory does not
        # take it, so it is neither returned nor written to the engine.
        assert ch.log.high_water == 30
    assert returned == list(range(1, 31))
    assert token not in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("group", [False, True])
async def test_the_rows_of_the_commit_that_met_the_removal_never_reach_the_engine(
    local_engine: LocalEngine, tmp_path: Path, group: bool
) -> None:
    # Simulator seed 911652: under group commit, the group the log gave up as never
    # committed (GroupCommitError) still went out, read from the unlinked file.
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine,
        tmp_path / "wal",
        run_id,
        token,
        group_commit=GroupCommit(max_rows=64) if group else None,
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("h", "scan", "1")
        assert [ch.send_finding({"n": n}) for n in range(1, 4)] == [1, 2, 3]
        assert await ch.wait_acked(timeout_ms=10_000)
        remove_the_files(ch.log.path)
        if group:
            assert ch.send_finding({"n": 4}) == 4  # handed out; its group meets the removal
            assert await ch.wait_acked(timeout_ms=0) is False
        else:
            with pytest.raises(WalRemovedError):
                ch.send_finding({"n": 4})
        assert ch.state is ChannelState.FAILED
        assert ch.log.high_water == 3
    # The channel is closed: its writer is over, and wrote nothing past seq 3.
    assert local_engine.accepted(run_id) == [1, 2, 3]


@pytest.mark.asyncio
async def test_under_group_commit_the_group_fails_naming_its_seqs(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, group_commit=GroupCommit(max_rows=64)
    )
    async with GrpcEngineChannel(config) as ch:
        first = [ch.send_finding({"n": n}) for n in range(1, 4)]
        assert await ch.wait_acked(timeout_ms=0) is False  # (commits the group; no handshake)
        assert ch.log.high_water == 3
        remove_the_files(ch.log.path)
        # Handed out, then committed at the turn's end into a file no path names.
        pending = [ch.send_finding({"n": n}) for n in range(4, 7)]
        assert pending == [4, 5, 6]
        # wait_acked() commits the group first: it lands only in the unlinked file.
        assert await ch.wait_acked(timeout_ms=0) is False
        assert ch.state is ChannelState.FAILED
        with pytest.raises(GroupCommitError) as caught:
            ch.send_finding({"n": 7})
        assert (caught.value.first_seq, caught.value.last_seq) == (4, 6)
        assert str(ch.log.path) in str(caught.value)
        assert "removed or replaced while open" in str(caught.value)
    assert first == [1, 2, 3]


def test_the_log_alone_refuses_to_write_on_once_its_file_is_replaced(tmp_path: Path) -> None:
    # A restore or a copy put another file at the path: the open file is not it.
    with RunLog.open(tmp_path, "run", correlation_id="c") as log:
        log.append("finding", {"fields": {"n": 1}})
        other = tmp_path / "other"
        shutil.copy(log.path, other)
        os.replace(other, log.path)
        with pytest.raises(WalRemovedError, match=r"the log file .* is another file now"):
            log.append("finding", {"fields": {"n": 2}})
        with pytest.raises(WalRemovedError):
            log.ack(1)


def test_the_failed_reason_names_the_removal() -> None:
    assert FAILED_LOG_REMOVED.startswith("log removed: ")


class _RaiseAfterCommit:
    """A commit hook that raises once, after the next COMMIT (a signal's exception)."""

    def __init__(self) -> None:
        self.armed = False

    def before_commit(self, what: str) -> None:
        return None

    def after_commit(self, what: str) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt("a signal, after the COMMIT")


@pytest.mark.parametrize("exc_after_commit", [False, True])
def test_a_commit_into_removed_files_fails_the_run_also_when_an_exception_leaves_it(
    tmp_path: Path, exc_after_commit: bool
) -> None:
    # Found by the simulator (seed 63454): a signal's exception after the COMMIT
    # left the commit before the files were looked at, and the rows it landed in
    # the unlinked file went to the stream.
    import sqlite3

    gone: list[str] = []
    with RunLog.open(tmp_path, "run", correlation_id="c") as made:
        path = made.path
    hook = _RaiseAfterCommit()
    conn = sqlite3.connect(path, isolation_level=None)
    log = RunLog.on_connection(
        conn,
        run_id="run",
        correlation_id="c",
        commit_hook=hook,
        watch=lambda: "the log file is gone" if gone else None,
    )
    failed: list[WalRemovedError] = []
    log.on_removed(failed.append)
    log.append("finding", {"fields": {"n": 1}})
    gone.append("rm")
    hook.armed = exc_after_commit
    expected: type[BaseException] = KeyboardInterrupt if exc_after_commit else WalRemovedError
    with pytest.raises(expected):
        log.append("finding", {"fields": {"n": 2}})
    assert len(failed) == 1  # the owner is told, whichever exception left the commit
    assert log.high_water == 1  # and the log's memory does not take the commit: none writes it
    with pytest.raises(WalRemovedError, match="the log file is gone"):
        log.append("finding", {"fields": {"n": 3}})
    log.close()
