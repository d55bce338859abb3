"""Memory and disk cases, each arm run in a child process of its own.

RSS is read from ``/proc/self/status`` (``VmRSS``) inside the child, so one
arm's heap never counts against the other. The parent side
(:func:`case_memory`) starts the children and makes the rows; the child
side is ``python -m tools.bench.child ARM --n N ...``, printing one JSON
line.

Arms:

- ``unacked-wal``: a ``GrpcEngineChannel`` pointed at a closed port (engine
  down, the loop dialing with backoff) logs ``n`` findings; all stay unacked.
- ``unacked-mem``: the baseline, the design note's in-memory ``#unacked``
  buffer: every encoded ``UpMessage`` kept in a dict by seq until acked.
- ``streamed-wal`` / ``streamed-bare``: ``n`` findings streamed to an engine
  acking every ``lag`` messages; the producer keeps at most ``1.5 x lag``
  unacked (an ack lag of about ``lag``). The walchannel arm also reports the
  log's size (database plus ``-wal``).
- ``disk-naive``: the disk baseline, no network: a plain SQLite queue table
  (WAL, ``synchronous=NORMAL``, SQLite's defaults otherwise) with one insert
  per message and a delete of the acked rows every ``lag`` inserts, trailing
  by ``lag``.
- ``backlog-wal`` (case ``backlog``, run only when asked: ``--only
  backlog``): issue 13's scenario. ``n`` findings of ~300 bytes are logged
  with the engine down, then a second channel on the same log replays them
  to an engine that acks them all; the log's size is taken when all are
  acked, once idle, after ``close()`` and after ``RunLog.checkpoint()`` by
  hand. ``--inspect`` runs ``walchannel inspect --json`` in a tight loop in
  another process during the drain and the idle wait.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.bench.common import (
    RUN_TOKEN,
    Result,
    Target,
    closed_port,
    disk_bytes,
    finding,
    interleave,
    median,
    rss_bytes,
)
from tools.bench.engine import ROOT, child_env

__all__ = ["case_backlog", "case_memory", "main"]

_SAMPLE_EVERY = 5_000
_MB = 1e6


class _Peak:
    def __init__(self) -> None:
        self.rss0 = rss_bytes()
        self.rss_peak = self.rss0
        self.disk_peak = 0

    def sample(self, db: Path | None = None) -> None:
        self.rss_peak = max(self.rss_peak, rss_bytes())
        if db is not None:
            self.disk_peak = max(self.disk_peak, disk_bytes(db))


def _config(addr: str, run_id: str, folder: Path, **extra: Any) -> Any:
    from walchannel.config import Backoff, GrpcChannelConfig

    return GrpcChannelConfig(
        grpc_addr=addr,
        run_id=run_id,
        correlation_id=f"corr-{run_id}",
        run_token=RUN_TOKEN,
        wal_dir=folder,
        backoff=Backoff(initial_ms=500, multiplier=2, max_ms=15_000, jitter_ms=250),
        **extra,
    )


async def _unacked_wal(n: int, folder: Path) -> dict[str, Any]:
    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.errors import EngineUnavailableError

    ch = GrpcEngineChannel(
        _config(f"127.0.0.1:{closed_port()}", "mem-unacked", folder, connect_timeout_ms=300)
    )
    try:
        # The engine is down: the channel keeps dialing, sends are logged.
        with contextlib.suppress(EngineUnavailableError):
            await ch.handshake("bench", "walchannel", "1")
        peak = _Peak()
        t0 = time.perf_counter()
        for i in range(n):
            ch.send_finding(finding(i))
            await asyncio.sleep(0)
            if i % _SAMPLE_EVERY == 0:
                peak.sample()
        elapsed = time.perf_counter() - t0
        peak.sample()
        end = rss_bytes()
        assert ch.unacked_count == n, ch.unacked_count
        db = ch.log.path
    finally:
        await ch.close()
    return {
        "rss0": peak.rss0,
        "peak": peak.rss_peak - peak.rss0,
        "end": end - peak.rss0,
        "rate": n / elapsed,
        "disk": disk_bytes(db),
    }


def _unacked_mem(n: int) -> dict[str, Any]:
    from walchannel.wire import protobuf as wire

    unacked: dict[int, bytes] = {}
    peak = _Peak()
    t0 = time.perf_counter()
    for i in range(n):
        seq = i + 1
        msg = wire.up_message(
            "mem-unacked", "corr-mem-unacked", seq, "finding", {"fields": finding(i)}
        )
        unacked[seq] = msg.SerializeToString()
        if i % _SAMPLE_EVERY == 0:
            peak.sample()
    elapsed = time.perf_counter() - t0
    peak.sample()
    end = rss_bytes()
    assert len(unacked) == n
    return {
        "rss0": peak.rss0,
        "peak": peak.rss_peak - peak.rss0,
        "end": end - peak.rss0,
        "rate": n / elapsed,
    }


async def _streamed_wal(addr: str, run_id: str, n: int, lag: int, folder: Path) -> dict[str, Any]:
    from walchannel.channel.grpc_channel import GrpcEngineChannel

    window = lag + lag // 2
    ch = GrpcEngineChannel(_config(addr, run_id, folder, connect_timeout_ms=30_000))
    db = ch.log.path
    try:
        await ch.handshake("bench", "walchannel", "1")
        peak = _Peak()
        t0 = time.perf_counter()
        last = 0
        for i in range(n):
            if last - ch.last_acked_seq >= window:
                await ch.wait_acked(last - window + 1, timeout_ms=600_000)
            last = ch.send_finding(finding(i))
            await asyncio.sleep(0)
            if i % _SAMPLE_EVERY == 0:
                peak.sample(db)
        if not await ch.wait_acked(last, timeout_ms=600_000):
            raise RuntimeError(f"seq {last} not acked")
        elapsed = time.perf_counter() - t0
        peak.sample(db)
        end = rss_bytes()
        disk_end = disk_bytes(db)
        await asyncio.sleep(0.5)  # the coalesced ack is stored within ~100 ms
        disk_stored = disk_bytes(db)
    finally:
        await ch.close()
    return {
        "rss0": peak.rss0,
        "peak": peak.rss_peak - peak.rss0,
        "end": end - peak.rss0,
        "rate": n / elapsed,
        "disk_end": disk_end,
        "disk_peak": peak.disk_peak,
        "disk_stored": disk_stored,
        "disk_closed": disk_bytes(db),
    }


async def _streamed_bare(addr: str, run_id: str, n: int, lag: int) -> dict[str, Any]:
    from tools.bench.bare import BareStream

    window = lag + lag // 2
    stream = BareStream(addr, run_id)
    try:
        await stream.open()
        peak = _Peak()
        t0 = time.perf_counter()
        for i in range(n):
            if stream.unacked >= window:
                await asyncio.wait_for(stream.wait_acked(stream.next_seq - window), 600)
            await stream.send(finding(i))
            if i % _SAMPLE_EVERY == 0:
                peak.sample()
        await asyncio.wait_for(stream.wait_acked(stream.next_seq - 1), 600)
        elapsed = time.perf_counter() - t0
        peak.sample()
        end = rss_bytes()
    finally:
        await stream.close()
    return {
        "rss0": peak.rss0,
        "peak": peak.rss_peak - peak.rss0,
        "end": end - peak.rss0,
        "rate": n / elapsed,
    }


def _disk_naive(n: int, lag: int, folder: Path) -> dict[str, Any]:
    import sqlite3

    import msgpack

    db = folder / "naive.sqlite3"
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE rows (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body BLOB NOT NULL,"
        " crc32 INTEGER NOT NULL, appended_at REAL NOT NULL)"
    )
    peak = 0
    for i in range(1, n + 1):
        blob = msgpack.packb({"fields": finding(i)}, use_bin_type=True)
        conn.execute(
            "INSERT INTO rows VALUES (?, ?, ?, ?, ?)",
            (i, "finding", blob, zlib.crc32(blob), time.time()),
        )
        if i % lag == 0:
            conn.execute("DELETE FROM rows WHERE seq <= ?", (i - lag,))
        if i % _SAMPLE_EVERY == 0:
            peak = max(peak, disk_bytes(db))
    conn.execute("DELETE FROM rows WHERE seq <= ?", (n,))
    end = disk_bytes(db)
    conn.close()
    return {"disk_end": end, "disk_peak": max(peak, end), "disk_closed": disk_bytes(db)}


# A finding whose msgpack row body is ~300 bytes, as in issue 13.
_BACKLOG_PAD = "p" * 270
# "Shrunk": within this of an empty log (bytes).
_SHRUNK = 1_000_000
# How long the idle wait may take before it is reported as not shrunk (seconds).
_IDLE_WAIT_S = 60.0

_INSPECT_LOOP = """
import contextlib, io, os, sys
from walchannel.cli import main
log, stop = sys.argv[1], sys.argv[2]
n = 0
while not os.path.exists(stop):
    with contextlib.redirect_stdout(io.StringIO()):
        main(["inspect", log, "--json"])
    n += 1
print(n)
"""


async def _backlog_wal(
    addr: str, run_id: str, n: int, folder: Path, *, inspect: bool
) -> dict[str, Any]:
    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.errors import EngineUnavailableError
    from walchannel.log.writer import RunLog

    down = GrpcEngineChannel(
        _config(f"127.0.0.1:{closed_port()}", run_id, folder, connect_timeout_ms=300)
    )
    db = down.log.path
    try:
        with contextlib.suppress(EngineUnavailableError):
            await down.handshake("bench", "walchannel", "1")
        for i in range(n):
            down.send_finding({"n": i, "pad": _BACKLOG_PAD})
            await asyncio.sleep(0)
        assert down.unacked_count == n, down.unacked_count
        row_bytes = down.log.unacked_bytes / n
    finally:
        await down.close()
    logged = disk_bytes(db)
    stop = folder / "stop-inspect"
    poller = None
    if inspect:
        poller = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _INSPECT_LOOP,
            str(db),
            str(stop),
            cwd=ROOT,
            env=child_env(),
            stdout=asyncio.subprocess.PIPE,
        )
    stall = [0.0]

    async def watch_loop() -> None:
        # The longest the event loop went without running this task (s).
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stall[0] = max(stall[0], time.perf_counter() - t - 0.01)

    ch = GrpcEngineChannel(_config(addr, run_id, folder, connect_timeout_ms=30_000))
    watcher = asyncio.create_task(watch_loop())
    try:
        t0 = time.perf_counter()
        await ch.handshake("bench", "walchannel", "1")  # the backlog replays
        if not await ch.wait_acked(timeout_ms=600_000):
            raise RuntimeError(f"run {run_id}: the backlog was not acked")
        drain_s = time.perf_counter() - t0
        acked = disk_bytes(db)
        drain_stall, stall[0] = stall[0], 0.0
        t1 = time.perf_counter()
        shrink_s = float("nan")
        while time.perf_counter() - t1 < _IDLE_WAIT_S:
            if disk_bytes(db) < _SHRUNK:
                shrink_s = time.perf_counter() - t1
                break
            await asyncio.sleep(0.05)
        idle = disk_bytes(db)
    finally:
        watcher.cancel()
        await ch.close()
        polls = 0
        if poller is not None:
            stop.touch()
            out, _ = await asyncio.wait_for(poller.communicate(), 60)
            polls = int(out.strip() or 0)
    closed = disk_bytes(db)
    with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as wal:
        rows = wal.unacked_count
        wal.checkpoint()
    return {
        "row_bytes": row_bytes,
        "logged": logged,
        "drain_s": drain_s,
        "acked": acked,
        "shrink_s": shrink_s,
        "idle": idle,
        "closed": closed,
        "by_hand": disk_bytes(db),
        "rows": rows,
        "polls": polls,
        "drain_stall_ms": drain_stall * 1000,
        "idle_stall_ms": stall[0] * 1000,
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.child")
    parser.add_argument(
        "arm",
        choices=(
            "unacked-wal",
            "unacked-mem",
            "streamed-wal",
            "streamed-bare",
            "disk-naive",
            "backlog-wal",
        ),
    )
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--lag", type=int, default=1_000)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--addr", default="")
    parser.add_argument("--run-id", default="")
    parser.add_argument("--inspect", default="0", help="1: poll inspect during the drain")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.arm == "unacked-wal":
        out = asyncio.run(_unacked_wal(args.n, args.dir))
    elif args.arm == "unacked-mem":
        out = _unacked_mem(args.n)
    elif args.arm == "streamed-wal":
        out = asyncio.run(_streamed_wal(args.addr, args.run_id, args.n, args.lag, args.dir))
    elif args.arm == "streamed-bare":
        out = asyncio.run(_streamed_bare(args.addr, args.run_id, args.n, args.lag))
    elif args.arm == "backlog-wal":
        out = asyncio.run(
            _backlog_wal(args.addr, args.run_id, args.n, args.dir, inspect=args.inspect == "1")
        )
    else:
        out = _disk_naive(args.n, args.lag, args.dir)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


# -- the parent side ------------------------------------------------------------------


def _run_child(arm: str, n: int, folder: Path, **options: Any) -> dict[str, float]:
    argv = [sys.executable, "-m", "tools.bench.child", arm, "--n", str(n), "--dir", str(folder)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(
        argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {arm} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {k: float(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def case_memory(ctx: Any) -> list[Result]:
    """RSS growth with ``n`` unacked (engine down) and while ``n`` stream; the log's disk size."""
    s = ctx.sizes
    n_mem, n_disk, lag = s.memory_msgs, s.disk_msgs, s.disk_lag
    ctx.say(f"memory: {n_mem} unacked, engine down (children) x {s.child_reps}")
    unacked = interleave(
        {
            "wal": lambda: _run_child("unacked-wal", n_mem, ctx.fresh_dir("mem-wal-")),
            "mem": lambda: _run_child("unacked-mem", n_mem, ctx.fresh_dir("mem-buf-")),
        },
        s.child_reps,
    )
    engine = ctx.engines.get(lag)
    ctx.say(f"memory/disk: {n_disk} streamed, engine ack every {lag} (children) x {s.child_reps}")
    streamed = interleave(
        {
            "wal": lambda: _run_child(
                "streamed-wal",
                n_disk,
                ctx.fresh_dir("stream-wal-"),
                addr=engine.grpc_addr,
                run_id=engine.new_run("stream"),
                lag=lag,
            ),
            "bare": lambda: _run_child(
                "streamed-bare",
                n_disk,
                ctx.fresh_dir("stream-bare-"),
                addr=engine.grpc_addr,
                run_id=engine.new_run("stream-bare"),
                lag=lag,
            ),
        },
        s.child_reps,
    )
    ctx.say(f"disk: naive SQLite queue, {n_disk} rows, lag {lag}")
    naive = interleave(
        {"naive": lambda: _run_child("disk-naive", n_disk, ctx.fresh_dir("disk-naive-"), lag=lag)},
        s.child_reps,
    )
    w, b = unacked["wal"], unacked["mem"]
    sw, sb = streamed["wal"], streamed["bare"]
    nv = naive["naive"]
    return [
        Result(
            name="memory: RSS growth, unacked (engine down)",
            n=n_mem,
            unit="MB",
            wal=median(w["peak"]) / _MB,
            base=median(b["peak"]) / _MB,
            base_label="in-memory #unacked",
            target=Target("value", "<=", 50.0, "<=50 MB"),
            detail=(
                f"end +{median(w['end']) / _MB:.1f} MB; log {median(w['disk']) / _MB:.0f} MB; "
                f"{median(w['rate']):,.0f} sends/s"
            ),
            samples={"wal": w, "mem": b},
        ),
        Result(
            name="memory: RSS growth, streamed+acked",
            n=n_disk,
            unit="MB",
            wal=median(sw["peak"]) / _MB,
            base=median(sb["peak"]) / _MB,
            base_label="bare grpc.aio",
            target=None,
            detail=(
                f"ack/{lag}, <= {lag + lag // 2} unacked; "
                f"{median(sw['rate']):,.0f} vs {median(sb['rate']):,.0f} msgs/s"
            ),
            samples={"wal": sw, "bare": sb},
        ),
        Result(
            name="disk: db+wal after all acked",
            n=n_disk,
            unit="MB",
            wal=median(sw["disk_end"]) / _MB,
            base=median(nv["disk_end"]) / _MB,
            base_label="naive sqlite3 queue",
            target=Target("value", "<=", 16.0, "<=16 MB"),
            detail=(
                f"lag ~{lag}; peak {median(sw['disk_peak']) / _MB:.1f} MB, "
                f"+0.5 s {median(sw['disk_stored']) / _MB:.1f} MB, "
                f"closed {median(sw['disk_closed']) / _MB:.1f} MB"
            ),
            samples={"wal": sw, "naive": nv},
        ),
    ]


def case_backlog(ctx: Any) -> list[Result]:
    """Issue 13: a backlog logged with the engine down, then acked: is its disk given back?"""
    s = ctx.sizes
    engine = ctx.engines.get(s.disk_lag)
    rows = []
    for n, inspect in ((s.backlog_msgs, False), (s.backlog_inspect_msgs, True)):
        what = " while inspect --json polls" if inspect else ""
        ctx.say(f"backlog: {n} findings logged with the engine down, then acked{what}")
        out = interleave(
            {
                "wal": lambda n=n, inspect=inspect: _run_child(
                    "backlog-wal",
                    n,
                    ctx.fresh_dir("backlog-"),
                    addr=engine.grpc_addr,
                    run_id=engine.new_run("backlog"),
                    inspect=int(inspect),
                )
            },
            s.child_reps,
        )["wal"]
        rows.append(
            Result(
                name=f"disk: backlog acked, idle{' (inspect polling)' if inspect else ''}",
                n=n,
                unit="MB",
                wal=median(out["idle"]) / _MB,
                base=median(out["logged"]) / _MB,
                base_label="log before the drain",
                target=Target("value", "<=", _SHRUNK / _MB, f"<={_SHRUNK / _MB:.0f} MB"),
                detail=(
                    f"idle {median(out['idle']) / _MB:.2f} MB; "
                    f"{median(out['row_bytes']):.0f} B rows; drained in "
                    f"{median(out['drain_s']):.1f} s, {median(out['acked']) / _MB:.1f} MB then; "
                    f"shrunk {median(out['shrink_s']):.1f} s later; closed "
                    f"{median(out['closed']) / _MB:.2f} MB; checkpoint() by hand "
                    f"{median(out['by_hand']) / _MB:.2f} MB; "
                    f"longest event-loop stall {median(out['drain_stall_ms']):.0f} ms draining, "
                    f"{median(out['idle_stall_ms']):.0f} ms idle"
                    + (f"; {median(out['polls']):.0f} inspect runs" if inspect else "")
                ),
                samples={"wal": out},
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
