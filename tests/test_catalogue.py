"""The bad-input and security catalogue: one test per row of docs/security.md.

Every hostile or broken input ends in a clear error that names the problem,
with no accepted message lost and no secret exposed. Permission cases run
in a forked child that drops to an unprivileged uid without exec (CI runs
as root, and Python lives under a 0700 home, so an exec'd child of another
uid could not even start); resource-limit cases run in a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import logging
import math
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import HELPERS, PYTHON, child_env, eventually, new_run, while_progressing
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from helpers.users import as_user
from walchannel import (
    ChannelState,
    GrpcEngineChannel,
    PayloadError,
    WalCorruptError,
)
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.cli import main
from walchannel.config import GrpcChannelConfig
from walchannel.log import RunLog
from walchannel.log.format import ROW_LOST_TYPE
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.transport.grpc import token_tracers

NOBODY = 65534


# -- payloads -------------------------------------------------------------------------

PAYLOAD_ROWS = {
    "int_above_2_53": ({"v": 2**53 + 1}, "finding.v"),
    "int_below_minus_2_53": ({"v": -(2**53) - 1}, "finding.v"),
    "nan": ({"v": [0, math.nan]}, "finding.v[1]"),
    "infinity": ({"v": {"w": math.inf}}, "finding.v.w"),
    "bytes": ({"v": b"raw"}, "finding.v"),
    "set": ({"v": {1}}, "finding.v"),
    "datetime": ({"v": datetime.datetime.now(datetime.UTC)}, "finding.v"),
    "custom_object": ({"v": object()}, "finding.v"),
    "non_str_key": ({"v": {3: "x"}}, "finding.v[3]"),
    "lone_surrogate": ({"v": "ok\ud83d"}, "finding.v"),
}


@pytest.mark.parametrize("row", sorted(PAYLOAD_ROWS))
@pytest.mark.asyncio
async def test_payload_rule_names_the_path_uses_no_seq_and_keeps_order(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine, row: str
) -> None:
    payload, path = PAYLOAD_ROWS[row]
    ch = engine_channel
    await ch.handshake("1", "catalogue", "1")
    assert ch.send_finding({"before": 1}) == 1
    with pytest.raises(PayloadError) as info:
        ch.send_finding(payload)
    assert info.value.path == path
    assert ch.send_finding({"after": 1}) == 2
    assert await ch.wait_acked(timeout_ms=5000)
    bodies = local_engine.bodies(ch.config.run_id)
    assert [b["body"]["fields"] for b in bodies] == [{"before": 1.0}, {"after": 1.0}]


@pytest.mark.asyncio
async def test_payload_nested_at_the_limit_travels_and_one_deeper_is_refused(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    def nested(depth: int) -> dict[str, Any]:
        value: dict[str, Any] = {"leaf": True}
        for _ in range(depth - 1):
            value = {"d": value}
        return value

    ch = engine_channel
    await ch.handshake("1", "catalogue", "1")
    ch.send_finding(nested(32))
    with pytest.raises(PayloadError, match="deeper than 32"):
        ch.send_finding(nested(33))
    deep: Any = 0
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(PayloadError, match="deeper"):
        ch.send_finding({"deep": deep})  # no RecursionError
    assert await ch.wait_acked(timeout_ms=5000)
    assert local_engine.accepted(ch.config.run_id) == [1]


@pytest.mark.asyncio
async def test_payload_just_under_and_just_over_max_message_bytes(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    limit = 64 * 1024
    config = local_channel_config(local_engine, tmp_path, run_id, token, max_message_bytes=limit)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "catalogue", "1")
        # Find the largest text that fits: encoded size grows by one per char.
        size = limit - 200
        while True:
            try:
                ch.send_finding({"blob": "x" * (size + 1)})
            except PayloadError:
                break
            size += 1
            await ch.wait_acked(timeout_ms=5000)
        with pytest.raises(PayloadError, match="max_message_bytes") as info:
            ch.send_finding({"blob": "x" * (size + 50)})
        assert info.value.path == "finding"
        assert await ch.wait_acked(timeout_ms=5000)
        accepted = local_engine.accepted(run_id)
        assert accepted == list(range(1, len(accepted) + 1)) and accepted


# -- discovery ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "answer"),
    [
        ("empty_body", b""),
        ("url_instead_of_host_port", b"http://127.0.0.1:1"),
        ("host_without_port", b"engine"),
        ("port_out_of_range", b"127.0.0.1:70000"),
        ("json_of_the_wrong_shape", b'{"address": "127.0.0.1:1"}'),
    ],
)
@pytest.mark.asyncio
async def test_discovery_bad_answer_is_logged_and_the_last_address_kept(
    local_engine: LocalEngine,
    tmp_path: Path,
    row: str,
    answer: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from helpers.http_answer import serve_answer

    run_id, token = new_run(local_engine)
    with serve_answer(answer) as http_addr:
        config = local_channel_config(local_engine, tmp_path, run_id, token, http_addr=http_addr)
        caplog.set_level(logging.WARNING, logger="walchannel.channel")
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "catalogue", "1")
            await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
            await eventually(lambda: "discovery failed" in caplog.text, what="discovery failure")
            ch.send_finding({"n": 1})
            assert await ch.wait_acked(timeout_ms=10_000)
            assert f"keeping {local_engine.grpc_addr}" in caplog.text


@pytest.mark.asyncio
async def test_discovery_address_outside_allowed_hosts_is_never_dialled(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from helpers.http_answer import serve_answer

    trap = socket.socket()
    trap.bind(("127.0.0.2", 0))
    trap.listen(8)
    trap.setblocking(False)
    run_id, token = new_run(local_engine)
    answer = f"127.0.0.2:{trap.getsockname()[1]}".encode()
    with serve_answer(answer) as http_addr:
        config = local_channel_config(
            local_engine, tmp_path, run_id, token, http_addr=http_addr, allowed_hosts=["127.0.0.1"]
        )
        caplog.set_level(logging.WARNING, logger="walchannel.channel")
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "catalogue", "1")
            for i in range(3):
                await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
                # Each end makes a rediscovery; the next cut waits for the re-dial's stream.
                await eventually(
                    lambda i=i: ch.stats().reconnects > i and ch.state is ChannelState.STREAMING,
                    what=f"reconnect {i + 1}",
                )
            ch.send_finding({"n": 1})
            assert await ch.wait_acked(timeout_ms=10_000)
    with pytest.raises(BlockingIOError):
        trap.accept()  # nobody ever connected
    trap.close()
    assert "not in allowed_hosts" in caplog.text


# -- engine misbehaviour ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def rogue_channel(
    script: Callable[[RogueStream], Any], tmp_path: Path, **kw: Any
) -> AsyncIterator[tuple[RogueEngine, GrpcEngineChannel]]:
    """A RogueEngine playing ``script`` and an open channel to it; both closed, pass or fail."""
    engine = RogueEngine(script)
    await engine.start()
    try:
        config = engine.channel_config(
            tmp_path / "wal", "rogue-run", "tok-" + secrets.token_hex(8), **kw
        )
        async with GrpcEngineChannel(config) as ch:
            yield engine, ch
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_engine_ack_above_the_high_water_is_a_counted_protocol_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Never logged, so never written: the stream is ended and dialed again
    # (tests/test_engine_lies.py has the other lies).
    lied: list[int] = []

    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        await stream.read()
        if not lied:
            lied.append(1000)
            stream.ack(1000)
        stream.ack(1)

    async with rogue_channel(script, tmp_path) as (engine, ch):
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(1, timeout_ms=5000)
        assert ch.stats().protocol_errors == 1
        assert ch.last_acked_seq == 1
        assert len(engine.streams) == 2
        assert "Ack(1000) covers rows never written: beyond seq 1" in caplog.text


@pytest.mark.asyncio
async def test_engine_ack_going_backwards_changes_nothing(tmp_path: Path) -> None:
    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        await stream.read()
        await stream.read()
        stream.ack(2)
        stream.ack(1)
        stream.ack(0)
        # Down messages are handled in order: once this Stop is seen, so were the acks.
        stream.send(pb.DownMessage(stop=pb.Stop(reason="after the stale acks")))

    async with rogue_channel(script, tmp_path) as (_, ch):
        stops: list[str] = []
        ch.on_stop(stops.append)
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        ch.send_finding({"n": 2})
        assert await ch.wait_acked(timeout_ms=5000)
        await eventually(lambda: stops, what="the Stop sent after the stale acks")
        assert ch.last_acked_seq == 2 and ch.stats().protocol_errors == 0


@pytest.mark.asyncio
async def test_engine_unknown_body_stop_reason_and_decision_id_are_handled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        stream.send(pb.DownMessage())  # no body at all
        stream.send(pb.DownMessage.FromString(b"\x2a\x00"))  # field 5: unknown to us
        stream.send(pb.DownMessage(stop=pb.Stop(reason="solar-flare")))
        stream.send(
            pb.DownMessage(
                approval_decision=pb.ApprovalDecision(request_id="nobody-asked", approved=True)
            )
        )
        await stream.read()
        stream.ack(1)

    stops: list[str] = []
    async with rogue_channel(script, tmp_path) as (_, ch):
        ch.on_stop(stops.append)
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=5000)
        assert stops == ["solar-flare"]
        decision = await ch.request_approval("x", {}, request_id="nobody-asked")
        assert decision.approved
        assert ch.state is ChannelState.STREAMING
    assert caplog.text.count("unknown body") == 2


@pytest.mark.asyncio
async def test_engine_flood_of_down_messages_is_survived(tmp_path: Path) -> None:
    # 10,000 at once, each handled as it comes (none dropped, none twice),
    # and the stream goes on: the ack behind them arrives. More would show
    # nothing new, only take longer.
    n = 10_000

    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        for _ in range(n):
            stream.send(pb.DownMessage(budget_update=pb.BudgetUpdate(message="spam")))
        await stream.read()
        stream.ack(1)

    seen = [0]
    async with rogue_channel(script, tmp_path) as (_, ch):
        ch.on_budget_update(lambda m, d: seen.__setitem__(0, seen[0] + 1))
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        await while_progressing(
            lambda: ch.last_acked_seq == 1,
            lambda: (seen[0], ch.last_acked_seq),
            what="the flood, then the ack behind it",
        )
        assert seen[0] == n


@pytest.mark.asyncio
async def test_a_flood_of_one_fault_is_one_line_per_kind_then_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 58, item 6: 15,000 unknown down messages made 15,000 WARNING lines.
    # Three kinds of per-message fault, each repeated: one line each, then a count
    # when the stream ends.
    n = 5_000
    cut = b"\xe2\x82"  # a UTF-8 character cut in two

    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream)
        for i in range(n):
            stream.send_raw(b"\x2a\x00")  # field 5: an unknown body
            # budget_update (field 3) whose message (field 1) is the cut text
            stream.send_raw(b"\x1a" + bytes([len(cut) + 2, 0x0A, len(cut)]) + cut)
            stream.send(
                pb.DownMessage(
                    approval_decision=pb.ApprovalDecision(request_id=f"nobody-{i}", approved=True)
                )
            )
        await stream.read()
        stream.ack(1)

    budgets: list[str] = []
    caplog.set_level(logging.INFO, logger="walchannel")
    async with rogue_channel(script, tmp_path) as (_, ch):
        ch.on_budget_update(lambda m, d: budgets.append(m))
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        await while_progressing(
            lambda: ch.last_acked_seq == 1,
            lambda: (len(budgets), ch.last_acked_seq),
            what="the flood, then the ack behind it",
        )
    assert budgets == ["\ufffd"] * n  # every message acted on
    text = caplog.text
    for kind in (
        "down messages with an unknown body",
        "down messages with text that is not valid UTF-8",
        "decisions no call waits on",
    ):
        assert f"{n - 1} more {kind}" in text, kind
    assert text.count("unknown body") == 2, text[-2000:]
    assert text.count("not valid UTF-8") == 2
    assert text.count("that this channel is not waiting on") == 1
    assert len(caplog.records) < 40


@pytest.mark.asyncio
async def test_engine_stream_ending_without_status_is_a_reconnect(tmp_path: Path) -> None:
    async def script(stream: RogueStream) -> None:
        await answer_handshakes(stream, high=len(done))
        msg = await stream.read()
        if msg is not None and msg.seq and not done:
            done.append(msg.seq)
            stream.end()  # a bare end: status OK, no error
            return
        if msg is not None:
            stream.ack(msg.seq)

    done: list[int] = []
    async with rogue_channel(script, tmp_path) as (engine, ch):
        await ch.handshake("1", "catalogue", "1")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=10_000)
        assert ch.stats().reconnects >= 1
        assert "status OK" in (ch.stats().last_error or "") or len(engine.streams) >= 2


# -- files ------------------------------------------------------------------------------


def as_nobody(work: Path, fn: Callable[[], object]) -> object:
    """Run ``fn`` in a forked child as uid/gid 65534 in ``work``; return what it returned."""
    return as_user(NOBODY, fn, cwd=work)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder owned by uid 65534 where that uid can reach it (pytest's tmp is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="walchannel-nobody-", dir="/tmp"))
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_files_log_folder_not_writable(nobody_dir: Path) -> None:
    work = nobody_dir
    locked = work / "wal"
    locked.mkdir(mode=0o755)  # owned by root: nobody cannot create files in it
    result = as_nobody(work, lambda: RunLog.open(locked, "run-1", correlation_id="c"))
    # Not a WalWriteError (a full disk to the runner, retriable): where it cannot live.
    assert result[:2] == ("raised", "WalLocationError"), result  # type: ignore[index]
    assert f"the folder {locked} is not writable by uid {NOBODY}" in str(result[2]), result  # type: ignore[index]
    assert list(locked.iterdir()) == []


@needs_root
def test_files_log_file_read_only(nobody_dir: Path) -> None:
    work = nobody_dir
    wal = work / "wal"
    wal.mkdir()
    with RunLog.open(wal, "run-1", correlation_id="c") as log:
        log.append("finding", {"fields": {"n": 1}})
        path = log.path
    for p in (work, wal, *wal.iterdir()):
        os.chown(p, NOBODY, NOBODY)
    path.chmod(0o400)
    before = path.read_bytes()

    def try_open() -> object:
        with RunLog.open(wal, "run-1", correlation_id="c") as log:
            return ("opened", log.unacked_count)

    result = as_nobody(work, try_open)
    assert result[:2] == ("raised", "WalLocationError"), result  # type: ignore[index]
    said = str(result[2])  # type: ignore[index]
    assert f"{path} is not writable by uid {NOBODY}" in said and "chmod" in said, result
    assert path.read_bytes() == before


@pytest.mark.asyncio
async def test_files_disk_full_raises_wal_write_error_and_resumes(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "store.sqlite3")
    await engine.start()
    try:
        run_id, token = new_run(engine)
        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            str(HELPERS / "disk_full_child.py"),
            str(tmp_path / "wal"),
            run_id,
            engine.grpc_addr,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(HARNESS_TOKEN=token),
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()[-3000:]
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report["write_errors"] >= 1
        assert "disk" in report["first_error"].lower() or "full" in report["first_error"].lower()
        assert report["path_in_error"]
        assert report["seqs"] == list(range(1, len(report["seqs"]) + 1))  # no seq skipped
        n = len(report["seqs"])
        assert engine.accepted(run_id) == list(range(1, n + 2))  # + Done
        assert engine.done(run_id) is not None
    finally:
        await engine.stop()


def make_log(wal: Path, run_id: str = "run-1", rows: int = 3) -> Path:
    with RunLog.open(wal, run_id, correlation_id="c") as log:
        log.append_many([("finding", {"fields": {"n": i}}) for i in range(rows)])
        return log.path


def test_files_log_of_another_run(tmp_path: Path) -> None:
    path = make_log(tmp_path, "run-2")
    path.rename(tmp_path / "run-1.wal.sqlite3")
    with pytest.raises(WalCorruptError, match="belongs to run 'run-2'"):
        RunLog.open(tmp_path, "run-1", correlation_id="c")


def test_files_newer_schema(tmp_path: Path) -> None:
    path = make_log(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(WalCorruptError, match="newer schema version 99"):
        RunLog.open(tmp_path, "run-1", correlation_id="c")


def read_everything(folder: Path) -> None:
    with RunLog.open(folder, "run-1", correlation_id="c") as log:
        list(log.unacked())


def test_files_truncated_file(tmp_path: Path) -> None:
    path = make_log(tmp_path, rows=3000)
    path.write_bytes(path.read_bytes()[: 4096 * 3])
    with pytest.raises(WalCorruptError) as info:
        read_everything(tmp_path)
    assert info.value.path == str(path)


@pytest.mark.asyncio
async def test_files_bit_flip_in_a_row_body_is_quarantined_and_sent_as_row_lost(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    path = make_log(wal, run_id)
    conn = sqlite3.connect(path)
    body = bytearray(conn.execute("SELECT body FROM rows WHERE seq = 2").fetchone()[0])
    body[3] ^= 0x10
    conn.execute("UPDATE rows SET body = ? WHERE seq = 2", (bytes(body),))
    conn.commit()
    conn.close()
    config = local_channel_config(local_engine, wal, run_id, token)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "catalogue", "1")
        assert await ch.wait_acked(timeout_ms=5000)
    bodies = local_engine.bodies(run_id)
    assert [b["seq"] for b in bodies] == [1, 2, 3]
    lost = bodies[1]
    assert lost["kind"] == "event" and lost["body"]["type"] == ROW_LOST_TYPE
    assert lost["body"]["payload"]["seq"] == 2.0


@pytest.mark.asyncio
async def test_files_bit_flip_in_sqlite_pages_is_wal_corrupt(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    with RunLog.open(wal, run_id, correlation_id="c") as log:
        log.append_many([("finding", {"fields": {"n": i, "pad": "p" * 200}}) for i in range(2000)])
        log.checkpoint()
        path = log.path
    data = bytearray(path.read_bytes())
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'rows'").fetchone()[0]
    conn.close()
    page = (root - 1) * 4096
    data[page] = 0x00  # the b-tree page type byte of the rows table's root
    path.write_bytes(bytes(data))
    config = local_channel_config(local_engine, wal, run_id, token)
    try:
        ch = GrpcEngineChannel(config)
    except WalCorruptError as exc:
        opened_error: WalCorruptError | None = exc
    else:
        opened_error = None
    if opened_error is not None:
        assert opened_error.path == str(path)
        return
    async with ch:
        await ch.handshake("1", "catalogue", "1")
        await eventually(lambda: ch.state is ChannelState.FAILED, what="FAILED")
        assert str(path) in (ch.stats().last_error or "")


@pytest.mark.asyncio
async def test_files_symlink_planted_where_the_log_should_be(
    engine_channel: GrpcEngineChannel, tmp_path: Path
) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / "run-1.wal.sqlite3").symlink_to(target)
    with pytest.raises(WalCorruptError, match="symbolic link"):
        RunLog.open(folder, "run-1", correlation_id="c")
    assert target.read_bytes() == b"precious"


# Run ids at the edges of the safe-name rule, each accepted by the config.
EDGE_RUN_IDS = [
    "a",
    "-x",
    "x.",
    "a...b",
    ":",
    "_",
    "x.wal.sqlite3",
    "a.lock",
    "9" * 200,
    "A:b-c_d.e",
]


def assert_inspect_lists_every_accepted(run_ids: list[str]) -> None:
    accepted = set()
    for run_id in run_ids:
        try:
            GrpcChannelConfig(grpc_addr="h:1", run_id=run_id, correlation_id="c", run_token="t")
        except ValueError:
            continue
        accepted.add(run_id)
    with tempfile.TemporaryDirectory() as folder:
        for run_id in accepted:
            RunLog.open(folder, run_id, correlation_id="c").close()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["inspect", folder, "--json"])
        assert rc == 0
        assert {item["run_id"] for item in json.loads(out.getvalue())} == accepted


def test_files_every_run_id_the_config_accepts_is_listed_by_inspect() -> None:
    assert_inspect_lists_every_accepted([*EDGE_RUN_IDS, ".hidden", "..."])


@settings(max_examples=10, deadline=None)
@given(st.lists(st.from_regex(r"[A-Za-z0-9._:-]{1,200}", fullmatch=True), max_size=3))
def test_files_any_run_id_the_config_accepts_is_listed_by_inspect(run_ids: list[str]) -> None:
    assert_inspect_lists_every_accepted(run_ids)


@pytest.mark.parametrize("run_id", [".hidden", "...", ".x.wal.sqlite3"])
def test_files_a_run_id_naming_a_hidden_file_is_refused_everywhere(
    run_id: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"run_id .* must not start with '\.'"):
        GrpcChannelConfig(grpc_addr="h:1", run_id=run_id, correlation_id="c", run_token="t")
    with pytest.raises(ValueError, match="hidden"):
        RunLog.open(tmp_path / "wal", run_id, correlation_id="c")
    assert not (tmp_path / "wal").exists() or not any((tmp_path / "wal").iterdir())


# -- two owners --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_two_owners_second_harness_process_is_refused_with_the_pid(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    async with GrpcEngineChannel(local_channel_config(local_engine, wal, run_id, token)) as ch:
        ch.send_finding({"n": 1})
        code = (
            "import sys\n"
            "from walchannel import GrpcEngineChannel, WalLockedError\n"
            "from walchannel.config import GrpcChannelConfig\n"
            f"c = GrpcChannelConfig(grpc_addr='127.0.0.1:1', run_id='{run_id}', "
            f"correlation_id='c', run_token='t', wal_dir='{wal}')\n"
            "try:\n    GrpcEngineChannel(c)\n"
            "except WalLockedError as e:\n    print(e.pid); sys.exit(0)\n"
            "sys.exit(1)\n"
        )
        out = subprocess.run(
            [PYTHON, "-c", code], capture_output=True, text=True, env=child_env(), check=True
        )
        assert int(out.stdout.strip()) == os.getpid()
        assert ch.unacked_count == 1


def test_two_owners_forked_child_of_an_open_channel_cannot_write(tmp_path: Path) -> None:
    out = subprocess.run(
        [PYTHON, str(HELPERS / "fork_run.py"), str(tmp_path / "wal")],
        capture_output=True,
        text=True,
        env=child_env(GRPC_ENABLE_FORK_SUPPORT="false"),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["verdicts"] == ["locked"] * 10
    assert report["delivered"]
    assert report["bodies"] == [float(i) for i in range(10)]  # no child row, none lost


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    from helpers.certs import make_certs

    return make_certs("engine.test")


@pytest.mark.asyncio
async def test_tls_with_tls_server_name_when_discovery_answers_an_ip(
    certs: dict[str, bytes], tmp_path: Path
) -> None:
    from helpers.http_answer import serve_answer

    creds = grpc.ssl_server_credentials([(certs["key"], certs["cert"])])
    engine = LocalEngine(server_credentials=creds)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        with serve_answer(engine.grpc_addr.encode()) as http_addr:
            config = local_channel_config(
                engine,
                tmp_path,
                run_id,
                token,
                http_addr=http_addr,
                credentials=grpc.ssl_channel_credentials(root_certificates=certs["cert"]),
                tls_server_name="engine.test",
            )
            async with GrpcEngineChannel(config) as ch:
                await ch.handshake("1", "catalogue", "1")
                await engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
                ch.send_finding({"n": 1})
                assert await ch.wait_acked(timeout_ms=10_000)
        assert engine.accepted(run_id) == [1]
    finally:
        await engine.stop()


@pytest.mark.asyncio
async def test_tls_wrong_ca_fails_with_a_clear_last_error_while_retrying(
    certs: dict[str, bytes], tmp_path: Path
) -> None:
    from helpers.certs import make_certs

    other = make_certs("engine.test")
    creds = grpc.ssl_server_credentials([(certs["key"], certs["cert"])])
    engine = LocalEngine(server_credentials=creds)
    await engine.start()
    try:
        run_id, token = new_run(engine)
        config = local_channel_config(
            engine,
            tmp_path,
            run_id,
            token,
            http_addr=None,
            connect_timeout_ms=1000,
            credentials=grpc.ssl_channel_credentials(root_certificates=other["cert"]),
            tls_server_name="engine.test",
        )
        async with GrpcEngineChannel(config) as ch:
            with pytest.raises(Exception, match="no engine answered"):
                await ch.handshake("1", "catalogue", "1")
            ch.send_finding({"n": 1})

            def refused() -> bool:
                error = ch.stats().last_error or ""
                return "UNAVAILABLE" in error or "handshake" in error.lower()

            await eventually(refused, what=f"a TLS refusal, last error {ch.stats().last_error!r}")
            assert ch.state in (ChannelState.BACKOFF, ChannelState.CONNECTING)
            assert ch.unacked_count == 1
    finally:
        await engine.stop()


# -- secrets ---------------------------------------------------------------------------------


def test_secrets_whole_run_at_debug_with_grpc_tracers_leaks_no_token(tmp_path: Path) -> None:
    token = "tok-" + secrets.token_urlsafe(24)
    env = child_env(
        HARNESS_TOKEN=token,
        GRPC_TRACE="http,keepalive,connectivity_state",
        GRPC_VERBOSITY="debug",
    )
    out = subprocess.run(
        [PYTHON, str(HELPERS / "secret_run.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "run finished" in out.stdout
    assert len(out.stderr) > 1000  # the tracers and DEBUG logs really ran
    assert token not in out.stdout
    assert token not in out.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def test_secrets_api_tracer_is_warned_about_once() -> None:
    code = (
        "import logging, io\n"
        "stream = io.StringIO()\n"
        "logging.basicConfig(stream=stream, level=logging.WARNING)\n"
        "import asyncio, tempfile\n"
        "from walchannel import GrpcChannelConfig, GrpcEngineChannel\n"
        "folder = tempfile.mkdtemp()\n"
        "for run in ('r1', 'r2'):\n"
        "    asyncio.run(GrpcEngineChannel(GrpcChannelConfig(grpc_addr='127.0.0.1:9', run_id=run,\n"
        "        correlation_id='c', run_token='t', wal_dir=folder)).close())\n"
        "print(stream.getvalue().count('GRPC_TRACE'))\n"
    )
    out = subprocess.run(
        [PYTHON, "-c", code],
        capture_output=True,
        text=True,
        env=child_env(GRPC_TRACE="*,-http"),
        check=True,
    )
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize(
    ("grpc_trace", "leaky"),
    [
        ("api", ["api"]),
        ("all", ["api", "chttp2_hpack_parser"]),
        ("*", ["api", "chttp2_hpack_parser"]),
        ("chttp2_*", ["chttp2_hpack_parser"]),
        ("ap?,http", ["api"]),
        ("all,-api", ["chttp2_hpack_parser"]),
        ("-api,all", ["api", "chttp2_hpack_parser"]),
        ("ALL,API", []),  # gRPC's names are case-sensitive: these enable nothing
        ("http,keepalive,connectivity_state", []),
        ("", []),
    ],
)
def test_secrets_the_tracers_that_print_the_token_are_recognised(
    grpc_trace: str, leaky: list[str]
) -> None:
    # Each case was checked against grpcio 1.85: the token appears in the
    # output exactly when this list is not empty (docs/operations.md).
    assert token_tracers(grpc_trace) == leaky
