"""Read-only views of run logs, for ``walchannel inspect`` and ``walchannel export``.

A reader here must never disturb a live run (SPEC "Operating tools"):

- Each file is opened with a read-only SQLite URI (``mode=ro``) and
  ``PRAGMA query_only``; nothing is ever written to the database.
- The owner lock is never taken: liveness comes from
  :func:`walchannel.lock.probe_owner` (``F_OFD_GETLK`` on ``<log>.lock``).
- Every read transaction is a handful of indexed lookups, or one bounded
  batch of rows, so the owner's checkpoints are never starved: in WAL mode a
  checkpoint cannot copy past a reader's snapshot nor restart the ``-wal``
  while a reader holds one, and a ``TRUNCATE`` checkpoint waits on readers
  (https://sqlite.org/wal.html#concurrency).
- The format is read through :func:`walchannel.log.check_header`,
  :func:`~walchannel.log.read_meta` and :func:`~walchannel.log.decode_row`,
  never re-implemented. A damaged row is shown as damaged (it is not
  quarantined: that is a write, and the owner's job).

SQLite needs the ``-wal`` and ``-shm`` files to read a WAL-mode database, so
reading an idle log may leave an empty ``-wal`` and a ``-shm`` beside it (as
the next owner would); ``walchannel prune`` removes them with the tombstone.

This module imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Self

from walchannel import files
from walchannel.errors import WalCorruptError
from walchannel.lock import LockOwner, probe_owner
from walchannel.log import Row, RunMeta, check_header, decode_row, read_meta
from walchannel.protocol import next_seq_after

__all__ = [
    "ALERT_STATES",
    "DEFAULT_STUCK_AFTER_S",
    "JSON_KEYS",
    "LogReader",
    "PathError",
    "QuarantinedRow",
    "RunReport",
    "STATES",
    "ShownRow",
    "format_age",
    "format_size",
    "inspect_log",
    "list_logs",
    "run_id_from_name",
]

#: Every state, most urgent first: a run gets the first that applies.
STATES: Final = (
    "corrupt",
    "failed",
    "orphaned",
    "stuck",
    "done-pending",
    "active",
    "idle",
    "completed",
)
#: States that make ``inspect`` exit 1.
ALERT_STATES: Final = frozenset({"corrupt", "failed", "orphaned", "stuck"})
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


def _file_bytes(path: Path) -> int:
    """Size of the log and its ``-wal`` (bytes): the disk the run holds."""
    total = 0
    for candidate in (path, Path(f"{path}-wal")):
        with contextlib.suppress(OSError):
            total += candidate.lstat().st_size
    return total


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


class LogReader:
    """A read-only handle on one log file; never takes the owner lock.

    Open it, read, close it (a context manager). Every method runs short
    read transactions; SQLite errors come out as
    :class:`~walchannel.errors.WalCorruptError` (path and reason).

    Args:
        path: the log file.
        run_id: the run it must belong to (None: any).

    Raises:
        WalCorruptError: the file is a symlink or not a regular file, cannot
            be opened, or fails :func:`walchannel.log.check_header`.
    """

    def __init__(self, path: Path, run_id: str | None = None) -> None:
        self.path = path
        try:
            st = path.lstat()
        except OSError as exc:
            raise WalCorruptError(str(path), f"cannot read: {exc.strerror or exc}") from None
        if stat.S_ISLNK(st.st_mode):
            raise WalCorruptError(str(path), "is a symbolic link; refusing to follow it")
        if not stat.S_ISREG(st.st_mode):
            raise WalCorruptError(str(path), "not a regular file")
        # SQLite's own "unable to open" hides the cause: ask the kernel first.
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
        except OSError as exc:
            raise WalCorruptError(str(path), f"cannot read: {exc.strerror or exc}") from None
        try:
            self._conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                timeout=_READ_BUSY_TIMEOUT_S,
            )
        except sqlite3.Error as exc:
            raise WalCorruptError(str(path), f"cannot open: {exc}") from None
        try:
            self._conn.execute("PRAGMA query_only = 1")
            check_header(self._conn, path, run_id)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise WalCorruptError(str(path), f"not a usable SQLite database: {exc}") from None
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    def _fail(self, what: str, exc: sqlite3.Error) -> WalCorruptError:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
        return WalCorruptError(str(self.path), f"cannot read {what}: {exc}")

    def meta(self) -> RunMeta:
        """Return the meta row.

        Raises:
            WalCorruptError: it cannot be read.
        """
        try:
            return read_meta(self._conn)
        except (sqlite3.Error, ValueError, TypeError) as exc:
            if isinstance(exc, sqlite3.Error):
                raise self._fail("meta", exc) from None
            raise WalCorruptError(str(self.path), f"broken meta: {exc}") from None

    def snapshot(self) -> _Snapshot:
        """Read meta and the ends of the backlog in one short read transaction."""
        conn = self._conn
        try:
            conn.execute("BEGIN")
            meta = read_meta(conn)
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
        except sqlite3.Error as exc:
            raise self._fail("meta and rows", exc) from None
        except (ValueError, TypeError) as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise WalCorruptError(str(self.path), f"broken meta: {exc}") from None
        return _Snapshot(
            meta=meta,
            top_seq=int(top[0][0]) if top else None,
            top_kind=str(top[0][1]) if top else None,
            oldest_appended_at=float(oldest[0][0]) if oldest else None,
            quarantined=int(quarantined),
            last_quarantined=(int(last_q[0][0]), str(last_q[0][1])) if last_q else None,
        )

    def unacked_bytes(self, after_seq: int, upto_seq: int) -> int:
        """Sum the body sizes of the rows in ``(after_seq, upto_seq]`` (bytes).

        Reads a batch of row sizes per read transaction (no blob is loaded).
        Rows the owner acks meanwhile are simply not counted.
        """
        total = 0
        cursor = after_seq
        while cursor < upto_seq:
            try:
                batch = self._conn.execute(
                    "SELECT seq, length(body) FROM rows WHERE seq > ? AND seq <= ?"
                    " ORDER BY seq LIMIT ?",
                    (cursor, upto_seq, _BATCH),
                ).fetchall()
            except sqlite3.Error as exc:
                raise self._fail("rows", exc) from None
            total += sum(int(size or 0) for _, size in batch)
            if len(batch) < _BATCH:
                break
            cursor = int(batch[-1][0])
        return total

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
        """
        cursor = after_seq
        remaining = limit
        while remaining is None or remaining > 0:
            size = _BATCH if remaining is None else min(_BATCH, remaining)
            try:
                batch = self._conn.execute(
                    "SELECT seq, kind, body, crc32, appended_at FROM rows"
                    " WHERE seq > ? ORDER BY seq LIMIT ?",
                    (cursor, size),
                ).fetchall()
            except sqlite3.Error as exc:
                raise self._fail("rows", exc) from None
            for raw in batch:
                yield decode_row(*raw)
            if len(batch) < size:
                return
            if remaining is not None:
                remaining -= len(batch)
            cursor = int(batch[-1][0])

    def quarantined(self, limit: int | None = None) -> Iterator[QuarantinedRow]:
        """Yield the rows of the ``quarantine`` table in seq order, bodies included.

        Damaged rows and rows the engine refused for their size (each went
        out as a ``walchannel.row_lost`` event in its place) stay there,
        also after the run completed. One read transaction per batch.

        Args:
            limit: stop after this many rows (None: all).

        Raises:
            WalCorruptError: SQLite cannot read the table.
        """
        cursor: int | None = None
        remaining = limit
        while remaining is None or remaining > 0:
            size = _BATCH if remaining is None else min(_BATCH, remaining)
            try:
                batch = self._conn.execute(
                    "SELECT seq, kind, body, crc32, appended_at, reason, quarantined_at"
                    " FROM quarantine WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?",
                    (cursor, cursor, size),
                ).fetchall()
            except sqlite3.Error as exc:
                raise self._fail("quarantine", exc) from None
            for seq, kind, blob, crc, appended_at, reason, quarantined_at in batch:
                yield _quarantined_row(seq, kind, blob, crc, appended_at, reason, quarantined_at)
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
        """
        try:
            answers = [str(r[0]) for r in self._conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as exc:
            return [str(exc)]
        if answers == ["ok"]:
            return []
        lines = [line for answer in answers for line in answer.splitlines()]
        return [line for line in lines if line and not line.startswith("***")]


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

    def to_json(self) -> dict[str, Any]:
        """Return the ``inspect --json`` object: exactly :data:`JSON_KEYS`."""
        out: dict[str, Any] = {}
        for key in JSON_KEYS:
            value = getattr(self, key)
            if key == "locked_by" and value is not None:
                value = {"pid": value.pid, "host": value.host}
            out[key] = value
        return out


def _corrupt(path: Path, run_id: str | None, reason: str, owner: LockOwner | None) -> RunReport:
    return RunReport(
        run_id=run_id,
        file=str(path),
        state="corrupt",
        reason=reason,
        locked_by=owner,
        file_bytes=_file_bytes(path),
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
        if meta.last_error:
            return "failed", f"the channel stopped: {meta.last_error}"
        return "failed", (
            "an engine answered below the stored cursor: it lost rows this log already "
            "deleted, which cannot be re-sent"
        )
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
        ``corrupt`` with the reason (never an exception).
    """
    now = time.time() if now is None else now
    named = run_id_from_name(path)
    owner = _probe(path)
    try:
        reader = LogReader(path, named)
    except WalCorruptError as exc:
        return _corrupt(path, named, exc.reason, owner)
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
        except WalCorruptError as exc:
            return _corrupt(path, named, exc.reason, owner)
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
        file_bytes=_file_bytes(path),
        shown=shown,
        shown_quarantined=shown_quarantined,
    )
