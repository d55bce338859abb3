#!/usr/bin/env python3
"""The cost of ``durability="replicated"`` against ``"process"``, both beside a running Litestream.

A LocalEngine process on loopback, a ``litestream replicate`` sidecar over
the log folder (file replica), and one channel in this process:

- throughput: N findings sent in batches of B (``send_findings``), timed
  from the first send to the ack of the last;
- latency: single findings at a steady rate, each timed from ``send_finding``
  to its ack (p50 / p99 / max).

Usage::

    python -m tools.bench.replicated [--n 5000] [--batch 50] [--rate 20] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))  # the demo

from demo.processes import start_process  # noqa: E402

from walchannel import Backoff, GrpcChannelConfig, GrpcEngineChannel  # noqa: E402
from walchannel.log.replication import SOCKET_ENV, Replicator  # noqa: E402


def finding(i: int) -> dict[str, object]:
    return {
        "test_id": "B101",
        "test_name": "assert_used",
        "severity": "LOW",
        "path": f"pkg/mod{i % 97}.py",
        "line_number": i,
        "text": "Use of assert detected.",
    }


async def one_mode(
    durability: str, engine_addr: str, store: Path, workdir: Path, args: argparse.Namespace
) -> dict[str, float]:
    from walchannel.testing.store import EngineStore

    run_id = f"bench-{durability}-{secrets.token_hex(3)}"
    token = secrets.token_urlsafe(18)
    with EngineStore(store) as st:
        st.register_run(run_id, token)
    wal_dir = workdir / durability / "wal"
    url = (workdir / durability / "replica").as_uri()
    with Replicator(wal_dir, url, sync_interval_s=args.sync_interval) as rep:
        os.environ[SOCKET_ENV] = str(rep.socket_path)
        config = GrpcChannelConfig(
            grpc_addr=engine_addr,
            run_id=run_id,
            correlation_id=run_id,
            run_token=token,
            wal_dir=wal_dir,
            durability=durability,  # type: ignore[arg-type]
            backoff=Backoff(initial_ms=50, multiplier=2, max_ms=500, jitter_ms=10),
        )
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "bench", "1")
            # Let Litestream pick the new log up before timing.
            ch.send_event("bench.start", "info", {})
            assert await ch.wait_acked(timeout_ms=30_000)
            started = time.perf_counter()
            for start in range(0, args.n, args.batch):
                ch.send_findings([finding(i) for i in range(start, start + args.batch)])
                await asyncio.sleep(0)
            assert await ch.wait_acked(timeout_ms=120_000)
            elapsed = time.perf_counter() - started
            latencies = []
            period = 1.0 / args.rate
            deadline = time.perf_counter() + args.seconds
            i = args.n
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                seq = ch.send_finding(finding(i))
                assert await ch.wait_acked(seq, timeout_ms=30_000)
                latencies.append((time.perf_counter() - t0) * 1000)
                i += 1
                await asyncio.sleep(max(0.0, period - (time.perf_counter() - t0)))
    latencies.sort()
    return {
        "msgs_per_s": args.n / elapsed,
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max_ms": latencies[-1],
        "samples": len(latencies),
    }


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="walchannel-bench-replicated-"))
    store = workdir / "engine.sqlite3"
    with (workdir / "engine.log").open("w") as log:
        engine, info = start_process(
            ["-m", "walchannel.testing.engine", "--store", str(store)], dict(os.environ), log
        )
        try:
            results = {}
            for mode in ("process", "replicated"):
                results[mode] = await one_mode(mode, info["grpc_addr"], store, workdir, args)
        finally:
            engine.terminate()
            engine.wait(10)
    print(
        f"{args.n} findings in batches of {args.batch}; then one finding at a time at "
        f"{args.rate}/s for {args.seconds:g} s; Litestream sync interval {args.sync_interval:g} s"
    )
    print("durability  | throughput msgs/s | latency p50 ms | p99 ms | max ms | samples")
    for mode, r in results.items():
        print(
            f"{mode:<11} | {r['msgs_per_s']:>17,.0f} | {r['p50_ms']:>14.1f} | "
            f"{r['p99_ms']:>6.1f} | {r['max_ms']:>6.1f} | {r['samples']:>7.0f}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sync-interval", type=float, default=1.0)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
