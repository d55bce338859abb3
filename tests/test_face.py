"""The package's face: what a harness imports, and what a channel hands out (issue 59).

The top level exports what a harness author uses; the log's classes live in
``walchannel.log`` for tools; a channel is built from its config alone, hands
out no driver and only a read-only view of its log; the seams go through
``walchannel.channel.seams``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import walchannel
from conftest import offline_config
from walchannel import BlockingEngineChannel, GrpcEngineChannel
from walchannel.channel.seams import driver_of, log_of, open_channel
from walchannel.core.driver import Driver
from walchannel.log import Row, RunLog, RunMeta
from walchannel.log.view import LogView

#: What a harness author uses, by kind (SPEC "Layout and toolchain").
FACE = {
    # the channels, their protocols and values
    "GrpcEngineChannel", "BlockingEngineChannel", "EngineChannel", "SyncEngineChannel",
    "ChannelState", "ChannelStats", "ApprovalDecision",
    # the config
    "GrpcChannelConfig", "Backoff", "GroupCommit",
    # the runner
    "run_harness", "run_harness_async", "Harness", "HarnessError", "Manifest",
    "ManifestError", "ItemContext", "AsyncItemContext", "ExitCode", "WorkListChangedError",
    # the grace period
    "GracePeriod", "EXIT_ROWS_LEFT", "EXIT_STOPPED",
    # the errors (and the one warning)
    "WalchannelError", "ConfigurationError", "PayloadError", "EngineRefusedError",
    "TransportError", "LogError", "ApprovalTimeoutError", "BacklogFullError",
    "ChannelClosedError", "DiscoveryError", "EngineBehindError", "EngineUnavailableError",
    "GroupCommitError", "ReentrantCallError", "RowRefusedError", "RunCompletedError",
    "RunExpiredError", "RunRefusedError", "RunningLoopError", "WalCorruptError",
    "WalLocationError", "WalLockedError", "WalRemovedError", "WalWriteError",
    "WriterFencedError", "InsecureDiscoveryWarning",
}  # fmt: skip


def test_the_top_level_exports_what_a_harness_uses_and_no_log_internals() -> None:
    assert set(walchannel.__all__) == FACE
    for name in ("RunLog", "Row", "RunMeta", "Driver", "driver", "log"):
        assert name not in walchannel.__all__
    with pytest.raises(AttributeError, match="RunLog"):
        walchannel.RunLog  # noqa: B018
    assert (RunLog, Row, RunMeta) == (
        walchannel.log.RunLog,
        walchannel.log.Row,
        walchannel.log.RunMeta,
    )


def test_the_constructors_take_the_config_alone() -> None:
    for cls in (GrpcEngineChannel, BlockingEngineChannel):
        assert list(inspect.signature(cls).parameters) == ["config"], cls


@pytest.mark.parametrize("seam", ["log", "transport", "clock", "rng", "token_hash_when"])
def test_a_seam_passed_to_the_constructor_is_refused(tmp_path: Path, seam: str) -> None:
    with pytest.raises(TypeError, match=seam):
        GrpcEngineChannel(offline_config(tmp_path, "face-run"), **{seam: None})  # type: ignore[call-arg]
    assert not list(tmp_path.iterdir()), "nothing is opened for a refused call"


@pytest.mark.asyncio
async def test_a_channel_hands_out_no_driver_and_a_log_it_cannot_write(tmp_path: Path) -> None:
    async with GrpcEngineChannel(offline_config(tmp_path, "face-run")) as ch:
        assert not hasattr(ch, "driver")
        seq = ch.send_finding({"path": "a.py"}, progress={"next": 1})
        view = ch.log
        assert isinstance(view, LogView) and ch.log is view
        own = log_of(ch)
        # Every read answers as the log's own; nothing that writes is there.
        assert (view.path, view.run_id, view.next_seq, view.high_water) == (
            own.path, own.run_id, own.next_seq, own.high_water
        )  # fmt: skip
        assert (view.unacked_count, view.last_acked_seq, view.progress) == (1, 0, {"next": 1})
        assert [row.seq for row in view.unacked()] == [seq]
        assert view.meta() == own.meta()
        writes = {"append", "append_many", "append_encoded", "ack", "verify", "close",
                  "update_meta", "mark_takeover", "set_aside", "checkpoint",
                  "complete_by_engine", "on_removed", "note_writing"}  # fmt: skip
        assert writes <= {n for n in dir(own) if not n.startswith("_")}
        assert not writes & {n for n in dir(view) if not n.startswith("_")}
        with pytest.raises(AttributeError):
            view.path = tmp_path  # type: ignore[misc]
        assert isinstance(driver_of(ch), Driver)
        assert driver_of(ch).unacked == 1
    assert view.closed and own.closed


@pytest.mark.asyncio
async def test_the_seams_factory_refuses_a_bad_policy_and_a_foreign_log(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token_hash_when must be 'open' or 'accepted'"):
        open_channel(offline_config(tmp_path, "face-run"), token_hash_when="later")  # type: ignore[arg-type]
    other = RunLog.open(tmp_path, "another-run", correlation_id="c")
    try:
        with pytest.raises(ValueError, match="log= must be the open, owned log of run face-run"):
            open_channel(offline_config(tmp_path, "face-run"), log=other)
    finally:
        other.close()
    # The factory's channel is the constructor's: the same log, driven the same way.
    mine = RunLog.open(tmp_path, "face-run", correlation_id="c")
    async with open_channel(offline_config(tmp_path, "face-run"), log=mine) as ch:
        assert log_of(ch) is mine
        assert ch.send_event("t", "info", {}) == 1
    assert mine.closed
