"""One raw ``/EngineChannel/Open`` call, as the conformance kit drives it.

The kit writes up-messages itself, with the generated stubs, not through
``GrpcEngineChannel``: the channel tolerates (and hides) what an engine does
wrong, and a check must see it. A reader task keeps every down message and
the call's final status, so a check can wait for either with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Final

import grpc
from google.protobuf import struct_pb2
from grpc import aio

from walchannel._proto import engine_channel_pb2 as pb

__all__ = ["METHOD", "Ended", "Probe", "Target", "open_channel"]

#: The engine's one method (SPEC "Wire contract").
METHOD: Final = "/EngineChannel/Open"


@dataclass(frozen=True)
class Target:
    """Where the engine is and how to dial it.

    Attributes:
        grpc_addr: ``host:port``.
        credentials: TLS channel credentials, or None for plaintext.
        server_name: the name the engine's certificate holds (TLS), or None.
    """

    grpc_addr: str
    credentials: grpc.ChannelCredentials | None = None
    server_name: str | None = None


def open_channel(target: Target) -> aio.Channel:
    """A new grpc.aio channel to ``target`` (plaintext, or TLS with the name checked)."""
    options: list[tuple[str, str | int]] = [("grpc.enable_retries", 0)]
    if target.server_name is not None:
        options.append(("grpc.ssl_target_name_override", target.server_name))
    if target.credentials is None:
        return aio.insecure_channel(target.grpc_addr, options=options)
    return aio.secure_channel(target.grpc_addr, target.credentials, options=options)


@dataclass(frozen=True)
class Ended:
    """How a call ended: its status code and details."""

    code: grpc.StatusCode
    details: str

    def __str__(self) -> str:
        return f"{self.code.name} {self.details!r}"


class Probe:
    """One call of the engine's method for one run (use ``async with``).

    Args:
        target: the engine.
        run_id: the run every message names.
        token: the run's token (the call's bearer token; never shown).
    """

    def __init__(self, target: Target, run_id: str, token: str) -> None:
        self.run_id = run_id
        self._target = target
        self._token = token
        self._channel: aio.Channel | None = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._down: asyncio.Queue[pb.DownMessage | Ended] = asyncio.Queue()
        self.ended: Ended | None = None
        #: Every down message read so far, in order.
        self.seen: list[pb.DownMessage] = []
        #: The highest seq written on this call (0: none).
        self.top = 0

    async def __aenter__(self) -> Probe:
        self._channel = open_channel(self._target)
        open_call = self._channel.stream_stream(
            METHOD,
            request_serializer=pb.UpMessage.SerializeToString,
            response_deserializer=pb.DownMessage.FromString,
        )
        self._call = open_call(metadata=(("authorization", f"Bearer {self._token}"),))
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._channel is not None:
            await self._channel.close()

    async def _read(self) -> None:
        call = self._call
        with contextlib.suppress(grpc.RpcError):  # the call failed: its status says how
            while True:
                msg = await call.read()
                if msg is aio.EOF:
                    break
                self.seen.append(msg)
                await self._down.put(msg)
        try:
            code, details = await call.code(), await call.details()
        except Exception as exc:  # the call was cancelled here
            code, details = grpc.StatusCode.CANCELLED, str(exc)
        self.ended = Ended(code, details or "")
        await self._down.put(self.ended)

    # -- up ----------------------------------------------------------------------------

    def _up(self, seq: int, **body: Any) -> pb.UpMessage:
        return pb.UpMessage(
            run_id=self.run_id, correlation_id=f"corr-{self.run_id}", seq=seq, **body
        )

    async def write(self, msg: pb.UpMessage) -> bool:
        """Write ``msg``; False when the call has ended (the engine ended it)."""
        try:
            await self._call.write(msg)
        except Exception:
            return False
        self.top = max(self.top, int(msg.seq))
        return True

    async def handshake(self, writer_id: str, epoch: int = 1, *, take_over: bool = False) -> bool:
        """Write a handshake (seq 0) naming the writer."""
        hello = pb.Handshake(
            connector_version="walchannel-conformance",
            harness_name="conformance",
            harness_version="1",
            writer_id=writer_id,
            writer_epoch=epoch,
            take_over=take_over,
        )
        return await self.write(self._up(0, handshake=hello))

    async def finding(self, seq: int, **fields: Any) -> bool:
        """Write a finding at ``seq`` whose fields are ``fields``."""
        struct = struct_pb2.Struct()
        struct.update(fields)
        return await self.write(self._up(seq, finding=pb.FindingDraft(fields=struct)))

    async def heartbeat(self) -> bool:
        """Write a heartbeat (seq 0)."""
        return await self.write(self._up(0, heartbeat=pb.Heartbeat(ts="2026-01-01T00:00:00Z")))

    async def done(self, seq: int, status: str = "completed") -> bool:
        """Write a ``Done`` at ``seq``."""
        return await self.write(
            self._up(seq, done=pb.Done(status=status, exit_reason="conformance"))
        )

    async def approval(self, seq: int, request_id: str) -> bool:
        """Write an ``ApprovalRequest`` at ``seq``."""
        request = pb.ApprovalRequest(request_id=request_id, action="conformance")
        return await self.write(self._up(seq, approval_request=request))

    async def half_close(self) -> None:
        """Half-close: no more up-messages."""
        with contextlib.suppress(Exception):
            await self._call.done_writing()

    # -- down --------------------------------------------------------------------------

    async def next(self, timeout_s: float) -> pb.DownMessage | Ended | None:
        """The next down message, the call's end, or None when nothing came in time."""
        try:
            return await asyncio.wait_for(self._down.get(), timeout_s)
        except TimeoutError:
            return None

    async def next_of(self, kind: str | None, timeout_s: float) -> pb.DownMessage | Ended | None:
        """The next down message with body ``kind`` (others skipped; None: skip every
        one, to wait for the end), the call's end, or None when nothing came in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            got = await self.next(max(0.0, deadline - loop.time()))
            if got is None or isinstance(got, Ended) or got.WhichOneof("body") == kind:
                return got

    async def ack(self, timeout_s: float) -> int | Ended | None:
        """The next ``Ack``'s seq (other bodies skipped), the call's end, or None in time."""
        got = await self.next_of("ack", timeout_s)
        return int(got.ack.seq) if isinstance(got, pb.DownMessage) else got

    async def ack_reaching(self, seq: int, timeout_s: float) -> list[int] | Ended | None:
        """Every ack until one reaches ``seq``: their seqs; the end; or None in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen: list[int] = []
        while True:
            got = await self.ack(max(0.0, deadline - loop.time()))
            if got is None or isinstance(got, Ended):
                return got
            seen.append(got)
            if got >= seq:
                return seen

    async def end(self, timeout_s: float) -> Ended | None:
        """Wait for the call's end (down messages skipped); None if it goes on."""
        got = await self.next_of(None, timeout_s)
        return got if isinstance(got, Ended) else None
