#!/usr/bin/env python3
"""The harness process of ``tools/chaos.py``: a resumable scan that streams findings.

Usage::

    CHAOS_TOKEN=... python tools/chaos_child.py --wal-dir D --run-id R --grpc-addr A
        [--http-addr H] --findings N [--pause S] [--pad BYTES] [--keepalive-ms MS]
        [--dead-stream-ms MS] [--group-commit ROWS]

It sends findings ``0..N-1`` in order, each carrying ``{"run", "n"}`` (the
audit's identity by content) and ``progress={"next": i + 1}`` (batches of
three every seventh step, one transaction), resuming from
``channel.progress()``, then ``Done`` and waits for its ack. Lines on
stdout: ``resume <next>``, ``sent <n> <seq>``, then ``finished`` (Done
acked) or ``completed`` (the run had already finished: a tombstone, or the
engine's "run completed"). Exit 0 for both. ``WALCHANNEL_TEST_KILL_AT``
arms a kill point (``walchannel._killpoints``).

``--group-commit ROWS`` runs the channel under ``GroupCommit(max_rows=ROWS)``
(SPEC "Group commit") and sends in bursts of 1 to 8 steps per event-loop
turn, so a group holds several rows when a kill lands; a ``sent`` line then
names a seq handed out, committed by the end of the turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from walchannel import (
    Backoff,
    ChannelState,
    GroupCommit,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
)
from walchannel.errors import EngineUnavailableError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wal-dir", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--grpc-addr", required=True)
    parser.add_argument("--http-addr", default=None)
    parser.add_argument("--findings", type=int, required=True)
    parser.add_argument("--pause", type=float, default=0.002)
    parser.add_argument("--pad", type=int, default=0, help="extra bytes per finding")
    parser.add_argument("--keepalive-ms", type=int, default=25_000)
    parser.add_argument("--dead-stream-ms", type=int, default=None)
    parser.add_argument("--group-commit", type=int, default=None, metavar="ROWS")
    return parser


async def run(args: argparse.Namespace) -> int:
    config = GrpcChannelConfig(
        grpc_addr=args.grpc_addr,
        http_addr=args.http_addr,
        allowed_hosts=["127.0.0.1"],
        run_id=args.run_id,
        correlation_id=f"chaos-{args.run_id}",
        run_token=os.environ["CHAOS_TOKEN"],
        wal_dir=args.wal_dir,
        keepalive_ms=args.keepalive_ms,
        dead_stream_ms=args.dead_stream_ms,
        connect_timeout_ms=3000,
        backoff=Backoff(initial_ms=50, multiplier=2, max_ms=500, jitter_ms=25),
        done_ack_timeout_ms=3000,
        close_timeout_ms=1000,
        group_commit=(
            None if args.group_commit is None else GroupCommit(max_rows=args.group_commit)
        ),
    )
    try:
        channel = GrpcEngineChannel(config)
    except RunCompletedError:
        print("completed", flush=True)
        return 0
    try:
        async with channel:
            with contextlib.suppress(EngineUnavailableError):
                await channel.handshake("1.0", "chaos-child", "1.0")
            i = int((channel.progress() or {"next": 0})["next"])
            n = args.findings
            print(f"resume {i}", flush=True)
            pad = "x" * args.pad
            left = 1
            while i < n:
                if i % 7 == 3 and i + 3 <= n:
                    batch = [{"run": args.run_id, "n": j, "pad": pad} for j in range(i, i + 3)]
                    seqs = channel.send_findings(batch, progress={"next": i + 3})
                    for j, seq in zip(range(i, i + 3), seqs, strict=True):
                        print(f"sent {j} {seq}", flush=True)
                    i += 3
                else:
                    finding = {"run": args.run_id, "n": i, "pad": pad}
                    seq = channel.send_finding(finding, progress={"next": i + 1})
                    print(f"sent {i} {seq}", flush=True)
                    i += 1
                left -= 1
                if args.pause and left <= 0:
                    await asyncio.sleep(args.pause)
                    # Under group commit, bursts of 1 to 8 steps share one turn.
                    left = 1 if args.group_commit is None else (i * 7919) % 8 + 1
            acked = await channel.send_done("completed", n, ["chaos"], "")
            while not acked:
                # send_done is once per channel: keep waiting on its ack. Ask
                # first: on a tombstone ("run completed" stood in for a lost
                # ack) the channel is FAILED and wait_acked is True.
                acked = await channel.wait_acked(timeout_ms=2000)
                if not acked and channel.state in (ChannelState.FAILED, ChannelState.EXPIRED):
                    print(f"channel {channel.state.name}: {channel.stats().last_error}", flush=True)
                    return 3
    except RunCompletedError:
        # The engine applied this run's Done (its ack died with a previous life).
        print("completed", flush=True)
        return 0
    print("finished", flush=True)
    return 0


def main() -> int:
    return asyncio.run(run(_parser().parse_args()))


if __name__ == "__main__":
    sys.exit(main())
