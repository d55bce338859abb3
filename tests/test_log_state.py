"""LogState (walchannel.log.state), tested directly on plain values: no SQLite, no clock.

The checks the mutation run (``make mutation``, docs/mutation-survivors.md)
found missing; the rules' wider tests are in tests/test_driver.py and
tests/test_log.py.
"""

from __future__ import annotations

import pytest

from walchannel.errors import ChannelClosedError, RunCompletedError
from walchannel.log.state import (
    COMPLETED_BY_ANOTHER,
    FAILED_UNDELIVERABLE,
    MAX_SEQ,
    AckPlan,
    LogState,
    completed_by_another,
    fenced_reason,
    impossible_answer,
    refused_at_open,
)

RUN = "run-7"


def _state(
    next_seq: int = 6,
    last_acked: int = 2,
    unverified_from: int | None = None,
    done_seq: int | None = None,
    completed: bool = False,
) -> LogState:
    return LogState(RUN, next_seq, last_acked, unverified_from, done_seq, completed)


def _append_error(state: LogState, kinds: list[str]) -> str:
    with pytest.raises((ValueError, ChannelClosedError, RunCompletedError)) as caught:
        state.append(kinds)
    return str(caught.value)


# -- every state a transition makes still names its run ---------------------------------


def test_every_transition_keeps_the_run_id_for_the_errors_that_name_it() -> None:
    opened = LogState.at_open(
        RUN,
        high_water=5,
        last_acked=2,
        stored_unverified=None,
        completed=False,
        top_seq=5,
        top_is_done=False,
    )
    plan = _state().ack(4)
    assert plan is not None
    verified = _state(unverified_from=4).verify(5)
    made = {
        "at_open": opened,
        "append": _state().append(["event"]),
        "follow_disk": _state().follow_disk(
            high_water=9,
            last_acked=2,
            unverified_from=None,
            completed=False,
            top_seq=9,
            top_is_done=False,
        ),
        "ack": plan.state,
        "verify": verified.state,
        "row_replaced": _state(done_seq=5).row_replaced(5),
    }
    for how, state in made.items():
        assert state.run_id == RUN, how
        assert _append_error(state, ["bogus"]) == f"run {RUN}: unknown row kind 'bogus'", how
    completed = _state(done_seq=5).complete_by_engine()
    assert completed.run_id == RUN
    assert _append_error(completed, ["event"]) == f"run {RUN}: completed (its Done was acked)"


def test_the_refusals_of_an_append_name_the_run_and_the_done_seq() -> None:
    assert _append_error(_state(completed=True), ["event"]) == (
        f"run {RUN}: completed (its Done was acked)"
    )
    assert _append_error(_state(done_seq=5), ["event"]) == (
        f"run {RUN}: Done is logged at seq 5; no new rows"
    )
    assert _append_error(_state(), ["finding", "done", "event"]) == (
        f"run {RUN}: rows after Done (seq 7) are refused"
    )


# -- a failed commit whose rows may have landed ------------------------------------------


def _disk(state: LogState, top_seq: int | None, **meta: object) -> LogState:
    fields: dict[str, object] = {
        "high_water": 0 if top_seq is None else top_seq,
        "last_acked": state.last_acked,
        "unverified_from": state.unverified_from,
        "completed": False,
        "top_seq": top_seq,
        "top_is_done": False,
    }
    fields.update(meta)
    return state.follow_disk(**fields)  # type: ignore[arg-type]


def test_a_failed_commit_never_hands_out_a_seq_sqlite_holds() -> None:
    state = _state(next_seq=6, last_acked=2, unverified_from=4, done_seq=None)
    # The disk's top below the next seq: the commit left nothing; the next
    # seq never goes back (a seq handed out once is not handed out again).
    assert _disk(state, None, high_water=5) == state
    assert _disk(state, 5) == state
    assert _disk(state, 3, high_water=3) == state
    # At or above it: the rows landed after all; the next seq passes them.
    assert _disk(state, 6) == LogState(RUN, 7, 2, 4, None, False)
    assert _disk(state, 9) == LogState(RUN, 10, 2, 4, None, False)
    # A stored high-water above the rows (acked and deleted) counts too.
    assert _disk(state, None, high_water=11, last_acked=11) == LogState(RUN, 12, 11, 4, None, False)


def test_a_failed_commit_takes_the_disks_word_for_every_other_fact() -> None:
    state = _state(next_seq=6, last_acked=0, unverified_from=None, done_seq=None)
    # A Done that landed is held; one the engine acked (completed) is not.
    assert _disk(state, 6, top_is_done=True) == LogState(RUN, 7, 0, None, 6, False)
    assert _disk(state, 6, top_is_done=True, completed=True) == LogState(
        RUN, 7, 0, None, None, True
    )
    # The cursor and unverified_from are the stored ones (a verification
    # that landed cleared it; one that did not keeps it).
    assert _disk(state, 6, last_acked=3, unverified_from=2) == LogState(RUN, 7, 3, 2, None, False)
    verifying = _state(next_seq=6, last_acked=0, unverified_from=1)
    assert _disk(verifying, 12, high_water=12, unverified_from=None) == LogState(
        RUN, 13, 0, None, None, False
    )


# -- acks ---------------------------------------------------------------------------------


def test_an_ack_at_or_below_the_cursor_plans_nothing() -> None:
    state = _state(next_seq=6, last_acked=2)
    assert state.ack(2) is None
    assert state.ack(1) is None
    assert _state(next_seq=6, last_acked=5, done_seq=5, completed=True).ack(5) is None


def test_an_ordinary_ack_moves_no_row_and_keeps_the_log_unverified() -> None:
    # Acks before any answered handshake (engine_acks_handshake=False): the
    # log stays unverified, in memory as on disk, and nothing is shifted.
    state = _state(next_seq=6, last_acked=0, unverified_from=3)
    assert state.ack(4) == AckPlan(
        state=LogState(RUN, 6, 4, 3, None, False),
        shift_from=None,
        shift_by=0,
        delete_through=4,
        high_water=5,
        clear_unverified=False,
        completed=False,
        advanced=True,
    )
    assert _state(next_seq=6, last_acked=0, unverified_from=1).ack(1) == AckPlan(
        state=LogState(RUN, 6, 1, 1, None, False),
        shift_from=None,
        shift_by=0,
        delete_through=1,
        high_water=5,
        clear_unverified=False,
        completed=False,
        advanced=True,
    )


# -- verification --------------------------------------------------------------------------


@pytest.mark.parametrize(("done", "moved_to"), [(3, 6), (4, 7)])
def test_a_verification_shift_moves_a_done_among_the_unverified_rows(
    done: int, moved_to: int
) -> None:
    # Rows 3.. are unverified; the engine answers 5: they move by 3. The Done
    # row moves with them, the first unverified row as well as a later one.
    state = _state(next_seq=done + 1, last_acked=0, unverified_from=3, done_seq=done)
    plan = state.verify(5)
    assert plan.shift_by == 3
    assert plan.shift_from == 3
    assert plan.state.done_seq == moved_to
    assert plan.state.next_seq == moved_to + 1
    assert not plan.completed
    assert plan.state.completed is False


# -- the engine's "run completed"; a replaced row -------------------------------------------


def test_run_completed_by_the_engine_keeps_the_cursor_and_the_seqs() -> None:
    state = _state(next_seq=9, last_acked=3, unverified_from=7, done_seq=8)
    assert state.complete_by_engine() == LogState(RUN, 9, 3, 7, None, True)
    assert _state(next_seq=4, last_acked=0, done_seq=3).complete_by_engine() == (
        LogState(RUN, 4, 0, None, None, True)
    )


def test_replacing_the_done_row_forgets_the_done_and_no_other_row_does() -> None:
    state = _state(next_seq=9, last_acked=3, unverified_from=7, done_seq=8)
    assert state.row_replaced(8) == LogState(RUN, 9, 3, 7, None, False)
    assert state.row_replaced(5) is state
    assert _state(done_seq=None).row_replaced(5) == _state(done_seq=None)


# -- a fenced log's cause, read back (walchannel takeover, inspect) ------------------------


@pytest.mark.parametrize("writer", ["w-1a2b", "0f3c9e.7:x_y"])
def test_the_writer_that_completed_the_run_is_read_back_from_the_fenced_reason(
    writer: str,
) -> None:
    said = f"{COMPLETED_BY_ANOTHER.format(writer=writer)}, while 2 row(s) of this writer"
    assert completed_by_another(fenced_reason(said)) == writer


@pytest.mark.parametrize(
    "reason",
    [
        None,
        fenced_reason("the engine refused it: owned by another writer: run r is owned by w"),
        # The phrase outside a fenced reason (a last error quoted elsewhere) is no cause.
        "engine behind: " + COMPLETED_BY_ANOTHER.format(writer="w-1"),
    ],
)
def test_other_reasons_name_no_completing_writer(reason: str | None) -> None:
    assert completed_by_another(reason) is None


# -- what the log says: refusals at open and impossible answers (mutation survivors) ----------


def test_a_fenced_log_is_refused_at_open_until_it_is_marked_to_take_over() -> None:
    fenced = fenced_reason("the engine refused it: writer fenced")
    assert refused_at_open(fenced, False) is True
    assert refused_at_open(fenced, True) is False
    assert refused_at_open(None, False) is False
    assert refused_at_open(FAILED_UNDELIVERABLE, False) is False


def test_an_answer_past_sqlites_range_says_so_in_full_and_the_largest_seq_is_not() -> None:
    too_big = MAX_SEQ + 1
    assert impossible_answer(too_big, unverified_from=None, high_water=10) == (
        "handshake answer Ack(9223372036854775808) is past 2**63 - 1, the largest seq SQLite holds"
    )
    # MAX_SEQ itself is a seq SQLite holds: a verified log's answer of it is possible.
    assert impossible_answer(MAX_SEQ, unverified_from=None, high_water=10) is None
    # Rows 10 on moved up to MAX_SEQ itself leave no seq for the next row.
    assert impossible_answer(MAX_SEQ - 1, unverified_from=10, high_water=10) == (
        "handshake answer Ack(9223372036854775806) would move the unverified rows (seq 10 on) "
        "by 9223372036854775797, up to seq 9223372036854775807: no seq would be left below "
        "2**63 - 1, the largest seq SQLite holds"
    )
