"""RunLog: the writer of a run's write-ahead log, SQLite in WAL mode with msgpack rows.

One database per run at ``<wal_dir>/<run_id>.wal.sqlite3`` (SPEC "The log");
its tables, header and row encoding are :mod:`walchannel.log.format`, which
the read-only tools share. :class:`RunLog` is the one writer, one class read
top to bottom: opening (the owner lock, creation under a temporary name,
the pragmas, the claim at open), its state, the one commit path, the
transactions (append, ack, verify, complete, meta), the quarantine of
damaged rows and of rows set aside, the reads, the checkpoints that keep
the file small, closing. Every decision about seqs, acks and completion is
:class:`~walchannel.log.state.LogState`'s; ``RunLog`` carries it out in SQL.
A row is committed before a seq is handed out; an ack deletes every row
``<= seq`` and stores the cursor in one transaction; the ack that deletes
the ``done`` row turns the log into a tombstone. The log knows nothing of
gRPC.

Durability (https://sqlite.org/pragma.html#pragma_synchronous):
``"process"`` is ``synchronous=NORMAL`` — a commit survives the process
being killed, but a power loss may roll back the last commits (rows and
progress marker together); ``"power"`` is ``synchronous=FULL`` — a commit
survives power loss too. The folder must be on a local file system.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, Final, Literal, ParamSpec, Protocol, Self, TypeVar

from walchannel._logging import get_logger
from walchannel._reentry import FREE, Guard
from walchannel.clock import SYSTEM_CLOCK, Clock, age_s
from walchannel.errors import (
    ChannelClosedError,
    PayloadError,
    ReentrantCallError,
    RunCompletedError,
    WalchannelError,
    WalCorruptError,
    WalLocationError,
    WalLockedError,
    WalRemovedError,
    WalWriteError,
)
from walchannel.log import files
from walchannel.log.format import (
    APPLICATION_ID,
    OPTIONAL_META_TYPES,
    OPTIONAL_ROW_TYPES,
    ROW_LOST_TYPE,
    ROWS_AFTER,
    SCHEMA,
    SCHEMA_VERSION,
    Row,
    RunMeta,
    body_crc,
    carried_marker,
    check_header,
    decode_row,
    encode_body,
    new_file_id,
    new_writer_id,
    not_damage,
    quick_check,
    read_file_id,
    read_meta,
    row_lost_body,
    row_time,
)
from walchannel.log.lock import OwnerLock
from walchannel.log.state import FAILED_FENCED, AckPlan, LogState, Writer

__all__ = [
    "BUSY_TIMEOUT_MS",
    "JOURNAL_SIZE_LIMIT",
    "SYNCHRONOUS",
    "WRITABLE_META",
    "CommitHook",
    "Durability",
    "RunLog",
]

logger = get_logger(__name__)

Durability = Literal["process", "power"]

_T = TypeVar("_T")
_P = ParamSpec("_P")
#: How far ahead of its writer a log keeps the highest seq written (rows): one
#: record a step; an engine's answer up to this far above what was written
#: is not caught as impossible (SPEC "Acks").
WRITTEN_STEP: Final = 16
#: A write method of RunLog (its self, then its arguments).
_Write = Callable[Concatenate["RunLog", _P], _T]

#: ``PRAGMA synchronous`` for each durability.
SYNCHRONOUS: Final = {"process": "NORMAL", "power": "FULL"}
# Keep the -wal file from staying large after a burst (bytes).
JOURNAL_SIZE_LIMIT: Final = 4 * 1024 * 1024
BUSY_TIMEOUT_MS: Final = 5000
#: What F_OFD_SETLK answers on a runtime or file system without those locks:
#: gVisor and WSL1 (EINVAL), an NFS without its lock daemon (ENOLCK).
LOCKS_LACKING: Final = frozenset({errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})
# How long a checkpoint waits for readers to leave the -wal (ms): short, as
# it runs on the channel's event loop; a held-off checkpoint is retried.
# Litestream holds a read transaction for good: this bounds the stall.
_CHECKPOINT_BUSY_MS: Final = 250
_INSERT: Final = (
    "INSERT INTO rows (seq, kind, body, crc32, appended_at, appended_boot)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
# Rows read from SQLite at a time by unacked().
_BATCH: Final = 512

#: Meta fields callers may set with update_meta(); the rest are the log's own.
WRITABLE_META: Final = frozenset(
    {
        "correlation_id",
        "connector_version",
        "harness_name",
        "harness_version",
        "token_sha256",
        "last_engine_addr",
        "http_addr",
        "last_ack_at",
        "last_error",
        "last_error_at",
        "reconnects",
        "failed_at",
        "failed_reason",
        "group_commit",
        "engine_resume",
    }
)


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


def _encode_progress(progress: Mapping[str, Any]) -> str:
    try:
        return json.dumps(progress, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError("progress", f"not JSON-like: {exc}") from None


def _guarded(label: str) -> Callable[[_Write[_P, _T]], _Write[_P, _T]]:
    """Run the decorated write of :class:`RunLog` holding its guard (:meth:`RunLog._write`)."""

    def wrap(method: _Write[_P, _T]) -> _Write[_P, _T]:
        @functools.wraps(method)
        def guarded(self: RunLog, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            return self._write(label, lambda: method(self, *args, **kwargs))

        return guarded

    return wrap


class WrittenStore(Protocol):
    """Where the highest seq written is kept beside a log (the lock file: ``OwnerLock``)."""

    def written(self) -> tuple[str | None, int | None]:
        """``(boot id, highest seq)`` kept by this log's owners (None, None: nothing)."""
        ...

    def keep_written(self, boot_id: str | None, seq: int) -> None:
        """Keep ``seq`` (written on ``boot_id``) before a row at or below it goes out.

        Raises:
            OSError: it could not be kept.
        """
        ...


class RunLog:
    """The write-ahead log of one run. Open it with :meth:`RunLog.open`.

    One owner at a time (an OFD lock on ``<log>.lock``); use it from one
    thread. Every write returns only once committed. Context manager:
    ``with RunLog.open(...) as wal: ...`` closes it.

    SPEC "The log".
    """

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        wal_dir: str | os.PathLike[str] | None,
        run_id: str,
        *,
        correlation_id: str,
        durability: Durability = "process",
        clock: Clock | None = None,
    ) -> Self:
        """Create or re-open the log of ``run_id`` and take its owner lock.

        A new log is built under a temporary name (schema and meta
        committed), then linked into place, so a crash never leaves a
        half-made log; stale temporaries of this run are removed first.
        Completed logs (tombstones) open too: refusing them is the channel's
        job.

        Args:
            wal_dir: the log folder (None: the default, see
                :func:`walchannel.log.files.default_wal_dir`); created 0700.
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
            WalCorruptError: the file's content proves it is not this run's
                usable log: a symlink or a folder where the file should be,
                not a walchannel log, a newer schema, another run's, broken.
            WalWriteError: the folder or file cannot be created, opened or
                written, the cause named from the OS (SPEC "The log"): its
                path longer than SQLite opens
                (:data:`walchannel.log.files.SQLITE_MAX_PATH_BYTES`, checked before
                anything is written), no file descriptor left, a file where
                a folder should be, permissions, a read-only file system.
        """
        files.check_run_id(run_id)
        if not isinstance(correlation_id, str) or not correlation_id:
            raise ValueError("correlation_id must be a non-empty str")
        if durability not in SYNCHRONOUS:
            raise ValueError(f"durability must be 'process' or 'power', got {durability!r}")
        if wal_dir is not None:
            folder = files.expand_user(Path(wal_dir))
        else:
            folder = files.default_wal_dir()
        path = files.log_path(folder, run_id)
        try:
            # Before anything is written: the log's name is the longest SQLite opens.
            files.check_path_length(path)
        except OSError as exc:
            raise WalWriteError(
                f"run {run_id}: cannot open its log: {files.describe_os_error(exc)}",
                path=str(path),
            ) from None
        try:
            folder = files.ensure_wal_dir(folder)
        except OSError as exc:
            if isinstance(exc, NotADirectoryError | FileExistsError):
                # A file where the folder is to be: no retry there can mend it.
                if wal_dir is not None:
                    setting, fix = "wal_dir", "set wal_dir (walchannel run: --wal-dir)"
                elif os.environ.get("WALCHANNEL_DIR"):
                    setting, fix = "WALCHANNEL_DIR", "set WALCHANNEL_DIR"
                else:
                    setting, fix = "the default log folder", "set WALCHANNEL_DIR or wal_dir"
                raise WalLocationError(
                    f"run {run_id}: the log cannot live in {folder}, from {setting}:"
                    f" {files.describe_os_error(exc)}: {fix} to a folder (made if missing),"
                    " or move the file out of the way",
                    path=str(folder),
                ) from None
            refused = files.not_writable(folder, exc)
            if refused is not None:
                raise WalLocationError(
                    f"run {run_id}: the log cannot live in {folder}: {refused}", path=str(folder)
                ) from None
            raise WalWriteError(
                f"cannot create the log folder: {files.describe_os_error(exc)}", path=str(path)
            ) from None
        try:
            lock = OwnerLock.acquire(files.lock_path(path), log=path)
        except WalLockedError:
            raise
        except OSError as exc:
            if exc.errno in LOCKS_LACKING:
                raise WalLocationError(
                    f"run {run_id}: the log cannot live in {folder}: this runtime or its file"
                    f" system lacks the open-file-description locks (F_OFD_SETLK:"
                    f" {files.describe_os_error(exc)}) that keep a second harness off the"
                    " run's log, as gVisor, WSL1 and network file systems without a lock"
                    " daemon do. Put wal_dir on a local file system of a runtime that has them"
                    " (docs/operations.md)",
                    path=str(folder),
                ) from None
            refused = files.not_writable(folder, exc)
            if refused is not None:
                raise WalLocationError(
                    f"run {run_id}: the log cannot live in {folder}: {refused}", path=str(folder)
                ) from None
            raise WalWriteError(
                f"cannot take the owner lock: {files.describe_os_error(exc)}", path=str(path)
            ) from None
        try:
            return cls._open_locked(
                path, lock, run_id, correlation_id, durability, clock or SYSTEM_CLOCK
            )
        except OSError as exc:
            lock.release()
            raise WalWriteError(
                f"cannot open the log: {files.describe_os_error(exc)}", path=str(path)
            ) from None
        except WalWriteError as exc:
            lock.release()
            # SQLite says "unable to open database file" or "attempt to write a
            # readonly database" where its WAL cannot have shared memory: ask why.
            for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                if os.path.lexists(part) and not os.access(part, os.R_OK | os.W_OK):
                    raise WalLocationError(
                        f"run {run_id}: the log cannot be written: {part} is not writable by"
                        f" uid {os.geteuid()}{files.user_name()}: run the harness as its"
                        " owner, or give that user read and write access to it"
                        " (chown / chmod u+rw)",
                        path=str(part),
                    ) from None
            problem = files.shared_memory_failure(path)
            if problem is None:
                raise
            if problem.startswith("its -shm"):
                # Something else stands where SQLite makes its -shm: a leftover, a mount.
                fix = (
                    "Move it out of the way (SQLite makes the -shm itself; nothing of the"
                    " log is in it) and start again"
                )
            else:
                fix = (
                    "virtiofs, 9p, network file systems and some bind mounts cannot give"
                    " it: put wal_dir on a local file system"
                )
            raise WalLocationError(
                f"run {run_id}: the log cannot live in {folder}: {problem}. SQLite's WAL keeps"
                " its index in a file beside the log that it maps into shared memory (the"
                f" -shm). {fix} (docs/operations.md). No row was written. ({exc})",
                path=str(folder),
            ) from None
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
        clock: Clock | None = None,
        watch: Callable[[], str | None] | None = None,
        written_store: WrittenStore | None = None,
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
            clock: the clocks its records are dated with (default the system's).
            watch: called after every commit: what of the log's files its
                path no longer names, or None (:meth:`open` watches the
                file, its ``-wal`` and its lock file; here the caller's world).
            written_store: where the highest seq written is kept beside the
                log (:meth:`open`: its lock file); None: nowhere, and
                :attr:`written_bound` is None.

        Raises:
            WalCorruptError: the database is not this run's log.
            WalWriteError: the open's own transaction (the claim) failed.
        """
        path = Path(":memory:")
        if create:
            cls.initialize(conn, run_id, correlation_id)
        check_header(conn, path, run_id)
        meta = read_meta(conn, path)
        wal = cls(
            conn, path, None, meta, "process", clock or SYSTEM_CLOCK, commit_hook, written_store
        )
        wal._claim(meta, correlation_id)
        wal._watch = watch
        return wal

    @staticmethod
    def initialize(conn: sqlite3.Connection, run_id: str, correlation_id: str) -> None:
        """Lay out a new log in an empty database: header, tables and meta, in one transaction.

        SPEC "The log" (the schema of :mod:`walchannel.log.format`). The
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
            # The writer identity is born with the log: a random id, epoch 0.
            conn.execute(
                "INSERT INTO meta (id, schema_version, run_id, correlation_id,"
                " created_at, updated_at, file_id, writer_id, writer_epoch)"
                " VALUES (1, ?, ?, ?, ?, ?, ?, ?, 0)",
                (SCHEMA_VERSION, run_id, correlation_id, now, now, new_file_id(), new_writer_id()),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        lock: OwnerLock | None,
        meta: RunMeta,
        durability: Durability,
        clock: Clock,
        hook: CommitHook | None = None,
        written_store: WrittenStore | None = None,
    ) -> None:
        self._conn = conn
        self._path = path
        self._lock = lock
        self._hook = hook
        self._clock = clock
        # The boot its rows' boot times belong to (the claim makes it this one).
        self._boot_id = clock.boot_id()
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
        # The highest seq any owner of this log wrote, in steps ahead of its
        # writer, kept beside the log (its lock file: a copy of the log put
        # back does not carry it), trusted on the boot that kept it, never for
        # a takeover (SPEC "Acks").
        self._written_store = written_store
        self._written_saved = 0
        self._written_bound: int | None = None
        if written_store is not None:
            boot, written = written_store.written()
            if written is not None and boot == self._boot_id and boot is not None:
                self._written_saved = written
                if meta.takeover_at is None:
                    self._written_bound = written
        self._unacked_bytes: int | None = None
        self._quarantined = int(conn.execute("SELECT count(*) FROM quarantine").fetchone()[0])
        self._closed = False
        # Held by the transaction in progress (its label): see _commit.
        self._guard = Guard()
        # After each commit: does the path still name the files open? (what changed, or None)
        self._watch: Callable[[], str | None] | None = None
        self._removed: str | None = None
        self._removed_listeners: list[Callable[[WalRemovedError], None]] = []

    @classmethod
    def _open_locked(
        cls,
        path: Path,
        lock: OwnerLock,
        run_id: str,
        correlation_id: str,
        durability: Durability,
        clock: Clock,
    ) -> Self:
        cls._remove_stale_temporaries(path)
        kind = files.file_kind(path)
        if kind == "symlink":
            raise WalCorruptError(str(path), "is a symbolic link; refusing to follow it")
        if kind == "missing":
            cls._create(path, run_id, correlation_id)
        elif kind != "file":
            raise WalCorruptError(str(path), f"is a {kind}, not a log file")
        else:
            try:
                cls._check_wal_is_its_own(path)
            except sqlite3.Error as exc:
                raise cls._cannot_open(path, exc) from None
        try:
            conn = sqlite3.connect(
                files.sqlite_uri(path, "mode=rw"), uri=True, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise cls._cannot_open(path, exc) from None
        try:
            check_header(conn, path, run_id)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise WalCorruptError(str(path), f"cannot use WAL mode (journal_mode={mode})")
            conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
            conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
            meta = read_meta(conn, path)
            wal = cls(conn, path, lock, meta, durability, clock, written_store=lock)
            wal._claim(meta, correlation_id)
            wal._watch = cls._watch_for(path, lock)
            return wal
        except sqlite3.Error as exc:
            conn.close()
            if not_damage(exc):
                raise cls._cannot_open(path, exc) from None
            raise WalCorruptError(str(path), f"not a usable SQLite database: {exc}") from None
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _watch_for(path: Path, lock: OwnerLock) -> Callable[[], str | None]:
        """The check, after each commit, that ``path`` still names the files open under it.

        The log file, its ``-wal`` and the lock's sidecar, each by its
        ``(st_dev, st_ino)`` now (SPEC "The log": its files removed while open).
        """
        wal_file = Path(f"{path}-wal")
        named: dict[str, tuple[Path, tuple[int, int]]] = {}
        for what, where, ident in (
            ("the log file", path, files.identity(path)),
            ("its -wal", wal_file, files.identity(wal_file)),
            ("its lock file", lock.path, lock.identity()),
        ):
            if ident is not None:
                named[what] = (where, ident)
        return files.watch_files(path.parent, named)

    @staticmethod
    def _check_wal_is_its_own(path: Path) -> None:
        """Refuse a ``-wal`` left by another file, before anything is written.

        SQLite cannot tell: a WAL's salts bind its frames to the WAL, not to
        the database, so a stale ``-wal`` beside a restored or copied file
        is replayed onto it (and ``quick_check`` may still say ok). Every log
        file carries a random ``file_id`` written when it is made and never
        after: read from the main file alone (``immutable=1``: the ``-wal``
        unread) and through the ``-wal``, the two must agree. Both reads are
        read-only connections: neither checkpoints the ``-wal`` into the file
        when it closes, as the owner's read-write one would (SQLite may
        rebuild the ``-shm``, its index of the ``-wal``).

        Raises:
            WalCorruptError: they differ, or the pair cannot be read as one log.
            sqlite3.Error: SQLite cannot open the file (the caller names why).
        """
        size = files.file_size(Path(f"{path}-wal"))
        if size == 0:
            return

        def file_id(query: str) -> str | None:
            conn = sqlite3.connect(files.sqlite_uri(path, query), uri=True)
            try:
                return read_file_id(conn)
            finally:
                conn.close()

        try:
            alone = file_id("mode=ro&immutable=1")
        except sqlite3.Error as exc:
            if not_damage(exc):
                raise
            raise WalCorruptError(str(path), f"not a usable SQLite database: {exc}") from None
        try:
            through = file_id("mode=ro")
        except sqlite3.Error as exc:
            if not_damage(exc):
                raise
            through = f"unreadable ({exc})"
        if alone != through:
            raise WalCorruptError(
                str(path),
                f"its -wal ({size} bytes) belongs to another log file: the file's id is "
                f"{alone}, the -wal's {through}. Nothing was written. A restore or a move "
                "left the -wal of another file beside it: move this file, its -wal and its "
                "-shm aside together, or the -wal and -shm back beside the file they belong to",
            )

    @staticmethod
    def _cannot_open(path: Path, exc: sqlite3.Error) -> WalWriteError:
        """SQLite could not open a log for a reason other than its content: name the cause."""
        cause = files.open_failure(path, write=True)
        said = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        why = f"{cause} (SQLite: {exc}, {said})" if cause else f"{exc} ({said})"
        return WalWriteError(f"cannot open the log: {why}", path=str(path))

    @staticmethod
    def _remove_stale_temporaries(path: Path) -> None:
        # Called with the owner lock held: no other opener is building this log.
        for candidate in path.parent.glob(files.temporary_path(path, "*").name):
            if files.is_temporary_for(candidate, path):
                logger.info("removing stale temporary %s of an interrupted log creation", candidate)
                with contextlib.suppress(FileNotFoundError):
                    candidate.unlink()

    @staticmethod
    def _create(path: Path, run_id: str, correlation_id: str) -> None:
        tmp = files.temporary_path(path, secrets.token_hex(4))
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
                RunLog.initialize(conn, run_id, correlation_id)
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
            if isinstance(exc, OSError):
                why = files.describe_os_error(exc)
            else:
                cause = files.open_failure(tmp, write=True)
                said = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
                why = f"{cause} (SQLite: {exc}, {said})" if cause else f"{exc} ({said})"
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()
            raise WalWriteError(f"cannot create the log: {why}", path=str(path)) from None

    def _claim(self, meta: RunMeta, correlation_id: str) -> None:
        """Record the owner and ``unverified_from`` at open (one transaction).

        A log made before the writer identity gets its writer id now (epoch
        0, or the epoch a restore gave it), and counts as answered when it
        holds an ack (SPEC "The log").
        """
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
            self._boot_id,
            self._clock.wall_s(),
        )
        conn = self._conn
        present = {r[1] for r in conn.execute("PRAGMA table_info(meta)")}
        row_columns = {r[1] for r in conn.execute("PRAGMA table_info(rows)")}
        # A log made before an optional column existed gets it now (NULL).
        missing = [
            f"ALTER TABLE meta ADD COLUMN {name} {kind}"
            for name, kind in sorted(OPTIONAL_META_TYPES.items())
            if name not in present
        ] + [
            f"ALTER TABLE rows ADD COLUMN {name} {kind}"
            for name, kind in sorted(OPTIONAL_ROW_TYPES.items())
            if name not in row_columns
        ]
        # Boot times of another boot cannot be compared with this one's.
        other_boot = meta.boot_id != self._boot_id
        writer = _writer_of(meta, meta.writer_id or new_writer_id())
        # A log from before the answered mark: answered if it holds an ack.
        older = "answered_at" not in present and meta.last_acked_seq > 0
        if older:
            writer = writer._replace(answered=True)

        def work(conn: sqlite3.Connection) -> None:
            for statement in missing:
                conn.execute(statement)
            if other_boot and "appended_boot" in row_columns:
                conn.execute("UPDATE rows SET appended_boot = NULL")
            if meta.writer_id is None or older:
                conn.execute(
                    "UPDATE meta SET writer_id = ?, writer_epoch = ?,"
                    " answered_at = CASE WHEN ? THEN coalesce(last_ack_at, updated_at)"
                    " ELSE answered_at END WHERE id = 1",
                    (writer.id, writer.epoch, older),
                )
            conn.execute(
                "UPDATE meta SET correlation_id = ?, unverified_from = ?, owner_pid = ?,"
                " owner_host = ?, boot_id = ?,"
                " last_ack_boot = CASE WHEN ? THEN NULL ELSE last_ack_boot END,"
                " updated_at = ? WHERE id = 1",
                (*params[:5], other_boot, params[5]),
            )

        single = not missing and not other_boot and meta.writer_id is not None
        self._commit("claim", "record the owner at open", work, single=single)
        self._writer = writer

    # -- state -----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The log file, ``<wal_dir>/<run_id>.wal.sqlite3``."""
        return self._path

    @property
    def run_id(self) -> str:
        """The run this log belongs to."""
        return self._run_id

    @property
    def writer(self) -> Writer:
        """The log's writer identity (id, epoch, takeover mark, answered mark). SPEC "The log"."""
        return self._writer

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
    def written_bound(self) -> int | None:
        """The highest seq this log can have written to an engine, known at open; else None.

        What the owners of this log kept beside it (:meth:`note_writing`,
        in steps ahead of their writers: at least every seq they wrote), on
        this boot (a power loss may lose what was kept), unless the log is
        marked to take the run over. A handshake answer above it is no
        engine's honest word (SPEC "Acks"). None otherwise: the first
        answer is judged by the verification rule (SPEC "Dial").
        """
        return self._written_bound

    def note_writing(self, seq: int) -> None:
        """Row ``seq`` is about to be written to a stream: keep the bound ahead of it.

        When ``seq`` passes what was kept, keeps ``seq`` +
        :data:`WRITTEN_STEP` beside the log before the row goes out, so one
        record covers many writes, and what is kept is at least every seq
        ever written (SPEC "Acks").

        Raises:
            WalWriteError: it cannot be kept; the row must not be written.
        """
        if seq <= self._written_saved or self._written_store is None:
            return
        ahead = seq + WRITTEN_STEP
        try:
            self._written_store.keep_written(self._boot_id, ahead)
        except OSError as exc:
            raise WalWriteError(
                f"run {self._run_id}: cannot keep the highest seq written beside "
                f"{self._path}: {files.describe_os_error(exc)}",
                path=str(self._path),
            ) from None
        self._written_saved = ahead

    @property
    def busy(self) -> str | None:
        """The name of the transaction in progress (``"append"``, ``"ack"``, ...), or None.

        Set only while a transaction runs: a call that sees it set was made
        from inside one (a signal handler's), SPEC "Signal handlers and the
        channel".
        """
        return self._guard.holder

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

    # -- the commit path: the one way the log writes ---------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: the log {self._path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._removed is not None:
            raise self._removed_error()
        if self._lock is not None and self._lock.forked:
            raise WalLockedError(
                f"{self._path}: this process is a forked child of the log's owner "
                f"({self._lock.owner.describe()}); it may not write",
                path=str(self._path),
                pid=self._lock.owner.pid,
                host=self._lock.owner.host,
            )

    def _write(self, label: str, op: Callable[[], _T]) -> _T:
        """Run the write ``op`` (named ``label``) holding the log's guard; refuse a nested one.

        A write reads the log's state to plan its transaction, then commits
        it: a signal handler's write between the two would make the plan
        stale (a seq handed out twice). So the guard is held from before the
        state is read to after the log's memory follows the commit, and a
        write begun while it is held (only a handler's can be) is refused.
        SPEC "Signal handlers and the channel".

        Raises:
            ReentrantCallError: another write is in progress; nothing begun.
        """
        busy = self._guard.holder
        if busy is not None:
            raise self._nested(label, busy)
        held = FREE
        try:
            # Taken inside the try: an exception on any line after it releases it.
            held = self._guard.take(label)
            return op()
        finally:
            self._guard.release(held)

    def _nested(self, label: str, busy: str) -> ReentrantCallError:
        return ReentrantCallError(
            f"run {self._run_id}: the log's {label} was begun while its {busy} was in "
            "progress (a signal handler re-entering the channel or the log?): refused, "
            "nothing written; send from a handler installed with loop.add_signal_handler, "
            "which runs between the event loop's callbacks"
        )

    def _commit(
        self,
        label: str,
        what: str | Callable[[], str],
        work: Callable[[sqlite3.Connection], _T],
        *,
        single: bool = False,
        then: Callable[[_T], None] | None = None,
    ) -> _T:
        """Run ``work`` in one transaction, commit, then ``then(result)``: the one way to write.

        ``what`` names the transaction in an error ("cannot <what>"); a
        callable is only called then (the append path formats nothing when
        it succeeds). ``single``: ``work`` is one statement, run in
        autocommit mode (its own transaction) when no :class:`CommitHook`
        watches. ``then`` brings the log's memory (its state, marker, byte
        count) up to the committed transaction.

        Whatever stops it on the way — SQLite failing, or an exception from
        a signal handler (a ``KeyboardInterrupt``, a ``SIGALRM`` timeout's)
        between any two statements, before or after ``COMMIT``, or before
        ``then`` is through — the open transaction is rolled back and the
        log's memory takes the disk's word (:meth:`_follow_disk`): the
        transaction landed whole or not at all, none stays open, and no seq
        the disk holds is handed out again (SPEC "The log"). A commit that
        lands in files no path names any more (:meth:`_files_moved`) is not
        taken into the log's memory at all: :class:`WalRemovedError` is
        raised (or what interrupted it), and no seq of it is returned or read.

        Raises:
            WalRemovedError: it committed into files no path names any more.
            WalWriteError: SQLite failed; the transaction is rolled back.
            BaseException: what interrupted it, raised again once the log is whole.
        """
        conn = self._conn
        hook = self._hook
        moved: WalRemovedError | None = None
        try:
            if single and hook is None:
                result = work(conn)
            else:
                conn.execute("BEGIN IMMEDIATE")
                result = work(conn)
                if hook is not None:
                    hook.before_commit(label)
                conn.execute("COMMIT")
                if hook is not None:
                    hook.after_commit(label)
            # Committed, but into a file no path names any more: the log's memory
            # does not take it, so no seq of it is returned or written to the
            # engine (simulator seed 911652: a group given up as never committed
            # went out all the same), and nothing more is written (SPEC "The log").
            moved = self._files_moved()
            if moved is None and then is not None:
                then(result)
        except BaseException as exc:
            self._roll_back_open()
            if moved is None:
                # It may have landed before the exception (a signal's, after the
                # COMMIT): into a file no path names any more, it is not taken either.
                moved = self._files_moved()
            if moved is None:
                self._after_failed_commit(exc, what)
            if isinstance(exc, sqlite3.Error):
                said = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
                raise WalWriteError(
                    f"run {self._run_id}: cannot {what if isinstance(what, str) else what()} "
                    f"in {self._path}: {exc} ({said})",
                    path=str(self._path),
                ) from None
            raise
        if moved is not None:
            raise moved
        return result

    def _files_moved(self) -> WalRemovedError | None:
        """After a commit: do the paths still name the files open? The error, once, if not.

        The first time they do not, the log refuses every later write and
        its listeners (the channel: :meth:`on_removed`) fail the run.
        """
        watch = self._watch
        if watch is None or self._removed is not None:
            return None
        moved = watch()
        if moved is None:
            return None
        self._removed = moved
        error = self._removed_error()
        logger.error("%s", error)
        for listener in self._removed_listeners:
            listener(error)
        return error

    def on_removed(self, callback: Callable[[WalRemovedError], None]) -> None:
        """Call ``callback(error)`` once, when a commit finds the log's files removed.

        The owner (the channel) fails its run there, whichever of its
        commits (a send, an ack, a meta update) met it.
        """
        self._removed_listeners.append(callback)

    def _removed_error(self) -> WalRemovedError:
        return WalRemovedError(
            f"run {self._run_id}: the log's files were removed or replaced while open: "
            f"{self._removed}; what it committed since lives only in the unlinked file, "
            "lost when this process ends, and nothing more is written to it. Find what "
            "removed them (a tmp cleaner, a wiped volume), then restart the harness: the "
            'engine holds what it acked (SPEC "The log")',
            path=str(self._path),
        )

    def _roll_back_open(self) -> None:
        """Roll back the transaction still open, if any (SQLite's error is moot here)."""
        conn = self._conn
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _after_failed_commit(self, exc: BaseException, what: str | Callable[[], str]) -> None:
        """Roll back what is still open, then follow the disk; say so when the commit landed."""
        self._roll_back_open()
        old = self._state
        if not self._follow_disk():
            return
        failed = isinstance(exc, sqlite3.Error)
        if self._state.next_seq > old.next_seq:
            # A failed commit may, on an I/O error after the commit frame
            # reached the WAL, still have landed; an interrupted one too.
            logger.log(
                logging.ERROR if failed else logging.WARNING,
                "run %s: a %s commit landed rows up to seq %d; continuing after it",
                self._run_id,
                "failed" if failed else f"{type(exc).__name__}-interrupted",
                self._state.next_seq - 1,
            )
        elif not failed:
            logger.warning(
                "run %s: %s interrupted the log's transaction (%s); the log follows its disk",
                self._run_id,
                type(exc).__name__,
                what if isinstance(what, str) else what(),
            )

    def _follow_disk(self) -> bool:
        """Take the disk's word for the log's state, marker and counts; False if it cannot be read.

        After a commit that failed or was interrupted (:meth:`_commit`):
        whatever landed is what the log holds, whatever did not is not.
        """
        conn = self._conn
        try:
            meta = read_meta(conn, self._path)
            top = conn.execute("SELECT seq, kind FROM rows ORDER BY seq DESC LIMIT 1").fetchone()
            quarantined = int(conn.execute("SELECT count(*) FROM quarantine").fetchone()[0])
        except (sqlite3.Error, WalchannelError):
            return False
        self._state = self._state.follow_disk(
            high_water=meta.high_water,
            last_acked=meta.last_acked_seq,
            unverified_from=meta.unverified_from,
            completed=meta.completed_at is not None,
            top_seq=top[0] if top else None,
            top_is_done=bool(top) and top[1] == "done",
        )
        self._progress = meta.progress
        self._quarantined = quarantined
        if meta.writer_id is not None:
            self._writer = _writer_of(meta, meta.writer_id)
        self._unacked_bytes = None  # summed again from disk when next asked
        return True

    # -- transactions ----------------------------------------------------------------------

    def append(
        self, kind: str, body: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """Commit one row (and the progress marker, if given) and return its seq.

        Args:
            kind: ``event``, ``finding``, ``approval_request`` or ``done``.
            body: the body mapping (SPEC "Control vs data").
            progress: the harness's resume marker, committed in the same
                transaction; None leaves it unchanged.

        Returns:
            The row's seq, once committed. A failed commit uses no seq.

        Raises:
            ValueError: unknown ``kind``.
            PayloadError: msgpack cannot encode the body, or ``progress`` is
                not JSON-like.
            ChannelClosedError: the log is closed or holds an unacked ``done``.
            RunCompletedError: the log is a tombstone.
            WalLockedError: this process is a forked child of the owner.
            WalWriteError: the commit failed (disk full, I/O error).
        """
        return self.append_encoded(((kind, encode_body(kind, body)),), progress=progress)[0]

    def append_many(
        self,
        items: Iterable[tuple[str, Mapping[str, Any]]],
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Commit several rows in one transaction: all of them, or none.

        Args:
            items: ``(kind, body)`` pairs, in order.
            progress: as in :meth:`append`.

        Returns:
            Their seqs, consecutive, once committed. No ``items`` with a
            ``progress`` commits the marker alone and returns ``[]`` (a
            stretch of the scan with nothing to report).

        Raises:
            As :meth:`append`; ``ValueError`` for no ``items`` and no ``progress``.
        """
        # append_encoded checks the log and each kind.
        encoded = [(kind, encode_body(kind, body)) for kind, body in items]
        return self.append_encoded(encoded, progress=progress)

    def check_append(self, kinds: Sequence[str]) -> None:
        """Raise what an append of rows of ``kinds`` would raise before it touches the disk.

        For a caller that hands seqs out before it appends (the channel's
        ``group_commit``, SPEC "Group commit"): what the log refuses is
        refused then, not at the commit.

        Raises:
            ChannelClosedError: the log is closed, or holds an unacked ``Done``.
            WalLockedError: this process is a forked child of the log's owner.
            RunCompletedError: the log is a tombstone.
            ValueError: an unknown kind.
        """
        self._check_writable()
        self._state.append(kinds)

    def append_encoded(
        self,
        items: Sequence[tuple[str, bytes]],
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """:meth:`append_many` for bodies already encoded with :func:`encode_body`.

        Lets a caller that needs the encoded size (the channel's message-size
        and backlog checks) encode each body once.

        Args:
            items: ``(kind, msgpack body)`` pairs, in order.
            progress: as in :meth:`append`.

        Returns:
            Their seqs, consecutive, once committed.

        Raises:
            As :meth:`append_many`.
        """
        # The guard of _write, inline: the send path's one commit (no wrapper).
        busy = self._guard.holder
        if busy is not None:
            raise self._nested("append", busy)
        held = FREE
        try:
            held = self._guard.take("append")
            return self._append_encoded(items, progress)
        finally:
            self._guard.release(held)

    def _append_encoded(
        self, items: Sequence[tuple[str, bytes]], progress: Mapping[str, Any] | None
    ) -> list[int]:
        self._check_writable()
        old = self._state
        first = old.next_seq
        clock = self._clock
        now = clock.wall_s()
        boot = clock.boot_s()
        if progress is None and len(items) == 1:
            # The send path: one row, one autocommit statement. Kept apart from
            # the general path below, which costs ~1.3 µs more per row
            # (docs/performance.md, the append row).
            kind, blob = items[0]
            state = old.append((kind,))
            row = (first, kind, blob, body_crc(blob), now, boot)

            def follow(_: object) -> None:
                self._state = state
                if self._unacked_bytes is not None:
                    self._unacked_bytes += len(blob)

            self._commit(
                "append",
                lambda: f"append 1 row at seq {first}",
                lambda conn: conn.execute(_INSERT, row),
                single=True,
                then=follow,
            )
            return [first]
        state = old.append([kind for kind, _ in items])
        rows = [
            (seq, kind, blob, body_crc(blob), now, boot)
            for seq, (kind, blob) in enumerate(items, start=first)
        ]
        if not rows and progress is None:
            raise ValueError(f"run {self._run_id}: append_many() got no rows and no progress")
        marker = _encode_progress(progress) if progress is not None else None

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(_INSERT, rows)
            if marker is not None:
                conn.execute(
                    "UPDATE meta SET progress = ?, updated_at = ? WHERE id = 1", (marker, now)
                )

        def follow_rows(_: None) -> None:
            self._state = state
            if marker is not None:
                # A copy the caller cannot mutate afterwards.
                self._progress = json.loads(marker)
            if self._unacked_bytes is not None:
                self._unacked_bytes += sum(len(r[2]) for r in rows)

        what = f"append {len(rows)} row(s) at seq {first}" if rows else "store progress"
        self._commit("append", what, work, then=follow_rows)
        return list(range(first, state.next_seq))

    @_guarded("ack")
    def ack(self, seq: int) -> int:
        """Store a cumulative ack: delete every row ``<= seq`` and the cursor, in one transaction.

        The ack that covers the ``done`` row also sets ``completed_at``: the
        log becomes a tombstone (rows gone, meta kept). An ack at or below
        the stored cursor changes nothing.

        Args:
            seq: the acked seq.

        Returns:
            How many rows were deleted.

        Raises:
            ValueError: ``seq`` is above the high-water mark (never applied).
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        plan = self._state.ack(seq)
        if plan is None:
            return 0  # at or below the stored cursor; a tombstone takes no more writes
        return self._carry_out(plan, "ack", f"store ack {seq}")

    @_guarded("verification")
    def verify(self, engine_high: int, *, engine_resume: str | None = None) -> int:
        """Apply the verification rule for the first answered handshake ``Ack(h)``.

        In one transaction: when the engine holds seqs at or above
        ``unverified_from``, the unverified rows move to ``h+1, h+2, …``
        (a constant shift, order kept) and the high-water becomes at least
        ``h``; ``unverified_from`` is cleared; then ``Ack(h)`` is stored as
        any ack is. The caller checks first that ``h`` is not below the
        stored cursor (the engine-behind rule). SPEC "Dial"; the decision
        is :meth:`LogState.verify <walchannel.log.state.LogState.verify>`.

        Args:
            engine_high: ``h``, the engine's answer.
            engine_resume: the answer's resume point as meta stores it (JSON;
                None: leave it): stored in the same transaction, so the
                takeover mark this clears never goes without it (SPEC "The
                engine keeps the resume point").

        Returns:
            The shift applied to the unverified rows (0 for none).

        Raises:
            ValueError: ``h`` is below the stored cursor, or the log is
                already verified (``unverified_from`` is None).
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        plan = self._state.verify(engine_high)
        self._carry_out(plan, "verify", f"store ack {engine_high}", engine_resume)
        return plan.shift_by

    def _carry_out(
        self, plan: AckPlan, label: str, what: str, engine_resume: str | None = None
    ) -> int:
        """Carry out an :class:`~walchannel.log.state.AckPlan` in one transaction; rows deleted."""
        now = self._clock.wall_s()
        boot = self._clock.boot_s()
        count_gone = self._unacked_bytes is not None and plan.advanced

        def work(conn: sqlite3.Connection) -> tuple[int, int]:
            if plan.shift_from is not None:
                # Two passes keep the primary key unique at every step.
                args = (plan.shift_by, plan.shift_from)
                conn.execute("UPDATE rows SET seq = -(seq + ?) WHERE seq >= ?", args)
                conn.execute("UPDATE rows SET seq = -seq WHERE seq < 0")
                conn.execute("UPDATE quarantine SET seq = -(seq + ?) WHERE seq >= ?", args)
                conn.execute("UPDATE quarantine SET seq = -seq WHERE seq < 0")
            gone_bytes = 0
            if count_gone:
                gone_bytes = conn.execute(
                    "SELECT coalesce(sum(length(body)), 0) FROM rows WHERE seq <= ?",
                    (plan.delete_through,),
                ).fetchone()[0]
            deleted = conn.execute(
                "DELETE FROM rows WHERE seq <= ?", (plan.delete_through,)
            ).rowcount
            conn.execute(
                "UPDATE meta SET last_acked_seq = ?, high_water = max(high_water, ?),"
                " unverified_from = CASE WHEN ? THEN NULL ELSE unverified_from END,"
                " completed_at = CASE WHEN ? THEN ? ELSE completed_at END,"
                # An answer that covers no new row (a handshake's Ack(h)) is
                # not progress: last_ack_at says when rows were last acked.
                " last_ack_at = CASE WHEN ? THEN ? ELSE last_ack_at END,"
                " last_ack_boot = CASE WHEN ? THEN ? ELSE last_ack_boot END,"
                # The first answered handshake (or ack of its rows) is the
                # log's durable evidence; it ends a takeover's one shot.
                " answered_at = coalesce(answered_at, ?),"
                " takeover_at = CASE WHEN ? THEN NULL ELSE takeover_at END,"
                " updated_at = ? WHERE id = 1",
                (
                    plan.state.last_acked,
                    plan.high_water,
                    plan.clear_unverified,
                    plan.completed,
                    now,
                    plan.advanced,
                    now,
                    plan.advanced,
                    boot,
                    now,
                    plan.clear_unverified,
                    now,
                ),
            )
            if engine_resume is not None:
                conn.execute("UPDATE meta SET engine_resume = ? WHERE id = 1", (engine_resume,))
            return deleted, int(gone_bytes)

        def follow(result: tuple[int, int]) -> None:
            self._state = plan.state
            if plan.clear_unverified:
                self._writer = self._writer._replace(take_over=False, answered=True)
            elif not self._writer.answered:
                self._writer = self._writer._replace(answered=True)
            if self._unacked_bytes is not None:
                self._unacked_bytes -= result[1]

        return self._commit(label, what, work, then=follow)[0]

    @_guarded("completion")
    def complete_by_engine(self) -> int:
        """Turn a log holding an unacked ``Done``, or nothing unacked, into a tombstone
        on the engine's word.

        For the engine's FAILED_PRECONDITION "run completed" answer when this
        log holds ``Done``: the engine applied a ``Done`` of this run (it takes
        seqs in order, so everything before it too), but its ack was lost. In
        one transaction every row is deleted and ``completed_at`` set; the
        stored cursor does not move (after a rollback the engine's ``Done``
        may sit at another seq). The decision is
        :meth:`LogState.complete_by_engine <walchannel.log.state.LogState.complete_by_engine>`.

        Returns:
            How many rows were deleted.

        Raises:
            ValueError: the log holds unacked rows and no ``Done``.
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        state = self._state.complete_by_engine()
        now = self._clock.wall_s()

        def work(conn: sqlite3.Connection) -> int:
            deleted = conn.execute("DELETE FROM rows").rowcount
            conn.execute(
                "UPDATE meta SET completed_at = ?, last_error = ?, last_error_at = ?,"
                " updated_at = ? WHERE id = 1",
                (now, "the engine says the run is completed; the log is a tombstone", now, now),
            )
            return deleted

        def follow(_: int) -> None:
            self._state = state
            self._unacked_bytes = 0

        return self._commit("complete", "mark the run completed", work, then=follow)

    @_guarded("meta update")
    def update_meta(self, /, **values: Any) -> None:
        """Store meta fields (one transaction); names as in :class:`RunMeta`.

        Only the caller-owned fields may be set: the handshake fields,
        ``correlation_id``, ``token_sha256``, ``last_engine_addr``,
        ``http_addr``, ``last_ack_at``, ``last_error``, ``last_error_at``,
        ``reconnects``, ``failed_at``, ``failed_reason``, ``group_commit``
        and ``engine_resume``. The cursor,
        high-water, progress and completion belong to the log's own
        operations.

        Raises:
            ValueError: an unknown or log-owned field name.
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        bad = sorted(set(values) - WRITABLE_META)
        if bad:
            raise ValueError(f"update_meta(): not a writable meta field: {', '.join(bad)}")
        if not values:
            return
        self._check_writable()
        names = sorted(values)
        assignments = ", ".join(f"{name} = ?" for name in names)
        params = (*(values[name] for name in names), self._clock.wall_s())
        sql = f"UPDATE meta SET {assignments}, updated_at = ? WHERE id = 1"  # noqa: S608
        self._commit(
            "meta",
            f"update meta ({', '.join(names)})",
            lambda conn: conn.execute(sql, params),
            single=True,
        )

    @_guarded("takeover mark")
    def mark_takeover(self) -> Writer:
        """Mark the log to take its run over from whichever writer has it (``walchannel takeover``).

        In one transaction the log gets a new random writer id (epoch 0), so
        every copy of it under the old id stays refused by the engine, and
        ``takeover_at`` is set: the channel's handshakes ask the engine to
        take the run over until the first answered one, which clears the
        mark in its own transaction (one shot: a mark left set would make
        two writers fence each other in turn). A fenced failure mark
        (``failed_reason`` :data:`~walchannel.log.state.FAILED_FENCED`) is
        cleared: the operator decided. SPEC "The log", "Operating tools".

        Returns:
            The log's new writer identity.

        Raises:
            RunCompletedError: the log is a tombstone: its run is done.
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        if self._state.completed:
            raise RunCompletedError(
                f"run {self._run_id}: completed (its Done was acked); {self._path} is a "
                "tombstone: there is nothing to take over"
            )
        writer = Writer(new_writer_id(), 0, True, self._writer.answered)
        now = self._clock.wall_s()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE meta SET writer_id = ?, writer_epoch = 0, takeover_at = ?,"
                " failed_at = CASE WHEN failed_reason LIKE ? THEN NULL ELSE failed_at END,"
                " failed_reason = CASE WHEN failed_reason LIKE ? THEN NULL ELSE failed_reason END,"
                " updated_at = ? WHERE id = 1",
                (writer.id, now, f"{FAILED_FENCED}%", f"{FAILED_FENCED}%", now),
            )

        def follow(_: None) -> None:
            self._writer = writer

        self._commit("meta", "mark the log to take the run over", work, then=follow)
        return writer

    # -- the quarantine: damaged rows and rows set aside -----------------------------------

    @_guarded("quarantine")
    def _quarantine(self, raw: tuple[Any, ...], substitute: Row, reason: str) -> Row:
        seq = raw[0]
        logger.error(
            "run %s: row seq %d in %s is damaged (%s); quarantined, sending %s instead",
            self._run_id,
            seq,
            self._path,
            reason,
            ROW_LOST_TYPE,
        )
        if self._forked:
            return substitute
        blob = encode_body("event", substitute.body)
        now = self._clock.wall_s()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*raw, reason, now),
            )
            conn.execute(
                "UPDATE rows SET kind = 'event', body = ?, crc32 = ? WHERE seq = ?",
                (blob, body_crc(blob), seq),
            )

        def follow(_: None) -> None:
            self._quarantined += 1
            self._state = self._state.row_replaced(seq)
            if self._unacked_bytes is not None:
                self._unacked_bytes += len(blob) - (len(raw[2]) if isinstance(raw[2], bytes) else 0)

        try:
            self._commit("quarantine", f"quarantine seq {seq}", work, then=follow)
        except WalWriteError as exc:
            # The substitute still goes out; the damaged row stays for next time.
            logger.error("run %s: cannot quarantine seq %d: %s", self._run_id, seq, exc)
            return substitute
        return Row(seq, "event", substitute.body, substitute.appended_at, len(blob))

    @_guarded("set-aside")
    def set_aside(self, /, seq: int, reason: str, **details: str | int) -> Row:
        """Move a good row that can never be delivered into the quarantine.

        For a row the engine refuses for its size (docs/design.md): in one
        transaction the row, body and all, goes to the ``quarantine`` table
        with ``reason`` (recoverable with ``walchannel export --quarantined``)
        and its place in ``rows`` is taken by a ``walchannel.row_lost`` event
        (severity ``error``, payload: ``seq``, ``reason`` and ``details``) at
        the same seq, so the engine's sequence goes on and the loss is
        visible. The caller logs it. Never for ``done``: a log keeps its
        ``Done``.

        Args:
            seq: an unacked row's seq.
            reason: why (stored and sent).
            details: more payload fields, e.g. ``kind``, ``size``, ``limit``.

        Returns:
            The substitute row.

        Raises:
            ValueError: no unacked row ``seq``, or it is the ``done`` row.
            WalCorruptError: SQLite cannot read the row.
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        conn = self._conn
        try:
            raw = conn.execute(
                "SELECT seq, kind, body, crc32, appended_at FROM rows WHERE seq = ? AND seq > ?",
                (seq, self._state.last_acked),
            ).fetchone()
        except sqlite3.Error as exc:
            raise WalCorruptError(str(self._path), f"cannot read row seq {seq}: {exc}") from None
        if raw is None:
            raise ValueError(f"run {self._run_id}: no unacked row at seq {seq} to set aside")
        if raw[1] == "done":
            raise ValueError(
                f"run {self._run_id}: seq {seq} is the run's Done; it is never set aside"
            )
        body = row_lost_body(seq, reason, **details)
        carried = carried_marker(raw[2], raw[3])
        if carried is not None:
            # The marker the row carried for the engine stays at its seq: the
            # engine's resume point must not skip its transaction (SPEC "The
            # engine keeps the resume point").
            body["progress"] = carried
        blob = encode_body("event", body)
        now = self._clock.wall_s()

        def work(conn: sqlite3.Connection) -> None:
            # Plain INSERT: an earlier quarantined body at this seq is never replaced.
            conn.execute("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)", (*raw, reason, now))
            conn.execute(
                "UPDATE rows SET kind = 'event', body = ?, crc32 = ? WHERE seq = ?",
                (blob, body_crc(blob), seq),
            )

        def follow(_: None) -> None:
            self._quarantined += 1
            if self._unacked_bytes is not None:
                self._unacked_bytes += len(blob) - len(raw[2])

        self._commit("set_aside", f"set aside seq {seq}", work, then=follow)
        return Row(seq, "event", body, row_time(raw[4]), len(blob))

    def quarantined(self) -> list[tuple[int, str]]:
        """Return ``(seq, reason)`` of every quarantined row.

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: SQLite cannot read the ``quarantine`` table.
        """
        self._check_open()
        try:
            held = self._conn.execute("SELECT seq, reason FROM quarantine ORDER BY seq").fetchall()
        except sqlite3.Error as exc:
            raise WalCorruptError(str(self._path), f"cannot read the quarantine: {exc}") from None
        return [(int(s), str(r)) for s, r in held]

    # -- reads -----------------------------------------------------------------------------

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

    def oldest_unacked_age_s(self, after_seq: int = 0) -> float | None:
        """How old the oldest unacked row above ``after_seq`` is (seconds); reads only.

        Dated by its ``CLOCK_BOOTTIME`` reading when it was committed in this
        boot, so a wall-clock step (NTP, a VM resume) changes nothing; a row
        of an earlier boot, or of a writer before boot times were stored, is
        dated by its wall-clock time (:func:`walchannel.clock.age_s`). Unlike
        :meth:`unacked`, a damaged row is not quarantined here (that is a
        write): only its times are read.

        Args:
            after_seq: look at rows with ``seq > after_seq`` (and above the
                stored cursor).

        Returns:
            Seconds, or None when there is no such row (or its time is not a number).

        Raises:
            ChannelClosedError: the log is closed.
            WalCorruptError: SQLite cannot read the rows.
        """
        self._check_open()
        try:
            row = self._conn.execute(
                "SELECT appended_at, appended_boot FROM rows WHERE seq > ? ORDER BY seq LIMIT 1",
                (self._state.read_after(after_seq),),
            ).fetchone()
        except sqlite3.Error as exc:
            raise WalCorruptError(str(self._path), f"cannot read rows: {exc}") from None
        if row is None or not isinstance(row[0], int | float):
            return None
        boot_at = float(row[1]) if isinstance(row[1], int | float) else None
        return age_s(self._clock, wall_at=float(row[0]), boot_at=boot_at, boot_id=self._boot_id)

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

    # -- giving disk back ------------------------------------------------------------------

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
            empty, or the log has no file of its own
            (:meth:`on_connection`: nothing to give back). False when
            ``max_pages`` were given back and more are left (the file has
            shrunk: call again), a reader held it off, an error stopped it,
            or the log is closed or not this process's (a forked child).

        Raises:
            ValueError: ``max_pages`` is below 1.
        """
        if self._closed or self._forked:
            return False
        if self._lock is None:
            return True  # no file of its own (on_connection): nothing to give back
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

    # -- closing ---------------------------------------------------------------------------

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


def _writer_of(meta: RunMeta, writer_id: str) -> Writer:
    """The writer identity the meta row stores, with ``writer_id`` (a new one when it has none)."""
    return Writer(
        writer_id,
        meta.writer_epoch or 0,
        meta.takeover_at is not None,
        meta.answered_at is not None,
    )
