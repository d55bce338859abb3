#!/usr/bin/env python3
"""Chaos loop for host loss: many lost machines at random times, each restored and resumed.

Everything is real (``demo.hostloss``): a LocalEngine process
and a discovery process on one store, ``demo.bandit_harness`` as the
harness, a ``litestream replicate`` sidecar per "machine" (a folder) with a
file replica. A loss SIGKILLs Litestream and the harness together and
deletes the machine's folder; the log is restored from the replica into the
next machine, which resumes. Runs go on until ``--losses`` machines were
lost (1 or 2 per run, at random fractions of the files). Each run is audited
against an independent bandit scan of the same files: no seq with two
contents at the engine, no gap, nothing the engine acked lost, every
finding applied at least once, duplicates by content only inside the loss
windows, every run completed (Done acked, tombstone). It prints one line per
run, then the loss-window figures; exit 1 when any audit fails.

``--sync-intervals 0.1,1,5`` repeats the loop for each Litestream sync
interval and prints one table row per interval (the loss window vs the
interval, docs/reliability.md).

Usage::

    python tools/chaos_hostloss.py                       # 20 losses, sync every 1 s
    python tools/chaos_hostloss.py --losses 20 --sync-intervals 0.25,1,4 --seed 1
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))  # the demo

from demo import audit, bandit_harness, hostloss  # noqa: E402


def _expected(files: list[Path], tree: Path, workdir: Path) -> Any:
    report = workdir / "independent-bandit.json"
    with (workdir / "bandit.log").open("w") as log:
        proc = audit.start_audit_scan(files, report, log)
        proc.wait()
    return audit.expected_findings(report, tree)


def loop(
    *,
    losses: int,
    sync_interval_s: float,
    tree: Path,
    files: list[Path],
    expected: Any,
    pace: float,
    rng: random.Random,
    workroot: Path,
    keep: bool,
    durability: str,
) -> dict[str, Any]:
    done_losses: list[hostloss.HostLoss] = []
    runs: list[dict[str, Any]] = []
    failures = 0
    while len(done_losses) < losses:
        count = min(losses - len(done_losses), rng.choice((1, 2)))
        points = sorted(round(rng.uniform(0.05, 0.9), 3) for _ in range(count))
        workdir = Path(tempfile.mkdtemp(prefix="hostloss-", dir=workroot))
        with (workdir / "processes.log").open("w") as plog:
            outcome = hostloss.stream_with_host_losses(
                tree=tree,
                files=files,
                limit=None,
                workdir=workdir,
                loss_at=points,
                sync_interval_s=sync_interval_s,
                pace=pace,
                say=lambda _text: None,
                plog=plog,
                durability=durability,
            )
        fig = hostloss.figures(outcome, expected, files, tree)
        ok = fig.ok and len(outcome.losses) == count
        failures += not ok
        done_losses.extend(outcome.losses)
        runs.append({"ok": ok, "twice": fig.twice, "seconds": outcome.seconds})
        lines = "; ".join(
            f"lost at {x.at_fraction:.0%}: {x.rows_lost} rows, lag "
            + (f"{x.lag_s:.2f} s" if x.lag_s is not None else "- (no replica)")
            for x in outcome.losses
        )
        print(
            f"{'ok  ' if ok else 'FAIL'} run {outcome.run_id}: {lines}; twice by content "
            f"{fig.twice} (outside windows {fig.twice_outside_windows}), two contents "
            f"{outcome.two_contents}, gaps {outcome.gaps}, lost {fig.lost}, "
            f"completed {'yes' if outcome.completed else 'NO'} ({outcome.seconds:.1f} s)",
            flush=True,
        )
        if ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            print(f"     kept {workdir}", flush=True)
    replicated = [x for x in done_losses if x.lag_s is not None]
    rows = [x.rows_lost for x in done_losses]
    lags = [x.lag_s for x in replicated if x.lag_s is not None]
    twice = [r["twice"] for r in runs]
    return {
        "durability": durability,
        "sync_interval_s": sync_interval_s,
        "runs": len(runs),
        "losses": len(done_losses),
        "failed_runs": failures,
        "no_replica_yet": len(done_losses) - len(replicated),
        "rows_lost_mean": statistics.fmean(rows) if rows else 0.0,
        "rows_lost_max": max(rows, default=0),
        "lag_s_mean": statistics.fmean(lags) if lags else 0.0,
        "lag_s_max": max(lags, default=0.0),
        "twice_by_content_per_loss": sum(twice) / max(1, len(done_losses)),
        "twice_by_content_max_run": max(twice, default=0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--losses", type=int, default=20, help="machines to lose (default 20)")
    parser.add_argument(
        "--sync-intervals",
        default="1",
        help="comma-separated Litestream sync intervals, seconds (default 1)",
    )
    parser.add_argument(
        "--tree",
        default=str(Path(sysconfig.get_paths()["stdlib"]) / "email"),
        help="code tree to scan (default: the standard library's email package)",
    )
    parser.add_argument(
        "--pace", type=float, default=0.25, help="harness pause per file, s (default 0.25)"
    )
    parser.add_argument(
        "--durability",
        choices=("process", "replicated"),
        default="process",
        help="the harness's durability (default process)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed the random loss points")
    parser.add_argument("--keep", action="store_true", help="keep every run's work dir")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON too")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    files = bandit_harness.scan_files(tree)
    if not files:
        print(f"no Python files under {tree}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    workroot = Path(tempfile.mkdtemp(prefix="walchannel-chaos-hostloss-"))
    print(
        f"chaos-hostloss: {args.losses} host losses per sync interval, "
        f"durability={args.durability!r}, bandit over {tree} "
        f"({len(files)} files, pace {args.pace:g} s), seed {seed}",
        flush=True,
    )
    started = time.monotonic()
    expected = _expected(files, tree, workroot)
    summaries = []
    for text in args.sync_intervals.split(","):
        interval = float(text)
        print(f"-- sync interval {interval:g} s", flush=True)
        summaries.append(
            loop(
                losses=args.losses,
                sync_interval_s=interval,
                tree=tree,
                files=files,
                expected=expected,
                pace=args.pace,
                rng=rng,
                workroot=workroot,
                keep=args.keep,
                durability=args.durability,
            )
        )
    print()
    print(
        "sync interval | losses | runs | failed | rows lost per loss (mean / max) | "
        "replica lag s (mean / max) | twice by content per loss | no replica yet"
    )
    for s in summaries:
        print(
            f"{s['sync_interval_s']:>11g} s | {s['losses']:>6} | {s['runs']:>4} | "
            f"{s['failed_runs']:>6} | {s['rows_lost_mean']:>15.1f} / {s['rows_lost_max']:<5} | "
            f"{s['lag_s_mean']:>9.2f} / {s['lag_s_max']:<5.2f} | "
            f"{s['twice_by_content_per_loss']:>25.2f} | {s['no_replica_yet']}"
        )
    if args.json:
        print(json.dumps(summaries, indent=2))
    failed = sum(s["failed_runs"] for s in summaries)
    print(
        f"{'PASS' if not failed else 'FAIL'}: {sum(s['losses'] for s in summaries)} host "
        f"losses, {failed} failed runs ({time.monotonic() - started:.0f} s)"
    )
    if not failed and not args.keep:
        shutil.rmtree(workroot, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
