"""The pytest fixtures harness authors get, and the in-memory double."""

from __future__ import annotations

from pathlib import Path

import pytest

from walchannel import (
    ChannelClosedError,
    ChannelState,
    EngineChannel,
    GrpcChannelConfig,
    GrpcEngineChannel,
    PayloadError,
)
from walchannel.testing.engine import LocalEngine
from walchannel.testing.memory import InMemoryEngineChannel


@pytest.mark.asyncio
async def test_my_harness_reports_findings(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    # The ten-line example from walchannel/testing/plugin.py and README.md.
    await engine_channel.handshake("1.0", "my-harness", "0.1")
    engine_channel.send_finding({"test_id": "B101"}, progress={"file": 1})
    assert await engine_channel.send_done("completed", 1, ["src/"], "")
    run_id = engine_channel.config.run_id
    assert local_engine.accepted(run_id) == [1, 2]
    assert local_engine.bodies(run_id)[0]["body"]["fields"]["test_id"] == "B101"


@pytest.mark.asyncio
async def test_engine_channel_fixture_is_fresh_and_registered(
    engine_channel: GrpcEngineChannel, local_engine: LocalEngine
) -> None:
    assert isinstance(engine_channel, EngineChannel)
    assert engine_channel.progress() is None
    assert engine_channel.state.name == "IDLE"
    assert local_engine.accepted(engine_channel.config.run_id) == []


@pytest.mark.asyncio
async def test_in_memory_channel_records_what_it_gets(
    in_memory_channel: InMemoryEngineChannel,
) -> None:
    ch = in_memory_channel
    assert isinstance(ch, EngineChannel)
    stops: list[str] = []
    ch.on_stop(stops.append)
    await ch.handshake("1", "h", "1")
    assert ch.send_event("t", "info", {"a": 1}, ts="2026-01-01T00:00:00+02:00") == 1
    assert ch.send_findings([{"n": 1}, {"n": 2}], progress={"next": 2}) == [2, 3]
    assert ch.send_findings([], progress={"next": 3}) == []
    assert ch.progress() == {"next": 3}
    decision = await ch.request_approval("scan", {"x": 1}, request_id="r1")
    assert decision.approved and decision.request_id == "r1"
    ch.stop("operator")
    ch.stop("operator")
    assert stops == ["operator"]
    assert await ch.send_done("completed", 2, ["a"], "")
    assert ch.events == [
        {"type": "t", "severity": "info", "payload": {"a": 1}, "ts": "2025-12-31T22:00:00.000000Z"}
    ]
    assert ch.findings == [{"fields": {"n": 1}}, {"fields": {"n": 2}}]
    assert ch.approvals == [{"request_id": "r1", "action": "scan", "details": {"x": 1}}]
    assert ch.done == {"status": "completed", "findings": 2, "coverage": ["a"], "exit_reason": ""}
    assert ch.progress() == {"next": 3}
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"n": 3})


@pytest.mark.asyncio
async def test_in_memory_channel_keeps_what_was_sent_not_later_changes() -> None:
    ch = InMemoryEngineChannel()
    finding = {"test_id": "B101", "lines": [1, 2]}
    ch.send_finding(finding)
    ch.send_findings([finding])
    finding["lines"].append(3)
    finding["test_id"] = "CHANGED"
    assert ch.findings == [{"fields": {"test_id": "B101", "lines": [1, 2]}}] * 2


def _real_channel(wal: Path, run_id: str) -> GrpcEngineChannel:
    # Offline: the calls below refuse before anything touches the network.
    config = GrpcChannelConfig(
        grpc_addr="127.0.0.1:1", run_id=run_id, correlation_id="c", run_token="t", wal_dir=wal
    )
    return GrpcEngineChannel(config)


@pytest.mark.asyncio
async def test_in_memory_channel_refuses_what_the_real_one_refuses(tmp_path: Path) -> None:
    for ch in (InMemoryEngineChannel(), _real_channel(tmp_path, "refuses")):
        with pytest.raises(PayloadError, match=r"finding\.x"):
            ch.send_finding({"x": float("inf")})
        with pytest.raises(PayloadError, match=r"done\.findings"):
            await ch.send_done("completed", -1, [], "")
        with pytest.raises(PayloadError, match="progress"):
            ch.send_finding({"ok": 1}, progress={"seq": b"x"})
        assert ch.stats().unacked_count == 0  # nothing of it was logged
        await ch.close()
        with pytest.raises(ChannelClosedError):
            ch.send_finding({"ok": 1})


@pytest.mark.asyncio
async def test_in_memory_channel_has_the_real_channels_read_outs() -> None:
    # A harness written against GrpcEngineChannel's calls (README "The calls,
    # in short") runs on the double: stats(), wait_acked(), on_budget_update().
    ch = InMemoryEngineChannel()
    assert ch.state is ChannelState.IDLE
    assert ch.stats().state is ChannelState.IDLE
    await ch.handshake("1.0", "my-harness", "0.1")
    seqs = ch.send_findings([{"test_id": "B101"}, {"test_id": "B102"}])
    assert await ch.wait_acked(seqs[0])
    assert await ch.wait_acked(timeout_ms=10)
    assert not await ch.wait_acked(seqs[-1] + 1, timeout_ms=10)  # never logged
    stats = ch.stats()
    assert (stats.state, stats.sent, stats.acked, stats.unacked_count) == (
        ChannelState.STREAMING,
        2,
        2,
        0,
    )
    budgets: list[tuple[str, dict[str, object]]] = []
    ch.on_budget_update(lambda message, details: budgets.append((message, details)))
    ch.budget_update("half the budget used", {"used": 0.5})
    assert budgets == [("half the budget used", {"used": 0.5})]
    await ch.close()
    assert ch.stats().state is ChannelState.CLOSED


@pytest.mark.asyncio
async def test_in_memory_channel_names_a_batchs_bad_finding_as_the_real_one_does(
    tmp_path: Path,
) -> None:
    said = []
    for ch in (InMemoryEngineChannel(), _real_channel(tmp_path, "batch")):
        with pytest.raises(PayloadError, match=r"^findings: expected a list") as none:
            ch.send_findings(None)  # type: ignore[arg-type]
        with pytest.raises(PayloadError, match=r"^findings\[1\]\.when: ") as bad:
            ch.send_findings([{"ok": 1}, {"when": object()}])
        assert ch.stats().unacked_count == 0
        said.append((str(none.value), str(bad.value).split(" at 0x")[0]))
        await ch.close()
    assert said[0] == said[1]
