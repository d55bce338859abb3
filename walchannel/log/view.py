"""A read-only view of a run's log: what a channel hands out as ``channel.log``.

The channel owns its :class:`~walchannel.log.writer.RunLog` (it alone
appends, acks, verifies and closes); a harness, a test or a tool reads it
through this view, which has no method that writes. Each member reads the
log as :class:`~walchannel.log.writer.RunLog`'s member of the same name
does (see it for units and what is raised). SPEC "The log (WAL)".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from walchannel.log.format import Row, RunMeta
    from walchannel.log.state import Writer
    from walchannel.log.writer import Durability, RunLog

__all__ = ["LogView"]


class LogView:
    """Read a :class:`~walchannel.log.writer.RunLog` without the power to write it.

    Args:
        log: the log read through.
    """

    __slots__ = ("_log",)

    def __init__(self, log: RunLog) -> None:
        self._log = log

    def __repr__(self) -> str:
        return f"LogView({self._log.path})"

    @property
    def path(self) -> Path:
        """The log file, ``<wal_dir>/<run_id>.wal.sqlite3``."""
        return self._log.path

    @property
    def run_id(self) -> str:
        """The run this log belongs to."""
        return self._log.run_id

    @property
    def writer(self) -> Writer:
        """The log's writer identity (SPEC "Writers")."""
        return self._log.writer

    @property
    def durability(self) -> Durability:
        """``"process"`` or ``"power"``."""
        return self._log.durability

    @property
    def last_acked_seq(self) -> int:
        """The stored ack cursor: every seq ``<=`` it is deleted."""
        return self._log.last_acked_seq

    @property
    def next_seq(self) -> int:
        """The seq the next committed row gets."""
        return self._log.next_seq

    @property
    def high_water(self) -> int:
        """The highest seq ever used by this log (0 for a new one)."""
        return self._log.high_water

    @property
    def unverified_from(self) -> int | None:
        """Rows at or above it were never written after an answered handshake."""
        return self._log.unverified_from

    @property
    def unacked_count(self) -> int:
        """Rows not yet covered by the stored cursor."""
        return self._log.unacked_count

    @property
    def unacked_bytes(self) -> int:
        """Total msgpack size of the unacked rows (bytes)."""
        return self._log.unacked_bytes

    @property
    def progress(self) -> dict[str, Any] | None:
        """The last committed harness progress marker (None for a new run)."""
        return self._log.progress

    @property
    def completed(self) -> bool:
        """True once the ack covering the ``done`` row was stored (a tombstone)."""
        return self._log.completed

    @property
    def done_seq(self) -> int | None:
        """The seq of the unacked ``done`` row, if one is logged."""
        return self._log.done_seq

    @property
    def quarantined_count(self) -> int:
        """How many rows the ``quarantine`` table holds."""
        return self._log.quarantined_count

    @property
    def closed(self) -> bool:
        """True once the channel has closed its log."""
        return self._log.closed

    @property
    def written_bound(self) -> int | None:
        """The highest seq this log can have written to an engine, known at open."""
        return self._log.written_bound

    def meta(self) -> RunMeta:
        """Return the meta row as stored now."""
        return self._log.meta()

    def quarantined(self) -> list[tuple[int, str]]:
        """Return ``(seq, reason)`` of every quarantined row."""
        return self._log.quarantined()

    def unacked(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Row]:
        """Yield the unacked rows above ``after_seq``, in seq order (at most ``limit``)."""
        return self._log.unacked(after_seq, limit)

    def oldest_unacked_age_s(self, after_seq: int = 0) -> float | None:
        """How old the oldest unacked row above ``after_seq`` is (seconds; None: none)."""
        return self._log.oldest_unacked_age_s(after_seq)
