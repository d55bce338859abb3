"""The driver: one run's protocol as one object that does no I/O.

h11's ``Connection`` is the model: a test, the simulator (``tools/sim.py``)
and the channel's executor drive this one object alike, through one entry
point, :meth:`Driver.handle`: an event in (:mod:`walchannel.core.events`:
an engine's answer ``Ack(h)``, an ack, a stream's end status, a timer, a
harness's call; times in milliseconds of any monotonic origin, wall-clock
seconds), the actions to perform out (:mod:`walchannel.core.actions`).
Nothing here awaits, reads a clock, touches SQLite, sockets or gRPC.

:class:`Driver` holds what a run's channel knows beyond its log: the state
(:class:`ChannelState` and its legal moves), the cursor (the received ack,
the write position, provisional seqs after a verification shift), ack
coalescing, the reconnect policy (backoff attempt and its reset, and
whether to rediscover), heartbeat and checkpoint timing, ``send_done`` and
the failure that ended the run (and its ``failed_reason``), a ``Done`` held
back after the engine refused it, ``Stop`` and approval decisions (and
their repeats), when the unacked rows were committed, and the counters of
``stats()``. The log's own facts — the next seq, the stored ack,
``unverified_from``, the unacked ``Done`` and completion — have one owner,
the log's :class:`~walchannel.log.state.LogState`; the driver reads them
through :class:`StateSource` and never keeps a copy.

The channel's executor (:meth:`ConnectionLoop.feed
<walchannel.channel.connection.ConnectionLoop.feed>`) performs the actions
and feeds each result back as the next event. The writer's per-row calls
are events too (``Writing``, ``Written``), answered with no action; a row
written or an ack allocates its event and nothing else. SPEC "The
channel"; docs/design.md, "The driver: events and actions", has the tables.
"""

from __future__ import annotations

import enum
import random as _random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol

from walchannel.core import actions as act
from walchannel.core import events as ev
from walchannel.core.actions import Action
from walchannel.core.ages import CommitAges
from walchannel.core.checkpoints import CHECKPOINT_IDLE_MS, CheckpointPolicy
from walchannel.core.end_status import (
    DownTooLarge,
    Meaning,
    SizeRefusal,
    is_too_many_pings,
    parse_receive_limit,
    parse_size_refusal,
    read_end,
    run_completed_by,
)
from walchannel.core.engine_refusals import fenced_error
from walchannel.core.watchdog import Verdict, loop_stalled, stream_verdict, watchdog_period_ms
from walchannel.errors import (
    BacklogFullError,
    ChannelClosedError,
    EngineBehindError,
    RunCompletedError,
    RunExpiredError,
    WalchannelError,
    WriterFencedError,
    raw_message,
)
from walchannel.log.state import (
    COMPLETED_BY_ANOTHER,
    FAILED_CORRUPT,
    FAILED_DONE_REFUSED,
    FAILED_ENGINE_BEHIND,
    FAILED_GROUP_LOST,
    FAILED_INTERNAL,
    FAILED_LOG_REMOVED,
    FAILED_UNDELIVERABLE,
    LogState,
    Writer,
    fenced_reason,
    impossible_answer,
    refused_at_open,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from walchannel.config import GrpcChannelConfig

__all__ = [
    "ACK_STORE_AFTER_MS",
    "ACK_STORE_EVERY",
    "ACK_STORE_RETRY_MAX_MS",
    "MAX_KEEPALIVE_MS",
    "STABLE_STREAM_MS",
    "AckKind",
    "Answer",
    "AnswerPlan",
    "Call",
    "ChannelState",
    "Completion",
    "Driver",
    "End",
    "EndPlan",
    "StateError",
    "StateSource",
]

#: Store a received ack after this many acks ...
ACK_STORE_EVERY: Final = 256
#: ... or this long after the first unstored one (ms), whichever comes first.
ACK_STORE_AFTER_MS: Final = 100.0
#: A failed store is tried again after ACK_STORE_AFTER_MS, doubling per failure up to this (ms).
ACK_STORE_RETRY_MAX_MS: Final = 5_000.0
#: A stream up this long resets the backoff attempt counter (ms).
STABLE_STREAM_MS: Final = 30_000.0
#: Cap of the keepalive after GOAWAY too_many_pings doublings (ms).
MAX_KEEPALIVE_MS: Final = 300_000
#: How often the hard_deadline timer looks at the wall clock at the longest (seconds).
DEADLINE_LOOK_S: Final = 60.0
#: The stream ends that refuse a run's token (an unknown run, a wrong token).
REFUSED_TOKEN_CODES: Final = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED"})


# -- states --------------------------------------------------------------------------------


class ChannelState(enum.Enum):
    """Where a channel is. ``CLOSED`` is final; ``EXPIRED`` and ``FAILED`` only lead to it."""

    IDLE = "idle"
    CONNECTING = "connecting"
    STREAMING = "streaming"
    BACKOFF = "backoff"
    EXPIRED = "expired"
    FAILED = "failed"
    CLOSED = "closed"


_S = ChannelState
_LEGAL: Final[dict[ChannelState, frozenset[ChannelState]]] = {
    _S.IDLE: frozenset({_S.CONNECTING, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.CONNECTING: frozenset({_S.STREAMING, _S.BACKOFF, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.STREAMING: frozenset({_S.BACKOFF, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.BACKOFF: frozenset({_S.CONNECTING, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.EXPIRED: frozenset({_S.CLOSED}),
    _S.FAILED: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}
_FINAL: Final = frozenset({_S.EXPIRED, _S.FAILED, _S.CLOSED})
# No bound on acks but the high-water (above any uint64 an Ack carries).
_NO_BOUND: Final = 2**64
_EXPIRED: Final = _S.EXPIRED  # module globals: the admission check runs on every send
_FAILED: Final = _S.FAILED
# What an event that asks for nothing returns: shared, so it allocates nothing.
_NOTHING: Final[tuple[Action, ...]] = ()
_ANSWER_REFUSED: Final = "handshake answer refused"
_JUST_MOVED: Final[tuple[Action, ...]] = (act.ACK_MOVED,)
_CHECKPOINT: Final[tuple[Action, ...]] = (act.CHECKPOINT,)


class StateError(RuntimeError):
    """An illegal state transition: a bug in walchannel, never a user error."""


# -- the decisions' enums ------------------------------------------------------------------


class Call(enum.Enum):
    """What a caller asks to do (:meth:`Driver.admit`): the admission check differs."""

    SEND = "send"  # send_event, send_finding(s), request_approval: a new row
    DONE = "done"  # send_done
    HANDSHAKE = "handshake"


class Answer(enum.Enum):
    """What the engine's answer ``Ack(h)`` to a handshake means. SPEC "Dial"."""

    NO_ANSWER = "no_answer"  # engine_acks_handshake=False: replay from the cursor
    RESUME = "resume"  # an ordinary ack of h: replay from h + 1
    VERIFY = "verify"  # first answer since open: the action Verify, answered by Verified
    BEHIND = "behind"  # h below the stored cursor: FAILED, EngineBehindError
    # A log that never had an answered handshake (nor a restore or takeover)
    # meets an engine holding rows of the run: another writer's. FAILED, WriterFencedError.
    FOREIGN = "foreign"
    FORGOT = "forgot"  # h below an ack received, not stored: re-send from h + 1
    AHEAD = "ahead"  # h above anything this log wrote: a protocol error, the stream ends
    # h past SQLite's range, or its verification shift would carry a row past
    # it: a protocol error, never applied; the stream ends and is dialed again.
    IMPOSSIBLE = "impossible"


class AckKind(enum.Enum):
    """What a received ``Ack(seq)`` does. SPEC "Acks"."""

    ADVANCE = "advance"  # moves the cursor
    STALE = "stale"  # at or below the cursor: nothing to do
    ABOVE_HIGH_WATER = "above_high_water"  # protocol error: never applied
    # Beyond every row this channel wrote and the stream's answer h: the
    # engine acks what it never received. A protocol error, never applied;
    # the stream ends and is dialed again.
    NEVER_WRITTEN = "never_written"


class End(enum.Enum):
    """What a stream's end means for the run. SPEC "Reconnect"."""

    RECONNECT = "reconnect"  # record the error; back off and dial again
    RUN_COMPLETED = "run_completed"  # FAILED_PRECONDITION "run completed": the loop ends
    # FAILED_PRECONDITION "owned by another writer" / "writer fenced": the loop ends
    FENCED = "fenced"
    SIZE_REFUSAL = "size_refusal"  # the engine refused an up-message for its size
    DOWN_TOO_LARGE = "down_too_large"  # a down message over max_receive_message_bytes
    ALREADY_OVER = "already_over"  # the channel was FAILED/EXPIRED: nothing to record
    # FAILED_PRECONDITION "expected seq N" below the stored cursor: the engine
    # contradicts what it acked; the run has failed (engine behind)
    CONTRADICTED = "contradicted"


class Completion(enum.Enum):
    """What the engine's "run completed" does to this run's log (docs/design.md)."""

    TOMBSTONE = "tombstone"  # our Done was applied, its ack lost: RunLog.complete_by_engine
    UNDELIVERABLE = "undeliverable"  # rows remain that can never go: mark the run failed
    NOTHING = "nothing"  # nothing left: the loop ends, the log stays as it is
    # The run is another writer's (refused, or completed by another with rows
    # here): FAILED with WriterFencedError, every row kept.
    FENCED = "fenced"


# -- what the driver reads: the log's state ------------------------------------------------


class StateSource(Protocol):
    """Where the driver reads the log's facts: ``RunLog`` (its ``state`` property)."""

    @property
    def state(self) -> LogState:
        """The log's current :class:`~walchannel.log.state.LogState`."""
        ...


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """What a handshake answer meant, once applied; ``Answered``'s actions are made from it.

    Attributes:
        answer: what it meant.
        replay_from: the first seq to write on the stream; None: the stream ends.
        clear_failed_mark: a healthy answer clears a ``failed_at`` left in
            the log by an earlier run (``inspect`` no longer says failed).
        problem: for the log line: with ``AHEAD`` and ``IMPOSSIBLE``, the
            protocol error (counted, in ``last_error``); with ``FORGOT``,
            which acks the engine forgot.
        failed_reason: with ``BEHIND`` and ``FOREIGN`` (the run failed,
            :attr:`Driver.failure`), the ``failed_reason`` to store.
        acked_moved: with ``RESUME``, the answer moved the received ack:
            the ack's actions follow (store when due, wake waiters).
    """

    answer: Answer
    replay_from: int | None
    clear_failed_mark: bool = False
    problem: str = ""
    failed_reason: str | None = None
    acked_moved: bool = False


class EndPlan(NamedTuple):
    """What a stream's end meant, once applied; ``Ended``'s actions are made from it.

    Attributes:
        end: what it means.
        keepalive_doubled: the engine sent GOAWAY ``too_many_pings``: the
            keepalive was doubled (:attr:`Driver.keepalive_ms`).
        refusal: with :attr:`End.SIZE_REFUSAL`, what the engine said.
        too_large: with :attr:`End.DOWN_TOO_LARGE`, what gRPC said of the
            down message.
        cause_kept: with :attr:`End.DOWN_TOO_LARGE`, gRPC lost this end's
            status (grpc/grpc#36066): ``too_large`` is the last end's cause.
        completion: with ``RUN_COMPLETED`` and ``FENCED``, what the engine's
            word does to the log. Unless ``TOMBSTONE`` (the action
            ``Tombstone``, answered by ``TombstoneStored`` or
            ``TombstoneNotStored``), the run has failed already: the action
            ``StoreFailure`` stores :attr:`failed_reason`.
        failed_reason: that failure's ``failed_reason`` (None: none to store).
    """

    end: End
    keepalive_doubled: bool
    refusal: SizeRefusal | None
    too_large: DownTooLarge | None = None
    cause_kept: bool = False
    completion: Completion | None = None
    failed_reason: str | None = None


# -- the driver ----------------------------------------------------------------------------


class Driver:
    """The protocol state of one run's channel, and every decision about it.

    Args:
        config: the run's configuration (read: run id, backoff, keepalive,
            ``dead_stream_ms``, ``min_send_rate_bytes_per_s``,
            ``hard_deadline``, ``engine_acks_handshake``).
        log: where the log's facts are read (the open ``RunLog``).
        failed_mark: the log holds ``failed_at`` from an earlier run (a
            healthy handshake answer clears it).
        now_ms: the time of creation (ms, monotonic).
        writer: the log's writer identity (``RunLog.writer``); None: not
            known, and the log is trusted to meet rows (the driver's own tests).
        failed_reason: the log's stored ``failed_reason``: a fenced log not
            marked to take over starts ``FAILED`` with ``WriterFencedError``.
        path: the log file, for the errors that name it.
        written_bound: ``RunLog.written_bound`` (the highest seq the log can
            have written before this channel), or None when not known.
        rng: the backoff's jitter (``Backoff.delay_ms``); None: a fresh
            ``random.Random``. The channel passes its own (SystemRandom, or
            the simulator's seeded one).

    Its fields (``state``, ``acked``, the counters, …) are read-only
    properties: only :meth:`handle` changes them, and ``state`` only through
    the transition table (SPEC "The channel", the state diagram), as h11's
    ``Connection`` changes state only through its machine.
    """

    def __init__(
        self,
        config: GrpcChannelConfig,
        log: StateSource,
        *,
        failed_mark: bool,
        now_ms: float,
        writer: Writer | None = None,
        failed_reason: str | None = None,
        path: str = "",
        written_bound: int | None = None,
        rng: _random.Random | None = None,
    ) -> None:
        self._log = log
        # The backoff's jitter: a seeded source in the simulator and the tests.
        self._rng = rng if rng is not None else _random.Random()
        self._rediscovers = config.http_addr is not None
        self._max_unacked_bytes = config.max_unacked_bytes
        self._ack_timer_armed = False
        self._pings_warned = False
        self._handlers: dict[type, Callable[[Any], Sequence[Action]]] = {
            ev.LoopStarted: self._on_loop_started,
            ev.StreamOver: self._on_stream_over,
            ev.BackoffOver: self._on_backoff_over,
            ev.Rediscovered: self._on_rediscovered,
            ev.Answered: self._on_answered,
            ev.Verified: self._on_verified,
            ev.VerificationFailed: self._on_verification_failed,
            ev.RowsCommitted: self._on_rows_committed,
            ev.BacklogDated: self._on_backlog_dated,
            ev.AckReceived: self._on_ack_received,
            ev.Writing: self._on_writing,
            ev.Written: self._on_written,
            ev.AckTimerFired: self._on_ack_timer_fired,
            ev.AcksFlushed: self._on_acks_flushed,
            ev.AckStored: self._on_ack_stored,
            ev.AckStoreFailed: self._on_ack_store_failed,
            ev.CheckpointTimerFired: self._on_checkpoint_timer_fired,
            ev.Checkpointed: self._on_checkpointed,
            ev.Ended: self._on_ended,
            ev.TombstoneStored: self._on_tombstone_stored,
            ev.TombstoneNotStored: self._on_tombstone_not_stored,
            ev.ProtocolViolation: self._on_protocol_violation,
            ev.RefusedRowSetAside: self._on_refused_row_set_aside,
            ev.DoneRefused: self._on_done_refused,
            ev.StopReceived: self._on_stop_received,
            ev.DecisionReceived: self._on_decision_received,
            ev.CloseRequested: self._on_close_requested,
            ev.Closed: self._on_closed,
            ev.DoneRequested: self._on_done_requested,
            ev.DoneLogged: self._on_done_logged,
            ev.Rewind: self._on_rewind,
            ev.DeadlineLook: self._on_deadline_look,
            ev.DeadlinePassed: self._on_deadline_passed,
            ev.Failed: self._on_failed,
            ev.ErrorSeen: self._on_error_seen,
        }
        self._run_id = config.run_id
        self._writer = writer
        self._ever_up = False  # a stream of this channel came up: the log had an answer
        self._path = path
        # What the engine said when it ended the run for this writer.
        self._engine_refused: str | None = None
        self._completed_by: str | None = None
        self._fenced_failure: str | None = None
        self._backoff = config.backoff
        self._dead_stream_ms = config.dead_stream_ms
        self._min_send_rate = float(config.min_send_rate_bytes_per_s)
        self._acks_handshake = config.engine_acks_handshake
        deadline = config.hard_deadline
        self._deadline_s = None if deadline is None else deadline.timestamp()
        self._state = ChannelState.IDLE
        self._closed = False
        self._done_sent = False
        # This channel's Done was delivered: its ack stored, or the engine's
        # "run completed" made its log a tombstone. Not so for a tombstone
        # over nothing (another writer completed the run): send_done raises.
        self._done_delivered = False
        self._failure: WalchannelError | None = None
        self._failed_mark = failed_mark
        # The cursor.
        self._acked = log.state.last_acked
        self._write_pos = 0
        self._pending = 0
        self._pending_since_ms: float | None = None
        # The coalescing window (ms), and the next one should a store fail again.
        self._ack_window_ms = self._ack_retry_ms = ACK_STORE_AFTER_MS
        self._provisional: tuple[int, int, int] | None = None
        self._verifying: tuple[int, int] | None = None
        self._hold_at: int | None = None
        self._held: WalchannelError | None = None
        # The reconnect policy.
        self._attempt = 0
        self._first_written: int | None = None
        self._up_since_ms: float | None = None
        self._keepalive_ms = config.keepalive_ms
        # Counters.
        self._sent = 0
        self._replayed = 0
        self._max_written = 0
        # The highest seq whose write ever started on a stream of this channel,
        # and what an ack may cover: the higher of it and the stream's answer
        # h (no bound without answers: engine_acks_handshake=False).
        self._max_started = 0
        self._ack_bound = _NO_BOUND
        # The highest seq this log can have written before this channel
        # (RunLog.written_bound: what its owners kept in its lock file, ahead
        # of their writers, on this boot), or the h a verification took; None
        # until one of them is known (the verification path).
        self._written_bound = written_bound
        self._dials = 0
        self._reconnects = 0
        self._protocol_errors = 0
        self._last_error: str | None = None
        self._last_end_code: str | None = None
        # Stream ends since a stream was last up, and how many refused the token.
        self._ends_down = 0
        self._refused_down = 0
        self._down_too_large: DownTooLarge | None = None
        self._repeated_end: str | None = None
        # Down messages: Stop fires once, decisions are kept by request id.
        self._stopped = False
        self._decided: dict[str, tuple[bool, str]] = {}
        self._checkpoints = CheckpointPolicy(now_ms)
        self._ages = CommitAges()
        if refused_at_open(failed_reason, writer is not None and writer.take_over):
            # Refused before, and not marked to take over: no dial, no send.
            self._failure = self._fenced(f"it was refused before: {failed_reason}")
            self._move(ChannelState.FAILED)
        elif writer is not None and writer.take_over and not self._acks_handshake:
            # A takeover numbers this log's rows after the engine's h. Without
            # the answer they would start at the log's own seqs, which the
            # engine holds from the old writer: dropped as duplicates, lost.
            self._failure = WriterFencedError(
                f"run {self._run_id}: {self._path or 'the log'} is marked to take the run over "
                "(walchannel takeover), which needs the engine's handshake answer to number "
                "its rows after the engine's: set engine_acks_handshake=True (an engine that "
                "answers handshakes); without it the engine would drop them as duplicates of "
                f"the old writer's rows. Every row stays in {self._path or 'the log'}",
                run_id=self._run_id,
                path=self._path,
                writer_id=writer.id,
            )
            self._move(ChannelState.FAILED)

    # -- its own fields: read-only outside the driver ----------------------------------------

    @property
    def run_id(self) -> str:
        """The run (for the errors that name it)."""
        return self._run_id

    @property
    def state(self) -> ChannelState:
        """The :class:`ChannelState`; it changes only through the transition table."""
        return self._state

    @property
    def acked(self) -> int:
        """The highest seq received in an ack; at least the stored cursor."""
        return self._acked

    @property
    def write_pos(self) -> int:
        """The next seq to write on the live stream (0: no stream)."""
        return self._write_pos

    @property
    def provisional(self) -> tuple[int, int, int] | None:
        """``(first, end, shift)``: seqs in ``[first, end)`` handed out before a
        verification shift now live at ``seq + shift``."""
        return self._provisional

    @property
    def hold_at(self) -> int | None:
        """A ``Done`` the engine refused for its size: nothing from this seq on is
        written; :attr:`held` is raised once the rows before it are acked."""
        return self._hold_at

    @property
    def held(self) -> WalchannelError | None:
        """The error the channel stops with once the rows before :attr:`hold_at` are acked."""
        return self._held

    @property
    def closed(self) -> bool:
        """``close()`` was called (or the channel's event loop is gone)."""
        return self._closed

    @property
    def done_sent(self) -> bool:
        """``send_done()`` was called: no new rows."""
        return self._done_sent

    @property
    def failure(self) -> WalchannelError | None:
        """The error that ended the run (``FAILED`` or a completed run); sends raise it."""
        return self._failure

    @property
    def attempt(self) -> int:
        """The backoff attempt of the next dial."""
        return self._attempt

    @property
    def keepalive_ms(self) -> int:
        """The keepalive of the next dial (ms; doubled after GOAWAY ``too_many_pings``)."""
        return self._keepalive_ms

    @property
    def sent(self) -> int:
        """Rows written for the first time on this channel's streams (``stats()``)."""
        return self._sent

    @property
    def replayed(self) -> int:
        """Rows written again on this channel's streams (``stats()``)."""
        return self._replayed

    @property
    def reconnects(self) -> int:
        """Streams after the first that came up (``stats()``)."""
        return self._reconnects

    @property
    def protocol_errors(self) -> int:
        """Impossible answers of the engine, counted, never applied (``stats()``)."""
        return self._protocol_errors

    @property
    def last_error(self) -> str | None:
        """The last connection or engine error (no token)."""
        return self._last_error

    @property
    def last_end_code(self) -> str | None:
        """The gRPC status name of the last stream end."""
        return self._last_end_code

    @property
    def every_dial_refused(self) -> bool:
        """True when at least two dials ended since a stream was last up, each refusing the token.

        UNAUTHENTICATED or PERMISSION_DENIED: an unknown run or a wrong token
        (a replacement engine that does not know the run yet answers so too).
        """
        return self._ends_down >= 2 and self._refused_down == self._ends_down

    @property
    def down_too_large(self) -> DownTooLarge | None:
        """The last stream end with a known status was a down message over
        ``max_receive_message_bytes`` (None: it was not, or a stream since had a
        row acked or lived :data:`STABLE_STREAM_MS`)."""
        return self._down_too_large

    @property
    def failed_mark(self) -> bool:
        """The log's ``failed_at`` from an earlier run is still to be cleared.

        Not a copy of the log's meta but a duty: the first healthy handshake
        answer hands it to the channel (``AnswerPlan.clear_failed_mark``) once.
        """
        return self._failed_mark

    @property
    def stopped(self) -> bool:
        """The engine sent ``Stop`` (callbacks fired)."""
        return self._stopped

    @property
    def fenced_failure(self) -> str | None:
        """The ``failed_reason`` of the last :meth:`_fenced` error."""
        return self._fenced_failure

    # -- the log's facts (read, never kept) ------------------------------------------------

    @property
    def high_water(self) -> int:
        """The highest committed seq (the log's)."""
        return self._log.state.next_seq - 1

    @property
    def stored(self) -> int:
        """The ack the log stores (rows ``<=`` it are deleted)."""
        return self._log.state.last_acked

    @property
    def unverified_from(self) -> int | None:
        """The log's ``unverified_from``; None once verified."""
        return self._log.state.unverified_from

    @property
    def done_seq(self) -> int | None:
        """The seq of the logged, unacked ``Done``, if any."""
        return self._log.state.done_seq

    @property
    def completed(self) -> bool:
        """The log is a tombstone."""
        return self._log.state.completed

    @property
    def unacked(self) -> int:
        """Rows not covered by a received ack (0 once the run is completed)."""
        state = self._log.state
        return 0 if state.completed else state.next_seq - 1 - self._acked

    # -- state -----------------------------------------------------------------------------

    @property
    def final(self) -> bool:
        """True in ``EXPIRED``, ``FAILED`` and ``CLOSED``: the connection loop is over."""
        return self._state in _FINAL

    def _move(self, new: ChannelState) -> bool:
        """Move to ``new``; return True when the state changed (staying put is allowed).

        Raises:
            StateError: the move is not legal (e.g. out of ``CLOSED``).
        """
        old = self._state
        if new is old:
            return False
        if new not in _LEGAL[old]:
            raise StateError(f"illegal channel state change {old.name} -> {new.name}")
        self._state = new
        return True

    def _deadline_in_s(self, now_wall_s: float) -> float | None:
        """Seconds until ``hard_deadline`` (0 when past; None without one)."""
        return None if self._deadline_s is None else max(0.0, self._deadline_s - now_wall_s)

    def admit(self, call: Call, now_wall_s: float) -> WalchannelError | None:
        """The one admission check of a call: None to go ahead, else the error to raise.

        The order is SPEC "Buffer first": closed, then ``send_done`` already
        called (sends and ``send_done``), then — for ``send_done`` on a run
        whose ``Done`` is acked and stored, nothing more — in ``FAILED`` the
        failure that ended the run (final: a deadline passing later never
        replaces it, SPEC "States"), then past ``hard_deadline``, or
        already ``EXPIRED`` whatever the wall clock says now (a
        :class:`~walchannel.errors.RunExpiredError`: the channel feeds
        ``DeadlinePassed`` before it raises, which moves it to ``EXPIRED``;
        ``send_done`` returns False instead of raising), then a failure kept
        after the expiry. A query: it changes nothing.

        Args:
            call: what is asked.
            now_wall_s: the wall clock (unix seconds), for ``hard_deadline``.
        """
        if self._closed:
            return ChannelClosedError(f"run {self._run_id}: the channel is closed")
        if self._done_sent and call is not Call.HANDSHAKE:
            if call is Call.DONE:
                return ChannelClosedError(f"run {self._run_id}: send_done() was already called")
            return ChannelClosedError(f"run {self._run_id}: send_done() was called; no new rows")
        if call is Call.DONE and self.completed and self._done_delivered:
            return None  # this run's Done is acked and stored: nothing can fail it now
        if self._state is _FAILED:
            return self._failure
        # EXPIRED is final: a wall clock stepped back before the deadline does not reopen it.
        deadline_s = self._deadline_s
        if (deadline_s is not None and now_wall_s >= deadline_s) or self._state is _EXPIRED:
            return RunExpiredError(f"run {self._run_id}: past its hard_deadline")
        return self._failure

    def ended_error(self) -> WalchannelError | None:
        """The error the run's end gives whoever waits on it; None while the loop runs.

        The one place it is built for every waiter (``handshake``,
        ``request_approval``): the failure that ended the run (``FAILED``, or
        a completed run), else past ``hard_deadline`` (``EXPIRED``), else
        closed. A new call is admitted by :meth:`admit`, whose order is
        SPEC's "Buffer first" (closed and the deadline first).
        """
        if self._failure is not None:
            return self._failure
        if self._state is _EXPIRED:
            return RunExpiredError(f"run {self._run_id}: past its hard_deadline")
        if self._closed or self._state is ChannelState.CLOSED:
            return ChannelClosedError(f"run {self._run_id}: the channel is closed")
        return None

    def _expire(self) -> bool:
        """``hard_deadline`` passed: move to ``EXPIRED``; False when already over."""
        if self.final:
            return False
        return self._move(ChannelState.EXPIRED)

    def _fail(self, error: WalchannelError, *, reason: str | None = None) -> str | None:
        """The run fails with ``error`` (sends raise it); return the ``failed_reason`` to store.

        Moves to ``FAILED`` unless already over. The reason names why for
        ``inspect`` (``log_state.FAILED_*``): ``reason`` when given (a
        refused ``Done``, a damaged file, a broken invariant), the engine
        behind for an :class:`~walchannel.errors.EngineBehindError`, else None.
        """
        self._failure = error
        if not self.final:
            self._move(ChannelState.FAILED)
        if reason is None and isinstance(error, EngineBehindError):
            return FAILED_ENGINE_BEHIND
        return reason

    def _protocol_error(self, message: str) -> str:
        """The engine broke the protocol: count it; return the ``last_error`` text (SPEC "Acks")."""
        self._protocol_errors += 1
        self._last_error = f"protocol error: {message}"
        return self._last_error

    # -- the handshake answer --------------------------------------------------------------

    def _answer(self, engine_high: int | None, now_ms: float) -> AnswerPlan:
        """Apply the engine's handshake answer ``Ack(h)``; return what it meant. SPEC "Dial".

        One call applies every change of the driver's own state the answer
        makes; :meth:`_on_answered` makes the plan into actions (the log, the
        stream, the waiters). By :attr:`AnswerPlan.answer`:

        - ``RESUME``: ``h`` is applied as a received ack
          (:attr:`AnswerPlan.acked_moved`: then the ack path, as after
          :meth:`_ack`).
        - ``FORGOT``: ``h`` is below acks received but not stored: the cursor
          steps back to ``max(h, stored)`` and those rows are written again.
        - ``VERIFY``: the action ``Verify`` runs ``RunLog.verify(h)``, and
          its ``Verified`` applies the shift (:meth:`_verified`): the log's
          rows move in between.
        - ``BEHIND``, ``FOREIGN``: the run has failed (:attr:`failure`);
          ``StoreFailure`` stores :attr:`AnswerPlan.failed_reason`.
        - ``AHEAD``, ``IMPOSSIBLE``: a protocol error, counted and kept as
          :attr:`last_error`, never applied (:attr:`AnswerPlan.problem`),
          and the stream ends: ``h`` above anything this log wrote
          (:attr:`written_bound`), or past SQLite's range, or a shift that
          would carry a row past it
          (:func:`~walchannel.log.state.impossible_answer`).

        Args:
            engine_high: ``h``; None without ``engine_acks_handshake`` (no
                answer is awaited).
            now_ms: the time of the answer (ms, monotonic): when a ``RESUME``
                ack waits to be stored from.
        """
        if engine_high is None:
            self._ack_bound = _NO_BOUND
            return AnswerPlan(Answer.NO_ANSWER, self._acked + 1)
        problem = impossible_answer(
            engine_high, unverified_from=self.unverified_from, high_water=self.high_water
        )
        if problem is not None:
            said = self._protocol_error(f"{problem}; not applied")
            return AnswerPlan(Answer.IMPOSSIBLE, None, problem=said)
        if engine_high < self.stored:
            reason = self._fail(self._behind(engine_high))
            return AnswerPlan(Answer.BEHIND, None, failed_reason=reason)
        unverified = self.unverified_from
        writer = self._writer
        if unverified is not None and engine_high > 0 and writer and not writer.may_meet_rows:
            error = self._fenced(
                f"this log never had an answered handshake, and the engine already holds "
                f"seqs up to {engine_high} of the run: they are another writer's (a lost or "
                "misplaced log: a WALCHANNEL_DIR typo, a relative wal_dir, a volume gone; or "
                "a second harness); joining them would apply findings twice",
                engine_high=engine_high,
            )
            reason = self._fail(error, reason=self._fenced_failure)
            return AnswerPlan(Answer.FOREIGN, None, failed_reason=reason)
        clear = self._failed_mark
        self._failed_mark = False
        written = self.written_bound
        if written is None and unverified is None:
            written = self.high_water  # verified, bound not known: nothing above was logged
        if written is not None and engine_high > written:
            # No engine can hold a seq this log never wrote (SPEC "Acks"): not
            # applied, and no bound for acks either (never the answer itself).
            said = self._protocol_error(
                f"handshake answer Ack({engine_high}) is above seq {written}, the highest "
                "this log can have written; not applied"
            )
            self._ack_bound = self._max_started  # never the answer itself
            return AnswerPlan(Answer.AHEAD, None, clear, problem=said)
        self._ack_bound = max(engine_high, self._max_started)
        if unverified is not None:
            # After the log's verification the high-water is at least h.
            self._verifying = (unverified, self.high_water + 1)
            return AnswerPlan(Answer.VERIFY, engine_high + 1, clear)
        if engine_high < self._acked:
            forgot_from = self._acked
            # Re-send what it forgot; what the log stores is gone from it.
            self._acked = max(engine_high, self.stored)
            self._clear_pending()
            return AnswerPlan(
                Answer.FORGOT, engine_high + 1, clear, problem=f"below acks it gave ({forgot_from})"
            )
        moved = self._ack(engine_high, now_ms) is AckKind.ADVANCE
        return AnswerPlan(Answer.RESUME, engine_high + 1, clear, acked_moved=moved)

    def _contradicted(self, expected: int) -> EngineBehindError:
        return EngineBehindError(
            f"run {self._run_id}: engine behind: it expects seq {expected}, so it holds seqs "
            f"only up to {expected - 1}, below the cursor {self.stored} this log stored from "
            "its acks and answers; it lost rows it acked (or answered above what it held), "
            "and this log deleted them: they cannot be re-sent"
        )

    def _behind(self, engine_high: int) -> EngineBehindError:
        return EngineBehindError(
            f"run {self._run_id}: engine behind: its high-water {engine_high} is below "
            f"the stored cursor {self.stored}; it lost rows this log already "
            "deleted, which cannot be re-sent"
        )

    def _fenced(self, why: str, *, engine_high: int | None = None) -> WriterFencedError:
        """The :class:`~walchannel.errors.WriterFencedError` for ``why``, its reason kept.

        The message says where the rows are and what to do (review them,
        or take the run over); :attr:`fenced_failure` is set to the
        ``failed_reason`` to store (:func:`~walchannel.log.state.fenced_reason`).

        Args:
            why: the cause (the engine's words, or the log's own evidence).
            engine_high: the engine's high-water, when the evidence is the log's.
        """
        self._fenced_failure = fenced_reason(why)
        writer = self._writer
        answered = self._ever_up or writer is None or writer.answered
        return fenced_error(
            self._run_id, self._path, writer, why, engine_high=engine_high, answered=answered
        )

    def _verified(self, engine_high: int, shift: int) -> None:
        """The log applied the verification rule for ``h`` with ``shift``; follow it.

        The log moved its rows (``LogState.verify``); the driver only keeps
        which seqs it handed out before are provisional (:meth:`translate`).
        """
        if shift and self._verifying is not None:
            first, end = self._verifying
            self._provisional = (first, end, shift)
            self._ages.shift(first, end, shift)  # the marks follow the log's rows
        self._verifying = None
        if engine_high > self._acked:
            self._acked = engine_high
        # The engine's h is this log's numbering from now on: a later answer
        # above it (and above every write) is no engine's word.
        self._written_bound = max(self._written_bound or 0, engine_high)
        self._clear_pending()

    def translate(self, seq: int) -> int:
        """Map a seq handed out before a verification shift to where its row lives now.

        The one place seqs are renumbered for the channel: every waiter and
        answer asks :meth:`is_acked` (or this), none shifts a seq itself.
        """
        if self._provisional is not None:
            first, end, shift = self._provisional
            if first <= seq < end:
                return seq + shift
        return seq

    def is_acked(self, handed_out: int) -> bool:
        """Tell whether the engine acked the row handed out as seq ``handed_out``.

        ``wait_acked(t)`` answers this: ``t`` as returned by ``send_*``,
        followed through any verification shift (SPEC "Dial"). On a
        tombstone every row logged was delivered, also when the engine's
        "run completed" stood in for the ``Done``'s lost ack: it applied
        the ``Done``, so every row before it (SPEC "Completion"). The
        ``Done`` itself counts only with its tombstone stored (SPEC
        "Shutdown order"), as for ``send_done``: an ack of it the disk
        refused leaves it to a resume or ``flush``.
        """
        seq = self.translate(handed_out)
        state = self._log.state
        if state.completed and seq < state.next_seq:
            return True
        if state.done_seq is not None and seq >= state.done_seq:
            return False
        return self._acked >= seq

    # -- acks ------------------------------------------------------------------------------

    def _ack(self, seq: int, now_ms: float) -> AckKind:
        """Apply a received cumulative ``Ack(seq)``: ``acked = max(acked, seq)``. SPEC "Acks".

        A writer standing at or below ``seq`` (rewound by ``replay_unacked``
        while those rows were in flight) moves to ``seq + 1``: acked rows are
        not written again, and the log may already have deleted them. An ack
        covering a row written on this stream resets the backoff attempt.

        Returns:
            ``ADVANCE`` when it moved the cursor (then :meth:`_ack_to_store`),
            ``STALE`` when it did not; for a protocol error, counted and
            kept as :attr:`last_error`, never applied: ``NEVER_WRITTEN``
            beyond :attr:`ack_bound` (rows never written: the stream ends;
            without handshake answers, beyond the high-water),
            ``ABOVE_HIGH_WATER`` for a seq never logged within it (after an
            answer above the high-water).
        """
        if seq > self._ack_bound or seq > self._log.state.next_seq - 1:
            return self._impossible_ack(seq)
        if self._first_written is not None and seq >= self._first_written:
            self._attempt = 0
            self._down_too_large = None
        if seq <= self._acked:
            return AckKind.STALE
        self._acked = seq
        if self._write_pos and self._write_pos <= seq:
            self._write_pos = seq + 1
        self._pending += 1
        if self._pending_since_ms is None:
            self._pending_since_ms = now_ms
        return AckKind.ADVANCE

    def _impossible_ack(self, seq: int) -> AckKind:
        """``Ack(seq)`` covers rows never written or never logged: count it, apply nothing."""
        high_water = self._log.state.next_seq - 1
        if seq <= self._ack_bound and self._acks_handshake:
            self._protocol_error(f"Ack({seq}) is above the high-water {high_water}; not applied")
            return AckKind.ABOVE_HIGH_WATER
        if self._acks_handshake:
            bound = (
                f"beyond seq {self._ack_bound}, the highest this channel wrote or the engine "
                "answered the handshake with"
            )
        else:
            # Without answers the high-water is the bound (SPEC "Acks").
            bound = (
                f"beyond seq {high_water}, the log's high-water (the engine answers no handshakes)"
            )
        self._protocol_error(f"Ack({seq}) covers rows never written: {bound}; not applied")
        return AckKind.NEVER_WRITTEN

    def _ack_to_store(self, now_ms: float, *, force: bool = False) -> int | None:
        """Return the ack to store in the log now, or None to keep coalescing.

        Acks are stored every :data:`ACK_STORE_EVERY` acks or
        :data:`ACK_STORE_AFTER_MS` after the first unstored one; an ack
        covering ``Done`` is stored at once; ``force`` (close, limits) too.
        After a failed store the window is the retry's pause (``AckStoreFailed``).
        SPEC "The log".
        """
        state = self._log.state
        acked = self._acked
        if acked <= state.last_acked:
            return None
        if (
            force
            or self._pending >= ACK_STORE_EVERY
            or (state.done_seq is not None and acked >= state.done_seq)
            or (
                self._pending_since_ms is not None
                and now_ms - self._pending_since_ms >= self._ack_window_ms
            )
        ):
            # Handed out to store: the coalescing window starts again (a store
            # that fails opens the retry's window: AckStoreFailed).
            self._clear_pending()
            return acked
        return None

    def _ack_timer_ms(self, *, timer_armed: bool) -> float | None:
        """In how many ms a coalesced ack must be stored at the latest; None: no timer to arm.

        Asked when :meth:`_ack_to_store` said "not yet": the ack is stored
        :data:`ACK_STORE_AFTER_MS` after the first unstored one (or the retry's
        pause after a failed store), by a timer armed once.
        """
        if self._pending_since_ms is None or timer_armed:
            return None
        return self._ack_window_ms

    def _clear_pending(self) -> None:
        self._pending = 0
        self._pending_since_ms = None

    # -- streams and the writer ------------------------------------------------------------

    def _stream_up(self, replay_from: int, now_ms: float) -> None:
        """The handshake was answered (or written, without answers): the stream is up.

        The writer starts at ``replay_from`` (never below the received ack);
        the backoff attempt resets once the stream lives :data:`STABLE_STREAM_MS`
        or an ack covers a row written on it. Moves to ``STREAMING``.
        """
        self._write_pos = max(replay_from, self._acked + 1)
        self._ever_up = True
        self._up_since_ms = now_ms
        self._ends_down = self._refused_down = 0
        self._first_written = None
        self._repeated_end = None
        self._move(ChannelState.STREAMING)

    def _count_dial(self) -> None:
        """A dial begins: every one after the channel's first is a reconnect (``stats()``).

        Whether or not its stream comes up: a dial refused, or a stream cut
        for a missing handshake answer, was a re-dial too.
        """
        self._dials += 1
        if self._dials > 1:
            self._reconnects += 1

    def next_to_write(self) -> int | None:
        """Return the next seq to write on the live stream, or None when caught up.

        Nothing at or above :attr:`hold_at` is written.
        """
        end = self._log.state.next_seq - 1
        if self._hold_at is not None and self._hold_at <= end:
            end = self._hold_at - 1
        pos = self._write_pos
        return pos if pos and pos <= end else None

    def _writing(self, seq: int) -> None:
        """Row ``seq``'s write starts on the live stream: from now on the engine may ack it.

        An honest engine may ack a row before its write returns here.
        """
        if seq > self._max_started:
            self._max_started = seq
            if seq > self._ack_bound:
                self._ack_bound = seq

    @property
    def written_bound(self) -> int | None:
        """The highest seq this log can have written to any engine, or None while unknown.

        What the log's owners kept beside it, ahead of their writers, on this
        boot (``RunLog.written_bound``), or the ``h`` a verification took,
        and every seq written since. A handshake answer above it is a
        protocol error, never applied (SPEC "Acks").
        """
        written = self._written_bound
        return None if written is None else max(written, self._max_started)

    @property
    def ack_bound(self) -> int:
        """The highest seq an ack may cover: the higher of the stream's answer and every write.

        A replay rewinds the writer, so the rows written on this stream alone
        would be too low. Without handshake answers (``engine_acks_handshake``
        False) there is none: the high-water bounds acks then. SPEC "Acks".
        """
        return self._ack_bound if self._acks_handshake else self.high_water

    def is_replay(self, seq: int) -> bool:
        """Tell whether writing ``seq`` now writes it again (it went out before)."""
        return seq <= self._max_written

    def _written(self, seq: int) -> None:
        """Row ``seq`` was written to the stream.

        The writer moves past ``seq``, and never back under the received
        ack: an ack that came while the write was in flight may cover rows
        after ``seq`` (a replay to an engine that already had them), which
        the log may have deleted already.
        """
        acked = self._acked
        self._write_pos = seq + 1 if seq >= acked else acked + 1
        if self._first_written is None:
            self._first_written = seq
        self._sent += 1
        if seq <= self._max_written:
            self._replayed += 1
        else:
            self._max_written = seq

    def _rewind(self) -> int:
        """Rewind the writer to the received ack; return how many rows it will re-send."""
        if self._write_pos:
            self._write_pos = self._acked + 1
        return self.high_water - self._acked

    # -- ends of stream and reconnecting ---------------------------------------------------

    def _end(self, code: str | None, details: str, debug: str = "") -> EndPlan:
        """Decide what a stream's end means, from its gRPC status. SPEC "Reconnect".

        Every status reconnects (INTERNAL and UNKNOWN too: proxies report
        cuts that way; UNAUTHENTICATED too: a replacement engine may not know
        the run yet) except FAILED_PRECONDITION "run completed"; a size
        refusal is handled apart; a down message over the channel's own
        receive limit (:func:`~walchannel.core.end_status.parse_receive_limit`) is named
        apart, and stays
        the named cause of later ends whose status gRPC lost to a write
        (grpc/grpc#36066) until a stream proves healthy; a GOAWAY
        ``too_many_pings`` doubles :attr:`keepalive_ms` (capped at
        :data:`MAX_KEEPALIVE_MS`).

        Args:
            code: the status name (``"UNAVAILABLE"``), None when none is known.
            details: the status details.
            debug: gRPC's debug string (where some GOAWAY reasons show).
        """
        self._write_pos = 0  # no stream: nothing is written until the next is up
        self._last_end_code = code
        self._ends_down += 1
        if code in REFUSED_TOKEN_CODES:
            self._refused_down += 1
        doubled = is_too_many_pings(f"{details} {debug}")
        if doubled:
            self._keepalive_ms = min(self._keepalive_ms * 2, MAX_KEEPALIVE_MS)
        read = read_end(code, details)  # the one reading of the details (end_status.PATTERNS)
        meaning = read.meaning
        if meaning is Meaning.WRITER_REFUSED:
            self._engine_refused = details
            return self._ended_by_engine(End.FENCED, doubled)
        if meaning is Meaning.RUN_COMPLETED:
            _, self._completed_by = run_completed_by(code, details)
            return self._ended_by_engine(End.RUN_COMPLETED, doubled)
        if self.final:
            return EndPlan(End.ALREADY_OVER, doubled, None)
        if meaning is Meaning.EXPECTED_SEQ and read.match is not None:
            expected = int(read.match.group(1))
            if expected - 1 < self.stored:
                reason = self._fail(self._contradicted(expected))
                return EndPlan(End.CONTRADICTED, doubled, None, failed_reason=reason)
        too_large = parse_receive_limit(code, details)
        kept = too_large is None and meaning is Meaning.STATUS_LOST
        if kept:
            too_large = self._down_too_large
        self._down_too_large = too_large
        if too_large is not None:
            return EndPlan(End.DOWN_TOO_LARGE, doubled, None, too_large, kept)
        refusal = parse_size_refusal(code, details)
        if refusal is not None:
            return EndPlan(End.SIZE_REFUSAL, doubled, refusal)
        return EndPlan(End.RECONNECT, doubled, None)

    def _ended_by_engine(self, end: End, doubled: bool) -> EndPlan:
        """The engine ended the run for this writer: the log's fate; failed unless a tombstone."""
        completion = self._run_completed()
        if completion is Completion.TOMBSTONE:
            return EndPlan(end, doubled, None, completion=completion)
        error, reason = self._refused(completion)
        reason = self._fail(error, reason=reason)
        return EndPlan(end, doubled, None, completion=completion, failed_reason=reason)

    def _tombstone_not_stored(self) -> str | None:
        """The log could not be made a tombstone: its rows are undeliverable; the run fails.

        ``TombstoneNotStored``, after the action ``Tombstone`` found the log's
        write failed (or it read-only). Returns the ``failed_reason``.
        """
        error, reason = self._refused(Completion.UNDELIVERABLE)
        return self._fail(error, reason=reason)

    def _first_said(self, text: str) -> bool:
        """Tell whether ``text`` (a stream's end) differs from the last one since a stream was up.

        The same end again (an engine down, a token refused) while redialing
        is said once at WARNING, then at INFO until a stream comes up.
        """
        first = text != self._repeated_end
        self._repeated_end = text
        return first

    def _run_completed(self) -> Completion:
        """Decide what the engine ending the run for this writer does to the log. docs/design.md.

        For FAILED_PRECONDITION "run completed" (and the engine's refusals of
        this writer, :attr:`End.FENCED`). Either way the loop ends
        (``FAILED``; :meth:`_refused` gives the error): a log holding an
        unacked ``Done`` becomes a tombstone on the engine's word (it applied
        the ``Done``, and every row before it; the ack was lost) — only when
        the engine names no writer or this one: a run another writer
        completed while rows are here, or a refusal, is ``FENCED``, every row
        kept; else rows left above the stored cursor are undeliverable.
        """
        state = self._log.state
        by = self._completed_by
        other = by is not None and self._writer is not None and by != self._writer.id
        if self._engine_refused is not None or (other and state.unacked_count > 0):
            return Completion.FENCED
        if state.done_seq is not None:
            return Completion.TOMBSTONE
        return Completion.UNDELIVERABLE if state.unacked_count > 0 else Completion.NOTHING

    def _refused(self, completion: Completion) -> tuple[WalchannelError, str | None]:
        """The error a run ended by the engine fails with, and the ``failed_reason`` to store.

        ``FENCED``: :class:`~walchannel.errors.WriterFencedError` naming what
        the engine said; ``UNDELIVERABLE``: ``RunCompletedError`` with
        :data:`~walchannel.log.state.FAILED_UNDELIVERABLE`; ``NOTHING``:
        ``RunCompletedError``, no mark. SPEC "Reconnect".
        """
        if completion is Completion.FENCED:
            said = self._engine_refused
            if said is None:
                count = self._log.state.unacked_count
                said = (
                    f"{COMPLETED_BY_ANOTHER.format(writer=self._completed_by)}, while "
                    f"{count} row(s) of this writer were never applied"
                )
            else:
                said = f"the engine refused it: {said}"
            return self._fenced(said), self._fenced_failure
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        return error, FAILED_UNDELIVERABLE if completion is Completion.UNDELIVERABLE else None

    def _completed_by_engine(self) -> RunCompletedError:
        """The log became a tombstone on the engine's word: the loop ends, ``send_done`` is True.

        Returns the error later calls raise (the run is completed).
        """
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        self._failure = error
        if not self.final:
            self._move(ChannelState.FAILED)
        return error

    def _next_delay_ms(self, now_ms: float) -> float:
        """The stream (or dial) ended: return the backoff before the next dial (ms).

        ``Backoff.delay_ms(attempt, rng)``; the attempt counter resets only
        after an ack covering a seq written on the stream (:meth:`_ack`) or
        once it was up :data:`STABLE_STREAM_MS`, so an engine that answers
        the handshake and drops at once does not make a tight loop. SPEC
        "Reconnect".
        """
        if self._up_since_ms is not None and now_ms - self._up_since_ms >= STABLE_STREAM_MS:
            self._attempt = 0
            self._down_too_large = None
        delay = self._backoff.delay_ms(self._attempt, self._rng)
        self._attempt += 1
        self._up_since_ms = None
        self._first_written = None
        return delay

    def next_beat_ms(self, now_ms: float) -> float:
        """When the next heartbeat is due after one written (or the writer's start) at ``now_ms``.

        One keepalive later (doubled after GOAWAY ``too_many_pings``): the
        engine's acks of heartbeats are what the watchdog hears (SPEC "Reconnect").
        """
        return now_ms + self._keepalive_ms

    def next_seq_after(self, pending: int) -> int:
        """The seq a new row gets when ``pending`` rows handed out before it commit first.

        Under ``group_commit`` a send's seqs are handed out before the commit:
        the log takes no other rows while a group is pending, so the seqs
        handed out are the seqs the rows get (SPEC "Group commit").
        """
        return self._log.state.next_seq + pending

    def watchdog_period_ms(self) -> float:
        """How often the watchdog looks at a live stream (ms)."""
        return watchdog_period_ms(self._dead_stream_ms, self._keepalive_ms)

    def loop_stalled(self, late_ms: float) -> bool:
        """:func:`~walchannel.core.watchdog.loop_stalled` with this channel's keepalive."""
        return loop_stalled(late_ms, self._keepalive_ms)

    def stream_verdict(
        self,
        now_ms: float,
        *,
        last_down_ms: float,
        heartbeats_since_down: int,
        write_since_ms: float | None,
        next_beat_ms: float,
        pending_bytes: int,
    ) -> tuple[Verdict, float, float, bool, float] | None:
        """:func:`stream_verdict` with this channel's bounds, keepalive and minimum rate."""
        return stream_verdict(
            now_ms,
            last_down_ms=last_down_ms,
            heartbeats_since_down=heartbeats_since_down,
            write_since_ms=write_since_ms,
            next_beat_ms=next_beat_ms,
            pending_bytes=pending_bytes,
            dead_stream_ms=self._dead_stream_ms,
            keepalive_ms=self._keepalive_ms,
            min_send_rate=self._min_send_rate,
        )

    # -- a row the engine refused for its size ---------------------------------------------

    def _set_aside(self) -> None:
        """A refused row was set aside: the engine is healthy, dial again soon."""
        self._attempt = 0

    def _hold(self, seq: int, error: WalchannelError) -> None:
        """The engine refused the ``Done`` at ``seq``: write nothing from it on.

        The channel stops with ``error`` once every row before it is acked
        (:meth:`_held_due`): the engine drops what it read ahead, so those rows
        are delivered first (docs/design.md, ``Done`` is never set aside).
        """
        self._hold_at = seq
        self._held = error
        self._attempt = 0

    def _held_due(self) -> WalchannelError | None:
        """The held error, once every row before the refused ``Done`` is acked (taken once)."""
        if self._held is None or self._hold_at is None or self._acked < self._hold_at - 1:
            return None
        error, self._held = self._held, None
        return error

    # -- down messages ---------------------------------------------------------------------

    def _stop(self) -> bool:
        """A ``Stop`` arrived: True the first time (fire the callbacks), then False.

        SPEC "Down messages": the engine re-sends it after every handshake.
        """
        first = not self._stopped
        self._stopped = True
        return first

    def _decide(self, request_id: str, approved: bool, reason: str) -> None:
        """An approval decision arrived (new or repeated): keep it; the latest wins."""
        self._decided[request_id] = (approved, reason)

    def decision(self, request_id: str) -> tuple[bool, str] | None:
        """``(approved, reason)`` decided for ``request_id``, or None when none came yet."""
        return self._decided.get(request_id)

    # -- the one entry point ---------------------------------------------------------------

    def handle(self, event: ev.Event) -> Sequence[Action]:
        """Take ``event``; return the actions to perform, in order. docs/design.md.

        Every change of the driver's state comes through here, and
        ``state`` only through the transition table. An action whose I/O
        has a result is answered with the next event (``Verify`` with
        ``Verified``, ``Tombstone`` with ``TombstoneStored``, ``StoreAck``
        with ``AckStored``): no plan is left for the caller to finish.

        Raises:
            StateError: a walchannel bug broke the transition table.
            KeyError: ``event`` is not one of :mod:`walchannel.core.events`.
        """
        return self._handlers[type(event)](event)

    # -- the connection loop's turns -------------------------------------------------------

    def _dial_unless_over(self) -> Sequence[Action]:
        if self._closed or self._state in _FINAL:
            return _NOTHING
        out: list[Action] = [act.STATE_CHANGED] if self._move(ChannelState.CONNECTING) else []
        self._count_dial()
        out.append(act.Dial(self._keepalive_ms))
        return out

    def _on_loop_started(self, event: ev.LoopStarted) -> Sequence[Action]:
        return self._dial_unless_over()

    def _on_stream_over(self, event: ev.StreamOver) -> Sequence[Action]:
        if self._closed or self._state in _FINAL:
            return _NOTHING  # the loop ends
        out: list[Action] = [act.STATE_CHANGED] if self._move(ChannelState.BACKOFF) else []
        delay = self._next_delay_ms(event.now_ms)
        out.append(act.Backoff(delay, self._attempt))
        return out

    def _on_backoff_over(self, event: ev.BackoffOver) -> Sequence[Action]:
        if self._closed or self._state in _FINAL:
            return _NOTHING
        # With a discovery URL every re-dial asks it first (SPEC "Reconnect").
        return (act.REDISCOVER,) if self._rediscovers else self._dial_unless_over()

    def _on_rediscovered(self, event: ev.Rediscovered) -> Sequence[Action]:
        return self._dial_unless_over()  # the run may have ended while discovery answered

    # -- the handshake answer --------------------------------------------------------------

    def _on_answered(self, event: ev.Answered) -> Sequence[Action]:
        high = event.high
        plan = self._answer(high, event.now_ms)
        answer = plan.answer
        out: list[Action] = [act.CLEAR_FAILED_MARK] if plan.clear_failed_mark else []
        if answer is Answer.IMPOSSIBLE or answer is Answer.AHEAD:
            # Nothing applied, nothing written: an engine that holds seqs this
            # log never wrote would drop rows sent under them as duplicates.
            # The stream ends, and a fresh handshake re-syncs.
            out.append(act.NoteProtocolError(plan.problem))
            out.append(act.EndStream(f"{plan.problem}; the stream is ended and dialed again"))
            return out
        if answer is Answer.BEHIND or answer is Answer.FOREIGN:
            out.append(act.StoreFailure(plan.failed_reason))
            out.append(act.EndStream(_ANSWER_REFUSED))
            return out
        if answer is Answer.VERIFY:
            assert high is not None
            out.append(act.Verify(high))
            return out
        if answer is Answer.FORGOT:
            assert high is not None
            out.append(
                act.Warn(
                    f"the engine answered Ack({high}) {plan.problem}; re-sending from "
                    f"{plan.replay_from}"
                )
            )
        elif plan.acked_moved:
            out.extend(self._after_ack(event.now_ms, act.ACK_MOVED))
        assert plan.replay_from is not None
        return self._up_from(plan.replay_from, event.now_ms, out)

    def _up_from(self, replay_from: int, now_ms: float, out: list[Action]) -> list[Action]:
        """The answer was taken: the stream is up from ``replay_from``, unless the run ended."""
        if self._state in _FINAL:
            # The answer acked the rows before a refused Done: stopped.
            out.append(act.EndStream("the channel stopped"))
            return out
        self._stream_up(replay_from, now_ms)
        out.append(act.StartStream(replay_from))
        return out

    def _on_verified(self, event: ev.Verified) -> Sequence[Action]:
        verifying = self._verifying
        out: list[Action] = []
        if event.shift:
            unverified = None if verifying is None else verifying[0]
            out.append(act.Renumbered(event.high, unverified, event.shift))
        self._verified(event.high, event.shift)
        out.extend(self._rows_deleted(event.now_ms))  # the verifying ack deleted rows too
        out.extend(self._after_ack(event.now_ms, act.ACK_MOVED_BY_ANSWER))
        return self._up_from(event.high + 1, event.now_ms, out)

    def _on_verification_failed(self, event: ev.VerificationFailed) -> Sequence[Action]:
        self._verifying = None
        return (act.RecordError(event.text, loud=False), act.EndStream(_ANSWER_REFUSED))

    # -- the writer's rows (per row: the handlers allocate nothing) --------------------------

    def _on_writing(self, event: ev.Writing) -> Sequence[Action]:
        self._writing(event.seq)
        return _NOTHING

    def _on_written(self, event: ev.Written) -> Sequence[Action]:
        self._written(event.seq)
        return _NOTHING

    # -- acks ------------------------------------------------------------------------------

    def _on_ack_received(self, event: ev.AckReceived) -> Sequence[Action]:
        seq = event.seq
        kind = self._ack(seq, event.now_ms)
        if kind is AckKind.ADVANCE:
            return self._after_ack(event.now_ms, act.ACK_MOVED)
        if kind is AckKind.STALE:
            return (act.StaleAck(seq, self._acked),)
        said = self._last_error or ""
        noted = act.NoteProtocolError(said, f"impossible acks ({kind.name})")
        if kind is AckKind.NEVER_WRITTEN:
            # Rows never written: a fresh handshake re-syncs.
            return (noted, act.EndStream(f"{said}; the stream is ended and dialed again"))
        return (noted,)

    def _after_ack(self, now_ms: float, moved: act.AckMoved) -> Sequence[Action]:
        """The received ack moved: what follows (store it or arm the timer; a held ``Done``)."""
        store = self._ack_to_store(now_ms)
        if store is None:
            if self._held is None and (self._pending_since_ms is None or self._ack_timer_armed):
                return _JUST_MOVED if moved is act.ACK_MOVED else (moved,)  # allocates nothing
            out: list[Action] = [moved]
            self._arm_ack_timer(out)
        else:
            out = [moved, act.StoreAck(store)]
        if self._held is not None:
            out.extend(self._stop_if_held_due())
        return out

    def _arm_ack_timer(self, out: list[Action]) -> None:
        delay = self._ack_timer_ms(timer_armed=self._ack_timer_armed)
        if delay is not None:
            self._ack_timer_armed = True
            out.append(act.ArmAckTimer(delay))

    def _on_ack_timer_fired(self, event: ev.AckTimerFired) -> Sequence[Action]:
        self._ack_timer_armed = False
        store = self._ack_to_store(event.now_ms)
        if store is not None:
            return (act.StoreAck(store),)
        out: list[Action] = []
        self._arm_ack_timer(out)
        return out

    def _on_acks_flushed(self, event: ev.AcksFlushed) -> Sequence[Action]:
        store = self._ack_to_store(event.now_ms, force=True)
        return _NOTHING if store is None else (act.StoreAck(store),)

    def _on_ack_stored(self, event: ev.AckStored) -> Sequence[Action]:
        self._ack_window_ms = self._ack_retry_ms = ACK_STORE_AFTER_MS
        reclaim = self._rows_deleted(event.now_ms)
        if not self._log.state.completed:
            return reclaim
        self._done_delivered = True  # the stored ack covered this log's Done
        return (act.DONE_ACKED, *reclaim)

    def _on_ack_store_failed(self, event: ev.AckStoreFailed) -> Sequence[Action]:
        if self._log.state.last_acked >= event.seq:
            # Stored after all (an exception that reached the call after its commit).
            return self._on_ack_stored(ev.AckStored(event.seq, event.now_ms))
        # Nothing else would try again: after the Done no ack comes, and its
        # waiters wait on the tombstone (seed 642715). The pause doubles so a
        # full disk is not asked, and logged about, ten times a second.
        self._ack_window_ms = self._ack_retry_ms
        self._ack_retry_ms = min(2 * self._ack_retry_ms, ACK_STORE_RETRY_MAX_MS)
        self._pending_since_ms = event.now_ms
        out: list[Action] = []
        self._arm_ack_timer(out)
        return out

    # -- when rows were committed (the oldest unacked row's age) ----------------------------

    def _on_rows_committed(self, event: ev.RowsCommitted) -> Sequence[Action]:
        self._ages.committed(event.first_seq, event.now_s, self._log.state.last_acked)
        return _NOTHING

    def _on_backlog_dated(self, event: ev.BacklogDated) -> Sequence[Action]:
        self._ages.seed(event.points)
        return _NOTHING

    def oldest_unacked_at(self) -> float | None:
        """When the oldest row no ack covers was committed (the clock of ``RowsCommitted``).

        None when not known (no commit of it was fed, nor dated). Safe from
        another thread: it reads a copy of the marks.
        """
        return self._ages.oldest(self._acked + 1)

    # -- giving disk back ------------------------------------------------------------------

    def _rows_deleted(self, now_ms: float) -> Sequence[Action]:
        """A stored ack deleted rows: checkpoint now, or arm the idle timer."""
        if self._checkpoints.on_rows_deleted(now_ms, unacked=self.unacked):
            self._checkpoints.on_checkpoint(now_ms)
            return _CHECKPOINT
        return self._arm_checkpoint(CHECKPOINT_IDLE_MS)

    def _arm_checkpoint(self, delay_ms: float) -> Sequence[Action]:
        # A closed channel arms nothing: RunLog.close checkpoints itself.
        return _NOTHING if self._closed else (act.ArmCheckpointTimer(delay_ms),)

    def _on_checkpoint_timer_fired(self, event: ev.CheckpointTimerFired) -> Sequence[Action]:
        if self._closed:
            return _NOTHING
        delay = self._checkpoints.on_timer(event.now_ms)
        if delay is None:
            return _NOTHING
        if delay > 0:
            return self._arm_checkpoint(delay)  # acks still coming
        self._checkpoints.on_checkpoint(event.now_ms)
        return _CHECKPOINT

    def _on_checkpointed(self, event: ev.Checkpointed) -> Sequence[Action]:
        delay = self._checkpoints.on_result(complete=event.complete, shrank=event.shrank)
        return _NOTHING if delay is None else self._arm_checkpoint(delay)

    def _stop_if_held_due(self) -> Sequence[Action]:
        """Stop with the held error once every row before a refused ``Done`` is acked."""
        error = self._held_due()
        if error is None:
            return _NOTHING
        reason = self._fail(error, reason=FAILED_DONE_REFUSED)
        return (act.StoreFailure(reason), act.EndStream(raw_message(error)))

    # -- a stream's end --------------------------------------------------------------------

    def _on_ended(self, event: ev.Ended) -> Sequence[Action]:
        keepalive = self._keepalive_ms
        plan = self._end(event.code, event.details, event.debug)
        out: list[Action] = []
        if plan.keepalive_doubled and not self._pings_warned:
            self._pings_warned = True
            out.append(act.KeepaliveDoubled(keepalive, self._keepalive_ms))
        end = plan.end
        if end is End.RUN_COMPLETED or end is End.FENCED:
            completion = plan.completion
            if completion is Completion.TOMBSTONE:
                out.append(act.TOMBSTONE)  # answered: TombstoneStored or TombstoneNotStored
                return out
            if completion is Completion.NOTHING:
                out.append(act.MARK_COMPLETED)  # nothing here to lose: a tombstone says so
            # Rows this log still holds cannot be delivered (here) any more: the
            # reason flags the run for an operator (inspect: failed; export saves them).
            out.append(act.StoreFailure(plan.failed_reason))
            return out
        if end is End.CONTRADICTED:
            out.append(act.StoreFailure(plan.failed_reason))  # engine behind, both numbers named
            return out
        if end is End.ALREADY_OVER:
            return out
        if plan.too_large is not None:
            out.append(act.SayDownTooLarge(plan.too_large, event.text, plan.cause_kept))
            return out
        # The same end again (an engine down, a token refused) while redialing:
        # said once at WARNING, then at INFO until a stream comes up.
        loud = self._first_said(event.text)
        if plan.refusal is not None:
            out.append(act.SetAsideRefused(plan.refusal, event.text, loud))
        else:
            out.append(act.RecordEnd(event.text, loud))
        return out

    def _on_tombstone_stored(self, event: ev.TombstoneStored) -> Sequence[Action]:
        self._done_delivered = True  # the engine applied this log's Done; its ack was lost
        self._completed_by_engine()
        return (act.STATE_CHANGED,)

    def _on_tombstone_not_stored(self, event: ev.TombstoneNotStored) -> Sequence[Action]:
        return (act.StoreFailure(self._tombstone_not_stored()),)  # Done, and maybe more, stays

    def _on_protocol_violation(self, event: ev.ProtocolViolation) -> Sequence[Action]:
        said = self._protocol_error(event.message)
        return (act.NoteProtocolError(said), act.EndStream(said))

    def _on_refused_row_set_aside(self, event: ev.RefusedRowSetAside) -> Sequence[Action]:
        self._set_aside()
        return _NOTHING

    def _on_done_refused(self, event: ev.DoneRefused) -> Sequence[Action]:
        self._hold(event.seq, event.error)
        return self._stop_if_held_due()

    # -- down messages ---------------------------------------------------------------------

    def _on_stop_received(self, event: ev.StopReceived) -> Sequence[Action]:
        return (act.StopCallbacks(event.reason),) if self._stop() else _NOTHING

    def _on_decision_received(self, event: ev.DecisionReceived) -> Sequence[Action]:
        self._decide(event.request_id, event.approved, event.reason)
        return (act.ResolveApproval(event.request_id, event.approved, event.reason),)

    # -- the harness's calls ---------------------------------------------------------------

    def _on_close_requested(self, event: ev.CloseRequested) -> Sequence[Action]:
        self._closed = True
        return _NOTHING

    def _on_closed(self, event: ev.Closed) -> Sequence[Action]:
        return (act.STATE_CHANGED,) if self._move(ChannelState.CLOSED) else _NOTHING

    def _on_done_requested(self, event: ev.DoneRequested) -> Sequence[Action]:
        if self.completed:
            # This channel already delivered the run's Done (a restarted
            # harness's log held it): the tombstone is stored.
            self._done_sent = True
            return (act.DONE_DELIVERED,)
        if self._log.state.done_seq is None:
            return (act.LOG_DONE,)  # answered: DoneLogged
        self._done_sent = True
        return (act.WAIT_DONE,)

    def _on_done_logged(self, event: ev.DoneLogged) -> Sequence[Action]:
        self._done_sent = True
        return (act.WAIT_DONE,)

    def _on_rewind(self, event: ev.Rewind) -> Sequence[Action]:
        return (act.Replay(self._rewind()),)

    def _on_deadline_look(self, event: ev.DeadlineLook) -> Sequence[Action]:
        delay = self._deadline_in_s(event.now_wall_s)
        if delay is None or self._closed:
            return _NOTHING
        if delay <= 0:
            return self._on_deadline_passed(ev.DeadlinePassed())
        # The token's expiry is a wall-clock time: looking at most every
        # DEADLINE_LOOK_S follows a step of the clock (NTP, a resumed VM).
        return (act.ArmDeadline(min(delay, DEADLINE_LOOK_S)),)

    def _on_deadline_passed(self, event: ev.DeadlinePassed) -> Sequence[Action]:
        return (act.DEADLINE_HIT,) if self._expire() else _NOTHING

    def _on_failed(self, event: ev.Failed) -> Sequence[Action]:
        cause = event.cause
        if cause is ev.Failure.GROUP_LOST and self._closed:
            # Closing: nothing runs on; the error stays for stats() and inspect.
            return (act.RecordError(raw_message(event.error), loud=True),)
        if cause is ev.Failure.LOG_REMOVED and self._state in _FINAL:
            return _NOTHING
        reason = {
            ev.Failure.LOG_REMOVED: FAILED_LOG_REMOVED,
            ev.Failure.CORRUPT: FAILED_CORRUPT,
            ev.Failure.GROUP_LOST: FAILED_GROUP_LOST,
            ev.Failure.INTERNAL: f"{FAILED_INTERNAL}: {event.what}",
        }[cause]
        return (act.StoreFailure(self._fail(event.error, reason=reason)),)

    def _on_error_seen(self, event: ev.ErrorSeen) -> Sequence[Action]:
        self._last_error = event.text
        return _NOTHING

    # -- queries of the calls --------------------------------------------------------------

    def backlog_error(self, logged: int, pending: int, added: int) -> BacklogFullError | None:
        """The error a send that adds ``added`` bytes gets under ``max_unacked_bytes``, or None.

        Args:
            logged: unacked bytes in the log (after the received ack is stored).
            pending: bytes handed out under ``group_commit``, not yet committed.
            added: the send's rows' bytes.
        """
        limit = self._max_unacked_bytes
        if limit is None or logged + pending + added <= limit:
            return None
        waiting = f" + {pending} pending" if pending else ""
        return BacklogFullError(
            f"run {self._run_id}: {logged} unacked bytes{waiting} + {added} "
            f"would pass max_unacked_bytes {limit}; nothing was logged"
        )
