"""The options of ``python -m demo``, for both of its demos (kills and ``--host-loss``)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

__all__ = ["add_arguments", "scan_inputs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser`` (changed in place)."""
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


def scan_inputs(args: argparse.Namespace, prefix: str) -> tuple[Path, list[Path], Path] | None:
    """The tree, its files and the work folder the options name, the folder created.

    Args:
        args: the parsed options (``tree``, ``limit``, ``workdir``).
        prefix: the name prefix of a temporary work folder (no ``--workdir``).

    Returns:
        ``(tree, files, workdir)``, or None when the tree holds no Python file
        (said on stderr: the demo exits 2).
    """
    # Here, not at the top: the CLI reads add_arguments for every command,
    # and the harness imports the channel (grpc).
    from demo import bandit_harness

    tree = Path(args.tree).resolve() if args.tree else bandit_harness.default_tree()
    files = bandit_harness.scan_files(tree, args.limit)
    if not files:
        print(f"demo: no Python files under {tree}", file=sys.stderr)
        return None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    return tree, files, workdir
