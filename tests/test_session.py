"""The channel's decision layer (walchannel.session), tested directly: no gRPC, no loop, no disk."""

from __future__ import annotations

import pytest

from walchannel.log_state import LogState
from walchannel.protocol import ACK_STORE_AFTER_MS, Cursor, RefusalVerdict, SizeRefusal
from walchannel.session import (
    CHECKPOINT_EVERY_MS,
    CHECKPOINT_IDLE_MS,
    CHECKPOINT_RETRY_MAX_MS,
    KEEPALIVE_TIMEOUT_MS,
    MAX_KEEPALIVE_MS,
    AnswerStep,
    CheckpointPolicy,
    DownLatch,
    EndOutcome,
    VerdictKind,
    WriteCounter,
    ack_timer_ms,
    doubled_keepalive_ms,
    held_done_reached,
    plan_answer,
    plan_end,
    plan_run_completed,
    stream_verdict,
    unproven_refusal,
    watchdog_period_ms,
)


class StateHolder:
    """The cursor reads the log's facts from a ``state``, as from ``RunLog.state``."""

    def __init__(self, state: LogState) -> None:
        self.state = state


def cursor(
    high: int = 10, acked: int = 5, stored: int = 3, unverified: int | None = None
) -> Cursor:
    state = LogState("r", high + 1, stored, unverified, None, False)
    return Cursor(log=StateHolder(state), acked=max(acked, stored))


# -- the handshake answer --------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "step", "replay_from"),
    [
        (2, AnswerStep.FAIL_BEHIND, None),  # below the stored cursor (3)
        (4, AnswerStep.RESEND_FORGOTTEN, 5),  # below the received ack (5), not stored
        (5, AnswerStep.ACK, 6),
        (8, AnswerStep.ACK, 9),
        (10, AnswerStep.ACK, 11),
        (11, AnswerStep.PROTOCOL_ERROR, 6),  # above the high-water: replay from the cursor
    ],
)
def test_a_verified_logs_answer_maps_to_one_action(
    answer: int, step: AnswerStep, replay_from: int | None
) -> None:
    c = cursor()
    plan = plan_answer(c, answer, failed_mark=False)
    assert (plan.step, plan.replay_from) == (step, replay_from)
    assert (c.acked, c.stored, c.high_water) == (5, 3, 10)  # pure: nothing moved


@pytest.mark.parametrize("answer", [0, 3, 7, 10, 25])
def test_the_first_answer_since_open_verifies_and_replays_after_it(answer: int) -> None:
    # SPEC "Dial": rows at or above unverified_from move to h+1, h+2, ...;
    # the writer starts right after h either way.
    plan = plan_answer(cursor(stored=0, acked=0, unverified=4), answer, failed_mark=False)
    assert (plan.step, plan.replay_from) == (AnswerStep.VERIFY, answer + 1)


def test_behind_wins_over_verification() -> None:
    plan = plan_answer(cursor(stored=3, unverified=4), 2, failed_mark=True)
    assert plan.step is AnswerStep.FAIL_BEHIND and not plan.clear_failed_mark


@pytest.mark.parametrize("answer", [4, 5, 11])
def test_a_healthy_answer_clears_an_old_failed_mark(answer: int) -> None:
    assert plan_answer(cursor(), answer, failed_mark=True).clear_failed_mark
    assert not plan_answer(cursor(), answer, failed_mark=False).clear_failed_mark


def test_without_handshake_answers_the_writer_starts_at_the_cursor() -> None:
    plan = plan_answer(cursor(), None, failed_mark=True)
    assert (plan.step, plan.replay_from, plan.clear_failed_mark) == (
        AnswerStep.NO_ANSWER,
        6,
        False,
    )


# -- storing acks -----------------------------------------------------------------------


def test_an_unstored_ack_arms_one_timer_of_the_coalescing_window() -> None:
    c = cursor(acked=3, stored=3)
    assert ack_timer_ms(c, timer_armed=False) is None  # nothing pending
    c.on_ack(4, now_ms=1000.0)
    assert c.ack_to_store(1000.0) is None  # coalesced
    assert ack_timer_ms(c, timer_armed=False) == ACK_STORE_AFTER_MS
    assert ack_timer_ms(c, timer_armed=True) is None  # one timer at a time


def test_a_refused_done_stops_the_channel_once_the_rows_before_it_are_acked() -> None:
    c = cursor(high=10, acked=5, stored=5)
    assert not held_done_reached(c)  # no Done held
    c.hold_at = 8
    assert not held_done_reached(c)
    c.acked = 7
    assert held_done_reached(c)


# -- giving disk back -------------------------------------------------------------------


def test_checkpoints_wait_for_idle_unless_the_backlog_is_empty_and_it_has_been_a_while() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    assert policy.on_rows_deleted(100.0, unacked=0) == CHECKPOINT_IDLE_MS  # too soon
    assert policy.on_rows_deleted(200.0, unacked=5) == CHECKPOINT_IDLE_MS
    assert policy.on_rows_deleted(CHECKPOINT_EVERY_MS, unacked=5) == CHECKPOINT_IDLE_MS
    assert policy.on_rows_deleted(CHECKPOINT_EVERY_MS, unacked=0) == "now"


def test_the_idle_timer_waits_for_acks_to_stop() -> None:
    policy = CheckpointPolicy(now_ms=0.0)
    assert policy.on_timer(5000.0) is None  # nothing deleted: nothing to do
    policy.on_rows_deleted(1000.0, unacked=3)
    policy.on_rows_deleted(1600.0, unacked=3)  # acks still coming
    assert policy.on_timer(2000.0) == pytest.approx(600.0)
    assert policy.on_timer(2600.0) == "now"


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


# -- writes and streams -------------------------------------------------------------------


def test_a_write_at_or_below_the_highest_written_seq_is_a_replay() -> None:
    writes = WriteCounter()
    for seq in (1, 2, 3, 2, 3, 4):
        writes.on_written(seq)
    assert (writes.sent, writes.replayed, writes.max_written) == (6, 2, 4)
    assert writes.is_replay(4) and not writes.is_replay(5)


def test_every_stream_after_the_first_is_a_reconnect() -> None:
    writes = WriteCounter()
    writes.on_stream_up()
    assert writes.reconnects == 0
    writes.on_stream_up()
    writes.on_stream_up()
    assert (writes.streams_up, writes.reconnects) == (3, 2)


def test_the_watchdog_looks_four_times_per_bound_and_at_most_every_50_ms() -> None:
    assert watchdog_period_ms(None, 25_000) == 25_000 / 4
    assert watchdog_period_ms(2_000, 25_000) == 500
    assert watchdog_period_ms(None, 100) == 50


def verdict(now: float, **kw: object) -> object:
    args: dict[str, object] = {
        "last_down_ms": 0.0,
        "heartbeats_since_down": 0,
        "write_since_ms": None,
        "next_beat_ms": 1e18,
        "dead_stream_ms": 3_000.0,
        "keepalive_ms": 1_000.0,
    }
    args.update(kw)
    return stream_verdict(now, **args)  # type: ignore[arg-type]


def test_a_silent_stream_is_dead_only_while_heartbeats_go_out() -> None:
    assert verdict(2_999.0, heartbeats_since_down=2) is None
    dead = verdict(3_000.0, heartbeats_since_down=2)
    assert dead is not None and dead.kind is VerdictKind.DEAD  # type: ignore[attr-defined]
    # Idle and healthy (no heartbeat since the last down message): alive.
    assert verdict(60_000.0, heartbeats_since_down=0) is None
    # Without dead_stream_ms, silence alone is never death.
    assert verdict(60_000.0, heartbeats_since_down=5, dead_stream_ms=None) is None


def test_a_heartbeat_stuck_behind_a_blocked_write_counts_as_sent() -> None:
    dead = verdict(3_000.0, write_since_ms=500.0, next_beat_ms=2_000.0)
    assert dead is not None
    assert dead.kind is VerdictKind.DEAD and dead.beat_overdue  # type: ignore[attr-defined]
    assert verdict(3_000.0, write_since_ms=500.0, next_beat_ms=3_500.0) is None


def test_a_write_blocked_past_keepalive_plus_ten_seconds_with_no_down_message_is_stalled() -> None:
    stall = 1_000.0 + KEEPALIVE_TIMEOUT_MS
    args = {"dead_stream_ms": None, "next_beat_ms": 1e18}
    assert verdict(stall - 1, write_since_ms=0.0, **args) is None
    stalled = verdict(stall, write_since_ms=0.0, **args)
    assert stalled is not None and stalled.kind is VerdictKind.STALLED  # type: ignore[attr-defined]
    # A down message arrived meanwhile: the engine is alive, only slow.
    assert verdict(stall, write_since_ms=0.0, last_down_ms=stall - 100, **args) is None
    # Not in a write: never stalled.
    assert verdict(10 * stall, **args) is None


# -- how a stream ended ---------------------------------------------------------------


def test_too_many_pings_doubles_the_keepalive_up_to_five_minutes() -> None:
    assert doubled_keepalive_ms(25_000) == 50_000
    assert doubled_keepalive_ms(200_000) == MAX_KEEPALIVE_MS
    plan = plan_end("UNAVAILABLE", "Too many pings", "", final=False)
    assert plan.double_keepalive and plan.outcome is EndOutcome.RECONNECT
    plan = plan_end("UNAVAILABLE", "", 'GOAWAY "too_many_pings"', final=False)
    assert plan.double_keepalive


def test_run_completed_ends_the_loop_even_once_the_channel_is_over() -> None:
    for final in (False, True):
        plan = plan_end("FAILED_PRECONDITION", "run completed", "", final=final)
        assert plan.outcome is EndOutcome.RUN_COMPLETED
    assert plan_end("UNAVAILABLE", "x", "", final=True).outcome is EndOutcome.ALREADY_OVER


@pytest.mark.parametrize(
    ("done_seq", "acked", "tombstone", "undeliverable"),
    [
        (10, 3, True, True),  # our Done was applied, its ack lost: a tombstone
        (None, 3, False, True),  # rows that can never be delivered: marked failed
        (None, 10, False, False),  # nothing left: only the loop ends
    ],
)
def test_run_completed_makes_a_logged_done_a_tombstone_else_marks_what_is_left(
    done_seq: int | None, acked: int, tombstone: bool, undeliverable: bool
) -> None:
    # docs/design.md: "run completed" while Done is logged completes the log on the
    # engine's word; without Done, rows above the stored cursor are undeliverable.
    state = LogState("r", 11, acked, None, done_seq, False)
    plan = plan_run_completed(state)
    assert (plan.tombstone, plan.mark_undeliverable) == (tombstone, undeliverable)


def test_a_size_refusal_is_read_from_the_status_and_anything_else_reconnects() -> None:
    plan = plan_end(
        "RESOURCE_EXHAUSTED",
        "SERVER: Received message larger than max (900 vs. 500)",
        "",
        final=False,
    )
    assert plan.outcome is EndOutcome.SIZE_REFUSAL and plan.refusal == SizeRefusal(900, 500)
    for code, details in [
        ("RESOURCE_EXHAUSTED", "quota"),
        ("RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max (900 vs. 500)"),
        ("UNAUTHENTICATED", "who?"),
        ("INTERNAL", "RST_STREAM"),
        (None, ""),
    ]:
        plan = plan_end(code, details, "", final=False)
        assert plan.outcome is EndOutcome.RECONNECT and plan.refusal is None, (code, details)


def test_an_unproven_size_refusal_says_why_nothing_was_set_aside() -> None:
    refusal = SizeRefusal(received=900, limit=500)
    none = RefusalVerdict(None)
    assert unproven_refusal(none, refusal, handshake_size=900).startswith("it is the handshake")
    assert "no row written" in unproven_refusal(none, refusal, handshake_size=80)
    other = RefusalVerdict(None, suspect=7, suspect_size=800)
    assert unproven_refusal(other, refusal, handshake_size=900) == (
        "the first row over the limit, seq 7 (800 bytes), is not the refused 900-byte message"
    )


# -- repeats of down messages -----------------------------------------------------------


def test_stop_fires_once_and_decisions_are_kept_by_request_id() -> None:
    latch: DownLatch[str] = DownLatch()
    assert latch.on_stop() is True
    assert latch.on_stop() is False  # re-sent after a handshake
    assert latch.decision("r1") is None
    latch.on_decision("r1", "approved")
    latch.on_decision("r1", "approved")  # re-sent
    assert latch.decision("r1") == "approved" and list(latch.decided) == ["r1"]
