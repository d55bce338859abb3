"""Buffer first: the channel's sends, approvals and waits (SPEC "The channel").

``send_*`` validates, encodes (:class:`~walchannel.row_source.RowSource`),
commits the row to the run's log with the progress marker, and only then
wakes the writer: it never blocks on the network and never raises because
the stream is down. ``send_done``, ``request_approval`` and ``wait_acked``
wait on what the acks and decisions bring in.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from walchannel import _killpoints, messages
from walchannel.channel.base import ChannelBase, now_ms
from walchannel.errors import (
    ApprovalTimeoutError,
    BacklogFullError,
    ChannelClosedError,
    RunExpiredError,
)
from walchannel.interface import ApprovalDecision
from walchannel.protocol import ChannelState

__all__ = ["Sender"]

logger = logging.getLogger(__name__)


def _check_timeout_ms(call: str, timeout_ms: object) -> None:
    """Refuse a ``timeout_ms`` that is not None or a number >= 0 (NaN would never time out).

    Raises:
        ValueError: naming ``call`` and the value.
    """
    if timeout_ms is None:
        return
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, (int, float))
        or not math.isfinite(timeout_ms)
        or timeout_ms < 0
    ):
        raise ValueError(
            f"{call}: timeout_ms must be None or a finite number >= 0, got {timeout_ms!r}"
        )


class Sender(ChannelBase):
    """The sending part of :class:`~walchannel.channel.GrpcEngineChannel`."""

    def _check_sendable(self) -> None:
        """Refuse a send the channel cannot take (SPEC "Buffer first": which error when)."""
        self._check_loop()
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: the channel is closed")
        if self._done_sent:
            raise ChannelClosedError(f"run {self._run_id}: send_done() was called; no new rows")
        if self._expired():
            self._expire()
            raise RunExpiredError(f"run {self._run_id}: past its hard_deadline")
        if self._failure is not None:
            raise self._failure

    def _expired(self) -> bool:
        deadline = self._config.hard_deadline
        return deadline is not None and datetime.now(UTC) >= deadline

    def _check_backlog(self, added: int) -> None:
        limit = self._config.max_unacked_bytes
        if limit is None:
            return
        self._store_ack(force=True)
        if self._log.unacked_bytes + added > limit:
            raise BacklogFullError(
                f"run {self._run_id}: {self._log.unacked_bytes} unacked bytes + {added} "
                f"would pass max_unacked_bytes {limit}; nothing was logged"
            )

    def _log_rows(
        self,
        items: list[tuple[str, bytes]],
        progress: Mapping[str, Any] | None,
        *,
        exempt_from_backlog: bool = False,
    ) -> list[int]:
        """Commit ``items`` (with ``progress``) and hand them to the writer; return their seqs."""
        marker = messages.progress_marker(progress)
        if self._config.max_unacked_bytes is not None and not exempt_from_backlog:
            self._check_backlog(sum(len(blob) for _, blob in items))
        seqs = self._log.append_encoded(items, progress=marker)
        _killpoints.reached("after_commit")
        self._rows.on_commit(seqs, items)
        if self._metrics is not None:
            self._metrics.on_commit(seqs[0])
        self._wakeup.set()
        return seqs

    def send_event(
        self,
        type: str,
        severity: str,
        payload: Mapping[str, Any],
        ts: datetime | str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> int:
        """Commit an ``Event`` (and ``progress``) and return its seq.

        Args:
            type: the event type, e.g. ``"progress"``.
            severity: free text, e.g. ``"info"``.
            payload: a JSON-like mapping (SPEC "Payloads").
            ts: an aware datetime, an RFC 3339 str, or None (now); sent in UTC.
            progress: the harness's resume marker, committed with the row.

        Returns:
            The row's seq (provisional until the first answered handshake:
            see ``wait_acked``).

        Raises:
            PayloadError: a bad field or payload, or an encoded message over
                ``max_message_bytes`` (nothing logged, no seq used).
            BacklogFullError: ``max_unacked_bytes`` would be passed.
            ChannelClosedError: after ``send_done`` or ``close``, or once
                the channel's event loop is gone.
            RunExpiredError: past ``hard_deadline``.
            EngineBehindError: the channel is ``FAILED``.
            RunCompletedError: the engine said the run is completed.
            WalWriteError: the commit failed (disk full); retry later.
        """
        started = time.perf_counter_ns() if self._metrics is not None else 0
        self._check_sendable()
        body = messages.event_body(type, severity, payload, ts, max_values=self._max_values)
        seq = self._log_rows([self._rows.prepare("event", body)], progress)[0]
        if self._metrics is not None:
            self._metrics.on_send(started)
        return seq

    def send_finding(
        self, finding: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """Commit a ``FindingDraft`` (and ``progress``) and return its seq.

        Args:
            finding: the finding's fields, a JSON-like mapping.
            progress: the harness's resume marker, committed with the row.

        Returns:
            The row's seq.

        Raises:
            As :meth:`send_event`.
        """
        started = time.perf_counter_ns() if self._metrics is not None else 0
        self._check_sendable()
        body = messages.finding_body(finding, max_values=self._max_values)
        seq = self._log_rows([self._rows.prepare("finding", body)], progress)[0]
        if self._metrics is not None:
            self._metrics.on_send(started)
        return seq

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Commit several findings in one transaction (all logged, or none).

        Args:
            findings: the findings, in order.
            progress: the harness's resume marker, committed with them.

        Returns:
            Their seqs, consecutive; ``[]`` for no findings, when only
            ``progress`` (if given) is committed: a stretch of the scan with
            nothing to report still moves the resume marker.

        Raises:
            As :meth:`send_event`; a bad finding names its index
            (``finding``) and nothing of the batch is logged.
        """
        started = time.perf_counter_ns() if self._metrics is not None else 0
        self._check_sendable()
        bodies = messages.finding_bodies(findings, max_values=self._max_values)
        items = [self._rows.prepare("finding", body) for body in bodies]
        if not items:
            marker = messages.progress_marker(progress)
            if marker is not None:
                self._log.append_encoded([], progress=marker)
            seqs = []
        else:
            seqs = self._log_rows(items, progress)
        if self._metrics is not None:
            self._metrics.on_send(started)
        return seqs

    async def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """Commit and write ``Done``, then wait up to ``done_ack_timeout_ms`` for its ack.

        On a log that already holds an unacked ``Done`` (a restarted
        harness) it waits on that row instead of logging another. After it,
        ``send_*`` raise ``ChannelClosedError``.

        Args:
            status: free text; ``completed``, ``failed`` or ``stopped`` suggested.
            findings: how many findings the run produced.
            coverage: what was scanned (e.g. paths).
            exit_reason: free text.

        Returns:
            True once the ack and the tombstone are stored; False when no
            ack came in time (the row stays for a resume or ``flush``), or at
            once past ``hard_deadline``.

        Raises:
            PayloadError: a bad field; or the engine refused the ``Done``
                for its size (the channel stops once the rows before it are
                acked; the row stays in the log).
            ChannelClosedError: after ``close`` or a previous ``send_done``.
            EngineBehindError, RunCompletedError, WalWriteError: as ``send_event``;
                also when the channel fails while waiting (engine behind).

        SPEC "Shutdown order".
        """
        self._bind_loop()
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: the channel is closed")
        if self._done_sent:
            raise ChannelClosedError(f"run {self._run_id}: send_done() was already called")
        if self._expired():
            self._expire()
            return False
        if self._failure is not None:
            raise self._failure
        if self._cursor.done_seq is None:
            body = messages.done_body(status, findings, coverage, exit_reason)
            self._log_rows(
                [self._rows.prepare("done", body)],
                None,
                exempt_from_backlog=True,
            )
        self._done_sent = True
        _killpoints.reached("in_send_done")
        # No ack wakes it: completion (the tombstone stored) and failures do.
        acked = await self._wait_for(
            lambda: self._cursor.completed, self._config.done_ack_timeout_ms, lambda: math.inf
        )
        if not acked and self._failure is not None:
            # Failed while waiting (engine behind). A Done the engine applied
            # but whose ack was lost ends as a tombstone instead: True above.
            raise self._failure
        return acked

    async def request_approval(
        self,
        action: str,
        details: Mapping[str, Any],
        *,
        request_id: str | None = None,
        timeout_ms: float | None = None,
    ) -> ApprovalDecision:
        """Log an ``ApprovalRequest`` and wait for the engine's decision.

        Decisions are cached by ``request_id``: an id already decided (in
        this channel, or re-sent by the engine after a handshake) resolves at
        once without logging a new row. Pass a stable ``request_id`` to
        survive a harness restart.

        Args:
            action: what the harness wants to do.
            details: a JSON-like mapping.
            request_id: default a uuid4.
            timeout_ms: how long to wait (None: until close).

        Returns:
            The :class:`~walchannel.ApprovalDecision`.

        Raises:
            ApprovalTimeoutError: no decision within ``timeout_ms`` (the
                request stays logged; a later call with the id waits again).
            ChannelClosedError: the channel closed while waiting.
            PayloadError: as ``send_event``; or the engine refused the request
                for its size (it was set aside: it will never be decided).
            ValueError: ``timeout_ms`` is not None or a finite number >= 0
                (nothing logged).
            The other errors of ``send_event``.
        """
        self._bind_loop()
        _check_timeout_ms("request_approval", timeout_ms)
        rid = request_id if request_id is not None else str(uuid.uuid4())
        decided = self._down.decision(rid)
        if decided is not None:
            return decided
        future = self._approvals.get(rid)
        if future is None or future.done():
            self._check_sendable()
            body = messages.approval_body(rid, action, details, max_values=self._max_values)
            self._log_rows(
                [self._rows.prepare("approval_request", body)],
                None,
            )
            future = asyncio.get_running_loop().create_future()
            self._approvals[rid] = future
        try:
            if timeout_ms is None:
                return await asyncio.shield(future)
            return await asyncio.wait_for(asyncio.shield(future), timeout_ms / 1000)
        except TimeoutError:
            raise ApprovalTimeoutError(
                f"run {self._run_id}: no decision for approval request {rid!r} "
                f"within {timeout_ms} ms"
            ) from None

    async def wait_acked(self, seq: int | None = None, timeout_ms: float | None = None) -> bool:
        """Wait until the engine acked ``seq`` (default: the newest logged row).

        A seq returned before the first answered handshake is provisional:
        if the verification rule moved its row, this follows it.

        Args:
            seq: the seq to wait for.
            timeout_ms: bound (None: until acked or closed).

        Returns:
            True when acked, False on timeout or close.

        Raises:
            TypeError: ``seq`` is not an int.
            ValueError: ``timeout_ms`` is not None or a finite number >= 0.
        """
        self._bind_loop()
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)):
            raise TypeError(f"wait_acked: seq must be an int, got {type(seq).__name__} {seq!r}")
        _check_timeout_ms("wait_acked", timeout_ms)
        target = self._cursor.high_water if seq is None else seq
        return await self._wait_for(
            lambda: self._cursor.acked >= self._cursor.translate(target),
            timeout_ms,
            lambda: self._cursor.translate(target),
        )

    async def _wait_for(
        self,
        condition: Callable[[], bool],
        timeout_ms: float | None,
        wake_at: Callable[[], float],
    ) -> bool:
        """Wait until ``condition()`` holds; False at ``timeout_ms`` or once nothing can come.

        ``wake_at()`` is the lowest received ack at which ``condition`` may
        hold: acks below it do not wake this waiter. Changes of state
        (completion, failure, close, a verification shift) always do.
        """
        deadline = None if timeout_ms is None else now_ms() + timeout_ms
        if self._sm.state is ChannelState.IDLE and not condition():
            # Sends before handshake() are logged, not sent (SPEC "The
            # channel"): waiting on acks then would end silently at the timeout.
            text = "waiting for acks, but handshake() was never called: nothing is sent until it is"
            if self._last_error != text:
                logger.warning("run %s: %s", self._run_id, text)
                self._last_error = text
        while not condition():
            # FAILED or EXPIRED: the connection loop is over, no ack can come.
            if self._closed or self._sm.final:
                return False
            remaining = None if deadline is None else (deadline - now_ms()) / 1000
            if remaining is not None and remaining <= 0:
                return False
            self._acked_changed.clear()
            at = wake_at()
            self._ack_waits.append(at)
            self._wake_at = min(self._ack_waits)
            try:
                # asyncio.timeout: on Python 3.11 wait_for can swallow a caller's cancel.
                async with asyncio.timeout(remaining):
                    await self._acked_changed.wait()
            except TimeoutError:
                return condition()
            finally:
                self._ack_waits.remove(at)
                self._wake_at = min(self._ack_waits, default=math.inf)
        return True

    def replay_unacked(self) -> int:
        """Rewind the writer to the cursor; return how many rows it will re-send.

        The rows above the received ack are written again (the engine drops
        duplicates by seq). Without a live stream nothing moves: the next
        dial replays from the cursor anyway.
        """
        self._check_loop()
        self._rows.clear_readahead()
        count = self._cursor.rewind()
        self._wakeup.set()
        return count
