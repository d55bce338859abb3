"""What a scan function sees of its item: events, approvals, the stop flag (SPEC "The runner")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from walchannel.channel.interface import ApprovalDecision
from walchannel.wire import messages

__all__ = ["Approve", "AsyncItemContext", "ItemContext"]

#: ``approve(action, details, request_id, timeout_s)``: the run's approval call.
Approve = Callable[[str, Mapping[str, Any], str, float | None], Awaitable[ApprovalDecision]]


class ItemContext:
    """What a plain ``scan`` function gets (it runs in a worker thread); one try of one item.

    Attributes:
        item: the item.
        index: its position in the work list (0 first).
        events: the events the scan added, logged with its findings.
    """

    def __init__(
        self,
        index: int,
        item: str,
        fingerprint: str,
        *,
        stopping: Callable[[], bool],
        approve: Approve,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.index = index
        self.item = item
        self.events: list[tuple[str, str, Mapping[str, Any]]] = []
        self._fingerprint = fingerprint
        self._stopping = stopping
        self._approve = approve
        self._loop = loop
        self._approvals = 0
        self.abandoned = False

    @property
    def stopping(self) -> bool:
        """True once the run takes no new items (SIGTERM, Stop, the deadline): finish soon."""
        return self._stopping()

    def event(self, type: str, payload: Mapping[str, Any], *, severity: str = "info") -> None:
        """Add an event to the item's transaction: logged with its findings, or not at all.

        Args:
            type: the event type (str).
            payload: a JSON-like mapping (SPEC "Payloads").
            severity: free text.

        Raises:
            PayloadError: a bad field, at once (nothing kept).
            TimeoutError: the item's time ran out (``item_timeout_s``): the
                scan is given up and its thread should end.
        """
        if self.abandoned:
            raise TimeoutError(f"item {self.index} ({self.item}) was given up: its time ran out")
        # Checked now, so a bad event fails the scan that made it, not the commit.
        messages.event_body(type, severity, payload, None)
        self.events.append((type, severity, payload))

    def request_id(self) -> str:
        """The next approval request's id: stable across restarts (a rescan finds the decision)."""
        self._approvals += 1
        return f"{self._fingerprint[:16]}-{self.index}-{self._approvals}"

    def request_approval(
        self, action: str, details: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ApprovalDecision:
        """Ask the engine and wait for its decision (blocks this worker thread).

        Args:
            action: what the scan wants to do.
            details: a JSON-like mapping.
            timeout_s: how long to wait, s (None: until the run closes).

        Returns:
            The decision; the same one when a rescanned item asks again.

        Raises:
            As ``GrpcEngineChannel.request_approval``.
        """
        asked = _awaited(self.ask(action, details, timeout_s))
        return asyncio.run_coroutine_threadsafe(asked, self._loop).result()

    def ask(
        self, action: str, details: Mapping[str, Any], timeout_s: float | None
    ) -> Awaitable[ApprovalDecision]:
        """The approval request, on the event loop, under the next stable id."""
        return self._approve(action, details, self.request_id(), timeout_s)


class AsyncItemContext:
    """What a coroutine ``scan`` function gets (it runs on the event loop).

    As :class:`ItemContext`, with ``request_approval`` awaited.
    """

    def __init__(self, state: ItemContext) -> None:
        self._state = state
        self.item = state.item
        self.index = state.index

    @property
    def stopping(self) -> bool:
        """True once the run takes no new items: finish soon."""
        return self._state.stopping

    def event(self, type: str, payload: Mapping[str, Any], *, severity: str = "info") -> None:
        """As :meth:`ItemContext.event`."""
        self._state.event(type, payload, severity=severity)

    async def request_approval(
        self, action: str, details: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ApprovalDecision:
        """As :meth:`ItemContext.request_approval`, awaited."""
        return await self._state.ask(action, details, timeout_s)


async def _awaited(work: Awaitable[ApprovalDecision]) -> ApprovalDecision:
    return await work
