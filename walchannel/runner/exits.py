"""The runner's exit codes: every outcome has a number, each retriable or not (SPEC "The runner").

A job platform reads them: Kubernetes' ``podFailurePolicy`` fails the Job
on the codes that are not retriable, systemd's ``RestartPreventExitStatus=``
takes the same list (docs/deployment.md).
"""

from __future__ import annotations

import enum
import logging
import signal
from typing import Final

from walchannel._logging import get_logger

__all__ = ["NOT_RETRIABLE", "ExitCode", "said"]

logger = get_logger(__name__)


class ExitCode(enum.IntEnum):
    """What :func:`walchannel.run_harness` returns (the process's exit status)."""

    #: ``Done`` (status ``completed``) logged and acked; also a run whose
    #: log says it completed so earlier.
    DONE = 0
    #: Bad usage: an option, the manifest, a harness object without its
    #: parts, or a work list that is not the one this run's marker was made from.
    USAGE = 2
    #: The run is another writer's, or this log is not the run's (SPEC "Dial").
    FENCED = 3
    #: Every dial was refused before this log ever had an answer: an unknown
    #: run or a wrong token.
    REFUSED = 4
    #: Another process holds the run's log (``WalLockedError``): a second
    #: harness on the run; retry once it has exited.
    LOCKED = 5
    #: The log is damaged, or was removed while open.
    LOG_BROKEN = 6
    #: The run failed on the engine's side: engine behind, a refused row.
    RUN_FAILED = 7
    #: The engine stopped the run: ``Done`` (status ``stopped``) acked.
    STOPPED = 8
    #: Too little of ``hardDeadline`` was left to scan on: ``Done`` (status
    #: ``deadline``) acked before it.
    DEADLINE = 9
    #: An item's scan failed past its retries under ``on_scan_error="fail"``:
    #: ``Done`` (status ``failed``) acked; also a run that completed so earlier.
    SCAN_FAILED = 10
    #: ``hardDeadline`` passed before the run ended: the token is dead.
    EXPIRED = 11
    #: The engine says the run completed, and this log holds nothing of it
    #: (another writer's run ended, or a log put back after the run ended).
    COMPLETED_ELSEWHERE = 12
    #: An item's scan failed past its retries under ``on_scan_error="exit"``:
    #: no ``Done``; a restart scans the item again.
    SCAN_EXIT = 13
    #: ``Done`` logged but its ack not stored (the tombstone) within
    #: ``drain_timeout_s``: it stays in the log for the next start or
    #: ``walchannel flush``.
    DONE_NOT_ACKED = 14
    #: No engine answered this new log's handshake within ``first_answer_s``
    #: (nothing scanned; the dials were not all refused).
    NO_ENGINE = 15
    #: The disk refused a write of the log (full) when it was opened: start
    #: again once it has room (a commit the disk refuses mid-run is waited out).
    LOG_WRITE_FAILED = 16
    #: SIGTERM, every logged row acked: 128 + SIGTERM (SPEC "Grace period").
    SIGTERM = 128 + signal.SIGTERM
    #: SIGTERM with rows left in the log (EX_TEMPFAIL).
    ROWS_LEFT = 75
    #: Ctrl-C (SIGINT, ``KeyboardInterrupt``) in ``walchannel run``: the scan
    #: in hand is given up, the channel closed; the next start resumes.
    INTERRUPTED = 128 + signal.SIGINT

    @property
    def retriable(self) -> bool:
        """True when starting the harness again can end the run better."""
        return self not in NOT_RETRIABLE


#: The codes a retry cannot mend: a platform fails the job on them.
NOT_RETRIABLE: Final = frozenset(
    {
        ExitCode.DONE,
        ExitCode.USAGE,
        ExitCode.FENCED,
        ExitCode.REFUSED,
        ExitCode.LOG_BROKEN,
        ExitCode.RUN_FAILED,
        ExitCode.STOPPED,
        ExitCode.DEADLINE,
        ExitCode.SCAN_FAILED,
        ExitCode.EXPIRED,
        ExitCode.COMPLETED_ELSEWHERE,
    }
)


def said(run_id: str | None, code: ExitCode) -> ExitCode:
    """Say the run's exit code in one log line, with its name and whether a retry helps.

    Returns:
        ``code``.
    """
    logger.log(
        logging.INFO if code == ExitCode.DONE else logging.WARNING,
        "%sexit %d (%s, %s)",
        "" if run_id is None else f"run {run_id}: ",
        code,
        code.name,
        "retriable: start it again" if code.retriable else "not retriable",
    )
    return code
