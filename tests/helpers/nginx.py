"""A real nginx (L7 gRPC load balancer) as a non-daemon child, for tests/test_nginx.py.

Everything lives in a temp folder of its own: the config, the pid file, the
logs and nginx's temp paths, so it never touches the system nginx. It
listens on ``127.0.0.1:P`` with plain HTTP/2 (h2c) and ``grpc_pass``es to an
upstream group of engine addresses (round robin).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
)

CONFIG = """\
{user}
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    upstream engines {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port} http2;
        # Without this nginx ends a long stream after 1 MB of request body.
        client_max_body_size 0;
        client_body_timeout {timeout_s}s;
        location / {{
            grpc_pass grpc://engines;
            grpc_read_timeout {timeout_s}s;
            grpc_send_timeout {timeout_s}s;
            grpc_connect_timeout 2s;
        }}
    }}
}}
"""


def free_port() -> int:
    """A port the kernel just handed out for port 0 (nginx cannot report its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Nginx:
    """nginx in front of ``upstreams`` with all three idle timeouts set to ``timeout_s``."""

    def __init__(self, prefix: Path, upstreams: list[str], *, timeout_s: float) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed")
        self.prefix = prefix
        self.upstreams = upstreams
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NGINX is not None
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)
        servers = "\n".join(
            f"        server {u} max_fails=1 fail_timeout=2s;" for u in self.upstreams
        )
        # Run as root in CI: keep the workers root too, so they can read the temp folder.
        user = "user root;" if os.geteuid() == 0 else ""
        for _ in range(5):
            self.port = free_port()
            conf = self.prefix / "nginx.conf"
            conf.write_text(
                CONFIG.format(
                    user=user,
                    prefix=self.prefix,
                    servers=servers,
                    port=self.port,
                    timeout_s=int(self.timeout_s),
                )
            )
            self.proc = subprocess.Popen(
                [
                    NGINX,
                    "-p",
                    str(self.prefix),
                    "-c",
                    str(conf),
                    "-e",
                    str(self.prefix / "error.log"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_listening():
                return
            self.stop()
        raise RuntimeError(f"nginx did not start: {self.error_log()[-2000:]}")

    def _wait_listening(self, timeout_s: float = 10.0) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return True
            time.sleep(0.05)
        return False

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
