"""The channel's decision layer: what ``GrpcEngineChannel`` decides, without I/O.

Sans-I/O in the style of h11: inputs are events and times in milliseconds
(any monotonic origin), outputs are decisions; nothing here awaits, reads a
clock, touches SQLite or gRPC. The channel (:mod:`walchannel.channel`) feeds
it what happened and carries out what it returns, so each rule is tested
directly (``tests/test_session.py``) and the simulator carries out the very
same decisions in virtual time (``tools/sim.py``'s ``SimDriver``).

It builds on :mod:`walchannel.protocol` (the cursor, the handshake answer's
meaning, the reconnect policy, how a stream ended), which it does not
change. What is here:

- :func:`plan_answer`: the engine's handshake answer -> which action, and
  from where to replay (SPEC "Dial").
- :func:`ack_timer_ms`: when a coalesced ack must be stored at the latest
  (SPEC "The log").
- :class:`CheckpointPolicy`: when the log is checkpointed to give disk back
  (SPEC "The log": disk bounded by the backlog).
- :func:`held_done_reached`: a refused ``Done`` stops the channel once the
  rows before it are acked (docs/design.md).
- :class:`WriteCounter`: which write is a replay; reconnect counting
  (SPEC "The channel", ``stats()``).
- :func:`watchdog_period_ms`, :func:`stream_verdict`: the dead-stream and
  stalled-write rules (SPEC "Reconnect"; docs/design.md).
- :func:`doubled_keepalive_ms`, :func:`plan_end`: how a stream's end is
  handled (SPEC "Reconnect", "Dial": ``too_many_pings``).
- :func:`plan_run_completed`: the engine's "run completed": a tombstone
  when this log's ``Done`` was applied, else the rows left are
  undeliverable (docs/design.md).
- :func:`unproven_refusal`: why a size refusal sets nothing aside
  (docs/design.md, "A row the engine refuses for its size").
- :class:`DownLatch`: ``Stop`` fires once; decisions are cached by request id
  (SPEC "Down messages").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

from walchannel.log_state import LogState
from walchannel.protocol import (
    ACK_STORE_AFTER_MS,
    AnswerKind,
    Cursor,
    EndKind,
    RefusalVerdict,
    SizeRefusal,
    classify_end,
    is_too_many_pings,
    parse_size_refusal,
)

__all__ = [
    "CHECKPOINT_EVERY_MS",
    "CHECKPOINT_IDLE_MS",
    "CHECKPOINT_RETRY_MAX_MS",
    "KEEPALIVE_TIMEOUT_MS",
    "MAX_KEEPALIVE_MS",
    "AnswerPlan",
    "AnswerStep",
    "CheckpointPolicy",
    "DownLatch",
    "EndOutcome",
    "EndPlan",
    "RunCompletedPlan",
    "StreamVerdict",
    "VerdictKind",
    "WriteCounter",
    "ack_timer_ms",
    "doubled_keepalive_ms",
    "held_done_reached",
    "plan_answer",
    "plan_end",
    "plan_run_completed",
    "stream_verdict",
    "unproven_refusal",
    "watchdog_period_ms",
]

D = TypeVar("D")

#: gRPC keepalive ping timeout (ms), as in the design note; also the slack
#: a blocked write gets beyond ``keepalive_ms`` before it counts as stalled.
KEEPALIVE_TIMEOUT_MS = 10_000
#: Cap of the keepalive after GOAWAY too_many_pings doublings (ms).
MAX_KEEPALIVE_MS = 300_000
#: Quiet time after the last stored ack after which the log is checkpointed
#: and its freed pages given back (ms).
CHECKPOINT_IDLE_MS = 1_000
#: While acks keep being stored, an empty backlog is checkpointed at most this often (ms).
CHECKPOINT_EVERY_MS = 10_000
#: Retry delays of a checkpoint a reader held off: doubling up to this (ms).
CHECKPOINT_RETRY_MAX_MS = 30_000


# -- the handshake answer --------------------------------------------------------------


class AnswerStep(enum.Enum):
    """What the channel does with the engine's handshake answer ``Ack(h)``."""

    FAIL_BEHIND = "fail_behind"  # FAILED, EngineBehindError; the stream ends
    VERIFY = "verify"  # RunLog.verify(h), then Cursor.on_verified
    PROTOCOL_ERROR = "protocol_error"  # counted, not applied; replay from the cursor
    RESEND_FORGOTTEN = "resend_forgotten"  # Cursor.on_forgot; re-send from h + 1
    ACK = "ack"  # an ordinary ack of h; replay from h + 1
    NO_ANSWER = "no_answer"  # engine_acks_handshake=False: replay from the cursor


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """The decision for a handshake answer.

    Attributes:
        step: what to do.
        replay_from: the first seq to write on the stream, or None when the
            stream ends (``FAIL_BEHIND``).
        clear_failed_mark: a healthy answer clears a ``failed_at`` left in
            the log by an earlier run (``inspect`` no longer says failed).
    """

    step: AnswerStep
    replay_from: int | None
    clear_failed_mark: bool = False


def plan_answer(cursor: Cursor, engine_high: int | None, *, failed_mark: bool) -> AnswerPlan:
    """Decide what the engine's handshake answer means for the channel. SPEC "Dial".

    Pure: reads ``cursor`` (:meth:`~walchannel.protocol.Cursor.on_answer`
    classifies the answer), changes nothing.

    Args:
        cursor: the channel's cursor before the answer.
        engine_high: ``h`` from ``Ack(h)``; None without
            ``engine_acks_handshake`` (no answer is awaited).
        failed_mark: the log holds ``failed_at`` from an earlier run.

    Returns:
        The :class:`AnswerPlan`: behind -> fail; first answer since open ->
        verify and renumber, replay from ``h + 1``; above the high-water of
        a verified log -> protocol error, replay from the cursor; below an
        ack received but not stored -> re-send from ``h + 1``; else an
        ordinary ack, replay from ``h + 1``.
    """
    if engine_high is None:
        return AnswerPlan(AnswerStep.NO_ANSWER, cursor.acked + 1)
    answer = cursor.on_answer(engine_high)
    clear = failed_mark and answer.kind is not AnswerKind.BEHIND
    if answer.kind is AnswerKind.BEHIND:
        return AnswerPlan(AnswerStep.FAIL_BEHIND, None)
    if answer.kind is AnswerKind.VERIFY:
        return AnswerPlan(AnswerStep.VERIFY, engine_high + 1, clear)
    if answer.kind is AnswerKind.AHEAD:
        return AnswerPlan(AnswerStep.PROTOCOL_ERROR, answer.replay_from, clear)
    if answer.kind is AnswerKind.FORGOT:
        return AnswerPlan(AnswerStep.RESEND_FORGOTTEN, answer.replay_from, clear)
    return AnswerPlan(AnswerStep.ACK, answer.replay_from, clear)


# -- storing acks and giving disk back ---------------------------------------------------


def ack_timer_ms(cursor: Cursor, *, timer_armed: bool) -> float | None:
    """Return in how many ms a coalesced ack must be stored, or None for no timer.

    Called when :meth:`~walchannel.protocol.Cursor.ack_to_store` said "not
    yet": an ack received and not stored is stored at the latest
    :data:`~walchannel.protocol.ACK_STORE_AFTER_MS` later (SPEC "The log":
    ~100 ms), by a timer armed once.
    """
    if cursor.pending_since_ms is None or timer_armed:
        return None
    return ACK_STORE_AFTER_MS


class CheckpointPolicy:
    """When to checkpoint the log and give its freed pages back (docs/design.md).

    Rows deleted by a stored ack leave free pages. Once acks stop for
    :data:`CHECKPOINT_IDLE_MS` the log is checkpointed, whatever is still
    unacked; while acks keep coming and the backlog is empty, at most every
    :data:`CHECKPOINT_EVERY_MS`. A big reclaim goes one chunk per turn of the
    event loop; a checkpoint a reader held off is retried, the delay
    doubling up to :data:`CHECKPOINT_RETRY_MAX_MS`; new acks bring it forward.

    The methods return what to do: ``0.0`` or more is "arm the timer to fire
    in that many ms (at the latest)", ``"now"`` is "checkpoint now", None is
    "nothing".

    Args:
        now_ms: the time of creation (ms).
    """

    def __init__(self, now_ms: float) -> None:
        self.last_stored_ms = 0.0
        self.last_checkpoint_ms = now_ms
        self.due = False
        self.retry_ms = float(CHECKPOINT_IDLE_MS)

    def on_rows_deleted(self, now_ms: float, *, unacked: int) -> float | str:
        """An ack was stored (rows deleted): checkpoint now, or arm the idle timer.

        Args:
            now_ms: the time (ms).
            unacked: rows not covered by the received ack.
        """
        self.last_stored_ms = now_ms
        self.due = True
        self.retry_ms = float(CHECKPOINT_IDLE_MS)
        if unacked == 0 and now_ms - self.last_checkpoint_ms >= CHECKPOINT_EVERY_MS:
            return "now"
        return float(CHECKPOINT_IDLE_MS)

    def on_timer(self, now_ms: float) -> float | str | None:
        """The timer fired: checkpoint now, wait longer (acks still coming), or nothing."""
        if not self.due:
            return None
        quiet_ms = now_ms - self.last_stored_ms
        if quiet_ms < CHECKPOINT_IDLE_MS:
            return CHECKPOINT_IDLE_MS - quiet_ms
        return "now"

    def on_checkpoint(self, now_ms: float) -> None:
        """A checkpoint step starts now."""
        self.last_checkpoint_ms = now_ms

    def on_result(self, *, complete: bool, shrank: bool) -> float | None:
        """A checkpoint step ended: None when done, else the delay before the next step.

        Args:
            complete: no free page is left (the log gave everything back).
            shrank: the file got smaller (a step of a big reclaim): go on at once.
        """
        if complete:
            self.due = False
            self.retry_ms = float(CHECKPOINT_IDLE_MS)
            return None
        if shrank:
            return 0.0
        # A reader (inspect) held it off, or it failed: try again, less often.
        delay = self.retry_ms
        self.retry_ms = min(2 * self.retry_ms, float(CHECKPOINT_RETRY_MAX_MS))
        return delay


def held_done_reached(cursor: Cursor) -> bool:
    """Tell whether every row before a ``Done`` the engine refused for its size is acked.

    Then the channel stops with the refusal's error (docs/design.md, "A row
    the engine refuses for its size": ``Done`` is never set aside).
    """
    return cursor.hold_at is not None and cursor.acked >= cursor.hold_at - 1


# -- writes and streams ---------------------------------------------------------------------


@dataclass(slots=True)
class WriteCounter:
    """What ``stats()`` counts about writes and streams.

    Attributes:
        sent: data rows written (replays included).
        replayed: data rows written again (after a reconnect or ``replay_unacked``).
        max_written: the highest seq ever written on any stream.
        streams_up: streams that came up (answered handshake).
        reconnects: streams up after the channel's first.
    """

    sent: int = 0
    replayed: int = 0
    max_written: int = 0
    streams_up: int = 0
    reconnects: int = 0

    def is_replay(self, seq: int) -> bool:
        """Tell whether writing ``seq`` now writes it again (it went out before)."""
        return seq <= self.max_written

    def on_written(self, seq: int) -> None:
        """Row ``seq`` was written."""
        self.sent += 1
        if self.is_replay(seq):
            self.replayed += 1
        else:
            self.max_written = seq

    def on_stream_up(self) -> None:
        """A stream came up; every one after the first is a reconnect."""
        self.streams_up += 1
        if self.streams_up > 1:
            self.reconnects += 1


class VerdictKind(enum.Enum):
    """Why the watchdog ends a stream."""

    DEAD = "dead"  # dead_stream_ms of silence while heartbeats went out
    STALLED = "stalled"  # a write blocked past keepalive + 10 s, silent as long


@dataclass(frozen=True, slots=True)
class StreamVerdict:
    """The watchdog's verdict on a live stream.

    Attributes:
        kind: why it is dead.
        silent_ms: time since the last down message (ms).
        blocked_ms: how long the write in progress has been blocked (ms; 0: none).
        beat_overdue: a heartbeat is due behind a blocked write.
    """

    kind: VerdictKind
    silent_ms: float
    blocked_ms: float
    beat_overdue: bool


def watchdog_period_ms(dead_stream_ms: float | None, keepalive_ms: float) -> float:
    """How often the watchdog looks (ms): a quarter of the shortest bound, at least 50 ms."""
    stall_ms = keepalive_ms + KEEPALIVE_TIMEOUT_MS
    return max(50.0, min(dead_stream_ms or stall_ms, keepalive_ms) / 4)


def stream_verdict(
    now_ms: float,
    *,
    last_down_ms: float,
    heartbeats_since_down: int,
    write_since_ms: float | None,
    next_beat_ms: float,
    dead_stream_ms: float | None,
    keepalive_ms: float,
) -> StreamVerdict | None:
    """Decide whether a live stream is dead; None while it looks alive.

    ``dead_stream_ms`` (SPEC "Reconnect"): no down message for that long
    while heartbeats go out. A heartbeat that falls due while the writer is
    blocked in a write (flow control: a frozen engine, or a proxy that
    stopped reading) counts as going out: it is only stuck behind that write.

    Stalled write (always on, docs/design.md): a write blocked for
    ``keepalive_ms + 10 s`` with no down message for as long. gRPC
    keepalive cannot catch it: its ping queues behind the blocked bytes.

    Args:
        now_ms: the time (ms).
        last_down_ms: when the last down message arrived (ms; the dial's
            time before the first).
        heartbeats_since_down: heartbeats written since then.
        write_since_ms: when the write in progress started, None when the
            writer is not in a write.
        next_beat_ms: when the next heartbeat is due (ms).
        dead_stream_ms: the config's bound (None: off).
        keepalive_ms: the current keepalive (ms).
    """
    silent = now_ms - last_down_ms
    blocked = 0.0 if write_since_ms is None else now_ms - write_since_ms
    beat_overdue = write_since_ms is not None and now_ms >= next_beat_ms
    if (
        dead_stream_ms is not None
        and silent >= dead_stream_ms
        and (heartbeats_since_down > 0 or beat_overdue)
    ):
        return StreamVerdict(VerdictKind.DEAD, silent, blocked, beat_overdue)
    stall_ms = keepalive_ms + KEEPALIVE_TIMEOUT_MS
    if blocked >= stall_ms and silent >= stall_ms:
        return StreamVerdict(VerdictKind.STALLED, silent, blocked, beat_overdue)
    return None


# -- how a stream ended ---------------------------------------------------------------


def doubled_keepalive_ms(keepalive_ms: int) -> int:
    """The keepalive after a GOAWAY ``too_many_pings``: doubled, capped at 5 minutes."""
    return min(keepalive_ms * 2, MAX_KEEPALIVE_MS)


class EndOutcome(enum.Enum):
    """What a stream's end means for the run."""

    RUN_COMPLETED = "run_completed"  # the engine says so: the loop ends
    ALREADY_OVER = "already_over"  # the channel was FAILED/EXPIRED: nothing to record
    SIZE_REFUSAL = "size_refusal"  # the engine refused a message for its size
    RECONNECT = "reconnect"  # record the error; back off and dial again


@dataclass(frozen=True, slots=True)
class EndPlan:
    """The decision for a stream's end.

    Attributes:
        outcome: what it means.
        double_keepalive: the engine sent GOAWAY ``too_many_pings``.
        refusal: with ``SIZE_REFUSAL``, what the engine said.
    """

    outcome: EndOutcome
    double_keepalive: bool = False
    refusal: SizeRefusal | None = None


def plan_end(code: str | None, details: str, debug: str, *, final: bool) -> EndPlan:
    """Decide what a stream's end means, from its gRPC status. SPEC "Reconnect".

    Args:
        code: the status name (``"UNAVAILABLE"``), None when none is known.
        details: the status details.
        debug: gRPC's debug string (where some GOAWAY reasons show).
        final: the channel is already ``FAILED``/``EXPIRED``.
    """
    double = is_too_many_pings(f"{details} {debug}")
    if classify_end(code, details) is EndKind.RUN_COMPLETED:
        return EndPlan(EndOutcome.RUN_COMPLETED, double)
    if final:
        return EndPlan(EndOutcome.ALREADY_OVER, double)
    refusal = parse_size_refusal(code, details)
    if refusal is not None:
        return EndPlan(EndOutcome.SIZE_REFUSAL, double, refusal)
    return EndPlan(EndOutcome.RECONNECT, double)


@dataclass(frozen=True, slots=True)
class RunCompletedPlan:
    """What the engine's "run completed" means for this run's log.

    Attributes:
        tombstone: the log holds an unacked ``Done``: the engine applied it
            (and, taking seqs in order, every row before it) but its ack was
            lost, so the log becomes a tombstone on the engine's word
            (``RunLog.complete_by_engine``) and ``send_done`` returns True.
        mark_undeliverable: when the log is not made a tombstone (no
            ``Done`` logged, or completing it failed), rows remain that can
            never be delivered: mark the run failed (``failed_at`` +
            ``FAILED_UNDELIVERABLE``) so ``inspect`` says so.
    """

    tombstone: bool
    mark_undeliverable: bool


def plan_run_completed(state: LogState) -> RunCompletedPlan:
    """Decide what FAILED_PRECONDITION "run completed" does to the log. docs/design.md.

    Either way the connection loop ends (``FAILED``, ``RunCompletedError``);
    this decides only the log's side (SPEC "Completion": a run whose
    ``Done`` the engine applied is complete, whether or not its ack came).

    Args:
        state: the log's :class:`~walchannel.log_state.LogState` when the
            answer came.

    Returns:
        The :class:`RunCompletedPlan`: a tombstone when ``Done`` is logged;
        the undeliverable mark when rows above the stored cursor remain.
    """
    return RunCompletedPlan(
        tombstone=state.done_seq is not None,
        mark_undeliverable=state.unacked_count > 0,
    )


def unproven_refusal(verdict: RefusalVerdict, refusal: SizeRefusal, *, handshake_size: int) -> str:
    """Say why a size refusal proves no row refused, so nothing is set aside.

    For the ERROR line and ``last_error`` when
    :func:`~walchannel.protocol.pick_refused_row` found no proven row
    (``verdict.seq`` is None): the refused size is the handshake's, no row
    written on the stream is over the limit, or the first one over it has
    another size.

    Args:
        verdict: what ``pick_refused_row`` decided.
        refusal: what the engine said (sizes in bytes).
        handshake_size: the encoded handshake's size (bytes).
    """
    if verdict.suspect is None and handshake_size == refusal.received:
        return "it is the handshake: shorten connector_version, harness_name or harness_version"
    if verdict.suspect is None:
        return f"no row written on the stream is over the engine's limit of {refusal.limit} bytes"
    return (
        f"the first row over the limit, seq {verdict.suspect} "
        f"({verdict.suspect_size} bytes), is not the refused "
        f"{refusal.received}-byte message"
    )


# -- down messages ------------------------------------------------------------------------


class DownLatch(Generic[D]):
    """Repeats of down messages: ``Stop`` fires once, decisions are kept by request id.

    SPEC "Down messages" and "The channel": the engine re-sends its ``Stop``
    and every decision after each handshake; ``on_stop`` callbacks fire once
    per channel, and a ``request_approval`` for an id already decided
    resolves at once without logging a new row.
    """

    def __init__(self) -> None:
        self.stopped = False
        self.decided: dict[str, D] = {}

    def on_stop(self) -> bool:
        """A ``Stop`` arrived: True the first time (fire the callbacks), then False."""
        first = not self.stopped
        self.stopped = True
        return first

    def on_decision(self, request_id: str, decision: D) -> None:
        """A decision arrived (new or repeated): keep it; the latest wins."""
        self.decided[request_id] = decision

    def decision(self, request_id: str) -> D | None:
        """The decision for ``request_id``, or None when none came yet."""
        return self.decided.get(request_id)
