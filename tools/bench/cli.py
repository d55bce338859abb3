"""The command line: ``python -m tools.bench [--quick] [--only CASES] [--json FILE]``.

Runs the cases in order, prints progress to stderr and the table to
stdout. Targets are shown (``ok`` column), never enforced: the exit code is
0 whenever the harness itself worked.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import grpc
import msgpack

from tools.bench.cases import CASES, Context
from tools.bench.child import case_backlog, case_memory
from tools.bench.common import Result, Sizes, finding_pool, format_table
from tools.bench.engine import Engines
from tools.bench.limit import case_limit
from tools.bench.metrics import case_metrics

__all__ = ["ALL_CASES", "EXTRA_CASES", "machine", "main", "pin_cpus"]

ALL_CASES: dict[str, Callable[[Context], list[Result]]] = {
    "append": CASES["append"],
    "e2e": CASES["e2e"],
    "fast": CASES["fast"],
    "limit": case_limit,
    "replay": CASES["replay"],
    "open": CASES["open"],
    "latency": CASES["latency"],
    "memory": case_memory,
    "power": CASES["power"],
    "metrics": case_metrics,
}
#: Cases run only when named in ``--only``.
EXTRA_CASES: dict[str, Callable[[Context], list[Result]]] = {
    "backlog": case_backlog,
}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import sqlite3

    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "grpcio": grpc.__version__,
        "msgpack": ".".join(map(str, msgpack.version)),
        "kernel": platform.release(),
    }


def pin_cpus(*, enabled: bool) -> tuple[set[int], set[int]] | None:
    """Split the CPUs: the engine gets the last one, this process (and its children) the rest.

    The engine stands in for a server on another machine: on its own core,
    the client's CPU cost shows as client time instead of slowing the
    engine, and the engine's thread hand-offs stop depending on where the
    scheduler happens to put them (unpinned, the same arm varies by 2x).

    Returns:
        ``(client_cpus, engine_cpus)``, or None when not pinned.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled or len(cpus) < 2:
        return None
    client, engine = set(cpus[:-1]), {cpus[-1]}
    os.sched_setaffinity(0, client)
    return client, engine


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench",
        description="walchannel benchmarks: walchannel vs a baseline per row, interleaved medians.",
        epilog=(
            "example: python -m tools.bench --quick\n"
            "         python -m tools.bench --only append,latency --json bench.json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="CI-sized runs (well under a minute)")
    parser.add_argument(
        "--only",
        default="",
        help=(
            f"comma-separated cases to run (default all: {','.join(ALL_CASES)};"
            f" only when named: {','.join(EXTRA_CASES)})"
        ),
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions per row (override)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder (local disk)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the engine processes to their own CPU (default: pinned when >= 2 CPUs)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ALL_CASES)
    cases = {**ALL_CASES, **EXTRA_CASES}
    unknown = [n for n in names if n not in cases]
    if unknown:
        sys.stderr.write(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(cases)}\n")
        return 2
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.reps is not None:
        sizes = replace(sizes, reps=max(1, args.reps))
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="walchannel-bench-", dir=args.dir))
    pinning = pin_cpus(enabled=not args.no_pin)
    engines = Engines(folder, pinning[1] if pinning else None)

    def say(text: str) -> None:
        sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {text}\n")
        sys.stderr.flush()

    ctx = Context(sizes=sizes, folder=folder, engines=engines, pool=finding_pool(), say=say)
    results: list[Result] = []
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        for name in names:
            t0 = time.perf_counter()
            results.extend(cases[name](ctx))
            say(f"{name}: {time.perf_counter() - t0:.1f} s")
    finally:
        engines.close()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    elapsed = time.perf_counter() - started
    info = machine()
    mode = "quick" if args.quick else "full"
    pinned = (
        f"engine pinned to CPU {sorted(pinning[1])}, client to {sorted(pinning[0])}"
        if pinning
        else "not pinned"
    )
    info["pinning"] = pinned
    load_after = os.getloadavg()
    info["loadavg_before"] = load_before
    info["loadavg_after"] = load_after
    print(
        f"walchannel bench ({mode}, {sizes.reps} reps, medians; ratio = walchannel / baseline)"
        f" on {info['nproc']} x {info['cpu']}, Python {info['python']},"
        f" SQLite {info['sqlite']}, grpcio {info['grpcio']}; {pinned}; {elapsed:.0f} s;"
        f" load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(format_table(results))
    if args.json is not None:
        payload = {
            "mode": mode,
            "sizes": asdict(sizes),
            "machine": info,
            "elapsed_s": elapsed,
            "results": [r.as_dict() for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return 0
