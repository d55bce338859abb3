"""GrpcEngineChannel: the durable stream of one run (SPEC "The channel").

Buffer first: ``send_*`` validates, commits the row to the run's log and
only then wakes the writer; it never waits on the network. The log is the
queue: one writer per stream takes rows in seq order from a small in-memory
tail of committed rows, or from disk, so replay and live sends never
interleave and memory stays flat. The connection loop dials, sends the
handshake (seq 0), waits for the engine's ``Ack(h)``, applies the
verification rule, replays, and on any end of stream backs off,
rediscovers and dials again, until ``close()``, ``hard_deadline`` or a
failure.

The channel is composed, not inherited. It owns

- a :class:`~walchannel.driver.Driver`: the run's protocol state and every
  decision about it (no I/O);
- the run's :class:`~walchannel.log.RunLog` (storage) and a
  :class:`~walchannel.row_source.RowSource` (the rows' bytes, tail first);
- a :class:`~walchannel.transport.Transport` (dials and discovery: grpc.aio
  and httpx in :mod:`walchannel.channel.grpc_transport`, or the simulator's
  world) and a :class:`~walchannel.clock.Clock`;
- per dial a :class:`~walchannel.channel.stream.Stream` (its reader, writer
  and watchdog);
- :class:`~walchannel.channel.refused_rows.RefusedRows` (a row the engine
  refused for its size: set aside or held) and
  :class:`~walchannel.channel.reclaim.DiskReclaim` (the checkpoint timer).

and carries out what the driver decides: the log's transactions, timers,
waking waiters, logging. Everything runs on the event loop's thread;
``BlockingEngineChannel`` serves other threads. Every module of the channel
logs under ``walchannel.channel``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import random
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal, Self

from walchannel import _killpoints, messages, metrics, wire
from walchannel.channel.reclaim import DiskReclaim
from walchannel.channel.refused_rows import RefusedRows
from walchannel.channel.stream import TEARDOWN_TIMEOUT_S, Stream
from walchannel.clock import SYSTEM_CLOCK, Clock
from walchannel.config import GrpcChannelConfig, redact_secret
from walchannel.driver import (
    AckKind,
    Answer,
    Call,
    ChannelState,
    Completion,
    Driver,
    End,
)
from walchannel.end_status import DownTooLarge, describe_end
from walchannel.errors import (
    ApprovalTimeoutError,
    BacklogFullError,
    ChannelClosedError,
    DiscoveryError,
    EngineUnavailableError,
    PayloadError,
    RunCompletedError,
    RunExpiredError,
    WalchannelError,
    WalWriteError,
    raw_message,
)
from walchannel.formatting import get_logger
from walchannel.interface import ApprovalDecision, BudgetCallback, ChannelStats, StopCallback
from walchannel.log import RunLog
from walchannel.log_state import (
    FAILED_CORRUPT,
    FAILED_DONE_REFUSED,
    FAILED_INTERNAL,
)
from walchannel.payload import check_text
from walchannel.refusals import down_too_large_text
from walchannel.replication import SOCKET_ENV
from walchannel.row_source import RowSource
from walchannel.transport import StreamEnded

if TYPE_CHECKING:
    from walchannel._proto import engine_channel_pb2 as pb
    from walchannel.channel.replica import ReplicaGate
    from walchannel.transport import Transport

__all__ = ["GrpcEngineChannel"]

logger = get_logger(__name__)

#: How often the hard_deadline timer asks the wall clock at the longest (seconds).
DEADLINE_LOOK_S: Final = 60.0


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


#: How the connection loop ended when a task.cancel() from outside reached it.
_CANCELLED_FROM_OUTSIDE: Final = (
    "cancelled from outside walchannel (a task.cancel(), or the event loop finishing "
    "with the channel never closed)"
)


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
        rng: the random source of backoff jitter and of default approval
            request ids (a uuid4 drawn from it). Default: the system's
            (``random.SystemRandom``); inject a seeded ``random.Random`` in
            tests for repeatable delays and ids.
        log: an already-open :class:`~walchannel.RunLog` of this run to
            use instead of opening one (``walchannel flush`` keeps the
            owner lock from its checks through delivery;
            ``RunLog.on_connection`` in the simulator); the channel closes it.
        transport: where dials and discovery go (default: grpc.aio and
            httpx, :class:`~walchannel.channel.grpc_transport.GrpcTransport`);
            the simulator passes its simulated network. A seam, not for
            everyday use.
        clock: the clocks read (default: the system's,
            :data:`~walchannel.clock.SYSTEM_CLOCK`); the simulator passes
            its virtual ones. Timers follow the event loop's own time.
        token_hash_when: when the log's stored sha256 of the run token
            (SPEC "The log"; what ``flush`` checks a token against) is set to
            this config's token: ``"open"`` (default) in the constructor;
            ``"accepted"`` only once an engine has answered a handshake
            sent with it (``walchannel flush --replace-token``), so a token
            no engine accepts leaves the stored hash as it was.

    Raises:
        RunCompletedError: the log is a tombstone: the run already finished.
        WalLockedError: another process (or channel) owns the run's log.
        WalCorruptError: the log file is not usable.
        WalWriteError: the log cannot be created.
        TypeError: ``config`` is not a ``GrpcChannelConfig``.
        ValueError: ``log`` is not the open, owned log of ``config.run_id``.

    SPEC "The channel".
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        *,
        rng: random.Random | None = None,
        log: RunLog | None = None,
        transport: Transport | None = None,
        clock: Clock | None = None,
        token_hash_when: Literal["open", "accepted"] = "open",  # noqa: S107 - not a secret
    ) -> None:
        if not isinstance(config, GrpcChannelConfig):
            raise TypeError("config must be a GrpcChannelConfig")
        if token_hash_when not in ("open", "accepted"):
            raise ValueError(
                f"token_hash_when must be 'open' or 'accepted', got {token_hash_when!r}"
            )
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
        try:
            if log.completed:
                raise RunCompletedError(
                    f"run {self._run_id}: completed (its Done was acked); the log "
                    f"{log.path} is a tombstone"
                )
            token_hash = hashlib.sha256(config.run_token.encode("utf-8")).hexdigest()
            meta = log.meta()
            # Stored on the first answered handshake instead ("accepted").
            self._pending_token_hash: str | None = None
            if meta.token_sha256 != token_hash:
                if token_hash_when == "open":  # noqa: S105 - a policy, not a secret
                    log.update_meta(token_sha256=token_hash)
                else:
                    self._pending_token_hash = token_hash
            self._handshake_fields: tuple[str, str, str] | None = None
            if meta.harness_name is not None:
                self._handshake_fields = (
                    meta.connector_version or "",
                    meta.harness_name or "",
                    meta.harness_version or "",
                )
            if transport is None:
                # grpc loads here, not when this module is imported.
                from walchannel.channel.grpc_transport import GrpcTransport

                transport = GrpcTransport(config)
        except BaseException:
            log.close()
            raise
        self._transport: Transport = transport
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
        )
        self._addr = config.grpc_addr
        # A payload with more values can never travel: each takes >= 2 bytes as a Struct.
        self._max_values = config.max_message_bytes // 2
        self._rows = RowSource(log, config.run_id, config.correlation_id, config.max_message_bytes)
        self._reclaim = DiskReclaim(log, self._driver, self._clock)
        self._refused = RefusedRows(
            config,
            log,
            self._driver,
            self._rows,
            record_error=self._record_error,
            handshake_size=lambda: self._hello().ByteSize(),
        )
        self._wakeup = asyncio.Event()
        self._up = asyncio.Event()
        self._over = asyncio.Event()
        # Set when an ack reaches _wake_at (the lowest seq a waiter waits for),
        # and on any change of state: an ack below every waiter's target wakes
        # nobody, so a cumulative ack costs O(1) however many come.
        self._acked_changed = asyncio.Event()
        self._ack_waits: list[float] = []
        self._wake_at = math.inf
        self._stream: Stream | None = None
        self._runner: asyncio.Task[None] | None = None
        # A cancelled close() leaves closing the network to a task of its own, kept here.
        self._teardown: asyncio.Task[None] | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        socket = os.environ.get(SOCKET_ENV) if config.durability == "replicated" else None
        self._replica: ReplicaGate | None = None
        if socket is not None:
            from walchannel.channel.replica import ReplicaGate

            self._replica = ReplicaGate(socket, log, self._note_error)
        self._pings_warned = False
        # Texts of errors from outside walchannel already said at ERROR.
        self._said: set[str] = set()
        self._stop_callbacks: list[StopCallback] = []
        self._budget_callbacks: list[BudgetCallback] = []
        self._approvals: dict[str, asyncio.Future[ApprovalDecision]] = {}
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
    def log(self) -> RunLog:
        """The run's log (read it; the channel owns its writes)."""
        return self._log

    @property
    def driver(self) -> Driver:
        """The run's :class:`~walchannel.driver.Driver` (read it; the channel drives it)."""
        return self._driver

    def progress(self) -> Mapping[str, Any] | None:
        """Return the last committed harness progress marker (None for a new run).

        SPEC "Harness progress": resume a restarted scan from it.

        Raises:
            ChannelClosedError: the channel's event loop is gone.
        """
        self._check_loop()
        return self._log.progress

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
        )

    def __repr__(self) -> str:
        d = self._driver
        return (
            f"<GrpcEngineChannel run_id={self._run_id!r} state={d.state.name} "
            f"addr={self._addr!r} acked={d.acked} high={d.high_water}>"
        )

    def on_stop(self, callback: StopCallback) -> None:
        """Call ``callback(reason)`` when the engine sends ``Stop``.

        Fires once per channel however often the engine repeats it; the
        channel does not close itself. A callback that raises is logged and
        does not stop the others.
        """
        self._stop_callbacks.append(callback)

    def on_budget_update(self, callback: BudgetCallback) -> None:
        """Call ``callback(message, details)`` for each ``BudgetUpdate`` (advisory only)."""
        self._budget_callbacks.append(callback)

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
        self._driver.on_close()
        logger.warning(
            "run %s: the channel's event loop is gone (closed or stopped); the channel is "
            "closed and its log released, the unacked rows stay for a new channel",
            self._run_id,
        )
        self._cancel_timers()
        self._stream = None
        self._runner = None
        self._approvals.clear()
        try:
            self._store_ack(force=True)
            self._record_error(str(self._loop_gone()))
        finally:
            self._driver.move(ChannelState.CLOSED)
            if self._metrics is not None:
                self._metrics.close()
            self._log.close()

    # -- state and errors ------------------------------------------------------------------

    def _move(self, state: ChannelState) -> None:
        if self._driver.move(state):
            self._state_changed()

    def _state_changed(self) -> None:
        """Follow the driver's state with the events the waits watch."""
        driver = self._driver
        if driver.state is ChannelState.STREAMING:
            self._up.set()
        else:
            self._up.clear()
        if driver.final:
            self._over.set()
            self._wakeup.set()
            self._acked_changed.set()
            failure = driver.ended_error() if self._approvals else None
            if failure is not None and driver.state is not ChannelState.CLOSED:
                # No decision can come any more: waiting would never end.
                self._fail_approvals(lambda rid: failure)

    def _fail_approvals(self, error: Callable[[str], WalchannelError]) -> None:
        """Fail every pending ``request_approval`` with ``error(request_id)``."""
        approvals, self._approvals = self._approvals, {}
        for rid, future in approvals.items():
            if not future.done():
                future.set_exception(error(rid))
                future.exception()

    def _fail(self, error: WalchannelError, *, reason: str | None = None) -> None:
        self._failed(self._driver.fail(error, reason=reason))

    def _failed(self, reason: str | None) -> None:
        """The driver failed the run (:attr:`Driver.failure`): say so, store it, wake the waits."""
        error = self._driver.failure
        assert error is not None
        logger.error("%s", error)
        self._record_error(raw_message(error), failed=reason)
        self._state_changed()

    def _log_damaged(self, error: WalchannelError) -> None:
        """The writer found the log file damaged: re-dialing cannot mend it; stop, keep the rows."""
        self._fail(error, reason=FAILED_CORRUPT)

    def _foreign_error(
        self, where: str, exc: Exception, *, then: str = "retried with backoff"
    ) -> None:
        """An error from outside walchannel at a boundary: a failed attempt, never the run's end.

        The harness's objects (its ``http_client``, closed or misconfigured;
        its callbacks), httpx, grpc's channel creation, a malformed proxy
        variable: logged at ERROR with the type and traceback once per
        distinct text (then at INFO), kept in ``last_error``; the connection
        loop backs off and tries again, dialing the last known address
        (SPEC "The channel", errors from outside).
        """
        text = redact_secret(f"{where}: {type(exc).__name__}: {exc}", self._config.run_token)
        first = text not in self._said
        self._said.add(text)
        # Where it was raised, not the traceback: its last line would repeat
        # the message unredacted.
        frames = traceback.extract_tb(exc.__traceback__)
        raised = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        level = logging.ERROR if first else logging.INFO
        logger.log(level, "run %s: %s%s; %s", self._run_id, text, raised, then)
        self._record_error(text)

    def _note_error(self, message: str) -> None:
        """Keep ``message`` as ``last_error`` (``stats()``), not in the log."""
        self._driver.note_error(redact_secret(message, self._config.run_token))

    def _record_error(self, message: str, *, failed: str | None = None) -> None:
        """Keep ``message`` as ``last_error`` and store it in the log's meta (``inspect``)."""
        self._note_error(message)
        if not self._log.writable:
            return
        now = self._clock.wall_s()
        fields: dict[str, Any] = {"last_error": self._driver.last_error, "last_error_at": now}
        if failed is not None:
            fields["failed_at"] = now
            fields["failed_reason"] = failed
        try:
            self._log.update_meta(**fields)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the last error: %s", self._run_id, exc)

    def _call_back(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception as exc:
            name = getattr(callback, "__qualname__", repr(callback))
            self._foreign_error(f"callback {name}", exc, then="ignored")

    def _expire(self) -> None:
        if not self._driver.expire():
            return
        logger.error("run %s: hard_deadline passed; the channel stops", self._run_id)
        self._record_error("hard_deadline passed")
        self._state_changed()
        if self._stream is not None:
            self._stream.finish(StreamEnded("hard_deadline passed"))

    def _admit(self, call: Call) -> None:
        """Raise what the driver's one admission check says (expiring first when it is that)."""
        error = self._driver.admit(call, self._clock.wall_s())
        if error is not None:
            if isinstance(error, RunExpiredError):
                self._expire()
            raise error

    # -- sending (buffer first) ------------------------------------------------------------

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

    def _check_backlog(self, added: int) -> None:
        limit = self._config.max_unacked_bytes
        assert limit is not None
        self._store_ack(force=True)
        if self._log.unacked_bytes + added > limit:
            raise BacklogFullError(
                f"run {self._run_id}: {self._log.unacked_bytes} unacked bytes + {added} "
                f"would pass max_unacked_bytes {limit}; nothing was logged"
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
                (:func:`~walchannel.messages.parse_rfc3339`: a leap second is
                sent as ``23:59:59.999999``), or None (now); sent in UTC
                (SPEC "Timestamps").
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
        hooks = self._metrics
        started = hooks.clock_ns() if hooks is not None else 0
        self._check_sendable()
        if ts is None:
            ts = messages.rfc3339_at(self._clock.wall_s())
        body = messages.event_body(type, severity, payload, ts, max_values=self._max_values)
        seq = self._log_rows([self._rows.prepare("event", body)], progress)[0]
        if hooks is not None:
            hooks.on_send(started)
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
        hooks = self._metrics
        started = hooks.clock_ns() if hooks is not None else 0
        self._check_sendable()
        body = messages.finding_body(finding, max_values=self._max_values)
        seq = self._log_rows([self._rows.prepare("finding", body)], progress)[0]
        if hooks is not None:
            hooks.on_send(started)
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
            As :meth:`send_event`; a bad finding is named by its index
            (``findings[3].x``, and ``PayloadError.index``), whichever rule
            refused it, and nothing of the batch is logged.
        """
        hooks = self._metrics
        started = hooks.clock_ns() if hooks is not None else 0
        self._check_sendable()
        bodies = messages.finding_bodies(findings, max_values=self._max_values)
        items = []
        for index, body in enumerate(bodies):
            try:
                items.append(self._rows.prepare("finding", body))
            except PayloadError as exc:  # its size: name it as the other rules do
                raise PayloadError(f"findings[{index}]", exc.reason, index=index) from None
        if not items:
            marker = messages.progress_marker(progress)
            if marker is not None:
                self._log.append_encoded([], progress=marker)
            seqs: list[int] = []
        else:
            seqs = self._log_rows(items, progress)
        if hooks is not None:
            hooks.on_send(started)
        return seqs

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

        SPEC "Shutdown order".
        """
        self._bind_loop()
        driver = self._driver
        try:
            self._admit(Call.DONE)
        except RunExpiredError:
            return False
        if driver.completed:
            # This channel already delivered the run's Done (a restarted
            # harness's log held it): the tombstone is stored.
            driver.on_done_sent()
            return True
        if driver.done_seq is None:
            body = messages.done_body(status, findings, coverage, exit_reason)
            self._log_rows([self._rows.prepare("done", body)], None, exempt_from_backlog=True)
        driver.on_done_sent()
        _killpoints.reached("in_send_done")
        # No ack wakes it: completion (the tombstone stored) and failures do.
        acked = await self._wait_for(
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
            request_id: default a uuid4 (drawn from the channel's ``rng``).
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
        future = self._approvals.get(rid)
        if future is None or future.done():
            self._check_sendable()
            body = messages.approval_body(rid, action, details, max_values=self._max_values)
            self._log_rows([self._rows.prepare("approval_request", body)], None)
            future = asyncio.get_running_loop().create_future()
            self._approvals[rid] = future
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
            True when acked, False on timeout or close.

        Raises:
            TypeError: ``seq`` is not an int.
            ValueError: ``timeout_ms`` is not None or a finite number >= 0.
        """
        self._bind_loop()
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)):
            raise TypeError(f"wait_acked: seq must be an int, got {type(seq).__name__} {seq!r}")
        _check_timeout_ms("wait_acked", timeout_ms)
        driver = self._driver
        target = driver.high_water if seq is None else seq
        return await self._wait_for(
            lambda: driver.is_acked(target), timeout_ms, lambda: driver.translate(target)
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
        driver = self._driver
        now_ms = self._clock.monotonic_ms
        deadline = None if timeout_ms is None else now_ms() + timeout_ms
        if driver.state is ChannelState.IDLE and not condition():
            # Sends before handshake() are logged, not sent (SPEC "The
            # channel"): waiting on acks then would end silently at the timeout.
            text = "waiting for acks, but handshake() was never called: nothing is sent until it is"
            if driver.last_error != text:
                logger.warning("run %s: %s", self._run_id, text)
                driver.note_error(text)
        while not condition():
            # FAILED or EXPIRED: the connection loop is over, no ack can come.
            if driver.closed or driver.final:
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
        count = self._driver.rewind()
        self._wakeup.set()
        return count

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
        self._handshake_fields = (connector_version, harness_name, harness_version)
        # The discovery URL too: the step inspect prints for an orphaned run
        # names it, since the last engine streamed to may be dead by then.
        discovery = {} if self._config.http_addr is None else {"http_addr": self._config.http_addr}
        self._log.update_meta(
            connector_version=connector_version,
            harness_name=harness_name,
            harness_version=harness_version,
            **discovery,
        )
        self._start()
        driver = self._driver
        if driver.state is ChannelState.STREAMING:
            return
        up = asyncio.ensure_future(self._up.wait())
        over = asyncio.ensure_future(self._over.wait())
        try:
            await asyncio.wait(
                (up, over),
                timeout=self._config.connect_timeout_ms / 1000,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            up.cancel()
            over.cancel()
        if self.state is ChannelState.STREAMING:
            return
        ended = driver.ended_error()
        if ended is not None:
            raise ended
        waited = self._config.connect_timeout_ms
        if driver.last_end_code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            raise EngineUnavailableError(
                f"run {self._run_id}: the engine refused this run's token for {waited} ms "
                f"(the last attempt: {driver.last_error}); still dialing, in case a "
                "replacement engine accepts it"
            )
        raise EngineUnavailableError(
            f"run {self._run_id}: no engine answered the handshake within {waited} ms "
            f"(the last attempt: {driver.last_error}); still dialing"
        )

    def _start(self) -> None:
        if self._runner is not None:
            return
        loop = asyncio.get_running_loop()
        self._check_deadline()
        self._runner = loop.create_task(self._run(), name=f"walchannel-{self._run_id}")
        self._runner.add_done_callback(self._runner_done)

    def _runner_done(self, runner: asyncio.Task[None]) -> None:
        """The connection loop ended: if the channel is still open, the run fails here.

        The loop runs until ``close()`` or a final state; ended any other way
        (cancelled from outside: a ``task.cancel()`` of the harness's, or
        ``asyncio.run`` finishing with the channel never closed; or a
        ``BaseException`` such as ``KeyboardInterrupt`` raised inside it),
        no ack can come: :meth:`_loop_ended`.
        """
        if runner.cancelled():
            self._loop_ended(_CANCELLED_FROM_OUTSIDE)
        else:
            exc = runner.exception()
            what = "ended" if exc is None else f"ended by {type(exc).__name__}: {exc}"
            self._loop_ended(what)

    def _fail_if_cancelled(self) -> bool:
        """In the loop: a cancel from outside is being delivered; fail the run now. True if so."""
        task = asyncio.current_task()
        if task is None or not task.cancelling() or self._driver.closed:
            return False
        self._loop_ended(_CANCELLED_FROM_OUTSIDE)
        return True

    def _loop_ended(self, what: str) -> None:
        """The connection loop was ``what`` with the channel open: ``FAILED``, ``FAILED_INTERNAL``.

        Every waiter wakes at once (``wait_acked`` False; ``send_done``,
        ``request_approval`` and ``send_*`` raise the error) instead of
        hanging until its timeout. The rows stay in the log; the next
        channel's healthy answer clears the mark. SPEC "Cancellation".
        """
        driver = self._driver
        if driver.closed or driver.final:
            return
        self._fail(
            WalchannelError(
                f"run {self._run_id}: the connection loop was {what}; no ack can come. "
                f"The rows stay in {self._log.path}; close() this channel and open a new one"
            ),
            reason=f"{FAILED_INTERNAL}: the connection loop was {what}",
        )

    def _check_deadline(self) -> None:
        """Expire at ``hard_deadline`` on the wall clock, whatever the clock's steps.

        The token's expiry is a wall-clock time: the timer wakes at most every
        :data:`DEADLINE_LOOK_S` and asks the wall clock, so a step either way
        (NTP, a resumed VM) moves the expiry with it, as the admission check
        of every call does.
        """
        self._deadline_timer = None
        delay = self._driver.deadline_in_s(self._clock.wall_s())
        if delay is None or self._driver.closed:
            return
        if delay <= 0:
            self._expire()
            return
        self._deadline_timer = asyncio.get_running_loop().call_later(
            min(delay, DEADLINE_LOOK_S), self._check_deadline
        )

    async def _run(self) -> None:
        driver = self._driver
        try:
            rediscover = False  # the first dial uses the configured address
            while not driver.final and not driver.closed:
                if rediscover:
                    rediscover = False
                    await self._rediscover()
                    continue  # the run may have ended while discovery answered
                self._move(ChannelState.CONNECTING)
                await self._stream_once(self._addr)
                if driver.closed or driver.final:
                    break
                self._move(ChannelState.BACKOFF)
                delay = driver.next_delay_ms(self._clock.monotonic_ms(), self._rng)
                logger.info(
                    "run %s: reconnecting in %.0f ms (attempt %d)",
                    self._run_id,
                    delay,
                    driver.attempt,
                )
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can
                # turn a cancel into a TimeoutError (python/cpython#86296).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay / 1000):
                        await self._over.wait()
                rediscover = self._config.http_addr is not None
        except Exception as exc:
            # Errors from outside walchannel are failed attempts at their
            # boundary (discovery, the dial): what reaches here is walchannel's
            # own invariant breaking (StateError, an assertion, a bug). Fail
            # loudly rather than spin, naming it for inspect; nothing is dropped.
            logger.exception("run %s: the connection loop failed", self._run_id)
            what = f"{type(exc).__name__}: {exc}"
            self._fail(
                WalchannelError(f"run {self._run_id}: connection loop failed: {what}"),
                reason=f"{FAILED_INTERNAL}: {what}",
            )

    async def _rediscover(self) -> None:
        """Ask discovery for the engine's address; keep the last one on any failure.

        SPEC "Reconnect" (``GET {http_addr}/grpc-address``, validated against
        ``allowed_hosts`` before any dial); docs/design.md, "First address".
        """
        transport = self._transport
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see _run
                addr = await transport.discover(timeout_s)
        except DiscoveryError as exc:
            why = redact_secret(raw_message(exc), self._config.run_token)
            via = transport.discovery_route
            text = f"discovery{via}: {why}"
            # The same failure again (a closed client stays closed): said once.
            level = logging.WARNING if text not in self._said else logging.INFO
            self._said.add(text)
            logger.log(
                level,
                "run %s: discovery failed%s, keeping %s: %s",
                self._run_id,
                via,
                self._addr,
                why,
            )
            self._record_error(text)
            return
        except TimeoutError:
            via = transport.discovery_route
            logger.warning(
                "run %s: discovery timed out%s, keeping %s", self._run_id, via, self._addr
            )
            self._record_error(
                f"discovery{via}: no answer from {self._config.http_addr} within {timeout_s:.1f} s"
            )
            return
        except Exception as exc:
            self._foreign_error(f"discovery (keeping {self._addr})", exc)
            return
        if addr != self._addr:
            logger.info(
                "run %s: discovery moved the engine from %s to %s", self._run_id, self._addr, addr
            )
            self._addr = addr

    def _heartbeat(self) -> bytes:
        fields = (self._run_id, self._config.correlation_id)
        ts = messages.rfc3339_at(self._clock.wall_s())
        return wire.heartbeat_message(*fields, ts).SerializeToString()

    async def _stream_once(self, addr: str) -> None:
        """Dial ``addr``, handshake, stream until the stream ends; never raises for I/O."""
        try:
            call = self._transport.dial(addr, keepalive_ms=self._driver.keepalive_ms)
        except Exception as exc:  # channel creation, a malformed proxy variable
            self._foreign_error(f"dialing {addr}", exc)
            return
        stream = Stream(
            call,
            addr,
            driver=self._driver,
            rows=self._rows,
            clock=self._clock,
            wakeup=self._wakeup,
            on_down=self._on_down,
            on_fatal=self._log_damaged,
            heartbeat=self._heartbeat,
            acks_handshake=self._config.engine_acks_handshake,
            replica=self._replica,
        )
        self._stream = stream
        try:
            await self._open(stream)
            if not stream.ended.is_set() and not self._driver.final:
                await stream.ended.wait()
        finally:
            # Cancelled from outside: fail the run before the teardown's awaits,
            # so the waiters wake now, not once the network lets go.
            cancelled = self._fail_if_cancelled()
            await stream.read_final_status()
            self._driver.on_stream_gone()
            self._rows.clear_readahead()
            await stream.teardown()
            self._stream = None
            if not self._driver.closed and not cancelled:
                self._record_end(stream)

    async def _open(self, stream: Stream) -> None:
        """Send the handshake, take the answer, start writing. Ends ``stream`` on failure."""
        hello = self._hello().SerializeToString()
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await stream.call.write(hello)
                engine_high = await stream.answer if self._config.engine_acks_handshake else None
        except TimeoutError:
            stream.finish(
                StreamEnded(f"no handshake answer from {stream.addr} within {timeout_s:.1f} s")
            )
            return
        except Exception as exc:
            stream.finish(exc)
            return
        if stream.ended.is_set():
            return
        # None (engine_acks_handshake=False) is decided too: replay from the cursor.
        replay_from = self._take_answer(engine_high)
        if replay_from is None:
            stream.finish(StreamEnded("handshake answer refused"))
            return
        if self._driver.final:
            # The answer acked the rows before a refused Done: stopped (_check_held).
            stream.finish(StreamEnded("the channel stopped"))
            return
        self._driver.on_stream_up(replay_from, self._clock.monotonic_ms())
        self._state_changed()
        logger.info("run %s: streaming to %s", self._run_id, stream.addr)
        stored: dict[str, Any] = {
            "last_engine_addr": stream.addr,
            "reconnects": self._driver.reconnects,
        }
        if self._pending_token_hash is not None:
            # The engine answered a handshake sent with this token: it accepts it.
            stored["token_sha256"] = self._pending_token_hash
        try:
            self._log.update_meta(**stored)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the engine address: %s", self._run_id, exc)
        else:
            if self._pending_token_hash is not None:
                self._pending_token_hash = None
                logger.warning(
                    "run %s: the engine at %s accepted the replacement run token; its "
                    "sha256 is now the one stored in %s",
                    self._run_id,
                    stream.addr,
                    self._log.path,
                )
        stream.start()

    def _hello(self) -> pb.UpMessage:
        """The handshake: its stored fields and the log's writer identity (SPEC "Wire contract").

        It asks to take the run over while the log is marked so (until the
        first answered handshake clears the mark).
        """
        fields = self._handshake_fields or ("", "", "")
        writer = self._log.writer
        return wire.handshake_message(
            self._run_id,
            self._config.correlation_id,
            *fields,
            writer_id=writer.id,
            writer_epoch=writer.epoch,
            take_over=writer.take_over,
        )

    def _take_answer(self, engine_high: int | None) -> int | None:
        """Apply the handshake answer ``Ack(h)`` and do the I/O it needs. SPEC "Dial".

        The driver applies the answer in one call (:meth:`Driver.on_answer
        <walchannel.driver.Driver.on_answer>`); only a verification calls it
        again, after the log moved its rows.

        Args:
            engine_high: ``h``; None without ``engine_acks_handshake``.

        Returns:
            The first seq to write on the stream, or None to end the stream.
        """
        driver = self._driver
        now = self._clock.monotonic_ms()
        plan = driver.on_answer(engine_high, now)
        answer = plan.answer
        if engine_high is None:
            return plan.replay_from
        if plan.clear_failed_mark:
            try:
                self._log.update_meta(failed_at=None, failed_reason=None)
            except WalchannelError as exc:
                logger.warning("run %s: cannot clear the failed mark: %s", self._run_id, exc)
        if answer is Answer.IMPOSSIBLE or answer is Answer.AHEAD:
            logger.error("run %s: %s", self._run_id, plan.problem)
            if answer is Answer.IMPOSSIBLE and self._stream is not None:
                # Nothing applied; the stream ends, and a fresh handshake re-syncs.
                self._stream.finish(
                    StreamEnded(f"{plan.problem}; the stream is ended and dialed again")
                )
            return plan.replay_from
        if answer is Answer.BEHIND or answer is Answer.FOREIGN:
            self._failed(plan.failed_reason)  # the run cannot go on with this engine
            return None
        if answer is Answer.VERIFY:
            unverified = driver.unverified_from
            try:
                shift = self._log.verify(engine_high)
            except WalWriteError as exc:
                self._record_error(raw_message(exc))
                return None
            if shift:
                logger.warning(
                    "run %s: the engine already holds seqs up to %d, at or above this log's "
                    "unverified rows (from %s); moved them by %d to follow it",
                    self._run_id,
                    engine_high,
                    unverified,
                    shift,
                )
                self._rows.clear_tail()
                # Seqs handed out before now live higher: waiters re-read their targets.
                self._acked_changed.set()
            driver.on_verified(engine_high, shift)
            self._reclaim.rows_deleted()  # the verifying ack deleted rows too
            self._after_ack()
            return plan.replay_from
        if answer is Answer.FORGOT:
            logger.warning(
                "run %s: the engine answered Ack(%d) %s; re-sending from %d",
                self._run_id,
                engine_high,
                plan.problem,
                plan.replay_from,
            )
        elif plan.acked_moved:
            _killpoints.reached("after_ack_received")
            self._after_ack(now)
        return plan.replay_from

    # -- how a stream ended ----------------------------------------------------------------

    def _record_end(self, stream: Stream) -> None:
        reason = stream.reason
        code: str | None = None
        details = debug = ""
        if isinstance(reason, StreamEnded):
            code, details, debug = reason.code, reason.details, reason.debug
        if code is None and stream.status is not None and stream.status[0] != "OK":
            code, details = stream.status
        text = describe_end(code, details) if code else str(reason or "stream ended")
        # The engine's text may echo the token (SPEC "Secrets").
        text = redact_secret(text, self._config.run_token)
        driver = self._driver
        keepalive = driver.keepalive_ms
        plan = driver.on_end(code, details, debug)
        if plan.keepalive_doubled and not self._pings_warned:
            self._pings_warned = True
            logger.warning(
                "run %s: the engine sent GOAWAY too_many_pings; keepalive %d -> %d ms for "
                "the rest of the run",
                self._run_id,
                keepalive,
                driver.keepalive_ms,
            )
        if plan.end is End.RUN_COMPLETED or plan.end is End.FENCED:
            self._on_run_completed(plan.completion, plan.failed_reason)
            return
        if plan.end is End.ALREADY_OVER:
            return
        if plan.too_large is not None:
            self._on_down_too_large(stream, plan.too_large, text, kept=plan.cause_kept)
            return
        # The same end again (an engine down, a token refused) while redialing:
        # said once at WARNING, then at INFO until a stream comes up.
        level = logging.WARNING if driver.first_said(text) else logging.INFO
        logger.log(
            level, "run %s: stream to %s%s ended: %s", self._run_id, stream.addr, stream.route, text
        )
        if plan.refusal is not None:
            refused = self._refused.on_refusal(stream.addr, stream.top_written, plan.refusal, text)
            if refused is not None:
                future = self._approvals.pop(refused.request_id, None)
                if future is not None and not future.done():
                    future.set_exception(refused.error)
                    future.exception()
            self._check_held()
            return
        self._record_error(f"{stream.addr}{stream.route}: {text}")

    def _on_down_too_large(
        self, stream: Stream, found: DownTooLarge, text: str, *, kept: bool
    ) -> None:
        """A down message was over ``max_receive_message_bytes``: name the field; retry.

        SPEC "Down messages": the engine likely sends it again after every
        handshake, so each stream ends the same way; said at ERROR once per
        distinct text (then at INFO), kept in ``last_error``, and the
        connection loop backs off as after any end. An end whose status
        grpc.aio lost to a write (grpc/grpc#36066) keeps this cause
        (:meth:`~walchannel.driver.Driver.on_end`).
        """
        why = down_too_large_text(found, self._config.max_receive_message_bytes)
        where = f"{stream.addr}{stream.route}"
        first = why not in self._said
        self._said.add(why)
        if kept:
            # gRPC lost this stream's status: the last one it gave stands.
            logger.info(
                "run %s: stream to %s ended: %s; taken as the same cause as before: %s",
                self._run_id,
                where,
                text,
                why,
            )
        else:
            logger.log(
                logging.ERROR if first else logging.INFO,
                "run %s: stream to %s ended: %s (gRPC: %s)",
                self._run_id,
                where,
                why,
                text,
            )
        self._record_error(f"{where}: {why}")

    def _on_run_completed(self, completion: Completion | None, failed_reason: str | None) -> None:
        """The engine answered "run completed", or refused this writer: the loop ends.

        The driver decided in :meth:`~walchannel.driver.Driver.on_end`
        (:attr:`~walchannel.driver.EndPlan.completion`): unless the log becomes
        a tombstone the run has already failed there, and this stores it.
        """
        driver = self._driver
        if completion is not Completion.TOMBSTONE:
            # Rows this log still holds cannot be delivered (here) any more: the
            # reason flags the run for an operator (inspect: failed; export saves them).
            self._failed(failed_reason)
            return
        if self._log.writable:
            # Our Done was applied but its ack was lost: the run ended well.
            try:
                self._log.complete_by_engine()
            except WalchannelError as exc:
                logger.error("run %s: cannot mark the log completed: %s", self._run_id, exc)
            else:
                logger.info(
                    "run %s: the engine applied this run's Done; the log is now a tombstone",
                    self._run_id,
                )
                driver.completed_by_engine()
                self._state_changed()
                return
        self._failed(driver.tombstone_not_stored())  # Done, and maybe more, stays

    def _check_held(self) -> None:
        """Stop with the held error once every row before a refused ``Done`` is acked."""
        error = self._driver.held_due()
        if error is None:
            return
        self._fail(error, reason=FAILED_DONE_REFUSED)
        if self._stream is not None:
            self._stream.finish(StreamEnded(raw_message(error)))

    # -- down messages ---------------------------------------------------------------------

    def _on_down(self, msg: pb.DownMessage, now: float) -> None:
        kind = msg.WhichOneof("body")
        if kind == "ack":
            self._on_ack(msg.ack.seq, now)
        elif kind == "stop":
            self._on_stop(msg.stop.reason)
        elif kind == "approval_decision":
            d = msg.approval_decision
            self._on_decision(d.request_id, d.approved, d.reason)
        elif kind == "budget_update":
            details = wire.struct_to_dict(msg.budget_update.details)
            for callback in list(self._budget_callbacks):
                self._call_back(callback, msg.budget_update.message, details)
        else:
            logger.warning("run %s: ignoring a down message with an unknown body", self._run_id)

    def _on_stop(self, reason: str) -> None:
        if not self._driver.on_stop():
            return  # a repeat (the engine re-sends it after every handshake)
        logger.info(
            "run %s: the engine sent Stop(%r)",
            self._run_id,
            redact_secret(reason, self._config.run_token),
        )
        for callback in list(self._stop_callbacks):
            self._call_back(callback, reason)

    def _on_decision(self, request_id: str, approved: bool, reason: str) -> None:
        self._driver.on_decision(request_id, approved, reason)
        future = self._approvals.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(ApprovalDecision(request_id, approved, reason))
        elif future is None:
            logger.info(
                "run %s: decision for approval request %r that this channel is not "
                "waiting on; cached",
                self._run_id,
                request_id,
            )

    # -- acks ------------------------------------------------------------------------------

    def _on_ack(self, seq: int, now: float | None = None) -> None:
        """Apply a received cumulative ``Ack(seq)`` (SPEC "Acks"); ``now`` in ms (monotonic)."""
        driver = self._driver
        now = self._clock.monotonic_ms() if now is None else now
        kind = driver.on_ack(seq, now)
        if kind is AckKind.ADVANCE:
            _killpoints.reached("after_ack_received")
            self._after_ack(now)
        elif kind is not AckKind.STALE:  # a protocol error, counted, never applied
            logger.error("run %s: %s", self._run_id, driver.last_error)
            if kind is AckKind.NEVER_WRITTEN and self._stream is not None:
                # Rows never written: a fresh handshake re-syncs.
                self._stream.finish(
                    StreamEnded(f"{driver.last_error}; the stream is ended and dialed again")
                )

    def _after_ack(self, now: float | None = None) -> None:
        """The received ack moved: drop acked rows from the tail, store when due, wake waiters.

        Waiters (``wait_acked``, ``send_done``) are woken only when the ack
        reaches the lowest seq one of them waits for (``_wake_at``).
        """
        driver = self._driver
        acked = driver.acked
        self._rows.drop_acked(acked)
        self._store_ack(now=now)
        if acked >= self._wake_at:
            self._acked_changed.set()
        if driver.held is not None:
            self._check_held()

    def _store_ack(self, *, force: bool = False, now: float | None = None) -> None:
        """Store the received ack in the log now if it is due, else arm the timer.

        When is the driver's :meth:`~walchannel.driver.Driver.ack_to_store`
        (every 256 acks or 100 ms, at once for ``Done``, ``force`` at close).
        """
        driver = self._driver
        seq = driver.ack_to_store(self._clock.monotonic_ms() if now is None else now, force=force)
        if seq is None:
            delay_ms = driver.ack_timer_ms(timer_armed=self._ack_timer is not None)
            if delay_ms is not None:
                with contextlib.suppress(RuntimeError):  # no running loop: stored at close
                    self._ack_timer = asyncio.get_running_loop().call_later(
                        delay_ms / 1000, self._ack_timer_fired
                    )
            return
        if not self._log.writable:
            return
        try:
            self._log.ack(seq)
        except WalchannelError as exc:
            # Not stored: the rows stay and are re-sent after a crash (harmless).
            # The error names the run, the ack and the file already.
            logger.error("%s; the acked rows stay until the next ack is stored", exc)
            self._note_error(raw_message(exc))
            return
        if driver.completed:
            logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)
            self._acked_changed.set()
        self._reclaim.rows_deleted()

    def _ack_timer_fired(self) -> None:
        self._ack_timer = None
        self._store_ack()

    # -- closing ---------------------------------------------------------------------------

    def _cancel_timers(self) -> None:
        for timer in (self._deadline_timer, self._ack_timer):
            if timer is not None:
                timer.cancel()
        self._deadline_timer = self._ack_timer = None
        self._reclaim.cancel()

    async def close(self) -> None:
        """Close the channel: half-close, wait up to ``close_timeout_ms``, tear down.

        Marks the channel closed first (so the teardown is not mistaken for
        a drop), half-closes the stream, waits up to ``close_timeout_ms`` for
        its end, then stops every task and closes the connection, stores
        the latest ack, and closes the log. Idempotent; never hangs; unacked
        rows stay on disk for a resume or ``flush``. Pending approvals fail
        with ``ChannelClosedError``. The log is closed (its lock released)
        whatever happens on the way.

        On another event loop than the channel's: if that one is closed or
        stopped (an earlier ``asyncio.run()`` ended), the channel is closed
        without it, nothing of it awaited (the socket closes with the gRPC
        channel object); if it runs in another thread, the close runs there.

        Cancelled (``task.cancel()``, an ``asyncio.timeout()`` around it), or
        called by a task that is being cancelled (an ``async with`` body
        cancelled), it finishes at once and awaits nothing more: the channel
        is ``CLOSED``, the received ack stored, pending approvals fail, the
        log closed and its lock released, synchronously; the network's
        teardown (the stream's call and tasks, the discovery client) goes on
        in the background. The ``CancelledError`` of a cancelled ``close()``
        is raised again; that of a task being cancelled goes on as it was.

        Raises:
            asyncio.CancelledError: ``close()`` itself was cancelled.

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
        driver = self._driver
        driver.on_close()
        self._cancel_timers()
        self._over.set()
        if self._stream is not None:
            self._stream.finish(StreamEnded("closed"))
        runner = self._runner
        if runner is not None and not runner.done():
            runner.cancel()
        self._mark_closed()
        if self._teardown is None:
            self._teardown = asyncio.get_running_loop().create_task(
                self._close_network(), name=f"walchannel-{self._run_id}-teardown"
            )

    def _mark_closed(self) -> None:
        """The part of closing that awaits nothing: ack stored, ``CLOSED``, waiters answered.

        Shared by :meth:`_close` and :meth:`_close_now` (idempotent).
        """
        self._store_ack(force=True)
        self._move(ChannelState.CLOSED)
        self._fail_approvals(
            lambda rid: ChannelClosedError(f"run {self._run_id}: closed before approval {rid!r}")
        )
        self._acked_changed.set()
        if self._metrics is not None:
            self._metrics.close()

    async def _close_network(self) -> None:
        """Close the transport and the replica gate (both idempotent; a failure is logged)."""
        closers = [self._transport.aclose]
        if self._replica is not None:
            closers.append(self._replica.aclose)
        for aclose in closers:
            try:
                await aclose()
            except Exception as exc:
                logger.debug("run %s: closing the network failed: %r", self._run_id, exc)

    async def _close(self) -> None:
        driver = self._driver
        driver.on_close()
        _killpoints.reached("in_close")
        self._cancel_timers()
        await self._stop_streaming()
        self._mark_closed()
        await self._close_network()

    async def _stop_streaming(self) -> None:
        """For close: half-close the stream, wait up to ``close_timeout_ms``, tear down.

        SPEC "Shutdown order". The caller has marked the channel closed, so
        the end of the stream is not taken for a drop.
        """
        budget_s = self._config.close_timeout_ms / 1000
        stream = self._stream
        if stream is not None and not stream.ended.is_set():
            # The budget passed, or the call failed: tear down. A cancel
            # propagates (asyncio.timeout, not wait_for: on Python 3.11
            # wait_for can swallow one, python/cpython#86296).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(budget_s):
                    await stream.half_close()
            stream.finish(StreamEnded("closed"))
        # Wake the loop (backoff sleeps and handshake waits watch _over) and
        # let it tear its stream down itself; cancel it only if it lingers.
        self._over.set()
        if self._runner is not None:
            done, _ = await asyncio.wait({self._runner}, timeout=2 * TEARDOWN_TIMEOUT_S + 1)
            if not done:
                self._runner.cancel()
                await asyncio.wait({self._runner}, timeout=TEARDOWN_TIMEOUT_S)
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.teardown()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
