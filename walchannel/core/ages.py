"""When the unacked rows were committed, in bounded memory: the oldest one's age.

The driver keeps one :class:`CommitAges` (fed ``RowsCommitted`` and
``BacklogDated``) and answers the oldest unacked row's commit time from it
(``Driver.oldest_unacked_at``); the metrics read that answer (docs/operations.md
"Monitoring"). Its seqs are the log's own: a verification that moves the
log's unverified rows moves the marks with them (:meth:`CommitAges.shift`),
so no seq is ever mapped back. Times are any one clock, as values: nothing
here reads one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final

__all__ = ["BASE_RESOLUTION_S", "MAX_MARKS", "CommitAges"]

#: The marks' finest resolution (seconds) and how many marks a channel keeps.
BASE_RESOLUTION_S: Final = 0.1
MAX_MARKS: Final = 1024


class CommitAges:
    """Marks ``(seq, t)``: the rows from ``seq`` up to the next mark were committed at ``t``.

    Or later, by less than two :attr:`resolution_s`. A commit adds a mark
    only when the last is at least ``resolution_s`` old; with ``max_marks``
    marks the resolution doubles and close marks merge, so a commit costs a
    comparison and memory stays bounded.

    :meth:`committed`, :meth:`seed` and :meth:`shift` run on the channel's
    thread; :meth:`oldest` may run on a metrics reader's thread: it copies
    the marks (one C call, atomic under the GIL) and never changes them.

    Args:
        resolution_s: the finest resolution (seconds).
        max_marks: the most marks kept (at least 2).
    """

    def __init__(self, resolution_s: float = BASE_RESOLUTION_S, max_marks: int = MAX_MARKS) -> None:
        self._marks: deque[tuple[int, float]] = deque()
        self._base = resolution_s
        self._max = max(2, max_marks)
        #: The current resolution (seconds).
        self.resolution_s = resolution_s

    def __len__(self) -> int:
        return len(self._marks)

    def committed(self, first_seq: int, now: float, stored: int) -> None:
        """Rows from ``first_seq`` were committed at ``now``; ``stored``: the stored ack."""
        marks = self._marks
        if marks and now - marks[-1][1] < self.resolution_s:
            return  # the last mark covers these rows (the common case: one check)
        if stored + 1 >= first_seq:
            # Everything committed before is acked and stored: start afresh.
            if marks:
                marks.clear()
                self.resolution_s = self._base
        else:
            while len(marks) > 1 and marks[1][0] <= stored + 1:
                marks.popleft()
        if len(marks) >= self._max:
            self._coarsen()
        self._marks.append((first_seq, now))

    def _coarsen(self) -> None:
        marks = self._marks
        while len(marks) > self._max // 2:
            self.resolution_s *= 2
            kept: deque[tuple[int, float]] = deque([marks[0]])
            for mark in marks:
                if mark[1] - kept[-1][1] >= self.resolution_s:
                    kept.append(mark)
            marks = kept
        # A new deque, not changed in place: a reader may be copying the old one.
        self._marks = marks

    def seed(self, points: Iterable[tuple[int, float]]) -> None:
        """Put ``(seq, t)`` points below every mark (the rows of an earlier process)."""
        marks = self._marks
        first = marks[0][0] if marks else None
        kept: list[tuple[int, float]] = []
        for seq, t in points:
            if first is not None and seq >= first:
                break
            if kept and t < kept[-1][1]:
                t = kept[-1][1]  # a clock stepped back: keep the marks in time order
            kept.append((seq, t))
        self._marks = deque([*kept, *marks])

    def shift(self, first: int, end: int, by: int) -> None:
        """The log moved its rows ``[first, end)`` up by ``by`` (a verification): follow them."""
        self._marks = deque((s + by if first <= s < end else s, t) for s, t in self._marks)

    def oldest(self, first_unacked: int) -> float | None:
        """When row ``first_unacked`` was committed (at the latest); None if not known."""
        best: float | None = None
        for seq, t in tuple(self._marks):
            if seq > first_unacked:
                break
            best = t
        return best
