"""A harness whose signal handler sends on the channel while the scan sends too (issue 52).

Usage: python reentry_child.py MODE WAL_DIR RUN_ID GRPC_ADDR SECONDS [INTERVAL_MS]
(the token comes from $HARNESS_TOKEN). MODE is ``async`` (GrpcEngineChannel)
or ``blocking`` (BlockingEngineChannel). The scan sends findings in a tight
loop (single sends, and batches with a marker) for SECONDS; a SIGALRM timer
every INTERVAL_MS (``setitimer``; 0: none) and any SIGUSR1 (another process's)
run a handler that sends a progress event, as a per-item timer or a status
tick would (cpython bpo-27334). Every seq a call returned is printed on
stdout as one JSON line at the end, with what was refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from walchannel import (
    Backoff,
    BlockingEngineChannel,
    GrpcChannelConfig,
    GrpcEngineChannel,
    ReentrantCallError,
)

returned: list[int] = []
refused = {"handler": 0, "scan": 0}
ticks = [0]


def config(wal_dir: str, run_id: str, grpc_addr: str) -> GrpcChannelConfig:
    return GrpcChannelConfig(
        grpc_addr=grpc_addr,
        run_id=run_id,
        correlation_id="corr",
        run_token=os.environ["HARNESS_TOKEN"],
        wal_dir=wal_dir,
        connect_timeout_ms=5_000,
        backoff=Backoff(initial_ms=50, max_ms=500, jitter_ms=20),
    )


def install(channel: Any, interval_ms: float) -> None:
    def handler(signum: int, frame: object) -> None:
        ticks[0] += 1
        try:
            returned.append(channel.send_event("tick", "info", {"n": ticks[0]}))
        except ReentrantCallError:
            refused["handler"] += 1

    signal.signal(signal.SIGALRM, handler)
    signal.signal(signal.SIGUSR1, handler)
    if interval_ms > 0:
        signal.setitimer(signal.ITIMER_REAL, interval_ms / 1000, interval_ms / 1000)


def stop_signals() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def scan_step(channel: Any, i: int) -> None:
    try:
        if i % 5 == 0:
            returned.extend(
                channel.send_findings([{"i": i, "j": 0}, {"i": i, "j": 1}], progress={"i": i})
            )
        else:
            returned.append(channel.send_finding({"i": i}))
    except ReentrantCallError:
        # A handler's refusal it let go reaches the call it interrupted.
        refused["scan"] += 1


def report(acked: bool) -> None:
    print(json.dumps({"returned": returned, "refused": refused, "acked": acked}), flush=True)


async def run_async(args: list[str]) -> None:
    wal_dir, run_id, grpc_addr, seconds = args[:4]
    interval = float(args[4]) if len(args) > 4 else 2.0
    async with GrpcEngineChannel(config(wal_dir, run_id, grpc_addr)) as channel:
        await channel.handshake("1", "reentry", "1")
        install(channel, interval)
        # Only now: the parent's first SIGUSR1 follows this line, and one
        # before the handler is installed would kill the process.
        print("ready", flush=True)
        try:
            end = time.monotonic() + float(seconds)
            i = 0
            while time.monotonic() < end:
                scan_step(channel, i)
                i += 1
                if i % 20 == 0:
                    await asyncio.sleep(0)  # the stream's tasks run
        finally:
            stop_signals()
        acked = await channel.wait_acked(timeout_ms=120_000)
    report(acked)


def run_blocking(args: list[str]) -> None:
    wal_dir, run_id, grpc_addr, seconds = args[:4]
    interval = float(args[4]) if len(args) > 4 else 2.0
    with BlockingEngineChannel(config(wal_dir, run_id, grpc_addr)) as channel:
        channel.handshake("1", "reentry", "1")
        install(channel, interval)
        # Only now: the parent's first SIGUSR1 follows this line, and one
        # before the handler is installed would kill the process.
        print("ready", flush=True)
        try:
            end = time.monotonic() + float(seconds)
            i = 0
            while time.monotonic() < end:
                scan_step(channel, i)
                i += 1
        finally:
            stop_signals()
        acked = channel.wait_acked(timeout_ms=120_000)
    report(acked)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "async":
        asyncio.run(run_async(rest))
    else:
        run_blocking(rest)
