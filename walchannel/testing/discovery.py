"""A stable discovery address in front of engine processes that come and go.

``python -m walchannel.testing.discovery --store FILE [--http-port H]``
serves ``GET /grpc-address`` with the newest engine address recorded in the
store (read per request), prints one JSON line ``{"http_addr", "pid"}`` once
listening, and runs until SIGTERM/SIGINT (or SIGKILL). So an engine process
(``python -m walchannel.testing.engine``) can be SIGKILLed and a new one take
over behind the same address (SPEC "Test doubles and the local engine").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from walchannel._logging import get_logger
from walchannel.testing._http import DiscoveryServer
from walchannel.testing.store import EngineStore

__all__ = ["main"]

logger = get_logger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.discovery",
        description=(
            "Serve GET /grpc-address from an engine store's newest engine address;"
            " print one JSON line {http_addr, pid} once listening; stop on SIGTERM."
        ),
        epilog="example: python -m walchannel.testing.discovery --store /tmp/engine.sqlite3",
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--http-port", type=int, default=0, help="HTTP port (default: any free)")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging level (to stderr)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the discovery process until SIGTERM or SIGINT.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0 after a signal; 2 on bad usage.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: an exit code, not an exception
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with EngineStore(args.store) as store:
        server = DiscoveryServer(store.latest_engine_addr, port=args.http_port)
        try:
            sys.stdout.write(json.dumps({"http_addr": server.http_addr, "pid": os.getpid()}) + "\n")
            sys.stdout.flush()
            logger.info("discovery on %s for store %s", server.http_addr, args.store)
            # A timed wait: the signal handler runs between waits at the latest.
            while not stop.wait(0.5):
                pass
        finally:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
