"""FaultProxy: a loopback TCP proxy that injects network faults between a channel and an engine.

It sits between a client (the channel) and a target (an engine, or nginx)
and forwards bytes both ways, until told otherwise:

- ``pass``: forward (plus ``latency_ms`` each way, order kept).
- ``reset``: RST every flow (``SO_LINGER`` 0), the live ones at once and
  every new one as it arrives.
- ``freeze``: keep every socket open and forward nothing, in either
  direction, for live and new flows: a half-open link. The proxy stops
  reading, so TCP windows fill and the sender blocks, as over a dead
  path. Back to ``pass`` the frozen flows flow again (the partition heals).
- ``blackhole``: new connections are accepted and never forwarded (no
  upstream connection, nothing read or answered); live flows go on.
- ``idle_timeout_s=T`` (any mode): a flow with no byte either way for
  ``T`` seconds is forgotten and reset, like a cloud load balancer.
- ``rate_bytes_per_s=R`` (any mode): each flow reads at most ``R`` bytes
  a second each way, a slow link. With ``socket_buffer_bytes`` (set at
  construction) the proxy's sockets and its read buffer are that small, so
  the sender blocks as on a slow path instead of the kernel taking the
  bytes at once.

Loopback only: the proxy listens on ``127.0.0.1`` and refuses a non-loopback
target. In-process (asyncio)::

    proxy = FaultProxy(engine.grpc_addr)
    await proxy.start()             # proxy.addr == "127.0.0.1:PORT"
    proxy.set_mode("freeze"); ...; proxy.set_mode("pass")
    await proxy.stop()

As a process (``python -m walchannel.testing.proxy --target HOST:PORT``):
prints one JSON line ``{"addr", "pid"}``, then reads commands from
standard input, one per line, answering each with one JSON line of its
stats: ``pass``, ``reset``, ``freeze``, ``blackhole``, ``latency MS``,
``idle_timeout S`` (0: off), ``rate BYTES_PER_S`` (0: off), ``target
HOST:PORT``, ``reset_all``, ``stats``, ``quit``. It stops on ``quit``, end
of input or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Final, Literal

from walchannel._logging import get_logger

__all__ = ["FaultMode", "FaultProxy", "ProxyEvent", "ProxyStats", "main"]

logger = get_logger(__name__)

FaultMode = Literal["pass", "reset", "freeze", "blackhole"]
MODES: Final[tuple[str, ...]] = ("pass", "reset", "freeze", "blackhole")

# Bytes read at a time, and chunks queued per direction before reading pauses.
_CHUNK: Final = 64 * 1024
_QUEUE_CHUNKS: Final = 64
# How often the idle monitor looks (a fraction of the idle timeout, seconds).
_IDLE_TICK_MAX_S: Final = 0.25
_CONNECT_TIMEOUT_S: Final = 5.0
# A rate-limited flow reads at most this long's worth of bytes at a time (seconds).
_RATE_TICK_S: Final = 0.05
#: Events kept (oldest dropped first).
MAX_EVENTS: Final = 10_000


def _split(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {addr!r}")
    host = host.strip("[]")
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"the fault proxy is loopback only; {addr!r} is not loopback")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class ProxyEvent:
    """One thing that happened to a flow (``at``: ``time.monotonic()`` seconds).

    ``kind``: ``accepted``, ``blackholed``, ``connected`` (upstream),
    ``connect_failed``, ``reset`` (by the proxy's mode), ``idle_reset``,
    ``client_closed``, ``target_closed``, ``closed``.
    """

    at: float
    flow: int
    kind: str


@dataclass(frozen=True, slots=True)
class ProxyStats:
    """Counters since :meth:`FaultProxy.start`."""

    mode: str
    latency_ms: float
    idle_timeout_s: float | None
    rate_bytes_per_s: float | None
    live_flows: int
    accepted: int
    resets: int
    idle_resets: int
    blackholed: int
    connect_failures: int
    bytes_up: int
    bytes_down: int


class _Flow:
    """One client connection and (unless blackholed) its upstream connection."""

    def __init__(
        self,
        proxy: FaultProxy,
        ident: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.ident = ident
        self.client_reader = reader
        self.client_writer = writer
        self.target_writer: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.last_activity = time.monotonic()
        self.done = asyncio.Event()
        self.closed = False

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_writer, self.target_writer) if w is not None]

    def reset(self, kind: str) -> None:
        """RST both sides (SO_LINGER 0, then abort) and end the flow."""
        if self.closed:
            return
        self.proxy._event(self.ident, kind)
        for writer in self.writers():
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self._end()

    def close(self, kind: str = "closed") -> None:
        """Close both sides cleanly (FIN) and end the flow."""
        if self.closed:
            return
        self.proxy._event(self.ident, kind)
        for writer in self.writers():
            writer.transport.close()
        self._end()

    def _end(self) -> None:
        self.closed = True
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        self.proxy._flows.pop(self.ident, None)
        self.done.set()


class FaultProxy:
    """A loopback TCP proxy with fault modes (see the module doc).

    Args:
        target: ``host:port`` to forward to (loopback only).
        listen_port: the port to listen on (0: any free port).
        mode: the starting mode (``pass``, ``reset``, ``freeze``, ``blackhole``).
        latency_ms: added delay per chunk, each way (milliseconds, >= 0).
        idle_timeout_s: reset a flow quiet for this long (seconds; None: never).
        rate_bytes_per_s: the most each flow forwards per second, each way
            (bytes/s, > 0; None: as fast as the sockets go).
        socket_buffer_bytes: ``SO_RCVBUF`` and ``SO_SNDBUF`` of the proxy's
            sockets, and the size of its read buffer (bytes, > 0; None: the
            kernel's, which grow to megabytes and would take a whole large
            message at once on a slow link). Keep it at 64 KiB or more: at
            16 KiB a gRPC flow at 24 KiB/s on loopback was ended after ~10 s
            by the TCP user timeout gRPC sets (ETIMEDOUT), before any rule
            of the channel could look.

    Raises:
        ValueError: a non-loopback target, an unknown mode, a negative value.
    """

    def __init__(
        self,
        target: str,
        *,
        listen_port: int = 0,
        mode: FaultMode = "pass",
        latency_ms: float = 0.0,
        idle_timeout_s: float | None = None,
        rate_bytes_per_s: float | None = None,
        socket_buffer_bytes: int | None = None,
    ) -> None:
        self._target = _split(target)
        if socket_buffer_bytes is not None and not socket_buffer_bytes > 0:
            raise ValueError(
                f"socket_buffer_bytes must be > 0 or None, got {socket_buffer_bytes!r}"
            )
        self._buffer_bytes = socket_buffer_bytes
        # The stream readers' limit: they stop reading the socket past twice it.
        self._read_limit = _CHUNK if socket_buffer_bytes is None else socket_buffer_bytes
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._flows: dict[int, _Flow] = {}
        self._next_flow = 0
        # Set while bytes may flow; cleared by ``freeze``.
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._monitor: asyncio.Task[None] | None = None
        self.events: list[ProxyEvent] = []
        self._counts = {
            "accepted": 0,
            "resets": 0,
            "idle_resets": 0,
            "blackholed": 0,
            "connect_failures": 0,
            "bytes_up": 0,
            "bytes_down": 0,
        }
        self._mode: str = "pass"
        self.set_mode(mode)
        self._latency_s = 0.0
        self.latency_ms = latency_ms
        self._idle_timeout_s: float | None = None
        self.idle_timeout_s = idle_timeout_s
        self._rate: float | None = None
        self.rate_bytes_per_s = rate_bytes_per_s

    # -- settings ----------------------------------------------------------

    @property
    def addr(self) -> str:
        """``127.0.0.1:PORT`` the clients dial.

        Raises:
            RuntimeError: not started.
        """
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        """The listening port (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def target(self) -> str:
        """The ``host:port`` new flows go to."""
        return f"{self._target[0]}:{self._target[1]}"

    @target.setter
    def target(self, addr: str) -> None:
        self._target = _split(addr)

    @property
    def mode(self) -> str:
        """The current mode."""
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Switch modes; ``reset`` resets the live flows at once, ``freeze`` stops them.

        Raises:
            ValueError: an unknown mode.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self._mode = mode
        if mode == "freeze":
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode == "reset":
            self.reset_all()

    @property
    def latency_ms(self) -> float:
        """Added delay per chunk, each way (milliseconds)."""
        return self._latency_s * 1000

    @latency_ms.setter
    def latency_ms(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"latency_ms must be >= 0, got {value!r}")
        self._latency_s = value / 1000

    @property
    def idle_timeout_s(self) -> float | None:
        """Reset flows quiet for this long (seconds), or None."""
        return self._idle_timeout_s

    @idle_timeout_s.setter
    def idle_timeout_s(self, value: float | None) -> None:
        if value is not None and not value > 0:
            raise ValueError(f"idle_timeout_s must be > 0 or None, got {value!r}")
        self._idle_timeout_s = value

    @property
    def rate_bytes_per_s(self) -> float | None:
        """The most each flow forwards per second, each way (bytes/s), or None."""
        return self._rate

    @rate_bytes_per_s.setter
    def rate_bytes_per_s(self, value: float | None) -> None:
        if value is not None and not value > 0:
            raise ValueError(f"rate_bytes_per_s must be > 0 or None, got {value!r}")
        self._rate = None if value is None else float(value)

    def reset_all(self) -> int:
        """RST every live flow now; return how many."""
        flows = list(self._flows.values())
        for flow in flows:
            self._counts["resets"] += 1
            flow.reset("reset")
        return len(flows)

    @property
    def live_flows(self) -> int:
        """Flows open right now (blackholed ones included)."""
        return len(self._flows)

    def stats(self) -> ProxyStats:
        """A snapshot of the counters."""
        return ProxyStats(
            mode=self._mode,
            latency_ms=self.latency_ms,
            idle_timeout_s=self._idle_timeout_s,
            rate_bytes_per_s=self._rate,
            live_flows=len(self._flows),
            **self._counts,
        )

    def _event(self, flow: int, kind: str) -> None:
        self.events.append(ProxyEvent(time.monotonic(), flow, kind))
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]
        logger.debug("flow %d: %s", flow, kind)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Listen on ``127.0.0.1:listen_port``.

        Raises:
            RuntimeError: already started.
            OSError: the port cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("the proxy is already started")
        sock = None
        if self._buffer_bytes is not None:
            # Set on the listening socket before listen(): accepted sockets
            # inherit the sizes, and the TCP window offered is chosen from them.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self._small_buffers(sock)
                sock.bind(("127.0.0.1", self._listen_port))
            except OSError:
                sock.close()
                raise
        self._server = await asyncio.start_server(
            self._on_client,
            None if sock else "127.0.0.1",
            None if sock else self._listen_port,
            sock=sock,
            limit=self._read_limit,
        )
        self._port = int(self._server.sockets[0].getsockname()[1])
        self._monitor = asyncio.create_task(self._idle_monitor(), name="fault-proxy-idle")
        logger.info("fault proxy on %s -> %s", self.addr, self.target)

    async def stop(self) -> None:
        """Stop listening and close every flow (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        flows = list(self._flows.values())
        for flow in flows:
            flow.close()
        for flow in flows:
            for task in flow.tasks:
                with contextlib.suppress(BaseException):
                    await task
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _small_buffers(self, sock: socket.socket) -> None:
        if self._buffer_bytes is not None:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, self._buffer_bytes)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._buffer_bytes is None:
            return await asyncio.open_connection(*self._target, limit=_CHUNK)
        # Sizes set before connect(), so the window offered is that small too.
        sock = socket.socket(socket.AF_INET6 if ":" in self._target[0] else socket.AF_INET)
        try:
            self._small_buffers(sock)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, self._target)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=self._read_limit)

    # -- flows ---------------------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next_flow += 1
        flow = _Flow(self, self._next_flow, reader, writer)
        self._flows[flow.ident] = flow
        self._counts["accepted"] += 1
        self._event(flow.ident, "accepted")
        try:
            if self._mode == "reset":
                self._counts["resets"] += 1
                flow.reset("reset")
                return
            if self._mode == "blackhole":
                # Accepted, never forwarded, never answered: read and drop until the
                # client gives up (so its close is seen and the flow forgotten).
                self._counts["blackholed"] += 1
                self._event(flow.ident, "blackholed")
                with contextlib.suppress(ConnectionError, OSError):
                    while await reader.read(_CHUNK):
                        pass
                flow.close("client_closed")
                return
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    self._open_upstream(), _CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                self._counts["connect_failures"] += 1
                flow.reset("connect_failed")
                return
            if flow.closed:
                target_writer.transport.abort()
                return
            flow.target_writer = target_writer
            self._event(flow.ident, "connected")
            up = asyncio.create_task(self._pump(flow, reader, target_writer, "up"))
            down = asyncio.create_task(self._pump(flow, target_reader, writer, "down"))
            flow.tasks += [up, down]
            await flow.done.wait()
        finally:
            if not flow.closed:
                flow.close()

    async def _pump(
        self,
        flow: _Flow,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
        sender = asyncio.create_task(self._send(flow, queue, writer, direction))
        flow.tasks.append(sender)
        # With a rate: when this direction may read again (time.monotonic()).
        paced = time.monotonic()
        try:
            while True:
                await self._flowing.wait()
                rate = self._rate
                size = _CHUNK if rate is None else max(1, min(_CHUNK, int(rate * _RATE_TICK_S)))
                try:
                    data = await reader.read(size)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    # EOF (or an error) from this side: end the whole flow.
                    await queue.put(None)
                    return
                flow.last_activity = time.monotonic()
                self._counts["bytes_up" if direction == "up" else "bytes_down"] += len(data)
                # Frozen after the read: hold it (forward nothing) until thawed.
                await self._flowing.wait()
                now = time.monotonic()
                await queue.put((now + self._latency_s, data))
                if rate is not None:
                    # Read nothing more until these bytes' time at the rate is up:
                    # the socket's buffer fills and the sender blocks.
                    paced = max(paced, now) + len(data) / rate
                    if paced > now:
                        await asyncio.sleep(paced - now)
        except asyncio.CancelledError:
            raise

    async def _send(
        self,
        flow: _Flow,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
        direction: str,
    ) -> None:
        while True:
            item = await queue.get()
            if item is None:
                flow.close("client_closed" if direction == "up" else "target_closed")
                return
            due, data = item
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._flowing.wait()
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                flow.close("client_closed" if direction == "down" else "target_closed")
                return
            flow.last_activity = time.monotonic()

    async def _idle_monitor(self) -> None:
        while True:
            timeout = self._idle_timeout_s
            tick = _IDLE_TICK_MAX_S if timeout is None else min(_IDLE_TICK_MAX_S, timeout / 4)
            await asyncio.sleep(tick)
            if timeout is None:
                continue
            now = time.monotonic()
            for flow in list(self._flows.values()):
                if now - flow.last_activity >= timeout:
                    self._counts["idle_resets"] += 1
                    flow.reset("idle_reset")


# -- the process form ----------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.proxy",
        description=(
            "A loopback TCP fault proxy. Prints one JSON line {addr, pid}, then reads"
            " commands from stdin (pass, reset, freeze, blackhole, latency MS,"
            " idle_timeout S, rate BYTES_PER_S, target HOST:PORT, reset_all, stats, quit),"
            " answering each"
            " with a JSON line of stats. reset and freeze act on live connections too;"
            " blackhole only on new ones (reset_all cuts the live ones)."
        ),
        epilog=(
            "example: python -m walchannel.testing.proxy --target 127.0.0.1:50051"
            " --latency-ms 20 --idle-timeout 30"
        ),
    )
    parser.add_argument("--target", required=True, help="host:port to forward to (loopback)")
    parser.add_argument("--listen-port", type=int, default=0, help="port (default: any free)")
    parser.add_argument("--mode", choices=MODES, default="pass", help="starting mode")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added delay each way")
    parser.add_argument("--idle-timeout", type=float, default=None, help="seconds (default: off)")
    parser.add_argument(
        "--rate", type=float, default=None, help="bytes/s each way per flow (default: no limit)"
    )
    parser.add_argument(
        "--socket-buffer",
        type=int,
        default=None,
        help="SO_RCVBUF/SO_SNDBUF of the proxy's sockets, bytes (default: the kernel's)",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging level (to stderr)",
    )
    return parser


def _command(proxy: FaultProxy, line: str) -> bool:
    """Carry out one stdin command; return False to stop."""
    words = line.split()
    if not words:
        return True
    name, args = words[0], words[1:]
    if name == "quit":
        return False
    if name in MODES:
        proxy.set_mode(name)
    elif name == "latency" and len(args) == 1:
        proxy.latency_ms = float(args[0])
    elif name == "idle_timeout" and len(args) == 1:
        value = float(args[0])
        proxy.idle_timeout_s = value if value > 0 else None
    elif name == "rate" and len(args) == 1:
        value = float(args[0])
        proxy.rate_bytes_per_s = value if value > 0 else None
    elif name == "target" and len(args) == 1:
        proxy.target = args[0]
    elif name == "reset_all":
        proxy.reset_all()
    elif name != "stats":
        raise ValueError(f"unknown command: {line.strip()!r}")
    return True


def _write_line(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


async def _serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    proxy = FaultProxy(
        args.target,
        listen_port=args.listen_port,
        mode=args.mode,
        latency_ms=args.latency_ms,
        idle_timeout_s=args.idle_timeout,
        rate_bytes_per_s=args.rate,
        socket_buffer_bytes=args.socket_buffer,
    )
    await proxy.start()
    _write_line({"addr": proxy.addr, "pid": os.getpid()})
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def commands() -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            try:
                go_on = _command(proxy, line.decode())
            except ValueError as exc:
                _write_line({"error": str(exc)})
                continue
            _write_line(asdict(proxy.stats()))
            if not go_on:
                return

    task = asyncio.create_task(commands())
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((task, stopper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        stopper.cancel()
        await proxy.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy process form (see the module doc).

    Returns:
        0 after ``quit``, end of input or a signal; 2 on bad usage.
    """
    try:
        args = _parser().parse_args(argv)
        _split(args.target)
    except SystemExit as exc:  # usage errors and --help: an exit code, not an exception
        return exc.code if isinstance(exc.code, int) else 2
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    return asyncio.run(_serve(args))


if __name__ == "__main__":
    sys.exit(main())
