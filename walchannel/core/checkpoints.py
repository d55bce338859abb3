"""When to give the log's disk back: the checkpoint policy (pure; times in ms).

Rows deleted by stored acks leave free pages in the log file; the channel
checkpoints the log and returns them to the filesystem when this policy
says (``RunLog.checkpoint``). Decided from plain times, no I/O: the
channel arms the timers and runs the checkpoints. SPEC "The log";
docs/design.md.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CHECKPOINT_EVERY_MS",
    "CHECKPOINT_IDLE_MS",
    "CHECKPOINT_RETRY_MAX_MS",
    "CheckpointPolicy",
]

#: Quiet time after the last stored ack after which the log is checkpointed
#: and its freed pages given back (ms).
CHECKPOINT_IDLE_MS: Final = 1_000
#: While acks keep being stored, an empty backlog is checkpointed at most this often (ms).
CHECKPOINT_EVERY_MS: Final = 10_000
#: Retry delays of a checkpoint a reader held off: doubling up to this (ms).
CHECKPOINT_RETRY_MAX_MS: Final = 30_000


class CheckpointPolicy:
    """When to checkpoint the log and give its freed pages back (docs/design.md).

    Rows deleted by a stored ack leave free pages. Once acks stop for
    :data:`CHECKPOINT_IDLE_MS` the log is checkpointed, whatever is still
    unacked; while acks keep coming and the backlog is empty, at most every
    :data:`CHECKPOINT_EVERY_MS`. A big reclaim goes one chunk per turn of the
    event loop; a checkpoint a reader held off is retried, the delay
    doubling up to :data:`CHECKPOINT_RETRY_MAX_MS`; new acks bring it forward.

    :meth:`on_timer` and :meth:`on_result` return in how many ms to
    checkpoint (0: now), or None for nothing.

    Args:
        now_ms: the time of creation (ms).
    """

    def __init__(self, now_ms: float) -> None:
        self.last_stored_ms = 0.0
        self.last_checkpoint_ms = now_ms
        self.due = False
        self.retry_ms = float(CHECKPOINT_IDLE_MS)

    def on_rows_deleted(self, now_ms: float, *, unacked: int) -> bool:
        """An ack was stored (rows deleted): True to checkpoint now, False to arm the idle timer.

        The idle timer fires :data:`CHECKPOINT_IDLE_MS` later (:meth:`on_timer`).

        Args:
            now_ms: the time (ms).
            unacked: rows not covered by the received ack.
        """
        self.last_stored_ms = now_ms
        self.due = True
        self.retry_ms = float(CHECKPOINT_IDLE_MS)
        return unacked == 0 and now_ms - self.last_checkpoint_ms >= CHECKPOINT_EVERY_MS

    def on_timer(self, now_ms: float) -> float | None:
        """The timer fired: checkpoint now (0), wait longer (acks still coming), or nothing."""
        if not self.due:
            return None
        remaining = CHECKPOINT_IDLE_MS - (now_ms - self.last_stored_ms)
        # Less than a millisecond left is a float's rounding of "due now": a
        # timer armed for it could fire at the same clock reading, forever.
        return remaining if remaining >= 1.0 else 0.0

    def on_checkpoint(self, now_ms: float) -> None:
        """A checkpoint step starts now."""
        self.last_checkpoint_ms = now_ms

    def on_result(self, *, complete: bool, shrank: bool) -> float | None:
        """A checkpoint step ended: None when done, else the delay before the next step.

        Args:
            complete: no free page is left (the log gave everything back).
            shrank: the file got smaller (a step of a big reclaim): go on at once.
        """
        if complete:
            self.due = False
            self.retry_ms = float(CHECKPOINT_IDLE_MS)
            return None
        if shrank:
            return 0.0
        # A reader (inspect) held it off, or it failed: try again, less often.
        delay = self.retry_ms
        self.retry_ms = min(2 * self.retry_ms, float(CHECKPOINT_RETRY_MAX_MS))
        return delay
