"""LocalEngine: a real ``grpc.aio`` engine on loopback that fulfils every engine duty.

It serves ``/EngineChannel/Open`` on ``127.0.0.1`` (port 0 unless told) over
an :class:`~walchannel.testing.store.EngineStore`, in memory or a SQLite
file shared by several engine processes, and answers ``GET /grpc-address``
on its own HTTP discovery port. The duties (SPEC "Wire contract", "Engine
duties the client relies on"):

- Auth: call metadata ``authorization: Bearer <token>``, compared by sha256
  with the registered hash; an unknown run or a bad token is
  UNAUTHENTICATED (the token is never echoed or logged).
- The first up-message is a handshake at seq 0, answered with ``Ack(h)``
  (``h`` = the highest seq the store holds for the run, 0 if none); a
  completed run fails FAILED_PRECONDITION "run completed". After every
  handshake the run's ``Stop`` (if issued) and every decision are re-sent.
- Heartbeats (seq 0) are answered with ``Ack(h)``.
- Data: ``seq == h + 1`` is applied, ``seq <= h`` is a duplicate (counted,
  acked, not applied), a higher seq is a gap (recorded; FAILED_PRECONDITION
  naming the expected seq). A repeated ``ApprovalRequest`` id is answered
  with the stored decision. ``Done`` completes the run and is acked at once;
  a second ``Done`` is a protocol error.
- Acks say only what the store committed: one per ``ack_every`` messages,
  and after ``ack_idle_ms`` without new messages if anything is unacked.
- One live stream per run per engine: a newer stream ends the older
  (ABORTED).

Each RPC handler owns one command queue, fed by a reader task (up-messages,
end of input) and by the engine (end with a status, push a down message,
timers), because an RPC can only be aborted from its own handler. Store
transactions run on one worker thread per engine, so two engines in one
process contend on the store file for real.

As processes (SPEC "Test doubles and the local engine")::

    python -m walchannel.testing.engine --store FILE [--grpc-port P]
        [--ack-every N] [--no-heartbeat-acks]
    python -m walchannel.testing.engine register --store FILE --run-id R --token-env VAR
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, ParamSpec, TypeVar

import grpc
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.testing._http import DiscoveryServer
from walchannel.testing.store import AcceptResult, Decision, EngineStore, StoreClosedError
from walchannel.wire import DATA_KINDS, body_of

__all__ = [
    "PERMISSIVE_PING_OPTIONS",
    "RUN_COMPLETED",
    "STRICT_PING_OPTIONS",
    "LocalEngine",
    "PingPolicy",
    "main",
]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

PingPolicy = Literal["permissive", "strict"]

#: Server options that let a client ping often (keepalive down to ~1 s), without strikes.
PERMISSIVE_PING_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
)
#: gRPC's own strict server settings: a client pinging faster than every
#: 5 minutes without data gets GOAWAY ``too_many_pings`` after 2 strikes.
STRICT_PING_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
    ("grpc.http2.max_ping_strikes", 2),
    ("grpc.keepalive_permit_without_calls", 0),
)
# No SO_REUSEPORT: a port bound by a live engine is never shared with another.
_BASE_OPTIONS: Final = (("grpc.so_reuseport", 0),)

#: The details of the FAILED_PRECONDITION that answers a completed run.
RUN_COMPLETED: Final = "run completed"

_UNAUTHENTICATED_DETAILS: Final = "unknown run or invalid token"
# Up-messages read ahead of the handler per stream (flow control stays with gRPC).
_READ_AHEAD: Final = 256
# How long end_streams/kill/stop wait for a handler to finish (seconds).
_END_WAIT_S: Final = 5.0
# Tolerance when deciding that a delayed message is due (seconds): asyncio
# may run a timer up to its clock resolution early.
_DUE_SLACK_S: Final = 0.001
_NEW_PORT_ATTEMPTS: Final = 10


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


def _ack(seq: int) -> pb.DownMessage:
    return pb.DownMessage(ack=pb.Ack(seq=seq))


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


class _Stream:
    """The state of one ``Open`` call: its command queue, outbox and ack cadence."""

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.run_id: str | None = None
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


class _Servicer(pb_grpc.EngineChannelServicer):
    """Hands each ``Open`` call to its engine."""

    def __init__(self, engine: LocalEngine) -> None:
        self._engine = engine

    async def Open(
        self,
        request_iterator: AsyncIterator[pb.UpMessage],
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> AsyncIterator[pb.DownMessage]:
        async for msg in self._engine._serve(request_iterator, context):
            yield msg


class LocalEngine:
    """A real ``grpc.aio`` engine on loopback (see the module doc for its duties).

    Args:
        store_path: a SQLite file shared with other engines (created if
            missing), or None for a private in-memory store.
        ack_every: send ``Ack(h)`` after every N received messages (>= 1).
        ack_idle_ms: also ack after this long without new messages if
            anything is unacked (milliseconds, > 0).
        ack_delay_ms: delay the sending of every ack by this long, to play a
            slow engine (milliseconds, >= 0); messages behind an ack wait too.
        ack_handshakes: answer handshakes with ``Ack(h)``.
        ack_heartbeats: answer heartbeats with ``Ack(h)``.
        server_credentials: serve TLS with these, else plaintext.
        ping_policy: ``"permissive"`` (frequent client pings allowed) or
            ``"strict"`` (gRPC's strict server settings: fast pings get
            GOAWAY ``too_many_pings``).
        reject_tokens_for_ms: reject every token (UNAUTHENTICATED) for this
            long after :meth:`start` and :meth:`replace`, like a replacement
            engine that does not know the run yet (milliseconds, >= 0).
        grpc_port: the port :meth:`start` binds (0: any free port);
            :meth:`replace` always takes a new free port.
        http_port: the discovery HTTP port (0: any free port; None: no
            discovery server, :attr:`http_addr` then raises).
        max_receive_message_bytes: the largest up-message the server
            accepts (``grpc.max_receive_message_length``, bytes, > 0; None:
            gRPC's default, 4 MiB). A larger one ends the stream with
            RESOURCE_EXHAUSTED "Received message larger than max (N vs. M)",
            as an engine with a smaller limit than the client's does.

    Raises:
        ValueError: a knob out of range.
        sqlite3.Error: the store file cannot be opened.

    SPEC "Test doubles and the local engine".
    """

    def __init__(
        self,
        store_path: str | os.PathLike[str] | None = None,
        *,
        ack_every: int = 1,
        ack_idle_ms: float = 50,
        ack_delay_ms: float = 0,
        ack_handshakes: bool = True,
        ack_heartbeats: bool = True,
        server_credentials: grpc.ServerCredentials | None = None,
        ping_policy: PingPolicy = "permissive",
        reject_tokens_for_ms: float = 0,
        grpc_port: int = 0,
        http_port: int | None = 0,
        max_receive_message_bytes: int | None = None,
    ) -> None:
        if isinstance(ack_every, bool) or not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be an int >= 1, got {ack_every!r}")
        if not ack_idle_ms > 0:
            raise ValueError(f"ack_idle_ms must be > 0, got {ack_idle_ms!r}")
        if not ack_delay_ms >= 0:
            raise ValueError(f"ack_delay_ms must be >= 0, got {ack_delay_ms!r}")
        if not reject_tokens_for_ms >= 0:
            raise ValueError(f"reject_tokens_for_ms must be >= 0, got {reject_tokens_for_ms!r}")
        if ping_policy not in ("permissive", "strict"):
            raise ValueError(f"ping_policy must be 'permissive' or 'strict', got {ping_policy!r}")
        for name, port in (("grpc_port", grpc_port), ("http_port", http_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port!r}")
        self._ack_every = ack_every
        self._ack_idle_s = ack_idle_ms / 1000
        self._ack_delay_s = ack_delay_ms / 1000
        self._ack_handshakes = ack_handshakes
        self._ack_heartbeats = ack_heartbeats
        self._credentials = server_credentials
        self._ping_policy: PingPolicy = ping_policy
        self._reject_s = reject_tokens_for_ms / 1000
        if max_receive_message_bytes is not None and (
            isinstance(max_receive_message_bytes, bool)
            or not isinstance(max_receive_message_bytes, int)
            or max_receive_message_bytes < 1
        ):
            raise ValueError(
                "max_receive_message_bytes must be an int >= 1 or None, "
                f"got {max_receive_message_bytes!r}"
            )
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._max_receive = max_receive_message_bytes
        self._store = EngineStore(store_path)
        # One worker: this engine's transactions run in order, off the event loop.
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="walchannel-engine-store"
        )
        self._server: aio.Server | None = None
        self._http: DiscoveryServer | None = None
        self._grpc_addr: str | None = None
        self._used_ports: set[int] = set()
        self._reject_until = 0.0
        self._streams: dict[str, _Stream] = {}
        self._handlers: set[_Stream] = set()
        self._started = False
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------

    @property
    def grpc_addr(self) -> str:
        """The engine's current gRPC address, ``127.0.0.1:PORT``.

        After :meth:`kill` it is the dead address until :meth:`replace`.

        Raises:
            RuntimeError: not started.
        """
        if self._grpc_addr is None:
            raise RuntimeError("the engine is not started")
        return self._grpc_addr

    @property
    def http_addr(self) -> str:
        """The discovery base URL, ``http://127.0.0.1:PORT``.

        Raises:
            RuntimeError: not started, or built with ``http_port=None``.
        """
        if self._http is None:
            raise RuntimeError("the engine has no discovery server (not started or http_port=None)")
        return self._http.http_addr

    @property
    def store(self) -> EngineStore:
        """The engine's store."""
        return self._store

    @property
    def serving(self) -> bool:
        """True while the gRPC server is up (not yet killed or stopped)."""
        return self._server is not None

    async def start(self) -> None:
        """Start the gRPC server (and the discovery server) and record the address in the store.

        Raises:
            RuntimeError: already started, or the port cannot be bound.
        """
        if self._started:
            raise RuntimeError("the engine was already started")
        self._started = True
        await self._start_grpc(self._grpc_port)
        if self._http_port is not None:
            # Answers this engine's own current address (read per request).
            self._http = DiscoveryServer(lambda: self._grpc_addr, port=self._http_port)
            logger.info("engine discovery on %s", self._http.http_addr)

    async def kill(self) -> None:
        """Drop every stream and close the gRPC port at once, like a dead task.

        The store and the discovery server stay; discovery keeps answering
        the dead address until :meth:`replace`. Idempotent.
        """
        server, self._server = self._server, None
        if server is None:
            return
        handlers = list(self._handlers)
        self._streams.clear()
        await server.stop(None)
        await self._wait_finished(handlers)
        logger.info("engine on %s killed", self._grpc_addr)

    async def replace(self) -> None:
        """Start a new gRPC server on a new port over the same store (killing a live one first).

        Discovery answers the new address from then on.

        Raises:
            RuntimeError: not started, or already stopped.
        """
        if not self._started or self._stopped:
            raise RuntimeError("replace() needs a started, not stopped engine")
        await self.kill()
        await self._start_grpc(0)

    async def stop(self) -> None:
        """Shut everything down: streams (UNAVAILABLE), gRPC, discovery, the store. Idempotent.

        An in-memory store's contents are gone after this.
        """
        if self._stopped:
            return
        self._stopped = True
        handlers = list(self._handlers)
        for stream in handlers:
            stream.command(_End(grpc.StatusCode.UNAVAILABLE, "engine stopping"))
        await self._wait_finished(handlers, timeout_s=1.0)
        server, self._server = self._server, None
        self._streams.clear()
        if server is not None:
            await server.stop(None)
        if self._http is not None:
            await asyncio.to_thread(self._http.close)
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        self._store.close()
        logger.info("engine stopped")

    async def __aenter__(self) -> LocalEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _start_grpc(self, port: int) -> None:
        ping = PERMISSIVE_PING_OPTIONS if self._ping_policy == "permissive" else STRICT_PING_OPTIONS
        for _ in range(_NEW_PORT_ATTEMPTS):
            limit: tuple[tuple[str, int], ...] = ()
            if self._max_receive is not None:
                limit = (("grpc.max_receive_message_length", self._max_receive),)
            server = aio.server(options=[*_BASE_OPTIONS, *ping, *limit])
            pb_grpc.add_EngineChannelServicer_to_server(_Servicer(self), server)
            bind = f"127.0.0.1:{port}"
            try:
                if self._credentials is not None:
                    bound = server.add_secure_port(bind, self._credentials)
                else:
                    bound = server.add_insecure_port(bind)
            except RuntimeError as exc:
                raise RuntimeError(f"cannot bind the engine to {bind}: {exc}") from None
            if bound == 0:
                raise RuntimeError(f"cannot bind the engine to {bind}")
            if port == 0 and bound in self._used_ports:
                # replace() promises a NEW port: the kernel handed back an old one.
                await server.stop(None)
                continue
            break
        else:
            raise RuntimeError("no new port for the engine")
        await server.start()
        self._used_ports.add(bound)
        self._server = server
        self._grpc_addr = f"127.0.0.1:{bound}"
        self._reject_until = time.monotonic() + self._reject_s
        await self._store_call(self._store.record_engine, self._grpc_addr, os.getpid())
        logger.info("engine serving on %s (%s)", self._grpc_addr, self._ping_policy)

    @staticmethod
    async def _wait_finished(streams: Sequence[_Stream], timeout_s: float = _END_WAIT_S) -> None:
        if not streams:
            return
        waits = [asyncio.ensure_future(s.finished.wait()) for s in streams]
        _, pending = await asyncio.wait(waits, timeout=timeout_s)
        for fut in pending:
            fut.cancel()

    # -- control -------------------------------------------------------------

    def register_run(self, run_id: str, run_token: str) -> None:
        """Register a run with its token (stored as sha256 only). Sync.

        Raises:
            ValueError: empty ``run_id`` or ``run_token``.
        """
        self._store.register_run(run_id, run_token)

    async def end_streams(
        self, run_id: str, code: grpc.StatusCode | None, *, details: str | None = None
    ) -> bool:
        """End the run's live stream on this engine with a gRPC status.

        Args:
            run_id: the run.
            code: the status; ``grpc.StatusCode.OK`` or None is a bare,
                clean end of stream.
            details: the status details (default names the code).

        Returns:
            True when a live stream was ended (waited for, up to 5 s).
        """
        stream = self._streams.pop(run_id, None)
        if stream is None:
            return False
        clean = code is None or code is grpc.StatusCode.OK
        text = details if details is not None else f"stream ended by the local engine ({code})"
        stream.command(_End(None if clean else code, text))
        await self._wait_finished([stream])
        logger.info("run %s: stream ended by the test with %s", run_id, code)
        return True

    async def send_stop(self, run_id: str, reason: str) -> bool:
        """Issue the run's ``Stop``: stored (re-sent after every handshake) and sent now.

        Args:
            run_id: a registered run.
            reason: ``"deadline"``, ``"operator"`` or ``"failure"`` (not checked).

        Returns:
            True when a live stream on this engine got it now.

        Raises:
            ValueError: unknown run.
        """
        try:
            await self._store_call(self._store.set_stop, run_id, reason)
        except KeyError:
            raise ValueError(f"run {run_id!r} is not registered") from None
        logger.info("run %s: stop issued (%s)", run_id, reason)
        return self._push(run_id, pb.DownMessage(stop=pb.Stop(reason=reason)))

    async def decide_approval(
        self, run_id: str, request_id: str, approved: bool, reason: str = ""
    ) -> bool:
        """Decide an approval request: stored (re-sent after every handshake) and sent now.

        Returns:
            True when a live stream on this engine got it now.

        Raises:
            ValueError: unknown run.
        """
        try:
            decision = await self._store_call(
                self._store.set_decision, run_id, request_id, approved, reason
            )
        except KeyError:
            raise ValueError(f"run {run_id!r} is not registered") from None
        logger.info("run %s: approval %s decided (approved=%s)", run_id, request_id, approved)
        return self._push(run_id, _decision_message(decision))

    async def send_budget_update(
        self, run_id: str, message: str, details: Mapping[str, Any] | None = None
    ) -> bool:
        """Send an advisory ``BudgetUpdate`` to the run's live stream (not stored).

        Args:
            run_id: a registered run.
            message: the text.
            details: a JSON-like mapping, sent as a Struct.

        Returns:
            True when a live stream on this engine got it.

        Raises:
            ValueError: unknown run, or ``details`` a Struct cannot hold.
        """
        if await self._store_call(self._store.run_state, run_id) is None:
            raise ValueError(f"run {run_id!r} is not registered")
        struct = Struct()
        try:
            struct.update(dict(details or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"budget update details are not JSON-like: {exc}") from None
        return self._push(
            run_id, pb.DownMessage(budget_update=pb.BudgetUpdate(message=message, details=struct))
        )

    def _push(self, run_id: str, msg: pb.DownMessage) -> bool:
        stream = self._streams.get(run_id)
        if stream is None:
            return False
        stream.command(_Push(msg))
        return True

    # -- read-outs (sync) ------------------------------------------------------

    def accepted(self, run_id: str) -> list[int]:
        """The applied seqs of the run, ascending."""
        return self._store.accepted(run_id)

    def duplicates(self, run_id: str) -> int:
        """How many duplicates (``seq <= h``) the run received."""
        return self._store.duplicates(run_id)

    def gaps(self, run_id: str) -> list[tuple[int, int]]:
        """The run's recorded gaps as ``(expected, received)``, oldest first."""
        return self._store.gaps(run_id)

    def bodies(self, run_id: str) -> list[dict[str, Any]]:
        """The applied messages as ``{"seq", "kind", "body"}`` (shapes of ``wire.body_of``)."""
        return self._store.bodies(run_id)

    def done(self, run_id: str) -> dict[str, Any] | None:
        """The applied ``Done`` as ``{"seq", "status", "findings", "coverage", "exit_reason"}``."""
        return self._store.done(run_id)

    # -- serving -------------------------------------------------------------

    async def _store_call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def _serve(
        self,
        requests: AsyncIterator[pb.UpMessage],
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> AsyncIterator[pb.DownMessage]:
        """The body of one ``Open`` call: run commands, yield due down messages."""
        stream = _Stream(context.peer())
        token = _bearer_token(context.invocation_metadata())
        if token is None:
            logger.info("stream from %s: no bearer token", stream.peer)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        self._handlers.add(stream)
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
                    stream.closing = True
                    if stream.unacked:
                        self._send_ack(stream)
                for msg in stream.take_due():
                    yield msg
                if stream.closing and stream.outbox_empty:
                    return
        finally:
            stream.close()
            self._handlers.discard(stream)
            if stream.run_id is not None and self._streams.get(stream.run_id) is stream:
                del self._streams[stream.run_id]

    async def _on_up(
        self,
        stream: _Stream,
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
                await self._answer_handshake(stream, context)
            elif self._ack_heartbeats:
                h = await self._store_call(self._store.high_water, run_id)
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
        result = await self._store_call(self._store.accept, run_id, seq, kind, body)
        await self._on_result(stream, seq, kind, result, context)

    async def _open_run(
        self,
        stream: _Stream,
        msg: pb.UpMessage,
        kind: str,
        token: str,
        context: aio.ServicerContext[pb.UpMessage, pb.DownMessage],
    ) -> None:
        """Authenticate the stream's first message, which must be the handshake."""
        run_id = msg.run_id
        if time.monotonic() < self._reject_until:
            logger.info("run %s: token rejected (this engine does not know runs yet)", run_id)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if not await self._store_call(self._store.check_token, run_id, token):
            logger.warning("run %s: unknown run or invalid token from %s", run_id, stream.peer)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if kind != "handshake" or msg.seq != 0:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the first message must be a handshake at seq 0, got {kind or 'no body'}"
                f" at seq {msg.seq}",
            )
        stream.run_id = run_id
        older = self._streams.get(run_id)
        # Register before reading the run's state: a Stop or decision issued
        # meanwhile is queued behind this handshake's answer, never lost.
        self._streams[run_id] = stream
        if older is not None and older is not stream:
            logger.info("run %s: a newer stream from %s ends the older one", run_id, stream.peer)
            older.command(_End(grpc.StatusCode.ABORTED, "superseded by a newer stream for the run"))
        await self._answer_handshake(stream, context)

    async def _answer_handshake(
        self, stream: _Stream, context: aio.ServicerContext[pb.UpMessage, pb.DownMessage]
    ) -> None:
        run_id = stream.run_id
        assert run_id is not None
        state = await self._store_call(self._store.run_state, run_id)
        if state is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)
        if state.completed:
            logger.info("run %s: handshake refused, run completed", run_id)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, RUN_COMPLETED)
        stream.h = max(stream.h, state.h)
        if self._ack_handshakes:
            self._send_ack(stream)
        if state.stop_reason is not None:
            stream.send(pb.DownMessage(stop=pb.Stop(reason=state.stop_reason)))
        for decision in state.decisions:
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
        stream: _Stream,
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
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"expected seq {result.expected}, got seq {seq}",
            )
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
            self._send_ack(stream)
            return
        stream.unacked += 1
        if stream.unacked >= self._ack_every:
            self._send_ack(stream)
        else:
            stream.arm_idle(self._ack_idle_s)

    def _send_ack(self, stream: _Stream) -> None:
        """Ack everything the stream knows committed (``stream.h``), after ``ack_delay_ms``."""
        stream.unacked = 0
        stream.cancel_idle()
        stream.send(_ack(stream.h), delay_s=self._ack_delay_s)


# -- the process form ----------------------------------------------------------


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.engine",
        description=(
            "Run a local engine on a store file shared with other engine processes;"
            " print one JSON line {grpc_addr, pid} once serving; stop on SIGTERM."
            " Subcommand 'register' registers a run."
        ),
        epilog=(
            "example: python -m walchannel.testing.engine --store /tmp/engine.sqlite3\n"
            "         python -m walchannel.testing.engine register --store /tmp/engine.sqlite3"
            " --run-id r1 --token-env RUN_TOKEN"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: any free)")
    parser.add_argument("--ack-every", type=int, default=1, help="ack every N messages")
    parser.add_argument("--no-heartbeat-acks", action="store_true", help="do not answer heartbeats")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="WARNING",
        help="logging level (to stderr)",
    )
    return parser


def _register_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walchannel.testing.engine register",
        description=(
            "Register a run in an engine store; the token is read from an environment"
            " variable, never from the command line."
        ),
        epilog=(
            "example: RUN_TOKEN=... python -m walchannel.testing.engine register"
            " --store /tmp/engine.sqlite3 --run-id r1 --token-env RUN_TOKEN"
        ),
    )
    parser.add_argument("--store", required=True, help="the engine store (SQLite file)")
    parser.add_argument("--run-id", required=True, help="the run to register")
    parser.add_argument(
        "--token-env", required=True, help="name of the environment variable holding the token"
    )
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: an exit code, not an exception
        return exc.code if isinstance(exc.code, int) else 2


def _write_line(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine process form (see the module doc).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        0 after a clean shutdown or registration; 2 on bad usage or a
        missing token variable.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["register"]:
        parsed = _parse(_register_parser(), args[1:])
        if isinstance(parsed, int):
            return parsed
        token = os.environ.get(parsed.token_env, "")
        if not token:
            sys.stderr.write(f"environment variable {parsed.token_env} is not set or empty\n")
            return 2
        with EngineStore(parsed.store) as store:
            store.register_run(parsed.run_id, token)
        return 0
    parsed = _parse(_serve_parser(), args)
    if isinstance(parsed, int):
        return parsed
    if parsed.ack_every < 1:
        sys.stderr.write("--ack-every must be >= 1\n")
        return 2
    logging.basicConfig(level=parsed.log_level, stream=sys.stderr)
    return asyncio.run(_serve_process(parsed))


async def _serve_process(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine = LocalEngine(
        args.store,
        ack_every=args.ack_every,
        ack_heartbeats=not args.no_heartbeat_acks,
        grpc_port=args.grpc_port,
        http_port=None,
    )
    try:
        await engine.start()
        _write_line({"grpc_addr": engine.grpc_addr, "pid": os.getpid()})
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
