"""The stream driver: the connection loop, one stream's reader, writer and watchdog.

SPEC "Dial", "Reconnect", "Shutdown order". The loop dials (with
:mod:`~walchannel.channel.dial`), sends the handshake (seq 0), waits for the
engine's ``Ack(h)``, hands the answer to the channel to decide, then runs
three tasks per stream: the reader (down messages to the channel's
handlers), the writer (rows in seq order from the
:class:`~walchannel.row_source.RowSource`, and heartbeats) and the watchdog
(dead and stalled streams). On any end of stream it backs off and dials
again, until ``close()``, ``hard_deadline`` or a failure. What to do is
decided without I/O in :mod:`walchannel.protocol` (cursor, backoff) and
:mod:`walchannel.session` (ends of stream, the watchdog's rules, counters);
this module carries it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

import grpc
import grpc.aio

from walchannel import _killpoints, messages, wire
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.channel.base import now_ms
from walchannel.channel.dial import Dialer
from walchannel.channel.replica import ReplicaGate
from walchannel.config import redact_secret
from walchannel.errors import RunCompletedError, WalchannelError, WalCorruptError
from walchannel.interface import ApprovalDecision
from walchannel.log_format import FAILED_UNDELIVERABLE
from walchannel.protocol import ChannelState, describe_end
from walchannel.row_source import RowMissingError
from walchannel.session import (
    MAX_KEEPALIVE_MS,
    EndOutcome,
    VerdictKind,
    doubled_keepalive_ms,
    plan_end,
    plan_run_completed,
    stream_verdict,
    watchdog_period_ms,
)

__all__ = [
    "MAX_KEEPALIVE_MS",
    "METHOD",
    "TEARDOWN_TIMEOUT_S",
    "Stream",
    "StreamDriver",
    "StreamEnded",
]

logger = logging.getLogger(__name__)

METHOD = "/EngineChannel/Open"
#: Bound on waiting for a dead stream's tasks and gRPC channel to go (seconds).
TEARDOWN_TIMEOUT_S = 2.0


def _identity(data: bytes) -> bytes:
    # Rows arrive already serialized (RowSource.row_bytes): no second encoding.
    return data


class StreamEnded(Exception):
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


class Stream:
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
        self.last_down_ms = now_ms()
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
            self.answer.set_exception(reason or StreamEnded("stream ended"))
            self.answer.exception()  # retrieved: nobody may be waiting


class StreamDriver(Dialer, ReplicaGate):
    """The stream driver of :class:`~walchannel.channel.GrpcEngineChannel`."""

    def _start(self) -> None:
        if self._runner is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = self._config.hard_deadline
        if deadline is not None:
            delay = (deadline - datetime.now(UTC)).total_seconds()
            self._deadline_timer = loop.call_later(max(0.0, delay), self._expire)
        self._runner = loop.create_task(self._run(), name=f"walchannel-{self._run_id}")

    def _expire(self) -> None:
        if self._sm.final:
            return
        logger.error("run %s: hard_deadline passed; the channel stops", self._run_id)
        self._set_error("hard_deadline passed")
        self._move(ChannelState.EXPIRED)
        if self._stream is not None:
            self._stream.finish(StreamEnded("hard_deadline passed"))

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
                    now_ms(), lambda attempt: self._config.backoff.delay_ms(attempt, self._rng)
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
        stream = Stream(addr, channel, call, loop, via)
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
            self._rows.clear_readahead()
            await self._teardown(stream)
            self._stream = None
            if not self._closing:
                self._record_end(stream)

    async def _read_final_status(self, stream: Stream) -> None:
        """Keep the call's final status when the server ended it (not a write's error)."""
        call = stream.call
        if call is None or not call.done():
            return
        with contextlib.suppress(Exception):
            code = await call.code()
            stream.status = (code.name, await call.details() or "")

    async def _open(self, stream: Stream) -> None:
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
        if self._sm.final:
            # The answer acked the rows before a refused Done: stopped (_check_held).
            stream.finish(StreamEnded("the channel stopped"))
            return
        self._writes.on_stream_up()
        self._repeated_end = None
        self._move(ChannelState.STREAMING)
        self._reconnect.on_stream_up(now_ms())
        self._record_up(stream.addr)
        self._cursor.start_stream(replay_from)
        loop = asyncio.get_running_loop()
        stream.tasks.append(loop.create_task(self._write_loop(stream)))
        stream.tasks.append(loop.create_task(self._watchdog(stream)))

    def _record_up(self, addr: str) -> None:
        logger.info("run %s: streaming to %s", self._run_id, addr)
        try:
            self._log.update_meta(last_engine_addr=addr, reconnects=self._writes.reconnects)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the engine address: %s", self._run_id, exc)

    def _record_end(self, stream: Stream) -> None:
        reason = stream.reason
        code: str | None = None
        details = ""
        debug = ""
        if isinstance(reason, grpc.aio.AioRpcError):
            code = reason.code().name
            details = reason.details() or ""
            debug = reason.debug_error_string() or ""
        elif isinstance(reason, StreamEnded):
            code, details = reason.code, reason.details
        if code is None and stream.status is not None and stream.status[0] != "OK":
            code, details = stream.status
        self._last_end_code = code
        text = describe_end(code, details) if code else str(reason or "stream ended")
        # The engine's text may echo the token (SPEC "Secrets").
        text = redact_secret(text, self._config.run_token)
        plan = plan_end(code, details, debug, final=self._sm.final)
        if plan.double_keepalive:
            self._double_keepalive()
        if plan.outcome is EndOutcome.RUN_COMPLETED:
            self._on_run_completed()
            return
        if plan.outcome is EndOutcome.ALREADY_OVER:
            return
        # The same end again (an engine down, a token refused) while redialing:
        # said once at WARNING, then at INFO until a stream comes up.
        level = logging.INFO if text == self._repeated_end else logging.WARNING
        self._repeated_end = text
        logger.log(
            level, "run %s: stream to %s%s ended: %s", self._run_id, stream.addr, stream.via, text
        )
        if plan.refusal is not None:
            self._on_size_refusal(stream, plan.refusal, text)
            return
        self._set_error(f"{stream.addr}{stream.via}: {text}")

    def _on_run_completed(self) -> None:
        """The engine answered FAILED_PRECONDITION "run completed": the loop ends.

        What it does to the log is decided by
        :func:`walchannel.session.plan_run_completed`; this carries it out.
        """
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        plan = plan_run_completed(self._log.state)
        if plan.tombstone and self._log.writable:
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
        if self._log.writable and plan.mark_undeliverable:
            # Rows this log still holds cannot be delivered any more: flag the
            # run for an operator (inspect shows it as failed, export saves them).
            with contextlib.suppress(WalchannelError):
                self._log.update_meta(failed_at=time.time(), failed_reason=FAILED_UNDELIVERABLE)

    def _double_keepalive(self) -> None:
        doubled = doubled_keepalive_ms(self._keepalive_ms)
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

    async def _teardown(self, stream: Stream) -> None:
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

    async def _read_loop(self, stream: Stream) -> None:
        call = stream.call
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    code = await call.code()
                    details = await call.details() or ""
                    if code is grpc.StatusCode.OK:
                        stream.finish(StreamEnded("the engine ended the stream (status OK)"))
                    else:
                        stream.finish(StreamEnded(f"{code.name}: {details}", code.name, details))
                    return
                now = now_ms()
                stream.last_down_ms = now
                stream.heartbeats_since_down = 0
                self._on_down(stream, msg, now)
        except asyncio.CancelledError:
            stream.finish(StreamEnded("cancelled"))
            raise
        except grpc.aio.AioRpcError as exc:
            stream.finish(exc)
        except Exception as exc:
            logger.exception("run %s: reading the stream failed", self._run_id)
            stream.finish(exc)

    def _on_down(self, stream: Stream, msg: pb.DownMessage, now: float) -> None:
        kind = msg.WhichOneof("body")
        if kind == "ack":
            if not stream.answer.done() and self._config.engine_acks_handshake:
                stream.answer.set_result(msg.ack.seq)
                return
            self._on_ack(msg.ack.seq, now)
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

    async def _write_loop(self, stream: Stream) -> None:
        call = stream.call
        cursor = self._cursor
        row_bytes = self._rows.row_bytes
        writes, reconnect = self._writes, self._reconnect
        next_beat_ms = now_ms() + self._keepalive_ms
        stream.next_beat_ms = next_beat_ms
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup
        # One timer per heartbeat period wakes the writer for the beat, not one
        # per wait: the writer waits once per message when the sender is slower.
        beat_timer: asyncio.TimerHandle | None = None

        def beat_due() -> None:
            nonlocal beat_timer
            beat_timer = None
            wakeup.set()

        try:
            while True:
                seq = cursor.next_to_write()
                if seq is None:
                    wakeup.clear()
                    if cursor.next_to_write() is None and not self._sm.final:
                        if beat_timer is None:
                            delay_s = max(0.0, next_beat_ms - now_ms()) / 1000
                            beat_timer = loop.call_later(delay_s, beat_due)
                        await wakeup.wait()
                    if self._sm.final:
                        return
                elif self._replica_socket is not None and seq > self._replicated_through:
                    await self._replicate()
                else:
                    data = row_bytes(seq)
                    if writes.is_replay(seq):
                        _killpoints.reached("in_replay")
                    stream.write_since_ms = now = now_ms()
                    if seq > stream.top_written:
                        stream.top_written = seq
                    await call.write(data)
                    stream.write_since_ms = None
                    cursor.on_written(seq)
                    reconnect.on_written(seq)
                    writes.on_written(seq)
                    _killpoints.reached("after_write")
                    if now < next_beat_ms:
                        continue  # the common case: no heartbeat due, no clock read
                if now_ms() >= next_beat_ms:
                    stream.heartbeats_since_down += 1
                    beat = wire.heartbeat_message(
                        self._run_id, self._config.correlation_id, messages.now_rfc3339()
                    )
                    stream.write_since_ms = now_ms()
                    await call.write(beat.SerializeToString())
                    stream.write_since_ms = None
                    next_beat_ms = now_ms() + self._keepalive_ms
                    stream.next_beat_ms = next_beat_ms
                    if beat_timer is not None:
                        beat_timer.cancel()
                        beat_timer = None
        except asyncio.CancelledError:
            raise
        except (
            grpc.aio.AioRpcError,
            grpc.aio.UsageError,
            asyncio.InvalidStateError,
            StreamEnded,
            RowMissingError,
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
        finally:
            if beat_timer is not None:
                beat_timer.cancel()

    async def _watchdog(self, stream: Stream) -> None:
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
            await asyncio.sleep(watchdog_period_ms(dead_ms, self._keepalive_ms) / 1000)
            verdict = stream_verdict(
                now_ms(),
                last_down_ms=stream.last_down_ms,
                heartbeats_since_down=stream.heartbeats_since_down,
                write_since_ms=stream.write_since_ms,
                next_beat_ms=stream.next_beat_ms,
                dead_stream_ms=dead_ms,
                keepalive_ms=self._keepalive_ms,
            )
            if verdict is None:
                continue
            silent, blocked = verdict.silent_ms, verdict.blocked_ms
            if verdict.kind is VerdictKind.DEAD:
                logger.warning(
                    "run %s: no down message from %s for %.0f ms while heartbeats went out%s: "
                    "the stream is dead",
                    self._run_id,
                    stream.addr,
                    silent,
                    " (one is stuck behind a write blocked by flow control)"
                    if verdict.beat_overdue
                    else "",
                )
                stream.finish(StreamEnded(f"dead stream: no down message for {silent:.0f} ms"))
                return
            logger.warning(
                "run %s: a write to %s has been blocked for %.0f ms with no down message: "
                "the stream is dead",
                self._run_id,
                stream.addr,
                blocked,
            )
            stream.finish(
                StreamEnded(
                    f"stalled stream: a write blocked for {blocked:.0f} ms, "
                    f"no down message for {silent:.0f} ms"
                )
            )
            return

    async def _half_close(self, stream: Stream) -> None:
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

    async def _stop_streaming(self) -> None:
        """For close: half-close the stream, wait up to ``close_timeout_ms``, tear down.

        SPEC "Shutdown order". The caller has marked the channel closed, so
        the end of the stream is not taken for a drop.
        """
        budget_s = self._config.close_timeout_ms / 1000
        stream = self._stream
        if stream is not None and not stream.ended.is_set():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._half_close(stream), budget_s)
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
            with contextlib.suppress(BaseException):
                await self._teardown(self._stream)
