"""Discovery over httpx.MockTransport: limits, redirects, shapes, allowed_hosts."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Literal

import httpx
import pytest

from walchannel.errors import DiscoveryError
from walchannel.transport.discovery import discover, discovery_client
from walchannel.wire.address import (
    host_allowed,
    parse_allowed_hosts,
    parse_host_port,
    proxy_bypassed,
    proxy_for,
)

BASE = "http://engines.test:8080"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    def streamed(request: httpx.Request) -> httpx.Response:
        # As a server sends it: a body still to be read (discovery reads it raw).
        made = handler(request)
        return httpx.Response(
            made.status_code, headers=made.headers, stream=httpx.ByteStream(made.content)
        )

    return httpx.AsyncClient(transport=httpx.MockTransport(streamed))


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


# -- the proxy the environment names (issue 13, item 6) ------------------------------------

PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "no_proxy", "no_grpc_proxy")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def route(host: str, kind: Literal["grpc", "http", "https"]) -> str | None:
    proxy = proxy_for(host, kind)
    return None if proxy is None else f"{proxy.shown} {proxy.source}"


def test_no_proxy_variable_means_direct(env: Callable[..., None]) -> None:
    assert route("engine.internal", "grpc") is None
    assert route("engine.internal", "https") is None


def test_the_stream_takes_grpcs_order_and_discovery_its_scheme(env: Callable[..., None]) -> None:
    env(http_proxy="http://h:1", https_proxy="http://s:2", all_proxy="http://a:3")
    assert route("e", "grpc") == "s:2 https_proxy"
    assert route("e", "http") == "h:1 http_proxy"
    assert route("e", "https") == "s:2 https_proxy"
    env(grpc_proxy="http://g:4")
    assert route("e", "grpc") == "g:4 grpc_proxy"
    assert route("e", "http") == "h:1 http_proxy"


def test_all_proxy_serves_discovery_but_not_the_stream(env: Callable[..., None]) -> None:
    env(ALL_PROXY="http://a:3")
    assert route("e", "grpc") is None
    assert route("e", "https") == "a:3 ALL_PROXY"


def test_either_case_is_read_and_the_lower_case_wins(env: Callable[..., None]) -> None:
    env(HTTPS_PROXY="http://upper:1")
    assert route("e", "grpc") == "upper:1 HTTPS_PROXY"
    env(https_proxy="http://lower:2")
    assert route("e", "grpc") == "lower:2 https_proxy"


def test_a_value_without_scheme_is_http_and_credentials_are_never_shown(
    env: Callable[..., None],
) -> None:
    env(https_proxy="proxy.corp:3128")
    proxy = proxy_for("e", "grpc")
    assert proxy is not None and proxy.url == "http://proxy.corp:3128"
    env(https_proxy="http://scan:SECRET@[fd00::1]:3128")
    proxy = proxy_for("e", "grpc")
    assert proxy is not None and proxy.shown == "[fd00::1]:3128"
    assert "SECRET" not in repr(proxy) and "SECRET" not in proxy.shown
    assert "SECRET" in proxy.url  # handed to gRPC and httpx, which send it to the proxy


@pytest.mark.parametrize(
    ("no_proxy", "host", "bypassed"),
    [
        ("*", "engine.internal", True),
        ("engine.internal", "engine.internal", True),
        ("ENGINE.internal", "engine.internal", True),
        (".internal", "engine.internal", True),
        ("internal", "engine.internal", True),
        (".internal", "internal", True),
        ("nal", "engine.internal", True),  # gRPC's plain-suffix rule: it would bypass too
        ("other.internal", "engine.internal", False),
        ("10.0.0.0/8", "10.1.2.3", True),
        ("10.0.0.0/8", "11.1.2.3", False),
        ("10.0.0.0/8", "engine.internal", False),
        ("127.0.0.1", "127.0.0.1", True),
        ("::1", "::1", True),
        ("fd00::/8", "fd00::5", True),
        (" a.b , 10.0.0.0/8 ,", "10.9.9.9", True),
        ("", "engine.internal", False),
    ],
)
def test_no_proxy_rules(no_proxy: str, host: str, bypassed: bool) -> None:
    assert proxy_bypassed(host, no_proxy) is bypassed


def test_no_grpc_proxy_exempts_the_stream_only(env: Callable[..., None]) -> None:
    env(http_proxy="http://h:1", no_grpc_proxy="engine.internal", no_proxy="other")
    assert route("engine.internal", "grpc") is None
    assert route("engine.internal", "http") == "h:1 http_proxy"
    env(NO_PROXY="engine.internal")
    assert route("engine.internal", "http") == "h:1 http_proxy"  # lower-case no_proxy wins
    env(no_proxy="engine.internal")
    assert route("engine.internal", "http") is None


@pytest.mark.asyncio
async def test_discovery_client_follows_the_policy(env: Callable[..., None]) -> None:
    env(https_proxy="http://scan:SECRET@proxy.corp:3128", no_proxy="direct.corp")
    client, proxy = discovery_client("https://engines.corp")
    await client.aclose()
    assert proxy is not None and proxy.shown == "proxy.corp:3128"
    for http_addr, from_env in (("https://engines.corp", False), ("https://direct.corp", True)):
        client, proxy = discovery_client(http_addr, proxy_from_env=from_env)
        await client.aclose()
        assert proxy is None
    env(https_proxy="socks5://proxy.corp:1080")
    client, proxy = discovery_client("https://engines.corp")
    await client.aclose()
    assert proxy is None  # not one httpx can use without extras: direct, with a WARNING
