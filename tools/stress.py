"""Run the test suite several times with the CPUs busy: the flake hunt of ``make test-stress``.

Usage: ``python tools/stress.py [--runs N] [--hogs K] [-- PYTEST_ARGS...]``

Starts K busy-loop processes (default 2: one per core of the reference
machine), runs ``python -m pytest -q`` N times (default 3) beside them,
stops the hogs, and prints one line per run plus a total such as
``stress: 3 runs, 0 failed``. Exit 0 only when every run passed. A test that
fails once here is a defect (README "No flakes"); the failing runs' output
is kept in ``--out`` (default ``stress-logs/``, git-ignored) for reading.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOG = "while True:\n    pass\n"
SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed).*) in [\d.]+s", re.MULTILINE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="full suite runs (default 3)")
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "stress-logs", help="logs of runs")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            took = time.monotonic() - start
            found = SUMMARY.findall(proc.stdout)
            summary = found[-1][0] if found else f"exit {proc.returncode}, no summary"
            print(f"run {run}/{args.runs}: {summary} ({took:.0f} s, {args.hogs} hogs)", flush=True)
            if proc.returncode != 0:
                failed += 1
                log = args.out / f"run-{run}.log"
                log.write_text(proc.stdout + proc.stderr)
                print(f"  output kept in {log}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"stress: {args.runs} runs, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
