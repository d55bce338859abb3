"""LogReader: reading a run log without writing, for ``inspect``, ``export`` and ``flush``.

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
  :func:`walchannel.log.lock.probe_owner` (``F_OFD_GETLK`` on ``<log>.lock``).
- Every read transaction is a handful of indexed lookups, or one bounded
  batch of rows, so the owner's checkpoints are never starved: in WAL mode a
  checkpoint cannot copy past a reader's snapshot nor restart the ``-wal``
  while a reader holds one, and a ``TRUNCATE`` checkpoint waits on readers
  (https://sqlite.org/wal.html#concurrency).
- The format is read through :mod:`walchannel.log.format`
  (:func:`~walchannel.log.format.check_header`,
  :func:`~walchannel.log.format.read_meta`,
  :func:`~walchannel.log.format.decode_row`,
  :func:`~walchannel.log.format.quick_check`), never re-implemented. A
  damaged row is shown as damaged (it is not quarantined: that is a write,
  and the owner's job); a damaged meta field is named, and
  ``snapshot(salvage=True)`` still reads the rows beside it.
- A log that cannot be read for a reason other than damage (permissions,
  a lock held too long) raises :class:`LogUnreadableError`, never
  :class:`~walchannel.errors.WalCorruptError`: ``inspect`` calls it
  ``unreadable``, not ``corrupt``.

What a reading says about the run (its state) is :mod:`walchannel.cli.inspection`'s.
This module imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import sqlite3
import stat
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self, TypeVar

from walchannel.errors import WalCorruptError
from walchannel.log import files
from walchannel.log.format import (
    ROWS_AFTER,
    MetaReading,
    Row,
    RunMeta,
    check_header,
    decode_row,
    not_damage,
    quick_check,
    read_meta,
    read_meta_fields,
    row_time,
    undecodable_text_kept,
)

__all__ = ["LogReader", "LogUnreadableError", "QuarantinedRow", "Snapshot", "run_id_from_name"]

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
# os.access() asks for the effective uid (sudo, setuid) where it can.
_EFFECTIVE_IDS: Final = os.access in os.supports_effective_ids

_T = TypeVar("_T")


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent read of the meta row and the ends of the backlog.

    ``reading`` is the meta row field by field; :attr:`meta` is it as a
    :class:`~walchannel.log.format.RunMeta`. Only ``snapshot(salvage=True)``
    returns a snapshot with damaged fields; ``top_seq`` and the oldest row
    are then read above the stored ack cursor if it reads, else above 0.
    """

    reading: MetaReading
    top_seq: int | None
    top_kind: str | None
    oldest_appended_at: float | None
    quarantined: int
    # (seq, reason) of the row quarantined last, if any.
    last_quarantined: tuple[int, str] | None = None
    # The oldest unacked row's CLOCK_BOOTTIME reading (the boot in meta.boot_id).
    oldest_appended_boot: float | None = None
    # The oldest unacked row's seq, and its time cells that are damaged
    # (not a number; an absent appended_boot is not damage).
    oldest_seq: int | None = None
    oldest_damaged: tuple[str, ...] = ()

    @property
    def meta(self) -> RunMeta:
        """The meta row.

        Raises:
            walchannel.log.format.MetaDamagedError: a field is damaged (only
                from ``snapshot(salvage=True)``).
        """
        return self.reading.meta()


# (inode, size, mtime in ns) of a file, or None when it does not exist.
_FileId = tuple[int, int, int] | None


def _file_id(path: str | Path) -> _FileId:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
            fails :func:`walchannel.log.format.check_header`.
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
            raise LogUnreadableError(
                str(path), f"cannot read: {files.describe_os_error(exc)}"
            ) from None
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
        reason = f"{what}: {files.describe_os_error(exc)}"
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
                        str(self.path),
                        f"cannot lock it for reading: {files.describe_os_error(exc)}",
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
                files.sqlite_uri(path, query),
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
            shared = files.shared_memory_failure(self.path, probe=False)
            if shared is not None:  # a folder, a device, a dangling link: not "denied"
                raise LogUnreadableError(
                    str(self.path), f"{shared}: no shared memory for SQLite's WAL index"
                )
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
                f"{where}{files.describe_os_error(exc)}",
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
        if not_damage(exc):
            name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
            # SQLite names no cause for CANTOPEN: ask the OS (files.open_failure).
            cause = files.open_failure(self.path, write=False)
            if cause is None:
                shared = files.shared_memory_failure(self.path, probe=False)
                if shared is not None:
                    cause = f"{shared}: no shared memory for SQLite's WAL index"
            said = f"{cause} (SQLite: {exc}, {name})" if cause else f"{exc} ({name})"
            return LogUnreadableError(str(self.path), f"cannot read {what}: {said}")
        if what == "header":
            return WalCorruptError(str(self.path), f"not a usable SQLite database: {exc}")
        return WalCorruptError(str(self.path), f"cannot read {what}: {exc}")

    # -- reads ----------------------------------------------------------------

    def meta(self) -> RunMeta:
        """Return the meta row.

        Raises:
            walchannel.log.format.MetaDamagedError: a field is damaged (a
                ``WalCorruptError``; its ``reading`` holds the fields that read).
            WalCorruptError: it cannot be read.
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """
        return self._read("meta", lambda conn: read_meta(conn, self.path))

    def snapshot(self, *, salvage: bool = False) -> Snapshot:
        """Read meta and the ends of the backlog in one short read transaction.

        Args:
            salvage: return a snapshot whose meta has damaged fields too
                (``inspect`` names them and salvages the rows), rather than
                raise.

        Raises:
            walchannel.log.format.MetaDamagedError: a meta field is damaged
                (without ``salvage``).
            WalCorruptError: it cannot be read.
            LogUnreadableError: the log cannot be read here (permissions, locks).
        """

        def read(conn: sqlite3.Connection) -> Snapshot:
            conn.execute("BEGIN")
            reading = read_meta_fields(conn, self.path)
            if not salvage:
                reading.meta()  # raises MetaDamagedError
            # The rows above the ack cursor; all of them if it is damaged
            # (an ack deletes the rows it covers in its own transaction).
            acked = reading.values.get("last_acked_seq") or 0
            top = conn.execute("SELECT seq, kind FROM rows ORDER BY seq DESC LIMIT 1").fetchall()
            # appended_boot: an optional column, absent from older logs.
            columns = {r[1] for r in conn.execute("PRAGMA table_info(rows)")}
            boot = "appended_boot" if "appended_boot" in columns else "NULL"
            oldest = conn.execute(
                f"SELECT appended_at, {boot}, seq FROM rows WHERE seq > ? ORDER BY seq LIMIT 1",  # noqa: S608
                (acked,),
            ).fetchall()
            quarantined = conn.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
            last_q = conn.execute(
                "SELECT seq, reason FROM quarantine ORDER BY quarantined_at DESC, seq DESC LIMIT 1"
            ).fetchall()
            conn.execute("COMMIT")
            damaged: tuple[str, ...] = ()
            if oldest:
                at, boot_at, _ = oldest[0]
                damaged = tuple(
                    name
                    for name, cell, absent_ok in (("appended_at", at, False), (boot, boot_at, True))
                    if row_time(cell) is None and not (absent_ok and cell is None)
                )
            return Snapshot(
                reading=reading,
                top_seq=int(top[0][0]) if top else None,
                top_kind=str(top[0][1]) if top else None,
                oldest_appended_at=row_time(oldest[0][0]) if oldest else None,
                oldest_appended_boot=row_time(oldest[0][1]) if oldest else None,
                oldest_seq=int(oldest[0][2]) if oldest else None,
                oldest_damaged=damaged,
                quarantined=int(quarantined),
                last_quarantined=(int(last_q[0][0]), str(last_q[0][1])) if last_q else None,
            )

        def op(conn: sqlite3.Connection) -> Snapshot:
            # A kind or reason that is not UTF-8 is named, not an error of the read.
            with undecodable_text_kept(conn):
                return read(conn)

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
                # A kind that is not UTF-8 is that row's damage, not the batch's.
                with undecodable_text_kept(conn):
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
        appended_at=row_time(appended_at),
        reason=str(reason),
        quarantined_at=float(quarantined_at),
        size=len(blob) if isinstance(blob, bytes) else 0,
    )
