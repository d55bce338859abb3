"""Opening a :class:`~walchannel.log.RunLog`: creating, locking, configuring and claiming the file.

:meth:`~Opening.open` takes the owner lock (:mod:`walchannel.lock`), removes
stale temporaries of an interrupted creation, builds a new log under a
temporary name and links it into place (so a crash never leaves a half-made
log), sets the pragmas (WAL mode, ``synchronous`` from the durability,
busy timeout, ``journal_size_limit``) and claims the log in one
transaction (owner, ``unverified_from``, optional meta columns an older
log lacks). :meth:`~Opening.on_connection` runs the same claim on a given
connection, without any of the file's parts. SPEC "The log".
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Final, Self

from walchannel import files
from walchannel.errors import WalCorruptError, WalLockedError, WalWriteError
from walchannel.lock import OwnerLock
from walchannel.log.base import CommitHook, Durability, LogBase
from walchannel.log.disk import BUSY_TIMEOUT_MS, JOURNAL_SIZE_LIMIT
from walchannel.log_format import (
    APPLICATION_ID,
    OPTIONAL_META_FIELDS,
    SCHEMA,
    SCHEMA_VERSION,
    RunMeta,
    check_header,
    read_meta,
)

__all__ = ["Opening", "SYNCHRONOUS"]

logger = logging.getLogger(__name__)

#: ``PRAGMA synchronous`` for each durability.
SYNCHRONOUS: Final = {"process": "NORMAL", "power": "FULL"}


class Opening(LogBase):
    """Opening a log: :meth:`open` (the file) and :meth:`on_connection` (the storage seam)."""

    @classmethod
    def open(
        cls,
        wal_dir: str | os.PathLike[str] | None,
        run_id: str,
        *,
        correlation_id: str,
        durability: Durability = "process",
    ) -> Self:
        """Create or re-open the log of ``run_id`` and take its owner lock.

        A new log is built under a temporary name (schema and meta
        committed), then linked into place, so a crash never leaves a
        half-made log; stale temporaries of this run are removed first.
        Completed logs (tombstones) open too: refusing them is the channel's
        job.

        Args:
            wal_dir: the log folder (None: the default, see
                :func:`walchannel.files.default_wal_dir`); created 0700.
            run_id: the run; must be a safe file name.
            correlation_id: stored; a different one on reopen is logged at
                WARNING and stored.
            durability: ``"process"`` (``synchronous=NORMAL``) or
                ``"power"`` (``synchronous=FULL``).

        Returns:
            The open log, owned by this process.

        Raises:
            ValueError: unsafe ``run_id``, empty ``correlation_id`` or
                unknown ``durability``; nothing is created.
            WalLockedError: another owner holds the log (names its pid).
            WalCorruptError: the file is a symlink, not a walchannel log,
                of a newer schema, another run's, or broken.
            WalWriteError: the folder or file cannot be created or written.
        """
        files.check_run_id(run_id)
        if not isinstance(correlation_id, str) or not correlation_id:
            raise ValueError("correlation_id must be a non-empty str")
        if durability not in SYNCHRONOUS:
            raise ValueError(f"durability must be 'process' or 'power', got {durability!r}")
        try:
            folder = files.ensure_wal_dir(wal_dir)
        except OSError as exc:
            raise WalWriteError(f"cannot create the log folder: {exc}", path=str(wal_dir)) from None
        path = files.log_path(folder, run_id)
        try:
            lock = OwnerLock.acquire(files.lock_path(path), log=path)
        except WalLockedError:
            raise
        except OSError as exc:
            raise WalWriteError(f"cannot take the owner lock: {exc}", path=str(path)) from None
        try:
            return cls._open_locked(path, lock, run_id, correlation_id, durability)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def on_connection(
        cls,
        conn: sqlite3.Connection,
        *,
        run_id: str,
        correlation_id: str,
        create: bool = False,
        commit_hook: CommitHook | None = None,
    ) -> Self:
        """Run the log's transactions on a given connection: the storage seam, without the file.

        No owner lock, no pragmas, no file modes, no fsync, no checkpoints:
        only the transactions (append, ack, verify, complete, meta and
        progress, reads), exactly as :meth:`open` runs them. For
        ``sqlite3.connect(":memory:", isolation_level=None)`` in tests and
        in ``tools/sim.py``, whose disk is this database serialized after
        every commit. Production opens logs with :meth:`open`.

        Args:
            conn: an autocommit connection (``isolation_level=None``).
            run_id: the run the database belongs to.
            correlation_id: stored, as in :meth:`open`.
            create: lay out a new log first (:meth:`initialize`).
            commit_hook: called around every commit (see :class:`CommitHook`).

        Raises:
            WalCorruptError: the database is not this run's log.
            WalWriteError: the open's own transaction (the claim) failed.
        """
        path = Path(":memory:")
        if create:
            cls.initialize(conn, run_id, correlation_id)
        check_header(conn, path, run_id)
        wal = cls(conn, path, None, read_meta(conn, path), "process", commit_hook)
        wal._claim(wal.meta(), correlation_id)
        return wal

    @staticmethod
    def initialize(conn: sqlite3.Connection, run_id: str, correlation_id: str) -> None:
        """Lay out a new log in an empty database: header, tables and meta, in one transaction.

        SPEC "The log" (the schema of :mod:`walchannel.log_format`). The
        file's own settings (WAL mode, synchronous) are :meth:`open`'s.

        Raises:
            sqlite3.Error: SQLite failed; nothing is committed.
        """
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in SCHEMA:
                conn.execute(statement)
            now = time.time()
            conn.execute(
                "INSERT INTO meta (id, schema_version, run_id, correlation_id,"
                " created_at, updated_at) VALUES (1, ?, ?, ?, ?, ?)",
                (SCHEMA_VERSION, run_id, correlation_id, now, now),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @classmethod
    def _open_locked(
        cls,
        path: Path,
        lock: OwnerLock,
        run_id: str,
        correlation_id: str,
        durability: Durability,
    ) -> Self:
        cls._remove_stale_temporaries(path)
        if path.is_symlink():
            raise WalCorruptError(str(path), "is a symbolic link; refusing to follow it")
        if not path.exists():
            cls._create(path, run_id, correlation_id)
        try:
            conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=rw", uri=True, isolation_level=None
            )
        except sqlite3.Error as exc:
            if not os.access(path, os.R_OK | os.W_OK):
                raise WalWriteError(
                    f"cannot open the log for writing (permission denied): {exc}", path=str(path)
                ) from None
            raise WalCorruptError(str(path), f"cannot open: {exc}") from None
        try:
            check_header(conn, path, run_id)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise WalCorruptError(str(path), f"cannot use WAL mode (journal_mode={mode})")
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
            conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            meta = read_meta(conn, path)
            wal = cls(conn, path, lock, meta, durability)
            wal._claim(meta, correlation_id)
            return wal
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise WalCorruptError(str(path), f"not a usable SQLite database: {exc}") from None
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _remove_stale_temporaries(path: Path) -> None:
        # Called with the owner lock held: no other opener is building this log.
        for candidate in path.parent.glob(f".{path.name}*"):
            if files.is_temporary_for(candidate, path):
                logger.info("removing stale temporary %s of an interrupted log creation", candidate)
                with contextlib.suppress(FileNotFoundError):
                    candidate.unlink()

    @staticmethod
    def _create(path: Path, run_id: str, correlation_id: str) -> None:
        tmp = files.temporary_path(path, f"{os.getpid()}-{secrets.token_hex(4)}")
        try:
            # Create the file 0600 ourselves (the umask cannot widen it);
            # SQLite gives its -wal and -shm the same mode.
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                # auto_vacuum must precede the first table; WAL mode is the file's.
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = FULL")
                Opening.initialize(conn, run_id, correlation_id)
            finally:
                conn.close()  # checkpoints and removes the temporary's -wal
            # link() fails if the name exists: a log is never clobbered.
            os.link(tmp, path)
            os.unlink(tmp)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except (OSError, sqlite3.Error) as exc:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            raise WalWriteError(f"cannot create the log: {exc}", path=str(path)) from None

    def _claim(self, meta: RunMeta, correlation_id: str) -> None:
        """Record the owner and ``unverified_from`` at open (one transaction)."""
        if meta.correlation_id != correlation_id:
            logger.warning(
                "run %s: correlation_id changed from %r to %r on reopen; storing the new one",
                self._run_id,
                meta.correlation_id,
                correlation_id,
            )
        owner = self._lock.owner if self._lock is not None else None
        params = (
            correlation_id,
            self._state.unverified_from,
            owner.pid if owner is not None else None,
            owner.host if owner is not None else None,
            time.time(),
        )
        present = {r[1] for r in self._conn.execute("PRAGMA table_info(meta)")}
        # A log made before an optional column existed gets it now (NULL).
        missing = sorted(OPTIONAL_META_FIELDS - present)

        def work(conn: sqlite3.Connection) -> None:
            for name in missing:
                conn.execute(f"ALTER TABLE meta ADD COLUMN {name} TEXT")
            conn.execute(
                "UPDATE meta SET correlation_id = ?, unverified_from = ?, owner_pid = ?,"
                " owner_host = ?, updated_at = ? WHERE id = 1",
                params,
            )

        self._commit("claim", "record the owner at open", work, single=not missing)
