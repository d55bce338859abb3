"""Giving disk back: the checkpoint timer and its steps, one part of the channel.

SPEC "The log" (disk stays bounded by the unacked backlog; checkpoint and
reclaim freed pages, truncate the ``-wal`` when idle). When to checkpoint is
the driver's :class:`~walchannel.core.checkpoints.CheckpointPolicy`, a decision
without I/O; :class:`DiskReclaim` carries it out on the event loop: it arms
the timer the policy asks for and runs :meth:`RunLog.checkpoint
<walchannel.log.writer.RunLog.checkpoint>` one chunk at a time, so a big reclaim
never holds the loop (docs/design.md, "Giving disk back").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from walchannel.core.checkpoints import CHECKPOINT_IDLE_MS
from walchannel.log.files import file_size

if TYPE_CHECKING:
    from walchannel.clock import Clock
    from walchannel.core.driver import Driver
    from walchannel.log.writer import RunLog

__all__ = ["CHECKPOINT_STEP_PAGES", "DiskReclaim"]

#: Pages (4 KiB) given back per turn of the event loop: one 4 MiB chunk and its checkpoints.
CHECKPOINT_STEP_PAGES: Final = 1024


class DiskReclaim:
    """The pages of deleted rows given back once the channel is idle.

    Args:
        log: the run's open log (its :meth:`~walchannel.log.writer.RunLog.checkpoint`).
        driver: the run's driver: its ``checkpoints`` policy, ``unacked``
            and ``closed`` (a closed channel arms nothing).
        clock: the monotonic clock the policy's times are read from (ms).

    Timers run on the running event loop; without one (a call from another
    thread at teardown) nothing is armed, and the next stored ack or
    ``close()`` reclaims instead.
    """

    def __init__(self, log: RunLog, driver: Driver, clock: Clock) -> None:
        self._log = log
        self._driver = driver
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None

    def rows_deleted(self) -> None:
        """Rows were deleted (a stored ack): checkpoint now, or arm the idle timer."""
        driver = self._driver
        if driver.checkpoints.on_rows_deleted(self._clock.monotonic_ms(), unacked=driver.unacked):
            self._step()
        else:
            self._arm(CHECKPOINT_IDLE_MS)

    def cancel(self) -> None:
        """Cancel the timer (the channel closes; ``RunLog.close`` checkpoints itself)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, delay_ms: float) -> None:
        """Have the timer fire in ``delay_ms`` at the latest."""
        if self._driver.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        when = loop.time() + delay_ms / 1000
        timer = self._timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()  # a long retry wait; new acks bring it forward
        self._timer = loop.call_at(when, self._fired)

    def _fired(self) -> None:
        self._timer = None
        if self._driver.closed:
            return
        delay = self._driver.checkpoints.on_timer(self._clock.monotonic_ms())
        if delay is None:
            return
        if delay > 0:
            self._arm(delay)  # acks still coming
        else:
            self._step()

    def _step(self) -> None:
        """One checkpoint step (4 MiB given back at most); the policy says what next."""
        policy = self._driver.checkpoints
        policy.on_checkpoint(self._clock.monotonic_ms())
        if not self._log.writable:
            return
        path = self._log.path
        before = file_size(path)
        complete = self._log.checkpoint(max_pages=CHECKPOINT_STEP_PAGES)
        shrank = not complete and file_size(path) < before
        delay = policy.on_result(complete=complete, shrank=shrank)
        if delay is not None:
            self._arm(delay)
