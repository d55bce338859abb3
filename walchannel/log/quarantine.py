"""The quarantine of a :class:`~walchannel.log.RunLog`: damaged rows and rows set aside.

A row whose CRC, msgpack or kind does not check out when read, and a good
row the engine refuses for its size, move (body and all, with the reason)
to the ``quarantine`` table; a ``walchannel.row_lost`` event takes its seq
in ``rows``, so the engine's sequence goes on and the loss is visible.
``walchannel export --quarantined`` gives the originals back. SPEC "The
log"; docs/design.md ("A row the engine refuses for its size").
"""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

from walchannel.errors import WalCorruptError, WalWriteError
from walchannel.log.base import LogBase
from walchannel.log_format import ROW_LOST_TYPE, Row, body_crc, encode_body, row_lost_body

__all__ = ["Quarantine"]

logger = logging.getLogger(__name__)


class Quarantine(LogBase):
    """Moving rows into the ``quarantine`` table, and listing it."""

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
        now = time.time()

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*raw, reason, now),
            )
            conn.execute(
                "UPDATE rows SET kind = 'event', body = ?, crc32 = ? WHERE seq = ?",
                (blob, body_crc(blob), seq),
            )

        try:
            self._commit("quarantine", f"quarantine seq {seq}", work)
        except WalWriteError as exc:
            # The substitute still goes out; the damaged row stays for next time.
            logger.error("run %s: cannot quarantine seq %d: %s", self._run_id, seq, exc)
            return substitute
        self._quarantined += 1
        self._state = self._state.row_replaced(seq)
        if self._unacked_bytes is not None:
            self._unacked_bytes += len(blob) - (len(raw[2]) if isinstance(raw[2], bytes) else 0)
        return Row(seq, "event", substitute.body, substitute.appended_at, len(blob))

    def set_aside(self, seq: int, reason: str, **details: str | int) -> Row:
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
        blob = encode_body("event", body)
        now = time.time()

        def work(conn: sqlite3.Connection) -> None:
            # Plain INSERT: an earlier quarantined body at this seq is never replaced.
            conn.execute("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?)", (*raw, reason, now))
            conn.execute(
                "UPDATE rows SET kind = 'event', body = ?, crc32 = ? WHERE seq = ?",
                (blob, body_crc(blob), seq),
            )

        self._commit("set_aside", f"set aside seq {seq}", work)
        self._quarantined += 1
        if self._unacked_bytes is not None:
            self._unacked_bytes += len(blob) - len(raw[2])
        return Row(seq, "event", body, float(raw[4]), len(blob))

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
