"""The connection loop and the channel's executor: one part of the channel.

It dials, sends the handshake (seq 0), waits for the engine's ``Ack(h)``,
replays and streams until the stream ends; then backs off, rediscovers and
dials again, until ``close()``, ``hard_deadline`` or a failure (SPEC
"Dial", "Reconnect"). Everything that happens (an answer, an ack, a
stream's end, a timer, what the harness's calls ask) is fed to the driver
(:meth:`ConnectionLoop.feed`), and this performs the actions it answers;
it decides nothing itself (docs/design.md, "The driver: events and actions").
However the loop's task ends with the channel still open (cancelled from
outside, a ``BaseException`` inside it), the channel was left open: it
closes itself and every waiter wakes (SPEC "Cancellation"). An exception of
walchannel's own in the loop fails the run with ``FAILED_INTERNAL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Final

from walchannel import _killpoints
from walchannel._logging import get_logger
from walchannel.channel.interface import ApprovalDecision, BudgetCallback, StopCallback
from walchannel.channel.reclaim import DiskReclaim
from walchannel.channel.refused_rows import RefusedRows
from walchannel.channel.stream import TEARDOWN_TIMEOUT_S, Stream
from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.end_status import describe_end
from walchannel.core.engine_refusals import down_too_large_text
from walchannel.errors import (
    DiscoveryError,
    GroupCommitError,
    ReentrantCallError,
    WalchannelError,
    WalRemovedError,
    WalWriteError,
    raw_message,
)
from walchannel.log.format import engine_resume
from walchannel.transport.base import StreamEnded
from walchannel.wire import messages
from walchannel.wire import protobuf as wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from walchannel._proto import engine_channel_pb2 as pb
    from walchannel.channel.replica import ReplicaGate
    from walchannel.channel.reporting import Reporter
    from walchannel.channel.row_source import RowSource
    from walchannel.channel.waiters import Waiters
    from walchannel.clock import Clock
    from walchannel.config import GrpcChannelConfig
    from walchannel.core.actions import Action
    from walchannel.core.driver import Driver
    from walchannel.log.writer import RunLog
    from walchannel.transport.base import Transport

__all__ = ["ConnectionLoop"]

logger = get_logger(__name__)

#: How the connection loop ended when a task.cancel() from outside reached it.
CANCELLED_FROM_OUTSIDE: Final = (
    "cancelled from outside walchannel (a task.cancel(), or the event loop finishing "
    "with the channel never closed)"
)


class ConnectionLoop:
    """Dial, handshake, stream, reconnect; take what the engine sends down.

    Args:
        config: the run's config.
        log: the run's open log.
        driver: the run's driver: every decision is its; this does the I/O.
        rows: the writer's row source.
        clock: the clocks read (monotonic ms, wall seconds).
        transport: where dials and discovery go.
        replica: the replica gate under ``durability="replicated"``, else None.
        waiters: what the harness's awaits watch (woken from here).
        reporter: where errors are kept, stored and the run failed.
        wakeup: the writer's event.
        handshake_fields: ``(connector_version, harness_name,
            harness_version)`` from the log's meta, or None before the first
            ``handshake()``.
        pending_token_hash: the token's sha256 to store once an engine
            answers a handshake sent with it (``token_hash_when="accepted"``),
            else None.
        commit_pending: under ``group_commit``, commits the rows handed out
            but not yet committed (raises ``WalchannelError`` if it cannot),
            before a handshake answer is judged: the driver reads the log's
            high-water there and the verification renumbers the log's rows,
            so none may wait outside them (SPEC "Group commit"). None without.
        on_left_open: called with how the loop ended when it ended with the
            channel open (SPEC "Cancellation"): the channel closes itself.
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        log: RunLog,
        driver: Driver,
        rows: RowSource,
        clock: Clock,
        transport: Transport,
        replica: ReplicaGate | None,
        waiters: Waiters,
        reporter: Reporter,
        wakeup: asyncio.Event,
        *,
        handshake_fields: tuple[str, str, str] | None,
        pending_token_hash: str | None,
        commit_pending: Callable[[], None] | None = None,
        on_left_open: Callable[[str], None],
    ) -> None:
        self._config = config
        self._run_id = config.run_id
        self._log = log
        self._driver = driver
        self._rows = rows
        self._clock = clock
        self._transport = transport
        self._replica = replica
        self._waiters = waiters
        self._reporter = reporter
        self._wakeup = wakeup
        self.handshake_fields = handshake_fields
        """What the handshake sends: set by ``handshake()``, read from the log's meta."""
        self._pending_token_hash = pending_token_hash
        self._commit_pending = commit_pending
        self._on_left_open = on_left_open
        self.addr = config.grpc_addr
        """The engine's address: the configured one, then what discovery answered."""
        self.stop_callbacks: list[StopCallback] = []
        self.budget_callbacks: list[BudgetCallback] = []
        self._reclaim = DiskReclaim(log, clock, self.feed)
        self._refused = RefusedRows(
            config,
            log,
            driver,
            rows,
            reporter,
            self.feed,
            handshake_size=lambda: self.hello().ByteSize(),
        )
        self._stream: Stream | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._perform = self._performers()
        # What the executor carries between an action and the code that awaits it.
        self._turn: act.Dial | act.Backoff | act.Rediscover | None = None
        self._done_step: Action | None = None
        self._replayed = 0
        self._ended: Stream | None = None  # the stream whose end is being fed
        #: The engine's resume point from its last answer, as stored in meta
        #: (None: it announced none); SPEC "The engine keeps the resume point".
        self.engine_resume: dict[str, Any] | None = engine_resume(log.meta().engine_resume)
        # Judged from the answer, not stored yet: (the point, or None to clear it).
        self._resume_to_store: tuple[dict[str, Any] | None] | None = None
        self._resync = False  # the answer announced a point the last one did not

    # -- starting and stopping -------------------------------------------------------------

    def start(self) -> None:
        """Start the loop's task on the running event loop (once) and the deadline timer."""
        if self._runner is not None:
            return
        loop = asyncio.get_running_loop()
        self._look_at_deadline()
        self._runner = loop.create_task(self._run(), name=f"walchannel-{self._run_id}")
        self._runner.add_done_callback(self._runner_done)

    def cancel(self) -> None:
        """For a cancelled ``close()``: end the stream and cancel the loop; await nothing.

        The loop tears its stream down itself, in its own task.
        """
        self.cancel_timers()
        if self._stream is not None:
            self._stream.finish(StreamEnded("closed"))
        runner = self._runner
        # Not from the loop's own task: it is ending already (a second cancel
        # would cut its stream's teardown short).
        if runner is not None and not runner.done() and runner is not asyncio.current_task():
            runner.cancel()

    def abandon(self) -> None:
        """Forget the loop, its stream and timers: their event loop is gone."""
        self.cancel_timers()
        self._stream = None
        self._runner = None

    async def stop(self) -> None:
        """For ``close()``: half-close the stream, wait up to ``close_timeout_ms``, tear down.

        SPEC "Shutdown order". The channel is already marked closed, so the
        end of the stream is not taken for a drop.
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
        # Wake the loop (backoff sleeps and handshake waits watch `over`) and
        # let it tear its stream down itself; cancel it only if it lingers.
        self._waiters.over.set()
        if self._runner is not None:
            done, _ = await asyncio.wait({self._runner}, timeout=2 * TEARDOWN_TIMEOUT_S + 1)
            if not done:
                self._runner.cancel()
                await asyncio.wait({self._runner}, timeout=TEARDOWN_TIMEOUT_S)
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.teardown()

    async def aclose(self) -> None:
        """Close the transport and the replica gate (both idempotent; a failure is logged)."""
        closers = [self._transport.aclose]
        if self._replica is not None:
            closers.append(self._replica.aclose)
        for aclose in closers:
            try:
                await aclose()
            except Exception as exc:
                logger.debug("run %s: closing the network failed: %r", self._run_id, exc)

    def cancel_timers(self) -> None:
        """Cancel the deadline, ack and checkpoint timers (the channel closes)."""
        for timer in (self._deadline_timer, self._ack_timer):
            if timer is not None:
                timer.cancel()
        self._deadline_timer = self._ack_timer = None
        self._reclaim.cancel()

    # -- the loop's end --------------------------------------------------------------------

    def _runner_done(self, runner: asyncio.Task[None]) -> None:
        """The loop's task ended: if the channel is still open, it was left open.

        The loop runs until ``close()`` or a final state; ended any other way
        (cancelled from outside: a ``task.cancel()`` of the harness's, or
        ``asyncio.run`` finishing with the channel never closed; or a
        ``BaseException`` such as ``KeyboardInterrupt`` raised inside it),
        the harness's code ended it, not walchannel's: ``on_left_open``.
        """
        if runner.cancelled():
            self._left_open(CANCELLED_FROM_OUTSIDE)
        else:
            exc = runner.exception()
            self._left_open("ended" if exc is None else f"ended by {type(exc).__name__}: {exc}")

    def _close_if_cancelled(self) -> bool:
        """In the loop: a cancel from outside is being delivered; close now. True if so."""
        task = asyncio.current_task()
        if task is None or not task.cancelling() or self._driver.closed:
            return False
        self._left_open(CANCELLED_FROM_OUTSIDE)
        return True

    def _left_open(self, what: str) -> None:
        driver = self._driver
        if driver.closed or driver.final:
            return
        self._on_left_open(f"its connection loop was {what}")

    # -- hard_deadline ---------------------------------------------------------------------

    def _look_at_deadline(self) -> None:
        """The ``hard_deadline`` timer: the driver looks at the wall clock (``DeadlineLook``)."""
        self._deadline_timer = None
        self.feed(ev.DeadlineLook(self._clock.wall_s()))

    # -- the executor ----------------------------------------------------------------------

    def feed(self, event: ev.Event) -> None:
        """Hand ``event`` to the driver and perform every action it answers, in order.

        An action whose I/O has a result feeds the next event here in turn
        (``Verify`` then ``Verified``): the driver hears of every outcome.
        The connection loop's own turns (``Dial``, ``Backoff``,
        ``Rediscover``) are awaited by :meth:`_run`. docs/design.md, "The
        driver: events and actions".
        """
        perform = self._perform
        for action in self._driver.handle(event):
            perform[type(action)](action)

    def _performers(self) -> dict[type, Callable[[Any], None]]:
        """The performer of each action (each does I/O only; the driver decided)."""
        return {
            act.Dial: self._next_turn,
            act.Backoff: self._next_turn,
            act.Rediscover: self._next_turn,
            act.StateChanged: self._do_state_changed,
            act.StartStream: self._do_start_stream,
            act.EndStream: self._do_end_stream,
            act.Replay: self._do_replay,
            act.NoteProtocolError: self._do_note_protocol_error,
            act.StaleAck: self._do_stale_ack,
            act.ClearFailedMark: self._do_clear_failed_mark,
            act.Verify: self._do_verify,
            act.Renumbered: self._do_renumbered,
            act.AckMoved: self._do_ack_moved,
            act.Checkpoint: self._do_checkpoint,
            act.ArmCheckpointTimer: self._do_arm_checkpoint_timer,
            act.DoneAcked: self._do_done_acked,
            act.RecordError: self._do_record_error,
            act.Warn: self._do_warn,
            act.StoreAck: self._do_store_ack,
            act.ArmAckTimer: self._do_arm_ack_timer,
            act.ArmDeadline: self._do_arm_deadline,
            act.DeadlineHit: self._do_deadline_hit,
            act.StoreFailure: self._do_store_failure,
            act.Tombstone: self._do_tombstone,
            act.MarkCompleted: self._do_mark_completed,
            act.RecordEnd: self._do_record_end,
            act.SayDownTooLarge: self._do_say_down_too_large,
            act.SetAsideRefused: self._do_set_aside_refused,
            act.KeepaliveDoubled: self._do_keepalive_doubled,
            act.StopCallbacks: self._do_stop_callbacks,
            act.ResolveApproval: self._do_resolve_approval,
            act.DoneDelivered: self._next_done_step,
            act.LogDone: self._next_done_step,
            act.WaitDone: self._next_done_step,
        }

    def _next_turn(self, action: act.Dial | act.Backoff | act.Rediscover) -> None:
        self._turn = action  # awaited by _run

    def _next_done_step(self, action: act.DoneDelivered | act.LogDone | act.WaitDone) -> None:
        self._done_step = action  # carried out by send_done

    def done_step(self, event: ev.DoneRequested | ev.DoneLogged) -> Action:
        """Feed ``send_done``'s ``event``; return what ``send_done`` does next.

        ``DONE_DELIVERED`` (return True), ``LOG_DONE`` (log the row, then
        feed ``DoneLogged``) or ``WAIT_DONE``.
        """
        self._done_step = None
        self.feed(event)
        step = self._done_step
        assert step is not None, f"the driver answered {event!r} with no step"
        return step

    def replay(self) -> int:
        """``replay_unacked()``: feed ``Rewind``; return how many rows go again."""
        self._replayed = 0
        self.feed(ev.Rewind())
        return self._replayed

    def flush_acks(self) -> None:
        """Store the received ack now if it is not stored yet (close, the backlog limit)."""
        self.feed(ev.AcksFlushed(self._clock.monotonic_ms()))

    def _do_state_changed(self, action: act.StateChanged) -> None:
        self._waiters.state_changed()

    def _do_end_stream(self, action: act.EndStream) -> None:
        if self._stream is not None:
            self._stream.finish(StreamEnded(action.why))

    def _do_replay(self, action: act.Replay) -> None:
        self._rows.clear_readahead()
        self._replayed = action.count
        self._wakeup.set()

    def _do_note_protocol_error(self, action: act.NoteProtocolError) -> None:
        if action.kind is not None:
            self._say(action.kind, logging.ERROR, "run %s: %s", self._run_id, action.text)
        else:
            logger.error("run %s: %s", self._run_id, action.text)

    def _do_stale_ack(self, action: act.StaleAck) -> None:
        if self._stream is not None:
            self._stream.stale_ack(action.seq, action.acked)

    def _do_warn(self, action: act.Warn) -> None:
        logger.warning("run %s: %s", self._run_id, action.text)

    def _do_record_error(self, action: act.RecordError) -> None:
        if action.loud:
            logger.error("%s", action.text)
        self._reporter.record(action.text)

    def _do_store_failure(self, action: act.StoreFailure) -> None:
        self._reporter.failed(action.reason)

    def _do_arm_deadline(self, action: act.ArmDeadline) -> None:
        self._deadline_timer = asyncio.get_running_loop().call_later(
            action.delay_s, self._look_at_deadline
        )

    def _do_deadline_hit(self, action: act.DeadlineHit) -> None:
        logger.error("run %s: hard_deadline passed; the channel stops", self._run_id)
        self._reporter.record("hard_deadline passed")
        self._waiters.state_changed()
        if self._stream is not None:
            self._stream.finish(StreamEnded("hard_deadline passed"))

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            self._turn = None
            self.feed(ev.LoopStarted())
            while self._turn is not None:
                turn, self._turn = self._turn, None
                if isinstance(turn, act.Dial):
                    await self._stream_once(self.addr, turn.keepalive_ms)
                    self.feed(ev.StreamOver(self._clock.monotonic_ms()))
                elif isinstance(turn, act.Backoff):
                    logger.info(
                        "run %s: reconnecting in %.0f ms (attempt %d)",
                        self._run_id,
                        turn.delay_ms,
                        turn.attempt,
                    )
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can
                    # turn a cancel into a TimeoutError (python/cpython#86296).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(turn.delay_ms / 1000):
                            await self._waiters.over.wait()
                    self.feed(ev.BackoffOver())
                else:
                    await self._rediscover()
                    self.feed(ev.Rediscovered())
        except WalRemovedError:
            return  # the log's listener failed the run (log_removed)
        except Exception as exc:
            # Errors from outside walchannel are failed attempts at their
            # boundary (discovery, the dial): what reaches here is walchannel's
            # own invariant breaking (StateError, an assertion, a bug). Fail
            # loudly rather than spin, naming it for inspect; nothing is dropped.
            logger.exception("run %s: the connection loop failed", self._run_id)
            what = f"{type(exc).__name__}: {exc}"
            error = WalchannelError(f"run {self._run_id}: connection loop failed: {what}")
            self.feed(ev.Failed(error, ev.Failure.INTERNAL, what))

    async def _rediscover(self) -> None:
        """Ask discovery for the engine's address; keep the last one on any failure.

        SPEC "Reconnect" (``GET {http_addr}/grpc-address``, validated against
        ``allowed_hosts`` before any dial); docs/design.md, "First address".
        """
        transport = self._transport
        reporter = self._reporter
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see _run
                addr = await transport.discover(timeout_s)
        except DiscoveryError as exc:
            why = reporter.redact(raw_message(exc))
            via = transport.discovery_route
            text = f"discovery{via}: {why}"
            # The same failure again (a closed client stays closed): said once.
            level = logging.WARNING if reporter.first_time(text) else logging.INFO
            logger.log(
                level,
                "run %s: discovery failed%s, keeping %s: %s",
                self._run_id,
                via,
                self.addr,
                why,
            )
            reporter.record(text)
            return
        except TimeoutError:
            via = transport.discovery_route
            logger.warning(
                "run %s: discovery timed out%s, keeping %s", self._run_id, via, self.addr
            )
            reporter.record(
                f"discovery{via}: no answer from {self._config.http_addr} within {timeout_s:.1f} s"
            )
            return
        except Exception as exc:
            reporter.foreign(f"discovery (keeping {self.addr})", exc)
            return
        if addr != self.addr:
            logger.info(
                "run %s: discovery moved the engine from %s to %s", self._run_id, self.addr, addr
            )
            self.addr = addr

    def _heartbeat(self) -> bytes:
        fields = (self._run_id, self._config.correlation_id)
        ts = messages.rfc3339_at(self._clock.wall_s())
        return wire.heartbeat_message(*fields, ts).SerializeToString()

    def log_removed(self, error: WalRemovedError) -> None:
        """The log's files were removed while open: nothing more can be logged; the run fails.

        The log's listener (``RunLog.on_removed``), called by the commit that found it.
        """
        self.feed(ev.Failed(error, ev.Failure.LOG_REMOVED))

    def _log_damaged(self, error: WalchannelError) -> None:
        """The writer found the log file damaged: re-dialing cannot mend it; stop, keep the rows."""
        self.feed(ev.Failed(error, ev.Failure.CORRUPT))

    def _violation(self, message: str) -> None:
        """The stream read what no correct engine sends (``message``): the stream ends."""
        self.feed(ev.ProtocolViolation(message))

    async def _stream_once(self, addr: str, keepalive_ms: int) -> None:
        """Dial ``addr``, handshake, stream until the stream ends; never raises for I/O."""
        try:
            call = self._transport.dial(addr, keepalive_ms=keepalive_ms)
        except Exception as exc:  # channel creation, a malformed proxy variable
            self._reporter.foreign(f"dialing {addr}", exc)
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
            on_violation=self._violation,
            heartbeat=self._heartbeat,
            acks_handshake=self._config.engine_acks_handshake,
            replica=self._replica,
            note_writing=self._log.note_writing,
        )
        self._stream = stream
        try:
            await self._open(stream)
            if not stream.ended.is_set() and not self._driver.final:
                await stream.ended.wait()
        finally:
            # Cancelled from outside: close before the teardown's awaits, so
            # the waiters wake now, not once the network lets go.
            cancelled = self._close_if_cancelled()
            await stream.read_final_status()
            self._rows.clear_readahead()
            await stream.teardown()
            self._stream = None
            if not self._driver.closed and not cancelled:
                self._record_end(stream)

    async def _open(self, stream: Stream) -> None:
        """Send the handshake, take the answer, start writing. Ends ``stream`` on failure."""
        hello = self.hello().SerializeToString()
        took_over = self._log.writer.take_over  # the answer's ack clears the mark
        timeout_s = self._config.connect_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await stream.call.write(hello)
                ack = await stream.answer if self._config.engine_acks_handshake else None
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
        engine_high = None
        if ack is not None:
            engine_high = ack.seq
            if not self._judge_resume(stream, ack, took_over):
                return
        if self._commit_pending is not None:
            # Rows handed out before the answer are judged and renumbered with
            # the log's: the driver reads the high-water when it takes the answer.
            try:
                self._commit_pending()
            except WalWriteError as exc:
                self._reporter.record(raw_message(exc))
                stream.finish(StreamEnded("handshake answer refused"))
                return
            except GroupCommitError:
                # Given up: the run failed naming its seqs (its files removed).
                stream.finish(StreamEnded("handshake answer refused"))
                return
        try:
            # None (engine_acks_handshake=False) is decided too: replay from the cursor.
            self.feed(ev.Answered(engine_high, self._clock.monotonic_ms()))
        finally:
            self._resume_to_store = None  # a refused answer's point is never stored
            self._resync = False

    def _do_start_stream(self, action: act.StartStream) -> None:
        """The answer was taken: store its resume point, start the writer and the watchdog."""
        stream = self._stream
        assert stream is not None  # only the answer of a live stream starts one
        if not stream.ended.is_set():
            self._store_resume()
            if self._resync:
                self._resync_marker()
        self._waiters.state_changed()
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

    def _judge_resume(self, stream: Stream, ack: pb.Ack, took_over: bool) -> bool:
        """Judge the resume point of the engine's answer; keep what to store of it.

        Stored with the answer's ack, not before it: by the verification
        transaction that clears a takeover mark (so a kill cannot part
        them), or just after an ack that clears none (:meth:`_store_resume`);
        an answer the driver refuses stores nothing of it. Returns False when
        the point is impossible: a protocol error, nothing applied, the stream
        ended. SPEC "The engine keeps the resume point".
        """
        self._resume_to_store = None
        try:
            point = wire.resume_point(ack)
        except ValueError as exc:
            self._violation(
                f"the engine at {stream.addr} answered the handshake with {exc}; the stream"
                " is ended and dialed again"
            )
            return False
        before = self.engine_resume
        resume: dict[str, Any] | None = None
        if point is None:
            if before is not None:
                logger.warning(
                    "run %s: the engine at %s no longer keeps the run's resume point: no more"
                    " progress rows are logged for it, and a takeover costs what it did"
                    " without one (docs/operations.md)",
                    self._run_id,
                    stream.addr,
                )
        else:
            # A takeover's point stays the runner's until the log has progress of its own.
            kept = before is not None and before["takeover"] and self._log.progress is None
            resume = {
                "marker": point.marker,
                "seq": point.seq,
                "applied": point.applied,
                "digests": list(point.digests),
                "rows": point.rows,
                "takeover": took_over or kept,
            }
        if resume != before:
            self._resume_to_store = (resume,)
        # A first (or renewed) announcement: the rows logged before it carry no
        # marker rows, so one repeating the log's marker follows them.
        self._resync = before is None and resume is not None
        return True

    def _resync_marker(self) -> None:
        """Log a ``progress`` row repeating the log's marker (the engine just announced a point).

        Rows after the engine's point are then only the first rows of one
        stretch, as the runner's takeover counts on (SPEC "The engine keeps
        the resume point"). Nothing without a marker, or on a log past its
        ``Done``.
        """
        self._resync = False
        marker = self._log.progress
        if marker is None or self._log.state.done_seq is not None:
            return
        try:
            items = [self._rows.prepare("progress", {"marker": marker, "digests": []})]
            seqs = self._log.append_encoded(items)
        except WalchannelError as exc:
            logger.warning("run %s: cannot log the marker for the engine: %s", self._run_id, exc)
            return
        self._rows.on_commit(seqs, items)
        self._wakeup.set()

    def _verify_resume(self) -> str | None:
        """The resume point for the verification transaction to store (JSON), or None."""
        pending = self._resume_to_store
        if pending is None or pending[0] is None:
            return None  # a point withdrawn is stored after (no mark depends on it)
        return json.dumps(pending[0], sort_keys=True)

    def _store_resume(self) -> None:
        """Store the judged resume point, unless the verification did or the answer was refused."""
        pending, self._resume_to_store = self._resume_to_store, None
        if pending is None:
            return
        resume = pending[0]
        try:
            self._log.update_meta(
                engine_resume=None if resume is None else json.dumps(resume, sort_keys=True)
            )
        except WalchannelError as exc:
            logger.warning("run %s: cannot store the resume point: %s", self._run_id, exc)
            return  # the rows go on; a later answer stores it
        self.engine_resume = resume

    def hello(self) -> pb.UpMessage:
        """The handshake: its stored fields and the log's writer identity (SPEC "Wire contract").

        It asks to take the run over while the log is marked so (until the
        first answered handshake clears the mark).
        """
        fields = self.handshake_fields or ("", "", "")
        writer = self._log.writer
        return wire.handshake_message(
            self._run_id,
            self._config.correlation_id,
            *fields,
            writer_id=writer.id,
            writer_epoch=writer.epoch,
            take_over=writer.take_over,
        )

    def _do_clear_failed_mark(self, action: act.ClearFailedMark) -> None:
        try:
            self._log.update_meta(failed_at=None, failed_reason=None)
        except WalchannelError as exc:
            logger.warning("run %s: cannot clear the failed mark: %s", self._run_id, exc)

    def _do_verify(self, action: act.Verify) -> None:
        """``RunLog.verify(h)`` with the judged resume point; answer with its outcome."""
        try:
            shift = self._log.verify(action.high, engine_resume=self._verify_resume())
        except WalWriteError as exc:
            self.feed(ev.VerificationFailed(raw_message(exc)))
            return
        pending = self._resume_to_store
        if pending is not None and pending[0] is not None:
            self.engine_resume, self._resume_to_store = pending[0], None
        self.feed(ev.Verified(action.high, shift, self._clock.monotonic_ms()))

    def _do_renumbered(self, action: act.Renumbered) -> None:
        logger.warning(
            "run %s: the engine already holds seqs up to %d, at or above this log's "
            "unverified rows (from %s); moved them by %d to follow it",
            self._run_id,
            action.high,
            action.unverified,
            action.shift,
        )
        self._rows.clear_tail()
        # Seqs handed out before now live higher: waiters re-read their targets.
        self._waiters.wake_all()

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
        text = self._reporter.redact(text)
        self._ended = stream
        try:
            self.feed(ev.Ended(code, details, debug, text))
        finally:
            self._ended = None

    def _ended_stream(self) -> Stream:
        stream = self._ended
        assert stream is not None  # only a stream's end asks for these
        return stream

    def _do_keepalive_doubled(self, action: act.KeepaliveDoubled) -> None:
        logger.warning(
            "run %s: the engine sent GOAWAY too_many_pings; keepalive %d -> %d ms for "
            "the rest of the run",
            self._run_id,
            action.before,
            action.after,
        )

    def _say_end(self, text: str, *, loud: bool) -> Stream:
        """Say how the stream ended (WARNING the first time, then INFO); return the stream."""
        stream = self._ended_stream()
        logger.log(
            logging.WARNING if loud else logging.INFO,
            "run %s: stream to %s%s ended: %s",
            self._run_id,
            stream.addr,
            stream.route,
            text,
        )
        return stream

    def _do_record_end(self, action: act.RecordEnd) -> None:
        stream = self._say_end(action.text, loud=action.loud)
        self._reporter.record(f"{stream.addr}{stream.route}: {action.text}")

    def _do_set_aside_refused(self, action: act.SetAsideRefused) -> None:
        stream = self._say_end(action.text, loud=action.loud)
        refused = self._refused.on_refusal(
            stream.addr, stream.top_written, action.refusal, action.text
        )
        if refused is not None:
            self._waiters.refuse_approval(refused.request_id, refused.error)

    def _do_say_down_too_large(self, action: act.SayDownTooLarge) -> None:
        """A down message was over ``max_receive_message_bytes``: name the field; retry.

        SPEC "Down messages": the engine likely sends it again after every
        handshake, so each stream ends the same way; said at ERROR once per
        distinct text (then at INFO), kept in ``last_error``, and the
        connection loop backs off as after any end. An end whose status
        grpc.aio lost to a write (grpc/grpc#36066) keeps this cause (``kept``).
        """
        stream = self._ended_stream()
        why = down_too_large_text(action.found, self._config.max_receive_message_bytes)
        where = f"{stream.addr}{stream.route}"
        first = self._reporter.first_time(why)
        if action.kept:
            # gRPC lost this stream's status: the last one it gave stands.
            logger.info(
                "run %s: stream to %s ended: %s; taken as the same cause as before: %s",
                self._run_id,
                where,
                action.text,
                why,
            )
        else:
            logger.log(
                logging.ERROR if first else logging.INFO,
                "run %s: stream to %s ended: %s (gRPC: %s)",
                self._run_id,
                where,
                why,
                action.text,
            )
        self._reporter.record(f"{where}: {why}")

    def _do_mark_completed(self, action: act.MarkCompleted) -> None:
        if self._log.writable:
            try:
                self._log.complete_by_engine()
            except WalchannelError as exc:
                logger.warning("run %s: cannot mark the log completed: %s", self._run_id, exc)

    def _do_tombstone(self, action: act.Tombstone) -> None:
        """Our ``Done`` was applied but its ack was lost: the log becomes a tombstone."""
        if self._log.writable:
            try:
                self._log.complete_by_engine()
            except WalchannelError as exc:
                logger.error("run %s: cannot mark the log completed: %s", self._run_id, exc)
            else:
                logger.info(
                    "run %s: the engine applied this run's Done; the log is now a tombstone",
                    self._run_id,
                )
                self.feed(ev.TombstoneStored())
                return
        self.feed(ev.TombstoneNotStored())

    # -- down messages ---------------------------------------------------------------------

    def _on_down(self, msg: pb.DownMessage, now: float) -> None:
        kind = msg.WhichOneof("body")
        if kind == "ack":
            self.feed(ev.AckReceived(msg.ack.seq, now))
        elif kind == "stop":
            self.feed(ev.StopReceived(msg.stop.reason))
        elif kind == "approval_decision":
            d = msg.approval_decision
            self.feed(ev.DecisionReceived(d.request_id, d.approved, d.reason))
        elif kind == "budget_update":
            details = wire.struct_to_dict(msg.budget_update.details)
            for callback in list(self.budget_callbacks):
                self._reporter.call_back(callback, msg.budget_update.message, details)
        else:
            self._say(
                "down messages with an unknown body",
                logging.WARNING,
                "run %s: ignoring a down message with an unknown body (a newer engine's?)",
                self._run_id,
            )

    def _say(self, kind: str, level: int, message: str, *args: object) -> None:
        """A per-message line: once per kind per stream, the rest counted (OncePerKind)."""
        stream = self._stream
        assert stream is not None  # down messages come only from a stream's reader
        stream.said.say(kind, level, message, *args)

    def _do_stop_callbacks(self, action: act.StopCallbacks) -> None:
        reason = action.reason
        logger.info("run %s: the engine sent Stop(%r)", self._run_id, self._reporter.redact(reason))
        for callback in list(self.stop_callbacks):
            self._reporter.call_back(callback, reason)

    def _do_resolve_approval(self, action: act.ResolveApproval) -> None:
        decision = ApprovalDecision(action.request_id, action.approved, action.reason)
        if not self._waiters.decided(decision):
            self._say(
                "decisions no call waits on",
                logging.INFO,
                "run %s: decision for approval request %r that this channel is not "
                "waiting on; cached",
                self._run_id,
                action.request_id,
            )

    # -- acks ------------------------------------------------------------------------------

    def _do_ack_moved(self, action: act.AckMoved) -> None:
        """The received ack moved: drop acked rows from the tail, wake the waiters it answers.

        Waiters (``wait_acked``, ``send_done``) are woken only when the ack
        reaches the lowest seq one of them waits for (:attr:`Waiters.wake_at
        <walchannel.channel.waiters.Waiters.wake_at>`).
        """
        if action.received:
            _killpoints.reached("after_ack_received")
        acked = self._driver.acked
        self._rows.drop_acked(acked)
        self._waiters.ack_moved(acked)

    def _do_store_ack(self, action: act.StoreAck) -> None:
        """Store the ack the driver says is due (``RunLog.ack``).

        Answers ``AckStored``, or ``AckStoreFailed`` (the driver arms the retry).
        """
        if not self._log.writable:
            return
        try:
            self._log.ack(action.seq)
        except WalRemovedError:
            return  # the log's listener failed the run (log_removed)
        except ReentrantCallError:
            # A signal handler's refused call, let go: it reaches the call the
            # handler interrupted (close(), a send), as any signal's exception.
            # The driver hears of it first, or no store would be tried again.
            self.feed(ev.AckStoreFailed(action.seq, self._clock.monotonic_ms()))
            raise
        except WalchannelError as exc:
            # Not stored: the rows stay and are re-sent after a crash (harmless).
            # The error names the run, the ack and the file already.
            logger.error("%s; the acked rows stay until a later try stores it", exc)
            self._reporter.note(raw_message(exc))
            self.feed(ev.AckStoreFailed(action.seq, self._clock.monotonic_ms()))
            return
        self.feed(ev.AckStored(action.seq, self._clock.monotonic_ms()))

    def _do_done_acked(self, action: act.DoneAcked) -> None:
        logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)
        self._waiters.wake_all()

    def _do_checkpoint(self, action: act.Checkpoint) -> None:
        self._reclaim.step()

    def _do_arm_checkpoint_timer(self, action: act.ArmCheckpointTimer) -> None:
        self._reclaim.arm(action.delay_ms)

    def _do_arm_ack_timer(self, action: act.ArmAckTimer) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: stored at close
            self._ack_timer = asyncio.get_running_loop().call_later(
                action.delay_ms / 1000, self._ack_timer_fired
            )

    def _ack_timer_fired(self) -> None:
        self._ack_timer = None
        self.feed(ev.AckTimerFired(self._clock.monotonic_ms()))
