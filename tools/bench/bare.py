"""The baseline stream: a bare ``grpc.aio`` bidi stream, no log.

It does what a harness without walchannel would have to do at the least:
dial with the same channel options and bearer metadata, write the same
handshake (seq 0), wait for the engine's ``Ack(h)``, then build each
``UpMessage`` from the finding dict (the same protobuf Struct encoding),
write it with the next seq, and read the acks. Nothing is kept for a
replay: a drop loses whatever was not acked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

from tools.bench.common import RUN_TOKEN
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.wire import protobuf as wire

__all__ = ["BareStream", "HandOff"]

METHOD = "/EngineChannel/Open"


def _identity(data: bytes) -> bytes:
    return data


class BareStream:
    """One bare stream to ``addr`` for ``run_id``; :meth:`open` then :meth:`send` each finding."""

    def __init__(self, addr: str, run_id: str) -> None:
        self.addr = addr
        self.run_id = run_id
        self.correlation_id = f"corr-{run_id}"
        self.acked = 0
        self.next_seq = 1
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._ended: BaseException | None = None

    async def open(self) -> int:
        """Dial, write the handshake, wait for ``Ack(h)``; return ``h``."""
        # The options GrpcEngineChannel dials with (its defaults).
        options = [
            ("grpc.keepalive_time_ms", 25_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 0),
            ("grpc.max_send_message_length", 4 * 1024 * 1024 + 64),
        ]
        self._channel = grpc.aio.insecure_channel(self.addr, options=options)
        self._call = self._channel.stream_stream(
            METHOD, request_serializer=_identity, response_deserializer=pb.DownMessage.FromString
        )(metadata=(("authorization", f"Bearer {RUN_TOKEN}"),))
        hello = wire.handshake_message(self.run_id, self.correlation_id, "bench", "bare", "1")
        await self._call.write(hello.SerializeToString())
        answer = await self._call.read()
        if answer is grpc.aio.EOF or answer.WhichOneof("body") != "ack":
            raise RuntimeError(f"no handshake answer from {self.addr}: {answer!r}")
        h = int(answer.ack.seq)
        self.acked = h
        self.next_seq = h + 1
        self._reader = asyncio.create_task(self._read())
        return h

    async def _read(self) -> None:
        call = self._call
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    self._ended = RuntimeError(f"stream ended: {await call.code()}")
                    break
                if msg.WhichOneof("body") == "ack" and msg.ack.seq > self.acked:
                    self.acked = int(msg.ack.seq)
                    self._changed.set()
        except grpc.aio.AioRpcError as exc:
            self._ended = exc
        finally:
            self._changed.set()

    def encode(self, fields: Mapping[str, Any]) -> bytes:
        """The next finding's ``UpMessage`` bytes (takes the next seq)."""
        seq = self.next_seq
        self.next_seq += 1
        msg = wire.up_message(self.run_id, self.correlation_id, seq, "finding", {"fields": fields})
        return msg.SerializeToString()

    async def write(self, data: bytes) -> None:
        await self._call.write(data)

    async def send(self, fields: Mapping[str, Any]) -> int:
        """Encode and write one finding; return its seq."""
        data = self.encode(fields)
        await self._call.write(data)
        return self.next_seq - 1

    @property
    def unacked(self) -> int:
        return self.next_seq - 1 - self.acked

    async def wait_acked(self, seq: int) -> None:
        """Wait until the engine acked ``seq``."""
        while self.acked < seq:
            if self._ended is not None:
                raise RuntimeError(f"bare stream to {self.addr} ended: {self._ended}")
            self._changed.clear()
            await self._changed.wait()

    async def close(self) -> None:
        if self._call is not None:
            with contextlib.suppress(Exception):
                await self._call.done_writing()
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        if self._channel is not None:
            await self._channel.close(grace=None)
        self._call = None
        self._channel = None


class HandOff:
    """A writer task for a :class:`BareStream`: a call hands it bytes and returns at once.

    The shape of the durable send path without its log: the caller's call
    returns before its write, and a writer task, woken by an event, writes
    what the calls handed it, in order.
    """

    def __init__(self, stream: BareStream) -> None:
        self._stream = stream
        self._handed: deque[bytes] = deque()
        self._wakeup = asyncio.Event()
        self._finished = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._write())

    def hand(self, data: bytes) -> None:
        """Queue ``data`` for the writer and wake it."""
        self._handed.append(data)
        self._wakeup.set()

    async def drain(self) -> None:
        """Wait until the writer wrote everything handed to it, then end it."""
        self._finished = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _write(self) -> None:
        handed, wakeup = self._handed, self._wakeup
        while True:
            while handed:
                await self._stream.write(handed.popleft())
            if self._finished:
                return
            wakeup.clear()
            await wakeup.wait()
