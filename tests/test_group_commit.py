"""Group commit (SPEC "Group commit"): the rows of many sends in one transaction.

Against the real LocalEngine on loopback and the real log file, read from a
second SQLite connection as a restarted process would: a send returns
before its row is committed; the group commits at the end of the first
turn of the event loop that adds nothing to it, inline at its caps, and
before every call that waits on the engine; a batch and its marker are
never split; nothing reaches the engine before it is committed; a failed
commit is tried again, and a group that cannot be committed fails the
channel, naming the seqs it lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually, new_run
from walchannel import (
    BacklogFullError,
    ChannelState,
    GroupCommit,
    GroupCommitError,
    GrpcChannelConfig,
    GrpcEngineChannel,
    WalWriteError,
)
from walchannel.cli import main
from walchannel.log.state import FAILED_GROUP_LOST
from walchannel.log.writer import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def finding(i: int) -> dict[str, Any]:
    return {"n": i, "path": f"src/file_{i}.py"}


def config(engine: LocalEngine, wal: Path, run_id: str, token: str, **kw: Any) -> GrpcChannelConfig:
    kw.setdefault("group_commit", GroupCommit())
    return local_channel_config(engine, wal, run_id, token, **kw)


def commits_of_rows(ch: GrpcEngineChannel) -> int:
    """How many transactions wrote the log's rows (a transaction dates all its rows alike)."""
    conn = sqlite3.connect(f"file:{ch.log.path}?mode=ro", uri=True)
    try:
        (count,) = conn.execute("SELECT COUNT(DISTINCT appended_at) FROM rows").fetchone()
    finally:
        conn.close()
    return int(count)


def on_disk(ch: GrpcEngineChannel) -> tuple[list[int], dict[str, Any] | None]:
    """The seqs and the progress marker the log file holds, as another process reads them."""
    conn = sqlite3.connect(f"file:{ch.log.path}?mode=ro", uri=True)
    try:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM rows ORDER BY seq")]
        (marker,) = conn.execute("SELECT progress FROM meta").fetchone()
    finally:
        conn.close()
    return seqs, None if marker is None else json.loads(marker)


def refuse_rows_from(ch: GrpcEngineChannel, seq: int) -> sqlite3.Connection:
    """Make every commit of a row at or above ``seq`` fail (a real SQLite error); returns the
    connection that drops the refusal (``DROP TRIGGER refuse``)."""
    other = sqlite3.connect(ch.log.path)
    other.execute(
        f"CREATE TRIGGER refuse BEFORE INSERT ON rows WHEN NEW.seq >= {seq}"
        " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
    )
    other.commit()
    return other


@pytest.mark.asyncio
async def test_sends_return_before_their_rows_commit_and_the_turn_commits_them_together(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(config(local_engine, tmp_path, run_id, token)) as ch:
        await ch.handshake("1", "h", "1")
        seqs = [ch.send_finding(finding(i), progress={"next": i + 1}) for i in range(10)]
        # Still this turn: handed out, not committed, nothing written.
        assert seqs == list(range(1, 11))
        assert on_disk(ch) == ([], None)
        assert ch.stats().pending == 10 and ch.unacked_count == 0
        assert ch.progress() == {"next": 10}  # the marker last set
        await eventually(lambda: on_disk(ch)[0] == seqs, what="the group committed")
        assert on_disk(ch)[1] == {"next": 10} and ch.stats().pending == 0
        assert commits_of_rows(ch) == 1  # one transaction for the ten
        assert await ch.wait_acked(timeout_ms=10_000)
        assert await ch.send_done("completed", 10, [], "")
    assert local_engine.accepted(run_id) == list(range(1, 12))


@pytest.mark.asyncio
async def test_a_full_group_commits_inline_and_a_batch_is_never_split(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    caps = GroupCommit(max_rows=4, max_bytes=1 << 20, max_delay_ms=60_000)
    async with GrpcEngineChannel(
        config(local_engine, tmp_path, run_id, token, group_commit=caps)
    ) as ch:
        await ch.handshake("1", "h", "1")
        # All in one turn: only the caps commit.
        assert [ch.send_finding(finding(i)) for i in range(3)] == [1, 2, 3]
        assert on_disk(ch) == ([], None)
        # 3 + 3 > 4: the three pending commit first, the batch waits whole with its marker.
        assert ch.send_findings([finding(i) for i in range(3, 6)], progress={"b": 1}) == [4, 5, 6]
        assert on_disk(ch) == ([1, 2, 3], None)
        # 3 + 1 = 4: full with this row, committed inline, the marker with it.
        assert ch.send_finding(finding(6), progress={"b": 2}) == 7
        assert on_disk(ch) == ([1, 2, 3, 4, 5, 6, 7], {"b": 2})
        # A batch at the cap by itself commits at once.
        assert ch.send_findings([finding(i) for i in range(7, 11)]) == [8, 9, 10, 11]
        assert on_disk(ch)[0] == list(range(1, 12))
        assert commits_of_rows(ch) == 3
        assert await ch.wait_acked(timeout_ms=10_000)
    assert local_engine.accepted(run_id) == list(range(1, 12))


@pytest.mark.asyncio
async def test_the_byte_cap_and_the_delay_cap_commit_inline(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    caps = GroupCommit(max_rows=1000, max_bytes=300, max_delay_ms=200)
    async with GrpcEngineChannel(
        config(local_engine, tmp_path, run_id, token, group_commit=caps)
    ) as ch:
        await ch.handshake("1", "h", "1")
        pad = "x" * 100
        assert ch.send_finding({"pad": pad}) == 1
        assert ch.send_finding({"pad": pad}) == 2
        assert on_disk(ch)[0] == []
        # Over 300 bytes with it: the two commit first, it waits in a group of its own.
        assert ch.send_finding({"pad": pad}) == 3
        assert on_disk(ch)[0] == [1, 2]
        assert ch.send_finding(finding(4)) == 4
        # A harness computing holds the loop past max_delay_ms (no turn ends):
        # its next send commits the group first.
        time.sleep(0.3)
        assert ch.send_finding(finding(5)) == 5
        assert on_disk(ch)[0] == [1, 2, 3, 4]
        assert await ch.wait_acked(timeout_ms=10_000)
    assert local_engine.accepted(run_id) == [1, 2, 3, 4, 5]


@pytest.mark.asyncio
async def test_a_harness_yielding_after_every_send_still_gets_groups(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # Its next send runs in the next turn of the loop, so the group commits
    # at the first turn that adds nothing, not at the end of each turn.
    run_id, token = new_run(local_engine)
    caps = GroupCommit(max_rows=1000, max_bytes=1 << 20, max_delay_ms=60_000)
    async with GrpcEngineChannel(
        config(local_engine, tmp_path, run_id, token, group_commit=caps)
    ) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(20):
            ch.send_finding(finding(i), progress={"next": i + 1})
            await asyncio.sleep(0)
        assert ch.stats().pending == 20 and on_disk(ch) == ([], None)
        await eventually(lambda: ch.stats().pending == 0, what="a quiet turn commits the group")
        assert on_disk(ch) == (list(range(1, 21)), {"next": 20})
        assert commits_of_rows(ch) == 1
        assert await ch.wait_acked(timeout_ms=10_000)
    assert local_engine.accepted(run_id) == list(range(1, 21))


@pytest.mark.asyncio
async def test_a_group_still_growing_commits_once_max_delay_ms_old(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # A harness that never leaves a turn quiet: the send that finds the
    # group max_delay_ms old commits it.
    run_id, token = new_run(local_engine)
    caps = GroupCommit(max_rows=1_000_000, max_bytes=1 << 30, max_delay_ms=200)
    async with GrpcEngineChannel(
        config(local_engine, tmp_path, run_id, token, group_commit=caps)
    ) as ch:
        await ch.handshake("1", "h", "1")
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 30:
            ch.send_finding(finding(sent))  # a send in every turn: the group keeps growing
            sent += 1
            await asyncio.sleep(0)
            if on_disk(ch)[0]:
                break
        assert on_disk(ch)[0], "the group never committed"
        assert time.monotonic() - started >= 0.2 - 0.01  # not before it was max_delay_ms old
        assert sent > 1 and commits_of_rows(ch) == 1
        assert await ch.wait_acked(timeout_ms=10_000)


@pytest.mark.asyncio
async def test_rows_pending_when_the_answer_moves_the_log_are_moved_with_it(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # The engine holds seqs 1..8 of the run from a log now lost; a new log
    # takes the run over, and its handshake answer Ack(8) moves the new rows
    # past 8 (SPEC "Dial", the verification). Rows still pending when the
    # answer comes are judged and moved with the log's: the seq a send
    # returned is acked only once the engine holds that row.
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(
        local_channel_config(local_engine, tmp_path / "lost", run_id, token)
    ) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(8):
            ch.send_finding({"old": i})
        assert await ch.wait_acked(timeout_ms=10_000)
    wal = tmp_path / "new"
    with RunLog.open(wal, run_id, correlation_id=f"corr-{run_id}") as log:
        log.mark_takeover()  # as `walchannel takeover` does
    caps = GroupCommit(max_rows=1_000_000, max_bytes=1 << 30, max_delay_ms=60_000)
    async with GrpcEngineChannel(config(local_engine, wal, run_id, token, group_commit=caps)) as ch:
        handed: dict[int, int] = {}
        dialing = asyncio.create_task(ch.handshake("1", "h", "1"))
        started = time.monotonic()
        # A send in every turn: the group stays pending while the answer is taken.
        while ch.state is not ChannelState.STREAMING and time.monotonic() - started < 30:
            handed[ch.send_finding({"new": len(handed)})] = len(handed)
            await asyncio.sleep(0)
        await dialing
        assert ch.state is ChannelState.STREAMING and handed
        for seq, n in handed.items():
            assert await ch.wait_acked(seq, timeout_ms=10_000)
            held = [b["body"]["fields"] for b in local_engine.bodies(run_id)]
            assert {"new": n} in held, f"wait_acked({seq}) said True before the engine held it"
    new = [b["seq"] for b in local_engine.bodies(run_id) if "new" in b["body"]["fields"]]
    assert new == list(range(9, 9 + len(handed)))
    assert local_engine.duplicates(run_id) == 0


@pytest.mark.asyncio
async def test_calls_that_wait_on_the_engine_commit_the_group_first(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(config(local_engine, tmp_path, run_id, token)) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_findings([finding(i) for i in range(3)], progress={"p": 3})
        # wait_acked() waits for the newest seq handed out, not the newest committed.
        assert await ch.wait_acked(timeout_ms=10_000)
        assert local_engine.accepted(run_id) == [1, 2, 3]
        ch.send_finding(finding(3))
        ch.send_finding(finding(4))
        # send_done: the group, then Done after it.
        assert await ch.send_done("completed", 5, [], "")
        assert local_engine.accepted(run_id) == [1, 2, 3, 4, 5, 6]
        assert local_engine.done(run_id)["seq"] == 6  # type: ignore[index]


@pytest.mark.asyncio
async def test_close_commits_the_group_and_a_new_channel_resumes_from_it(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    ch = GrpcEngineChannel(config(local_engine, tmp_path, run_id, token))
    ch.send_findings([finding(i) for i in range(4)], progress={"next": 4})
    await ch.close()  # in the same turn as the sends
    again = GrpcEngineChannel(config(local_engine, tmp_path, run_id, token, group_commit=None))
    try:
        assert again.progress() == {"next": 4} and again.unacked_count == 4
        assert again.log.meta().group_commit is None  # this owner writes without it
        await again.handshake("1", "h", "1")
        assert await again.send_done("completed", 4, [], "")
    finally:
        await again.close()
    # 5: the marker again, as the first engine that announced its resume point
    # learns it (the 4 rows were logged before any answer); 6: Done.
    assert local_engine.accepted(run_id) == [1, 2, 3, 4, 5, 6]
    assert local_engine.bodies(run_id)[4]["kind"] == "progress"


@pytest.mark.asyncio
async def test_a_failed_group_commit_is_tried_again_and_nothing_is_sent_before_it_lands(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="walchannel")
    run_id, token = new_run(local_engine)
    async with GrpcEngineChannel(config(local_engine, tmp_path, run_id, token)) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_finding(finding(0))
        assert await ch.wait_acked(timeout_ms=10_000)
        refusal = refuse_rows_from(ch, 2)
        try:
            assert [ch.send_finding(finding(i)) for i in (1, 2)] == [2, 3]
            await eventually(lambda: "trying again in 100 ms" in caplog.text, what="a retry")
            assert max(on_disk(ch)[0], default=0) <= 1 and local_engine.accepted(run_id) == [1]
            assert ch.stats().pending == 2 and ch.state is ChannelState.STREAMING
            refusal.execute("DROP TRIGGER refuse")
            refusal.commit()
        finally:
            refusal.close()
        await eventually(lambda: ch.stats().pending == 0, what="the retry committed")
        assert await ch.wait_acked(timeout_ms=10_000)
    assert local_engine.accepted(run_id) == [1, 2, 3]


@pytest.mark.asyncio
async def test_a_group_that_cannot_be_committed_fails_the_channel_naming_its_seqs(
    local_engine: LocalEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, token = new_run(local_engine)
    ch = GrpcEngineChannel(config(local_engine, tmp_path, run_id, token))
    try:
        await ch.handshake("1", "h", "1")
        ch.send_finding(finding(0), progress={"next": 1})
        assert await ch.wait_acked(timeout_ms=10_000)
        refusal = refuse_rows_from(ch, 2)
        assert ch.send_findings([finding(1), finding(2)], progress={"next": 3}) == [2, 3]
        await eventually(lambda: ch.state is ChannelState.FAILED, what="the channel failed")
        error = ch.stats().last_error or ""
        assert "2 row(s) handed out as seqs 2..3" in error and "disk says no" in error
        assert ch.stats().pending == 0
        with pytest.raises(GroupCommitError, match=r"seqs 2\.\.3") as info:
            ch.send_finding(finding(3))
        assert (info.value.first_seq, info.value.last_seq) == (2, 3)
        assert not isinstance(info.value, WalWriteError)  # a harness's "retry later" would loop
        assert ch.progress() == {"next": 1}  # the committed marker: resume from there
        assert ch.log.meta().failed_reason == FAILED_GROUP_LOST
        refusal.close()
    finally:
        await ch.close()
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["state"] == "failed" and report["next_seq"] == 2
    assert report["group_commit"] == {"max_rows": 256, "max_bytes": 1 << 20, "max_delay_ms": 50}
    assert local_engine.accepted(run_id) == [1]


@pytest.mark.asyncio
async def test_the_backlog_limit_counts_pending_rows(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    cfg = config(local_engine, tmp_path, run_id, token, max_unacked_bytes=1000)
    async with GrpcEngineChannel(cfg) as ch:
        sent: list[int] = []

        def fill() -> None:  # one turn, before the handshake: every row stays pending
            for _ in range(20):
                sent.append(ch.send_finding({"pad": "x" * 100}))

        with pytest.raises(BacklogFullError, match="pending"):
            fill()
        assert 0 < len(sent) < 10 and ch.stats().pending == len(sent)
        assert on_disk(ch)[0] == []


def test_stats_show_the_setting(tmp_path: Path) -> None:
    caps = GroupCommit(max_rows=8, max_bytes=4096, max_delay_ms=5)
    cfg = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1",
        run_id="r",
        correlation_id="c",
        run_token="t",
        wal_dir=tmp_path,
        group_commit=caps,
    )
    ch = GrpcEngineChannel(cfg)
    try:
        assert ch.stats().group_commit == caps and ch.stats().pending == 0
        stored = ch.log.meta().group_commit
        assert stored is not None
        assert json.loads(stored) == {"max_rows": 8, "max_bytes": 4096, "max_delay_ms": 5}
        # Outside a running loop no turn ends: the send commits at once.
        assert ch.send_finding(finding(1)) == 1
        assert ch.unacked_count == 1 and ch.stats().pending == 0
    finally:
        asyncio.run(ch.close())


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_rows", 0), ("max_rows", 1.5), ("max_bytes", -1), ("max_bytes", True),
     ("max_delay_ms", 0), ("max_delay_ms", float("nan"))],
)  # fmt: skip
def test_a_bad_cap_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"group_commit.{field}"):
        GroupCommit(**{field: value})


def test_group_commit_must_be_a_group_commit() -> None:
    with pytest.raises(ValueError, match=r"group_commit must be a walchannel\.GroupCommit"):
        GrpcChannelConfig(
            grpc_addr="127.0.0.1:1",
            run_id="r",
            correlation_id="c",
            run_token="t",
            group_commit={"max_rows": 4},  # type: ignore[arg-type]
        )
