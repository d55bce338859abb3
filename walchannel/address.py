"""gRPC addresses: parsing ``host:port`` and checking hosts against ``allowed_hosts``.

Used for ``GrpcChannelConfig.grpc_addr`` and for every address discovery
answers, which is validated before any dial (SPEC "Reconnect"). No DNS is
done here: a host name matches only a listed name, an IP literal only a
listed network.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

__all__ = ["AllowedHost", "host_allowed", "parse_allowed_hosts", "parse_host_port"]

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
