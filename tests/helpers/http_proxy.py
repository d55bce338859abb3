"""A loopback HTTP proxy: CONNECT tunnels (how gRPC uses a proxy) and absolute-form
requests (how httpx sends a plain ``http://`` request through one). It records
what it was asked for, so a test sees that a dial really went through it."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


class HttpProxy:
    """Start with ``await proxy.start()``; ``proxy.addr`` is ``127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.requests: list[str] = []  # "CONNECT host:port", "GET http://host:port/path"
        self.auth: list[str | None] = []  # each request's Proxy-Authorization header
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.addr = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.addr = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = [h for h in lines[1:] if h]
            auth = [
                h.split(":", 1)[1].strip()
                for h in headers
                if h.lower().startswith("proxy-authorization:")
            ]
            self.requests.append(f"{method} {target}")
            self.auth.append(auth[0] if auth else None)
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urlsplit(target)
                assert url.hostname is not None
                up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
                path = url.path + (f"?{url.query}" if url.query else "")
                kept = [h for h in headers if not h.lower().startswith("proxy-")]
                request = "".join(f"{h}\r\n" for h in [f"{method} {path} {version}", *kept])
                up_writer.write(f"{request}\r\n".encode("latin-1"))
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.write_eof()
