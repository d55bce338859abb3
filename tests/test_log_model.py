"""A hypothesis state machine: random append / ack / close / reopen against a plain model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from walchannel import ChannelClosedError
from walchannel.log import RunLog


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="walmodel-"))
        self.wal: RunLog | None = RunLog.open(self.dir, "model", correlation_id="c")
        self.rows: dict[int, dict[str, Any]] = {}  # unacked seq -> body
        self.acked = 0
        self.high = 0
        self.progress: dict[str, Any] | None = None
        self.done: int | None = None
        self.completed = False
        self.counter = 0

    def teardown(self) -> None:
        if self.wal is not None:
            self.wal.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def body(self) -> dict[str, Any]:
        self.counter += 1
        return {"fields": {"n": self.counter}}

    @precondition(lambda self: self.wal is not None and self.done is None and not self.completed)
    @rule(marker=st.none() | st.integers(0, 1000))
    def append(self, marker: int | None) -> None:
        assert self.wal is not None
        body = self.body()
        progress = None if marker is None else {"m": marker}
        seq = self.wal.append("finding", body, progress=progress)
        assert seq == self.high + 1
        self.high = seq
        self.rows[seq] = body
        if progress is not None:
            self.progress = progress

    @precondition(lambda self: self.wal is not None and self.done is None and not self.completed)
    @rule(n=st.integers(1, 5), marker=st.none() | st.integers(0, 1000))
    def append_many(self, n: int, marker: int | None) -> None:
        assert self.wal is not None
        bodies = [self.body() for _ in range(n)]
        progress = None if marker is None else {"m": marker}
        seqs = self.wal.append_many([("finding", b) for b in bodies], progress=progress)
        assert seqs == list(range(self.high + 1, self.high + n + 1))
        self.high += n
        self.rows.update(zip(seqs, bodies, strict=True))
        if progress is not None:
            self.progress = progress

    @precondition(lambda self: self.wal is not None and self.done is None and not self.completed)
    @rule()
    def append_done(self) -> None:
        assert self.wal is not None
        body = {"status": "completed", "findings": 0, "coverage": [], "exit_reason": ""}
        seq = self.wal.append("done", body)
        self.high = seq
        self.rows[seq] = body
        self.done = seq

    @precondition(lambda self: self.wal is not None and self.done is not None)
    @rule()
    def append_after_done_is_refused(self) -> None:
        assert self.wal is not None
        try:
            self.wal.append("finding", self.body())
        except ChannelClosedError:
            return
        raise AssertionError("a row after Done was accepted")

    @precondition(lambda self: self.wal is not None)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        assert self.wal is not None
        seq = data.draw(st.integers(0, self.high))
        deleted = self.wal.ack(seq)
        gone = [s for s in self.rows if s <= seq]
        assert deleted == (len(gone) if seq > self.acked else 0)
        for s in gone:
            del self.rows[s]
        self.acked = max(self.acked, seq)
        if self.done is not None and self.acked >= self.done:
            self.completed = True
            self.done = None

    @precondition(lambda self: self.wal is not None)
    @rule()
    def close_and_reopen(self) -> None:
        assert self.wal is not None
        self.wal.close()
        self.wal = RunLog.open(self.dir, "model", correlation_id="c")

    @precondition(lambda self: self.wal is not None)
    @invariant()
    def matches_the_model(self) -> None:
        wal = self.wal
        assert wal is not None
        assert wal.next_seq == self.high + 1
        assert wal.last_acked_seq == self.acked
        assert wal.unacked_count == len(self.rows)
        assert {r.seq: r.body for r in wal.unacked()} == self.rows
        assert wal.progress == self.progress
        assert wal.completed == self.completed
        assert wal.done_seq == self.done


TestLogModel = LogModel.TestCase
TestLogModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
