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

import logging
import signal
import threading
import time
from collections.abc import Awaitable, Iterable
from types import FrameType
from typing import Any, Final, Protocol, Self

__all__ = ["EXIT_ROWS_LEFT", "EXIT_STOPPED", "GracePeriod"]

logger = logging.getLogger(__name__)

#: Stopped by the signal with every logged row acked: 128 + SIGTERM, what a
#: shell reports for a process SIGTERM ended. Non-zero, so a job runner does
#: not take the unfinished scan for a finished one and starts it again.
EXIT_STOPPED: Final = 128 + signal.SIGTERM
#: Stopped by the signal with rows left in the log (EX_TEMPFAIL, sysexits.h):
#: the next start, or ``walchannel flush``, delivers them.
EXIT_ROWS_LEFT: Final = 75

#: What ``drain`` keeps back for ``close()`` by default, seconds: with the
#: engine up it takes well under one; ``close_timeout_ms`` (2 s) bounds the
#: wait for the stream's end, the rest covers the teardown.
CLOSE_RESERVE_S: Final = 3.0


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

    def close(self) -> None: ...


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

    A second signal during the drain is ignored (the platform's SIGKILL ends
    the process anyway); the rows are in the log either way.

    Args:
        seconds: the grace period the platform gives, seconds (> 0), counted
            from the signal. Give a little less than the platform's
            (Kubernetes' default is 30 s): ``drain`` returns within it.
        signals: the signals that request the stop (default: SIGTERM only;
            add ``signal.SIGINT`` to treat Ctrl-C alike).
        close_reserve_s: the part of the period ``drain`` keeps for
            ``close()``, seconds (>= 0, less than ``seconds``).

    Raises:
        ValueError: a bound is not a finite number in range.
    """

    def __init__(
        self,
        seconds: float,
        *,
        signals: Iterable[int] = (signal.SIGTERM,),
        close_reserve_s: float = CLOSE_RESERVE_S,
    ) -> None:
        if not isinstance(seconds, int | float) or not 0 < seconds < float("inf"):
            raise ValueError(f"GracePeriod: seconds must be a finite number > 0, got {seconds!r}")
        if not isinstance(close_reserve_s, int | float) or not 0 <= close_reserve_s < seconds:
            raise ValueError(
                f"GracePeriod: close_reserve_s must be >= 0 and below seconds={seconds!r},"
                f" got {close_reserve_s!r}"
            )
        self._seconds = float(seconds)
        self._reserve_s = float(close_reserve_s)
        self._signals = tuple(signals)
        self._saved: dict[int, Any] = {}
        self._stopping = threading.Event()
        self._signalled_at: float | None = None
        self._signum: int | None = None

    # -- the signal ----------------------------------------------------------------------

    def __enter__(self) -> Self:
        for signum in self._signals:
            self._saved[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            return
        self._signalled_at = time.monotonic()
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
        return max(0.0, self._signalled_at + self._seconds - time.monotonic())

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
        return EXIT_STOPPED

    async def drain(self, channel: _AsyncChannel) -> int:
        """Wait for the backlog's acks within the period, close the channel, return the exit code.

        Waits (``wait_acked``) until every logged row is acked or only
        ``close_reserve_s`` of the period is left, then closes the channel
        (SPEC "Shutdown order": half-close, store the ack, release the log).
        Rows not acked stay in the log for the next start.

        Args:
            channel: an asyncio channel (``GrpcEngineChannel``).

        Returns:
            :data:`EXIT_STOPPED` (143) when nothing is left in the log,
            :data:`EXIT_ROWS_LEFT` (75) when rows are.
        """
        try:
            await channel.wait_acked(timeout_ms=self._drain_budget_ms())
            rows_left = channel.unacked_count
        finally:
            await channel.close()
        return self._exit_code(rows_left)

    def drain_blocking(self, channel: _SyncChannel) -> int:
        """:meth:`drain` for a ``BlockingEngineChannel`` (blocks the calling thread)."""
        try:
            channel.wait_acked(timeout_ms=self._drain_budget_ms())
            rows_left = channel.unacked_count
        finally:
            channel.close()
        return self._exit_code(rows_left)
