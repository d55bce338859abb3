"""Received acks: storing them in the log, coalesced, and giving disk back.

SPEC "The log": an ack deletes every row ``<= seq``; the channel may
coalesce acks (the cursor decides when: every 256 acks or ~100 ms, always at
close, at once for ``Done``). Once acks stop, the log is checkpointed and its
freed pages given back (docs/design.md, "Giving disk back"; when:
:class:`walchannel.session.CheckpointPolicy`). This module does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from walchannel import _killpoints
from walchannel.channel.base import ChannelBase, now_ms
from walchannel.errors import WalchannelError
from walchannel.files import file_size
from walchannel.protocol import AckKind
from walchannel.session import ack_timer_ms

__all__ = ["CHECKPOINT_STEP_PAGES", "AckKeeper"]

logger = logging.getLogger(__name__)

#: Pages (4 KiB) given back per turn of the event loop: one 4 MiB chunk and its checkpoints.
CHECKPOINT_STEP_PAGES = 1024


class AckKeeper(ChannelBase):
    """The acks part of :class:`~walchannel.channel.GrpcEngineChannel`."""

    def _on_ack(self, seq: int, now: float | None = None) -> None:
        """Apply a received cumulative ``Ack(seq)`` (SPEC "Acks"); ``now`` in ms (``now_ms``)."""
        now = now_ms() if now is None else now
        kind = self._cursor.on_ack(seq, now)
        if kind is AckKind.ABOVE_HIGH_WATER:
            self._protocol_error(
                f"Ack({seq}) is above the high-water {self._cursor.high_water}; not applied"
            )
            return
        self._reconnect.on_ack(seq)
        if kind is AckKind.ADVANCE:
            _killpoints.reached("after_ack_received")
            self._after_ack(now)

    def _after_ack(self, now: float | None = None) -> None:
        """The received ack moved: drop acked rows from the tail, store when due, wake waiters.

        Waiters (``wait_acked``, ``send_done``) are woken only when the ack
        reaches the lowest seq one of them waits for (``_wake_at``).
        """
        acked = self._cursor.acked
        self._rows.drop_acked(acked)
        self._store_ack(now=now)
        if acked >= self._wake_at:
            self._acked_changed.set()
        if self._held is not None:
            self._check_held()

    def _store_ack(self, *, force: bool = False, now: float | None = None) -> None:
        """Store the received ack in the log now if it is due, else arm the timer.

        When is decided by :meth:`~walchannel.protocol.Cursor.ack_to_store`
        (every 256 acks or 100 ms, at once for ``Done``, ``force`` at close).
        ``now``: the time in ms (``now_ms``), when the caller has it.
        """
        seq = self._cursor.ack_to_store(now_ms() if now is None else now, force=force)
        if seq is None:
            delay_ms = ack_timer_ms(self._cursor, timer_armed=self._ack_timer is not None)
            if delay_ms is not None:
                with contextlib.suppress(RuntimeError):  # no running loop: stored at close
                    self._ack_timer = asyncio.get_running_loop().call_later(
                        delay_ms / 1000, self._ack_timer_fired
                    )
            return
        if not self._log.writable:
            return
        try:
            self._log.ack(seq)
        except WalchannelError as exc:
            # Not stored: the rows stay and are re-sent after a crash (harmless).
            # The error names the run, the ack and the file already.
            logger.error("%s; the acked rows stay until the next ack is stored", exc)
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
        """Rows were deleted: give their pages back once idle (SPEC "The log").

        When: :meth:`walchannel.session.CheckpointPolicy.on_rows_deleted`.
        """
        what = self._checkpoints.on_rows_deleted(now_ms(), unacked=self._cursor.unacked)
        if isinstance(what, str):
            self._checkpoint()
        else:
            self._arm_checkpoint(what)

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
        if self._closed:
            return
        what = self._checkpoints.on_timer(now_ms())
        if what is None:
            return
        if isinstance(what, str):
            self._checkpoint()
        else:
            self._arm_checkpoint(what)  # acks still coming

    def _checkpoint(self) -> None:
        """One checkpoint step (4 MiB given back at most); the policy says what next."""
        self._checkpoints.on_checkpoint(now_ms())
        if not self._log.writable:
            return
        path = self._log.path
        before = file_size(path)
        complete = self._log.checkpoint(max_pages=CHECKPOINT_STEP_PAGES)
        shrank = not complete and file_size(path) < before
        delay_ms = self._checkpoints.on_result(complete=complete, shrank=shrank)
        if delay_ms is not None:
            self._arm_checkpoint(delay_ms)
