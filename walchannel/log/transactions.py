"""The transactions of a :class:`~walchannel.log.RunLog`: append, ack, verify, complete, meta.

Each carries out a decision of :class:`~walchannel.log_state.LogState` in
SQL, in one transaction through :meth:`~walchannel.log.base.LogBase._commit`:
a row is committed before its seq is handed out (with the progress marker,
if any); an ack deletes every row ``<= seq`` and stores the cursor; the
verification rule renumbers the unverified rows; the ack that deletes the
``done`` row, or the engine's "run completed", turns the log into a
tombstone. SPEC "The log", "Dial", "Completion".
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from walchannel.errors import PayloadError
from walchannel.log.base import LogBase
from walchannel.log_format import body_crc, encode_body
from walchannel.log_state import AckPlan

__all__ = ["Transactions", "WRITABLE_META"]

_INSERT: Final = "INSERT INTO rows VALUES (?, ?, ?, ?, ?)"

#: Meta fields callers may set with update_meta(); the rest are the log's own.
WRITABLE_META: Final = frozenset(
    {
        "correlation_id",
        "connector_version",
        "harness_name",
        "harness_version",
        "token_sha256",
        "last_engine_addr",
        "last_ack_at",
        "last_error",
        "last_error_at",
        "reconnects",
        "failed_at",
        "failed_reason",
    }
)


def _encode_progress(progress: Mapping[str, Any]) -> str:
    try:
        return json.dumps(progress, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError("progress", f"not JSON-like: {exc}") from None


class Transactions(LogBase):
    """The log's writes of rows, acks, verification, completion and meta."""

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
        self._check_writable()
        old = self._state
        first = old.next_seq
        now = time.time()
        if progress is None and len(items) == 1:
            # The send path: one row, one autocommit statement. Kept apart from
            # the general path below, which costs ~1.3 µs more per row
            # (docs/performance.md, the append row).
            kind, blob = items[0]
            state = old.append((kind,))
            row = (first, kind, blob, body_crc(blob), now)
            self._commit(
                "append",
                lambda: f"append 1 row at seq {first}",
                lambda conn: conn.execute(_INSERT, row),
                single=True,
            )
            self._state = state
            if self._unacked_bytes is not None:
                self._unacked_bytes += len(blob)
            return [first]
        state = old.append([kind for kind, _ in items])
        rows = [
            (seq, kind, blob, body_crc(blob), now)
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

        what = f"append {len(rows)} row(s) at seq {first}" if rows else "store progress"
        self._commit("append", what, work)
        self._state = state
        if marker is not None:
            # A copy the caller cannot mutate afterwards.
            self._progress = json.loads(marker)
        if self._unacked_bytes is not None:
            self._unacked_bytes += sum(len(r[2]) for r in rows)
        return list(range(first, state.next_seq))

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

    def verify(self, engine_high: int) -> int:
        """Apply the verification rule for the first answered handshake ``Ack(h)``.

        In one transaction: when the engine holds seqs at or above
        ``unverified_from``, the unverified rows move to ``h+1, h+2, …``
        (a constant shift, order kept) and the high-water becomes at least
        ``h``; ``unverified_from`` is cleared; then ``Ack(h)`` is stored as
        any ack is. The caller checks first that ``h`` is not below the
        stored cursor (the engine-behind rule). SPEC "Dial"; the decision
        is :meth:`LogState.verify <walchannel.log_state.LogState.verify>`.

        Args:
            engine_high: ``h``, the engine's answer.

        Returns:
            The shift applied to the unverified rows (0 for none).

        Raises:
            ValueError: ``h`` is below the stored cursor, or the log is
                already verified (``unverified_from`` is None).
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        plan = self._state.verify(engine_high)
        self._carry_out(plan, "verify", f"store ack {engine_high}")
        return plan.shift_by

    def _carry_out(self, plan: AckPlan, label: str, what: str) -> int:
        """Carry out an :class:`~walchannel.log_state.AckPlan` in one transaction; rows deleted."""
        now = time.time()
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
                " updated_at = ? WHERE id = 1",
                (
                    plan.state.last_acked,
                    plan.high_water,
                    plan.clear_unverified,
                    plan.completed,
                    now,
                    plan.advanced,
                    now,
                    now,
                ),
            )
            return deleted, int(gone_bytes)

        deleted, gone_bytes = self._commit(label, what, work)
        self._state = plan.state
        if self._unacked_bytes is not None:
            self._unacked_bytes -= gone_bytes
        return deleted

    def complete_by_engine(self) -> int:
        """Turn a log holding an unacked ``Done`` into a tombstone on the engine's word.

        For the engine's FAILED_PRECONDITION "run completed" answer when this
        log holds ``Done``: the engine applied a ``Done`` of this run (it takes
        seqs in order, so everything before it too), but its ack was lost. In
        one transaction every row is deleted and ``completed_at`` set; the
        stored cursor does not move (after a rollback the engine's ``Done``
        may sit at another seq). The decision is
        :meth:`LogState.complete_by_engine <walchannel.log_state.LogState.complete_by_engine>`.

        Returns:
            How many rows were deleted.

        Raises:
            ValueError: the log holds no unacked ``Done``.
            ChannelClosedError, WalLockedError, WalWriteError: as :meth:`append`.
        """
        self._check_writable()
        state = self._state.complete_by_engine()
        now = time.time()

        def work(conn: sqlite3.Connection) -> int:
            deleted = conn.execute("DELETE FROM rows").rowcount
            conn.execute(
                "UPDATE meta SET completed_at = ?, last_error = ?, last_error_at = ?,"
                " updated_at = ? WHERE id = 1",
                (now, "the engine says the run is completed; the log is a tombstone", now, now),
            )
            return deleted

        deleted = self._commit("complete", "mark the run completed", work)
        self._state = state
        self._unacked_bytes = 0
        return deleted

    def update_meta(self, **values: Any) -> None:
        """Store meta fields (one transaction); names as in :class:`RunMeta`.

        Only the caller-owned fields may be set: the handshake fields,
        ``correlation_id``, ``token_sha256``, ``last_engine_addr``,
        ``last_ack_at``, ``last_error``, ``last_error_at``, ``reconnects``
        and ``failed_at``. The cursor, high-water, progress and completion
        belong to the log's own operations.

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
        params = (*(values[name] for name in names), time.time())
        sql = f"UPDATE meta SET {assignments}, updated_at = ? WHERE id = 1"  # noqa: S608
        self._commit(
            "meta",
            f"update meta ({', '.join(names)})",
            lambda conn: conn.execute(sql, params),
            single=True,
        )
