"""The discovery HTTP server shared by LocalEngine and ``python -m walchannel.testing.discovery``.

``GET /grpc-address`` answers the live engine's address as ``text/plain``
``127.0.0.1:PORT`` (the body the channel's re-discovery reads, SPEC
"Reconnect"); 503 while no engine is known; 404 for any other path. Built
on the stdlib's ``ThreadingHTTPServer`` on a daemon thread: no HTTP parsing
of our own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from walchannel._logging import get_logger

__all__ = ["DISCOVERY_PATH", "DiscoveryServer"]

logger = get_logger(__name__)

#: The path the channel GETs to re-discover the engine.
DISCOVERY_PATH: Final = "/grpc-address"
# How often serve_forever checks for shutdown (seconds): bounds close()'s wait.
_POLL_INTERVAL_S: Final = 0.05

Resolver = Callable[[], str | None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A restarted discovery may take over its predecessor's port at once.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], resolve: Resolver) -> None:
        self.resolve = resolve
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "walchannel-discovery"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != DISCOVERY_PATH:
            self._reply(HTTPStatus.NOT_FOUND, f"no such path: {path}\n")
            return
        try:
            addr = self.server.resolve()
        except Exception:
            logger.exception("discovery: cannot read the engine address")
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, "cannot read the engine address\n")
            return
        if addr is None:
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, "no engine yet\n")
            return
        self._reply(HTTPStatus.OK, addr)

    def _reply(self, status: HTTPStatus, text: str) -> None:
        body = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # Route the stdlib's stderr access log to logging, at DEBUG.
        logger.debug("discovery %s: " + format, self.address_string(), *args)


class DiscoveryServer:
    """``GET /grpc-address`` on ``127.0.0.1``, answering whatever ``resolve()`` returns now.

    Args:
        resolve: called per request (on a server thread); returns the
            engine's ``host:port`` or None while there is none.
        port: the TCP port (0: any free port).

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, resolve: Resolver, *, port: int = 0) -> None:
        self._server = _Server(("127.0.0.1", port), resolve)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="walchannel-discovery",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return int(self._server.server_address[1])

    @property
    def http_addr(self) -> str:
        """The base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop serving and close the socket (idempotent; blocks up to ~50 ms)."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
