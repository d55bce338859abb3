"""The engine's status survives a write that fails as the call ends (grpc/grpc#36066).

When a write is in flight as a call ends, grpc.aio's failed write replaces
the call's status with ``INTERNAL: Internal error from Core``. On this
machine that happened to every call an engine aborted while the client
wrote (30 of 30), and to most calls ended by a down message over the
receive limit; in one CI run, tests/test_receive_limit.py's flush lost the
status on all five of its dials, and could not name its flag. The call's
done callbacks run with the status that arrived first, before the
replacement: :class:`~walchannel.transport.grpc.GrpcCall`
keeps that one.

Every kind of status a write can race is a member; three are tried, each on
a real grpc.aio server on loopback, each over 20 calls: a down message over
the client's receive limit (client side), an engine's abort with
FAILED_PRECONDITION "run completed" and with RESOURCE_EXHAUSTED (a size
refusal).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from walchannel import GrpcChannelConfig
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.transport.base import StreamEnded
from walchannel.transport.grpc import METHOD, GrpcTransport

CALLS = 20
BIG = 5 * 1024 * 1024
ROW = b"\x00" * 250

Script = Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext[Any, Any]], AsyncIterator[bytes]]


async def over_the_limit(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    """Answer the first message with a 5 MiB Stop (the client's limit is 4 MiB), keep reading."""
    async for _ in requests:
        yield pb.DownMessage(stop=pb.Stop(reason="r" * BIG)).SerializeToString()
        break
    async for _ in requests:
        pass


def aborting(code: grpc.StatusCode, details: str) -> Script:
    async def script(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """Read two messages while the client writes on, then end the call with a status."""
        n = 0
        async for _ in requests:
            n += 1
            if n == 2:
                await context.abort(code, details)
        yield b""  # pragma: no cover - a generator; abort raises

    return script


async def end_of_calls(script: Script) -> list[tuple[str | None, str, str | None]]:
    """Run ``CALLS`` calls that write without pause; return each one's end as the channel reads it.

    Each entry is ``(code of the first StreamEnded raised, its text, final_status code)``.
    """

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                METHOD.split("/")[1],
                {
                    METHOD.split("/")[2]: grpc.stream_stream_rpc_method_handler(
                        script, request_deserializer=bytes, response_serializer=bytes
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = GrpcChannelConfig(
        grpc_addr=f"127.0.0.1:{port}", run_id="r", correlation_id="c", run_token="t"
    )
    transport = GrpcTransport(config)
    ends: list[tuple[str | None, str, str | None]] = []
    try:
        for _ in range(CALLS):
            call = transport.dial(config.grpc_addr, keepalive_ms=30_000)
            first: asyncio.Future[StreamEnded] = asyncio.get_running_loop().create_future()

            async def side(
                step: Callable[[], Awaitable[object]], first: asyncio.Future[StreamEnded]
            ) -> None:
                try:
                    while True:
                        await step()
                except StreamEnded as exc:
                    if not first.done():
                        first.set_result(exc)

            write = functools.partial(call.write, ROW)
            tasks = [
                asyncio.create_task(side(write, first)),
                asyncio.create_task(side(call.read, first)),
            ]
            ended = await asyncio.wait_for(first, 30)
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            final = await call.final_status()
            ends.append((ended.code, str(ended), None if final is None else final[0]))
            await call.close()
    finally:
        await server.stop(None)
    return ends


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("script", "code", "said"),
    [
        (over_the_limit, "RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max"),
        (
            aborting(grpc.StatusCode.FAILED_PRECONDITION, "run completed by writer w1"),
            "FAILED_PRECONDITION",
            "run completed by writer w1",
        ),
        (
            aborting(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (900 vs. 500)"
            ),
            "RESOURCE_EXHAUSTED",
            "Received message larger than max (900 vs. 500)",
        ),
    ],
    ids=["down-over-the-receive-limit", "run-completed", "size-refusal"],
)
async def test_a_write_racing_the_end_does_not_replace_the_engines_status(
    script: Script, code: str, said: str
) -> None:
    ends = await end_of_calls(script)
    lost = [end for end in ends if end[0] != code or end[2] != code or said not in end[1]]
    assert not lost, f"{len(lost)} of {CALLS} calls lost their status, e.g. {lost[0]}"
