"""A frozen harness does not blame the engine (issue 58, item 5).

A harness process stopped with SIGSTOP (as ``docker pause`` does) for
longer than its dead-stream bound used to wake, find no down message for
that long, and drop a healthy stream as dead. Its watchdog now sees that it
woke far too late (the process did not run), says so, and gives the stream
a fresh chance. A real process, really stopped, against the local engine.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import child_env, new_run
from walchannel.testing.engine import LocalEngine

_HARNESS = textwrap.dedent(
    """
    import asyncio, os, sys
    from walchannel import GrpcEngineChannel
    from walchannel.testing.plugin import local_channel_config

    class Engine:
        grpc_addr = sys.argv[2]
        http_addr = None

    async def main() -> None:
        config = local_channel_config(
            Engine(), sys.argv[1], sys.argv[3], os.environ["RUN_TOKEN"],
            keepalive_ms=1_000, dead_stream_ms=2_500,
        )
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "frozen", "1")
            ch.send_finding({"n": 0})
            assert await ch.wait_acked(timeout_ms=10_000)
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            ch.send_finding({"n": 1})
            assert await ch.wait_acked(timeout_ms=10_000)
            print(f"reconnects {ch.stats().reconnects}", flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.asyncio
async def test_a_harness_stopped_past_its_dead_stream_bound_keeps_its_stream(
    local_engine: LocalEngine, tmp_path: Path
) -> None:
    run_id, token = new_run(local_engine)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _HARNESS,
        str(tmp_path),
        local_engine.grpc_addr,
        run_id,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env(RUN_TOKEN=token),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"ready\n"
        proc.send_signal(signal.SIGSTOP)
        await asyncio.sleep(6.0)  # the freeze itself: 6 s, past the 2.5 s bound
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        said = await asyncio.wait_for(proc.stdout.readline(), 60)
    finally:
        proc.send_signal(signal.SIGCONT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert said == b"reconnects 0\n", text[-3000:]
    assert "the event loop did not run for" in text, text[-3000:]
    assert "dead stream" not in text
    assert local_engine.accepted(run_id) == [1, 2]


@pytest.mark.parametrize(
    ("late_ms", "keepalive_ms", "stalled"),
    [(20_000, 10_000, False), (20_001, 10_000, True), (5, 1_000, False), (6_000, 1_000, True)],
)
def test_a_watchdog_more_than_twice_the_keepalive_late_means_the_process_did_not_run(
    late_ms: float, keepalive_ms: float, stalled: bool
) -> None:
    from walchannel.core.watchdog import loop_stalled

    assert loop_stalled(late_ms, keepalive_ms) is stalled
