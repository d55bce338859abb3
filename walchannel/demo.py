"""``walchannel demo``: a real bandit scan streamed through engine and harness kills, audited.

It starts a local engine process and a discovery process on one store,
runs :mod:`walchannel.bandit_harness` as a child over a real code tree, and
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
import importlib.util
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from walchannel import bandit_harness

if TYPE_CHECKING:
    from walchannel.log_format import RunMeta

__all__ = [
    "add_arguments",
    "engine_progress",
    "progress_line",
    "read_marker",
    "resume_line",
    "run",
]

Key = tuple[str, int, int, str]


#: The harness the demo runs, as a child: ``python -m`` this module.
HARNESS = ("-m", "walchannel.bandit_harness")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to its subcommand parser."""
    parser.add_argument(
        "--tree", help="code tree to scan (default: this interpreter's standard library)"
    )
    parser.add_argument("--limit", type=int, help="scan only the first N files (default: all)")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="pause per file in the harness, so the kills land in a small tree "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--workdir", help="keep the store and logs here (default: a temp dir, removed after a PASS)"
    )
    parser.add_argument(
        "--engine-kill-at",
        type=float,
        default=0.15,
        metavar="FRACTION",
        help="(a) SIGKILL the engine process and start a replacement on a new port once "
        "this fraction of the files reached the engine (default: %(default)s)",
    )
    parser.add_argument(
        "--host-loss",
        action="store_true",
        help="instead: replicate the log with Litestream, lose the whole machine (harness and "
        "Litestream SIGKILLed, its folder deleted), restore the log on another, resume",
    )
    parser.add_argument(
        "--host-loss-at",
        type=float,
        default=0.4,
        metavar="FRACTION",
        help="with --host-loss: lose the machine once this fraction of the files reached "
        "the engine (default: %(default)s)",
    )
    parser.add_argument(
        "--sync-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="with --host-loss: Litestream's sync interval (default: %(default)s)",
    )
    parser.add_argument(
        "--durability",
        choices=("process", "replicated"),
        default="process",
        help="with --host-loss: the harness's durability; 'replicated' writes a row to the "
        "engine only once the replica holds it (default: %(default)s)",
    )
    parser.add_argument(
        "--harness-kill-at",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="(b) SIGKILL the harness and restart it on the same log once this fraction "
        "of the files reached the engine (default: %(default)s)",
    )


def _start(args: list[str], env: dict[str, str], log: IO[str]) -> tuple[subprocess.Popen[str], Any]:
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=log, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"{' '.join(args)} did not start (see {log.name})")
    return proc, json.loads(line)


def _audit_scan(files: list[Path], out: Path, log: IO[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bandit", "-q", "-f", "json", "-o", str(out), *map(str, files)],
        stdout=log,
        stderr=log,
    )


def _expected(report: Path, tree: Path) -> Counter[Key]:
    data = json.loads(report.read_text())
    return Counter(
        (
            str(Path(r["filename"]).resolve().relative_to(tree)),
            int(r["line_number"]),
            int(r["col_offset"]),
            str(r["test_id"]),
        )
        for r in data["results"]
    )


def _applied(bodies: list[dict[str, Any]]) -> Counter[Key]:
    return Counter(
        (
            str(f["path"]),
            int(f["line_number"]),
            int(f["col_offset"]),
            str(f["test_id"]),
        )
        for b in bodies
        if b["kind"] == "finding"
        for f in [b["body"]["fields"]]
    )


def bandit_installed() -> bool:
    """True when bandit can be imported; else say how to get it (stderr) and return False."""
    if importlib.util.find_spec("bandit") is not None:
        return True
    print(
        "walchannel demo: bandit is not installed: the demo scans with it."
        ' Install walchannel with its demo extra (README "Installing it"),'
        " or `pip install bandit`",
        file=sys.stderr,
    )
    return False


def run(args: argparse.Namespace) -> int:
    """Run the demo; return 0 only when the audit holds (2: bandit missing or no files)."""
    from walchannel.testing.store import EngineStore

    if not bandit_installed():
        return 2
    tree = Path(args.tree).resolve() if args.tree else bandit_harness.default_tree()
    files = bandit_harness.scan_files(tree, args.limit)
    if not files:
        print(f"walchannel demo: no Python files under {tree}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="walchannel-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "engine-store.sqlite3"
    wal_dir = workdir / "wal"
    run_id = f"demo-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(24)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")) if p
    )
    env["DEMO_TOKEN"] = token
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)

    print(f"walchannel demo: bandit over {tree} ({len(files)} files); work dir {workdir}")
    procs: list[subprocess.Popen[Any]] = []
    with (workdir / "processes.log").open("w") as plog:
        try:
            engine, info = _start(
                ["-m", "walchannel.testing.engine", "--store", str(store_path)], env, plog
            )
            procs.append(engine)
            discovery, dinfo = _start(
                ["-m", "walchannel.testing.discovery", "--store", str(store_path)], env, plog
            )
            procs.append(discovery)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "walchannel.testing.engine",
                    "register",
                    "--store",
                    str(store_path),
                    "--run-id",
                    run_id,
                    "--token-env",
                    "DEMO_TOKEN",
                ],
                check=True,
                env=env,
                stdout=plog,
                stderr=plog,
            )
            say(f"engine pid {engine.pid} at {info['grpc_addr']}; discovery {dinfo['http_addr']}")
            report = workdir / "independent-bandit.json"
            audit_proc = _audit_scan(files, report, plog)
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
                    engine, info = _start(
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
            ok &= _report(store, run_id, final, _expected(report, tree), len(files))
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


def engine_progress(bodies: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """What the engine holds of the scan: ``(findings, files)``.

    Files are the distinct ``scan.file`` events by index: a harness killed
    between a file's event and its findings sends the event again (its
    findings never), so counting events would count that file twice.

    Args:
        bodies: the engine's applied messages (``LocalEngine.bodies`` shape).
    """
    findings = 0
    files: set[int] = set()
    for b in bodies:
        if b["kind"] == "finding":
            findings += 1
        elif b["kind"] == "event" and b["body"]["type"] == "scan.file":
            files.add(int(b["body"]["payload"]["index"]))
    return findings, len(files)


def read_marker(wal_dir: Path, run_id: str) -> RunMeta | str | None:
    """The harness log's meta, read-only (its ``progress`` is the marker).

    Returns:
        The meta; None when the log does not exist yet; or why it could not
        be read (the demo goes on: the audit tells the truth).
    """
    from walchannel import files
    from walchannel.log_reader import LogReader

    path = files.log_path(wal_dir, run_id)
    if not path.exists():
        return None
    try:
        with LogReader(path, run_id) as reader:
            return reader.meta()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _marker_text(meta: RunMeta | str | None, total: int) -> tuple[str, int | None]:
    """``harness marker: N/TOTAL files scanned`` and N (None: no marker)."""
    if isinstance(meta, str):
        return f"harness marker: unreadable ({meta})", None
    marker = (meta.progress if meta is not None else None) or {}
    if "next_file" not in marker:
        return "harness marker: none yet", None
    done = int(marker["next_file"])
    return f"harness marker: {done}/{total} files scanned", done


def progress_line(bodies: Sequence[dict[str, Any]], total: int, meta: RunMeta | str | None) -> str:
    """The demo's progress line: what the engine holds, then the harness's marker.

    The two can differ: the marker counts the files whose rows the harness
    committed to its log (where a restart resumes, as :func:`resume_line`
    says), the engine the files whose event it applied; rows logged and not
    yet delivered (a killed harness's, until its restart replays them) are
    the difference.

    Args:
        bodies: the engine's applied messages.
        total: the files of the scan.
        meta: :func:`read_marker`'s answer.
    """
    findings, scanned = engine_progress(bodies)
    marker, _ = _marker_text(meta, total)
    return f"engine holds {findings} findings from {scanned}/{total} files; {marker}"


def resume_line(meta: RunMeta | str | None, total: int) -> str:
    """Where a restarted harness resumes: after the files its marker counts, as the progress line.

    Args:
        meta: :func:`read_marker`'s answer.
        total: the files of the scan.
    """
    marker, done = _marker_text(meta, total)
    if done is None or isinstance(meta, str) or meta is None:
        return f"{marker}: it starts with file 1"
    found = int((meta.progress or {}).get("findings", 0))
    return (
        f"{marker}, {found} findings logged (seqs up to {meta.high_water} logged, "
        f"up to {meta.last_acked_seq} acked): it resumes with file {done + 1}"
    )


def _tombstone(wal_dir: Path, run_id: str) -> bool:
    from walchannel.log import RunLog

    with RunLog.open(wal_dir, run_id, correlation_id=f"bandit-{run_id}") as wal:
        completed = wal.completed
    print(f"  harness log is a tombstone:      {'yes' if completed else 'no'}")
    return completed


def _report(
    store: Any, run_id: str, bodies: list[dict[str, Any]], expected: Counter[Key], n: int
) -> bool:
    applied = _applied(bodies)
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
