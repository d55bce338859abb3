"""EngineStore: the local engine's SQLite store of runs and applied messages.

In memory (``path=None``: one connection, gone with the object) or a file
shared by several engine processes (WAL mode, ``busy_timeout`` 10 s)::

    runs      (run_id PRIMARY KEY, token_sha256, h, completed_at, stop_reason,
               duplicates, registered_at, writer_id, writer_epoch, completed_by)
    messages  (run_id, seq, kind, body JSON text, applied_at;
               PRIMARY KEY (run_id, seq))
    gaps      (run_id, expected, received, at)
    decisions (run_id, request_id, approved, reason, decided_at;
               PRIMARY KEY (run_id, request_id))
    engines   (id, grpc_addr, pid, started_at)   -- the newest row is discovery's answer
    takeovers (id, run_id, at, from_writer, from_epoch, to_writer, to_epoch)

Each run keeps its owner, the writer ``(writer_id, writer_epoch)`` whose
handshake it accepts (SPEC "Engine duties"): :meth:`EngineStore.admit`
decides a handshake and :meth:`EngineStore.accept` checks the owner in the
same transaction as the seq, so a writer that lost the run can never apply
another message. A store file made before these columns gets them when an
engine opens it.

Every up-message is accepted in one ``BEGIN IMMEDIATE`` transaction (read
``h``, compare the seq, insert, bump ``h``, commit), so two streams or two
engine processes can never both apply a seq (SPEC "Test doubles and the
local engine"). The store keeps the sha256 of a run token, never the token.

The object is thread-safe (one lock around its one connection), so an
engine can run its transactions on a worker thread while a test reads the
read-outs from its own thread. Times are unix seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from walchannel._logging import get_logger
from walchannel.wire.protobuf import continues_transaction

__all__ = [
    "AcceptResult",
    "Admission",
    "Decision",
    "EngineStore",
    "RunState",
    "StoreClosedError",
    "Takeover",
    "Writer",
    "token_sha256",
]

logger = get_logger(__name__)

#: How long a transaction waits for another engine process's write lock.
BUSY_TIMEOUT_MS: Final = 10_000

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL,
        h INTEGER NOT NULL DEFAULT 0,
        completed_at REAL,
        stop_reason TEXT,
        duplicates INTEGER NOT NULL DEFAULT 0,
        registered_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS messages (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        applied_at REAL NOT NULL,
        PRIMARY KEY (run_id, seq)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS gaps (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        expected INTEGER NOT NULL,
        received INTEGER NOT NULL,
        at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS decisions (
        run_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        approved INTEGER NOT NULL,
        reason TEXT NOT NULL,
        decided_at REAL NOT NULL,
        PRIMARY KEY (run_id, request_id)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS engines (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        grpc_addr TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS takeovers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        at REAL NOT NULL,
        from_writer TEXT,
        from_epoch INTEGER,
        to_writer TEXT NOT NULL,
        to_epoch INTEGER NOT NULL)""",
)
# Columns of runs added after the table first shipped: an older store file
# gets them (NULL) when an engine opens it.
_RUN_COLUMNS: Final = {
    "writer_id": "TEXT",
    "writer_epoch": "INTEGER",
    "completed_by": "TEXT",
    "resume_marker": "TEXT",
    "resume_seq": "INTEGER",
    "resume_digests": "TEXT",
    "resume_rows": "INTEGER",
    "resume_writer": "TEXT",
}

Outcome = Literal["applied", "duplicate", "gap", "completed", "fenced", "unknown_run"]
Verdict = Literal["accepted", "completed", "owned", "fenced", "unknown_run"]


class StoreClosedError(RuntimeError):
    """The store was closed (its engine stopped); read a store file with a new EngineStore."""


def token_sha256(run_token: str) -> str:
    """Return the hex sha256 of a run token (what the store keeps instead of it)."""
    return hashlib.sha256(run_token.encode("utf-8")).hexdigest()


def _lost(owner: Writer | None, writer: Writer) -> bool:
    """True when ``writer`` may not write a run owned by ``owner``: another id, or a lower epoch."""
    return owner is not None and (writer.id != owner.id or writer.epoch < owner.epoch)


def _dump(body: dict[str, Any]) -> str:
    # Sorted keys: equal bodies give equal text, so a duplicate can be compared.
    return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Decision:
    """A stored approval decision of a run."""

    request_id: str
    approved: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Writer:
    """A writer of a run, as its handshake names it (SPEC "Engine duties").

    Attributes:
        id: the log's random writer id; "" from an older client (no id).
        epoch: raised by one by each restore of the log.
    """

    id: str
    epoch: int

    def __str__(self) -> str:
        return f"writer {self.id} (epoch {self.epoch})" if self.id else "a writer with no id"


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of :meth:`EngineStore.admit`: may this writer's handshake be answered?

    Attributes:
        verdict: ``"accepted"`` (the writer owns the run now); ``"completed"``
            (the run's ``Done`` was applied: "run completed");
            ``"owned"`` (another writer owns the run and this one did not ask
            to take it over); ``"fenced"`` (the owner's id at a lower epoch: a
            restored copy superseded it); ``"unknown_run"``.
        owner: the run's owner after the transaction (None: none with an id).
        completed_by: for ``"completed"``, the writer id whose ``Done`` was
            applied (None: unknown, or a writer with no id).
        took_over_from: the owner this handshake took the run over from.
    """

    verdict: Verdict
    owner: Writer | None = None
    completed_by: str | None = None
    took_over_from: Writer | None = None


@dataclass(frozen=True, slots=True)
class Takeover:
    """A takeover recorded in the store: the run changed owner on an operator's request."""

    at: float
    from_writer: Writer | None
    to_writer: Writer


@dataclass(frozen=True, slots=True)
class RunState:
    """What a handshake needs to know about a run, read in one transaction.

    Attributes:
        h: the highest seq durably accepted (0 if none).
        completed: True once the run's ``Done`` was applied.
        stop_reason: the issued ``Stop`` reason, or None.
        decisions: every approval decision made for the run, oldest first.
        completed_by: the writer id whose ``Done`` completed the run (None:
            not completed, or a writer with no id).
        resume_marker: the last applied ``Progress`` row's marker (None: none).
        resume_seq: that row's seq (0: none).
        resume_digests: that row's digests of the rows of its transaction.
        resume_rows: how many of them were applied (its writer's rows after it).
    """

    h: int
    completed: bool
    stop_reason: str | None
    decisions: tuple[Decision, ...]
    completed_by: str | None = None
    resume_marker: dict[str, Any] | None = None
    resume_seq: int = 0
    resume_digests: tuple[int, ...] = ()
    resume_rows: int = 0


@dataclass(frozen=True, slots=True)
class AcceptResult:
    """The outcome of :meth:`EngineStore.accept`.

    Attributes:
        outcome: ``"applied"`` (seq == h+1, inserted), ``"duplicate"``
            (seq <= h, counted, not applied), ``"gap"`` (seq > h+1,
            recorded, not applied), ``"completed"`` (seq == h+1 but the
            run's ``Done`` was already applied: not applied), ``"fenced"``
            (the sending writer no longer owns the run: not applied), or
            ``"unknown_run"``.
        h: the run's high-water after the transaction.
        decision: the stored decision for an ``approval_request``'s id, if any.
        differs: for a duplicate, True when its body differs from the applied one.
        owner: for ``"fenced"``, the run's owner now.
    """

    outcome: Outcome
    h: int
    decision: Decision | None = None
    differs: bool = False
    owner: Writer | None = None

    @property
    def expected(self) -> int:
        """The seq the run accepts next."""
        return self.h + 1


class EngineStore:
    """The local engine's store (see the module doc).

    Args:
        path: a SQLite file shared by engine processes (created if missing),
            or None for a private in-memory store.
        busy_timeout_ms: how long a transaction waits for another
            connection's write lock (milliseconds).

    Raises:
        sqlite3.Error: the file cannot be opened or is not a SQLite database.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        self._path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        if self._path is not None and not self._path.exists():
            # Token hashes live here: create the file 0600 (SQLite gives its
            # -wal and -shm the same mode).
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        target = str(self._path) if self._path is not None else ":memory:"
        # check_same_thread=False: the lock serializes every use of the connection.
        self._conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        self._closed = False
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if self._path is not None:
                # WAL: readers (discovery, read-outs) never block an engine's writes.
                self._conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode: a commit survives the process being killed.
                self._conn.execute("PRAGMA synchronous = NORMAL")
            with self._transaction() as conn:
                for statement in _SCHEMA:
                    conn.execute(statement)
                have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
                for name, kind in _RUN_COLUMNS.items():
                    if name not in have:
                        conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
        except BaseException:
            self._conn.close()
            raise

    # -- plumbing ----------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The store file, or None for an in-memory store."""
        return self._path

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Close the connection (idempotent). An in-memory store is gone after this."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def __enter__(self) -> EngineStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock; yield the open connection (autocommit: one statement each)."""
        with self._lock:
            if self._closed:
                raise StoreClosedError("the engine store is closed")
            yield self._conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one ``BEGIN IMMEDIATE`` transaction; commit or roll back."""
        with self._connection() as conn:
            # IMMEDIATE takes the write lock up front, so the read of h and the
            # insert that depends on it cannot interleave with another writer.
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                # SQLite may have rolled back already (e.g. on SQLITE_FULL).
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one read transaction (a consistent snapshot)."""
        with self._connection() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    # -- runs and auth -----------------------------------------------------

    def register_run(self, run_id: str, run_token: str) -> None:
        """Register a run (or give a registered run a new token); keeps only the token's sha256.

        Args:
            run_id: the run.
            run_token: its bearer token; stored as sha256, never as is.

        Raises:
            ValueError: empty ``run_id`` or ``run_token``.
        """
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty str")
        if not isinstance(run_token, str) or not run_token:
            raise ValueError("run_token must be a non-empty str")
        digest = token_sha256(run_token)
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, token_sha256, registered_at) VALUES (?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET token_sha256 = excluded.token_sha256",
                (run_id, digest, time.time()),
            )
        logger.info("run %s: registered", run_id)

    def check_token(self, run_id: str, run_token: str) -> bool:
        """Return True when ``run_id`` is registered and ``run_token`` hashes to its sha256."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT token_sha256 FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        if row is None:
            return False
        return hmac.compare_digest(str(row[0]), token_sha256(run_token))

    def run_state(self, run_id: str) -> RunState | None:
        """Return the run's high-water, completion, Stop and decisions (None: unknown run)."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT h, completed_at, stop_reason, completed_by, resume_marker, resume_seq,"
                " resume_digests, resume_rows FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                return None
            decisions = conn.execute(
                "SELECT request_id, approved, reason FROM decisions WHERE run_id = ?"
                " ORDER BY decided_at, request_id",
                (run_id,),
            ).fetchall()
        return RunState(
            h=int(row[0]),
            completed=row[1] is not None,
            stop_reason=row[2],
            decisions=tuple(Decision(r[0], bool(r[1]), r[2]) for r in decisions),
            completed_by=row[3],
            resume_marker=json.loads(row[4]) if row[4] is not None else None,
            resume_seq=int(row[5] or 0),
            resume_digests=tuple(json.loads(row[6])) if row[6] is not None else (),
            resume_rows=int(row[7] or 0),
        )

    def high_water(self, run_id: str) -> int:
        """Return the highest seq durably accepted for the run (0 if none or unknown)."""
        with self._connection() as conn:
            row = conn.execute("SELECT h FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    # -- the run's writer ----------------------------------------------------

    def admit(self, run_id: str, writer: Writer, *, take_over: bool = False) -> Admission:
        """Decide whether ``writer``'s handshake may be answered, in one transaction.

        SPEC "Engine duties": a completed run is ``"completed"`` (naming the
        writer whose ``Done`` was applied). A run without an owner that has
        an id is taken by the first writer with an id that dials (a new run,
        or one from before owners, rows and all); a writer without an id (an
        older client) is accepted only while the run has no such owner. The
        owner is accepted at an equal or higher epoch (the stored epoch
        follows) and ``"fenced"`` at a lower one (a restored copy superseded
        it). Another writer is ``"owned"`` unless it asks to ``take_over``:
        then it becomes the owner and the takeover is recorded
        (:meth:`takeovers`); the caller ends the old writer's stream, and
        :meth:`accept` refuses the old writer from then on.

        Args:
            run_id: the run.
            writer: the handshake's writer.
            take_over: the handshake asks to take the run over.

        Returns:
            The verdict, with the run's owner after it.
        """
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT completed_at, completed_by, writer_id, writer_epoch FROM runs"
                " WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                return Admission("unknown_run")
            completed_at, completed_by, owner_id, owner_epoch = row
            owner = Writer(owner_id, int(owner_epoch or 0)) if owner_id else None
            if completed_at is not None:
                return Admission("completed", owner, completed_by)
            same = owner is not None and writer.id == owner.id
            if owner is None or (same and (take_over or writer.epoch >= owner.epoch)):
                if writer.id:  # adopt the run, or follow the owner's epoch
                    conn.execute(
                        "UPDATE runs SET writer_id = ?, writer_epoch = ? WHERE run_id = ?",
                        (writer.id, writer.epoch, run_id),
                    )
                return Admission("accepted", writer if writer.id else None)
            if same:
                return Admission("fenced", owner)
            if not take_over or not writer.id:
                return Admission("owned", owner)
            conn.execute(
                "UPDATE runs SET writer_id = ?, writer_epoch = ? WHERE run_id = ?",
                (writer.id, writer.epoch, run_id),
            )
            conn.execute(
                "INSERT INTO takeovers (run_id, at, from_writer, from_epoch, to_writer, to_epoch)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, time.time(), owner.id, owner.epoch, writer.id, writer.epoch),
            )
            return Admission("accepted", writer, took_over_from=owner)

    def heartbeat(self, run_id: str, writer: Writer) -> tuple[int, Writer | None]:
        """Return the run's high-water, and its owner when ``writer`` no longer owns it (else None).

        A heartbeat is answered with ``Ack(h)``; a writer that lost the run
        (to a takeover or a restored copy, perhaps through another engine
        process) learns it here at the latest.
        """
        with self._reading() as conn:
            row = conn.execute(
                "SELECT h, writer_id, writer_epoch FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        if row is None:
            return 0, None
        owner = Writer(row[1], int(row[2] or 0)) if row[1] else None
        return int(row[0]), owner if _lost(owner, writer) else None

    def forget_owners(self) -> None:
        """Clear every run's owner (the ``forget_owner_on_restart`` fault: an engine that
        kept owners in memory). Never for a real run."""
        with self._transaction() as conn:
            conn.execute("UPDATE runs SET writer_id = NULL, writer_epoch = NULL")

    def owner(self, run_id: str) -> Writer | None:
        """Return the run's owner (None: unknown run, or no owner with an id yet)."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT writer_id, writer_epoch FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return Writer(row[0], int(row[1] or 0)) if row is not None and row[0] else None

    def completed_by(self, run_id: str) -> str | None:
        """Return the writer id whose ``Done`` completed the run (None: not completed, or no id)."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT completed_by FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return str(row[0]) if row is not None and row[0] else None

    def takeovers(self, run_id: str) -> list[Takeover]:
        """Return the run's recorded takeovers, oldest first."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT at, from_writer, from_epoch, to_writer, to_epoch FROM takeovers"
                " WHERE run_id = ? ORDER BY id",
                (run_id,),
            ).fetchall()
        return [
            Takeover(r[0], Writer(r[1], int(r[2] or 0)) if r[1] else None, Writer(r[3], int(r[4])))
            for r in rows
        ]

    # -- the check-and-insert ----------------------------------------------

    def accept(
        self,
        run_id: str,
        seq: int,
        kind: str,
        body: dict[str, Any],
        *,
        writer: Writer | None = None,
    ) -> AcceptResult:
        """Accept one data message in one ``BEGIN IMMEDIATE`` transaction.

        A writer that no longer owns the run (another took it over, or a
        restored copy superseded it) is ``"fenced"``: nothing is applied.
        ``seq == h + 1`` is inserted and becomes the new ``h`` (a ``done``
        also marks the run completed, by this writer, and a ``progress`` row,
        or the marker a row carries, becomes the run's resume point, in the
        same transaction); ``seq <= h``
        is a duplicate: counted, not applied; a higher seq is recorded as a
        gap ``(h + 1, seq)`` and not applied.
        SPEC "Engine duties".

        Args:
            run_id: the run (registered).
            seq: the message's seq (>= 1).
            kind: the ``UpMessage`` oneof name (``event``, ``finding``,
                ``approval_request``, ``done``).
            body: the body mapping as :func:`walchannel.wire.protobuf.body_of` returns it.
            writer: the stream's writer, checked against the run's owner
                (None: not checked).

        Returns:
            What happened, with the run's high-water after it.
        """
        # A marker the row carries is the run's resume point, not its content.
        point = body if kind == "progress" else body.get("progress")
        if point is not None and kind != "progress":
            body = {k: v for k, v in body.items() if k != "progress"}
        text = _dump(body)
        request_id = body.get("request_id") if kind == "approval_request" else None
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT h, completed_at, writer_id, writer_epoch FROM runs WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                return AcceptResult("unknown_run", 0)
            h, completed_at = int(row[0]), row[1]
            owner = Writer(row[2], int(row[3] or 0)) if row[2] else None
            if writer is not None and _lost(owner, writer):
                return AcceptResult("fenced", h, owner=owner)
            if seq <= h:
                conn.execute(
                    "UPDATE runs SET duplicates = duplicates + 1 WHERE run_id = ?", (run_id,)
                )
                stored = conn.execute(
                    "SELECT body FROM messages WHERE run_id = ? AND seq = ?", (run_id, seq)
                ).fetchone()
                differs = stored is not None and stored[0] != text
                decision = self._decision(conn, run_id, request_id)
                return AcceptResult("duplicate", h, decision, differs)
            if seq > h + 1:
                conn.execute(
                    "INSERT INTO gaps (run_id, expected, received, at) VALUES (?, ?, ?, ?)",
                    (run_id, h + 1, seq, time.time()),
                )
                return AcceptResult("gap", h)
            if completed_at is not None:
                return AcceptResult("completed", h)
            now = time.time()
            conn.execute(
                "INSERT INTO messages (run_id, seq, kind, body, applied_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, seq, kind, text, now),
            )
            done = kind == "done"
            conn.execute(
                "UPDATE runs SET h = ?, completed_at = ?, completed_by = ? WHERE run_id = ?",
                (seq, now if done else None, writer.id if done and writer else None, run_id),
            )
            if point is not None:
                # The run's resume point moves with the row, in its transaction:
                # its transaction's rows begin after a progress row, or at the
                # row that carries it (the first of them, applied now).
                carrier = kind != "progress"
                conn.execute(
                    "UPDATE runs SET resume_marker = ?, resume_seq = ?, resume_digests = ?,"
                    " resume_rows = ?, resume_writer = ? WHERE run_id = ?",
                    (
                        _dump(point["marker"]),
                        seq - 1 if carrier else seq,
                        json.dumps(point["digests"]),
                        1 if carrier else 0,
                        writer.id if writer is not None else "",
                        run_id,
                    ),
                )
            else:
                self._count_transaction_row(conn, run_id, kind, body, writer)
            decision = self._decision(conn, run_id, request_id)
            return AcceptResult("applied", seq, decision)

    @staticmethod
    def _count_transaction_row(
        conn: sqlite3.Connection,
        run_id: str,
        kind: str,
        body: dict[str, Any],
        writer: Writer | None,
    ) -> None:
        """Count an applied row into the resume point's transaction, or end its count.

        The row counts when the point's writer wrote it and it is the
        transaction's next row by content
        (:func:`~walchannel.wire.protobuf.continues_transaction`). Any other
        row while rows are owed ends the count for good (``resume_writer``
        cleared): a takeover's row, or a renumbered log's own after the log
        lost the transaction's commit, is none of them, and the rows after it
        are not either. SPEC "The engine keeps the resume point".
        """
        point = conn.execute(
            "SELECT resume_digests, resume_rows, resume_writer FROM runs WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        if point is None or point[0] is None or point[2] is None:
            return
        digests, rows = json.loads(point[0]), int(point[1] or 0)
        if rows >= len(digests):
            return
        mine = point[2] == (writer.id if writer is not None else "")
        if mine and continues_transaction(kind, body, int(digests[rows])):
            conn.execute(
                "UPDATE runs SET resume_rows = resume_rows + 1 WHERE run_id = ?", (run_id,)
            )
        else:
            conn.execute("UPDATE runs SET resume_writer = NULL WHERE run_id = ?", (run_id,))

    @staticmethod
    def _decision(conn: sqlite3.Connection, run_id: str, request_id: object) -> Decision | None:
        if not isinstance(request_id, str):
            return None
        row = conn.execute(
            "SELECT approved, reason FROM decisions WHERE run_id = ? AND request_id = ?",
            (run_id, request_id),
        ).fetchone()
        return Decision(request_id, bool(row[0]), row[1]) if row is not None else None

    # -- down-side state ---------------------------------------------------

    def set_stop(self, run_id: str, reason: str) -> None:
        """Store the run's issued ``Stop`` reason (re-sent after every handshake).

        Raises:
            KeyError: unknown run.
        """
        with self._transaction() as conn:
            cur = conn.execute("UPDATE runs SET stop_reason = ? WHERE run_id = ?", (reason, run_id))
            if cur.rowcount == 0:
                raise KeyError(run_id)

    def set_decision(self, run_id: str, request_id: str, approved: bool, reason: str) -> Decision:
        """Store an approval decision (the latest for a ``request_id`` wins).

        Raises:
            KeyError: unknown run.
        """
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise KeyError(run_id)
            conn.execute(
                "INSERT INTO decisions (run_id, request_id, approved, reason, decided_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, request_id) DO UPDATE SET"
                " approved = excluded.approved, reason = excluded.reason",
                (run_id, request_id, int(approved), reason, time.time()),
            )
        return Decision(request_id, approved, reason)

    # -- engine addresses --------------------------------------------------

    def record_engine(self, grpc_addr: str, pid: int) -> None:
        """Record a started engine's address; the newest one is discovery's answer."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO engines (grpc_addr, pid, started_at) VALUES (?, ?, ?)",
                (grpc_addr, pid, time.time()),
            )

    def latest_engine_addr(self) -> str | None:
        """Return the newest recorded engine address (``127.0.0.1:PORT``), or None."""
        with self._connection() as conn:
            row = conn.execute("SELECT grpc_addr FROM engines ORDER BY id DESC LIMIT 1").fetchone()
        return str(row[0]) if row is not None else None

    # -- read-outs ---------------------------------------------------------

    def accepted(self, run_id: str) -> list[int]:
        """Return the applied seqs of the run, ascending."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT seq FROM messages WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
        return [int(r[0]) for r in rows]

    def duplicates(self, run_id: str) -> int:
        """Return how many duplicates (``seq <= h``) the run received (0 for an unknown run)."""
        with self._connection() as conn:
            row = conn.execute("SELECT duplicates FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    def gaps(self, run_id: str) -> list[tuple[int, int]]:
        """Return the recorded gaps of the run as ``(expected, received)``, oldest first."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT expected, received FROM gaps WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
        return [(int(r[0]), int(r[1])) for r in rows]

    def bodies(self, run_id: str) -> list[dict[str, Any]]:
        """Return the applied messages as ``{"seq", "kind", "body"}``, ascending by seq.

        Body shapes are those of :func:`walchannel.wire.protobuf.body_of` (SPEC
        "Control vs data"); Struct numbers are floats.
        """
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT seq, kind, body FROM messages WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
        return [{"seq": int(r[0]), "kind": r[1], "body": json.loads(r[2])} for r in rows]

    def done(self, run_id: str) -> dict[str, Any] | None:
        """Return the applied ``Done`` as ``{"seq", "status", "findings", "coverage",
        "exit_reason"}``, or None."""
        with self._connection() as conn:
            row = conn.execute(
                "SELECT seq, body FROM messages WHERE run_id = ? AND kind = 'done'"
                " ORDER BY seq LIMIT 1",
                (run_id,),
            ).fetchone()
        if row is None:
            return None
        body = json.loads(row[1])
        return {
            "seq": int(row[0]),
            "status": body["status"],
            "findings": body["findings"],
            "coverage": body["coverage"],
            "exit_reason": body["exit_reason"],
        }

    def stop_reason(self, run_id: str) -> str | None:
        """Return the run's issued ``Stop`` reason, or None."""
        state = self.run_state(run_id)
        return state.stop_reason if state is not None else None

    def decisions(self, run_id: str) -> list[Decision]:
        """Return the run's stored approval decisions, oldest first."""
        state = self.run_state(run_id)
        return list(state.decisions) if state is not None else []
