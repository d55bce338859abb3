"""A log with a gap below its high-water is a named failure, never a re-dial loop (issue 52).

A row goes only when a stored ack covers it. A log that lacks one above its
cursor (a damaged file, an older version's bug) used to end every stream on
"row seq N is not in the log" and re-dial for ever, the run orphaned. Now the
channel fails the run as a damaged log, naming the seq and the file, and
``inspect`` says so (SPEC "The log").
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from conftest import eventually, new_run
from walchannel import ChannelState, GrpcEngineChannel, WalCorruptError
from walchannel.cli.inspection import inspect_log
from walchannel.log import RunLog
from walchannel.log.state import FAILED_CORRUPT
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def log_with_a_gap(folder: Path, run_id: str, missing: int, rows: int = 10) -> Path:
    """A log of ``rows`` findings whose row ``missing`` is gone from the file."""
    with RunLog.open(folder, run_id, correlation_id=f"corr-{run_id}") as log:
        log.append_many([("finding", {"fields": {"n": n}}) for n in range(1, rows + 1)])
        path = log.path
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM rows WHERE seq = ?", (missing,))
    conn.close()
    return path


@pytest.mark.asyncio
@pytest.mark.parametrize("missing", [1, 6], ids=["the first unacked row", "a row in the middle"])
async def test_a_gap_fails_the_run_naming_the_seq_and_inspect_shows_it(
    local_engine: LocalEngine, tmp_path: Path, missing: int
) -> None:
    run_id, token = new_run(local_engine)
    wal = tmp_path / "wal"
    path = log_with_a_gap(wal, run_id, missing)
    config = local_channel_config(local_engine, wal, run_id, token)
    async with GrpcEngineChannel(config) as ch:
        # The writer may meet the gap before handshake() returns: it raises then.
        with contextlib.suppress(WalCorruptError):
            await ch.handshake("1", "gap", "1")
        await eventually(lambda: ch.state is ChannelState.FAILED, what="the run failed")
        with pytest.raises(WalCorruptError, match=f"row seq {missing} is missing") as caught:
            ch.send_finding({"n": 11})
        assert str(path) in str(caught.value) and run_id in str(caught.value)
        stats = ch.stats()
        assert stats.reconnects == 0  # no re-dial loop
        assert stats.last_error is not None and f"row seq {missing}" in stats.last_error
    # Rows before the gap may have gone out (those in flight stay in the log);
    # none after it, none twice.
    accepted = local_engine.accepted(run_id)
    assert accepted == list(range(1, len(accepted) + 1)) and len(accepted) < missing
    report = inspect_log(path)
    assert report.state == "failed"
    assert report.reason is not None and FAILED_CORRUPT in report.reason
    assert report.last_error is not None and f"row seq {missing} is missing" in report.last_error
