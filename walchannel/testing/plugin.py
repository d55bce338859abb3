"""pytest fixtures for harness authors (loaded through the ``pytest11`` entry point).

``local_engine`` and ``engine_channel`` need pytest-asyncio (strict mode:
mark tests ``@pytest.mark.asyncio``); without it they fail saying so and the
rest of a project's pytest run is unaffected::

    import pytest

    @pytest.mark.asyncio
    async def test_my_harness_reports_findings(engine_channel, local_engine):
        await engine_channel.handshake("1.0", "my-harness", "0.1")
        engine_channel.send_finding({"test_id": "B101"}, progress={"file": 1})
        assert await engine_channel.send_done("completed", 1, ["src/"], "")
        run_id = engine_channel.config.run_id
        assert local_engine.accepted(run_id) == [1, 2]
        assert local_engine.bodies(run_id)[0]["body"]["fields"]["test_id"] == "B101"

Fixtures:

- ``local_engine``: a started :class:`~walchannel.testing.LocalEngine`
  (in-memory store, loopback), stopped after the test.
- ``engine_channel``: a :class:`~walchannel.GrpcEngineChannel` on a temporary
  ``wal_dir``, its run registered with ``local_engine``, not yet handshaken;
  closed after the test. Its config uses short test timings.
- ``in_memory_channel``: an :class:`~walchannel.testing.InMemoryEngineChannel`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

from walchannel.config import Backoff, GrpcChannelConfig
from walchannel.testing.memory import InMemoryEngineChannel

if TYPE_CHECKING:
    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.testing.engine import LocalEngine


_F = TypeVar("_F", bound=Callable[..., Any])


def _needs_pytest_asyncio(fixture: Callable[..., Any]) -> Any:
    """Without pytest-asyncio, ``fixture`` is one that fails saying what is missing.

    The plugin loads in every pytest run of a project that installs
    walchannel (the ``pytest11`` entry point): it must not break one that
    has no pytest-asyncio, only the fixtures that need it.
    """
    name = fixture.__name__

    @pytest.fixture(name=name)
    def missing() -> None:
        pytest.fail(
            f"walchannel's {name} fixture needs pytest-asyncio: pip install pytest-asyncio",
            pytrace=False,
        )

    return missing


def _async_fixture(fixture: _F) -> _F:
    """pytest-asyncio's ``fixture``, or :func:`_needs_pytest_asyncio` without it."""
    try:
        import pytest_asyncio
    except ModuleNotFoundError:
        return cast("_F", _needs_pytest_asyncio(fixture))
    return cast("_F", pytest_asyncio.fixture(fixture))


__all__ = ["engine_channel", "in_memory_channel", "local_engine", "local_channel_config"]


def local_channel_config(
    local_engine: LocalEngine, wal_dir: Path, run_id: str, run_token: str, **overrides: Any
) -> GrpcChannelConfig:
    """A channel config for ``local_engine`` with short test timings.

    Args:
        local_engine: a started :class:`~walchannel.testing.LocalEngine`.
        wal_dir: the log folder.
        run_id: the run (register it with the engine first).
        run_token: its token.
        overrides: any other :class:`~walchannel.GrpcChannelConfig` field.
    """
    values: dict[str, Any] = {
        "grpc_addr": local_engine.grpc_addr,
        "http_addr": local_engine.http_addr,
        "allowed_hosts": ["127.0.0.1"],
        "run_id": run_id,
        "correlation_id": f"corr-{run_id}",
        "run_token": run_token,
        "wal_dir": wal_dir,
        "connect_timeout_ms": 5_000,
        "backoff": Backoff(initial_ms=50, multiplier=2, max_ms=1_000, jitter_ms=50),
        "done_ack_timeout_ms": 5_000,
        "close_timeout_ms": 1_000,
    }
    values.update(overrides)
    return GrpcChannelConfig(**values)


@_async_fixture
async def local_engine() -> AsyncIterator[LocalEngine]:
    """A started LocalEngine on loopback with an in-memory store."""
    from walchannel.testing.engine import LocalEngine

    engine = LocalEngine()
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


@_async_fixture
async def engine_channel(
    local_engine: LocalEngine, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[GrpcEngineChannel]:
    """A GrpcEngineChannel for a fresh run registered with ``local_engine``; not handshaken."""
    from walchannel.channel.grpc_channel import GrpcEngineChannel

    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:80]
    run_id = f"{name}-{secrets.token_hex(3)}"
    token = secrets.token_urlsafe(24)
    local_engine.register_run(run_id, token)
    channel = GrpcEngineChannel(local_channel_config(local_engine, tmp_path / "wal", run_id, token))
    try:
        yield channel
    finally:
        await channel.close()


@pytest.fixture
def in_memory_channel() -> InMemoryEngineChannel:
    """An InMemoryEngineChannel (no network, no disk)."""
    return InMemoryEngineChannel()
