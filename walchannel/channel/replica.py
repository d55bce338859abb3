"""``durability="replicated"``: rows wait, unsent, until Litestream's replica holds them.

The writer asks before writing a row above what the replica is known to
hold (docs/operations.md, "Replication"): a host lost after the engine acked
a row must not lose it from the restored log. An httpx adapter: it talks to
Litestream's control socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import httpx

from walchannel._logging import get_logger

if TYPE_CHECKING:
    from walchannel.log.writer import RunLog

__all__ = ["REPLICA_QUIET_S", "REPLICA_RETRY_S", "REPLICA_SYNC_TIMEOUT_S", "ReplicaGate"]

logger = get_logger(__name__)

#: Litestream's bound on one sync (s), the pause after a failed one (s), and
#: how long failures stay quiet (a new log is being picked up).
REPLICA_SYNC_TIMEOUT_S: Final = 30
REPLICA_RETRY_S: Final = 0.2
REPLICA_QUIET_S: Final = 5.0


class ReplicaGate:
    """What Litestream's replica holds of one run's log, and the wait for more.

    Args:
        socket: the path of Litestream's control socket (``$WALCHANNEL_LITESTREAM_SOCKET``).
        log: the run's log.
        on_error: records a failure text (the channel's ``last_error``).

    Attributes:
        through: every row up to this seq is on the replica.
    """

    def __init__(self, socket: str, log: RunLog, on_error: Callable[[str], None]) -> None:
        self._socket = socket
        self._log = log
        self._on_error = on_error
        self._client: httpx.AsyncClient | None = None
        self._failing_since: float | None = None
        self._last_said: str | None = None
        self.through = 0

    async def wait(self) -> None:
        """Wait until the replica holds every row committed so far (one attempt).

        POST ``/sync`` with ``wait`` on Litestream's control socket; when it
        answers 200 the replica holds every commit made before the call (rows
        and progress marker). On a failure the rows stay unsent (never
        dropped): it logs, records the error and pauses before the writer's
        next try.
        """
        target = self._log.next_seq - 1
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self._socket),
                timeout=REPLICA_SYNC_TIMEOUT_S + 5,
                trust_env=False,
            )
        try:
            answer = await self._client.post(
                "http://litestream/sync",
                json={
                    "path": str(self._log.path.resolve()),
                    "wait": True,
                    "timeout": REPLICA_SYNC_TIMEOUT_S,
                },
            )
            if answer.status_code != 200:
                raise httpx.HTTPError(f"HTTP {answer.status_code}: {answer.text[:200]}")
        except httpx.HTTPError as exc:
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            # A new log is picked up by Litestream within about a second: be quiet first.
            if now - self._failing_since >= REPLICA_QUIET_S:
                message = f"Litestream does not confirm the replica of new rows: {exc}"
                if self._last_said != message:
                    self._last_said = message
                    logger.warning(
                        "run %s: %s; rows from seq %d wait, unsent",
                        self._log.run_id,
                        message,
                        self.through + 1,
                    )
                self._on_error(message)
            await asyncio.sleep(REPLICA_RETRY_S)
            return
        self._failing_since = None
        self.through = max(self.through, target)

    async def aclose(self) -> None:
        """Close the client of the control socket."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
