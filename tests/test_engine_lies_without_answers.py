"""Without handshake answers, an ack beyond the log's high-water ends its stream (issue 33).

SPEC "Acks": an ack covers only rows this channel wrote; without handshake
answers (``engine_acks_handshake=False``) the bound is the log's high-water.
An ack beyond it — a data ack or a heartbeat's answer, by one seq or by
``2**64 - 1`` — is a protocol error: counted, never applied, no row deleted,
the run not failed, and the stream ended and re-dialed with backoff, as
with answers. The simulator (tools/sim.py, a lying engine) found such an
ack left its stream up. A real ``grpc.aio`` server on loopback plays the
engine (``tests/helpers/rogue.py``), honest but for the lie.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from test_engine_lies import Store, config_for, until_the_client_ends

from conftest import eventually
from helpers.rogue import RogueEngine, RogueStream
from walchannel import ChannelState, GrpcEngineChannel

ROWS = 5

LIES: dict[str, Callable[[int], int]] = {
    "one_past_the_high_water": lambda high_water: high_water + 1,
    "uint64_max": lambda high_water: 2**64 - 1,
}


async def skip_the_handshake(stream: RogueStream) -> None:
    """Read the handshake and answer nothing (an engine without answers)."""
    msg = await stream.read()
    assert msg is not None and msg.WhichOneof("body") == "handshake"


async def assert_counted_and_redialed(ch: GrpcEngineChannel, store: Store, told: int) -> None:
    await eventually(lambda: ch.stats().protocol_errors, what="the lie counted")
    # Never applied: nothing the engine does not hold is acked or deleted.
    assert ch.last_acked_seq <= store.high
    assert ch.log.last_acked_seq <= store.high
    assert f"Ack({told})" in (ch.stats().last_error or "")
    await eventually(lambda: len(store.starts) > 1, what="the stream ended and dialed again")
    assert ch.stats().protocol_errors == 1
    assert store.starts[1] - store.starts[0] >= 0.045, store.starts  # with backoff


@pytest.mark.parametrize("lie", sorted(LIES))
@pytest.mark.asyncio
async def test_a_data_ack_beyond_the_high_water_ends_the_stream(tmp_path: Path, lie: str) -> None:
    store = Store()
    told = LIES[lie](ROWS)

    async def script(stream: RogueStream) -> None:
        lying = store.lying()
        await skip_the_handshake(stream)
        if not lying:
            await store.honest(stream)
            return
        while (msg := await stream.read()) is not None:
            if msg.seq:
                store.take(msg)
            if store.high == 3:
                stream.ack(told)
                await until_the_client_ends(stream)

    engine = RogueEngine(script)
    await engine.start()
    try:
        config = config_for(engine, tmp_path, engine_acks_handshake=False)
        async with GrpcEngineChannel(config) as ch:
            for n in range(ROWS):
                ch.send_finding({"n": n})
            await ch.handshake("1", "liar", "1")
            await assert_counted_and_redialed(ch, store, told)
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.state is ChannelState.STREAMING
    finally:
        await engine.stop()
    assert store.gaps == []
    assert store.held == list(range(1, ROWS + 1))


@pytest.mark.parametrize("lie", sorted(LIES))
@pytest.mark.asyncio
async def test_a_heartbeat_answer_beyond_the_high_water_ends_the_stream(
    tmp_path: Path, lie: str
) -> None:
    store = Store()
    told = LIES[lie](ROWS)

    async def script(stream: RogueStream) -> None:
        lying = store.lying()
        await skip_the_handshake(stream)
        if not lying:
            await store.honest(stream)
            return
        while (msg := await stream.read()) is not None:
            if msg.seq:
                store.take(msg)
                stream.ack(store.high)
            elif msg.WhichOneof("body") == "heartbeat" and store.high == ROWS:
                stream.ack(told)
                await until_the_client_ends(stream)

    engine = RogueEngine(script)
    await engine.start()
    try:
        config = config_for(engine, tmp_path, engine_acks_handshake=False, keepalive_ms=1000)
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "liar", "1")
            for n in range(ROWS):
                ch.send_finding({"n": n})
            assert await ch.wait_acked(timeout_ms=10_000)
            await assert_counted_and_redialed(ch, store, told)
            assert ch.last_acked_seq == ROWS and ch.log.next_seq == ROWS + 1
            ch.send_finding({"n": ROWS})
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.state is ChannelState.STREAMING
    finally:
        await engine.stop()
    assert store.gaps == []
    assert store.held == list(range(1, ROWS + 2))
