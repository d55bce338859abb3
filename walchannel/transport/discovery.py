"""Engine discovery: ``GET {http_addr}/grpc-address`` over httpx.

The answer is ``host:port`` as the body, or JSON ``{"grpcAddr": "host:port"}``.
At most 1 KiB is read; a redirect is followed only to the same host (and
scheme and port); the address is validated and checked against
``allowed_hosts`` before it is returned, so a hostile answer is never
dialled. On any failure :class:`~walchannel.errors.DiscoveryError` says
why and the caller keeps its last address. SPEC "Reconnect".
"""

from __future__ import annotations

import json
import ssl
import zlib
from typing import Final, Literal
from urllib.parse import urljoin, urlsplit

import httpx

from walchannel._logging import get_logger
from walchannel.errors import DiscoveryError
from walchannel.wire.address import AllowedHost, Proxy, host_allowed, parse_host_port, proxy_for

__all__ = ["MAX_ANSWER_BYTES", "discover", "discovery_client", "discovery_url"]

logger = get_logger(__name__)

#: Most bytes of a discovery answer ever read.
MAX_ANSWER_BYTES = 1024
_MAX_REDIRECTS = 3


def discovery_url(http_addr: str) -> str:
    """Return ``{http_addr}/grpc-address`` (a trailing slash on the base is fine)."""
    return http_addr.rstrip("/") + "/grpc-address"


def discovery_client(
    http_addr: str, *, proxy_from_env: bool = True, verify: ssl.SSLContext | bool = True
) -> tuple[httpx.AsyncClient, Proxy | None]:
    """Build the httpx client discovery uses, with the proxy policy of the stream.

    The environment's proxy is resolved here (:func:`walchannel.wire.address.proxy_for`)
    and handed to httpx explicitly (``trust_env=False``), so what the log
    and errors name is what is used. httpx tunnels ``https://`` through an
    ``http://`` proxy with CONNECT and sends ``http://`` requests to it.

    Args:
        http_addr: the discovery base URL (its scheme picks the variable).
        proxy_from_env: False: connect directly whatever the environment says.
        verify: TLS verification for an ``https://`` base (httpx's ``verify``).

    Returns:
        The client (no redirects followed: :func:`discover` checks them) and
        the proxy it goes through, or None.
    """
    parts = urlsplit(http_addr)
    scheme: Literal["http", "https"] = "https" if parts.scheme == "https" else "http"
    proxy = proxy_for(parts.hostname or "", scheme) if proxy_from_env else None
    if proxy is not None and proxy.scheme not in ("http", "https"):
        logger.warning(
            "%s names a %s:// proxy (%s); discovery supports http:// and https:// proxies "
            "only: asking %s directly",
            proxy.source,
            proxy.scheme,
            proxy.shown,
            http_addr,
        )
        proxy = None
    if proxy is not None:
        logger.info(
            "discovery asks %s via proxy %s (from %s)", http_addr, proxy.shown, proxy.source
        )
    client = httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=verify,
        proxy=proxy.url if proxy is not None else None,
    )
    return client, proxy


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def parse_answer(body: bytes) -> str:
    """Return the ``host:port`` text of a discovery answer body.

    Raises:
        DiscoveryError: empty, not UTF-8, or JSON of the wrong shape.
    """
    try:
        text = body.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise DiscoveryError("discovery answer is not UTF-8 text") from None
    if not text:
        raise DiscoveryError("discovery answer is empty")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DiscoveryError(f"discovery answer is not valid JSON: {exc}") from None
        addr = data.get("grpcAddr") if isinstance(data, dict) else None
        if not isinstance(addr, str):
            raise DiscoveryError('discovery JSON answer has no string "grpcAddr"')
        return addr.strip()
    return text


#: Content-Encodings a server that ignored ``accept-encoding: identity`` may
#: use, and the zlib window bits that read them (RFC 9110 section 8.4.1).
_INFLATE: Final = {"gzip": 31, "x-gzip": 31, "deflate": 15}
#: The most raw bytes read for an answer, compressed or not.
_MAX_RAW_BYTES: Final = 64 * 1024


async def _read_bounded(resp: httpx.Response, url: str) -> bytes:
    """The answer's body, decoded, read only while it is within :data:`MAX_ANSWER_BYTES`.

    Raw bytes, inflated here with a capped ``zlib`` object: httpx would
    inflate each whole network chunk first, so a 254 KiB gzip of 256 MiB
    cost some 141 MiB before any bound could look at it.

    Raises:
        DiscoveryError: over the bound (raw or decoded), an encoding other
            than identity, gzip or deflate, or bytes that do not decode.
    """
    coding = resp.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        inflate = None
    elif coding in _INFLATE:
        inflate = zlib.decompressobj(_INFLATE[coding])
    else:
        raise DiscoveryError(
            f"{url} answered with content-encoding {coding} though asked for identity; serve"
            " the address uncompressed"
        )
    over = DiscoveryError(f"{url} answer is over {MAX_ANSWER_BYTES} bytes; not read further")
    body = bytearray()
    raw = 0
    async for chunk in resp.aiter_raw():
        raw += len(chunk)
        if raw > _MAX_RAW_BYTES:
            raise over  # compressed bytes that inflate to little: nothing an address needs
        if inflate is not None:
            try:
                # At most one byte past the bound is ever produced.
                chunk = inflate.decompress(chunk, MAX_ANSWER_BYTES + 1 - len(body))
            except zlib.error as exc:
                raise DiscoveryError(
                    f"{url} answer says content-encoding {coding} but cannot be decoded: {exc}"
                ) from None
            if inflate.unconsumed_tail:
                raise over
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise over
    if inflate is not None and not inflate.eof:
        raise DiscoveryError(f"{url} answer says content-encoding {coding} but ends cut short")
    return bytes(body)


async def discover(
    client: httpx.AsyncClient,
    http_addr: str,
    *,
    allowed_hosts: tuple[AllowedHost, ...] | None,
    timeout_s: float,
) -> str:
    """Ask the stable engine URL for the live engine's gRPC address.

    Args:
        client: the httpx client (redirects are handled here, not by it).
        http_addr: the base URL (``http://`` or ``https://``).
        allowed_hosts: the hosts the answer may name (None: any).
        timeout_s: bound for the whole exchange (seconds).

    Returns:
        A validated ``host:port``.

    Raises:
        DiscoveryError: refused, timed out, non-200, over 1 KiB, a redirect
            to another host, unparsable, or a host outside ``allowed_hosts``.
    """
    url = discovery_url(http_addr)
    origin = _origin(url)
    timeout = httpx.Timeout(timeout_s)
    for _ in range(_MAX_REDIRECTS + 1):
        try:
            async with client.stream(
                "GET",
                url,
                timeout=timeout,
                follow_redirects=False,
                # No compression: the 1 KiB bound is on what we decode.
                headers={"accept-encoding": "identity"},
            ) as resp:
                if resp.is_redirect:
                    location = resp.headers.get("location", "")
                    target = urljoin(url, location)
                    if _origin(target) != origin:
                        raise DiscoveryError(
                            f"{url} redirects to another host ({urlsplit(target).netloc}); "
                            "not followed"
                        )
                    url = target
                    continue
                if resp.status_code != 200:
                    raise DiscoveryError(f"{url} answered HTTP {resp.status_code}")
                body = await _read_bounded(resp, url)
        except httpx.HTTPError as exc:
            raise DiscoveryError(f"{url}: {type(exc).__name__}: {exc}") from None
        text = parse_answer(bytes(body))
        try:
            host, port = parse_host_port(text, what="discovered address")
        except ValueError as exc:
            raise DiscoveryError(f"{url}: {exc}") from None
        if not host_allowed(host, allowed_hosts):
            raise DiscoveryError(
                f"{url} named {text!r}, whose host is not in allowed_hosts; not dialled"
            )
        return text if not text.startswith("[") else f"[{host}]:{port}"
    raise DiscoveryError(f"{http_addr}: more than {_MAX_REDIRECTS} redirects")
