"""The driver (walchannel.core.driver), tested directly: exact numbers; no gRPC, loop or disk.

Its one entry point, ``handle(event)``, is tested event by event for the
actions it answers (below, "The one entry point"); the decisions it builds
them from (``_answer``, ``_end``, ``_ack``, the backoff, the state table)
are tested here directly too, with the exact numbers each rule gives.
"""

from __future__ import annotations

import ast
import random
import typing
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walchannel.core.driver as wd
import walchannel.core.end_status as es
import walchannel.core.engine_refusals as rf
from walchannel.config import Backoff, GrpcChannelConfig
from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.checkpoints import (
    CHECKPOINT_EVERY_MS,
    CHECKPOINT_IDLE_MS,
    CHECKPOINT_RETRY_MAX_MS,
    CheckpointPolicy,
)
from walchannel.core.driver import (
    ACK_STORE_AFTER_MS,
    ACK_STORE_EVERY,
    ACK_STORE_RETRY_MAX_MS,
    MAX_KEEPALIVE_MS,
    STABLE_STREAM_MS,
    AckKind,
    Answer,
    AnswerPlan,
    Call,
    ChannelState,
    Completion,
    Driver,
    End,
    StateError,
)
from walchannel.core.end_status import SizeRefusal, describe_end
from walchannel.core.engine_refusals import RefusalVerdict, fenced_error, unproven_refusal
from walchannel.core.watchdog import (
    KEEPALIVE_TIMEOUT_MS,
    Verdict,
    stall_bound_ms,
    stream_verdict,
    watchdog_period_ms,
)
from walchannel.errors import (
    BacklogFullError,
    ChannelClosedError,
    EngineBehindError,
    PayloadError,
    RowRefusedError,
    RunCompletedError,
    RunExpiredError,
    WalchannelError,
    WriterFencedError,
)
from walchannel.log.state import (
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_FENCED,
    FAILED_UNDELIVERABLE,
    LogState,
    Writer,
    fenced_reason,
    next_seq_after,
    unverified_at_open,
    verification_shift,
)

S = ChannelState
_FINALS = (ChannelState.FAILED, ChannelState.EXPIRED, ChannelState.CLOSED)


def driver(
    *,
    high: int = 10,
    acked: int = 0,
    stored: int = 0,
    unverified: int | None = None,
    done_seq: int | None = None,
    failed_mark: bool = False,
    **config: Any,
) -> Driver:
    """A driver over a stand-in for ``RunLog`` (it reads only ``state``)."""
    log = SimpleNamespace(state=LogState("r", high + 1, stored, unverified, done_seq, False))
    base = {"grpc_addr": "127.0.0.1:1", "run_id": "r", "correlation_id": "c", "run_token": "t"}
    d = Driver(GrpcChannelConfig(**{**base, **config}), log, failed_mark=failed_mark, now_ms=0.0)
    if acked > stored:  # an ack received, not stored yet
        assert d._ack(acked, 0.0) is AckKind.ADVANCE
    return d


def dials_failed(d: Driver, n: int) -> None:
    """``n`` dials failed in a row: the backoff attempt is ``n`` higher."""
    for _ in range(n):
        d._next_delay_ms(0.0)


def log_of(d: Driver) -> SimpleNamespace:
    log = d._log
    assert isinstance(log, SimpleNamespace)
    return log


def up(d: Driver, replay_from: int, now: float = 0.0) -> None:
    d._move(S.CONNECTING)
    d._stream_up(replay_from, now)


# -- the log's seq rules (log_state) -------------------------------------------------


def test_next_seq_never_reuses_after_everything_is_acked() -> None:
    assert next_seq_after(0, 0) == 1
    assert next_seq_after(10, 4) == 11
    assert next_seq_after(0, 10) == 11  # rows gone, cursor remembers
    assert next_seq_after(7, 10) == 11


def test_unverified_from_at_open() -> None:
    assert unverified_at_open(None, 5) == 5
    assert unverified_at_open(3, 5) == 3
    assert unverified_at_open(9, 5) == 5


@pytest.mark.parametrize(
    ("unverified", "h", "shift"),
    [(None, 50, 0), (5, 4, 0), (5, 5, 1), (5, 10, 6), (1, 0, 0), (1, 1, 1)],
)
def test_verification_shift(unverified: int | None, h: int, shift: int) -> None:
    assert verification_shift(unverified, h) == shift


# -- states ----------------------------------------------------------------------------


def test_legal_transitions_and_final_states() -> None:
    d = driver()
    assert d.state is S.IDLE
    for state in (S.CONNECTING, S.STREAMING, S.BACKOFF, S.CONNECTING, S.BACKOFF):
        assert d._move(state)
    assert not d._move(S.BACKOFF)  # staying put is no change
    assert d._move(S.FAILED) and d.final
    with pytest.raises(StateError, match="FAILED -> CONNECTING"):
        d._move(S.CONNECTING)
    d._move(S.CLOSED)
    for state in S:
        if state is not S.CLOSED:
            with pytest.raises(StateError):
                d._move(state)


#: The arrows of SPEC's state diagram ("The channel", **States**).
SPEC_ARROWS = {
    (S.IDLE, S.CONNECTING),
    (S.CONNECTING, S.STREAMING),
    (S.CONNECTING, S.BACKOFF),
    (S.STREAMING, S.BACKOFF),
    (S.BACKOFF, S.CONNECTING),
    *{(a, b) for a in (S.IDLE, S.CONNECTING, S.STREAMING, S.BACKOFF) for b in _FINALS},
    (S.FAILED, S.CLOSED),
    (S.EXPIRED, S.CLOSED),
}


def _path_to(state: ChannelState) -> list[ChannelState]:
    """The moves from IDLE to ``state`` along SPEC's arrows (breadth first)."""
    paths: dict[ChannelState, list[ChannelState]] = {S.IDLE: []}
    frontier = [S.IDLE]
    while frontier:
        here = frontier.pop(0)
        for a, b in sorted(SPEC_ARROWS, key=lambda e: (e[0].value, e[1].value)):
            if a is here and b not in paths:
                paths[b] = [*paths[here], b]
                frontier.append(b)
    return paths[state]


@pytest.mark.parametrize("old", list(S), ids=lambda s: s.name)
def test_the_transition_table_allows_exactly_specs_arrows(old: ChannelState) -> None:
    for new in S:
        d = driver()
        for step in _path_to(old):
            d._move(step)
        assert d.state is old
        if new is old:
            assert not d._move(new)
        elif (old, new) in SPEC_ARROWS:
            assert d._move(new) and d.state is new
        else:
            with pytest.raises(StateError, match=f"{old.name} -> {new.name}"):
                d._move(new)


def test_a_failure_moves_through_the_table_and_a_final_state_stays() -> None:
    d = driver()
    behind = EngineBehindError("behind")
    assert d._fail(behind) == FAILED_ENGINE_BEHIND
    assert d.state is S.FAILED and d.failure is behind  # IDLE -> FAILED: a drawn arrow
    e = driver()
    assert e._expire() and e.state is S.EXPIRED
    assert not e._expire()
    e._fail(behind)
    assert e.state is S.EXPIRED and e.failure is behind  # kept as the error to raise
    c = driver()
    up(c, 1)
    error = c._completed_by_engine()
    assert c.state is S.FAILED and c.failure is error


def test_idle_cannot_stream_without_connecting() -> None:
    with pytest.raises(StateError):
        driver()._move(S.STREAMING)


# -- one admission check ----------------------------------------------------------------


def test_admission_says_closed_then_done_then_expired_then_failed() -> None:
    d = driver(hard_deadline=datetime(2030, 1, 1, tzinfo=UTC))
    deadline = d._deadline_in_s(0.0)
    assert deadline is not None
    before, after = 0.0, deadline + 1.0
    for call in Call:
        assert d.admit(call, before) is None
        assert isinstance(d.admit(call, after), RunExpiredError)
    behind = EngineBehindError("behind")
    assert d._fail(behind) == FAILED_ENGINE_BEHIND and d.state is S.FAILED
    for call in Call:
        assert d.admit(call, before) is behind
    d.handle(ev.DoneLogged())
    assert "already called" in str(d.admit(Call.DONE, before))
    assert "no new rows" in str(d.admit(Call.SEND, before))
    assert d.admit(Call.HANDSHAKE, before) is behind  # a handshake sends no row
    d.handle(ev.CloseRequested())
    for call in Call:
        error = d.admit(call, after)
        assert isinstance(error, ChannelClosedError) and "closed" in str(error)


def test_the_final_state_says_the_error_once_the_deadline_passes_too() -> None:
    # Million-schedule seeds 173780 and 199918: a channel FAILED (fenced) raised
    # RunExpiredError once the deadline passed, hiding why it failed; and FAILED
    # is final, so it never became EXPIRED either. The final state decides.
    deadline = datetime(2030, 1, 1, tzinfo=UTC)
    failed = driver(hard_deadline=deadline)
    fenced = WriterFencedError("another writer's", run_id="r", path="p", writer_id="w")
    failed._fail(fenced)
    after = (failed._deadline_in_s(0.0) or 0.0) + 1.0
    for call in Call:
        assert failed.admit(call, after) is fenced, call
    assert not failed._expire() and failed.state is S.FAILED
    # The other order: EXPIRED first, a failure after it is kept, the expiry still said.
    expired = driver(hard_deadline=deadline)
    assert expired._expire()
    expired._fail(EngineBehindError("behind"))
    for call in Call:
        assert isinstance(expired.admit(call, 0.0), RunExpiredError), call
        assert isinstance(expired.admit(call, after), RunExpiredError), call


def test_expiry_moves_to_expired_once_and_never_out_of_a_final_state() -> None:
    d = driver()
    assert d._expire() and d.state is S.EXPIRED
    assert not d._expire()
    failed = driver()
    failed._fail(RunCompletedError("done"))
    assert not failed._expire() and failed.state is S.FAILED


def test_an_expired_run_stays_expired_when_the_wall_clock_steps_back() -> None:
    # Million-schedule seed 291100: past the deadline, then the clock stepped back an hour.
    d = driver(hard_deadline=datetime(2030, 1, 1, tzinfo=UTC))
    assert d._expire()
    for call in Call:
        assert isinstance(d.admit(call, 0.0), RunExpiredError), call


def test_a_refused_done_fails_with_its_own_reason() -> None:
    d = driver()
    refused = RowRefusedError("too big", run_id="r", seq=3, kind="done", size=9, limit=8, path="p")
    assert d._fail(refused, reason=FAILED_DONE_REFUSED) == FAILED_DONE_REFUSED
    assert driver()._fail(RunCompletedError("x")) is None


# -- acks ---------------------------------------------------------------------------------


def test_acks_are_cumulative_and_stale_ones_change_nothing() -> None:
    d = driver()
    assert d._ack(4, 0) is AckKind.ADVANCE
    assert d._ack(2, 1) is AckKind.STALE
    assert d._ack(4, 2) is AckKind.STALE
    assert d.acked == 4 and d.unacked == 6
    assert d._ack(11, 3) is AckKind.ABOVE_HIGH_WATER
    assert d.acked == 4


def test_ack_storage_is_coalesced() -> None:
    d = driver(high=10_000)
    d._ack(1, 1000.0)
    assert d._ack_to_store(1000.0) is None
    d._ack(2, 1050.0)
    assert d._ack_to_store(1050.0) is None
    assert d._ack_to_store(1000.0 + ACK_STORE_AFTER_MS) == 2
    plan = log_of(d).state.ack(2)
    log_of(d).state = plan.state
    assert d._ack_to_store(5000.0) is None
    for seq in range(3, 3 + ACK_STORE_EVERY):
        d._ack(seq, 2000.0)
    assert d._ack_to_store(2000.0) == 2 + ACK_STORE_EVERY
    assert d._ack_to_store(2000.0, force=True) == 2 + ACK_STORE_EVERY


def test_an_unstored_ack_arms_one_timer_of_the_coalescing_window() -> None:
    d = driver(acked=3, stored=3)
    assert d._ack_timer_ms(timer_armed=False) is None  # nothing pending
    d._ack(4, 1000.0)
    assert d._ack_to_store(1000.0) is None  # coalesced
    assert d._ack_timer_ms(timer_armed=False) == ACK_STORE_AFTER_MS
    assert d._ack_timer_ms(timer_armed=True) is None  # one timer at a time


def test_ack_covering_done_is_stored_at_once_and_completes() -> None:
    d = driver(high=5)
    log = log_of(d)
    log.state = log.state.append(["done"])
    assert d.done_seq == 6 and d.high_water == 6
    d._ack(5, 0)
    assert d._ack_to_store(0) is None
    d._ack(6, 0)
    assert d._ack_to_store(0) == 6
    assert not d.completed
    plan = log.state.ack(6)
    assert plan is not None and plan.completed
    log.state = plan.state
    assert d.completed and d.unacked == 0
    assert d.is_acked(6) and not d.is_acked(7)  # every logged row, no seq past them


def test_an_ack_of_done_the_log_could_not_store_leaves_done_unacked_to_waiters() -> None:
    # Seed 1023789: the disk was full when the ack covering Done came; the
    # tombstone could not be stored, yet wait_acked() said True and the runner
    # exited 0 (DONE) over a log still holding an unacked Done. SPEC "Shutdown
    # order": the Done counts as acked once the tombstone is stored.
    d = driver(high=5)
    log = log_of(d)
    log.state = log.state.append(["finding", "done"])
    assert d.done_seq == 7
    d._ack(7, 0)
    assert d._ack_to_store(0) == 7  # handed to the log, whose commit then fails
    assert not d.completed
    assert d.is_acked(6)  # a row before Done: acked when the engine acks it
    assert not d.is_acked(7)  # the Done: only with its tombstone
    plan = log.state.ack(7)
    assert plan is not None and plan.completed
    log.state = plan.state
    assert d.is_acked(7)


# -- the handshake answer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "kind", "replay_from", "acked", "state", "errors"),
    [
        (2, Answer.BEHIND, None, 5, S.FAILED, 0),  # below the stored cursor (3)
        (4, Answer.FORGOT, 5, 4, S.CONNECTING, 0),  # below the received ack (5), not stored
        (5, Answer.RESUME, 6, 5, S.CONNECTING, 0),
        (8, Answer.RESUME, 9, 8, S.CONNECTING, 0),
        (10, Answer.RESUME, 11, 10, S.CONNECTING, 0),
        (11, Answer.AHEAD, None, 5, S.CONNECTING, 1),  # above anything logged: the stream ends
    ],
)
def test_a_verified_logs_answer_is_applied_in_one_call(
    answer: int, kind: Answer, replay_from: int | None, acked: int, state: S, errors: int
) -> None:
    d = driver(acked=5, stored=3)
    d._move(S.CONNECTING)
    plan = d._answer(answer, 0.0)
    assert (plan.answer, plan.replay_from) == (kind, replay_from)
    # One call applies what the answer means to the driver; the log is the caller's.
    assert (d.acked, d.stored, d.high_water, d.provisional) == (acked, 3, 10, None)
    assert (d.state, d.protocol_errors) == (state, errors)
    assert plan.acked_moved is (acked > 5)
    if kind is Answer.BEHIND:
        assert isinstance(d.failure, EngineBehindError)
        assert plan.failed_reason == FAILED_ENGINE_BEHIND
    if kind is Answer.AHEAD:
        assert (
            plan.problem
            == d.last_error
            == (
                "protocol error: handshake answer Ack(11) is above seq 10, the highest this log "
                "can have written; not applied"
            )
        )


@pytest.mark.parametrize(
    ("answer", "unverified", "words"),
    [
        (2**63, None, "past 2**63 - 1"),  # SQLite cannot hold it
        (2**64 - 1, 4, "past 2**63 - 1"),
        (2**63 - 2, 4, "would move the unverified rows (seq 4 on) by"),  # rows 4-10 past it
        (2**63 - 11, 1, "up to seq 9223372036854775807"),  # the top row at the limit: no next
    ],
)
def test_an_answer_out_of_sqlites_range_is_impossible_and_applies_nothing(
    answer: int, unverified: int | None, words: str
) -> None:
    d = driver(acked=5, stored=3, unverified=unverified, failed_mark=True)
    plan = d._answer(answer, 0.0)
    assert (plan.answer, plan.replay_from) == (Answer.IMPOSSIBLE, None)
    assert words in plan.problem and f"Ack({answer})" in plan.problem
    assert (d.acked, d.stored, d.high_water, d.provisional, d.failed_mark) == (
        5,
        3,
        10,
        None,
        True,
    )
    if unverified is not None:
        with pytest.raises(ValueError, match="2\\*\\*63 - 1"):
            log_of(d).state.verify(answer)


def test_the_largest_answer_that_leaves_a_seq_for_the_next_row_verifies() -> None:
    d = driver(unverified=1)  # rows 1-10, none verified
    answer = 2**63 - 12  # rows move to 2**63 - 11 .. 2**63 - 2
    assert d._answer(answer, 0.0).answer is Answer.VERIFY
    plan = log_of(d).state.verify(answer)
    assert plan.state.next_seq == 2**63 - 1


def test_an_ack_beyond_every_write_and_the_answer_is_never_written_and_not_applied() -> None:
    d = driver(high=30, acked=2, stored=2)
    assert d._answer(2, 0.0).answer is Answer.RESUME
    up(d, 3)
    assert d.ack_bound == 2
    for seq in (3, 4, 5):
        d.handle(ev.Writing(seq))
    d.handle(ev.Written(3))
    # Row 5's write started: an engine may ack it before the write returns.
    assert d._ack(5, 0) is AckKind.ADVANCE and d.acked == 5
    for n, lie in enumerate((6, 25, 30, 31, 2**63, 2**64 - 1), start=1):
        assert d._ack(lie, 0) is AckKind.NEVER_WRITTEN, lie
        assert d.protocol_errors == n  # counted in the same call
    assert d.last_error == (
        f"protocol error: Ack({2**64 - 1}) covers rows never written: beyond seq 5, the "
        "highest this channel wrote or the engine answered the handshake with; not applied"
    )
    assert d.acked == 5 and d.ack_bound == 5
    # A replay rewinds the writer: rows written before still bound acks.
    d._end("UNAVAILABLE", "connection reset")
    d._move(S.BACKOFF)
    assert d._answer(3, 0.0).answer is Answer.FORGOT and d.acked == 3
    up(d, 4)
    assert d.ack_bound == 5 and d._ack(5, 0) is AckKind.ADVANCE
    # The answer bounds them too: an engine that holds rows of an earlier process.
    d._end("UNAVAILABLE", "connection reset")
    d._move(S.BACKOFF)
    plan = d._answer(20, 0.0)
    assert plan.answer is Answer.RESUME and plan.acked_moved and d.acked == 20  # applied as an ack
    assert d._ack(20, 0) is AckKind.STALE
    assert d._ack(21, 0) is AckKind.NEVER_WRITTEN


def test_without_handshake_answers_acks_are_bounded_by_the_high_water_only() -> None:
    d = driver(high=30, engine_acks_handshake=False)
    assert d._answer(None, 0.0).answer is Answer.NO_ANSWER
    up(d, 1)
    assert d._ack(25, 0) is AckKind.ADVANCE  # the engine's rows of an earlier process
    # Beyond the high-water, the bound then (SPEC "Acks"): the stream ends.
    assert d._ack(31, 0) is AckKind.NEVER_WRITTEN
    assert d.ack_bound == 30 and d.protocol_errors == 1
    assert d.last_error == (
        "protocol error: Ack(31) covers rows never written: beyond seq 30, the log's "
        "high-water (the engine answers no handshakes); not applied"
    )


@pytest.mark.parametrize("answer", [0, 3, 7, 10, 25])
def test_the_first_answer_since_open_verifies_and_replays_after_it(answer: int) -> None:
    # SPEC "Dial": rows at or above unverified_from move to h+1, h+2, ...;
    # the writer starts right after h either way.
    d = driver(unverified=4)
    plan = d._answer(answer, 0.0)
    assert (plan.answer, plan.replay_from) == (Answer.VERIFY, answer + 1)
    # What moves: the driver remembers which seqs it handed out are unverified
    # (4..10), so on_verified can make them provisional; acked does not move yet.
    assert d.acked == 0 and d.provisional is None
    plan_log = log_of(d).state.verify(answer)
    log_of(d).state = plan_log.state
    d._verified(answer, plan_log.shift_by)
    expected = None if plan_log.shift_by == 0 else (4, 11, plan_log.shift_by)
    assert d.provisional == expected and d.acked == answer


def test_behind_wins_over_verification_and_keeps_the_failed_mark() -> None:
    d = driver(stored=3, unverified=4, failed_mark=True)
    plan = d._answer(2, 0.0)
    assert plan.answer is Answer.BEHIND and not plan.clear_failed_mark and d.failed_mark


@pytest.mark.parametrize("answer", [4, 5, 11])
def test_a_healthy_answer_clears_an_old_failed_mark_once(answer: int) -> None:
    d = driver(acked=5, stored=3, failed_mark=True)
    assert d._answer(answer, 0.0).clear_failed_mark and not d.failed_mark
    assert not d._answer(answer, 0.0).clear_failed_mark
    assert not driver(acked=5, stored=3)._answer(answer, 0.0).clear_failed_mark


def test_without_handshake_answers_the_writer_starts_at_the_cursor() -> None:
    d = driver(acked=5, stored=3, failed_mark=True)
    plan = d._answer(None, 0.0)
    assert (plan.answer, plan.replay_from, plan.clear_failed_mark) == (Answer.NO_ANSWER, 6, False)


def test_forgotten_acks_are_resent_without_moving_below_the_stored_cursor() -> None:
    d = driver(acked=8, stored=2)
    plan = d._answer(5, 0.0)
    assert (plan.answer, plan.replay_from, d.acked) == (Answer.FORGOT, 6, 5)
    assert plan.problem == "below acks it gave (8)"
    up(d, 6)
    assert d.next_to_write() == 6
    e = driver(acked=8, stored=2)
    assert e._answer(1, 0.0).answer is Answer.BEHIND  # below the stored cursor
    f = driver(acked=8, stored=3)
    assert f._answer(3, 0.0).answer is Answer.FORGOT
    assert f.acked == 3  # never below what the log stores
    assert f._ack_to_store(10_000.0) is None  # the forgotten acks are not stored any more


def test_verification_shift_translates_provisional_seqs() -> None:
    # Rows 4..10 were logged before the first answer; the engine holds up to 20.
    d = driver(high=10, acked=3, stored=3, unverified=4, done_seq=10)
    plan = d._answer(20, 0.0)
    assert plan.answer is Answer.VERIFY and plan.replay_from == 21
    verify = log_of(d).state.verify(20)
    assert verify.shift_by == verification_shift(4, 20) == 17
    log_of(d).state = verify.state
    d._verified(20, verify.shift_by)
    assert d.high_water == 27 and d.acked == 20 and d.stored == 20
    assert d.unverified_from is None and d.done_seq == 27
    assert [d.translate(s) for s in (3, 4, 10, 11, 28)] == [3, 21, 27, 11, 28]
    # wait_acked's one query: seq 4 as handed out is row 21, not yet acked; 3 is.
    assert d.is_acked(3) and not d.is_acked(4) and not d.is_acked(10)
    up(d, 21)
    d.handle(ev.Writing(21))
    assert d._ack(21, 0.0) is AckKind.ADVANCE
    assert d.is_acked(4) and not d.is_acked(5)


# -- the writer ---------------------------------------------------------------------------------


def test_writer_position_follows_replay_rewind_and_end() -> None:
    d = driver(high=5, acked=2, stored=2)
    assert d.next_to_write() is None  # no stream
    up(d, 1)  # never below the received ack
    assert d.state is S.STREAMING and d.next_to_write() == 3
    d.handle(ev.Written(3))
    d.handle(ev.Written(4))
    assert d.next_to_write() == 5
    assert d._rewind() == 3
    assert d.next_to_write() == 3
    d.handle(ev.Written(5))
    assert d.next_to_write() is None
    d._end("UNAVAILABLE", "connection reset")
    assert d.next_to_write() is None and d._rewind() == 3


def test_an_ack_above_a_rewound_writer_moves_it_past_the_acked_rows() -> None:
    # Rewound to 3 while 3..4 were in flight; the engine then acks 4: the
    # writer goes on at 5, never asking the log for rows it may have deleted.
    d = driver(high=6, acked=2, stored=2)
    up(d, 3)
    d.handle(ev.Written(3))
    d.handle(ev.Written(4))
    d._rewind()
    assert d.next_to_write() == 3
    d._ack(4, 0.0)
    assert d.next_to_write() == 5
    d._ack(3, 0.0)  # stale: nothing moves back
    assert d.next_to_write() == 5


def test_an_ack_during_a_replayed_write_that_covers_later_rows_is_not_undone() -> None:
    # Replaying 3 to an engine that already had 3..5: its Ack(5) arrives
    # while the write of 3 is in flight. The writer goes on at 6, never at 4
    # (the log may have deleted 4 and 5 already). Found by the 1,000,000-
    # schedule simulation.
    d = driver(high=7, acked=2, stored=2)
    up(d, 3)
    seq = d.next_to_write()
    assert seq == 3
    d._ack(5, 0.0)  # during the write
    d.handle(ev.Written(seq))
    assert d.next_to_write() == 6


def test_a_write_at_or_below_the_highest_written_seq_is_a_replay() -> None:
    d = driver(high=10)
    up(d, 1)
    for seq in (1, 2, 3, 2, 3, 4):
        d.handle(ev.Written(seq))
    assert (d.sent, d.replayed) == (6, 2)
    assert d.is_replay(4) and not d.is_replay(5)


def test_every_dial_after_the_first_is_a_reconnect() -> None:
    # Issue 53: whether its stream came up or not (a dial refused, a stream cut
    # for a missing handshake answer): streams up alone counted none of those.
    d = driver()
    d._count_dial()
    up(d, 1)
    assert d.reconnects == 0
    for _ in range(2):
        d._move(S.BACKOFF)
        d._count_dial()  # refused, or never answered
    d._count_dial()
    up(d, 1)
    assert d.reconnects == 3


def test_a_held_done_is_never_written_and_stops_once_the_rows_before_it_are_acked() -> None:
    d = driver(high=10, acked=5, stored=5)
    assert d._held_due() is None  # nothing held
    up(d, 6)
    error = PayloadError("done", "too big")
    d._hold(8, error)
    written = []
    while (seq := d.next_to_write()) is not None:
        written.append(seq)
        d.handle(ev.Written(seq))
    assert written == [6, 7]
    assert d._held_due() is None
    d._ack(7, 0.0)
    assert d._held_due() is error and d._held_due() is None  # taken once


# -- backoff and reconnecting -----------------------------------------------------------------


def test_backoff_delays_follow_the_formula_exactly() -> None:
    b = Backoff(initial_ms=500, multiplier=2, max_ms=15_000, jitter_ms=0)
    rng = random.Random(1)
    assert [b.delay_ms(a, rng) for a in range(8)] == [
        500,
        1000,
        2000,
        4000,
        8000,
        15000,
        15000,
        15000,
    ]
    assert b.delay_ms(10_000, rng) == 15_000  # no overflow


def test_backoff_jitter_comes_from_the_injected_rng() -> None:
    b = Backoff(initial_ms=100, multiplier=3, max_ms=1000, jitter_ms=250)
    rng = random.Random(7)
    twin = random.Random(7)
    for attempt in range(6):
        base = min(1000, 100 * 3**attempt)
        assert b.delay_ms(attempt, rng) == base + twin.uniform(0, 250)


@given(st.integers(0, 200), st.integers(0, 2**32))
def test_backoff_stays_within_bounds(attempt: int, seed: int) -> None:
    b = Backoff()
    delay = b.delay_ms(attempt, random.Random(seed))
    assert b.initial_ms <= delay <= b.max_ms + b.jitter_ms


def test_the_attempt_resets_only_on_an_ack_of_a_row_written_on_the_stream() -> None:
    backoff = Backoff(initial_ms=100, multiplier=2, max_ms=100_000, jitter_ms=0)
    d = driver(high=60, acked=50, stored=50, backoff=backoff)
    delays = [d._next_delay_ms(0)]  # first dial refused
    up(d, 51, 100)
    d._ack(50, 100)  # nothing written yet
    d._move(S.BACKOFF)
    delays.append(d._next_delay_ms(200))  # dropped at once
    up(d, 51, 300)
    d.handle(ev.Written(51))
    d._ack(50, 300)  # covers nothing written on this stream
    d._move(S.BACKOFF)
    delays.append(d._next_delay_ms(400))
    up(d, 51, 500)
    d.handle(ev.Written(51))
    d._ack(51, 500)
    d._move(S.BACKOFF)
    delays.append(d._next_delay_ms(600))
    assert delays == [100, 200, 400, 100]


def test_the_attempt_resets_after_a_stable_stream() -> None:
    backoff = Backoff(initial_ms=100, multiplier=2, max_ms=100_000, jitter_ms=0)
    d = driver(backoff=backoff)
    dials_failed(d, 5)
    up(d, 1, 0)
    assert d._next_delay_ms(STABLE_STREAM_MS - 1) == 3200
    d._move(S.BACKOFF)
    up(d, 1, 0)
    assert d._next_delay_ms(STABLE_STREAM_MS) == 100


def test_a_set_aside_row_or_a_held_done_resets_the_attempt() -> None:
    d = driver()
    dials_failed(d, 4)
    d._set_aside()
    assert d.attempt == 0
    dials_failed(d, 4)
    d._hold(3, PayloadError("done", "x"))
    assert d.attempt == 0


# -- ends of stream ------------------------------------------------------------------------


def test_too_many_pings_doubles_the_keepalive_up_to_five_minutes() -> None:
    d = driver(keepalive_ms=25_000)
    plan = d._end("UNAVAILABLE", "Too many pings")
    assert plan.keepalive_doubled and plan.end is End.RECONNECT and d.keepalive_ms == 50_000
    plan = d._end("UNAVAILABLE", "", 'GOAWAY "too_many_pings"')
    assert plan.keepalive_doubled and d.keepalive_ms == 100_000
    d._end("UNAVAILABLE", "too_many_pings")
    d._end("UNAVAILABLE", "too_many_pings")
    assert d.keepalive_ms == MAX_KEEPALIVE_MS
    assert not d._end("UNAVAILABLE", "Socket closed").keepalive_doubled


def test_run_completed_ends_the_loop_even_once_the_channel_is_over() -> None:
    d = driver()
    assert d._end("FAILED_PRECONDITION", "run completed").end is End.RUN_COMPLETED
    d._fail(EngineBehindError("x"))
    assert d._end("FAILED_PRECONDITION", "Run Completed").end is End.RUN_COMPLETED
    assert d._end("UNAVAILABLE", "x").end is End.ALREADY_OVER
    assert d.last_end_code == "UNAVAILABLE"


def test_every_other_status_reconnects() -> None:
    d = driver()
    for code in ("INTERNAL", "UNKNOWN", "UNAVAILABLE", "UNAUTHENTICATED", "CANCELLED", None):
        assert d._end(code, "run completed" if code else "").end is End.RECONNECT
    assert d._end("FAILED_PRECONDITION", "expected seq 4, got 9").end is End.RECONNECT


@pytest.mark.parametrize(
    ("done_seq", "stored", "completion"),
    [
        (10, 3, Completion.TOMBSTONE),  # our Done was applied, its ack lost
        (None, 3, Completion.UNDELIVERABLE),  # rows that can never be delivered
        (None, 10, Completion.NOTHING),  # nothing left: only the loop ends
    ],
)
def test_run_completed_makes_a_logged_done_a_tombstone_else_marks_what_is_left(
    done_seq: int | None, stored: int, completion: Completion
) -> None:
    d = driver(high=10, stored=stored, done_seq=done_seq)
    assert d._run_completed() is completion
    error = d._completed_by_engine()
    assert d.failure is error and d.state is S.FAILED


def test_a_size_refusal_is_read_from_the_status_and_anything_else_reconnects() -> None:
    d = driver()
    plan = d._end("RESOURCE_EXHAUSTED", "SERVER: Received message larger than max (900 vs. 500)")
    assert plan.end is End.SIZE_REFUSAL and plan.refusal == SizeRefusal(900, 500)
    # The channel's own receive limit (a down message) is no refusal of a row.
    plan = d._end("RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max (900 vs. 500)")
    assert plan.end is End.DOWN_TOO_LARGE and plan.refusal is None
    for code, details in [
        ("RESOURCE_EXHAUSTED", "quota"),
        ("UNAUTHENTICATED", "who?"),
        ("INTERNAL", "RST_STREAM"),
        (None, ""),
    ]:
        plan = d._end(code, details)
        assert plan.end is End.RECONNECT and plan.refusal is None, (code, details)


def test_an_unproven_size_refusal_says_why_nothing_was_set_aside() -> None:
    refusal = SizeRefusal(received=900, limit=500)
    none = RefusalVerdict(None)
    assert unproven_refusal(none, refusal, handshake_size=900).startswith("it is the handshake")
    assert "no row written" in unproven_refusal(none, refusal, handshake_size=80)
    other = RefusalVerdict(None, suspect=7, suspect_size=800)
    assert unproven_refusal(other, refusal, handshake_size=900) == (
        "the first row over the limit, seq 7 (800 bytes), is not the refused 900-byte message"
    )


def test_the_same_end_again_is_said_once_until_a_stream_comes_up() -> None:
    d = driver()
    assert d._first_said("UNAVAILABLE: refused")
    assert not d._first_said("UNAVAILABLE: refused")
    assert d._first_said("UNAUTHENTICATED: who")
    up(d, 1)
    assert d._first_said("UNAUTHENTICATED: who")


def test_describe_end_names_a_status_grpc_aio_lost_to_a_write() -> None:
    assert describe_end("UNAUTHENTICATED", "unknown run") == "UNAUTHENTICATED: unknown run"
    lost = describe_end("INTERNAL", "Internal error from Core")
    assert lost.startswith("INTERNAL: Internal error from Core (")
    assert "grpc/grpc#36066" in lost
    # An engine's own INTERNAL with other details is reported as it is.
    assert describe_end("INTERNAL", "engine bug") == "INTERNAL: engine bug"


# -- the watchdog ----------------------------------------------------------------------------


def test_the_watchdog_looks_four_times_per_bound_and_at_most_every_50_ms() -> None:
    assert watchdog_period_ms(None, 25_000) == 25_000 / 4
    assert watchdog_period_ms(2_000, 25_000) == 500
    assert watchdog_period_ms(None, 100) == 50
    assert driver(dead_stream_ms=2_000).watchdog_period_ms() == 500


def verdict(now: float, **kw: object) -> Any:
    args: dict[str, object] = {
        "last_down_ms": 0.0,
        "heartbeats_since_down": 0,
        "write_since_ms": None,
        "next_beat_ms": 1e18,
        "dead_stream_ms": 3_000.0,
        "keepalive_ms": 1_000.0,
        "pending_bytes": 0,
        "min_send_rate": 16_384.0,
    }
    args.update(kw)
    return stream_verdict(now, **args)  # type: ignore[arg-type]


def test_a_silent_stream_is_dead_only_while_heartbeats_go_out() -> None:
    assert verdict(2_999.0, heartbeats_since_down=2) is None
    assert verdict(3_000.0, heartbeats_since_down=2)[0] is Verdict.DEAD
    # Idle and healthy (no heartbeat since the last down message): alive.
    assert verdict(60_000.0, heartbeats_since_down=0) is None
    # Without dead_stream_ms, silence alone is never death.
    assert verdict(60_000.0, heartbeats_since_down=5, dead_stream_ms=None) is None


def test_a_heartbeat_stuck_behind_a_blocked_write_counts_as_sent() -> None:
    dead = verdict(3_000.0, write_since_ms=500.0, next_beat_ms=2_000.0)
    assert dead[0] is Verdict.DEAD and dead[3]  # the beat is overdue behind the write
    assert verdict(3_000.0, write_since_ms=500.0, next_beat_ms=3_500.0) is None


def test_a_write_blocked_past_keepalive_plus_ten_seconds_with_no_down_message_is_stalled() -> None:
    stall = 1_000.0 + KEEPALIVE_TIMEOUT_MS
    args: dict[str, object] = {"dead_stream_ms": None, "next_beat_ms": 1e18}
    assert verdict(stall - 1, write_since_ms=0.0, **args) is None
    assert verdict(stall, write_since_ms=0.0, **args)[0] is Verdict.STALLED
    # A down message arrived meanwhile: the engine is alive, only slow.
    assert verdict(stall, write_since_ms=0.0, last_down_ms=stall - 100, **args) is None
    # Not in a write: never stalled.
    assert verdict(10 * stall, **args) is None


MIB = 1024 * 1024


def test_the_stall_bound_grows_with_the_bytes_the_engine_must_receive_first() -> None:
    # grpc.aio cannot report progress inside a write: a large row on a slow
    # link is blocked and silent as long as it takes to cross. The bound is
    # keepalive + 10 s + pending_bytes / min_send_rate.
    args: dict[str, object] = {"dead_stream_ms": None, "write_since_ms": 0.0}
    old = 1_000.0 + KEEPALIVE_TIMEOUT_MS
    # A small row: keepalive + 10 s, as before (60 bytes at 16 KiB/s: 3.7 ms more).
    small = old + 60 * 1000 / 16_384
    assert stall_bound_ms(1_000.0, 60, 16_384.0) == small
    assert verdict(small - 1, pending_bytes=60, **args) is None
    assert verdict(small, pending_bytes=60, **args)[0] is Verdict.STALLED
    # The largest message at the default rate: 4 MiB at 16 KiB/s is 256 s more.
    big = old + 256_000.0
    assert stall_bound_ms(1_000.0, 4 * MIB, 16_384.0) == big
    assert verdict(old, pending_bytes=4 * MIB, **args) is None
    assert verdict(big - 1, pending_bytes=4 * MIB, **args) is None
    found = verdict(big, pending_bytes=4 * MIB, **args)
    assert found[0] is Verdict.STALLED and found[4] == big
    # The bound is the operator's minimum rate: 1 MiB/s makes it 4 s more.
    fast: dict[str, object] = {**args, "min_send_rate": float(MIB)}
    assert verdict(old + 4_000 - 1, pending_bytes=4 * MIB, **fast) is None
    assert verdict(old + 4_000, pending_bytes=4 * MIB, **fast)[0] is Verdict.STALLED
    # A down message meanwhile still means alive, whatever the size.
    assert verdict(big, pending_bytes=4 * MIB, last_down_ms=big - 100, **args) is None


def test_the_dead_stream_bound_grows_with_the_bytes_ahead_of_the_heartbeats() -> None:
    # Heartbeats that went out behind 400 KiB cannot be answered before those
    # bytes cross: dead_stream_ms 3 s + 400 KiB at 16 KiB/s (25 s).
    ahead = 400 * 1024
    assert verdict(3_000.0, heartbeats_since_down=2, pending_bytes=ahead) is None
    assert verdict(27_999.0, heartbeats_since_down=2, pending_bytes=ahead) is None
    dead = verdict(28_000.0, heartbeats_since_down=2, pending_bytes=ahead)
    assert dead[0] is Verdict.DEAD and dead[4] == 28_000.0
    # Behind a blocked write too.
    assert verdict(27_999.0, write_since_ms=0.0, next_beat_ms=1_000.0, pending_bytes=ahead) is None
    assert verdict(28_000.0, write_since_ms=0.0, next_beat_ms=1_000.0, pending_bytes=ahead)[3]
    # Nothing ahead: dead_stream_ms alone, as before.
    assert verdict(3_000.0, heartbeats_since_down=2)[0] is Verdict.DEAD


def test_the_driver_takes_the_minimum_rate_from_the_config() -> None:
    d = driver(keepalive_ms=1_000, min_send_rate_bytes_per_s=1024)
    look: dict[str, Any] = {
        "last_down_ms": 0.0,
        "heartbeats_since_down": 0,
        "write_since_ms": 0.0,
        "next_beat_ms": 1e18,
        "pending_bytes": 2048,  # 2 s at 1 KiB/s
    }
    assert d.stream_verdict(12_999.0, **look) is None
    assert d.stream_verdict(13_000.0, **look)[0] is Verdict.STALLED
    # The default rate, 16 KiB/s: 2 KiB is 125 ms more.
    assert driver(keepalive_ms=1_000).stream_verdict(11_124.0, **look) is None
    assert driver(keepalive_ms=1_000).stream_verdict(11_125.0, **look)[0] is Verdict.STALLED


# -- giving disk back -----------------------------------------------------------------------------


def test_checkpoints_wait_for_idle_unless_the_backlog_is_empty_and_it_has_been_a_while() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    assert not policy.on_rows_deleted(100.0, unacked=0)  # too soon
    assert not policy.on_rows_deleted(200.0, unacked=5)
    assert not policy.on_rows_deleted(CHECKPOINT_EVERY_MS, unacked=5)
    assert policy.on_rows_deleted(CHECKPOINT_EVERY_MS, unacked=0)


def test_the_idle_timer_waits_for_acks_to_stop() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    assert policy.on_timer(5000.0) is None  # nothing deleted: nothing to do
    policy.on_rows_deleted(1000.0, unacked=3)
    policy.on_rows_deleted(1600.0, unacked=3)  # acks still coming
    assert policy.on_timer(2000.0) == pytest.approx(600.0)
    assert policy.on_timer(1600.0 + CHECKPOINT_IDLE_MS) == 0.0  # now


def test_a_rounding_remainder_of_the_idle_wait_is_now_not_another_timer() -> None:
    # 2005.792 - 1005.792 is 999.9999999999998 in floats: re-arming a timer for
    # the 1e-13 ms left fired at the same clock reading forever (found by tools/sim.py).
    policy = CheckpointPolicy(now_ms=0.0)
    policy.on_rows_deleted(1005.792, unacked=3)
    assert policy.on_timer(2005.792) == 0.0
    assert policy.on_timer(2004.0) == pytest.approx(1.792)  # a real remainder still waits


def test_a_held_off_checkpoint_is_retried_less_often_and_a_reclaim_goes_on_at_once() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    policy.on_rows_deleted(0.0, unacked=1)
    assert policy.on_result(complete=False, shrank=True) == 0.0  # one chunk per turn
    delays = [policy.on_result(complete=False, shrank=False) for _ in range(8)]
    assert delays == [1000.0, 2000.0, 4000.0, 8000.0, 16000.0] + [CHECKPOINT_RETRY_MAX_MS] * 3
    policy.on_rows_deleted(1.0, unacked=1)  # new acks bring the retry forward
    assert policy.on_result(complete=False, shrank=False) == CHECKPOINT_IDLE_MS
    assert policy.on_result(complete=True, shrank=False) is None
    assert policy.on_timer(10_000.0) is None  # done: the timer has nothing to do


# -- repeats of down messages -------------------------------------------------------------


def test_stop_fires_once_and_decisions_are_kept_by_request_id() -> None:
    d = driver()
    assert d._stop() is True
    assert d._stop() is False  # re-sent after a handshake
    assert d.decision("r1") is None
    d._decide("r1", True, "ok")
    d._decide("r1", False, "changed")  # the latest wins
    assert d.decision("r1") == (False, "changed")


# -- what the driver says: exact texts, plans and first state (mutation survivors) --------

_NEXT_STEPS = (
    "and start again (a new log under the runner resumes from the engine's resume point "
    "where the engine keeps one; else what the other writer delivered then comes again, "
    "unless the harness resumes from its own record)"
)
_DEADLINE = datetime(2030, 1, 1, tzinfo=UTC)


def with_writer(
    writer: Writer | None,
    *,
    high: int = 10,
    stored: int = 0,
    unverified: int | None = None,
    failed_mark: bool = False,
    failed_reason: str | None = None,
    path: str | None = None,
    **config: Any,
) -> Driver:
    """A driver as the channel builds it: with the log's writer, stored reason and path."""
    log = SimpleNamespace(state=LogState("r", high + 1, stored, unverified, None, False))
    base = {"grpc_addr": "127.0.0.1:1", "run_id": "r", "correlation_id": "c", "run_token": "t"}
    extra: dict[str, Any] = {} if path is None else {"path": path}
    return Driver(
        GrpcChannelConfig(**{**base, **config}),
        log,
        failed_mark=failed_mark,
        now_ms=0.0,
        writer=writer,
        failed_reason=failed_reason,
        **extra,
    )


def test_a_fresh_driver_starts_with_nothing_known_sent_or_failed() -> None:
    d = driver(stored=3)
    assert d.run_id == "r"
    assert (d.state, d.closed, d.done_sent, d.failure) == (S.IDLE, False, False, None)
    assert d.closed is False and d.done_sent is False and d.stopped is False
    assert (d.acked, d.write_pos, d.provisional, d.hold_at, d.held) == (3, 0, None, None, None)
    assert (d.attempt, d.sent, d.replayed, d.reconnects, d.protocol_errors) == (0, 0, 0, 0, 0)
    assert (d.last_error, d.last_end_code, d.down_too_large, d.fenced_failure) == (
        None,
        None,
        None,
        None,
    )
    assert d._first_said("")  # nothing was said yet, not even an empty text


def test_the_first_unstored_ack_counts_one_toward_the_store_every_batch() -> None:
    d = driver(high=10_000)
    for seq in range(1, ACK_STORE_EVERY):
        assert d._ack(seq, 0.0) is AckKind.ADVANCE
    assert d._ack_to_store(0.0) is None  # one ack short of the batch
    d._ack(ACK_STORE_EVERY, 0.0)
    assert d._ack_to_store(0.0) == ACK_STORE_EVERY


def test_an_answer_of_zero_bounds_acks_by_what_was_written_since_none_was() -> None:
    d = driver()
    assert d._answer(0, 0.0) == AnswerPlan(Answer.RESUME, 1)  # acked 0: nothing moved
    assert d.ack_bound == 0
    assert d._ack(1, 0.0) is AckKind.NEVER_WRITTEN  # row 1 never went out on the stream
    d.handle(ev.Writing(1))
    assert d.ack_bound == 1 and d._ack(1, 0.0) is AckKind.ADVANCE


def test_the_deadline_is_counted_down_to_zero_and_refuses_at_the_second() -> None:
    d = driver(hard_deadline=_DEADLINE)
    at = _DEADLINE.timestamp()
    assert driver()._deadline_in_s(at) is None
    assert d._deadline_in_s(at - 30.0) == 30.0
    assert d._deadline_in_s(at - 0.25) == 0.25
    assert d._deadline_in_s(at) == 0.0 and d._deadline_in_s(at + 5.0) == 0.0
    assert d.admit(Call.SEND, at - 0.001) is None
    for call in Call:
        error = d.admit(call, at)  # the deadline second itself is past it
        assert isinstance(error, RunExpiredError)
        assert str(error) == "run r: past its hard_deadline"


def test_only_send_done_of_a_completed_run_passes_a_deadline_or_a_failure() -> None:
    d = driver(hard_deadline=_DEADLINE)
    log_of(d).state = log_of(d).state._replace(completed=True)
    after = _DEADLINE.timestamp() + 1.0
    # A tombstone this channel did not deliver a Done into passes nothing.
    assert isinstance(d.admit(Call.DONE, after), RunExpiredError)
    d.handle(ev.AckStored(10, 0.0))  # the stored ack covered this log's Done
    assert d.admit(Call.DONE, after) is None
    assert isinstance(d.admit(Call.SEND, after), RunExpiredError)
    assert isinstance(d.admit(Call.HANDSHAKE, after), RunExpiredError)
    d.handle(ev.TombstoneStored())
    error = d.failure
    assert isinstance(error, RunCompletedError)
    assert d.admit(Call.DONE, 0.0) is None
    assert d.admit(Call.SEND, 0.0) is error


def test_close_done_and_errors_are_recorded_as_said() -> None:
    d = driver()
    d.handle(ev.CloseRequested())
    assert d.closed is True
    d.handle(ev.DoneLogged())
    assert d.done_sent is True
    d.handle(ev.ErrorSeen("UNAVAILABLE: connection refused"))
    assert d.last_error == "UNAVAILABLE: connection refused"
    assert d._protocol_error("ack 99 above the high-water 10") == (
        "protocol error: ack 99 above the high-water 10"
    )
    assert d.last_error == "protocol error: ack 99 above the high-water 10"
    assert d.protocol_errors == 1
    d._protocol_error("again")
    d._protocol_error("and again")
    assert d.protocol_errors == 3 and d.last_error == "protocol error: and again"


def test_an_engine_behind_the_cursor_is_named_with_both_seqs() -> None:
    d = driver(acked=5, stored=3)
    plan = d._answer(2, 0.0)
    assert plan == AnswerPlan(Answer.BEHIND, None, failed_reason=FAILED_ENGINE_BEHIND)
    assert isinstance(d.failure, EngineBehindError) and d.state is S.FAILED
    assert str(d.failure) == (
        "run r: engine behind: its high-water 2 is below the stored cursor 3; it lost "
        "rows this log already deleted, which cannot be re-sent"
    )


def test_a_verifying_answer_clears_the_old_failed_mark_in_its_plan() -> None:
    d = driver(unverified=4, failed_mark=True)
    assert d._answer(5, 0.0) == AnswerPlan(Answer.VERIFY, 6, True)
    assert d.failed_mark is False
    assert d._answer(5, 0.0) == AnswerPlan(Answer.VERIFY, 6, False)  # cleared once


def test_a_verification_is_followed_once_and_an_equal_answer_keeps_the_ack() -> None:
    d = driver(acked=5, stored=5, unverified=4)
    assert d._answer(7, 0.0).answer is Answer.VERIFY
    d._verified(7, 4)
    assert d.provisional == (4, 11, 4) and d.acked == 7
    d._verified(9, 2)  # no VERIFY plan before it: no range handed out to move
    assert d.provisional == (4, 11, 4) and d.acked == 9
    fresh = driver(acked=5, stored=5)
    fresh._verified(5, 3)
    assert fresh.provisional is None and fresh.acked == 5


_FOREIGN_WHY = (
    "this log never had an answered handshake, and the engine already holds seqs up to 1 "
    "of the run: they are another writer's (a lost or misplaced log: a WALCHANNEL_DIR "
    "typo, a relative wal_dir, a volume gone; or a second harness); joining them would "
    "apply findings twice"
)


def test_a_never_answered_log_meeting_one_row_of_the_engine_is_foreign() -> None:
    me = Writer("w-me", 0, False, False)
    d = with_writer(me, unverified=1, path="/wal/r.wal")
    plan = d._answer(1, 0.0)  # the engine holds seq 1 already: not this log's
    assert plan == AnswerPlan(Answer.FOREIGN, None, failed_reason=fenced_reason(_FOREIGN_WHY))
    error = d.failure
    assert isinstance(error, WriterFencedError)
    # Never answered: the likeliest cause, a harness on the wrong folder, comes first.
    assert str(error) == (
        f"run r: not this log's to write (writer w-me (epoch 0)): {_FOREIGN_WHY}. If this "
        "harness ran before, check wal_dir / WALCHANNEL_DIR: its log is not where it was "
        "(this one is /wal/r.wal); fix the folder and restart. Every row "
        "stays in /wal/r.wal; review them with 'walchannel export /wal/r.wal', or take the "
        f"run over with 'walchannel takeover /wal/r.wal' {_NEXT_STEPS}"
    )
    assert (error.run_id, error.path, error.writer_id, error.engine_high) == (
        "r",
        "/wal/r.wal",
        "w-me",
        1,
    )
    assert d.fenced_failure == fenced_reason(_FOREIGN_WHY)
    # An engine holding nothing, or a log that may meet rows, verifies.
    assert with_writer(me, unverified=1)._answer(0, 0.0).answer is Answer.VERIFY
    answered = me._replace(answered=True)
    assert with_writer(answered, unverified=1)._answer(1, 0.0).answer is Answer.VERIFY


def test_fenced_keeps_its_reason_and_names_the_run_the_log_and_the_writer() -> None:
    d = with_writer(Writer("w-me", 2, False, True), path="/wal/my run.wal")
    error = d._fenced("because", engine_high=7)
    assert d.fenced_failure == fenced_reason("because")
    assert d.fenced_failure == f"{FAILED_FENCED} (because); every row is kept"
    assert str(error) == (
        "run r: not this log's to write (writer w-me (epoch 2)): because. Every row stays in "
        "/wal/my run.wal; review them with 'walchannel export '/wal/my run.wal'', "
        "or take the run over with 'walchannel takeover '/wal/my run.wal'' "
        f"{_NEXT_STEPS}"
    )
    assert (error.run_id, error.path, error.writer_id, error.engine_high) == (
        "r",
        "/wal/my run.wal",
        "w-me",
        7,
    )
    assert d._fenced("again").engine_high is None


def test_fenced_error_without_a_writer_or_a_path_says_this_writer_and_log() -> None:
    error = fenced_error("r", "", None, "because")
    assert str(error) == (
        "run r: not this log's to write (this writer): because. Every row stays in the log; "
        "review them with 'walchannel export LOG', or take the run over with "
        f"'walchannel takeover LOG' {_NEXT_STEPS}"
    )
    assert (error.run_id, error.path, error.writer_id, error.engine_high) == ("r", "", None, None)
    d = driver()  # no path given: the log is not named
    made = d._fenced("because", engine_high=3)
    assert made.path == "" and str(made) == str(error)
    assert (made.writer_id, made.engine_high) == (None, 3)
    named = fenced_error("r", "/wal/r.wal", Writer("w-1", 0, False, False), "x", engine_high=4)
    assert (named.path, named.writer_id, named.engine_high) == ("/wal/r.wal", "w-1", 4)
    assert "(writer w-1 (epoch 0))" in str(named) and "export /wal/r.wal'" in str(named)


def test_a_log_refused_before_starts_failed_unless_marked_to_take_over() -> None:
    why = "the engine refused it: writer fenced: superseded"
    reason = fenced_reason(why)
    me = Writer("w-me", 1, False, True)
    d = with_writer(me, failed_reason=reason, path="/wal/r.wal")
    assert d.state is S.FAILED
    assert isinstance(d.failure, WriterFencedError)
    before = f"it was refused before: {reason}"
    assert str(d.failure) == (
        f"run r: not this log's to write (writer w-me (epoch 1)): {before}. Every row stays "
        "in /wal/r.wal; review them with 'walchannel export /wal/r.wal', or take the run "
        f"over with 'walchannel takeover /wal/r.wal' {_NEXT_STEPS}"
    )
    assert d.fenced_failure == fenced_reason(before)
    assert d.admit(Call.HANDSHAKE, 0.0) is d.failure
    taking = with_writer(me._replace(take_over=True), failed_reason=reason)
    assert (taking.state, taking.failure) == (S.IDLE, None)
    other = with_writer(me, failed_reason=FAILED_UNDELIVERABLE)  # not a refusal
    assert (other.state, other.failure) == (S.IDLE, None)


@pytest.mark.parametrize(("path", "named"), [("/wal/r.wal", "/wal/r.wal"), (None, "the log")])
def test_a_takeover_without_handshake_answers_starts_failed_naming_the_log(
    path: str | None, named: str
) -> None:
    taking = Writer("w-new", 0, True, False)
    d = with_writer(taking, path=path, engine_acks_handshake=False)
    assert d.state is S.FAILED
    error = d.failure
    assert isinstance(error, WriterFencedError)
    assert str(error) == (
        f"run r: {named} is marked to take the run over (walchannel takeover), which needs "
        "the engine's handshake answer to number its rows after the engine's: set "
        "engine_acks_handshake=True (an engine that answers handshakes); without it the "
        "engine would drop them as duplicates of the old writer's rows. Every row stays "
        f"in {named}"
    )
    assert (error.run_id, error.path, error.writer_id, error.engine_high) == (
        "r",
        path or "",
        "w-new",
        None,
    )
    answering = with_writer(taking, path=path, engine_acks_handshake=True)
    assert (answering.state, answering.failure) == (S.IDLE, None)


def test_run_completed_by_another_fences_only_a_log_with_rows_left() -> None:
    me = Writer("w-me", 0, False, True)
    # No writer named (none said yet): this writer's rows left are undeliverable, not fenced.
    assert with_writer(me, high=10, stored=7)._run_completed() is Completion.UNDELIVERABLE
    said = "run completed by writer w-other"
    empty = with_writer(me, high=10, stored=10)
    assert empty._end("FAILED_PRECONDITION", said).end is End.RUN_COMPLETED
    assert empty._run_completed() is Completion.NOTHING
    one = with_writer(me, high=10, stored=9)  # a single row left is a row left
    assert one._end("FAILED_PRECONDITION", said).completion is Completion.FENCED
    d = with_writer(me, high=10, stored=7, path="/wal/r.wal")
    d._end("FAILED_PRECONDITION", said)
    assert d._run_completed() is Completion.FENCED
    error, reason = d._refused(Completion.FENCED)
    why = (
        "the engine says writer w-other completed the run, while 3 row(s) of this writer "
        "were never applied"
    )
    assert reason == fenced_reason(why) == d.fenced_failure
    assert isinstance(error, WriterFencedError)
    assert str(error) == str(fenced_error("r", "/wal/r.wal", me, why))
    assert (error.path, error.writer_id) == ("/wal/r.wal", "w-me")


def test_a_refusal_of_this_writer_is_fenced_with_the_engines_words() -> None:
    me = Writer("w-me", 0, False, True)
    d = with_writer(me, path="/wal/r.wal")
    details = "writer fenced: a newer copy of this log (epoch 1) writes the run"
    assert d._end("FAILED_PRECONDITION", details).end is End.FENCED
    assert d._run_completed() is Completion.FENCED
    error, reason = d._refused(Completion.FENCED)
    why = f"the engine refused it: {details}"
    assert reason == fenced_reason(why) == d.fenced_failure
    assert str(error) == str(fenced_error("r", "/wal/r.wal", me, why))


@pytest.mark.parametrize(
    ("stored", "completion", "reason"),
    [(9, Completion.UNDELIVERABLE, FAILED_UNDELIVERABLE), (10, Completion.NOTHING, None)],
)
def test_run_completed_with_one_row_left_marks_it_undeliverable(
    stored: int, completion: Completion, reason: str | None
) -> None:
    d = driver(high=10, stored=stored)
    assert d._run_completed() is completion
    error, said = d._refused(completion)
    assert isinstance(error, RunCompletedError) and said == reason
    assert str(error) == "run r: the engine says the run is completed"
    assert d.fenced_failure is None


def test_the_engines_completion_fails_the_run_with_its_own_words() -> None:
    d = driver()
    error = d._completed_by_engine()
    assert isinstance(error, RunCompletedError)
    assert str(error) == "run r: the engine says the run is completed"
    assert d.failure is error and d.state is S.FAILED


def test_a_tombstone_says_every_logged_row_acked_and_no_seq_past_them() -> None:
    # The engine's "run completed" standing in for the Done's lost ack (SPEC "Completion");
    # the Done's own ack: test_ack_covering_done_is_stored_at_once_and_completes.
    e = driver(high=10, acked=3, stored=3, done_seq=10)
    log_of(e).state = log_of(e).state.complete_by_engine()
    assert e.completed and e.is_acked(10) and not e.is_acked(11)


def test_a_held_done_is_due_exactly_when_the_row_before_it_is_acked() -> None:
    d = driver(high=10, acked=3, stored=3)
    error = PayloadError("done", "too big")
    assert d._held_due() is None  # nothing held back
    d._hold(5, error)
    assert d._held_due() is None  # row 4 is not acked
    d._ack(4, 0.0)
    assert d._held_due() is error
    assert d.held is None and d._held_due() is None


# -- what the driver says: exact texts, plans and boundaries (mutation survivors) -------------

GRPC_SAYS_DOWN_TOO_LARGE = "CLIENT: Received message larger than max (900 vs. 500)"
LOST = es.LOST_STATUS_DETAILS
TAIL = "raise it in the config; the rows wait in the log and the channel keeps retrying"


def test_every_end_plan_carries_the_doubled_keepalive_whatever_the_end() -> None:
    pings = 'GOAWAY "too_many_pings"'
    # The engine ending the run fails it in the same call: a fresh driver each.
    for details, said, end, completion in (
        ("owned by another writer w2", pings, End.FENCED, Completion.FENCED),
        ("writer fenced", "", End.FENCED, Completion.FENCED),
        ("run completed", pings, End.RUN_COMPLETED, Completion.UNDELIVERABLE),
        ("run completed", "", End.RUN_COMPLETED, Completion.UNDELIVERABLE),
    ):
        e = driver(keepalive_ms=25_000)
        plan = e._end("FAILED_PRECONDITION", details, said)
        assert (plan.end, plan.keepalive_doubled, plan.refusal) == (end, bool(said), None)
        assert e.state is S.FAILED and plan.completion is completion
        assert plan.failed_reason is not None  # 10 rows here were never applied
    # A logged Done the engine applied: a tombstone, not a failure; the keepalive still doubles.
    for said in (pings, ""):
        t = driver(keepalive_ms=25_000, done_seq=10)
        assert t._end("FAILED_PRECONDITION", "run completed", said) == wd.EndPlan(
            End.RUN_COMPLETED, bool(said), None, completion=Completion.TOMBSTONE
        )
        assert t.failure is None
    d = driver(keepalive_ms=25_000)
    big = es.DownTooLarge(900, 500)
    assert d._end("RESOURCE_EXHAUSTED", GRPC_SAYS_DOWN_TOO_LARGE, pings) == wd.EndPlan(
        End.DOWN_TOO_LARGE, True, None, big
    )
    assert d._end("RESOURCE_EXHAUSTED", GRPC_SAYS_DOWN_TOO_LARGE) == wd.EndPlan(
        End.DOWN_TOO_LARGE, False, None, big
    )
    refused = "SERVER: Received message larger than max (900 vs. 500)"
    assert d._end("RESOURCE_EXHAUSTED", refused, pings) == wd.EndPlan(
        End.SIZE_REFUSAL, True, SizeRefusal(900, 500)
    )
    assert d._end("RESOURCE_EXHAUSTED", refused) == wd.EndPlan(
        End.SIZE_REFUSAL, False, SizeRefusal(900, 500)
    )
    assert d._end("UNAVAILABLE", "x", pings) == wd.EndPlan(End.RECONNECT, True, None)
    d._fail(EngineBehindError("x"))
    assert d._end("UNAVAILABLE", "x", pings) == wd.EndPlan(End.ALREADY_OVER, True, None)
    assert d._end("UNAVAILABLE", "x") == wd.EndPlan(End.ALREADY_OVER, False, None)


def test_a_down_message_too_large_stays_the_cause_of_ends_grpc_lost_to_a_write() -> None:
    d = driver()
    assert d.down_too_large is None
    d._end("RESOURCE_EXHAUSTED", GRPC_SAYS_DOWN_TOO_LARGE)
    assert d.down_too_large == es.DownTooLarge(900, 500)
    # The next stream's end lost its status to a write (grpc/grpc#36066): still too large.
    plan = d._end("INTERNAL", LOST)
    assert plan == wd.EndPlan(End.DOWN_TOO_LARGE, False, None, es.DownTooLarge(900, 500), True)
    assert d.down_too_large == es.DownTooLarge(900, 500)
    # A real status that says something else replaces it.
    assert d._end("UNAVAILABLE", "Socket closed") == wd.EndPlan(End.RECONNECT, False, None)
    assert d.down_too_large is None
    # With nothing known before, a lost status is an ordinary reconnect.
    assert d._end("INTERNAL", LOST) == wd.EndPlan(End.RECONNECT, False, None)
    assert d.down_too_large is None


def test_an_ack_of_a_written_row_or_a_stable_stream_forgets_the_down_message_too_large() -> None:
    d = driver(high=10)
    d._end("RESOURCE_EXHAUSTED", GRPC_SAYS_DOWN_TOO_LARGE)
    up(d, 1)
    d.handle(ev.Written(1))
    d._ack(1, 0.0)
    assert d.down_too_large is None
    d._move(S.BACKOFF)
    d._end("RESOURCE_EXHAUSTED", GRPC_SAYS_DOWN_TOO_LARGE)
    up(d, 2, 0.0)
    d._next_delay_ms(STABLE_STREAM_MS)
    assert d.down_too_large is None


def test_an_ack_moves_a_writer_standing_exactly_at_its_seq_and_no_writer_without_a_stream() -> None:
    d = driver(high=10)
    assert d._ack(4, 0.0) is AckKind.ADVANCE
    assert d.write_pos == 0  # no stream: nothing to move
    up(d, 5)
    assert d.write_pos == 5
    d._ack(5, 0.0)  # the row the writer stands at
    assert d.write_pos == 6


def test_acks_are_stored_at_the_256th_and_coalescing_restarts_after_a_store() -> None:
    d = driver(high=10_000)
    for seq in range(1, ACK_STORE_EVERY):
        d._ack(seq, 0.0)
    assert d._ack_to_store(0.0) is None  # 255: not yet
    d._ack(ACK_STORE_EVERY, 0.0)
    assert d._ack_to_store(0.0) == ACK_STORE_EVERY
    log = log_of(d)
    plan = log.state.ack(ACK_STORE_EVERY)
    log.state = plan.state
    assert d._ack_timer_ms(timer_armed=False) is None
    start = ACK_STORE_EVERY + 1
    for seq in range(start, start + ACK_STORE_EVERY - 1):
        d._ack(seq, 0.0)
    assert d._ack_to_store(0.0) is None  # counting from 0 again
    d._ack(start + ACK_STORE_EVERY - 1, 0.0)
    assert d._ack_to_store(0.0) == 2 * ACK_STORE_EVERY


def test_an_ack_already_stored_is_not_stored_again_even_when_forced() -> None:
    d = driver(acked=3, stored=3)
    assert d._ack_to_store(0.0, force=True) is None


def test_a_stream_up_forgets_the_last_end_said_whatever_it_was() -> None:
    d = driver()
    assert d._first_said("")
    assert not d._first_said("")
    up(d, 1)
    assert d._first_said("")


def test_a_stream_end_leaves_the_writer_at_zero() -> None:
    d = driver()
    up(d, 1)
    assert d.write_pos == 1
    d._end("UNAVAILABLE", "connection reset")
    assert d.write_pos == 0
    assert d.next_to_write() is None


def test_the_driver_watchdog_uses_its_dead_stream_bound_and_the_heartbeats_given() -> None:
    d = driver(dead_stream_ms=3_000, keepalive_ms=60_000)
    look: dict[str, Any] = {
        "last_down_ms": 0.0,
        "write_since_ms": None,
        "next_beat_ms": 1e18,
        "pending_bytes": 0,
    }
    assert d.stream_verdict(3_000.0, heartbeats_since_down=0, **look) is None
    found = d.stream_verdict(3_000.0, heartbeats_since_down=1, **look)
    assert found == (Verdict.DEAD, 3_000.0, 0.0, False, 3_000.0)


def test_stream_verdicts_give_every_field_exactly_at_their_bounds() -> None:
    # One heartbeat since the last down message is enough.
    assert verdict(3_000.0, heartbeats_since_down=1) == (Verdict.DEAD, 3_000.0, 0.0, False, 3_000.0)
    # A heartbeat due exactly now, behind a write blocked since 500 ms, counts as sent.
    found = verdict(3_000.0, write_since_ms=500.0, next_beat_ms=3_000.0)
    assert found == (Verdict.DEAD, 3_000.0, 2_500.0, True, 3_000.0)
    stall = 1_000.0 + KEEPALIVE_TIMEOUT_MS
    found = verdict(stall + 200.0, write_since_ms=200.0, dead_stream_ms=None)
    assert found == (Verdict.STALLED, stall + 200.0, stall, False, stall)


def test_a_fresh_checkpoint_policy_has_nothing_due() -> None:
    policy = CheckpointPolicy(now_ms=5.0)
    assert policy.last_stored_ms == 0.0
    assert policy.last_checkpoint_ms == 5.0
    assert policy.due is False
    assert policy.retry_ms == CHECKPOINT_IDLE_MS
    # A first step held off by a reader retries after the idle wait.
    assert policy.on_result(complete=False, shrank=False) == CHECKPOINT_IDLE_MS


def test_a_checkpoint_done_resets_the_retry_and_the_due_flag() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    policy.on_rows_deleted(0.0, unacked=1)
    policy.on_result(complete=False, shrank=False)
    policy.on_result(complete=False, shrank=False)
    assert policy.on_result(complete=True, shrank=False) is None
    assert policy.due is False
    assert policy.retry_ms == CHECKPOINT_IDLE_MS
    assert policy.on_result(complete=False, shrank=False) == CHECKPOINT_IDLE_MS


def test_an_empty_backlog_checkpoints_every_ten_seconds_since_the_last_checkpoint() -> None:
    policy = CheckpointPolicy(now_ms=5_000.0)
    assert not policy.on_rows_deleted(9_000.0, unacked=0)
    assert not policy.on_rows_deleted(5_000.0 + CHECKPOINT_EVERY_MS - 1, unacked=0)
    assert policy.on_rows_deleted(5_000.0 + CHECKPOINT_EVERY_MS, unacked=0)


def test_exactly_one_millisecond_left_of_the_idle_wait_still_waits() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    policy.on_rows_deleted(1_000.0, unacked=3)
    assert policy.on_timer(1_999.0) == 1.0


def test_only_failed_precondition_with_details_is_an_engine_refusal() -> None:
    assert es.engine_refusal("FAILED_PRECONDITION", " Owned By Another Writer w2") == (
        "owned by another writer"
    )
    assert es.engine_refusal("FAILED_PRECONDITION", "writer fenced: epoch 3") == "writer fenced"
    assert es.engine_refusal("UNAVAILABLE", "owned by another writer") is None
    assert es.engine_refusal("FAILED_PRECONDITION", None) is None
    assert es.engine_refusal("FAILED_PRECONDITION", "") is None


def test_describe_end_says_the_whole_text() -> None:
    assert describe_end("UNAVAILABLE", "") == "UNAVAILABLE: "
    assert describe_end("UNAVAILABLE", None) == "UNAVAILABLE: "
    assert describe_end(None, None) == "None: "
    assert describe_end("INTERNAL", LOST) == (
        "INTERNAL: Internal error from Core (the stream ended during a write, and gRPC "
        "reported this in place of the engine's status: grpc/grpc#36066; the next dial "
        "learns it)"
    )


def test_only_grpc_aios_own_internal_text_is_a_lost_status() -> None:
    assert es.status_lost("INTERNAL", "Internal error from Core")
    assert not es.status_lost("INTERNAL", "internal error from core")
    assert not es.status_lost("INTERNAL", None)
    assert not es.status_lost("UNKNOWN", "Internal error from Core")


def test_a_size_refusal_is_read_in_each_grpc_wording_and_only_over_the_limit() -> None:
    exhausted = "RESOURCE_EXHAUSTED"
    said = "SERVER: Received message larger than max (900 vs. 500)"
    assert es.parse_size_refusal(exhausted, said) == SizeRefusal(received=900, limit=500)
    assert es.parse_size_refusal(exhausted, "grpc: received message larger than max (9 vs 5)") == (
        SizeRefusal(received=9, limit=5)
    )
    # grpc-java names the limit first.
    java = "gRPC message exceeds maximum size 500: 900"
    assert es.parse_size_refusal(exhausted, java) == SizeRefusal(received=900, limit=500)
    # Not over the limit, another code, no details, or the client's own limit: no refusal.
    assert es.parse_size_refusal(exhausted, "larger than max (500 vs. 500)") is None
    assert es.parse_size_refusal(exhausted, "received message larger than max (5 vs. 5)") is None
    assert es.parse_size_refusal(exhausted, "gRPC message exceeds maximum size 500: 500") is None
    assert es.parse_size_refusal("UNAVAILABLE", said) is None
    assert es.parse_size_refusal(exhausted, None) is None
    assert es.parse_size_refusal(exhausted, "") is None
    assert es.parse_size_refusal(exhausted, GRPC_SAYS_DOWN_TOO_LARGE) is None


def test_the_refused_row_is_the_first_strictly_over_the_limit() -> None:
    refusal = SizeRefusal(received=900, limit=500)
    # A row exactly at the limit was accepted: the one after it is proven.
    assert rf.pick_refused_row([(3, 500), (4, 900)], refusal) == RefusalVerdict(4, 4, 900)
    assert rf.pick_refused_row([(3, 100), (4, 800), (5, 900)], refusal) == RefusalVerdict(
        None, 4, 800
    )
    assert rf.pick_refused_row([(3, 500)], refusal) == RefusalVerdict(None, None, None)


def test_a_down_message_too_large_is_read_from_grpcs_client_side_text_only() -> None:
    exhausted = "RESOURCE_EXHAUSTED"
    assert es.parse_receive_limit(exhausted, GRPC_SAYS_DOWN_TOO_LARGE) == es.DownTooLarge(
        received=900, limit=500
    )
    assert es.parse_receive_limit(exhausted, "CLIENT: Received message larger than max") == (
        es.DownTooLarge(received=None, limit=None)
    )
    assert es.parse_receive_limit("UNAVAILABLE", GRPC_SAYS_DOWN_TOO_LARGE) is None
    assert es.parse_receive_limit(exhausted, None) is None
    assert es.parse_receive_limit(exhausted, "SERVER: received message larger than max") is None


def test_the_down_message_too_large_text_names_the_size_the_limit_and_the_field() -> None:
    assert rf.down_too_large_text(es.DownTooLarge(900, 500), 4_194_304) == (
        f"a 900-byte down message exceeded max_receive_message_bytes (500): {TAIL}"
    )
    assert rf.down_too_large_text(es.DownTooLarge(None, None), 4_194_304) == (
        f"a down message exceeded max_receive_message_bytes (4194304): {TAIL}"
    )


def test_the_down_message_too_large_text_is_read_back_from_a_last_error() -> None:
    sized = rf.down_too_large_text(es.DownTooLarge(900, 500), 4_194_304)
    assert rf.receive_limit_in(f"RESOURCE_EXHAUSTED: {sized}") == es.DownTooLarge(900, 500)
    unsized = rf.down_too_large_text(es.DownTooLarge(None, None), 4_194_304)
    assert rf.receive_limit_in(unsized) == es.DownTooLarge(None, 4_194_304)
    assert rf.receive_limit_in("UNAVAILABLE: Socket closed") is None
    assert rf.receive_limit_in("") is None
    assert rf.receive_limit_in(None) is None


# -- the driver owns its state -----------------------------------------------------------


def test_the_drivers_fields_are_read_only_outside_it() -> None:
    d = driver()
    assert all(name.startswith("_") for name in vars(d)), sorted(vars(d))
    fields = {n for n, v in vars(Driver).items() if isinstance(v, property)}
    assert {"state", "acked", "closed", "done_sent", "last_error", "failure"} <= fields
    for name in fields:
        assert getattr(Driver, name).fset is None, name
    with pytest.raises(AttributeError):
        d.acked = 3  # type: ignore[misc]


def _driver_written(path: Path) -> list[str]:
    """``<…driver>.<field> = …`` (or ``+=``, ``setattr``) in ``path``, as ``file:line``."""

    def is_driver(node: ast.expr) -> bool:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return name in ("driver", "_driver")

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
        ):
            targets = [node.args[0]] if node.args and is_driver(node.args[0]) else []
            found += [f"{path.name}:{node.lineno}"] * len(targets)
            continue
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and is_driver(sub.value):
                    found.append(f"{path.name}:{node.lineno}")
    return found


def test_nothing_outside_driver_modules_writes_a_drivers_field() -> None:
    root = Path(__file__).resolve().parent.parent
    paths = [
        p
        for top in ("walchannel", "tools", "tests", "examples")
        for p in (root / top).rglob("*.py")
        if not (top == "walchannel" and p.name.startswith("driver"))
    ]
    written = [w for p in paths for w in _driver_written(p)]
    assert not written, written


def test_the_write_finder_finds_a_planted_write(tmp_path: Path) -> None:
    planted = tmp_path / "channel.py"
    planted.write_text(
        "def f(self):\n    self._driver._acked = 3\n    driver.closed += 1\n"
        "    setattr(self._driver, 'state', None)\n    self.driven = 1\n"
    )
    assert _driver_written(planted) == ["channel.py:2", "channel.py:3", "channel.py:4"]


# -- the answer's own inputs (mutation survivors of issue 36's one-call answer) ----------------


def test_an_answer_applied_as_an_ack_waits_to_be_stored_from_the_answers_time() -> None:
    d = driver(high=10, acked=3, stored=3)
    plan = d._answer(8, 5_000.0)
    assert plan.acked_moved and d.acked == 8
    assert d._ack_timer_ms(timer_armed=False) is not None
    assert d._ack_to_store(5_000.0 + ACK_STORE_AFTER_MS - 1) is None
    assert d._ack_to_store(5_000.0 + ACK_STORE_AFTER_MS) == 8
    assert d._ack_timer_ms(timer_armed=False) is None  # handed out: the window starts again


def test_an_answer_above_the_high_water_raises_no_ack_bound() -> None:
    # Issue 53: the refused answer is never the bound (it was: acks up to it were
    # then taken as "above the high-water", and after a restart as rows).
    d = driver(high=10)
    d._move(S.CONNECTING)
    assert d._answer(11, 0.0).answer is Answer.AHEAD
    up(d, 1)
    assert d._ack(11, 0.0) is AckKind.NEVER_WRITTEN
    d.handle(ev.Writing(1))
    assert d._ack(1, 0.0) is AckKind.ADVANCE  # what this channel wrote may be acked
    assert d.protocol_errors == 2 and d.acked == 1


def test_the_error_of_the_runs_end_is_built_in_one_place() -> None:
    d = driver()
    assert d.ended_error() is None
    d.handle(ev.CloseRequested())
    closed = d.ended_error()
    assert isinstance(closed, ChannelClosedError) and str(closed) == "run r: the channel is closed"
    e = driver()
    e._expire()
    expired = e.ended_error()
    assert isinstance(expired, RunExpiredError) and str(expired) == "run r: past its hard_deadline"
    behind = EngineBehindError("behind")
    e._fail(behind)  # a failure after the deadline: the failure is what ended it
    assert e.ended_error() is behind
    f = driver()
    f._fail(behind)
    f.handle(ev.CloseRequested())
    assert f.ended_error() is behind


def test_run_completed_is_decided_in_the_end_and_a_tombstone_needs_the_log_first() -> None:
    d = driver(high=10, acked=9, stored=9, done_seq=10)
    up(d, 10)
    plan = d._end("FAILED_PRECONDITION", "run completed")
    assert (plan.end, plan.completion, plan.failed_reason) == (
        End.RUN_COMPLETED,
        Completion.TOMBSTONE,
        None,
    )
    assert d.state is S.STREAMING and d.failure is None  # nothing failed: the log comes first
    error = d._completed_by_engine()
    assert d.state is S.FAILED and d.failure is error
    # The log could not be made a tombstone: its rows stay, undeliverable.
    e = driver(high=10, acked=9, stored=9, done_seq=10)
    up(e, 10)
    assert e._end("FAILED_PRECONDITION", "run completed").completion is Completion.TOMBSTONE
    assert e._tombstone_not_stored() == FAILED_UNDELIVERABLE
    assert e.state is S.FAILED and isinstance(e.failure, RunCompletedError)


# -- what the engine contradicts, and answers above what was written (issue 53) ----------


def test_expected_seq_below_the_stored_cursor_fails_the_run_as_engine_behind() -> None:
    d = driver(high=20, stored=15)
    up(d, 16)
    plan = d._end("FAILED_PRECONDITION", "expected seq 11, got seq 16")
    assert plan.end is wd.End.CONTRADICTED
    assert plan.failed_reason == FAILED_ENGINE_BEHIND
    assert d.state is S.FAILED
    assert isinstance(d.failure, EngineBehindError)
    assert "expects seq 11" in str(d.failure) and "below the cursor 15" in str(d.failure)


@pytest.mark.parametrize("expected", [16, 19])
def test_expected_seq_at_or_above_the_stored_cursor_is_re_sent(expected: int) -> None:
    # The FORGOT rule: acks received but not stored may be lost; the rows are still here.
    d = driver(high=20, acked=18, stored=15)
    up(d, 19)
    plan = d._end("FAILED_PRECONDITION", f"expected seq {expected}, got seq 19")
    assert plan.end is wd.End.RECONNECT
    assert d.state is S.STREAMING and d.failure is None


def _trusted(written: int | None, *, high: int = 10, unverified: int | None = 11) -> Driver:
    """A driver over a log reopened on the same boot (``written``: RunLog.written_bound)."""
    log = SimpleNamespace(state=LogState("r", high + 1, high, unverified, None, False))
    base = {"grpc_addr": "127.0.0.1:1", "run_id": "r", "correlation_id": "c", "run_token": "t"}
    return Driver(
        GrpcChannelConfig(**base), log, failed_mark=False, now_ms=0.0, written_bound=written
    )


@pytest.mark.parametrize("answer", [11, 60, 2**62])
def test_an_answer_above_the_written_bound_is_refused_and_bounds_no_ack(answer: int) -> None:
    d = _trusted(10)
    plan = d._answer(answer, 0.0)
    assert plan.answer is Answer.AHEAD
    assert d.protocol_errors == 1
    assert f"Ack({answer}) is above seq 10" in (d.last_error or "")
    assert d.ack_bound == 0  # the refused answer raises nothing: only writes will
    assert d._ack(answer, 0.0) is AckKind.NEVER_WRITTEN


def test_an_answer_within_the_written_bound_is_verified_as_before() -> None:
    d = _trusted(10)
    assert d._answer(10, 0.0).answer is Answer.VERIFY


@pytest.mark.parametrize("answer", [11, 60])
def test_without_a_written_bound_an_answer_above_is_the_verification_path(answer: int) -> None:
    # A takeover, a restored log, another boot: the engine may hold more than this log.
    d = _trusted(None)
    assert d._answer(answer, 0.0).answer is Answer.VERIFY
    d._verified(answer, answer + 1 - 11)
    assert d.written_bound == answer  # from now on, above it is no engine's word
    assert d._answer(answer + 5, 0.0).answer is Answer.AHEAD


# -- the one entry point: events in, actions out (issue 60) ------------------------------------


def streaming(**kw: Any) -> Driver:
    """A driver whose stream is up (answered with its stored cursor), writer at the cursor."""
    d = driver(**kw)
    d.handle(ev.LoopStarted())
    actions = d.handle(ev.Answered(d.stored, 0.0))
    assert any(isinstance(a, act.StartStream) for a in actions), actions
    while (seq := d.next_to_write()) is not None:  # every row goes out: acks may cover them
        d.handle(ev.Writing(seq))
        d.handle(ev.Written(seq))
    return d


def test_every_event_has_a_handler_and_every_handler_an_event() -> None:
    d = driver()
    events = set(typing.get_args(ev.Event))
    assert set(d._handlers) == events
    assert {name for name in ev.__all__ if name[0].isupper()} - {"Event", "Failure"} == {
        e.__name__ for e in events
    }


def test_the_loop_dials_backs_off_and_rediscovers_only_with_a_discovery_url() -> None:
    backoff = Backoff(initial_ms=100, multiplier=2, max_ms=1000, jitter_ms=0)
    d = driver(backoff=backoff, keepalive_ms=20_000)
    assert list(d.handle(ev.LoopStarted())) == [act.STATE_CHANGED, act.Dial(20_000)]
    assert d.state is S.CONNECTING
    assert list(d.handle(ev.StreamOver(0.0))) == [act.STATE_CHANGED, act.Backoff(100, 1)]
    assert list(d.handle(ev.BackoffOver())) == [act.STATE_CHANGED, act.Dial(20_000)]
    assert d.reconnects == 1
    found = driver(http_addr="http://127.0.0.1:1", allowed_hosts=["127.0.0.1"], keepalive_ms=20_000)
    found.handle(ev.LoopStarted())
    found.handle(ev.StreamOver(0.0))
    assert list(found.handle(ev.BackoffOver())) == [act.REDISCOVER]
    assert list(found.handle(ev.Rediscovered())) == [act.STATE_CHANGED, act.Dial(20_000)]


@pytest.mark.parametrize("over", ["closed", "failed"])
def test_the_loop_ends_once_the_channel_is_closed_or_over(over: str) -> None:
    d = driver()
    d.handle(ev.LoopStarted())
    if over == "closed":
        d.handle(ev.CloseRequested())
    else:
        d.handle(ev.Failed(WalchannelError("x"), ev.Failure.CORRUPT))
    for event in (ev.StreamOver(0.0), ev.BackoffOver(), ev.Rediscovered(), ev.LoopStarted()):
        assert not d.handle(event), event


def test_a_verifying_answer_asks_for_the_verification_and_its_outcome_starts_the_stream() -> None:
    d = driver(high=10, unverified=4, failed_mark=True)
    d.handle(ev.LoopStarted())
    assert list(d.handle(ev.Answered(6, 0.0))) == [act.CLEAR_FAILED_MARK, act.Verify(6)]
    assert d.state is S.CONNECTING  # nothing is up until the log moved its rows
    log_of(d).state = log_of(d).state.verify(6).state
    actions = list(d.handle(ev.Verified(6, 3, 0.0)))
    assert actions[:3] == [
        act.Renumbered(6, 4, 3),
        act.ArmCheckpointTimer(CHECKPOINT_IDLE_MS),
        act.ACK_MOVED_BY_ANSWER,
    ]
    assert actions[-1] == act.StartStream(7)
    assert d.state is S.STREAMING and d.acked == 6 and d.translate(4) == 7


def test_a_verification_not_written_ends_the_stream_and_forgets_the_verification() -> None:
    d = driver(high=10, unverified=4)
    d.handle(ev.LoopStarted())
    d.handle(ev.Answered(6, 0.0))
    assert list(d.handle(ev.VerificationFailed("disk full"))) == [
        act.RecordError("disk full", loud=False),
        act.EndStream("handshake answer refused"),
    ]
    assert d._verifying is None and d.state is S.CONNECTING


@pytest.mark.parametrize(("answer", "cls"), [(2, EngineBehindError)])
def test_an_answer_that_fails_the_run_stores_the_failure_and_ends_the_stream(
    answer: int, cls: type[Exception]
) -> None:
    d = driver(acked=5, stored=3)
    d.handle(ev.LoopStarted())
    actions = list(d.handle(ev.Answered(answer, 0.0)))
    assert actions == [
        act.StoreFailure(FAILED_ENGINE_BEHIND),
        act.EndStream("handshake answer refused"),
    ]
    assert isinstance(d.failure, cls) and d.state is S.FAILED


def test_an_answer_above_the_log_is_a_protocol_error_that_ends_the_stream() -> None:
    d = driver(acked=5, stored=3)
    d.handle(ev.LoopStarted())
    said = (
        "protocol error: handshake answer Ack(11) is above seq 10, the highest this log can "
        "have written; not applied"
    )
    assert list(d.handle(ev.Answered(11, 0.0))) == [
        act.NoteProtocolError(said),
        act.EndStream(f"{said}; the stream is ended and dialed again"),
    ]
    assert d.state is S.CONNECTING and d.protocol_errors == 1


def test_a_forgetful_answer_warns_and_starts_from_what_it_holds() -> None:
    d = driver(acked=5, stored=3)
    d.handle(ev.LoopStarted())
    assert list(d.handle(ev.Answered(4, 0.0))) == [
        act.Warn("the engine answered Ack(4) below acks it gave (5); re-sending from 5"),
        act.StartStream(5),
    ]


def test_an_answer_that_acks_the_rows_before_a_refused_done_stops_instead_of_streaming() -> None:
    d = driver(high=5, acked=0, stored=0)
    d.handle(ev.LoopStarted())
    error = RowRefusedError("too big", run_id="r", seq=5, kind="done", size=9, limit=8, path="p")
    assert not d.handle(ev.DoneRefused(5, error))
    actions = list(d.handle(ev.Answered(4, 0.0)))
    assert act.StoreFailure(FAILED_DONE_REFUSED) in actions
    assert actions[-1] == act.EndStream("the channel stopped")
    assert d.failure is error and d.state is S.FAILED


def test_an_ack_moves_allocates_nothing_and_a_due_store_is_asked_for() -> None:
    d = streaming(high=10_000)
    first = d.handle(ev.AckReceived(1, 1000.0))
    assert list(first) == [act.ACK_MOVED, act.ArmAckTimer(ACK_STORE_AFTER_MS)]
    # The timer is armed: later acks answer one shared tuple.
    assert d.handle(ev.AckReceived(2, 1001.0)) is d.handle(ev.AckReceived(3, 1002.0))
    assert list(d.handle(ev.AckTimerFired(1000.0 + ACK_STORE_AFTER_MS))) == [act.StoreAck(3)]
    for seq in range(4, 4 + ACK_STORE_EVERY - 1):
        d.handle(ev.AckReceived(seq, 2000.0))
    assert list(d.handle(ev.AckReceived(3 + ACK_STORE_EVERY, 2000.0))) == [
        act.ACK_MOVED,
        act.StoreAck(3 + ACK_STORE_EVERY),
    ]


def test_a_stored_ack_asks_the_reclaim_and_a_stored_done_wakes_everyone() -> None:
    d = streaming(high=5)
    idle = act.ArmCheckpointTimer(CHECKPOINT_IDLE_MS)
    assert list(d.handle(ev.AckStored(3, 0.0))) == [idle]
    log = log_of(d)
    log.state = log.state.append(["done"])
    d.handle(ev.Writing(6))
    d.handle(ev.Written(6))
    assert list(d.handle(ev.AckReceived(6, 0.0))) == [act.ACK_MOVED, act.StoreAck(6)]
    log.state = log.state.ack(6).state
    # Nothing unacked, and the last checkpoint long ago: give the disk back now.
    assert list(d.handle(ev.AckStored(6, 20_000.0))) == [act.DONE_ACKED, act.CHECKPOINT]


def done_written() -> Driver:
    """A streaming driver whose log holds rows 1-5 and a ``Done`` at seq 6, written."""
    d = streaming(high=5)
    log = log_of(d)
    log.state = log.state.append(["done"])
    d.handle(ev.Writing(6))
    d.handle(ev.Written(6))
    return d


def test_a_failed_ack_store_is_tried_again_on_a_doubling_timer_until_it_is_stored() -> None:
    # Seed 642715: the disk was full when the ack covering Done came; the
    # store failed and nothing tried it again until a later ack opened a new
    # window, and after Done no ack comes: flush waited on the tombstone for
    # ever. Any failed store (a Done's or a row's) is tried again by the timer.
    d = done_written()
    log = log_of(d)
    assert list(d.handle(ev.AckReceived(6, 0.0))) == [act.ACK_MOVED, act.StoreAck(6)]
    now, delay = 0.0, ACK_STORE_AFTER_MS
    for _ in range(8):  # the disk stays full: the pause doubles up to its cap
        assert list(d.handle(ev.AckStoreFailed(6, now))) == [act.ArmAckTimer(delay)]
        assert not d.is_acked(6)  # the Done waits on its tombstone
        now += delay
        assert list(d.handle(ev.AckTimerFired(now))) == [act.StoreAck(6)]
        delay = min(2 * delay, ACK_STORE_RETRY_MAX_MS)
    assert delay == ACK_STORE_RETRY_MAX_MS
    log.state = log.state.ack(6).state
    assert act.DONE_ACKED in d.handle(ev.AckStored(6, now))
    assert d.is_acked(6)


def test_a_failed_store_of_a_rows_ack_is_tried_again_and_success_restarts_the_window() -> None:
    d = streaming(high=10)
    assert list(d.handle(ev.AckReceived(3, 0.0))) == [
        act.ACK_MOVED,
        act.ArmAckTimer(ACK_STORE_AFTER_MS),
    ]
    assert list(d.handle(ev.AckTimerFired(ACK_STORE_AFTER_MS))) == [act.StoreAck(3)]
    assert list(d.handle(ev.AckStoreFailed(3, 100.0))) == [act.ArmAckTimer(ACK_STORE_AFTER_MS)]
    d.handle(ev.AckReceived(4, 150.0))  # a later ack joins the retry, not a window of its own
    assert list(d.handle(ev.AckTimerFired(200.0))) == [act.StoreAck(4)]
    assert list(d.handle(ev.AckStoreFailed(4, 200.0))) == [act.ArmAckTimer(2 * ACK_STORE_AFTER_MS)]
    assert list(d.handle(ev.AckTimerFired(400.0))) == [act.StoreAck(4)]
    log_of(d).state = log_of(d).state.ack(4).state
    d.handle(ev.AckStored(4, 400.0))
    # Stored: the next unstored ack waits the usual window again.
    assert list(d.handle(ev.AckReceived(5, 500.0))) == [
        act.ACK_MOVED,
        act.ArmAckTimer(ACK_STORE_AFTER_MS),
    ]


def test_a_store_reported_failed_that_the_log_holds_after_all_counts_as_stored() -> None:
    # An exception that reached the store after its commit (a signal
    # handler's refused call): the log holds the ack; the Done is acked.
    d = done_written()
    log = log_of(d)
    d.handle(ev.AckReceived(6, 0.0))
    log.state = log.state.ack(6).state
    assert act.DONE_ACKED in d.handle(ev.AckStoreFailed(6, 0.0))


def test_flushing_acks_stores_whatever_is_received_and_not_stored() -> None:
    d = streaming(high=10)
    assert not d.handle(ev.AcksFlushed(0.0))
    d.handle(ev.AckReceived(4, 0.0))
    assert list(d.handle(ev.AcksFlushed(0.0))) == [act.StoreAck(4)]


def test_stale_and_impossible_acks_are_answered_apart() -> None:
    d = streaming(high=10, acked=5, stored=5)
    assert list(d.handle(ev.AckReceived(4, 0.0))) == [act.StaleAck(4, 5)]
    actions = list(d.handle(ev.AckReceived(99, 0.0)))
    kind = "impossible acks (NEVER_WRITTEN)"
    assert actions[0] == act.NoteProtocolError(d.last_error or "", kind)
    assert actions[1] == act.EndStream(f"{d.last_error}; the stream is ended and dialed again")
    assert d.acked == 5 and d.protocol_errors == 1


def test_run_completed_over_a_logged_done_asks_for_a_tombstone_and_hears_its_outcome() -> None:
    d = driver(high=6, done_seq=6)
    d.handle(ev.LoopStarted())
    assert list(d.handle(ev.Ended("FAILED_PRECONDITION", "run completed", "", "x"))) == [
        act.TOMBSTONE
    ]
    assert d.state is S.CONNECTING and d.failure is None  # not decided before the log answers
    assert list(d.handle(ev.TombstoneStored())) == [act.STATE_CHANGED]
    assert isinstance(d.failure, RunCompletedError) and d.state is S.FAILED
    other = driver(high=6, done_seq=6)
    other.handle(ev.Ended("FAILED_PRECONDITION", "run completed", "", "x"))
    assert list(other.handle(ev.TombstoneNotStored())) == [act.StoreFailure(FAILED_UNDELIVERABLE)]


def test_run_completed_with_nothing_left_marks_the_log_and_fails_without_a_mark() -> None:
    d = driver(high=6, stored=6)
    assert list(d.handle(ev.Ended("FAILED_PRECONDITION", "run completed", "", "x"))) == [
        act.MARK_COMPLETED,
        act.StoreFailure(None),
    ]


def test_a_stream_end_is_said_loudly_once_and_a_size_refusal_is_set_aside() -> None:
    d = driver()
    unavailable = ev.Ended("UNAVAILABLE", "down", "", "UNAVAILABLE: down")
    assert list(d.handle(unavailable)) == [act.RecordEnd("UNAVAILABLE: down", loud=True)]
    assert list(d.handle(unavailable)) == [act.RecordEnd("UNAVAILABLE: down", loud=False)]
    details = "Received message larger than max (70000 vs. 65536)"
    actions = list(d.handle(ev.Ended("RESOURCE_EXHAUSTED", details, "", "refused")))
    assert actions == [act.SetAsideRefused(SizeRefusal(70000, 65536), "refused", loud=True)]
    assert not d.handle(ev.RefusedRowSetAside()) and d.attempt == 0


def test_too_many_pings_is_said_once_whatever_the_doublings() -> None:
    d = driver(keepalive_ms=10_000)
    goaway = ev.Ended("UNAVAILABLE", "GOAWAY too_many_pings", "", "x")
    assert list(d.handle(goaway)) == [
        act.KeepaliveDoubled(10_000, 20_000),
        act.RecordEnd("x", loud=True),
    ]
    assert not any(isinstance(a, act.KeepaliveDoubled) for a in d.handle(goaway))
    assert d.keepalive_ms == 40_000


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        (ev.Failure.LOG_REMOVED, wd.FAILED_LOG_REMOVED),
        (ev.Failure.CORRUPT, wd.FAILED_CORRUPT),
        (ev.Failure.GROUP_LOST, wd.FAILED_GROUP_LOST),
        (ev.Failure.INTERNAL, f"{wd.FAILED_INTERNAL}: KeyError: 'x'"),
    ],
)
def test_each_failure_of_walchannels_own_gets_its_reason_from_the_driver(
    cause: ev.Failure, reason: str
) -> None:
    d = driver()
    error = WalchannelError("broken")
    assert list(d.handle(ev.Failed(error, cause, "KeyError: 'x'"))) == [act.StoreFailure(reason)]
    assert d.failure is error and d.state is S.FAILED


def test_a_group_lost_while_closing_is_recorded_and_a_removal_after_the_end_is_nothing() -> None:
    d = driver()
    d.handle(ev.CloseRequested())
    error = WalchannelError("lost seqs 3-4")
    assert list(d.handle(ev.Failed(error, ev.Failure.GROUP_LOST))) == [
        act.RecordError("lost seqs 3-4", loud=True)
    ]
    assert d.failure is None
    over = driver()
    over.handle(ev.Failed(error, ev.Failure.CORRUPT))
    assert not over.handle(ev.Failed(error, ev.Failure.LOG_REMOVED))


def test_the_deadline_is_looked_at_until_it_passes_then_expires_once() -> None:
    d = driver(hard_deadline=datetime.fromtimestamp(1000.0, UTC))
    assert list(d.handle(ev.DeadlineLook(0.0))) == [act.ArmDeadline(wd.DEADLINE_LOOK_S)]
    assert list(d.handle(ev.DeadlineLook(990.0))) == [act.ArmDeadline(10.0)]
    assert list(d.handle(ev.DeadlineLook(1000.0))) == [act.DEADLINE_HIT]
    assert d.state is S.EXPIRED
    assert not d.handle(ev.DeadlinePassed()) and not d.handle(ev.DeadlineLook(2000.0))
    assert not driver().handle(ev.DeadlineLook(0.0))  # no deadline: no timer


def test_send_done_is_answered_by_the_logs_state() -> None:
    fresh = driver(high=5)
    assert list(fresh.handle(ev.DoneRequested())) == [act.LOG_DONE]
    assert not fresh.done_sent  # a Done not logged (a bad field) may be sent again
    assert list(fresh.handle(ev.DoneLogged())) == [act.WAIT_DONE] and fresh.done_sent
    logged = driver(high=6, done_seq=6)
    assert list(logged.handle(ev.DoneRequested())) == [act.WAIT_DONE] and logged.done_sent
    tomb = driver(high=6, done_seq=6)
    log = log_of(tomb)
    log.state = log.state.ack(6).state
    assert list(tomb.handle(ev.DoneRequested())) == [act.DONE_DELIVERED] and tomb.done_sent


def test_stop_is_fired_once_and_every_decision_is_resolved_and_kept() -> None:
    d = driver()
    assert list(d.handle(ev.StopReceived("budget"))) == [act.StopCallbacks("budget")]
    assert not d.handle(ev.StopReceived("budget"))
    decided = ev.DecisionReceived("q", True, "ok")
    assert list(d.handle(decided)) == [act.ResolveApproval("q", True, "ok")]
    assert d.decision("q") == (True, "ok")


def test_rewind_and_close_go_through_the_entry_point() -> None:
    d = streaming(high=10, acked=4, stored=4)
    for seq in range(5, 9):
        d.handle(ev.Writing(seq))
        d.handle(ev.Written(seq))
    assert list(d.handle(ev.Rewind())) == [act.Replay(6)] and d.write_pos == 5
    assert not d.handle(ev.CloseRequested()) and d.closed
    assert list(d.handle(ev.Closed())) == [act.STATE_CHANGED] and d.state is S.CLOSED
    assert not d.handle(ev.Closed())


def test_a_protocol_violation_is_counted_said_and_ends_the_stream() -> None:
    d = streaming()
    said = "protocol error: the engine sent garbage"
    assert list(d.handle(ev.ProtocolViolation("the engine sent garbage"))) == [
        act.NoteProtocolError(said),
        act.EndStream(said),
    ]
    assert d.protocol_errors == 1 and d.last_error == said


def test_the_backlog_limit_is_the_drivers_answer() -> None:
    assert driver().backlog_error(10**9, 0, 10**9) is None  # no limit
    d = driver(max_unacked_bytes=100)
    assert d.backlog_error(50, 0, 50) is None
    error = d.backlog_error(50, 20, 31)
    assert isinstance(error, BacklogFullError)
    assert str(error).startswith(
        "run r: 50 unacked bytes + 20 pending + 31 would pass max_unacked_bytes 100"
    )


def test_the_disk_reclaim_is_asked_for_by_the_driver_and_hears_each_steps_result() -> None:
    d = streaming(high=10)
    assert list(d.handle(ev.CheckpointTimerFired(0.0))) == []  # nothing deleted: nothing due
    d.handle(ev.AckReceived(10, 0.0))
    assert list(d.handle(ev.AckStored(10, 20_000.0))) == [act.CHECKPOINT]
    # A big reclaim goes on at once; a held-off one is retried after the idle wait, doubling.
    assert list(d.handle(ev.Checkpointed(complete=False, shrank=True))) == [
        act.ArmCheckpointTimer(0.0)
    ]
    assert list(d.handle(ev.CheckpointTimerFired(20_000.0 + CHECKPOINT_IDLE_MS))) == [
        act.CHECKPOINT
    ]
    assert list(d.handle(ev.Checkpointed(complete=False, shrank=False))) == [
        act.ArmCheckpointTimer(CHECKPOINT_IDLE_MS)
    ]
    assert not d.handle(ev.Checkpointed(complete=True, shrank=False))
    d.handle(ev.CloseRequested())
    assert not d.handle(ev.CheckpointTimerFired(99_000.0))  # closed: RunLog.close checkpoints
    assert not d.handle(ev.Checkpointed(complete=False, shrank=False))


def test_send_done_after_another_writer_completed_the_run_raises_instead_of_saying_delivered() -> (
    None
):
    # Simulator seed 531948: "run completed by" another writer, nothing of this
    # log left: the log becomes a tombstone over nothing, and send_done must not
    # say this run's Done (never logged) was delivered.
    me = Writer("w-me", 0, False, True)
    d = with_writer(me, high=10, stored=10)
    actions = list(
        d.handle(ev.Ended("FAILED_PRECONDITION", "run completed by writer w-3", "", "x"))
    )
    assert actions == [act.MARK_COMPLETED, act.StoreFailure(None)]
    log = log_of(d)
    log.state = log.state.complete_by_engine()
    error = d.admit(Call.DONE, 0.0)
    assert isinstance(error, RunCompletedError) and error is d.failure
    # This log's own Done, acked and stored: send_done says delivered, whatever the state.
    ours = driver(high=5)
    ours_log = log_of(ours)
    ours_log.state = ours_log.state.append(["done"])
    ours.handle(ev.LoopStarted())
    ours.handle(ev.Answered(0, 0.0))
    for seq in range(1, 7):
        ours.handle(ev.Writing(seq))
        ours.handle(ev.Written(seq))
    assert act.StoreAck(6) in ours.handle(ev.AckReceived(6, 0.0))
    ours_log.state = ours_log.state.ack(6).state
    ours.handle(ev.AckStored(6, 0.0))
    assert ours.admit(Call.DONE, 0.0) is None
    assert list(ours.handle(ev.DoneRequested())) == [act.DONE_DELIVERED]
