"""A scriptable, misbehaving engine: a real grpc.aio server whose answers a test writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from walchannel import GrpcChannelConfig
from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.testing.plugin import local_channel_config

Script = Callable[["RogueStream"], Awaitable[None]]


@dataclass(frozen=True)
class _Abort:
    code: grpc.StatusCode
    details: str


class RogueStream:
    """One Open call: read what the client sends, answer what the script says."""

    def __init__(self, requests: AsyncIterator[pb.UpMessage], context: Any) -> None:
        self.requests = requests
        self.context = context
        self.out: asyncio.Queue[pb.DownMessage | bytes | _Abort | None] = asyncio.Queue()
        self.received: list[pb.UpMessage] = []

    async def read(self) -> pb.UpMessage | None:
        try:
            msg = await self.requests.__anext__()
        except StopAsyncIteration:
            return None
        self.received.append(msg)
        return msg

    def send(self, msg: pb.DownMessage) -> None:
        self.out.put_nowait(msg)

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are: what a broken encoder puts on the wire."""
        self.out.put_nowait(data)

    def ack(self, seq: int) -> None:
        self.send(pb.DownMessage(ack=pb.Ack(seq=seq)))

    def end(self) -> None:
        self.out.put_nowait(None)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with this status, after the messages queued before it; never returns.

        The handler's own task sends the status: one sent from the script's
        task while the handler waits on its queue reached the client late or
        never (once in about 50 runs under load, the client still streaming
        30 s on).
        """
        self.out.put_nowait(_Abort(code, details))
        await asyncio.Event().wait()  # the handler cancels the script as the call ends


class RogueEngine:
    """Serve ``/EngineChannel/Open`` on 127.0.0.1:0 and run ``script`` for each stream."""

    def __init__(self, script: Script, *, options: Sequence[tuple[str, Any]] = ()) -> None:
        self.script = script
        self.options = list(options)  # grpc server options, e.g. a fixed HTTP/2 window
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.streams: list[RogueStream] = []

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_addr(self) -> None:
        return None  # no discovery

    def channel_config(
        self, wal_dir: Path, run_id: str, run_token: str = "tok", **overrides: Any
    ) -> GrpcChannelConfig:
        """A channel config for this engine (short test timings, no discovery)."""
        return local_channel_config(
            self,  # type: ignore[arg-type]
            wal_dir,
            run_id,
            run_token,
            http_addr=None,
            **overrides,
        )

    async def start(self) -> None:
        engine = self

        class Servicer(pb_grpc.EngineChannelServicer):
            async def Open(  # type: ignore[override]
                self, request_iterator: AsyncIterator[pb.UpMessage], context: Any
            ) -> AsyncIterator[pb.DownMessage | bytes]:
                stream = RogueStream(request_iterator, context)
                engine.streams.append(stream)
                task = asyncio.create_task(engine.script(stream))
                try:
                    while True:
                        msg = await stream.out.get()
                        if msg is None:
                            return
                        if isinstance(msg, _Abort):
                            await context.abort(msg.code, msg.details)
                        yield msg
                finally:
                    task.cancel()

        self.server = grpc.aio.server(options=self.options)
        servicer = Servicer()
        # The generated registration, but a response serializer that lets raw
        # bytes through (RogueStream.send_raw) as well as messages.
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.Open,
            request_deserializer=pb.UpMessage.FromString,
            response_serializer=_serialized,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("EngineChannel", {"Open": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


def _serialized(msg: pb.DownMessage | bytes) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


async def answer_handshakes(stream: RogueStream, high: int = 0) -> pb.UpMessage | None:
    """Read up to the handshake and answer it with Ack(high); return the handshake."""
    msg = await stream.read()
    if msg is not None and msg.WhichOneof("body") == "handshake":
        stream.ack(high)
    return msg
