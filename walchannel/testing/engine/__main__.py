"""The local engine as a process: ``python -m walchannel.testing.engine``.

SPEC "Test doubles and the local engine"::

    python -m walchannel.testing.engine [serve] --store FILE [--grpc-port P] [--http-port P]
        [--ack-every N] [--no-heartbeat-acks] [--no-resume-points] [--fault NAME]...
        [--pid-file FILE]
    python -m walchannel.testing.engine start   (serve's options; --pid-file required)
    python -m walchannel.testing.engine restart (the same)
    python -m walchannel.testing.engine register --store FILE [--run-id R] [--token-env VAR]
    python -m walchannel.testing.engine applied  --store FILE [--run-id R]
    python -m walchannel.testing.engine stop-run --store FILE [--run-id R] [--reason TEXT]
    python -m walchannel.testing.engine decide   --store FILE [--run-id R] [--request-id ID]
        [--approved true|false]

``serve`` prints one JSON line ``{grpc_addr, http_addr, pid}`` once serving
and stops on SIGTERM; ``start`` runs ``serve`` detached (its own session),
prints that line and exits 0 once it serves; ``restart`` SIGKILLs the
process the pid file names (as a lost task dies) and starts one on the same
store. The rest act on the store a running engine shares. Each option the
conformance kit's hooks pass in the environment has it as its default
(``WALCHANNEL_RUN_ID``, ``WALCHANNEL_RUN_TOKEN``, ``WALCHANNEL_STOP_REASON``,
``WALCHANNEL_REQUEST_ID``, ``WALCHANNEL_APPROVED``), so a hook is one short
command (docs/conformance.md). The token is read from an environment
variable, never from the command line. :func:`main` is importable for tests
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
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from walchannel.testing.engine import LocalEngine
from walchannel.testing.servicer import FAULTS
from walchannel.testing.store import EngineStore

__all__ = ["main", "serve_trial"]

PROG = "python -m walchannel.testing.engine"
#: How long ``start`` waits for the detached engine's first line (seconds).
START_TIMEOUT_S = 30.0


def _serve_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Run a local engine on a store file shared with other engine processes;"
            " print one JSON line {grpc_addr, http_addr, pid} once serving; stop on SIGTERM."
            " Subcommands: serve (the default), start, restart, register, applied,"
            " stop-run, decide."
        ),
        epilog=(
            f"example: {PROG} --store /tmp/engine.sqlite3\n"
            f"         {PROG} start --store /tmp/engine.sqlite3 --pid-file /tmp/engine.pid"
            " --grpc-port 50051\n"
            f"         WALCHANNEL_RUN_ID=r1 WALCHANNEL_RUN_TOKEN=... {PROG} register"
            " --store /tmp/engine.sqlite3"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: any free)")
    parser.add_argument(
        "--http-port", type=int, help="serve discovery (GET /grpc-address) on this port"
    )
    parser.add_argument("--ack-every", type=int, default=1, help="ack every N messages")
    parser.add_argument("--no-heartbeat-acks", action="store_true", help="do not answer heartbeats")
    parser.add_argument(
        "--no-resume-points",
        action="store_true",
        help="play an engine that does not keep the run's resume point (an older one)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        choices=sorted(FAULTS),
        metavar="NAME",
        help="break one duty on purpose, to see the conformance kit catch it (repeatable;"
        f" {', '.join(sorted(FAULTS))})",
    )
    parser.add_argument("--pid-file", help="write this process's pid here once serving")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging level (to stderr)",
    )
    return parser


def _store_parser(command: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", description=description)
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument(
        "--run-id",
        default=os.environ.get("WALCHANNEL_RUN_ID"),
        help="the run (default: $WALCHANNEL_RUN_ID)",
    )
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: an exit code, not an exception
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "run_id", "") is None:
        sys.stderr.write(f"{parser.prog}: --run-id or WALCHANNEL_RUN_ID is required\n")
        return 2
    return args


def _write_line(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine process form (see the module doc).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0 when done (a clean shutdown, a store change made); 1 when a run is
        unknown to the store or a started engine did not come up; 2 on bad
        usage or a missing token variable.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-"):
        command, rest = args[0], args[1:]
    else:
        command, rest = "serve", args  # the form before subcommands: serve
    handler = _COMMANDS.get(command)
    if handler is None:
        sys.stderr.write(f"{PROG}: no command {command!r} (commands: {', '.join(_COMMANDS)})\n")
        return 2
    return handler(rest)


def _serve(argv: Sequence[str]) -> int:
    parsed = _parse(_serve_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    if parsed.ack_every < 1:
        sys.stderr.write("--ack-every must be >= 1\n")
        return 2
    logging.basicConfig(level=parsed.log_level, stream=sys.stderr)
    return asyncio.run(_serve_process(parsed))


def _start(argv: Sequence[str], *, restart: bool = False) -> int:
    command = "restart" if restart else "start"
    parsed = _parse(_serve_parser(f"{PROG} {command}"), argv)
    if isinstance(parsed, int):
        return parsed
    if parsed.pid_file is None:
        sys.stderr.write(f"{PROG} {command}: --pid-file is required\n")
        return 2
    if restart:
        _kill_from(parsed.pid_file)
    with open(f"{parsed.pid_file}.log", "ab") as log:  # the detached engine's stderr
        child = subprocess.Popen(
            [sys.executable, "-m", "walchannel.testing.engine", "serve", *argv],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # not killed with the hook's shell
        )
    assert child.stdout is not None
    line = _first_line(child)
    if line is None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        ended = child.poll() is not None
        said = _last_error(f"{parsed.pid_file}.log") if ended else ""
        sys.stderr.write(
            f"{PROG} {command}: "
            + (
                f"the engine exited before serving: {said}"
                if ended
                else f"the engine did not serve within {START_TIMEOUT_S:.0f} s"
            )
            + f" (its stderr: {parsed.pid_file}.log)\n"
        )
        return 1
    sys.stdout.write(line)
    sys.stdout.flush()
    return 0


def _first_line(child: subprocess.Popen[bytes]) -> str | None:
    """The serving engine's first stdout line, or None if it ended or took too long."""
    import selectors

    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        if not sel.select(START_TIMEOUT_S):
            return None
    raw = child.stdout.readline()
    child.stdout.close()  # the engine's later lines go nowhere
    return raw.decode() if raw else None


def _last_error(log: str) -> str:
    """The last line of a dead engine's stderr that says what went wrong ("" if none)."""
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1][:500] if lines else ""


def _kill_from(pid_file: str) -> None:
    """SIGKILL the process a pid file names and wait until it is gone (no pid: nothing)."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)


def _register(argv: Sequence[str]) -> int:
    parser = _store_parser(
        "register",
        "Register a run in an engine store; the token is read from an environment"
        " variable, never from the command line.",
    )
    parser.add_argument(
        "--token-env",
        default="WALCHANNEL_RUN_TOKEN",
        help="the environment variable holding the token (default WALCHANNEL_RUN_TOKEN)",
    )
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    token = os.environ.get(parsed.token_env, "")
    if not token:
        sys.stderr.write(f"environment variable {parsed.token_env} is not set or empty\n")
        return 2
    with EngineStore(parsed.store) as store:
        store.register_run(parsed.run_id, token)
    return 0


def _applied(argv: Sequence[str]) -> int:
    parser = _store_parser(
        "applied", "Print what the engine applied for a run: one JSON object a line, by seq."
    )
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    with EngineStore(parsed.store) as store:
        for row in store.bodies(parsed.run_id):
            _write_line(row)
    return 0


def _stop_run(argv: Sequence[str]) -> int:
    parser = _store_parser(
        "stop-run", "Issue a run's Stop (sent after every handshake from then on)."
    )
    parser.add_argument(
        "--reason",
        default=os.environ.get("WALCHANNEL_STOP_REASON", "operator"),
        help="the Stop's reason (default: $WALCHANNEL_STOP_REASON, else 'operator')",
    )
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    return _on_run(parsed, lambda store: store.set_stop(parsed.run_id, parsed.reason))


def _decide(argv: Sequence[str]) -> int:
    parser = _store_parser(
        "decide", "Decide a run's approval request (sent after every handshake from then on)."
    )
    parser.add_argument(
        "--request-id",
        default=os.environ.get("WALCHANNEL_REQUEST_ID"),
        help="the request (default: $WALCHANNEL_REQUEST_ID)",
    )
    parser.add_argument(
        "--approved",
        choices=("true", "false"),
        default=os.environ.get("WALCHANNEL_APPROVED", "true"),
        help="the decision (default: $WALCHANNEL_APPROVED, else true)",
    )
    parser.add_argument("--reason", default="", help="the decision's reason")
    parsed = _parse(parser, argv)
    if isinstance(parsed, int):
        return parsed
    if parsed.request_id is None:
        sys.stderr.write(f"{PROG} decide: --request-id or WALCHANNEL_REQUEST_ID is required\n")
        return 2
    return _on_run(
        parsed,
        lambda store: store.set_decision(
            parsed.run_id, parsed.request_id, parsed.approved == "true", parsed.reason
        ),
    )


def _on_run(parsed: argparse.Namespace, change: Callable[[EngineStore], object]) -> int:
    with EngineStore(parsed.store) as store:
        try:
            change(store)
        except KeyError:
            sys.stderr.write(f"run {parsed.run_id!r} is not in {parsed.store}\n")
            return 1
    return 0


_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "serve": _serve,
    "start": _start,
    "restart": lambda argv: _start(argv, restart=True),
    "register": _register,
    "applied": _applied,
    "stop-run": _stop_run,
    "decide": _decide,
}


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
        http_port=args.http_port,
        faults=args.fault,
    )
    try:
        await engine.start()
        if args.pid_file is not None:
            # Before the line: whoever read the line may restart this process by it.
            await asyncio.to_thread(Path(args.pid_file).write_text, f"{os.getpid()}\n")
        line: dict[str, Any] = {"grpc_addr": engine.grpc_addr, "pid": os.getpid()}
        if args.http_port is not None:
            line["http_addr"] = engine.http_addr
        _write_line(line)
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

    from walchannel.log.files import check_run_id

    run_id = f"run-{secrets.token_hex(4)}" if run_id is None else run_id
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
        try:
            await engine.start()
        except (RuntimeError, OSError) as exc:  # a port taken: the engine's own words
            write(f"walchannel engine: {exc}; pass another --grpc-port / --http-port (0: any)")
            with contextlib.suppress(Exception):
                await engine.stop()
            return 2
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
            write("Ctrl-C stops the engine (and removes the manifest: its addresses die with it).")
            await stop.wait()
            write(f"engine stopped; {manifest} removed")
        finally:
            with contextlib.suppress(Exception):
                await engine.stop()
    return 0


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
