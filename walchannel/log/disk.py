"""Giving disk back: checkpoints and incremental vacuum of a :class:`~walchannel.log.RunLog`.

Disk stays bounded by the unacked backlog, not by the run's length (SPEC
"The log"): pages freed by acks go back to the file system and the
``-wal`` is truncated, a chunk at a time, without holding off readers for
long. Only a log opened on its file (:meth:`RunLog.open
<walchannel.log.RunLog.open>`) has a disk to give back.
"""

from __future__ import annotations

import logging
import math
import sqlite3

from walchannel.log.base import LogBase

__all__ = ["BUSY_TIMEOUT_MS", "Disk", "JOURNAL_SIZE_LIMIT"]

logger = logging.getLogger(__name__)

# Keep the -wal file from staying large after a burst (bytes).
JOURNAL_SIZE_LIMIT = 4 * 1024 * 1024
BUSY_TIMEOUT_MS = 5000
# How long a checkpoint waits for readers to leave the -wal (ms): short, as
# it runs on the channel's event loop; a held-off checkpoint is retried.
# Litestream holds a read transaction for good: this bounds the stall.
_CHECKPOINT_BUSY_MS = 250


class Disk(LogBase):
    """The checkpoint that keeps the file small."""

    def checkpoint(self, *, max_pages: int | None = None) -> bool:
        """Checkpoint the WAL, give freed pages back to the file system, truncate the ``-wal``.

        Disk stays bounded by the unacked backlog, not by the run's length
        (SPEC "The log"). Pages freed by acks are released with ``PRAGMA
        incremental_vacuum``, a chunk the size of ``journal_size_limit`` at
        a time, each followed by a ``TRUNCATE`` checkpoint: the file shrinks
        as the chunks land and the ``-wal`` never grows past one chunk. A
        reader's snapshot (``walchannel inspect``) holds a checkpoint off;
        it waits for readers at most 250 ms and then stops, leaving the
        rest to the next call. Changes no data; errors are logged, never
        raised.

        Args:
            max_pages: give back at most this many pages (4 KiB each) in
                this call, so a caller on an event loop can spread a big
                reclaim over several calls; None: all of them.

        Returns:
            True when done: no free pages are left and the ``-wal`` is
            empty. False when ``max_pages`` were given back and more are
            left (the file has shrunk: call again), a reader held it off,
            an error stopped it, or the log is closed or not this
            process's (a forked child).

        Raises:
            ValueError: ``max_pages`` is below 1.
        """
        if self._closed or self._forked or self._lock is None:
            return False  # no file of its own (on_connection): nothing to give back
        if max_pages is not None and max_pages < 1:
            raise ValueError(f"max_pages must be >= 1 or None, got {max_pages!r}")
        budget = math.inf if max_pages is None else max_pages
        conn = self._conn
        try:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            chunk = max(1, JOURNAL_SIZE_LIMIT // page_size)
            # Our logs are made with auto_vacuum=INCREMENTAL (2); another
            # mode has no incremental_vacuum, only the -wal is truncated.
            reclaims = conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
            last_free: int | None = None
            conn.execute(f"PRAGMA busy_timeout = {_CHECKPOINT_BUSY_MS}")
            try:
                while True:
                    busy, wal_frames, copied = conn.execute(
                        "PRAGMA wal_checkpoint(TRUNCATE)"
                    ).fetchone()
                    if busy:
                        logger.debug(
                            "run %s: a reader holds off the checkpoint of %s (%d of %d frames"
                            " copied); retried later",
                            self._run_id,
                            self._path,
                            copied,
                            wal_frames,
                        )
                        return False
                    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                    if not free or not reclaims:
                        return True
                    if last_free is not None and free >= last_free:
                        logger.warning(
                            "run %s: incremental_vacuum freed nothing in %s (%d free pages)",
                            self._run_id,
                            self._path,
                            free,
                        )
                        return False
                    if budget <= 0:
                        return False
                    last_free = free
                    pages = int(min(free, chunk, budget))
                    budget -= pages
                    # Each step of incremental_vacuum frees one page, and
                    # execute() steps a statement once (it returns no
                    # columns); executescript() steps it to the end.
                    conn.executescript(f"PRAGMA incremental_vacuum({pages})")
            finally:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            logger.warning("run %s: checkpoint of %s failed: %s", self._run_id, self._path, exc)
            return False
