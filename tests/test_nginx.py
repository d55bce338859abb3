"""Through a real L7 load balancer: nginx (h2c, ``grpc_pass``) in front of two engine processes.

nginx cuts a stream whose request or response is quiet for longer than its
timeouts (``client_body_timeout``, ``grpc_read_timeout``,
``grpc_send_timeout``), answers HTTP/2 pings itself (so gRPC keepalive
cannot see past it), and round-robins new streams over its upstreams.
These tests run nginx as a non-daemon child with its own prefix, config,
pid and logs in a temp folder; they are mandatory when
``WALCHANNEL_REQUIRE_NGINX=1`` (CI) and skipped otherwise when nginx is
missing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from conftest import eventually
from helpers.engines import EngineProcs, Proc
from helpers.nginx import NGINX, Nginx
from walchannel import (
    Backoff,
    ChannelState,
    GrpcChannelConfig,
    GrpcEngineChannel,
    WriterFencedError,
)
from walchannel.log import RunLog
from walchannel.testing.store import EngineStore, Writer

REQUIRE = os.environ.get("WALCHANNEL_REQUIRE_NGINX") == "1"

pytestmark = pytest.mark.skipif(
    NGINX is None and not REQUIRE,
    reason="nginx is not installed (apt-get install nginx); "
    "WALCHANNEL_REQUIRE_NGINX=1 makes its absence a failure",
)


class Setup:
    """Two engine processes on one store, nginx in front, one registered run."""

    def __init__(self, tmp: Path) -> None:
        if NGINX is None:
            pytest.fail("WALCHANNEL_REQUIRE_NGINX=1 but nginx is not installed")
        self.tmp = tmp
        self.engines = EngineProcs(tmp)
        self.a = self.engines.engine()
        self.b = self.engines.engine()
        self.nginx: Nginx | None = None
        self.run_id = f"ngx-{secrets.token_hex(4)}"
        self.token = secrets.token_urlsafe(16)
        self.engines.register(self.run_id, self.token)

    def start_nginx(self, timeout_s: float) -> Nginx:
        self.nginx = Nginx(
            self.tmp / "nginx",
            [str(self.a.info["grpc_addr"]), str(self.b.info["grpc_addr"])],
            timeout_s=timeout_s,
        )
        self.nginx.start()
        return self.nginx

    def config(self, **overrides: Any) -> GrpcChannelConfig:
        assert self.nginx is not None
        values: dict[str, Any] = {
            "grpc_addr": self.nginx.addr,
            "run_id": self.run_id,
            "correlation_id": "ngx",
            "run_token": self.token,
            "wal_dir": self.tmp / "wal",
            "connect_timeout_ms": 3000,
            "backoff": Backoff(initial_ms=100, multiplier=2, max_ms=1000, jitter_ms=50),
            "done_ack_timeout_ms": 10_000,
        }
        values.update(overrides)
        return GrpcChannelConfig(**values)

    def serving(self) -> Proc:
        """The engine that answered the run's (only) handshake so far."""
        marker = f"run {self.run_id}: handshake from"
        serving = [e for e in (self.a, self.b) if marker in e.stderr()]
        assert len(serving) == 1, "expected exactly one engine to have served the run"
        return serving[0]

    def audit(self, n: int) -> None:
        with EngineStore(self.engines.store) as store:
            accepted = store.accepted(self.run_id)
            assert accepted == list(range(1, len(accepted) + 1)), "gap or disorder"
            assert store.gaps(self.run_id) == []
            contents = Counter(
                int(b["body"]["fields"]["n"])
                for b in store.bodies(self.run_id)
                if b["kind"] == "finding"
            )
        assert sorted(contents) == list(range(n)), "a finding is missing"
        assert [k for k, v in contents.items() if v > 1] == [], "applied twice by content"

    def close(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        self.engines.close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    yield s
    s.close()


@pytest_asyncio.fixture
async def caplog_channel(
    caplog: pytest.LogCaptureFixture,
) -> AsyncIterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="walchannel.channel")
    yield caplog


@pytest.mark.asyncio
async def test_heartbeats_below_the_idle_timeout_keep_one_stream(setup: Setup) -> None:
    nginx = setup.start_nginx(timeout_s=3)
    async with GrpcEngineChannel(setup.config(keepalive_ms=1000)) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(5):
            ch.send_finding({"n": i})
        assert await ch.wait_acked(timeout_ms=5000)
        await asyncio.sleep(7.5)  # two and a half idle timeouts: only heartbeats flow
        for i in range(5, 10):
            ch.send_finding({"n": i})
        assert await ch.wait_acked(timeout_ms=5000)
        stats = ch.stats()
        assert stats.reconnects == 0 and stats.last_error is None
    assert "timed out" not in nginx.error_log()
    setup.audit(10)


@pytest.mark.asyncio
async def test_heartbeats_above_the_idle_timeout_are_cut_and_recovered(
    setup: Setup, caplog_channel: pytest.LogCaptureFixture
) -> None:
    setup.start_nginx(timeout_s=3)
    async with GrpcEngineChannel(setup.config(keepalive_ms=20_000)) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(5):
            ch.send_finding({"n": i})
        assert await ch.wait_acked(timeout_ms=5000)
        await eventually(lambda: ch.stats().last_error is not None, 10, "nginx's cut")
        # nginx's idle timeout ends the stream: the client sees INTERNAL / RST_STREAM.
        assert "INTERNAL" in (ch.stats().last_error or "")
        for i in range(5, 10):
            ch.send_finding({"n": i})
        assert await ch.wait_acked(timeout_ms=10_000)
        assert ch.stats().reconnects >= 1
    setup.audit(10)


@pytest.mark.asyncio
async def test_upstream_engine_killed_behind_nginx_is_survived(setup: Setup) -> None:
    setup.start_nginx(timeout_s=60)
    n = 400
    async with GrpcEngineChannel(setup.config(keepalive_ms=1000)) as ch:
        await ch.handshake("1", "h", "1")
        for i in range(100):
            ch.send_finding({"n": i})
            await asyncio.sleep(0.002)
        serving = setup.serving()
        serving.signal(signal.SIGKILL)
        for i in range(100, n):
            ch.send_finding({"n": i})
            await asyncio.sleep(0.002)
        assert await ch.wait_acked(timeout_ms=20_000)
        assert ch.stats().reconnects >= 1
    setup.audit(n)


async def _freeze_the_serving_engine(
    setup: Setup, ch: GrpcEngineChannel, n_before: int, n: int
) -> float:
    """SIGSTOP the engine behind nginx while a large backlog is written; time the way out."""
    await ch.handshake("1", "h", "1")
    pad = "x" * 60_000
    for i in range(n_before):
        ch.send_finding({"n": i, "pad": pad})
    assert await ch.wait_acked(timeout_ms=10_000)
    frozen = setup.serving()
    frozen.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    # ~15 MB: the writer blocks on flow control well before it is all out.
    for i in range(n_before, n):
        ch.send_finding({"n": i, "pad": pad})
    await eventually(lambda: ch.state is not ChannelState.STREAMING, 90, "leaving the stream")
    return time.monotonic() - t0


@pytest.mark.asyncio
async def test_frozen_engine_behind_nginx_is_left_by_the_dead_stream_rule(
    setup: Setup, caplog_channel: pytest.LogCaptureFixture
) -> None:
    # nginx answers pings itself, and its own timeouts (60 s) are far above
    # 3 x keepalive_ms: only the dead-stream rule can notice the frozen engine.
    setup.start_nginx(timeout_s=60)
    n = 260
    config = setup.config(keepalive_ms=1000, dead_stream_ms=3000)
    async with GrpcEngineChannel(config) as ch:
        took = await _freeze_the_serving_engine(setup, ch, 10, n)
        # Which rule fired is in the error text; the time (sends included)
        # only has to be reasonable on a loaded machine.
        assert took < 30, took
        assert "dead stream" in (ch.stats().last_error or "")
        assert "the stream is dead" in caplog_channel.text
        assert await ch.wait_acked(timeout_ms=30_000)  # through the live engine
    setup.audit(n)


@pytest.mark.asyncio
async def test_frozen_engine_behind_nginx_without_dead_stream_ms_is_left_by_the_stall_rule(
    setup: Setup,
) -> None:
    # Without dead_stream_ms: a write blocked for keepalive_ms + 10 s with no
    # down message ends the stream (nginx's pings hide the freeze from gRPC).
    setup.start_nginx(timeout_s=60)
    n = 260
    async with GrpcEngineChannel(setup.config(keepalive_ms=1000)) as ch:
        took = await _freeze_the_serving_engine(setup, ch, 10, n)
        # Never before the rule's bound (keepalive 1 s + 10 s, from the
        # block); the upper bound is generous: t0 is before 15 MB of sends.
        assert 10 < took < 60, took
        assert "stalled stream" in (ch.stats().last_error or "")
        assert await ch.wait_acked(timeout_ms=30_000)
    setup.audit(n)


@pytest.mark.asyncio
async def test_the_writer_fields_cross_nginx_and_fence_across_engine_processes(
    setup: Setup,
) -> None:
    # The writer identity travels in the Handshake message, not in metadata
    # (nginx drops header names with underscores by default). Behind nginx the
    # two harnesses may reach different engine processes: the owner in the
    # shared store fences the old writer at its next heartbeat all the same.
    setup.start_nginx(timeout_s=60)
    b_config = setup.config(wal_dir=setup.tmp / "wal-b")
    async with GrpcEngineChannel(setup.config(keepalive_ms=1000)) as a:
        await a.handshake("1", "h", "1")
        for i in range(5):
            a.send_finding({"n": i})
        assert await a.wait_acked(timeout_ms=10_000)
        async with GrpcEngineChannel(b_config) as b:
            with pytest.raises(WriterFencedError, match="owned by another writer"):
                await b.handshake("1", "h", "1")
            b_log = b.log.path
        with RunLog.open(b_log.parent, setup.run_id, correlation_id="ngx") as wal:
            marked = wal.mark_takeover()  # `walchannel takeover`
        async with GrpcEngineChannel(b_config) as b:
            await b.handshake("1", "h", "1")
            for i in range(5, 10):
                b.send_finding({"n": i})
            assert await b.wait_acked(timeout_ms=10_000)
            await eventually(lambda: a.state is ChannelState.FAILED, 30, "the old writer fenced")
            with pytest.raises(WriterFencedError, match="writer fenced"):
                a.send_finding({"n": 99})
    setup.audit(10)
    with EngineStore(setup.engines.store) as store:
        assert store.owner(setup.run_id) == Writer(marked.id, 0)
        assert len(store.takeovers(setup.run_id)) == 1
