"""What happens to a run's channel: the driver's inputs, one class each.

Each event is a plain value handed to :meth:`Driver.handle
<walchannel.core.driver.Driver.handle>`, which answers with the actions to
perform (:mod:`walchannel.core.actions`). An action whose I/O has a result
(a verification's shift, a tombstone stored or not) is answered by the
executor with the next event: no plan waits on a second call the caller
could forget. docs/design.md, "The driver: events and actions", has the
table of events and the actions each can give.

Times are in milliseconds of any monotonic origin (``now_ms``) or unix
seconds of the wall clock (``now_wall_s``).

Events are values: nothing changes one after it is made. The three made
per row (:class:`Writing`, :class:`Written`, :class:`AckReceived`) are not
``frozen`` dataclasses only because a frozen one's ``__init__`` costs
0.15 µs more per event (``object.__setattr__`` per field); the rest are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from walchannel.errors import WalchannelError

__all__ = [
    "AckReceived",
    "AckStoreFailed",
    "AckStored",
    "AckTimerFired",
    "AcksFlushed",
    "CheckpointTimerFired",
    "Checkpointed",
    "Answered",
    "BacklogDated",
    "BackoffOver",
    "CloseRequested",
    "Closed",
    "DeadlineLook",
    "DeadlinePassed",
    "DecisionReceived",
    "DoneLogged",
    "DoneRefused",
    "DoneRequested",
    "Ended",
    "ErrorSeen",
    "Event",
    "Failed",
    "Failure",
    "LoopStarted",
    "ProtocolViolation",
    "Rediscovered",
    "RefusedRowSetAside",
    "Rewind",
    "RowsCommitted",
    "StopReceived",
    "StreamOver",
    "TombstoneNotStored",
    "TombstoneStored",
    "VerificationFailed",
    "Verified",
    "Writing",
    "Written",
]


class Failure(enum.Enum):
    """Which of walchannel's own failures a :class:`Failed` is (the driver names its reason)."""

    LOG_REMOVED = "log_removed"  # the log's files were removed while open
    CORRUPT = "corrupt"  # the writer found the log file damaged
    INTERNAL = "internal"  # the connection loop broke (a bug of walchannel's)
    GROUP_LOST = "group_lost"  # a pending group could not be committed on any try


# -- the connection loop -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoopStarted:
    """The connection loop starts (``handshake()``): dial, unless the run is over."""


@dataclass(frozen=True, slots=True)
class StreamOver:
    """A stream (or a dial that never streamed) is over and its end recorded: back off?"""

    now_ms: float


@dataclass(frozen=True, slots=True)
class BackoffOver:
    """The backoff's sleep ended (or the run ended during it)."""


@dataclass(frozen=True, slots=True)
class Rediscovered:
    """Discovery answered (or failed; the last address is kept): dial, unless over."""


# -- the handshake answer ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answered:
    """The engine's handshake answer ``Ack(high)``; None without ``engine_acks_handshake``."""

    high: int | None
    now_ms: float


@dataclass(frozen=True, slots=True)
class Verified:
    """``RunLog.verify(high)`` committed: the log moved its unverified rows by ``shift``."""

    high: int
    shift: int
    now_ms: float


@dataclass(frozen=True, slots=True)
class VerificationFailed:
    """``RunLog.verify(high)`` could not be written (``text``: why, no token)."""

    text: str


# -- acks ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowsCommitted:
    """Rows from ``first_seq`` were committed at ``now_s`` (the metrics' clock, seconds)."""

    first_seq: int
    now_s: float


@dataclass(frozen=True, slots=True)
class BacklogDated:
    """``(seq, t)``: when sampled rows of an earlier process were committed (the same clock)."""

    points: tuple[tuple[int, float], ...]


@dataclass(slots=True)  # per row: see the module docstring
class AckReceived:
    """A cumulative ``Ack(seq)`` arrived on the live stream."""

    seq: int
    now_ms: float


@dataclass(slots=True)  # per row: see the module docstring
class Writing:
    """Row ``seq``'s first write starts on the live stream: the engine may ack it from now."""

    seq: int


@dataclass(slots=True)  # per row: see the module docstring
class Written:
    """Row ``seq`` was written to the live stream."""

    seq: int


@dataclass(frozen=True, slots=True)
class AckTimerFired:
    """The coalesced-ack timer fired."""

    now_ms: float


@dataclass(frozen=True, slots=True)
class AcksFlushed:
    """Store whatever ack is received and not stored yet (close, the backlog limit)."""

    now_ms: float


@dataclass(frozen=True, slots=True)
class AckStored:
    """``RunLog.ack(seq)`` committed (rows at or below ``seq`` are deleted)."""

    seq: int
    now_ms: float


@dataclass(frozen=True, slots=True)
class AckStoreFailed:
    """``RunLog.ack(seq)`` raised (a full disk, an I/O error, an exception inside the call)."""

    seq: int
    now_ms: float


@dataclass(frozen=True, slots=True)
class CheckpointTimerFired:
    """The disk reclaim's timer fired."""

    now_ms: float


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A checkpoint step ended: ``complete`` (nothing left to give back), ``shrank`` (the file)."""

    complete: bool
    shrank: bool


# -- a stream's end and what the engine says -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Ended:
    """The live stream ended with this gRPC status.

    Attributes:
        code: the status name (``"UNAVAILABLE"``), None when none is known.
        details: the status details.
        debug: gRPC's debug string (where some GOAWAY reasons show).
        text: the end, described for people, the token redacted.
    """

    code: str | None
    details: str
    debug: str
    text: str


@dataclass(frozen=True, slots=True)
class TombstoneStored:
    """``RunLog.complete_by_engine()`` committed: the log is a tombstone."""


@dataclass(frozen=True, slots=True)
class TombstoneNotStored:
    """The log could not be made a tombstone (its write failed, or it is read-only)."""


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """The engine sent what no correct engine sends (``message``: what); the stream ends."""

    message: str


@dataclass(frozen=True, slots=True)
class RefusedRowSetAside:
    """A row the engine refused for its size was set aside into the quarantine."""


@dataclass(frozen=True, slots=True)
class DoneRefused:
    """The engine refused the ``Done`` at ``seq`` for its size: the run stops with ``error``."""

    seq: int
    error: WalchannelError


@dataclass(frozen=True, slots=True)
class StopReceived:
    """A ``Stop`` arrived (the engine re-sends it after every handshake)."""

    reason: str


@dataclass(frozen=True, slots=True)
class DecisionReceived:
    """An approval decision arrived (new, or repeated after a handshake)."""

    request_id: str
    approved: bool
    reason: str


# -- the harness's calls and the run's limits ----------------------------------------------


@dataclass(frozen=True, slots=True)
class CloseRequested:
    """``close()`` began (or the channel's event loop is gone): no call is admitted."""


@dataclass(frozen=True, slots=True)
class Closed:
    """Closing is done: the channel is ``CLOSED``."""


@dataclass(frozen=True, slots=True)
class DoneRequested:
    """``send_done()`` was called and admitted."""


@dataclass(frozen=True, slots=True)
class DoneLogged:
    """``send_done()`` logged the run's ``Done`` (or found one logged): no new rows."""


@dataclass(frozen=True, slots=True)
class Rewind:
    """``replay_unacked()``: write again every row above the received ack."""


@dataclass(frozen=True, slots=True)
class DeadlineLook:
    """The ``hard_deadline`` timer looks at the wall clock."""

    now_wall_s: float


@dataclass(frozen=True, slots=True)
class DeadlinePassed:
    """A call found ``hard_deadline`` passed."""


@dataclass(frozen=True, slots=True)
class Failed:
    """walchannel's own failure (``cause``) ends the run with ``error``; ``what`` details it."""

    error: WalchannelError
    cause: Failure
    what: str = ""


@dataclass(frozen=True, slots=True)
class ErrorSeen:
    """An error to keep as ``last_error`` (``stats()``); ``text`` is redacted of the token."""

    text: str


Event = (
    LoopStarted
    | StreamOver
    | BackoffOver
    | Rediscovered
    | Answered
    | Verified
    | VerificationFailed
    | RowsCommitted
    | BacklogDated
    | AckReceived
    | Writing
    | Written
    | AckTimerFired
    | AcksFlushed
    | AckStored
    | AckStoreFailed
    | CheckpointTimerFired
    | Checkpointed
    | Ended
    | TombstoneStored
    | TombstoneNotStored
    | ProtocolViolation
    | RefusedRowSetAside
    | DoneRefused
    | StopReceived
    | DecisionReceived
    | CloseRequested
    | Closed
    | DoneRequested
    | DoneLogged
    | Rewind
    | DeadlineLook
    | DeadlinePassed
    | Failed
    | ErrorSeen
)
"""Every input of the driver."""
