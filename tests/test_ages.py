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
