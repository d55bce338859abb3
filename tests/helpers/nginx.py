"""A real nginx (L7 gRPC load balancer) as a non-daemon child, for tests/test_nginx.py.

Everything lives in a temp folder of its own: the config, the pid file, the
logs and nginx's temp paths, so it never touches the system nginx. It
runs ``examples/nginx-engines.conf`` (the config docs/deployment.md ships),
listening on ``127.0.0.1:P`` with plain HTTP/2 (h2c) and ``grpc_pass``ing to
the test's engine addresses (round robin).
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

# The example config the docs ship, run as the tests' balancer.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nginx-engines.conf"

MAIN = """\
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
    include {prefix}/engines.conf;
}}
"""


def engines_conf(upstreams: list[str], port: int, timeout_s: int) -> str:
    """The shipped example with the test's listen address, upstreams and idle timeouts."""
    text = EXAMPLE.read_text()
    example_servers = [
        line for line in text.splitlines() if line.strip().startswith("server engine-")
    ]
    listen = "    listen 50051 http2;"
    assert example_servers and listen in text and text.count(" 3600s;") == 3, "example changed"
    servers = "\n".join(f"    server {u} max_fails=1 fail_timeout=2s;" for u in upstreams)
    text = text.replace("\n".join(example_servers), servers)
    text = text.replace(listen, f"    listen 127.0.0.1:{port} http2;")
    return text.replace(" 3600s;", f" {timeout_s}s;")


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
        # Run as root in CI: keep the workers root too, so they can read the temp folder.
        user = "user root;" if os.geteuid() == 0 else ""
        for _ in range(5):
            self.port = free_port()
            conf = self.prefix / "nginx.conf"
            (self.prefix / "engines.conf").write_text(
                engines_conf(self.upstreams, self.port, int(self.timeout_s))
            )
            conf.write_text(MAIN.format(user=user, prefix=self.prefix))
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
