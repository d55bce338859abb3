"""Why a run failed: ``failed_reason`` beside ``failed_at``, one text per cause (issue 15).

``failed_at`` is set for an engine behind the stored cursor, for "run
completed" while the log holds undeliverable rows, and for a ``Done`` the
engine refuses; ``walchannel inspect`` names the cause from
``failed_reason``. A log written before the field still opens and inspects.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, child_env, new_run
from walchannel import EngineBehindError, GrpcEngineChannel, RunCompletedError
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.state import FAILED_ENGINE_BEHIND, FAILED_UNDELIVERABLE
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def channel_for(
    engine: LocalEngine, wal: Path, run_id: str, token: str, **kw: Any
) -> GrpcEngineChannel:
    return GrpcEngineChannel(local_channel_config(engine, wal, run_id, token, **kw))


def finding(i: int) -> dict[str, Any]:
    return {"n": i}


@pytest.mark.asyncio
async def test_engine_behind_is_named_as_its_cause(tmp_path: Path) -> None:
    engine = LocalEngine()
    await engine.start()
    wal = tmp_path / "wal"
    try:
        run_id, token = new_run(engine)
        async with channel_for(engine, wal, run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            ch.send_finding(finding(0))
            assert await ch.wait_acked(timeout_ms=5000)
    finally:
        await engine.stop()
    fresh = LocalEngine()  # an empty store: it lost the acked row
    await fresh.start()
    try:
        fresh.register_run(run_id, token)
        async with channel_for(fresh, wal, run_id, token) as ch:
            ch.send_finding(finding(1))
            with pytest.raises(EngineBehindError):
                await ch.handshake("1", "h", "1")
            meta = ch.log.meta()
            path = ch.log.path
        assert meta.failed_at is not None and meta.failed_reason == FAILED_ENGINE_BEHIND
    finally:
        await fresh.stop()
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None and report.reason.startswith("engine behind:")


@pytest.mark.asyncio
async def test_run_completed_with_undeliverable_rows_is_named_as_its_cause(
    tmp_path: Path,
) -> None:
    engine = LocalEngine()
    await engine.start()
    try:
        run_id, token = new_run(engine)
        async with channel_for(engine, tmp_path / "a", run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            ch.send_finding(finding(0))
            assert await ch.wait_acked(timeout_ms=5000)
        # An older copy of the log (the same writer), taken before its Done.
        (tmp_path / "b").mkdir(mode=0o700)
        name = f"{run_id}.wal.sqlite3"
        shutil.copyfile(tmp_path / "a" / name, tmp_path / "b" / name)  # closed: all in the file
        async with channel_for(engine, tmp_path / "a", run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            assert await ch.send_done("completed", 1, [], "")
        # The copy logs a row the engine will never take: the engine has the run's Done.
        async with channel_for(engine, tmp_path / "b", run_id, token) as ch:
            ch.send_finding(finding(1))
            with pytest.raises(RunCompletedError):
                await ch.handshake("1", "h", "1")
            meta = ch.log.meta()
            path = ch.log.path
    finally:
        await engine.stop()
    assert meta.failed_at is not None and meta.failed_reason == FAILED_UNDELIVERABLE
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None
    assert report.reason.startswith("run completed with rows unacked here")
    assert "engine behind" not in report.reason


def test_a_log_without_failed_reason_still_opens_and_inspects(tmp_path: Path) -> None:
    with RunLog.open(tmp_path, "r1", correlation_id="c") as wal:
        wal.append("finding", {"fields": {"n": 1}})
        path = wal.path
    # What a log made before the field looks like.
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE meta DROP COLUMN failed_reason")
    conn.execute("UPDATE meta SET failed_at = 1.0, last_error = 'engine behind: h 0 < 1'")
    conn.commit()
    conn.close()
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason == "the channel stopped: engine behind: h 0 < 1"
    with RunLog.open(tmp_path, "r1", correlation_id="c") as wal:
        assert wal.meta().failed_reason is None  # the column is added, empty
        assert [r.seq for r in wal.unacked()] == [1]
        wal.update_meta(failed_reason=FAILED_UNDELIVERABLE)
    report = inspect_log(path)
    assert report.reason is not None and report.reason.startswith(FAILED_UNDELIVERABLE)


@pytest.mark.asyncio
async def test_flushing_an_older_copy_of_a_completed_run_advises_no_re_send(
    tmp_path: Path,
) -> None:
    """A copy of a log taken while its rows were unacked, flushed after the run completed.

    The engine applied every row of the copy: flush must not say they
    "cannot be delivered" and inspect must not advise exporting them for a
    re-import (the operator's day, item 5).
    """
    engine = LocalEngine()
    await engine.start()
    try:
        run_id, token = new_run(engine)
        live, copy = tmp_path / "live", tmp_path / "copy"
        async with channel_for(engine, live, run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            await engine.kill()
            for i in range(5):
                ch.send_finding(finding(i))
        copy.mkdir(mode=0o700)
        log_name = f"{run_id}.wal.sqlite3"
        shutil.copyfile(live / log_name, copy / log_name)  # closed: all in the main file
        await engine.replace()
        async with channel_for(engine, live, run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            assert await ch.send_done("completed", 5, [], "")
        assert engine.accepted(run_id) == [1, 2, 3, 4, 5, 6]

        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "walchannel",
            "flush",
            str(copy / log_name),
            "--grpc-addr",
            engine.grpc_addr,
            "--token-env",
            "TOKEN",
            "--timeout",
            "30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(TOKEN=token),
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 1, err
        said = err.decode()
        assert "the engine says the run is completed" in said, said
        assert "may already be applied" in said and "cannot be delivered" not in said, said
        assert token not in said + out.decode()
        assert engine.accepted(run_id) == [1, 2, 3, 4, 5, 6]
    finally:
        await engine.stop()
    report = inspect_log(copy / log_name)
    assert report.state == "failed" and report.unacked_count == 5, report
    assert report.reason is not None and "may already be applied" in report.reason
    assert "do not re-send" in report.next_step, report.next_step
    assert "saves the rows the engine will not take" not in report.next_step
    assert "then remove the log" not in report.next_step
