"""An exception lands inside a log commit: the log stays whole and usable (issue 33).

A signal handler's exception — a second Ctrl-C (``KeyboardInterrupt``), a
per-file ``SIGALRM`` timeout raising an ordinary exception class
(cpython bpo-27334, duckdb #5938, sqlite-utils #767) — can land between any
two SQL statements of a transaction, before or after its ``COMMIT``, or
right after the ``COMMIT`` before the log's memory follows. The harness
catches it and goes on. The rules (SPEC "The log"): a seq a call returned
is durable; an interrupted call's rows and marker commit together or not at
all, and ``progress`` says which; no transaction is left open, no
committed row is lost, no seq is handed out twice. Real SQLite files
throughout: a connection class that raises around its n-th statement, and
a ``sys.settrace`` sweep raising at every line of the commit path.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from conftest import log_on_connection, new_run
from helpers.sqlite_probe import no_write_transaction_open
from walchannel import GrpcEngineChannel
from walchannel.channel.seams import open_channel
from walchannel.log import RunLog
from walchannel.log import state as log_state
from walchannel.log import writer as log_module
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

RUN = "run-int"


class Alarm(Exception):
    """What a signal handler of the harness raises: an ordinary exception class."""


EXCEPTIONS = [KeyboardInterrupt, Alarm]


def finding(n: int) -> dict[str, Any]:
    return {"fields": {"n": n}}


class InterruptingConnection(sqlite3.Connection):
    """A real SQLite connection that raises once, before or after its ``n``-th statement.

    Statements are counted from :meth:`arm`; ``seen`` lists them (for the
    points to interrupt).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan: tuple[int, str, type[BaseException]] | None = None
        self.counting = False
        self.seen: list[str] = []

    def arm(self, plan: tuple[int, str, type[BaseException]] | None) -> None:
        self.plan, self.counting, self.seen = plan, True, []

    def _point(self, when: str, sql: str) -> None:
        if not self.counting:
            return
        if when == "before":
            self.seen.append(" ".join(sql.split()[:2]))
        plan = self.plan
        if plan is not None and plan[0] == len(self.seen) and plan[1] == when:
            self.plan = None
            self.counting = False
            raise plan[2](f"interrupted {when} statement {plan[0]}: {self.seen[-1]}")

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self._point("before", sql)
        cursor = super().execute(sql, parameters)
        self._point("after", sql)
        return cursor

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        self._point("before", sql)
        cursor = super().executemany(sql, parameters)
        self._point("after", sql)
        return cursor


def base_log(folder: Path) -> Path:
    """A log with rows 1-2 and the marker ``{"step": 0}``, closed; its path."""
    with RunLog.open(folder, RUN, correlation_id="c") as wal:
        wal.append_many([("finding", finding(1)), ("finding", finding(2))], progress={"step": 0})
        return wal.path


# What each call under test does, and what it commits when it lands.
CALLS: dict[str, tuple[Callable[[RunLog], object], int, dict[str, int] | None]] = {
    # A stretch of the scan with nothing to report: the marker alone.
    "marker": (lambda wal: wal.append_many([], progress={"step": 1}), 0, {"step": 1}),
    # A batch of findings with its marker.
    "batch": (
        lambda wal: wal.append_many(
            [("finding", finding(n)) for n in (3, 4, 5)], progress={"step": 1}
        ),
        3,
        {"step": 1},
    ),
    # The send path: one row, no marker (one autocommit statement).
    "single": (lambda wal: wal.append("finding", finding(3)), 1, None),
}


def check_after_interrupt(wal: RunLog, path: Path, call: str) -> None:
    """The interrupted call's rows and marker landed together or not at all; the log goes on."""
    _, rows, marker = CALLS[call]
    assert no_write_transaction_open(path), "a transaction was left open"
    if marker is not None:
        landed = wal.progress == marker
        assert landed or wal.progress == {"step": 0}, wal.progress
    else:
        landed = wal.next_seq == 3 + rows
    # Its memory follows its disk: the next seq is the first one not on disk.
    expected = 3 + (rows if landed else 0)
    assert wal.next_seq == expected, (landed, wal.next_seq)
    assert wal.unacked_count == expected - 1
    # Usable: the next marker commit and the next send succeed, at the next seqs.
    assert wal.append_many([("finding", finding(100))], progress={"step": 2}) == [expected]
    assert wal.append("finding", finding(101)) == expected + 1
    wal.close()
    with RunLog.open(path.parent, RUN, correlation_id="c") as again:
        assert [r.seq for r in again.unacked()] == list(range(1, expected + 2))
        assert again.progress == {"step": 2}
        assert again.next_seq == expected + 2


def statements_of(tmp_path: Path, call: str) -> list[str]:
    path = base_log(tmp_path / "dry")
    conn = sqlite3.connect(path, factory=InterruptingConnection, isolation_level=None)
    wal = RunLog.on_connection(conn, run_id=RUN, correlation_id="c")
    conn.arm(None)
    CALLS[call][0](wal)
    seen = list(conn.seen)
    wal.close()
    return seen


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_exception_between_any_two_statements_of_a_commit_leaves_the_log_whole(
    tmp_path: Path, call: str, exc: type[BaseException]
) -> None:
    statements = statements_of(tmp_path, call)
    if call == "single":
        assert [s.split()[0] for s in statements] == ["INSERT"]
    else:
        assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT", statements
    for n, statement in enumerate(statements, start=1):
        for when in ("before", "after"):
            path = base_log(tmp_path / f"{n}-{when}")
            conn = sqlite3.connect(path, factory=InterruptingConnection, isolation_level=None)
            wal = RunLog.on_connection(conn, run_id=RUN, correlation_id="c")
            conn.arm((n, when, exc))
            with pytest.raises(exc, match=f"interrupted {when} statement {n}"):
                CALLS[call][0](wal)
            try:
                check_after_interrupt(wal, path, call)
            except AssertionError as failure:
                raise AssertionError(f"{exc.__name__} {when} {statement!r}: {failure}") from None


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
def test_a_commit_hook_raising_before_or_after_commit_leaves_the_log_whole(
    tmp_path: Path, exc: type[BaseException]
) -> None:
    # The storage seam's own hook (the simulator's disk): an exception there too.

    class Hook:
        def __init__(self, when: str) -> None:
            self.when: str | None = when

        def before_commit(self, what: str) -> None:
            self.fire("before_commit", what)

        def after_commit(self, what: str) -> None:
            self.fire("after_commit", what)

        def fire(self, point: str, what: str) -> None:
            if point == self.when and what == "append":
                self.when = None
                raise exc(f"in {point}")

    for when in ("before_commit", "after_commit"):
        path = base_log(tmp_path / when)
        conn = sqlite3.connect(path, isolation_level=None)
        hook = Hook(when)
        wal = RunLog.on_connection(conn, run_id=RUN, correlation_id="c", commit_hook=hook)
        with pytest.raises(exc, match=f"in {when}"):
            CALLS["batch"][0](wal)
        check_after_interrupt(wal, path, "batch")


# -- the sweep: an exception at every line of the commit path -----------------------------

TRACED = {log_module.__file__, log_state.__file__}


def raise_at_line(n: int, exc: type[BaseException], call: Callable[[], object]) -> bool:
    """Run ``call`` raising ``exc`` at the ``n``-th line it executes in the log's modules.

    Returns:
        True when it raised there; False when ``call`` ran fewer lines (it completed).
    """
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count == n:
                # Raised into the traced frame at this line; tracing stops with it.
                raise exc(f"at line {n} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename in TRACED else None

    sys.settrace(calls)
    try:
        call()
    except exc as raised:
        if f"at line {n} " not in str(raised):
            raise
        return True
    finally:
        sys.settrace(None)
    return False


def sweep(tmp_path: Path, exc: type[BaseException], call: str) -> int:
    n = 0
    while True:
        n += 1
        assert n < 2000, "the sweep never ended"
        path = base_log(tmp_path / f"{call}-{exc.__name__}-{n}")
        wal = RunLog.open(path.parent, RUN, correlation_id="c")
        try:
            interrupted = raise_at_line(n, exc, partial(CALLS[call][0], wal))
            if not interrupted:
                wal.close()
                return n - 1
            check_after_interrupt(wal, path, call)
        except AssertionError as failure:
            raise AssertionError(f"{exc.__name__} at line {n} of {call}: {failure}") from None
        finally:
            wal.close()


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_exception_at_every_line_of_the_commit_path_leaves_the_log_whole(
    tmp_path: Path, call: str, exc: type[BaseException]
) -> None:
    lines = sweep(tmp_path, exc, call)
    assert lines >= 10, lines  # the sweep really ran the commit path


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
def test_an_exception_at_every_line_of_an_ack_leaves_the_cursor_on_disk_and_in_memory_equal(
    tmp_path: Path, exc: type[BaseException]
) -> None:
    n = 0
    while True:
        n += 1
        assert n < 2000, "the sweep never ended"
        path = base_log(tmp_path / f"ack-{n}")
        wal = RunLog.open(path.parent, RUN, correlation_id="c")
        try:
            if not raise_at_line(n, exc, partial(wal.ack, 1)):
                break
            assert no_write_transaction_open(path), f"line {n}: a transaction was left open"
            acked = wal.last_acked_seq
            assert acked in (0, 1), acked
            assert wal.unacked_count == 2 - acked
            assert [r.seq for r in wal.unacked()] == list(range(acked + 1, 3))
            assert wal.ack(2) == 2 - acked
            assert wal.append("finding", finding(3)) == 3
            wal.close()
            with RunLog.open(path.parent, RUN, correlation_id="c") as again:
                assert again.last_acked_seq == 2
                assert [r.seq for r in again.unacked()] == [3]
        finally:
            wal.close()
    assert n > 10, n


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
def test_an_exception_at_every_line_of_a_verification_shift_moves_all_rows_or_none(
    tmp_path: Path, exc: type[BaseException]
) -> None:
    # A restarted harness's rows 1-2 are unverified; the engine answers Ack(5):
    # they move to 6-7 in one transaction, and the state follows it.
    n = 0
    while True:
        n += 1
        assert n < 2000, "the sweep never ended"
        path = base_log(tmp_path / f"verify-{n}")
        wal = RunLog.open(path.parent, RUN, correlation_id="c")
        try:
            assert wal.unverified_from == 1
            if not raise_at_line(n, exc, partial(wal.verify, 5)):
                break
            assert no_write_transaction_open(path), f"line {n}: a transaction was left open"
            seqs = [r.seq for r in wal.unacked()]
            if wal.unverified_from is None:  # landed
                assert (seqs, wal.last_acked_seq, wal.next_seq) == ([6, 7], 5, 8), n
            else:
                assert (seqs, wal.last_acked_seq, wal.next_seq) == ([1, 2], 0, 3), n
                assert wal.verify(5) == 5
            assert wal.append("finding", finding(3)) == 8
            wal.close()
            with RunLog.open(path.parent, RUN, correlation_id="c") as again:
                assert [r.seq for r in again.unacked()] == [6, 7, 8]
                assert again.last_acked_seq == 5
        finally:
            wal.close()
    assert n > 10, n


# -- a harness that catches it and goes on ------------------------------------------------


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize(
    "where",
    [
        # Between BEGIN IMMEDIATE and COMMIT of a marker commit (the report).
        "marker after BEGIN",
        # Right after a send's row committed, before the log's memory followed it.
        "send after INSERT",
    ],
)
@pytest.mark.asyncio
async def test_a_harness_that_catches_an_exception_inside_a_commit_loses_no_returned_seq(
    local_engine: LocalEngine, tmp_path: Path, where: str, exc: type[BaseException]
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    # The log file as the channel makes it, then watched by a connection that is interrupted.
    conn, log = log_on_connection(config, InterruptingConnection)
    returned: list[int] = []
    ch = open_channel(config, log=log)
    try:
        await ch.handshake("1", "interrupts", "1")
        returned += ch.send_findings([{"n": 1}, {"n": 2}], progress={"step": 1})
        conn.arm((1, "after", exc))
        if where.startswith("marker"):
            interrupted = partial(ch.send_findings, [], progress={"step": 2})
        else:
            interrupted = partial(ch.send_finding, {"n": 3})
        with pytest.raises(exc):
            interrupted()
        # The harness learns from progress() whether the marker landed; it goes on.
        assert ch.progress() == {"step": 1}
        for n in range(4, 10):
            returned.append(ch.send_finding({"n": n}))
        ch.send_findings([], progress={"step": 3})  # the next marker commit succeeds
        returned += ch.send_findings([{"n": 10}], progress={"step": 4})
        assert await ch.wait_acked(timeout_ms=10_000)
        high = ch.log.high_water
    finally:
        await ch.close()
    accepted = local_engine.accepted(run_id)
    # Every returned seq reached the engine, with no gap and none twice; a row
    # interrupted after its INSERT landed and was delivered too.
    assert accepted == list(range(1, high + 1))
    assert set(returned) <= set(accepted)
    assert len(returned) == len(set(returned))
    # + the progress row of step 3's marker alone (the local engine keeps the
    # resume point), and the row interrupted after its INSERT.
    assert high == len(returned) + 1 + (1 if where.startswith("send") else 0)
    # The restarted harness finds its log usable: the marker, nothing left to send.
    async with GrpcEngineChannel(config) as again:
        assert again.progress() == {"step": 4}
        assert again.unacked_count == 0


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("when", ["before", "after"])
def test_an_exception_around_a_takeover_marks_commit_leaves_memory_and_disk_one_writer(
    tmp_path: Path, when: str, exc: type[BaseException]
) -> None:
    # The writer identity is the log's too: after an interrupted mark the
    # handshake must send the id the disk holds, or the engine sees a stranger.
    path = base_log(tmp_path)
    conn = sqlite3.connect(path, factory=InterruptingConnection, isolation_level=None)
    wal = RunLog.on_connection(conn, run_id=RUN, correlation_id="c")
    conn.arm(None)
    wal.mark_takeover()  # counted dry run: its statements
    assert conn.seen == ["BEGIN IMMEDIATE", "UPDATE meta", "COMMIT"]
    before = wal.writer
    conn.arm((3, when, exc))
    with pytest.raises(exc, match=f"interrupted {when} statement 3"):
        wal.mark_takeover()
    assert no_write_transaction_open(path)
    stored = (
        sqlite3.connect(path)
        .execute("SELECT writer_id, takeover_at IS NOT NULL FROM meta")
        .fetchone()
    )
    assert (wal.writer.id, wal.writer.take_over) == (stored[0], bool(stored[1]))
    landed = when == "after"
    assert (wal.writer.id != before.id) is landed
    wal.close()


class _RaiseAfterCommit:
    """A commit hook that raises ``exc`` once, right after an append's ``COMMIT``."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc: type[BaseException] | None = None
        self.armed = exc

    def arm(self) -> None:
        self.exc = self.armed

    def before_commit(self, what: str) -> None:
        return None

    def after_commit(self, what: str) -> None:
        exc, self.exc = self.exc, None
        if exc is not None and what == "append":
            raise exc("a signal, after the COMMIT")


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("call", ["send_finding", "send_findings with a marker"])
@pytest.mark.asyncio
async def test_a_row_committed_by_an_interrupted_send_goes_out_at_once(
    local_engine: LocalEngine, tmp_path: Path, call: str, exc: type[BaseException]
) -> None:
    # Issue 51: the simulator's liveness check found it. An exception after
    # the COMMIT left the writer unwoken: the committed row waited for the next
    # heartbeat (keepalive_ms, 25 s here), and a Done sent so timed out.
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    assert config.keepalive_ms >= 25_000
    with RunLog.open(config.wal_dir, run_id, correlation_id=config.correlation_id) as made:
        path = made.path
    hook = _RaiseAfterCommit(exc)
    conn = sqlite3.connect(path, isolation_level=None)
    log = RunLog.on_connection(
        conn, run_id=run_id, correlation_id=config.correlation_id, commit_hook=hook
    )
    async with open_channel(config, log=log) as ch:
        await ch.handshake("1", "interrupts", "1")
        ch.send_finding({"n": 1})
        assert await ch.wait_acked(timeout_ms=10_000)
        hook.arm()
        if call == "send_finding":
            interrupted = partial(ch.send_finding, {"n": 2})
        else:
            interrupted = partial(ch.send_findings, [{"n": 2}, {"n": 3}], progress={"step": 1})
        with pytest.raises(exc):
            interrupted()
        high = ch.log.high_water
        assert high > 1  # the interrupted send's rows committed
        # Nothing else is sent: the writer must take them now, not at its next heartbeat.
        assert await ch.wait_acked(timeout_ms=3_000), ch.stats()
    assert local_engine.accepted(run_id) == list(range(1, high + 1))
