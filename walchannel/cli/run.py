"""``walchannel run`` (a harness under the runner) and ``walchannel engine`` (one to try it on).

SPEC "The runner", "Test doubles and the local engine"; docs/deployment.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from walchannel.cli.common import (
    RAW,
    non_negative_float,
    positive_float,
)
from walchannel.cli.logs import (
    err,
)

# -- run ----------------------------------------------------------------------------

_RUN_EXAMPLES = """\
examples:
  walchannel run myscanner:harness --manifest /run/scan/manifest.json
  WALCHANNEL_MANIFEST=m.json walchannel run myscanner.main:Scanner --concurrency 4
  walchannel run myscanner:harness --manifest m.json --on-scan-error skip --wal-dir /var/lib/wal

MODULE:ATTR names the harness object as uvicorn and celery name an app: the
module is imported (the current folder first on sys.path) and ATTR read from
it; a class is instantiated with no arguments. The harness gives name,
version, work() and scan(item, ctx) (SPEC "The runner"). The manifest is a
JSON file: runId, correlationId, runToken, hardDeadline, grpcAddr, httpAddr.

exit codes (retriable ones marked *): 0 done; 2 usage, manifest or work
list changed; 3 fenced; 4 refused (unknown run or wrong token); 5* log held
by another process; 6 log broken; 7 run failed; 8 stopped by the engine;
9 deadline; 10 scan failed; 11 expired; 12 completed elsewhere; 13* scan
exit; 14* Done not acked; 15* no engine; 16* the disk refused the log at
open; 75* SIGTERM with rows left; 130* Ctrl-C;
143* SIGTERM (docs/deployment.md).
"""


def add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel run`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "run",
        help="run a harness for the run a manifest names (the runner)",
        description="Load a harness object by import path and run it with the runner.",
        epilog=_RUN_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument("target", metavar="MODULE:ATTR", help="the harness object")
    p.add_argument("--manifest", metavar="PATH", help="default: $WALCHANNEL_MANIFEST")
    p.add_argument("--wal-dir", metavar="DIR", help="the log folder (default: the default)")
    p.add_argument("--durability", choices=("process", "power", "replicated"), default="process")
    p.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="items scanned at once (default 1)"
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="tries again of a failed scan (default 2)",
    )
    p.add_argument(
        "--on-scan-error",
        choices=("fail", "skip", "exit"),
        default="fail",
        help="after the retries: fail the run, skip the item, or exit for a restart (default fail)",
    )
    p.add_argument(
        "--item-timeout", type=positive_float, metavar="SECONDS", help="the bound on one scan"
    )
    p.add_argument(
        "--grace",
        type=positive_float,
        default=25.0,
        metavar="SECONDS",
        help="SIGTERM's grace period, spent draining (default 25)",
    )
    p.add_argument(
        "--drain-timeout",
        type=non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long Done's ack is waited for (default 600)",
    )
    p.add_argument(
        "--first-answer",
        type=non_negative_float,
        default=600.0,
        metavar="SECONDS",
        help="how long a new log waits for an engine's first answer before exit 15 (default 600)",
    )
    p.add_argument(
        "--progress-every",
        type=non_negative_float,
        default=10.0,
        metavar="SECONDS",
        help="a progress line this often (0: only at the end; default 10)",
    )
    p.add_argument(
        "--deadline-margin",
        type=non_negative_float,
        default=60.0,
        metavar="SECONDS",
        help="no new item once less than this is left of hardDeadline (default 60)",
    )
    p.add_argument(
        "--max-waiting-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="no item begins while finished ones waiting for an earlier one hold this much",
    )
    p.add_argument("--max-unacked-bytes", type=int, metavar="N", help="the backlog's bound")
    p.add_argument("--tls-ca", metavar="FILE", help="TLS to the engine, trusting this CA (PEM)")
    p.add_argument("--tls-server-name", metavar="NAME", help="the name the engine's cert holds")
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a host (or IP network) discovery may send the harness to; repeat it",
    )
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.set_defaults(handler=_cmd_run)


def load_target(target: str) -> Any:
    """The object ``MODULE:ATTR`` names (a class: an instance of it).

    Raises:
        ValueError: ``target`` is not ``MODULE:ATTR``, the module cannot be
            imported, or it has no ``ATTR``; the message names which.
    """
    import importlib

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r}: name the harness as MODULE:ATTR, e.g. myscanner:harness")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ValueError(
                f"{target!r}: no module {exc.name!r} (run from the folder that holds it, or"
                " install it)"
            ) from None
        raise ValueError(f"{target!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the harness's module is broken: its error, named
        raise ValueError(
            f"{target!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{target!r}: module {module_name!r} has no {attr!r}")
        found = getattr(found, part)
    if not isinstance(found, type):
        return found
    try:
        return found()
    except Exception as exc:
        raise ValueError(
            f"{target!r}: {attr}() raised {type(exc).__name__}: {exc} (a class is made with"
            " no arguments: name an instance instead)"
        ) from exc


def _warnings_as_log_lines() -> None:
    """walchannel's own Python warnings as log lines naming the flag, not a source line."""
    import logging
    import warnings

    from walchannel.errors import InsecureDiscoveryWarning

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, InsecureDiscoveryWarning):
            logging.getLogger("walchannel.run").warning(
                "%s (walchannel run: pass --allowed-host HOST)", message
            )
        else:
            shown(message, category, *args, **kw)

    warnings.showwarning = show


def _cmd_run(args: argparse.Namespace) -> int:
    import logging

    from walchannel.runner.exits import ExitCode, said

    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # httpx says each discovery request at INFO; walchannel says what matters of it.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    _warnings_as_log_lines()
    try:
        harness = load_target(args.target)
    except ValueError as exc:
        err("run", str(exc))
        return 2
    channel: dict[str, Any] = {}
    if args.tls_ca is not None:
        from walchannel.runner.run import tls_credentials

        try:
            channel["credentials"] = tls_credentials(args.tls_ca)
        except OSError as exc:
            err("run", f"--tls-ca {args.tls_ca}: cannot be read: {exc.strerror or exc}")
            return 2
    if args.tls_server_name is not None:
        channel["tls_server_name"] = args.tls_server_name
    if args.allowed_host:
        channel["allowed_hosts"] = args.allowed_host
    if args.max_unacked_bytes is not None:
        channel["max_unacked_bytes"] = args.max_unacked_bytes
    try:
        return _run(harness, args, channel)
    except KeyboardInterrupt:
        # asyncio.run cancelled the runner: its channel is closed, the log
        # keeps every committed item, and the next start resumes after them.
        return said(None, ExitCode.INTERRUPTED)


def _run(harness: Any, args: argparse.Namespace, channel: dict[str, Any]) -> int:
    from walchannel.runner import run_harness

    return run_harness(
        harness,
        args.manifest,
        wal_dir=args.wal_dir,
        durability=args.durability,
        concurrency=args.concurrency,
        retries=args.retries,
        on_scan_error=args.on_scan_error,
        item_timeout_s=args.item_timeout,
        grace_s=args.grace,
        drain_timeout_s=args.drain_timeout,
        first_answer_s=args.first_answer,
        deadline_margin_s=args.deadline_margin,
        progress_every_s=args.progress_every,
        max_waiting_bytes=args.max_waiting_bytes,
        **channel,
    )


# One adder per subcommand, in help order.
_ENGINE_EXAMPLES = """\
examples:
  walchannel engine --manifest manifest.json
  walchannel engine --run-id run-42 --manifest /tmp/m.json --store /tmp/engine.sqlite3

A real engine (walchannel.testing.LocalEngine: gRPC and discovery on
127.0.0.1) for trying a harness: it registers one run with a fresh token,
writes the run's manifest (mode 600: the token is only there) and prints the
command that runs a harness for it. Ctrl-C stops it. A --store kept between
starts keeps what the engine applied.
"""


def add_engine(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walchannel engine`` to ``sub``: its options, examples and exit codes."""
    p = sub.add_parser(
        "engine",
        help="start a local engine with one run registered, and write its manifest",
        description="Start a local engine on loopback, register a run, write its manifest.",
        epilog=_ENGINE_EXAMPLES,
        formatter_class=RAW,
    )
    p.add_argument(
        "--manifest",
        metavar="PATH",
        default="manifest.json",
        help="where to write the run's manifest (default manifest.json; never"
        " over an existing file)",
    )
    p.add_argument("--run-id", metavar="ID", help="the run to register (default: run-<random>)")
    p.add_argument("--store", metavar="FILE", help="the engine's store (default: a temporary one)")
    p.add_argument("--grpc-port", type=int, default=0, metavar="PORT", help="default: any free")
    p.add_argument("--http-port", type=int, default=0, metavar="PORT", help="default: any free")
    p.set_defaults(handler=_cmd_engine)


def _cmd_engine(args: argparse.Namespace) -> int:
    import asyncio

    from walchannel.testing.engine.__main__ import serve_trial

    def write(line: str) -> None:
        print(line, flush=True)

    return asyncio.run(
        serve_trial(
            manifest=args.manifest,
            run_id=args.run_id,
            store=args.store,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            write=write,
        )
    )
