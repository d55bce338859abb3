"""A meta write the disk refuses at an engine's answer is said and the run goes on.

Two writes the channel makes on an answer, not on a send: clearing a failed
mark after a healthy answer, and turning a log that holds nothing unacked
into a tombstone when the engine says the run is completed. Each refused
(SQLite's "database or disk is full") is logged at WARNING, never raised
into the connection loop; what the write would have recorded is left as it
was, and nothing of the run is lost.

An ack the disk will not store is tried again with no later ack to prompt
it; while it is not stored, its rows stay in the log, so an engine that
lost rows it acked is sent them again. And when the engine applied the
run's ``Done`` but its ack was lost with the stream, the engine's "run
completed" makes the log a tombstone, or, when the disk refuses that, the
``Done`` stays in the log and the run fails with ``RunCompletedError``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest

from conftest import eventually, log_on_connection, new_run
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from walchannel import GrpcEngineChannel, RunCompletedError
from walchannel.channel.seams import open_channel
from walchannel.config import GrpcChannelConfig
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


class FullOn(sqlite3.Connection):
    """A real connection whose UPDATEs holding ``needle`` fail as a full disk does."""

    needle: str | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        writes = sql.lstrip().upper().startswith("UPDATE")
        if writes and self.needle is not None and self.needle in sql:
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, parameters)


@pytest.mark.asyncio
async def test_a_failed_mark_the_disk_will_not_clear_is_said_and_the_run_streams_on(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    conn, log = log_on_connection(config, FullOn)
    log.update_meta(failed_at=1.0, failed_reason="engine behind: an earlier stream's")
    conn.needle = "failed_at"
    async with open_channel(config, log=log) as ch:
        await ch.handshake("1", "meta-full", "1")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=10_000)
        conn.needle = None
    assert "cannot clear the failed mark" in caplog.text
    assert local_engine.accepted(run_id) == [1]
    with RunLog.open(config.wal_dir, run_id, correlation_id=config.correlation_id) as again:
        assert again.meta().failed_at == 1.0  # left as it was; the next answer clears it


@pytest.mark.asyncio
async def test_a_tombstone_the_disk_will_not_store_is_said_and_run_completed_still_raised(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    done_by = local_channel_config(local_engine, tmp_path / "first", run_id, token)
    async with GrpcEngineChannel(done_by) as ch:
        await ch.handshake("1", "meta-full", "1")
        assert await ch.send_done("completed", 0, [], "")
    config = local_channel_config(local_engine, tmp_path / "after-prune", run_id, token)
    conn, log = log_on_connection(config, FullOn)
    conn.needle = "completed_at"
    async with open_channel(config, log=log) as ch:
        with pytest.raises(RunCompletedError):
            await ch.handshake("1", "meta-full", "1")
    assert "cannot mark the log completed" in caplog.text
    with RunLog.open(config.wal_dir, run_id, correlation_id=config.correlation_id) as again:
        assert not again.completed and list(again.unacked()) == []  # nothing to lose


# -- an ack the disk will not store is tried again, with no later ack to prompt it -------------


def on_full_connection(
    local_engine: LocalEngine, tmp_path: Path
) -> tuple[str, GrpcChannelConfig, FullOn, RunLog]:
    """A new run's config, and its log on a :class:`FullOn` connection (no fault armed yet)."""
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    conn, log = log_on_connection(config, FullOn)
    return run_id, config, conn, log


@pytest.mark.asyncio
async def test_an_ack_the_disk_will_not_store_is_stored_once_the_disk_has_room(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, config, conn, log = on_full_connection(local_engine, tmp_path)
    async with open_channel(config, log=log) as ch:
        await ch.handshake("1", "ack-full", "1")
        conn.needle = "last_acked_seq"
        ch.send_finding({"n": 1})
        await eventually(lambda: "cannot store ack 1" in caplog.text, what="the refused store")
        conn.needle = None
        # No message follows, so no ack: only the retry can store it.
        await eventually(lambda: log.state.last_acked == 1, what="the ack stored on a retry")
        assert list(log.unacked()) == []
    assert local_engine.accepted(run_id) == [1]


@pytest.mark.asyncio
async def test_the_dones_ack_the_disk_will_not_store_is_stored_and_send_done_says_true(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Seed 642715: after the Done no ack comes; a failed store of its ack was
    # never tried again and send_done (or flush) waited out its timeout.
    run_id, config, conn, log = on_full_connection(local_engine, tmp_path)
    async with open_channel(config, log=log) as ch:
        await ch.handshake("1", "ack-full", "1")
        ch.send_finding({"n": 1})
        # Stored first: no coalescing timer stays armed to store the Done's ack by chance.
        await eventually(lambda: log.state.last_acked == 1, what="the finding's ack stored")
        conn.needle = "last_acked_seq"
        done = asyncio.ensure_future(ch.send_done("completed", 1, [], ""))
        await eventually(lambda: "cannot store ack 2" in caplog.text, what="the refused store")
        assert not done.done()  # the Done waits on its tombstone
        conn.needle = None
        assert await done
        assert log.completed
        assert f"run {run_id}: Done acked; the log is now a tombstone" in caplog.text
    assert local_engine.accepted(run_id) == [1, 2]  # the Done applied once


# -- an engine that lost rows it acked before the log stored the ack ---------------------------


@pytest.mark.asyncio
async def test_an_engine_that_lost_acked_rows_the_log_still_holds_is_sent_them_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The handshake answer is below acks the engine gave that the log never
    # stored (the disk refused them): those rows are still in the log, so the
    # channel says so and writes them again (the driver's Answer.FORGOT).
    held: list[int] = []  # the engine's store: the seqs it applied, in order

    async def engine(stream: RogueStream) -> None:
        await answer_handshakes(stream, len(held))
        while (msg := await stream.read()) is not None:
            if msg.seq == len(held) + 1:
                held.append(msg.seq)
            stream.ack(len(held))  # a heartbeat's answer too

    rogue = RogueEngine(engine)
    await rogue.start()
    try:
        config = rogue.channel_config(tmp_path / "wal", "forgot-run")
        conn, log = log_on_connection(config, FullOn)
        async with open_channel(config, log=log) as ch:
            await ch.handshake("1", "forgot", "1")
            conn.needle = "last_acked_seq"  # after the answer's verification, which stores one
            for n in range(1, 6):
                ch.send_finding({"n": n})
            await eventually(lambda: ch.last_acked_seq == 5, what="ack 5 received")
            await eventually(lambda: "cannot store ack 5" in caplog.text, what="its store refused")
            del held[2:]  # the engine loses rows 3..5, which it acked, and restarts
            for stream in rogue.streams:
                stream.end()
            said = (
                "run forgot-run: the engine answered Ack(2) below acks it gave (5); "
                "re-sending from 3"
            )
            await eventually(lambda: said in caplog.text, what="the warning")
            await eventually(lambda: held == [1, 2, 3, 4, 5], what="rows 3..5 applied again")
            conn.needle = None
            await eventually(lambda: log.state.last_acked == 5, what="the ack stored")
            assert list(log.unacked()) == []
            assert ch.stats().protocol_errors == 0  # an engine may lose what it acked
    finally:
        await rogue.stop()


# -- the engine applied this run's Done and the ack was lost with the stream -------------------


class DoneAckLost:
    """An engine that applies the ``Done``, loses its ack with the stream, then says so.

    The next stream is refused FAILED_PRECONDITION "run completed" (naming
    no writer): the engine's word that it applied the ``Done``.
    """

    def __init__(self) -> None:
        self.held = 0
        self.done_applied = False
        self.rogue = RogueEngine(self.script)

    async def script(self, stream: RogueStream) -> None:
        if self.done_applied:
            await stream.read()  # the handshake
            await stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "run completed")
        await answer_handshakes(stream, self.held)
        while (msg := await stream.read()) is not None:
            if msg.seq == self.held + 1:
                self.held = msg.seq
            if msg.WhichOneof("body") == "done":
                self.done_applied = True
                stream.end()  # the Done's ack goes with the stream
                return
            stream.ack(self.held)


async def done_after_a_lost_ack(
    tmp_path: Path, needle: str | None
) -> tuple[DoneAckLost, GrpcChannelConfig, bool | BaseException]:
    """Log a finding and the ``Done`` to :class:`DoneAckLost`, with ``needle``'s UPDATEs refused.

    Returns the engine, the run's config, and what ``send_done`` returned or raised.
    """
    engine = DoneAckLost()
    await engine.rogue.start()
    try:
        config = engine.rogue.channel_config(tmp_path / "wal", "done-lost")
        conn, log = log_on_connection(config, FullOn)
        async with open_channel(config, log=log) as ch:
            await ch.handshake("1", "done-lost", "1")
            conn.needle = needle
            ch.send_finding({"n": 1})
            outcome: bool | BaseException
            try:
                outcome = await ch.send_done("completed", 1, [], "")
            except RunCompletedError as exc:
                outcome = exc
            conn.needle = None
        return engine, config, outcome
    finally:
        await engine.rogue.stop()


@pytest.mark.asyncio
async def test_a_done_whose_ack_was_lost_makes_the_log_a_tombstone_on_the_engines_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, config, outcome = await done_after_a_lost_ack(tmp_path, None)
    assert engine.done_applied and engine.held == 2
    assert outcome is True
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        assert log.completed and list(log.unacked()) == []
    said = "run done-lost: the engine applied this run's Done; the log is now a tombstone"
    assert said in caplog.text


@pytest.mark.asyncio
async def test_a_tombstone_the_disk_will_not_store_after_a_lost_done_ack_keeps_the_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, config, outcome = await done_after_a_lost_ack(tmp_path, "completed_at")
    assert engine.done_applied
    assert isinstance(outcome, RunCompletedError)
    assert "run done-lost: cannot mark the log completed" in caplog.text
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        assert not log.completed
        assert [row.seq for row in log.unacked()] == [2]  # the Done stays: nothing is lost
