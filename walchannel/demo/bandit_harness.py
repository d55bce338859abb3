"""A real scan harness: bandit over a code tree, streamed through walchannel (the demo's).

It runs the bandit security scanner in-process, file by file, over a tree
(default: this interpreter's standard library without site-packages,
dist-packages and test folders) and streams the run through a
GrpcEngineChannel: a handshake, a ``scan.file`` progress Event per file,
one FindingDraft per bandit result with its real fields, and a Done with
the totals and the tree as coverage (a bounded summary, never every file:
``Done`` must fit ``max_message_bytes``).

It is resumable after SIGKILL: each file's findings are committed together
with the scan position (``progress=``), and a restart resumes from
``channel.progress()``, so no finding is logged twice or skipped. It honours
Stop (ends with status ``stopped``), and spends a SIGTERM's grace period
well (:class:`walchannel.GracePeriod`): it finishes the file in hand, lets
the backlog drain and exits 143, or 75 when rows are left in the log.

Usage::

    HARNESS_TOKEN=... python -m walchannel.demo.bandit_harness --run-id RUN \\
        --grpc-addr 127.0.0.1:50051 [--http-addr http://127.0.0.1:8080] \\
        [--wal-dir DIR] [--tree PATH] [--limit N] [--pace SECONDS] [--durability D] \\
        [--grace SECONDS]

It needs bandit (walchannel's ``demo`` extra, or ``pip install bandit``).

Exit codes: 0 when the run is done and its Done acked (also when started
again on a completed run, and when the engine stopped the run), 1 when the
run failed (engine behind, Done not acked in time), 2 on bad usage, 143
(or 75, rows left in the log) when stopped by SIGTERM (SPEC "Grace period").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from walchannel import (
    Backoff,
    EngineBehindError,
    EngineUnavailableError,
    GracePeriod,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
    WriterFencedError,
)
from walchannel.formatting import get_logger

CONNECTOR_VERSION = "walchannel-example/1"
SKIPPED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)

log = get_logger(__name__)


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


def tree_id(tree: Path, files: Sequence[Path]) -> str:
    """A short hash of the file list: a resume marker is only valid for the same list."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(tree)).encode() + b"\0")
    return digest.hexdigest()[:16]


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


class Scanner:
    """bandit's manager, reused file by file (its plugins load once)."""

    def __init__(self, tree: Path) -> None:
        from bandit.core import config, manager

        logging.getLogger("bandit").setLevel(logging.ERROR)
        self.tree = tree
        self.manager = manager.BanditManager(config.BanditConfig(), "file", quiet=True)

    def scan(self, path: Path) -> list[dict[str, Any]]:
        mgr = self.manager
        mgr.files_list = [str(path)]
        mgr.results = []
        mgr.run_tests()
        issues = mgr.get_issue_list()
        return [finding_of(issue, self.tree) for issue in issues]


async def run(
    args: argparse.Namespace, token: str, tree: Path, files: list[Path], grace: GracePeriod
) -> int:
    """Scan ``files`` under ``tree`` and stream the run; return the exit code."""
    ident = tree_id(tree, files)
    config = GrpcChannelConfig(
        grpc_addr=args.grpc_addr,
        http_addr=args.http_addr,
        allowed_hosts=["127.0.0.1", "localhost"] if args.http_addr else None,
        run_id=args.run_id,
        correlation_id=args.correlation_id or f"bandit-{args.run_id}",
        run_token=token,
        wal_dir=args.wal_dir,
        durability=args.durability,
        connect_timeout_ms=5_000,
        backoff=Backoff(initial_ms=200, multiplier=2, max_ms=3_000, jitter_ms=100),
    )
    try:
        channel = GrpcEngineChannel(config)
    except RunCompletedError:
        print(f"run {args.run_id} is already completed; nothing to do", flush=True)
        return 0
    stop: list[str] = []
    channel.on_stop(stop.append)
    async with channel:
        import bandit

        try:
            await channel.handshake(CONNECTOR_VERSION, "bandit-harness", bandit.__version__)
        except EngineUnavailableError as exc:
            log.warning("%s; scanning on, the log holds the findings", exc)
        except RunCompletedError:
            print(f"run {args.run_id} is already completed; nothing to do", flush=True)
            return 0
        except WriterFencedError as exc:  # another writer has the run: never scan it again
            print(f"bandit_harness: {exc}", file=sys.stderr)
            return 1
        marker = dict(channel.progress() or {})
        if marker and marker.get("tree") != ident:
            print(
                f"bandit_harness: the log's progress marker is for another file list "
                f"({marker.get('tree')} != {ident}); refusing to resume",
                file=sys.stderr,
            )
            return 2
        start = int(marker.get("next_file", 0))
        found = int(marker.get("findings", 0))
        print(f"scanning {len(files)} files under {tree} from file {start}", flush=True)
        scanner = Scanner(tree)
        try:
            if start == 0:
                channel.send_event("scan.started", "info", {"tree": str(tree), "files": len(files)})
            for index in range(start, len(files)):
                if stop:
                    break
                if grace.stopping:  # the file in hand is done; a restart resumes here
                    return await grace.drain(channel)
                path = files[index]
                # bandit is CPU-bound: a worker thread keeps the stream flowing.
                results = await asyncio.to_thread(scanner.scan, path)
                found += len(results)
                marker = {"tree": ident, "next_file": index + 1, "findings": found}
                event = {
                    "path": str(path.relative_to(tree)),
                    "index": index,
                    "total": len(files),
                    "findings": len(results),
                }
                if results:
                    # If killed between these two, the file is scanned again:
                    # its progress event repeats, its findings never do.
                    channel.send_event("scan.file", "info", event)
                    channel.send_findings(results, progress=marker)
                else:
                    channel.send_event("scan.file", "info", event, progress=marker)
                if args.pace:
                    await asyncio.sleep(args.pace)
            coverage = [str(tree)]
            if stop:
                scanned = int(marker.get("next_file", start))
                status = "stopped"
                reason = f"Stop from the engine: {stop[0]} ({scanned} of {len(files)} files)"
            else:
                status, reason = "completed", ""
            acked = await channel.send_done(status, found, coverage, reason)
            if not acked:  # a SIGTERM ends this wait: the grace period is drain's
                acked = await grace.wait_acked(channel, timeout_ms=args.done_wait * 1000)
            if not acked and grace.stopping:
                return await grace.drain(channel)
        except RunCompletedError:
            print(f"run {args.run_id} is already completed; nothing to do", flush=True)
            return 0
        except (EngineBehindError, WriterFencedError) as exc:
            print(f"bandit_harness: {exc}", file=sys.stderr)
            return 1
        if not acked:
            print(
                "bandit_harness: Done was not acked in time; it stays in the log "
                "(`walchannel flush` delivers it)",
                file=sys.stderr,
            )
            return 1
        print(f"done: {found} findings in {len(files)} files ({status})", flush=True)
        return 0


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
    with GracePeriod(seconds=args.grace) as grace:
        return asyncio.run(run(args, token, tree, files, grace))


if __name__ == "__main__":
    sys.exit(main())
