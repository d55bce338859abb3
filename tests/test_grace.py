"""GracePeriod (SPEC "Grace period"): SIGTERM as a stop request, a bounded drain, an exit code.

The whole path with a real harness process, a local engine and a real
SIGTERM is in test_readme.py (the README's examples use it).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from pathlib import Path

import pytest

from walchannel import (
    EXIT_ROWS_LEFT,
    EXIT_STOPPED,
    GracePeriod,
    GrpcChannelConfig,
    GrpcEngineChannel,
)
from walchannel.inspection import inspect_log


@pytest.mark.parametrize(
    ("seconds", "reserve"),
    [(0, 0), (-1, 0), (math.nan, 0), (math.inf, 0), ("25", 0), (5, 5), (5, -1), (5, math.nan)],
)
def test_bounds_out_of_range_are_refused_by_name(seconds: object, reserve: object) -> None:
    with pytest.raises(ValueError, match=r"GracePeriod: (seconds|close_reserve_s)"):
        GracePeriod(seconds, close_reserve_s=reserve)  # type: ignore[arg-type]


def test_sigterm_sets_stopping_once_and_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with GracePeriod(seconds=30) as grace:
        assert not grace.stopping and grace.remaining_s() == 30
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not grace.stopping:  # delivered to the main thread between bytecodes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        first = grace.remaining_s()
        assert 0 < first <= 30
        os.kill(os.getpid(), signal.SIGTERM)  # a second one does not restart the period
        time.sleep(0.05)
        assert grace.remaining_s() <= first
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigint_counts_only_when_asked_for() -> None:
    with GracePeriod(seconds=30, signals=(signal.SIGTERM, signal.SIGINT)) as grace:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10
        while not grace.stopping:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


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
