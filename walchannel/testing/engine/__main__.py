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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from walchannel.testing.engine import LocalEngine
from walchannel.testing.store import EngineStore

__all__ = ["main", "serve_trial"]


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


async def serve_trial(
    *,
    manifest: str,
    run_id: str | None,
    store: str | None,
    grpc_port: int,
    http_port: int,
    write: Callable[[str], None],
) -> int:
    """``walchannel engine``: a local engine with discovery, one run registered, its manifest.

    The manifest (``runId``, ``correlationId``, ``runToken``, ``hardDeadline``
    24 hours ahead, ``grpcAddr``, ``httpAddr``) is written with mode 0600 and
    is the only place the token goes (never printed), and is removed when the
    engine stops (its addresses die with it). Serves until SIGINT or SIGTERM.
    SPEC "Test doubles and the local engine".

    Args:
        manifest: where to write the manifest; an existing file is refused.
        run_id: the run to register (None: ``run-`` and 8 random hex digits).
        store: the engine store (SQLite file; None: a temporary one, removed at the end).
        grpc_port, http_port: the ports (0: any free).
        write: where each line for the user goes.

    Returns:
        0 after SIGINT or SIGTERM; 2 if the manifest exists or cannot be written.
    """
    import secrets
    import tempfile
    import time

    from walchannel.files import check_run_id

    run_id = run_id or f"run-{secrets.token_hex(4)}"
    try:
        check_run_id(run_id)
    except ValueError as exc:
        write(f"walchannel engine: --run-id: {exc}")
        return 2
    token = secrets.token_urlsafe(24)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with (
        tempfile.TemporaryDirectory(prefix="walchannel-engine-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        engine = LocalEngine(
            store or os.path.join(scratch, "engine.sqlite3"),
            grpc_port=grpc_port,
            http_port=http_port,
        )
        await engine.start()
        try:
            engine.register_run(run_id, token)
            deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86_400))
            text = json.dumps(
                {
                    "runId": run_id,
                    "correlationId": f"corr-{run_id}",
                    "runToken": token,
                    "hardDeadline": deadline,
                    "grpcAddr": engine.grpc_addr,
                    "httpAddr": engine.http_addr,
                },
                indent=1,
            )
            try:
                fd = os.open(manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                write(
                    f"walchannel engine: {manifest} exists (a manifest of another run?): pass"
                    " --manifest another path, or remove it"
                )
                return 2
            except OSError as exc:
                write(f"walchannel engine: cannot write {manifest}: {exc.strerror or exc}")
                return 2
            with os.fdopen(fd, "w") as out:
                out.write(text + "\n")
            # Its addresses die with this engine: the manifest goes with it.
            stack.callback(_remove, manifest)
            write(f"local engine: gRPC {engine.grpc_addr}, discovery {engine.http_addr}")
            write(
                f"run {run_id} registered; its manifest (the token is in it, mode 600): {manifest}"
            )
            write("run a harness for it:")
            write(f"  walchannel run MODULE:ATTR --manifest {manifest} --allowed-host 127.0.0.1")
            write("Ctrl-C stops the engine.")
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await engine.stop()
    return 0


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
