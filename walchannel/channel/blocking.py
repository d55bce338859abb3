"""BlockingEngineChannel: the durable channel for harnesses that are not asyncio programs.

It runs a :class:`~walchannel.GrpcEngineChannel` on an event loop in a
private thread and offers the same methods without ``await``
(:class:`~walchannel.SyncEngineChannel`). Every method may be called from
any thread; each call runs on the loop thread and returns its result or
raises its exception. Callbacks (``on_stop``, ``on_budget_update``) run on
a dispatcher thread of their own, so a callback may call the channel.
``close()`` closes the channel and joins the loop thread; it drops the
callbacks still queued (one log line gives the count) and waits a bounded
time for the one running, so a slow callback cannot stretch a shutdown
past a grace period. Every call made while ``close()`` runs gets its
result or ``ChannelClosedError``: calls already queued on the loop run to
their end (the closed channel refuses them) before the loop stops, and
none is ever left waiting on a stopped loop. A call that waits on the engine
(``handshake``, ``send_done``, ``wait_acked``, ``request_approval``) made on
a thread that runs an asyncio event loop raises
:class:`~walchannel.RunningLoopError` at once: it would block that loop, and
deadlock with an engine served by it. SPEC "The channel".
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self, TypeVar

from walchannel._logging import get_logger
from walchannel.channel.grpc_channel import GrpcEngineChannel
from walchannel.channel.handoff import Handoff
from walchannel.channel.interface import (
    ApprovalDecision,
    BudgetCallback,
    ChannelStats,
    StopCallback,
)
from walchannel.config import GrpcChannelConfig
from walchannel.core.driver import ChannelState
from walchannel.errors import (
    ChannelClosedError,
    ReentrantCallError,
    RunningLoopError,
    WalchannelError,
)

__all__ = ["BlockingEngineChannel"]

logger = get_logger(__name__)

# Channels not closed yet: the interpreter's exit closes them (their loop
# threads are daemons, which would otherwise die with unsent rows).
_LEFT_OPEN: set[BlockingEngineChannel] = set()


@atexit.register
def _close_left_open() -> None:
    for channel in list(_LEFT_OPEN):
        try:
            channel._close_at_exit()
        except Exception:
            logger.exception("closing %r at exit failed", channel)


_T = TypeVar("_T")
#: How long close() lets calls still queued on the loop finish (they return
#: or raise ChannelClosedError at once on a closed channel) before it cancels them.
DRAIN_TIMEOUT_S = 5.0


class BlockingEngineChannel:
    """A thread-safe, blocking facade over :class:`~walchannel.GrpcEngineChannel`.

    The constructor starts the loop thread and opens the channel there (so
    the log's SQLite connection lives on that thread); its errors surface
    here as in the async constructor. Use it as a context manager or call
    :meth:`close`.

    Args:
        config: the run's :class:`~walchannel.GrpcChannelConfig`.

    The constructor, the sends, ``close()`` and the read-outs never wait on
    the engine (``close()`` waits at most ``close_timeout_ms``), so any
    thread may call them, one running an event loop too. The calls that
    wait on the engine refuse such a thread (:meth:`_refuse_in_loop`).

    Raises:
        RunCompletedError, WalLockedError, WalCorruptError, WalWriteError:
            as :class:`~walchannel.GrpcEngineChannel`.
    """

    def __init__(self, config: GrpcChannelConfig) -> None:
        self._run_id = config.run_id
        # Per calling thread: how many calls it waits in (a handler's send then is refused).
        self._waiting = threading.local()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name=f"walchannel-loop-{config.run_id}", daemon=True
        )
        self._loop_thread.start()
        # Callbacks waiting for the dispatcher, under _dispatch_cond; once
        # _dispatch_stopped, new ones are counted in _dropped instead.
        self._callbacks: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._dispatch_cond = threading.Condition()
        self._dispatch_stopped = False
        self._dropped = 0
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"walchannel-callbacks-{config.run_id}", daemon=True
        )
        # Taken once, by the first close(), and never given back: a test-and-set
        # that neither another thread nor a signal handler's close() can block on.
        self._close_once = threading.Lock()
        # The calls submitted to the loop and not finished. No lock guards them:
        # a signal handler's call on a thread inside _submit must never wait on
        # one (issue 52); set.add and set.discard are atomic, and _submit checks
        # the loop again after adding (see there).
        self._calls: set[Handoff[Any]] = set()
        self._accepting = True

        async def build() -> GrpcEngineChannel:
            return GrpcEngineChannel(config)

        try:
            self._channel = self._submit(build())
        except BaseException:
            self._stop_loop()
            raise
        self._dispatcher.start()
        _LEFT_OPEN.add(self)

    # -- plumbing -----------------------------------------------------------------

    def _submit(
        self, coro: Coroutine[Any, Any, _T], *, closing: bool = False, read: bool = False
    ) -> _T:
        if threading.current_thread() is self._loop_thread:
            coro.close()
            raise RunningLoopError(
                f"run {self._run_id}: BlockingEngineChannel called from its own loop thread "
                "(it would wait on itself)"
            )
        if not (self._accepting or closing) or self._loop.is_closed():
            coro.close()
            raise ChannelClosedError("the blocking channel is closed")
        depth: int = getattr(self._waiting, "depth", 0)
        if depth and not read:
            # A signal handler's call inside another call's wait on this thread:
            # nested waits under a fast timer grow without bound (RecursionError).
            coro.close()
            raise ReentrantCallError(
                f"run {self._run_id}: a call of the blocking channel was made while this "
                "thread waits in another one (a signal handler): refused, nothing logged; "
                "call it after that call returns"
            )
        call: Handoff[_T] = Handoff()
        self._calls.add(call)  # before it runs: its end discards it
        try:
            asyncio.run_coroutine_threadsafe(call.run(coro, self._calls), self._loop)
        except RuntimeError as exc:  # closed meanwhile, by another thread
            self._calls.discard(call)
            coro.close()
            # asyncio's own words kept: "Event loop is closed", or what else it was.
            raise ChannelClosedError(f"the blocking channel is closed ({exc})") from None
        if self._loop.is_closed():
            # _stop_loop closes the loop before it fails the calls left: one
            # added after that look is failed here (the other side of the race).
            call.finish(error=ChannelClosedError("the blocking channel is closed"))
        self._waiting.depth = depth + 1
        try:
            return call.wait()
        finally:
            self._waiting.depth = depth

    def _refuse_in_loop(self, call: str) -> None:
        """Raise :class:`~walchannel.RunningLoopError` when this thread runs an event loop.

        Called first by every call that waits on the engine, before anything
        is logged: blocking such a thread freezes its loop until the engine
        answers, for ever when the engine (an in-process ``LocalEngine``) or
        anything the answer needs runs on that loop. SPEC "The channel".
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop on this thread: blocking it is fine
            return
        raise RunningLoopError(
            f"run {self._run_id}: BlockingEngineChannel.{call}() called on a thread that runs "
            "an asyncio event loop: it would block that loop until the engine answers, and "
            "never return if the engine or what its answer needs runs on that loop; in async "
            f"code use GrpcEngineChannel ('await channel.{call}(...)'), or call this from "
            "another thread (asyncio.to_thread)"
        )

    def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        async def run() -> _T:
            return fn(*args, **kwargs)

        return self._submit(run())

    def _read(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on the loop: a read, never refused (also inside another call's wait)."""

        async def run() -> _T:
            return fn()

        return self._submit(run(), read=True)

    def _enqueue(self, callback: Callable[..., None], *args: Any) -> None:
        """Hand a callback to the dispatcher thread (runs on the loop thread)."""
        with self._dispatch_cond:
            if self._dispatch_stopped:
                self._dropped += 1
                return
            self._callbacks.append((callback, args))
            self._dispatch_cond.notify()

    def _dispatch(self) -> None:
        while True:
            with self._dispatch_cond:
                while not self._callbacks and not self._dispatch_stopped:
                    self._dispatch_cond.wait()
                if self._dispatch_stopped:
                    return
                callback, args = self._callbacks.popleft()
            try:
                callback(*args)
            except Exception:
                logger.exception("callback %r raised; ignored", callback)

    def _stop_dispatching(self) -> None:
        """Drop the queued callbacks (counted) and let the dispatcher end after the one in hand."""
        with self._dispatch_cond:
            self._dispatch_stopped = True
            self._dropped += len(self._callbacks)
            self._callbacks.clear()
            self._dispatch_cond.notify()

    def _stop_loop(self) -> None:
        """Refuse new calls, let queued ones finish, stop and close the loop, fail leftovers."""
        self._accepting = False
        if self._loop.is_running() and threading.current_thread() is not self._loop_thread:
            # Runs after every call queued so far (the loop is FIFO): each one
            # gets its result or the closed channel's ChannelClosedError.
            drain = asyncio.run_coroutine_threadsafe(self._drain(), self._loop)
            try:
                drain.result(DRAIN_TIMEOUT_S + 5)
            except Exception:
                logger.exception("draining the loop's calls failed")
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._loop_thread:
            self._loop_thread.join()
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
        # Nothing left can run now: a caller still waiting gets an answer.
        for call in self._calls.copy():
            call.finish(error=ChannelClosedError("the blocking channel is closed"))

    async def _drain(self) -> None:
        """Wait for the other tasks on the loop (the callers' calls), then cancel stragglers."""
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning("close(): cancelled %d call(s) still running on the loop", len(pending))
            await asyncio.wait(pending, timeout=DRAIN_TIMEOUT_S)

    # -- the SyncEngineChannel surface ------------------------------------------------

    @property
    def config(self) -> GrpcChannelConfig:
        """The configuration."""
        return self._channel.config

    @property
    def state(self) -> ChannelState:
        """The channel's state."""
        return self._channel.state

    @property
    def last_acked_seq(self) -> int:
        """The highest seq received in an ack."""
        return self._read(lambda: self._channel.last_acked_seq)

    @property
    def unacked_count(self) -> int:
        """Logged rows not covered by a received ack."""
        return self._read(lambda: self._channel.unacked_count)

    def handshake(self, connector_version: str, harness_name: str, harness_version: str) -> None:
        """As :meth:`GrpcEngineChannel.handshake`, blocking up to ``connect_timeout_ms``.

        Raises:
            RunningLoopError: called on a thread that runs an event loop.
            EngineUnavailableError, RunCompletedError: as the async call.
        """
        self._refuse_in_loop("handshake")
        self._submit(self._channel.handshake(connector_version, harness_name, harness_version))

    def send_event(
        self,
        type: str,
        severity: str,
        payload: Mapping[str, Any],
        ts: datetime | str | None = None,
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> int:
        """As :meth:`GrpcEngineChannel.send_event`: returns the seq once committed."""
        return self._call(self._channel.send_event, type, severity, payload, ts, progress=progress)

    def send_finding(
        self, finding: Mapping[str, Any], *, progress: Mapping[str, Any] | None = None
    ) -> int:
        """As :meth:`GrpcEngineChannel.send_finding`."""
        return self._call(self._channel.send_finding, finding, progress=progress)

    def send_findings(
        self,
        findings: Iterable[Mapping[str, Any]],
        *,
        events: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
        progress: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """As :meth:`GrpcEngineChannel.send_findings` (one transaction)."""
        return self._call(
            self._channel.send_findings, list(findings), events=list(events), progress=progress
        )

    def send_done(
        self, status: str, findings: int, coverage: Sequence[str], exit_reason: str
    ) -> bool:
        """As :meth:`GrpcEngineChannel.send_done`, blocking up to ``done_ack_timeout_ms``.

        Raises:
            RunningLoopError: called on a thread that runs an event loop
                (nothing logged).
        """
        self._refuse_in_loop("send_done")
        return self._submit(self._channel.send_done(status, findings, coverage, exit_reason))

    def request_approval(
        self,
        action: str,
        details: Mapping[str, Any],
        *,
        request_id: str | None = None,
        timeout_ms: float | None = None,
    ) -> ApprovalDecision:
        """As :meth:`GrpcEngineChannel.request_approval`, blocking.

        Raises:
            RunningLoopError: called on a thread that runs an event loop
                (nothing logged).
            ApprovalTimeoutError, ChannelClosedError: as the async call.
        """
        self._refuse_in_loop("request_approval")
        return self._submit(
            self._channel.request_approval(
                action, details, request_id=request_id, timeout_ms=timeout_ms
            )
        )

    def wait_acked(self, seq: int | None = None, timeout_ms: float | None = None) -> bool:
        """As :meth:`GrpcEngineChannel.wait_acked`, blocking up to ``timeout_ms`` (ms).

        Raises:
            RunningLoopError: called on a thread that runs an event loop.
        """
        self._refuse_in_loop("wait_acked")
        return self._submit(self._channel.wait_acked(seq, timeout_ms))

    def replay_unacked(self) -> int:
        """As :meth:`GrpcEngineChannel.replay_unacked`."""
        return self._call(self._channel.replay_unacked)

    def progress(self) -> Mapping[str, Any] | None:
        """The last committed progress marker (None for a new run)."""
        return self._read(self._channel.progress)

    def stats(self) -> ChannelStats:
        """As :meth:`GrpcEngineChannel.stats`."""
        return self._read(self._channel.stats)

    def on_stop(self, callback: StopCallback) -> None:
        """Call ``callback(reason)`` on the dispatcher thread when the engine sends Stop (once)."""
        self._call(self._channel.on_stop, lambda reason: self._enqueue(callback, reason))

    def on_budget_update(self, callback: BudgetCallback) -> None:
        """Call ``callback(message, details)`` on the dispatcher thread for each BudgetUpdate."""
        self._call(
            self._channel.on_budget_update,
            lambda message, details: self._enqueue(callback, message, details),
        )

    def close(self, *, timeout_ms: float | None = None) -> None:
        """Close the channel, join the loop thread, stop the callbacks (idempotent).

        Callbacks still queued are dropped, never run; a callback already
        running gets up to ``timeout_ms`` from this call to end, and past it
        is left to finish on the dispatcher (a daemon thread, which then
        ends). One WARNING line gives the count dropped and says when a
        callback was left running. The channel's own close is bounded by
        ``close_timeout_ms`` as ever (SPEC "Shutdown order"); later calls
        raise ``ChannelClosedError``. From inside a callback it closes the
        channel and leaves the dispatcher thread to end by itself.

        Args:
            timeout_ms: how long to wait for a running callback, ms from
                this call (>= 0; default: the config's ``close_timeout_ms``).
                ``GracePeriod.drain_blocking`` passes what is left of the
                grace period.

        Raises:
            ValueError: ``timeout_ms`` is not a number >= 0 (nothing closed).
        """
        if timeout_ms is None:
            timeout_ms = self._channel.config.close_timeout_ms
        elif (
            not isinstance(timeout_ms, int | float)
            or isinstance(timeout_ms, bool)
            or not 0 <= timeout_ms < float("inf")
        ):
            raise ValueError(f"close: timeout_ms must be a finite number >= 0, got {timeout_ms!r}")
        deadline = time.monotonic() + timeout_ms / 1000
        if not self._close_once.acquire(blocking=False):
            return  # closed, or being closed (by another thread, or the call a handler interrupted)
        _LEFT_OPEN.discard(self)
        self._stop_dispatching()
        self._accepting = False
        try:
            self._submit(self._channel.close(), closing=True)
        finally:
            self._stop_loop()
            self._end_dispatcher(deadline, timeout_ms)

    def _end_dispatcher(self, deadline: float, timeout_ms: float) -> None:
        """Wait for the callback in hand until ``deadline``; say what was dropped or left."""
        if threading.current_thread() is not self._dispatcher and self._dispatcher.is_alive():
            self._dispatcher.join(max(0.0, deadline - time.monotonic()))
        left_running = (
            threading.current_thread() is not self._dispatcher and self._dispatcher.is_alive()
        )
        # The loop is stopped: no callback can be queued any more.
        with self._dispatch_cond:
            dropped = self._dropped
        if dropped or left_running:
            logger.warning(
                "run %s: close(): dropped %d queued callback(s) unrun%s",
                self._channel.config.run_id,
                dropped,
                f"; a callback still running after {timeout_ms:.0f} ms is left to finish"
                " on its daemon thread"
                if left_running
                else "",
            )

    def _close_at_exit(self) -> None:
        """The interpreter exits with this channel open: say so, give its logged rows
        up to ``close_timeout_ms`` to be acked, then :meth:`close`. SPEC "Cancellation"."""
        bound_ms = self._channel.config.close_timeout_ms
        with contextlib.suppress(WalchannelError):
            self._read(
                lambda: self._channel._say_left_open(
                    "BlockingEngineChannel never closed; walchannel closes it at exit, after"
                    f" up to {bound_ms} ms (close_timeout_ms) for its rows' acks. Close a"
                    " channel when the harness ends ('with BlockingEngineChannel(...)' or"
                    " 'channel.close()')"
                )
            )
            if self._channel.state is not ChannelState.IDLE:  # handshake() was called
                self.wait_acked(timeout_ms=bound_ms)
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<BlockingEngineChannel {self._channel!r}>"
