"""The channel interfaces and the values they hand out (SPEC "The channel").

:class:`EngineChannel` is what a harness codes against (asyncio);
:class:`SyncEngineChannel` is the same without ``await``. Implemented by
``GrpcEngineChannel``, ``testing.InMemoryEngineChannel`` and
``BlockingEngineChannel``. This module imports neither grpc nor SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from walchannel.config import GroupCommit
    from walchannel.core.driver import ChannelState

__all__ = [
    "ApprovalDecision",
    "BudgetCallback",
    "ChannelStats",
    "EngineChannel",
    "StopCallback",
    "SyncEngineChannel",
]

#: ``on_stop`` callbacks get the Stop reason (``deadline``, ``operator``, ``failure``).
StopCallback = Callable[[str], None]
#: ``on_budget_update`` callbacks get the message and its details (advisory only).
BudgetCallback = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """The engine's answer to an ``ApprovalRequest``.

    Attributes:
        request_id: the request it answers.
        approved: the decision.
        reason: free text from the engine.
    """

    request_id: str
    approved: bool
    reason: str


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """A snapshot of a channel (``GrpcEngineChannel.stats()``).

    Some fields are the run's (``acked``, the ``unacked_*`` ones,
    ``quarantined``: a restarted harness reads them from the log), the others
    this channel object's (``sent``, ``replayed``, ``reconnects``,
    ``protocol_errors``, ``last_error``: 0 or None after a restart).

    Attributes:
        state: the channel's state; it stays ``STREAMING`` after ``Done`` is
            acked (the stream stays open until ``close()``).
        sent: data messages this channel wrote to streams, re-sends included.
        acked: the highest seq received in an ack, for the whole run.
        replayed: data messages written again after a reconnect or rewind.
        reconnects: dials after the channel's first, whether their stream came up
            or not (a dial refused, a stream cut for a missing handshake answer).
        unacked_count: logged rows not covered by a received ack.
        unacked_bytes: their msgpack size (bytes).
        oldest_unacked_age_s: age of the oldest of them (seconds; None if none).
        protocol_errors: engine messages that broke the protocol (ignored).
        last_error: the last connection or engine error (never holds the token).
        quarantined: rows in the log's quarantine table: damaged rows, and rows
            the engine refused for their size; each went out as a
            ``walchannel.row_lost`` event (an addition to SPEC's fields).
        group_commit: the channel's ``GroupCommit`` setting (None: every
            send commits before it returns). SPEC "Group commit".
        pending: rows handed out under it and not yet committed (not in
            ``unacked_count``: they are not in the log yet).
    """

    state: ChannelState
    sent: int
    acked: int
    replayed: int
    reconnects: int
    unacked_count: int
    unacked_bytes: int
    oldest_unacked_age_s: float | None
    protocol_errors: int
    last_error: str | None
    quarantined: int = 0
    group_commit: GroupCommit | None = None
    pending: int = 0


@runtime_checkable
class EngineChannel(Protocol):
    """The asyncio channel a harness streams its run through (SPEC "The channel").

    ``send_*`` validate, commit the row (with ``progress``, if given) and
    return its seq without waiting on the network.
    """

    async def handshake(
        self, connector_version: str, harness_name: str, harness_version: str
    ) -> None:
        """Connect (or reconnect) and return once the engine answered the handshake."""

    def send_event(
        self,
        type: str,
        severity: str,
        payload: Mapping[str, Any],
        ts: datetime | str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> int:
        """Log an ``Event`` and return its seq."""
        raise NotImplementedError

    def send_finding(
        self, finding: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """Log a ``FindingDraft`` and return its seq."""
        raise NotImplementedError

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Log several findings and events in one transaction (all or none); return their seqs."""
        raise NotImplementedError

    async def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """Log ``Done`` and wait for its ack; True when acked (and stored) in time."""
        raise NotImplementedError

    def progress(self) -> Mapping[str, Any] | None:
        """The last committed progress marker (None for a new run)."""
        raise NotImplementedError

    def on_stop(self, callback: StopCallback) -> None:
        """Register a callback for the engine's ``Stop`` (fires once per channel)."""

    async def close(self) -> None:
        """Close the channel (idempotent); unacked rows stay on disk."""


@runtime_checkable
class SyncEngineChannel(Protocol):
    """:class:`EngineChannel` without ``await``, for harnesses that are not asyncio programs."""

    def handshake(self, connector_version: str, harness_name: str, harness_version: str) -> None:
        """Connect and return once the engine answered the handshake."""

    def send_event(
        self,
        type: str,
        severity: str,
        payload: Mapping[str, Any],
        ts: datetime | str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> int:
        """Log an ``Event`` and return its seq."""
        raise NotImplementedError

    def send_finding(
        self, finding: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """Log a ``FindingDraft`` and return its seq."""
        raise NotImplementedError

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Log several findings and events in one transaction; return their seqs."""
        raise NotImplementedError

    def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """Log ``Done`` and wait for its ack; True when acked (and stored) in time."""
        raise NotImplementedError

    def progress(self) -> Mapping[str, Any] | None:
        """The last committed progress marker (None for a new run)."""
        raise NotImplementedError

    def on_stop(self, callback: StopCallback) -> None:
        """Register a callback for the engine's ``Stop`` (fires once per channel)."""

    def close(self, *, timeout_ms: float | None = None) -> None:
        """Close the channel (idempotent); wait up to ``timeout_ms`` (ms) for a running callback.

        Queued callbacks are dropped; ``None`` waits the config's
        ``close_timeout_ms``. SPEC "The channel".
        """
