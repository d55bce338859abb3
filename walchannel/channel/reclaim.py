"""Giving disk back: the checkpoint timer and its steps, one part of the channel.

SPEC "The log" (disk stays bounded by the unacked backlog; checkpoint and
reclaim freed pages, truncate the ``-wal`` when idle). When to checkpoint is
the driver's (its :class:`~walchannel.core.checkpoints.CheckpointPolicy`, a
decision without I/O, asked through ``Driver.handle``); :class:`DiskReclaim`
performs it on the event loop: it arms the timer the driver asks for and
runs :meth:`RunLog.checkpoint <walchannel.log.writer.RunLog.checkpoint>` one
chunk at a time, so a big reclaim never holds the loop (docs/design.md, "Giving disk back").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from walchannel.core import events as ev
from walchannel.log.files import file_size

if TYPE_CHECKING:
    from collections.abc import Callable

    from walchannel.clock import Clock
    from walchannel.log.writer import RunLog

__all__ = ["CHECKPOINT_STEP_PAGES", "DiskReclaim"]

#: Pages (4 KiB) given back per turn of the event loop: one 4 MiB chunk and its checkpoints.
CHECKPOINT_STEP_PAGES: Final = 1024


class DiskReclaim:
    """The pages of deleted rows given back once the channel is idle: the timer and the steps.

    Args:
        log: the run's open log (its :meth:`~walchannel.log.writer.RunLog.checkpoint`).
        clock: the monotonic clock the timer's events are stamped with (ms).
        feed: the executor's entry (``ConnectionLoop.feed``): the timer fires
            ``CheckpointTimerFired``, a step answers ``Checkpointed``.

    Timers run on the running event loop; without one (a call from another
    thread at teardown) nothing is armed, and the next stored ack or
    ``close()`` reclaims instead.
    """

    def __init__(self, log: RunLog, clock: Clock, feed: Callable[[ev.Event], None]) -> None:
        self._log = log
        self._clock = clock
        self._feed = feed
        self._timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        """Cancel the timer (the channel closes; ``RunLog.close`` checkpoints itself)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def arm(self, delay_ms: float) -> None:
        """Have the timer fire in ``delay_ms`` at the latest (an earlier one stands)."""
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
        self._feed(ev.CheckpointTimerFired(self._clock.monotonic_ms()))

    def step(self) -> None:
        """One checkpoint step (4 MiB given back at most); its result is fed back."""
        if not self._log.writable:
            return
        path = self._log.path
        before = file_size(path)
        complete = self._log.checkpoint(max_pages=CHECKPOINT_STEP_PAGES)
        shrank = not complete and file_size(path) < before
        self._feed(ev.Checkpointed(complete, shrank))
