"""Down messages whose text is not valid UTF-8, and ones that do not parse (issue 57, part 1).

A C++ or Go engine may cut a text mid-character (protobuf #4970, grpc
#14847, #16102). Python's protobuf refuses the whole message; grpc.aio used
to log a traceback and hand the channel ``None``, and an engine that re-sent
such a ``Stop`` after every handshake kept the run reconnecting for ever.
Now the channel reads the raw bytes itself (SPEC "Down messages"): a
message whose only fault is its text is acted on, the text decoded with
U+FFFD, said once per stream; one that does not parse at all is a protocol
error of the engine, counted, named in ``last_error``, and its stream is
ended (the engine re-sends ``Stop`` and decisions after the next handshake).

Each engine here is a real grpc.aio server on loopback writing the bytes a
broken encoder writes (``tests/helpers/rogue.py``, ``send_raw``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from conftest import eventually
from helpers.rogue import RogueEngine, RogueStream
from walchannel import ChannelState, GrpcEngineChannel
from walchannel._proto import down_lenient_pb2 as lenient

ROWS = 200


def bad_stop() -> bytes:
    # "operator stop €" cut inside the euro sign's three bytes.
    return lenient.DownMessage(
        stop=lenient.Stop(reason=b"operator stop \xe2\x82")
    ).SerializeToString()


def bad_decision() -> bytes:
    return lenient.DownMessage(
        approval_decision=lenient.ApprovalDecision(
            request_id=b"req-1", approved=True, reason=b"ok \xff by the operator"
        )
    ).SerializeToString()


def bad_budget() -> bytes:
    details = lenient.Struct(
        fields=[
            lenient.FieldsEntry(key=b"spent", value=lenient.Value(number_value=12.5)),
            lenient.FieldsEntry(key=b"note\xc0", value=lenient.Value(string_value=b"caf\xc3")),
        ]
    )
    return lenient.DownMessage(
        budget_update=lenient.BudgetUpdate(message=b"budget \xed\xa0\x80", details=details)
    ).SerializeToString()


class TextEngine:
    """Acks rows in order; after every handshake answer, sends ``down`` (raw bytes)."""

    def __init__(self, down: bytes, *, streams_with_it: int | None = None) -> None:
        self.down = down
        self.streams_with_it = streams_with_it
        self.h = 0
        self.applied: list[int] = []
        self.rogue = RogueEngine(self._script)

    async def _script(self, stream: RogueStream) -> None:
        msg = await stream.read()
        if msg is None or msg.WhichOneof("body") != "handshake":
            return
        stream.ack(self.h)
        if self.streams_with_it is None or len(self.rogue.streams) <= self.streams_with_it:
            stream.send_raw(self.down)
        while (msg := await stream.read()) is not None:
            if msg.seq == self.h + 1:
                self.h = msg.seq
                self.applied.append(msg.seq)
            stream.ack(self.h)


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and r.name.startswith("walchannel")]


@pytest.mark.asyncio
@pytest.mark.parametrize("body", ["stop", "decision", "budget"])
async def test_a_message_whose_only_fault_is_its_text_is_acted_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: str
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel")
    down = {"stop": bad_stop, "decision": bad_decision, "budget": bad_budget}[body]()
    engine = TextEngine(down)  # re-sent after every handshake, as for a stopped run
    await engine.rogue.start()
    stops: list[str] = []
    updates: list[tuple[str, dict[str, Any]]] = []
    try:
        config = engine.rogue.channel_config(tmp_path / "wal", "text-run")
        async with GrpcEngineChannel(config) as ch:
            ch.on_stop(stops.append)
            ch.on_budget_update(lambda message, details: updates.append((message, details)))
            await ch.handshake("1", "h", "1")
            seqs = ch.send_findings([{"n": i} for i in range(ROWS)])
            assert await ch.wait_acked(timeout_ms=20_000)
            if body == "stop":
                await eventually(lambda: stops, what="the Stop")
                assert stops == ["operator stop \ufffd"]
            elif body == "decision":
                decision = await ch.request_approval(
                    "act", {}, request_id="req-1", timeout_ms=10_000
                )
                assert decision.approved and decision.reason == "ok \ufffd by the operator"
            else:
                await eventually(lambda: updates, what="the budget update")
                message, details = updates[0]
                assert message == "budget \ufffd\ufffd\ufffd"
                assert details == {"spent": 12.5, "note\ufffd": "caf\ufffd"}
            stats = ch.stats()
            assert stats.state is ChannelState.STREAMING and stats.protocol_errors == 0
            assert stats.reconnects == 0, "the message ended a stream"
        assert engine.applied == seqs
    finally:
        await engine.rogue.stop()
    warnings = [r.getMessage() for r in said(caplog, logging.WARNING) if "UTF-8" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per stream
    assert not said(caplog, logging.ERROR)
    assert "Traceback" not in caplog.text


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "garbage",
    [b"\x0a\x05ab", b"\x0f\x00"],
    ids=["cut-mid-field", "no-such-wire-type"],
)
async def test_a_message_that_does_not_parse_is_a_named_protocol_error_and_ends_the_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    caplog.set_level(logging.INFO, logger="walchannel")
    engine = TextEngine(garbage, streams_with_it=2)  # the first two streams get it
    await engine.rogue.start()
    try:
        config = engine.rogue.channel_config(tmp_path / "wal", "garbage-run")
        async with GrpcEngineChannel(config) as ch:
            await ch.handshake("1", "h", "1")
            seqs = ch.send_findings([{"n": i} for i in range(ROWS)])
            assert await ch.wait_acked(timeout_ms=30_000)
            stats = ch.stats()
            assert stats.protocol_errors == 2, stats
            assert stats.reconnects >= 2
        assert engine.applied == seqs
        assert len(engine.rogue.streams) >= 3
    finally:
        await engine.rogue.stop()
    errors = [r.getMessage() for r in said(caplog, logging.ERROR)]
    assert len(errors) == 2, errors
    assert all(f"{len(garbage)}-byte down message" in e and "protocol error" in e for e in errors)
    assert "Traceback" not in caplog.text
