"""Saying what went wrong: one part of the channel.

Every error the channel meets ends in one of three places, all here: kept as
``last_error`` (``stats()``), stored in the log's meta with its time (what
``inspect`` shows), and, for the run's failure, the failed mark and reason
(SPEC "The log"; docs/operations.md). Errors from outside walchannel are said
at ERROR once per distinct text, then at INFO, and are never the run's end
(SPEC "The channel", errors from outside). Every text is redacted of the run
token first (SPEC "Secrets").
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from walchannel._logging import get_logger
from walchannel.config import redact_secret
from walchannel.core import events as ev
from walchannel.errors import WalchannelError, raw_message

if TYPE_CHECKING:
    from walchannel.clock import Clock
    from walchannel.config import GrpcChannelConfig
    from walchannel.core.driver import Driver
    from walchannel.log.writer import RunLog

__all__ = ["Reporter"]

logger = get_logger(__name__)


class Reporter:
    """Keeps and stores the channel's errors; says and stores the run's failure.

    Args:
        config: the run's config (run id; the token every text is redacted of).
        log: the run's log (its meta stores the last error and the failed mark).
        driver: the run's driver (``last_error``, ``failure``; fed ``ErrorSeen``).
        clock: the wall clock the errors' times are read from (seconds).
        state_changed: called after the run failed, so every waiter wakes.
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        log: RunLog,
        driver: Driver,
        clock: Clock,
        state_changed: Callable[[], None],
    ) -> None:
        self._run_id = config.run_id
        self._token = config.run_token
        self._log = log
        self._driver = driver
        self._clock = clock
        self._state_changed = state_changed
        # Texts of errors from outside walchannel already said at ERROR.
        self._said: set[str] = set()

    def first_time(self, text: str) -> bool:
        """True the first time ``text`` is asked about (say it loudly), then False."""
        first = text not in self._said
        self._said.add(text)
        return first

    def redact(self, text: str) -> str:
        """``text`` without the run token."""
        return redact_secret(text, self._token)

    def note(self, message: str) -> None:
        """Keep ``message`` as ``last_error`` (``stats()``), not in the log."""
        self._driver.handle(ev.ErrorSeen(self.redact(message)))  # kept; it asks for nothing

    def record(self, message: str, *, failed: str | None = None) -> None:
        """Keep ``message`` as ``last_error`` and store it in the log's meta (``inspect``).

        ``failed``: also store the failed mark with this reason (``FAILED_*``).
        A closed log stores nothing; a failed store is logged at WARNING.
        """
        self.note(message)
        if not self._log.writable:
            return
        now = self._clock.wall_s()
        fields: dict[str, Any] = {"last_error": self._driver.last_error, "last_error_at": now}
        if failed is not None:
            fields["failed_at"] = now
            fields["failed_reason"] = failed
        try:
            self._log.update_meta(**fields)
        except WalchannelError as exc:
            logger.warning("run %s: cannot record the last error: %s", self._run_id, exc)

    def foreign(self, where: str, exc: Exception, *, then: str = "retried with backoff") -> None:
        """An error from outside walchannel at a boundary: a failed attempt, never the run's end.

        The harness's objects (its ``http_client``, closed or misconfigured;
        its callbacks), httpx, grpc's channel creation, a malformed proxy
        variable: logged at ERROR with the type and where it was raised once
        per distinct text (then at INFO), kept in ``last_error``; ``then``
        says what happens next.
        """
        text = self.redact(f"{where}: {type(exc).__name__}: {exc}")
        # Where it was raised, not the traceback: its last line would repeat
        # the message unredacted.
        frames = traceback.extract_tb(exc.__traceback__)
        raised = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        level = logging.ERROR if self.first_time(text) else logging.INFO
        logger.log(level, "run %s: %s%s; %s", self._run_id, text, raised, then)
        self.record(text)

    def call_back(self, callback: Callable[..., None], *args: Any) -> None:
        """Call the harness's ``callback(*args)``; what it raises is logged and ignored."""
        try:
            callback(*args)
        except Exception as exc:
            name = getattr(callback, "__qualname__", repr(callback))
            self.foreign(f"callback {name}", exc, then="ignored")

    def failed(self, reason: str | None) -> None:
        """The driver failed the run (:attr:`Driver.failure`): say so, store it, wake the waits.

        The performer of ``StoreFailure``: ``reason`` is the ``failed_reason``
        the driver chose (``FAILED_*``; None: no mark).
        """
        error = self._driver.failure
        assert error is not None
        logger.error("%s", error)
        self.record(raw_message(error), failed=reason)
        self._state_changed()
