"""The client catches every engine lie it can see (issue 53): a handshake answer above
anything this log wrote is refused, also after a restart; an engine that contradicts
the cursor its own acks put on disk is engine-behind, not a retry loop; ack floods are
said; every re-dial counts.

A real ``grpc.aio`` server on loopback plays the engine (``tests/helpers/rogue.py``):
an honest store that takes ``seq == h + 1`` only and ends the stream
FAILED_PRECONDITION "expected seq N, got seq M" on a gap (SPEC "Engine duties"),
with one duty broken per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
from pathlib import Path

import grpc
import pytest

from conftest import eventually
from helpers.rogue import RogueEngine, RogueStream
from walchannel import ChannelState, EngineBehindError, GrpcEngineChannel
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.state import FAILED_ENGINE_BEHIND
from walchannel.log.writer import WRITTEN_STEP

RUN = "lie-run"


class Engine:
    """The engine's store (it survives its streams, as a durable store does) and its lies.

    ``answers`` lists what the next streams answer the handshake with, in
    turn (None: the truth, the highest seq held); after the list, the truth.
    """

    def __init__(self, answers: list[int | None] | None = None, *, flood: bool = False) -> None:
        self.held = 0
        self.answers = list(answers or [])
        self.flood = flood
        self.expected_ends: list[str] = []
        self.silent_streams = 0  # the next streams never answer the handshake
        self.rogue = RogueEngine(self.script)

    async def script(self, stream: RogueStream) -> None:
        hello = await stream.read()
        if hello is None:
            return
        if self.silent_streams:
            self.silent_streams -= 1
            await asyncio.Event().wait()  # no answer: the client's connect timeout ends it
        answer = self.answers.pop(0) if self.answers else None
        stream.ack(self.held if answer is None else answer)
        while (msg := await stream.read()) is not None:
            if not msg.seq:  # a heartbeat: answered with what it holds
                stream.ack(self.held)
                continue
            if msg.seq > self.held + 1:
                text = f"expected seq {self.held + 1}, got seq {msg.seq}"
                self.expected_ends.append(text)
                await stream.abort(grpc.StatusCode.FAILED_PRECONDITION, text)
            if msg.seq == self.held + 1:
                self.held = msg.seq
            stream.ack(self.held)
            if self.flood:
                stream.ack(self.held)  # a duplicate
                stream.ack(max(0, self.held - 1))  # and a step back

    async def __aenter__(self) -> Engine:
        await self.rogue.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.rogue.stop()

    def channel(self, wal: Path, **kw: object) -> GrpcEngineChannel:
        return GrpcEngineChannel(self.rogue.channel_config(wal, RUN, "tok", **kw))


async def send_and_ack(ch: GrpcEngineChannel, first: int, count: int) -> None:
    for n in range(first, first + count):
        ch.send_finding({"n": n})
    assert await ch.wait_acked(timeout_ms=10_000), ch.stats()


async def cut(engine: Engine) -> None:
    """The engine dies right after acking all it received (its store stays)."""
    for stream in engine.rogue.streams:
        stream.end()


# -- an answer above anything this log wrote ----------------------------------------------


@pytest.mark.asyncio
async def test_an_answer_above_anything_written_is_refused_within_a_process(
    tmp_path: Path,
) -> None:
    async with Engine(answers=[None, 60]) as engine, engine.channel(tmp_path / "wal") as ch:
        await ch.handshake("1", "lies", "1")
        await send_and_ack(ch, 1, 10)
        await cut(engine)  # the restarted engine answers 60: the client wrote 10
        await eventually(lambda: ch.stats().protocol_errors == 1, what="the lie counted")
        assert "above seq 10" in (ch.stats().last_error or "")
        assert ch.last_acked_seq == 10  # nothing moved
        await send_and_ack(ch, 11, 5)  # the next stream, answered truly, takes 11..15
        assert ch.stats().acked == 15
    assert engine.held == 15 and not engine.expected_ends


@pytest.mark.asyncio
async def test_an_answer_above_anything_written_is_refused_after_a_harness_restart(
    tmp_path: Path,
) -> None:
    wal = tmp_path / "wal"
    async with Engine(answers=[None, 60]) as engine:
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            await send_and_ack(ch, 1, 10)
        # The harness restarts on its log (same boot): its high-water bounds what it wrote.
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            assert ch.stats().protocol_errors == 1
            # What the log kept beside it, ahead of its writer, bounds what it wrote.
            assert f"above seq {1 + WRITTEN_STEP}," in (ch.stats().last_error or "")
            assert ch.log.last_acked_seq == 10 and ch.log.high_water == 10
            await send_and_ack(ch, 11, 5)
    assert engine.held == 15 and not engine.expected_ends


@pytest.mark.asyncio
async def test_the_same_answer_is_taken_from_the_engine_a_takeover_meets(tmp_path: Path) -> None:
    # Legitimately above anything this log wrote: the engine holds another writer's rows.
    wal = tmp_path / "wal"
    async with Engine(answers=[None]) as engine:
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            await send_and_ack(ch, 1, 10)
        engine.held = 60  # another writer delivered 11..60
        with RunLog.open(wal, RUN, correlation_id=f"corr-{RUN}") as log:
            log.mark_takeover()
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            assert ch.stats().protocol_errors == 0
            assert ch.send_finding({"n": 61}) == 61  # numbered after the engine's
            assert await ch.wait_acked(timeout_ms=10_000)
    assert engine.held == 61 and not engine.expected_ends


@pytest.mark.asyncio
async def test_the_answer_a_log_copied_back_meets_is_taken(tmp_path: Path) -> None:
    # An older copy of the log put back (by hand, on this boot): the engine holds what
    # this log's owners wrote, which the lock file beside it still bounds.
    wal = tmp_path / "wal"
    backup = tmp_path / "backup.sqlite3"
    async with Engine(answers=[None]) as engine:
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            await send_and_ack(ch, 1, 5)
            src = sqlite3.connect(ch.log.path)
            dst = sqlite3.connect(backup)
            src.backup(dst)
            src.close()
            dst.close()
            await send_and_ack(ch, 6, 5)
            path = ch.log.path
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(backup, path)
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            assert ch.stats().protocol_errors == 0
            assert ch.send_finding({"n": 11}) == 11  # moved past the engine's 10
            assert await ch.wait_acked(timeout_ms=10_000)
    assert engine.held == 11 and not engine.expected_ends


# -- an engine that contradicts itself ----------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("repeated", [True, False], ids=["every stream lies", "one lie"])
async def test_an_expected_seq_below_the_stored_cursor_is_engine_behind(
    tmp_path: Path, repeated: bool
) -> None:
    # The engine holds 10 of the 20 rows written, restarts, and answers 15: inside
    # what was written, so the channel takes it (and stores it, deleting 11..15).
    # Then it ends the stream "expected seq 11": below the cursor it made us store.
    wal = tmp_path / "wal"
    async with Engine() as engine:
        async with engine.channel(wal) as ch:
            await ch.handshake("1", "lies", "1")
            await send_and_ack(ch, 1, 10)
        engine.held = 10
        with RunLog.open(wal, RUN, correlation_id=f"corr-{RUN}") as log:
            log.append_many([("finding", {"fields": {"n": n}}) for n in range(11, 21)])
        engine.answers = [15] * (50 if repeated else 1)
        started = asyncio.get_running_loop().time()
        async with engine.channel(wal) as ch:
            with contextlib.suppress(EngineBehindError):
                await ch.handshake("1", "lies", "1")
            # (30 s: once, under four workers and two busy loops on two cores, 10 s
            # passed; the proof that it is no re-dial loop is the stream count below.)
            await eventually(
                lambda: ch.state is ChannelState.FAILED, timeout=30.0, what="engine behind"
            )
            took = asyncio.get_running_loop().time() - started
            with pytest.raises(EngineBehindError, match="expects seq 11") as caught:
                ch.send_finding({"n": 21})
            assert "below the cursor 15" in str(caught.value)
            streams = len(engine.rogue.streams)
        path = tmp_path / "wal" / f"{RUN}.wal.sqlite3"
    assert took < 30.0  # within seconds, not a re-dial loop: at most four streams
    assert streams <= 4
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None and report.reason.startswith(FAILED_ENGINE_BEHIND)
    assert report.last_error is not None and "expects seq 11" in report.last_error


# -- floods, backwards acks, re-dials ----------------------------------------------------


@pytest.mark.asyncio
async def test_an_ack_flood_is_said_once_per_stream_and_delivers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="walchannel")
    async with Engine(flood=True) as engine, engine.channel(tmp_path / "wal") as ch:
        await ch.handshake("1", "lies", "1")
        await send_and_ack(ch, 1, 300)
        assert ch.stats().protocol_errors == 0
    said = [r for r in caplog.records if "duplicate acks beyond" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert "acks going backwards" in said[0].getMessage()
    assert engine.held == 300


@pytest.mark.asyncio
async def test_a_stream_cut_for_a_missing_answer_counts_as_a_reconnect(tmp_path: Path) -> None:
    async with Engine() as engine:
        engine.silent_streams = 2
        async with engine.channel(tmp_path / "wal", connect_timeout_ms=300) as ch:
            with contextlib.suppress(Exception):
                await ch.handshake("1", "lies", "1")
            await eventually(lambda: ch.state is ChannelState.STREAMING, what="the third stream")
            assert ch.stats().reconnects == 2
            await send_and_ack(ch, 1, 3)
