"""An ack-flooding engine against an honest one, in one run: ``python -m tools.bench.flood``.

Issue 53: duplicate acks and acks going backwards change nothing, and a
correct engine sends neither; what do they cost the client? Two fast
engines (:mod:`tools.bench.fast_engine`, storing nothing) run as child
processes: one acks every message, the other sends after every ack a
duplicate and a step back (three acks a message). Rounds alternate between
them (honest, flooding, honest, ...), each ``--rows`` single sends then
``wait_acked()``; the table gives the medians of the wall time, the client's
CPU per message, and the flooding engine's ratios to the honest one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tools.bench.engine import FastEngineProcess
from walchannel import GrpcChannelConfig, GrpcEngineChannel


async def one_round(addr: str, run_id: str, wal: Path, rows: int) -> tuple[float, float]:
    """Send ``rows`` findings and wait for their acks; ``(wall s, client CPU µs/message)``."""
    config = GrpcChannelConfig(
        grpc_addr=addr, run_id=run_id, correlation_id=f"corr-{run_id}", run_token="tok", wal_dir=wal
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "flood", "1")
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(rows):
            ch.send_finding({"i": i, "rule": "B101"})
            if i % 32 == 0:
                await asyncio.sleep(0)
        if not await ch.wait_acked(timeout_ms=120_000):
            raise RuntimeError(f"not acked: {ch.stats()}")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return wall, cpu / rows * 1e6


async def main_async(rows: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="flood-bench-") as tmp:
        folder = Path(tmp)
        with (
            FastEngineProcess(folder, 1) as honest,
            FastEngineProcess(folder, 1, flood=True) as flooding,
        ):
            results: dict[str, list[tuple[float, float]]] = {"honest": [], "flooding": []}
            for n in range(rounds):
                for name, engine in (("honest", honest), ("flooding", flooding)):
                    wal = folder / f"wal-{name}-{n}"
                    results[name].append(
                        await one_round(engine.grpc_addr, engine.new_run(name), wal, rows)
                    )
    med = {
        name: (statistics.median(w for w, _ in rs), statistics.median(c for _, c in rs))
        for name, rs in results.items()
    }
    print(f"{rows} single sends then wait_acked(), {rounds} interleaved rounds; medians")
    print("| engine | wall | client CPU/msg |")
    print("|---|---:|---:|")
    for name, (wall, cpu) in med.items():
        print(f"| {name} | {wall:.3f} s | {cpu:.1f} µs |")
    (hw, hc), (fw, fc) = med["honest"], med["flooding"]
    print(f"flooding / honest: wall {fw / hw:.2f}x, client CPU {fc / hc:.2f}x (+{fc - hc:.1f} µs)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.flood", description=__doc__)
    parser.add_argument("--rows", type=int, default=2000, help="sends a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per engine")
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.rows, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
