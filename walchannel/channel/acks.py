"""Received acks: storing them in the log, coalesced, and giving disk back.

SPEC "The log": an ack deletes every row ``<= seq``; the channel may
coalesce acks (the cursor decides when: every 256 acks or ~100 ms, always at
close, at once for ``Done``). Once acks stop, the log is checkpointed and its
freed pages given back (docs/design.md, "Giving disk back").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from walchannel import _killpoints
from walchannel.channel.base import CHECKPOINT_IDLE_MS, ChannelBase, now_ms
from walchannel.errors import WalchannelError
from walchannel.files import file_size
from walchannel.protocol import ACK_STORE_AFTER_MS, AckKind

__all__ = [
    "CHECKPOINT_EVERY_MS",
    "CHECKPOINT_IDLE_MS",
    "CHECKPOINT_RETRY_MAX_MS",
    "CHECKPOINT_STEP_PAGES",
    "AckKeeper",
]

logger = logging.getLogger(__name__)

#: While acks keep being stored, an empty backlog is checkpointed at most this often (ms).
CHECKPOINT_EVERY_MS = 10_000
#: Retry delays of a checkpoint a reader held off: doubling up to this (ms).
CHECKPOINT_RETRY_MAX_MS = 30_000
#: Pages (4 KiB) given back per turn of the event loop: one 4 MiB chunk and its checkpoints.
CHECKPOINT_STEP_PAGES = 1024


class AckKeeper(ChannelBase):
    """The acks part of :class:`~walchannel.channel.GrpcEngineChannel`."""

    def _on_ack(self, seq: int) -> None:
        """Apply a received cumulative ``Ack(seq)`` (SPEC "Acks")."""
        kind = self._cursor.on_ack(seq, now_ms())
        if kind is AckKind.ABOVE_HIGH_WATER:
            self._protocol_error(
                f"Ack({seq}) is above the high-water {self._cursor.high_water}; not applied"
            )
            return
        self._reconnect.on_ack(seq)
        if kind is AckKind.ADVANCE:
            _killpoints.reached("after_ack_received")
            self._after_ack()

    def _after_ack(self) -> None:
        """The received ack moved: drop acked rows from the tail, store when due, wake waiters."""
        self._rows.drop_acked(self._cursor.acked)
        self._store_ack()
        self._acked_changed.set()
        self._check_held()

    def _store_ack(self, *, force: bool = False) -> None:
        """Store the received ack in the log now if it is due, else arm the timer.

        When is decided by :meth:`~walchannel.protocol.Cursor.ack_to_store`
        (every 256 acks or 100 ms, at once for ``Done``, ``force`` at close).
        """
        seq = self._cursor.ack_to_store(now_ms(), force=force)
        if seq is None:
            if self._cursor.pending_since_ms is not None and self._ack_timer is None:
                with contextlib.suppress(RuntimeError):
                    self._ack_timer = asyncio.get_running_loop().call_later(
                        ACK_STORE_AFTER_MS / 1000, self._ack_timer_fired
                    )
            return
        if not self._log.writable:
            return
        try:
            self._log.ack(seq)
        except WalchannelError as exc:
            # Not stored: the rows stay and are re-sent after a crash (harmless).
            logger.error("run %s: cannot store ack %d: %s", self._run_id, seq, exc)
            self._last_error = str(exc)
            return
        self._cursor.on_stored(seq)
        if self._cursor.completed:
            logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)
            self._acked_changed.set()
        self._maybe_checkpoint()

    def _ack_timer_fired(self) -> None:
        self._ack_timer = None
        self._store_ack()

    def _maybe_checkpoint(self) -> None:
        """Rows were deleted: give their pages back once idle (SPEC "The log")."""
        now = now_ms()
        self._last_stored_ms = now
        self._checkpoint_due = True
        self._checkpoint_delay_ms = CHECKPOINT_IDLE_MS
        if self._cursor.unacked == 0 and now - self._last_checkpoint_ms >= CHECKPOINT_EVERY_MS:
            self._checkpoint()
        else:
            self._arm_checkpoint(CHECKPOINT_IDLE_MS)

    def _arm_checkpoint(self, delay_ms: float) -> None:
        """Have the checkpoint timer fire in ``delay_ms`` at the latest."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        when = loop.time() + delay_ms / 1000
        timer = self._checkpoint_timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()  # a long retry wait; new acks bring it forward
        self._checkpoint_timer = loop.call_at(when, self._checkpoint_timer_fired)

    def _checkpoint_timer_fired(self) -> None:
        self._checkpoint_timer = None
        if not self._checkpoint_due or self._closed:
            return
        quiet_ms = now_ms() - self._last_stored_ms
        if quiet_ms < CHECKPOINT_IDLE_MS:
            self._arm_checkpoint(CHECKPOINT_IDLE_MS - quiet_ms)  # acks still coming
            return
        self._checkpoint()

    def _checkpoint(self) -> None:
        self._last_checkpoint_ms = now_ms()
        if not self._log.writable:
            return
        path = self._log.path
        before = file_size(path)
        if self._log.checkpoint(max_pages=CHECKPOINT_STEP_PAGES):
            self._checkpoint_due = False
            self._checkpoint_delay_ms = CHECKPOINT_IDLE_MS
            return
        if file_size(path) < before:
            # A step of a big reclaim: go on after letting the loop run.
            self._arm_checkpoint(0)
            return
        # A reader (inspect) held it off, or it failed: try again, less often.
        self._arm_checkpoint(self._checkpoint_delay_ms)
        self._checkpoint_delay_ms = min(2 * self._checkpoint_delay_ms, CHECKPOINT_RETRY_MAX_MS)
