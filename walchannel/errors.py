"""The exception tree of walchannel.

Every public call raises only these (plus ``ValueError`` for bad arguments,
which :class:`PayloadError` also is). grpc, sqlite3 and httpx exceptions are
wrapped at the boundary with ``raise ... from exc`` and never escape raw.
No message ever carries the run token (SPEC "Secrets"). ``str()`` of any
of them escapes the controls of text from outside (an engine's status
details, a discovery answer, a file name) that the message holds, so a
traceback or a log line shows ``\\x1b`` rather than act on it; ``args``
keeps the message as built (SPEC "The channel", "Text from outside").

::

    WalchannelError                           retriable: may a restart of the harness mend it?
    ├── ConfigurationError                    the harness's setup or its use of the API
    │   ├── WalLocationError                  the log cannot live there: no home, no -shm, no locks
    │   ├── ChannelClosedError                a call after send_done()/close()
    │   ├── ReentrantCallError (RuntimeError) a call made inside another (a signal handler's)
    │   └── RunningLoopError (RuntimeError)   a blocking wait on a thread running an event loop
    ├── PayloadError (ValueError)             a payload refused before it is logged
    ├── EngineRefusedError                    the engine said no, or lost what it acked
    │   ├── RunCompletedError                 the run's Done was already applied
    │   ├── RunExpiredError                   past hard_deadline
    │   ├── EngineBehindError                 the engine lost rows this log deleted (FAILED)
    │   ├── WriterFencedError                 the run is another writer's (FAILED, rows kept)
    │   └── RowRefusedError                   a logged row refused for its size
    ├── TransportError                        the engine cannot be reached or answers nothing
    │   ├── EngineUnavailableError      *     no answered handshake within the timeout
    │   │   └── RunRefusedError               every dial of a new log refused (run, token)
    │   ├── DiscoveryError              *     GET /grpc-address gave no usable address
    │   └── ApprovalTimeoutError (TimeoutError) *  no decision within timeout_ms
    └── LogError                              the run's local log
        ├── WalLockedError              *     another owner holds the run's log
        ├── WalCorruptError                   the log file is not a usable walchannel log
        ├── WalWriteError               *     a commit failed (disk full, I/O error)
        ├── WalRemovedError                   the log's files were removed while open (FAILED)
        ├── GroupCommitError                  a group of rows handed out never committed (FAILED)
        └── BacklogFullError            *     max_unacked_bytes would be passed

``*``: ``retriable`` is True. The runner's exit codes follow it (SPEC
"The runner": a code is retriable exactly when its error is).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from walchannel.formatting import escape_text

__all__ = [
    "OWNED_BY_ANOTHER_WRITER",
    "WRITER_FENCED",
    "ApprovalTimeoutError",
    "BacklogFullError",
    "ChannelClosedError",
    "ConfigurationError",
    "DiscoveryError",
    "EngineBehindError",
    "EngineRefusedError",
    "EngineUnavailableError",
    "GroupCommitError",
    "InsecureDiscoveryWarning",
    "LogError",
    "PayloadError",
    "ReentrantCallError",
    "RowRefusedError",
    "RunCompletedError",
    "RunRefusedError",
    "RunExpiredError",
    "RunningLoopError",
    "TransportError",
    "WalCorruptError",
    "WalLocationError",
    "WalLockedError",
    "WalRemovedError",
    "WalWriteError",
    "WalchannelError",
    "WriterFencedError",
    "raw_message",
]


class WalchannelError(Exception):
    """Root of every error walchannel raises on purpose.

    ``str(exc)`` is the message with its controls escaped
    (:func:`walchannel.formatting.escape_text`): what a traceback, a log
    line or an error message shows. ``exc.args[0]`` is the message as built,
    text from outside as received. SPEC "The channel", "Text from outside".
    """

    #: Whether starting the harness again (later) may mend it, as opposed to
    #: a fix by a person: the runner's exit codes follow it.
    retriable: ClassVar[bool] = False

    def __str__(self) -> str:
        return escape_text(super().__str__())


class ConfigurationError(WalchannelError):
    """The harness's setup or its use of the API is wrong: fix the harness, then start it."""


class EngineRefusedError(WalchannelError):
    """The engine said no to this run or this writer, or lost what it had acked."""


class TransportError(WalchannelError):
    """The engine cannot be reached, or answers nothing in time (the rows wait in the log)."""


class LogError(WalchannelError):
    """The run's local log: held by another process, damaged, unwritable or gone."""


def raw_message(exc: BaseException) -> str:
    """Return ``exc``'s message as built: text from outside as received, not escaped.

    For what is stored and handed to programs (``last_error`` in the log's
    meta and in ``stats()``), never for what is shown: ``str(exc)`` of a
    :class:`WalchannelError` escapes it. Other exceptions give ``str(exc)``.
    SPEC "The channel", "Text from outside".

    Args:
        exc: any exception.
    """
    if isinstance(exc, WalchannelError):
        return Exception.__str__(exc)
    return str(exc)


class PayloadError(WalchannelError, ValueError):
    """A payload cannot travel: refused before it is logged and before a seq is used.

    Attributes:
        path: where the bad value sits, e.g. ``finding.evidence[3].id``.
        reason: what is wrong with it.
        index: for a finding of a ``send_findings`` batch, its position in
            the batch (``findings[index]``), whichever rule refused it (its
            size too); None otherwise. A harness drops that finding,
            reports it and sends the rest with its marker (README "Use it in
            your harness").

    SPEC "Payloads".
    """

    def __init__(self, path: str, reason: str, *, index: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.index = index
        super().__init__(f"{path}: {reason}")


class ChannelClosedError(ConfigurationError):
    """The channel (or its log) accepts no more messages: ``send_done`` or ``close`` ran."""


class RunCompletedError(EngineRefusedError):
    """The run's ``Done`` was applied: the log is a tombstone or the engine said "run completed".

    A harness restarted after its run finished gets this and should exit
    instead of scanning again. SPEC "Completion".

    Attributes:
        progress: the tombstone's last progress marker, when the channel's
            constructor raised it on one (None otherwise): how the run
            ended, for a runner that keeps it there (SPEC "The runner").
    """

    def __init__(self, message: str, *, progress: dict[str, Any] | None = None) -> None:
        self.progress = progress
        super().__init__(message)


class RunExpiredError(EngineRefusedError):
    """The run passed its ``hard_deadline`` (the token's expiry)."""


class EngineBehindError(EngineRefusedError):
    """The engine's high-water is below the log's stored cursor.

    The engine lost rows this log already deleted after the engine acked
    them; they cannot be re-sent. The channel is ``FAILED``. SPEC "Dial".
    """


#: How the engine's FAILED_PRECONDITION details begin when it refuses a
#: writer (SPEC "Engine duties"): another writer owns the run, or a newer
#: epoch of this writer (a restore) or a takeover superseded it. The client
#: recognises them (:class:`WriterFencedError`); an engine sends them.
OWNED_BY_ANOTHER_WRITER: Final = "owned by another writer"
WRITER_FENCED: Final = "writer fenced"


class WriterFencedError(EngineRefusedError):
    """The run is another writer's: this log may not write it. Nothing is lost.

    Delivery is idempotent by ``(run_id, seq)`` only while one writer hands
    out a run's seqs. So the channel stops (``FAILED``, with a stored
    ``failed_reason``; every row stays in the log, ``send_done`` never
    returns True) when the engine says another writer owns the run, that a
    newer copy of this log (a restore) or a takeover superseded this writer,
    or that another writer completed the run while this log holds rows; and,
    on its own evidence, when this log never had an answered handshake and
    meets an engine that already holds rows of the run (a lost or misplaced
    log, a second harness). ``handshake()`` and every later call raise it; a
    restart on the same log is refused again until ``walchannel takeover``.
    What to do: review the rows (``walchannel export LOG``), or take the run
    over (``walchannel takeover LOG``, then restart). SPEC "The channel".

    Attributes:
        run_id: the run.
        path: the log file that keeps the rows.
        writer_id: this log's writer id (None when the log never had one).
        engine_high: the engine's high-water when the refusal is the log's own
            evidence (a never-answered log meeting rows); else None.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        path: str,
        writer_id: str | None,
        engine_high: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.path = path
        self.writer_id = writer_id
        self.engine_high = engine_high
        super().__init__(message)


class WalLockedError(LogError):
    """Another owner holds the run's log (or this process is a forked child of the owner).

    Attributes:
        path: the log file.
        pid: the owner's pid, when known.
        host: the owner's host name, when known.
    """

    retriable = True  # the other owner goes; a later start takes the log

    def __init__(
        self, message: str, *, path: str, pid: int | None = None, host: str | None = None
    ) -> None:
        self.path = path
        self.pid = pid
        self.host = host
        super().__init__(message)


class WalCorruptError(LogError):
    """The file is not a usable walchannel log; it is left untouched.

    Attributes:
        path: the file.
        reason: what check failed.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class WalWriteError(LogError):
    """A commit to the log failed (disk full, read-only file, I/O error).

    Rows committed before stay intact and are still delivered; nothing of
    the failed call was logged and no seq was used.

    Attributes:
        path: the log file.
    """

    retriable = True  # a disk that fills empties; the rows before are intact

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        # Every such error names its file (a message may already).
        super().__init__(message if path in message else f"{path}: {message}")


class WalLocationError(ConfigurationError):
    """The log cannot live where it was asked to; nothing was written (SPEC "The log").

    No folder could be chosen (no home folder for the default or a ``~``),
    or the folder's file system or runtime lacks what the log needs: a
    shared-memory file beside it for SQLite's WAL (``-shm``), or
    open-file-description locks. A retry in the same place cannot mend it:
    choose another folder (``wal_dir``, ``$WALCHANNEL_DIR``).

    Attributes:
        path: the folder or file it is about.
    """

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message)


class WalRemovedError(LogError):
    """The log's file, its ``-wal`` or its lock file was removed or replaced while open.

    A tmp cleaner, ``rm -rf $WALCHANNEL_DIR/*``, a wiped volume: SQLite goes
    on committing into the unlinked file, which a crash then takes with it,
    and a second opener would take a fresh lock beside this one. So after
    every commit the log checks that its path still names the files it has
    open; on a mismatch no seq of that commit is returned, the channel is
    ``FAILED`` and every later call raises this. Not a :class:`WalWriteError`,
    whose "retry later" would go on writing into the unlinked file. SPEC
    "The log" ("Its files removed while open").

    Attributes:
        path: the log file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message if path in message else f"{path}: {message}")


class GroupCommitError(LogError):
    """Under ``group_commit``, a group of rows handed out could not be committed, on every try.

    The channel is ``FAILED`` with it and every later call raises it: its
    rows are not in the log and were never sent (SPEC "Group commit"). Not
    a :class:`WalWriteError`, whose "retry later" would loop here for ever:
    the way on is a new channel on the log, resuming from ``progress()``
    (which then hands the lost seqs out again).

    Attributes:
        path: the log file.
        first_seq: the first seq handed out of the group (None: only its
            progress marker was lost).
        last_seq: the last one (None likewise).
    """

    def __init__(
        self, message: str, *, path: str, first_seq: int | None, last_seq: int | None
    ) -> None:
        self.path = path
        self.first_seq = first_seq
        self.last_seq = last_seq
        super().__init__(message if path in message else f"{path}: {message}")


class BacklogFullError(LogError):
    """Logging this message would pass ``max_unacked_bytes``; nothing was logged."""

    retriable = True  # acks free room as the engine takes rows


class EngineUnavailableError(TransportError):
    """No engine answered the handshake within ``connect_timeout_ms``.

    The channel stays usable and keeps dialing; sends are still logged.
    """

    retriable = True  # an engine may come; the rows wait in the log


class RunRefusedError(EngineUnavailableError):
    """Every dial of a log that never had an answer was refused: an unknown run or a wrong token.

    Raised by ``handshake()`` only while this log has never had an
    answered handshake and every dial (two at least) within
    ``connect_timeout_ms`` ended UNAUTHENTICATED or PERMISSION_DENIED. A
    log that had an answer keeps dialing instead (a replacement engine may
    not know the run yet), as this channel does too: it is an
    :class:`EngineUnavailableError`. Check the run id and the token the
    harness was given. SPEC "Dial".
    """

    retriable = False  # an unknown run or a wrong token stays so until a person fixes it


class DiscoveryError(TransportError):
    """``GET {http_addr}/grpc-address`` gave no usable address (the last one is kept)."""

    retriable = True  # discovery may answer later; the last address is kept


class RowRefusedError(EngineRefusedError):
    """The engine refused a row already logged, for its size (a ``RESOURCE_EXHAUSTED``).

    Unlike :class:`PayloadError` (refused before it is logged), the row is
    in the log with its seq. Raised by ``send_done`` when the engine refuses
    the run's ``Done`` (the channel then fails, every later send raises
    this error and the row stays for a resume or ``flush`` once the engine's
    limit is raised), and by ``request_approval`` when its request was
    refused and set aside (the engine will never decide it). SPEC "The
    channel"; docs/design.md "Rows the engine refuses".

    Attributes:
        run_id: the run.
        seq: the refused row's seq.
        kind: its kind, ``done`` or ``approval_request``.
        size: its size as the engine received it (bytes).
        limit: the engine's receive limit (bytes).
        path: the log file that keeps it.
    """

    def __init__(
        self, message: str, *, run_id: str, seq: int, kind: str, size: int, limit: int, path: str
    ) -> None:
        self.run_id = run_id
        self.seq = seq
        self.kind = kind
        self.size = size
        self.limit = limit
        self.path = path
        super().__init__(message)


class ApprovalTimeoutError(TransportError, TimeoutError):
    """No ``ApprovalDecision`` arrived within the request's ``timeout_ms``.

    Also a :class:`TimeoutError`, so ``except TimeoutError`` (asyncio's
    timeouts are that class too) catches it.
    """

    retriable = True  # the decision may come; the request stays logged


class RunningLoopError(ConfigurationError, RuntimeError):
    """A :class:`~walchannel.BlockingEngineChannel` call that waits on the engine was made
    on a thread that runs an asyncio event loop.

    It would block that loop until the engine answers, and never return
    while the engine (or anything the answer needs) runs on that loop: so
    it is refused at once, before anything is logged. Async code uses
    :class:`~walchannel.GrpcEngineChannel` and awaits it, or calls the
    blocking channel from another thread (``asyncio.to_thread``). Also a
    :class:`RuntimeError`, as asyncio's own "cannot be called from a running
    event loop". SPEC "The channel".
    """


class ReentrantCallError(ConfigurationError, RuntimeError):
    """A call of the channel was made while another one was inside the channel's state.

    A signal handler runs on the main thread between two bytecodes of
    whatever ran there: inside a ``send_*``, or inside the channel's own
    work on the event loop (a group commit, an ack stored). A send made
    from it then would interleave with the half-done call; it is refused
    at once instead, before its payload is checked and before any seq is
    handed out: nothing of it was logged. Raised out of the handler it
    reaches the call the handler interrupted, whose rows and marker then
    landed whole or not at all (``progress()`` says which). Schedule the
    call with ``loop.add_signal_handler`` (async harnesses: the handler
    runs between the loop's callbacks, never inside a call), or use
    :class:`~walchannel.BlockingEngineChannel`, whose work runs on a thread
    no signal lands on. Also a :class:`RuntimeError`. SPEC "Signal handlers
    and the channel".
    """


class InsecureDiscoveryWarning(UserWarning):
    """A Python warning (not an error): discovery is plaintext and unrestricted.

    Issued by :class:`~walchannel.GrpcChannelConfig` when ``http_addr`` is
    ``http://`` and ``allowed_hosts`` is None: whoever can answer
    ``GET /grpc-address`` could then send the harness (and its token) to any
    host. Set ``allowed_hosts`` to silence it, or filter it the usual way
    (``warnings.simplefilter("ignore", InsecureDiscoveryWarning)``), as with
    urllib3's ``InsecureRequestWarning``. SPEC "The channel" (``allowed_hosts``).
    """
