"""Discovery over httpx.MockTransport: limits, redirects, shapes, allowed_hosts."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import httpx
import pytest

from walchannel.address import host_allowed, parse_allowed_hosts, parse_host_port
from walchannel.discovery import discover
from walchannel.errors import DiscoveryError

BASE = "http://engines.test:8080"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def ask(
    handler: Callable[[httpx.Request], httpx.Response],
    allowed: tuple[str | ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None = None,
) -> str:
    async with client(handler) as c:
        return await discover(c, BASE, allowed_hosts=allowed, timeout_s=2)


@pytest.mark.asyncio
async def test_plain_and_json_answers() -> None:
    assert await ask(lambda r: httpx.Response(200, text="10.1.2.3:50051\n")) == "10.1.2.3:50051"
    assert (
        await ask(lambda r: httpx.Response(200, json={"grpcAddr": "engine-7:443"}))
        == "engine-7:443"
    )
    assert await ask(lambda r: httpx.Response(200, text="[::1]:9")) == "[::1]:9"


@pytest.mark.asyncio
async def test_the_path_is_grpc_address() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, text="h:1")

    async with client(handler) as c:
        await discover(c, BASE + "/", allowed_hosts=None, timeout_s=2)
    assert seen == [BASE + "/grpc-address"]


@pytest.mark.parametrize(
    ("response", "words"),
    [
        (httpx.Response(500, text="h:1"), "HTTP 500"),
        (httpx.Response(404), "HTTP 404"),
        (httpx.Response(200, text=""), "empty"),
        (httpx.Response(200, text="   \n"), "empty"),
        (httpx.Response(200, content=b"x" * 10_000_000), "over 1024 bytes"),
        (httpx.Response(200, text="http://h:1"), "not a URL"),
        (httpx.Response(200, text="engine"), "no port"),
        (httpx.Response(200, text="engine:99999"), "out of range"),
        (httpx.Response(200, text="engine:0"), "out of range"),
        (httpx.Response(200, json={"addr": "h:1"}), "grpcAddr"),
        (httpx.Response(200, json={"grpcAddr": 5}), "grpcAddr"),
        (httpx.Response(200, text="{not json"), "not valid JSON"),
        (httpx.Response(200, content=b"\xff\xfe:1"), "not UTF-8"),
        (
            httpx.Response(302, headers={"location": "http://evil.test/grpc-address"}),
            "another host",
        ),
        (httpx.Response(302, headers={"location": "https://engines.test:8080/x"}), "another host"),
    ],
)
@pytest.mark.asyncio
async def test_bad_answers_raise_discovery_error(response: httpx.Response, words: str) -> None:
    with pytest.raises(DiscoveryError, match=words):
        await ask(lambda r: response)


@pytest.mark.asyncio
async def test_same_host_redirect_is_followed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/grpc-address":
            return httpx.Response(307, headers={"location": "/v2/grpc-address"})
        return httpx.Response(200, text="engine-2:50051")

    assert await ask(handler) == "engine-2:50051"


@pytest.mark.asyncio
async def test_redirect_loops_end() -> None:
    with pytest.raises(DiscoveryError, match="redirects"):
        await ask(lambda r: httpx.Response(302, headers={"location": "/grpc-address"}))


@pytest.mark.asyncio
async def test_refused_connection_is_a_discovery_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(DiscoveryError, match="ConnectError"):
        await ask(handler)


@pytest.mark.asyncio
async def test_allowed_hosts_gate_the_answer() -> None:
    allowed = parse_allowed_hosts(["10.0.0.0/8", "engine.internal"])
    assert await ask(lambda r: httpx.Response(200, text="10.9.9.9:1"), allowed) == "10.9.9.9:1"
    assert (
        await ask(lambda r: httpx.Response(200, text="ENGINE.internal:1"), allowed)
        == "ENGINE.internal:1"
    )
    for outside in ("192.168.1.1:1", "evil.test:1", "[::1]:1"):
        with pytest.raises(DiscoveryError, match="allowed_hosts"):
            await ask(lambda r, o=outside: httpx.Response(200, text=o), allowed)


def test_host_port_parsing() -> None:
    assert parse_host_port("a.b-c:1") == ("a.b-c", 1)
    assert parse_host_port("[fe80::1]:65535") == ("fe80::1", 65535)
    for bad in ("", "a", ":1", "a:", "a b:1", "a:1/x", "[::1]", "[zz]:1", "::1:5", "a:+1", 5):
        with pytest.raises(ValueError, match="address"):
            parse_host_port(bad)


def test_host_allowed_matching() -> None:
    allowed = parse_allowed_hosts(["127.0.0.0/8", "Engine"])
    assert host_allowed("127.0.0.2", allowed)
    assert host_allowed("engine", allowed)
    assert not host_allowed("engine2", allowed)
    assert not host_allowed("128.0.0.1", allowed)
    assert host_allowed("anything", None)
