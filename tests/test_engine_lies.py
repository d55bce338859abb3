"""An engine's impossible answer is a counted protocol error, never data (issue 33).

An ack beyond every row this channel wrote and the stream's handshake answer
``h`` (on a data ack or a heartbeat's answer, a small lie or a large one), a
handshake answer SQLite cannot hold (``h >= 2**63``) or whose verification
shift would carry a row past ``2**63 - 1``: each is counted in
``stats().protocol_errors``, never applied, deletes no row and fails no
run; the stream is ended and re-dialed with backoff (a fresh handshake
re-syncs), and the cause is in ``last_error`` and ``inspect`` (SPEC "Acks",
"Dial"; "errors from outside never fail a run"). Duplicate floods and
backwards acks keep holding. A real ``grpc.aio`` server on loopback plays
the engine (``tests/helpers/rogue.py``): honest but for the lies.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import eventually
from helpers.rogue import RogueEngine, RogueStream, answer_handshakes
from helpers.sqlite_probe import no_write_transaction_open
from walchannel import ChannelState, GrpcEngineChannel
from walchannel._proto import engine_channel_pb2 as pb
from walchannel.cli import main
from walchannel.config import GrpcChannelConfig

# A fixed HTTP/2 window: the engine's reads pace the client's writes, so a
# client that logged 30 rows of 100 KB has written only the few the engine
# read, plus about two (grpc takes one large message at once).
FIXED_WINDOW = (("grpc.http2.bdp_probe", 0),)
PAD = "x" * 100_000
ROWS = 30
READ_BEFORE_LIE = 8


class Store:
    """The rogue engine's honest side: the rows it received in order, each stream's start."""

    def __init__(self, lying_streams: int = 1) -> None:
        self.held: list[int] = []
        self.gaps: list[tuple[int, int]] = []
        self.starts: list[float] = []
        self.lies_left = lying_streams

    @property
    def high(self) -> int:
        return self.held[-1] if self.held else 0

    def take(self, msg: pb.UpMessage) -> None:
        if msg.seq == self.high + 1:
            self.held.append(msg.seq)
        elif msg.seq > self.high + 1:
            self.gaps.append((self.high + 1, msg.seq))

    def lying(self) -> bool:
        """Whether this stream lies (the first ``lying_streams`` do); notes its start."""
        self.starts.append(time.monotonic())
        if self.lies_left:
            self.lies_left -= 1
            return True
        return False

    async def honest(self, stream: RogueStream) -> None:
        """Ack every row received, and every heartbeat, with what it holds."""
        while (msg := await stream.read()) is not None:
            if msg.seq:
                self.take(msg)
            stream.ack(self.high)


async def until_the_client_ends(stream: RogueStream) -> None:
    """Read nothing more: the client's writes stay where they are, and the lie stays one."""
    await asyncio.Event().wait()  # cancelled when the client ends the call


def inspect_json(path: Path) -> dict[str, object]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["inspect", "--json", str(path)])
    (report,) = json.loads(out.getvalue())
    return report  # type: ignore[no-any-return]


def config_for(engine: RogueEngine, tmp_path: Path, **kw: object) -> GrpcChannelConfig:
    return engine.channel_config(tmp_path / "wal", "liar-run", "tok-liar", **kw)


async def assert_named_and_redialed(
    ch: GrpcEngineChannel, store: Store, words: str, *, errors: int = 1
) -> None:
    """The lie was counted, ended its stream, is named in last_error and inspect; re-dialed."""
    await eventually(
        lambda: words in (ch.log.meta().last_error or ""), what=f"last_error naming {words}"
    )
    assert ch.stats().protocol_errors == errors
    assert words in (ch.stats().last_error or "")
    report = inspect_json(ch.log.path)
    assert words in str(report["last_error"]), report
    assert report["state"] not in ("failed", "corrupt"), report
    await eventually(lambda: len(store.starts) > errors, what="a new stream")
    # With backoff (initial 50 ms here), never at once.
    assert store.starts[errors] - store.starts[errors - 1] >= 0.045, store.starts


# -- acks of rows never written -----------------------------------------------------------

DATA_LIES: dict[str, Callable[[int], int]] = {
    # The engine read 8 rows; the client wrote ~2 more (the window). Never 14.
    "small": lambda held: held + 6,
    # The report: h + 20 while the client had written 8-10 rows.
    "twenty_ahead": lambda held: held + 20,
    # Past the high-water and past what SQLite holds.
    "uint64_max": lambda held: 2**64 - 1,
}


@pytest.mark.parametrize("lie", sorted(DATA_LIES))
@pytest.mark.asyncio
async def test_a_data_ack_of_rows_never_written_deletes_nothing_and_redials(
    tmp_path: Path, lie: str
) -> None:
    store = Store()

    async def script(stream: RogueStream) -> None:
        lying = store.lying()
        await answer_handshakes(stream, high=store.high)
        if not lying:
            await store.honest(stream)
            return
        for _ in range(READ_BEFORE_LIE):
            msg = await stream.read()
            assert msg is not None
            store.take(msg)
        stream.ack(DATA_LIES[lie](store.high))
        await until_the_client_ends(stream)

    engine = RogueEngine(script, options=FIXED_WINDOW)
    await engine.start()
    try:
        async with GrpcEngineChannel(config_for(engine, tmp_path)) as ch:
            for n in range(ROWS):
                ch.send_finding({"n": n, "pad": PAD})
            await ch.handshake("1", "liar", "1")
            await eventually(lambda: ch.stats().protocol_errors, what="the lie counted")
            # Never applied: nothing the engine does not hold is acked or deleted.
            assert ch.last_acked_seq <= store.high
            assert ch.log.last_acked_seq <= store.high
            assert ch.log.unacked_count == ROWS - ch.log.last_acked_seq
            told = DATA_LIES[lie](READ_BEFORE_LIE)
            await assert_named_and_redialed(ch, store, f"Ack({told})")
            # The next stream re-syncs; every row arrives once, in order.
            assert await ch.wait_acked(timeout_ms=30_000)
            assert ch.state is ChannelState.STREAMING
            assert ch.stats().protocol_errors == 1
    finally:
        await engine.stop()
    assert store.gaps == []
    assert store.held == list(range(1, ROWS + 1))


HEARTBEAT_LIES: dict[str, Callable[[int], int]] = {
    "small": lambda high: high + 1,
    "large": lambda high: 2**63,
}


@pytest.mark.parametrize("lie", sorted(HEARTBEAT_LIES))
@pytest.mark.asyncio
async def test_a_heartbeat_answer_beyond_every_row_written_is_a_protocol_error_and_redials(
    tmp_path: Path, lie: str
) -> None:
    store = Store()
    told: list[int] = []

    async def script(stream: RogueStream) -> None:
        lying = store.lying()
        await answer_handshakes(stream, high=store.high)
        if not lying:
            await store.honest(stream)
            return
        while (msg := await stream.read()) is not None:
            if msg.seq:
                store.take(msg)
                stream.ack(store.high)
            elif msg.WhichOneof("body") == "heartbeat" and store.high == 5:
                told.append(HEARTBEAT_LIES[lie](store.high))
                stream.ack(told[0])
                await until_the_client_ends(stream)

    engine = RogueEngine(script)
    await engine.start()
    try:
        async with GrpcEngineChannel(config_for(engine, tmp_path, keepalive_ms=1000)) as ch:
            await ch.handshake("1", "liar", "1")
            for n in range(5):
                ch.send_finding({"n": n})
            assert await ch.wait_acked(timeout_ms=10_000)
            await eventually(lambda: ch.stats().protocol_errors, what="the lie counted")
            assert ch.last_acked_seq == 5 and ch.log.next_seq == 6
            await assert_named_and_redialed(ch, store, f"Ack({told[0]})")
            ch.send_finding({"n": 5})
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.state is ChannelState.STREAMING
    finally:
        await engine.stop()
    assert store.gaps == []
    assert store.held == list(range(1, 7))


# -- what keeps holding --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_duplicate_floods_and_backwards_acks_are_no_protocol_error(tmp_path: Path) -> None:
    store = Store(lying_streams=0)

    async def script(stream: RogueStream) -> None:
        store.lying()
        await answer_handshakes(stream, high=store.high)
        while (msg := await stream.read()) is not None:
            if msg.seq:
                store.take(msg)
            for _ in range(50):  # a flood of duplicates
                stream.ack(store.high)
            stream.ack(max(0, store.high - 3))  # backwards
            stream.ack(0)

    engine = RogueEngine(script)
    await engine.start()
    try:
        async with GrpcEngineChannel(config_for(engine, tmp_path)) as ch:
            await ch.handshake("1", "liar", "1")
            for n in range(40):
                ch.send_finding({"n": n})
            assert await ch.wait_acked(timeout_ms=10_000)
            ch.send_findings([{"n": n} for n in range(40, 60)])
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.stats().protocol_errors == 0
            assert ch.stats().reconnects == 0
            assert len(store.starts) == 1
    finally:
        await engine.stop()
    assert store.held == list(range(1, 61))


# -- handshake answers SQLite cannot hold --------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        2**63,  # one past SQLite's largest integer
        2**64 - 1,  # the largest uint64
        2**63 - 2,  # the shift would carry the 3 unverified rows past 2**63 - 1
    ],
)
@pytest.mark.asyncio
async def test_a_handshake_answer_out_of_sqlites_range_is_a_protocol_error_and_redials(
    tmp_path: Path, answer: int
) -> None:
    store = Store(lying_streams=2)

    async def script(stream: RogueStream) -> None:
        lying = store.lying()
        await answer_handshakes(stream, high=answer if lying else store.high)
        if lying:
            await until_the_client_ends(stream)
        else:
            await store.honest(stream)

    engine = RogueEngine(script)
    await engine.start()
    try:
        config = config_for(engine, tmp_path)
        # A harness logged 3 rows and stopped; the restarted one handshakes.
        async with GrpcEngineChannel(config) as first:
            for n in range(3):
                first.send_finding({"n": n})
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "liar", "1")  # answered on the third dial
            await assert_named_and_redialed(ch, store, f"Ack({answer})", errors=2)
            assert no_write_transaction_open(ch.log.path)
            assert await ch.wait_acked(timeout_ms=10_000)
            assert ch.state is ChannelState.STREAMING
            assert ch.log.meta().failed_at is None
            assert ch.send_finding({"n": 3}) == 4
            assert await ch.wait_acked(timeout_ms=10_000)
    finally:
        await engine.stop()
    assert store.held == [1, 2, 3, 4]
