"""The local engine as a process: ``python -m walchannel.testing.engine``.

SPEC "Test doubles and the local engine"::

    python -m walchannel.testing.engine --store FILE [--grpc-port P]
        [--ack-every N] [--no-heartbeat-acks]
    python -m walchannel.testing.engine register --store FILE --run-id R --token-env VAR

``serve`` prints one JSON line ``{grpc_addr, pid}`` once serving and stops
on SIGTERM; ``register`` reads the token from an environment variable,
never from the command line. :func:`main` is importable for tests
(``from walchannel.testing.engine.__main__ import main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from walchannel.testing.engine import LocalEngine
from walchannel.testing.store import EngineStore

__all__ = ["main"]


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.engine",
        description=(
            "Run a local engine on a store file shared with other engine processes;"
            " print one JSON line {grpc_addr, pid} once serving; stop on SIGTERM."
            " Subcommand 'register' registers a run."
        ),
        epilog=(
            "example: python -m walchannel.testing.engine --store /tmp/engine.sqlite3\n"
            "         python -m walchannel.testing.engine register --store /tmp/engine.sqlite3"
            " --run-id r1 --token-env RUN_TOKEN"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: any free)")
    parser.add_argument("--ack-every", type=int, default=1, help="ack every N messages")
    parser.add_argument("--no-heartbeat-acks", action="store_true", help="do not answer heartbeats")
    parser.add_argument(
        "--no-resume-points",
        action="store_true",
        help="play an engine that does not keep the run's resume point (an older one)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging level (to stderr)",
    )
    return parser


def _register_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.engine register",
        description=(
            "Register a run in an engine store; the token is read from an environment"
            " variable, never from the command line."
        ),
        epilog=(
            "example: RUN_TOKEN=... python -m walchannel.testing.engine register"
            " --store /tmp/engine.sqlite3 --run-id r1 --token-env RUN_TOKEN"
        ),
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--run-id", required=True, help="the run to register")
    parser.add_argument(
        "--token-env", required=True, help="name of the environment variable holding the token"
    )
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: an exit code, not an exception
        return exc.code if isinstance(exc.code, int) else 2


def _write_line(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine process form (see the module doc).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0 after a clean shutdown or registration; 2 on bad usage or a
        missing token variable.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["register"]:
        parsed = _parse(_register_parser(), args[1:])
        if isinstance(parsed, int):
            return parsed
        token = os.environ.get(parsed.token_env, "")
        if not token:
            sys.stderr.write(f"environment variable {parsed.token_env} is not set or empty\n")
            return 2
        with EngineStore(parsed.store) as store:
            store.register_run(parsed.run_id, token)
        return 0
    parsed = _parse(_serve_parser(), args)
    if isinstance(parsed, int):
        return parsed
    if parsed.ack_every < 1:
        sys.stderr.write("--ack-every must be >= 1\n")
        return 2
    logging.basicConfig(level=parsed.log_level, stream=sys.stderr)
    return asyncio.run(_serve_process(parsed))


async def _serve_process(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine = LocalEngine(
        args.store,
        ack_every=args.ack_every,
        ack_heartbeats=not args.no_heartbeat_acks,
        resume_points=not args.no_resume_points,
        grpc_port=args.grpc_port,
        http_port=None,
    )
    try:
        await engine.start()
        _write_line({"grpc_addr": engine.grpc_addr, "pid": os.getpid()})
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
