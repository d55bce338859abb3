"""``durability="replicated"``: rows wait, unsent, until Litestream's replica holds them.

The writer asks before writing a row above what the replica is known to
hold (docs/operations.md, "Replication"): a host lost after the engine acked
a row must not lose it from the restored log.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from walchannel.channel.base import ChannelBase

__all__ = ["REPLICA_QUIET_S", "REPLICA_RETRY_S", "REPLICA_SYNC_TIMEOUT_S", "ReplicaGate"]

logger = logging.getLogger(__name__)

#: Litestream's bound on one sync (s), the pause after a failed one (s), and
#: how long failures stay quiet (a new log is being picked up).
REPLICA_SYNC_TIMEOUT_S = 30
REPLICA_RETRY_S = 0.2
REPLICA_QUIET_S = 5.0


class ReplicaGate(ChannelBase):
    """The replica gate of :class:`~walchannel.channel.GrpcEngineChannel`'s writer."""

    async def _replicate(self) -> None:
        """Wait until Litestream's replica holds every row committed so far (one attempt).

        ``durability="replicated"``: POST ``/sync`` with ``wait`` on
        Litestream's control socket; when it answers 200 the replica holds
        every commit made before the call (rows and progress marker). On a
        failure the rows stay unsent (never dropped): it logs, records the
        error and pauses before the writer's next try.
        """
        assert self._replica_socket is not None
        target = self._log.next_seq - 1
        if self._replica is None:
            self._replica = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self._replica_socket),
                timeout=REPLICA_SYNC_TIMEOUT_S + 5,
                trust_env=False,
            )
        try:
            answer = await self._replica.post(
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
            if self._replica_failing_since is None:
                self._replica_failing_since = now
            # A new log is picked up by Litestream within about a second: be quiet first.
            if now - self._replica_failing_since >= REPLICA_QUIET_S:
                message = f"Litestream does not confirm the replica of new rows: {exc}"
                if self._last_error != message:
                    logger.warning(
                        "run %s: %s; rows from seq %d wait, unsent",
                        self._run_id,
                        message,
                        self._replicated_through + 1,
                    )
                self._last_error = message
            await asyncio.sleep(REPLICA_RETRY_S)
            return
        self._replica_failing_since = None
        self._replicated_through = max(self._replicated_through, target)
