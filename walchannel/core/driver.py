"""The driver: one run's protocol as one object that does no I/O.

h11's ``Connection`` is the model: a test, the simulator (``tools/sim.py``)
and the channel's asyncio tasks drive this one object alike. Inputs are
plain values (an engine's answer ``Ack(h)``, an ack, a stream's end status,
times in milliseconds of any monotonic origin, wall-clock seconds); outputs
are decisions (an enum, a seq, a delay). Nothing here awaits, reads a clock,
touches SQLite, sockets or gRPC.

:class:`Driver` holds what a run's channel knows beyond its log: the state
(:class:`ChannelState` and its legal moves), the cursor (the received ack,
the write position, provisional seqs after a verification shift), ack
coalescing, the reconnect policy (backoff attempt and its reset), the
checkpoint policy, ``send_done`` and the failure that ended the run, a
``Done`` held back after the engine refused it, ``Stop`` and approval
decisions (and their repeats), and the counters of ``stats()``. The log's
own facts — the next seq, the stored ack, ``unverified_from``, the unacked
``Done`` and completion — have one owner, the log's
:class:`~walchannel.log.state.LogState`; the driver reads them through
:class:`StateSource` and never keeps a copy.

:class:`walchannel.channel.GrpcEngineChannel` carries out what the driver
decides (the log's transactions, writes on the stream, timers, waking
waiters). On the per-message path (a write, an ack) the driver is called
directly and allocates nothing. SPEC "The channel"; docs/design.md has the
table of inputs and decisions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

from walchannel.core.checkpoints import CheckpointPolicy
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
    ChannelClosedError,
    EngineBehindError,
    RunCompletedError,
    RunExpiredError,
    WalchannelError,
    WriterFencedError,
)
from walchannel.log.state import (
    COMPLETED_BY_ANOTHER,
    FAILED_ENGINE_BEHIND,
    FAILED_UNDELIVERABLE,
    LogState,
    Writer,
    fenced_reason,
    impossible_answer,
    refused_at_open,
)

if TYPE_CHECKING:
    import random

    from walchannel.config import GrpcChannelConfig

__all__ = [
    "ACK_STORE_AFTER_MS",
    "ACK_STORE_EVERY",
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
#: A stream up this long resets the backoff attempt counter (ms).
STABLE_STREAM_MS: Final = 30_000.0
#: Cap of the keepalive after GOAWAY too_many_pings doublings (ms).
MAX_KEEPALIVE_MS: Final = 300_000
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
    VERIFY = "verify"  # first answer since open: RunLog.verify(h), then on_verified
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
    """What the caller does after :meth:`Driver.on_answer` applied a handshake answer.

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
            the caller takes the ack path (store when due, wake waiters).
    """

    answer: Answer
    replay_from: int | None
    clear_failed_mark: bool = False
    problem: str = ""
    failed_reason: str | None = None
    acked_moved: bool = False


class EndPlan(NamedTuple):
    """The decision for a stream's end.

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
            word does to the log (:meth:`Driver.on_run_completed`). Unless
            ``TOMBSTONE`` (the caller makes the log a tombstone, then calls
            :meth:`Driver.completed_by_engine`, or
            :meth:`Driver.tombstone_not_stored`), the run has failed in the
            same call: the caller stores :attr:`failed_reason`.
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

    Its fields (``state``, ``acked``, the counters, …) are read-only
    properties: only the driver's own inputs change them, and ``state``
    only through the transition table (SPEC "The channel", the state
    diagram), as h11's ``Connection`` changes state only through its machine.
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
    ) -> None:
        self._log = log
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
        self._failure: WalchannelError | None = None
        self._failed_mark = failed_mark
        # The cursor.
        self._acked = log.state.last_acked
        self._write_pos = 0
        self._pending = 0
        self._pending_since_ms: float | None = None
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
        if refused_at_open(failed_reason, writer is not None and writer.take_over):
            # Refused before, and not marked to take over: no dial, no send.
            self._failure = self.fenced(f"it was refused before: {failed_reason}")
            self.move(ChannelState.FAILED)
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
            self.move(ChannelState.FAILED)

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
    def checkpoints(self) -> CheckpointPolicy:
        """When to give the log's disk back."""
        return self._checkpoints

    @property
    def fenced_failure(self) -> str | None:
        """The ``failed_reason`` of the last :meth:`fenced` error."""
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

    def move(self, new: ChannelState) -> bool:
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

    def deadline_in_s(self, now_wall_s: float) -> float | None:
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
        :class:`~walchannel.errors.RunExpiredError`: the caller first moves
        the channel to ``EXPIRED``, see :meth:`expire`; ``send_done`` returns
        False instead of raising), then a failure kept after the expiry.

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
        if call is Call.DONE and self.completed:
            return None  # the run's Done is acked and stored: nothing can fail it now
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

    def expire(self) -> bool:
        """``hard_deadline`` passed: move to ``EXPIRED``; False when already over."""
        if self.final:
            return False
        return self.move(ChannelState.EXPIRED)

    def fail(self, error: WalchannelError, *, reason: str | None = None) -> str | None:
        """The run fails with ``error`` (sends raise it); return the ``failed_reason`` to store.

        Moves to ``FAILED`` unless already over. The reason names why for
        ``inspect`` (``log_state.FAILED_*``): ``reason`` when given (a
        refused ``Done``, a damaged file, a broken invariant), the engine
        behind for an :class:`~walchannel.errors.EngineBehindError`, else None.
        """
        self._failure = error
        if not self.final:
            self.move(ChannelState.FAILED)
        if reason is None and isinstance(error, EngineBehindError):
            return FAILED_ENGINE_BEHIND
        return reason

    def on_close(self) -> None:
        """``close()`` began (or the loop is gone): no send is admitted from now on."""
        self._closed = True

    def on_done_sent(self) -> None:
        """``send_done`` logged the run's ``Done`` (or found it delivered): later sends close."""
        self._done_sent = True

    def note_error(self, text: str) -> None:
        """Keep ``text`` (no token: the caller redacts it) as ``last_error`` (``stats()``)."""
        self._last_error = text

    def protocol_error(self, message: str) -> str:
        """The engine broke the protocol: count it; return the ``last_error`` text (SPEC "Acks")."""
        self._protocol_errors += 1
        self._last_error = f"protocol error: {message}"
        return self._last_error

    # -- the handshake answer --------------------------------------------------------------

    def on_answer(self, engine_high: int | None, now_ms: float) -> AnswerPlan:
        """Apply the engine's handshake answer ``Ack(h)``; return the I/O it needs. SPEC "Dial".

        One call applies every change of the driver's own state the answer
        makes; the plan names only what the caller must do outside it (the
        log, the stream, the waiters). By :attr:`AnswerPlan.answer`:

        - ``RESUME``: ``h`` is applied as a received ack
          (:attr:`AnswerPlan.acked_moved`: then the ack path, as after
          :meth:`on_ack`).
        - ``FORGOT``: ``h`` is below acks received but not stored: the cursor
          steps back to ``max(h, stored)`` and those rows are written again.
        - ``VERIFY``: the caller runs ``RunLog.verify(h)``, then
          :meth:`on_verified` with its shift: the one second call, as the
          log's rows move in between.
        - ``BEHIND``, ``FOREIGN``: the run has failed (:attr:`failure`);
          the caller stores :attr:`AnswerPlan.failed_reason` and ends.
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
            said = self.protocol_error(f"{problem}; not applied")
            return AnswerPlan(Answer.IMPOSSIBLE, None, problem=said)
        if engine_high < self.stored:
            reason = self.fail(self._behind(engine_high))
            return AnswerPlan(Answer.BEHIND, None, failed_reason=reason)
        unverified = self.unverified_from
        writer = self._writer
        if unverified is not None and engine_high > 0 and writer and not writer.may_meet_rows:
            error = self.fenced(
                f"this log never had an answered handshake, and the engine already holds "
                f"seqs up to {engine_high} of the run: they are another writer's (a lost or "
                "misplaced log: a WALCHANNEL_DIR typo, a relative wal_dir, a volume gone; or "
                "a second harness); joining them would apply findings twice",
                engine_high=engine_high,
            )
            reason = self.fail(error, reason=self._fenced_failure)
            return AnswerPlan(Answer.FOREIGN, None, failed_reason=reason)
        clear = self._failed_mark
        self._failed_mark = False
        written = self.written_bound
        if written is None and unverified is None:
            written = self.high_water  # verified, bound not known: nothing above was logged
        if written is not None and engine_high > written:
            # No engine can hold a seq this log never wrote (SPEC "Acks"): not
            # applied, and no bound for acks either (never the answer itself).
            said = self.protocol_error(
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
        moved = self.on_ack(engine_high, now_ms) is AckKind.ADVANCE
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

    def fenced(self, why: str, *, engine_high: int | None = None) -> WriterFencedError:
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

    def on_verified(self, engine_high: int, shift: int) -> None:
        """The log applied the verification rule for ``h`` with ``shift``; follow it.

        The log moved its rows (``LogState.verify``); the driver only keeps
        which seqs it handed out before are provisional (:meth:`translate`).
        """
        if shift and self._verifying is not None:
            first, end = self._verifying
            self._provisional = (first, end, shift)
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
        the ``Done``, so every row before it (SPEC "Completion").
        """
        seq = self.translate(handed_out)
        if self.completed and seq < self._log.state.next_seq:
            return True
        return self._acked >= seq

    def untranslate(self, seq: int) -> int:
        """Map a row's seq back to the seq handed out for it (:meth:`translate` undone)."""
        if self._provisional is not None:
            first, end, shift = self._provisional
            if first + shift <= seq < end + shift:
                return seq - shift
        return seq

    # -- acks ------------------------------------------------------------------------------

    def on_ack(self, seq: int, now_ms: float) -> AckKind:
        """Apply a received cumulative ``Ack(seq)``: ``acked = max(acked, seq)``. SPEC "Acks".

        A writer standing at or below ``seq`` (rewound by ``replay_unacked``
        while those rows were in flight) moves to ``seq + 1``: acked rows are
        not written again, and the log may already have deleted them. An ack
        covering a row written on this stream resets the backoff attempt.

        Returns:
            ``ADVANCE`` when it moved the cursor (then :meth:`ack_to_store`),
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
            self.protocol_error(f"Ack({seq}) is above the high-water {high_water}; not applied")
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
        self.protocol_error(f"Ack({seq}) covers rows never written: {bound}; not applied")
        return AckKind.NEVER_WRITTEN

    def ack_to_store(self, now_ms: float, *, force: bool = False) -> int | None:
        """Return the ack to store in the log now, or None to keep coalescing.

        Acks are stored every :data:`ACK_STORE_EVERY` acks or
        :data:`ACK_STORE_AFTER_MS` after the first unstored one; an ack
        covering ``Done`` is stored at once; ``force`` (close, limits) too.
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
                and now_ms - self._pending_since_ms >= ACK_STORE_AFTER_MS
            )
        ):
            # Handed out to store: the coalescing window starts again (a store
            # that fails is tried again at the next window's end).
            self._clear_pending()
            return acked
        return None

    def ack_timer_ms(self, *, timer_armed: bool) -> float | None:
        """In how many ms a coalesced ack must be stored at the latest; None: no timer to arm.

        Asked when :meth:`ack_to_store` said "not yet": the ack is stored
        :data:`ACK_STORE_AFTER_MS` after the first unstored one, by a timer armed once.
        """
        if self._pending_since_ms is None or timer_armed:
            return None
        return ACK_STORE_AFTER_MS

    def _clear_pending(self) -> None:
        self._pending = 0
        self._pending_since_ms = None

    # -- streams and the writer ------------------------------------------------------------

    def on_stream_up(self, replay_from: int, now_ms: float) -> None:
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
        self.move(ChannelState.STREAMING)

    def on_dial(self) -> None:
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

    def on_writing(self, seq: int) -> None:
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

    def on_written(self, seq: int) -> None:
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

    def rewind(self) -> int:
        """Rewind the writer to the received ack; return how many rows it will re-send."""
        if self._write_pos:
            self._write_pos = self._acked + 1
        return self.high_water - self._acked

    # -- ends of stream and reconnecting ---------------------------------------------------

    def on_end(self, code: str | None, details: str, debug: str = "") -> EndPlan:
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
                reason = self.fail(self._contradicted(expected))
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
        completion = self.on_run_completed()
        if completion is Completion.TOMBSTONE:
            return EndPlan(end, doubled, None, completion=completion)
        error, reason = self.refused(completion)
        reason = self.fail(error, reason=reason)
        return EndPlan(end, doubled, None, completion=completion, failed_reason=reason)

    def tombstone_not_stored(self) -> str | None:
        """The log could not be made a tombstone: its rows are undeliverable; the run fails.

        The second call after :attr:`EndPlan.completion` ``TOMBSTONE`` when the
        log's write failed (or it is read-only). Returns the ``failed_reason``.
        """
        error, reason = self.refused(Completion.UNDELIVERABLE)
        return self.fail(error, reason=reason)

    def first_said(self, text: str) -> bool:
        """Tell whether ``text`` (a stream's end) differs from the last one since a stream was up.

        The same end again (an engine down, a token refused) while redialing
        is said once at WARNING, then at INFO until a stream comes up.
        """
        first = text != self._repeated_end
        self._repeated_end = text
        return first

    def on_run_completed(self) -> Completion:
        """Decide what the engine ending the run for this writer does to the log. docs/design.md.

        For FAILED_PRECONDITION "run completed" (and the engine's refusals of
        this writer, :attr:`End.FENCED`). Either way the loop ends
        (``FAILED``; :meth:`refused` gives the error): a log holding an
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

    def refused(self, completion: Completion) -> tuple[WalchannelError, str | None]:
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
            return self.fenced(said), self._fenced_failure
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        return error, FAILED_UNDELIVERABLE if completion is Completion.UNDELIVERABLE else None

    def completed_by_engine(self) -> RunCompletedError:
        """The log became a tombstone on the engine's word: the loop ends, ``send_done`` is True.

        Returns the error later calls raise (the run is completed).
        """
        error = RunCompletedError(f"run {self._run_id}: the engine says the run is completed")
        self._failure = error
        if not self.final:
            self.move(ChannelState.FAILED)
        return error

    def next_delay_ms(self, now_ms: float, rng: random.Random) -> float:
        """The stream (or dial) ended: return the backoff before the next dial (ms).

        ``Backoff.delay_ms(attempt, rng)``; the attempt counter resets only
        after an ack covering a seq written on the stream (:meth:`on_ack`) or
        once it was up :data:`STABLE_STREAM_MS`, so an engine that answers
        the handshake and drops at once does not make a tight loop. SPEC
        "Reconnect".
        """
        if self._up_since_ms is not None and now_ms - self._up_since_ms >= STABLE_STREAM_MS:
            self._attempt = 0
            self._down_too_large = None
        delay = self._backoff.delay_ms(self._attempt, rng)
        self._attempt += 1
        self._up_since_ms = None
        self._first_written = None
        return delay

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

    def on_set_aside(self) -> None:
        """A refused row was set aside: the engine is healthy, dial again soon."""
        self._attempt = 0

    def hold(self, seq: int, error: WalchannelError) -> None:
        """The engine refused the ``Done`` at ``seq``: write nothing from it on.

        The channel stops with ``error`` once every row before it is acked
        (:meth:`held_due`): the engine drops what it read ahead, so those rows
        are delivered first (docs/design.md, ``Done`` is never set aside).
        """
        self._hold_at = seq
        self._held = error
        self._attempt = 0

    def held_due(self) -> WalchannelError | None:
        """The held error, once every row before the refused ``Done`` is acked (taken once)."""
        if self._held is None or self._hold_at is None or self._acked < self._hold_at - 1:
            return None
        error, self._held = self._held, None
        return error

    # -- down messages ---------------------------------------------------------------------

    def on_stop(self) -> bool:
        """A ``Stop`` arrived: True the first time (fire the callbacks), then False.

        SPEC "Down messages": the engine re-sends it after every handshake.
        """
        first = not self._stopped
        self._stopped = True
        return first

    def on_decision(self, request_id: str, approved: bool, reason: str) -> None:
        """An approval decision arrived (new or repeated): keep it; the latest wins."""
        self._decided[request_id] = (approved, reason)

    def decision(self, request_id: str) -> tuple[bool, str] | None:
        """``(approved, reason)`` decided for ``request_id``, or None when none came yet."""
        return self._decided.get(request_id)
