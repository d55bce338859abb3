"""The production transport: grpc.aio calls and httpx discovery.

Fills the :class:`~walchannel.transport.base.Transport` seam for
:class:`~walchannel.channel.GrpcEngineChannel`: each dial is a fresh grpc.aio
channel and ``/EngineChannel/Open`` call carrying ``authorization: Bearer
<run_token>`` metadata, with the keepalive options of SPEC "Dial" and the
proxy policy of docs/design.md ("Proxies: one policy"); discovery is
:func:`walchannel.transport.discovery.discover` over the harness's ``http_client`` or
a client of its own. grpc's errors become
:class:`~walchannel.transport.base.StreamEnded` here, with the status they carry.

It also watches for ``os.fork()`` while a transport is open (from the
channel's construction to its close): gRPC's fork handlers can crash the
forked child, so the first such fork warns once (:func:`warn_fork`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
import grpc.aio

from walchannel._logging import get_logger
from walchannel.core.end_status import status_lost
from walchannel.core.watchdog import KEEPALIVE_TIMEOUT_MS
from walchannel.transport.base import StreamEnded
from walchannel.transport.discovery import discover, discovery_client
from walchannel.wire.address import Proxy, parse_host_port, proxy_for

if TYPE_CHECKING:
    from collections.abc import Coroutine

    import httpx

    from walchannel.config import GrpcChannelConfig

__all__ = [
    "METHOD",
    "TOKEN_TRACERS",
    "GrpcCall",
    "GrpcTransport",
    "token_tracers",
    "warn_fork",
    "warn_grpc_trace",
]

logger = get_logger(__name__)

METHOD: Final = "/EngineChannel/Open"

T = TypeVar("T")

_trace_warned = False
#: Bound on closing a grpc.aio channel (seconds).
_CLOSE_TIMEOUT_S: Final = 2.0


#: gRPC tracers that print call metadata, the bearer token included: found by
#: running a channel and a local engine under each tracer grpcio 1.85 lists
#: (``GRPC_TRACE=list_tracers``) and searching the output for the token.
TOKEN_TRACERS: Final = ("api", "chttp2_hpack_parser")


def token_tracers(grpc_trace: str) -> list[str]:
    """Return which of :data:`TOKEN_TRACERS` a ``GRPC_TRACE`` value enables.

    As gRPC reads it: comma-separated names, case-sensitive, ``all``, glob
    patterns (``*``, ``?``), and ``-name`` disabling, applied in order.
    """
    enabled: set[str] = set()
    for item in (part.strip() for part in grpc_trace.split(",")):
        pattern = item.removeprefix("-")
        named = {t for t in TOKEN_TRACERS if pattern == "all" or fnmatch.fnmatchcase(t, pattern)}
        if item.startswith("-"):
            enabled -= named
        else:
            enabled |= named
    return sorted(enabled)


def warn_grpc_trace() -> None:
    """Warn once per process when ``GRPC_TRACE`` enables tracers that print the token.

    SPEC "Secrets": gRPC's :data:`TOKEN_TRACERS` print call metadata from C
    code, outside this library's reach, so it is said once.
    """
    global _trace_warned
    if _trace_warned:
        return
    spec = os.environ.get("GRPC_TRACE", "")
    leaky = token_tracers(spec)
    if leaky:
        _trace_warned = True
        logger.warning(
            "GRPC_TRACE=%s enables gRPC's %s tracer(s), which print call metadata, "
            "including the run token, from C code that walchannel cannot filter; do not "
            "enable them in production",
            spec,
            "/".join(leaky),
        )


#: ``GRPC_ENABLE_FORK_SUPPORT`` values that turn gRPC's fork handlers off: what
#: gRPC core reads as false (absl::SimpleAtob: trimmed, any case). Any other
#: value leaves them on (gRPC prints "... is not a bool" for one it cannot read).
GRPC_FORK_SUPPORT_OFF: Final = frozenset({"0", "f", "false", "n", "no"})

# The transports not closed yet (one per channel), and the once-per-process flags.
_open_transports: weakref.WeakSet[GrpcTransport] = weakref.WeakSet()
_fork_hook_registered = False
_fork_warned = False


def _watch_forks(transport: GrpcTransport) -> None:
    """Count ``transport`` as open; register the fork hook once per process."""
    global _fork_hook_registered
    _open_transports.add(transport)
    if not _fork_hook_registered:
        _fork_hook_registered = True
        # before= only: it runs in the parent; the child is left alone.
        os.register_at_fork(before=warn_fork)


def warn_fork() -> None:
    """Warn once per process when it forks with a channel open (an ``os.register_at_fork`` hook).

    gRPC's fork handlers, on unless ``GRPC_ENABLE_FORK_SUPPORT`` is false,
    can crash a child forked while grpc.aio runs (SIGSEGV inside
    ``os.fork()``, about 1 fork in 6-12 under load; docs/security.md). A
    ``RuntimeWarning`` (``warnings.warn``, pointing at the caller of
    ``os.fork``) says what to do, at the first fork with a channel open;
    none without an open channel, once they are all closed, or when
    ``GRPC_ENABLE_FORK_SUPPORT`` is already one of
    :data:`GRPC_FORK_SUPPORT_OFF`. SPEC "The channel".
    """
    global _fork_warned
    if _fork_warned or not _open_transports:
        return
    if os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").strip().lower() in GRPC_FORK_SUPPORT_OFF:
        return
    _fork_warned = True
    warnings.warn(
        f"os.fork() with {len(_open_transports)} open walchannel channel(s): gRPC's fork "
        "handlers can crash the forked child (SIGSEGV inside fork()); set "
        "GRPC_ENABLE_FORK_SUPPORT=false before grpc is imported, or use multiprocessing's "
        "'spawn' or 'forkserver' start method (walchannel docs/security.md). Said once "
        "per process.",
        RuntimeWarning,
        stacklevel=2,
    )


def _identity(data: bytes) -> bytes:
    # Rows arrive already serialized (RowSource.row_bytes): no second encoding.
    return data


def _now(step: Coroutine[Any, Any, T]) -> T | None:
    """Run ``step`` to its end if it never suspends, else drop it and return None."""
    try:
        step.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    step.close()
    return None


def _done_status(call: Any) -> tuple[str, str, str] | None:
    """A done call's status ``(code, details, debug)``, read at once (grpc.aio's accessors).

    The accessors are coroutines that only wait while the call is not done:
    in a done callback they return without suspending.
    """
    code = _now(call.code())
    if code is None:
        return None
    return code.name, _now(call.details()) or "", _now(call.debug_error_string()) or ""


class GrpcCall:
    """One grpc.aio channel and its ``/EngineChannel/Open`` call (a :class:`StreamCall`)."""

    def __init__(self, channel: grpc.aio.Channel, call: Any, route: str) -> None:
        self._channel: grpc.aio.Channel | None = channel
        self._call: Any = call
        self.route = route
        # The status the call ended with, as its done callbacks saw it.
        self._first: tuple[str, str, str] | None = None
        call.add_done_callback(self._on_done)

    def _on_done(self, call: Any) -> None:
        """Keep the status the call ended with (grpc.aio runs this once, as the status lands).

        A write in flight as the call ends fails, and grpc.aio then replaces
        the call's status with ``INTERNAL: Internal error from Core``
        (grpc/grpc#36066): the engine's own status arrived first, and this
        callback has already run with it.
        """
        if self._first is None:
            self._first = _done_status(call)

    def _ended(self, exc: BaseException) -> StreamEnded:
        """grpc's error of this call as :class:`StreamEnded`, with the call's status if known.

        A write after the call ended fails with "RPC already finished"
        (``asyncio.InvalidStateError``): the status the call ended with is the reason.
        """
        if isinstance(exc, grpc.aio.AioRpcError):
            code, details, debug = self._status(
                exc.code().name, exc.details() or "", exc.debug_error_string() or ""
            )
        elif self._first is not None:
            code, details, debug = self._first
            if code == "OK":
                return StreamEnded("the engine ended the stream (status OK)")
        else:
            return StreamEnded(f"{type(exc).__name__}: {exc}")
        return StreamEnded(f"{code}: {details}", code, details, debug)

    def _status(self, code: str, details: str, debug: str = "") -> tuple[str, str, str]:
        """``(code, details, debug)``, or the first status when grpc.aio replaced it."""
        first = self._first
        if first is not None and status_lost(code, details) and not status_lost(*first[:2]):
            return first
        return code, details, debug

    async def write(self, message: bytes) -> None:
        try:
            await self._call.write(message)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            raise self._ended(exc) from None

    async def read(self) -> bytes:
        call = self._call
        try:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                code = await call.code()
                if code is grpc.StatusCode.OK:
                    raise StreamEnded("the engine ended the stream (status OK)")
                name, details, _ = self._status(code.name, await call.details() or "")
                raise StreamEnded(f"{name}: {details}", name, details)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            raise self._ended(exc) from None
        return msg  # type: ignore[no-any-return]

    async def done_writing(self) -> None:
        try:
            await self._call.done_writing()
        except Exception as exc:
            raise self._ended(exc) from None

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    async def final_status(self) -> tuple[str, str] | None:
        call = self._call
        if call is None or not call.done():
            return None
        try:
            code = await call.code()
            name, details, _ = self._status(code.name, await call.details() or "")
        except Exception as exc:
            raise self._ended(exc) from None
        return name, details

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._call = None
        if channel is None:
            return
        # Without a grace grpc.aio's close awaits nothing: the socket goes at
        # once. A cancel still propagates (never swallowed): the socket then
        # closes when the last reference to the channel does (its __del__).
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await channel.close(grace=None)


class GrpcTransport:
    """Dials with grpc.aio, discovers over httpx (a :class:`~walchannel.transport.base.Transport`).

    Args:
        config: the run's configuration (address options, credentials,
            proxies, discovery; the run token goes into call metadata only).
    """

    def __init__(self, config: GrpcChannelConfig) -> None:
        warn_grpc_trace()
        self._config = config
        self._run_id = config.run_id
        self._metadata = (("authorization", f"Bearer {config.run_token}"),)
        self._http: httpx.AsyncClient | None = config.http_client
        self._own_http = False
        self.discovery_route = ""
        # The last (address, proxy) logged, so a route is logged once.
        self._route: tuple[str, str | None] | None = None
        self._proxy_scheme_warned = False
        _watch_forks(self)

    # -- dialing ------------------------------------------------------------------------

    def dial(self, addr: str, *, keepalive_ms: int) -> GrpcCall:
        """Open a grpc.aio channel and call to ``addr``; nothing is awaited. SPEC "Dial"."""
        proxy = self._stream_proxy(addr)
        options = self.channel_options(keepalive_ms, proxy)
        creds = self._config.credentials
        if creds is None:
            channel = grpc.aio.insecure_channel(addr, options=options)
        else:
            channel = grpc.aio.secure_channel(addr, creds, options=options)
        # Raw bytes both ways: the channel parses what comes down itself
        # (wire.decode_down), so a text that is not UTF-8 is repaired, not lost
        # in grpc.aio's deserializer with a traceback.
        call = channel.stream_stream(
            METHOD, request_serializer=_identity, response_deserializer=_identity
        )(metadata=self._metadata)
        route = f" via proxy {proxy.shown}" if proxy is not None else ""
        return GrpcCall(channel, call, route)

    def _stream_proxy(self, addr: str) -> Proxy | None:
        """The proxy a dial to ``addr`` goes through (config ``proxy_from_env``), logged once."""
        proxy = None
        if self._config.proxy_from_env:
            proxy = proxy_for(parse_host_port(addr, what="engine address")[0], "grpc")
        if proxy is not None and proxy.scheme != "http":
            if not self._proxy_scheme_warned:
                self._proxy_scheme_warned = True
                logger.warning(
                    "run %s: %s names a %s:// proxy (%s); gRPC can only tunnel through an "
                    "http:// proxy: dialling %s directly",
                    self._run_id,
                    proxy.source,
                    proxy.scheme,
                    proxy.shown,
                    addr,
                )
            proxy = None
        route = (addr, None if proxy is None else f"{proxy.shown} (from {proxy.source})")
        if route != self._route:
            if route[1] is not None:
                logger.info("run %s: dialling %s via proxy %s", self._run_id, addr, route[1])
            elif self._route is not None and self._route[1] is not None:
                logger.info("run %s: dialling %s directly (no proxy applies)", self._run_id, addr)
            self._route = route
        return proxy

    def channel_options(
        self, keepalive_ms: int, proxy: Proxy | None = None
    ) -> list[tuple[str, Any]]:
        """The gRPC channel options of a dial (SPEC "Dial": keepalive names and values).

        Also the receive limit, ``max_receive_message_bytes`` (SPEC "Down messages").
        """
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Replay is ours: gRPC's transparent retries would reorder nothing
            # useful and hide drops.
            ("grpc.enable_retries", 0),
            # A fresh channel is a fresh connection: gRPC's global subchannel
            # pool would hand a re-dial the old connection (or another run's
            # to the same address) when it outlived its channel's close.
            ("grpc.use_local_subchannel_pool", 1),
            # No send cap: max_message_bytes judges new sends (RowSource.prepare);
            # a row already logged (under a larger max_message_bytes) is the
            # engine's to accept or refuse, and a refusal is handled (the
            # channel sets it aside). A cap here would refuse such a row on
            # every stream, forever.
            ("grpc.max_send_message_length", -1),
            # A down message over it ends the stream; the channel names the
            # field (SPEC "Down messages").
            ("grpc.max_receive_message_length", self._config.max_receive_message_bytes),
        ]
        if self._config.tls_server_name is not None:
            options.append(("grpc.ssl_target_name_override", self._config.tls_server_name))
        # The proxy is decided here (_stream_proxy), never by gRPC's own
        # reading of the environment, so the one logged is the one used.
        if proxy is not None:
            options += [("grpc.enable_http_proxy", 1), ("grpc.http_proxy", proxy.url)]
        else:
            options.append(("grpc.enable_http_proxy", 0))
        return options

    # -- discovery ------------------------------------------------------------------------

    async def discover(self, timeout_s: float) -> str:
        """Ask ``GET {http_addr}/grpc-address`` (SPEC "Reconnect"; :mod:`~.discovery`)."""
        http_addr = self._config.http_addr
        assert http_addr is not None
        if self._http is None:
            self._http, proxy = discovery_client(
                http_addr, proxy_from_env=self._config.proxy_from_env
            )
            self.discovery_route = f" via proxy {proxy.shown}" if proxy is not None else ""
            self._own_http = True
        return await discover(
            self._http, http_addr, allowed_hosts=self._config.allowed, timeout_s=timeout_s
        )

    async def aclose(self) -> None:
        """Close the discovery client this transport made (the harness's own stays open).

        From here on a fork no longer counts this transport as open (:func:`warn_fork`).
        """
        _open_transports.discard(self)
        if self._own_http and self._http is not None:
            http, self._http = self._http, None
            with contextlib.suppress(Exception):
                await http.aclose()
