"""The sans-I/O core: exact numbers, no sockets, no files."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from walchannel.config import Backoff
from walchannel.log_state import LogState
from walchannel.protocol import (
    ACK_STORE_AFTER_MS,
    ACK_STORE_EVERY,
    STABLE_STREAM_MS,
    AckKind,
    AnswerKind,
    ChannelState,
    Cursor,
    EndKind,
    ReconnectPolicy,
    StateError,
    StateMachine,
    classify_end,
    describe_end,
    is_too_many_pings,
    next_seq_after,
    unverified_at_open,
    verification_shift,
)

S = ChannelState


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


# -- states -------------------------------------------------------------------


def test_legal_transitions_and_final_states() -> None:
    sm = StateMachine()
    assert sm.state is S.IDLE
    for state in (S.CONNECTING, S.STREAMING, S.BACKOFF, S.CONNECTING, S.BACKOFF):
        sm.move(state)
    sm.move(S.FAILED)
    assert sm.final
    with pytest.raises(StateError, match="FAILED -> CONNECTING"):
        sm.move(S.CONNECTING)
    sm.move(S.CLOSED)
    for state in S:
        if state is not S.CLOSED:
            with pytest.raises(StateError):
                sm.move(state)


def test_idle_cannot_stream_without_connecting() -> None:
    with pytest.raises(StateError):
        StateMachine().move(S.STREAMING)


# -- the cursor ---------------------------------------------------------------------


class FakeLog:
    """Stands in for ``RunLog``: the cursor reads the log's facts from ``state``."""

    def __init__(self, state: LogState) -> None:
        self.state = state


def cursor(
    *,
    high_water: int = 10,
    acked: int = 0,
    stored: int = 0,
    unverified_from: int | None = None,
    done_seq: int | None = None,
) -> Cursor:
    state = LogState("r", high_water + 1, stored, unverified_from, done_seq, False)
    return Cursor(log=FakeLog(state), acked=max(acked, stored))


def _log(c: Cursor) -> FakeLog:
    assert isinstance(c.log, FakeLog)
    return c.log


def test_acks_are_cumulative_and_stale_ones_change_nothing() -> None:
    c = cursor()
    assert c.on_ack(4, 0) is AckKind.ADVANCE
    assert c.on_ack(2, 1) is AckKind.STALE
    assert c.on_ack(4, 2) is AckKind.STALE
    assert c.acked == 4 and c.unacked == 6
    assert c.on_ack(11, 3) is AckKind.ABOVE_HIGH_WATER
    assert c.acked == 4


def test_ack_storage_is_coalesced() -> None:
    c = cursor(high_water=10_000)
    c.on_ack(1, 1000.0)
    assert c.ack_to_store(1000.0) is None
    c.on_ack(2, 1050.0)
    assert c.ack_to_store(1050.0) is None
    assert c.ack_to_store(1000.0 + ACK_STORE_AFTER_MS) == 2
    plan = _log(c).state.ack(2)
    assert plan is not None
    _log(c).state = plan.state
    c.on_stored(2)
    assert c.ack_to_store(5000.0) is None
    for seq in range(3, 3 + ACK_STORE_EVERY):
        c.on_ack(seq, 2000.0)
    assert c.ack_to_store(2000.0) == 2 + ACK_STORE_EVERY
    assert c.ack_to_store(2000.0, force=True) == 2 + ACK_STORE_EVERY


def test_ack_covering_done_is_stored_at_once_and_completes() -> None:
    c = cursor(high_water=5)
    log = _log(c)
    log.state = log.state.append(["done"])
    assert c.done_seq == 6 and c.high_water == 6
    c.on_ack(5, 0)
    assert c.ack_to_store(0) is None
    c.on_ack(6, 0)
    assert c.ack_to_store(0) == 6
    assert not c.completed
    plan = log.state.ack(6)
    assert plan is not None and plan.completed
    log.state = plan.state
    c.on_stored(6)
    assert c.completed and c.unacked == 0


def test_handshake_answers() -> None:
    assert cursor(stored=5, acked=5).on_answer(4).kind is AnswerKind.BEHIND
    verify = cursor(unverified_from=3).on_answer(7)
    assert verify.kind is AnswerKind.VERIFY and verify.replay_from == 8
    resume = cursor(acked=4, stored=4).on_answer(6)
    assert resume.kind is AnswerKind.RESUME and resume.replay_from == 7
    ahead = cursor(acked=4, stored=4).on_answer(11)
    assert ahead.kind is AnswerKind.AHEAD and ahead.replay_from == 5
    forgot = cursor(acked=8, stored=2).on_answer(5)
    assert forgot.kind is AnswerKind.FORGOT and forgot.replay_from == 6


def test_forgotten_acks_are_resent_without_moving_below_the_stored_cursor() -> None:
    c = cursor(acked=8, stored=2)
    c.on_forgot(5)
    assert c.acked == 5
    c.start_stream(6)
    assert c.next_to_write() == 6


def test_verification_shift_translates_provisional_seqs() -> None:
    # Rows 4..10 were logged before the first answer; the engine holds up to 20.
    c = cursor(high_water=10, acked=3, stored=3, unverified_from=4, done_seq=10)
    answer = c.on_answer(20)
    assert answer.kind is AnswerKind.VERIFY and answer.replay_from == 21
    plan = _log(c).state.verify(20)
    assert plan.shift_by == verification_shift(4, 20) == 17
    _log(c).state = plan.state
    c.on_verified(20, plan.shift_by)
    assert c.high_water == 27 and c.acked == 20 and c.stored == 20
    assert c.unverified_from is None
    assert c.done_seq == 27
    assert [c.translate(s) for s in (3, 4, 10, 11, 28)] == [3, 21, 27, 11, 28]


def test_writer_position_follows_replay_rewind_and_end() -> None:
    c = cursor(high_water=5, acked=2, stored=2)
    assert c.next_to_write() is None  # no stream
    c.start_stream(1)  # never below the received ack
    assert c.next_to_write() == 3
    c.on_written(3)
    c.on_written(4)
    assert c.next_to_write() == 5
    assert c.rewind() == 3
    assert c.next_to_write() == 3
    c.on_written(5)
    assert c.next_to_write() is None
    c.end_stream()
    assert c.next_to_write() is None and c.rewind() == 3


def test_an_ack_above_a_rewound_writer_moves_it_past_the_acked_rows() -> None:
    # Rewound to 3 while 3..4 were in flight; the engine then acks 4: the
    # writer goes on at 5, never asking the log for rows it may have deleted.
    c = cursor(high_water=6, acked=2, stored=2)
    c.start_stream(3)
    c.on_written(3)
    c.on_written(4)
    c.rewind()
    assert c.next_to_write() == 3
    c.on_ack(4, 0.0)
    assert c.next_to_write() == 5
    c.on_ack(3, 0.0)  # stale: nothing moves back
    assert c.next_to_write() == 5


# -- backoff ----------------------------------------------------------------------


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
    expected_rng = random.Random(42)
    got = [b.delay_ms(a, random.Random(42)) for a in range(1)]
    assert got == [100 + expected_rng.uniform(0, 250)]
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


def test_reconnect_attempt_resets_only_on_an_ack_of_a_row_written_here() -> None:
    p = ReconnectPolicy()
    delays: list[int] = []

    def record(attempt: int) -> float:
        delays.append(attempt)
        return 0.0

    p.next_delay_ms(0, record)  # first dial refused
    p.on_stream_up(100)
    p.on_ack(50)  # the handshake answer: nothing written yet
    p.next_delay_ms(200, record)  # dropped at once
    p.on_stream_up(300)
    p.on_written(51)
    p.on_ack(50)  # covers nothing written on this stream
    p.next_delay_ms(400, record)
    p.on_stream_up(500)
    p.on_written(51)
    p.on_ack(51)
    p.next_delay_ms(600, record)
    assert delays == [0, 1, 2, 0]


def test_reconnect_attempt_resets_after_a_stable_stream() -> None:
    p = ReconnectPolicy(attempt=5)
    p.on_stream_up(0)
    attempts: list[int] = []
    p.next_delay_ms(STABLE_STREAM_MS - 1, lambda a: attempts.append(a) or 0.0)
    p.on_stream_up(0)
    p.next_delay_ms(STABLE_STREAM_MS, lambda a: attempts.append(a) or 0.0)
    assert attempts == [5, 0]


def test_stream_end_classification() -> None:
    assert classify_end("FAILED_PRECONDITION", "run completed") is EndKind.RUN_COMPLETED
    for code in ("INTERNAL", "UNKNOWN", "UNAVAILABLE", "UNAUTHENTICATED", "CANCELLED", None):
        assert classify_end(code, "run completed" if code else "") is EndKind.RECONNECT
    assert classify_end("FAILED_PRECONDITION", "expected seq 4, got 9") is EndKind.RECONNECT
    assert is_too_many_pings("GOAWAY received; Error code: 11; Debug Text: too_many_pings")
    assert not is_too_many_pings("Socket closed")


def test_describe_end_names_a_status_grpc_aio_lost_to_a_write() -> None:
    assert describe_end("UNAUTHENTICATED", "unknown run") == "UNAUTHENTICATED: unknown run"
    lost = describe_end("INTERNAL", "Internal error from Core")
    assert lost.startswith("INTERNAL: Internal error from Core (")
    assert "grpc/grpc#36066" in lost
    # An engine's own INTERNAL with other details is reported as it is.
    assert describe_end("INTERNAL", "engine bug") == "INTERNAL: engine bug"
