"""The in-process cases: append, open, end-to-end, replay, latency, durability "power".

Each case returns :class:`~tools.bench.common.Result` rows. The arms of a
row run alternately in this process (see :func:`~tools.bench.common.interleave`),
each repetition on a fresh database or a fresh run, so neither arm inherits
the other's file.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import sqlite3
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgpack
import persistqueue
import persistqueue.serializers.msgpack

from tools.bench.bare import BareStream, HandOff
from tools.bench.common import (
    RUN_TOKEN,
    Result,
    Sizes,
    Target,
    Timer,
    interleave,
    interleave_async,
    median,
    percentile,
)
from tools.bench.engine import EngineProcess, Engines, FastEngineProcess
from walchannel.channel.grpc_channel import GrpcEngineChannel
from walchannel.channel.seams import log_of
from walchannel.config import GroupCommit, GrpcChannelConfig
from walchannel.log.writer import Durability, RunLog

__all__ = ["CASES", "Context"]

AnyEngine = EngineProcess | FastEngineProcess

_SYNC = {"process": "NORMAL", "power": "FULL"}
#: RunLog's ``rows`` table: the raw sqlite3 baseline writes a table of the same shape.
_RAW_SCHEMA = """CREATE TABLE rows (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    body BLOB NOT NULL,
    crc32 INTEGER NOT NULL,
    appended_at REAL NOT NULL)"""
_INSERT = "INSERT INTO rows VALUES (?, ?, ?, ?, ?)"
#: How long an end-to-end arm may wait for its last ack (seconds).
_ACK_WAIT_S = 600.0


@dataclass
class Context:
    """What every case gets: sizes, a scratch folder, the engine processes, the payloads."""

    sizes: Sizes
    folder: Path
    engines: Engines
    pool: list[dict[str, Any]]
    say: Callable[[str], None] = print

    def fresh_dir(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.folder))

    def body(self, i: int) -> dict[str, Any]:
        return {"fields": self.pool[i % len(self.pool)]}


def _cpu_detail(samples: dict[str, dict[str, list[float]]], wal: str, base: str) -> str:
    w, b = samples[wal], samples[base]
    text = f"cpu/msg {median(w['cpu_us']):.0f} vs {median(b['cpu_us']):.0f} µs"
    if "engine_busy" in w:
        text += (
            f"; client busy {median(w['busy']):.0%} vs {median(b['busy']):.0%}"
            f", engine {median(w['engine_busy']):.0%} vs {median(b['engine_busy']):.0%}"
        )
    return text


def _throughput_row(
    name: str,
    n: int,
    unit: str,
    samples: dict[str, dict[str, list[float]]],
    wal: str,
    base: str,
    base_label: str,
    target: Target | None,
) -> Result:
    return Result(
        name=name,
        n=n,
        unit=unit,
        wal=median(samples[wal]["rate"]),
        base=median(samples[base]["rate"]),
        base_label=base_label,
        target=target,
        detail=_cpu_detail(samples, wal, base),
        samples={wal: samples[wal], base: samples[base]},
    )


# -- append ------------------------------------------------------------------------


def raw_connect(path: Path, synchronous: str) -> sqlite3.Connection:
    """A plain sqlite3 connection with RunLog's pragmas and a table of the same shape."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA journal_size_limit = 4194304")
    conn.execute(_RAW_SCHEMA)
    return conn


def wal_append(ctx: Context, durability: Durability, n: int, batch: int) -> dict[str, float]:
    folder = ctx.fresh_dir("append-wal-")
    timer = Timer()
    with RunLog.open(folder, "bench-append", correlation_id="corr", durability=durability) as log:
        timer.start()
        if batch == 1:
            for i in range(n):
                log.append("finding", ctx.body(i))
        else:
            for start in range(0, n, batch):
                log.append_many(
                    [("finding", ctx.body(i)) for i in range(start, min(n, start + batch))]
                )
        timer.stop()
    shutil.rmtree(folder)
    return {"rate": n / timer.wall, "cpu_us": timer.cpu / n * 1e6}


def raw_append(ctx: Context, durability: Durability, n: int, batch: int) -> dict[str, float]:
    folder = ctx.fresh_dir("append-raw-")
    conn = raw_connect(folder / "raw.sqlite3", _SYNC[durability])
    packb, crc32, now = msgpack.packb, zlib.crc32, time.time
    timer = Timer()
    timer.start()
    if batch == 1:
        for i in range(n):
            blob = packb(ctx.body(i), use_bin_type=True)
            conn.execute(_INSERT, (i + 1, "finding", blob, crc32(blob), now()))
    else:
        for start in range(0, n, batch):
            rows = []
            for i in range(start, min(n, start + batch)):
                blob = packb(ctx.body(i), use_bin_type=True)
                rows.append((i + 1, "finding", blob, crc32(blob), now()))
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
    timer.stop()
    conn.close()
    shutil.rmtree(folder)
    return {"rate": n / timer.wall, "cpu_us": timer.cpu / n * 1e6}


def pq_append(ctx: Context, synchronous: str, n: int) -> dict[str, float]:
    folder = ctx.fresh_dir("append-pq-")
    queue = persistqueue.SQLiteAckQueue(
        str(folder / "q"), serializer=persistqueue.serializers.msgpack, auto_resume=False
    )
    # persist-queue has no constructor argument for it: set it on its connection.
    conn = cast("sqlite3.Connection", queue._putter)
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    got = conn.execute("PRAGMA synchronous").fetchone()[0]
    assert got == {"NORMAL": 1, "FULL": 2}[synchronous], got
    timer = Timer()
    timer.start()
    for i in range(n):
        queue.put(ctx.body(i))
    timer.stop()
    queue.close()
    shutil.rmtree(folder)
    return {"rate": n / timer.wall, "cpu_us": timer.cpu / n * 1e6}


def case_append(ctx: Context) -> list[Result]:
    """``RunLog.append`` vs raw sqlite3 insert+commit vs persist-queue ``put`` (NORMAL and FULL)."""
    s = ctx.sizes
    out = []
    modes: tuple[tuple[Durability, int], ...] = (
        ("process", s.append_rows),
        ("power", s.append_rows_full),
    )
    for durability, n in modes:
        sync = _SYNC[durability]
        ctx.say(f"append: {durability} ({sync}), {n} rows x {s.reps}")
        samples = interleave(
            {
                "wal": functools.partial(wal_append, ctx, durability, n, 1),
                "raw": functools.partial(raw_append, ctx, durability, n, 1),
                "pq": functools.partial(pq_append, ctx, sync, n),
            },
            s.reps,
        )
        suffix = "" if durability == "process" else " [power]"
        out.append(
            _throughput_row(
                f"append{suffix} vs sqlite3",
                n,
                "rows/s",
                samples,
                "wal",
                "raw",
                f"sqlite3 {sync}",
                Target("ratio", ">=", 0.8, ">=0.80x") if durability == "process" else None,
            )
        )
        out.append(
            _throughput_row(
                f"append{suffix} vs persist-queue",
                n,
                "rows/s",
                samples,
                "wal",
                "pq",
                f"persist-queue {sync}",
                Target("ratio", ">=", 1.5, ">=1.50x") if durability == "process" else None,
            )
        )
    n = s.append_rows_full * 8
    ctx.say(f"append: power (FULL), batches of 64, {n} rows x {s.reps}")
    samples = interleave(
        {
            "wal": lambda: wal_append(ctx, "power", n, 64),
            "raw": lambda: raw_append(ctx, "power", n, 64),
        },
        s.reps,
    )
    out.append(
        _throughput_row(
            "append_many(64) [power] vs sqlite3",
            n,
            "rows/s",
            samples,
            "wal",
            "raw",
            "sqlite3 FULL, 64/txn",
            None,
        )
    )
    return out


# -- open ----------------------------------------------------------------------------


def build_log(folder: Path, run_id: str, n: int, body: Callable[[int], dict[str, Any]]) -> Path:
    """Create ``run_id``'s log holding ``n`` unacked finding rows; return its path."""
    with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as log:
        chunk = 5_000
        for start in range(0, n, chunk):
            log.append_many([("finding", body(i)) for i in range(start, min(n, start + chunk))])
        path = log.path
    return path


def case_open(ctx: Context) -> list[Result]:
    """``RunLog.open`` of a big log vs a bare sqlite3 open (WAL pragma + MAX(seq))."""
    s = ctx.sizes
    n = s.open_rows
    folder = ctx.fresh_dir("open-")
    ctx.say(f"open: building a {n}-row log")
    path = build_log(folder, "bench-open", n, ctx.body)

    def wal() -> dict[str, float]:
        t0 = time.perf_counter()
        log = RunLog.open(folder, "bench-open", correlation_id="corr-bench-open")
        elapsed = time.perf_counter() - t0
        assert log.unacked_count == n
        log.close()
        return {"ms": elapsed * 1000}

    def raw() -> dict[str, float]:
        t0 = time.perf_counter()
        conn = sqlite3.connect(str(path), isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        top = conn.execute("SELECT max(seq) FROM rows").fetchone()[0]
        elapsed = time.perf_counter() - t0
        assert top == n
        conn.close()
        return {"ms": elapsed * 1000}

    def channel() -> dict[str, float]:
        config = GrpcChannelConfig(
            grpc_addr="127.0.0.1:1",
            run_id="bench-open",
            correlation_id="corr-bench-open",
            run_token=RUN_TOKEN,
            wal_dir=folder,
        )
        t0 = time.perf_counter()
        ch = GrpcEngineChannel(config)
        elapsed = time.perf_counter() - t0
        log_of(ch).close()
        return {"ms": elapsed * 1000}

    ctx.say(f"open: {s.open_reps} reps")
    samples = interleave({"wal": wal, "raw": raw, "channel": channel}, s.open_reps)
    size_mb = (path.stat().st_size) / 1e6
    shutil.rmtree(folder)
    return [
        Result(
            name="open: RunLog.open",
            n=n,
            unit="ms",
            wal=median(samples["wal"]["ms"]),
            base=median(samples["raw"]["ms"]),
            base_label="sqlite3 open+max(seq)",
            target=Target("value", "<", 1000.0, "<1000 ms"),
            detail=(
                f"GrpcEngineChannel() {median(samples['channel']['ms']):.1f} ms; "
                f"file {size_mb:.0f} MB, warm cache"
            ),
            samples=samples,
        )
    ]


# -- end-to-end ------------------------------------------------------------------------


def channel_config(
    engine: AnyEngine,
    run_id: str,
    wal_dir: Path,
    durability: Durability = "process",
    group_commit: GroupCommit | None = None,
) -> GrpcChannelConfig:
    return GrpcChannelConfig(
        grpc_addr=engine.grpc_addr,
        run_id=run_id,
        correlation_id=f"corr-{run_id}",
        run_token=RUN_TOKEN,
        wal_dir=wal_dir,
        durability=durability,
        connect_timeout_ms=30_000,
        group_commit=group_commit,
    )


def e2e_sample(n: int, timer: Timer, engine_cpu: float) -> dict[str, float]:
    return {
        "rate": n / timer.wall,
        "cpu_us": timer.cpu / n * 1e6,
        "busy": timer.cpu / timer.wall,
        "engine_busy": engine_cpu / timer.wall,
        "switches": timer.switches / n,
    }


async def wal_e2e(
    ctx: Context,
    engine: AnyEngine,
    n: int,
    batch: int,
    durability: Durability,
    group_commit: GroupCommit | None = None,
) -> dict[str, float]:
    """``send_finding`` (or ``send_findings`` batches) of ``n`` findings until all are acked."""
    folder = ctx.fresh_dir("e2e-wal-")
    run_id = engine.new_run("wal")
    ch = GrpcEngineChannel(channel_config(engine, run_id, folder, durability, group_commit))
    pool, size = ctx.pool, len(ctx.pool)
    timer = Timer()
    try:
        await ch.handshake("bench", "walchannel", "1")
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        if batch == 1:
            for i in range(n):
                last = ch.send_finding(pool[i % size])
                await asyncio.sleep(0)
        else:
            for start in range(0, n, batch):
                last = ch.send_findings(
                    [pool[i % size] for i in range(start, min(n, start + batch))]
                )[-1]
                await asyncio.sleep(0)
        if not await ch.wait_acked(last, timeout_ms=_ACK_WAIT_S * 1000):
            raise RuntimeError(f"walchannel arm: seq {last} not acked in {_ACK_WAIT_S} s")
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        await ch.close()
        shutil.rmtree(folder)
    return e2e_sample(n, timer, engine_cpu)


async def bare_e2e(ctx: Context, engine: AnyEngine, n: int) -> dict[str, float]:
    """The bare stream writes ``n`` findings and waits for the final ack."""
    run_id = engine.new_run("bare")
    stream = BareStream(engine.grpc_addr, run_id)
    pool, size = ctx.pool, len(ctx.pool)
    timer = Timer()
    try:
        await stream.open()
        last = 0
        engine_cpu = engine.cpu_seconds()
        timer.start()
        for i in range(n):
            last = await stream.send(pool[i % size])
        await asyncio.wait_for(stream.wait_acked(last), _ACK_WAIT_S)
        timer.stop()
        engine_cpu = engine.cpu_seconds() - engine_cpu
    finally:
        await stream.close()
    return e2e_sample(n, timer, engine_cpu)


async def _e2e_rows(ctx: Context, durability: Durability, n: int) -> list[Result]:
    s = ctx.sizes
    out = []
    power = durability == "power"
    cadences = (50,) if power else (1, 50)
    for ack_every in cadences:
        engine = ctx.engines.get(ack_every)
        for batch in (1, 64):
            label = "send_finding" if batch == 1 else "send_findings(64)"
            ctx.say(f"e2e: {durability}, {label}, ack every {ack_every}, {n} msgs x {s.reps}")
            samples = await interleave_async(
                {
                    "wal": functools.partial(wal_e2e, ctx, engine, n, batch, durability),
                    "bare": functools.partial(bare_e2e, ctx, engine, n),
                },
                s.reps,
            )
            if power:
                target = Target("ratio", ">=", 0.5, ">=0.50x") if batch == 64 else None
                name = f"e2e [power] {label}, ack/{ack_every}"
            else:
                target = Target(
                    "ratio",
                    ">=",
                    0.85 if batch == 1 else 0.95,
                    ">=0.85x" if batch == 1 else ">=0.95x",
                )
                name = f"e2e {label}, ack/{ack_every}"
            out.append(
                _throughput_row(name, n, "msgs/s", samples, "wal", "bare", "bare grpc.aio", target)
            )
    return out


def case_e2e(ctx: Context) -> list[Result]:
    """``send_finding``/``send_findings`` → all acked vs the bare stream, same engine process."""
    return asyncio.run(_e2e_rows(ctx, "process", ctx.sizes.e2e_msgs))


def _paired_ratio(wal: dict[str, list[float]], base: dict[str, list[float]]) -> float:
    """The median of the repetitions' own ratios (each repetition ran both arms in turn)."""
    return median([w / b for w, b in zip(wal["rate"], base["rate"], strict=True)])


async def _fast_rows(ctx: Context, n: int) -> list[Result]:
    out = []
    for ack_every in (1, 50):
        engine = ctx.engines.fast(ack_every)
        for batch in (1, 64):
            label = "send_finding" if batch == 1 else "send_findings(64)"
            ctx.say(f"fast: {label}, ack every {ack_every}, {n} msgs x {ctx.sizes.reps}")
            samples = await interleave_async(
                {
                    "wal": functools.partial(wal_e2e, ctx, engine, n, batch, "process"),
                    "group": functools.partial(
                        wal_e2e, ctx, engine, n, batch, "process", GroupCommit()
                    ),
                    "bare": functools.partial(bare_e2e, ctx, engine, n),
                },
                ctx.sizes.reps,
            )
            for arm, tag in (("wal", ""), ("group", " [group]")):
                target = None
                if ack_every == 1:
                    bound = 0.85 if batch == 1 and arm == "wal" else 0.95
                    target = Target("ratio", ">=", bound, f">={bound:.2f}x")
                row = _throughput_row(
                    f"fast e2e{tag} {label}, ack/{ack_every}",
                    n,
                    "msgs/s",
                    samples,
                    arm,
                    "bare",
                    "bare grpc.aio",
                    target,
                )
                wal, bare = samples[arm], samples["bare"]
                row.paired = _paired_ratio(wal, bare)
                extra = median(wal["cpu_us"]) - median(bare["cpu_us"])
                # Rep by rep (the arms alternate): this box's noise is tens of µs.
                paired = [w - b for w, b in zip(wal["cpu_us"], bare["cpu_us"], strict=True)]
                ratios = [w / b for w, b in zip(wal["rate"], bare["rate"], strict=True)]
                row.detail += (
                    f"; client +{extra:.0f} µs/msg (per rep {min(paired):+.0f} to "
                    f"{max(paired):+.0f}); ratio per rep {min(ratios):.2f}-{max(ratios):.2f}"
                    f"; context switches/msg {median(wal['switches']):.1f} vs "
                    f"{median(bare['switches']):.1f}"
                )
                out.append(row)
    return out


def case_fast(ctx: Context) -> list[Result]:
    """Against an engine that stores nothing and acks (tools/bench/fast_engine.py): the
    client is the ceiling, so the ratio and cpu/msg show walchannel's own cost."""
    return asyncio.run(_fast_rows(ctx, ctx.sizes.e2e_msgs))


def case_power(ctx: Context) -> list[Result]:
    """Durability "power" (synchronous=FULL) end to end, per message and in batches of 64."""
    return asyncio.run(_e2e_rows(ctx, "power", ctx.sizes.e2e_msgs_power))


# -- replay ------------------------------------------------------------------------------


async def _replay(ctx: Context) -> list[Result]:
    s = ctx.sizes
    n = s.replay_rows
    engine = ctx.engines.get(50)

    async def wal() -> dict[str, float]:
        folder = ctx.fresh_dir("replay-wal-")
        run_id = engine.new_run("replay")
        build_log(folder, run_id, n, ctx.body)
        config = channel_config(engine, run_id, folder)
        t0 = time.perf_counter()
        ch = GrpcEngineChannel(config)
        try:
            await ch.handshake("bench", "walchannel", "1")
            t1 = time.perf_counter()
            c1 = time.process_time()
            if not await ch.wait_acked(n, timeout_ms=_ACK_WAIT_S * 1000):
                raise RuntimeError(f"replay: seq {n} not acked in {_ACK_WAIT_S} s")
            t2 = time.perf_counter()
            c2 = time.process_time()
        finally:
            await ch.close()
            shutil.rmtree(folder)
        return {"open_ms": (t1 - t0) * 1000, "rate": n / (t2 - t1), "cpu_us": (c2 - c1) / n * 1e6}

    async def bare() -> dict[str, float]:
        run_id = engine.new_run("replay-bare")
        t0 = time.perf_counter()
        stream = BareStream(engine.grpc_addr, run_id)
        pool, size = ctx.pool, len(ctx.pool)
        try:
            await stream.open()
            t1 = time.perf_counter()
            c1 = time.process_time()
            last = 0
            for i in range(n):
                last = await stream.send(pool[i % size])
            await asyncio.wait_for(stream.wait_acked(last), _ACK_WAIT_S)
            t2 = time.perf_counter()
            c2 = time.process_time()
        finally:
            await stream.close()
        return {"open_ms": (t1 - t0) * 1000, "rate": n / (t2 - t1), "cpu_us": (c2 - c1) / n * 1e6}

    reps = min(s.reps, s.replay_reps)
    ctx.say(f"replay: {n} unacked rows x {reps} (engine ack every 50)")
    samples = await interleave_async({"wal": wal, "bare": bare}, reps)
    return [
        Result(
            name="replay: open + handshake",
            n=n,
            unit="ms",
            wal=median(samples["wal"]["open_ms"]),
            base=median(samples["bare"]["open_ms"]),
            base_label="bare dial+handshake",
            target=None,
            detail="channel constructed .. Ack(h) answered",
            samples=samples,
        ),
        _throughput_row(
            "replay: throughput, ack/50",
            n,
            "msgs/s",
            samples,
            "wal",
            "bare",
            "bare grpc.aio",
            Target("ratio", ">=", 0.9, ">=0.90x"),
        ),
    ]


def case_replay(ctx: Context) -> list[Result]:
    """A restarted harness with unacked rows on disk: open time and replay throughput."""
    return asyncio.run(_replay(ctx))


# -- latency ------------------------------------------------------------------------------


async def _latency(ctx: Context) -> list[Result]:
    s = ctx.sizes
    n = s.latency_msgs
    engine = ctx.engines.get(1)
    pool, size = ctx.pool, len(ctx.pool)

    def quantiles(ns: list[int]) -> dict[str, float]:
        ns.sort()
        return {
            q: percentile(ns, v) / 1000 for q, v in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
        }

    async def wal(group_commit: GroupCommit | None = None) -> dict[str, float]:
        folder = ctx.fresh_dir("latency-wal-")
        run_id = engine.new_run("latency")
        ch = GrpcEngineChannel(channel_config(engine, run_id, folder, group_commit=group_commit))
        clock = time.perf_counter_ns
        times: list[int] = []
        try:
            await ch.handshake("bench", "walchannel", "1")
            last = 0
            for i in range(n):
                t0 = clock()
                last = ch.send_finding(pool[i % size])
                times.append(clock() - t0)
                await asyncio.sleep(0)
            await ch.wait_acked(last, timeout_ms=_ACK_WAIT_S * 1000)
        finally:
            await ch.close()
            shutil.rmtree(folder)
        return quantiles(times)

    async def raw() -> dict[str, float]:
        # The least a durable send must do: encode, insert+commit, encode for
        # the wire, hand to a writer task streaming on a bare stream.
        folder = ctx.fresh_dir("latency-raw-")
        conn = raw_connect(folder / "raw.sqlite3", "NORMAL")
        stream = BareStream(engine.grpc_addr, engine.new_run("latency-raw"))
        writer = HandOff(stream)

        clock = time.perf_counter_ns
        packb, crc32, now = msgpack.packb, zlib.crc32, time.time
        times: list[int] = []
        try:
            await stream.open()
            writer.start()
            for i in range(n):
                t0 = clock()
                body = {"fields": pool[i % size]}
                blob = packb(body, use_bin_type=True)
                conn.execute(_INSERT, (i + 1, "finding", blob, crc32(blob), now()))
                writer.hand(stream.encode(body["fields"]))
                times.append(clock() - t0)
                await asyncio.sleep(0)
            await writer.drain()
            await asyncio.wait_for(stream.wait_acked(stream.next_seq - 1), _ACK_WAIT_S)
        finally:
            writer.cancel()
            await stream.close()
            conn.close()
            shutil.rmtree(folder)
        return quantiles(times)

    ctx.say(f"latency: {n} sends x {s.reps} while streaming (engine ack every 1)")
    samples = await interleave_async(
        {"wal": wal, "group": functools.partial(wal, GroupCommit()), "raw": raw}, s.reps
    )
    out = []
    for arm, tag, detail in (
        ("wal", "", "stream busy, durability process"),
        ("group", " [group]", "stream busy, durability process, group commit (defaults)"),
    ):
        for q, label, target in (
            ("p50", "p50", None),
            ("p99", "p99", Target("value", "<=", 200.0, "<=200 µs")),
            ("p999", "p99.9", None),
        ):
            out.append(
                Result(
                    name=f"latency{tag}: send_finding {label}",
                    n=n,
                    unit="µs",
                    wal=median(samples[arm][q]),
                    base=median(samples["raw"][q]),
                    base_label="sqlite3 commit+encode",
                    target=target,
                    detail=detail,
                    samples={arm: samples[arm][q], "raw": samples["raw"][q]},
                )
            )
    return out


def case_latency(ctx: Context) -> list[Result]:
    """``send_finding`` call time percentiles while the writer streams."""
    return asyncio.run(_latency(ctx))


#: name -> case, in the order the table shows them (memory and disk live in tools.bench.child).
CASES: dict[str, Callable[[Context], list[Result]]] = {
    "append": case_append,
    "e2e": case_e2e,
    "fast": case_fast,
    "replay": case_replay,
    "open": case_open,
    "latency": case_latency,
    "power": case_power,
}
