#!/usr/bin/env python3
"""Chaos suite: many real crashes aimed at the dangerous moments, audited against the engine store.

Everything is real: LocalEngine *processes* on loopback sharing a SQLite
store, the discovery process, harness processes (``tools/chaos_child.py``)
with their SQLite logs, SIGKILL, and the fault proxy
(:mod:`walchannel.testing.proxy`). Each scenario ends with an audit against
the engine store, the independent record: per run, the accepted seqs are
exactly ``1..N`` (no gap, nothing out of order), no gap was ever recorded,
every finding ``0..n-1`` was applied exactly once *by content*, the ``Done``
is the last message and was acked to the harness, and no seq was ever
handed out twice by the harness. It prints one line per scenario and exits
1 when any audit is not clean.

Scenarios (``--iterations`` sets each one's count; ``--all`` runs them all
with their defaults):

- ``harness-kill`` (200 kills): a harness streams findings with
  ``progress=`` and is SIGKILLed, then restarted on the same log. Lives are
  armed in turn at each named kill point (``WALCHANNEL_TEST_KILL_AT``,
  ``walchannel._killpoints``) or killed at a random moment; the fault proxy
  resets the link now and then so that replays happen inside one life.
- ``engine-kill`` (50 replacements): the engine process is SIGKILLed and a
  new one started on a new port (same store) while three runs stream;
  they follow it through discovery.
- ``network`` (8 cycles): the proxy cycles pass, reset, freeze, blackhole,
  latency and an idle timeout under one streaming run (keepalive 1 s,
  ``dead_stream_ms`` 3 s, a permissive engine); each freeze's detection
  time and the rule that found it are reported.
- ``both`` (80 events): engine replacements and harness kills interleaved.
- ``group-kill`` (24 kills): as ``harness-kill`` at random moments, the
  harness under ``group_commit`` (``max_rows`` 16, bursts of 1 to 8 steps
  per event-loop turn): what a crash costs. A kill takes the rows handed
  out in the pending group (the next life resumes below them, from its
  marker); it reports the rows lost per kill against the cap, and the
  audit holds as everywhere (exactly once by content).
- ``soak`` (``--minutes``, default 10): one run streams under periodic
  faults; RSS, open fds, asyncio tasks and threads must stay flat, and the
  log's disk size bounded by the backlog.

Usage::

    python tools/chaos.py --all
    python tools/chaos.py harness-kill --iterations 20
    python tools/chaos.py soak --minutes 10
    python tools/chaos.py soak --seconds 25

``CHAOS_SOAK_TRACE=1`` prints every soak sample (RSS, fds, threads, tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from walchannel import _killpoints  # noqa: E402
from walchannel.testing.proxy import FaultProxy  # noqa: E402
from walchannel.testing.store import EngineStore  # noqa: E402

if TYPE_CHECKING:
    from walchannel import GrpcChannelConfig

CHILD = ROOT / "tools" / "chaos_child.py"
POINTS: tuple[str, ...] = _killpoints.POINTS
CATEGORIES: tuple[str, ...] = (*POINTS, "random")
LIFE_TIMEOUT_S = 90.0

DEFAULTS = {"harness-kill": 200, "engine-kill": 50, "network": 8, "both": 80, "group-kill": 24}
SCENARIOS = ("harness-kill", "engine-kill", "network", "both", "group-kill", "soak")
#: ``group-kill``'s ``GroupCommit.max_rows``: a kill loses fewer rows than this.
GROUP_ROWS = 16


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("WALCHANNEL_TEST_KILL_AT", None)
    env.update(extra)
    return env


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _append(path: Path) -> Any:
    return path.open("ab")


# -- processes -----------------------------------------------------------------


class JsonProc:
    """A ``python -m MODULE`` child that prints one JSON line once it serves."""

    def __init__(self, proc: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.proc = proc
        self.info = info

    @classmethod
    async def start(
        cls, module: str, args: list[str], stderr: Path, *, stdin: bool = False
    ) -> JsonProc:
        with _append(stderr) as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=child_env(),
            )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            await proc.wait()
            raise RuntimeError(f"{module} printed nothing: {_tail(stderr)}")
        return cls(proc, json.loads(line))

    async def command(self, line: str) -> dict[str, Any]:
        """Send one stdin command (the proxy's process form) and read its answer."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        answer = await asyncio.wait_for(self.proc.stdout.readline(), 10)
        return dict(json.loads(answer))

    def signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        await self.proc.wait()


class Cluster:
    """Engine processes (one live at a time) and a discovery process on one store file."""

    def __init__(self, tmp: Path, *, ack_every: int = 1, discovery: bool = True) -> None:
        self.tmp = tmp
        self.store_path = tmp / "engine-store.sqlite3"
        self.ack_every = ack_every
        self.want_discovery = discovery
        self.engine: JsonProc | None = None
        self.discovery: JsonProc | None = None
        self.addrs: list[str] = []
        self.replacements = 0
        self._store: EngineStore | None = None

    @property
    def grpc_addr(self) -> str:
        return self.addrs[-1]

    @property
    def http_addr(self) -> str | None:
        return None if self.discovery is None else str(self.discovery.info["http_addr"])

    @property
    def store(self) -> EngineStore:
        if self._store is None:
            self._store = EngineStore(self.store_path)
        return self._store

    async def start(self) -> None:
        await self._start_engine()
        if self.want_discovery:
            self.discovery = await JsonProc.start(
                "walchannel.testing.discovery",
                ["--store", str(self.store_path)],
                self.tmp / "discovery.stderr",
            )

    async def _start_engine(self) -> None:
        for _ in range(10):
            engine = await JsonProc.start(
                "walchannel.testing.engine",
                ["--store", str(self.store_path), "--ack-every", str(self.ack_every)],
                self.tmp / "engines.stderr",
            )
            addr = str(engine.info["grpc_addr"])
            if addr not in self.addrs:
                self.engine = engine
                self.addrs.append(addr)
                return
            await engine.kill()  # the kernel handed back an old port: a NEW one is wanted
        raise RuntimeError("no new port for the engine")

    async def replace(self) -> None:
        """SIGKILL the live engine and start a new one on a new port (same store)."""
        if self.engine is not None:
            await self.engine.kill()
        await self._start_engine()
        self.replacements += 1

    def register(self, run_id: str, token: str) -> None:
        self.store.register_run(run_id, token)

    async def close(self) -> None:
        for proc in (self.engine, self.discovery):
            if proc is not None:
                await proc.kill()
        if self._store is not None:
            self._store.close()


# -- harness lives ----------------------------------------------------------------


@dataclass
class Run:
    """One scan run: its id, token, size, what the harness reported, how it ended."""

    run_id: str
    token: str
    n: int
    wal_dir: Path
    correlation_id: str = ""
    next: int = 0
    lives: int = 0
    finished: bool = False
    how: str = ""
    seq_of: dict[int, int] = field(default_factory=dict)  # finding n -> seq
    n_of: dict[int, int] = field(default_factory=dict)  # seq -> finding n
    problems: list[str] = field(default_factory=list)
    # Under group commit a kill may take rows handed out and never committed:
    # the next life resumes below them, and they are handed out again.
    grouped: bool = False
    lost: list[int] = field(default_factory=list)  # rows each life's end took

    def note(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "sent" and len(words) == 3:
            n, seq = int(words[1]), int(words[2])
            if n in self.seq_of:
                self.problems.append(f"finding {n} logged twice (seqs {self.seq_of[n]}, {seq})")
            if seq in self.n_of and self.n_of[seq] != n:
                self.problems.append(f"seq {seq} handed out twice ({self.n_of[seq]}, {n})")
            self.seq_of[n] = seq
            self.n_of[seq] = n
            self.next = max(self.next, n + 1)
        elif words[0] == "resume" and len(words) == 2:
            resume = int(words[1])
            gone = sorted(n for n in self.seq_of if n >= resume)
            if gone and not self.grouped:
                # Without group commit a seq handed out is committed with its marker.
                self.problems.append(
                    f"findings {gone[:5]} were logged, yet the log resumes at {resume}"
                )
            for n in gone:
                del self.n_of[self.seq_of.pop(n)]
            if self.lives > 1:
                self.lost.append(len(gone))
            self.next = resume
        elif words[0] in ("finished", "completed"):
            self.finished = True
            self.how = words[0]


def new_run(cluster: Cluster, tmp: Path, n: int, prefix: str) -> Run:
    run_id = f"{prefix}-{secrets.token_hex(4)}"
    run = Run(run_id, secrets.token_urlsafe(18), n, tmp / "wal", f"chaos-{run_id}")
    cluster.register(run.run_id, run.token)
    return run


def fast_config(run: Run, grpc_addr: str) -> GrpcChannelConfig:
    """An in-process channel that finds a frozen link in ~3 s (keepalive 1 s)."""
    from walchannel import Backoff, GrpcChannelConfig

    return GrpcChannelConfig(
        grpc_addr=grpc_addr,
        run_id=run.run_id,
        correlation_id=run.correlation_id,
        run_token=run.token,
        wal_dir=run.wal_dir,
        keepalive_ms=1000,
        dead_stream_ms=3000,
        connect_timeout_ms=2000,
        backoff=Backoff(initial_ms=50, multiplier=2, max_ms=500, jitter_ms=25),
        done_ack_timeout_ms=10_000,
        close_timeout_ms=1000,
    )


@dataclass
class Life:
    rc: int | None
    killed_by_us: bool
    hung: bool
    stderr: str
    said: str  # what the child printed other than "sent" lines (its verdict)

    def tail(self) -> str:
        """What a problem line quotes: the child's verdict, then its stderr's end."""
        return f"{self.said}{self.stderr[-800:]}"


async def live(
    run: Run,
    grpc_addr: str,
    http_addr: str | None,
    *,
    armed: str | None = None,
    kill_after_s: float | None = None,
    from_spawn: bool = False,
    pause: float = 0.003,
    pad: int = 0,
    extra: list[str] | None = None,
    timeout_s: float = LIFE_TIMEOUT_S,
    stop: asyncio.Event | None = None,
) -> Life:
    """Run one life of the harness child for ``run`` until it exits or is killed."""
    args = [
        str(CHILD),
        "--wal-dir",
        str(run.wal_dir),
        "--run-id",
        run.run_id,
        "--grpc-addr",
        grpc_addr,
        "--findings",
        str(run.n),
        "--pause",
        str(pause),
        "--pad",
        str(pad),
        *(extra or []),
    ]
    if http_addr is not None:
        args += ["--http-addr", http_addr]
    env = child_env(CHAOS_TOKEN=run.token)
    if armed is not None:
        env["WALCHANNEL_TEST_KILL_AT"] = armed
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    run.lives += 1
    assert proc.stdout is not None
    assert proc.stderr is not None
    err_chunks: list[bytes] = []
    said: list[str] = []
    resumed = asyncio.Event()

    async def read_out() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            text = line.decode(errors="replace")
            if text.startswith("resume"):
                resumed.set()
            if not text.startswith("sent"):
                said.append(text)
            run.note(text)

    async def read_err() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(65536):
            err_chunks.append(chunk)
            if len(err_chunks) > 64:
                del err_chunks[:32]

    readers = [asyncio.create_task(read_out()), asyncio.create_task(read_err())]
    killed = False
    hung = False
    waiter = asyncio.ensure_future(proc.wait())
    stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
    limit = timeout_s if kill_after_s is None else min(kill_after_s, timeout_s)
    if kill_after_s is not None and not from_spawn:
        # A random moment of the scan itself: counted from the handshake, not the imports.
        started = time.monotonic()
        resumed_wait = asyncio.ensure_future(resumed.wait())
        await asyncio.wait(
            [waiter, resumed_wait], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        resumed_wait.cancel()
        limit = min(kill_after_s, max(0.0, timeout_s - (time.monotonic() - started)))
    try:
        done, _ = await asyncio.wait(
            [w for w in (waiter, stopper) if w is not None],
            timeout=limit,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if waiter not in done:
            killed = True
            hung = kill_after_s is None and (stopper is None or stopper not in done)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            await waiter
    finally:
        if stopper is not None:
            stopper.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    err = b"".join(err_chunks).decode(errors="replace")
    return Life(proc.returncode, killed, hung, err, "".join(said[-5:]))


async def finish_runs(
    runs: list[Run], grpc_addr: Callable[[], str], http_addr: str | None, **kw: Any
) -> None:
    """Run every unfinished run, unarmed, until it finishes (a few lives at most)."""
    for run in runs:
        for _ in range(5):
            if run.finished:
                break
            result = await live(run, grpc_addr(), http_addr, pause=0.0, **kw)
            if result.rc not in (0, -signal.SIGKILL) or result.hung:
                run.problems.append(f"final life ended rc={result.rc}: {result.tail()}")


# -- the audit -----------------------------------------------------------------


@dataclass
class Audit:
    runs: int = 0
    messages: int = 0
    lost: int = 0
    twice: int = 0
    gaps: int = 0
    dup_seqs: int = 0
    done_acked: int = 0
    tombstones: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def line(self) -> str:
        return (
            f"runs={self.runs} messages={self.messages} lost={self.lost} "
            f"applied_twice={self.twice} gaps={self.gaps} dup_seqs={self.dup_seqs} "
            f"done_acked={self.done_acked}/{self.runs} tombstones={self.tombstones}/{self.runs} "
            f"audit={'clean' if self.clean else 'FAILED'}"
        )


def audit(store_path: Path, runs: list[Run]) -> Audit:
    """Check every run against the engine store (and the harness's own reports)."""
    from walchannel.errors import WalchannelError
    from walchannel.log import RunLog

    result = Audit()
    with EngineStore(store_path) as store:
        for run in runs:
            result.runs += 1
            bad = [f"{run.run_id}: {p}" for p in run.problems]
            accepted = store.accepted(run.run_id)
            result.messages += len(accepted)
            if accepted != list(range(1, len(accepted) + 1)):
                bad.append(f"{run.run_id}: accepted seqs are not 1..N")
            gaps = store.gaps(run.run_id)
            result.gaps += len(gaps)
            if gaps:
                bad.append(f"{run.run_id}: gaps recorded {gaps[:5]}")
            result.dup_seqs += store.duplicates(run.run_id)
            contents = Counter(
                int(b["body"]["fields"]["n"])
                for b in store.bodies(run.run_id)
                if b["kind"] == "finding"
            )
            lost = [i for i in range(run.n) if contents[i] == 0]
            twice = sorted(i for i, c in contents.items() if c > 1)
            strangers = sorted(i for i in contents if not 0 <= i < run.n)
            result.lost += len(lost)
            result.twice += len(twice)
            if lost:
                bad.append(f"{run.run_id}: {len(lost)} finding(s) lost, e.g. {lost[:5]}")
            if twice:
                bad.append(f"{run.run_id}: applied twice by content: {twice[:5]}")
            if strangers:
                bad.append(f"{run.run_id}: unknown findings {strangers[:5]}")
            done = store.done(run.run_id)
            if done is None or done["findings"] != run.n or done["seq"] != accepted[-1]:
                bad.append(f"{run.run_id}: Done missing or not last: {done}")
            if run.finished:
                result.done_acked += 1
            else:
                bad.append(f"{run.run_id}: the harness never saw its Done acked")
            try:
                with RunLog.open(run.wal_dir, run.run_id, correlation_id=run.correlation_id) as wal:
                    if wal.completed:
                        result.tombstones += 1
            except WalchannelError as exc:
                bad.append(f"{run.run_id}: cannot open its log: {exc}")
            result.problems += bad
    return result


# -- scenarios -----------------------------------------------------------------------


def pick_count(point: str, run: Run, rng: random.Random) -> int:
    """How many times ``point`` may be reached before the armed child dies."""
    remaining = max(1, run.n - run.next)
    if point in ("after_commit", "after_write"):
        return rng.randint(1, min(remaining, 60))
    if point == "after_ack_received":
        return rng.randint(1, max(1, min(remaining // 6, 12)))
    if point == "in_replay":
        return rng.randint(1, 3)
    return 1


async def harness_kill(tmp: Path, iterations: int, rng: random.Random) -> tuple[bool, str]:
    """Harness lives SIGKILLed at each named point and at random moments."""
    cluster = Cluster(tmp, ack_every=6, discovery=False)
    await cluster.start()
    proxy = FaultProxy(cluster.grpc_addr, latency_ms=3)
    await proxy.start()
    hits: Counter[str] = Counter()
    armed_lives: Counter[str] = Counter()
    runs: list[Run] = []
    hangs = 0
    flaps = asyncio.Event()
    current: list[Run] = []

    async def flapper() -> None:
        # Resets the link once the stream carries rows (with latency, some are in
        # flight), so that a life reconnects and replays; again after a pause.
        while True:
            await flaps.wait()
            run = current[0]
            start = run.next
            while flaps.is_set() and run.next < min(start + 15, run.n):  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            if flaps.is_set():
                proxy.reset_all()
            await asyncio.sleep(rng.uniform(0.4, 0.7))

    flapping = asyncio.create_task(flapper())
    try:
        run = new_run(cluster, tmp, 250, "hk")
        runs.append(run)
        turn = 0
        lives = 0
        # ``iterations`` kills (a life armed for a point it never reached ends on
        # its own and is not one), with a bound on the lives spent.
        while sum(hits.values()) < iterations and lives < 2 * iterations + 10:
            lives += 1
            if run.finished:
                run = new_run(cluster, tmp, 250, "hk")
                runs.append(run)
            category = CATEGORIES[turn % len(CATEGORIES)]
            if category == "random" and run.n - run.next < 60:
                # Too little left for a random moment to land in: a fresh run (the
                # old one is finished, unarmed, before the audit).
                run = new_run(cluster, tmp, 250, "hk")
                runs.append(run)
            armed = None
            kill_after = None
            from_spawn = False
            if category == "random":
                # Half of them during the start (imports, log open, dial, handshake),
                # half during the scan (counted from the handshake).
                from_spawn = rng.random() < 0.5
                kill_after = rng.uniform(0.25, 0.9) if from_spawn else rng.uniform(0.0, 0.5)
            else:
                armed = f"{category}:{pick_count(category, run, rng)}"
            armed_lives[category] += 1
            if category in ("in_replay", "random"):
                # Resets, and latency so that rows are in flight when one lands.
                proxy.latency_ms = 25
                flaps.set()
            else:
                proxy.latency_ms = 3
                flaps.clear()
            was_finished_before = run.how
            current[:] = [run]
            result = await live(
                run,
                proxy.addr,
                None,
                armed=armed,
                kill_after_s=kill_after,
                from_spawn=from_spawn,
            )
            flaps.clear()
            if not (run.how == "completed" and not was_finished_before and result.rc == 0):
                turn += 1  # a life that only found its run completed does not use up a turn
            else:
                armed_lives[category] -= 1
            if result.hung:
                hangs += 1
                run.problems.append(f"life {run.lives} hung ({armed}): {result.tail()}")
            elif result.rc == -signal.SIGKILL:
                if category == "random" and result.killed_by_us:
                    hits["random"] += 1
                elif category != "random" and not result.killed_by_us:
                    hits[category] += 1
            elif result.rc != 0:
                run.problems.append(f"life {run.lives} exited {result.rc}: {result.tail()}")
        await finish_runs(runs, lambda: proxy.addr, None)
    finally:
        flapping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flapping
        await proxy.stop()
        await cluster.close()
    result_audit = audit(cluster.store_path, runs)
    missed = [p for p in CATEGORIES if hits[p] == 0]
    ok = result_audit.clean and hangs == 0 and (not missed or iterations < 2 * len(CATEGORIES))
    if missed and iterations >= 2 * len(CATEGORIES):
        result_audit.problems.append(f"kill points never hit: {missed}")
    kills = " ".join(f"{p}={hits[p]}/{armed_lives[p]}" for p in CATEGORIES)
    return ok, (
        f"harness-kill: lives={sum(r.lives for r in runs)} kills={sum(hits.values())} "
        f"(hit/armed {kills}) hangs={hangs} {result_audit.line()}" + _problems(result_audit)
    )


async def group_kill(tmp: Path, iterations: int, rng: random.Random) -> tuple[bool, str]:
    """Harness lives under group commit SIGKILLed at random moments (SPEC "Group commit")."""
    cluster = Cluster(tmp, ack_every=6, discovery=False)
    await cluster.start()
    extra = ["--group-commit", str(GROUP_ROWS)]
    runs: list[Run] = []
    kills = hangs = lives = 0
    try:
        run = new_run(cluster, tmp, 400, "gk")
        run.grouped = True
        runs.append(run)
        while kills < iterations and lives < 3 * iterations + 10:
            lives += 1
            if run.finished or run.n - run.next < 60:
                run = new_run(cluster, tmp, 400, "gk")
                run.grouped = True
                runs.append(run)
            result = await live(
                run,
                cluster.grpc_addr,
                None,
                kill_after_s=rng.uniform(0.0, 0.5),
                pause=0.002,
                extra=extra,
            )
            if result.hung:
                hangs += 1
                run.problems.append(f"life {run.lives} hung: {result.tail()}")
            elif result.rc == -signal.SIGKILL and result.killed_by_us:
                kills += 1
            elif result.rc != 0:
                run.problems.append(f"life {run.lives} exited {result.rc}: {result.tail()}")
        await finish_runs(runs, lambda: cluster.grpc_addr, None, extra=extra)
    finally:
        await cluster.close()
    result_audit = audit(cluster.store_path, runs)
    lost = [n for r in runs for n in r.lost]
    worst = max(lost, default=0)
    if worst >= GROUP_ROWS:
        result_audit.problems.append(f"a kill took {worst} rows, the cap is {GROUP_ROWS}")
    ok = result_audit.clean and hangs == 0 and worst < GROUP_ROWS
    mean = statistics.fmean(lost) if lost else 0.0
    costly = sum(1 for n in lost if n)
    return ok, (
        f"group-kill: lives={sum(r.lives for r in runs)} kills={kills} hangs={hangs} "
        f"rows lost per kill: mean {mean:.2f}, max {worst} (cap {GROUP_ROWS}; {costly} of "
        f"{len(lost)} restarts lost any) {result_audit.line()}" + _problems(result_audit)
    )


async def engine_kill(tmp: Path, iterations: int, rng: random.Random) -> tuple[bool, str]:
    """Engine processes SIGKILLed and replaced on new ports while three runs stream."""
    cluster = Cluster(tmp)
    await cluster.start()
    runs: list[Run] = []
    slots: list[asyncio.Task[Life] | None] = [None, None, None]
    slot_runs: list[Run | None] = [None, None, None]
    problems: list[str] = []

    def refill() -> None:
        for k, task in enumerate(slots):
            if task is not None and not task.done():
                continue
            if task is not None:
                life = task.result()
                prev = slot_runs[k]
                assert prev is not None
                if life.hung or (life.rc != 0 and not life.killed_by_us):
                    prev.problems.append(f"life exited rc={life.rc}: {life.tail()}")
            run = new_run(cluster, tmp, 400, "ek")
            runs.append(run)
            slot_runs[k] = run
            slots[k] = asyncio.create_task(
                live(run, cluster.grpc_addr, cluster.http_addr, pause=0.004)
            )

    try:
        refill()
        for _ in range(iterations):
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            await cluster.replace()
            refill()
        for task in slots:
            if task is not None:
                life = await task
                if life.hung or life.rc != 0:
                    problems.append(f"last life rc={life.rc}: {life.tail()}")
        await finish_runs(runs, lambda: cluster.grpc_addr, cluster.http_addr)
    finally:
        await cluster.close()
    result = audit(cluster.store_path, runs)
    result.problems += problems
    return result.clean, (
        f"engine-kill: replacements={cluster.replacements} {result.line()}" + _problems(result)
    )


async def both(tmp: Path, iterations: int, rng: random.Random) -> tuple[bool, str]:
    """Engine replacements and harness kills (random moments and named points) interleaved."""
    cluster = Cluster(tmp, ack_every=4)
    await cluster.start()
    runs: list[Run] = []
    slots: list[asyncio.Task[Life] | None] = [None, None]
    slot_runs: list[Run | None] = [None, None]
    hits: Counter[str] = Counter()
    kills_by_us = 0
    stops = [asyncio.Event(), asyncio.Event()]

    def start_life(k: int) -> None:
        run = slot_runs[k]
        if run is None or run.finished:
            run = new_run(cluster, tmp, 200, "bo")
            runs.append(run)
            slot_runs[k] = run
        armed = None
        if rng.random() < 0.5:
            point = rng.choice(POINTS)
            armed = f"{point}:{pick_count(point, run, rng)}"
        stops[k] = asyncio.Event()
        slots[k] = asyncio.create_task(
            live(run, cluster.grpc_addr, cluster.http_addr, armed=armed, stop=stops[k])
        )
        slots[k].armed = armed  # type: ignore[attr-defined]

    def reap(k: int) -> None:
        nonlocal kills_by_us
        task = slots[k]
        if task is None or not task.done():
            return
        life = task.result()
        run = slot_runs[k]
        assert run is not None
        armed = getattr(task, "armed", None)
        if life.hung:
            run.problems.append(f"life hung ({armed}): {life.tail()}")
        elif life.rc == -signal.SIGKILL:
            if life.killed_by_us:
                kills_by_us += 1
            elif armed:
                hits[armed.split(":")[0]] += 1
        elif life.rc != 0:
            run.problems.append(f"life exited rc={life.rc}: {life.tail()}")
        slots[k] = None

    try:
        for k in range(2):
            start_life(k)
        for _ in range(iterations):
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            if rng.random() < 0.4:
                await cluster.replace()
            else:
                k = rng.randrange(2)
                stops[k].set()  # SIGKILL this life now, wherever it is
            for k in range(2):
                if slots[k] is not None and slots[k].done():  # type: ignore[union-attr]
                    reap(k)
                if slots[k] is None:
                    start_life(k)
        for k in range(2):
            if slots[k] is not None:
                await slots[k]  # type: ignore[misc]
                reap(k)
        await finish_runs(runs, lambda: cluster.grpc_addr, cluster.http_addr)
    finally:
        await cluster.close()
    result = audit(cluster.store_path, runs)
    points = " ".join(f"{p}={hits[p]}" for p in POINTS)
    return result.clean, (
        f"both: replacements={cluster.replacements} "
        f"harness_kills={kills_by_us + sum(hits.values())} (random={kills_by_us} {points})"
        f" lives={sum(r.lives for r in runs)} {result.line()}" + _problems(result)
    )


async def network(tmp: Path, iterations: int, rng: random.Random) -> tuple[bool, str]:
    """The proxy cycles its faults under one streaming run; freeze detection is timed."""
    from walchannel import ChannelState, GrpcEngineChannel

    cluster = Cluster(tmp, discovery=False)
    await cluster.start()
    proxy = FaultProxy(cluster.grpc_addr)
    await proxy.start()
    run = new_run(cluster, tmp, 0, "nw")
    config = fast_config(run, proxy.addr)
    detections: list[float] = []
    ends = _Ends()
    channel_logger = logging.getLogger("walchannel.channel")
    channel_logger.addHandler(ends)
    rules: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    problems: list[str] = []
    sent = 0
    sending = asyncio.Event()
    sending.set()
    channel = GrpcEngineChannel(config)

    async def sender() -> None:
        nonlocal sent
        while True:
            await sending.wait()
            pad = "x" * rng.choice((0, 100, 2000, 30_000))
            channel.send_finding(
                {"run": run.run_id, "n": sent, "pad": pad}, progress={"next": sent + 1}
            )
            sent += 1
            await asyncio.sleep(0.004)

    async def streaming(limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while channel.state is not ChannelState.STREAMING:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    task: asyncio.Task[None] | None = None
    try:
        await channel.handshake("1.0", "chaos-network", "1.0")
        task = asyncio.create_task(sender())
        for cycle in range(iterations):
            await asyncio.sleep(1.0)
            # reset: every flow RST, new ones too for a moment
            faults["reset"] += 1
            proxy.set_mode("reset")
            await asyncio.sleep(0.3)
            proxy.set_mode("pass")
            if not await streaming(10):
                problems.append(f"cycle {cycle}: no stream after reset")
            await asyncio.sleep(1.0)
            # freeze: a half-open link; must be found by keepalive or the dead-stream rule
            faults["freeze"] += 1
            t0 = time.monotonic()
            proxy.set_mode("freeze")
            while channel.state is ChannelState.STREAMING and time.monotonic() - t0 < 40:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            first = ends.first_after(t0)
            if channel.state is ChannelState.STREAMING or first is None:
                problems.append(f"cycle {cycle}: a freeze was not detected in 40 s")
            else:
                # When the rule fired (its own log line), not when the teardown ended.
                detections.append(first[0] - t0)
                text = first[1]
                rule = (
                    "dead_stream"
                    if "no down message" in text
                    else "stalled_write"
                    if "has been blocked" in text
                    else "keepalive"
                )
                rules[rule] += 1
            proxy.set_mode("pass")
            if not await streaming(10):
                problems.append(f"cycle {cycle}: no stream after freeze")
            await asyncio.sleep(0.5)
            # blackhole: the live flow is cut and new connections go nowhere
            faults["blackhole"] += 1
            proxy.set_mode("blackhole")
            proxy.reset_all()
            await asyncio.sleep(2.5)
            proxy.set_mode("pass")
            if not await streaming(10):
                problems.append(f"cycle {cycle}: no stream after blackhole")
            # latency both ways
            faults["latency"] += 1
            proxy.latency_ms = rng.choice((50, 150, 300))
            await asyncio.sleep(2.0)
            proxy.latency_ms = 0
            # idle timeout below the heartbeat period while the harness is quiet
            faults["idle_timeout"] += 1
            sending.clear()
            await asyncio.sleep(0.5)
            proxy.idle_timeout_s = 0.7
            await asyncio.sleep(2.5)
            proxy.idle_timeout_s = None
            sending.set()
            if not await streaming(10):
                problems.append(f"cycle {cycle}: no stream after idle timeouts")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        task = None
        run.n = sent
        acked = await channel.send_done("completed", sent, ["chaos"], "")
        if not acked:
            acked = await channel.wait_acked(timeout_ms=30_000)
        run.finished = acked
        stats = channel.stats()
    finally:
        channel_logger.removeHandler(ends)
        if task is not None:
            task.cancel()
        await channel.close()
        idle_resets = proxy.stats().idle_resets
        await proxy.stop()
        await cluster.close()
    result = audit(cluster.store_path, [run])
    result.problems += problems
    times = (
        f"min={min(detections):.2f}s median={statistics.median(detections):.2f}s "
        f"max={max(detections):.2f}s"
        if detections
        else "none"
    )
    rule_text = ",".join(f"{k}={v}" for k, v in sorted(rules.items()))
    fault_text = " ".join(f"{k}={v}" for k, v in faults.items())
    return result.clean, (
        f"network: cycles={iterations} faults({fault_text}) idle_resets={idle_resets} "
        f"reconnects={stats.reconnects} freeze_detection({times}; {rule_text}) {result.line()}"
        + _problems(result)
    )


class _Ends(logging.Handler):
    """Records when the channel declared a stream over, and why (for detection times)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.ends: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "the stream is dead" in text or " ended: " in text:
            self.ends.append((time.monotonic(), text))

    def first_after(self, t0: float) -> tuple[float, str] | None:
        return next(((t, m) for t, m in self.ends if t >= t0), None)


# -- soak ---------------------------------------------------------------------------------


def _proc_sample() -> dict[str, float]:
    rss_kib = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return {
        "rss_mib": rss_kib / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "tasks": len(asyncio.all_tasks()),
    }


def _log_bytes(wal_dir: Path, run_id: str) -> int:
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += (wal_dir / f"{run_id}.wal.sqlite3{suffix}").stat().st_size
    return total


async def soak(tmp: Path, seconds: float, rng: random.Random) -> tuple[bool, str]:
    """One run streams for ``seconds`` under periodic faults; resources must stay flat."""
    from walchannel import ChannelState, GrpcEngineChannel

    cluster = Cluster(tmp, discovery=False)
    await cluster.start()
    # The proxy runs as its own process: only the channel lives in this one.
    proxy = await JsonProc.start(
        "walchannel.testing.proxy",
        ["--target", cluster.grpc_addr],
        tmp / "proxy.stderr",
        stdin=True,
    )
    run = new_run(cluster, tmp, 0, "soak")
    config = fast_config(run, str(proxy.info["addr"]))
    channel = GrpcEngineChannel(config)
    samples: list[dict[str, float]] = []
    problems: list[str] = []
    faults: Counter[str] = Counter()
    peak_backlog = 0
    peak_log = 0
    sent = 0
    fault_every = max(3.0, min(20.0, seconds / 12))

    async def sender() -> None:
        nonlocal sent
        while True:
            pad = "x" * rng.choice((0, 50, 500, 4000))
            channel.send_finding(
                {"run": run.run_id, "n": sent, "pad": pad}, progress={"next": sent + 1}
            )
            sent += 1
            await asyncio.sleep(0.005)

    async def sampler() -> None:
        nonlocal peak_backlog, peak_log
        while True:
            samples.append(_proc_sample())
            if os.environ.get("CHAOS_SOAK_TRACE"):
                print(f"{time.monotonic():.0f} {samples[-1]}", flush=True)
            peak_backlog = max(peak_backlog, channel.stats().unacked_bytes)
            peak_log = max(peak_log, _log_bytes(run.wal_dir, run.run_id))
            await asyncio.sleep(0.5)

    async def streaming(limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while channel.state is not ChannelState.STREAMING:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    tasks: list[asyncio.Task[None]] = []
    kinds = ["reset", "freeze", "replace", "latency", "blackhole"]
    try:
        await channel.handshake("1.0", "chaos-soak", "1.0")
        tasks = [asyncio.create_task(sender()), asyncio.create_task(sampler())]
        end = time.monotonic() + seconds
        k = 0
        while time.monotonic() + fault_every < end:
            await asyncio.sleep(fault_every)
            kind = kinds[k % len(kinds)]
            k += 1
            faults[kind] += 1
            if kind == "reset":
                await proxy.command("reset_all")
            elif kind == "freeze":
                await proxy.command("freeze")
                t0 = time.monotonic()
                while channel.state is ChannelState.STREAMING and time.monotonic() - t0 < 30:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                await proxy.command("pass")
            elif kind == "replace":
                await cluster.replace()
                await proxy.command(f"target {cluster.grpc_addr}")
                await proxy.command("reset_all")
            elif kind == "latency":
                await proxy.command("latency 100")
                await asyncio.sleep(min(3.0, fault_every / 2))
                await proxy.command("latency 0")
            elif kind == "blackhole":
                await proxy.command("blackhole")
                await proxy.command("reset_all")
                await asyncio.sleep(min(2.5, fault_every / 2))
                await proxy.command("pass")
            if not await streaming(15):
                problems.append(f"no stream 15 s after {kind}")
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tasks = []
        run.n = sent
        acked = await channel.send_done("completed", sent, ["soak"], "")
        if not acked:
            acked = await channel.wait_acked(timeout_ms=30_000)
        run.finished = acked
    finally:
        for task in tasks:
            task.cancel()
        await channel.close()
        with contextlib.suppress(Exception):
            await proxy.command("quit")
        await proxy.kill()
        await cluster.close()
    result = audit(cluster.store_path, [run])
    result.problems += problems
    # Flatness: compare the second tenth of the run (after warm-up) with the last tenth.
    tenth = max(1, len(samples) // 10)
    early, late = samples[tenth : 2 * tenth], samples[-tenth:]

    def grew(key: str) -> float:
        return statistics.median(s[key] for s in late) - statistics.median(s[key] for s in early)

    growth = {key: grew(key) for key in ("rss_mib", "fds", "threads", "tasks")}
    peaks = {key: max(s[key] for s in samples) for key in ("rss_mib", "fds", "threads", "tasks")}
    bounds = {"rss_mib": 40.0, "fds": 8, "threads": 4, "tasks": 4}
    for key, bound in bounds.items():
        if growth[key] > bound:
            problems_text = f"{key} grew by {growth[key]:.1f} (bound {bound})"
            result.problems.append(problems_text)
    log_bound = 16 * 1024 * 1024 + 3 * peak_backlog
    if peak_log > log_bound:
        result.problems.append(
            f"log disk {peak_log} B above {log_bound} B (backlog peak {peak_backlog} B)"
        )
    grow_text = " ".join(f"{k}{v:+.1f}" for k, v in growth.items())
    peak_text = " ".join(f"{k}={v:.0f}" for k, v in peaks.items())
    return result.clean, (
        f"soak: seconds={seconds:.0f} faults({' '.join(f'{k}={v}' for k, v in faults.items())}) "
        f"growth({grow_text}) peaks({peak_text}) log_peak={peak_log / 2**20:.1f}MiB "
        f"backlog_peak={peak_backlog / 2**20:.1f}MiB {result.line()}" + _problems(result)
    )


def _problems(result: Audit) -> str:
    if result.clean:
        return ""
    return "\n  " + "\n  ".join(result.problems[:20])


# -- main -------------------------------------------------------------------------------


async def _run(names: list[str], args: argparse.Namespace) -> int:
    ok_all = True
    for name in names:
        tmp = Path(tempfile.mkdtemp(prefix=f"walchannel-chaos-{name}-"))
        rng = random.Random(args.seed if args.seed is not None else secrets.randbits(32))
        started = time.monotonic()
        scenario: Callable[..., Awaitable[tuple[bool, str]]]
        try:
            if name == "soak":
                seconds = args.seconds if args.seconds is not None else args.minutes * 60
                ok, line = await soak(tmp, seconds, rng)
            else:
                scenario = {
                    "harness-kill": harness_kill,
                    "engine-kill": engine_kill,
                    "network": network,
                    "both": both,
                    "group-kill": group_kill,
                }[name]
                iterations = args.iterations if args.iterations is not None else DEFAULTS[name]
                ok, line = await scenario(tmp, iterations, rng)
        except Exception as exc:  # a crash of the tool is a failed scenario, with its story
            import traceback

            ok, line = False, f"{name}: ERROR {exc!r}\n{traceback.format_exc()}"
        print(f"{line} ({time.monotonic() - started:.0f} s)", flush=True)
        ok_all = ok_all and ok
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            (tmp / "result.txt").write_text(line + "\n")
            print(f"  kept: {tmp}", flush=True)
    return 0 if ok_all else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/chaos.py",
        description="Chaos suite: real crashes and network faults, audited against the store.",
        epilog="example: python tools/chaos.py --all; python tools/chaos.py harness-kill "
        "--iterations 20",
    )
    parser.add_argument("scenario", nargs="?", choices=SCENARIOS)
    parser.add_argument("--all", action="store_true", help="every scenario with its defaults")
    parser.add_argument("--iterations", type=int, default=None, help="the scenario's count")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    parser.add_argument("--seconds", type=float, default=None, help="soak length in seconds")
    parser.add_argument("--seed", type=int, default=None, help="seed the random choices")
    parser.add_argument("--keep", action="store_true", help="keep the temp folders")
    parser.add_argument("--verbose", action="store_true", help="show the channels' warnings")
    args = parser.parse_args(argv)
    if args.all == (args.scenario is not None):
        parser.error("give one scenario or --all")
    names = list(SCENARIOS) if args.all else [args.scenario]
    if args.all:
        args.iterations = None
    # The in-process channels (network, soak) log every cut they survive: keep to errors.
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING if args.verbose else logging.ERROR)
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)
    print(
        f"chaos: {' '.join(names)} on {os.cpu_count()} cores, python {sys.version.split()[0]}",
        flush=True,
    )
    if args.all:
        return _run_each(args)
    return asyncio.run(_run(names, args))


def _run_each(args: argparse.Namespace) -> int:
    """``--all``: each scenario in a process of its own (the soak measures only itself)."""
    import subprocess

    started = time.monotonic()
    ok = True
    for name in SCENARIOS:
        command = [sys.executable, __file__, name, "--minutes", str(args.minutes)]
        for flag, value in (("--seed", args.seed), ("--seconds", args.seconds)):
            if value is not None:
                command += [flag, str(value)]
        command += ["--keep"] if args.keep else []
        command += ["--verbose"] if args.verbose else []
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
        sys.stdout.write("".join(done.stdout.splitlines(keepends=True)[1:]))
        sys.stdout.flush()
        ok = ok and done.returncode == 0
    print(f"chaos: {'all clean' if ok else 'FAILED'} ({time.monotonic() - started:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
