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
  task woken by an event writes (:func:`bare_arm`);
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

import msgpack

from tools.bench.bare import BareStream, HandOff
from tools.bench.cases import (
    _ACK_WAIT_S,
    _INSERT,
    AnyEngine,
    Context,
    bare_e2e,
    e2e_sample,
    raw_connect,
    wal_e2e,
)
from tools.bench.common import Result, Target, Timer, interleave_async, median
from walchannel.config import GroupCommit

__all__ = ["bare_arm", "case_limit", "raw_commits"]


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


async def bare_arm(
    ctx: Context, engine: AnyEngine, n: int, *, commit: bool, hand_off: bool
) -> dict[str, float]:
    """The bare stream, with the raw commit of :func:`raw_commits` before each message
    (``commit``), the message handed to a writer task (``hand_off``) or written in the loop.

    ``commit`` without ``hand_off``: the limit measured rather than added
    up, the commit running between the stream's own work as the durable
    path's does, so it pays the same cold caches. ``hand_off``: the send
    path's shape (:class:`~tools.bench.bare.HandOff`): the call encodes (and
    commits) and returns before its write; nothing is kept for a replay, no
    driver, no checks (docs/performance.md, "The physical limit").
    """
    folder = ctx.fresh_dir("limit-bare-")
    conn = raw_connect(folder / "raw.db", "NORMAL")
    stream = BareStream(engine.grpc_addr, engine.new_run("bare-arm"))
    writer = HandOff(stream) if hand_off else None
    pool, size = ctx.pool, len(ctx.pool)
    packb, crc32, wall, execute = msgpack.packb, zlib.crc32, time.time, conn.execute
    timer = Timer()
    try:
        await stream.open()
        if writer is not None:
            writer.start()
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        for i in range(n):
            fields = pool[i % size]
            if commit:
                blob = packb({"fields": fields})
                execute(_INSERT, (i + 1, "finding", blob, crc32(blob), wall()))
            if writer is None:
                last = await stream.send(fields)
            else:
                last = stream.next_seq
                writer.hand(stream.encode(fields))
                await asyncio.sleep(0)
        if writer is not None:
            await writer.drain()
        await asyncio.wait_for(stream.wait_acked(last), _ACK_WAIT_S)
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        if writer is not None:
            writer.cancel()
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
                "both": functools.partial(bare_arm, ctx, engine, n, commit=True, hand_off=False),
                "shape": functools.partial(bare_arm, ctx, engine, n, commit=False, hand_off=True),
                "shape+commit": functools.partial(
                    bare_arm, ctx, engine, n, commit=True, hand_off=True
                ),
                "wal": functools.partial(wal_e2e, ctx, engine, n, 1, "process"),
                "wal64": functools.partial(wal_e2e, ctx, engine, n, 64, "process"),
                "group": functools.partial(wal_e2e, ctx, engine, n, 1, "process", GroupCommit()),
            },
            ctx.sizes.reps,
        )
        bare = _rounds(samples, "bare")
        limits = [_limit(b, c) for b, c in zip(bare, _rounds(samples, "commit"), strict=True)]
        commit = samples["commit"]
        out.append(
            _row(
                f"limit: bare + raw commit, ack/{ack_every}",
                n,
                limits,
                bare,
                "bare grpc.aio",
                f"= bare {median(samples['bare']['cpu_us']):.0f} + commit "
                f"{median(commit['cpu_us']):.1f} (raw commits alone "
                f"{median(commit['rate']):,.0f} rows/s)",
            )
        )
        out.append(
            _row(
                f"limit: bare + raw commit in one loop, ack/{ack_every}",
                n,
                _rounds(samples, "both"),
                limits,
                "the limit",
            )
        )
        for arm, label in (
            ("shape", "the send path's shape, bare (no commit)"),
            ("shape+commit", "the send path's shape, bare + raw commit"),
        ):
            out.append(
                _row(
                    f"limit: {label}, ack/{ack_every}",
                    n,
                    _rounds(samples, arm),
                    bare,
                    "bare grpc.aio",
                )
            )
        shape = _rounds(samples, "shape+commit")
        arms: tuple[tuple[str, str, list[dict[str, float]], str], ...] = (
            ("wal", "send_finding", limits, "the limit"),
            ("wal", "send_finding against its shape", shape, "shape + commit"),
            ("wal64", "send_findings(64)", bare, "bare grpc.aio"),
            ("group", "[group] send_finding", bare, "bare grpc.aio"),
        )
        for arm, label, against, against_label in arms:
            rounds = _rounds(samples, arm)
            row = _row(f"limit: {label}, ack/{ack_every}", n, rounds, against, against_label)
            if ack_every == 1:
                row.target = Target("ratio", ">=", 0.95, ">=0.95x")
            to_bare = [r["rate"] / b["rate"] for r, b in zip(rounds, bare, strict=True)]
            row.detail += f"; {median(to_bare):.2f}x bare"
            out.append(row)
    return out


def _row(
    name: str,
    n: int,
    rounds: list[dict[str, float]],
    against: list[dict[str, float]],
    against_label: str,
    why: str = "",
) -> Result:
    """One row: ``rounds`` against ``against``, round by round (msgs/s, client CPU per message).

    Its ratio is the median of the rounds' ratios; its samples' ``"wal"`` arm
    is the row's own (as ``python -m tools.bench.ab`` reads it).
    """
    cpu = [r["cpu_us"] for r in rounds]
    extra = [r["cpu_us"] - a["cpu_us"] for r, a in zip(rounds, against, strict=True)]
    detail = (
        f"cpu/msg {median(cpu):.0f} µs {why}"
        if why
        else (
            f"cpu/msg {median(cpu):.0f} vs {median([a['cpu_us'] for a in against]):.0f} µs "
            f"({median(extra):+.0f}; per round {min(extra):+.0f} to {max(extra):+.0f})"
        )
    )
    if "switches" in rounds[0]:
        detail += f"; context switches/msg {median([r['switches'] for r in rounds]):.1f}"
    return Result(
        name=name,
        n=n,
        unit="msgs/s",
        wal=median([r["rate"] for r in rounds]),
        base=median([a["rate"] for a in against]),
        base_label=against_label,
        detail=detail,
        samples={"wal": {"rate": [r["rate"] for r in rounds], "cpu_us": cpu}},
        paired=median([r["rate"] / a["rate"] for r, a in zip(rounds, against, strict=True)]),
    )


def case_limit(ctx: Context) -> list[Result]:
    """Bare stream, raw commit, their sum, and the durable path: same run, interleaved."""
    return asyncio.run(_limit_rows(ctx, ctx.sizes.e2e_msgs))
