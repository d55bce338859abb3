"""Spending a termination grace period well (SPEC "Grace period").

A platform stops a process with SIGTERM first and SIGKILL a grace period
later (Kubernetes: ``terminationGracePeriodSeconds``, 30 s by default;
systemd: ``TimeoutStopSec``; ``docker stop``: 10 s). Without a handler,
SIGTERM kills a harness like SIGKILL: nothing is lost (the log has every
row), but the backlog waits for the next start. :class:`GracePeriod` turns
the signal into a flag the harness's work loop checks, then spends what is
left of the period letting the backlog drain before closing in order, and
says in its exit code whether rows were left in the log.

This module imports neither grpc nor SQLite: it drives any channel with
``wait_acked``, ``unacked_count`` and ``close`` (``GrpcEngineChannel``,
``BlockingEngineChannel``, ``testing.InMemoryEngineChannel``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Iterable
from types import FrameType
from typing import Any, Final, Protocol, Self

from walchannel._logging import get_logger
from walchannel.clock import Clock, SystemClock

__all__ = ["EXIT_ROWS_LEFT", "EXIT_STOPPED", "GracePeriod"]

logger = get_logger(__name__)

#: Stopped by the signal with every logged row acked: 128 + SIGTERM, what a
#: shell reports for a process SIGTERM ended. Non-zero, so a job runner does
#: not take the unfinished scan for a finished one and starts it again.
EXIT_STOPPED: Final = 128 + signal.SIGTERM
#: Stopped by the signal with rows left in the log (EX_TEMPFAIL, sysexits.h):
#: the next start, or ``walchannel flush``, delivers them.
EXIT_ROWS_LEFT: Final = 75

#: How often :meth:`GracePeriod.wait_acked` looks for a stop request (ms).
STOP_POLL_MS: Final = 200.0
#: What ``drain`` keeps back for ``close()`` by default, seconds: with the
#: engine up it takes well under one; ``close_timeout_ms`` (2 s) bounds the
#: wait for the stream's end, the rest covers the teardown.
CLOSE_RESERVE_S: Final = 3.0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _AsyncChannel(Protocol):
    @property
    def unacked_count(self) -> int: ...

    def wait_acked(
        self, seq: int | None = None, timeout_ms: float | None = None
    ) -> Awaitable[bool]: ...

    def close(self) -> Awaitable[None]: ...


class _SyncChannel(Protocol):
    @property
    def unacked_count(self) -> int: ...

    def wait_acked(self, seq: int | None = None, timeout_ms: float | None = None) -> bool: ...

    def close(self, *, timeout_ms: float | None = None) -> None: ...


class GracePeriod:
    """SIGTERM as a request to stop: finish the item in hand, drain, close, exit.

    Use it as a context manager around the harness's work (it installs its
    handler with :func:`signal.signal`, so enter it in the main thread, and
    restores the previous handlers on exit)::

        with GracePeriod(seconds=25) as grace:
            for item in work:
                if grace.stopping:
                    return await grace.drain(channel)   # EXIT_STOPPED or EXIT_ROWS_LEFT
                ...

    Outside the work loop, wait for acks with :meth:`wait_acked` (a stop
    request ends it) and then ``drain``. A second signal changes nothing
    (the platform's SIGKILL ends the process anyway); the rows are in the
    log either way. SPEC "Grace period"; docs/deployment.md.

    Args:
        seconds: the grace period the platform gives, seconds (> 0), counted
            from the signal. Give a little less than the platform's
            (Kubernetes' default is 30 s): ``drain`` returns within it.
        signals: the signals that request the stop (default: SIGTERM only;
            add ``signal.SIGINT`` to treat Ctrl-C alike).
        close_reserve_s: the part of the period ``drain`` keeps for
            ``close()``, seconds (>= 0, less than ``seconds``).
        clock: what the period is measured by (default the system's
            monotonic clock; the simulator's is virtual).

    Raises:
        ValueError: a bound is not a finite number in range, or ``signals``
            is empty; on entering, outside the main thread.
        OSError: on entering, a signal that cannot be caught (SIGKILL); the
            handlers already installed are restored first.
    """

    def __init__(
        self,
        seconds: float,
        *,
        signals: Iterable[int] = (signal.SIGTERM,),
        close_reserve_s: float = CLOSE_RESERVE_S,
        clock: Clock | None = None,
    ) -> None:
        if not _is_number(seconds) or not 0 < seconds < float("inf"):
            raise ValueError(f"GracePeriod: seconds must be a finite number > 0, got {seconds!r}")
        if not _is_number(close_reserve_s) or not 0 <= close_reserve_s < seconds:
            raise ValueError(
                f"GracePeriod: close_reserve_s must be >= 0 and below seconds={seconds!r},"
                f" got {close_reserve_s!r}"
            )
        self._signals = tuple(signals)
        if not self._signals:
            raise ValueError("GracePeriod: signals is empty: give at least one (signal.SIGTERM)")
        self._seconds = float(seconds)
        self._reserve_s = float(close_reserve_s)
        self._saved: dict[int, Any] = {}
        self._stopping = threading.Event()
        self._signalled_at: float | None = None
        self._signum: int | None = None
        self._clock = clock or SystemClock()

    def _now_s(self) -> float:
        return self._clock.monotonic_ms() / 1000

    # -- the signal ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        if threading.current_thread() is not threading.main_thread():
            # Python runs signal handlers in the main thread only.
            raise ValueError(
                "GracePeriod: enter it in the main thread (Python delivers signals there),"
                f" not in {threading.current_thread().name!r}"
            )
        try:
            for signum in self._signals:
                self._saved[signum] = signal.signal(signum, self._on_signal)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_stop(signum)

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Start the period as signal ``signum`` would: for a handler installed another way.

        The runner installs it with ``loop.add_signal_handler`` (which works
        off the main thread and never runs inside a call of the channel)
        instead of entering this object. A second request changes nothing.

        Args:
            signum: the signal that asked for the stop (its number makes the
                exit code: 128 + ``signum``).
        """
        if self._stopping.is_set():
            return
        self._signalled_at = self._now_s()
        self._signum = signum
        self._stopping.set()
        # A signal handler may not log (the logging lock may be held by the
        # interrupted frame): drain() says what happened.

    @property
    def stopping(self) -> bool:
        """True once a stop was requested: take no more work."""
        return self._stopping.is_set()

    def remaining_s(self) -> float:
        """Seconds left of the grace period (the whole period before any signal)."""
        if self._signalled_at is None:
            return self._seconds
        return max(0.0, self._signalled_at + self._seconds - self._now_s())

    # -- waiting, cut short by a stop request ------------------------------------------

    def _step_ms(self, deadline: float | None) -> float:
        if self.stopping:
            return 0.0
        if deadline is None:
            return STOP_POLL_MS
        return min(STOP_POLL_MS, max(0.0, (deadline - self._now_s()) * 1000))

    async def wait_acked(self, channel: _AsyncChannel, timeout_ms: float | None = None) -> bool:
        """``channel.wait_acked()`` for every logged row, ended early by a stop request.

        For the long waits outside the work loop (a backlog draining after
        ``Done``): a SIGTERM then leaves the whole grace period to
        :meth:`drain` instead of being noticed only after the wait.

        Args:
            channel: an asyncio channel (``GrpcEngineChannel``).
            timeout_ms: bound (ms; None: until acked or a stop request).

        Returns:
            True once every logged row is acked; False at ``timeout_ms``,
            within 200 ms of a stop request (check :attr:`stopping`), or as
            soon as the channel's own wait ends early (closed, failed,
            expired: no ack can come).
        """
        deadline = None if timeout_ms is None else self._now_s() + timeout_ms / 1000
        while True:
            step = self._step_ms(deadline)
            began = self._now_s()
            if await channel.wait_acked(timeout_ms=step):
                return True
            if self.stopping or (deadline is not None and self._now_s() >= deadline):
                return False
            if self._now_s() - began < step / 1000:
                return False  # it ended before its step: closed, failed or expired

    def wait_acked_blocking(self, channel: _SyncChannel, timeout_ms: float | None = None) -> bool:
        """:meth:`wait_acked` for a ``BlockingEngineChannel`` (blocks the calling thread)."""
        deadline = None if timeout_ms is None else self._now_s() + timeout_ms / 1000
        while True:
            step = self._step_ms(deadline)
            began = self._now_s()
            if channel.wait_acked(timeout_ms=step):
                return True
            if self.stopping or (deadline is not None and self._now_s() >= deadline):
                return False
            if self._now_s() - began < step / 1000:
                return False  # it ended before its step: closed, failed or expired

    # -- draining --------------------------------------------------------------------------

    def _drain_budget_ms(self) -> float:
        return max(0.0, self.remaining_s() - self._reserve_s) * 1000

    def _exit_code(self, rows_left: int) -> int:
        name = signal.Signals(self._signum).name if self._signum is not None else "stop"
        if rows_left:
            logger.warning(
                "%s: closed with %d row(s) unacked in the log; the next start or"
                " `walchannel flush` delivers them",
                name,
                rows_left,
            )
            return EXIT_ROWS_LEFT
        logger.info("%s: closed with every logged row acked", name)
        return EXIT_STOPPED if self._signum is None else 128 + self._signum

    async def drain(self, channel: _AsyncChannel) -> int:
        """Wait for the backlog's acks within the period, close the channel, return the exit code.

        Waits (``wait_acked``) until every logged row is acked or only
        ``close_reserve_s`` of the period is left, then closes the channel
        (SPEC "Shutdown order": half-close, store the ack, release the log).
        Rows not acked stay in the log for the next start.

        Args:
            channel: an asyncio channel (``GrpcEngineChannel``).

        Returns:
            :data:`EXIT_STOPPED` (143, 128 + SIGTERM; 128 + the number of
            another signal that requested the stop) when nothing is left in
            the log, :data:`EXIT_ROWS_LEFT` (75) when rows are.
        """
        try:
            await channel.wait_acked(timeout_ms=self._drain_budget_ms())
            rows_left = channel.unacked_count
        finally:
            await channel.close()
        return self._exit_code(rows_left)

    def drain_blocking(self, channel: _SyncChannel) -> int:
        """:meth:`drain` for a ``BlockingEngineChannel`` (blocks the calling thread).

        ``close(timeout_ms=...)`` gets what is left of the period: a
        callback still running on the channel's dispatcher is waited for
        that long at most, and the queued ones are dropped, so a slow
        callback cannot keep the process past the period.
        """
        try:
            channel.wait_acked(timeout_ms=self._drain_budget_ms())
            rows_left = channel.unacked_count
        finally:
            channel.close(timeout_ms=self.remaining_s() * 1000)
        return self._exit_code(rows_left)
