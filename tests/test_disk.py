"""Disk is returned once the backlog is acked (SPEC "The log": disk stays
bounded by the unacked backlog; checkpoint and reclaim freed pages; truncate
the ``-wal`` when idle). Real SQLite files, a real LocalEngine on loopback,
``walchannel inspect`` in a real child process."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import PYTHON, child_env, eventually, new_run, while_progressing
from walchannel import GrpcEngineChannel
from walchannel.channel.reclaim import CHECKPOINT_STEP_PAGES
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

# ~300-byte findings, as in the issue: thousands of them fill megabytes.
PAD = "p" * 270
# What an empty log takes on disk (a few pages): far below any backlog here.
SMALL = 256 * 1024


def finding(i: int) -> dict[str, Any]:
    return {"n": i, "pad": PAD}


# ~3 KB findings for the channel's tests: 2,000 of them fill more than one
# checkpoint step (CHECKPOINT_STEP_PAGES, 4 MiB) in a tenth of the messages.
BIG_PAD = "p" * 2_970


def big_finding(i: int) -> dict[str, Any]:
    return {"n": i, "pad": BIG_PAD}


def disk_bytes(db: Path) -> int:
    """The database plus its ``-wal`` (bytes; a missing file counts 0)."""
    total = 0
    for path in (db, Path(f"{db}-wal")):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def free_pages(db: Path) -> int:
    """The file's free-list length, read by a separate read-only connection."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    finally:
        conn.close()


def fill(wal: RunLog, n: int) -> None:
    for start in range(0, n, 1000):
        wal.append_many([("finding", finding(i)) for i in range(start, min(n, start + 1000))])


# -- RunLog ---------------------------------------------------------------------------


def test_checkpoint_returns_every_freed_page_of_a_drained_backlog(wal_dir: Path) -> None:
    # PRAGMA incremental_vacuum frees one page per step: run once it freed
    # one page of thousands and the file stayed at the backlog's peak size.
    with RunLog.open(wal_dir, "drained", correlation_id="c") as wal:
        fill(wal, 30_000)
        peak = disk_bytes(wal.path)
        assert peak > 8_000_000, peak
        for seq in range(1000, 30_001, 1000):
            wal.ack(seq)
        assert wal.checkpoint() is True
        assert free_pages(wal.path) == 0
        assert disk_bytes(wal.path) < SMALL, disk_bytes(wal.path)
        assert Path(f"{wal.path}-wal").stat().st_size == 0
        assert wal.unacked_count == 0 and wal.quick_check() == []


def test_checkpoint_shrinks_to_the_rows_still_unacked(wal_dir: Path) -> None:
    with RunLog.open(wal_dir, "partly", correlation_id="c") as wal:
        fill(wal, 30_000)
        wal.ack(28_000)  # one big ack: the freed pages lie before the live ones
        assert wal.checkpoint() is True
        assert free_pages(wal.path) == 0
        size = disk_bytes(wal.path)
        # 2,000 rows of ~300 bytes: about 0.7 MB, well below the 30,000's 10 MB.
        assert size < 2_000_000, size
        assert wal.quick_check() == []
        rows = list(wal.unacked())
        assert [r.seq for r in rows] == list(range(28_001, 30_001))
        assert rows[0].body == finding(28_000) and rows[-1].body == finding(29_999)


def test_checkpoint_in_steps_shrinks_the_file_at_every_step(wal_dir: Path) -> None:
    # The channel spreads a big reclaim over turns of its event loop.
    with RunLog.open(wal_dir, "steps", correlation_id="c") as wal:
        fill(wal, 30_000)
        wal.ack(30_000)
        with pytest.raises(ValueError, match="max_pages"):
            wal.checkpoint(max_pages=0)
        sizes = [wal.path.stat().st_size]
        while not wal.checkpoint(max_pages=512):
            sizes.append(wal.path.stat().st_size)
            assert sizes[-1] < sizes[-2], sizes  # progress at every step
            assert Path(f"{wal.path}-wal").stat().st_size <= 4 * 1024 * 1024 + 64 * 1024
        assert len(sizes) > 3
        assert disk_bytes(wal.path) < SMALL and free_pages(wal.path) == 0


def test_close_returns_freed_pages_and_removes_the_wal(wal_dir: Path) -> None:
    wal = RunLog.open(wal_dir, "closed", correlation_id="c")
    fill(wal, 20_000)
    wal.ack(20_000)
    path = wal.path
    wal.close()
    assert disk_bytes(path) < SMALL, disk_bytes(path)
    assert free_pages(path) == 0
    with RunLog.open(wal_dir, "closed", correlation_id="c") as again:
        assert again.last_acked_seq == 20_000 and again.unacked_count == 0


def test_a_reader_holds_off_the_checkpoint_only_while_it_reads(wal_dir: Path) -> None:
    with RunLog.open(wal_dir, "read", correlation_id="c") as wal:
        fill(wal, 20_000)
        wal.ack(20_000)
        reader = sqlite3.connect(
            f"{wal.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
        )
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM meta").fetchall()  # holds a snapshot
            start = time.monotonic()
            assert wal.checkpoint() is False  # the snapshot pins the -wal
            assert time.monotonic() - start < 3  # bounded wait, not the 5 s busy timeout
            reader.execute("COMMIT")
            assert wal.checkpoint() is True
        finally:
            reader.close()
        assert free_pages(wal.path) == 0
        assert disk_bytes(wal.path) < SMALL, disk_bytes(wal.path)


def test_checkpoint_of_a_log_without_incremental_vacuum_only_truncates_the_wal(
    wal_dir: Path,
) -> None:
    # A log file rebuilt with auto_vacuum=NONE (by hand, or by another tool's
    # VACUUM) has no incremental_vacuum: the checkpoint must not loop on it.
    with RunLog.open(wal_dir, "novac", correlation_id="c") as wal:
        path = wal.path
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    with RunLog.open(wal_dir, "novac", correlation_id="c") as wal:
        fill(wal, 5_000)
        wal.ack(5_000)
        assert wal.checkpoint() is True
        assert free_pages(path) > 0  # kept for reuse by later rows
        assert Path(f"{path}-wal").stat().st_size == 0


# -- GrpcEngineChannel ----------------------------------------------------------------


async def drain(ch: GrpcEngineChannel, n: int) -> Path:
    """Log ``n`` big findings before the stream is up, then let the engine ack them all."""
    for start in range(0, n, 500):
        ch.send_findings([big_finding(i) for i in range(start, min(n, start + 500))])
    db = ch.log.path
    assert disk_bytes(db) > n * 3_000 > CHECKPOINT_STEP_PAGES * 4096, disk_bytes(db)
    await ch.handshake("1", "disk-test", "1")
    await acked(ch, n)
    return db


async def acked(ch: GrpcEngineChannel, seq: int) -> None:
    """Wait for the engine's acks up to ``seq`` while they keep coming."""
    await while_progressing(
        lambda: ch.last_acked_seq >= seq, lambda: ch.last_acked_seq, what=f"acks up to {seq}"
    )


async def shrunk(db: Path) -> None:
    """Wait for the log to shrink below SMALL while it keeps shrinking."""
    await while_progressing(
        lambda: disk_bytes(db) < SMALL, lambda: disk_bytes(db), what="the log to shrink"
    )


@pytest.mark.asyncio
async def test_an_idle_channel_shrinks_its_log_after_the_backlog_is_acked(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine, "disk")
    n = 2_000
    ch = GrpcEngineChannel(local_channel_config(local_engine, tmp_path / "wal", run_id, token))
    async with ch:
        db = await drain(ch, n)
        # Idle from here on (heartbeats only): the log shrinks now, not at close.
        await shrunk(db)
        assert free_pages(db) == 0
        assert not ch.log.closed
        # More traffic afterwards is fine, and is reclaimed the same way.
        ch.send_findings([big_finding(i) for i in range(n, n + 500)])
        await acked(ch, n + 500)
        await shrunk(db)
    assert disk_bytes(db) < SMALL, disk_bytes(db)
    assert not Path(f"{db}-wal").exists()
    assert local_engine.accepted(run_id) == list(range(1, n + 501))


@pytest.mark.asyncio
async def test_close_right_after_the_drain_leaves_a_small_log(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine, "disk")
    ch = GrpcEngineChannel(local_channel_config(local_engine, tmp_path / "wal", run_id, token))
    async with ch:
        db = await drain(ch, 2_000)
    assert disk_bytes(db) < SMALL, disk_bytes(db)
    assert free_pages(db) == 0


_INSPECTOR = textwrap.dedent(
    """
    import contextlib, io, json, os, sys
    from walchannel.cli import main
    log, stop, started = sys.argv[1], sys.argv[2], sys.argv[3]
    n = 0
    while not os.path.exists(stop):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["inspect", log, "--json"])
        assert rc == 0, buf.getvalue()
        json.loads(buf.getvalue())
        n += 1
        if n == 1:
            open(started, "w").close()
    print(n)
    """
)


@pytest.mark.asyncio
async def test_inspect_polling_during_the_drain_does_not_keep_the_log_big(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine, "disk")
    ch = GrpcEngineChannel(local_channel_config(local_engine, tmp_path / "wal", run_id, token))
    stop, started = tmp_path / "stop", tmp_path / "started"
    async with ch:
        db = ch.log.path
        inspector = await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            _INSPECTOR,
            str(db),
            str(stop),
            str(started),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(),
        )
        try:
            await eventually(started.exists, timeout=30, what="inspect to start polling")
            await drain(ch, 2_000)
            # inspect is still polling: the owner's checkpoints are not starved.
            await shrunk(db)
            assert inspector.returncode is None
        finally:
            stop.touch()
            out, err = await asyncio.wait_for(inspector.communicate(), 30)
        assert inspector.returncode == 0, err.decode()[-2000:]
        assert int(out) > 1
    assert disk_bytes(db) < SMALL, disk_bytes(db)
