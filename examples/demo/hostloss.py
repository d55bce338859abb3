"""``python -m demo --host-loss``: a replicated bandit scan survives losing its machine.

Like ``python -m demo`` (a local engine process and a discovery process on
one store, :mod:`demo.bandit_harness` as the harness), but each
"machine" is a folder ``host-N/wal`` replicated by a ``litestream
replicate`` sidecar to ``replica/host-N``. At each loss point the whole
machine goes: Litestream and the harness are SIGKILLed together and the
folder is deleted. The run's log is restored from the replica into the next
machine's folder, a new sidecar and a new harness start there, and the
harness resumes from the restored progress marker.

The audit, against an independent bandit run over the same files: every
real finding applied at least once (lost 0 from what the engine acked),
no seq with two contents at the engine, gaps 0, Done acked; findings
applied twice by content only inside each loss window (the files between
the replicated progress marker and the lost one), counted with the
measured replication lag. ``tools/chaos_hostloss.py`` runs the same
machinery many times at random loss points.
"""

from __future__ import annotations

import argparse
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from demo.audit import (
    Key,
    applied_findings,
    bandit_installed,
    expected_findings,
    start_audit_scan,
)
from demo.options import scan_inputs
from demo.processes import HARNESS, child_env, start_engine_and_discovery

__all__ = ["Figures", "HostLoss", "Outcome", "audit", "figures", "run", "stream_with_host_losses"]

_DIFFERS = re.compile(r"run (\S+): duplicate seq \d+ \(\w+\) differs from the applied message")


@dataclass
class HostLoss:
    """One lost machine, measured.

    Attributes:
        at_fraction: the share of files at the engine when it was lost.
        findings_at_engine: findings the engine held then.
        lost_last_seq: the last seq the lost log held (gone with the machine).
        restored_last_seq: the last seq in the replica (0: no replica yet).
        lag_s: how far the replica was behind the lost log (seconds between
            their last meta updates; None without a replica).
        lost_next_file: the lost log's progress marker (next file to scan).
        restored_next_file: the replica's marker: where the new harness resumes.
    """

    at_fraction: float
    findings_at_engine: int
    lost_last_seq: int
    restored_last_seq: int
    lag_s: float | None
    lost_next_file: int
    restored_next_file: int

    @property
    def rows_lost(self) -> int:
        """Rows committed on the lost machine that the replica did not have."""
        return self.lost_last_seq - self.restored_last_seq


@dataclass
class Outcome:
    """What a replicated run with host losses did (see :func:`stream_with_host_losses`)."""

    run_id: str
    code: int | None
    losses: list[HostLoss] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    gaps: int = 0
    two_contents: int = 0
    done: dict[str, Any] | None = None
    completed: bool = False
    seconds: float = 0.0


def _log_state(wal_dir: Path, run_id: str) -> tuple[int, float, int]:
    """(last seq, meta updated_at, marker's next_file) of a log, read-only."""
    from walchannel.log import files
    from walchannel.log.reader import LogReader
    from walchannel.log.state import next_seq_at_open

    path = files.log_path(wal_dir, run_id)
    if not path.exists():
        return 0, 0.0, 0
    with LogReader(path, run_id) as reader:
        snap = reader.snapshot()
    meta = snap.meta
    last = next_seq_at_open(meta.high_water, snap.top_seq, meta.last_acked_seq) - 1
    return last, meta.updated_at, int((meta.progress or {}).get("next", 0))


def _tombstone(wal_dir: Path, run_id: str) -> bool:
    from walchannel.log import files
    from walchannel.log.reader import LogReader

    path = files.log_path(wal_dir, run_id)
    if not path.exists():
        return False
    with LogReader(path, run_id) as reader:
        return reader.meta().completed_at is not None


def stream_with_host_losses(
    *,
    tree: Path,
    files: list[Path],
    limit: int | None,
    workdir: Path,
    loss_at: list[float],
    sync_interval_s: float,
    pace: float,
    say: Callable[[str], None],
    plog: IO[str],
    durability: str = "process",
) -> Outcome:
    """Stream one bandit run, losing its machine at each fraction of ``loss_at``.

    Starts an engine and a discovery process on ``workdir/engine-store.sqlite3``
    and a harness on ``host-0`` replicated to ``replica/host-0`` (a file
    replica); at each loss point SIGKILLs Litestream and the harness, deletes
    the machine's folder, restores the log into the next machine and resumes.

    Returns:
        The outcome; ``code`` is the last harness's exit status.
    """
    from walchannel.log.replication import ReplicationError, Replicator, restore
    from walchannel.testing.store import EngineStore

    started = time.monotonic()
    store_path = workdir / "engine-store.sqlite3"
    run_id = f"hostloss-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(24)
    env = child_env(token)
    outcome = Outcome(run_id=run_id, code=None)
    procs: list[subprocess.Popen[Any]] = []
    replicator: Replicator | None = None
    try:
        _, info, dinfo = start_engine_and_discovery(store_path, run_id, env, plog, procs)

        def machine(n: int) -> tuple[Path, str]:
            return workdir / f"host-{n}" / "wal", (workdir / "replica" / f"host-{n}").as_uri()

        def start_machine(n: int) -> tuple[Replicator, subprocess.Popen[str]]:
            wal_dir, url = machine(n)
            rep = Replicator(wal_dir, url, sync_interval_s=sync_interval_s, log_file=plog)
            rep.start()
            cmd = [
                *HARNESS, "--run-id", run_id, "--grpc-addr", str(info["grpc_addr"]),
                "--http-addr", str(dinfo["http_addr"]), "--wal-dir", str(wal_dir),
                "--tree", str(tree), "--token-env", "DEMO_TOKEN", "--pace", str(pace),
                "--durability", durability,
            ]  # fmt: skip
            if limit is not None:
                cmd += ["--limit", str(limit)]
            proc = subprocess.Popen(
                [sys.executable, *cmd], stdout=plog, stderr=plog, text=True,
                env=rep.child_env(env),
            )  # fmt: skip
            procs.append(proc)
            return rep, proc

        host = 0
        replicator, harness = start_machine(host)
        say(
            f"host-{host}: harness pid {harness.pid} streams run {run_id} "
            f"(durability={durability!r}); Litestream pid {replicator.pid} replicates its log "
            f"every {sync_interval_s:g} s"
        )
        store = EngineStore(store_path)
        pending = sorted(loss_at)
        while True:
            bodies = store.bodies(run_id)
            scanned = {
                b["body"]["payload"]["path"]
                for b in bodies
                if b["kind"] == "event" and b["body"]["type"] == "scan.file"
            }
            fraction = len(scanned) / len(files)
            if pending and fraction >= pending[0]:
                pending.pop(0)
                findings = sum(1 for b in bodies if b["kind"] == "finding")
                # The machine is lost: its processes die at once, then its disk goes.
                replicator.kill()
                harness.send_signal(signal.SIGKILL)
                harness.wait()
                wal_dir, url = machine(host)
                lost_seq, lost_at, lost_next = _log_state(wal_dir, run_id)
                shutil.rmtree(wal_dir.parent)
                host += 1
                new_dir, _ = machine(host)
                try:
                    restored = restore(run_id, url, new_dir)
                except ReplicationError as exc:
                    say(f"    no replica to restore ({exc}); host-{host} starts an empty log")
                    loss = HostLoss(fraction, findings, lost_seq, 0, None, lost_next, 0)
                else:
                    marker = restored.meta.progress or {}
                    loss = HostLoss(
                        fraction,
                        findings,
                        lost_seq,
                        restored.next_seq - 1,
                        max(0.0, lost_at - restored.meta.updated_at),
                        lost_next,
                        int(marker.get("next", 0)),
                    )
                outcome.losses.append(loss)
                lag = (
                    f"the replica was {loss.lag_s:.2f} s behind"
                    if loss.lag_s is not None
                    else "no replica yet"
                )
                say(
                    f">>> host-{host - 1} LOST at {fraction:.0%} of the files (engine holds "
                    f"{findings} findings): Litestream and harness SIGKILLed, folder deleted"
                )
                window = (
                    f"files {loss.restored_next_file + 1}..{loss.lost_next_file}"
                    if loss.lost_next_file > loss.restored_next_file
                    else "no file"
                )
                say(f"    {lag}: {loss.rows_lost} rows ({window}) were only on the lost machine")
                replicator, harness = start_machine(host)
                say(
                    f">>> restored on host-{host}; harness pid {harness.pid} resumes with file "
                    f"{loss.restored_next_file + 1} (seqs up to {loss.restored_last_seq} restored)"
                )
            code = harness.poll()
            if code is not None:
                outcome.code = code
                if pending:
                    say("the harness finished before every loss point (narrow --pace up)")
                break
            time.sleep(0.1)
        replicator.stop()
        replicator = None
        final = store.bodies(run_id)
        outcome.bodies = final
        accepted = store.accepted(run_id)
        holes = abs(len(accepted) - (accepted[-1] if accepted else 0))
        outcome.gaps = len(store.gaps(run_id)) + holes
        outcome.done = store.done(run_id)
        outcome.completed = _tombstone(machine(host)[0], run_id)
        store.close()
    finally:
        if replicator is not None:
            replicator.kill()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    plog.flush()
    text = Path(plog.name).read_text(errors="replace")
    outcome.two_contents = sum(1 for m in _DIFFERS.finditer(text) if m.group(1) == run_id)
    outcome.seconds = time.monotonic() - started
    return outcome


@dataclass
class Figures:
    """The audit of one replicated run with host losses."""

    expected_findings: int
    locations: int
    exactly_once: int
    twice: int
    twice_outside_windows: int
    lost: int
    ok: bool


def figures(outcome: Outcome, expected: Counter[Key], files: list[Path], tree: Path) -> Figures:
    """Audit ``outcome`` against ``expected`` (by content: path, line, column, test id)."""
    applied = applied_findings(outcome.bodies)
    index = {str(p.relative_to(tree)): i for i, p in enumerate(files)}
    exactly_once = sum(1 for key, want in expected.items() if applied.get(key, 0) == want)
    lost = sum(max(0, want - applied.get(key, 0)) for key, want in expected.items())
    extra = {key: got - expected.get(key, 0) for key, got in applied.items()}
    windows = [(loss.restored_next_file, loss.lost_next_file) for loss in outcome.losses]
    outside = sum(
        n
        for key, n in extra.items()
        if n > 0 and not any(a <= index.get(key[0], -1) < b for a, b in windows)
    )
    done = outcome.done
    total = sum(expected.values())
    ok = (
        outcome.code == 0
        and lost == 0
        and outside == 0
        and outcome.two_contents == 0
        and outcome.gaps == 0
        and done is not None
        and done["findings"] == total
        and outcome.completed
        and total > 0
    )
    return Figures(
        expected_findings=total,
        locations=len(expected),
        exactly_once=exactly_once,
        twice=sum(n for n in extra.values() if n > 0),
        twice_outside_windows=outside,
        lost=lost,
        ok=ok,
    )


def audit(outcome: Outcome, expected: Counter[Key], files: list[Path], tree: Path) -> bool:
    """Print the host-loss audit of ``outcome`` against ``expected``; True when it holds."""
    fig = figures(outcome, expected, files, tree)
    done = outcome.done
    lags = ", ".join(
        f"{loss.lag_s:.2f} s / {loss.rows_lost} rows" if loss.lag_s is not None else "no replica"
        for loss in outcome.losses
    )
    inside = "yes" if not fig.twice_outside_windows else f"no, {fig.twice_outside_windows} outside"
    print(
        f"audit against an independent bandit run ({fig.expected_findings} findings, "
        f"{len(files)} files):"
    )
    print(f"  applied exactly once by content: {fig.exactly_once} / {fig.locations} locations")
    print(
        f"  duplicates by content:           {fig.twice} (all in the loss windows: {inside}; "
        f"replica lag {lags or 'none'})"
    )
    print(f"  seqs with two contents:          {outcome.two_contents}")
    print(f"  gaps:                            {outcome.gaps}")
    print(f"  lost (from what the engine acked): {fig.lost}")
    print(
        "  Done acked:                      "
        + (f"yes (seq {done['seq']}, {done['findings']} findings)" if done else "no")
    )
    print(f"  last log is a tombstone:         {'yes' if outcome.completed else 'no'}")
    return fig.ok


def run(args: argparse.Namespace) -> int:
    """``python -m demo --host-loss``: return 0 only when the audit holds.

    Args:
        args: the parsed ``python -m demo`` options (:mod:`demo.options`).

    Returns:
        0 when the audit holds, 1 when it does not, 2 when bandit, Litestream
        or the tree's files are missing.
    """
    from walchannel.log.replication import ReplicationError, find_litestream

    if not bandit_installed():
        return 2
    try:
        find_litestream()
    except ReplicationError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    inputs = scan_inputs(args, "walchannel-hostloss-")
    if inputs is None:
        return 2
    tree, files, workdir = inputs
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)

    print(f"demo --host-loss: bandit over {tree} ({len(files)} files); work dir {workdir}")
    with (workdir / "processes.log").open("w") as plog:
        report = workdir / "independent-bandit.json"
        audit_proc = start_audit_scan(files, report, plog)
        try:
            outcome = stream_with_host_losses(
                tree=tree,
                files=files,
                limit=args.limit,
                workdir=workdir,
                loss_at=[args.host_loss_at],
                sync_interval_s=args.sync_interval,
                pace=args.pace,
                say=say,
                plog=plog,
                durability=args.durability,
            )
        finally:
            audit_proc.wait()
        say(f"harness exited {outcome.code}")
        ok = audit(outcome, expected_findings(report, tree), files, tree)
        ok &= len(outcome.losses) == 1
    print("PASS" if ok else "FAIL", f"({time.monotonic() - started:.1f} s)")
    if ok and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"work dir kept: {workdir}")
    return 0 if ok else 1
