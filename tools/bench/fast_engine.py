"""A fast engine for the benchmark: stores nothing, answers the handshake, acks.

``python -m tools.bench.fast_engine --ack-every N`` serves
``/EngineChannel/Open`` on a loopback port and prints one JSON line
``{"grpc_addr": ..., "pid": ...}``. Per run it keeps one number, the
highest seq seen, so a second stream's handshake is answered ``Ack(h)`` as
SPEC "Handshake" asks; it applies nothing and checks no token. It acks every
``N``-th message (and a ``Done`` at once), as an engine on other machines
that is never the bottleneck would: with it, the client is the ceiling
(issue "Throughput at the transport ceiling", docs/performance.md).

:class:`FastEngineProcess` runs it as a child process (pinned like
:class:`tools.bench.engine.EngineProcess`) with the same ``new_run``,
``grpc_addr`` and ``cpu_seconds`` the end-to-end cases use.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["FastEngineProcess", "main"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
# Pin before any thread starts (every engine thread inherits it); no preexec_fn.
_LAUNCH = """
import os, runpy, sys
cpus = sys.argv.pop(1)
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
sys.argv[0] = "tools.bench.fast_engine"
runpy.run_module("tools.bench.fast_engine", run_name="__main__", alter_sys=True)
"""


async def serve(ack_every: int) -> None:
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
    args = parser.parse_args(argv)
    asyncio.run(serve(max(1, args.ack_every)))
    return 0


class FastEngineProcess:
    """The fast engine as a child process; a context manager."""

    _ids = itertools.count(1)

    def __init__(self, folder: Path, ack_every: int, cpus: set[int] | None = None) -> None:
        self.ack_every = ack_every
        self.cpus = cpus
        self._stderr_path = folder / f"fast-engine-ack{ack_every}.stderr"
        self._proc: subprocess.Popen[str] | None = None
        self.grpc_addr = ""
        self.pid = 0

    def start(self) -> FastEngineProcess:
        from tools.bench.engine import ROOT, child_env

        with open(self._stderr_path, "w", encoding="utf-8") as stderr:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _LAUNCH,
                    ",".join(map(str, sorted(self.cpus or ()))),
                    "--ack-every",
                    str(self.ack_every),
                ],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=ROOT,
                env=child_env(),
            )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(
                f"the fast engine did not start: {self._stderr_path.read_text()[-2000:]}"
            )
        info = json.loads(line)
        self.grpc_addr = info["grpc_addr"]
        self.pid = int(info["pid"])
        return self

    def new_run(self, prefix: str) -> str:
        """A fresh run id (the fast engine accepts any run and token)."""
        return f"{prefix}-{os.getpid()}-{next(self._ids)}"

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the engine process has used so far."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> FastEngineProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
