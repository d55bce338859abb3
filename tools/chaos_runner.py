#!/usr/bin/env python3
"""The runner through SIGKILLs and engine kills: ``walchannel run`` processes, audited by content.

Everything is real: LocalEngine processes on loopback sharing a store file
behind the discovery process (``tools/chaos.py``'s ``Cluster``), and the
harness as ``python -m walchannel run chaos_runner_harness:Harness`` with
``--concurrency`` items at once. The harness is SIGKILLed ``--kills`` times
at random moments and restarted on the same log; the engine is SIGKILLed
and replaced (a new port, found through discovery) ``--engine-kills`` times
among them; the last life runs to its end, which must be exit 0. The audit
reads the engine's store: the seqs applied are exactly ``1..N``, every
finding ``(item, n)`` was applied exactly once by content, every item's
event once, ``Done`` last with status ``completed`` and the count.

Usage::

    python tools/chaos_runner.py                       # 20 kills, 2 engine kills, 4 at once
    python tools/chaos_runner.py --kills 5 --items 400 --seed 7

Exit 0 when the audit is clean, 1 otherwise. docs/reliability.md has its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import ROOT, Cluster, child_env

LIFE_BOUND_S = 300.0


async def life(argv: list[str], env: dict[str, str], log: Path, kill_after: float | None) -> int:
    """One harness process: SIGKILLed after ``kill_after`` s (None: to its end); its code."""
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT / "tools", env=env, stdout=err, stderr=err
        )
    try:
        async with asyncio.timeout(kill_after):
            return await proc.wait()
    except TimeoutError:
        proc.send_signal(signal.SIGKILL)
        return await proc.wait()


async def run(args: argparse.Namespace, tmp: Path) -> int:
    rng = random.Random(args.seed)
    cluster = Cluster(tmp)
    await cluster.start()
    try:
        run_id, token = f"runner-{secrets.token_hex(4)}", secrets.token_urlsafe(18)
        cluster.register(run_id, token)
        manifest = tmp / "manifest.json"
        deadline = datetime.now(UTC) + timedelta(hours=6)
        manifest.write_text(
            json.dumps(
                {
                    "runId": run_id,
                    "correlationId": f"corr-{run_id}",
                    "runToken": token,
                    "hardDeadline": deadline.isoformat(),
                    "grpcAddr": cluster.grpc_addr,
                    "httpAddr": cluster.http_addr,
                }
            )
        )
        manifest.chmod(0o600)
        argv = [
            sys.executable, "-m", "walchannel", "run", "chaos_runner_harness:Harness",
            "--manifest", str(manifest), "--wal-dir", str(tmp / "wal"),
            "--concurrency", str(args.concurrency), "--progress-every", "0",
        ]  # fmt: skip
        env = child_env(RUNNER_ITEMS=str(args.items), RUNNER_PACE_S=str(args.pace))
        engine_kills = sorted(rng.sample(range(1, args.kills + 1), args.engine_kills))
        t0 = time.monotonic()
        codes: Counter[int] = Counter()
        early: list[str] = []
        for k in range(1, args.kills + 1):
            if k in engine_kills:
                await cluster.replace()
                print(f"kill {k}: the engine replaced (now {cluster.grpc_addr})", flush=True)
            code = await life(argv, env, tmp / "harness.log", rng.uniform(0.3, 2.0))
            codes[code] += 1
            if code != -signal.SIGKILL:
                # Not a kill mid-run: the proof is thinner than asked.
                print(f"kill {k}: the harness ended {code} before its kill", flush=True)
                early.append(f"life {k} ended {code} before its kill: raise --items")
        code = await life(argv, env, tmp / "harness.log", LIFE_BOUND_S)
        wall = time.monotonic() - t0
        problems = early + audit(cluster, run_id, args.items)
        if code != 0:
            problems.append(f"the last life exited {code}, not 0")
        findings = sum(i % 5 for i in range(args.items))
        print(
            f"runner: {args.kills} harness SIGKILLs ({codes[-signal.SIGKILL]} mid-run),"
            f" {args.engine_kills} engine kills, concurrency {args.concurrency}, {args.items}"
            f" items, {findings} findings: {'clean' if not problems else 'NOT CLEAN'}"
            f" ({wall:.1f} s)"
        )
        for problem in problems:
            print(f"  - {problem}")
        if problems:
            print(f"  harness log: {tmp / 'harness.log'}")
        return 1 if problems else 0
    finally:
        await cluster.close()


def audit(cluster: Cluster, run_id: str, items: int) -> list[str]:
    """What the engine's store says against the work: every finding and event exactly once."""
    problems: list[str] = []
    store = cluster.store
    accepted = store.accepted(run_id)
    if accepted != list(range(1, len(accepted) + 1)):
        problems.append(f"the seqs applied are not 1..{len(accepted)}")
    if store.gaps(run_id):
        problems.append(f"gaps recorded: {store.gaps(run_id)[:5]}")
    found: Counter[tuple[str, int]] = Counter()
    events: Counter[str] = Counter()
    bodies = store.bodies(run_id)
    for message in bodies:
        body = message["body"]
        if message["kind"] == "finding":
            found[(body["fields"]["item"], int(body["fields"]["n"]))] += 1
        elif message["kind"] == "event" and body["type"] == "scan.item":
            events[body["payload"]["item"]] += 1
    want = Counter({(f"item-{i:05}", n): 1 for i in range(items) for n in range(i % 5)})
    twice = sum(n - 1 for n in found.values() if n > 1)
    lost = sum(1 for key in want if key not in found)
    if twice or lost or set(found) - set(want):
        problems.append(f"findings: {twice} applied twice, {lost} lost, by content")
    if set(events) != {f"item-{i:05}" for i in range(items)} or set(events.values()) != {1}:
        problems.append("an item's event is missing or applied twice")
    done = store.done(run_id)
    if done is None or bodies[-1]["kind"] != "done":
        problems.append("no Done, or not the last message")
    elif done["status"] != "completed" or int(done["findings"]) != sum(want.values()):
        problems.append(f"Done says {done['status']} with {done['findings']} findings")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="harness SIGKILLs (default 20)")
    parser.add_argument("--engine-kills", type=int, default=2, help="engine kills (default 2)")
    parser.add_argument("--items", type=int, default=6000, help="work items (default 6000)")
    parser.add_argument("--concurrency", type=int, default=4, help="items at once (default 4)")
    parser.add_argument("--pace", type=float, default=0.01, help="each scan's time, s (0.01)")
    parser.add_argument("--seed", type=int, default=None, help="seed the kill moments")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args(argv)
    if not 0 <= args.engine_kills <= args.kills:
        parser.error("--engine-kills must be between 0 and --kills")
    tmp = Path(tempfile.mkdtemp(prefix="chaos-runner-"))
    try:
        return asyncio.run(run(args, tmp))
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
