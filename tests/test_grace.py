"""GracePeriod (SPEC "Grace period"): SIGTERM as a stop request, a bounded drain, an exit code.

The whole path with a real harness process, a local engine and a real
SIGTERM is in test_readme.py (the README's examples use it).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from walchannel import (
    EXIT_ROWS_LEFT,
    EXIT_STOPPED,
    ChannelState,
    EngineUnavailableError,
    GracePeriod,
    GrpcChannelConfig,
    GrpcEngineChannel,
)
from walchannel.cli.inspection import inspect_log


@pytest.mark.parametrize(
    ("seconds", "reserve"),
    [
        (0, 0),
        (-1, 0),
        (math.nan, 0),
        (math.inf, 0),
        ("25", 0),
        (True, 0),
        (None, 0),
        (5, 5),
        (5, -1),
        (5, math.nan),
        (5, False),
    ],
)
def test_bounds_out_of_range_are_refused_by_name(seconds: object, reserve: object) -> None:
    with pytest.raises(ValueError, match=r"GracePeriod: (seconds|close_reserve_s)"):
        GracePeriod(seconds, close_reserve_s=reserve)  # type: ignore[arg-type]


def test_bad_signals_are_refused_and_a_failed_enter_restores_what_it_installed() -> None:
    with pytest.raises(ValueError, match="GracePeriod: signals is empty"):
        GracePeriod(5, signals=())
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(OSError):  # SIGKILL cannot be caught
        GracePeriod(5, signals=(signal.SIGTERM, signal.SIGKILL)).__enter__()
    assert signal.getsignal(signal.SIGTERM) is before


def test_entering_outside_the_main_thread_names_the_rule() -> None:
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with GracePeriod(5):
                pass
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=enter, name="scanner-1")
    thread.start()
    thread.join()
    (error,) = errors
    assert isinstance(error, ValueError)
    assert "GracePeriod: enter it in the main thread" in str(error) and "scanner-1" in str(error)


def test_sigterm_sets_stopping_once_and_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with GracePeriod(seconds=30) as grace:
        assert not grace.stopping and grace.remaining_s() == 30
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not grace.stopping:  # delivered to the main thread between bytecodes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert 0 < grace.remaining_s() <= 30
        # Half a second of the period spent, so a restarted one would show.
        while grace.remaining_s() > 29.5:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one does not restart the period
        time.sleep(0.05)  # (its handler runs between bytecodes, well within this)
        assert grace.remaining_s() < 29.5
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.asyncio
async def test_sigint_counts_only_when_asked_for_and_exits_130(tmp_path: Path) -> None:
    channel = _channel_with_no_engine(tmp_path, "run-grace-sigint")
    before = signal.getsignal(signal.SIGINT)  # asyncio's runner has one of its own
    with GracePeriod(seconds=30, signals=(signal.SIGTERM, signal.SIGINT)) as grace:
        os.kill(os.getpid(), signal.SIGINT)
        while not grace.stopping:
            await asyncio.sleep(0.01)
        assert await grace.drain(channel) == 130  # 128 + SIGINT, as a shell reports it
    assert signal.getsignal(signal.SIGINT) == before


@pytest.mark.asyncio
async def test_a_stop_request_cuts_a_long_wait_for_acks_short(tmp_path: Path) -> None:
    # No engine: the wait could last forever; SIGTERM ends it at once.
    channel = _channel_with_no_engine(tmp_path, "run-grace-wait")
    channel.send_finding({"path": "a.py"})
    with GracePeriod(seconds=4, close_reserve_s=3.5) as grace:  # drain: 0.5 s
        waiting = asyncio.create_task(grace.wait_acked(channel, timeout_ms=None))
        await asyncio.sleep(0)  # the wait has begun
        assert not waiting.done()
        signalled = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(waiting, 10) is False
        assert time.monotonic() - signalled < 5
        assert await grace.drain(channel) == EXIT_ROWS_LEFT


def _channel_with_no_engine(folder: Path, run_id: str) -> GrpcEngineChannel:
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:9",  # discard: nothing answers
        wal_dir=folder,
        run_id=run_id,
        correlation_id="corr",
        run_token="tok-grace-never-printed",
    )
    return GrpcEngineChannel(config)


@pytest.mark.asyncio
async def test_drain_keeps_the_reserve_for_close_and_says_rows_are_left(tmp_path: Path) -> None:
    # No engine: nothing can be acked, so the drain ends when only the
    # reserve is left, closes, and the rows stay on disk.
    channel = _channel_with_no_engine(tmp_path, "run-grace")
    channel.send_finding({"path": "a.py"})
    channel.send_finding({"path": "b.py"})
    with GracePeriod(seconds=2.0, close_reserve_s=1.5) as grace:
        os.kill(os.getpid(), signal.SIGTERM)
        while not grace.stopping:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        code = await grace.drain(channel)
        took = time.monotonic() - started
    assert code == EXIT_ROWS_LEFT
    assert took < 2.0  # within the period, the reserve included
    assert channel.state.value == "closed"
    report = inspect_log(tmp_path / "run-grace.wal.sqlite3")
    assert report.unacked_count == 2 and report.locked_by is None


@pytest.mark.asyncio
async def test_drain_with_nothing_logged_says_stopped(tmp_path: Path) -> None:
    channel = _channel_with_no_engine(tmp_path, "run-grace-empty")
    assert await GracePeriod(seconds=5).drain(channel) == EXIT_STOPPED == 143
    assert channel.state.value == "closed"


@pytest.mark.asyncio
async def test_drain_works_on_the_in_memory_double() -> None:
    from walchannel.testing import InMemoryEngineChannel

    channel = InMemoryEngineChannel()
    channel.send_finding({"path": "a.py"})
    assert await GracePeriod(seconds=5).wait_acked(channel, timeout_ms=1000)
    assert await GracePeriod(seconds=5).drain(channel) == EXIT_STOPPED
    assert channel.closed


@pytest.mark.asyncio
@pytest.mark.parametrize("ended", ["closed", "expired"])
async def test_a_wait_for_acks_on_a_channel_that_can_get_none_ends_at_once(
    tmp_path: Path, ended: str
) -> None:
    # Its own wait_acked returns False at once: the loop must not spin until the
    # timeout (it did, for a whole drain_timeout, on an expired channel).
    from datetime import UTC, datetime, timedelta

    channel = _channel_with_no_engine(tmp_path, f"run-grace-{ended}")
    channel.send_finding({"path": "a.py"})
    if ended == "closed":
        await channel.close()
    else:
        config = GrpcChannelConfig(
            grpc_addr="127.0.0.1:9",
            wal_dir=tmp_path / "expiring",
            run_id="run-grace-expiring",
            correlation_id="corr",
            run_token="tok-grace-never-printed",
            hard_deadline=datetime.now(UTC) + timedelta(milliseconds=1_500),
            connect_timeout_ms=500,
        )
        await channel.close()
        channel = GrpcEngineChannel(config)
        channel.send_finding({"path": "a.py"})
        with pytest.raises(EngineUnavailableError):
            await channel.handshake("1", "h", "1")  # (its deadline timer runs from here)
        while channel.state is not ChannelState.EXPIRED:
            await asyncio.sleep(0.05)
    grace = GracePeriod(seconds=30)
    began = time.monotonic()
    assert await grace.wait_acked(channel, timeout_ms=20_000) is False
    assert time.monotonic() - began < 2
    await channel.close()
