"""Errors from outside walchannel never fail a run (issue 26, item 1; SPEC "The channel").

Whatever the harness's objects or a third-party boundary raise (a closed or
misconfigured ``http_client``, a raising httpx event hook, a malformed proxy
variable at the dial) is a failed attempt: logged at ERROR once with its
type, kept in ``last_error``, retried with backoff, and the last known
engine address is still dialed. Only walchannel's own invariant breaking
ends the run, with a ``failed_reason`` that ``inspect`` shows.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from conftest import eventually, new_run
from walchannel import (
    ChannelState,
    EngineUnavailableError,
    GrpcEngineChannel,
    WalchannelError,
    WalCorruptError,
)
from walchannel.cli.inspection import inspect_log
from walchannel.core.driver import Driver
from walchannel.log.state import FAILED_CORRUPT, FAILED_INTERNAL
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "no_proxy", "no_grpc_proxy")


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def errors(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


def closed_client() -> httpx.AsyncClient:
    return httpx.AsyncClient()


def raising_hook_client() -> httpx.AsyncClient:
    async def hook(request: httpx.Request) -> None:
        raise ValueError(f"harness hook refuses {request.url.path}")

    return httpx.AsyncClient(event_hooks={"request": [hook]})


@pytest.mark.parametrize(
    ("make_client", "close_it", "named"),
    [
        # encode/httpx #1332: the harness's `async with` ended before the run.
        (closed_client, True, "RuntimeError: Cannot send a request, as the client has been closed"),
        (raising_hook_client, False, "ValueError: harness hook refuses /grpc-address"),
    ],
    ids=["closed-client", "raising-event-hook"],
)
@pytest.mark.asyncio
async def test_a_broken_harness_http_client_leaves_discovery_dead_but_the_run_streams(
    local_engine: LocalEngine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    make_client: Callable[[], httpx.AsyncClient],
    close_it: bool,
    named: str,
) -> None:
    run_id, token = new_run(local_engine)
    client = make_client()
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token, http_client=client)
    caplog.set_level(logging.INFO, logger="walchannel")
    try:
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            ch.send_finding({"n": 0})
            assert await ch.wait_acked(timeout_ms=5000)
            if close_it:
                await client.aclose()
            for n in (1, 2, 3):
                # Each drop asks discovery again, which raises every time.
                await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
                await eventually(
                    lambda: named in (ch.stats().last_error or ""), what=f"last_error: {named}"
                )
                ch.send_finding({"n": n})
                assert await ch.wait_acked(timeout_ms=10_000)
                assert ch.state is ChannelState.STREAMING
            stats = ch.stats()
            path = ch.log.path
            assert stats.acked == 4 and stats.unacked_count == 0
        assert local_engine.accepted(run_id) == [1, 2, 3, 4]
        # Said once at ERROR with its type, whatever the number of drops.
        assert len(errors(caplog, named)) == 1, caplog.text
        assert "retried with backoff" in caplog.text
        assert token not in caplog.text
    finally:
        await client.aclose()
    report = inspect_log(path)
    assert report.state != "failed" and report.reason is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [("grpc_proxy", "http://[::1"), ("https_proxy", "http://[not-an-ip]:3128")],
    ids=["unclosed-ipv6-bracket", "bad-ip-literal"],
)
@pytest.mark.asyncio
async def test_a_malformed_proxy_variable_is_a_failed_dial_not_a_failed_run(
    local_engine: LocalEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    variable: str,
    value: str,
) -> None:
    clear_proxies(monkeypatch)
    monkeypatch.setenv(variable, value)
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, http_addr=None, connect_timeout_ms=1000
    )
    caplog.set_level(logging.INFO, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        ch.send_finding({"n": 0})
        with pytest.raises(EngineUnavailableError):
            await ch.handshake("1", "h", "1")
        await eventually(
            lambda: "dialing 127.0.0.1" in (ch.stats().last_error or ""),
            what="last_error naming the failed dial",
        )
        await eventually(lambda: "(attempt 2)" in caplog.text, what="an attempt after backoff")
        assert ch.state is not ChannelState.FAILED
        ch.send_finding({"n": 1})  # sends are still taken (and logged)
        assert ch.stats().unacked_count == 2
        # The operator fixes the variable: the next attempt streams.
        monkeypatch.delenv(variable)
        assert await ch.wait_acked(timeout_ms=15_000)
    assert local_engine.accepted(run_id) == [1, 2]
    dial_errors = errors(caplog, "dialing 127.0.0.1")
    assert len(dial_errors) == 1, caplog.text
    assert "ValueError" in dial_errors[0].getMessage()


@pytest.mark.asyncio
async def test_a_malformed_discovery_proxy_leaves_the_stream_on_the_last_address(
    local_engine: LocalEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # httpx refuses the proxy URL when discovery builds its client; the
    # stream's own proxy is bypassed, so only discovery is dead.
    clear_proxies(monkeypatch)
    monkeypatch.setenv("http_proxy", "http://[::1")
    monkeypatch.setenv("no_grpc_proxy", "127.0.0.1")
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    caplog.set_level(logging.INFO, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        for n in (0, 1):
            await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
            await eventually(
                lambda: "discovery (keeping" in (ch.stats().last_error or ""),
                what="last_error naming discovery",
            )
            ch.send_finding({"n": n})
            assert await ch.wait_acked(timeout_ms=10_000)
    assert local_engine.accepted(run_id) == [1, 2]
    assert len(errors(caplog, "discovery (keeping")) == 1, caplog.text


@pytest.mark.parametrize(
    "planted",
    [AssertionError("cursor above next_seq"), KeyError("attempt")],
    ids=["assertion", "bug"],
)
@pytest.mark.asyncio
async def test_walchannels_own_invariant_breaking_fails_the_run_and_names_it(
    local_engine: LocalEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    planted: Exception,
) -> None:
    # No real input breaks an invariant (that would be the bug): plant one
    # in the driver's backoff step, which only the connection loop calls.
    def broken(self: Driver, *args: Any) -> float:
        raise planted

    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_finding({"n": 0})
        assert await ch.wait_acked(timeout_ms=5000)
        monkeypatch.setattr(Driver, "_next_delay_ms", broken)
        await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
        await eventually(lambda: ch.state is ChannelState.FAILED, what="FAILED")
        with pytest.raises(WalchannelError, match=type(planted).__name__) as raised:
            ch.send_finding({"n": 1})
        assert "connection loop failed" in str(raised.value)
        meta = ch.log.meta()
        path = ch.log.path
    assert meta.failed_at is not None
    assert meta.failed_reason is not None and meta.failed_reason.startswith(FAILED_INTERNAL)
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None and type(planted).__name__ in report.reason


@pytest.mark.asyncio
async def test_a_raising_harness_callback_is_said_once_and_the_run_goes_on(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def on_budget(message: str, details: Any) -> None:
        seen.append(message)
        raise TypeError(f"harness budget handler cannot take {message!r}")

    def on_stop(reason: str) -> None:
        seen.append(reason)
        raise RuntimeError("harness stop handler crashed")

    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    caplog.set_level(logging.INFO, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        ch.on_budget_update(on_budget)
        ch.on_stop(on_stop)
        await ch.handshake("1", "h", "1")
        for n in range(3):
            assert await local_engine.send_budget_update(run_id, "80% used")
            ch.send_finding({"n": n})
            assert await ch.wait_acked(timeout_ms=5000)
        assert await local_engine.send_stop(run_id, "operator")
        await eventually(lambda: "operator" in seen, what="the stop callback")
        await eventually(
            lambda: "RuntimeError: harness stop handler crashed" in (ch.stats().last_error or ""),
            what="last_error naming the stop callback",
        )
        ch.send_finding({"n": 3})
        assert await ch.wait_acked(timeout_ms=5000)
        assert ch.state is ChannelState.STREAMING
    assert seen.count("80% used") == 3
    assert local_engine.accepted(run_id) == [1, 2, 3, 4]
    budget = errors(caplog, "TypeError: harness budget handler cannot take '80% used'")
    assert len(budget) == 1, caplog.text
    assert "callback test_a_raising_harness_callback" in budget[0].getMessage()
    assert "raised at " + __file__ in budget[0].getMessage()
    assert len(errors(caplog, "RuntimeError: harness stop handler crashed")) == 1
    assert token not in caplog.text


@pytest.mark.parametrize(
    "damage",
    ["DROP TABLE rows", "ALTER TABLE rows RENAME COLUMN body TO gone"],
    ids=["rows-dropped", "column-renamed"],
)
@pytest.mark.asyncio
async def test_a_log_damaged_under_the_writer_fails_the_run_naming_it(
    local_engine: LocalEngine, tmp_path: Path, damage: str
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        await local_engine.kill()
        # More than the in-memory tail holds, so the replay reads the file.
        for n in range(200):
            ch.send_finding({"n": n, "pad": "x" * 30_000})
        with sqlite3.connect(ch.log.path) as other:
            other.execute(damage)
        await local_engine.replace()
        await eventually(lambda: ch.state is ChannelState.FAILED, what="FAILED")
        with pytest.raises(WalCorruptError, match="cannot read rows"):
            ch.send_finding({"n": 200})
        meta = ch.log.meta()
    assert meta.failed_at is not None and meta.failed_reason == FAILED_CORRUPT
