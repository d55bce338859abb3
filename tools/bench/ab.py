"""Interleaved A/B of the benchmark against another commit: ``python -m tools.bench.ab``.

Runs ``python -m tools.bench --only CASES --json`` alternately in a checkout
of the other commit (A, before) and in this tree (B, after), ``--reps``
times each (A, B, A, B, …, so drift of a shared machine falls on both), and
prints per row the median over the runs of: the walchannel arm's client CPU
per message (µs) and its throughput ratio against the same run's baseline.

    git worktree add /tmp/base <commit>
    python -m tools.bench.ab --base /tmp/base --only fast,e2e --reps 5

Check both trees out (``git worktree add``) when this one is being edited.

A run's own numbers are medians of its repetitions (tools/bench/common.py);
the verdict columns apply the regression bounds given (defaults: client CPU
up by at most 3 µs, throughput ratio at least 0.97 of before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def _run(tree: Path, only: str, out: Path) -> dict[str, Any]:
    subprocess.run(
        [sys.executable, "-m", "tools.bench", "--only", only, "--json", str(out)],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _rows(data: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``row name -> (client cpu/msg µs of walchannel, throughput ratio)`` of one run."""
    rows = {}
    for result in data["results"]:
        arms = result.get("samples", {})
        samples = arms.get("wal") or arms.get("group") or {}  # a [group] row's arm is "group"
        cpu = samples.get("cpu_us")
        if not cpu or result.get("ratio") is None:
            continue
        rows[result["name"]] = (statistics.median(cpu), float(result["ratio"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.ab",
        description="Interleaved A/B of the benchmark: another checkout (A) against this tree (B).",
        epilog="example: python -m tools.bench.ab --base /tmp/base --only fast,e2e --reps 5",
    )
    parser.add_argument("--base", type=Path, required=True, help="checkout of the commit before")
    parser.add_argument(
        "--tree", type=Path, default=ROOT, help="checkout of the commit after (default: this one)"
    )
    parser.add_argument("--only", default="fast,e2e", help="cases (python -m tools.bench --only)")
    parser.add_argument("--reps", type=int, default=5, help="runs of each tree, interleaved")
    parser.add_argument("--cpu-us", type=float, default=3.0, help="allowed client cpu/msg rise")
    parser.add_argument("--ratio", type=float, default=0.97, help="allowed throughput ratio")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for arm, tree in (("A", args.base), ("B", args.tree)):
                out = Path(tmp) / f"{arm}{rep}.json"
                runs[arm].append(_rows(_run(tree, args.only, out)))
                print(f"run {rep + 1}/{args.reps} {arm} done", file=sys.stderr, flush=True)
    names = [n for n in runs["A"][0] if all(n in r for r in runs["A"] + runs["B"])]
    print(f"A = {args.base}, B = {args.tree}; {args.reps} interleaved runs each; medians over runs")
    print("| row | client cpu/msg A | B | B - A | ratio A | B | B / A | ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    failing = 0
    for name in names:
        cpu_a = statistics.median(r[name][0] for r in runs["A"])
        cpu_b = statistics.median(r[name][0] for r in runs["B"])
        ratio_a = statistics.median(r[name][1] for r in runs["A"])
        ratio_b = statistics.median(r[name][1] for r in runs["B"])
        ok = cpu_b - cpu_a <= args.cpu_us and ratio_b >= args.ratio * ratio_a
        failing += not ok
        verdict = "yes" if ok else "NO"
        print(
            f"| {name} | {cpu_a:.1f} µs | {cpu_b:.1f} µs | {cpu_b - cpu_a:+.1f} µs "
            f"| {ratio_a:.2f}x | {ratio_b:.2f}x | {ratio_b / ratio_a:.3f} | {verdict} |"
        )
    # Rows only this tree has (a new arm): its medians alone, nothing to compare.
    for name in runs["B"][0]:
        if name in names or not all(name in r for r in runs["B"]):
            continue
        cpu_b = statistics.median(r[name][0] for r in runs["B"])
        ratio_b = statistics.median(r[name][1] for r in runs["B"])
        print(f"| {name} | - | {cpu_b:.1f} µs | - | - | {ratio_b:.2f}x | - | new |")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
