"""A real scan harness: bandit over a code tree, run by walchannel's runner (the demo's).

It runs the bandit security scanner in-process, file by file, over a tree
(default: this interpreter's standard library without site-packages,
dist-packages and test folders), as :class:`BanditHarness` under
:func:`walchannel.run_harness`: each file's findings (one FindingDraft per
bandit result, with its real fields), its ``scan.file`` event and the
runner's marker are one transaction; ``Done`` carries the totals and the
tree as coverage. The runner resumes it after SIGKILL, ends it on Stop and
spends a SIGTERM's grace period (SPEC "The runner").

Usage::

    HARNESS_TOKEN=... python -m demo.bandit_harness --run-id RUN \\
        --grpc-addr 127.0.0.1:50051 [--http-addr http://127.0.0.1:8080] \\
        [--wal-dir DIR] [--tree PATH] [--limit N] [--pace SECONDS] [--durability D] \\
        [--grace SECONDS]

(``walchannel run`` would load the harness from a manifest; the demo builds
its manifest from these options.) It needs bandit (walchannel's ``demo``
extra, or ``pip install bandit``). Exit codes: the runner's
(:class:`walchannel.ExitCode`), and 2 with no token or no files.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from walchannel import Backoff, ItemContext, Manifest, run_harness

SKIPPED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)


def default_tree() -> Path:
    """This interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def scan_files(tree: Path, limit: int | None = None) -> list[Path]:
    """The files to scan, in a fixed order (resume positions index into it).

    Skips site-packages, dist-packages and test folders.
    """
    found: list[Path] = []
    for root, dirs, names in os.walk(tree):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        found.extend(Path(root) / n for n in sorted(names) if n.endswith(".py"))
    return found[:limit] if limit is not None else found


def finding_of(issue: Any, tree: Path) -> dict[str, Any]:
    """A bandit issue as a FindingDraft's fields (JSON-like)."""
    data = issue.as_dict(with_code=False)
    cwe = data.get("issue_cwe") or {}
    return {
        "test_id": data["test_id"],
        "test_name": data["test_name"],
        "severity": data["issue_severity"],
        "confidence": data["issue_confidence"],
        "cwe": cwe.get("id"),
        "path": str(Path(data["filename"]).relative_to(tree)),
        "line_number": data["line_number"],
        "col_offset": data["col_offset"],
        "end_col_offset": data.get("end_col_offset"),
        "line_range": list(data["line_range"]),
        "text": data["issue_text"],
    }


class BanditHarness:
    """The demo's harness for :func:`walchannel.run_harness`: bandit over a tree, file by file.

    Items are the files' paths relative to the tree; each scan returns the
    file's bandit findings and adds a ``scan.file`` event to the file's
    transaction. bandit's manager (its plugins load once) is kept per
    worker thread: it is not thread-safe.
    """

    name = "bandit-harness"

    def __init__(self, tree: Path, files: Sequence[Path], pace: float = 0.0) -> None:
        import bandit

        logging.getLogger("bandit").setLevel(logging.ERROR)
        self.version = bandit.__version__
        self.tree = tree
        self.files = [str(path.relative_to(tree)) for path in files]
        self.pace = pace
        self._local = threading.local()

    def work(self) -> list[str]:
        return self.files

    def scan(self, item: str, ctx: ItemContext) -> list[dict[str, Any]]:
        manager = getattr(self._local, "manager", None)
        if manager is None:
            from bandit.core import config
            from bandit.core import manager as bandit_manager

            manager = bandit_manager.BanditManager(config.BanditConfig(), "file", quiet=True)
            self._local.manager = manager
        manager.files_list = [str(self.tree / item)]
        manager.results = []
        manager.run_tests()
        found = [finding_of(issue, self.tree) for issue in manager.get_issue_list()]
        ctx.event(
            "scan.file",
            {"path": item, "index": ctx.index, "total": len(self.files), "findings": len(found)},
        )
        if self.pace:
            time.sleep(self.pace)
        return found

    def coverage(self) -> list[str]:
        return [str(self.tree)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Scan a code tree with bandit and stream it through walchannel."
    )
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--grpc-addr", required=True, help="engine host:port")
    parser.add_argument("--http-addr", help="stable engine URL for discovery")
    parser.add_argument("--correlation-id")
    parser.add_argument("--wal-dir", help="log folder (default: walchannel's default)")
    parser.add_argument("--tree", default=str(default_tree()), help="code tree to scan")
    parser.add_argument("--limit", type=int, help="scan only the first N files")
    parser.add_argument("--pace", type=float, default=0.0, help="seconds to pause per file")
    parser.add_argument("--done-wait", type=float, default=120.0, help="seconds to wait for Done")
    parser.add_argument("--token-env", default="HARNESS_TOKEN", help="variable with the token")
    parser.add_argument(
        "--grace",
        type=float,
        default=25.0,
        help="seconds after SIGTERM before the platform's SIGKILL, less a margin (default 25)",
    )
    parser.add_argument(
        "--durability",
        choices=("process", "power", "replicated"),
        default="process",
        help="the log's durability (replicated: under 'walchannel replicate --exec')",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    token = os.environ.get(args.token_env)
    if not token:
        print(f"bandit_harness: ${args.token_env} holds no run token", file=sys.stderr)
        return 2
    tree = Path(args.tree).resolve()
    files = scan_files(tree, args.limit)
    if not files:
        print(f"bandit_harness: no Python files under {tree}", file=sys.stderr)
        return 2
    manifest = Manifest(
        run_id=args.run_id,
        correlation_id=args.correlation_id or f"bandit-{args.run_id}",
        run_token=token,
        hard_deadline=datetime.now(UTC) + timedelta(days=1),
        grpc_addr=args.grpc_addr,
        http_addr=args.http_addr,
    )
    print(f"scanning {len(files)} files under {tree}", flush=True)
    return run_harness(
        BanditHarness(tree, files, args.pace),
        manifest,
        wal_dir=args.wal_dir,
        durability=args.durability,
        grace_s=args.grace,
        drain_timeout_s=args.done_wait,
        progress_every_s=0,
        allowed_hosts=["127.0.0.1", "localhost"] if args.http_addr else None,
        connect_timeout_ms=5_000,
        backoff=Backoff(initial_ms=200, multiplier=2, max_ms=3_000, jitter_ms=100),
    )


if __name__ == "__main__":
    sys.exit(main())
