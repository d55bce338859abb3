"""The on-disk format of a run log, shared by its writer and its readers.

One SQLite database per run at ``<wal_dir>/<run_id>.wal.sqlite3`` (SPEC "The log")::

    rows       (seq INTEGER PRIMARY KEY, kind TEXT, body BLOB, crc32 INTEGER,
                appended_at REAL, appended_boot REAL)  -- the unacked messages
    quarantine (seq, kind, body, crc32, appended_at, reason, quarantined_at)
    meta       (one row: run identity, handshake, cursor, progress, status)

``PRAGMA application_id`` marks the file as ours and ``PRAGMA user_version``
holds the schema version. This module holds what a file must look like and
how it is read: the schema (:data:`SCHEMA`, :data:`SCHEMA_VERSION`), the
:class:`Row` and :class:`RunMeta` types, the body encoding and CRC
(:func:`encode_body`, :func:`body_crc`), row and meta decoding
(:func:`decode_row`, :func:`read_meta`; :func:`read_meta_fields` reads meta
field by field, so one damaged field is named and the others still read),
the header checks (:func:`check_header`) and ``PRAGMA quick_check``
(:func:`quick_check`).

It never writes a file and never takes a lock: the writer is
:class:`walchannel.log.writer.RunLog`, the readers are in
:mod:`walchannel.cli.inspection` and :mod:`walchannel.log.replication`, and all of
them read the format through the functions here, never re-implemented. It
imports neither grpc nor httpx.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import sqlite3
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgpack

from walchannel.errors import PayloadError, WalCorruptError
from walchannel.log.state import KINDS as _KINDS
from walchannel.wire.protobuf import ROW_LOST_TYPE as _ROW_LOST_TYPE

__all__ = [
    "APPLICATION_ID",
    "KINDS",
    "META_FIELDS",
    "MetaDamagedError",
    "MetaReading",
    "OPTIONAL_META_FIELDS",
    "OPTIONAL_META_TYPES",
    "OPTIONAL_ROW_TYPES",
    "ROWS_AFTER",
    "ROW_LOST_TYPE",
    "Row",
    "RunMeta",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UndecodableText",
    "body_crc",
    "carried_marker",
    "check_header",
    "decode_row",
    "encode_body",
    "engine_resume",
    "quick_check",
    "new_file_id",
    "new_writer_id",
    "not_damage",
    "read_file_id",
    "read_meta",
    "read_meta_fields",
    "row_lost_body",
    "row_time",
    "undecodable_text_kept",
]

#: ``PRAGMA application_id`` of every walchannel log ("WALC").
APPLICATION_ID: Final = 0x57414C43
#: The schema this code writes and the newest it reads.
SCHEMA_VERSION: Final = 1
#: Event type that stands in, at the same seq, for a row that failed its checks
#: (defined with the wire's shapes, re-exported here).
ROW_LOST_TYPE: Final = _ROW_LOST_TYPE

#: The row kinds: the ``UpMessage`` oneof names that go through the log
#: (decided in :mod:`walchannel.log.state`, re-exported here).
KINDS: Final = _KINDS

#: The CREATE statements of a new log, in order.
SCHEMA: Final = (
    """CREATE TABLE rows (
        seq INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        body BLOB NOT NULL,
        crc32 INTEGER NOT NULL,
        appended_at REAL NOT NULL,
        appended_boot REAL)""",
    """CREATE TABLE quarantine (
        seq INTEGER PRIMARY KEY,
        kind TEXT,
        body BLOB,
        crc32 INTEGER,
        appended_at REAL,
        reason TEXT NOT NULL,
        quarantined_at REAL NOT NULL)""",
    """CREATE TABLE meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        schema_version INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        correlation_id TEXT NOT NULL,
        connector_version TEXT,
        harness_name TEXT,
        harness_version TEXT,
        last_acked_seq INTEGER NOT NULL DEFAULT 0,
        high_water INTEGER NOT NULL DEFAULT 0,
        unverified_from INTEGER,
        progress TEXT,
        token_sha256 TEXT,
        owner_pid INTEGER,
        owner_host TEXT,
        last_engine_addr TEXT,
        last_ack_at REAL,
        last_error TEXT,
        last_error_at REAL,
        reconnects INTEGER NOT NULL DEFAULT 0,
        failed_at REAL,
        completed_at REAL,
        failed_reason TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        boot_id TEXT,
        last_ack_boot REAL,
        file_id TEXT,
        writer_id TEXT,
        writer_epoch INTEGER,
        takeover_at REAL,
        answered_at REAL,
        group_commit TEXT,
        engine_resume TEXT)""",
)

_ROW_COLUMNS: Final = ("seq", "kind", "body", "crc32", "appended_at")
#: The rows above a seq in seq order, a batch at a time (parameters: the
#: seq, the batch size); each result row is :func:`decode_row`'s arguments.
ROWS_AFTER: Final = (
    "SELECT seq, kind, body, crc32, appended_at FROM rows WHERE seq > ? ORDER BY seq LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class Row:
    """One logged message.

    Attributes:
        seq: its seq (>= 1).
        kind: the ``UpMessage`` oneof name (``event``, ``finding``,
            ``approval_request``, ``done``).
        body: the inner message as a plain mapping (SPEC "Control vs data").
        appended_at: when it was committed (unix seconds); None when the
            stored cell is not a number (damaged: the body, checked by its
            CRC, is still good, so the row is kept).
        size: the size of its msgpack body (bytes).
    """

    seq: int
    kind: str
    body: dict[str, Any]
    appended_at: float | None
    size: int


@dataclass(frozen=True, slots=True)
class RunMeta:
    """The log's meta row (SPEC "The log"). Times are unix seconds.

    ``progress`` is the harness's resume marker (decoded JSON), never a seq;
    ``token_sha256`` is the sha256 of the run token, never the token;
    ``failed_at`` is set when the channel stopped for good, and
    ``failed_reason`` says why (one of the ``log_state.FAILED_*`` texts; None in a
    log written before the field existed). ``boot_id`` is the boot of the
    log's last owner: its rows' ``appended_boot`` and ``last_ack_boot`` are
    ``CLOCK_BOOTTIME`` readings of that boot (:mod:`walchannel.clock`), so an
    age holds across a wall-clock step; None in a log written before them.
    ``file_id`` is random, written when the file is made (created or
    restored) and never changed after: a ``-wal`` whose frames say another
    id belongs to another file (:func:`read_file_id`). ``http_addr`` is the
    discovery base URL the harness's last ``handshake()`` was configured
    with (None without discovery, or in an older log): ``inspect``'s
    ``flush`` step names it, as the last engine may be dead.

    The writer identity (SPEC "The log", "Engine duties"): ``writer_id`` is
    random, made in the creation transaction (or at the owner's first open
    of an older log, or anew by ``walchannel takeover``) and sent in every
    handshake with ``writer_epoch``, 0 at creation and raised by one by each
    ``walchannel restore``. ``takeover_at`` is when the operator marked the
    log to take the run over (None: not marked; cleared by the first
    answered handshake). ``answered_at`` is when an engine first answered a
    handshake of this log or acked its rows (None: never), the evidence that
    the run's rows an engine holds may be this log's.

    ``group_commit`` is the last owner's ``GroupCommit`` setting as JSON
    (``{"max_rows": ..., "max_bytes": ..., "max_delay_ms": ...}``), None
    when it committed every send before returning (SPEC "Group commit").

    ``engine_resume`` is the engine's resume point from its last answer, as
    JSON (``{"marker", "seq", "applied", "digests", "rows", "takeover"}``;
    ``takeover``: answered to a handshake that took the run over, kept until
    the log has progress of its own), None while the engine announced none
    (SPEC "The engine keeps the resume point").
    """

    schema_version: int
    run_id: str
    correlation_id: str
    connector_version: str | None
    harness_name: str | None
    harness_version: str | None
    last_acked_seq: int
    high_water: int
    unverified_from: int | None
    progress: dict[str, Any] | None
    token_sha256: str | None
    owner_pid: int | None
    owner_host: str | None
    last_engine_addr: str | None
    last_ack_at: float | None
    last_error: str | None
    last_error_at: float | None
    reconnects: int
    failed_at: float | None
    completed_at: float | None
    created_at: float
    updated_at: float
    failed_reason: str | None = None
    boot_id: str | None = None
    last_ack_boot: float | None = None
    file_id: str | None = None
    http_addr: str | None = None
    writer_id: str | None = None
    writer_epoch: int | None = None
    takeover_at: float | None = None
    answered_at: float | None = None
    group_commit: str | None = None
    engine_resume: str | None = None


#: The meta row's columns, in :class:`RunMeta` order.
META_FIELDS: Final = tuple(f.name for f in fields(RunMeta))
#: Columns added after schema version 1 shipped, without a version bump (so
#: an older walchannel still reads a newer log): a log may lack them. The
#: writer adds them at open; readers take None for a missing one.
OPTIONAL_META_TYPES: Final = {
    "failed_reason": "TEXT",
    "boot_id": "TEXT",
    "last_ack_boot": "REAL",
    "file_id": "TEXT",
    "http_addr": "TEXT",
    "writer_id": "TEXT",
    "writer_epoch": "INTEGER",
    "takeover_at": "REAL",
    "answered_at": "REAL",
    "group_commit": "TEXT",
    "engine_resume": "TEXT",
}
OPTIONAL_META_FIELDS: Final = frozenset(OPTIONAL_META_TYPES)
#: Row columns added the same way (NULL in the rows of an older writer).
OPTIONAL_ROW_TYPES: Final = {"appended_boot": "REAL"}


@dataclass(frozen=True, slots=True)
class UndecodableText:
    """A TEXT value whose bytes are not UTF-8 (a flipped byte), kept instead of raising.

    SQLite hands back whatever bytes a TEXT cell holds; Python's ``sqlite3``
    raises on the whole fetch when they do not decode, which would make one
    damaged cell hide every other column of its row
    (:func:`undecodable_text_kept`).

    Attributes:
        raw: the stored bytes.
    """

    raw: bytes

    def __str__(self) -> str:
        try:
            self.raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return (
                f"not UTF-8 text (byte {self.raw[exc.start]:#04x} at offset {exc.start} "
                f"of {len(self.raw)})"
            )
        return "not UTF-8 text"  # pragma: no cover - only made for bytes that do not decode

    __repr__ = __str__


def _text_or_undecodable(raw: bytes) -> str | UndecodableText:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(raw)


@contextlib.contextmanager
def undecodable_text_kept(conn: sqlite3.Connection) -> Iterator[None]:
    """Within the block, a TEXT cell that is not UTF-8 comes out as :class:`UndecodableText`.

    Fetch inside the block: Python's ``sqlite3`` decodes TEXT as rows are
    fetched, with the connection's ``text_factory`` of that moment. The
    factory before is restored after.
    """
    saved = conn.text_factory
    conn.text_factory = _text_or_undecodable
    try:
        yield
    finally:
        conn.text_factory = saved


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def encode_body(kind: str, body: Mapping[str, Any]) -> bytes:
    """Encode a row body as msgpack, the form it is stored in.

    Raises:
        PayloadError: msgpack cannot encode it (named by ``kind``).
    """
    try:
        return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as exc:
        raise PayloadError(kind, f"msgpack cannot encode the body: {exc}") from None


def body_crc(blob: bytes) -> int:
    """The ``crc32`` column of a row: zlib's CRC-32 of its msgpack body."""
    return zlib.crc32(blob)


def row_lost_body(seq: int, reason: str, **details: str | int) -> dict[str, Any]:
    """The body of the ``walchannel.row_lost`` event that replaces a quarantined row.

    Args:
        seq: the row's seq.
        reason: why it was quarantined.
        details: more payload fields (e.g. ``kind``, ``size``, ``limit`` of a
            row the engine refused for its size).
    """
    return {
        "type": ROW_LOST_TYPE,
        "severity": "error",
        "payload": {"seq": seq, "reason": reason, **details},
        "ts": _now_iso(),
    }


def row_time(value: Any) -> float | None:
    """A stored time cell (``appended_at``, ``appended_boot``) as seconds; None if not a number.

    SQLite keeps whatever a damaged page holds in a REAL column of a
    non-STRICT table (text, a blob): such a cell is damaged, never parsed.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def decode_row(
    seq: int, kind: str, blob: bytes, crc: int, appended_at: Any
) -> tuple[Row, str | None]:
    """Check and decode one stored row.

    An ``appended_at`` that is not a number is the row's ``appended_at``
    None (:func:`row_time`), not a reason: nothing sent depends on it.

    Returns:
        ``(row, None)`` for a good row; ``(substitute, reason)`` for a row
        whose CRC, msgpack or kind does not check out, where the substitute
        is the ``walchannel.row_lost`` event at the same seq.
    """
    appended_at = row_time(appended_at)
    reason: str | None = None
    body: Any = None
    if not isinstance(blob, bytes):
        reason = f"body is {type(blob).__name__}, not a blob"
    elif body_crc(blob) != crc:
        reason = f"crc32 mismatch (stored {crc}, computed {body_crc(blob)})"
    elif kind not in KINDS:
        reason = f"unknown kind {kind!r}"
    else:
        try:
            body = msgpack.unpackb(blob, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            reason = f"msgpack does not decode: {exc}"
        else:
            if not isinstance(body, dict):
                reason = f"body decodes to {type(body).__name__}, not a mapping"
    if reason is not None:
        lost = row_lost_body(seq, reason)
        size = len(msgpack.packb(lost, use_bin_type=True))
        return Row(seq, "event", lost, appended_at, size), reason
    return Row(seq, kind, body, appended_at, len(blob)), None


def check_header(conn: sqlite3.Connection, path: Path, run_id: str | None) -> None:
    """Check that ``conn`` holds a walchannel log of this schema (and this run, if given).

    Reads only: the file is left untouched whatever it holds.

    Raises:
        WalCorruptError: not a walchannel log, a newer schema, another run's
            log, or a broken header, schema or meta row (path and reason). A
            damaged meta field is :func:`read_meta_fields`'s to name.
    """
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
            what = "an empty file" if tables == 0 else f"application_id {app_id:#x}"
            raise WalCorruptError(str(path), f"not a walchannel log ({what})")
        if version > SCHEMA_VERSION:
            raise WalCorruptError(
                str(path),
                f"newer schema version {version} (this walchannel reads up to {SCHEMA_VERSION})",
            )
        if version < 1:
            raise WalCorruptError(str(path), f"broken header: schema version {version}")
        for table, wanted in (("rows", _ROW_COLUMNS), ("meta", META_FIELDS)):
            cols = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
            missing = [c for c in wanted if c not in cols and c not in OPTIONAL_META_FIELDS]
            if missing:
                raise WalCorruptError(
                    str(path), f"broken schema: table {table} lacks {', '.join(missing)}"
                )
        with undecodable_text_kept(conn):
            metas = conn.execute("SELECT run_id FROM meta").fetchall()
        if len(metas) != 1:
            raise WalCorruptError(str(path), f"broken meta: {len(metas)} meta rows, expected 1")
        # A damaged run_id (or schema_version) is a damaged field, named by
        # read_meta_fields: a reader can still salvage the rows.
        stored_run = metas[0][0]
        if run_id is not None and isinstance(stored_run, str) and stored_run != run_id:
            raise WalCorruptError(str(path), f"belongs to run {stored_run!r}, not {run_id!r}")
    except sqlite3.DatabaseError as exc:
        if not_damage(exc):
            raise  # the caller names the cause (a lock, permissions, no descriptor)
        raise WalCorruptError(str(path), f"not a usable SQLite database: {exc}") from None


def new_file_id() -> str:
    """A random id for a log file made now (16 hex digits; meta ``file_id``)."""
    return secrets.token_hex(8)


def new_writer_id() -> str:
    """A random writer id (16 hex digits; meta ``writer_id``, the handshake's ``writer_id``)."""
    return secrets.token_hex(8)


def read_file_id(conn: sqlite3.Connection) -> str | None:
    """Read meta's ``file_id`` (None in a log made before it existed).

    Raises:
        sqlite3.Error: SQLite cannot read it.
    """
    columns = {r[1] for r in conn.execute("PRAGMA table_info(meta)")}
    if "file_id" not in columns:
        return None
    row = conn.execute("SELECT file_id FROM meta WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else str(row[0])


def not_damage(exc: sqlite3.Error) -> bool:
    """True when SQLite's error is about access, locks or resources, not the file's content.

    Only content proves a log damaged (``WalCorruptError``): SQLITE_CANTOPEN,
    BUSY, PERM, READONLY, NOMEM, FULL and the IOERR codes of locks, shared
    memory and access say nothing about the bytes in the file
    (https://sqlite.org/rescode.html).
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        # Python raises some errors without a code: "unable to open" is one.
        return isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc)
    return (code & 0xFF) in _NOT_DAMAGE or code in _IOERR_NOT_DAMAGE


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
        sqlite3.SQLITE_FULL,
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


@dataclass(frozen=True, slots=True)
class MetaReading:
    """The meta row read field by field: what decodes, and what does not.

    A damaged field (a flipped byte: text that is not UTF-8, a progress
    marker that is not JSON, a value walchannel never writes) is named
    with what is wrong with it, and the other fields still read: a reader
    salvaging the rows needs only the ack cursor (SPEC "Operating tools").

    Attributes:
        path: the log file.
        values: every field that decodes and checks out, by name (an
            optional column a log lacks is None); damaged fields are absent.
        damaged: each damaged field's name and what is wrong with it, e.g.
            ``{"progress": "progress is not JSON (Expecting value: ...)"}``,
            in :data:`META_FIELDS` order.
    """

    path: str
    values: Mapping[str, Any]
    damaged: Mapping[str, str]

    def describe(self) -> str:
        """The damaged fields and what is wrong with each, ``; ``-separated ("" if none)."""
        return "; ".join(self.damaged.values())

    def meta(self) -> RunMeta:
        """The meta row as a :class:`RunMeta`.

        Raises:
            MetaDamagedError: a field is damaged (names every one, the path
                and the run).
        """
        if self.damaged:
            raise MetaDamagedError(self)
        return RunMeta(**self.values)


class MetaDamagedError(WalCorruptError):
    """The meta row has damaged fields: a :class:`~walchannel.errors.WalCorruptError`.

    The owner's open and ``flush`` refuse such a log, as any corrupt one
    (without its progress marker a harness cannot resume exactly once);
    ``export`` and ``inspect`` catch this to salvage the rows beside it
    from :attr:`reading` (SPEC "Operating tools").

    Attributes:
        path: the log file.
        reason: ``broken meta: <field> <what is wrong>[; ...] (run <run_id>)``.
        reading: the fields that do read, and the damaged ones.
        fields: the damaged fields' names.
    """

    def __init__(self, reading: MetaReading) -> None:
        self.reading = reading
        self.fields = tuple(reading.damaged)
        run = reading.values.get("run_id")
        where = f" (run {run})" if isinstance(run, str) else ""
        super().__init__(reading.path, f"broken meta: {reading.describe()}{where}")


def read_meta(conn: sqlite3.Connection, path: str | Path) -> RunMeta:
    """Read and decode the meta row (after :func:`check_header`).

    Args:
        conn: a connection to the log.
        path: the log file, for the error.

    Raises:
        MetaDamagedError: a field does not decode or holds a value
            walchannel never writes (every such field named).
        WalCorruptError: there is no meta row.
        sqlite3.Error: SQLite cannot read it; the caller says whether that
            is damage or only a lock or permission.
    """
    return read_meta_fields(conn, path).meta()


def read_meta_fields(conn: sqlite3.Connection, path: str | Path) -> MetaReading:
    """Read the meta row field by field: one damaged field never hides the others.

    A TEXT cell that is not UTF-8 is a damaged field, not an error of the
    whole read (:func:`undecodable_text_kept`); ``schema_version`` must
    match the header's ``PRAGMA user_version``.

    Args:
        conn: a connection to the log.
        path: the log file, for the reading and its errors.

    Returns:
        The fields that read, and the damaged ones with what is wrong.

    Raises:
        WalCorruptError: there is no meta row.
        sqlite3.Error: SQLite cannot read it.
    """
    present = {r[1] for r in conn.execute("PRAGMA table_info(meta)")}
    names = [f for f in META_FIELDS if f in present or f not in OPTIONAL_META_FIELDS]
    header = conn.execute("PRAGMA user_version").fetchone()[0]
    with undecodable_text_kept(conn):
        row = conn.execute(f"SELECT {', '.join(names)} FROM meta WHERE id = 1").fetchone()  # noqa: S608
    if row is None:
        raise WalCorruptError(str(path), "broken meta: no meta row")
    values: dict[str, Any] = dict.fromkeys(META_FIELDS)
    damaged: dict[str, str] = {}
    for name, raw in zip(names, row, strict=True):
        value, wrong = _decode_meta_field(name, raw, header)
        if wrong is None:
            values[name] = value
        else:
            del values[name]
            damaged[name] = f"{name} {wrong}"
    return MetaReading(str(path), values, damaged)


#: Meta columns by the values walchannel writes there ("?": None allowed too).
_META_COUNTS: Final = ("schema_version", "last_acked_seq", "high_water", "reconnects")
_META_COUNTS_OR_NONE: Final = ("unverified_from", "owner_pid", "writer_epoch")
_META_TIMES: Final = ("created_at", "updated_at")
_META_TIMES_OR_NONE: Final = (
    "last_ack_at",
    "last_error_at",
    "failed_at",
    "completed_at",
    "takeover_at",
    "answered_at",
)
_META_BOOT_TIMES_OR_NONE: Final = ("last_ack_boot",)
_META_TEXTS: Final = ("run_id", "correlation_id")
_META_TEXTS_OR_NONE: Final = (
    "connector_version",
    "harness_name",
    "harness_version",
    "token_sha256",
    "owner_host",
    "last_engine_addr",
    "last_error",
    "failed_reason",
    "http_addr",
    "boot_id",
    "file_id",
    "writer_id",
    "group_commit",
    "engine_resume",
)


def _decode_meta_field(name: str, raw: Any, header_version: int) -> tuple[Any, str | None]:
    """Decode and check one meta value, as walchannel writes it.

    Refuses what walchannel never writes (an edited or damaged field):
    without this a wrong type surfaces later as a ``TypeError`` far from
    the file (comparing a seq with a str), or as a wrong count.

    Returns:
        ``(value, None)``, or ``(None, what is wrong)`` (the text follows
        the field's name: ``"is 'abc', expected an integer >= 0"``).
    """
    if isinstance(raw, UndecodableText):
        return None, f"is {raw}"

    def bad(expected: str) -> tuple[None, str]:
        return None, f"is {raw!r}, expected {expected}"

    if name == "progress":
        if raw is None:
            return None, None
        if not isinstance(raw, str):
            return bad("a JSON object")
        try:
            marker = json.loads(raw)
        except ValueError as exc:
            return None, f"is not JSON ({exc})"
        if not isinstance(marker, dict):
            return None, f"is {marker!r}, expected a JSON object"
        return marker, None
    if name in _META_COUNTS or name in _META_COUNTS_OR_NONE:
        if raw is None and name in _META_COUNTS_OR_NONE:
            return None, None
        if type(raw) is not int or raw < 0:
            return bad("an integer >= 0")
        if name == "schema_version" and raw != header_version:
            return None, f"is {raw}, the header says {header_version}"
        return raw, None
    if name in _META_TIMES or name in _META_TIMES_OR_NONE or name in _META_BOOT_TIMES_OR_NONE:
        if raw is None and name not in _META_TIMES:
            return None, None
        if type(raw) not in (int, float) or not math.isfinite(raw):
            return bad("seconds" if name in _META_BOOT_TIMES_OR_NONE else "unix seconds")
        return raw, None
    if name in _META_TEXTS or name in _META_TEXTS_OR_NONE:
        if type(raw) is not str and (raw is not None or name in _META_TEXTS):
            return bad("text")
        return raw, None
    return raw, None  # pragma: no cover - every META_FIELDS name is listed above


def quick_check(conn: sqlite3.Connection) -> list[str]:
    """Run ``PRAGMA quick_check`` (reads every page) and return its complaints.

    SQLite answers ``ok``, or lines of complaints that may hold several
    lines each and ``*** in database main ***`` headers: each complaint
    comes out as one line, headers dropped. SPEC "The log" (quick_check
    runs in ``flush`` and ``inspect --verify``, not on the hot path);
    https://sqlite.org/pragma.html#pragma_quick_check.

    Returns:
        An empty list when SQLite finds the file sound, else its complaints.

    Raises:
        sqlite3.Error: SQLite cannot run the check; the caller decides what
            that means (a writer reports it as a complaint, a reader sorts
            damage from a lock or permission).
    """
    answers = [str(r[0]) for r in conn.execute("PRAGMA quick_check")]
    if answers == ["ok"]:
        return []
    lines = [line for answer in answers for line in answer.splitlines()]
    return [line for line in lines if line and not line.startswith("***")]


def engine_resume(text: str | None) -> dict[str, Any] | None:
    """The ``engine_resume`` meta value as a mapping; None for none, or a value not ours.

    Keys ``marker`` (a mapping or None), ``seq``, ``applied``, ``rows``
    (ints), ``digests`` (a list of ints) and ``takeover`` (bool): :class:`RunMeta`.
    """
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    keys = {"marker", "seq", "applied", "digests", "rows", "takeover"}
    if not isinstance(value, dict) or set(value) != keys:
        return None
    marker, seq, applied = value["marker"], value["seq"], value["applied"]
    if marker is not None and not isinstance(marker, dict):
        return None
    digests = value["digests"]
    if not isinstance(digests, list) or not all(type(d) is int for d in digests):
        return None
    if not (type(seq) is int and type(applied) is int and 0 <= seq <= applied):
        return None
    if type(value["rows"]) is not int or not 0 <= value["rows"] <= len(digests):
        return None
    return value if isinstance(value["takeover"], bool) else None


def carried_marker(blob: object, crc: object) -> dict[str, Any] | None:
    """The marker a stored row body carries for the engine (``"progress"``), or None.

    None too for a damaged body (its CRC does not match): nothing in it is trusted.
    """
    if not isinstance(blob, bytes) or body_crc(blob) != crc:
        return None
    try:
        body = msgpack.unpackb(blob, raw=False)
    except Exception:
        return None  # undecodable: it carries nothing
    carried = body.get("progress") if isinstance(body, dict) else None
    return carried if isinstance(carried, dict) else None
