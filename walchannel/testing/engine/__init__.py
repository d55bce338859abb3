"""LocalEngine: a real ``grpc.aio`` engine on loopback that fulfils every engine duty.

It serves ``/EngineChannel/Open`` on ``127.0.0.1`` (port 0 unless told) over
an :class:`~walchannel.testing.store.EngineStore`, in memory or a SQLite
file shared by several engine processes, and answers ``GET /grpc-address``
on its own HTTP discovery port. This module is the engine's lifecycle and
controls (start, kill, replace, stop, register_run, Stop, decisions, budget
updates, read-outs); the handling of each stream, with the duties it
fulfils (SPEC "Wire contract", "Engine duties the client relies on"), is
:mod:`walchannel.testing.servicer` (the engine owns one
:class:`~walchannel.testing.servicer.EngineServicer` and registers it with
each gRPC server it starts); the process form is
:mod:`walchannel.testing.engine.__main__`::

    python -m walchannel.testing.engine --store FILE [--grpc-port P]
        [--ack-every N] [--no-heartbeat-acks]
    python -m walchannel.testing.engine register --store FILE --run-id R --token-env VAR
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Literal, TypeVar

import grpc
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from walchannel._logging import get_logger
from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.testing._http import DiscoveryServer
from walchannel.testing.servicer import RUN_COMPLETED, EngineServicer, wait_finished
from walchannel.testing.store import EngineStore, Takeover, Writer

__all__ = [
    "PERMISSIVE_PING_OPTIONS",
    "RUN_COMPLETED",
    "STRICT_PING_OPTIONS",
    "LocalEngine",
    "PingPolicy",
]

logger = get_logger(__name__)
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

#: How long stop() lets gRPC finish calls before cancelling them (seconds).
_STOP_GRACE_S: Final = 2.0
# How long end_streams/kill/stop wait for a handler to finish (seconds).
_END_WAIT_S: Final = 5.0
_NEW_PORT_ATTEMPTS: Final = 10


def _check_int(name: str, value: object, low: int, *, or_none: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int >= ``low`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        also = " or None" if or_none else ""
        raise ValueError(f"{name} must be an int >= {low}{also}, got {value!r}")


class LocalEngine:
    """A real ``grpc.aio`` engine on loopback (its duties: :mod:`walchannel.testing.servicer`).

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
        resume_points: keep the run's resume point and announce it in every
            handshake's answer (False: an engine without the duty, as before
            it; SPEC "The engine keeps the resume point").
        server_credentials: serve TLS with these, else plaintext.
        ping_policy: ``"permissive"`` (frequent client pings allowed) or
            ``"strict"`` (gRPC's strict server settings: fast pings get
            GOAWAY ``too_many_pings``).
        reject_tokens_for_handshakes: refuse the token (UNAUTHENTICATED) of
            this many handshakes after :meth:`start` and after each
            :meth:`replace`, like a replacement engine that does not know the
            run yet (a count, not a time: the same on a loaded machine).
        grpc_port: the port :meth:`start` binds (0: any free port);
            :meth:`replace` always takes a new free port.
        http_port: the discovery HTTP port (0: any free port; None: no
            discovery server, :attr:`http_addr` then raises).
        max_receive_message_bytes: the largest up-message the server
            accepts (``grpc.max_receive_message_length``, bytes, > 0; None:
            gRPC's default, 4 MiB). A larger one ends the stream with
            RESOURCE_EXHAUSTED "Received message larger than max (N vs. M)",
            as an engine with a smaller limit than the client's does.
        bdp_probe: let gRPC grow the HTTP/2 flow-control window from its
            bandwidth-delay probes (gRPC's default): the client's gRPC then
            takes megabytes of messages ahead of a slow link. False keeps
            the window fixed (``grpc.http2.bdp_probe`` 0), as some engines
            do: a client's write then waits until the message before it has
            crossed the link.
        faults: names from :data:`~walchannel.testing.servicer.FAULTS`, each
            a duty this engine breaks on purpose (never for a real run: for
            proving that ``walchannel conformance`` catches it).

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
        resume_points: bool = True,
        server_credentials: grpc.ServerCredentials | None = None,
        ping_policy: PingPolicy = "permissive",
        reject_tokens_for_handshakes: int = 0,
        grpc_port: int = 0,
        http_port: int | None = 0,
        max_receive_message_bytes: int | None = None,
        bdp_probe: bool = True,
        faults: Iterable[str] = (),
    ) -> None:
        if isinstance(ack_every, bool) or not isinstance(ack_every, int) or ack_every < 1:
            raise ValueError(f"ack_every must be an int >= 1, got {ack_every!r}")
        if not ack_idle_ms > 0:
            raise ValueError(f"ack_idle_ms must be > 0, got {ack_idle_ms!r}")
        if not ack_delay_ms >= 0:
            raise ValueError(f"ack_delay_ms must be >= 0, got {ack_delay_ms!r}")
        _check_int("reject_tokens_for_handshakes", reject_tokens_for_handshakes, 0)
        if ping_policy not in ("permissive", "strict"):
            raise ValueError(f"ping_policy must be 'permissive' or 'strict', got {ping_policy!r}")
        for name, port in (("grpc_port", grpc_port), ("http_port", http_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port!r}")
        self._credentials = server_credentials
        self._ping_policy: PingPolicy = ping_policy
        self._reject_handshakes = reject_tokens_for_handshakes
        if max_receive_message_bytes is not None:
            _check_int("max_receive_message_bytes", max_receive_message_bytes, 1, or_none=True)
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._max_receive = max_receive_message_bytes
        if not isinstance(bdp_probe, bool):
            raise ValueError(f"bdp_probe must be a bool, got {bdp_probe!r}")
        self._bdp_probe = bdp_probe
        self._store = EngineStore(store_path)
        self._store_path = store_path
        # One worker: this engine's transactions run in order, off the event loop.
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="walchannel-engine-store"
        )
        self._server: aio.Server | None = None
        self._http: DiscoveryServer | None = None
        self._grpc_addr: str | None = None
        self._used_ports: set[int] = set()
        # Serves every call of every gRPC server this engine starts.
        self._servicer = EngineServicer(
            self._store,
            self._executor,
            ack_every=ack_every,
            ack_idle_s=ack_idle_ms / 1000,
            ack_delay_s=ack_delay_ms / 1000,
            ack_handshakes=ack_handshakes,
            ack_heartbeats=ack_heartbeats,
            resume_points=resume_points,
            faults=frozenset(faults),
        )
        self._forget_owners = "forget_owner_on_restart" in faults
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
            RuntimeError: already started, stopped (an engine starts once: make
                a new ``LocalEngine`` on the same ``store_path`` and port), or
                the port cannot be bound.
        """
        if self._stopped:
            raise RuntimeError(
                "the engine was stopped and cannot start again: make a new LocalEngine"
                " (same store_path and grpc_port to stand in for this one)"
            )
        if self._started:
            raise RuntimeError("the engine was already started")
        self._started = True
        if self._forget_owners:
            self._store.forget_owners()  # the fault: owners lived in the dead engine's memory
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
        handlers = list(self._servicer.handlers)
        self._servicer.streams.clear()
        await server.stop(None)
        await wait_finished(handlers, _END_WAIT_S)
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
        handlers = self._servicer.end_all(grpc.StatusCode.UNAVAILABLE, "engine stopping")
        await wait_finished(handlers, 1.0)
        server, self._server = self._server, None
        if server is not None:
            # A grace, so gRPC says goodbye with a NO_ERROR GOAWAY once the
            # ended calls are done, as a well-behaved engine does; without one
            # it cancels them with an INTERNAL_ERROR GOAWAY, which the
            # client's C-core prints to stderr ("Got goaway [2]").
            await server.stop(_STOP_GRACE_S)
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
            if not self._bdp_probe:
                limit += (("grpc.http2.bdp_probe", 0),)
            server = aio.server(options=[*_BASE_OPTIONS, *ping, *limit])
            pb_grpc.add_EngineChannelServicer_to_server(self._servicer, server)
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
        self._servicer.reject_handshakes = self._reject_handshakes
        await self._servicer.store_call(self._store.record_engine, self._grpc_addr, os.getpid())
        logger.info("engine serving on %s (%s)", self._grpc_addr, self._ping_policy)

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
        clean = code is None or code is grpc.StatusCode.OK
        text = details if details is not None else f"stream ended by the local engine ({code})"
        stream = self._servicer.end_stream(run_id, None if clean else code, text)
        if stream is None:
            return False
        await wait_finished([stream], _END_WAIT_S)
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
            await self._servicer.store_call(self._store.set_stop, run_id, reason)
        except KeyError:
            raise ValueError(f"run {run_id!r} is not registered") from None
        logger.info("run %s: stop issued (%s)", run_id, reason)
        return self._servicer.push(run_id, pb.DownMessage(stop=pb.Stop(reason=reason)))

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
            decision = await self._servicer.store_call(
                self._store.set_decision, run_id, request_id, approved, reason
            )
        except KeyError:
            raise ValueError(f"run {run_id!r} is not registered") from None
        logger.info("run %s: approval %s decided (approved=%s)", run_id, request_id, approved)
        return self._servicer.push_decision(run_id, decision)

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
        if await self._servicer.store_call(self._store.run_state, run_id) is None:
            raise ValueError(f"run {run_id!r} is not registered")
        struct = Struct()
        try:
            struct.update(dict(details or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"budget update details are not JSON-like: {exc}") from None
        return self._servicer.push(
            run_id, pb.DownMessage(budget_update=pb.BudgetUpdate(message=message, details=struct))
        )

    # -- read-outs (sync) ------------------------------------------------------

    def _read(self, read: Callable[[EngineStore, str], _T], run_id: str) -> _T:
        """``read`` on the live store; after ``stop()``, on the file (opened for this read).

        Raises:
            StoreClosedError: stopped, and the store was in memory (gone).
        """
        if not self._store.closed or self._store_path is None:
            return read(self._store, run_id)
        store = EngineStore(self._store_path)
        try:
            return read(store, run_id)
        finally:
            store.close()

    def accepted(self, run_id: str) -> list[int]:
        """The applied seqs of the run, ascending."""
        return self._read(EngineStore.accepted, run_id)

    def duplicates(self, run_id: str) -> int:
        """How many duplicates (``seq <= h``) the run received."""
        return self._read(EngineStore.duplicates, run_id)

    def gaps(self, run_id: str) -> list[tuple[int, int]]:
        """The run's recorded gaps as ``(expected, received)``, oldest first."""
        return self._read(EngineStore.gaps, run_id)

    def bodies(self, run_id: str) -> list[dict[str, Any]]:
        """The applied messages as ``{"seq", "kind", "body"}`` (shapes of ``wire.body_of``)."""
        return self._read(EngineStore.bodies, run_id)

    def done(self, run_id: str) -> dict[str, Any] | None:
        """The applied ``Done`` as ``{"seq", "status", "findings", "coverage", "exit_reason"}``."""
        return self._read(EngineStore.done, run_id)

    def owner(self, run_id: str) -> Writer | None:
        """The run's owner, the writer (id, epoch) whose handshakes it accepts; None: none yet."""
        return self._read(EngineStore.owner, run_id)

    def takeovers(self, run_id: str) -> list[Takeover]:
        """The run's recorded takeovers (from, to, when), oldest first."""
        return self._read(EngineStore.takeovers, run_id)
