"""Rows the engine refused for their size: one part of the channel.

SPEC "Row size" and docs/design.md ("A row the engine refuses"). An engine
whose limit is below the channel's ``max_message_bytes`` ends the stream with
RESOURCE_EXHAUSTED naming the size it received; re-sending the row would end
every stream the same way. :class:`RefusedRows` carries out what the pure
rules of :mod:`walchannel.core.engine_refusals` decide: it finds the row (only one
proven refused), then sets it aside into the log's quarantine and has a
``row_lost`` event stand in for it, or, for a ``Done``, holds it so the
channel stops once the rows before it are acked. It does the log's I/O and
the logging; the channel fails the waiters it names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from walchannel._logging import get_logger
from walchannel.core import events as ev
from walchannel.core.engine_refusals import pick_refused_row, refusal_sets_aside, unproven_refusal
from walchannel.errors import RowRefusedError, WalchannelError
from walchannel.log.format import ROW_LOST_TYPE
from walchannel.wire.protobuf import row_digest

if TYPE_CHECKING:
    from walchannel.channel.reporting import Reporter
    from walchannel.channel.row_source import RowSource
    from walchannel.config import GrpcChannelConfig
    from walchannel.core.driver import Driver
    from walchannel.core.end_status import SizeRefusal
    from walchannel.log.writer import RunLog

__all__ = ["ApprovalRefused", "RefusedRows"]

logger = get_logger(__name__)


class ApprovalRefused(NamedTuple):
    """An approval request set aside: the engine will never decide ``request_id``."""

    request_id: str
    error: RowRefusedError


class RefusedRows:
    """Find a refused row and set it aside or hold it (SPEC "Row size").

    Args:
        config: the run's config (run id, ``max_message_bytes``).
        log: the run's open log (the row is read from it and set aside in it).
        driver: the run's driver (read: ``acked``).
        rows: the writer's row source (its tail forgets a row set aside).
        reporter: where the refusal is kept as ``last_error`` and in the log's meta.
        feed: the executor's entry (``ConnectionLoop.feed``): the outcome is
            fed as ``RefusedRowSetAside`` or ``DoneRefused``.
        handshake_size: the size of this channel's handshake message (bytes),
            which an unproven refusal is compared with.
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        log: RunLog,
        driver: Driver,
        rows: RowSource,
        reporter: Reporter,
        feed: Callable[[ev.Event], None],
        *,
        handshake_size: Callable[[], int],
    ) -> None:
        self._feed = feed
        self._run_id = config.run_id
        self._max_message_bytes = config.max_message_bytes
        self._log = log
        self._driver = driver
        self._rows = rows
        self._reporter = reporter
        self._handshake_size = handshake_size
        self._limits_warned: set[tuple[str, int]] = set()

    def on_refusal(
        self, addr: str, top_written: int, refusal: SizeRefusal, text: str
    ) -> ApprovalRefused | None:
        """The engine at ``addr`` refused a message for its size: find the row, act on it.

        Args:
            addr: the engine's address (host:port), for the words.
            top_written: the highest seq written on the stream that ended.
            refusal: what the end status said (received size, limit; bytes).
            text: the stream end, described, for ``last_error``.

        Returns:
            The approval request whose row was set aside and that no later
            row asks again, with the error its waiter gets; else None. A
            refused ``Done`` is fed as ``DoneRefused`` (the driver stops the
            channel once the rows before it are acked).
        """
        driver = self._driver
        self._warn_engine_limit(addr, refusal.limit)
        try:
            verdict = pick_refused_row(
                self._rows.in_flight_sizes(driver.acked, top_written), refusal
            )
        except WalchannelError as exc:
            logger.error(
                "run %s: cannot read the log to find the refused row: %s", self._run_id, exc
            )
            self._reporter.record(f"{addr}: {text}")
            return None
        if verdict.seq is None:
            why = unproven_refusal(verdict, refusal, handshake_size=self._handshake_size())
            logger.error(
                "run %s: the engine at %s refused a %d-byte message (its limit: %d bytes), but %s: "
                "nothing is set aside; the stream will be retried",
                self._run_id,
                addr,
                refusal.received,
                refusal.limit,
                why,
            )
            self._reporter.record(f"{addr}: {text} ({why}; nothing set aside)")
            return None
        seq = verdict.seq
        size = refusal.received
        row = next(self._log.unacked(after_seq=seq - 1, limit=1))
        kind = row.kind
        what = (
            f"seq {seq} ({kind}, {size} bytes) was refused by the engine at {addr}: over its "
            f"limit of {refusal.limit} bytes"
        )

        def refused(message: str) -> RowRefusedError:
            return RowRefusedError(
                f"run {self._run_id}: {message}",
                run_id=self._run_id,
                seq=seq,
                kind=kind,
                size=size,
                limit=refusal.limit,
                path=str(self._log.path),
            )

        if not refusal_sets_aside(kind):
            # The rows before it may not be applied yet (the engine drops what
            # it had read ahead): deliver them, then stop (Driver.held_due).
            error = refused(
                f"{what}; the channel stops, the row stays in {self._log.path}"
                " (raise the engine's limit, then resume or flush)"
            )
            logger.error(
                "run %s: %s; it is not written again, and the channel stops once the rows "
                "before it are acked",
                self._run_id,
                what,
            )
            self._reporter.record(f"{what}; the channel stops once the rows before it are acked")
            self._feed(ev.DoneRefused(seq, error))
            return None
        reason = (
            f"refused by the engine at {addr} for its size: {size} bytes, over its limit "
            f"of {refusal.limit} bytes"
        )
        # The row's digest goes with the event that takes its seq: an engine that
        # keeps the resume point counts that event as the transaction's row it
        # stands for, and nothing else as it (SPEC "The engine keeps the resume point").
        digest = f"{row_digest(kind, row.body):016x}"
        try:
            self._log.set_aside(
                seq, reason, kind=kind, size=size, limit=refusal.limit, digest=digest
            )
        except (WalchannelError, ValueError) as exc:
            logger.error("run %s: %s, but it cannot be set aside: %s", self._run_id, what, exc)
            self._reporter.record(f"{what}; cannot set it aside: {exc}")
            return None
        # The tail and readahead may hold the original: read the substitute from disk.
        self._rows.forget()
        self._feed(ev.RefusedRowSetAside())
        logger.error(
            "run %s: %s; set aside into the quarantine of %s and replaced by a %s event at "
            "seq %d so later rows flow (recover it: walchannel export --quarantined)",
            self._run_id,
            what,
            self._log.path,
            ROW_LOST_TYPE,
            seq,
        )
        self._reporter.record(f"{what}; set aside into the quarantine, sent as {ROW_LOST_TYPE}")
        if kind != "approval_request":
            return None
        rid = str(row.body.get("request_id", ""))
        if self._asked_again(rid, seq):
            return None  # a later request with this id may still be decided
        return ApprovalRefused(
            rid,
            refused(
                f"approval request {rid!r} at {what}; set aside, the engine will never decide it"
            ),
        )

    def _asked_again(self, request_id: str, seq: int) -> bool:
        """Tell whether an unacked approval request above ``seq`` carries ``request_id``.

        A harness restarted with a stable request id logs it again; the engine
        decides that row even when an older one was set aside.
        """
        try:
            return any(
                row.kind == "approval_request" and row.body.get("request_id") == request_id
                for row in self._log.unacked(after_seq=seq)
            )
        except WalchannelError:
            return False

    def _warn_engine_limit(self, addr: str, limit: int) -> None:
        """Say once per engine and limit that the engine takes less than ``max_message_bytes``."""
        if (addr, limit) in self._limits_warned or limit >= self._max_message_bytes:
            return
        self._limits_warned.add((addr, limit))
        logger.warning(
            "run %s: the engine at %s accepts up-messages of at most %d bytes, less than this "
            "channel's max_message_bytes %d: a larger row is refused by it and set aside; set "
            "max_message_bytes=%d to refuse such rows at send time instead",
            self._run_id,
            addr,
            limit,
            self._max_message_bytes,
            limit,
        )
