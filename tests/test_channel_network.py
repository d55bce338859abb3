"""Reconnect behaviour against real sockets: backoff, discovery failures, sockets, two streams."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from conftest import eventually, new_run
from helpers.http_proxy import HttpProxy
from walchannel import Backoff, ChannelState, EngineUnavailableError, GrpcEngineChannel
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.log.state import Writer
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.wire.protobuf import handshake_message, up_message

RECONNECT = re.compile(r"reconnecting in (\d+) ms \(attempt (\d+)\)")


def delays(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [int(m.group(1)) for m in RECONNECT.finditer(caplog.text)]


@pytest.mark.asyncio
async def test_handshake_then_drop_does_not_reset_backoff_but_an_ack_does(
    local_engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine,
        tmp_path / "wal",
        run_id,
        token,
        http_addr=None,
        backoff=Backoff(initial_ms=40, multiplier=2, max_ms=640, jitter_ms=0),
    )
    stop_dropping = asyncio.Event()

    async def drop_every_stream() -> None:
        while not stop_dropping.is_set():
            await local_engine.end_streams(run_id, grpc.StatusCode.INTERNAL)
            await asyncio.sleep(0.005)

    caplog.set_level(logging.INFO, logger="walchannel.channel")
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        dropper = asyncio.create_task(drop_every_stream())
        await eventually(lambda: len(delays(caplog)) >= 6, what="six reconnects")
        stop_dropping.set()
        await dropper
        seen = delays(caplog)[:6]
        # The engine answers every handshake, yet the delays keep growing.
        assert seen == [40, 80, 160, 320, 640, 640], seen
        await eventually(lambda: ch.state is ChannelState.STREAMING, what="streaming")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=5000)
        caplog.clear()
        await local_engine.end_streams(run_id, grpc.StatusCode.INTERNAL)
        await eventually(lambda: delays(caplog), what="one reconnect")
        assert delays(caplog)[0] == 40  # an ack of a row written there reset it


class Discovery(http.server.ThreadingHTTPServer):
    """A discovery endpoint whose answer the test chooses."""

    mode = "good"
    grpc_addr = ""
    hits = 0


class Handler(http.server.BaseHTTPRequestHandler):
    server: Discovery

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.hits += 1
        mode = self.server.mode
        if mode == "slow":
            time.sleep(2.0)
        if mode == "500":
            self.send_response(500)
            self.end_headers()
            return
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", "http://169.254.1.1:9/grpc-address")
            self.end_headers()
            return
        body = {
            "good": self.server.grpc_addr.encode(),
            "slow": self.server.grpc_addr.encode(),
            "garbage": b"\x00\x01 not an address",
            "huge": b"9" * 10_000_000,
            "outside": b"10.66.0.1:50051",
        }[mode]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


@pytest.fixture
def discovery() -> Iterator[Discovery]:
    server = Discovery(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "mode", ["refused", "500", "garbage", "huge", "redirect", "slow", "outside"]
)
@pytest.mark.asyncio
async def test_failing_discovery_keeps_the_last_address_and_retries(
    local_engine: LocalEngine,
    tmp_path: Path,
    discovery: Discovery,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id, token = new_run(local_engine)
    discovery.grpc_addr = local_engine.grpc_addr
    http_addr = f"http://127.0.0.1:{discovery.server_address[1]}"
    if mode == "refused":
        discovery.shutdown()
        discovery.server_close()
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, http_addr=http_addr, connect_timeout_ms=1000
    )
    caplog.set_level(logging.WARNING, logger="walchannel.channel")
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        ch.send_finding({"n": 0})
        assert await ch.wait_acked(timeout_ms=5000)
        discovery.mode = mode if mode != "refused" else "good"
        await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
        await eventually(lambda: "discovery" in caplog.text, what="a discovery failure")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=10_000)
        assert ch.state is ChannelState.STREAMING
        assert local_engine.accepted(run_id) == [1, 2]
        assert "keeping " + local_engine.grpc_addr in caplog.text or "timed out" in caplog.text


@pytest.mark.asyncio
async def test_discovery_moves_the_channel_to_a_replacement(
    local_engine: LocalEngine, tmp_path: Path, discovery: Discovery
) -> None:
    run_id, token = new_run(local_engine)
    discovery.grpc_addr = local_engine.grpc_addr
    http_addr = f"http://127.0.0.1:{discovery.server_address[1]}"
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, http_addr=http_addr
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        await local_engine.kill()
        await local_engine.replace()
        discovery.grpc_addr = local_engine.grpc_addr
        ch.send_finding({"n": 0})
        assert await ch.wait_acked(timeout_ms=10_000)
        assert ch.log.meta().last_engine_addr == local_engine.grpc_addr
        assert discovery.hits >= 1


def established_to(port: int) -> int:
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01":
                count += 1
    return count


@pytest.mark.asyncio
async def test_close_leaves_no_connection_open(local_engine: LocalEngine, tmp_path: Path) -> None:
    run_id, token = new_run(local_engine)
    port = int(local_engine.grpc_addr.rsplit(":", 1)[1])
    ch = GrpcEngineChannel(local_channel_config(local_engine, tmp_path / "wal", run_id, token))
    await ch.handshake("1", "h", "1")
    ch.send_finding({"n": 0})
    assert await ch.wait_acked(timeout_ms=5000)
    assert established_to(port) >= 1
    await ch.close()
    await eventually(lambda: established_to(port) == 0, timeout=5, what="sockets to close")


@pytest.mark.asyncio
async def test_two_streams_for_one_run_never_apply_a_seq_twice(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite3"
    first, second = LocalEngine(store), LocalEngine(store)
    await first.start()
    await second.start()
    try:
        run_id, token = new_run(first)
        bodies = [{"n": i} for i in range(300)]
        config = local_channel_config(first, tmp_path / "wal", run_id, token, http_addr=None)

        async def stale_stream(writer: Writer) -> None:
            # An old stream of the same writer (another engine, same store)
            # re-sending the same seqs.
            async with grpc.aio.insecure_channel(second.grpc_addr) as channel:
                call = pb_grpc.EngineChannelStub(channel).Open(
                    metadata=(("authorization", f"Bearer {token}"),)
                )
                await call.write(
                    handshake_message(
                        run_id, "c", "1", "h", "1", writer_id=writer.id, writer_epoch=writer.epoch
                    )
                )
                for seq, body in enumerate(bodies, start=1):
                    await call.write(up_message(run_id, "c", seq, "finding", {"fields": body}))
                    if seq % 20 == 0:
                        await asyncio.sleep(0)
                await call.done_writing()
                async for _ in call:
                    pass

        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            racer = asyncio.create_task(stale_stream(ch.log.writer))
            for body in bodies:
                ch.send_finding(body)
                await asyncio.sleep(0)
            # It runs behind (duplicates) or ahead (refused with a gap): either way fine.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await racer
            assert await ch.wait_acked(timeout_ms=10_000)
        assert first.accepted(run_id) == list(range(1, 301))
        assert first.duplicates(run_id) > 0  # the two streams really overlapped
        contents = [b["body"]["fields"]["n"] for b in first.bodies(run_id)]
        assert contents == [float(i) for i in range(300)]
    finally:
        await first.stop()
        await second.stop()


# -- proxies from the environment (issue 13, item 6) ------------------------------------

PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "no_proxy", "no_grpc_proxy")


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Clear every proxy variable (both cases); the returned function sets some."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.asyncio
async def test_a_dead_env_proxy_is_named_in_last_error_and_the_log(
    local_engine: LocalEngine,
    tmp_path: Path,
    proxy_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = closed_port()
    proxy_env(http_proxy=f"http://scan:pw-SECRET@127.0.0.1:{dead}")
    proxy_env(https_proxy=f"http://scan:pw-SECRET@127.0.0.1:{dead}")
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, http_addr=None, connect_timeout_ms=1500
    )
    caplog.set_level(logging.INFO, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        with pytest.raises(EngineUnavailableError):
            await ch.handshake("1", "h", "1")
        ch.send_finding({"n": 1})
        await eventually(
            lambda: f"via proxy 127.0.0.1:{dead}" in (ch.stats().last_error or ""),
            what="last_error naming the proxy",
        )
        assert ch.log.meta().last_error is not None
        assert f"via proxy 127.0.0.1:{dead}" in (ch.log.meta().last_error or "")
    assert f"via proxy 127.0.0.1:{dead} (from https_proxy)" in caplog.text
    assert "SECRET" not in caplog.text and "SECRET" not in (ch.stats().last_error or "")
    assert local_engine.accepted(run_id) == []


@pytest.mark.asyncio
async def test_proxy_from_env_false_ignores_a_dead_env_proxy(
    local_engine: LocalEngine, tmp_path: Path, proxy_env: Callable[..., None]
) -> None:
    dead = closed_port()
    proxy_env(http_proxy=f"http://127.0.0.1:{dead}", https_proxy=f"http://127.0.0.1:{dead}")
    proxy_env(grpc_proxy=f"http://127.0.0.1:{dead}")
    run_id, token = new_run(local_engine)
    config = local_channel_config(
        local_engine, tmp_path / "wal", run_id, token, proxy_from_env=False
    )
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(ch.send_finding({"n": 1}), timeout_ms=10_000)
        # Discovery ignores it too: a reconnect asks http_addr directly.
        await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
        assert await ch.wait_acked(ch.send_finding({"n": 2}), timeout_ms=10_000)
        assert "proxy" not in (ch.stats().last_error or "")
    assert local_engine.accepted(run_id) == [1, 2]


@pytest.mark.asyncio
async def test_no_proxy_listing_the_engine_dials_it_directly(
    local_engine: LocalEngine,
    tmp_path: Path,
    proxy_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = closed_port()
    proxy_env(https_proxy=f"http://127.0.0.1:{dead}", http_proxy=f"http://127.0.0.1:{dead}")
    proxy_env(no_proxy="localhost,127.0.0.0/8")
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    caplog.set_level(logging.INFO, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "h", "1")
        assert await ch.wait_acked(ch.send_finding({"n": 1}), timeout_ms=10_000)
    assert "via proxy" not in caplog.text
    assert local_engine.accepted(run_id) == [1]


@pytest.mark.asyncio
async def test_a_live_env_proxy_carries_the_stream_and_discovery(
    local_engine: LocalEngine,
    tmp_path: Path,
    proxy_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = HttpProxy()
    await proxy.start()
    try:
        proxy_env(HTTPS_PROXY=f"http://scan:SECRET@{proxy.addr}", HTTP_PROXY=f"http://{proxy.addr}")
        run_id, token = new_run(local_engine)
        config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
        caplog.set_level(logging.INFO, logger="walchannel")
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            assert await ch.wait_acked(ch.send_finding({"n": 1}), timeout_ms=10_000)
            await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
            assert await ch.wait_acked(ch.send_finding({"n": 2}), timeout_ms=10_000)
        assert local_engine.accepted(run_id) == [1, 2]
        engine = local_engine.grpc_addr
        assert proxy.requests.count(f"CONNECT {engine}") >= 2
        assert f"GET {local_engine.http_addr}/grpc-address" in proxy.requests
        # The credentials in the URL reach the proxy, and only the proxy.
        assert "Basic " + base64.b64encode(b"scan:SECRET").decode() in proxy.auth
        assert f"via proxy {proxy.addr} (from HTTPS_PROXY)" in caplog.text
        assert f"discovery asks {local_engine.http_addr} via proxy {proxy.addr}" in caplog.text
        assert "SECRET" not in caplog.text
    finally:
        await proxy.stop()


@pytest.mark.asyncio
async def test_discovery_through_a_dead_env_proxy_names_it(
    local_engine: LocalEngine,
    tmp_path: Path,
    proxy_env: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead = closed_port()
    proxy_env(http_proxy=f"http://127.0.0.1:{dead}", no_grpc_proxy="127.0.0.1")
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    caplog.set_level(logging.WARNING, logger="walchannel")
    async with GrpcEngineChannel(config) as ch:
        # The stream skips the proxy (no_grpc_proxy); discovery, over http://, uses it.
        await ch.handshake("1", "h", "1")
        await local_engine.end_streams(run_id, grpc.StatusCode.UNAVAILABLE)
        await eventually(
            lambda: f"discovery failed via proxy 127.0.0.1:{dead}" in caplog.text,
            what="a discovery failure naming the proxy",
        )
        assert await ch.wait_acked(ch.send_finding({"n": 1}), timeout_ms=10_000)
    assert local_engine.accepted(run_id) == [1]


@pytest.mark.asyncio
async def test_every_dial_is_a_connection_of_its_own(tmp_path: Path) -> None:
    # SPEC "Reconnect": a fresh channel. gRPC's global subchannel pool would
    # hand a new channel any live connection to the same address: another
    # run's, or this run's old one when it outlived its channel's close.
    from helpers.rogue import RogueEngine, RogueStream

    async def script(stream: RogueStream) -> None:
        peers.append(stream.context.peer())  # only while the call lives
        hello = await stream.read()
        assert hello is not None
        stream.ack(acked.get(hello.run_id, 0))
        while (msg := await stream.read()) is not None:
            if msg.seq:
                acked[msg.run_id] = msg.seq
                stream.ack(msg.seq)
                if len(peers) == 1:
                    break  # the first stream only: a re-dial follows
        stream.end()

    acked: dict[str, int] = {}
    peers: list[str] = []
    engine = RogueEngine(script)
    await engine.start()
    try:
        channels = [
            GrpcEngineChannel(engine.channel_config(tmp_path / "wal", f"run-{i}")) for i in range(2)
        ]
        async with channels[0] as first, channels[1] as second:
            await first.handshake("1", "h", "1")
            assert await first.wait_acked(first.send_finding({"n": 1}), timeout_ms=10_000)
            await eventually(lambda: len(peers) == 2, what="the re-dial")
            await second.handshake("1", "h", "1")
            assert await second.wait_acked(second.send_finding({"n": 1}), timeout_ms=10_000)
            assert len(peers) == 3 and len(set(peers)) == 3, peers
    finally:
        await engine.stop()
