"""The options of ``walchannel demo``, for both of its demos (kills and ``--host-loss``)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser`` (its subcommand parser, changed in place)."""
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
