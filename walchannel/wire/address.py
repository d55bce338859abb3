"""gRPC addresses: parsing ``host:port``, checking hosts against ``allowed_hosts``,
and picking the proxy the environment names for a host.

Used for ``GrpcChannelConfig.grpc_addr`` and for every address discovery
answers, which is validated before any dial (SPEC "Reconnect"). No DNS is
done here: a host name matches only a listed name, an IP literal only a
listed network.
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

__all__ = [
    "AllowedHost",
    "Proxy",
    "host_allowed",
    "parse_allowed_hosts",
    "parse_host_port",
    "proxy_bypassed",
    "proxy_for",
]

AllowedHost = str | ipaddress.IPv4Network | ipaddress.IPv6Network

# RFC 1123 host names (labels of letters, digits and inner hyphens).
_HOSTNAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+")


def parse_host_port(text: object, *, what: str = "address") -> tuple[str, int]:
    """Parse ``host:port`` (IPv6 as ``[::1]:port``) and return ``(host, port)``.

    Args:
        text: the address.
        what: how errors name it, e.g. ``"grpc_addr"``.

    Returns:
        The host (without brackets) and the port (1-65535).

    Raises:
        ValueError: not a ``str``, a URL, a path, a missing or bad host or
            port, or a port out of range; the message names ``what``.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a str 'host:port', got {type(text).__name__}")
    shown = text if len(text) <= 80 else text[:77] + "..."
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{what} {shown!r} must be 'host:port' without spaces")
    if "://" in text or "/" in text:
        raise ValueError(f"{what} {shown!r} must be 'host:port', not a URL or path")
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError(f"{what} {shown!r}: IPv6 addresses are written '[addr]:port'")
        host, port_text = text[1:end], text[end + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{what} {shown!r}: {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{what} {shown!r} has no port ('host:port')")
        if ":" in host:
            raise ValueError(f"{what} {shown!r}: write IPv6 addresses as '[addr]:port'")
        if not host:
            raise ValueError(f"{what} {shown!r} has no host")
        if not _is_ipv4(host) and not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{what} {shown!r}: {host!r} is not a host name or IP address")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"{what} {shown!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} {shown!r}: port {port} is out of range 1-65535")
    return host, port


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def parse_allowed_hosts(items: Iterable[object]) -> tuple[AllowedHost, ...]:
    """Normalize ``allowed_hosts``: IP addresses/networks become networks, names lower-case.

    Raises:
        ValueError: an entry that is empty, not a ``str``, or neither a host
            name nor an IP network.
    """
    if isinstance(items, str):
        raise ValueError("allowed_hosts must be a list of hosts or networks, not one str")
    out: list[AllowedHost] = []
    for item in items:
        if isinstance(item, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            out.append(item)
            continue
        if not isinstance(item, str) or not item:
            raise ValueError(f"allowed_hosts entry {item!r} must be a non-empty str")
        try:
            out.append(ipaddress.ip_network(item, strict=False))
            continue
        except ValueError:
            pass
        if not _HOSTNAME.fullmatch(item):
            raise ValueError(f"allowed_hosts entry {item!r} is not a host name or IP network")
        out.append(item.lower().rstrip("."))
    return tuple(out)


def host_allowed(host: str, allowed: tuple[AllowedHost, ...] | None) -> bool:
    """Tell whether ``host`` may be dialled: always when ``allowed`` is None."""
    if allowed is None:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().rstrip(".")
        return any(isinstance(a, str) and a == name for a in allowed)
    return any(not isinstance(a, str) and ip.version == a.version and ip in a for a in allowed)


# -- proxies from the environment ----------------------------------------------------------

#: The variables each kind of connection reads, first set wins. The stream
#: takes gRPC's own order (grpc_proxy, https_proxy, http_proxy; see gRPC's
#: doc/environment_variables.md); discovery takes the proxy of its URL's
#: scheme, then all_proxy, as httpx and requests do.
_PROXY_KEYS: dict[str, tuple[str, ...]] = {
    "grpc": ("grpc", "https", "http"),
    "http": ("http", "all"),
    "https": ("https", "all"),
}
_NO_PROXY_KEYS: dict[str, tuple[str, ...]] = {
    "grpc": ("no_grpc", "no"),
    "http": ("no",),
    "https": ("no",),
}


@dataclass(frozen=True, repr=False)
class Proxy:
    """The HTTP proxy a connection goes through.

    Attributes:
        url: the proxy URL (``http://[user:password@]host[:port]``); may hold
            credentials: never log it, show :attr:`shown`.
        source: the environment variable it came from, e.g. ``https_proxy``.
    """

    url: str
    source: str

    @property
    def shown(self) -> str:
        """``host:port`` of the proxy, never its credentials."""
        parts = urlsplit(self.url)
        host = parts.hostname or "?"
        if ":" in host:
            host = f"[{host}]"
        try:
            port = parts.port
        except ValueError:
            port = None
        return host if port is None else f"{host}:{port}"

    @property
    def scheme(self) -> str:
        """The proxy URL's scheme (``http``, ``https``, ``socks5``...)."""
        return urlsplit(self.url).scheme.lower()

    def __repr__(self) -> str:
        return f"Proxy({self.shown!r}, source={self.source!r})"


def proxy_for(host: str, kind: Literal["grpc", "http", "https"]) -> Proxy | None:
    """Return the proxy the environment names for a connection to ``host``, or None.

    The variables are read with :func:`urllib.request.getproxies_environment`
    (either case; the lower-case one wins; an upper-case ``HTTP_PROXY`` is
    ignored under CGI). A value without a scheme is taken as ``http://``.

    Args:
        host: the host to connect to (a name or an IP literal, no brackets).
        kind: ``"grpc"`` for the stream (``grpc_proxy``, then ``https_proxy``,
            then ``http_proxy``, as gRPC reads them; bypassed by
            ``no_grpc_proxy``, else ``no_proxy``), ``"http"``/``"https"``
            for discovery (``<scheme>_proxy``, then ``all_proxy``; bypassed
            by ``no_proxy``).

    Returns:
        The :class:`Proxy`, or None: no variable set, or ``host`` listed in
        the no-proxy variable (see :func:`proxy_bypassed`).
    """
    found = urllib.request.getproxies_environment()
    for key in _PROXY_KEYS[kind]:
        value = found.get(key, "").strip()
        if value:
            break
    else:
        return None
    no_proxy = next((found[k] for k in _NO_PROXY_KEYS[kind] if found.get(k)), "")
    if no_proxy and proxy_bypassed(host, no_proxy):
        return None
    if "://" not in value:
        value = "http://" + value
    # The lower-case variable wins when both are set (as read above).
    source = f"{key}_proxy" if os.environ.get(f"{key}_proxy") else f"{key.upper()}_PROXY"
    return Proxy(url=value, source=source)


def proxy_bypassed(host: str, no_proxy: str) -> bool:
    """Tell whether a no-proxy list (comma-separated) exempts ``host``.

    True when Python's rule (``urllib.request.proxy_bypass`` given the list,
    on Linux its environment rule: ``*``, the name, or a parent domain with
    or without a leading dot) or
    gRPC's (a plain suffix of the name, or an IP network such as
    ``10.0.0.0/8`` holding an IP literal) matches: gRPC applies its own rule
    to the stream whatever proxy it is given, so a host either rule exempts
    is dialled directly.
    """
    if urllib.request.proxy_bypass(host, {"no": no_proxy}):
        return True
    name = host.lower()
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if name.endswith(entry):
            return True
        if ip is not None:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if ip.version == network.version and ip in network:
                return True
    return False
