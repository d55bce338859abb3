"""Read-only views of run logs, for ``walchannel inspect`` and ``walchannel export``.

A reader here must never disturb a live run, nor change anything its writer
needs, whoever runs it: the harness's user, another user, or root (SPEC
"Operating tools"; docs/operations.md "Reading as another user, or as
root"):

- Nothing is ever written, and no file is ever created in the log folder.
  A WAL-mode database read through SQLite's shared memory needs its
  ``-wal`` and ``-shm``; SQLite creates them when missing, owned by the
  reader, which then locks the harness out of its own log (and fails in a
  read-only folder). So :class:`LogReader` picks a view that needs no new
  file (https://sqlite.org/wal.html#readonly, https://sqlite.org/uri.html):

  * no ``-wal`` (a log closed cleanly), or an empty one and no ``-shm``:
    the database file alone holds everything: ``immutable=1`` (no locks,
    no sidecars). Every read is checked afterwards: if a writer opened the
    log meanwhile (its ``-wal`` or ``-shm`` appeared, or the file changed),
    the reader reopens with the view that now applies and reads again.
  * ``-wal`` and ``-shm`` present: ``mode=ro`` through them, as SQLite
    readers do (read-only ``-shm`` works since SQLite 3.22).
  * a non-empty ``-wal`` without its ``-shm``: the file and its ``-wal``
    are copied into a private temporary folder and the copy is read; the
    copy counts only if no ``-shm`` appeared and neither file changed
    while copying (a writer always creates the ``-shm``).

- While a reader is open it holds a read lock (``F_OFD_SETLK``) on the
  bytes SQLite's own readers lock in the database file. A writer closing
  meanwhile then cannot take its exclusive lock, so it neither deletes its
  ``-wal``/``-shm`` (which SQLite would recreate for the reader) nor can a
  writer that came and went go unnoticed. A reader opens the database
  ``mode=ro``: it cannot take that exclusive lock either, so it never
  checkpoints nor deletes the writer's ``-wal``.
- ``PRAGMA query_only`` on every connection.
- The owner lock is never taken: liveness comes from
  :func:`walchannel.lock.probe_owner` (``F_OFD_GETLK`` on ``<log>.lock``).
- Every read transaction is a handful of indexed lookups, or one bounded
  batch of rows, so the owner's checkpoints are never starved: in WAL mode a
  checkpoint cannot copy past a reader's snapshot nor restart the ``-wal``
  while a reader holds one, and a ``TRUNCATE`` checkpoint waits on readers
  (https://sqlite.org/wal.html#concurrency).
- The format is read through :mod:`walchannel.log_format`
  (:func:`~walchannel.log_format.check_header`,
  :func:`~walchannel.log_format.read_meta`,
  :func:`~walchannel.log_format.decode_row`,
  :func:`~walchannel.log_format.quick_check`), never re-implemented. A
  damaged row is shown as damaged (it is not quarantined: that is a write,
  and the owner's job).
- A log that cannot be read for a reason other than damage (permissions,
  a lock held too long) raises :class:`LogUnreadableError`, never
  :class:`~walchannel.errors.WalCorruptError`: ``inspect`` calls it
  ``unreadable``, not ``corrupt``.

This module imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import sqlite3
import stat
import struct
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Self, TypeVar

from walchannel import files
from walchannel.errors import WalCorruptError
from walchannel.lock import LockOwner, probe_owner
from walchannel.log_format import (
    FAILED_ENGINE_BEHIND,
    ROWS_AFTER,
    Row,
    RunMeta,
    check_header,
    decode_row,
    quick_check,
    read_meta,
)
from walchannel.protocol import next_seq_after

__all__ = [
    "ALERT_STATES",
    "DEFAULT_STUCK_AFTER_S",
    "JSON_KEYS",
    "LogReader",
    "LogUnreadableError",
    "PathError",
    "QuarantinedRow",
    "RunReport",
    "STATES",
    "ShownRow",
    "align_table",
    "format_age",
    "format_size",
    "inspect_log",
    "list_logs",
    "run_id_from_name",
]

#: Every state, most urgent first: a run gets the first that applies.
STATES: Final = (
    "corrupt",
    "unreadable",
    "failed",
    "orphaned",
    "stuck",
    "done-pending",
    "active",
    "idle",
    "completed",
)
#: States that make ``inspect`` exit 1.
ALERT_STATES: Final = frozenset({"corrupt", "unreadable", "failed", "orphaned", "stuck"})
# States whose DETAIL shows the last error.
_ERROR_STATES: Final = frozenset({"failed", "orphaned", "stuck", "done-pending"})
#: ``--stuck-after`` default (seconds).
DEFAULT_STUCK_AFTER_S: Final = 120.0
#: The keys of one ``inspect --json`` object, in order (SPEC "Operating tools").
JSON_KEYS: Final = (
    "run_id",
    "file",
    "state",
    "reason",
    "next_seq",
    "last_acked_seq",
    "unacked_count",
    "unacked_bytes",
    "oldest_unacked_age_s",
    "last_ack_at",
    "last_engine_addr",
    "last_error",
    "last_error_at",
    "locked_by",
    "quarantined",
    "file_bytes",
)

# Rows per read transaction when summing or reading the backlog: large
# enough to be quick, small enough that no snapshot is held for long.
_BATCH: Final = 2048
# How long a read waits on a lock SQLite holds briefly (WAL recovery) (s).
_READ_BUSY_TIMEOUT_S: Final = 2.0
# How often a reader reopens a log whose writer keeps coming and going.
_VIEW_ATTEMPTS: Final = 5
# The bytes SQLite's readers read-lock and its exclusive lock write-locks in
# a database file (sqlite3.c: SHARED_FIRST = PENDING_BYTE + 2, SHARED_SIZE).
_SQLITE_SHARED_FIRST: Final = 0x40000000 + 2
_SQLITE_SHARED_SIZE: Final = 510
_FLOCK: Final = "hhqqi4x"  # struct flock on Linux; l_pid 0 for OFD locks
# SQLite result codes (primary, low byte) that mean "cannot read here", not damage.
_NOT_DAMAGE: Final = frozenset(
    {
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_AUTH,
    }
)
# IOERR extended codes about locks, shared memory and access, not the data.
_IOERR_NOT_DAMAGE: Final = frozenset(
    {
        sqlite3.SQLITE_IOERR_ACCESS,
        sqlite3.SQLITE_IOERR_LOCK,
        sqlite3.SQLITE_IOERR_RDLOCK,
        sqlite3.SQLITE_IOERR_SHMOPEN,
        sqlite3.SQLITE_IOERR_SHMSIZE,
        sqlite3.SQLITE_IOERR_SHMMAP,
        sqlite3.SQLITE_IOERR_SHMLOCK,
        sqlite3.SQLITE_IOERR_NOMEM,
    }
)

# os.access() asks for the effective uid (sudo, setuid) where it can.
_EFFECTIVE_IDS: Final = os.access in os.supports_effective_ids

_T = TypeVar("_T")


def format_age(seconds: float | None) -> str:
    """Return a duration as ``45s``, ``3m12s``, ``2h05m`` or ``3d04h`` (``-`` for None).

    Args:
        seconds: the duration (seconds); negative values count as 0.
    """
    if seconds is None:
        return "-"
    total = int(max(0.0, seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def align_table(columns: Sequence[tuple[str, bool]], rows: Sequence[Sequence[str]]) -> list[str]:
    """Return the lines of a table: the header, then ``rows``, columns padded to fit.

    Args:
        columns: ``(header, right-aligned)`` per column; the last column is
            free text, never padded.
        rows: the cells of each row, one per column.
    """
    table = [tuple(h for h, _ in columns), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns) - 1)]
    lines = []
    for row in table:
        cells = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, (_, right) in zip(row, widths, columns, strict=False)
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def format_size(size: int | None) -> str:
    """Return a byte count as ``512 B``, ``1.2 KiB``, ``3.4 MiB`` … (``-`` for None).

    Args:
        size: the size (bytes).
    """
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


class PathError(Exception):
    """The PATH given to ``inspect``/``prune`` cannot be read (the CLI exits 2)."""


class LogUnreadableError(Exception):
    """A log this process cannot read, for a reason other than damage.

    Permissions (the file, its ``-wal`` or ``-shm``), a lock held for too
    long, no room for a private copy: the file may be a perfectly good log,
    so ``inspect`` shows it as ``unreadable``, never ``corrupt``.

    Attributes:
        path: the log file.
        reason: what could not be read and why.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def run_id_from_name(path: Path) -> str | None:
    """Return the run id a log's file name claims (``<run_id>.wal.sqlite3``), or None."""
    name = path.name
    if not name.endswith(files.LOG_SUFFIX):
        return None
    candidate = name[: -len(files.LOG_SUFFIX)]
    try:
        return files.check_run_id(candidate)
    except ValueError:
        return None


def list_logs(path: Path) -> list[Path]:
    """Return the logs to look at: ``path`` itself, or the logs directly in the folder.

    A folder is not searched recursively; only names ending in
    ``.wal.sqlite3`` count, and hidden names (the ``.<log>.creating-*``
    temporaries of a log being built, and anything else starting with a
    dot) are skipped. A file is returned as it is, whatever its name.

    Args:
        path: a log folder or one log file.

    Returns:
        The paths, sorted by name.

    Raises:
        PathError: ``path`` does not exist or cannot be listed (names it).
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise PathError(f"{path}: no such file or folder") from None
    except OSError as exc:
        raise PathError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        return [path]
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        raise PathError(f"{path}: cannot list the folder: {exc.strerror or exc}") from None
    return [
        path / name
        for name in names
        if name.endswith(files.LOG_SUFFIX) and not name.startswith(".")
    ]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """One consistent read of the meta row and the ends of the backlog."""

    meta: RunMeta
    top_seq: int | None
    top_kind: str | None
    oldest_appended_at: float | None
    quarantined: int
    # (seq, reason) of the row quarantined last, if any.
    last_quarantined: tuple[int, str] | None = None


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc)


# (inode, size, mtime in ns) of a file, or None when it does not exist.
_FileId = tuple[int, int, int] | None


def _file_id(path: str | Path) -> _FileId:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _not_damage(exc: sqlite3.Error) -> bool:
    """True when SQLite's error is about access or locks, not the file's content."""
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return False
    return (code & 0xFF) in _NOT_DAMAGE or code in _IOERR_NOT_DAMAGE


class LogReader:
    """A read-only handle on one log file; never takes the owner lock, never creates a file.

    Open it, read, close it (a context manager). Every method runs short
    read transactions; SQLite errors come out as
    :class:`~walchannel.errors.WalCorruptError` (damage) or
    :class:`LogUnreadableError` (permissions, locks), with path and reason.
    How it reads without creating the ``-wal``/``-shm`` SQLite would, and
    what it locks meanwhile: this module's docstring.

    Meant for a process of its own (the CLI): in a process that also has the
    log open through SQLite, closing the reader's descriptor on the file
    drops that process's POSIX locks on it (fcntl(2)).

    Args:
        path: the log file.
        run_id: the run it must belong to (None: any).

    Raises:
        WalCorruptError: the file is a symlink or not a regular file, or
            fails :func:`walchannel.log_format.check_header`.
        LogUnreadableError: this process cannot read the file, its ``-wal``
            or its ``-shm`` (the reason names which, and the file's owner).
    """

    def __init__(self, path: Path, run_id: str | None = None) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._copy_dir: str | None = None
        # The (log, -wal, -shm) ids an immutable view is valid for; None: any.
        self._watch: tuple[_FileId, _FileId, _FileId] | None = None
        self._fd: int | None = None
        try:
            st = path.lstat()
        except OSError as exc:
            raise LogUnreadableError(str(path), f"cannot read: {_strerror(exc)}") from None
        if stat.S_ISLNK(st.st_mode):
            raise WalCorruptError(str(path), "is a symbolic link; refusing to follow it")
        if not stat.S_ISREG(st.st_mode):
            raise WalCorruptError(str(path), "not a regular file")
        self._owner_uid = st.st_uid
        # SQLite's own "unable to open" hides the cause: ask the kernel first.
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise self._denied("cannot read", exc) from None
        try:
            self._hold_readers_lock()
            # The first read opens the view; errors are sorted into damage or not.
            self._read("header", lambda conn: conn.execute("PRAGMA schema_version").fetchall())
            self._read("header", lambda conn: check_header(conn, path, run_id))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection, drop the read lock, remove any private copy (idempotent)."""
        self._close_view()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    # -- the view -----------------------------------------------------------

    def _denied(self, what: str, exc: OSError) -> LogUnreadableError:
        reason = f"{what}: {_strerror(exc)}"
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason += f" (the log belongs to uid {self._owner_uid}; run as that user or root)"
        return LogUnreadableError(str(self.path), reason)

    def _hold_readers_lock(self) -> None:
        """Read-lock the bytes SQLite's readers lock, so no closing writer deletes its sidecars."""
        assert self._fd is not None
        request = struct.pack(
            _FLOCK, fcntl.F_RDLCK, os.SEEK_SET, _SQLITE_SHARED_FIRST, _SQLITE_SHARED_SIZE, 0
        )
        deadline = time.monotonic() + _READ_BUSY_TIMEOUT_S
        while True:
            try:
                fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, request)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise LogUnreadableError(
                        str(self.path), f"cannot lock it for reading: {_strerror(exc)}"
                    ) from None
            # A writer holds SQLite's exclusive lock only while it checkpoints at close.
            if time.monotonic() >= deadline:
                raise LogUnreadableError(
                    str(self.path),
                    f"another process held it exclusively for {_READ_BUSY_TIMEOUT_S:g} s; "
                    "try again",
                )
            time.sleep(0.01)

    def _sidecars(self) -> tuple[_FileId, _FileId, _FileId]:
        return (_file_id(self.path), _file_id(f"{self.path}-wal"), _file_id(f"{self.path}-shm"))

    def _connect(self, path: Path, query: str) -> None:
        try:
            conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?{query}",
                uri=True,
                isolation_level=None,
                timeout=_READ_BUSY_TIMEOUT_S,
            )
        except sqlite3.Error as exc:
            raise self._fail("header", exc) from None
        try:
            conn.execute("PRAGMA query_only = 1")
        except sqlite3.Error as exc:
            conn.close()
            raise self._fail("header", exc) from None
        self._conn = conn

    def _check_readable(self, path: str, what: str) -> None:
        # Name the real cause: SQLite would only say "unable to open database file".
        if not os.access(path, os.R_OK, effective_ids=_EFFECTIVE_IDS):
            code = errno.EACCES if os.path.lexists(path) else errno.ENOENT
            raise self._denied(f"cannot read its {what}", OSError(code, os.strerror(code)))

    def _open_view(self) -> bool:
        """Connect through the view the sidecars allow; False: they changed, try again."""
        try:
            seen = self._sidecars()
        except OSError as exc:
            raise self._denied("cannot read", exc) from None
        log, wal, shm = seen
        if log is None:
            raise LogUnreadableError(str(self.path), "removed while being read")
        if wal is None or (wal[1] == 0 and shm is None):
            # The main file holds every commit: read it alone, no locks, no sidecars.
            self._connect(self.path, "mode=ro&immutable=1")
            self._watch = seen
        elif shm is not None:
            self._check_readable(f"{self.path}-wal", "-wal")
            self._check_readable(f"{self.path}-shm", "-shm")
            self._connect(self.path, "mode=ro")
            self._watch = None
        else:
            # Commits in a -wal without its -shm: SQLite would create the -shm.
            copy = self._copy()
            if copy is None or self._sidecars() != seen:
                return False  # a writer came meanwhile: the copy may be torn
            self._connect(copy, "mode=ro")
            self._watch = None
        return True

    def _copy(self) -> Path | None:
        """Copy the log and its -wal into a private folder; None if the -wal went away."""
        assert self._fd is not None
        try:
            # mkdtemp makes the folder 0700: the copy holds the run's findings.
            self._copy_dir = tempfile.mkdtemp(prefix="walchannel-read-")
            copy = Path(self._copy_dir) / self.path.name
            with open(copy, "wb") as out:
                offset = 0
                while chunk := os.pread(self._fd, 1 << 20, offset):
                    out.write(chunk)
                    offset += len(chunk)
            try:
                source = open(f"{self.path}-wal", "rb")  # noqa: SIM115
            except FileNotFoundError:
                return None
            with source, open(f"{copy}-wal", "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        except OSError as exc:
            self._close_view()
            where = f"{exc.filename}: " if exc.filename else ""
            raise LogUnreadableError(
                str(self.path),
                "its -wal holds commits but its -shm is missing (the writer died and the -shm "
                "was removed, or the files were copied without it); reading it in place would "
                "create the -shm, and copying it to read the copy failed: "
                f"{where}{_strerror(exc)}",
            ) from None
        return copy

    def _close_view(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None
        self._watch = None

    def _view_changed(self) -> bool:
        if self._watch is None:
            return False
        try:
            return self._sidecars() != self._watch
        except OSError:
            return True

    def _read(self, what: str, op: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``op`` on the view; once more on a fresh view if a writer came meanwhile."""
        for _ in range(_VIEW_ATTEMPTS):
            if self._conn is None and not self._open_view():
                self._close_view()
                continue
            conn = self._conn
            assert conn is not None
            try:
                result = op(conn)
            except (sqlite3.Error, WalCorruptError) as exc:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                if self._view_changed():
                    self._close_view()
                    continue
                if isinstance(exc, WalCorruptError):
                    raise
                raise self._fail(what, exc) from None
            if not self._view_changed():
                return result
            self._close_view()
        raise LogUnreadableError(
            str(self.path), "a writer kept opening it while it was read; try again"
        )

    def _fail(self, what: str, exc: sqlite3.Error) -> WalCorruptError | LogUnreadableError:
        if _not_damage(exc):
            name = getattr(exc, "sqlite_errorname", "")
            return LogUnreadableError(str(self.path), f"cannot read {what}: {exc} ({name})")
        if what == "header":
            return WalCorruptError(str(self.path), f"not a usable SQLite database: {exc}")
        return WalCorruptError(str(self.path), f"cannot read {what}: {exc}")

    # -- reads ----------------------------------------------------------------

    def meta(self) -> RunMeta:
        """Return the meta row.

        Raises:
            WalCorruptError: it cannot be read.
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """
        return self._read("meta", lambda conn: read_meta(conn, self.path))

    def snapshot(self) -> _Snapshot:
        """Read meta and the ends of the backlog in one short read transaction."""

        def op(conn: sqlite3.Connection) -> _Snapshot:
            conn.execute("BEGIN")
            meta = read_meta(conn, self.path)
            top = conn.execute("SELECT seq, kind FROM rows ORDER BY seq DESC LIMIT 1").fetchall()
            oldest = conn.execute(
                "SELECT appended_at FROM rows WHERE seq > ? ORDER BY seq LIMIT 1",
                (meta.last_acked_seq,),
            ).fetchall()
            quarantined = conn.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
            last_q = conn.execute(
                "SELECT seq, reason FROM quarantine ORDER BY quarantined_at DESC, seq DESC LIMIT 1"
            ).fetchall()
            conn.execute("COMMIT")
            return _Snapshot(
                meta=meta,
                top_seq=int(top[0][0]) if top else None,
                top_kind=str(top[0][1]) if top else None,
                oldest_appended_at=float(oldest[0][0]) if oldest else None,
                quarantined=int(quarantined),
                last_quarantined=(int(last_q[0][0]), str(last_q[0][1])) if last_q else None,
            )

        return self._read("meta and rows", op)

    def unacked_bytes(self, after_seq: int, upto_seq: int) -> int:
        """Sum the body sizes of the rows in ``(after_seq, upto_seq]`` (bytes).

        Reads a batch of row sizes per read transaction (no blob is loaded).
        Rows the owner acks meanwhile are simply not counted.
        """
        batches = self._batches(
            "rows",
            "SELECT seq, length(body) FROM rows WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            after_seq,
            (upto_seq,),
        )
        return sum(int(size or 0) for _, size in batches)

    def rows(self, after_seq: int, limit: int | None = None) -> Iterator[tuple[Row, str | None]]:
        """Yield ``(row, damage)`` for the rows above ``after_seq``, in seq order.

        ``damage`` is None for a good row; for a row whose CRC, msgpack or
        kind does not check out it is the reason, and ``row`` is the
        ``walchannel.row_lost`` substitute the channel would send instead.
        One read transaction per batch.

        Args:
            after_seq: yield rows with ``seq > after_seq``.
            limit: stop after this many rows (None: all).

        Raises:
            WalCorruptError: SQLite cannot read the rows.
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """
        for raw in self._batches("rows", ROWS_AFTER, after_seq, limit=limit):
            yield decode_row(*raw)

    def quarantined(self, limit: int | None = None) -> Iterator[QuarantinedRow]:
        """Yield the rows of the ``quarantine`` table in seq order, bodies included.

        Damaged rows and rows the engine refused for their size (each went
        out as a ``walchannel.row_lost`` event in its place) stay there,
        also after the run completed. One read transaction per batch.

        Args:
            limit: stop after this many rows (None: all).

        Raises:
            WalCorruptError: SQLite cannot read the table.
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """
        batches = self._batches(
            "quarantine",
            "SELECT seq, kind, body, crc32, appended_at, reason, quarantined_at"
            " FROM quarantine WHERE seq > ? ORDER BY seq LIMIT ?",
            0,  # seqs start at 1
            limit=limit,
        )
        for raw in batches:
            yield _quarantined_row(*raw)

    def _batches(
        self,
        what: str,
        sql: str,
        after_seq: int,
        bounds: tuple[Any, ...] = (),
        *,
        limit: int | None = None,
    ) -> Iterator[Any]:
        """Yield the result rows of ``sql`` in seq order, one read transaction per batch.

        ``sql`` selects ``seq`` first and takes ``seq > ?``, then ``bounds``,
        then ``LIMIT ?``; each batch starts after the last seq of the one
        before, so rows the owner acks meanwhile are simply not seen.
        """
        cursor = after_seq
        remaining = limit
        while remaining is None or remaining > 0:
            size = _BATCH if remaining is None else min(_BATCH, remaining)
            params = (cursor, *bounds, size)

            def fetch(conn: sqlite3.Connection, params: tuple[Any, ...] = params) -> list[Any]:
                return conn.execute(sql, params).fetchall()

            batch = self._read(what, fetch)
            yield from batch
            if len(batch) < size:
                return
            if remaining is not None:
                remaining -= len(batch)
            cursor = int(batch[-1][0])

    def quick_check(self) -> list[str]:
        """Run ``PRAGMA quick_check`` (reads every page) and return its complaints.

        One read transaction as long as the file: opt-in (``--verify``).

        Returns:
            An empty list when SQLite finds the file sound.

        Raises:
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """
        try:
            return self._read("pages", quick_check)
        except WalCorruptError as exc:
            return [exc.reason]


@dataclass(frozen=True, slots=True)
class ShownRow:
    """One unacked row as ``inspect --show`` prints it.

    Attributes:
        seq: its seq.
        kind: the stored kind.
        age_s: how long ago it was committed (seconds).
        size: its msgpack body size (bytes).
        body: the decoded body (the ``row_lost`` substitute's when damaged).
        damage: why the row does not check out, or None.
    """

    seq: int
    kind: str
    age_s: float
    size: int
    body: dict[str, Any]
    damage: str | None


@dataclass(frozen=True, slots=True)
class QuarantinedRow:
    """One row of a log's ``quarantine`` table (``inspect --show``, ``export --quarantined``).

    Attributes:
        seq: its seq (a ``walchannel.row_lost`` event took it on the wire).
        kind: the stored kind (None if unreadable).
        body: the decoded body, or None when its CRC or msgpack does not
            check out (then ``raw`` holds the stored bytes).
        raw: the stored bytes of a body that does not decode, else None.
        appended_at: when the row was committed (unix seconds; None if unreadable).
        reason: why it was quarantined.
        quarantined_at: when (unix seconds).
        size: the stored body's size (bytes).
    """

    seq: int
    kind: str | None
    body: dict[str, Any] | None
    raw: bytes | None
    appended_at: float | None
    reason: str
    quarantined_at: float
    size: int


def _quarantined_row(
    seq: Any,
    kind: Any,
    blob: Any,
    crc: Any,
    appended_at: Any,
    reason: Any,
    quarantined_at: Any,
) -> QuarantinedRow:
    body: dict[str, Any] | None = None
    raw: bytes | None = None
    if isinstance(blob, bytes) and isinstance(kind, str) and isinstance(crc, int):
        row, damage = decode_row(int(seq), kind, blob, crc, 0.0)
        if damage is None:
            body = row.body
    if body is None and isinstance(blob, bytes):
        raw = blob
    return QuarantinedRow(
        seq=int(seq),
        kind=kind if isinstance(kind, str) else None,
        body=body,
        raw=raw,
        appended_at=float(appended_at) if isinstance(appended_at, int | float) else None,
        reason=str(reason),
        quarantined_at=float(quarantined_at),
        size=len(blob) if isinstance(blob, bytes) else 0,
    )


@dataclass(frozen=True, slots=True)
class RunReport:
    """What ``inspect`` says about one log. Times are unix seconds, sizes bytes.

    The attributes up to ``file_bytes`` are exactly the ``--json`` keys
    (SPEC "Operating tools"); ``locked_by`` is the live owner or None.
    ``shown`` holds the rows ``--show N`` decoded and ``shown_quarantined``
    the quarantined rows it lists (human output only).
    """

    run_id: str | None
    file: str
    state: str
    reason: str | None
    next_seq: int | None = None
    last_acked_seq: int | None = None
    unacked_count: int | None = None
    unacked_bytes: int | None = None
    oldest_unacked_age_s: float | None = None
    last_ack_at: float | None = None
    last_engine_addr: str | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    locked_by: LockOwner | None = None
    quarantined: int | None = None
    file_bytes: int = 0
    shown: tuple[ShownRow, ...] = field(default=())
    shown_quarantined: tuple[QuarantinedRow, ...] = field(default=())

    @property
    def urgency(self) -> int:
        """The state's rank: 0 is the most urgent."""
        return STATES.index(self.state)

    @property
    def sort_key(self) -> tuple[int, float, str]:
        """Most urgent state first; within a state, the oldest backlog first."""
        return (self.urgency, -(self.oldest_unacked_age_s or 0.0), self.file)

    def last_ack_text(self, now: float) -> str:
        """The LAST ACK cell: ``"3m05s ago"``, ``"never"``, or ``"-"`` when unread.

        Args:
            now: the time to measure from (unix seconds).
        """
        if self.last_ack_at is not None:
            return f"{format_age(now - self.last_ack_at)} ago"
        return "-" if self.state in ("corrupt", "unreadable") else "never"

    def owner_text(self) -> str:
        """The OWNER cell: ``"pid 4242"``, ``"pid 4242@host"`` for another host, or ``"-"``."""
        owner = self.locked_by
        if owner is None:
            return "-"
        pid = "pid ?" if owner.pid is None else f"pid {owner.pid}"
        if owner.host and owner.host != socket.gethostname():
            return f"{pid}@{owner.host}"
        return pid

    def detail(self, now: float) -> str:
        """The DETAIL cell: ``reason``, plus the last error where the state calls for it.

        The last error is added for a run that needs attention (an alert
        state, or ``done-pending``), with its age, and says so when rows
        were acked after it (an error the channel got past), so an old
        error is not read as the current one.

        Args:
            now: the time to measure from (unix seconds).
        """
        detail = self.reason or ""
        error = self.last_error
        if not error or self.state not in _ERROR_STATES or error in detail:
            return detail
        when = ""
        if self.last_error_at is not None:
            when = f" {format_age(now - self.last_error_at)} ago"
            if self.last_ack_at is not None and self.last_ack_at > self.last_error_at:
                when += ", rows acked since"
        text = f"last error ({when.strip()}): {error}" if when else f"last error: {error}"
        return f"{detail}; {text}" if detail else text

    def to_json(self) -> dict[str, Any]:
        """Return the ``inspect --json`` object: exactly :data:`JSON_KEYS`."""
        out: dict[str, Any] = {}
        for key in JSON_KEYS:
            value = getattr(self, key)
            if key == "locked_by" and value is not None:
                value = {"pid": value.pid, "host": value.host}
            out[key] = value
        return out


def _unread(
    path: Path,
    run_id: str | None,
    exc: WalCorruptError | LogUnreadableError,
    owner: LockOwner | None,
) -> RunReport:
    """The report of a log that could not be read: ``corrupt`` for damage, else ``unreadable``."""
    return RunReport(
        run_id=run_id,
        file=str(path),
        state="corrupt" if isinstance(exc, WalCorruptError) else "unreadable",
        reason=exc.reason,
        locked_by=owner,
        file_bytes=files.disk_bytes(path),
    )


def _probe(path: Path) -> LockOwner | None:
    try:
        return probe_owner(files.lock_path(path))
    except OSError:
        # Cannot tell: assume someone holds it, so nothing suggests taking
        # over a run that may be live (flush would be refused anyway).
        return LockOwner(None, None)


def _state(
    snap: _Snapshot,
    owner: LockOwner | None,
    unacked: int,
    oldest_age: float | None,
    stuck_after_s: float,
) -> tuple[str, str | None]:
    """Pick the first state that applies (SPEC "Operating tools")."""
    meta = snap.meta
    if meta.failed_at is not None:
        # failed_reason names the cause; a log written before it had only
        # last_error, which a later error may have replaced.
        cause = meta.failed_reason
        if cause and meta.last_error and meta.last_error not in cause:
            return "failed", f"{cause}; the channel stopped: {meta.last_error}"
        if cause:
            return "failed", cause
        if meta.last_error:
            return "failed", f"the channel stopped: {meta.last_error}"
        return "failed", FAILED_ENGINE_BEHIND
    if owner is None and unacked > 0:
        return "orphaned", f"no live owner and {unacked} unacked row(s)"
    if oldest_age is not None and oldest_age > stuck_after_s:
        return "stuck", (
            f"oldest unacked row is {format_age(oldest_age)} old "
            f"(stuck after {format_age(stuck_after_s)})"
        )
    if unacked > 0 and snap.top_kind == "done":
        return "done-pending", f"Done logged at seq {snap.top_seq}, not yet acked"
    if owner is not None:
        return "active", None
    # "idle" and "completed" both have no owner and nothing unacked: a
    # tombstone is "completed", anything else "idle".
    if meta.completed_at is not None:
        return "completed", None
    return "idle", None


def inspect_log(
    path: Path,
    *,
    now: float | None = None,
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
    verify: bool = False,
    show: int = 0,
) -> RunReport:
    """Look at one log without disturbing it and say what state its run is in.

    Args:
        path: the log file.
        now: the reference time (unix seconds; default: now).
        stuck_after_s: an owned run whose oldest unacked row is older than
            this is ``stuck`` (seconds).
        verify: also run ``PRAGMA quick_check`` (reads every page).
        show: decode this many of the oldest unacked rows into ``shown``,
            and as many quarantined rows into ``shown_quarantined``.

    Returns:
        The report; a file that cannot be read as a walchannel log is
        ``corrupt`` with the reason, one this process may not read (its
        permissions, a lock) is ``unreadable`` with the reason (never an
        exception).
    """
    now = time.time() if now is None else now
    named = run_id_from_name(path)
    owner = _probe(path)
    try:
        reader = LogReader(path, named)
    except (WalCorruptError, LogUnreadableError) as exc:
        return _unread(path, named, exc, owner)
    with reader:
        try:
            snap = reader.snapshot()
            meta = snap.meta
            acked = meta.last_acked_seq
            top = snap.top_seq if snap.top_seq is not None and snap.top_seq > acked else acked
            unacked = top - acked
            size = reader.unacked_bytes(acked, top) if unacked else 0
            shown: tuple[ShownRow, ...] = ()
            if show > 0 and unacked:
                shown = tuple(
                    ShownRow(
                        row.seq,
                        row.kind if damage is None else "damaged",
                        max(0.0, now - row.appended_at),
                        row.size,
                        row.body,
                        damage,
                    )
                    for row, damage in reader.rows(acked, show)
                )
            shown_quarantined: tuple[QuarantinedRow, ...] = ()
            if show > 0 and snap.quarantined:
                shown_quarantined = tuple(reader.quarantined(show))
            complaints = reader.quick_check() if verify else []
        except (WalCorruptError, LogUnreadableError) as exc:
            return _unread(path, named, exc, owner)
    oldest_age = (
        max(0.0, now - snap.oldest_appended_at) if snap.oldest_appended_at is not None else None
    )
    reason: str | None
    if complaints:
        more = f" (+{len(complaints) - 1} more)" if len(complaints) > 1 else ""
        state, reason = "corrupt", f"quick_check: {complaints[0]}{more}"
    else:
        state, reason = _state(snap, owner, unacked, oldest_age, stuck_after_s)
        if snap.last_quarantined is not None:
            # Never silent: whatever the state, say which row went to the quarantine.
            seq, why = snap.last_quarantined
            count = snap.quarantined
            note = (
                f"{count} row(s) in the quarantine, sent as walchannel.row_lost "
                f"(latest: seq {seq}: {why}; walchannel export --quarantined)"
            )
            reason = note if reason is None else f"{reason}; {note}"
    return RunReport(
        run_id=meta.run_id,
        file=str(path),
        state=state,
        reason=reason,
        next_seq=next_seq_after(max(meta.high_water, top), acked),
        last_acked_seq=acked,
        unacked_count=unacked,
        unacked_bytes=size,
        oldest_unacked_age_s=oldest_age,
        last_ack_at=meta.last_ack_at,
        last_engine_addr=meta.last_engine_addr,
        last_error=meta.last_error,
        last_error_at=meta.last_error_at,
        locked_by=owner,
        quarantined=snap.quarantined,
        file_bytes=files.disk_bytes(path),
        shown=shown,
        shown_quarantined=shown_quarantined,
    )
