"""Cancellation reaches the harness: no public coroutine swallows it (issue 33).

``task.cancel()`` and ``asyncio.timeout()`` around ``handshake``,
``wait_acked``, ``send_done``, ``request_approval`` and ``close``: the
``CancelledError`` propagates (``TimeoutError`` out of ``asyncio.timeout``)
promptly. A cancelled ``close()`` — or one called by a task being cancelled,
as ``async with`` does — closes the log and releases its lock at once,
leaves the network teardown behind and raises again; the channel is
``CLOSED``, pending approvals fail with ``ChannelClosedError``, and every
row is in the log for the next open (SPEC "Shutdown order"). A real
``LocalEngine`` behind a ``FaultProxy`` that freezes, so that ``close()``
really waits for the stream's end and no ack comes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from conftest import eventually, new_run
from walchannel import ChannelClosedError, ChannelState, GrpcEngineChannel
from walchannel.channel.seams import driver_of
from walchannel.cli.inspection import inspect_log
from walchannel.config import GrpcChannelConfig
from walchannel.log import RunLog
from walchannel.log.files import log_path
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.testing.proxy import FaultProxy

ROOT = Path(__file__).resolve().parent.parent
# Far longer than any bound the tests allow: a close that waits for it is caught.
SLOW_MS = 60_000
# What "promptly" means here: the rule is ~100 ms; the CPUs may be busy.
PROMPT_S = 2.0


@pytest_asyncio.fixture
async def proxy(local_engine: LocalEngine) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(local_engine.grpc_addr)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def frozen_config(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> GrpcChannelConfig:
    run_id, token = new_run(local_engine)
    return local_channel_config(
        local_engine,
        tmp_path / "wal",
        run_id,
        token,
        grpc_addr=proxy.addr,
        http_addr=None,
        close_timeout_ms=SLOW_MS,
        done_ack_timeout_ms=SLOW_MS,
        connect_timeout_ms=SLOW_MS,
    )


async def streaming_then_frozen(ch: GrpcEngineChannel, proxy: FaultProxy) -> int:
    """Handshake, deliver 3 rows, freeze the link, write 2 more; return the high-water."""
    await ch.handshake("1", "cancel", "1")
    for n in range(3):
        ch.send_finding({"n": n})
    assert await ch.wait_acked(timeout_ms=10_000)
    proxy.set_mode("freeze")
    ch.send_finding({"n": 3})
    ch.send_finding({"n": 4}, progress={"step": 5})
    # Written into the frozen link (the socket buffers take them): the writer is idle.
    await eventually(lambda: ch.stats().sent == ch.log.high_water, what="the rows written")
    return ch.log.high_water


def loop_running(run_id: str) -> bool:
    """The run's connection loop (the task ``walchannel-<run id>``) is still running."""
    name = f"walchannel-{run_id}"
    return any(t.get_name() == name and not t.done() for t in asyncio.all_tasks())


def assert_log_released_and_whole(config: GrpcChannelConfig, high: int) -> None:
    """Another owner can open the log at once, and it holds every row not acked."""
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        assert [r.seq for r in log.unacked()] == list(range(log.last_acked_seq + 1, high + 1))
        assert log.next_seq == high + 1
        assert log.progress == {"step": 5}


# -- close ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_cancelled_close_releases_the_log_at_once_and_raises(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    config = frozen_config(local_engine, proxy, tmp_path)
    ch = GrpcEngineChannel(config)
    approval = asyncio.create_task(ch.request_approval("deploy", {}, request_id="r1"))
    high = await streaming_then_frozen(ch, proxy)
    closing = asyncio.create_task(ch.close())
    # close() marks the channel closed, then waits for the frozen stream's end.
    await eventually(lambda: driver_of(ch).closed, what="close() under way")
    await asyncio.sleep(0.2)
    assert not closing.done()
    closing.cancel()
    t0 = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert time.monotonic() - t0 < PROMPT_S
    assert ch.state is ChannelState.CLOSED
    assert ch.log.closed
    assert_log_released_and_whole(config, high)
    # The loop is cancelled too, not left to wait out the frozen stream (60 s).
    await eventually(lambda: not loop_running(config.run_id), PROMPT_S, "the loop's end")
    with pytest.raises(ChannelClosedError):
        await asyncio.wait_for(approval, PROMPT_S)
    await ch.close()  # idempotent: nothing left to do


@pytest.mark.asyncio
async def test_a_cancelled_close_while_the_loop_dials_ends_the_loop_at_once(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    # No stream to end: the loop waits in a dial the frozen link never
    # answers (connect_timeout_ms is 60 s); the cancelled close cancels it.
    config = frozen_config(local_engine, proxy, tmp_path)
    proxy.set_mode("freeze")
    ch = GrpcEngineChannel(config)
    handshake = asyncio.create_task(ch.handshake("1", "cancel", "1"))
    await eventually(lambda: loop_running(config.run_id), what="the loop dialing")
    closing = asyncio.create_task(ch.close())
    await eventually(lambda: driver_of(ch).closed, what="close() under way")
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await eventually(lambda: not loop_running(config.run_id), PROMPT_S, "the loop's end")
    with pytest.raises(ChannelClosedError):
        await asyncio.wait_for(handshake, PROMPT_S)
    assert ch.state is ChannelState.CLOSED


@pytest.mark.asyncio
async def test_asyncio_timeout_around_close_raises_and_releases_the_log(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    config = frozen_config(local_engine, proxy, tmp_path)
    ch = GrpcEngineChannel(config)
    high = await streaming_then_frozen(ch, proxy)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await ch.close()
    assert time.monotonic() - t0 < 0.5 + PROMPT_S
    assert ch.state is ChannelState.CLOSED
    assert_log_released_and_whole(config, high)
    await eventually(lambda: not loop_running(config.run_id), PROMPT_S, "the loop's end")


# -- send_done -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_cancelled_send_done_raises_and_the_done_row_stays(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    config = frozen_config(local_engine, proxy, tmp_path)
    ch = GrpcEngineChannel(config)
    try:
        high = await streaming_then_frozen(ch, proxy)
        done = asyncio.create_task(ch.send_done("completed", 5, [], ""))
        await eventually(lambda: ch.log.done_seq is not None, what="Done logged")
        done.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await done
        assert time.monotonic() - t0 < PROMPT_S
    finally:
        async with asyncio.timeout(0.5 + PROMPT_S):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await ch.close()
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        assert log.done_seq == high + 1
        assert [r.seq for r in log.unacked()][-1] == high + 1


@pytest.mark.asyncio
async def test_asyncio_timeout_around_async_with_and_send_done_closes_at_once(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    # The timeout cancels send_done; the channel's __aexit__ then runs close()
    # in a task being cancelled: it closes at once, not after close_timeout_ms.
    config = frozen_config(local_engine, proxy, tmp_path)
    ch = GrpcEngineChannel(config)
    high = await streaming_then_frozen(ch, proxy)

    async def harness() -> None:
        async with asyncio.timeout(0.5), ch:
            await ch.send_done("completed", 5, [], "")

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await harness()
    # Out of the block past the timeout: close() did not wait for the frozen stream.
    assert time.monotonic() - t0 < 0.5 + PROMPT_S
    assert ch.state is ChannelState.CLOSED
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        assert log.done_seq == high + 1


# -- the other public coroutines -----------------------------------------------------------


@pytest.mark.asyncio
async def test_asyncio_timeout_works_around_handshake_wait_acked_and_request_approval(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    config = frozen_config(local_engine, proxy, tmp_path)
    proxy.set_mode("blackhole")  # dials hang: the handshake waits connect_timeout_ms
    ch = GrpcEngineChannel(config)
    try:
        seq = ch.send_finding({"n": 1})
        for name, call in (
            ("handshake", lambda: ch.handshake("1", "cancel", "1")),
            ("wait_acked", lambda: ch.wait_acked(seq)),
            ("request_approval", lambda: ch.request_approval("deploy", {}, request_id="r")),
        ):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await call()
            assert time.monotonic() - t0 < 0.3 + PROMPT_S, name
            task = asyncio.create_task(call())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, PROMPT_S)
        # The channel goes on: once the link heals, the row is delivered.
        proxy.set_mode("pass")
        proxy.reset_all()
        assert await ch.wait_acked(seq, timeout_ms=20_000)
    finally:
        await ch.close()
    assert local_engine.accepted(config.run_id) == [1, 2]


# -- the connection loop ended from outside ---------------------------------------------


def _runner_of(ch: GrpcEngineChannel) -> asyncio.Task[object]:
    """The channel's connection loop, as a harness sweeping ``asyncio.all_tasks()`` sees it."""
    name = f"walchannel-{ch.config.run_id}"
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == name]
    return task


@pytest.mark.asyncio
async def test_a_connection_loop_cancelled_from_outside_closes_the_channel_not_fails_the_run(
    local_engine: LocalEngine, proxy: FaultProxy, tmp_path: Path
) -> None:
    # The harness's own code ended the loop (a shutdown sweep): a user's mistake,
    # never "walchannel's own invariant broke" (issue 58, item 1).
    config = frozen_config(local_engine, proxy, tmp_path)
    ch = GrpcEngineChannel(config)
    high = await streaming_then_frozen(ch, proxy)
    acked = asyncio.create_task(ch.wait_acked())  # no timeout: only the channel's end wakes it
    approval = asyncio.create_task(ch.request_approval("deploy", {}, request_id="r1"))
    await asyncio.sleep(0.2)
    assert not acked.done() and not approval.done()
    assert ch.log.high_water == high + 1  # the approval's request is a row too
    runner = _runner_of(ch)
    t0 = time.monotonic()
    runner.cancel()  # e.g. a shutdown handler cancelling every task but its own
    with pytest.warns(ResourceWarning, match="left open"):
        woke = await asyncio.wait_for(acked, PROMPT_S)
    assert woke is False
    with pytest.raises(ChannelClosedError):
        await asyncio.wait_for(approval, PROMPT_S)
    assert time.monotonic() - t0 < PROMPT_S
    assert ch.state is ChannelState.CLOSED
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"n": 5})
    assert_log_released_and_whole(config, high + 1)  # released without close()
    with RunLog.open(config.wal_dir, config.run_id, correlation_id=config.correlation_id) as log:
        meta = log.meta()
        assert meta.failed_at is None and meta.failed_reason is None
        assert meta.last_error is not None and "left open" in meta.last_error
    await ch.close()  # still idempotent


# A harness that returns from main() without close(): asyncio.run cancels the
# tasks left, the connection loop among them.
FORGETS_CLOSE = """
import asyncio, os, sys
from walchannel import GrpcChannelConfig, GrpcEngineChannel

async def main():
    grpc_addr, run_id, wal_dir = sys.argv[1:4]
    ch = GrpcEngineChannel(GrpcChannelConfig(
        grpc_addr=grpc_addr, allowed_hosts=["127.0.0.1"], run_id=run_id,
        correlation_id="c-" + run_id, run_token=os.environ["RUN_TOKEN"], wal_dir=wal_dir,
    ))
    await ch.handshake("1", "forgets-close", "1")
    for n in range(3):
        ch.send_finding({"n": n})
    assert await ch.wait_acked(timeout_ms=30_000)
    ch.send_finding({"n": 3}, progress={"step": 5})
    assert await ch.wait_acked(timeout_ms=30_000)  # received; stored only by a timer or close()
    print("returning without close()", flush=True)

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_a_harness_that_never_closes_gets_a_warning_and_its_received_ack_stored(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal_dir = tmp_path / "wal"
    env = {**os.environ, "RUN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-W",
        "always::ResourceWarning",
        "-c",
        FORGETS_CLOSE,
        local_engine.grpc_addr,
        run_id,
        str(wal_dir),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert b"returning without close()" in out
    text = err.decode()
    assert "ResourceWarning: unclosed <GrpcEngineChannel" in text, text
    assert "the channel was left open" in text, text
    assert "invariant" not in text and "Traceback" not in text, text
    assert "destroyed" not in text and "ERROR" not in text, text
    assert token not in out.decode() + text
    with RunLog.open(wal_dir, run_id, correlation_id="c-" + run_id) as log:
        meta = log.meta()
        assert meta.failed_at is None and meta.failed_reason is None
        assert meta.last_error is not None and "left open" in meta.last_error
        assert log.next_seq == 5 and log.progress == {"step": 5}
        assert log.last_acked_seq == 4 and list(log.unacked()) == []  # the received ack was stored
    report = inspect_log(log_path(wal_dir, run_id))
    assert report.state == "idle", report


FORGETS_BLOCKING_CLOSE = """
import os, sys
from walchannel import BlockingEngineChannel, GrpcChannelConfig

grpc_addr, run_id, wal_dir = sys.argv[1:4]
ch = BlockingEngineChannel(GrpcChannelConfig(
    grpc_addr=grpc_addr, allowed_hosts=["127.0.0.1"], run_id=run_id,
    correlation_id="c-" + run_id, run_token=os.environ["RUN_TOKEN"], wal_dir=wal_dir,
))
ch.handshake("1", "forgets-close", "1")
for n in range(3):
    ch.send_finding({"n": n})
print("exiting without close()", flush=True)
"""


@pytest.mark.asyncio
async def test_a_blocking_channel_never_closed_is_closed_at_exit_and_its_rows_go_out(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal_dir = tmp_path / "wal"
    env = {**os.environ, "RUN_TOKEN": token, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FORGETS_BLOCKING_CLOSE,
        local_engine.grpc_addr,
        run_id,
        str(wal_dir),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = err.decode()
    assert b"exiting without close()" in out
    assert "the channel was left open" in text and "at exit" in text, text
    assert "Traceback" not in text and token not in text, text
    # The rows the harness logged went out within the bounded close at exit.
    assert local_engine.accepted(run_id) == [1, 2, 3]
    with RunLog.open(wal_dir, run_id, correlation_id="c-" + run_id) as log:
        meta = log.meta()
        assert meta.failed_at is None
        assert meta.last_error is not None and "left open" in meta.last_error
