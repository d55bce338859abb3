"""One dial: its call, and the three tasks that run on it (reader, writer, watchdog).

SPEC "The log is the queue", "Dial", "Reconnect". A :class:`Stream` is made
by the channel's connection loop for each dial. Once the engine answered the
handshake, the channel starts :meth:`Stream.start`: the writer writes rows in
seq order (the driver says which seq, the :class:`~walchannel.channel.row_source.RowSource`
gives its bytes) and heartbeats; the reader hands every down message to the
channel (the first ack answers the handshake); the watchdog ends a dead or
stalled stream (the driver's verdict). Whatever ends the stream,
:meth:`Stream.finish` records why once and the connection loop takes it from
there. The stream never imports grpc: the call is a
:class:`~walchannel.transport.base.StreamCall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from walchannel import _killpoints
from walchannel._logging import get_logger
from walchannel.channel.repeats import OncePerKind
from walchannel.channel.row_source import RowMissingError
from walchannel.core.events import Writing, Written
from walchannel.core.watchdog import Verdict
from walchannel.errors import ChannelClosedError, WalchannelError, WalCorruptError
from walchannel.transport.base import StreamEnded
from walchannel.wire.protobuf import DownDecodeError, decode_down

if TYPE_CHECKING:
    from walchannel._proto import engine_channel_pb2 as pb
    from walchannel.channel.replica import ReplicaGate
    from walchannel.channel.row_source import RowSource
    from walchannel.clock import Clock
    from walchannel.core.driver import Driver
    from walchannel.transport.base import StreamCall

__all__ = ["TEARDOWN_TIMEOUT_S", "Stream"]

logger = get_logger(__name__)

#: Bound on waiting for a dead stream's tasks and connection to go (seconds).
TEARDOWN_TIMEOUT_S: Final = 2.0
#: Acks on one stream that moved nothing, past which it is said once at WARNING:
#: duplicates beyond the heartbeats' answers (which repeat Ack(h) by design),
#: and acks going backwards, which a correct engine never sends (SPEC "Acks").
DUPLICATE_ACKS_WARN: Final = 64
BACKWARD_ACKS_WARN: Final = 8


class Stream:
    """One dial's call and tasks, and why it ended.

    Args:
        call: the dial's call.
        addr: the engine address dialled (``host:port``).
        driver: the run's driver (which seq next, what was written, verdicts).
        rows: the rows' bytes.
        clock: the monotonic clock (ms).
        wakeup: set when there is something new to write.
        on_down: the channel's handler of a down message (``(message, now ms)``);
            called for every message but the handshake's answer.
        on_fatal: the channel's handler of an error that re-dialing cannot
            mend (the log file is corrupt): it fails the run.
        on_violation: the channel's handler of a down message no correct
            engine sends (what, in words): a protocol error; the stream ends.
        heartbeat: builds the serialized heartbeat ``UpMessage`` (seq 0).
        acks_handshake: the first ack answers the handshake (``engine_acks_handshake``).
        replica: with ``durability="replicated"``, the Litestream gate.
        note_writing: ``RunLog.note_writing``: called before a seq is first
            written on this stream (the bound kept beside the log).

    Attributes:
        answer: the engine's answer to the handshake (its ``Ack``: ``h`` and any resume point).
        ended: set once the stream is over; :attr:`reason` says why.
        last_down_ms: when the last down message arrived (the dial's time before).
        heartbeats_since_down: heartbeats written since then.
        write_since_ms: when the write in progress started (None: not in a write).
        write_bytes: the size of the last write started (bytes on the wire).
        next_beat_ms: when the next heartbeat is due.
        top_written: the highest seq whose write started on this stream (a
            refused row's write may never complete).
        status: the call's final status ``(code, details)`` once read.
    """

    def __init__(
        self,
        call: StreamCall,
        addr: str,
        *,
        driver: Driver,
        rows: RowSource,
        clock: Clock,
        wakeup: asyncio.Event,
        on_down: Callable[[pb.DownMessage, float], None],
        on_fatal: Callable[[WalchannelError], None],
        on_violation: Callable[[str], None],
        heartbeat: Callable[[], bytes],
        acks_handshake: bool,
        replica: ReplicaGate | None,
        note_writing: Callable[[int], None],
    ) -> None:
        self.call = call
        self.addr = addr
        self._driver = driver
        self._rows = rows
        self._clock = clock
        self._wakeup = wakeup
        self._on_down = on_down
        self._on_fatal = on_fatal
        self._on_violation = on_violation
        self._heartbeat = heartbeat
        self._acks_handshake = acks_handshake
        self._replica = replica
        self._note_writing = note_writing
        self._run_id = driver.run_id
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.answer: asyncio.Future[pb.Ack] = loop.create_future()
        self.ended = asyncio.Event()
        self.reason: BaseException | None = None
        self.tasks: list[asyncio.Task[None]] = [loop.create_task(self._read_loop())]
        self.last_down_ms = clock.monotonic_ms()
        self.heartbeats_since_down = 0
        self.write_since_ms: float | None = None
        self.write_bytes = 0
        # Rows written on this stream that no ack covered yet: (seq, bytes), in write order.
        self._unacked: deque[tuple[int, int]] = deque()
        self.next_beat_ms = float("inf")
        self.top_written = 0
        self.status: tuple[str, str] | None = None
        # Acks that moved nothing, against the heartbeats written (stale_ack).
        self.beats = 0
        self.duplicate_acks = 0
        self.backward_acks = 0
        #: Per-message faults of the engine: each kind said once, the rest counted.
        self.said = OncePerKind(logger, f"run {self._run_id}: the stream to {addr}")

    @property
    def route(self) -> str:
        """`` via proxy host:port`` when the dial goes through a proxy, else ""."""
        return self.call.route

    def pending_bytes(self) -> int:
        """The bytes the engine must receive before it can answer (bytes on the wire).

        The larger of the oldest row written on this stream that no ack
        covers and the write in progress; 0 when there is neither. The
        watchdog's bounds wait the time these need at
        ``min_send_rate_bytes_per_s``: grpc.aio takes a large message at once
        and blocks a later write, or a heartbeat's answer, until it has
        crossed (SPEC "Reconnect").
        """
        unacked = self._unacked
        acked = self._driver.acked
        while unacked and unacked[0][0] <= acked:
            unacked.popleft()
        head = unacked[0][1] if unacked else 0
        if self.write_since_ms is None:
            return head
        return max(head, self.write_bytes)

    def stale_ack(self, seq: int, acked: int) -> None:
        """An ``Ack(seq)`` that moved nothing (``acked`` received already): count it.

        A duplicate beyond the heartbeats' answers, or an ack going backwards,
        is no correct engine's; past :data:`DUPLICATE_ACKS_WARN` or
        :data:`BACKWARD_ACKS_WARN` on this stream it is said once, at
        WARNING, with the counts: it can be the only live sign of an engine
        that lost its store. Nothing else is done with it (SPEC "Acks").
        """
        if seq < acked:
            self.backward_acks += 1
        else:
            self.duplicate_acks += 1
        beyond = self.duplicate_acks - self.beats
        if beyond > DUPLICATE_ACKS_WARN or self.backward_acks > BACKWARD_ACKS_WARN:
            self.said.say(
                "acks that moved nothing past the bound",
                logging.WARNING,
                "run %s: the engine at %s sent %d duplicate acks beyond its %d heartbeat "
                "answers and %d acks going backwards on this stream; a correct engine sends "
                "neither (an engine that lost its store may): nothing is applied from them",
                self._run_id,
                self.addr,
                max(0, beyond),
                self.beats,
                self.backward_acks,
            )

    def start(self) -> None:
        """The handshake is answered: start the writer and the watchdog."""
        self.tasks.append(self._loop.create_task(self._write_loop()))
        self.tasks.append(self._loop.create_task(self._watchdog()))

    def finish(self, reason: BaseException | None) -> None:
        """End the stream (the first reason wins); a pending handshake answer fails with it."""
        if not self.ended.is_set():
            # No traceback: its frames would keep the call (and its socket) alive.
            self.reason = reason.with_traceback(None) if reason is not None else None
            self.ended.set()
        if not self.answer.done():
            self.answer.set_exception(reason or StreamEnded("stream ended"))
            self.answer.exception()  # retrieved: nobody may be waiting

    # -- the tasks -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        call = self.call
        now_ms = self._clock.monotonic_ms
        answer = self.answer
        try:
            while True:
                data = await call.read()
                try:
                    decoded = decode_down(data)
                except DownDecodeError as exc:
                    self._undecodable(exc)
                    return
                if decoded.repaired:
                    self.said.say(
                        "down messages with text that is not valid UTF-8",
                        logging.WARNING,
                        "run %s: a down message from %s held text that is not valid UTF-8 in"
                        " %r: acted on, with U+FFFD in place of the bad bytes (the engine's"
                        " encoder cuts text)",
                        self._run_id,
                        self.addr,
                        list(decoded.repaired),
                    )
                msg = decoded.message
                now = now_ms()
                self.last_down_ms = now
                self.heartbeats_since_down = 0
                if not answer.done() and self._acks_handshake and msg.HasField("ack"):
                    answer.set_result(msg.ack)
                    continue
                self._on_down(msg, now)
        except asyncio.CancelledError:
            self.finish(StreamEnded("cancelled"))
            raise
        except StreamEnded as exc:
            self.finish(exc)
        except Exception as exc:
            logger.exception("run %s: reading the stream failed", self._run_id)
            self.finish(exc)

    def _undecodable(self, exc: DownDecodeError) -> None:
        """A down message that does not parse: a protocol error; the stream ends.

        Ended, not skipped: it may have been a ``Stop`` or a decision, which
        the engine sends again after the next handshake (SPEC "Down messages").
        """
        self._on_violation(
            f"the engine at {self.addr} sent {exc}; the stream is ended and dialed again"
        )

    async def _write_loop(self) -> None:
        call = self.call
        driver = self._driver
        next_to_write = driver.next_to_write
        handle = driver.handle  # the writer's rows are events (they ask for nothing)
        note_writing = self._note_writing
        row_bytes = self._rows.row_bytes
        now_ms = self._clock.monotonic_ms
        replica = self._replica
        wakeup = self._wakeup
        unacked = self._unacked
        next_beat_ms = driver.next_beat_ms(now_ms())
        self.next_beat_ms = next_beat_ms
        loop = self._loop
        # One timer per heartbeat period wakes the writer for the beat, not one
        # per wait: the writer waits once per message when the sender is slower.
        beat_timer: asyncio.TimerHandle | None = None

        def beat_due() -> None:
            nonlocal beat_timer
            beat_timer = None
            wakeup.set()

        try:
            while True:
                seq = next_to_write()
                if seq is None:
                    wakeup.clear()
                    if next_to_write() is None and not driver.final:
                        if beat_timer is None:
                            delay_s = max(0.0, next_beat_ms - now_ms()) / 1000
                            beat_timer = loop.call_later(delay_s, beat_due)
                        await wakeup.wait()
                    if driver.final:
                        return
                elif replica is not None and seq > replica.through:
                    await replica.wait()
                else:
                    data = row_bytes(seq)
                    if driver.is_replay(seq):
                        _killpoints.reached("in_replay")
                    self.write_since_ms = now = now_ms()
                    self.write_bytes = size = len(data)
                    acked = driver.acked
                    while unacked and unacked[0][0] <= acked:
                        unacked.popleft()  # what acks covered: the deque stays short
                    unacked.append((seq, size))
                    if seq > self.top_written:
                        note_writing(seq)  # kept beside the log before it goes out
                        self.top_written = seq
                        handle(Writing(seq))  # the engine may ack it from now on
                    await call.write(data)
                    self.write_since_ms = None
                    handle(Written(seq))
                    _killpoints.reached("after_write")
                    if now < next_beat_ms:
                        continue  # the common case: no heartbeat due, no clock read
                if now_ms() >= next_beat_ms:
                    self.heartbeats_since_down += 1
                    self.beats += 1
                    beat = self._heartbeat()
                    self.write_since_ms = now_ms()
                    self.write_bytes = len(beat)
                    await call.write(beat)
                    self.write_since_ms = None
                    next_beat_ms = driver.next_beat_ms(now_ms())
                    self.next_beat_ms = next_beat_ms
                    # A beat timer still armed fires early: one idle look, then re-armed.
        except asyncio.CancelledError:
            raise
        except (StreamEnded, RowMissingError) as exc:
            self.finish(exc)
        except WalCorruptError as exc:
            # Re-dialing cannot mend the file: stop, loudly, keeping the rows.
            self.finish(exc)
            self._on_fatal(exc)
        except WalchannelError as exc:
            if self.ended.is_set() and isinstance(exc, ChannelClosedError):
                # A cancelled close() closed the log under a writer still running:
                # the stream was already over, nothing is wrong with the log.
                logger.info("run %s: the writer stops, the stream is over: %s", self._run_id, exc)
            else:
                logger.error("run %s: cannot read the log to write: %s", self._run_id, exc)
            self.finish(exc)
        except Exception as exc:
            logger.exception("run %s: writing the stream failed", self._run_id)
            self.finish(exc)
        finally:
            if beat_timer is not None:
                beat_timer.cancel()

    async def _watchdog(self) -> None:
        """End the stream when it is dead: ``dead_stream_ms`` and stalled writes.

        ``dead_stream_ms``: no down message for that long while heartbeats go
        out. Stalled write (always on): a write blocked for ``keepalive_ms +
        10 s`` with no down message for as long. gRPC keepalive cannot catch
        this case: its ping queues behind the blocked bytes and its timeout
        only starts once the ping is written; a proxy answers pings itself.
        Both bounds also wait the time :meth:`pending_bytes` need at
        ``min_send_rate_bytes_per_s``: a slow link is not a dead one. A
        watchdog that wakes more than twice the keepalive late (the process
        did not run: ``SIGSTOP``) says so and starts the stream's clocks
        again. The rules are :meth:`~walchannel.core.driver.Driver.stream_verdict`'s.
        """
        driver = self._driver
        now_ms = self._clock.monotonic_ms
        while not self.ended.is_set():
            period_ms = driver.watchdog_period_ms()
            due = now_ms() + period_ms
            await asyncio.sleep(period_ms / 1000)
            late = now_ms() - due
            if driver.loop_stalled(late):
                # Nothing ran here: no heartbeat went out, no answer was read.
                # Silence says nothing of the stream; it gets a fresh chance.
                logger.warning(
                    "run %s: the event loop did not run for %.1f s (the process was stopped,"
                    " or starved); the stream to %s gets a fresh chance",
                    self._run_id,
                    late / 1000,
                    self.addr,
                )
                self.last_down_ms = now_ms()
                self.heartbeats_since_down = 0
                if self.write_since_ms is not None:
                    self.write_since_ms = self.last_down_ms
                continue
            pending = self.pending_bytes()
            found = driver.stream_verdict(
                now_ms(),
                last_down_ms=self.last_down_ms,
                heartbeats_since_down=self.heartbeats_since_down,
                write_since_ms=self.write_since_ms,
                next_beat_ms=self.next_beat_ms,
                pending_bytes=pending,
            )
            if found is None:
                continue
            verdict, silent, blocked, beat_overdue, bound = found
            if verdict is Verdict.DEAD:
                logger.warning(
                    "run %s: no down message from %s for %.0f ms while heartbeats went out%s "
                    "(bound %.0f ms with %d bytes to cross): the stream is dead",
                    self._run_id,
                    self.addr,
                    silent,
                    " (one is stuck behind a write blocked by flow control)"
                    if beat_overdue
                    else "",
                    bound,
                    pending,
                )
                self.finish(
                    StreamEnded(
                        f"dead stream: no down message for {silent:.0f} ms (bound {bound:.0f} ms)"
                    )
                )
                return
            logger.warning(
                "run %s: a write to %s has been blocked for %.0f ms with no down message "
                "(bound %.0f ms with %d bytes to cross): the stream is dead",
                self._run_id,
                self.addr,
                blocked,
                bound,
                pending,
            )
            self.finish(
                StreamEnded(
                    f"stalled stream: a write blocked for {blocked:.0f} ms, "
                    f"no down message for {silent:.0f} ms (bound {bound:.0f} ms)"
                )
            )
            return

    # -- the end ---------------------------------------------------------------------------

    async def read_final_status(self) -> None:
        """Keep the call's final status when the engine ended it (not a write's error)."""
        with contextlib.suppress(StreamEnded):
            self.status = await self.call.final_status()

    async def half_close(self) -> None:
        """For ``close()``: stop writing, half-close, wait for the engine to end the stream.

        ``close()`` is not a flush (``send_done`` is the ordered shutdown).
        """
        writers = self.tasks[1:]
        for task in writers:
            task.cancel()
        if writers:
            await asyncio.wait(writers, timeout=TEARDOWN_TIMEOUT_S)
        with contextlib.suppress(StreamEnded):
            await self.call.done_writing()
        await self.ended.wait()

    async def teardown(self) -> None:
        """Cancel the call and the tasks, wait for them (bounded), release the connection."""
        # Cancel the call first: a write parked on a dead transport only
        # returns once the call is gone, so its task could not be awaited.
        self.call.cancel()
        for task in self.tasks:
            task.cancel()
        try:
            if self.tasks:
                _, pending = await asyncio.wait(self.tasks, timeout=TEARDOWN_TIMEOUT_S)
                if pending:
                    logger.warning(
                        "run %s: %d task(s) of the stream to %s did not stop within %.0f s",
                        self._run_id,
                        len(pending),
                        self.addr,
                        TEARDOWN_TIMEOUT_S,
                    )
        finally:
            # Even when cancelled: the connection (its socket) must go.
            self.tasks.clear()
            self.said.summary()
            await self.call.close()
