"""A fast engine for the benchmark: stores nothing, answers the handshake, acks.

``python -m tools.bench.fast_engine --ack-every N`` serves
``/EngineChannel/Open`` on a loopback port and prints one JSON line
``{"grpc_addr": ..., "pid": ...}``. Per run it keeps one number, the
highest seq seen, so a second stream's handshake is answered ``Ack(h)`` as
SPEC "Handshake" asks; it applies nothing and checks no token. It acks every
``N``-th message (and a ``Done`` at once), as an engine on other machines
that is never the bottleneck would: with it, the client is the ceiling
(issue "Throughput at the transport ceiling", docs/performance.md).

:class:`tools.bench.engine.FastEngineProcess` runs it as a child process
with the same ``new_run``, ``grpc_addr`` and ``cpu_seconds`` the
end-to-end cases use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

__all__ = ["main", "serve"]


async def serve(ack_every: int, flood: bool = False) -> None:
    """Serve until SIGTERM; print the address line once listening."""
    import grpc
    import grpc.aio

    from walchannel._proto import engine_channel_pb2 as pb

    high: dict[str, int] = {}
    up = pb.UpMessage.FromString

    def ack(seq: int) -> bytes:
        return pb.DownMessage(ack=pb.Ack(seq=seq)).SerializeToString()

    async def open_stream(_requests: Any, context: Any) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        run_id = first.run_id
        await context.write(ack(high.get(run_id, 0)))
        unacked = 0
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                break
            seq = msg.seq
            if not seq:  # heartbeat
                continue
            if seq > high.get(run_id, 0):
                high[run_id] = seq
            unacked += 1
            if unacked >= ack_every or msg.WhichOneof("body") == "done":
                unacked = 0
                await context.write(ack(seq))
                if flood:  # an engine that lost its way: a duplicate, then a step back
                    await context.write(ack(seq))
                    await context.write(ack(max(0, seq - 1)))

    handler = grpc.method_handlers_generic_handler(
        "EngineChannel",
        {
            "Open": grpc.stream_stream_rpc_method_handler(
                open_stream, request_deserializer=up, response_serializer=bytes
            )
        },
    )
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 * 1024 * 1024)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"grpc_addr": f"127.0.0.1:{port}", "pid": os.getpid()}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ack-every", type=int, default=1, help="ack every N-th message")
    parser.add_argument(
        "--flood", action="store_true", help="after every ack, a duplicate and a step back"
    )
    args = parser.parse_args(argv)
    asyncio.run(serve(max(1, args.ack_every), args.flood))
    return 0


if __name__ == "__main__":
    sys.exit(main())
