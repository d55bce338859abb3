"""A row the engine refuses for its size (issue 13, item 3).

The engine's receive limit (``grpc.max_receive_message_length``) may be
below the client's ``max_message_bytes``. A row over it ends every stream
with RESOURCE_EXHAUSTED "Received message larger than max (N vs. M)"; the
channel must name it at once and set it aside (quarantine + a
``walchannel.row_lost`` event at its seq) so the rows behind it flow, and
must never set aside a row the engine did not prove it refuses. Real
LocalEngine on loopback, real log files.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from conftest import eventually, new_run
from walchannel import (
    ChannelState,
    EngineUnavailableError,
    GrpcEngineChannel,
    PayloadError,
    RowRefusedError,
    cli,
)
from walchannel.cli.inspection import inspect_log
from walchannel.config import GrpcChannelConfig
from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.driver import Driver
from walchannel.core.end_status import SizeRefusal, parse_size_refusal
from walchannel.core.engine_refusals import RefusalVerdict, pick_refused_row, refusal_sets_aside
from walchannel.errors import raw_message
from walchannel.log import RunLog
from walchannel.log.format import ROW_LOST_TYPE
from walchannel.log.reader import LogReader
from walchannel.log.state import FAILED_DONE_REFUSED, LogState
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.wire import messages
from walchannel.wire import protobuf as wire

LIMIT = 64 * 1024
BIG = {"big": "x" * 200_000}


def channel_for(
    engine: LocalEngine, wal: Path, run_id: str, token: str, **kw: Any
) -> GrpcEngineChannel:
    return GrpcEngineChannel(local_channel_config(engine, wal, run_id, token, **kw))


def encoded_size(ch: GrpcEngineChannel, seq: int, kind: str, body: dict[str, Any]) -> int:
    """The size of the UpMessage the engine receives for this row (bytes)."""
    cfg = ch.config
    return wire.up_message(cfg.run_id, cfg.correlation_id, seq, kind, body).ByteSize()


@pytest.mark.asyncio
async def test_a_row_refused_for_its_size_is_set_aside_named_and_later_rows_flow(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    async with LocalEngine(max_receive_message_bytes=LIMIT) as engine:
        run_id, token = new_run(engine)
        wal = tmp_path / "wal"
        ch = channel_for(engine, wal, run_id, token)
        try:
            await ch.handshake("1", "h", "1")
            assert ch.send_finding({"n": 0}) == 1
            assert ch.send_finding(BIG) == 2
            size = encoded_size(ch, 2, "finding", messages.finding_body(BIG))
            assert size > LIMIT
            for i in range(1, 6):
                ch.send_finding({"n": i})
            # Every row acked, rows 3..7 included, within a generous bound.
            assert await ch.wait_acked(7, timeout_ms=15_000)
            assert engine.accepted(run_id) == [1, 2, 3, 4, 5, 6, 7]
            bodies = engine.bodies(run_id)
            lost = bodies[1]
            assert lost["seq"] == 2 and lost["kind"] == "event"
            assert lost["body"]["type"] == ROW_LOST_TYPE
            assert lost["body"]["severity"] == "error"
            payload = lost["body"]["payload"]
            assert payload["seq"] == 2.0 and payload["kind"] == "finding"
            assert payload["size"] == float(size) and payload["limit"] == float(LIMIT)
            assert "refused by the engine" in payload["reason"]
            assert [b["body"]["fields"]["n"] for b in bodies[2:]] == [1.0, 2.0, 3.0, 4.0, 5.0]

            # The harness learns it from stats().
            stats = ch.stats()
            assert stats.quarantined == 1
            assert stats.last_error is not None
            assert "seq 2" in stats.last_error and str(LIMIT) in stats.last_error
            assert ch.state is ChannelState.STREAMING

            # The operator learns it from the log: ERROR with run id and seq, and a
            # WARNING naming the engine's limit; never the token.
            errors = [
                r.getMessage()
                for r in caplog.records
                if r.levelno == logging.ERROR and r.name.startswith("walchannel.channel")
            ]
            assert any(run_id in m and "seq 2" in m and str(LIMIT) in m for m in errors), errors
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert sum(str(LIMIT) in m and "max_message_bytes" in m for m in warnings) == 1
            assert token not in caplog.text

            # inspect, on the live run: its reason names the quarantined seq.
            report = inspect_log(ch.log.path)
            assert report.state == "active"
            assert report.quarantined == 1
            assert report.reason is not None and "seq 2" in report.reason
            assert "refused by the engine" in report.reason
            # The original row is kept, recoverable.
            assert ch.log.quarantined()[0][0] == 2
            path = ch.log.path
        finally:
            await ch.close()
    capsys.readouterr()
    assert cli.main(["inspect", str(path), "--show", "3"]) == 0
    shown = capsys.readouterr().out
    assert "quarantined seq 2" in shown and "finding" in shown
    out = tmp_path / "quarantine.jsonl"
    assert cli.main(["export", str(path), "--quarantined", "-o", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["seq"] == 2 and records[0]["kind"] == "finding"
    assert records[0]["body"] == {"fields": BIG}
    assert "refused by the engine" in records[0]["reason"]


@pytest.mark.asyncio
async def test_a_resource_exhausted_that_proves_no_row_sets_nothing_aside(
    tmp_path: Path,
) -> None:
    # Acks held back (a slow engine) so each big row is still in flight when
    # the stream is ended with a RESOURCE_EXHAUSTED status that proves nothing.
    async with LocalEngine(ack_every=1000, ack_idle_ms=60_000) as engine:
        run_id, token = new_run(engine)
        ch = channel_for(engine, tmp_path / "wal", run_id, token)

        async def in_flight_then_end(i: int, details: Callable[[int], str]) -> None:
            big = {"big": "x" * 200_000, "i": i}
            seq = ch.send_finding(big)
            size = encoded_size(ch, seq, "finding", messages.finding_body(big))
            await eventually(lambda: seq in engine.accepted(run_id), what=f"seq {seq} applied")
            assert ch.last_acked_seq < seq  # written, not acked: in flight
            reconnects = ch.stats().reconnects
            assert await engine.end_streams(
                run_id, grpc.StatusCode.RESOURCE_EXHAUSTED, details=details(size)
            )
            await eventually(
                lambda: ch.stats().reconnects > reconnects and ch.state is ChannelState.STREAMING,
                timeout=15,
                what="a reconnect",
            )

        try:
            await ch.handshake("1", "h", "1")
            ch.send_finding({"n": 0})
            cases: list[Callable[[int], str]] = [
                lambda size: "quota exceeded",  # not about size
                # a size that matches no in-flight row
                lambda size: f"SERVER: Received message larger than max ({size + 1} vs. {LIMIT})",
                lambda size: f"SERVER: Received message larger than max ({size} vs. {size})",
                # the client's own receive limit (a down message), exact size or not
                lambda size: (
                    "Stream removed (CLIENT: Received message larger than max "
                    f"({size} vs. {LIMIT}))"
                ),
                lambda size: f"grpc: message exceeds maximum size {LIMIT}: {size - 1}",
            ]
            for i, details in enumerate(cases):
                await in_flight_then_end(i, details)
                assert ch.stats().quarantined == 0, details(0)
                assert ch.stats().last_error is not None
            assert ch.log.quarantined() == []
            # Control: the same setup with the exact size is set aside, so the
            # cases above were not vacuous.
            await in_flight_then_end(
                99, lambda size: f"gRPC message exceeds maximum size {LIMIT}: {size}"
            )
            assert ch.stats().quarantined == 1
        finally:
            await ch.close()
        got = [b["body"] for b in engine.bodies(run_id)]
        assert [g["fields"]["i"] for g in got[1:]] == [0.0, 1.0, 2.0, 3.0, 4.0, 99.0]


@pytest.mark.asyncio
async def test_a_done_the_engine_refuses_stops_the_channel_with_a_clear_error(
    tmp_path: Path,
) -> None:
    # Done is the last row: nothing waits behind it, and replacing it by an
    # event would leave the run never completing. The channel stops, names it.
    async with LocalEngine(max_receive_message_bytes=LIMIT) as engine:
        run_id, token = new_run(engine)
        ch = channel_for(engine, tmp_path / "wal", run_id, token)
        try:
            await ch.handshake("1", "h", "1")
            ch.send_finding({"n": 0})
            with pytest.raises(RowRefusedError, match=r"seq 2 .*65536") as info:
                await asyncio.wait_for(ch.send_done("completed", 1, ["p" * 80_000], ""), timeout=20)
            assert (info.value.kind, info.value.seq, info.value.limit) == ("done", 2, LIMIT)
            assert info.value.size > LIMIT and info.value.path == str(ch.log.path)
            assert not isinstance(info.value, PayloadError)  # it was logged
            assert run_id in str(info.value)
            assert ch.state is ChannelState.FAILED
            assert ch.stats().last_error is not None and "seq 2" in ch.stats().last_error
            assert ch.log.quarantined() == []  # nothing set aside: the row stays
            assert ch.log.done_seq == 2  # the Done row stays in the log
            path = ch.log.path
        finally:
            await ch.close()
        assert engine.accepted(run_id) == [1]
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None and "seq 2" in report.reason


@pytest.mark.asyncio
async def test_an_approval_request_the_engine_refuses_fails_its_wait_and_rows_flow(
    tmp_path: Path,
) -> None:
    async with LocalEngine(max_receive_message_bytes=LIMIT) as engine:
        run_id, token = new_run(engine)
        ch = channel_for(engine, tmp_path / "wal", run_id, token)
        try:
            await ch.handshake("1", "h", "1")
            with pytest.raises(RowRefusedError, match="seq 1") as info:
                await asyncio.wait_for(
                    ch.request_approval("deploy", {"blob": "y" * 100_000}, request_id="r1"),
                    timeout=20,
                )
            assert (info.value.kind, info.value.seq) == ("approval_request", 1)
            assert "r1" in str(info.value)
            ch.send_finding({"n": 1})
            assert await ch.wait_acked(2, timeout_ms=15_000)
        finally:
            await ch.close()
        assert engine.accepted(run_id) == [1, 2]
        assert engine.bodies(run_id)[0]["body"]["type"] == ROW_LOST_TYPE


@pytest.mark.asyncio
async def test_a_row_logged_under_a_larger_max_message_bytes_is_still_delivered(
    tmp_path: Path,
) -> None:
    # The client's own limit judges new sends only: a row already in the log
    # (logged under a larger max_message_bytes) goes to the engine, which
    # decides. A client-side send cap would wedge it forever.
    async with LocalEngine() as engine:
        run_id, token = new_run(engine)
        wal = tmp_path / "wal"
        first = channel_for(engine, wal, run_id, token, max_message_bytes=1024 * 1024)
        first.send_finding({"big": "z" * 300_000})
        first.send_finding({"n": 2})
        await first.close()
        second = channel_for(engine, wal, run_id, token, max_message_bytes=128 * 1024)
        try:
            with pytest.raises(PayloadError, match="max_message_bytes"):
                second.send_finding({"big": "z" * 300_000})
            await second.handshake("1", "h", "1")
            assert await second.wait_acked(2, timeout_ms=15_000)
            assert second.stats().quarantined == 0
        finally:
            await second.close()
        assert engine.accepted(run_id) == [1, 2]
        assert engine.bodies(run_id)[0]["body"] == {"fields": {"big": "z" * 300_000}}


@pytest.mark.asyncio
async def test_a_handshake_the_engine_refuses_for_its_size_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with LocalEngine(max_receive_message_bytes=LIMIT) as engine:
        run_id, token = new_run(engine)
        ch = channel_for(engine, tmp_path / "wal", run_id, token, connect_timeout_ms=1_000)
        try:
            ch.send_finding({"n": 1})
            with pytest.raises(EngineUnavailableError):
                await ch.handshake("1", "h", "v" * 70_000)
            await eventually(
                lambda: "handshake" in (ch.stats().last_error or ""), what="named handshake"
            )
            assert ch.stats().quarantined == 0 and ch.log.quarantined() == []
        finally:
            await ch.close()
    assert any(
        r.levelno == logging.ERROR and run_id in r.getMessage() and "handshake" in r.getMessage()
        for r in caplog.records
    )


def test_local_engine_refuses_a_bad_receive_limit() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_receive_message_bytes"):
            LocalEngine(max_receive_message_bytes=bad)  # type: ignore[arg-type]


# -- the sans-I/O rules --------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        # gRPC C-core servers (Python, C++), with and without the side marker
        (
            "RESOURCE_EXHAUSTED",
            "SERVER: Received message larger than max (200035 vs. 65536)",
            SizeRefusal(200035, 65536),
        ),
        (
            "RESOURCE_EXHAUSTED",
            "Received message larger than max (200035 vs. 65536)",
            SizeRefusal(200035, 65536),
        ),
        # grpc-go and grpc-java servers
        (
            "RESOURCE_EXHAUSTED",
            "grpc: received message larger than max (70000 vs. 65536)",
            SizeRefusal(70000, 65536),
        ),
        (
            "RESOURCE_EXHAUSTED",
            "gRPC message exceeds maximum size 65536: 70000",
            SizeRefusal(70000, 65536),
        ),
        # not a refusal of an up-message for its size
        ("RESOURCE_EXHAUSTED", "quota exceeded", None),
        ("RESOURCE_EXHAUSTED", "", None),
        ("RESOURCE_EXHAUSTED", None, None),
        ("INTERNAL", "Received message larger than max (200035 vs. 65536)", None),
        (None, "Received message larger than max (200035 vs. 65536)", None),
        # the client's own receive limit: a down message too large for us
        (
            "RESOURCE_EXHAUSTED",
            "Stream removed (CLIENT: Received message larger than max (5242911 vs. 4194304))",
            None,
        ),
        # sizes that do not say "over the limit"
        ("RESOURCE_EXHAUSTED", "Received message larger than max (100 vs. 100)", None),
        ("RESOURCE_EXHAUSTED", "Received message larger than max (99 vs. 100)", None),
    ],
)
def test_parse_size_refusal(code: str | None, details: str | None, expected: Any) -> None:
    assert parse_size_refusal(code, details) == expected


def test_pick_refused_row_sets_aside_only_a_proven_row() -> None:
    refusal = SizeRefusal(received=200_000, limit=65_536)
    # The first row over the limit, with exactly the refused size.
    assert pick_refused_row([(3, 10), (4, 200_000), (5, 10)], refusal) == RefusalVerdict(
        4, 4, 200_000
    )
    # The first row over the limit decides: a later exact match was never read
    # by the engine (it stops at the first), so nothing is proven.
    assert pick_refused_row([(3, 70_000), (4, 200_000)], refusal) == RefusalVerdict(None, 3, 70_000)
    # No row over the limit: nothing (e.g. the handshake, or a proxy's limit).
    assert pick_refused_row([(3, 10), (4, 65_536)], refusal) == RefusalVerdict(None)
    assert pick_refused_row([], refusal) == RefusalVerdict(None)
    # Read lazily: nothing after the first row over the limit is sized.
    sized: list[int] = []

    def rows() -> Iterator[tuple[int, int]]:
        for seq, size in [(1, 10), (2, 200_000), (3, 5)]:
            sized.append(seq)
            yield seq, size

    assert pick_refused_row(rows(), refusal).seq == 2 and sized == [1, 2]


def test_only_done_stops_the_channel() -> None:
    assert refusal_sets_aside("finding") and refusal_sets_aside("event")
    assert refusal_sets_aside("approval_request")
    assert not refusal_sets_aside("done")


def test_a_held_seq_is_never_written() -> None:
    log = SimpleNamespace(state=LogState("r", 6, 0, None, None, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    driver = Driver(config, log, failed_mark=False, now_ms=0.0)
    driver.handle(ev.LoopStarted())
    assert act.StartStream(1) in driver.handle(ev.Answered(0, 0.0))
    error = RowRefusedError("refused", run_id="r", seq=3, kind="done", size=9, limit=8, path="p")
    assert not driver.handle(ev.DoneRefused(3, error))  # rows 1 and 2 are not acked yet
    written = []
    while (seq := driver.next_to_write()) is not None:
        written.append(seq)
        driver.handle(ev.Writing(seq))
        driver.handle(ev.Written(seq))
    assert written == [1, 2]
    first = driver.handle(ev.AckReceived(1, 1.0))
    assert act.ACK_MOVED in first and not any(isinstance(a, act.StoreFailure) for a in first)
    actions = driver.handle(ev.AckReceived(2, 1.0))
    assert act.StoreFailure(FAILED_DONE_REFUSED) in actions
    assert act.EndStream(raw_message(error)) in actions
    assert driver.failure is error and driver.state is ChannelState.FAILED
    assert list(driver.handle(ev.AckReceived(2, 2.0))) == [act.StaleAck(2, 2)]  # stopped once


# -- the log ----------------------------------------------------------------------


def test_set_aside_keeps_the_row_in_the_quarantine_and_sends_row_lost(tmp_path: Path) -> None:
    with RunLog.open(tmp_path, "r1", correlation_id="c") as wal:
        wal.append("finding", {"fields": {"n": 1}})
        wal.append("finding", {"fields": {"big": "x" * 1000}})
        wal.append("finding", {"fields": {"n": 3}})
        before = wal.unacked_bytes
        sub = wal.set_aside(2, "too big for the engine", kind="finding", size=1234, limit=100)
        assert sub.seq == 2 and sub.kind == "event"
        assert sub.body["type"] == ROW_LOST_TYPE and sub.body["severity"] == "error"
        assert sub.body["payload"] == {
            "seq": 2,
            "reason": "too big for the engine",
            "kind": "finding",
            "size": 1234,
            "limit": 100,
        }
        rows = list(wal.unacked())
        assert [r.seq for r in rows] == [1, 2, 3] and rows[1].body == sub.body
        assert wal.unacked_bytes == sum(r.size for r in rows) < before
        assert wal.quarantined() == [(2, "too big for the engine")]
        assert wal.quarantined_count == 1
        with pytest.raises(ValueError, match="seq 9"):
            wal.set_aside(9, "no such row")
        wal.ack(3)
        with pytest.raises(ValueError, match="seq 2"):
            wal.set_aside(2, "acked already")
        wal.append(
            "done", {"status": "completed", "findings": 3, "coverage": [], "exit_reason": ""}
        )
        with pytest.raises(ValueError, match="Done"):
            wal.set_aside(4, "never")
        wal.ack(4)
        assert wal.completed
    # The tombstone keeps the original body, recoverable.
    with RunLog.open(tmp_path, "r1", correlation_id="c") as wal:
        assert wal.quarantined_count == 1
    with LogReader(tmp_path / "r1.wal.sqlite3") as reader:
        (q,) = list(reader.quarantined())
    assert q.seq == 2 and q.kind == "finding" and q.body == {"fields": {"big": "x" * 1000}}
    assert q.raw is None and q.reason == "too big for the engine"


def test_prune_keeps_a_tombstone_whose_quarantine_holds_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RunLog.open(tmp_path, "r2", correlation_id="c") as wal:
        wal.append("finding", {"fields": {"big": "x" * 1000}})
        wal.set_aside(1, "refused by the engine for its size", kind="finding", size=1, limit=0)
        wal.append(
            "done", {"status": "completed", "findings": 1, "coverage": [], "exit_reason": ""}
        )
        wal.ack(2)
        assert wal.completed
    path = tmp_path / "r2.wal.sqlite3"
    capsys.readouterr()
    assert cli.main(["prune", str(tmp_path), "--older-than", "0"]) == 0
    out = capsys.readouterr()
    assert path.exists()
    assert f"kept {path}" in out.err and "1 row(s)" in out.err and "--quarantined" in out.err
    report = inspect_log(path)
    assert report.state == "completed" and report.quarantined == 1
    assert report.reason is not None and "seq 1" in report.reason
    assert cli.main(["prune", str(tmp_path), "--older-than", "0", "--include-quarantined"]) == 0
    assert not path.exists() and f"removed {path}" in capsys.readouterr().out
