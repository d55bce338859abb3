"""GrpcEngineChannel against the real LocalEngine on loopback (SPEC "The channel")."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest

from conftest import eventually, new_run, offline_config, while_progressing
from helpers.engine_thread import EngineThread
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from walchannel import (
    ApprovalTimeoutError,
    BacklogFullError,
    ChannelClosedError,
    ChannelState,
    EngineBehindError,
    EngineUnavailableError,
    GrpcChannelConfig,
    GrpcEngineChannel,
    PayloadError,
    RunCompletedError,
    RunRefusedError,
)
from walchannel.channel.seams import log_of
from walchannel.log import RunLog
from walchannel.log import state as log_state
from walchannel.testing import InMemoryEngineChannel
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def channel_for(
    engine: LocalEngine, wal: Path, run_id: str, token: str, **kw: Any
) -> GrpcEngineChannel:
    return GrpcEngineChannel(local_channel_config(engine, wal, run_id, token, **kw))


def finding(i: int) -> dict[str, Any]:
    return {"n": i, "path": f"src/file_{i}.py", "line": i * 3}


@pytest.mark.asyncio
async def test_round_trip_and_bodies(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    ch = engine_channel
    run_id = ch.config.run_id
    early = ch.send_event("started", "info", {"files": 3})  # before the handshake
    await ch.handshake("1.0", "test-harness", "0.1")
    assert ch.state is ChannelState.STREAMING
    seqs = [ch.send_finding(finding(i)) for i in range(5)]
    seqs += ch.send_findings([finding(i) for i in range(5, 8)], progress={"next": 8})
    assert [early, *seqs] == list(range(1, 10))
    assert await ch.wait_acked(timeout_ms=5000)
    assert ch.last_acked_seq == 9 and ch.unacked_count == 0
    assert local_engine.accepted(run_id) == list(range(1, 10))
    bodies = local_engine.bodies(run_id)
    assert bodies[0]["kind"] == "event" and bodies[0]["body"]["payload"] == {"files": 3.0}
    assert bodies[1]["body"] == {"fields": {"n": 0.0, "path": "src/file_0.py", "line": 0.0}}
    assert ch.progress() == {"next": 8}
    assert ch.send_findings([], progress={"next": 9}) == []  # no findings, marker moves
    # (The local engine keeps the resume point: the marker alone travels as seq 10.)
    assert ch.progress() == {"next": 9} and ch.unacked_count == 1
    assert await ch.send_done("completed", 8, ["src"], "")
    assert local_engine.done(run_id) == {
        "seq": 11,
        "status": "completed",
        "findings": 8,
        "coverage": ["src"],
        "exit_reason": "",
    }
    stats = ch.stats()
    assert stats.acked == 11 and stats.unacked_count == 0 and stats.sent >= 11
    with pytest.raises(ChannelClosedError):
        ch.send_finding(finding(99))


@pytest.mark.asyncio
async def test_bad_payload_uses_no_seq_and_good_ones_keep_order(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    ch = engine_channel
    await ch.handshake("1", "h", "1")
    assert ch.send_finding({"ok": 1}) == 1
    with pytest.raises(PayloadError, match=r"finding\.bad\[1\]"):
        ch.send_finding({"bad": [1, float("nan")]})
    with pytest.raises(PayloadError, match="max_message_bytes"):
        ch.send_finding({"huge": "x" * (4 * 1024 * 1024)})
    with pytest.raises(PayloadError, match=r"event\.ts"):
        ch.send_event("t", "info", {}, ts="yesterday")
    assert ch.send_finding({"ok": 2}) == 2
    assert await ch.wait_acked(timeout_ms=5000)
    assert local_engine.accepted(ch.config.run_id) == [1, 2]


@pytest.mark.asyncio
async def test_a_payload_changed_after_send_goes_out_as_it_was_committed(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    # A harness may reuse or change its dicts once send_* returned: what was
    # committed is what the engine gets, never the later state.
    ch = engine_channel
    await ch.handshake("1", "h", "1")
    first = {"test_id": "B101", "lines": [1, 2]}
    batch = [{"test_id": "B102", "lines": [3]}, {"test_id": "B103", "lines": [4]}]
    ch.send_finding(first)
    ch.send_findings(batch)
    first["test_id"] = "CHANGED"
    first["lines"].append(object())  # not even encodable any more
    batch[0]["lines"].clear()
    del batch[1]["test_id"]
    assert await ch.wait_acked(timeout_ms=5000)
    got = [row["body"]["fields"] for row in local_engine.bodies(ch.config.run_id)]
    assert got == [
        {"test_id": "B101", "lines": [1.0, 2.0]},
        {"test_id": "B102", "lines": [3.0]},
        {"test_id": "B103", "lines": [4.0]},
    ]


@pytest.mark.asyncio
async def test_tiny_rows_cannot_grow_the_tail_past_its_byte_bound(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each tail row counts its Python overhead: empty findings (9 bytes of
    # msgpack each) would otherwise all stay in memory. A 64 KiB bound shows
    # it with 2,000 rows (18 KB of bodies) as the real 4 MiB one does with 30,000.
    from walchannel.channel import row_source
    from walchannel.channel.row_source import TAIL_ROW_OVERHEAD

    monkeypatch.setattr(row_source, "TAIL_BYTES", 64 * 1024)
    ch = engine_channel
    n = 2_000
    for _ in range(n // 500):
        ch.send_findings([{}] * 500)
    tail = ch._rows.tail
    assert len(tail) <= row_source.TAIL_BYTES // TAIL_ROW_OVERHEAD < n
    assert ch._rows.tail_bytes <= row_source.TAIL_BYTES
    assert tail[-1][0] == n and tail[0][0] > 1
    await ch.handshake("1", "h", "1")  # the evicted rows come from disk
    await while_progressing(
        lambda: ch.last_acked_seq == n, lambda: ch.last_acked_seq, what=f"acks up to {n}"
    )
    assert local_engine.accepted(ch.config.run_id) == list(range(1, n + 1))


@pytest.mark.asyncio
async def test_engine_killed_and_replaced_keeps_the_count_rising(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    ch = channel_for(local_engine, tmp_path / "wal", run_id, token)
    async with ch:
        await ch.handshake("1", "seed", "1")
        counts = []
        for i in range(60):
            ch.send_finding(finding(i))
            await asyncio.sleep(0.005)
        await eventually(lambda: len(local_engine.accepted(run_id)) > 10, what="first findings")
        old_addr = local_engine.grpc_addr
        await local_engine.kill()
        counts.append(len(local_engine.accepted(run_id)))
        for i in range(60, 120):
            ch.send_finding(finding(i))  # logged while no engine is up
        await local_engine.replace()
        assert local_engine.grpc_addr != old_addr
        for i in range(120, 150):
            ch.send_finding(finding(i))
            await asyncio.sleep(0.002)
        assert await ch.wait_acked(timeout_ms=15_000)
        counts.append(len(local_engine.accepted(run_id)))
        assert counts[1] > counts[0]
        assert local_engine.accepted(run_id) == list(range(1, 151))
        assert local_engine.gaps(run_id) == []
        assert ch.stats().reconnects >= 1
        assert ch.log.meta().last_engine_addr == local_engine.grpc_addr


@pytest.mark.asyncio
async def test_resume_after_all_acked_continues_seqs_without_false_duplicates(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(5):
            ch.send_finding(finding(i))
        assert await ch.wait_acked(timeout_ms=5000)
    async with channel_for(local_engine, wal, run_id, token) as ch:
        assert ch.send_finding(finding(5)) == 6
        await ch.handshake("1", "h", "1")
        assert ch.send_finding(finding(6)) == 7
        assert await ch.wait_acked(timeout_ms=5000)
    assert local_engine.accepted(run_id) == list(range(1, 8))
    assert local_engine.duplicates(run_id) == 0


@pytest.mark.asyncio
async def test_unacked_rows_replay_on_the_next_open(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    async with channel_for(local_engine, wal, run_id, token) as ch:
        for i in range(20):
            ch.send_finding(finding(i))  # never handshaken: nothing sent
        assert ch.unacked_count == 20
    assert local_engine.accepted(run_id) == []
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(timeout_ms=5000)
        assert ch.send_finding(finding(20)) == 21
        assert await ch.wait_acked(timeout_ms=5000)
    assert local_engine.accepted(run_id) == list(range(1, 22))


@pytest.mark.asyncio
async def test_stats_only_reads_an_ack_received_is_counted_not_stored(
    local_engine: LocalEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Acks are stored a while after they arrive (coalesced): make the while long.
    monkeypatch.setattr("walchannel.core.driver.ACK_STORE_AFTER_MS", 3_600_000.0)
    run_id, token = new_run(local_engine)
    async with channel_for(local_engine, tmp_path / "wal", run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_findings([finding(i) for i in range(3)])
        assert await ch.wait_acked(timeout_ms=5000)
        wal = ch._log
        stored, changes = wal.last_acked_seq, wal._conn.total_changes
        assert stored == 0 and ch.last_acked_seq == 3  # received, not stored
        stats = ch.stats()
        assert (wal.last_acked_seq, wal._conn.total_changes) == (stored, changes)
        assert stats.acked == 3 and stats.unacked_count == 0
        assert stats.unacked_bytes == 0 < wal.unacked_bytes  # the received ack counts
        assert stats.oldest_unacked_age_s is None
    with RunLog.open(tmp_path / "wal", run_id, correlation_id="c") as wal:
        assert wal.last_acked_seq == 3  # close stored it


@pytest.mark.asyncio
async def test_stats_never_quarantines_a_damaged_row(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    with RunLog.open(tmp_path / "wal", run_id, correlation_id="c") as wal:
        wal.append_many([("finding", {"fields": finding(i)}) for i in range(3)])
        path = wal.path
    conn = sqlite3.connect(path)
    conn.execute("UPDATE rows SET crc32 = crc32 + 1 WHERE seq = 1")
    conn.commit()
    conn.close()
    async with channel_for(local_engine, tmp_path / "wal", run_id, token) as ch:
        changes = ch._log._conn.total_changes
        stats = ch.stats()  # never handshaken: the damaged row is still first
        assert ch._log._conn.total_changes == changes
        assert ch._log.quarantined() == [] and stats.quarantined == 0
        assert stats.unacked_count == 3 and stats.oldest_unacked_age_s is not None


def take_over(wal: Path, run_id: str) -> None:
    """Mark the run's (new) log to take the run over, as ``walchannel takeover LOG`` does."""
    with RunLog.open(wal, run_id, correlation_id=f"corr-{run_id}") as log:
        log.mark_takeover()


@pytest.mark.parametrize("damage", ["rolled-back", "deleted"])
@pytest.mark.asyncio
async def test_lost_commits_get_seqs_past_the_engine(
    local_engine: LocalEngine, tmp_path: Path, damage: str
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    backup = tmp_path / "backup.sqlite3"
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(3):
            ch.send_finding(finding(i))
        assert await ch.wait_acked(timeout_ms=5000)
        log_path = ch.log.path
        src = sqlite3.connect(log_path)
        dst = sqlite3.connect(backup)
        src.backup(dst)  # an older copy: the engine will hold more than it
        src.close()
        dst.close()
        for i in range(3, 8):
            ch.send_finding(finding(i))
        assert await ch.wait_acked(timeout_ms=5000)
    assert local_engine.accepted(run_id) == list(range(1, 9))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{log_path}{suffix}").unlink(missing_ok=True)
    if damage == "rolled-back":
        shutil.copyfile(backup, log_path)  # answered before its copy: the same writer
    else:
        # A fresh log meeting an engine that holds the run's rows is refused
        # (another writer's, for all it knows): the operator takes over.
        take_over(wal, run_id)
    async with channel_for(local_engine, wal, run_id, token) as ch:
        before = ch.send_finding({"n": "before-handshake"})
        await ch.handshake("1", "h", "1")
        after = ch.send_finding({"n": "after-handshake"})
        assert after == 10
        assert await ch.wait_acked(before, timeout_ms=5000)
        assert await ch.wait_acked(after, timeout_ms=5000)
    assert local_engine.accepted(run_id) == list(range(1, 11))
    assert local_engine.duplicates(run_id) == 0
    contents = [b["body"]["fields"]["n"] for b in local_engine.bodies(run_id)]
    assert contents[-2:] == ["before-handshake", "after-handshake"]


@pytest.mark.asyncio
async def test_completed_run_is_refused_by_the_engine_and_the_tombstone(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_finding(finding(0))
        assert await ch.send_done("completed", 1, [], "")
        assert ch.log.completed
    with pytest.raises(RunCompletedError):
        channel_for(local_engine, wal, run_id, token)
    # Pruned tombstone: the engine's answer covers it.
    for p in wal.iterdir():
        p.unlink()
    async with channel_for(local_engine, wal, run_id, token) as ch:
        with pytest.raises(RunCompletedError):
            await ch.handshake("1", "h", "1")
        assert ch.state is ChannelState.FAILED
        with pytest.raises(RunCompletedError):
            ch.send_finding(finding(1))


@pytest.mark.asyncio
async def test_engine_behind_the_cursor_fails_and_deletes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "engine.sqlite3"
    wal = tmp_path / "wal"
    engine = LocalEngine(store)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        async with channel_for(engine, wal, run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            for i in range(5):
                ch.send_finding(finding(i))
            assert await ch.wait_acked(timeout_ms=5000)
            ch.send_finding(finding(5))  # unacked: the engine is gone before it
            await engine.kill()
        await engine.stop()
        # The engine lost its store: a new one knows only the run.
        store.unlink()
        engine = LocalEngine(store)
        await engine.start()
        engine.register_run(run_id, token)
        async with channel_for(engine, wal, run_id, token) as ch:
            with pytest.raises(EngineBehindError):
                await ch.handshake("1", "h", "1")
            assert ch.state is ChannelState.FAILED
            with pytest.raises(EngineBehindError):
                ch.send_finding(finding(6))
            assert "below the stored cursor" in (ch.stats().last_error or "")
            assert [r.seq for r in ch.log.unacked()] == [6]
            assert ch.log.meta().failed_at is not None
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_send_done_times_out_then_replays_after_a_restart(
    tmp_path: Path,
) -> None:
    engine = LocalEngine(tmp_path / "store.sqlite3")
    await engine.start()
    wal = tmp_path / "wal"
    try:
        run_id, token = new_run(engine)
        async with channel_for(engine, wal, run_id, token, done_ack_timeout_ms=300) as ch:
            await ch.handshake("1", "h", "1")
            ch.send_finding(finding(0))
            assert await ch.wait_acked(timeout_ms=5000)
            await engine.kill()
            assert await ch.send_done("completed", 1, [], "") is False
            assert ch.log.done_seq == 2
            with pytest.raises(ChannelClosedError):
                await ch.send_done("completed", 1, [], "")
        await engine.replace()
        async with channel_for(engine, wal, run_id, token) as ch:
            await ch.handshake("1", "h", "1")
            # The log holds Done: no new row, wait on it.
            assert await ch.send_done("ignored", 0, [], "")
            assert ch.log.completed
        assert engine.done(run_id)["status"] == "completed"  # type: ignore[index]
        assert engine.accepted(run_id) == [1, 2]
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_close_during_a_reconnect_loop_is_prompt_and_leaves_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    engine = LocalEngine()
    await engine.start()
    try:
        run_id, token = new_run(engine)
        threads_before = set(threading.enumerate())
        tasks_before = asyncio.all_tasks()
        ch = channel_for(
            engine,
            tmp_path / "wal",
            run_id,
            token,
            grpc_addr=dead,
            http_addr=None,
            connect_timeout_ms=300,
            close_timeout_ms=500,
        )
        with pytest.raises(EngineUnavailableError):
            await ch.handshake("1", "h", "1")
        ch.send_finding(finding(0))
        assert ch.state in (ChannelState.BACKOFF, ChannelState.CONNECTING)
        start = asyncio.get_running_loop().time()
        await ch.close()
        # close_timeout_ms is 0.5 s; the bound only proves close() never hangs.
        assert asyncio.get_running_loop().time() - start < 10.0
        assert ch.state is ChannelState.CLOSED
        await ch.close()
        await eventually(
            lambda: asyncio.all_tasks() - tasks_before <= {asyncio.current_task()},
            what=f"the channel's tasks to end: {asyncio.all_tasks() - tasks_before}",
        )
        extra = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
        assert not [t for t in extra if not t.daemon], extra
        with RunLog.open(tmp_path / "wal", run_id, correlation_id="x") as wal:
            assert wal.unacked_count == 1  # unacked rows stay on disk
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_stop_approval_and_budget_round_trips(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine, caplog: pytest.LogCaptureFixture
) -> None:
    ch = engine_channel
    run_id = ch.config.run_id
    stops: list[str] = []
    budgets: list[tuple[str, dict[str, Any]]] = []

    def broken(reason: str) -> None:
        raise RuntimeError("callback bug")

    ch.on_stop(broken)
    ch.on_stop(stops.append)
    ch.on_budget_update(lambda m, d: budgets.append((m, d)))
    await ch.handshake("1", "h", "1")
    await local_engine.send_stop(run_id, "operator")
    await local_engine.send_stop(run_id, "operator")
    await local_engine.send_budget_update(run_id, "80% of budget", {"used": 0.8})
    await eventually(lambda: stops and budgets, what="stop and budget")
    assert stops == ["operator"]
    assert budgets == [("80% of budget", {"used": 0.8})]
    assert "callback bug" in caplog.text

    async def decide_later() -> None:
        await eventually(
            lambda: any(b["kind"] == "approval_request" for b in local_engine.bodies(run_id))
        )
        await local_engine.decide_approval(run_id, "req-1", True, "fine")

    task = asyncio.create_task(decide_later())
    decision = await ch.request_approval(
        "exploit", {"target": "x"}, request_id="req-1", timeout_ms=5000
    )
    await task
    assert (decision.request_id, decision.approved, decision.reason) == ("req-1", True, "fine")
    rows = ch.unacked_count
    again = await ch.request_approval("exploit", {"target": "x"}, request_id="req-1")
    assert again == decision and ch.unacked_count == rows
    with pytest.raises(ApprovalTimeoutError, match="req-2"):
        await ch.request_approval("scan", {}, request_id="req-2", timeout_ms=200)
    # A reconnect re-sends Stop (right after the handshake answer, before any
    # ack of a row): once a new row is acked, the repeat was seen.
    await local_engine.end_streams(run_id, None)
    await eventually(lambda: ch.stats().reconnects >= 1, what="reconnect")
    assert await ch.wait_acked(ch.send_finding(finding(99)), timeout_ms=10_000)
    assert stops == ["operator"]


@pytest.mark.asyncio
async def test_a_discovery_that_never_answers_ends_at_connect_timeout_and_the_address_stays(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An HTTP endpoint that takes the connection and never answers: the
    # re-discovery after a drop gives up at connect_timeout_ms (0.3 s), says
    # so, and the channel dials the engine it had (SPEC "Reconnect").
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, http_addr=url, connect_timeout_ms=300
    )
    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "silent-discovery", "1")
            await local_engine.end_streams(run_id, None)
            await eventually(lambda: bool(held), what="the re-discovery's request")
            assert await ch.wait_acked(ch.send_finding(finding(1)), timeout_ms=10_000)
            assert ch.stats().reconnects >= 1
            said = f"run {run_id}: discovery timed out, keeping {local_engine.grpc_addr}"
            assert said in caplog.text
            assert ch.stats().last_error == f"discovery: no answer from {url} within 0.3 s"
        assert local_engine.accepted(run_id) == [1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_close_half_closes_a_live_stream_and_the_engine_ends_it(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine, caplog: pytest.LogCaptureFixture
) -> None:
    # SPEC "Shutdown order": close() half-closes a live stream and waits for
    # the engine to end it; a cancel would tell the engine the client broke off.
    ch = engine_channel
    await ch.handshake("1", "h", "1")
    ch.send_finding(finding(0))
    await eventually(lambda: ch.unacked_count == 0, what="the ack")
    await ch.close()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("walchannel.testing")]
    assert any(line.endswith(": client half-closed") for line in said), said  # the engine's
    assert not any("stream input failed" in line for line in said), said


@pytest.mark.asyncio
async def test_pending_approval_fails_on_close(engine_channel: GrpcEngineChannel) -> None:
    ch = engine_channel
    await ch.handshake("1", "h", "1")
    rows = ch.unacked_count
    waiter = asyncio.create_task(ch.request_approval("x", {}))
    await eventually(lambda: ch.unacked_count > rows or ch.last_acked_seq > 0, what="the request")
    await ch.close()
    with pytest.raises(ChannelClosedError):
        await waiter


@pytest.mark.asyncio
async def test_backlog_limit_refuses_without_dropping(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    async with channel_for(
        local_engine, tmp_path / "wal", run_id, token, max_unacked_bytes=400
    ) as ch:
        sent = 0
        while ch.log.unacked_bytes + 40 <= 400:
            ch.send_finding(finding(sent))
            sent += 1
        with pytest.raises(BacklogFullError, match="max_unacked_bytes"):
            ch.send_finding({"blob": "x" * 100})
        assert 0 < sent < 100
        assert ch.unacked_count == sent
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(timeout_ms=5000)
        ch.send_finding(finding(100))  # room again
        assert await ch.send_done("completed", sent + 1, [], "")
        assert local_engine.accepted(run_id) == list(range(1, sent + 3))


@pytest.mark.asyncio
async def test_token_never_appears_in_logs_errors_or_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = LocalEngine(reject_tokens_for_handshakes=1)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        wal = tmp_path / "wal"
        texts: list[str] = []
        with caplog.at_level(logging.DEBUG):
            ch = channel_for(engine, wal, run_id, token)
            texts.append(repr(ch))
            texts.append(repr(ch.config))
            try:
                await ch.handshake("1", "h", "1")
            except EngineUnavailableError as exc:
                texts.append(str(exc))
            for i in range(10):
                ch.send_finding(finding(i))
            await eventually(lambda: ch.state is ChannelState.STREAMING, what="streaming")
            await engine.end_streams(run_id, None)
            await engine.kill()
            await engine.replace()
            assert await ch.wait_acked(timeout_ms=10_000)
            texts.append(str(ch.stats()))
            await ch.close()
        assert engine.accepted(run_id) == list(range(1, 11))
        texts.append(caplog.text)
        blob = b"".join(p.read_bytes() for p in wal.iterdir() if p.is_file())
        assert token.encode() not in blob
        for text in texts:
            assert token not in text
        assert "UNAUTHENTICATED" in caplog.text or "unauthenticated" in caplog.text.lower()
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_a_healthy_answer_clears_an_old_failed_mark(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    with RunLog.open(wal, run_id, correlation_id="c") as log:
        # As the reporter stores a failure: the time and the reason together.
        log.update_meta(
            failed_at=1.0,
            failed_reason=f"{log_state.FAILED_INTERNAL}: the loop was cancelled",
            last_error="engine behind",
        )
        assert log.meta().failed_reason is not None
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        meta = ch.log.meta()
        # Both go: a reason left behind would read as a failure in inspect (issue 51).
        assert (meta.failed_at, meta.failed_reason) == (None, None)


@pytest.mark.asyncio
async def test_done_applied_but_its_ack_lost_ends_as_a_tombstone(tmp_path: Path) -> None:
    # Found by tools/sim.py (seed 32): the engine applies Done and the stream
    # dies before its ack arrives; the next handshake is told "run completed".
    streams: list[int] = []

    async def script(stream: RogueStream) -> None:
        streams.append(1)
        if len(streams) > 1:
            await stream.read()
            await stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "run completed")
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.WhichOneof("body") == "done":
                stream.end()  # applied, never acked
                return

    engine = RogueEngine(script)
    await engine.start()
    config = engine.channel_config(tmp_path / "wal", "lost-ack", "tok", done_ack_timeout_ms=10_000)
    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            ch.send_finding(finding(0))
            assert await ch.send_done("completed", 1, [], "")
            assert ch.log.completed and ch.unacked_count == 0
            assert ch.state is ChannelState.FAILED
        with pytest.raises(RunCompletedError):
            GrpcEngineChannel(config)
    finally:
        await engine.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize("asleep", [True, False], ids=["waiting-when-told", "asking-after"])
@pytest.mark.parametrize("target", ["newest", "a-finding"])
async def test_after_send_done_gave_up_a_waiter_learns_the_done_was_applied(
    tmp_path: Path, asleep: bool, target: str
) -> None:
    # Found by tools/chaos.py engine-kill: send_done returned False (its ack
    # lost with the engine), the harness waits on wait_acked() as SPEC
    # "Shutdown order" says, and the next engine answers "run completed". The
    # engine applied this writer's Done and so every row before it: every
    # waiter is answered True, as send_done would have been.
    gate = asyncio.Event()
    streams: list[int] = []

    async def script(stream: RogueStream) -> None:
        streams.append(1)
        if len(streams) > 1:
            await stream.read()
            await stream.abort(grpc.StatusCode.FAILED_PRECONDITION, "run completed")
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.WhichOneof("body") == "done":
                await gate.wait()
                stream.end()  # applied, never acked
                return

    engine = RogueEngine(script)
    await engine.start()
    config = engine.channel_config(tmp_path / "wal", "late-word", "tok", done_ack_timeout_ms=200)
    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            first = ch.send_finding(finding(0))
            ch.send_finding(finding(1))  # never acked: the stream ends at Done
            assert not await ch.send_done("completed", 2, [], "")
            seq = None if target == "newest" else first
            if asleep:
                waiter = asyncio.ensure_future(ch.wait_acked(seq, timeout_ms=30_000))
                await eventually(lambda: ch.state is ChannelState.STREAMING)
                assert not waiter.done()
                gate.set()
                assert await waiter
            else:
                gate.set()
                await eventually(lambda: ch.log.completed)
                assert await ch.wait_acked(seq, timeout_ms=30_000)
            assert ch.log.completed and ch.unacked_count == 0
            assert ch.state is ChannelState.FAILED  # RunCompletedError: SPEC "Completion"
            assert not await ch.wait_acked(ch.stats().acked + 10, timeout_ms=0)  # never handed out
    finally:
        await engine.stop()


# -- one channel, two event loops (issue 13, item 5) ------------------------------------


@pytest.fixture
def engine_thread() -> Iterator[EngineThread]:
    e = EngineThread()
    yield e
    e.close()


LOOP_GONE = "belongs to an event loop that is closed"


@pytest.mark.parametrize("first_call", ["handshake", "send_finding", "stats", "close"])
def test_a_channel_whose_event_loop_is_gone_refuses_clearly_and_releases_its_log(
    engine_thread: EngineThread, tmp_path: Path, first_call: str
) -> None:
    engine = engine_thread.engine
    run_id, token = new_run(engine)
    wal = tmp_path / "wal"
    config = local_channel_config(engine, wal, run_id, token)

    async def first_life() -> GrpcEngineChannel:
        ch = GrpcEngineChannel(config)
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(ch.send_finding({"n": 1}), timeout_ms=10_000)
        return ch  # asyncio.run() ends without close()

    ch = asyncio.run(first_life())

    async def second_life() -> None:
        if first_call == "handshake":
            with pytest.raises(ChannelClosedError, match=LOOP_GONE):
                await ch.handshake("1", "h", "1")
        elif first_call == "send_finding":
            with pytest.raises(ChannelClosedError, match=LOOP_GONE):
                ch.send_finding({"n": 2})
        elif first_call == "stats":
            stats = ch.stats()
            assert stats.state is ChannelState.CLOSED
            # Closed as left open when the first asyncio.run() ended (SPEC "Cancellation").
            assert stats.last_error is not None and "left open" in stats.last_error
        await ch.close()  # never raises; idempotent
        await ch.close()
        # Every call now says why, instead of hanging or failing raw.
        with pytest.raises(ChannelClosedError, match=LOOP_GONE):
            ch.send_finding({"n": 3})
        with pytest.raises(ChannelClosedError, match=LOOP_GONE):
            await ch.wait_acked(timeout_ms=10)
        assert ch.stats().state is ChannelState.CLOSED

    asyncio.run(second_life())
    # The log is released: a new channel on a new loop takes the run over.

    async def third_life() -> None:
        async with GrpcEngineChannel(config) as again:
            await again.handshake("1", "h", "1")
            assert await again.wait_acked(again.send_finding({"n": 2}), timeout_ms=10_000)

    asyncio.run(third_life())
    assert engine.accepted(run_id) == [1, 2]


def test_a_channel_built_in_one_loop_and_first_awaited_in_another_works(
    engine_thread: EngineThread, tmp_path: Path
) -> None:
    engine = engine_thread.engine
    run_id, token = new_run(engine)
    config = local_channel_config(engine, tmp_path / "wal", run_id, token)

    async def build() -> GrpcEngineChannel:
        ch = GrpcEngineChannel(config)
        ch.send_finding({"n": 1})  # logged; no loop is bound before the first await
        return ch

    ch = asyncio.run(build())

    async def use() -> None:
        async with ch:
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(ch.send_finding({"n": 2}), timeout_ms=10_000)

    asyncio.run(use())
    assert engine.accepted(run_id) == [1, 2]


@pytest.mark.asyncio
async def test_an_engine_echoing_a_short_token_is_masked_whole_word_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 14: a short token was masked inside every word ("In***ernal"),
    # and the stream-end log line carried the echoed token unmasked.
    token = "t"
    streams: list[int] = []

    async def script(stream: RogueStream) -> None:
        streams.append(1)
        if len(streams) == 1:
            await stream.read()
            await stream.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"token {token} is not valid at the gate"
            )
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.WhichOneof("body") == "finding":
                stream.ack(msg.seq)

    engine = RogueEngine(script)
    await engine.start()
    config = engine.channel_config(tmp_path / "wal", "echo", token)
    try:
        with caplog.at_level(logging.DEBUG):
            async with GrpcEngineChannel(config) as ch:
                ch.send_finding(finding(0))
                await ch.handshake("1", "h", "1")
                assert await ch.wait_acked(timeout_ms=10_000)
                stored = ch.log.meta().last_error
                last = ch.stats().last_error
    finally:
        await engine.stop()
    expected = "token *** is not valid at the gate"
    assert last is not None and expected in last
    assert stored is not None and expected in stored
    assert expected in caplog.text
    assert f"token {token} is" not in caplog.text
    assert "UNAUTHENTICATED" in caplog.text  # "t" inside words is left alone


@pytest.mark.asyncio
async def test_a_refused_token_is_named_as_refused_at_the_handshake(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, _token = new_run(local_engine)
    wrong = "wrong-token-7f3a"
    config = local_channel_config(local_engine, tmp_path, run_id, wrong, connect_timeout_ms=2000)
    async with GrpcEngineChannel(config) as ch:
        with pytest.raises(EngineUnavailableError) as raised:
            await ch.handshake("1", "h", "1")
    # A new log's every dial refused: the run's own error (SPEC "Dial").
    assert isinstance(raised.value, RunRefusedError)
    text = str(raised.value)
    assert f"run {run_id}: every dial within 2000 ms was refused" in text, text
    assert "an unknown run or a wrong token" in text, text
    assert "UNAUTHENTICATED" in text, text
    assert wrong not in text


@pytest.mark.asyncio
async def test_an_engine_that_is_not_there_says_no_engine_answered_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = GrpcChannelConfig(
        grpc_addr=f"127.0.0.1:{port}",
        run_id="run-absent",
        correlation_id="c",
        run_token="tok-absent-1",
        wal_dir=tmp_path,
        connect_timeout_ms=1000,
    )

    def ends(level: int) -> int:
        return sum(
            r.levelno == level and "ended:" in r.getMessage() and r.name.startswith("walchannel")
            for r in caplog.records
        )

    with caplog.at_level(logging.INFO, logger="walchannel"):
        async with GrpcEngineChannel(config) as ch:
            with pytest.raises(EngineUnavailableError, match="no engine answered the handshake"):
                await ch.handshake("1", "h", "1")
            # Redialing a dead address: the same end is said once loudly, then quietly.
            await eventually(lambda: ends(logging.INFO) >= 2, timeout=30, what="repeats at INFO")
    assert ends(logging.WARNING) == 1, caplog.text


@pytest.mark.asyncio
async def test_waiting_for_acks_without_a_handshake_says_so(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(local_channel_config(local_engine, tmp_path, run_id, token)) as ch:
        seq = ch.send_finding({"n": 1})
        with caplog.at_level(logging.WARNING, logger="walchannel"):
            assert not await ch.wait_acked(seq, timeout_ms=100)
            assert not await ch.wait_acked(seq, timeout_ms=100)
        said = [r for r in caplog.records if "handshake() was never called" in r.getMessage()]
        assert len(said) == 1, caplog.text  # once, not per wait
        assert "handshake() was never called" in (ch.stats().last_error or "")
        assert ch.stats().unacked_count == 1  # logged all the same
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(seq, timeout_ms=30_000)
    assert local_engine.accepted(run_id) == [1]


def test_send_findings_names_the_batch_and_each_findings_index(tmp_path: Path) -> None:
    config = offline_config(tmp_path, "run-batch")

    async def main() -> None:
        async with GrpcEngineChannel(config) as ch:
            with pytest.raises(PayloadError, match=r"^findings: expected a list of findings"):
                ch.send_findings({"a": 1})  # type: ignore[arg-type]
            with pytest.raises(PayloadError, match=r"^findings\[1\]\.when: "):
                ch.send_findings([{"ok": 1}, {"when": object()}])
            assert ch.stats().unacked_count == 0  # nothing of a bad batch is logged

    asyncio.run(main())


def test_a_refused_finding_of_a_batch_is_named_by_its_index_for_every_rule(
    tmp_path: Path,
) -> None:
    # A harness drops findings[exc.index] and sends the rest (README): the
    # index must be there whichever rule refused the finding, the size too.
    config = offline_config(tmp_path, "run-index", max_message_bytes=64 * 1024)
    huge = {"blob": "x" * (128 * 1024)}

    async def main() -> None:
        async with GrpcEngineChannel(config) as ch:
            for batch, index, path in (
                ([{"ok": 1}, {"n": float("nan")}], 1, r"findings\[1\]\.n"),
                ([{"ok": 1}, {"ok": 2}, {"s": {1}}], 2, r"findings\[2\]\.s"),
                ([huge, {"ok": 1}], 0, r"findings\[0\]: encoded message is \d+ bytes"),
                ([{"ok": 1}, huge], 1, r"findings\[1\]: encoded message"),
            ):
                with pytest.raises(PayloadError, match=f"^{path}") as info:
                    ch.send_findings(batch, progress={"next": 1})
                assert info.value.index == index, info.value
            # Not a finding of a batch: no index.
            for send in (
                lambda: ch.send_finding(huge),
                lambda: ch.send_finding({"n": float("inf")}),
                lambda: ch.send_findings([{"ok": 1}], progress={"bad": float("nan")}),
            ):
                with pytest.raises(PayloadError) as info:
                    send()
                assert info.value.index is None, info.value
            assert ch.stats().unacked_count == 0 and ch.progress() is None
        memory = InMemoryEngineChannel()
        with pytest.raises(PayloadError, match=r"^findings\[1\]\.n") as info:
            memory.send_findings([{"ok": 1}, {"n": float("nan")}])
        assert info.value.index == 1

    asyncio.run(main())


def test_bad_arguments_are_named_and_log_nothing(tmp_path: Path) -> None:
    config = offline_config(tmp_path, "run-args")

    async def main() -> None:
        async with GrpcEngineChannel(config) as ch:
            first = ch.send_finding({"ok": 1})
            for bad in (None, 5):
                with pytest.raises(PayloadError, match=r"^findings: expected a list"):
                    ch.send_findings(bad)  # type: ignore[arg-type]
            for ts in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
                with pytest.raises(PayloadError, match=r"^event\.ts: .* out of range"):
                    ch.send_event("t", "info", {}, ts=ts)
            with pytest.raises(TypeError, match=r"wait_acked: seq must be an int, got str"):
                await ch.wait_acked("5", timeout_ms=10)  # type: ignore[arg-type]
            for timeout in (float("nan"), -1.0):
                with pytest.raises(ValueError, match=r"wait_acked: timeout_ms must be"):
                    await ch.wait_acked(timeout_ms=timeout)
                with pytest.raises(ValueError, match=r"request_approval: timeout_ms must be"):
                    await ch.request_approval("act", {}, timeout_ms=timeout)
            # Only the first row was logged; it is still there.
            assert ch.stats().unacked_count == 1 and log_of(ch).state.next_seq == first + 1

    asyncio.run(main())


def test_a_payload_of_shared_references_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    # 31 list objects, 2**30 values once expanded: walking or encoding all of
    # them would take hours and tens of GB. Each value costs >= 2 bytes as a
    # Struct, so past max_message_bytes / 2 values it can never travel.
    shared: list[Any] = [1]
    for _ in range(30):
        shared = [shared, shared]
    config = offline_config(tmp_path, "run-dag", max_message_bytes=64 * 1024)

    async def main() -> None:
        async with GrpcEngineChannel(config) as ch:
            with pytest.raises(PayloadError, match=r"^finding: more than 32768 values"):
                ch.send_finding({"tree": shared})
            with pytest.raises(PayloadError, match=r"^event\.payload: more than 32768 values"):
                ch.send_event("t", "info", {"tree": shared})
            with pytest.raises(PayloadError, match=r"^findings\[1\]: more than 32768 values"):
                ch.send_findings([{"ok": 1}, {"tree": shared}])
            with pytest.raises(PayloadError, match=r"^progress: more than 65536 values"):
                ch.send_finding({"ok": 1}, progress={"tree": shared})
            assert ch.send_finding({"flat": list(range(2_000))}) == 1  # a flat payload goes
            assert ch.stats().unacked_count == 1

    asyncio.run(main())


@pytest.mark.asyncio
async def test_an_idle_stream_sends_a_heartbeat_every_keepalive_period(tmp_path: Path) -> None:
    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.seq:
                stream.ack(msg.seq)

    engine = RogueEngine(script)
    await engine.start()
    config = engine.channel_config(tmp_path / "wal", "beats", "tok", keepalive_ms=1000)

    def beats() -> int:
        return sum(m.WhichOneof("body") == "heartbeat" for s in engine.streams for m in s.received)

    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            await eventually(lambda: beats() >= 2, timeout=30, what="two heartbeats while idle")
            # A data row resets nothing: the beats go on after it, on the same stream.
            assert await ch.wait_acked(ch.send_finding(finding(1)), timeout_ms=30_000)
            seen = beats()
            await eventually(lambda: beats() >= seen + 2, timeout=30, what="beats after a row")
            assert ch.stats().reconnects == 0
        # Each names the run at seq 0 and says when it was sent (RFC 3339 UTC:
        # SPEC "Wire contract").
        received = [m for s in engine.streams for m in s.received]
        for m in (m for m in received if m.WhichOneof("body") == "heartbeat"):
            assert (m.run_id, m.correlation_id, m.seq) == ("beats", config.correlation_id, 0)
            at = datetime.fromisoformat(m.heartbeat.ts)
            assert at.utcoffset() == timedelta(0) and abs(at.timestamp() - time.time()) < 600
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_replay_unacked_resends_the_rows_above_the_ack_and_says_how_many(
    tmp_path: Path,
) -> None:
    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.seq == 1:
                stream.ack(1)  # the rest stay unacked

    engine = RogueEngine(script)
    await engine.start()
    config = engine.channel_config(tmp_path / "wal", "replay", "tok")

    def seqs() -> list[int]:
        return [m.seq for s in engine.streams for m in s.received if m.seq]

    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(ch.send_finding(finding(1)), timeout_ms=10_000)
            for i in (2, 3, 4):
                ch.send_finding(finding(i))
            await eventually(lambda: seqs() == [1, 2, 3, 4], what="the rows written")
            assert ch.replay_unacked() == 3
            await eventually(lambda: seqs() == [1, 2, 3, 4, 2, 3, 4], what="the three again")
            assert ch.stats().replayed == 3 and ch.stats().reconnects == 0
            await engine.stop()
            await eventually(lambda: ch.state is not ChannelState.STREAMING, what="the drop")
            assert ch.replay_unacked() == 3  # no live stream: what the next dial re-sends
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_an_ack_below_a_waiters_target_does_not_wake_it(tmp_path: Path) -> None:
    # A cumulative ack costs O(1): wait_acked(N) is woken by the ack that
    # reaches N (or a change of state), not once per ack below it.
    release = asyncio.Event()

    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        while (msg := await stream.read()) is not None:
            if msg.seq == 40:
                await release.wait()
            if msg.seq:
                stream.ack(msg.seq)

    engine = RogueEngine(script)
    await engine.start()
    try:
        async with GrpcEngineChannel(engine.channel_config(tmp_path / "wal", "o1")) as ch:
            await ch.handshake("1", "h", "1")
            seqs = [ch.send_finding(finding(i)) for i in range(40)]
            waits = 0

            class CountingEvent(asyncio.Event):
                async def wait(self) -> Literal[True]:
                    nonlocal waits
                    waits += 1
                    return await super().wait()

            ch._waiters._acked_changed = CountingEvent()
            waiter = asyncio.create_task(ch.wait_acked(seqs[-1], timeout_ms=60_000))
            await eventually(lambda: ch.stats().acked == 39, timeout=30, what="acks 1..39")
            await asyncio.sleep(0)  # the waiter would run here if an ack had woken it
            assert waits == 1, f"the waiter waited {waits} times: acks below its target woke it"
            release.set()
            assert await waiter
            assert ch.stats().acked == 40
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_a_lost_log_with_rows_sent_before_its_handshake_follows_the_engine(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # The log is lost after 10 acked rows (a wiped folder, a new host); the
    # restarted harness logs 20 rows before its handshake. The engine's answer
    # Ack(10) moves them to 11..30 (SPEC "Dial": verification), and what goes
    # out must be those rows, read again: the in-memory tail holds them under
    # their old seqs (found by the simulator running the channel itself).
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    async with channel_for(local_engine, wal, run_id, token) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(10):
            ch.send_finding({"n": f"old-{i}"})
        assert await ch.wait_acked(timeout_ms=10_000)
    for leftover in wal.glob(f"{run_id}.wal.sqlite3*"):
        leftover.unlink()
    take_over(wal, run_id)  # else refused: the engine holds rows this new log never wrote
    async with channel_for(local_engine, wal, run_id, token) as ch:
        seqs = [ch.send_finding({"n": f"new-{i}"}) for i in range(20)]
        assert seqs == list(range(1, 21))  # provisional: the log starts afresh
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(seqs[-1], timeout_ms=10_000)
        assert ch.last_acked_seq == 30
    names = [b["body"]["fields"]["n"] for b in local_engine.bodies(run_id)]
    assert names == [f"old-{i}" for i in range(10)] + [f"new-{i}" for i in range(20)]
    assert local_engine.accepted(run_id) == list(range(1, 31))
    assert local_engine.duplicates(run_id) == 0 and local_engine.gaps(run_id) == []


@pytest.mark.asyncio
async def test_the_hard_deadline_passing_mid_stream_ends_the_stream_and_says_so(
    local_engine: LocalEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import walchannel.core.driver

    monkeypatch.setattr(walchannel.core.driver, "DEADLINE_LOOK_S", 0.1)
    run_id, token = new_run(local_engine)
    deadline = datetime.now().astimezone() + timedelta(seconds=3)  # the handshake first
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, hard_deadline=deadline
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        # No call asks: the deadline's timer finds it passed.
        await eventually(lambda: ch.state is ChannelState.EXPIRED, what="EXPIRED")
        assert ch.stats().last_error == "hard_deadline passed"
        assert f"run {run_id}: hard_deadline passed; the channel stops" in caplog.text
