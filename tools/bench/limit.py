"""The durable path against its physical limit: ``python -m tools.bench --only limit``.

The default path commits each row before it writes it, so it cannot beat
the bare stream; the least it can cost is the bare stream plus one raw
SQLite commit per row. This case measures, in the same run and
interleaved (A/B, B/A, … over ``reps`` rounds), against the fast engine
(:mod:`tools.bench.fast_engine`, which stores nothing, so the client is
the ceiling):

- ``bare``: the bare ``grpc.aio`` stream (:mod:`tools.bench.bare`);
- ``commit``: one raw SQLite commit per row of the same bytes: the body
  msgpack-packed, its CRC32, one autocommit ``INSERT`` on a connection
  with RunLog's pragmas (WAL, ``synchronous=NORMAL``), no stream;
- the limit, per round: the two added per message (wall time and CPU);
- ``both``: the bare stream with that raw commit before each write, in one
  loop: the limit measured rather than added up;
- ``shape``: the send path's shape on the bare stream, without and with
  the raw commit: the call encodes (and commits) and returns, a writer
  task woken by an event writes (:func:`bare_handed_off`);
- the durable path: ``send_finding`` one at a time (against the limit and
  against its shape with the commit), ``send_findings`` in batches of 64
  and ``send_finding`` under group commit (against the bare stream, whose
  commits are shared by many rows).

Each row's ratio is the median of the rounds' own ratios; its detail gives
the client CPU µs per message (less noisy than throughput on a shared
box). The targets are issue 61's (docs/performance.md, "The physical
limit"), shown, never asserted.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
import zlib
from collections import deque

import msgpack

from tools.bench.bare import BareStream
from tools.bench.cases import AnyEngine, Context, bare_e2e, e2e_sample, raw_connect, wal_e2e
from tools.bench.common import Result, Target, Timer, interleave_async, median
from walchannel.config import GroupCommit

__all__ = ["case_limit"]

_INSERT = "INSERT INTO rows VALUES (?, ?, ?, ?, ?)"


async def raw_commits(ctx: Context, n: int) -> dict[str, float]:
    """``n`` rows of the findings' bytes, one raw autocommit ``INSERT`` each (WAL, NORMAL)."""
    folder = ctx.fresh_dir("limit-commit-")
    conn = raw_connect(folder / "raw.db", "NORMAL")
    pool, size = ctx.pool, len(ctx.pool)
    packb, crc32, wall, execute = msgpack.packb, zlib.crc32, time.time, conn.execute
    timer = Timer()
    try:
        timer.start()
        for i in range(n):
            blob = packb({"fields": pool[i % size]})
            execute(_INSERT, (i + 1, "finding", blob, crc32(blob), wall()))
        timer.stop()
    finally:
        conn.close()
        shutil.rmtree(folder)
    return e2e_sample(n, timer, 0.0)


async def bare_with_commits(ctx: Context, engine: AnyEngine, n: int) -> dict[str, float]:
    """The bare stream with :func:`raw_commits`' commit before each write, in one loop.

    The least a durable send can do, measured rather than added up: the
    commit runs between the stream's own work, as the durable path's does,
    so it pays the same cold caches (docs/performance.md, "The physical
    limit").
    """
    folder = ctx.fresh_dir("limit-both-")
    conn = raw_connect(folder / "raw.db", "NORMAL")
    run_id = engine.new_run("bare-commit")
    stream = BareStream(engine.grpc_addr, run_id)
    pool, size = ctx.pool, len(ctx.pool)
    packb, crc32, wall, execute = msgpack.packb, zlib.crc32, time.time, conn.execute
    timer = Timer()
    try:
        await stream.open()
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        for i in range(n):
            fields = pool[i % size]
            blob = packb({"fields": fields})
            execute(_INSERT, (i + 1, "finding", blob, crc32(blob), wall()))
            last = await stream.send(fields)
        await asyncio.wait_for(stream.wait_acked(last), 600)
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        await stream.close()
        conn.close()
        shutil.rmtree(folder)
    return e2e_sample(n, timer, engine_cpu)


async def bare_handed_off(
    ctx: Context, engine: AnyEngine, n: int, commit: bool
) -> dict[str, float]:
    """The send path's shape on the bare stream: the call encodes (and commits) and returns,
    a writer task writes.

    As ``send_finding`` does: the call returns once its row is committed
    (``commit``: the raw commit of :func:`raw_commits`), before its write; a
    writer task, woken by an event, writes what the calls handed it. Nothing
    is kept for a replay, no driver, no checks: what the shape alone costs.
    """
    folder = ctx.fresh_dir("limit-shape-")
    conn = raw_connect(folder / "raw.db", "NORMAL")
    run_id = engine.new_run("bare-shape")
    stream = BareStream(engine.grpc_addr, run_id)
    pool, size = ctx.pool, len(ctx.pool)
    packb, crc32, wall, execute = msgpack.packb, zlib.crc32, time.time, conn.execute
    handed: deque[bytes] = deque()
    wakeup = asyncio.Event()
    done = False

    async def writer() -> None:
        while True:
            while handed:
                await stream.write(handed.popleft())
            if done:
                return
            wakeup.clear()
            await wakeup.wait()

    timer = Timer()
    task: asyncio.Task[None] | None = None
    try:
        await stream.open()
        task = asyncio.create_task(writer())
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        for i in range(n):
            fields = pool[i % size]
            if commit:
                blob = packb({"fields": fields})
                execute(_INSERT, (i + 1, "finding", blob, crc32(blob), wall()))
            last = stream.next_seq
            handed.append(stream.encode(fields))
            wakeup.set()
            await asyncio.sleep(0)
        done = True
        wakeup.set()
        await task
        await asyncio.wait_for(stream.wait_acked(last), 600)
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        if task is not None:
            task.cancel()
        await stream.close()
        conn.close()
        shutil.rmtree(folder)
    return e2e_sample(n, timer, engine_cpu)


def _limit(bare: dict[str, float], commit: dict[str, float]) -> dict[str, float]:
    """One round's limit: the bare stream's message and the raw commit, one after the other."""
    return {
        "rate": 1 / (1 / bare["rate"] + 1 / commit["rate"]),
        "cpu_us": bare["cpu_us"] + commit["cpu_us"],
    }


def _rounds(samples: dict[str, dict[str, list[float]]], arm: str) -> list[dict[str, float]]:
    data = samples[arm]
    return [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]


async def _limit_rows(ctx: Context, n: int) -> list[Result]:
    out = []
    for ack_every in (1, 50):
        engine = ctx.engines.fast(ack_every)
        ctx.say(f"limit: ack every {ack_every}, {n} msgs x {ctx.sizes.reps}")
        samples = await interleave_async(
            {
                "bare": functools.partial(bare_e2e, ctx, engine, n),
                "commit": functools.partial(raw_commits, ctx, n),
                "both": functools.partial(bare_with_commits, ctx, engine, n),
                "shape": functools.partial(bare_handed_off, ctx, engine, n, False),
                "shape+commit": functools.partial(bare_handed_off, ctx, engine, n, True),
                "wal": functools.partial(wal_e2e, ctx, engine, n, 1, "process"),
                "wal64": functools.partial(wal_e2e, ctx, engine, n, 64, "process"),
                "group": functools.partial(wal_e2e, ctx, engine, n, 1, "process", GroupCommit()),
            },
            ctx.sizes.reps,
        )
        bare = _rounds(samples, "bare")
        limits = [_limit(b, c) for b, c in zip(bare, _rounds(samples, "commit"), strict=True)]
        limit_arm = {key: [round_[key] for round_ in limits] for key in ("rate", "cpu_us")}
        commit = samples["commit"]
        out.append(
            Result(
                name=f"limit: bare + raw commit, ack/{ack_every}",
                n=n,
                unit="msgs/s",
                wal=median(limit_arm["rate"]),
                base=median(samples["bare"]["rate"]),
                base_label="bare grpc.aio",
                detail=(
                    f"cpu/msg {median(limit_arm['cpu_us']):.0f} µs = bare "
                    f"{median(samples['bare']['cpu_us']):.0f} + commit "
                    f"{median(commit['cpu_us']):.1f} (raw commits alone "
                    f"{median(commit['rate']):,.0f} rows/s)"
                ),
                samples={"limit": limit_arm, "bare": samples["bare"], "commit": commit},
                paired=median(
                    [lim["rate"] / b["rate"] for lim, b in zip(limits, bare, strict=True)]
                ),
            )
        )
        both = _rounds(samples, "both")
        both_to_bare = median([x["rate"] / b["rate"] for x, b in zip(both, bare, strict=True)])
        out.append(
            Result(
                name=f"limit: bare + raw commit in one loop, ack/{ack_every}",
                n=n,
                unit="msgs/s",
                wal=median(samples["both"]["rate"]),
                base=median(limit_arm["rate"]),
                base_label="the limit",
                detail=(
                    f"cpu/msg {median(samples['both']['cpu_us']):.0f} vs "
                    f"{median(limit_arm['cpu_us']):.0f} µs; "
                    f"{both_to_bare:.2f}x bare"
                ),
                samples={"both": samples["both"]},
                paired=median([x["rate"] / y["rate"] for x, y in zip(both, limits, strict=True)]),
            )
        )
        for arm, label in (
            ("shape", "the send path's shape, bare (no commit)"),
            ("shape+commit", "the send path's shape, bare + raw commit"),
        ):
            rounds = _rounds(samples, arm)
            out.append(
                Result(
                    name=f"limit: {label}, ack/{ack_every}",
                    n=n,
                    unit="msgs/s",
                    wal=median(samples[arm]["rate"]),
                    base=median(samples["bare"]["rate"]),
                    base_label="bare grpc.aio",
                    detail=(
                        f"cpu/msg {median(samples[arm]['cpu_us']):.0f} vs "
                        f"{median(samples['bare']['cpu_us']):.0f} µs; context switches/msg "
                        f"{median(samples[arm]['switches']):.1f}"
                    ),
                    samples={arm: samples[arm]},
                    paired=median(
                        [r["rate"] / b["rate"] for r, b in zip(rounds, bare, strict=True)]
                    ),
                )
            )
        shape = _rounds(samples, "shape+commit")
        arms: tuple[tuple[str, str, list[dict[str, float]], str, float], ...] = (
            ("wal", "send_finding", limits, "the limit", 0.95),
            ("wal", "send_finding against its shape", shape, "shape + commit", 0.95),
            ("wal64", "send_findings(64)", bare, "bare grpc.aio", 0.95),
            ("group", "[group] send_finding", bare, "bare grpc.aio", 0.95),
        )
        for arm, label, against, against_label, bound in arms:
            rounds = _rounds(samples, arm)
            ratios = [r["rate"] / a["rate"] for r, a in zip(rounds, against, strict=True)]
            to_bare = [r["rate"] / b["rate"] for r, b in zip(rounds, bare, strict=True)]
            extra = [r["cpu_us"] - a["cpu_us"] for r, a in zip(rounds, against, strict=True)]
            cpu_against = median([a["cpu_us"] for a in against])
            row = Result(
                name=f"limit: {label}, ack/{ack_every}",
                n=n,
                unit="msgs/s",
                wal=median(samples[arm]["rate"]),
                base=median([a["rate"] for a in against]),
                base_label=against_label,
                target=Target("ratio", ">=", bound, f">={bound:.2f}x") if ack_every == 1 else None,
                detail=(
                    f"cpu/msg {median(samples[arm]['cpu_us']):.0f} vs {cpu_against:.0f} µs "
                    f"({median(extra):+.0f}; per round {min(extra):+.0f} to {max(extra):+.0f})"
                    f"; {median(to_bare):.2f}x bare; context switches/msg "
                    f"{median(samples[arm]['switches']):.1f} vs "
                    f"{median(samples['bare']['switches']):.1f}"
                ),
                # "wal": the walchannel arm of the row, as python -m tools.bench.ab reads it.
                samples={"wal": samples[arm], "against": {"rate": [a["rate"] for a in against]}},
                paired=median(ratios),
            )
            out.append(row)
    return out


def case_limit(ctx: Context) -> list[Result]:
    """Bare stream, raw commit, their sum, and the durable path: same run, interleaved."""
    return asyncio.run(_limit_rows(ctx, ctx.sizes.e2e_msgs))
