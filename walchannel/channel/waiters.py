"""What the harness's awaits watch: one part of the channel.

``handshake`` waits for the stream to come up, ``wait_acked`` and
``send_done`` for an ack or the run's end, ``request_approval`` for a
decision. :class:`Waiters` holds the events they watch and the pending
approvals, and wakes them from one place: :meth:`Waiters.state_changed`
after any change of the driver's state (a final state wakes and answers
every waiter at once, however the run ended), :meth:`Waiters.ack_moved`
after a received ack. Which seq a waiter's target now is (a verification
shift moves rows handed out before it) is the driver's one query
(:meth:`~walchannel.core.driver.Driver.is_acked`,
:meth:`~walchannel.core.driver.Driver.translate`); no waiter renumbers itself.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from walchannel._logging import get_logger
from walchannel.channel.interface import ApprovalDecision
from walchannel.core import events as ev
from walchannel.core.driver import ChannelState

if TYPE_CHECKING:
    from walchannel.clock import Clock
    from walchannel.core.driver import Driver
    from walchannel.errors import WalchannelError

__all__ = ["Waiters"]

logger = get_logger(__name__)

#: What a wait on acks before ``handshake()`` says (once): nothing is sent until it is.
NO_HANDSHAKE = "waiting for acks, but handshake() was never called: nothing is sent until it is"


class Waiters:
    """The events the channel's awaits watch and the approvals they wait on.

    Args:
        run_id: the run, for the log lines.
        driver: the run's driver (its state, ``acked``, ``closed``, ``final``).
        clock: the monotonic clock timeouts are counted on (ms).
        wakeup: the writer's event, set when the run ends so it stops.

    Everything runs on the channel's event loop.
    """

    def __init__(self, run_id: str, driver: Driver, clock: Clock, wakeup: asyncio.Event) -> None:
        self._run_id = run_id
        self._driver = driver
        self._clock = clock
        self._wakeup = wakeup
        self._up = asyncio.Event()
        self.over = asyncio.Event()
        """Set once the run is final or the channel closes (backoff sleeps watch it)."""
        # Set when an ack reaches wake_at (the lowest seq a waiter waits for),
        # and on any change of state: an ack below every waiter's target wakes
        # nobody, so a cumulative ack costs O(1) however many come.
        self._acked_changed = asyncio.Event()
        self._ack_waits: list[float] = []
        self.wake_at = math.inf
        """The lowest received ack that may answer a waiter (``inf``: none waits)."""
        self._approvals: dict[str, asyncio.Future[ApprovalDecision]] = {}
        self._dropped = False

    # -- waking ----------------------------------------------------------------------------

    def state_changed(self) -> None:
        """Follow the driver's state: up or not; final wakes every waiter and answers approvals."""
        if self._dropped:
            return  # their event loop is gone: nothing of it may be touched
        driver = self._driver
        if driver.state is ChannelState.STREAMING:
            self._up.set()
        else:
            self._up.clear()
        if driver.final:
            self.over.set()
            self._wakeup.set()
            self._acked_changed.set()
            failure = driver.ended_error() if self._approvals else None
            if failure is not None and driver.state is not ChannelState.CLOSED:
                # No decision can come any more: waiting would never end.
                self.fail_approvals(lambda rid: failure)

    def ack_moved(self, acked: int) -> None:
        """The received ack is ``acked``: wake the waiters it may answer."""
        if acked >= self.wake_at:
            self._acked_changed.set()

    def wake_all(self) -> None:
        """Every waiter looks again (a shift moved targets; ``Done`` acked; closed)."""
        if self._dropped:
            return
        self._acked_changed.set()

    # -- waiting ---------------------------------------------------------------------------

    async def wait_up(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds until streaming or the run is over."""
        up = asyncio.ensure_future(self._up.wait())
        over = asyncio.ensure_future(self.over.wait())
        try:
            await asyncio.wait((up, over), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            over.cancel()

    async def wait_for(
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
        # Sends before handshake() are logged, not sent (SPEC "The channel"):
        # waiting on acks then would end silently at the timeout.
        idle = driver.state is ChannelState.IDLE
        if idle and not condition() and driver.last_error != NO_HANDSHAKE:
            logger.warning("run %s: %s", self._run_id, NO_HANDSHAKE)
            driver.handle(ev.ErrorSeen(NO_HANDSHAKE))  # kept as last_error; asks for nothing
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
            self.wake_at = min(self._ack_waits)
            try:
                # asyncio.timeout: on Python 3.11 wait_for can swallow a caller's cancel.
                async with asyncio.timeout(remaining):
                    await self._acked_changed.wait()
            except TimeoutError:
                return condition()
            finally:
                self._ack_waits.remove(at)
                self.wake_at = min(self._ack_waits, default=math.inf)
        return True

    # -- approvals -------------------------------------------------------------------------

    def approval(self, request_id: str) -> asyncio.Future[ApprovalDecision] | None:
        """The pending future of ``request_id`` (None: none, or already answered)."""
        future = self._approvals.get(request_id)
        return None if future is None or future.done() else future

    def add_approval(self, request_id: str) -> asyncio.Future[ApprovalDecision]:
        """A new pending approval: its future, resolved by :meth:`decided` or failed."""
        future = asyncio.get_running_loop().create_future()
        self._approvals[request_id] = future
        return future

    def decided(self, decision: ApprovalDecision) -> bool:
        """Resolve the approval ``decision`` answers; False if nobody waits on it."""
        future = self._approvals.pop(decision.request_id, None)
        if future is None:
            return False
        if not future.done():
            future.set_result(decision)
        return True

    def refuse_approval(self, request_id: str, error: WalchannelError) -> None:
        """Fail the approval ``request_id`` with ``error`` (its row was set aside)."""
        future = self._approvals.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(error)
            future.exception()

    def fail_approvals(self, error: Callable[[str], WalchannelError]) -> None:
        """Fail every pending ``request_approval`` with ``error(request_id)``."""
        approvals, self._approvals = self._approvals, {}
        for rid, future in approvals.items():
            if not future.done():
                future.set_exception(error(rid))
                future.exception()

    def drop(self) -> None:
        """Forget every approval without answering; wake nothing from now (their loop is gone)."""
        self._approvals.clear()
        self._dropped = True
