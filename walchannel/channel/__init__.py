"""GrpcEngineChannel: the durable stream over ``grpc.aio`` (SPEC "The channel").

Buffer first: ``send_*`` validates, commits the row to the run's log and
only then hands it to the writer; it never waits on the network. The log is
the queue: the one writer task takes rows in seq order from a small
in-memory tail of committed rows, or from disk, so replay and live sends
never interleave and memory stays flat. The connection loop dials, sends
the handshake (seq 0), waits for the engine's ``Ack(h)``, applies the
verification rule, replays, and on any end of stream backs off, rediscovers
and dials again, until ``close()``, ``hard_deadline`` or a failure.

The channel is one class built from parts, one module each:

- :mod:`walchannel.channel.sending`: ``send_*``, approvals, ``wait_acked``;
- :mod:`walchannel.channel.acks`: received acks stored (coalesced), disk given back;
- :mod:`walchannel.channel.stream`: the connection loop, reader, writer, watchdog;
- :mod:`walchannel.channel.dial`: discovery, proxy and gRPC options of a dial;
- :mod:`walchannel.channel.replica`: the Litestream gate of ``durability="replicated"``;
- :mod:`walchannel.channel.base`: the state they share;
- this module: the public class, the handshake, what the engine's answer
  means for the run, a row the engine refuses for its size, ``close()``.

Rows come from :class:`walchannel.row_source.RowSource`. Decisions (seq,
cursor, replay position, verification, backoff reset, states) come from
:mod:`walchannel.protocol` and :mod:`walchannel.session` (the channel's
decision layer, no I/O: answers, ack storage, checkpoints, the watchdog's
rules, ends of stream, repeats); storage is :class:`~walchannel.log.RunLog`.
Everything runs on the event loop's thread; ``BlockingEngineChannel``
serves other threads. Every module logs under ``walchannel.channel``
(``walchannel.channel.stream`` and so on), so that logger covers them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Self

from walchannel import _killpoints, metrics, wire
from walchannel.channel.acks import AckKeeper
from walchannel.channel.base import warn_grpc_trace as _warn_grpc_trace
from walchannel.channel.sending import Sender
from walchannel.channel.stream import Stream, StreamDriver, StreamEnded
from walchannel.config import GrpcChannelConfig, redact_secret
from walchannel.errors import (
    ChannelClosedError,
    EngineBehindError,
    EngineUnavailableError,
    PayloadError,
    RunExpiredError,
    WalchannelError,
    WalWriteError,
)
from walchannel.interface import ApprovalDecision, BudgetCallback, ChannelStats, StopCallback
from walchannel.log import RunLog
from walchannel.log_format import ROW_LOST_TYPE
from walchannel.payload import check_text
from walchannel.protocol import (
    ACK_STORE_AFTER_MS,
    ChannelState,
    SizeRefusal,
    pick_refused_row,
    refusal_sets_aside,
)
from walchannel.row_source import STRUCT_GROWTH, TAIL_BYTES, TAIL_ROW_OVERHEAD
from walchannel.session import AnswerStep, held_done_reached, plan_answer, unproven_refusal

# Importable from here as before the split (tests and tools use them).
__all__ = [
    "ACK_STORE_AFTER_MS",
    "STRUCT_GROWTH",
    "TAIL_BYTES",
    "TAIL_ROW_OVERHEAD",
    "GrpcEngineChannel",
    "_warn_grpc_trace",
]

logger = logging.getLogger(__name__)


class GrpcEngineChannel(Sender, AckKeeper, StreamDriver):
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
        super().__init__(config, rng=rng, log=log)
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
            sent=self._writes.sent,
            acked=self._cursor.acked,
            replayed=self._writes.replayed,
            reconnects=self._writes.reconnects,
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
        waited = self._config.connect_timeout_ms
        if self._last_end_code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            raise EngineUnavailableError(
                f"run {self._run_id}: the engine refused this run's token for {waited} ms "
                f"(the last attempt: {self._last_error}); still dialing, in case a "
                "replacement engine accepts it"
            )
        raise EngineUnavailableError(
            f"run {self._run_id}: no engine answered the handshake within {waited} ms "
            f"(the last attempt: {self._last_error}); still dialing"
        )

    def _take_answer(self, engine_high: int | None) -> int | None:
        """Carry out the decision for the handshake answer ``Ack(h)``. SPEC "Dial".

        The decision is :func:`walchannel.session.plan_answer`; this does
        the I/O (the log's verification, meta, logging).

        Args:
            engine_high: ``h``; None without ``engine_acks_handshake``.

        Returns:
            The first seq to write on the stream, or None to end the stream.
        """
        plan = plan_answer(self._cursor, engine_high, failed_mark=self._failed_mark)
        step = plan.step
        if engine_high is None or step is AnswerStep.NO_ANSWER:
            return plan.replay_from
        if plan.clear_failed_mark:
            self._failed_mark = False
            try:
                self._log.update_meta(failed_at=None, failed_reason=None)
            except WalchannelError as exc:
                logger.warning("run %s: cannot clear the failed mark: %s", self._run_id, exc)
        if step is AnswerStep.FAIL_BEHIND:
            self._fail(
                EngineBehindError(
                    f"run {self._run_id}: engine behind: its high-water {engine_high} is below "
                    f"the stored cursor {self._cursor.stored}; it lost rows this log already "
                    "deleted, which cannot be re-sent"
                )
            )
            return None
        if step is AnswerStep.VERIFY:
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
                self._rows.clear_tail()
                # Seqs handed out before now live higher: waiters re-read their targets.
                self._acked_changed.set()
            self._cursor.on_verified(engine_high, shift)
            self._maybe_checkpoint()  # the verifying ack deleted rows too
            self._after_ack()
            return plan.replay_from
        if step is AnswerStep.PROTOCOL_ERROR:
            self._protocol_error(
                f"handshake answer Ack({engine_high}) is above the high-water "
                f"{self._cursor.high_water}; not applied"
            )
            return plan.replay_from
        if step is AnswerStep.RESEND_FORGOTTEN:
            logger.warning(
                "run %s: the engine answered Ack(%d) below acks it gave (%d); re-sending from %d",
                self._run_id,
                engine_high,
                self._cursor.acked,
                engine_high + 1,
            )
            self._cursor.on_forgot(engine_high)
            return plan.replay_from
        self._on_ack(engine_high)
        return plan.replay_from

    def _on_size_refusal(self, stream: Stream, refusal: SizeRefusal, text: str) -> None:
        """The engine refused a message for its size: find the row, set it aside or stop.

        The decision rules are :func:`~walchannel.protocol.pick_refused_row`
        (only a row proven refused) and
        :func:`~walchannel.protocol.refusal_sets_aside`. docs/design.md.
        """
        addr = stream.addr
        self._warn_engine_limit(addr, refusal.limit)
        try:
            verdict = pick_refused_row(
                self._rows.in_flight_sizes(self._cursor.acked, stream.top_written), refusal
            )
        except WalchannelError as exc:
            logger.error(
                "run %s: cannot read the log to find the refused row: %s", self._run_id, exc
            )
            self._set_error(f"{addr}: {text}")
            return
        if verdict.seq is None:
            fields = self._handshake_fields or ("", "", "")
            hello = wire.handshake_message(self._run_id, self._config.correlation_id, *fields)
            why = unproven_refusal(verdict, refusal, handshake_size=hello.ByteSize())
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
        self._rows.forget()
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
        if self._held is None or not held_done_reached(self._cursor):
            return
        error, self._held = self._held, None
        self._fail(error, mark_failed=True)
        if self._stream is not None:
            self._stream.finish(StreamEnded(str(error)))

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

    def _on_stop(self, reason: str) -> None:
        if not self._down.on_stop():
            return  # a repeat (the engine re-sends it after every handshake)
        logger.info(
            "run %s: the engine sent Stop(%r)",
            self._run_id,
            redact_secret(reason, self._config.run_token),
        )
        for callback in list(self._stop_callbacks):
            self._call_back(callback, reason)

    def _on_decision(self, decision: ApprovalDecision) -> None:
        self._down.on_decision(decision.request_id, decision)
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
        await self._stop_streaming()
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _tail(self) -> deque[tuple[int, str, bytes]]:
        """The writer's in-memory tail of committed rows (for tests and tools)."""
        return self._rows.tail
