"""GrpcEngineChannel: the durable stream of one run (SPEC "The channel").

Buffer first: ``send_*`` validates, commits the row to the run's log and
only then wakes the writer; it never waits on the network. The log is the
queue: one writer per stream takes rows in seq order from a small in-memory
tail of committed rows, or from disk, so replay and live sends never
interleave and memory stays flat.

The channel is the harness's face, composed, not inherited, of parts named
for their responsibility:

- a :class:`~walchannel.core.driver.Driver`: the run's protocol state and every
  decision about it (no I/O);
- the run's :class:`~walchannel.log.writer.RunLog` (storage) and a
  :class:`~walchannel.channel.row_source.RowSource` (the rows' bytes, tail first);
- :class:`~walchannel.channel.connection.ConnectionLoop`: dials (through a
  :class:`~walchannel.transport.base.Transport`: grpc.aio and httpx in
  :mod:`walchannel.transport.grpc`, or the simulator's world),
  handshakes, streams (a :class:`~walchannel.channel.stream.Stream` per
  dial), takes acks and down messages, reconnects; it owns
  :class:`~walchannel.channel.refused_rows.RefusedRows` and
  :class:`~walchannel.channel.reclaim.DiskReclaim`;
- :class:`~walchannel.channel.waiters.Waiters`: what the harness's awaits
  watch, woken from one place;
- :class:`~walchannel.channel.reporting.Reporter`: ``last_error``, the log's
  error fields and the run's failure.

The channel itself admits calls, commits rows, binds to its event loop and
closes. Everything runs on the event loop's thread; ``BlockingEngineChannel``
serves other threads. Every module logs under its own name
(``walchannel.channel.*`` here, ``walchannel.transport.grpc`` for the
network), all below the ``walchannel`` logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import random
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Self

from walchannel import _killpoints
from walchannel._logging import get_logger
from walchannel._reentry import FREE, Guard
from walchannel.channel import metrics
from walchannel.channel.connection import ConnectionLoop
from walchannel.channel.group_commit import PendingGroup
from walchannel.channel.interface import (
    ApprovalDecision,
    BudgetCallback,
    ChannelStats,
    StopCallback,
)
from walchannel.channel.reporting import Reporter
from walchannel.channel.row_source import RowSource
from walchannel.channel.waiters import Waiters
from walchannel.clock import SYSTEM_CLOCK, Clock
from walchannel.config import GrpcChannelConfig
from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.driver import REFUSED_TOKEN_CODES, Call, ChannelState, Driver
from walchannel.errors import (
    ApprovalTimeoutError,
    ChannelClosedError,
    EngineUnavailableError,
    GroupCommitError,
    PayloadError,
    ReentrantCallError,
    RunCompletedError,
    RunExpiredError,
    RunRefusedError,
    WalchannelError,
)
from walchannel.log.replication import SOCKET_ENV
from walchannel.log.view import LogView
from walchannel.log.writer import RunLog
from walchannel.wire import messages
from walchannel.wire import protobuf as wire
from walchannel.wire.payload import check_text
from walchannel.wire.protobuf import ResumePoint

if TYPE_CHECKING:
    from walchannel.channel.replica import ReplicaGate
    from walchannel.transport.base import Transport

__all__ = ["GrpcEngineChannel"]

logger = get_logger(__name__)


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


@dataclass(frozen=True)
class ChannelSeams:
    """What a channel may be built on instead of the real parts (None: the real one).

    Not for harnesses: :func:`walchannel.channel.seams.open_channel` builds
    a channel on them for the simulator, ``walchannel flush`` and tests.

    Attributes:
        rng: the random source of backoff jitter and default approval ids
            (default ``random.SystemRandom``).
        log: an already-open, owned :class:`~walchannel.log.writer.RunLog` of
            the run, used instead of opening one; the channel closes it.
        transport: where dials and discovery go (default
            :class:`~walchannel.transport.grpc.GrpcTransport`).
        clock: the clocks read (default :data:`~walchannel.clock.SYSTEM_CLOCK`).
        token_hash_when: when the log's stored sha256 of the run token is set:
            ``"open"`` in the constructor, or ``"accepted"`` once an engine
            has answered a handshake sent with it (``flush --replace-token``).
    """

    rng: random.Random | None = None
    log: RunLog | None = None
    transport: Transport | None = None
    clock: Clock | None = None
    token_hash_when: Literal["open", "accepted"] = "open"  # noqa: S105 - a policy, not a secret


class GrpcEngineChannel:
    """The durable channel of one run. Construct, ``await handshake(...)``, send, close.

    The constructor opens the run's log (so ``RunCompletedError``,
    ``WalLockedError`` and ``WalCorruptError`` surface there) and touches no
    network; ``handshake()`` starts the connection loop. Use it from the
    event loop's thread only: the channel belongs to the loop of its first
    await. Once that loop is closed (an ``asyncio.run()`` ended), every
    call raises ``ChannelClosedError`` saying so and the log is released;
    ``close()`` never raises for it. ``async with`` closes it (without a
    handshake).

    Args:
        config: the run's :class:`~walchannel.GrpcChannelConfig`.

    Raises:
        RunCompletedError: the log is a tombstone: the run already finished.
        WalLockedError: another process (or channel) owns the run's log.
        WalCorruptError: the log file is not usable.
        WalWriteError: the log cannot be created.
        TypeError: ``config`` is not a ``GrpcChannelConfig``.

    SPEC "The channel".
    """

    def __init__(self, config: GrpcChannelConfig) -> None:
        self._start(config, ChannelSeams())

    def _start(self, config: GrpcChannelConfig, seams: ChannelSeams) -> None:
        """Build the channel on ``seams`` (:func:`walchannel.channel.seams.open_channel`)."""
        if not isinstance(config, GrpcChannelConfig):
            raise TypeError("config must be a GrpcChannelConfig")
        rng, log, transport, clock = seams.rng, seams.log, seams.transport, seams.clock
        token_hash_when = seams.token_hash_when
        self._config = config
        self._run_id = config.run_id
        self._rng = rng if rng is not None else random.SystemRandom()
        self._clock = clock if clock is not None else SYSTEM_CLOCK
        if log is None:
            log = RunLog.open(
                config.wal_dir,
                config.run_id,
                correlation_id=config.correlation_id,
                # "replicated" is "process" on disk, plus the replica gate.
                durability="power" if config.durability == "power" else "process",
                clock=self._clock,
            )
        elif log.run_id != config.run_id or not log.writable:
            raise ValueError(f"log= must be the open, owned log of run {config.run_id}")
        self._log = log
        self._log_view = LogView(log)
        try:
            if log.completed:
                raise RunCompletedError(
                    f"run {self._run_id}: completed (its Done was acked); the log "
                    f"{log.path} is a tombstone",
                    progress=log.progress,
                )
            token_hash = hashlib.sha256(config.run_token.encode("utf-8")).hexdigest()
            meta = log.meta()
            setting = None if config.group_commit is None else config.group_commit.describe()
            if meta.group_commit != setting:
                # inspect and the metrics read the setting the log was last written under.
                log.update_meta(group_commit=setting)
            # Stored on the first answered handshake instead ("accepted").
            pending_token_hash: str | None = None
            if meta.token_sha256 != token_hash:
                if token_hash_when == "open":  # noqa: S105 - a policy, not a secret
                    log.update_meta(token_sha256=token_hash)
                else:
                    pending_token_hash = token_hash
            handshake_fields: tuple[str, str, str] | None = None
            if meta.harness_name is not None:
                handshake_fields = (
                    meta.connector_version or "",
                    meta.harness_name or "",
                    meta.harness_version or "",
                )
            if transport is None:
                # grpc loads here, not when this module is imported.
                from walchannel.transport.grpc import GrpcTransport

                transport = GrpcTransport(config)
        except BaseException:
            log.close()
            raise
        # A log marked failed by an earlier run: cleared by a healthy answer.
        self._driver = Driver(
            config,
            log,
            failed_mark=meta.failed_at is not None,
            now_ms=self._clock.monotonic_ms(),
            # A fenced log stays refused until `walchannel takeover` marks it.
            writer=log.writer,
            failed_reason=meta.failed_reason,
            path=str(log.path),
            written_bound=log.written_bound,
            rng=self._rng,
        )
        # A payload with more values can never travel: each takes >= 2 bytes as a Struct.
        self._max_values = config.max_message_bytes // 2
        self._rows = RowSource(log, config.run_id, config.correlation_id, config.max_message_bytes)
        self._wakeup = asyncio.Event()
        self._waiters = Waiters(config.run_id, self._driver, self._clock, self._wakeup)
        self._reporter = Reporter(
            config, log, self._driver, self._clock, self._waiters.state_changed
        )
        self._group: PendingGroup | None = None
        # Held by the public call inside the channel now ("send_event()"): see _refuse_reentry.
        self._guard = Guard()
        if config.group_commit is not None:
            self._group = PendingGroup(
                config.group_commit,
                config.run_id,
                log,
                self._clock,
                self._commit_rows,
                self._lost,
                self._driver.next_seq_after,
            )
        socket = os.environ.get(SOCKET_ENV) if config.durability == "replicated" else None
        replica: ReplicaGate | None = None
        if socket is not None:
            from walchannel.channel.replica import ReplicaGate

            replica = ReplicaGate(socket, log, self._reporter.note)
        self._connection = ConnectionLoop(
            config,
            log,
            self._driver,
            self._rows,
            self._clock,
            transport,
            replica,
            self._waiters,
            self._reporter,
            self._wakeup,
            handshake_fields=handshake_fields,
            pending_token_hash=pending_token_hash,
            commit_pending=None if self._group is None else self._group.commit,
            on_left_open=self._left_open,
        )
        # Its files removed while open (a commit finds it): the run fails, whoever committed.
        log.on_removed(self._connection.log_removed)
        # A cancelled close() leaves closing the network to a task of its own, kept here.
        self._teardown: asyncio.Task[None] | None = None
        # The event loop of the first await; the tasks, events, timers and the
        # streams all live on it (see _bind_loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        # OpenTelemetry hooks: None when metrics are off or opentelemetry is absent.
        self._metrics = metrics.attach(config, self._driver, log)

    # -- read-outs -------------------------------------------------------------------------

    @property
    def config(self) -> GrpcChannelConfig:
        """The configuration (its ``repr`` never shows the token)."""
        return self._config

    @property
    def state(self) -> ChannelState:
        """The channel's :class:`~walchannel.ChannelState`."""
        return self._driver.state

    @property
    def last_acked_seq(self) -> int:
        """The highest seq received in an ack (the log stores it within ~100 ms)."""
        return self._driver.acked

    @property
    def unacked_count(self) -> int:
        """Logged rows not covered by a received ack."""
        return self._driver.unacked

    @property
    def log(self) -> LogView:
        """The run's log to read (:class:`~walchannel.log.view.LogView`); the channel writes it."""
        return self._log_view

    def progress(self) -> Mapping[str, Any] | None:
        """Return the last harness progress marker set (None for a new run).

        SPEC "Harness progress": resume a restarted scan from it. It is
        committed, except under ``group_commit``: there it is the marker of
        the last send, durable once that send's group commits (SPEC "Group
        commit").

        Raises:
            ChannelClosedError: the channel's event loop is gone.
        """
        self._check_loop()
        if self._group is not None and (marker := self._group.marker) is not None:
            return marker
        return self._log.progress

    def takeover_point(self) -> ResumePoint | None:
        """Return the engine's resume point a taken-over run resumes from, or None.

        Set once an engine that keeps the resume point answered a handshake
        that took the run over, and kept while the log has no progress of its
        own (a lost log's replacement). While it is not ``complete`` the
        engine applied only the first ``rows`` rows of the marker's
        transaction: log the rest again, found by :func:`~walchannel.wire.protobuf.row_digest`.
        SPEC "The engine keeps the resume point".

        Raises:
            ChannelClosedError: the channel's event loop is gone.
        """
        self._check_loop()
        stored = self._connection.engine_resume
        if stored is None or not stored["takeover"] or self.progress() is not None:
            return None
        return ResumePoint(
            stored["marker"],
            stored["seq"],
            stored["applied"],
            tuple(stored["digests"]),
            stored["rows"],
        )

    def stats(self) -> ChannelStats:
        """Return a :class:`~walchannel.ChannelStats` snapshot.

        It only reads: it neither stores a coalesced ack nor quarantines a
        damaged row. On a channel whose event loop is gone it closes the
        channel (see :meth:`close`) and reports ``CLOSED`` with the reason
        in ``last_error``.
        """
        if self._loop_closed():
            self._abandon()
        driver = self._driver
        oldest: float | None = None
        unacked_bytes = 0
        if not self._log.closed:
            unacked_bytes = self._log.unacked_bytes_above(driver.acked)
            if driver.unacked:
                oldest = self._log.oldest_unacked_age_s(driver.acked)
        return ChannelStats(
            state=driver.state,
            sent=driver.sent,
            acked=driver.acked,
            replayed=driver.replayed,
            reconnects=driver.reconnects,
            unacked_count=driver.unacked,
            unacked_bytes=unacked_bytes,
            oldest_unacked_age_s=oldest,
            protocol_errors=driver.protocol_errors,
            last_error=driver.last_error,
            quarantined=self._log.quarantined_count if not self._log.closed else 0,
            group_commit=self._config.group_commit,
            pending=0 if self._group is None else self._group.rows,
        )

    def __repr__(self) -> str:
        d = self._driver
        return (
            f"<GrpcEngineChannel run_id={self._run_id!r} state={d.state.name} "
            f"addr={self._connection.addr!r} acked={d.acked} high={d.high_water}>"
        )

    def on_stop(self, callback: StopCallback) -> None:
        """Call ``callback(reason)`` when the engine sends ``Stop``.

        Fires once per channel however often the engine repeats it; the
        channel does not close itself. A callback that raises is logged and
        does not stop the others.
        """
        self._connection.stop_callbacks.append(callback)

    def on_budget_update(self, callback: BudgetCallback) -> None:
        """Call ``callback(message, details)`` for each ``BudgetUpdate`` (advisory only)."""
        self._connection.budget_callbacks.append(callback)

    # -- the event loop --------------------------------------------------------------------

    def _loop_closed(self) -> bool:
        loop = self._loop
        return loop is not None and loop.is_closed()

    def _loop_gone(self) -> ChannelClosedError:
        return ChannelClosedError(
            f"run {self._run_id}: the channel belongs to an event loop that is closed "
            "or stopped (an earlier asyncio.run() ended?); it is closed and its log "
            "released. Open a new GrpcEngineChannel on this loop (the unacked rows "
            "are kept), or use BlockingEngineChannel from code without a loop"
        )

    def _check_loop(self) -> None:
        """For the sync methods: refuse on a channel whose event loop was closed."""
        if self._loop_closed():
            self._abandon()
            raise self._loop_gone()

    def _bind_loop(self) -> None:
        """For the async methods: bind the channel to the loop of its first await.

        Its tasks, events and streams live on that loop. On another loop, if
        that one is closed or stopped the channel is closed without it
        (:meth:`_abandon`) and ``ChannelClosedError`` says so; if it still
        runs (in another thread), ``WalchannelError``.
        """
        running = asyncio.get_running_loop()
        loop = self._loop
        if loop is None:
            self._loop = running
        elif loop is not running:
            if loop.is_closed() or not loop.is_running():
                self._abandon()
                raise self._loop_gone()
            raise WalchannelError(
                f"run {self._run_id}: the channel belongs to another event loop, running "
                "in another thread; call it from that loop's thread, or use "
                "BlockingEngineChannel"
            )

    def _abandon(self) -> None:
        """Close without the channel's loop, which is gone: release the log, await nothing.

        The tasks, timers, waiters and streams of the dead loop are dropped,
        not touched (a future of a closed loop cannot be resolved); the
        socket closes with the gRPC channel object.
        """
        if self._driver.closed:
            return
        connection = self._connection
        connection.feed(ev.CloseRequested())
        if self._group is not None:
            self._group.commit_or_give_up()
        logger.warning(
            "run %s: the channel's event loop is gone (closed or stopped); the channel is "
            "closed and its log released, the unacked rows stay for a new channel",
            self._run_id,
        )
        connection.abandon()
        self._waiters.drop()
        try:
            connection.flush_acks()
            self._reporter.record(str(self._loop_gone()))
        finally:
            connection.feed(ev.Closed())
            if self._metrics is not None:
                self._metrics.close()
            self._log.close()

    # -- admission -----------------------------------------------------------------------

    def _admit(self, call: Call) -> None:
        """Raise what the driver's one admission check says (expiring first when it is that)."""
        error = self._driver.admit(call, self._clock.wall_s())
        if error is not None:
            if isinstance(error, RunExpiredError):
                self._connection.feed(ev.DeadlinePassed())
            raise error

    # -- sending (buffer first) ------------------------------------------------------------

    def _send_rows(
        self,
        items: list[tuple[str, bytes]],
        progress: Mapping[str, Any] | None,
        bodies: list[dict[str, Any]],
    ) -> list[int]:
        """Log what a ``send_*`` sends: committed now, or handed to the pending group.

        ``bodies`` are ``items``' plain bodies, in order (their digests, for a
        marker). Returns the seqs of ``items`` (SPEC "Buffer first", "Group commit").
        """
        marker = messages.progress_marker(progress)
        rows = items
        if marker is not None and self._connection.engine_resume is not None:
            rows = self._with_marker(items, bodies, marker)
        if items:
            # The harness's rows: a marker row travels beside them, outside the bound.
            self._check_backlog(items)
        if self._group is not None:
            seqs = self._group.add(rows, marker)
        else:
            seqs = self._commit_rows(rows, marker)
        return seqs[len(rows) - len(items) :]

    def _with_marker(
        self,
        items: list[tuple[str, bytes]],
        bodies: list[dict[str, Any]],
        marker: dict[str, Any],
    ) -> list[tuple[str, bytes]]:
        """``items`` with ``marker`` for an engine that keeps the resume point.

        The first row carries it, with a digest of each row (SPEC "The engine
        keeps the resume point"); no row, or a first row it would take past
        ``max_message_bytes``, gets a ``progress`` row of its own first.
        """
        point = {
            "marker": marker,
            "digests": [wire.row_digest(k, b) for (k, _), b in zip(items, bodies, strict=True)],
        }
        if items:
            kind = items[0][0]
            with contextlib.suppress(PayloadError):
                return [self._rows.prepare(kind, {**bodies[0], "progress": point}), *items[1:]]
        return [self._rows.prepare("progress", point), *items]

    def _log_now(self, items: list[tuple[str, bytes]]) -> list[int]:
        """Commit a row its caller then waits on (``Done``, an approval): the group first."""
        if self._group is not None:
            self._group.commit()
        return self._commit_rows(items, None)

    def _commit_rows(
        self, items: list[tuple[str, bytes]], marker: dict[str, Any] | None
    ) -> list[int]:
        """Commit ``items`` (with ``marker``) in one transaction; hand them to the writer."""
        try:
            seqs = self._log.append_encoded(items, progress=marker)
            if not seqs:
                return seqs  # the marker alone
            _killpoints.reached("after_commit")
            self._rows.on_commit(seqs, items)
            if self._metrics is not None:
                self._metrics.on_commit(seqs[0])
        finally:
            # Also when a signal's exception leaves the call after the COMMIT
            # (SPEC "The log"): a committed row must not wait for a heartbeat.
            self._wakeup.set()
        return seqs

    def _lost(self, error: GroupCommitError) -> None:
        """The pending group could not be committed (``error`` names its seqs)."""
        self._connection.feed(ev.Failed(error, ev.Failure.GROUP_LOST))

    def _check_backlog(self, items: list[tuple[str, bytes]]) -> None:
        if self._config.max_unacked_bytes is None:
            return
        added = sum(len(blob) for _, blob in items)
        self._connection.flush_acks()  # what the engine acked frees room first
        pending = 0 if self._group is None else self._group.bytes
        error = self._driver.backlog_error(self._log.unacked_bytes, pending, added)
        if error is not None:
            raise error

    def _refuse_reentry(self, call: str) -> None:
        """Refuse ``call`` if another call or the channel's own work is inside the channel.

        Only a signal handler gets here so: it runs on this thread between two
        bytecodes of what ran (SPEC "Signal handlers and the channel"). The
        caller then takes :attr:`_guard` first thing in a ``try`` whose
        ``finally`` releases it.

        Raises:
            ReentrantCallError: before anything is checked or logged.
        """
        inside = self._guard.holder
        if inside is None:
            busy = self._log.busy
            if busy is not None:
                inside = f"the log's {busy} transaction"
            elif self._group is not None:
                inside = self._group.guard.holder
            if inside is None:
                return
        raise ReentrantCallError(
            f"run {self._run_id}: {call}() was called while {inside} was in progress on this "
            "channel, as a signal handler does when it interrupts one: refused, nothing was "
            "logged. Send from a handler installed with loop.add_signal_handler (it runs "
            "between the event loop's callbacks, never inside a call), or use "
            'BlockingEngineChannel (SPEC "Signal handlers and the channel")'
        )

    def _check_sendable(self) -> None:
        self._check_loop()
        self._admit(Call.SEND)

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
            ts: an aware datetime, an RFC 3339 §5.6 str
                (:func:`~walchannel.wire.messages.parse_rfc3339`: a leap second is
                sent as ``23:59:59.999999``), or None (now); sent in UTC
                (SPEC "Timestamps").
            progress: the harness's resume marker, committed with the row.

        Returns:
            The row's seq (provisional until the first answered handshake:
            see ``wait_acked``). Committed when this returns; under
            ``group_commit``, once a turn of the event loop adds nothing to
            the group, or at its caps (SPEC "Group commit").

        Raises:
            PayloadError: a bad field or payload, or an encoded message over
                ``max_message_bytes`` (nothing logged, no seq used).
            BacklogFullError: ``max_unacked_bytes`` would be passed (rows
                pending under ``group_commit`` count).
            ChannelClosedError: after ``send_done`` or ``close``, or once
                the channel's event loop is gone.
            RunExpiredError: past ``hard_deadline``.
            EngineBehindError: the channel is ``FAILED``.
            RunCompletedError: the engine said the run is completed.
            WalWriteError: the commit failed (disk full); retry later. Under
                ``group_commit``, when this send found the group full and
                could not commit it (nothing of this call was added).
            GroupCommitError: under ``group_commit``, a group of rows
                handed out could not be committed on any try: the channel
                is ``FAILED``; open a new channel and resume from
                ``progress()``.
            WalRemovedError: the log's files were removed or replaced while
                open; the channel is ``FAILED`` (SPEC "The log").
            ReentrantCallError: called from a signal handler while another
                call or the channel's own work was inside it; nothing logged
                (SPEC "Signal handlers and the channel").
        """
        self._refuse_reentry("send_event")
        held = FREE
        try:
            held = self._guard.take("send_event()")  # (in the try: released whatever comes)
            hooks = self._metrics
            started = hooks.clock_ns() if hooks is not None else 0
            self._check_sendable()
            if ts is None:
                ts = messages.rfc3339_at(self._clock.wall_s())
            body = messages.event_body(type, severity, payload, ts, max_values=self._max_values)
            seq = self._send_rows([self._rows.prepare("event", body)], progress, [body])[0]
            if hooks is not None:
                hooks.on_send(started)
            return seq
        finally:
            self._guard.release(held)

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
        self._refuse_reentry("send_finding")
        held = FREE
        try:
            held = self._guard.take("send_finding()")  # (in the try: released whatever comes)
            hooks = self._metrics
            started = hooks.clock_ns() if hooks is not None else 0
            self._check_sendable()
            body = messages.finding_body(finding, max_values=self._max_values)
            seq = self._send_rows([self._rows.prepare("finding", body)], progress, [body])[0]
            if hooks is not None:
                hooks.on_send(started)
            return seq
        finally:
            self._guard.release(held)

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Commit several findings, and events, in one transaction (all logged, or none).

        Args:
            findings: the findings, in order.
            events: ``(type, severity, payload)`` events, logged before the
                findings, stamped now (an item's events with its findings:
                SPEC "The runner").
            progress: the harness's resume marker, committed with them.

        Returns:
            Their seqs, consecutive, the events' first; ``[]`` for no rows,
            when only ``progress`` (if given) is committed: a stretch of the
            scan with nothing to report still moves the resume marker.

        Raises:
            As :meth:`send_event`; a bad finding is named by its index
            (``findings[3].x``, and ``PayloadError.index``), whichever rule
            refused it, a bad event by its (``events[1].payload.x``, with
            ``index`` None), and nothing of the batch is logged.
        """
        self._refuse_reentry("send_findings")
        held = FREE
        try:
            held = self._guard.take("send_findings()")  # (in the try: released whatever comes)
            hooks = self._metrics
            started = hooks.clock_ns() if hooks is not None else 0
            self._check_sendable()
            bodies = messages.finding_bodies(findings, max_values=self._max_values)
            items = []
            plain: list[dict[str, Any]] = []
            if events:
                ts = messages.rfc3339_at(self._clock.wall_s())
                plain = messages.event_bodies(events, ts, max_values=self._max_values)
                items = [self._rows.prepare("event", body) for body in plain]
            plain += bodies
            for index, body in enumerate(bodies):
                try:
                    items.append(self._rows.prepare("finding", body))
                except PayloadError as exc:  # its size: name it as the other rules do
                    raise PayloadError(f"findings[{index}]", exc.reason, index=index) from None
            seqs: list[int] = []
            if items or progress is not None:
                seqs = self._send_rows(items, progress, plain)
            if hooks is not None:
                hooks.on_send(started)
            return seqs
        finally:
            self._guard.release(held)

    async def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """Commit and write ``Done``, then wait up to ``done_ack_timeout_ms`` for its ack.

        On a log that already holds an unacked ``Done`` (a restarted
        harness) it waits on that row instead of logging another; once this
        channel delivered that row (its ack and the tombstone are stored) it
        returns True at once. After it, ``send_*`` raise ``ChannelClosedError``.

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
            PayloadError: a bad field (nothing logged).
            RowRefusedError: the engine refused the logged ``Done`` for its
                size (the channel stops once the rows before it are acked;
                the row stays in the log).
            ChannelClosedError: after ``close`` or a previous ``send_done``.
            EngineBehindError, RunCompletedError, WalWriteError: as ``send_event``;
                also when the channel fails while waiting (engine behind).
                Under ``group_commit`` the pending group is committed first:
                ``WalWriteError`` when it cannot be, with nothing of ``Done``
                logged.

        SPEC "Shutdown order".
        """
        self._bind_loop()
        driver = self._driver
        try:
            self._admit(Call.DONE)
        except RunExpiredError:
            return False
        step = self._connection.done_step(ev.DoneRequested())
        if step is act.DONE_DELIVERED:
            return True  # this channel already delivered the run's Done: the tombstone is stored
        if step is act.LOG_DONE:
            body = messages.done_body(status, findings, coverage, exit_reason)
            self._log_now([self._rows.prepare("done", body)])
            self._connection.done_step(ev.DoneLogged())  # answered WaitDone: wait below
        _killpoints.reached("in_send_done")
        # No ack wakes it: completion (the tombstone stored) and failures do.
        acked = await self._waiters.wait_for(
            lambda: driver.completed, self._config.done_ack_timeout_ms, lambda: math.inf
        )
        if not acked and driver.failure is not None:
            # Failed while waiting (engine behind). A Done the engine applied
            # but whose ack was lost ends as a tombstone instead: True above.
            raise driver.failure
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
            request_id: default a fresh uuid4.
            timeout_ms: how long to wait (None: until close).

        Returns:
            The :class:`~walchannel.ApprovalDecision`.

        Raises:
            ApprovalTimeoutError: no decision within ``timeout_ms`` (the
                request stays logged; a later call with the id waits again).
            ChannelClosedError: the channel closed while waiting.
            EngineBehindError, RunCompletedError, RunExpiredError: the channel
                failed or expired while waiting: no decision can come.
            PayloadError: as ``send_event`` (nothing logged).
            RowRefusedError: the engine refused the logged request for its
                size (it was set aside: it will never be decided).
            ValueError: ``timeout_ms`` is not None or a finite number >= 0
                (nothing logged).
            The other errors of ``send_event``.
        """
        self._bind_loop()
        _check_timeout_ms("request_approval", timeout_ms)
        if request_id is None:
            request_id = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        rid = request_id
        decided = self._driver.decision(rid)
        if decided is not None:
            return ApprovalDecision(rid, *decided)
        future = self._waiters.approval(rid)
        if future is None:
            self._check_sendable()
            body = messages.approval_body(rid, action, details, max_values=self._max_values)
            items = [self._rows.prepare("approval_request", body)]
            self._check_backlog(items)
            self._log_now(items)
            future = self._waiters.add_approval(rid)
        try:
            # asyncio.timeout: on Python 3.11 wait_for can swallow a caller's cancel.
            async with asyncio.timeout(None if timeout_ms is None else timeout_ms / 1000):
                return await asyncio.shield(future)
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
            True when acked (the ``Done``: once its tombstone is stored, SPEC
            "Shutdown order"), False on timeout or close.

        Raises:
            TypeError: ``seq`` is not an int.
            ValueError: ``timeout_ms`` is not None or a finite number >= 0.
        """
        self._bind_loop()
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)):
            raise TypeError(f"wait_acked: seq must be an int, got {type(seq).__name__} {seq!r}")
        _check_timeout_ms("wait_acked", timeout_ms)
        driver = self._driver
        group = self._group
        newest = driver.next_seq_after(0 if group is None else group.rows) - 1
        if group is not None:
            group.flush()
        target = newest if seq is None else seq
        return await self._waiters.wait_for(
            lambda: driver.is_acked(target), timeout_ms, lambda: driver.translate(target)
        )

    def replay_unacked(self) -> int:
        """Rewind the writer to the cursor; return how many rows it will re-send.

        The rows above the received ack are written again (the engine drops
        duplicates by seq). Without a live stream nothing moves: the next
        dial replays from the cursor anyway.
        """
        self._refuse_reentry("replay_unacked")
        held = FREE
        try:
            held = self._guard.take("replay_unacked()")  # (in the try: released whatever comes)
            self._check_loop()
            return self._connection.replay()
        finally:
            self._guard.release(held)

    # -- the handshake and the connection loop ---------------------------------------------

    async def handshake(
        self, connector_version: str, harness_name: str, harness_version: str
    ) -> None:
        """Store the handshake, start the connection loop, and wait for the engine's answer.

        The fields are stored in the log's meta (for a resume and ``flush``),
        with ``http_addr`` when the config has one (for ``inspect``'s flush
        step). Every dial sends ``authorization: Bearer <run_token>``
        metadata and this handshake (seq 0); with ``engine_acks_handshake``
        the engine's ``Ack(h)`` answer is awaited before any row is written.
        Sends made before this are delivered once connected.

        Args:
            connector_version, harness_name, harness_version: the handshake fields.

        Raises:
            RunRefusedError: this log never had an answer and every dial
                (two at least) within ``connect_timeout_ms`` refused the
                token: an unknown run or a wrong token (still dialing).
            EngineUnavailableError: no answered handshake within
                ``connect_timeout_ms``; the channel stays usable and keeps dialing.
            RunCompletedError: the engine (or the log) says the run is completed.
            EngineBehindError: the engine lost rows this log already deleted.
            RunExpiredError: past ``hard_deadline``.
            ChannelClosedError: the channel is closed.
            PayloadError: a field is not a valid str.

        SPEC "Dial".
        """
        self._bind_loop()
        if self._driver.closed:
            raise ChannelClosedError(f"run {self._run_id}: the channel is closed")
        for name, value in (
            ("connector_version", connector_version),
            ("harness_name", harness_name),
            ("harness_version", harness_version),
        ):
            check_text(value, f"handshake.{name}")
        self._admit(Call.HANDSHAKE)
        self._connection.handshake_fields = (connector_version, harness_name, harness_version)
        # The discovery URL too: the step inspect prints for an orphaned run
        # names it, since the last engine streamed to may be dead by then.
        discovery = {} if self._config.http_addr is None else {"http_addr": self._config.http_addr}
        self._log.update_meta(
            connector_version=connector_version,
            harness_name=harness_name,
            harness_version=harness_version,
            **discovery,
        )
        self._connection.start()
        driver = self._driver
        if driver.state is ChannelState.STREAMING:
            return
        await self._waiters.wait_up(self._config.connect_timeout_ms / 1000)
        if self.state is ChannelState.STREAMING:
            return
        ended = driver.ended_error()
        if ended is not None:
            raise ended
        waited = self._config.connect_timeout_ms
        if driver.every_dial_refused and self._log.meta().answered_at is None:
            raise RunRefusedError(
                f"run {self._run_id}: every dial within {waited} ms was refused (the last:"
                f" {driver.last_error}) and this log never had an answer: an unknown run or a"
                " wrong token; check the run id and the token this harness was given"
                " (still dialing, in case an engine that knows the run takes over)"
            )
        if driver.last_end_code in REFUSED_TOKEN_CODES:
            raise EngineUnavailableError(
                f"run {self._run_id}: the engine refused this run's token for {waited} ms "
                f"(the last attempt: {driver.last_error}); still dialing, in case a "
                "replacement engine accepts it"
            )
        raise EngineUnavailableError(
            f"run {self._run_id}: no engine answered the handshake within {waited} ms "
            f"(the last attempt: {driver.last_error}); still dialing"
        )

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the channel: half-close, wait up to ``close_timeout_ms``, tear down.

        Idempotent; never hangs. The latest received ack is stored and the
        log closed (its lock released) whatever happens on the way; unacked
        rows stay on disk for a resume or ``flush``; pending approvals fail
        with ``ChannelClosedError``. Called from another event loop, or
        after the channel's loop is gone, or cancelled: SPEC "Cancellation"
        says what still happens.

        Raises:
            asyncio.CancelledError: ``close()`` itself was cancelled (it has
                finished closing; the network's teardown goes on).

        SPEC "Shutdown order".
        """
        if self._driver.closed:
            return
        running = asyncio.get_running_loop()
        loop = self._loop
        if loop is not None and loop is not running:
            if loop.is_closed() or not loop.is_running():
                self._abandon()
                return
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.close(), loop))
            return
        try:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                self._close_now()
                return
            try:
                await self._close()
            except asyncio.CancelledError:
                self._close_now()
                raise
        finally:
            self._log.close()

    def _close_now(self) -> None:
        """Finish a cancelled ``close()`` without awaiting: the network's teardown goes on apart.

        Idempotent with :meth:`_close` (it may have done part of this).
        The connection loop is cancelled: it tears its stream down itself,
        in its own task; the transport and the replica gate are closed by a
        task of their own. The caller closes the log.
        """
        self._connection.feed(ev.CloseRequested())
        if self._group is not None:
            self._group.commit_or_give_up()
        self._waiters.over.set()
        self._connection.cancel()
        self._mark_closed()
        if self._teardown is None:
            self._teardown = asyncio.get_running_loop().create_task(
                self._connection.aclose(), name=f"walchannel-{self._run_id}-teardown"
            )

    def _left_open(self, how: str) -> None:
        """The harness's code ended the connection loop with the channel open: close it now.

        Not a failure of the run: the received ack is stored, the log closed
        and its lock released, as a cancelled ``close()`` does; a
        ``ResourceWarning`` (as an unclosed file gives) and a WARNING line
        say so, and ``last_error`` keeps it for ``inspect``. SPEC "Cancellation".
        """
        self._say_left_open(
            f"{how}; walchannel closed it: the received ack is stored and the log released,"
            " the unacked rows stay for the next channel. Close a channel before its event"
            " loop ends ('async with GrpcEngineChannel(...)' or 'await channel.close()')"
        )
        try:
            self._close_now()
        finally:
            self._log.close()

    def _say_left_open(self, what: str) -> None:
        """Say that the harness left this channel open: a ``ResourceWarning``, a WARNING
        line and ``last_error`` (for ``inspect``), each ``the channel was left open (what)``."""
        text = f"run {self._run_id}: the channel was left open ({what})"
        warnings.warn(f"unclosed {self!r}: {text}", ResourceWarning, source=self, stacklevel=1)
        logger.warning("%s", text)
        self._reporter.record(text)

    def _mark_closed(self) -> None:
        """The part of closing that awaits nothing: ack stored, ``CLOSED``, waiters answered.

        Shared by :meth:`_close` and :meth:`_close_now` (idempotent).
        """
        self._connection.flush_acks()
        self._connection.feed(ev.Closed())
        self._waiters.fail_approvals(
            lambda rid: ChannelClosedError(f"run {self._run_id}: closed before approval {rid!r}")
        )
        self._waiters.wake_all()
        if self._metrics is not None:
            self._metrics.close()

    async def _close(self) -> None:
        self._connection.feed(ev.CloseRequested())
        _killpoints.reached("in_close")
        if self._group is not None:
            self._group.commit_or_give_up()
        self._connection.cancel_timers()
        await self._connection.stop()
        self._mark_closed()
        await self._connection.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
