"""What every part of :class:`~walchannel.channel.GrpcEngineChannel` shares.

The channel is one object built from parts, each in its own module:
sending (:mod:`~walchannel.channel.sending`), received acks and disk
(:mod:`~walchannel.channel.acks`), the stream driver
(:mod:`~walchannel.channel.stream`, with :mod:`~walchannel.channel.dial` and
:mod:`~walchannel.channel.replica`), and the public class in
:mod:`walchannel.channel`. This base holds their shared state (built by the
constructor: the log, the cursor, the state machine, events, counters) and the
small helpers all of them use: the event-loop binding, state moves, errors.
A part that calls a method another part defines finds it declared here.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import logging
import math
import os
import random
import time
from typing import TYPE_CHECKING, Any, Final

from walchannel.config import GrpcChannelConfig, redact_secret
from walchannel.errors import (
    ChannelClosedError,
    EngineBehindError,
    PayloadError,
    RunCompletedError,
    WalchannelError,
)
from walchannel.interface import ApprovalDecision, BudgetCallback, StopCallback
from walchannel.log import RunLog
from walchannel.log_format import FAILED_DONE_REFUSED, FAILED_ENGINE_BEHIND
from walchannel.protocol import ChannelState, Cursor, ReconnectPolicy, SizeRefusal, StateMachine
from walchannel.replication import SOCKET_ENV
from walchannel.row_source import RowSource
from walchannel.session import CheckpointPolicy, DownLatch, WriteCounter

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from walchannel.channel.stream import Stream
    from walchannel.metrics import ChannelMetrics

__all__ = ["ChannelBase", "now_ms", "warn_grpc_trace"]

logger = logging.getLogger(__name__)

_trace_warned = False


def now_ms() -> float:
    """The monotonic clock in ms: the times the decision layer takes (any origin)."""
    return time.monotonic() * 1000.0


#: gRPC tracers that print call metadata, the bearer token included: found by
#: running a channel and a local engine under each tracer grpcio 1.85 lists
#: (``GRPC_TRACE=list_tracers``) and searching the output for the token.
TOKEN_TRACERS: Final = ("api", "chttp2_hpack_parser")


def token_tracers(grpc_trace: str) -> list[str]:
    """Return which of :data:`TOKEN_TRACERS` a ``GRPC_TRACE`` value enables.

    As gRPC reads it: comma-separated names, case-sensitive, ``all``, glob
    patterns (``*``, ``?``), and ``-name`` disabling, applied in order.
    """
    enabled: set[str] = set()
    for item in (part.strip() for part in grpc_trace.split(",")):
        pattern = item.removeprefix("-")
        named = {t for t in TOKEN_TRACERS if pattern == "all" or fnmatch.fnmatchcase(t, pattern)}
        if item.startswith("-"):
            enabled -= named
        else:
            enabled |= named
    return sorted(enabled)


def warn_grpc_trace() -> None:
    """Warn once per process when ``GRPC_TRACE`` enables tracers that print the token.

    SPEC "Secrets": gRPC's :data:`TOKEN_TRACERS` print call metadata from C
    code, outside this library's reach, so it is said once.
    """
    global _trace_warned
    if _trace_warned:
        return
    spec = os.environ.get("GRPC_TRACE", "")
    leaky = token_tracers(spec)
    if leaky:
        _trace_warned = True
        logger.warning(
            "GRPC_TRACE=%s enables gRPC's %s tracer(s), which print call metadata, "
            "including the run token, from C code that walchannel cannot filter; do not "
            "enable them in production",
            spec,
            "/".join(leaky),
        )


class ChannelBase:
    """The shared state and helpers of the channel's parts (not used alone)."""

    def __init__(
        self,
        config: GrpcChannelConfig,
        *,
        rng: random.Random | None = None,
        log: RunLog | None = None,
    ) -> None:
        """Open (or take) the run's log and set up the channel's state; no network.

        Args and Raises: see :class:`~walchannel.channel.GrpcEngineChannel`.
        """
        if not isinstance(config, GrpcChannelConfig):
            raise TypeError("config must be a GrpcChannelConfig")
        warn_grpc_trace()
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
        # A payload with more values can never travel: each takes >= 2 bytes as a Struct.
        self._max_values = config.max_message_bytes // 2
        # Where the writer's rows come from: the tail of committed rows, then disk.
        self._rows = RowSource(
            self._log, config.run_id, config.correlation_id, config.max_message_bytes
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
        # Stop fires once; decisions are kept by request id (session.DownLatch).
        self._down: DownLatch[ApprovalDecision] = DownLatch()
        self._approvals: dict[str, asyncio.Future[ApprovalDecision]] = {}
        # sent, replayed, reconnects (stats()) and which write is a replay.
        self._writes = WriteCounter()
        self._protocol_errors = 0
        self._last_error: str | None = None
        # The gRPC status code of the last stream end (names the handshake failure).
        self._last_end_code: str | None = None
        # The text of the last stream end, while no stream came up since.
        self._repeated_end: str | None = None
        self._limits_warned: set[tuple[str, int]] = set()
        # The error to stop with once the rows before a refused Done are acked.
        self._held: PayloadError | None = None
        # When to checkpoint the log and give its freed pages back.
        self._checkpoints = CheckpointPolicy(now_ms())
        # The event loop of the first await; the tasks, events, timers and the
        # gRPC channel all live on it (see _bind_loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        # OpenTelemetry hooks: None when metrics are off or opentelemetry is absent
        # (attached by GrpcEngineChannel once the channel is built).
        self._metrics: ChannelMetrics | None = None

    def _call_back(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            logger.exception("run %s: callback %r raised; ignored", self._run_id, callback)

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

    def _protocol_error(self, message: str) -> None:
        """The engine broke the protocol: count it, log it, never apply it (SPEC "Acks")."""
        self._protocol_errors += 1
        logger.error("run %s: protocol error: %s", self._run_id, message)
        self._last_error = f"protocol error: {message}"

    # -- defined by the other parts (declared here for the parts that call them) --

    def _expire(self) -> None:  # walchannel.channel.stream
        raise NotImplementedError

    def _abandon(self) -> None:  # walchannel.channel
        raise NotImplementedError

    def _store_ack(  # walchannel.channel.acks
        self, *, force: bool = False, now: float | None = None
    ) -> None:
        raise NotImplementedError

    def _on_ack(self, seq: int, now: float | None = None) -> None:  # walchannel.channel.acks
        raise NotImplementedError

    def _after_ack(self, now: float | None = None) -> None:  # walchannel.channel.acks
        raise NotImplementedError

    def _maybe_checkpoint(self) -> None:  # walchannel.channel.acks
        raise NotImplementedError

    def _check_held(self) -> None:  # walchannel.channel
        raise NotImplementedError

    def _take_answer(self, engine_high: int | None) -> int | None:  # walchannel.channel
        raise NotImplementedError

    def _on_stop(self, reason: str) -> None:  # walchannel.channel
        raise NotImplementedError

    def _on_decision(self, decision: ApprovalDecision) -> None:  # walchannel.channel
        raise NotImplementedError

    def _on_size_refusal(self, stream: Stream, refusal: SizeRefusal, text: str) -> None:
        raise NotImplementedError  # walchannel.channel
