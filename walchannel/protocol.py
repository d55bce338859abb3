"""The sans-I/O core: seq arithmetic, the ack cursor, replay and verification decisions.

Nothing here does I/O, awaits, reads a clock or touches SQLite: every
function takes plain values and returns plain values, so the rules that keep
a run exactly-once are tested exhaustively without sockets or files, and
``tools/sim.py`` drives this very code through simulated crashes (the h11
pattern). The storage layer (:mod:`walchannel.log`) and the channel
(:mod:`walchannel.channel`) carry out what it decides.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

# The log's seq rules live in walchannel.log_state (their one owner); they
# stay importable from here, where they were first.
from walchannel.log_state import (
    LogState,
    next_seq_after,
    next_seq_at_open,
    unverified_at_open,
    verification_shift,
)

__all__ = [
    "ACK_STORE_AFTER_MS",
    "ACK_STORE_EVERY",
    "AckKind",
    "Answer",
    "AnswerKind",
    "ChannelState",
    "Cursor",
    "EndKind",
    "LogState",
    "ReconnectPolicy",
    "RefusalVerdict",
    "STABLE_STREAM_MS",
    "SizeRefusal",
    "StateError",
    "StateMachine",
    "StateSource",
    "classify_end",
    "describe_end",
    "is_too_many_pings",
    "next_seq_after",
    "next_seq_at_open",
    "parse_size_refusal",
    "pick_refused_row",
    "refusal_sets_aside",
    "unverified_at_open",
    "verification_shift",
]


# -- channel states ----------------------------------------------------------


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
_LEGAL: dict[ChannelState, frozenset[ChannelState]] = {
    _S.IDLE: frozenset({_S.CONNECTING, _S.EXPIRED, _S.CLOSED}),
    _S.CONNECTING: frozenset({_S.STREAMING, _S.BACKOFF, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.STREAMING: frozenset({_S.BACKOFF, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.BACKOFF: frozenset({_S.CONNECTING, _S.FAILED, _S.EXPIRED, _S.CLOSED}),
    _S.EXPIRED: frozenset({_S.CLOSED}),
    _S.FAILED: frozenset({_S.CLOSED}),
    _S.CLOSED: frozenset(),
}


class StateError(RuntimeError):
    """An illegal state transition: a bug in walchannel, never a user error."""


class StateMachine:
    """The channel's state with its legal transitions (the h11 ``_state`` idea)."""

    def __init__(self) -> None:
        self.state = ChannelState.IDLE

    def can_move(self, new: ChannelState) -> bool:
        """Tell whether ``new`` is reachable from the current state in one step."""
        return new is self.state or new in _LEGAL[self.state]

    def move(self, new: ChannelState) -> ChannelState:
        """Move to ``new`` (staying put is allowed) and return the previous state.

        Raises:
            StateError: the move is not legal (e.g. out of ``CLOSED``).
        """
        old = self.state
        if not self.can_move(new):
            raise StateError(f"illegal channel state change {old.name} -> {new.name}")
        self.state = new
        return old

    @property
    def final(self) -> bool:
        """True in ``EXPIRED``, ``FAILED`` and ``CLOSED``: the connection loop is over."""
        return self.state in (ChannelState.EXPIRED, ChannelState.FAILED, ChannelState.CLOSED)


# -- the ack cursor ---------------------------------------------------------------

#: Store a received ack after this many acks ...
ACK_STORE_EVERY = 256
#: ... or this long after the first unstored one (ms), whichever comes first.
ACK_STORE_AFTER_MS = 100.0


class AnswerKind(enum.Enum):
    """What the engine's answer ``Ack(h)`` to a handshake means."""

    VERIFY = "verify"  # first answer since open: apply the verification rule
    RESUME = "resume"  # replay from the cursor
    BEHIND = "behind"  # h below the stored cursor: the engine lost deleted rows
    FORGOT = "forgot"  # h below an ack received but not yet stored: re-send from h+1
    AHEAD = "ahead"  # h above the high-water (verified log): a protocol error


@dataclass(frozen=True, slots=True)
class Answer:
    """The decision for a handshake answer; ``replay_from`` is the first seq to write."""

    kind: AnswerKind
    replay_from: int


class AckKind(enum.Enum):
    """What a received ``Ack(seq)`` does."""

    ADVANCE = "advance"  # moves the cursor
    STALE = "stale"  # at or below the cursor: nothing to do
    ABOVE_HIGH_WATER = "above_high_water"  # protocol error: never applied


class StateSource(Protocol):
    """What the cursor reads the log's facts from: ``RunLog`` (its ``state`` property)."""

    @property
    def state(self) -> LogState:
        """The log's current :class:`~walchannel.log_state.LogState`."""
        ...


@dataclass(slots=True)
class Cursor:
    """The sans-I/O ack cursor and write position of one open log.

    The log's own facts — the high-water, the stored ack, ``unverified_from``,
    the ``Done`` row's seq and completion — are not copied here: they are
    read from the log's :class:`~walchannel.log_state.LogState` (their one
    owner), so the cursor can never drift from what the log committed.

    Attributes:
        log: where the log's state is read (the open ``RunLog``).
        acked: the highest seq received in an ack (the channel's counters
            and limits use it); at least the stored cursor.
        write_pos: the next seq to write on the live stream (0: no stream).
        pending_count: acks received since the last one stored.
        pending_since_ms: when the first of them came (None: none pending).
        provisional: ``(first, end, shift)``: seqs in ``[first, end)`` handed
            out before a verification shift now live at ``seq + shift``.
        hold_at: a ``Done`` the engine refused for its size: nothing from it
            on is written.
    """

    log: StateSource
    acked: int
    write_pos: int = 0
    pending_count: int = 0
    pending_since_ms: float | None = None
    provisional: tuple[int, int, int] | None = None
    hold_at: int | None = None
    # (unverified_from, high_water + 1) at the VERIFY answer, before the log moved rows.
    verifying: tuple[int, int] | None = None

    # -- the log's facts (read, never stored) -------------------------------------

    @property
    def high_water(self) -> int:
        """The highest committed seq (the log's)."""
        return self.log.state.next_seq - 1

    @property
    def stored(self) -> int:
        """The ack the log stores (rows ``<=`` it are deleted)."""
        return self.log.state.last_acked

    @property
    def unverified_from(self) -> int | None:
        """The log's ``unverified_from``; None once verified."""
        return self.log.state.unverified_from

    @property
    def done_seq(self) -> int | None:
        """The seq of the logged, unacked ``Done``, if any."""
        return self.log.state.done_seq

    @property
    def completed(self) -> bool:
        """The log is a tombstone."""
        return self.log.state.completed

    @property
    def unacked(self) -> int:
        """Rows not covered by a received ack (0 once the run is completed)."""
        state = self.log.state
        return 0 if state.completed else state.next_seq - 1 - self.acked

    def translate(self, seq: int) -> int:
        """Map a seq handed out before a verification shift to where its row lives now."""
        if self.provisional is not None:
            first, end, shift = self.provisional
            if first <= seq < end:
                return seq + shift
        return seq

    # -- handshake answer ----------------------------------------------------

    def on_answer(self, engine_high: int) -> Answer:
        """Decide what the engine's handshake answer ``Ack(h)`` means. SPEC "Dial".

        Pure: the caller carries it out (``RunLog.verify``, then
        :meth:`on_verified`; or :meth:`on_ack`; or ``FAILED``).
        """
        if engine_high < self.stored:
            return Answer(AnswerKind.BEHIND, 0)
        unverified = self.unverified_from
        if unverified is not None:
            # After the log's verification the high-water is at least h.
            self.verifying = (unverified, self.high_water + 1)
            return Answer(AnswerKind.VERIFY, engine_high + 1)
        if engine_high > self.high_water:
            return Answer(AnswerKind.AHEAD, self.acked + 1)
        if engine_high < self.acked:
            return Answer(AnswerKind.FORGOT, engine_high + 1)
        return Answer(AnswerKind.RESUME, engine_high + 1)

    def on_verified(self, engine_high: int, shift: int) -> None:
        """The log applied the verification rule for ``h`` with ``shift``; follow it.

        The log moved its rows (``LogState.verify``); the cursor only
        remembers which seqs it handed out before are provisional.
        """
        if shift and self.verifying is not None:
            first, end = self.verifying
            self.provisional = (first, end, shift)
        self.verifying = None
        self.acked = max(self.acked, engine_high)
        self._clear_pending()

    def on_forgot(self, engine_high: int) -> None:
        """The engine answered below acks it gave that are not stored yet: re-send them."""
        self.acked = max(engine_high, self.stored)
        self._clear_pending()

    # -- acks ------------------------------------------------------------------

    def on_ack(self, seq: int, now_ms: float) -> AckKind:
        """Apply a received cumulative ``Ack(seq)`` (``acked = max(acked, seq)``).

        A writer standing at or below ``seq`` (rewound by ``replay_unacked``
        while those rows were in flight) moves to ``seq + 1``: acked rows are
        not written again, and the log may already have deleted them.

        Returns:
            ``ADVANCE`` when it moved the cursor (see :meth:`ack_to_store`),
            ``STALE`` when it did not, ``ABOVE_HIGH_WATER`` for an ack of a
            seq never logged: a protocol error, never applied.
        """
        if seq > self.high_water:
            return AckKind.ABOVE_HIGH_WATER
        if seq <= self.acked:
            return AckKind.STALE
        self.acked = seq
        if self.write_pos and self.write_pos <= seq:
            # Acked rows are never written (again): after a rewind the writer
            # may stand below an ack, and the log may delete those rows.
            self.write_pos = seq + 1
        self.pending_count += 1
        if self.pending_since_ms is None:
            self.pending_since_ms = now_ms
        return AckKind.ADVANCE

    def ack_to_store(self, now_ms: float, *, force: bool = False) -> int | None:
        """Return the ack to store in the log now, or None to keep coalescing.

        Acks are stored every :data:`ACK_STORE_EVERY` acks or
        :data:`ACK_STORE_AFTER_MS` after the first unstored one; an ack
        covering ``Done`` is stored at once; ``force`` (close, limits) too.
        """
        if self.acked <= self.stored:
            return None
        covers_done = self.done_seq is not None and self.acked >= self.done_seq
        waited = now_ms - self.pending_since_ms if self.pending_since_ms is not None else 0.0
        if (
            force
            or covers_done
            or self.pending_count >= ACK_STORE_EVERY
            or waited >= ACK_STORE_AFTER_MS
        ):
            return self.acked
        return None

    def on_stored(self, seq: int) -> None:
        """The log stored ``Ack(seq)`` (its state holds it): stop coalescing what it covers."""
        if max(self.stored, seq) >= self.acked:
            self._clear_pending()

    def _clear_pending(self) -> None:
        self.pending_count = 0
        self.pending_since_ms = None

    # -- the writer --------------------------------------------------------------

    def start_stream(self, replay_from: int) -> None:
        """A stream is up: write from ``replay_from`` (never below the received ack)."""
        self.write_pos = max(replay_from, self.acked + 1)

    def end_stream(self) -> None:
        """The stream is gone: nothing is being written."""
        self.write_pos = 0

    def next_to_write(self) -> int | None:
        """Return the next seq to write on the live stream, or None when caught up.

        Nothing at or above :attr:`hold_at` is written.
        """
        end = self.high_water if self.hold_at is None else min(self.high_water, self.hold_at - 1)
        if self.write_pos and self.write_pos <= end:
            return self.write_pos
        return None

    def on_written(self, seq: int) -> None:
        """``seq`` was written to the stream."""
        self.write_pos = seq + 1

    def rewind(self) -> int:
        """Rewind the writer to the received ack; return how many rows it will re-send."""
        if self.write_pos:
            self.write_pos = self.acked + 1
        return self.high_water - self.acked


# -- reconnect policy ------------------------------------------------------------

#: A stream up this long resets the backoff attempt counter (ms).
STABLE_STREAM_MS = 30_000.0


@dataclass(slots=True)
class ReconnectPolicy:
    """When the backoff attempt counter resets. SPEC "Reconnect".

    Only after an ack covering a seq written on this stream, or after the
    stream has been up for :data:`STABLE_STREAM_MS`: an engine that answers
    the handshake and drops at once must not make a tight loop.
    """

    attempt: int = 0
    first_written: int | None = None
    up_since_ms: float | None = None

    def on_stream_up(self, now_ms: float) -> None:
        """The handshake was answered (or written, without answers): the stream is up."""
        self.up_since_ms = now_ms
        self.first_written = None

    def on_written(self, seq: int) -> None:
        """A data row was written on this stream."""
        if self.first_written is None:
            self.first_written = seq

    def on_ack(self, seq: int) -> None:
        """An ack arrived on this stream: reset when it covers a row written here."""
        if self.first_written is not None and seq >= self.first_written:
            self.attempt = 0

    def on_set_aside(self) -> None:
        """A row the engine refused was set aside: the engine is healthy, dial again soon."""
        self.attempt = 0

    def next_delay_ms(self, now_ms: float, delay_ms: Callable[[int], float]) -> float:
        """The stream (or dial) ended: return the delay before the next dial.

        Args:
            now_ms: the current time (ms, any monotonic origin).
            delay_ms: ``attempt -> delay`` (``Backoff.delay_ms`` with its rng).
        """
        if self.up_since_ms is not None and now_ms - self.up_since_ms >= STABLE_STREAM_MS:
            self.attempt = 0
        delay = delay_ms(self.attempt)
        self.attempt += 1
        self.up_since_ms = None
        self.first_written = None
        return delay


# -- how a stream ended -----------------------------------------------------------


class EndKind(enum.Enum):
    """What the end of a stream means for the connection loop."""

    RECONNECT = "reconnect"
    RUN_COMPLETED = "run_completed"


RUN_COMPLETED_DETAILS = "run completed"


def classify_end(code: str | None, details: str | None) -> EndKind:
    """Classify a stream's end from its gRPC status name and details.

    Every status reconnects (INTERNAL and UNKNOWN too: proxies report cuts
    that way; UNAUTHENTICATED too: a replacement engine may not know the run
    yet) except FAILED_PRECONDITION "run completed". SPEC "Reconnect".
    """
    if code == "FAILED_PRECONDITION" and RUN_COMPLETED_DETAILS in (details or "").lower():
        return EndKind.RUN_COMPLETED
    return EndKind.RECONNECT


# What grpc.aio reports, in place of the engine's status, when a write was in
# flight as the stream ended (grpc/grpc#36066; grpcio 1.85 still does).
LOST_STATUS_DETAILS = "Internal error from Core"


def describe_end(code: str | None, details: str | None) -> str:
    """The text of a stream's end for logs and ``last_error``: ``"CODE: details"``.

    grpc.aio can replace the engine's status with ``INTERNAL: Internal error
    from Core`` when a write races the end of the call (grpc/grpc#36066): the
    text says so, so an operator does not chase an engine bug. The channel
    reconnects either way and the next dial learns the engine's real answer.
    """
    text = f"{code}: {details or ''}"
    if code == "INTERNAL" and (details or "") == LOST_STATUS_DETAILS:
        text += (
            " (the stream ended during a write, and gRPC reported this in place"
            " of the engine's status: grpc/grpc#36066; the next dial learns it)"
        )
    return text


def is_too_many_pings(text: str) -> bool:
    """Tell whether a status's details/debug text reports a GOAWAY ``too_many_pings``."""
    lowered = text.lower()
    return "too_many_pings" in lowered or "too many pings" in lowered


# -- a row the engine refuses for its size ----------------------------------------

# gRPC C-core (Python, C++, ...; "SERVER: " or "CLIENT: " in front since about
# 1.60), grpc-go ("grpc: received message larger than max (N vs. M)") and
# grpc-node: "... larger than max (N vs. M)". grpc-java: "gRPC message exceeds
# maximum size M: N".
_LARGER_THAN_MAX = re.compile(r"received message larger than max \((\d+) vs\.? (\d+)\)", re.I)
_EXCEEDS_MAX = re.compile(r"message exceeds maximum size (\d+): (\d+)", re.I)
# The client's own receive limit (a down message too large for us) reads the
# same but for this marker: it says nothing about our rows.
_CLIENT_SIDE = "client:"


@dataclass(frozen=True, slots=True)
class SizeRefusal:
    """The engine ended a stream because a message was over its receive limit.

    Attributes:
        received: the size of the message it refused (bytes).
        limit: its receive limit (bytes), below ``received``.
    """

    received: int
    limit: int


def parse_size_refusal(code: str | None, details: str | None) -> SizeRefusal | None:
    """Read a stream's end as the engine refusing an up-message for its size, or None.

    Only RESOURCE_EXHAUSTED whose details give both sizes, the received one
    over the limit, and that is not the client's own receive limit
    (``CLIENT:``, a down message too large for us) counts.

    Args:
        code: the gRPC status name (``"RESOURCE_EXHAUSTED"``).
        details: the status details.
    """
    if code != "RESOURCE_EXHAUSTED" or not details:
        return None
    text = details.lower()
    if _CLIENT_SIDE in text:
        return None
    found = _LARGER_THAN_MAX.search(text)
    if found is not None:
        received, limit = int(found.group(1)), int(found.group(2))
    else:
        found = _EXCEEDS_MAX.search(text)
        if found is None:
            return None
        limit, received = int(found.group(1)), int(found.group(2))
    if received <= limit:
        return None
    return SizeRefusal(received, limit)


@dataclass(frozen=True, slots=True)
class RefusalVerdict:
    """Which in-flight row a :class:`SizeRefusal` proves refused.

    Attributes:
        seq: the row to set aside, or None when no row is proven.
        suspect: the first in-flight row over the limit (the one the engine
            met first), or None when no in-flight row is over it.
        suspect_size: its encoded size (bytes), or None.
    """

    seq: int | None
    suspect: int | None = None
    suspect_size: int | None = None


def pick_refused_row(in_flight: Iterable[tuple[int, int]], refusal: SizeRefusal) -> RefusalVerdict:
    """Decide which row the engine refused, so that no acceptable row is ever set aside.

    The engine reads a stream's messages in order and refuses the first one
    over its limit; every row written before it on the stream was no larger
    than the limit. So the refused row is the first in-flight row (written
    on the stream, not acked), in seq order, whose encoded size is over
    ``refusal.limit`` — and it counts as proven only when its size is
    exactly ``refusal.received``. Anything else (no row over the limit, or
    a size that differs: a proxy's limit, compression) proves nothing.

    Args:
        in_flight: ``(seq, encoded UpMessage size in bytes)`` of the rows
            above the received ack up to the highest seq written on the
            stream, in seq order; read lazily, up to the first row over the
            limit.
        refusal: what the engine said.
    """
    for seq, size in in_flight:
        if size > refusal.limit:
            if size == refusal.received:
                return RefusalVerdict(seq, seq, size)
            return RefusalVerdict(None, seq, size)
    return RefusalVerdict(None)


def refusal_sets_aside(kind: str) -> bool:
    """Tell whether a refused row of ``kind`` is set aside (True) or stops the channel.

    Every kind is set aside into the quarantine, with a ``walchannel.row_lost``
    event at its seq so later rows flow — except ``done``: it is the last
    row, nothing waits behind it, and replacing it would leave the run
    never completing; the channel stops with a clear error instead and the
    row stays in the log (docs/design.md).
    """
    return kind != "done"
