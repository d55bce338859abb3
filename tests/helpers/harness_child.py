"""A resumable harness process for kill tests.

Usage: python harness_child.py WAL_DIR RUN_ID GRPC_ADDR HTTP_ADDR N [PAUSE_S]
(the token comes from $HARNESS_TOKEN). Sends findings 0..N-1 in order, each
with ``progress={"next": i + 1}``, resuming from ``channel.progress()``, then
``Done``; exits 0 when Done is acked or the run was already completed.
Prints ``sent <i> <seq>`` per finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from walchannel import (
    Backoff,
    ChannelState,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
)
from walchannel.errors import EngineUnavailableError


async def main() -> int:
    wal_dir, run_id, grpc_addr, http_addr, total = sys.argv[1:6]
    pause = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    config = GrpcChannelConfig(
        grpc_addr=grpc_addr,
        http_addr=http_addr if http_addr != "-" else None,
        allowed_hosts=["127.0.0.1"],
        run_id=run_id,
        correlation_id="corr",
        run_token=os.environ["HARNESS_TOKEN"],
        wal_dir=wal_dir,
        connect_timeout_ms=3000,
        backoff=Backoff(initial_ms=50, max_ms=500, jitter_ms=20),
        done_ack_timeout_ms=2000,
    )
    try:
        channel = GrpcEngineChannel(config)
    except RunCompletedError:
        print("completed", flush=True)
        return 0
    async with channel:
        with contextlib.suppress(EngineUnavailableError):
            await channel.handshake("1", "kill-test", "1")
        start = (channel.progress() or {"next": 0})["next"]
        i = int(start)
        n = int(total)
        while i < n:
            if i % 7 == 3 and i + 3 <= n:
                batch = [{"n": j, "text": f"finding {j}"} for j in range(i, i + 3)]
                seqs = channel.send_findings(batch, progress={"next": i + 3})
                for j, seq in zip(range(i, i + 3), seqs, strict=True):
                    print(f"sent {j} {seq}", flush=True)
                i += 3
            else:
                seq = channel.send_finding(
                    {"n": i, "text": f"finding {i}"}, progress={"next": i + 1}
                )
                print(f"sent {i} {seq}", flush=True)
                i += 1
            await asyncio.sleep(pause)
        acked = await channel.send_done("completed", n, ["all"], "")
        while not acked:
            # send_done is called once per channel: wait on its ack instead
            # (True on a tombstone, though the channel is then FAILED).
            print("done not acked yet", flush=True)
            acked = await channel.wait_acked(timeout_ms=2000)
            if not acked and channel.state is ChannelState.FAILED:
                print("failed:", channel.stats().last_error, flush=True)
                return 1
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
