"""``python -m demo``: a real bandit scan streamed through engine and harness kills, audited.

It starts a local engine process and a discovery process on one store,
runs :mod:`demo.bandit_harness` as a child over a real code tree, and
part-way through (a) SIGKILLs the engine process and starts a replacement
on a new port, and (b) SIGKILLs the harness and starts it again on the same
log. It prints the engine's accepted finding count at each phase and ends
with an audit against an independent bandit run (``python -m bandit``) over
the same files, keyed by (path, line_number, col_offset, test_id): every
real finding applied exactly once by content, duplicates dropped by seq,
gaps 0, lost 0, Done acked. Exit 0 only if the audit holds.
"""

from __future__ import annotations

import argparse
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from demo.audit import (
    Key,
    applied_findings,
    bandit_installed,
    expected_findings,
    start_audit_scan,
)
from demo.options import scan_inputs
from demo.processes import HARNESS, child_env, start_engine_and_discovery, start_process
from demo.progress import engine_progress, progress_line, read_marker, resume_line

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Run the demo; return 0 only when the audit holds (2: bandit missing or no files).

    Args:
        args: the parsed ``python -m demo`` options (:mod:`demo.options`).
    """
    from walchannel.testing.store import EngineStore

    if not bandit_installed():
        return 2
    inputs = scan_inputs(args, "walchannel-demo-")
    if inputs is None:
        return 2
    tree, files, workdir = inputs
    store_path = workdir / "engine-store.sqlite3"
    wal_dir = workdir / "wal"
    run_id = f"demo-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(24)
    env = child_env(token)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)

    print(f"demo: bandit over {tree} ({len(files)} files); work dir {workdir}")
    procs: list[subprocess.Popen[Any]] = []
    with (workdir / "processes.log").open("w") as plog:
        try:
            engine, info, dinfo = start_engine_and_discovery(store_path, run_id, env, plog, procs)
            say(f"engine pid {engine.pid} at {info['grpc_addr']}; discovery {dinfo['http_addr']}")
            report = workdir / "independent-bandit.json"
            audit_proc = start_audit_scan(files, report, plog)
            procs.append(audit_proc)
            harness_cmd = [
                *HARNESS,
                "--run-id",
                run_id,
                "--grpc-addr",
                str(info["grpc_addr"]),
                "--http-addr",
                str(dinfo["http_addr"]),
                "--wal-dir",
                str(wal_dir),
                "--tree",
                str(tree),
                "--token-env",
                "DEMO_TOKEN",
                "--pace",
                str(args.pace),
            ]
            if args.limit is not None:
                harness_cmd += ["--limit", str(args.limit)]

            def start_harness() -> subprocess.Popen[str]:
                proc = subprocess.Popen(
                    [sys.executable, *harness_cmd], stdout=plog, stderr=plog, text=True, env=env
                )
                procs.append(proc)
                return proc

            harness = start_harness()
            say(f"harness pid {harness.pid} streaming run {run_id}")
            store = EngineStore(store_path)
            counts: list[int] = []
            phase = "engine"
            last_line = 0.0
            while True:
                bodies = store.bodies(run_id)
                findings, scanned = engine_progress(bodies)
                fraction = scanned / len(files)
                now = time.monotonic()
                if now - last_line >= 2.0:
                    last_line = now
                    say(progress_line(bodies, len(files), read_marker(wal_dir, run_id)))
                if phase == "engine" and fraction >= args.engine_kill_at:
                    counts.append(findings)
                    say(f">>> SIGKILL engine pid {engine.pid} (findings at engine: {findings})")
                    engine.send_signal(signal.SIGKILL)
                    engine.wait()
                    engine, info = start_process(
                        ["-m", "walchannel.testing.engine", "--store", str(store_path)], env, plog
                    )
                    procs.append(engine)
                    say(f">>> replacement engine pid {engine.pid} at {info['grpc_addr']}")
                    phase = "harness"
                elif phase == "harness" and fraction >= args.harness_kill_at:
                    counts.append(findings)
                    say(f">>> SIGKILL harness pid {harness.pid} (findings at engine: {findings})")
                    harness.send_signal(signal.SIGKILL)
                    harness.wait()
                    resume = resume_line(read_marker(wal_dir, run_id), len(files))
                    say(f">>> harness restarted on the same log; {resume}")
                    harness = start_harness()
                    phase = "finish"
                code = harness.poll()
                if code is not None:
                    if phase != "finish":
                        say("the harness finished before every kill point (narrow --pace up)")
                    say(f"harness exited {code}")
                    break
                time.sleep(0.1)
            audit_proc.wait()
            final = store.bodies(run_id)
            counts.append(sum(1 for b in final if b["kind"] == "finding"))
            print("findings at engine: " + " -> ".join(str(c) for c in counts))
            ok = code == 0 and phase == "finish"
            ok &= _report(store, run_id, final, expected_findings(report, tree), len(files))
            ok &= _tombstone(wal_dir, run_id)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    # CPU seconds, this process's and its waited-for children's (the harnesses,
    # the engines, the audit's bandit): unlike the wall time, a busy machine
    # barely changes them (README "make demo").
    cpu = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    wall = time.monotonic() - started
    print("PASS" if ok else "FAIL", f"({wall:.1f} s, {cpu:.0f} s of CPU)")
    if ok and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"work dir kept: {workdir}")
    return 0 if ok else 1


def _tombstone(wal_dir: Path, run_id: str) -> bool:
    from walchannel.log.writer import RunLog

    with RunLog.open(wal_dir, run_id, correlation_id=f"bandit-{run_id}") as wal:
        completed = wal.completed
    print(f"  harness log is a tombstone:      {'yes' if completed else 'no'}")
    return completed


def _report(
    store: Any, run_id: str, bodies: list[dict[str, Any]], expected: Counter[Key], n: int
) -> bool:
    applied = applied_findings(bodies)
    accepted = store.accepted(run_id)
    gaps = store.gaps(run_id)
    holes = len(accepted) - (accepted[-1] if accepted else 0)
    exactly_once = sum(1 for key, want in expected.items() if applied.get(key, 0) == want)
    lost = sum(max(0, want - applied.get(key, 0)) for key, want in expected.items())
    twice = sum(max(0, got - expected.get(key, 0)) for key, got in applied.items())
    done = store.done(run_id)
    done_ok = done is not None and done["findings"] == sum(expected.values())
    total = sum(expected.values())
    print(f"audit against an independent bandit run ({total} findings, {n} files):")
    print(f"  applied exactly once by content: {exactly_once} / {len(expected)} locations")
    print(f"  duplicates dropped by seq:       {store.duplicates(run_id)}")
    print(f"  gaps:                            {len(gaps) + abs(holes)}")
    print(f"  lost:                            {lost}")
    print(f"  applied twice by content:        {twice}")
    print(
        "  Done acked:                      "
        + (f"yes (seq {done['seq']}, {done['findings']} findings)" if done else "no")
    )
    return (
        exactly_once == len(expected)
        and lost == 0
        and twice == 0
        and not gaps
        and holes == 0
        and done_ok
        and sum(expected.values()) > 0
    )
