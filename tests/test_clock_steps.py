"""Ages and the deadline hold across a wall-clock step (issue 26, item 3).

NTP stepping the clock, or a VM resumed, moves ``time.time()`` by any
amount either way. Rows are dated by ``CLOCK_BOOTTIME`` and the boot id
beside the wall time (the systemd journal's way), so ``stats()`` and
``inspect`` measure ages by boot time within one boot. ``hard_deadline`` is
the token's wall-clock expiry: it is judged on the wall clock, step or not.

In-process steps use time-machine (it moves the wall clock only, as NTP
does); the harness and ``inspect`` in separate processes use libfaketime
with ``FAKETIME_DONT_FAKE_MONOTONIC`` (likewise); skipped without it
(``apt install faketime``) unless ``WALCHANNEL_REQUIRE_FAKETIME=1`` (CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine

from conftest import eventually, new_run
from walchannel import ChannelState, GrpcEngineChannel, RunExpiredError
from walchannel.cli.inspection import inspect_log
from walchannel.clock import SYSTEM_CLOCK
from walchannel.log import RunLog
from walchannel.log.files import log_path
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

HOUR = 3600.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
needs_boot_clock = pytest.mark.skipif(
    SYSTEM_CLOCK.boot_id() is None, reason="no CLOCK_BOOTTIME and boot id on this system"
)


@needs_boot_clock
@pytest.mark.parametrize("step_s", [HOUR, -HOUR], ids=["clock-steps-ahead", "clock-steps-back"])
@pytest.mark.asyncio
async def test_stats_age_follows_elapsed_time_across_a_step(
    local_engine: LocalEngine, tmp_path: Path, step_s: float
) -> None:
    run_id, token = new_run(local_engine)
    await local_engine.kill()  # nothing is acked: the rows wait
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        ch.send_finding({"n": 0})
        began = time.monotonic()
        # The rows were committed on one side of the step, read on the other.
        with time_machine.travel(time.time() + step_s, tick=True):
            await eventually(
                lambda: (ch.stats().oldest_unacked_age_s or 0.0) >= 0.3,
                what="the age to grow with elapsed time",
            )
            age = ch.stats().oldest_unacked_age_s
            assert age is not None and age <= time.monotonic() - began + 1.0
            report = inspect_log(ch.log.path, stuck_after_s=120)
        assert report.oldest_unacked_age_s is not None
        assert 0.3 <= report.oldest_unacked_age_s < 60
        assert report.state == "active"


@needs_boot_clock
def test_a_log_from_another_boot_is_aged_by_the_wall_clock(tmp_path: Path) -> None:
    wal = RunLog.open(tmp_path, "run-x", correlation_id="c")
    try:
        wal.append("finding", {"n": 0})
    finally:
        wal.close()
    path = log_path(tmp_path, "run-x")
    with sqlite3.connect(path) as conn:
        # As if written in another boot an hour ago: its boot times mean nothing now.
        conn.execute("UPDATE meta SET boot_id = 'another-boot'")
        conn.execute("UPDATE rows SET appended_at = appended_at - 3600, appended_boot = 1e9")
    report = inspect_log(path)
    assert report.oldest_unacked_age_s is not None
    assert HOUR - 5 < report.oldest_unacked_age_s < HOUR + 60
    reopened = RunLog.open(tmp_path, "run-x", correlation_id="c")
    try:
        # The new owner's boot: the old boot times are forgotten, the wall time rules.
        assert reopened.meta().boot_id == SYSTEM_CLOCK.boot_id()
        age = reopened.oldest_unacked_age_s()
        assert age is not None and HOUR - 5 < age < HOUR + 60
    finally:
        reopened.close()


# -- the harness and inspect in separate processes (libfaketime) -----------------------------

HARNESS = """
import sys
from walchannel.log import RunLog
wal = RunLog.open(sys.argv[1], sys.argv[2], correlation_id="c")
wal.append("finding", {"n": 0})
print("ready", flush=True)
sys.stdin.read()  # until killed (libfaketime's sleep fails with EINVAL here)
"""


@pytest.fixture
def faked_harness(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(offset: str) -> Path:
        if not LIBFAKETIME.exists():
            if os.environ.get("WALCHANNEL_REQUIRE_FAKETIME") == "1":
                pytest.fail(f"{LIBFAKETIME} is missing: apt-get install faketime")
            pytest.skip("libfaketime is not installed (apt install faketime)")
        env = dict(
            os.environ,
            LD_PRELOAD=str(LIBFAKETIME),
            FAKETIME=offset,
            # NTP steps the wall clock only: CLOCK_MONOTONIC/BOOTTIME run on.
            FAKETIME_DONT_FAKE_MONOTONIC="1",
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", HARNESS, str(tmp_path), "run-step"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return log_path(tmp_path, "run-step")

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def inspect_cli(path: Path, *args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "walchannel", "inspect", str(path), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode in (0, 1), out.stderr
    runs = json.loads(out.stdout)
    assert len(runs) == 1
    return dict(runs[0])


@needs_boot_clock
def test_rows_written_an_hour_ahead_go_stuck_after_the_real_delay(faked_harness) -> None:  # type: ignore[no-untyped-def]
    # The harness's clock was an hour ahead when it committed; inspect's is right.
    path = faked_harness("+1h")
    began = time.monotonic()
    first = inspect_cli(path, "--stuck-after", "2")
    assert first["state"] == "active"
    # Wait on the condition (the real delay passing), then ask again.
    while time.monotonic() - began < 2.5:
        time.sleep(0.1)
    later = inspect_cli(path, "--stuck-after", "2")
    assert later["state"] == "stuck", later
    age = later["oldest_unacked_age_s"]
    assert isinstance(age, float) and 2 <= age < 60


@needs_boot_clock
def test_rows_written_an_hour_behind_are_not_stuck_at_once(faked_harness) -> None:  # type: ignore[no-untyped-def]
    path = faked_harness("-1h")
    report = inspect_cli(path, "--stuck-after", "300")
    assert report["state"] == "active", report
    age = report["oldest_unacked_age_s"]
    assert isinstance(age, float) and age < 60


# -- hard_deadline is judged on the wall clock ------------------------------------------------


@pytest.mark.asyncio
async def test_a_step_past_the_deadline_expires_the_run_and_a_step_back_does_not_reopen_it(
    local_engine: LocalEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import walchannel.core.driver

    monkeypatch.setattr(walchannel.core.driver, "DEADLINE_LOOK_S", 0.2)
    run_id, token = new_run(local_engine)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, hard_deadline=deadline
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        with time_machine.travel(time.time() + 2 * HOUR, tick=True):
            # No send asks: the timer reads the wall clock.
            await eventually(lambda: ch.state is ChannelState.EXPIRED, what="EXPIRED")
            with pytest.raises(RunExpiredError):
                ch.send_finding({"n": 0})
        # Back an hour before the deadline: the run stays expired (the
        # simulator's seed 291100, where an approval asked here waited forever).
        assert datetime.now(UTC) < deadline
        with pytest.raises(RunExpiredError):
            ch.send_finding({"n": 0})
        with pytest.raises(RunExpiredError):
            await asyncio.wait_for(ch.request_approval("deep-scan", {}), 10)
        with pytest.raises(RunExpiredError):
            await ch.handshake("1", "h", "1")
        assert await asyncio.wait_for(ch.send_done("completed", 0, [], ""), 10) is False
        assert ch.state is ChannelState.EXPIRED
        assert ch.unacked_count == 0  # nothing was logged after the expiry


@pytest.mark.asyncio
async def test_a_step_back_moves_the_deadline_away_with_the_wall_clock(
    local_engine: LocalEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import walchannel.core.driver

    monkeypatch.setattr(walchannel.core.driver, "DEADLINE_LOOK_S", 0.2)
    run_id, token = new_run(local_engine)
    deadline = datetime.now(UTC) + timedelta(seconds=1.5)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, hard_deadline=deadline
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        with time_machine.travel(time.time() - HOUR, tick=True):
            # Past the deadline's monotonic distance, the wall clock says an hour to go.
            began = time.monotonic()
            while time.monotonic() - began < 2.5:
                await asyncio.sleep(0.1)
            assert ch.state is ChannelState.STREAMING
            ch.send_finding({"n": 0})
            assert await ch.wait_acked(timeout_ms=5000)
        # Back on the real clock, the deadline has passed.
        await eventually(lambda: ch.state is ChannelState.EXPIRED, what="EXPIRED")


@pytest.mark.asyncio
async def test_a_call_that_finds_the_deadline_passed_expires_the_channel_at_once(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    # Issue 60: the admission's answer is fed back (DeadlinePassed): the run is
    # EXPIRED when the call raises, not at the deadline timer's next look (a
    # minute away at most: DEADLINE_LOOK_S).
    run_id, token = new_run(local_engine)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, hard_deadline=deadline
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        with time_machine.travel(time.time() + 2 * HOUR, tick=False):
            with pytest.raises(RunExpiredError):
                ch.send_finding({"n": 0})
            assert ch.state is ChannelState.EXPIRED  # no await between: the call expired it
            with pytest.raises(RunExpiredError):
                ch.send_event("progress", "info", {})
