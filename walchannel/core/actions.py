"""What the driver asks the channel to do: its outputs, one class each.

:meth:`Driver.handle <walchannel.core.driver.Driver.handle>` returns them, in
the order they are performed; the channel's executor
(:class:`~walchannel.channel.connection.ConnectionLoop`) performs each and
answers an action whose I/O has a result with the next event
(:mod:`walchannel.core.events`). An action decides nothing: what to do,
with which seq and which words, was decided before it was made. Actions
without fields are module-level singletons, so the per-ack path allocates
none. docs/design.md, "The driver: events and actions".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from walchannel.core.end_status import DownTooLarge, SizeRefusal

__all__ = [
    "ACK_MOVED",
    "ACK_MOVED_BY_ANSWER",
    "CLEAR_FAILED_MARK",
    "DEADLINE_HIT",
    "DONE_ACKED",
    "DONE_DELIVERED",
    "LOG_DONE",
    "MARK_COMPLETED",
    "REDISCOVER",
    "STATE_CHANGED",
    "TOMBSTONE",
    "WAIT_DONE",
    "AckMoved",
    "Action",
    "ArmAckTimer",
    "ArmCheckpointTimer",
    "ArmDeadline",
    "Backoff",
    "CHECKPOINT",
    "Checkpoint",
    "ClearFailedMark",
    "DeadlineHit",
    "Dial",
    "DoneAcked",
    "DoneDelivered",
    "EndStream",
    "KeepaliveDoubled",
    "LogDone",
    "MarkCompleted",
    "NoteProtocolError",
    "RecordEnd",
    "RecordError",
    "Rediscover",
    "Renumbered",
    "Replay",
    "ResolveApproval",
    "SayDownTooLarge",
    "SetAsideRefused",
    "StaleAck",
    "StartStream",
    "StateChanged",
    "StopCallbacks",
    "StoreAck",
    "StoreFailure",
    "Tombstone",
    "Verify",
    "WaitDone",
    "Warn",
]


# -- the connection loop -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dial:
    """Dial the engine's current address with this keepalive (ms); then :class:`StreamOver`."""

    keepalive_ms: int


@dataclass(frozen=True, slots=True)
class Backoff:
    """Sleep ``delay_ms`` (woken early when the run ends); then ``BackoffOver``.

    ``attempt`` is the attempt of the next dial, for the log line.
    """

    delay_ms: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Rediscover:
    """Ask discovery for the engine's address (keep the last on failure); then ``Rediscovered``."""


@dataclass(frozen=True, slots=True)
class StateChanged:
    """The channel's state changed: the waiters follow it (a final state wakes them all)."""


# -- the stream ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartStream:
    """The handshake is answered: write from ``replay_from`` on (the channel is ``STREAMING``)."""

    replay_from: int


@dataclass(frozen=True, slots=True)
class EndStream:
    """End the live stream, if one is, for ``why`` (it is then dialed again, unless over)."""

    why: str


@dataclass(frozen=True, slots=True)
class Replay:
    """``replay_unacked()``: drop the readahead, wake the writer; ``count`` rows go again."""

    count: int


@dataclass(frozen=True, slots=True)
class NoteProtocolError:
    """Say the engine's protocol error ``text`` at ERROR (once per ``kind`` per stream if given)."""

    text: str
    kind: str | None = None


@dataclass(frozen=True, slots=True)
class StaleAck:
    """``Ack(seq)`` moved nothing (``acked`` was received): the stream counts it."""

    seq: int
    acked: int


# -- the handshake answer and acks ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClearFailedMark:
    """Clear the log's ``failed_at`` of an earlier run (a healthy answer came)."""


@dataclass(frozen=True, slots=True)
class Verify:
    """Run ``RunLog.verify(high)``; answer ``Verified`` or ``VerificationFailed``."""

    high: int


@dataclass(frozen=True, slots=True)
class Renumbered:
    """The verification moved the rows from ``unverified`` up by ``shift``: drop the tail, wake.

    Seqs handed out before now live higher; waiters re-read their targets.
    """

    high: int
    unverified: int | None
    shift: int


@dataclass(frozen=True, slots=True)
class AckMoved:
    """The received ack moved (``Driver.acked``): drop acked rows from the tail, wake waiters.

    ``received``: an ``Ack`` (or an answer applied as one) moved it, not a verification.
    """

    received: bool


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Run one checkpoint step (``RunLog.checkpoint``, 4 MiB at most); answer ``Checkpointed``."""


@dataclass(frozen=True, slots=True)
class ArmCheckpointTimer:
    """Have the disk reclaim's timer fire in ``delay_ms`` at the latest (``CheckpointTimerFired``).

    An earlier timer already armed stands.
    """

    delay_ms: float


@dataclass(frozen=True, slots=True)
class DoneAcked:
    """The stored ack covered ``Done``: the log is a tombstone; say so and wake every waiter."""


@dataclass(frozen=True, slots=True)
class StoreAck:
    """Store ``seq`` as the log's ack (``RunLog.ack``); answer ``AckStored`` or ``ErrorSeen``."""

    seq: int


@dataclass(frozen=True, slots=True)
class ArmAckTimer:
    """Arm the coalesced-ack timer to fire in ``delay_ms``; it answers ``AckTimerFired``."""

    delay_ms: float


@dataclass(frozen=True, slots=True)
class ArmDeadline:
    """Look at the wall clock again in ``delay_s`` seconds (``DeadlineLook``)."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class DeadlineHit:
    """``hard_deadline`` passed (the channel is ``EXPIRED``): say it, store it, end the stream."""


# -- the run's end -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreFailure:
    """The run failed (``Driver.failure``): say it, store it with ``reason`` (None: no mark)."""

    reason: str | None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """The engine applied this run's ``Done``: make the log a tombstone.

    Answer ``TombstoneStored``, or ``TombstoneNotStored`` when the log
    cannot be written.
    """


@dataclass(frozen=True, slots=True)
class MarkCompleted:
    """Nothing is left to deliver: make the log a tombstone if it can be (no answer needed)."""


@dataclass(frozen=True, slots=True)
class RecordError:
    """Keep ``text`` as the last error, stored in the log's meta (``loud``: said at ERROR)."""

    text: str
    loud: bool


@dataclass(frozen=True, slots=True)
class Warn:
    """Say ``text`` at WARNING (the engine did something odd that is handled)."""

    text: str


@dataclass(frozen=True, slots=True)
class RecordEnd:
    """Say the stream's end (``loud``: WARNING, else INFO) and keep it as the last error."""

    text: str
    loud: bool


@dataclass(frozen=True, slots=True)
class SayDownTooLarge:
    """A down message was over ``max_receive_message_bytes``: name it; ``kept``: status lost."""

    found: DownTooLarge
    text: str
    kept: bool


@dataclass(frozen=True, slots=True)
class SetAsideRefused:
    """The engine refused a row for its size: find it and set it aside, or hold ``Done``.

    The refused-rows part answers ``RefusedRowSetAside`` or ``DoneRefused``.
    """

    refusal: SizeRefusal
    text: str
    loud: bool


@dataclass(frozen=True, slots=True)
class KeepaliveDoubled:
    """GOAWAY ``too_many_pings``: the keepalive went from ``before`` to ``after`` ms (said once)."""

    before: int
    after: int


@dataclass(frozen=True, slots=True)
class StopCallbacks:
    """Fire the ``on_stop`` callbacks with the engine's ``reason`` (the first ``Stop`` only)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ResolveApproval:
    """Answer the ``request_approval`` that waits on ``request_id`` (cached by the driver)."""

    request_id: str
    approved: bool
    reason: str


@dataclass(frozen=True, slots=True)
class DoneDelivered:
    """``send_done()`` returns True at once: this run's ``Done`` is acked and stored."""


@dataclass(frozen=True, slots=True)
class LogDone:
    """``send_done()`` logs the ``Done`` row, then answers ``DoneLogged``."""


@dataclass(frozen=True, slots=True)
class WaitDone:
    """``send_done()`` waits for the logged ``Done``'s ack (the tombstone stored)."""


ACK_MOVED: Final = AckMoved(received=True)
ACK_MOVED_BY_ANSWER: Final = AckMoved(received=False)
DEADLINE_HIT: Final = DeadlineHit()
DONE_ACKED: Final = DoneAcked()
CHECKPOINT: Final = Checkpoint()
CLEAR_FAILED_MARK: Final = ClearFailedMark()
DONE_DELIVERED: Final = DoneDelivered()
LOG_DONE: Final = LogDone()
MARK_COMPLETED: Final = MarkCompleted()
REDISCOVER: Final = Rediscover()
STATE_CHANGED: Final = StateChanged()
TOMBSTONE: Final = Tombstone()
WAIT_DONE: Final = WaitDone()

Action = (
    Dial
    | Backoff
    | Rediscover
    | StateChanged
    | StartStream
    | EndStream
    | Replay
    | NoteProtocolError
    | StaleAck
    | ClearFailedMark
    | Verify
    | Renumbered
    | AckMoved
    | Checkpoint
    | ArmCheckpointTimer
    | DoneAcked
    | RecordError
    | Warn
    | StoreAck
    | ArmAckTimer
    | ArmDeadline
    | DeadlineHit
    | StoreFailure
    | Tombstone
    | MarkCompleted
    | RecordEnd
    | SayDownTooLarge
    | SetAsideRefused
    | KeepaliveDoubled
    | StopCallbacks
    | ResolveApproval
    | DoneDelivered
    | LogDone
    | WaitDone
)
"""Every output of the driver."""
