"""``walchannel inspect --watch``: a live view of a log folder, on real logs and a live channel."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import PYTHON, child_env, eventually, new_run
from walchannel import GrpcEngineChannel
from walchannel.cli import main
from walchannel.cli.inspection import RunReport, list_logs
from walchannel.cli.watch import CLEAR_SCREEN, watch
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def run_row(block: str, run_id: str) -> list[str]:
    """The cells of ``run_id``'s row: STATE RUN UNACKED OLDEST LOGGED/s ACKED/s …"""
    (line,) = [ln for ln in block.splitlines() if f" {run_id} " in ln]
    return line.split()


@pytest.mark.asyncio
async def test_two_refreshes_show_what_a_live_run_logged_and_got_acked(
    tmp_path: Path, local_engine: LocalEngine
) -> None:
    wal_dir = tmp_path / "wal"
    run_id, token = new_run(local_engine, "watch")
    loop = asyncio.get_running_loop()
    config = local_channel_config(local_engine, wal_dir, run_id, token)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1.0", "watch-test", "1")
        for i in range(5):
            ch.send_finding({"n": i})
        assert await ch.wait_acked(timeout_ms=10_000)
        await eventually(lambda: ch.log.last_acked_seq == 5, what="ack 5 stored")

        async def twenty_more() -> None:
            last = 0
            for i in range(5, 25):
                last = ch.send_finding({"n": i})
            assert await ch.wait_acked(last, timeout_ms=10_000)
            await eventually(lambda: ch.log.last_acked_seq == 25, what="ack 25 stored")

        clock = [1000.0]

        def sleep(seconds: float) -> None:
            # Between the refreshes the run logs 20 rows and gets them acked.
            asyncio.run_coroutine_threadsafe(twenty_more(), loop).result(timeout=60)
            clock[0] += seconds

        out = io.StringIO()
        code = await asyncio.to_thread(
            watch,
            lambda: list_logs(wal_dir),
            where=str(wal_dir),
            interval_s=10,
            out=out,
            clear=False,
            count=2,
            stuck_after_s=120,
            sleep=sleep,
            clock=lambda: clock[0],
        )
    assert code == 0
    text = out.getvalue()
    assert CLEAR_SCREEN not in text
    first, second = text.split("\n\n")
    assert first.startswith(f"walchannel inspect --watch 10s  {wal_dir}  ")
    assert "1 run(s): 1 active" in first
    header = next(ln for ln in first.splitlines() if ln.startswith("STATE")).split()
    assert header[:6] == ["STATE", "RUN", "UNACKED", "OLDEST", "LOGGED/s", "ACKED/s"]
    # state, run, unacked, oldest, logged/s, acked/s: no rates at the first sight.
    assert run_row(first, run_id)[:6] == ["active", run_id, "0", "-", "-", "-"]
    # 20 rows logged and acked in 10 s.
    assert run_row(second, run_id)[:6] == ["active", run_id, "0", "-", "2.0", "2.0"]


def idle_folder(tmp_path: Path, rows: int = 0) -> Path:
    wal_dir = tmp_path / "wal"
    with RunLog.open(wal_dir, "watch-idle", correlation_id="corr") as log:
        for i in range(rows):
            log.append("finding", {"fields": {"n": i}})
    return wal_dir


def test_a_terminal_gets_redraws_and_a_pipe_gets_blocks(tmp_path: Path) -> None:
    wal_dir = idle_folder(tmp_path)
    for clear in (True, False):
        out = io.StringIO()
        code = watch(
            lambda: list_logs(wal_dir),
            where=str(wal_dir),
            interval_s=0.5,
            out=out,
            clear=clear,
            count=3,
            stuck_after_s=120,
            sleep=lambda s: None,
        )
        assert code == 0
        text = out.getvalue()
        if clear:
            assert text.count(CLEAR_SCREEN) == 3 and text.startswith(CLEAR_SCREEN)
        else:
            assert "\x1b" not in text
            assert len(text.rstrip("\n").split("\n\n")) == 3
        assert text.count("walchannel inspect --watch 0.5s") == 3
        assert text.count(" watch-idle ") == 3


SIGINT_DEFAULT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def test_ctrl_c_ends_the_watch_with_exit_0(tmp_path: Path) -> None:
    wal_dir = idle_folder(tmp_path)
    proc = subprocess.Popen(
        # A background job inherits SIGINT ignored, and Python then leaves it
        # so: give the child a terminal's default, as an operator's has (set
        # before an exec, not in a preexec_fn: this process has gRPC threads).
        [PYTHON, "-c", SIGINT_DEFAULT_THEN_EXEC, PYTHON, "-m", "walchannel", "inspect",
         str(wal_dir), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first refresh is on screen
        assert first.startswith("walchannel inspect --watch 0.2s"), first
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_watch_count_exits_as_inspect_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wal_dir = idle_folder(tmp_path)
    assert main(["inspect", str(wal_dir), "--watch", "0.01", "--watch-count", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("walchannel inspect --watch 0.01s") == 2
    assert "1 run(s): 1 idle" in out
    # Rows left behind with no owner: orphaned, which inspect answers with 1.
    orphaned = idle_folder(tmp_path / "o", rows=3)
    assert main(["inspect", str(orphaned), "--watch", "0.01", "--watch-count", "1"]) == 1
    assert "1 run(s): 1 orphaned" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--watch", "--json"],
        ["--show", "2", "--watch"],
        ["--watch-count", "2"],
        ["--watch", "1", "--watch-count", "0"],
        ["--watch", "0"],
        ["--watch", "soon"],
    ],
)
def test_watch_usage_errors_exit_2(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    wal_dir = idle_folder(tmp_path)
    assert main(["inspect", str(wal_dir), *argv]) == 2
    assert capsys.readouterr().err


def test_detail_dates_the_last_error_and_says_when_rows_were_acked_after_it() -> None:
    # Issue 14: an old error read like the current one after the channel got past it.
    now = 1_000_000.0
    base = RunReport(
        run_id="r", file="r.wal.sqlite3", state="orphaned", reason="2 unacked rows, no owner"
    )
    stale = replace(
        base,
        last_error="10.0.0.1:50051: UNAVAILABLE: connection refused",
        last_error_at=now - 300,
        last_ack_at=now - 60,
    )
    assert stale.detail(now) == (
        "2 unacked rows, no owner; last error (5m00s ago, rows acked since): "
        "10.0.0.1:50051: UNAVAILABLE: connection refused"
    )
    fresh = replace(stale, last_ack_at=now - 600)
    assert fresh.detail(now).endswith(
        "last error (5m00s ago): 10.0.0.1:50051: UNAVAILABLE: connection refused"
    )
    assert replace(stale, state="active").detail(now) == "2 unacked rows, no owner"
    assert replace(base, state="unreadable").last_ack_text() == "-"
    assert base.last_ack_text() == "never"
    acked = replace(base, last_ack_at=now - 65, last_ack_age_s=65.0)
    assert acked.last_ack_text() == "1m05s ago"
