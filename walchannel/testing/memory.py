"""InMemoryEngineChannel: an :class:`~walchannel.EngineChannel` that keeps what it gets.

For unit tests of harness code that need no engine, no socket and no disk.
It checks every input exactly as the real channel does (the same
``PayloadError`` for the same bad payload) and exposes what it got as
``events``, ``findings``, ``approvals`` (lists of the body mappings, shapes
as in SPEC "Control vs data") and ``done``. Each body is recorded as the
real channel commits it (a msgpack round trip: tuples become lists), so a
harness changing its dicts after a send changes nothing recorded. For durability tests use the
real channel against :class:`~walchannel.testing.LocalEngine`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgpack

from walchannel._logging import get_logger
from walchannel.channel.interface import (
    ApprovalDecision,
    BudgetCallback,
    ChannelStats,
    StopCallback,
)
from walchannel.core.driver import ChannelState
from walchannel.errors import ChannelClosedError
from walchannel.log.format import encode_body
from walchannel.wire import messages
from walchannel.wire.payload import check_text
from walchannel.wire.protobuf import ResumePoint

__all__ = ["InMemoryEngineChannel"]

logger = get_logger(__name__)


class InMemoryEngineChannel:
    """A test double of the channel: sends are recorded in memory, seqs count from 1.

    Attributes:
        events: the ``event`` bodies, in order.
        findings: the ``finding`` bodies (``{"fields": {...}}``), in order.
        approvals: the ``approval_request`` bodies, in order.
        done: the ``done`` body, once ``send_done`` ran.
        handshakes: the ``(connector_version, harness_name, harness_version)`` calls.
        closed: True after ``close()``.
    """

    def __init__(
        self,
        *,
        progress: Mapping[str, Any] | None = None,
        approve: bool = True,
        takeover_point: ResumePoint | None = None,
    ) -> None:
        """Args:
        progress: a marker to start from, as a resumed run would have.
        approve: the decision ``request_approval`` answers with.
        takeover_point: the engine's resume point :meth:`takeover_point`
            gives while no marker was set, as after a lost log was taken
            over (SPEC "The engine keeps the resume point").
        """
        self._takeover_point = takeover_point
        self._approve = approve
        self.events: list[dict[str, Any]] = []
        self.findings: list[dict[str, Any]] = []
        self.approvals: list[dict[str, Any]] = []
        self.done: dict[str, Any] | None = None
        self.handshakes: list[tuple[str, str, str]] = []
        self.closed = False
        self._progress = messages.progress_marker(progress)
        self._seq = 0
        self._stop_callbacks: list[StopCallback] = []
        self._budget_callbacks: list[BudgetCallback] = []
        self._stopped = False

    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosedError("the in-memory channel is closed")
        if self.done is not None:
            raise ChannelClosedError("send_done() was called; no new messages")

    def _commit(self, count: int, progress: Mapping[str, Any] | None) -> list[int]:
        marker = messages.progress_marker(progress)
        first = self._seq + 1
        self._seq += count
        if marker is not None:
            self._progress = marker
        return list(range(first, self._seq + 1))

    async def handshake(
        self, connector_version: str, harness_name: str, harness_version: str
    ) -> None:
        """Record the handshake (no network)."""
        if self.closed:
            raise ChannelClosedError("the in-memory channel is closed")
        for name, value in (
            ("connector_version", connector_version),
            ("harness_name", harness_name),
            ("harness_version", harness_version),
        ):
            check_text(value, f"handshake.{name}")
        self.handshakes.append((connector_version, harness_name, harness_version))

    def send_event(
        self,
        type: str,
        severity: str,
        payload: Mapping[str, Any],
        ts: datetime | str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> int:
        """Record an event and return its seq (checks as the real channel)."""
        self._check_open()
        body = messages.event_body(type, severity, payload, ts)
        messages.progress_marker(progress)
        self.events.append(_as_committed("event", body))
        return self._commit(1, progress)[0]

    def send_finding(
        self, finding: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """Record a finding and return its seq."""
        self._check_open()
        body = messages.finding_body(finding)
        messages.progress_marker(progress)
        self.findings.append(_as_committed("finding", body))
        return self._commit(1, progress)[0]

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Record several findings and events (all, or none on a bad one); return their seqs."""
        self._check_open()
        bodies = [_as_committed("finding", body) for body in messages.finding_bodies(findings)]
        noted = [
            _as_committed("event", body)
            for body in messages.event_bodies(events, messages.now_rfc3339())
        ]
        messages.progress_marker(progress)
        self.events.extend(noted)
        self.findings.extend(bodies)
        return self._commit(len(noted) + len(bodies), progress)

    async def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """Record ``Done``; always acked at once (returns True)."""
        self._check_open()
        self.done = _as_committed(
            "done", messages.done_body(status, findings, coverage, exit_reason)
        )
        self._commit(1, None)
        return True

    async def request_approval(
        self,
        action: str,
        details: Mapping[str, Any],
        *,
        request_id: str | None = None,
        timeout_ms: float | None = None,
    ) -> ApprovalDecision:
        """Record an approval request and answer it with the ``approve`` policy at once."""
        self._check_open()
        rid = request_id if request_id is not None else str(uuid.uuid4())
        self.approvals.append(
            _as_committed(
                "approval_request",
                messages.approval_body(rid, action, details),
            )
        )
        self._commit(1, None)
        return ApprovalDecision(rid, self._approve, "in-memory policy")

    async def wait_acked(self, seq: int | None = None, timeout_ms: float | None = None) -> bool:
        """Every recorded message counts as acked at once (there is no engine to wait for).

        Args:
            seq: the seq to wait for (default: the newest recorded).
            timeout_ms: accepted for the real channel's signature; never waited.

        Returns:
            True when ``seq`` was recorded; False at once for a seq not
            recorded yet (the real channel would wait up to ``timeout_ms``).
        """
        return seq is None or seq <= self._seq

    @property
    def unacked_count(self) -> int:
        """0: every recorded message counts as acked at once (as :meth:`wait_acked`)."""
        return 0

    @property
    def last_acked_seq(self) -> int:
        """The newest recorded seq (every one counts as acked at once)."""
        return self._seq

    @property
    def state(self) -> ChannelState:
        """``IDLE`` before the handshake, ``STREAMING`` after it, ``CLOSED`` after ``close()``."""
        if self.closed:
            return ChannelState.CLOSED
        return ChannelState.STREAMING if self.handshakes else ChannelState.IDLE

    def stats(self) -> ChannelStats:
        """A :class:`~walchannel.ChannelStats` as a channel with every message acked reports."""
        return ChannelStats(
            state=self.state,
            sent=self._seq,
            acked=self._seq,
            replayed=0,
            reconnects=0,
            unacked_count=0,
            unacked_bytes=0,
            oldest_unacked_age_s=None,
            protocol_errors=0,
            last_error=None,
        )

    def progress(self) -> Mapping[str, Any] | None:
        """The last marker passed with ``progress=`` (or given at construction)."""
        return self._progress

    def takeover_point(self) -> ResumePoint | None:
        """The ``takeover_point=`` given, while no marker was set; then None."""
        return self._takeover_point if self._progress is None else None

    def on_stop(self, callback: StopCallback) -> None:
        """Register a Stop callback; :meth:`stop` fires them (once)."""
        self._stop_callbacks.append(callback)

    def stop(self, reason: str) -> None:
        """Act as the engine sending ``Stop(reason)``: call the callbacks once."""
        if self._stopped:
            return
        self._stopped = True
        for callback in list(self._stop_callbacks):
            try:
                callback(reason)
            except Exception:
                logger.exception("on_stop callback %r raised; ignored", callback)

    def on_budget_update(self, callback: BudgetCallback) -> None:
        """Register a ``BudgetUpdate`` callback; :meth:`budget_update` fires them."""
        self._budget_callbacks.append(callback)

    def budget_update(self, message: str, details: Mapping[str, Any]) -> None:
        """Act as the engine sending ``BudgetUpdate(message, details)``: call each callback."""
        for callback in list(self._budget_callbacks):
            try:
                callback(message, dict(details))
            except Exception:
                logger.exception("on_budget_update callback %r raised; ignored", callback)

    async def close(self) -> None:
        """Mark the channel closed (idempotent)."""
        self.closed = True


def _as_committed(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the real channel stores it: a msgpack round trip, so a copy."""
    decoded: dict[str, Any] = msgpack.unpackb(encode_body(kind, body), raw=False)
    return decoded
