"""A whole run that exercises every path the token could leak through, at DEBUG level.

Usage: python secret_run.py WORKDIR (token in $HARNESS_TOKEN). Reconnects,
discovery failures, a TLS failure and a crash-resume, all logging at DEBUG
to stderr, with repr()s and exception strings printed too. The caller
searches stdout, stderr and every file under WORKDIR for the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import grpc

from walchannel import (
    EngineUnavailableError,
    GrpcEngineChannel,
    WalchannelError,
)
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers.certs import make_certs
from helpers.http_answer import serve_answer


async def main() -> int:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    work = Path(sys.argv[1])
    token = os.environ["HARNESS_TOKEN"]
    engine = LocalEngine(work / "store.sqlite3", reject_tokens_for_handshakes=1)
    await engine.start()
    run_id = "secret-run"
    engine.register_run(run_id, token)
    wal = work / "wal"
    answers = [b"not an address"]  # the first rediscovery fails, later ones work
    with serve_answer(lambda: answers.pop(0) if len(answers) > 1 else answers[0]) as http:
        config = local_channel_config(engine, wal, run_id, token, http_addr=http)
        ch = GrpcEngineChannel(config)
        print(repr(ch), repr(config), str(config), file=sys.stderr)
        try:
            await ch.handshake("1", "secret", "1")
        except EngineUnavailableError as exc:
            print("handshake:", exc, file=sys.stderr)
        for i in range(20):
            ch.send_finding({"n": i})
        await engine.end_streams(run_id, grpc.StatusCode.INTERNAL)  # discovery fails next
        await asyncio.sleep(0.5)
        await engine.kill()
        await engine.replace()
        answers.append(engine.grpc_addr.encode())
        ok = await ch.wait_acked(timeout_ms=20_000)
        print("stats:", ch.stats(), file=sys.stderr)
        await ch.close()
        if not ok:
            return 1
    # A TLS failure: the engine speaks plaintext, the channel TLS.
    certs = make_certs("engine.test")
    tls = local_channel_config(
        engine,
        wal,
        run_id,
        token,
        http_addr=None,
        connect_timeout_ms=500,
        credentials=grpc.ssl_channel_credentials(root_certificates=certs["cert"]),
    )
    async with GrpcEngineChannel(tls) as ch:
        with contextlib.suppress(WalchannelError):
            await ch.handshake("1", "secret", "1")
        print("tls:", ch.stats(), file=sys.stderr)
    # A crash-resume: a child SIGKILLs itself after committing, then we resume.
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(wal), run_id, engine.grpc_addr],
        env={**os.environ, "WALCHANNEL_TEST_KILL_AT": "after_commit:5"},
        capture_output=True,
        text=True,
    )
    print("child:", child.returncode, child.stdout, child.stderr, file=sys.stderr)
    async with GrpcEngineChannel(local_channel_config(engine, wal, run_id, token)) as ch:
        await ch.handshake("1", "secret", "1")
        assert await ch.send_done("completed", 25, [], "")
    await engine.stop()
    print("run finished")
    return 0


CHILD = """
import asyncio, logging, os, sys
logging.basicConfig(level=logging.DEBUG)
from walchannel import GrpcChannelConfig, GrpcEngineChannel
async def go():
    c = GrpcChannelConfig(grpc_addr=sys.argv[3], run_id=sys.argv[2], correlation_id="c",
                          run_token=os.environ["HARNESS_TOKEN"], wal_dir=sys.argv[1])
    async with GrpcEngineChannel(c) as ch:
        await ch.handshake("1", "secret-child", "1")
        for i in range(20, 40):
            ch.send_finding({"n": i})
            await asyncio.sleep(0.01)
asyncio.run(go())
"""

if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
