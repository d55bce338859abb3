"""When the unacked rows were committed (walchannel.core.ages): pure, no clock, no channel.

The oldest unacked row's age the metrics report is the driver's answer from
these marks (docs/operations.md "Monitoring"); the metric itself is tested
in tests/test_metrics.py.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from walchannel.core.ages import CommitAges


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=4),  # rows in the commit
            st.floats(min_value=0.0, max_value=3.0),  # seconds since the previous commit
            st.integers(min_value=0, max_value=6),  # rows acked (received) after it
            st.booleans(),  # the ack is stored too
        ),
        max_size=200,
    ),
    st.integers(min_value=2, max_value=16),
)
def test_commit_ages_err_old_by_under_two_resolutions(ops: list[Any], max_marks: int) -> None:
    tracker = CommitAges(resolution_s=0.5, max_marks=max_marks)
    committed: dict[int, float] = {}
    now, high, acked, stored = 1000.0, 0, 0, 0
    for rows, gap, ack, store in ops:
        now += gap
        tracker.committed(high + 1, now, stored)
        for seq in range(high + 1, high + rows + 1):
            committed[seq] = now
        high += rows
        acked = min(high, acked + ack)
        if store:
            stored = acked
        if acked < high:
            first = acked + 1
            at = tracker.oldest(first)
            assert at is not None
            # Never younger than the row; older by less than two resolutions.
            assert committed[first] - 2 * tracker.resolution_s < at <= committed[first]
        assert len(tracker) <= max_marks


def test_commit_ages_follow_a_verification_that_moves_the_rows() -> None:
    # Issue 60: the marks are in the log's numbering; a shift moves them with the rows.
    ages = CommitAges(resolution_s=0.1)
    ages.committed(1, 10.0, 0)  # rows 1.. (verified)
    ages.committed(4, 20.0, 0)  # rows 4.. handed out before the answer: unverified
    ages.committed(6, 30.0, 0)
    ages.shift(4, 8, 100)  # the engine already held seqs up to 103
    assert ages.oldest(3) == 10.0
    assert ages.oldest(104) == 20.0 and ages.oldest(105) == 20.0
    assert ages.oldest(106) == 30.0


def test_commit_ages_seed_puts_an_earlier_process_rows_below_the_marks() -> None:
    # BacklogDated: the rows a restart found unacked, dated from the log.
    ages = CommitAges(resolution_s=0.1)
    ages.committed(10, 50.0, 0)  # this process's first commit
    ages.seed([(1, 5.0), (4, 3.0), (7, 8.0), (10, 9.0), (12, 1.0)])
    # Below the first mark only; a point dated before the one below it (the
    # clock stepped back) takes the earlier point's date: the marks stay in order.
    assert ages.oldest(1) == 5.0
    assert ages.oldest(4) == 5.0 and ages.oldest(6) == 5.0
    assert ages.oldest(7) == 8.0 and ages.oldest(9) == 8.0
    assert ages.oldest(10) == 50.0 and ages.oldest(12) == 50.0
    assert len(ages) == 4


def test_commit_ages_seed_an_empty_tracker_and_know_nothing_below_it() -> None:
    ages = CommitAges(resolution_s=0.1)
    assert ages.oldest(1) is None
    ages.seed([(3, 2.0), (5, 4.0)])
    assert ages.oldest(2) is None  # no mark at or below it
    assert ages.oldest(3) == 2.0 and ages.oldest(9) == 4.0
    ages.committed(9, 10.0, 0)
    assert ages.oldest(8) == 4.0 and ages.oldest(9) == 10.0


def test_commit_ages_shift_moves_only_the_marks_inside_the_range() -> None:
    ages = CommitAges(resolution_s=0.1)
    for seq, t in ((1, 1.0), (3, 2.0), (5, 3.0), (7, 4.0)):
        ages.committed(seq, t, 0)
    # The unverified rows [3, 8) (a verification moves them all, up to the
    # end of the log) go up by 10; the verified rows below them stay.
    ages.shift(3, 8, 10)
    assert ages.oldest(2) == 1.0 and ages.oldest(12) == 1.0
    assert ages.oldest(13) == 2.0 and ages.oldest(15) == 3.0 and ages.oldest(17) == 4.0


def test_commit_ages_start_afresh_when_everything_before_is_stored() -> None:
    ages = CommitAges(resolution_s=0.1, max_marks=2)
    for i in range(6):
        ages.committed(i + 1, float(i), 0)  # coarsens: two marks at most
    assert ages.resolution_s > 0.1 and len(ages) <= 2
    ages.committed(7, 100.0, 6)  # rows 1..6 acked and stored
    assert ages.resolution_s == 0.1 and len(ages) == 1
    assert ages.oldest(7) == 100.0 and ages.oldest(6) is None
