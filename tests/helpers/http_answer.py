"""A one-answer HTTP server for discovery cases: GET /grpc-address returns the given bytes."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def serve_answer(answer: bytes | Callable[[], bytes], status: int = 200) -> Iterator[str]:
    """Serve ``answer`` (bytes, or a function giving them per request) with ``status``.

    Listens on 127.0.0.1:0; yields the base URL.
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = answer() if callable(answer) else answer
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

    with serving(Handler) as url:
        yield url


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1:0 in a thread; yield the base URL; stop it on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
