"""A down message over the channel's receive limit (issue "Hostile inputs", item 4).

An engine that sends a 5 MiB ``BudgetUpdate`` after every handshake answer
used to end every stream at gRPC's default receive limit (4 MiB), with no
setting to raise it: 0 of 300 rows delivered, the cause shown only as gRPC's
``RESOURCE_EXHAUSTED`` text. Now ``max_receive_message_bytes`` (SPEC "The
channel", configuration table) sets ``grpc.max_receive_message_length``; the
channel keeps retrying with backoff (a ``BudgetUpdate`` never halts a run),
names the option in ``last_error`` and ``inspect``, said once at ERROR; with
the option raised every row is delivered. Every kind of down message is a
member: ``BudgetUpdate`` (a scripted engine), ``Stop`` and
``ApprovalDecision`` (the local engine re-sends both after every handshake).

``walchannel flush`` builds its own config: ``--max-receive-message-bytes``
raises its limit; stuck on it, flush names the flag, and inspect's flush
step carries it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from conftest import PYTHON, child_env, eventually, new_run
from helpers.rogue import RogueEngine, RogueStream
from walchannel import ChannelState, GrpcChannelConfig, GrpcEngineChannel
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.cli import main
from walchannel.core import events as ev
from walchannel.core.driver import Driver, End
from walchannel.core.end_status import DownTooLarge, describe_end, parse_receive_limit
from walchannel.log.state import LogState
from walchannel.log.writer import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

MiB = 1024 * 1024
BIG = 5 * MiB
ROWS = 300
NAMED = f"max_receive_message_bytes ({4 * MiB})"


class BudgetEngine:
    """A real grpc.aio engine that sends a 5 MiB ``BudgetUpdate`` after every handshake answer.

    Otherwise a plain engine: it applies ``seq == h + 1`` only, answers every
    handshake and heartbeat with ``Ack(h)`` and acks every row it applied.
    """

    def __init__(self) -> None:
        details = Struct()
        details.update({"blob": "x" * BIG, "spent": 12.5})
        self.update = pb.DownMessage(
            budget_update=pb.BudgetUpdate(message="budget raised", details=details)
        )
        assert self.update.ByteSize() > BIG
        self.h = 0
        self.applied: list[int] = []
        self.rogue = RogueEngine(self._script)

    async def _script(self, stream: RogueStream) -> None:
        msg = await stream.read()
        if msg is None or msg.WhichOneof("body") != "handshake":
            return
        stream.ack(self.h)
        stream.send(self.update)
        while (msg := await stream.read()) is not None:
            if msg.seq == self.h + 1:
                self.h = msg.seq
                self.applied.append(msg.seq)
            stream.ack(self.h)

    @property
    def dials(self) -> int:
        return len(self.rogue.streams)


def said(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= level and text in r.getMessage() and r.name.startswith("walchannel")
    ]


def attempts(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The attempt numbers of the channel's "reconnecting in ... (attempt N)" lines, in order."""
    return [
        int(r.args[2])  # type: ignore[index]
        for r in caplog.records
        if r.name.startswith("walchannel.channel") and r.msg.startswith("run %s: reconnecting in")
    ]


def inspect_output(wal: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["inspect", str(wal), *args])
    return rc, capsys.readouterr().out


async def stuck_on_the_limit(
    ch: GrpcEngineChannel, dials: Callable[[], int], caplog: pytest.LogCaptureFixture
) -> None:
    """Wait for several dials refused by the receive limit; check what the channel says."""
    await eventually(lambda: dials() >= 5, timeout=30, what="five dials")
    await eventually(
        lambda: NAMED in (ch.stats().last_error or ""), timeout=10, what="last_error names it"
    )
    stats = ch.stats()
    last_error = stats.last_error or ""
    assert "raise it in the config" in last_error, last_error
    assert stats.state is not ChannelState.FAILED, stats
    assert stats.unacked_count > 0, stats
    # Said once at ERROR however many streams it ended; the rest at INFO.
    assert len(said(caplog, logging.ERROR, "max_receive_message_bytes")) == 1
    assert len(said(caplog, logging.WARNING, "Received message larger than max")) == 1
    # The backoff grows from stream to stream: no reset, no tight loop.
    seen = attempts(caplog)
    assert len(seen) >= 4 and seen == list(range(1, len(seen) + 1)), seen


@pytest.mark.asyncio
async def test_a_budget_update_over_the_receive_limit_is_named_retried_and_delivered_once_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel")
    engine = BudgetEngine()
    await engine.rogue.start()
    wal = tmp_path / "wal"
    config = engine.rogue.channel_config(wal, "budget-run")
    try:
        # (a) The default limit: every stream ends on the update; the run goes on.
        ch = GrpcEngineChannel(config)
        try:
            await ch.handshake("1", "h", "1")
            seqs = ch.send_findings([{"n": i} for i in range(ROWS)])
            await stuck_on_the_limit(ch, lambda: engine.dials, caplog)
        finally:
            await ch.close()
        # Nothing lost: what the engine did not apply is still in the log.
        with RunLog.open(wal, "budget-run", correlation_id=config.correlation_id) as log:
            kept = [row.seq for row in log.unacked()]
        assert sorted(set(engine.applied) | set(kept)) == seqs
        assert kept, "every row delivered despite the limit"
        # inspect names the option, in both forms.
        rc, out = inspect_output(wal, capsys, "--json")
        (report,) = json.loads(out)
        assert rc == 1 and report["state"] == "orphaned" and NAMED in report["last_error"]
        rc, out = inspect_output(wal, capsys)
        assert rc == 1 and NAMED in out and "raise it in the config" in out

        # (b) The limit raised: the same log resumes, every row is acked once,
        # and the callback gets the update.
        updates: list[tuple[str, dict[str, Any]]] = []
        raised = engine.rogue.channel_config(wal, "budget-run", max_receive_message_bytes=8 * MiB)
        async with GrpcEngineChannel(raised) as ch:
            ch.on_budget_update(lambda message, details: updates.append((message, details)))
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(timeout_ms=20_000)
            await eventually(lambda: updates, what="the budget update")
            assert ch.unacked_count == 0 and ch.stats().state is ChannelState.STREAMING
        assert engine.applied == seqs
        message, details = updates[0]
        assert message == "budget raised"
        assert details["spent"] == 12.5 and len(details["blob"]) == BIG
    finally:
        await engine.rogue.stop()


@pytest.mark.parametrize("kind", ["stop", "approval_decision"])
@pytest.mark.asyncio
async def test_a_stop_or_decision_over_the_receive_limit_behaves_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel")
    reason = "r" * BIG
    async with LocalEngine() as engine:
        run_id, token = new_run(engine)
        # Stored by the engine and re-sent after every handshake.
        if kind == "stop":
            await engine.send_stop(run_id, reason)
        else:
            await engine.decide_approval(run_id, "big-1", True, reason)
        wal = tmp_path / "wal"
        config = local_channel_config(engine, wal, run_id, token)
        ch = GrpcEngineChannel(config)
        stops: list[str] = []
        ch.on_stop(stops.append)
        try:
            await ch.handshake("1", "h", "1")
            seqs = ch.send_findings([{"n": i} for i in range(ROWS)])
            await stuck_on_the_limit(ch, lambda: ch.stats().reconnects + 1, caplog)
            assert not stops
        finally:
            await ch.close()
        assert set(engine.accepted(run_id)) < set(seqs)

        raised = local_channel_config(engine, wal, run_id, token, max_receive_message_bytes=8 * MiB)
        async with GrpcEngineChannel(raised) as ch:
            ch.on_stop(stops.append)
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(timeout_ms=20_000)
            if kind == "stop":
                await eventually(lambda: stops, what="the Stop")
                assert stops == [reason]
            else:
                # The decision came before the acks of the rows left (the
                # engine's order): answered from the cache, no new row.
                next_seq = ch.log.next_seq
                decision = await ch.request_approval("act", {}, request_id="big-1", timeout_ms=1)
                assert decision.approved and decision.reason == reason
                assert ch.log.next_seq == next_seq
        assert engine.accepted(run_id) == seqs


class CompressedEngine(BudgetEngine):
    """As :class:`BudgetEngine`, but its down message goes gzipped: 5 MiB that travel as KiB.

    gRPC inflates it past the limit and says only "Decompressed message
    larger than max", with no sizes (issue 57, part 2).
    """

    def __init__(self, body: str) -> None:
        super().__init__()
        if body == "stop":
            self.update = pb.DownMessage(stop=pb.Stop(reason="s" * BIG))
        assert self.update.ByteSize() > BIG

    async def _script(self, stream: RogueStream) -> None:
        stream.context.set_compression(grpc.Compression.Gzip)
        await super()._script(stream)


@pytest.mark.parametrize("body", ["budget_update", "stop"])
@pytest.mark.asyncio
async def test_a_compressed_down_message_over_the_limit_is_named_as_an_uncompressed_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: str
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel")
    engine = CompressedEngine(body)
    await engine.rogue.start()
    wal = tmp_path / "wal"
    config = engine.rogue.channel_config(wal, "gz-run")
    try:
        ch = GrpcEngineChannel(config)
        stops: list[str] = []
        ch.on_stop(stops.append)
        try:
            await ch.handshake("1", "h", "1")
            ch.send_findings([{"n": i} for i in range(ROWS)])
            await eventually(lambda: engine.dials >= 4, timeout=30, what="four dials")
            await eventually(
                lambda: NAMED in (ch.stats().last_error or ""), timeout=10, what="named"
            )
            last_error = ch.stats().last_error or ""
            assert "compressed" in last_error and "raise it in the config" in last_error
            assert "gRPC gives no size" in last_error, last_error
            assert ch.stats().state is not ChannelState.FAILED and not stops
            assert len(said(caplog, logging.ERROR, "max_receive_message_bytes")) == 1
        finally:
            await ch.close()
        # Raised, the same log delivers every row and the message is acted on.
        raised = engine.rogue.channel_config(wal, "gz-run", max_receive_message_bytes=8 * MiB)
        async with GrpcEngineChannel(raised) as ch:
            ch.on_stop(stops.append)
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(timeout_ms=20_000)
            if body == "stop":
                await eventually(lambda: stops, what="the Stop")
        assert engine.applied == list(range(1, ROWS + 1))
    finally:
        await engine.rogue.stop()


# -- the rule, without I/O ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        # grpcio's client (C-core): our own limit.
        (
            "RESOURCE_EXHAUSTED",
            "Stream removed (CLIENT: Received message larger than max (5242890 vs. 4194304))",
            (5242890, 4194304),
        ),
        ("RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max", (None, None)),
        # Compressed: gRPC inflates it past the limit and gives no sizes.
        ("RESOURCE_EXHAUSTED", "Decompressed message larger than max", (None, None, True)),
        (
            "RESOURCE_EXHAUSTED",
            "Stream removed (CLIENT: Decompressed message larger than max)",
            (None, None, True),
        ),
        ("INTERNAL", "Decompressed message larger than max", None),
        # The engine's limit (an up-message refused), a quota, another code: not ours.
        ("RESOURCE_EXHAUSTED", "SERVER: Received message larger than max (900 vs. 500)", None),
        ("RESOURCE_EXHAUSTED", "Received message larger than max (900 vs. 500)", None),
        ("RESOURCE_EXHAUSTED", "quota exceeded", None),
        ("INTERNAL", "CLIENT: Received message larger than max (900 vs. 500)", None),
        (None, "CLIENT: Received message larger than max (900 vs. 500)", None),
        ("RESOURCE_EXHAUSTED", None, None),
    ],
)
def test_parse_receive_limit_reads_only_the_clients_own_limit(
    code: str | None, details: str | None, expected: Any
) -> None:
    found = parse_receive_limit(code, details)
    assert found == (None if expected is None else DownTooLarge(*expected))


def test_a_status_grpc_lost_to_a_write_keeps_the_receive_limit_as_the_cause() -> None:
    """grpc/grpc#36066 replaces the status of about a third of such ends with INTERNAL."""
    log = SimpleNamespace(state=LogState("r", 6, 0, None, None, False))
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id="r", correlation_id="c", run_token="t"
    )
    d = Driver(config, log, failed_mark=False, now_ms=0.0)  # type: ignore[arg-type]
    lost = ("INTERNAL", "Internal error from Core")
    assert d._end(*lost).end is End.RECONNECT  # nothing known yet: said as it is
    hit = "Stream removed (CLIENT: Received message larger than max (5242890 vs. 4194304))"
    plan = d._end("RESOURCE_EXHAUSTED", hit)
    assert plan.end is End.DOWN_TOO_LARGE and plan.too_large == DownTooLarge(5242890, 4194304)
    plan = d._end(*lost)
    assert plan.end is End.DOWN_TOO_LARGE and plan.too_large == DownTooLarge(5242890, 4194304)
    # Another known end replaces it.
    assert d._end("UNAVAILABLE", "Socket closed").end is End.RECONNECT
    assert d._end(*lost).end is End.RECONNECT
    # An ack of a row written on a stream proves the limit no longer bites.
    d._end("RESOURCE_EXHAUSTED", hit)
    d._move(ChannelState.CONNECTING)
    d._stream_up(1, 0.0)
    d.handle(ev.Written(1))
    d._ack(1, 1.0)
    assert d._end(*lost).end is End.RECONNECT
    assert "grpc/grpc#36066" in describe_end(*lost)


# -- walchannel flush --------------------------------------------------------------------


async def flush_cli(*args: str | Path, token: str) -> tuple[int, str, str]:
    """Run ``python -m walchannel flush ARGS`` for real, the token in an environment variable."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "walchannel",
        "flush",
        *map(str, args),
        "--token-env",
        "TOKEN",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(TOKEN=token),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    assert token not in out.decode() + err.decode()
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.asyncio
async def test_flush_raises_the_receive_limit_with_a_flag_and_names_it_when_stuck(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine re-sending a 5 MiB Stop after every handshake: flush's own flag gets through."""
    async with LocalEngine() as engine:
        run_id, token = new_run(engine)
        await engine.send_stop(run_id, "r" * BIG)
        with RunLog.open(tmp_path, run_id, correlation_id=f"corr-{run_id}") as wal:
            wal.update_meta(connector_version="1", harness_name="h", harness_version="1")
            wal.update_meta(token_sha256=hashlib.sha256(token.encode()).hexdigest())
            seqs = [
                wal.append("finding", {"fields": {"n": i, "pad": "x" * 200}}) for i in range(ROWS)
            ]
        log = tmp_path / f"{run_id}.wal.sqlite3"
        addr = ("--grpc-addr", engine.grpc_addr)

        # The default limit: every stream ends on the Stop; flush says which flag raises it.
        rc, out, err = await flush_cli(log, *addr, "--timeout", "15", token=token)
        assert rc == 1, (out, err)
        last = err.strip().splitlines()[-1]
        assert "max_receive_message_bytes (4194304)" in last, err
        assert "--max-receive-message-bytes" in last, err
        assert set(engine.accepted(run_id)) < set(seqs)
        # inspect's flush step carries the flag: as printed, it would get through.
        capsys.readouterr()
        assert main(["inspect", str(log), "--json"]) == 1
        (report,) = json.loads(capsys.readouterr().out)
        assert report["state"] == "orphaned", report
        assert "--max-receive-message-bytes 6291456'" in report["next_step"], report

        # Raised: every row is applied, once.
        rc, out, err = await flush_cli(
            log, *addr, "--max-receive-message-bytes", str(8 * MiB), "--timeout", "60", token=token
        )
        assert rc == 0, err
        assert f"flushed run {run_id}" in out
        assert engine.accepted(run_id) == seqs


@pytest.mark.parametrize("bad", ["0", "-1", "4MiB", "1.5"])
def test_flush_refuses_a_bad_receive_limit_naming_the_flag(tmp_path: Path, bad: str) -> None:
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "walchannel",
            "flush",
            str(tmp_path / "r.wal.sqlite3"),
            "--grpc-addr",
            "127.0.0.1:1",
            "--max-receive-message-bytes",
            bad,
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert "argument --max-receive-message-bytes: " in proc.stderr, proc.stderr
