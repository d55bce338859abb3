"""GrpcEngineChannel: the durable stream over ``grpc.aio`` (SPEC "The channel").

Buffer first: ``send_*`` validates, commits the row to the run's log and
only then hands it to the writer; it never waits on the network. The log is
the queue: the one writer task takes rows in seq order from a small
in-memory tail of committed rows, or from disk, so replay and live sends
never interleave and memory stays flat. The connection loop dials, sends
the handshake (seq 0), waits for the engine's ``Ack(h)``, applies the
verification rule, replays, and on any end of stream backs off, rediscovers
and dials again, until ``close()``, ``hard_deadline`` or a failure.

Decisions (seq, cursor, replay position, verification, backoff reset,
states) come from :mod:`walchannel.protocol`; storage is
:class:`~walchannel.log.RunLog`; discovery is :mod:`walchannel.discovery`.
Everything runs on the event loop's thread; ``BlockingEngineChannel``
serves other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import grpc
import grpc.aio
import httpx
import msgpack

from walchannel import _killpoints, messages, metrics, wire
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.address import Proxy, parse_host_port, proxy_for
from walchannel.config import GrpcChannelConfig, redact_secret
from walchannel.discovery import discover, discovery_client
from walchannel.errors import (
    ApprovalTimeoutError,
    BacklogFullError,
    ChannelClosedError,
    DiscoveryError,
    EngineBehindError,
    EngineUnavailableError,
    PayloadError,
    RunCompletedError,
    RunExpiredError,
    WalchannelError,
    WalCorruptError,
    WalWriteError,
)
from walchannel.interface import ApprovalDecision, BudgetCallback, ChannelStats, StopCallback
from walchannel.log import RunLog
from walchannel.log_format import (
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_UNDELIVERABLE,
    ROW_LOST_TYPE,
    encode_body,
)
from walchannel.payload import check_text
from walchannel.protocol import (
    ACK_STORE_AFTER_MS,
    AckKind,
    AnswerKind,
    ChannelState,
    Cursor,
    EndKind,
    ReconnectPolicy,
    SizeRefusal,
    StateMachine,
    classify_end,
    describe_end,
    is_too_many_pings,
    parse_size_refusal,
    pick_refused_row,
    refusal_sets_aside,
)
from walchannel.replication import SOCKET_ENV

__all__ = ["GrpcEngineChannel"]

logger = logging.getLogger(__name__)

METHOD = "/EngineChannel/Open"
#: gRPC keepalive ping timeout (ms), as in the design note.
KEEPALIVE_TIMEOUT_MS = 10_000
#: Cap of the keepalive after GOAWAY too_many_pings doublings (ms).
MAX_KEEPALIVE_MS = 300_000
#: The in-memory tail of committed rows the writer reads before disk (bytes:
#: each row counts its msgpack body plus TAIL_ROW_OVERHEAD).
TAIL_BYTES = 4 * 1024 * 1024
#: What a tail entry costs beyond its body (the tuple, int and bytes objects),
#: so tiny rows cannot make the tail many times TAIL_BYTES in memory.
TAIL_ROW_OVERHEAD = 160
#: A Struct-encoded message is at most this many times its msgpack body.
STRUCT_GROWTH = 16
#: Rows read from disk at a time when the writer is behind the tail.
READAHEAD_ROWS = 256
#: Bound on waiting for a dead stream's tasks and gRPC channel to go (seconds).
TEARDOWN_TIMEOUT_S = 2.0
#: Quiet time after the last stored ack after which the log is checkpointed
#: and its freed pages given back (ms).
CHECKPOINT_IDLE_MS = 1_000
#: While acks keep being stored, an empty backlog is checkpointed at most this often (ms).
CHECKPOINT_EVERY_MS = 10_000
#: Retry delays of a checkpoint a reader held off: doubling up to this (ms).
CHECKPOINT_RETRY_MAX_MS = 30_000
#: Pages (4 KiB) given back per turn of the event loop: one 4 MiB chunk and its checkpoints.
CHECKPOINT_STEP_PAGES = 1024
#: durability="replicated": Litestream's bound on one sync (s), the pause after a
#: failed one (s), and how long failures stay quiet (a new log is being picked up).
REPLICA_SYNC_TIMEOUT_S = 30
REPLICA_RETRY_S = 0.2
REPLICA_QUIET_S = 5.0

_trace_warned = False


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _identity(data: bytes) -> bytes:
    return data


def _warn_grpc_trace() -> None:
    # gRPC's C core prints call metadata, the bearer token included, under
    # these tracers; it is outside this library's reach, so say it once.
    global _trace_warned
    if _trace_warned:
        return
    tracers = {t.strip().lower() for t in os.environ.get("GRPC_TRACE", "").split(",")}
    if tracers & {"api", "all"}:
        _trace_warned = True
        logger.warning(
            "GRPC_TRACE=%s: gRPC's own tracers print call metadata, including the run "
            "token, from C code that walchannel cannot filter; do not enable them in "
            "production",
            os.environ.get("GRPC_TRACE"),
        )


class _StreamEnded(Exception):
    """Why one stream ended (internal: the loop reconnects).

    ``code`` and ``details`` carry the gRPC status when one is known.
    """

    def __init__(self, message: str, code: str | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class _ClosedChannel:
    """Stands in for a released grpc.aio channel (closing it again is a no-op)."""

    async def close(self, grace: float | None = None) -> None:
        return None


_CLOSED_CHANNEL: Any = _ClosedChannel()


class _Stream:
    """One dial: its grpc.aio channel and call, its tasks, and why it ended."""

    def __init__(
        self, addr: str, channel: grpc.aio.Channel, call: Any, loop: Any, via: str = ""
    ) -> None:
        self.addr = addr
        # " via proxy host:port" when the dial goes through one, else "".
        self.via = via
        self.channel = channel
        self.call = call
        self.answer: asyncio.Future[int] = loop.create_future()
        self.ended = asyncio.Event()
        self.reason: BaseException | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.last_down_ms = _now_ms()
        self.heartbeats_since_down = 0
        # When the write in progress started (None: the writer is not in a
        # write), and when the next heartbeat is due: a write blocked by flow
        # control past that moment is a heartbeat that cannot go out.
        self.write_since_ms: float | None = None
        self.next_beat_ms = float("inf")
        # The highest seq whose write started on this stream (a refused row's
        # write may never complete), and the call's final status (code name,
        # details) when the server ended it.
        self.top_written = 0
        self.status: tuple[str, str] | None = None

    def release(self) -> None:
        """Drop the references to the gRPC objects once they are closed."""
        self.tasks.clear()
        self.call = None
        self.channel = _CLOSED_CHANNEL

    def finish(self, reason: BaseException | None) -> None:
        if not self.ended.is_set():
            # No traceback: its frames would keep the call (and its socket) alive.
            self.reason = reason.with_traceback(None) if reason is not None else None
            self.ended.set()
        if not self.answer.done():
            self.answer.set_exception(reason or _StreamEnded("stream ended"))
            self.answer.exception()  # retrieved: nobody may be waiting


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
        rng: the random source for backoff jitter (inject a seeded one in
            tests; default: a fresh ``random.Random``).
        log: an already-open :class:`~walchannel.RunLog` of this run to
            use instead of opening one (``walchannel flush`` keeps the
            owner lock from its checks through delivery); the channel
            closes it.

    Raises:
        RunCompletedError: the log is a tombstone: the run already finished.
        WalLockedError: another process (or channel) owns the run's log.
        WalCorruptError: the log file is not usable.
        WalWriteError: the log cannot be created.

    SPEC "The channel".
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        *,
        rng: random.Random | None = None,
        log: RunLog | None = None,
    ) -> None:
        if not isinstance(config, GrpcChannelConfig):
            raise TypeError("config must be a GrpcChannelConfig")
        _warn_grpc_trace()
        self._config = config
        self._run_id = config.run_id
        self._rng = rng or random.Random()
        if log is None:
            log = RunLog.open(
                config.wal_dir,
                config.run_id,
                correlation_id=config.correlation_id,
                # "replicated" is "process" on disk, plus the replica gate below.
                durability="power" if config.durability == "power" else "process",
            )
        elif log.run_id != config.run_id or not log.writable:
            raise ValueError(f"log= must be the open, owned log of run {config.run_id}")
        self._log = log
        try:
            if self._log.completed:
                raise RunCompletedError(
                    f"run {self._run_id}: completed (its Done was acked); the log "
                    f"{self._log.path} is a tombstone"
                )
            token_hash = hashlib.sha256(config.run_token.encode("utf-8")).hexdigest()
            meta = self._log.meta()
            if meta.token_sha256 != token_hash:
                self._log.update_meta(token_sha256=token_hash)
            # A log marked failed by an earlier run: cleared by a healthy answer.
            self._failed_mark = meta.failed_at is not None
            self._handshake_fields: tuple[str, str, str] | None = None
            if meta.harness_name is not None:
                self._handshake_fields = (
                    meta.connector_version or "",
                    meta.harness_name or "",
                    meta.harness_version or "",
                )
        except BaseException:
            self._log.close()
            raise
        # The log's facts (high-water, stored ack, Done, completion) are read from it.
        self._cursor = Cursor(log=self._log, acked=self._log.last_acked_seq)
        self._sm = StateMachine()
        self._reconnect = ReconnectPolicy()
        self._metadata = (("authorization", f"Bearer {config.run_token}"),)
        self._addr = config.grpc_addr
        self._keepalive_ms = config.keepalive_ms
        self._pings_warned = False
        # The tail: the newest committed rows (seq, kind, msgpack body) exactly
        # as stored, not the caller's dicts, which it may change once send_*
        # returned; the writer decodes and builds each message as it writes it.
        self._tail: deque[tuple[int, str, bytes]] = deque()
        self._tail_bytes = 0
        self._readahead: deque[tuple[int, str, dict[str, Any]]] = deque()
        # What an UpMessage adds around its body, for the size bound below.
        self._envelope = 64 + len(config.run_id) + len(config.correlation_id)
        self._wakeup = asyncio.Event()
        self._up = asyncio.Event()
        self._over = asyncio.Event()
        self._acked_changed = asyncio.Event()
        self._stream: _Stream | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._http: httpx.AsyncClient | None = config.http_client
        # durability="replicated": rows <= _replicated_through are on the replica.
        self._replica_socket = (
            os.environ.get(SOCKET_ENV) if config.durability == "replicated" else None
        )
        self._replica: httpx.AsyncClient | None = None
        self._replicated_through = 0
        self._replica_failing_since: float | None = None
        self._own_http = False
        # " via proxy host:port" for our own discovery client, else "".
        self._http_via = ""
        # The last (address, proxy) logged, so a route is logged once.
        self._route: tuple[str, str | None] | None = None
        self._proxy_scheme_warned = False
        self._closed = False
        self._closing = False
        self._done_sent = False
        self._failure: WalchannelError | None = None
        self._stop_callbacks: list[StopCallback] = []
        self._budget_callbacks: list[BudgetCallback] = []
        self._stop_fired = False
        self._decisions: dict[str, ApprovalDecision] = {}
        self._approvals: dict[str, asyncio.Future[ApprovalDecision]] = {}
        self._sent = 0
        self._replayed = 0
        self._max_written = 0
        self._reconnects = 0
        self._streams_up = 0
        self._protocol_errors = 0
        self._last_error: str | None = None
        self._limits_warned: set[tuple[str, int]] = set()
        # The error to stop with once the rows before a refused Done are acked.
        self._held: PayloadError | None = None
        self._last_checkpoint_ms = _now_ms()
        # The event loop of the first await; the tasks, events, timers and the
        # gRPC channel all live on it (see _bind_loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_stored_ms = 0.0
        self._checkpoint_due = False
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._checkpoint_delay_ms = float(CHECKPOINT_IDLE_MS)
        # OpenTelemetry hooks: None when metrics are off or opentelemetry is absent.
        self._metrics = metrics.attach(self)

    # -- read-outs ------------------------------------------------------------

    @property
    def config(self) -> GrpcChannelConfig:
        """The configuration (its ``repr`` never shows the token)."""
        return self._config

    @property
    def state(self) -> ChannelState:
        """The channel's :class:`~walchannel.ChannelState`."""
        return self._sm.state

    @property
    def last_acked_seq(self) -> int:
        """The highest seq received in an ack (the log stores it within ~100 ms)."""
        return self._cursor.acked

    @property
    def unacked_count(self) -> int:
        """Logged rows not covered by a received ack."""
        return self._cursor.unacked

    @property
    def log(self) -> RunLog:
        """The run's log (read it; the channel owns its writes)."""
        return self._log

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
        # Reads only: an ack received but not yet stored is counted, not stored.
        oldest: float | None = None
        unacked_bytes = 0
        if not self._log.closed:
            unacked_bytes = self._log.unacked_bytes_above(self._cursor.acked)
            if self._cursor.unacked:
                appended_at = self._log.oldest_appended_at(self._cursor.acked)
                if appended_at is not None:
                    oldest = max(0.0, time.time() - appended_at)
        return ChannelStats(
            state=self._sm.state,
            sent=self._sent,
            acked=self._cursor.acked,
            replayed=self._replayed,
            reconnects=self._reconnects,
            unacked_count=self._cursor.unacked,
            unacked_bytes=unacked_bytes,
            oldest_unacked_age_s=oldest,
            protocol_errors=self._protocol_errors,
            last_error=self._last_error,
            quarantined=self._log.quarantined_count if not self._log.closed else 0,
        )

    def __repr__(self) -> str:
        return (
            f"<GrpcEngineChannel run_id={self._run_id!r} state={self._sm.state.name} "
            f"addr={self._addr!r} acked={self._cursor.acked} high={self._cursor.high_water}>"
        )

    # -- callbacks ----------------------------------------------------------------

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

    def _call_back(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("run %s: callback %r raised; ignored", self._run_id, callback)

    # -- the event loop ---------------------------------------------------------------

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

        Its tasks, events and gRPC channel live on that loop. On another loop,
        if that one is closed or stopped the channel is closed without it
        (:meth:`_abandon`) and ``ChannelClosedError`` says so; if it still runs
        (in another thread), ``WalchannelError``.
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

        The tasks, timers, waiters and the gRPC channel of the dead loop are
        dropped, not touched (a future of a closed loop cannot be resolved);
        the socket closes with the gRPC channel object.
        """
        if self._closed:
            return
        self._closed = True
        self._closing = True
        logger.warning(
            "run %s: the channel's event loop is gone (closed or stopped); the channel is "
            "closed and its log released, the unacked rows stay for a new channel",
            self._run_id,
        )
        for timer in (self._deadline_timer, self._ack_timer, self._checkpoint_timer):
            if timer is not None:
                timer.cancel()
        self._ack_timer = None
        self._checkpoint_timer = None
        self._stream = None
        self._runner = None
        self._approvals.clear()
        try:
            self._store_ack(force=True)
            self._set_error(str(self._loop_gone()))
        finally:
            self._sm.move(ChannelState.CLOSED)
            if self._metrics is not None:
                self._metrics.close()
            self._log.close()

    # -- sending --------------------------------------------------------------------

    def _check_sendable(self) -> None:
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

    def _prepare(self, kind: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """Encode a checked body for the log; refuse it if its message could never travel."""
        blob = encode_body(kind, body)
        # A Struct takes at most ~11x the msgpack bytes of the same values
        # (a list of small ints); only near the limit is the exact size worth
        # building the message for.
        if len(blob) * STRUCT_GROWTH + self._envelope > self._config.max_message_bytes:
            msg = wire.up_message(self._run_id, self._config.correlation_id, 0, kind, body)
            # + 11: the seq's tag and varint are not set yet.
            size = msg.ByteSize() + 11
            if size > self._config.max_message_bytes:
                raise PayloadError(
                    kind,
                    f"encoded message is {size} bytes, over max_message_bytes "
                    f"{self._config.max_message_bytes}; it could never be delivered",
                )
        return kind, blob

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
        marker = messages.progress_marker(progress)
        if self._config.max_unacked_bytes is not None and not exempt_from_backlog:
            self._check_backlog(sum(len(blob) for _, blob in items))
        seqs = self._log.append_encoded(items, progress=marker)
        _killpoints.reached("after_commit")
        tail = self._tail
        if tail and tail[-1][0] + 1 != seqs[0]:
            tail.clear()
            self._tail_bytes = 0
        for seq, (kind, blob) in zip(seqs, items, strict=True):
            tail.append((seq, kind, blob))
            self._tail_bytes += len(blob) + TAIL_ROW_OVERHEAD
        while self._tail_bytes > TAIL_BYTES and len(tail) > 1:
            self._tail_bytes -= len(tail.popleft()[2]) + TAIL_ROW_OVERHEAD
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
        body = messages.event_body(type, severity, payload, ts)
        seq = self._log_rows([self._prepare("event", body)], progress)[0]
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
        body = messages.finding_body(finding)
        seq = self._log_rows([self._prepare("finding", body)], progress)[0]
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
        items = []
        for finding in findings:
            body = messages.finding_body(finding)
            items.append(self._prepare("finding", body))
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
                [self._prepare("done", body)],
                None,
                exempt_from_backlog=True,
            )
        self._done_sent = True
        _killpoints.reached("in_send_done")
        acked = await self._wait_for(
            lambda: self._cursor.completed, self._config.done_ack_timeout_ms
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
            The other errors of ``send_event``.
        """
        self._bind_loop()
        rid = request_id if request_id is not None else str(uuid.uuid4())
        decided = self._decisions.get(rid)
        if decided is not None:
            return decided
        future = self._approvals.get(rid)
        if future is None or future.done():
            self._check_sendable()
            body = messages.approval_body(rid, action, details)
            self._log_rows(
                [self._prepare("approval_request", body)],
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
        """
        self._bind_loop()
        target = self._cursor.high_water if seq is None else seq
        return await self._wait_for(
            lambda: self._cursor.acked >= self._cursor.translate(target), timeout_ms
        )

    async def _wait_for(self, condition: Callable[[], bool], timeout_ms: float | None) -> bool:
        deadline = None if timeout_ms is None else _now_ms() + timeout_ms
        while not condition():
            # FAILED or EXPIRED: the connection loop is over, no ack can come.
            if self._closed or self._sm.final:
                return False
            remaining = None if deadline is None else (deadline - _now_ms()) / 1000
            if remaining is not None and remaining <= 0:
                return False
            self._acked_changed.clear()
            try:
                # asyncio.timeout: on Python 3.11 wait_for can swallow a caller's cancel.
                async with asyncio.timeout(remaining):
                    await self._acked_changed.wait()
            except TimeoutError:
                return condition()
        return True

    def replay_unacked(self) -> int:
        """Rewind the writer to the cursor; return how many rows it will re-send.

        The rows above the received ack are written again (the engine drops
        duplicates by seq). Without a live stream nothing moves: the next
        dial replays from the cursor anyway.
        """
        self._check_loop()
        self._readahead.clear()
        count = self._cursor.rewind()
        self._wakeup.set()
        return count

    # -- handshake and the connection loop ----------------------------------------------

    async def handshake(
        self, connector_version: str, harness_name: str, harness_version: str
    ) -> None:
        """Store the handshake, start the connection loop, and wait for the engine's answer.

        Every dial sends ``authorization: Bearer <run_token>`` metadata and
        this handshake (seq 0); with ``engine_acks_handshake`` the engine's
        ``Ack(h)`` answer is awaited before any row is written. Sends made
        before this are delivered once connected.

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
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: the channel is closed")
        for name, value in (
            ("connector_version", connector_version),
            ("harness_name", harness_name),
            ("harness_version", harness_version),
        ):
            check_text(value, f"handshake.{name}")
        if self._failure is not None:
            raise self._failure
        if self._expired():
            self._expire()
            raise RunExpiredError(f"run {self._run_id}: past its hard_deadline")
        self._handshake_fields = (connector_version, harness_name, harness_version)
        self._log.update_meta(
            connector_version=connector_version,
            harness_name=harness_name,
            harness_version=harness_version,
        )
        self._start()
        if self._sm.state is ChannelState.STREAMING:
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
        if self._failure is not None:
            raise self._failure
        if self.state is ChannelState.EXPIRED:
            raise RunExpiredError(f"run {self._run_id}: past its hard_deadline")
        if self._closed:
            raise ChannelClosedError(f"run {self._run_id}: closed during the handshake")
        raise EngineUnavailableError(
            f"run {self._run_id}: no engine answered the handshake within "
            f"{self._config.connect_timeout_ms} ms (last error: {self._last_error}); "
            "still dialing"
        )

    def _start(self) -> None:
        if self._runner is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = self._config.hard_deadline
        if deadline is not None:
            delay = (deadline - datetime.now(UTC)).total_seconds()
            self._deadline_timer = loop.call_later(max(0.0, delay), self._expire)
        self._runner = loop.create_task(self._run(), name=f"walchannel-{self._run_id}")

    def _move(self, state: ChannelState) -> None:
        if self._sm.state is state:
            return
        self._sm.move(state)
        if state is ChannelState.STREAMING:
            self._up.set()
        else:
            self._up.clear()
        if self._sm.final:
            self._over.set()
            self._wakeup.set()
            self._acked_changed.set()

    def _expire(self) -> None:
        if self._sm.final:
            return
        logger.error("run %s: hard_deadline passed; the channel stops", self._run_id)
        self._set_error("hard_deadline passed")
        self._move(ChannelState.EXPIRED)
        if self._stream is not None:
            self._stream.finish(_StreamEnded("hard_deadline passed"))

    def _fail(self, error: WalchannelError, *, mark_failed: bool = False) -> None:
        logger.error("%s", error)
        self._failure = error
        reason = None
        if isinstance(error, EngineBehindError):
            reason = FAILED_ENGINE_BEHIND
        elif mark_failed:
            reason = FAILED_DONE_REFUSED
        self._set_error(str(error), failed=reason)
        if not self._sm.final:
            self._move(ChannelState.FAILED)

    def _set_error(self, message: str, *, failed: str | None = None) -> None:
        text = redact_secret(message, self._config.run_token)
        self._last_error = text
        if not self._log.writable:
            return
        fields: dict[str, Any] = {"last_error": text, "last_error_at": time.time()}
        if failed is not None:
            fields["failed_at"] = time.time()
            fields["failed_reason"] = failed
        try:
            self._log.update_meta(**fields)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the last error: %s", self._run_id, exc)

    async def _run(self) -> None:
        try:
            first = True
            while not self._sm.final and not self._closing:
                if not first and self._config.http_addr is not None:
                    await self._rediscover()
                    if self._closing or self._sm.final:
                        break
                first = False
                self._move(ChannelState.CONNECTING)
                await self._stream_once(self._addr)
                if self._closing or self._sm.final:
                    break
                self._move(ChannelState.BACKOFF)
                delay = self._reconnect.next_delay_ms(
                    _now_ms(), lambda attempt: self._config.backoff.delay_ms(attempt, self._rng)
                )
                logger.info(
                    "run %s: reconnecting in %.0f ms (attempt %d)",
                    self._run_id,
                    delay,
                    self._reconnect.attempt,
                )
                await self._sleep(delay / 1000)
        except Exception as exc:
            # A bug, not a network condition: fail loudly rather than spin.
            logger.exception("run %s: the connection loop failed", self._run_id)
            self._fail(WalchannelError(f"run {self._run_id}: connection loop failed: {exc!r}"))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._over.wait(), seconds)

    async def _rediscover(self) -> None:
        http_addr = self._config.http_addr
        assert http_addr is not None
        if self._http is None:
            self._http, proxy = discovery_client(
                http_addr, proxy_from_env=self._config.proxy_from_env
            )
            self._http_via = f" via proxy {proxy.shown}" if proxy is not None else ""
            self._own_http = True
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            addr = await asyncio.wait_for(
                discover(
                    self._http,
                    http_addr,
                    allowed_hosts=self._config.allowed,
                    timeout_s=timeout_s,
                ),
                timeout_s,
            )
        except DiscoveryError as exc:
            why = redact_secret(str(exc), self._config.run_token)
            logger.warning(
                "run %s: discovery failed%s, keeping %s: %s",
                self._run_id,
                self._http_via,
                self._addr,
                why,
            )
            self._set_error(f"discovery{self._http_via}: {why}")
            return
        except TimeoutError:
            logger.warning(
                "run %s: discovery timed out%s, keeping %s",
                self._run_id,
                self._http_via,
                self._addr,
            )
            self._set_error(
                f"discovery{self._http_via}: no answer from {http_addr} within {timeout_s:.1f} s"
            )
            return
        if addr != self._addr:
            logger.info(
                "run %s: discovery moved the engine from %s to %s", self._run_id, self._addr, addr
            )
            self._addr = addr

    def _stream_proxy(self, addr: str) -> Proxy | None:
        """The proxy a dial to ``addr`` goes through (config ``proxy_from_env``), logged once."""
        proxy = None
        if self._config.proxy_from_env:
            proxy = proxy_for(parse_host_port(addr, what="engine address")[0], "grpc")
        if proxy is not None and proxy.scheme != "http":
            if not self._proxy_scheme_warned:
                self._proxy_scheme_warned = True
                logger.warning(
                    "run %s: %s names a %s:// proxy (%s); gRPC can only tunnel through an "
                    "http:// proxy: dialling %s directly",
                    self._run_id,
                    proxy.source,
                    proxy.scheme,
                    proxy.shown,
                    addr,
                )
            proxy = None
        route = (addr, None if proxy is None else f"{proxy.shown} (from {proxy.source})")
        if route != self._route:
            if route[1] is not None:
                logger.info("run %s: dialling %s via proxy %s", self._run_id, addr, route[1])
            elif self._route is not None and self._route[1] is not None:
                logger.info("run %s: dialling %s directly (no proxy applies)", self._run_id, addr)
            self._route = route
        return proxy

    def _channel_options(self, proxy: Proxy | None = None) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", self._keepalive_ms),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Replay is ours: gRPC's transparent retries would reorder nothing
            # useful and hide drops.
            ("grpc.enable_retries", 0),
            # No send cap: max_message_bytes judges new sends (_prepare); a row
            # already logged (under a larger max_message_bytes) is the engine's
            # to accept or refuse, and a refusal is handled (_on_size_refusal).
            # A cap here would refuse such a row on every stream, forever.
            ("grpc.max_send_message_length", -1),
        ]
        if self._config.tls_server_name is not None:
            options.append(("grpc.ssl_target_name_override", self._config.tls_server_name))
        # The proxy is decided here (_stream_proxy), never by gRPC's own
        # reading of the environment, so the one logged is the one used.
        if proxy is not None:
            options += [("grpc.enable_http_proxy", 1), ("grpc.http_proxy", proxy.url)]
        else:
            options.append(("grpc.enable_http_proxy", 0))
        return options

    async def _stream_once(self, addr: str) -> None:
        """Dial ``addr``, handshake, stream until the stream ends; never raises for I/O."""
        loop = asyncio.get_running_loop()
        creds = self._config.credentials
        proxy = self._stream_proxy(addr)
        options = self._channel_options(proxy)
        if creds is None:
            channel = grpc.aio.insecure_channel(addr, options=options)
        else:
            channel = grpc.aio.secure_channel(addr, creds, options=options)
        call = channel.stream_stream(
            METHOD, request_serializer=_identity, response_deserializer=pb.DownMessage.FromString
        )(metadata=self._metadata)
        via = f" via proxy {proxy.shown}" if proxy is not None else ""
        stream = _Stream(addr, channel, call, loop, via)
        self._stream = stream
        stream.tasks.append(loop.create_task(self._read_loop(stream)))
        try:
            await self._open(stream)
            if stream.ended.is_set() or self._sm.final:
                return
            await stream.ended.wait()
        except asyncio.CancelledError:
            raise
        finally:
            await self._read_final_status(stream)
            self._cursor.end_stream()
            self._readahead.clear()
            await self._teardown(stream)
            self._stream = None
            if not self._closing:
                self._record_end(stream)

    async def _read_final_status(self, stream: _Stream) -> None:
        """Keep the call's final status when the server ended it (not a write's error)."""
        call = stream.call
        if call is None or not call.done():
            return
        with contextlib.suppress(Exception):
            code = await call.code()
            stream.status = (code.name, await call.details() or "")

    async def _open(self, stream: _Stream) -> None:
        """Send the handshake, take the answer, start writing. Ends ``stream`` on failure."""
        fields = self._handshake_fields or ("", "", "")
        hello = wire.handshake_message(
            self._run_id, self._config.correlation_id, *fields
        ).SerializeToString()
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await stream.call.write(hello)
                if self._config.engine_acks_handshake:
                    engine_high = await stream.answer
                else:
                    engine_high = None
        except TimeoutError:
            stream.finish(
                _StreamEnded(f"no handshake answer from {stream.addr} within {timeout_s:.1f} s")
            )
            return
        except Exception as exc:
            stream.finish(exc)
            return
        if stream.ended.is_set():
            return
        if engine_high is None:
            replay_from = self._cursor.acked + 1
        else:
            replay_from_or_none = self._take_answer(engine_high)
            if replay_from_or_none is None:
                stream.finish(_StreamEnded("handshake answer refused"))
                return
            replay_from = replay_from_or_none
            if self._sm.final:
                # The answer acked the rows before a refused Done: stopped (_check_held).
                stream.finish(_StreamEnded("the channel stopped"))
                return
        self._streams_up += 1
        if self._streams_up > 1:
            self._reconnects += 1
        self._move(ChannelState.STREAMING)
        self._reconnect.on_stream_up(_now_ms())
        self._record_up(stream.addr)
        self._cursor.start_stream(replay_from)
        loop = asyncio.get_running_loop()
        stream.tasks.append(loop.create_task(self._write_loop(stream)))
        stream.tasks.append(loop.create_task(self._watchdog(stream)))

    def _take_answer(self, engine_high: int) -> int | None:
        """Carry out the decision for the handshake answer; None ends the stream."""
        answer = self._cursor.on_answer(engine_high)
        kind = answer.kind
        if kind is not AnswerKind.BEHIND and self._failed_mark:
            self._failed_mark = False
            try:
                self._log.update_meta(failed_at=None, failed_reason=None)
            except WalchannelError as exc:
                logger.warning("run %s: cannot clear the failed mark: %s", self._run_id, exc)
        if kind is AnswerKind.BEHIND:
            self._fail(
                EngineBehindError(
                    f"run {self._run_id}: engine behind: its high-water {engine_high} is below "
                    f"the stored cursor {self._cursor.stored}; it lost rows this log already "
                    "deleted, which cannot be re-sent"
                )
            )
            return None
        if kind is AnswerKind.VERIFY:
            unverified = self._cursor.unverified_from
            try:
                shift = self._log.verify(engine_high)
            except WalWriteError as exc:
                self._set_error(str(exc))
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
                self._tail.clear()
                self._tail_bytes = 0
            self._cursor.on_verified(engine_high, shift)
            self._maybe_checkpoint()  # the verifying ack deleted rows too
            self._after_ack()
            return engine_high + 1
        if kind is AnswerKind.AHEAD:
            self._protocol_error(
                f"handshake answer Ack({engine_high}) is above the high-water "
                f"{self._cursor.high_water}; not applied"
            )
            return answer.replay_from
        if kind is AnswerKind.FORGOT:
            logger.warning(
                "run %s: the engine answered Ack(%d) below acks it gave (%d); re-sending from %d",
                self._run_id,
                engine_high,
                self._cursor.acked,
                engine_high + 1,
            )
            self._cursor.on_forgot(engine_high)
            return answer.replay_from
        self._on_ack(engine_high)
        return answer.replay_from

    def _record_up(self, addr: str) -> None:
        logger.info("run %s: streaming to %s", self._run_id, addr)
        try:
            self._log.update_meta(last_engine_addr=addr, reconnects=self._reconnects)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the engine address: %s", self._run_id, exc)

    def _record_end(self, stream: _Stream) -> None:
        reason = stream.reason
        code: str | None = None
        details = ""
        debug = ""
        if isinstance(reason, grpc.aio.AioRpcError):
            code = reason.code().name
            details = reason.details() or ""
            debug = reason.debug_error_string() or ""
        elif isinstance(reason, _StreamEnded):
            code, details = reason.code, reason.details
        if code is None and stream.status is not None and stream.status[0] != "OK":
            code, details = stream.status
        text = describe_end(code, details) if code else str(reason or "stream ended")
        # The engine's text may echo the token (SPEC "Secrets").
        text = redact_secret(text, self._config.run_token)
        if is_too_many_pings(f"{details} {debug}"):
            self._double_keepalive()
        if classify_end(code, details) is EndKind.RUN_COMPLETED:
            self._on_run_completed()
            return
        if self._sm.final:
            return
        logger.warning(
            "run %s: stream to %s%s ended: %s", self._run_id, stream.addr, stream.via, text
        )
        refusal = parse_size_refusal(code, details)
        if refusal is not None:
            self._on_size_refusal(stream, refusal, text)
            return
        self._set_error(f"{stream.addr}{stream.via}: {text}")

    def _in_flight_sizes(self, top: int) -> Iterator[tuple[int, int]]:
        """``(seq, encoded size)`` of the unacked rows up to ``top``, in seq order, lazily."""
        for row in self._log.unacked(after_seq=self._cursor.acked):
            if row.seq > top:
                return
            msg = wire.up_message(
                self._run_id, self._config.correlation_id, row.seq, row.kind, row.body
            )
            yield row.seq, msg.ByteSize()

    def _on_size_refusal(self, stream: _Stream, refusal: SizeRefusal, text: str) -> None:
        """The engine refused a message for its size: find the row, set it aside or stop.

        The decision rules are :func:`~walchannel.protocol.pick_refused_row`
        (only a row proven refused) and
        :func:`~walchannel.protocol.refusal_sets_aside`. docs/design.md.
        """
        addr = stream.addr
        self._warn_engine_limit(addr, refusal.limit)
        try:
            verdict = pick_refused_row(self._in_flight_sizes(stream.top_written), refusal)
        except WalchannelError as exc:
            logger.error(
                "run %s: cannot read the log to find the refused row: %s", self._run_id, exc
            )
            self._set_error(f"{addr}: {text}")
            return
        if verdict.seq is None:
            fields = self._handshake_fields or ("", "", "")
            hello = wire.handshake_message(self._run_id, self._config.correlation_id, *fields)
            if verdict.suspect is None and hello.ByteSize() == refusal.received:
                why = (
                    "it is the handshake: shorten connector_version, harness_name or "
                    "harness_version"
                )
            elif verdict.suspect is None:
                why = (
                    "no row written on the stream is over the engine's limit of "
                    f"{refusal.limit} bytes"
                )
            else:
                why = (
                    f"the first row over the limit, seq {verdict.suspect} "
                    f"({verdict.suspect_size} bytes), is not the refused "
                    f"{refusal.received}-byte message"
                )
            logger.error(
                "run %s: the engine at %s refused a %d-byte message (its limit: %d bytes), but %s: "
                "nothing is set aside; the stream will be retried",
                self._run_id,
                addr,
                refusal.received,
                refusal.limit,
                why,
            )
            self._set_error(f"{addr}: {text} ({why}; nothing set aside)")
            return
        seq = verdict.seq
        size = refusal.received
        row = next(self._log.unacked(after_seq=seq - 1, limit=1))
        kind = row.kind
        what = (
            f"seq {seq} ({kind}, {size} bytes) was refused by the engine at {addr}: over its "
            f"limit of {refusal.limit} bytes"
        )
        if not refusal_sets_aside(kind):
            # The rows before it may not be applied yet (the engine drops what
            # it had read ahead): deliver them, then stop (_check_held).
            self._held = PayloadError(
                kind,
                f"run {self._run_id}: {what}; the channel stops, the row stays in "
                f"{self._log.path} (raise the engine's limit, then resume or flush)",
            )
            self._cursor.hold_at = seq
            self._reconnect.on_set_aside()
            logger.error(
                "run %s: %s; it is not written again, and the channel stops once the rows "
                "before it are acked",
                self._run_id,
                what,
            )
            self._set_error(f"{what}; the channel stops once the rows before it are acked")
            self._check_held()
            return
        reason = (
            f"refused by the engine at {addr} for its size: {size} bytes, over its limit "
            f"of {refusal.limit} bytes"
        )
        try:
            self._log.set_aside(seq, reason, kind=kind, size=size, limit=refusal.limit)
        except (WalchannelError, ValueError) as exc:
            logger.error("run %s: %s, but it cannot be set aside: %s", self._run_id, what, exc)
            self._set_error(f"{what}; cannot set it aside: {exc}")
            return
        # The tail and readahead may hold the original: read the substitute from disk.
        self._tail.clear()
        self._tail_bytes = 0
        self._readahead.clear()
        self._reconnect.on_set_aside()
        logger.error(
            "run %s: %s; set aside into the quarantine of %s and replaced by a %s event at "
            "seq %d so later rows flow (recover it: walchannel export --quarantined)",
            self._run_id,
            what,
            self._log.path,
            ROW_LOST_TYPE,
            seq,
        )
        self._set_error(f"{what}; set aside into the quarantine, sent as {ROW_LOST_TYPE}")
        if kind == "approval_request":
            rid = str(row.body.get("request_id", ""))
            future = self._approvals.pop(rid, None)
            if future is not None and not future.done():
                future.set_exception(
                    PayloadError(
                        kind,
                        f"run {self._run_id}: approval request {rid!r} at {what}; set aside, "
                        "the engine will never decide it",
                    )
                )
                future.exception()

    def _check_held(self) -> None:
        """Stop with the held error once every row before a refused ``Done`` is acked."""
        hold_at = self._cursor.hold_at
        if self._held is None or hold_at is None or self._cursor.acked < hold_at - 1:
            return
        error, self._held = self._held, None
        self._fail(error, mark_failed=True)
        if self._stream is not None:
            self._stream.finish(_StreamEnded(str(error)))

    def _warn_engine_limit(self, addr: str, limit: int) -> None:
        """Say once per engine and limit that the engine takes less than ``max_message_bytes``."""
        if (addr, limit) in self._limits_warned or limit >= self._config.max_message_bytes:
            return
        self._limits_warned.add((addr, limit))
        logger.warning(
            "run %s: the engine at %s accepts up-messages of at most %d bytes, less than this "
            "channel's max_message_bytes %d: a larger row is refused by it and set aside; set "
            "max_message_bytes=%d to refuse such rows at send time instead",
            self._run_id,
            addr,
            limit,
            self._config.max_message_bytes,
            limit,
        )

    def _on_run_completed(self) -> None:
        """The engine answered FAILED_PRECONDITION "run completed": the loop ends."""
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        if self._log.done_seq is not None and self._log.writable:
            # Our Done was applied but its ack was lost: the run ended well.
            # Without this the log would hold its rows forever (found by tools/sim.py).
            try:
                self._log.complete_by_engine()
            except WalchannelError as exc:
                logger.error("run %s: cannot mark the log completed: %s", self._run_id, exc)
            else:
                logger.info(
                    "run %s: the engine applied this run's Done; the log is now a tombstone",
                    self._run_id,
                )
                self._acked_changed.set()
                self._failure = error
                if not self._sm.final:
                    self._move(ChannelState.FAILED)
                return
        self._fail(error)
        if self._log.writable and self._log.unacked_count:
            # Rows this log still holds cannot be delivered any more: flag the
            # run for an operator (inspect shows it as failed, export saves them).
            with contextlib.suppress(WalchannelError):
                self._log.update_meta(
                    failed_at=time.time(), failed_reason=FAILED_UNDELIVERABLE
                )

    def _double_keepalive(self) -> None:
        doubled = min(self._keepalive_ms * 2, MAX_KEEPALIVE_MS)
        if not self._pings_warned:
            self._pings_warned = True
            logger.warning(
                "run %s: the engine sent GOAWAY too_many_pings; keepalive %d -> %d ms for "
                "the rest of the run",
                self._run_id,
                self._keepalive_ms,
                doubled,
            )
        self._keepalive_ms = doubled

    async def _teardown(self, stream: _Stream) -> None:
        # Cancel the call first: a write() parked on a dead transport only
        # returns once the call is gone, so its task could not be awaited.
        if stream.call is not None:
            stream.call.cancel()
        for task in stream.tasks:
            task.cancel()
        try:
            if stream.tasks:
                _, pending = await asyncio.wait(stream.tasks, timeout=TEARDOWN_TIMEOUT_S)
                if pending:
                    logger.warning(
                        "run %s: %d task(s) of the stream to %s did not stop within %.0f s",
                        self._run_id,
                        len(pending),
                        stream.addr,
                        TEARDOWN_TIMEOUT_S,
                    )
        finally:
            # Even when cancelled: the gRPC channel (its socket) must go. The
            # socket closes when the last reference to the channel does.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(stream.channel.close(grace=None), TEARDOWN_TIMEOUT_S)
            stream.release()

    # -- the stream's tasks ------------------------------------------------------------

    async def _read_loop(self, stream: _Stream) -> None:
        call = stream.call
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    code = await call.code()
                    details = await call.details() or ""
                    if code is grpc.StatusCode.OK:
                        stream.finish(_StreamEnded("the engine ended the stream (status OK)"))
                    else:
                        stream.finish(_StreamEnded(f"{code.name}: {details}", code.name, details))
                    return
                stream.last_down_ms = _now_ms()
                stream.heartbeats_since_down = 0
                self._on_down(stream, msg)
        except asyncio.CancelledError:
            stream.finish(_StreamEnded("cancelled"))
            raise
        except grpc.aio.AioRpcError as exc:
            stream.finish(exc)
        except Exception as exc:
            logger.exception("run %s: reading the stream failed", self._run_id)
            stream.finish(exc)

    def _on_down(self, stream: _Stream, msg: pb.DownMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "ack":
            if not stream.answer.done() and self._config.engine_acks_handshake:
                stream.answer.set_result(int(msg.ack.seq))
                return
            self._on_ack(int(msg.ack.seq))
        elif kind == "stop":
            self._on_stop(msg.stop.reason)
        elif kind == "approval_decision":
            d = msg.approval_decision
            self._on_decision(ApprovalDecision(d.request_id, d.approved, d.reason))
        elif kind == "budget_update":
            details = wire.struct_to_dict(msg.budget_update.details)
            for callback in list(self._budget_callbacks):
                self._call_back(callback, msg.budget_update.message, details)
        else:
            logger.warning("run %s: ignoring a down message with an unknown body", self._run_id)

    def _protocol_error(self, message: str) -> None:
        self._protocol_errors += 1
        logger.error("run %s: protocol error: %s", self._run_id, message)
        self._last_error = f"protocol error: {message}"

    def _on_ack(self, seq: int) -> None:
        kind = self._cursor.on_ack(seq, _now_ms())
        if kind is AckKind.ABOVE_HIGH_WATER:
            self._protocol_error(
                f"Ack({seq}) is above the high-water {self._cursor.high_water}; not applied"
            )
            return
        self._reconnect.on_ack(seq)
        if kind is AckKind.ADVANCE:
            _killpoints.reached("after_ack_received")
            self._after_ack()

    def _after_ack(self) -> None:
        acked = self._cursor.acked
        tail = self._tail
        while tail and tail[0][0] <= acked:
            self._tail_bytes -= len(tail.popleft()[2]) + TAIL_ROW_OVERHEAD
        self._store_ack()
        self._acked_changed.set()
        self._check_held()

    def _store_ack(self, *, force: bool = False) -> None:
        seq = self._cursor.ack_to_store(_now_ms(), force=force)
        if seq is None:
            if self._cursor.pending_since_ms is not None and self._ack_timer is None:
                with contextlib.suppress(RuntimeError):
                    self._ack_timer = asyncio.get_running_loop().call_later(
                        ACK_STORE_AFTER_MS / 1000, self._ack_timer_fired
                    )
            return
        if not self._log.writable:
            return
        try:
            self._log.ack(seq)
        except WalchannelError as exc:
            # Not stored: the rows stay and are re-sent after a crash (harmless).
            logger.error("run %s: cannot store ack %d: %s", self._run_id, seq, exc)
            self._last_error = str(exc)
            return
        self._cursor.on_stored(seq)
        if self._cursor.completed:
            logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)
            self._acked_changed.set()
        self._maybe_checkpoint()

    def _ack_timer_fired(self) -> None:
        self._ack_timer = None
        self._store_ack()

    def _maybe_checkpoint(self) -> None:
        """Rows were deleted: give their pages back once idle (SPEC "The log")."""
        now = _now_ms()
        self._last_stored_ms = now
        self._checkpoint_due = True
        self._checkpoint_delay_ms = CHECKPOINT_IDLE_MS
        if self._cursor.unacked == 0 and now - self._last_checkpoint_ms >= CHECKPOINT_EVERY_MS:
            self._checkpoint()
        else:
            self._arm_checkpoint(CHECKPOINT_IDLE_MS)

    def _arm_checkpoint(self, delay_ms: float) -> None:
        """Have the checkpoint timer fire in ``delay_ms`` at the latest."""
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        when = loop.time() + delay_ms / 1000
        timer = self._checkpoint_timer
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()  # a long retry wait; new acks bring it forward
        self._checkpoint_timer = loop.call_at(when, self._checkpoint_timer_fired)

    def _checkpoint_timer_fired(self) -> None:
        self._checkpoint_timer = None
        if not self._checkpoint_due or self._closed:
            return
        quiet_ms = _now_ms() - self._last_stored_ms
        if quiet_ms < CHECKPOINT_IDLE_MS:
            self._arm_checkpoint(CHECKPOINT_IDLE_MS - quiet_ms)  # acks still coming
            return
        self._checkpoint()

    def _checkpoint(self) -> None:
        self._last_checkpoint_ms = _now_ms()
        if not self._log.writable:
            return
        path = self._log.path
        before = _file_size(path)
        if self._log.checkpoint(max_pages=CHECKPOINT_STEP_PAGES):
            self._checkpoint_due = False
            self._checkpoint_delay_ms = CHECKPOINT_IDLE_MS
            return
        if _file_size(path) < before:
            # A step of a big reclaim: go on after letting the loop run.
            self._arm_checkpoint(0)
            return
        # A reader (inspect) held it off, or it failed: try again, less often.
        self._arm_checkpoint(self._checkpoint_delay_ms)
        self._checkpoint_delay_ms = min(2 * self._checkpoint_delay_ms, CHECKPOINT_RETRY_MAX_MS)

    def _on_stop(self, reason: str) -> None:
        if self._stop_fired:
            return
        self._stop_fired = True
        logger.info(
            "run %s: the engine sent Stop(%r)",
            self._run_id,
            redact_secret(reason, self._config.run_token),
        )
        for callback in list(self._stop_callbacks):
            self._call_back(callback, reason)

    def _on_decision(self, decision: ApprovalDecision) -> None:
        self._decisions[decision.request_id] = decision
        future = self._approvals.pop(decision.request_id, None)
        if future is not None and not future.done():
            future.set_result(decision)
        elif future is None:
            logger.info(
                "run %s: decision for approval request %r that this channel is not "
                "waiting on; cached",
                self._run_id,
                decision.request_id,
            )

    def _row_bytes(self, seq: int) -> bytes:
        """The encoded ``UpMessage`` of row ``seq``: from the tail, else from disk."""
        tail = self._tail
        if tail and tail[0][0] <= seq <= tail[-1][0]:
            _, kind, blob = tail[seq - tail[0][0]]
            body = msgpack.unpackb(blob, raw=False)
        else:
            ahead = self._readahead
            while ahead and ahead[0][0] < seq:
                ahead.popleft()
            if not ahead or ahead[0][0] != seq:
                ahead.clear()
                budget = TAIL_BYTES
                for row in self._log.unacked(after_seq=seq - 1, limit=READAHEAD_ROWS):
                    ahead.append((row.seq, row.kind, row.body))
                    budget -= row.size
                    if budget <= 0 or (tail and row.seq + 1 >= tail[0][0]):
                        break
            if not ahead or ahead[0][0] != seq:
                raise _StreamEnded(f"row seq {seq} is not in the log")
            _, kind, body = ahead.popleft()
        msg = wire.up_message(self._run_id, self._config.correlation_id, seq, kind, body)
        return msg.SerializeToString()

    async def _write_loop(self, stream: _Stream) -> None:
        call = stream.call
        cursor = self._cursor
        keepalive_s = self._keepalive_ms / 1000
        next_beat = time.monotonic() + keepalive_s
        stream.next_beat_ms = next_beat * 1000
        try:
            while True:
                seq = cursor.next_to_write()
                if seq is None:
                    self._wakeup.clear()
                    if cursor.next_to_write() is None and not self._sm.final:
                        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows
                        # a cancel that lands as the event fires, and the writer would
                        # outlive its stream's teardown by up to a keepalive period.
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(max(0.0, next_beat - time.monotonic())):
                                await self._wakeup.wait()
                    if self._sm.final:
                        return
                elif self._replica_socket is not None and seq > self._replicated_through:
                    await self._replicate()
                else:
                    data = self._row_bytes(seq)
                    replay = seq <= self._max_written
                    if replay:
                        _killpoints.reached("in_replay")
                    stream.write_since_ms = _now_ms()
                    stream.top_written = max(stream.top_written, seq)
                    await call.write(data)
                    stream.write_since_ms = None
                    cursor.on_written(seq)
                    self._reconnect.on_written(seq)
                    self._sent += 1
                    if replay:
                        self._replayed += 1
                    else:
                        self._max_written = seq
                    _killpoints.reached("after_write")
                if time.monotonic() >= next_beat:
                    stream.heartbeats_since_down += 1
                    beat = wire.heartbeat_message(
                        self._run_id, self._config.correlation_id, messages.now_rfc3339()
                    )
                    stream.write_since_ms = _now_ms()
                    await call.write(beat.SerializeToString())
                    stream.write_since_ms = None
                    next_beat = time.monotonic() + keepalive_s
                    stream.next_beat_ms = next_beat * 1000
        except asyncio.CancelledError:
            raise
        except (
            grpc.aio.AioRpcError,
            grpc.aio.UsageError,
            asyncio.InvalidStateError,
            _StreamEnded,
        ) as exc:
            stream.finish(exc)
        except WalCorruptError as exc:
            # Re-dialing cannot mend the file: stop, loudly, keeping the rows.
            stream.finish(exc)
            self._fail(exc)
        except WalchannelError as exc:
            logger.error("run %s: cannot read the log to write: %s", self._run_id, exc)
            stream.finish(exc)
        except Exception as exc:
            logger.exception("run %s: writing the stream failed", self._run_id)
            stream.finish(exc)

    async def _replicate(self) -> None:
        """Wait until Litestream's replica holds every row committed so far (one attempt).

        ``durability="replicated"``: POST ``/sync`` with ``wait`` on
        Litestream's control socket; when it answers 200 the replica holds
        every commit made before the call (rows and progress marker). On a
        failure the rows stay unsent (never dropped): it logs, records the
        error and pauses before the writer's next try.
        """
        assert self._replica_socket is not None
        target = self._log.next_seq - 1
        if self._replica is None:
            self._replica = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self._replica_socket),
                timeout=REPLICA_SYNC_TIMEOUT_S + 5,
                trust_env=False,
            )
        try:
            answer = await self._replica.post(
                "http://litestream/sync",
                json={
                    "path": str(self._log.path.resolve()),
                    "wait": True,
                    "timeout": REPLICA_SYNC_TIMEOUT_S,
                },
            )
            if answer.status_code != 200:
                raise httpx.HTTPError(f"HTTP {answer.status_code}: {answer.text[:200]}")
        except httpx.HTTPError as exc:
            now = time.monotonic()
            if self._replica_failing_since is None:
                self._replica_failing_since = now
            # A new log is picked up by Litestream within about a second: be quiet first.
            if now - self._replica_failing_since >= REPLICA_QUIET_S:
                message = f"Litestream does not confirm the replica of new rows: {exc}"
                if self._last_error != message:
                    logger.warning(
                        "run %s: %s; rows from seq %d wait, unsent",
                        self._run_id,
                        message,
                        self._replicated_through + 1,
                    )
                self._last_error = message
            await asyncio.sleep(REPLICA_RETRY_S)
            return
        self._replica_failing_since = None
        self._replicated_through = max(self._replicated_through, target)

    async def _watchdog(self, stream: _Stream) -> None:
        """End ``stream`` when it is dead: the ``dead_stream_ms`` rule and stalled writes.

        ``dead_stream_ms``: no down message for that long while heartbeats go
        out. A heartbeat that is due while the writer is blocked in a write
        (flow control: a frozen engine, or a proxy that stopped reading)
        counts as going out: it is only stuck behind the blocked write.

        Stalled write (always on): a write blocked for ``keepalive_ms +
        10 s`` with no down message for as long. gRPC keepalive cannot catch
        this case: its ping queues behind the blocked bytes and its timeout
        only starts once the ping is written; a proxy answers pings itself.
        """
        dead_ms = self._config.dead_stream_ms
        while not stream.ended.is_set():
            keepalive_ms = self._keepalive_ms
            stall_ms = keepalive_ms + KEEPALIVE_TIMEOUT_MS
            period = max(0.05, min(dead_ms or stall_ms, keepalive_ms) / 4000)
            await asyncio.sleep(period)
            now = _now_ms()
            silent = now - stream.last_down_ms
            since = stream.write_since_ms
            blocked = 0.0 if since is None else now - since
            beat_overdue = since is not None and now >= stream.next_beat_ms
            if (
                dead_ms is not None
                and silent >= dead_ms
                and (stream.heartbeats_since_down > 0 or beat_overdue)
            ):
                logger.warning(
                    "run %s: no down message from %s for %.0f ms while heartbeats went out%s: "
                    "the stream is dead",
                    self._run_id,
                    stream.addr,
                    silent,
                    " (one is stuck behind a write blocked by flow control)"
                    if beat_overdue
                    else "",
                )
                stream.finish(_StreamEnded(f"dead stream: no down message for {silent:.0f} ms"))
                return
            if blocked >= stall_ms and silent >= stall_ms:
                logger.warning(
                    "run %s: a write to %s has been blocked for %.0f ms with no down message: "
                    "the stream is dead",
                    self._run_id,
                    stream.addr,
                    blocked,
                )
                stream.finish(
                    _StreamEnded(
                        f"stalled stream: a write blocked for {blocked:.0f} ms, "
                        f"no down message for {silent:.0f} ms"
                    )
                )
                return

    # -- closing --------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the channel: half-close, wait up to ``close_timeout_ms``, tear down.

        Marks the channel closed first (so the teardown is not mistaken for
        a drop), half-closes the stream, waits up to ``close_timeout_ms`` for
        its end, then stops every task and closes the gRPC channel, stores
        the latest ack, and closes the log. Idempotent; never hangs; unacked
        rows stay on disk for a resume or ``flush``. Pending approvals fail
        with ``ChannelClosedError``. The log is closed (its lock released)
        whatever happens on the way.

        On another event loop than the channel's: if that one is closed or
        stopped (an earlier ``asyncio.run()`` ended), the channel is closed
        without it, nothing of it awaited (the socket closes with the gRPC
        channel object); if it runs in another thread, the close runs there.
        SPEC "Shutdown order".
        """
        if self._closed:
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
            await self._close()
        finally:
            self._log.close()

    async def _close(self) -> None:
        self._closed = True
        self._closing = True
        _killpoints.reached("in_close")
        for timer in (self._deadline_timer, self._ack_timer, self._checkpoint_timer):
            if timer is not None:
                timer.cancel()
        self._ack_timer = None
        self._checkpoint_timer = None
        budget_s = self._config.close_timeout_ms / 1000
        stream = self._stream
        if stream is not None and not stream.ended.is_set():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._half_close(stream), budget_s)
            stream.finish(_StreamEnded("closed"))
        # Wake the loop (backoff sleeps and handshake waits watch _over) and
        # let it tear its stream down itself; cancel it only if it lingers.
        self._over.set()
        if self._runner is not None:
            done, _ = await asyncio.wait({self._runner}, timeout=2 * TEARDOWN_TIMEOUT_S + 1)
            if not done:
                self._runner.cancel()
                await asyncio.wait({self._runner}, timeout=TEARDOWN_TIMEOUT_S)
        if self._stream is not None:
            with contextlib.suppress(BaseException):
                await self._teardown(self._stream)
        self._store_ack(force=True)
        self._move(ChannelState.CLOSED)
        for rid, future in list(self._approvals.items()):
            if not future.done():
                future.set_exception(
                    ChannelClosedError(f"run {self._run_id}: closed before approval {rid!r}")
                )
                future.exception()
        self._approvals.clear()
        self._acked_changed.set()
        if self._own_http and self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.aclose()
        if self._metrics is not None:
            self._metrics.close()
        if self._replica is not None:
            with contextlib.suppress(Exception):
                await self._replica.aclose()

    async def _half_close(self, stream: _Stream) -> None:
        # close() is not a flush (send_done is the ordered shutdown): stop the
        # writer, half-close, and wait for the engine to end the stream.
        writers = stream.tasks[1:]
        for task in writers:
            task.cancel()
        if writers:
            await asyncio.wait(writers, timeout=TEARDOWN_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await stream.call.done_writing()
        await stream.ended.wait()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
