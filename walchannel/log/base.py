"""What every part of :class:`~walchannel.log.RunLog` shares: its state and the one way it commits.

``RunLog`` is one class built from parts, each in its own module: opening,
creating and claiming the file (:mod:`~walchannel.log.opening`), the
transactions (:mod:`~walchannel.log.transactions`), the quarantine
(:mod:`~walchannel.log.quarantine`), giving disk back
(:mod:`~walchannel.log.disk`), and the reads and closing in
:mod:`walchannel.log`. This base holds what they share: the connection,
the owner lock, the :class:`~walchannel.log_state.LogState` (built at
open), the read-only properties, the open/writable checks and
:meth:`LogBase._commit`, the one way the log writes.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from walchannel.errors import ChannelClosedError, WalCorruptError, WalLockedError, WalWriteError
from walchannel.lock import OwnerLock
from walchannel.log_format import RunMeta, read_meta
from walchannel.log_state import LogState

__all__ = ["CommitHook", "Durability", "LogBase"]

logger = logging.getLogger(__name__)

Durability = Literal["process", "power"]

_T = TypeVar("_T")


class CommitHook(Protocol):
    """Watches every transaction of a :class:`RunLog` opened with :meth:`RunLog.on_connection`.

    ``tools/sim.py`` plugs one in to model its disk: ``before_commit`` may
    raise ``sqlite3.Error`` (a full disk: the transaction rolls back and the
    caller gets ``WalWriteError``, as in production) or kill the simulated
    process; ``after_commit`` snapshots the committed database. ``what``
    names the transaction: ``claim``, ``append``, ``ack``, ``verify``,
    ``complete``, ``meta``, ``quarantine`` or ``set_aside``.
    """

    def before_commit(self, what: str) -> None:
        """Called inside the transaction, just before ``COMMIT``."""

    def after_commit(self, what: str) -> None:
        """Called once the transaction committed."""


class LogBase:
    """The state of a :class:`~walchannel.log.RunLog` and its commit path (see the module doc)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        lock: OwnerLock | None,
        meta: RunMeta,
        durability: Durability,
        hook: CommitHook | None = None,
    ) -> None:
        self._conn = conn
        self._path = path
        self._lock = lock
        self._hook = hook
        self._durability = durability
        self._run_id = meta.run_id
        self._progress = meta.progress
        top = conn.execute("SELECT seq, kind FROM rows ORDER BY seq DESC LIMIT 1").fetchone()
        # Every decision about seqs, acks and completion is the state's.
        self._state = LogState.at_open(
            meta.run_id,
            high_water=meta.high_water,
            last_acked=meta.last_acked_seq,
            stored_unverified=meta.unverified_from,
            completed=meta.completed_at is not None,
            top_seq=top[0] if top else None,
            top_is_done=bool(top) and top[1] == "done",
        )
        self._unacked_bytes: int | None = None
        self._quarantined = int(conn.execute("SELECT count(*) FROM quarantine").fetchone()[0])
        self._closed = False

    # -- state -------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The log file, ``<wal_dir>/<run_id>.wal.sqlite3``."""
        return self._path

    @property
    def run_id(self) -> str:
        """The run this log belongs to."""
        return self._run_id

    @property
    def durability(self) -> Durability:
        """``"process"`` or ``"power"`` (see the module doc)."""
        return self._durability

    @property
    def state(self) -> LogState:
        """What the log has decided (seqs, cursor, verification, completion), as a value.

        Its one owner; ``protocol.Cursor`` reads it instead of keeping copies.
        """
        return self._state

    @property
    def last_acked_seq(self) -> int:
        """The stored ack cursor: every seq ``<=`` it is deleted."""
        return self._state.last_acked

    @property
    def next_seq(self) -> int:
        """The seq the next committed row gets."""
        return self._state.next_seq

    @property
    def high_water(self) -> int:
        """The highest seq ever used by this log (0 for a new one)."""
        return self._state.next_seq - 1

    @property
    def unverified_from(self) -> int | None:
        """Rows at or above it were never written after an answered handshake.

        None once the first answered handshake verified them.
        """
        return self._state.unverified_from

    @property
    def unacked_count(self) -> int:
        """Rows not yet covered by the stored cursor (from seqs, not a scan); 0 for a tombstone."""
        return self._state.unacked_count

    @property
    def unacked_bytes(self) -> int:
        """Total msgpack size of the unacked rows (bytes).

        Summed from disk on first use, then kept current in memory.

        Raises:
            ChannelClosedError: the log is closed (and the sum not yet known).
            WalCorruptError: SQLite cannot read the rows.
        """
        if self._unacked_bytes is None:
            self._check_open()
            try:
                total = self._conn.execute(
                    "SELECT coalesce(sum(length(body)), 0) FROM rows WHERE seq > ?",
                    (self._state.last_acked,),
                ).fetchone()[0]
            except sqlite3.Error as exc:
                raise WalCorruptError(
                    str(self._path), f"cannot read the rows' sizes: {exc}"
                ) from None
            self._unacked_bytes = int(total)
        return self._unacked_bytes

    @property
    def progress(self) -> dict[str, Any] | None:
        """The last committed harness progress marker (None for a new run)."""
        return self._progress

    @property
    def completed(self) -> bool:
        """True once the ack covering the ``done`` row was stored (a tombstone)."""
        return self._state.completed

    @property
    def done_seq(self) -> int | None:
        """The seq of the unacked ``done`` row, if one is logged."""
        return self._state.done_seq

    @property
    def quarantined_count(self) -> int:
        """How many rows the ``quarantine`` table holds (damaged or set aside)."""
        return self._quarantined

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    @property
    def writable(self) -> bool:
        """True while open and owned by this process (False in a forked child)."""
        return not self._closed and not self._forked

    @property
    def _forked(self) -> bool:
        return self._lock is not None and self._lock.forked

    @property
    def unacked_bytes_known(self) -> int | None:
        """:attr:`unacked_bytes` when it is already in memory, else None.

        Never touches SQLite, so a metrics reader on another thread may read it.
        """
        return self._unacked_bytes

    def meta(self) -> RunMeta:
        """Return the meta row as stored now.

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: the meta row cannot be read.
        """
        self._check_open()
        try:
            return read_meta(self._conn, self._path)
        except sqlite3.DatabaseError as exc:
            raise WalCorruptError(str(self._path), f"cannot read meta: {exc}") from None

    # -- the commit path ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: the log {self._path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._lock is not None and self._lock.forked:
            raise WalLockedError(
                f"{self._path}: this process is a forked child of the log's owner "
                f"({self._lock.owner.describe()}); it may not write",
                path=str(self._path),
                pid=self._lock.owner.pid,
                host=self._lock.owner.host,
            )

    def _commit(
        self,
        label: str,
        what: str | Callable[[], str],
        work: Callable[[sqlite3.Connection], _T],
        *,
        single: bool = False,
    ) -> _T:
        """Run ``work`` in one transaction and commit it; the one way the log writes.

        ``what`` names the transaction in an error ("cannot <what>"); a
        callable is only called then (the append path formats nothing when
        it succeeds). ``single``: ``work`` is one statement, run in
        autocommit mode (its own transaction) when no :class:`CommitHook`
        watches.

        Raises:
            WalWriteError: SQLite failed; the transaction is rolled back.
        """
        conn = self._conn
        hook = self._hook
        try:
            if single and hook is None:
                return work(conn)
            conn.execute("BEGIN IMMEDIATE")
            result = work(conn)
            if hook is not None:
                hook.before_commit(label)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail_transaction(exc, what if isinstance(what, str) else what()) from None
        if hook is not None:
            hook.after_commit(label)
        return result

    def _fail_transaction(self, exc: sqlite3.Error, what: str) -> WalWriteError:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
        self._resync_next_seq()
        return WalWriteError(
            f"run {self._run_id}: cannot {what} in {self._path}: {exc}", path=str(self._path)
        )

    def _resync_next_seq(self) -> None:
        # A failed commit may, on an I/O error after the commit frame reached
        # the WAL, still have landed: never hand out a seq the disk holds.
        try:
            top = self._conn.execute("SELECT max(seq) FROM rows").fetchone()[0]
        except sqlite3.Error:
            return
        state = self._state.after_failed_commit(top)
        if state is not self._state:
            logger.error(
                "run %s: a failed commit landed rows up to seq %d; continuing after it",
                self._run_id,
                top,
            )
            self._state = state
            self._unacked_bytes = None
