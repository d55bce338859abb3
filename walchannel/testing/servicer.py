"""The engine's side of the ``Open`` calls: how a LocalEngine handles a stream.

:class:`EngineServicer` serves every call of a
:class:`~walchannel.testing.engine.LocalEngine` (which owns it and registers
it with each gRPC server it starts); :class:`EngineStream` is one call's
state (command queue, outbox, ack cadence).

The duties (SPEC "Wire contract", "Engine duties the client relies on"):

- Auth: call metadata ``authorization: Bearer <token>``, compared by sha256
  with the registered hash; an unknown run or a bad token is
  UNAUTHENTICATED (the token is never echoed or logged).
- The first up-message is a handshake at seq 0, answered with ``Ack(h)``
  (``h`` = the highest seq the store holds for the run, 0 if none); a
  completed run fails FAILED_PRECONDITION "run completed by writer W".
  After every handshake the run's ``Stop`` (if issued) and every decision
  are re-sent.
- One writer per run: the store keeps the run's owner (writer id, epoch)
  and :meth:`EngineStore.admit <walchannel.testing.store.EngineStore.admit>`
  decides each handshake before it is answered or ends any stream. Another
  writer fails FAILED_PRECONDITION "owned by another writer: …" unless its
  handshake asks to take the run over; the owner at a lower epoch fails
  "writer fenced: …". A takeover is logged at WARNING and recorded, and
  ends the old writer's stream with "writer fenced: …"; every message of a
  writer that lost the run is refused the same way (checked in the
  transaction that applies it), and so is its next heartbeat.
- Heartbeats (seq 0) are answered with ``Ack(h)``.
- Data: ``seq == h + 1`` is applied, ``seq <= h`` is a duplicate (counted,
  acked, not applied), a higher seq is a gap (recorded; FAILED_PRECONDITION
  naming the expected seq). A repeated ``ApprovalRequest`` id is answered
  with the stored decision. ``Done`` completes the run and is acked at once;
  a second ``Done`` is a protocol error.
- Acks say only what the store committed: one per ``ack_every`` messages,
  and after ``ack_idle_ms`` without new messages if anything is unacked.
- One live stream per run per engine: a newer stream of the owner ends the
  older (ABORTED); a refused handshake ends none.

Each RPC handler owns one command queue, fed by a reader task (up-messages,
end of input) and by the engine (end with a status, push a down message,
timers), because an RPC can only be aborted from its own handler. Store
transactions run on one worker thread per engine, so two engines in one
process contend on the store file for real.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, TypeVar

import grpc
from grpc import aio

from walchannel._logging import get_logger
from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.errors import OWNED_BY_ANOTHER_WRITER, WRITER_FENCED
from walchannel.testing.store import (
    AcceptResult,
    Admission,
    Decision,
    EngineStore,
    RunState,
    StoreClosedError,
    Writer,
)
from walchannel.wire.protobuf import DATA_KINDS, body_of

__all__ = [
    "FAULTS",
    "OWNED_BY_ANOTHER_WRITER",
    "RUN_COMPLETED",
    "WRITER_FENCED",
    "EngineServicer",
    "EngineStream",
    "wait_finished",
]

logger = get_logger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: The details of the FAILED_PRECONDITION that answers a completed run.
RUN_COMPLETED: Final = "run completed"

_UNAUTHENTICATED_DETAILS: Final = "unknown run or invalid token"

#: Faults a local engine can be given, each breaking exactly one duty (name ->
#: what the engine then does wrong): engines the conformance kit must fail
#: (docs/conformance.md). Never for a real run.
FAULTS: Final[dict[str, str]] = {
    "answer_ahead": "answers a handshake with Ack(h + 1), a seq it never received",
    "ack_ahead": "acks each data message with Ack(h + 1)",
    "duplicate_unacked": "does not ack a duplicate (seq <= h)",
    "gap_text": "ends a gap's stream without naming the expected seq",
    "done_ack_late": "acks Done 5 s late",
    "forget_completion": "forgets that a run completed: answers and applies after Done",
    "ignore_half_close": "does not end the call when the client half-closes",
    "keep_older": "keeps the older stream of a run when a newer one is accepted",
    "refused_ends_older": "ends the run's live stream when a handshake is refused",
    "no_fencing": "accepts every writer: no owner, no epoch",
    "takeover_keeps_old": "leaves the old writer's stream open after a takeover",
    "no_resend": "sends Stop and decisions once, not again after each handshake",
    "forget_owner_on_restart": "keeps the run's owner in memory: a restart forgets it",
    "never_commit": "acks data messages it never commits to its store",
}
#: How late the ``done_ack_late`` fault acks a Done (seconds).
_LATE_DONE_ACK_S: Final = 5.0
# Up-messages read ahead of the handler per stream (flow control stays with gRPC).
_READ_AHEAD: Final = 256
# Tolerance when deciding that a delayed message is due (seconds): asyncio
# may run a timer up to its clock resolution early.
_DUE_SLACK_S: Final = 0.001


# -- per-stream commands ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Up:
    msg: pb.UpMessage


@dataclass(frozen=True, slots=True)
class _ReadEnded:
    error: BaseException | None  # None: the client half-closed cleanly


@dataclass(frozen=True, slots=True)
class _Push:
    msg: pb.DownMessage


@dataclass(frozen=True, slots=True)
class _End:
    code: grpc.StatusCode | None  # None: a bare, clean end of stream
    details: str


@dataclass(frozen=True, slots=True)
class _Flush:
    """A marker on a stream's queue: the delayed down messages that are due go out now."""


@dataclass(frozen=True, slots=True)
class _IdleAck:
    generation: int


_Command = _Up | _ReadEnded | _Push | _End | _Flush | _IdleAck


def completed_text(completed_by: str | None) -> str:
    """The details of "run completed", naming the writer whose ``Done`` was applied when known."""
    return f"{RUN_COMPLETED} by writer {completed_by}" if completed_by else RUN_COMPLETED


def refusal_text(run_id: str, writer: Writer, admission: Admission) -> str:
    """The FAILED_PRECONDITION details of a writer the run refuses (SPEC "Engine duties").

    They begin with a fixed text the client recognises:
    :data:`~walchannel.errors.OWNED_BY_ANOTHER_WRITER` or
    :data:`~walchannel.errors.WRITER_FENCED`.
    """
    if admission.verdict == "fenced":
        return (
            f"{WRITER_FENCED}: {writer} of run {run_id} is below the run's epoch "
            f"{admission.owner.epoch if admission.owner else '?'} (a restored copy of its log "
            "superseded it)"
        )
    return (
        f"{OWNED_BY_ANOTHER_WRITER}: run {run_id} is owned by {admission.owner}; "
        f"{writer} did not ask to take it over (walchannel takeover)"
    )


def _ack(seq: int) -> pb.DownMessage:
    return pb.DownMessage(ack=pb.Ack(seq=seq))


def _resume_ack(h: int, state: RunState) -> pb.DownMessage:
    """``Ack(h)`` with the run's resume point: its last applied marker (empty while none)."""
    ack = pb.Ack(seq=h)
    ack.resume.SetInParent()
    ack.resume.seq = state.resume_seq
    ack.resume.row_digests.extend(state.resume_digests)
    ack.resume.rows = state.resume_rows
    if state.resume_marker is not None:
        ack.resume.marker.update(state.resume_marker)
    return pb.DownMessage(ack=ack)


def _decision_message(decision: Decision) -> pb.DownMessage:
    return pb.DownMessage(
        approval_decision=pb.ApprovalDecision(
            request_id=decision.request_id,
            approved=decision.approved,
            reason=decision.reason,
        )
    )


def _bearer_token(metadata: aio.Metadata | Sequence[tuple[str, Any]] | None) -> str | None:
    """Return the bearer token of the call metadata, or None when there is none."""
    if metadata is None:
        return None
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        if not isinstance(value, str):
            return None
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token else None
    return None


class EngineStream:
    """The state of one ``Open`` call: its command queue, outbox and ack cadence."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.run_id: str | None = None
        #: The writer its handshake named (admitted as the run's owner).
        self.writer: Writer | None = None
        #: Highest seq this stream knows to be committed for its run.
        self.h = 0
        #: Messages received (applied or duplicate) since the last ack.
        self.unacked = 0
        #: The client half-closed: finish once the outbox is empty.
        self.closing = False
        self.finished = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[_Command] = asyncio.Queue()
        self._read_slots = asyncio.Semaphore(_READ_AHEAD)
        # (due time on the loop clock, message); due times never decrease, so
        # a delayed ack holds back what follows it and order is kept.
        self._outbox: collections.deque[tuple[float, pb.DownMessage]] = collections.deque()
        self._last_due = 0.0
        self._flush_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_generation = 0
        self._reader: asyncio.Task[None] | None = None

    def label(self) -> str:
        return f"run {self.run_id}" if self.run_id is not None else f"stream from {self.peer}"

    # -- input --

    def start_reader(self, requests: AsyncIterator[pb.UpMessage]) -> None:
        self._reader = asyncio.create_task(self._read(requests), name="walchannel-engine-reader")

    async def _read(self, requests: AsyncIterator[pb.UpMessage]) -> None:
        try:
            async for msg in requests:
                await self._read_slots.acquire()
                self._queue.put_nowait(_Up(msg))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._queue.put_nowait(_ReadEnded(exc))
        else:
            self._queue.put_nowait(_ReadEnded(None))

    def command(self, command: _Command) -> None:
        """Queue a command for the handler (from any coroutine on the loop)."""
        self._queue.put_nowait(command)

    async def next_command(self) -> _Command:
        command = await self._queue.get()
        if isinstance(command, _Up):
            self._read_slots.release()
        return command

    # -- output --

    def send(self, msg: pb.DownMessage, *, delay_s: float = 0.0) -> None:
        """Queue a down message, due ``delay_s`` from now (and not before the one ahead)."""
        due = max(self._loop.time() + delay_s, self._last_due)
        self._last_due = due
        self._outbox.append((due, msg))
        self._arm_flush()

    def take_due(self) -> list[pb.DownMessage]:
        """Pop every message that is due now, in order."""
        now = self._loop.time() + _DUE_SLACK_S
        out: list[pb.DownMessage] = []
        while self._outbox and self._outbox[0][0] <= now:
            out.append(self._outbox.popleft()[1])
        self._arm_flush()
        return out

    @property
    def outbox_empty(self) -> bool:
        return not self._outbox

    def _arm_flush(self) -> None:
        if self._flush_timer is not None or not self._outbox:
            return
        delay = self._outbox[0][0] - self._loop.time()
        if delay > 0:
            self._flush_timer = self._loop.call_later(delay, self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_timer = None
        self._queue.put_nowait(_Flush())

    # -- idle ack timer --

    def arm_idle(self, delay_s: float) -> None:
        """(Re)start the idle timer: an ``_IdleAck`` arrives after ``delay_s`` of quiet."""
        self.cancel_idle()
        generation = self._idle_generation
        self._idle_timer = self._loop.call_later(
            delay_s, self._queue.put_nowait, _IdleAck(generation)
        )

    def cancel_idle(self) -> None:
        # A new generation makes an _IdleAck already queued a no-op.
        self._idle_generation += 1
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def idle_current(self, generation: int) -> bool:
        return generation == self._idle_generation

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self.cancel_idle()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self.finished.set()


async def wait_finished(streams: Sequence[EngineStream], timeout_s: float) -> None:
    """Wait until each of ``streams`` finished, at most ``timeout_s`` seconds in all."""
    if not streams:
        return
    waits = [asyncio.ensure_future(s.finished.wait()) for s in streams]
    _, pending = await asyncio.wait(waits, timeout=timeout_s)
    for fut in pending:
        fut.cancel()


class EngineServicer(pb_grpc.EngineChannelServicer):
    """The engine's side of every ``Open`` call (the duties in the module doc).

    Args:
        store: the engine's store.
        executor: where store transactions run (one worker: in order).
        ack_every, ack_idle_s, ack_delay_s, ack_handshakes, ack_heartbeats:
            the ack cadence (see :class:`~walchannel.testing.engine.LocalEngine`).
        resume_points: keep and announce the run's resume point (``LocalEngine``).
        faults: names from :data:`FAULTS`: duties this engine breaks on purpose.

    Attributes:
        streams: the live stream of each run on this engine.
        handlers: every call being served.
        reject_handshakes: this many handshakes more refuse their token
            (UNAUTHENTICATED), whatever it is: a replacement engine that
            does not know the run yet.
    """

    def __init__(
        self,
        store: EngineStore,
        executor: ThreadPoolExecutor,
        *,
        ack_every: int,
        ack_idle_s: float,
        ack_delay_s: float,
        ack_handshakes: bool,
        ack_heartbeats: bool,
        resume_points: bool = True,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        unknown = sorted(faults - FAULTS.keys())
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(FAULTS)}")
        self._faults = faults
        self._store = store
        self._executor = executor
        self._ack_every = ack_every
        self._ack_idle_s = ack_idle_s
        self._ack_delay_s = ack_delay_s
        self._ack_handshakes = ack_handshakes
        self._ack_heartbeats = ack_heartbeats
        self._resume_points = resume_points
        self.streams: dict[str, EngineStream] = {}
        self.handlers: set[EngineStream] = set()
        self._answered: set[str] = set()  # runs whose handshake was answered (no_resend)
        self.reject_handshakes = 0

    async def Open(
        self,
        request_iterator: AsyncIterator[pb.UpMessage],
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> AsyncIterator[pb.DownMessage]:
        """Serve one ``/EngineChannel/Open`` call."""
        async for msg in self._serve(request_iterator, context):
            yield msg

    # -- control (the engine's) ---------------------------------------------------------

    def end_stream(
        self, run_id: str, code: grpc.StatusCode | None, details: str
    ) -> EngineStream | None:
        """End the run's live stream with ``code`` (None: a bare, clean end); return it."""
        stream = self.streams.pop(run_id, None)
        if stream is not None:
            stream.command(_End(code, details))
        return stream

    def end_all(self, code: grpc.StatusCode, details: str) -> list[EngineStream]:
        """End every call being served with ``code``; return them."""
        handlers = list(self.handlers)
        for stream in handlers:
            stream.command(_End(code, details))
        self.streams.clear()
        return handlers

    def push(self, run_id: str, msg: pb.DownMessage) -> bool:
        """Send ``msg`` on the run's live stream; False when there is none."""
        stream = self.streams.get(run_id)
        if stream is None:
            return False
        stream.command(_Push(msg))
        return True

    def push_decision(self, run_id: str, decision: Decision) -> bool:
        """Send a stored approval decision on the run's live stream; False when there is none."""
        return self.push(run_id, _decision_message(decision))

    async def store_call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run a store transaction on the engine's worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # -- one call ------------------------------------------------------------------------

    async def _serve(
        self,
        requests: AsyncIterator[pb.UpMessage],
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> AsyncIterator[pb.DownMessage]:
        """The body of one ``Open`` call: run commands, yield due down messages."""
        stream = EngineStream(context.peer())
        token = _bearer_token(context.invocation_metadata())
        if token is None:
            logger.info("stream from %s: no bearer token", stream.peer)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        self.handlers.add(stream)
        stream.start_reader(requests)
        try:
            while True:
                command = await stream.next_command()
                if isinstance(command, _Up):
                    try:
                        await self._on_up(stream, command.msg, token, context)
                    except (sqlite3.Error, StoreClosedError) as exc:
                        # The stream ends UNAVAILABLE, so the client retries.
                        logger.error("%s: engine store failed: %s", stream.label(), exc)
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "engine store unavailable")
                elif isinstance(command, _Push):
                    stream.send(command.msg)
                elif isinstance(command, _End):
                    if command.code is None:
                        return
                    await context.abort(command.code, command.details)
                elif isinstance(command, _IdleAck):
                    if stream.idle_current(command.generation) and stream.unacked:
                        self._send_ack(stream)
                elif isinstance(command, _ReadEnded):
                    if command.error is not None:
                        logger.info("%s: stream input failed: %r", stream.label(), command.error)
                        return
                    logger.debug("%s: client half-closed", stream.label())
                    stream.closing = "ignore_half_close" not in self._faults
                    if stream.unacked:
                        self._send_ack(stream)
                for msg in stream.take_due():
                    yield msg
                if stream.closing and stream.outbox_empty:
                    return
        finally:
            stream.close()
            self.handlers.discard(stream)
            if stream.run_id is not None and self.streams.get(stream.run_id) is stream:
                del self.streams[stream.run_id]

    async def _on_up(
        self,
        stream: EngineStream,
        msg: pb.UpMessage,
        token: str,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> None:
        kind, body = body_of(msg)
        seq = int(msg.seq)
        run_id = stream.run_id
        if run_id is None:
            await self._open_run(stream, msg, kind, token, context)
            return
        if msg.run_id != run_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"message for run {msg.run_id!r} on the stream of run {run_id!r}",
            )
        if kind in ("handshake", "heartbeat"):
            if seq != 0:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"a {kind} must carry seq 0, got {seq}"
                )
            if kind == "handshake":
                await self._admit(stream, msg, context)
                await self._answer_handshake(stream, context)
            elif self._ack_heartbeats:
                writer = stream.writer or Writer("", 0)
                h, owner = await self.store_call(self._store.heartbeat, run_id, writer)
                if owner is not None:
                    await self._fence(context, run_id, writer, owner)
                stream.h = max(stream.h, h)
                self._send_ack(stream)
            return
        if kind not in DATA_KINDS:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"message at seq {seq} has no known body"
            )
        if seq == 0:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"a {kind} needs a seq >= 1, got 0"
            )
        if "never_commit" in self._faults:
            # Acked from memory: nothing reaches the store.
            if seq == stream.h + 1:
                result = AcceptResult("applied", seq)
            else:
                result = AcceptResult("duplicate", stream.h)
        else:
            result = await self.store_call(
                self._store.accept, run_id, seq, kind, body, writer=stream.writer or Writer("", 0)
            )
        await self._on_result(stream, seq, kind, result, context)

    async def _open_run(
        self,
        stream: EngineStream,
        msg: pb.UpMessage,
        kind: str,
        token: str,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> None:
        """Authenticate the stream's first message, which must be the handshake."""
        run_id = msg.run_id
        if self.reject_handshakes > 0:
            self.reject_handshakes -= 1
            logger.info("run %s: token rejected (this engine does not know runs yet)", run_id)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if not await self.store_call(self._store.check_token, run_id, token):
            logger.warning("run %s: unknown run or invalid token from %s", run_id, stream.peer)
            if "refused_ends_older" in self._faults:
                self.end_stream(run_id, grpc.StatusCode.ABORTED, "superseded")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if kind != "handshake" or msg.seq != 0:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the first message must be a handshake at seq 0, got {kind or 'no body'}"
                f" at seq {msg.seq}",
            )
        stream.run_id = run_id
        # The writer first: a refused handshake ends no stream of the owner.
        admission = await self._admit(stream, msg, context)
        older = self.streams.get(run_id)
        # Register before reading the run's state: a Stop or decision issued
        # meanwhile is queued behind this handshake's answer, never lost.
        self.streams[run_id] = stream
        if older is not None and older is not stream:
            if admission.took_over_from is not None and "takeover_keeps_old" in self._faults:
                pass  # the fault: the old writer's stream stays open
            elif admission.took_over_from is not None or older.writer != stream.writer:
                # Another writer (a takeover) or a newer epoch (a restored copy)
                # has the run: the old writer is refused from now on.
                text = (
                    f"{WRITER_FENCED}: {stream.writer} has run {run_id} now; "
                    f"{older.writer or 'a writer with no id'} no longer writes it"
                )
                older.command(_End(grpc.StatusCode.FAILED_PRECONDITION, text))
            elif "keep_older" not in self._faults:
                logger.info(
                    "run %s: a newer stream from %s ends the older one", run_id, stream.peer
                )
                older.command(
                    _End(grpc.StatusCode.ABORTED, "superseded by a newer stream for the run")
                )
        await self._answer_handshake(stream, context)

    async def _admit(
        self,
        stream: EngineStream,
        msg: pb.UpMessage,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> Admission:
        """Decide the handshake's writer (the store's ``admit``); abort the call when refused."""
        run_id = msg.run_id
        hello = msg.handshake
        writer = Writer(hello.writer_id, int(hello.writer_epoch))
        if "no_fencing" in self._faults:
            stream.writer = Writer("", 0)  # every writer is the run's; nothing is fenced
            return Admission("accepted")
        admission = await self.store_call(
            self._store.admit, run_id, writer, take_over=hello.take_over
        )
        if admission.verdict == "completed" and "forget_completion" in self._faults:
            admission = Admission("accepted")
        if admission.verdict == "unknown_run":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if admission.verdict == "completed":
            logger.info("run %s: handshake refused, run completed", run_id)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, completed_text(admission.completed_by)
            )
        if admission.verdict != "accepted":
            text = refusal_text(run_id, writer, admission)
            logger.warning("run %s: handshake from %s refused: %s", run_id, stream.peer, text)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, text)
        if admission.took_over_from is not None:
            logger.warning(
                "run %s: %s from %s took the run over from %s (recorded in the store); "
                "the old writer is refused from now on",
                run_id,
                writer,
                stream.peer,
                admission.took_over_from,
            )
        stream.writer = writer
        return admission

    async def _fence(
        self,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
        run_id: str,
        writer: Writer,
        owner: Writer | None,
    ) -> None:
        """End the call of a writer that no longer owns the run (FAILED_PRECONDITION)."""
        text = f"{WRITER_FENCED}: {writer} no longer owns run {run_id}; {owner} does"
        logger.warning("run %s: %s", run_id, text)
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, text)

    async def _answer_handshake(
        self, stream: EngineStream, context: aio.ServicerContext[pb.UpMessage, pb.DownMessage]
    ) -> None:
        run_id = stream.run_id
        assert run_id is not None
        state = await self.store_call(self._store.run_state, run_id)
        if state is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if state.completed and "forget_completion" not in self._faults:
            logger.info("run %s: handshake refused, run completed", run_id)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, completed_text(state.completed_by)
            )
        stream.h = max(stream.h, state.h)
        if "answer_ahead" in self._faults:
            stream.send(_ack(stream.h + 1))
        elif self._ack_handshakes:
            if self._resume_points:
                # Sent at once: the answer carries the point of the h it names.
                stream.unacked = 0
                stream.cancel_idle()
                stream.send(_resume_ack(stream.h, state), delay_s=self._ack_delay_s)
            else:
                self._send_ack(stream)
        # Re-sent after every handshake; the fault sends them on a run's first only.
        resend = "no_resend" not in self._faults or run_id not in self._answered
        self._answered.add(run_id)
        if state.stop_reason is not None and resend:
            stream.send(pb.DownMessage(stop=pb.Stop(reason=state.stop_reason)))
        for decision in state.decisions if resend else ():
            stream.send(_decision_message(decision))
        logger.info(
            "run %s: handshake from %s, h=%d (stop=%s, %d decisions re-sent)",
            run_id,
            stream.peer,
            state.h,
            state.stop_reason,
            len(state.decisions),
        )

    async def _on_result(
        self,
        stream: EngineStream,
        seq: int,
        kind: str,
        result: AcceptResult,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> None:
        run_id = stream.run_id
        if result.outcome == "applied":
            stream.h = max(stream.h, result.h)
            logger.debug("run %s: applied seq %d (%s)", run_id, seq, kind)
        elif result.outcome == "duplicate":
            if "duplicate_unacked" in self._faults:
                return
            stream.h = max(stream.h, result.h)
            if result.differs:
                logger.warning(
                    "run %s: duplicate seq %d (%s) differs from the applied message",
                    run_id,
                    seq,
                    kind,
                )
            else:
                logger.debug("run %s: duplicate seq %d (h=%d)", run_id, seq, result.h)
        elif result.outcome == "gap":
            logger.warning("run %s: gap: expected seq %d, got seq %d", run_id, result.expected, seq)
            if "gap_text" in self._faults:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"out of order: {seq}")
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"expected seq {result.expected}, got seq {seq}",
            )
        elif result.outcome == "fenced":
            await self._fence(context, run_id or "", stream.writer or Writer("", 0), result.owner)
        elif result.outcome == "completed" and "forget_completion" in self._faults:
            stream.h = max(stream.h, seq)  # taken as if the run went on
        elif result.outcome == "completed":
            if kind == "done":
                details = f"second Done at seq {seq}: the run completed at seq {result.h}"
            else:
                details = RUN_COMPLETED
            logger.warning("run %s: %s at seq %d after the run's Done", run_id, kind, seq)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, details)
        else:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if result.decision is not None:
            # A repeated request id gets the stored decision again.
            stream.send(_decision_message(result.decision))
        if kind == "done":
            logger.info("run %s: done at seq %d (%s)", run_id, seq, result.outcome)
            if "done_ack_late" in self._faults:
                stream.send(_ack(stream.h), delay_s=_LATE_DONE_ACK_S)
                return
            self._send_ack(stream)
            return
        if "ack_ahead" in self._faults:
            stream.send(_ack(stream.h + 1))
            return
        stream.unacked += 1
        if stream.unacked >= self._ack_every:
            self._send_ack(stream)
        else:
            stream.arm_idle(self._ack_idle_s)

    def _send_ack(self, stream: EngineStream) -> None:
        """Ack everything the stream knows committed (``stream.h``), after ``ack_delay_ms``."""
        stream.unacked = 0
        stream.cancel_idle()
        stream.send(_ack(stream.h), delay_s=self._ack_delay_s)
