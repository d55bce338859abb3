"""Fork a child from a process with a live channel; the child must not write.

Usage: python fork_run.py WAL_DIR. Prints one JSON line: what each child
got when it tried to send, and whether the parent's rows all arrived.
Run with GRPC_ENABLE_FORK_SUPPORT=false: gRPC's own fork handlers can
crash a child forked while grpc.aio is running (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from walchannel import GrpcEngineChannel, WalLockedError
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config


async def main() -> int:
    engine = LocalEngine()
    await engine.start()
    engine.register_run("fork-run", "tok-fork")
    config = local_channel_config(engine, Path(sys.argv[1]), "fork-run", "tok-fork")
    verdicts: list[str] = []
    async with GrpcEngineChannel(config) as ch:
        await ch.handshake("1", "fork", "1")
        for i in range(10):
            ch.send_finding({"n": i})
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                verdict = b"wrote"
                try:
                    ch.send_finding({"n": "child"})
                except WalLockedError:
                    verdict = b"locked"
                except BaseException:
                    verdict = b"other"
                os.write(write, verdict)
                os._exit(0)
            os.close(write)
            verdicts.append(os.read(read, 16).decode() or "died")
            os.close(read)
            os.waitpid(pid, 0)
            await asyncio.sleep(0.01)
        delivered = await ch.wait_acked(timeout_ms=10_000)
    bodies = [b["body"]["fields"]["n"] for b in engine.bodies("fork-run")]
    await engine.stop()
    print(json.dumps({"verdicts": verdicts, "delivered": delivered, "bodies": bodies}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
