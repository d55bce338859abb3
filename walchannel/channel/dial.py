"""Where and how the channel dials: discovery, the proxy, the gRPC options.

SPEC "Dial" (keepalive options) and "Reconnect" (discovery before each
redial, ``allowed_hosts``); docs/design.md, "Proxies: one policy". The
stream driver (:mod:`walchannel.channel.stream`) dials with what this decides.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from walchannel.address import Proxy, parse_host_port, proxy_for
from walchannel.channel.base import ChannelBase
from walchannel.config import redact_secret
from walchannel.discovery import discover, discovery_client
from walchannel.errors import DiscoveryError
from walchannel.session import KEEPALIVE_TIMEOUT_MS

__all__ = ["KEEPALIVE_TIMEOUT_MS", "Dialer"]

logger = logging.getLogger(__name__)


class Dialer(ChannelBase):
    """The dialing part of :class:`~walchannel.channel.GrpcEngineChannel`."""

    async def _rediscover(self) -> None:
        """Ask discovery for the engine's address; keep the last one on any failure.

        SPEC "Reconnect" (``GET {http_addr}/grpc-address``, validated against
        ``allowed_hosts`` before any dial); docs/design.md, "First address".
        """
        http_addr = self._config.http_addr
        assert http_addr is not None
        if self._http is None:
            self._http, proxy = discovery_client(
                http_addr, proxy_from_env=self._config.proxy_from_env
            )
            self._http_via = f" via proxy {proxy.shown}" if proxy is not None else ""
            self._own_http = True
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            addr = await asyncio.wait_for(
                discover(
                    self._http,
                    http_addr,
                    allowed_hosts=self._config.allowed,
                    timeout_s=timeout_s,
                ),
                timeout_s,
            )
        except DiscoveryError as exc:
            why = redact_secret(str(exc), self._config.run_token)
            logger.warning(
                "run %s: discovery failed%s, keeping %s: %s",
                self._run_id,
                self._http_via,
                self._addr,
                why,
            )
            self._set_error(f"discovery{self._http_via}: {why}")
            return
        except TimeoutError:
            logger.warning(
                "run %s: discovery timed out%s, keeping %s",
                self._run_id,
                self._http_via,
                self._addr,
            )
            self._set_error(
                f"discovery{self._http_via}: no answer from {http_addr} within {timeout_s:.1f} s"
            )
            return
        if addr != self._addr:
            logger.info(
                "run %s: discovery moved the engine from %s to %s", self._run_id, self._addr, addr
            )
            self._addr = addr

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

    def _channel_options(self, proxy: Proxy | None = None) -> list[tuple[str, Any]]:
        """The gRPC channel options of a dial (SPEC "Dial": keepalive names and values)."""
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", self._keepalive_ms),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Replay is ours: gRPC's transparent retries would reorder nothing
            # useful and hide drops.
            ("grpc.enable_retries", 0),
            # No send cap: max_message_bytes judges new sends (_prepare); a row
            # already logged (under a larger max_message_bytes) is the engine's
            # to accept or refuse, and a refusal is handled (_on_size_refusal).
            # A cap here would refuse such a row on every stream, forever.
            ("grpc.max_send_message_length", -1),
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
