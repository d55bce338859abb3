"""RunLog: the writer of a run's write-ahead log, SQLite in WAL mode with msgpack rows.

One database per run at ``<wal_dir>/<run_id>.wal.sqlite3`` (SPEC "The log");
its tables, header and row encoding are :mod:`walchannel.log_format`, which
the read-only tools share. This package holds the one writer, one class
built from parts: creating, locking and claiming the file
(:mod:`~walchannel.log.opening`), the transactions that append rows and
store acks and meta (:mod:`~walchannel.log.transactions`), the quarantine
of damaged rows (:mod:`~walchannel.log.quarantine`), the checkpoints that
keep the file small (:mod:`~walchannel.log.disk`), and their shared state
(:mod:`~walchannel.log.base`); the reads and closing are here. A row is
committed before a seq is handed out; an ack deletes every row ``<= seq``
and stores the cursor in one transaction; the ack that deletes the ``done``
row turns the log into a tombstone. The log knows nothing of gRPC.

Durability (https://sqlite.org/pragma.html#pragma_synchronous):
``"process"`` is ``synchronous=NORMAL`` — a commit survives the process
being killed, but a power loss may roll back the last commits (rows and
progress marker together); ``"power"`` is ``synchronous=FULL`` — a commit
survives power loss too. The folder must be on a local file system.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from typing import Self

from walchannel.errors import WalCorruptError
from walchannel.log.base import CommitHook, Durability
from walchannel.log.disk import Disk
from walchannel.log.opening import Opening
from walchannel.log.quarantine import Quarantine
from walchannel.log.transactions import WRITABLE_META as WRITABLE_META
from walchannel.log.transactions import Transactions
from walchannel.log_format import (
    APPLICATION_ID,
    ROW_LOST_TYPE,
    ROWS_AFTER,
    SCHEMA_VERSION,
    Row,
    RunMeta,
    decode_row,
    encode_body,
    quick_check,
)
from walchannel.log_format import check_header as check_header
from walchannel.log_format import read_meta as read_meta
from walchannel.log_format import row_lost_body as row_lost_body

# The format's names below were defined here before walchannel.log_format
# held them: they stay importable from this module.
__all__ = [
    "APPLICATION_ID",
    "CommitHook",
    "Durability",
    "ROW_LOST_TYPE",
    "Row",
    "RunLog",
    "RunMeta",
    "SCHEMA_VERSION",
    "decode_row",
    "encode_body",
]

_BATCH = 512


class RunLog(Opening, Transactions, Quarantine, Disk):
    """The write-ahead log of one run. Open it with :meth:`RunLog.open`.

    One owner at a time (an OFD lock on ``<log>.lock``); use it from one
    thread. Every write returns only once committed. Context manager:
    ``with RunLog.open(...) as wal: ...`` closes it.

    SPEC "The log".
    """

    # -- reads -------------------------------------------------------------

    def unacked(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Row]:
        """Yield the unacked rows above ``after_seq`` in seq order, a batch at a time.

        A row whose CRC, msgpack or kind does not check out is moved to the
        ``quarantine`` table, logged at ERROR, and comes out as its
        ``walchannel.row_lost`` substitute at the same seq (SPEC "The log").

        Args:
            after_seq: yield rows with ``seq > after_seq`` (and above the
                stored cursor).
            limit: stop after this many rows (None: all).

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: SQLite cannot read the rows.
        """
        self._check_open()
        cursor = self._state.read_after(after_seq)
        remaining = math.inf if limit is None else limit
        while remaining > 0:
            size = int(min(_BATCH, remaining))
            try:
                batch = self._conn.execute(ROWS_AFTER, (cursor, size)).fetchall()
            except sqlite3.DatabaseError as exc:
                raise WalCorruptError(str(self._path), f"cannot read rows: {exc}") from None
            for raw in batch:
                row, reason = decode_row(*raw)
                if reason is not None:
                    row = self._quarantine(raw, row, reason)
                yield row
            if len(batch) < size:
                return
            remaining -= len(batch)
            cursor = batch[-1][0]

    def unacked_bytes_above(self, seq: int) -> int:
        """:attr:`unacked_bytes` without the rows up to ``seq`` (bytes); reads only.

        For a caller that received an ack it has not stored yet (the channel
        coalesces acks, SPEC "The log"): the backlog as it counts it, with
        no write to the log.

        Args:
            seq: the received ack; at or below the stored cursor it changes
                nothing.

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: SQLite cannot read the rows.
        """
        total = self.unacked_bytes
        stored = self._state.last_acked
        if seq <= stored:
            return total
        self._check_open()
        try:
            gone = self._conn.execute(
                "SELECT coalesce(sum(length(body)), 0) FROM rows WHERE seq > ? AND seq <= ?",
                (stored, seq),
            ).fetchone()[0]
        except sqlite3.Error as exc:
            raise WalCorruptError(str(self._path), f"cannot read the rows' sizes: {exc}") from None
        return max(0, total - int(gone))

    def oldest_appended_at(self, after_seq: int = 0) -> float | None:
        """When the oldest unacked row above ``after_seq`` was committed; reads only.

        Unlike :meth:`unacked`, a damaged row is not quarantined here (that
        is a write): only its ``appended_at`` is read.

        Args:
            after_seq: look at rows with ``seq > after_seq`` (and above the
                stored cursor).

        Returns:
            Unix seconds, or None when there is no such row (or its time
            is not a number).

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: SQLite cannot read the rows.
        """
        self._check_open()
        try:
            row = self._conn.execute(
                "SELECT appended_at FROM rows WHERE seq > ? ORDER BY seq LIMIT 1",
                (self._state.read_after(after_seq),),
            ).fetchone()
        except sqlite3.Error as exc:
            raise WalCorruptError(str(self._path), f"cannot read rows: {exc}") from None
        if row is None or not isinstance(row[0], int | float):
            return None
        return float(row[0])

    def quick_check(self) -> list[str]:
        """Run ``PRAGMA quick_check`` (reads every page) and return its complaints.

        Returns:
            An empty list when the file is sound, else SQLite's messages.
        """
        self._check_open()
        try:
            return quick_check(self._conn)
        except sqlite3.DatabaseError as exc:
            return [str(exc)]

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """Checkpoint (see :meth:`checkpoint`), close the database and release the owner lock.

        Idempotent. In a forked child the parent's database handle is left
        alone.
        """
        if self._closed:
            return
        if not self._forked:
            self.checkpoint()
        self._closed = True
        if not self._forked:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"next_seq={self._state.next_seq}"
        return f"<RunLog run_id={self._run_id!r} {state} acked={self._state.last_acked}>"
