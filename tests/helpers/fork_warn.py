"""Fork twice from a process with a live channel; report the RuntimeWarnings raised.

Usage: python fork_warn.py MODE WAL_DIR, MODE one of ``fork`` (os.fork with
the channel open), ``mp`` (a multiprocessing fork-context Process with the
channel open), ``closed`` (the channel closed before the forks) and
``never`` (a local engine served, no channel opened). Prints one JSON line:
the RuntimeWarnings caught (category, message, file), nothing about the
children, whose fate is gRPC's (docs/security.md). Run in a process of its
own: the caller never forks beside gRPC threads.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from walchannel import GrpcEngineChannel
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


def reap(pid: int) -> None:
    """Wait for a child (30 s at most, then SIGKILL): a crashed or hung one is gRPC's business."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def nothing() -> None:
    """The multiprocessing child's work."""


def fork_once(mode: str) -> None:
    if mode == "mp":
        child = multiprocessing.get_context("fork").Process(target=nothing)
        child.start()
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
        return
    pid = os.fork()  # the line the warning must point at
    if pid == 0:
        os._exit(0)
    reap(pid)


async def main(mode: str, wal: Path) -> int:
    engine = LocalEngine()
    await engine.start()
    engine.register_run("fork-warn", "tok-fork-warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ch = None
        if mode != "never":
            ch = GrpcEngineChannel(local_channel_config(engine, wal, "fork-warn", "tok-fork-warn"))
            await ch.handshake("1", "fork-warn", "1")
            ch.send_finding({"n": 1})
            assert await ch.wait_acked(timeout_ms=10_000)
            if mode == "closed":
                await ch.close()
        for _ in range(2):
            fork_once(mode)
            await asyncio.sleep(0.01)  # let grpc.aio run between the forks
        if ch is not None:
            await ch.close()
    await engine.stop()
    found = [
        {"category": w.category.__name__, "message": str(w.message), "file": w.filename}
        for w in caught
        if issubclass(w.category, RuntimeWarning)
    ]
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], Path(sys.argv[2]))))
