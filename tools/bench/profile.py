"""Profile walchannel's hot paths with cProfile: ``python -m tools.bench.profile PATH``.

Paths (the walchannel arm of the matching benchmark row, client side only):

- ``steps``: no profiler: each step of ``send_finding`` timed alone over
  ``--n`` findings with ``perf_counter_ns`` (µs per call, median of 5 runs),
  the honest numbers behind the cProfile shares below.

- ``append``: ``RunLog.append`` of ``--n`` findings (``--durability``).
- ``e2e``: ``send_finding`` (``--batch 1``) or ``send_findings`` (``--batch 64``)
  of ``--n`` findings to an engine process acking every ``--ack-every``,
  until all are acked; ``--fast``: to the fast engine, which stores nothing;
  ``--group-commit``: the channel under ``GroupCommit()``.
- ``replay``: a channel opened on ``--n`` unacked rows, until all are acked.

Prints the total, the top ``--top`` functions by own time (with their share
of the profiled time) and the inclusive share of walchannel's main steps.
``--baseline`` profiles the baseline arm instead (raw sqlite3 / bare stream),
``--out FILE`` keeps the raw ``pstats`` for snakeviz & co. cProfile adds a
roughly constant cost per Python call, so shares of call-heavy code are
inflated; compare shapes, not absolute times.

    python -m tools.bench.profile e2e --n 10000 --ack-every 50
    python -m tools.bench.profile append --n 50000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import pstats
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.bench.cases import (
    Context,
    bare_e2e,
    build_log,
    channel_config,
    raw_append,
    wal_append,
    wal_e2e,
)
from tools.bench.cli import pin_cpus
from tools.bench.common import Sizes, finding_pool
from tools.bench.engine import Engines
from walchannel.channel.seams import driver_of, log_of
from walchannel.config import GroupCommit

__all__ = ["main", "report"]

#: walchannel steps whose inclusive time is worth seeing (file suffix, function name).
STEPS: tuple[tuple[str, str], ...] = (
    ("channel/grpc_channel.py", "send_finding"),
    ("channel/grpc_channel.py", "send_findings"),
    ("wire/messages.py", "finding_body"),
    ("wire/payload.py", "check_payload"),
    ("channel/row_source.py", "prepare"),
    ("wire/protobuf.py", "up_message"),
    ("channel/grpc_channel.py", "_log_rows"),
    ("log/writer.py", "append_encoded"),
    ("log/format.py", "encode_body"),
    ("channel/stream.py", "_write_loop"),
    ("channel/row_source.py", "row_bytes"),
    ("log/writer.py", "unacked"),
    ("log/format.py", "decode_row"),
    ("channel/stream.py", "_read_loop"),
    ("channel/grpc_channel.py", "_on_down"),
    ("channel/grpc_channel.py", "_on_ack"),
    ("channel/grpc_channel.py", "_store_ack"),
    ("log/writer.py", "ack"),
    ("channel/grpc_channel.py", "wait_acked"),
)


def _where(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("walchannel", "tools", "grpc", "asyncio", "google", "persistqueue"):
        if anchor in parts:
            short = "/".join(parts[parts.index(anchor) :])
            break
    else:
        short = Path(filename).name
    return f"{short}:{line}({name})"


def report(stats: pstats.Stats, *, top: int = 25) -> str:
    """The top functions by own time and walchannel's steps, as text."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in raw.values()) or 1e-9
    lines = [f"profiled time {total:.3f} s (sum of own times)", ""]
    lines.append(f"{'own %':>6} {'own s':>8} {'incl %':>7} {'calls':>9}  function")
    ranked = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    for func, (_, nc, tt, ct, _) in ranked:
        lines.append(
            f"{100 * tt / total:6.1f} {tt:8.3f} {100 * ct / total:7.1f} {nc:9d}  {_where(func)}"
        )
    lines += ["", "walchannel steps (inclusive; coroutines count each resume as a call):"]
    for suffix, name in STEPS:
        for func, (_, nc, _, ct, _) in raw.items():
            if func[2] == name and func[0].endswith(f"walchannel/{suffix}"):
                lines.append(f"  {100 * ct / total:6.1f} % {nc:9d}  {suffix}:{name}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.profile",
        description="cProfile of walchannel's append, end-to-end and replay paths.",
        epilog="example: python -m tools.bench.profile e2e --n 10000 --ack-every 50",
    )
    parser.add_argument("path", choices=("steps", "append", "e2e", "replay"))
    parser.add_argument("--n", type=int, default=10_000, help="messages or rows")
    parser.add_argument("--ack-every", type=int, default=50, help="engine ack cadence (e2e)")
    parser.add_argument("--batch", type=int, default=1, help="1: send_finding; >1: send_findings")
    parser.add_argument("--durability", choices=("process", "power"), default="process")
    parser.add_argument("--baseline", action="store_true", help="profile the baseline arm")
    parser.add_argument(
        "--fast", action="store_true", help="e2e against the fast engine (stores nothing)"
    )
    parser.add_argument(
        "--group-commit", action="store_true", help="e2e with GroupCommit() (its defaults)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=None, help="write the raw pstats here")
    parser.add_argument("--no-pin", action="store_true")
    return parser


def steps(n: int) -> str:
    """Time each step of ``send_finding`` alone (µs per call, median of 5 runs)."""
    import statistics
    import time
    import zlib

    import msgpack

    from tools.bench.cases import raw_connect
    from tools.bench.common import RUN_TOKEN, closed_port
    from tools.bench.metrics import meter_provider_for
    from walchannel.channel import metrics as wm
    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.config import GrpcChannelConfig
    from walchannel.log.writer import RunLog
    from walchannel.wire import messages
    from walchannel.wire import protobuf as wire

    pool = finding_pool()
    bodies = [{"fields": f} for f in pool]
    msgs = [wire.up_message("run-steps", "corr-run-steps", 0, "finding", b) for b in bodies]
    folder = Path(tempfile.mkdtemp(prefix="walchannel-steps-"))
    results: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> None:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for i in range(n):
                fn(i)
            runs.append((time.perf_counter_ns() - t0) / n / 1000)
        results[name] = runs

    size = len(pool)
    timed("messages.finding_body (check_payload)", lambda i: messages.finding_body(pool[i % size]))
    timed(
        "wire.up_message (Struct.update)",
        lambda i: wire.up_message("run-steps", "corr", 0, "finding", bodies[i % size]),
    )
    timed("UpMessage.ByteSize", lambda i: msgs[i % size].ByteSize())
    timed("UpMessage.SerializeToString", lambda i: msgs[i % size].SerializeToString())
    timed("msgpack.packb(body)", lambda i: msgpack.packb(bodies[i % size], use_bin_type=True))
    conn = raw_connect(folder / "raw.sqlite3", "NORMAL")
    blobs = [msgpack.packb(b, use_bin_type=True) for b in bodies]
    seq = iter(range(1, 10**9))
    timed(
        "sqlite3 INSERT autocommit (NORMAL)",
        lambda i: conn.execute(
            "INSERT INTO rows VALUES (?, ?, ?, ?, ?)",
            (next(seq), "finding", blobs[i % size], zlib.crc32(blobs[i % size]), time.time()),
        ),
    )
    conn.close()
    with RunLog.open(folder, "steps-log", correlation_id="c") as log:
        timed("RunLog.append (packb+crc+INSERT)", lambda i: log.append("finding", bodies[i % size]))
    config = GrpcChannelConfig(
        grpc_addr=f"127.0.0.1:{closed_port()}",
        run_id="steps-channel",
        correlation_id="corr",
        run_token=RUN_TOKEN,
        wal_dir=folder,
    )
    ch = GrpcEngineChannel(config)  # never handshaken: no stream, no network
    timed("GrpcEngineChannel.send_finding, no stream", lambda i: ch.send_finding(pool[i % size]))
    log_of(ch).close()
    off = GrpcEngineChannel(dataclasses.replace(config, run_id="steps-off", metrics=False))
    timed("  the same, metrics=False", lambda i: off.send_finding(pool[i % size]))
    log_of(off).close()
    # The metrics hooks of one send_* call (on_commit + on_send) alone.
    clock = time.perf_counter_ns
    for arm in ("api", "sdk"):
        provider = meter_provider_for(arm)
        hooked = GrpcEngineChannel(
            dataclasses.replace(config, run_id=f"steps-{arm}", meter_provider=provider)
        )
        hooks = wm.attach(hooked.config, driver_of(hooked), log_of(hooked))
        assert hooks is not None

        def both(i: int, hooks: Any = hooks) -> None:
            started = clock()
            hooks.on_commit(i + 1)
            hooks.on_send(started)

        label = "SDK (1 record per 5 ms)" if arm == "sdk" else "API only, no SDK"
        timed(f"metrics hooks per send, {label}", both)
        log_of(hooked).close()
        if provider is not None:
            provider.shutdown()
    shutil.rmtree(folder, ignore_errors=True)
    width = max(len(k) for k in results)
    lines = [f"{'step':<{width}}  µs/call (median of 5 x {n})"]
    for name, runs in results.items():
        lines.append(f"{name:<{width}}  {statistics.median(runs):8.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.path == "steps":
        print(steps(args.n))
        return 0
    folder = Path(tempfile.mkdtemp(prefix="walchannel-profile-"))
    pinning = pin_cpus(enabled=not args.no_pin)
    engines = Engines(folder, pinning[1] if pinning else None)
    ctx = Context(
        sizes=Sizes.full(), folder=folder, engines=engines, pool=finding_pool(), say=lambda _: None
    )
    profiler = cProfile.Profile()
    try:
        if args.path == "append":
            arm = raw_append if args.baseline else wal_append
            profiler.enable()
            arm(ctx, args.durability, args.n, args.batch)
            profiler.disable()
        elif args.path == "e2e":
            engine: Any = (engines.fast if args.fast else engines.get)(args.ack_every)

            async def run() -> None:
                if args.baseline:
                    await bare_e2e(ctx, engine, 200)  # warm up the process
                    profiler.enable()
                    await bare_e2e(ctx, engine, args.n)
                else:
                    group = GroupCommit() if args.group_commit else None
                    await wal_e2e(ctx, engine, 200, args.batch, args.durability, group)
                    profiler.enable()
                    await wal_e2e(ctx, engine, args.n, args.batch, args.durability, group)
                profiler.disable()

            asyncio.run(run())
        else:
            asyncio.run(_replay(ctx, engines, args.n, profiler))
    finally:
        engines.close()
        shutil.rmtree(folder, ignore_errors=True)
    stats = pstats.Stats(profiler)
    if args.out is not None:
        stats.dump_stats(str(args.out))
    what = "baseline" if args.baseline else "walchannel"
    print(f"# {args.path} ({what}), n={args.n}, batch={args.batch}, ack every {args.ack_every}")
    print(report(stats, top=args.top))
    return 0


async def _replay(ctx: Context, engines: Engines, n: int, profiler: cProfile.Profile) -> None:
    from walchannel.channel.grpc_channel import GrpcEngineChannel

    engine = engines.get(50)
    wal_dir = ctx.fresh_dir("replay-")
    run_id = engine.new_run("profile-replay")
    build_log(wal_dir, run_id, n, ctx.body)
    profiler.enable()
    ch = GrpcEngineChannel(channel_config(engine, run_id, wal_dir))
    try:
        await ch.handshake("bench", "walchannel", "1")
        await ch.wait_acked(n)
    finally:
        await ch.close()
        profiler.disable()


if __name__ == "__main__":
    sys.exit(main())
