"""The local engine's duties, driven by a RAW grpc.aio client on the generated stub.

No walchannel channel is involved: each test writes UpMessages itself and
reads the DownMessages (SPEC "Engine duties the client relies on", "Test
doubles and the local engine"). Real sockets on loopback, port 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc import aio

from conftest import PYTHON, child_env
from walchannel._proto import engine_channel_pb2 as pb
from walchannel._proto import engine_channel_pb2_grpc as pb_grpc
from walchannel.testing.engine import RUN_COMPLETED, LocalEngine
from walchannel.testing.engine.__main__ import main
from walchannel.testing.store import EngineStore
from walchannel.wire.protobuf import (
    body_of,
    handshake_message,
    heartbeat_message,
    struct_to_dict,
    up_message,
)

RUN = "run-1"
TOKEN = "tok-6f1d2c9a-secret"
WAIT = 10.0  # generous bound for anything that should happen "now" (seconds)
_NO_PROXY = (("grpc.enable_http_proxy", 0),)


class Raw:
    """One raw ``Open`` call; a pump task reads every down message into a queue.

    (Cancelling ``call.read()`` would cancel the RPC, so reads never time out
    themselves; the queue does.)
    """

    def __init__(
        self,
        addr: str,
        *,
        run_id: str = RUN,
        token: str | None = TOKEN,
        credentials: grpc.ChannelCredentials | None = None,
        options: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        opts = (*_NO_PROXY, *options)
        if credentials is None:
            self.channel = aio.insecure_channel(addr, options=opts)
        else:
            self.channel = aio.secure_channel(addr, credentials, options=opts)
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        self.call = pb_grpc.EngineChannelStub(self.channel).Open(metadata=metadata)
        self.run_id = run_id
        self.inbox: asyncio.Queue[pb.DownMessage | BaseException | None] = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_all())

    async def _read_all(self) -> None:
        try:
            while True:
                msg = await self.call.read()
                if msg is aio.EOF:
                    self.inbox.put_nowait(None)
                    return
                self.inbox.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.inbox.put_nowait(exc)

    async def write(self, msg: pb.UpMessage) -> None:
        # A write on a failed call raises its status; the pump reports it too.
        with contextlib.suppress(aio.AioRpcError):
            await self.call.write(msg)

    async def handshake(self) -> None:
        await self.write(handshake_message(self.run_id, "corr-1", "1.0", "raw-test", "0.1"))

    async def heartbeat(self) -> None:
        await self.write(heartbeat_message(self.run_id, "corr-1", "2024-01-01T00:00:00Z"))

    async def data(
        self, seq: int, kind: str = "finding", body: dict[str, Any] | None = None
    ) -> None:
        if body is None:
            body = {"fields": {"n": seq}}
        await self.write(up_message(self.run_id, "corr-1", seq, kind, body))

    async def recv(self, timeout: float = WAIT) -> pb.DownMessage:
        item = await asyncio.wait_for(self.inbox.get(), timeout)
        if item is None:
            raise EOFError("stream ended")
        if isinstance(item, BaseException):
            raise item
        return item

    async def ack(self, timeout: float = WAIT) -> int:
        msg = await self.recv(timeout)
        assert msg.WhichOneof("body") == "ack", msg
        return int(msg.ack.seq)

    async def acks_until(self, seq: int) -> list[int]:
        """Read acks until one covers ``seq``; return them all."""
        seen: list[int] = []
        while not seen or seen[-1] < seq:
            seen.append(await self.ack())
        return seen

    async def nothing_within(self, seconds: float) -> None:
        try:
            item = await asyncio.wait_for(self.inbox.get(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got {item!r}")

    async def error(self) -> aio.AioRpcError:
        """Read until the stream fails; return its error."""
        while True:
            item = await asyncio.wait_for(self.inbox.get(), WAIT)
            if isinstance(item, aio.AioRpcError):
                return item
            if item is None:
                raise AssertionError("stream ended cleanly, expected an error")
            if isinstance(item, BaseException):
                raise item

    async def eof(self) -> None:
        """Read until a clean end of stream."""
        while True:
            item = await asyncio.wait_for(self.inbox.get(), WAIT)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise AssertionError(f"expected a clean end, got {item!r}")

    async def close(self) -> None:
        self._pump.cancel()
        await self.channel.close()


Dial = Callable[..., Raw]


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[LocalEngine]:
    eng = LocalEngine()
    await eng.start()
    eng.register_run(RUN, TOKEN)
    yield eng
    await eng.stop()


@pytest_asyncio.fixture
async def dial() -> AsyncIterator[Dial]:
    made: list[Raw] = []

    def make(addr: str, **kwargs: Any) -> Raw:
        raw = Raw(addr, **kwargs)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        await raw.close()


async def connected(dial: Dial, engine: LocalEngine, expect_h: int = 0, **kwargs: Any) -> Raw:
    raw = dial(engine.grpc_addr, **kwargs)
    await raw.handshake()
    assert await raw.ack() == expect_h
    return raw


# -- handshake, acceptance ------------------------------------------------------


@pytest.mark.asyncio
async def test_handshake_answers_ack_zero_then_the_high_water(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine, 0)
    for seq in (1, 2, 3):
        await a.data(seq)
        assert await a.ack() == seq
    event = {"type": "scan.step", "severity": "info", "payload": {"k": [1, "x", None]}, "ts": "t"}
    await a.data(4, "event", event)
    assert await a.ack() == 4
    assert engine.accepted(RUN) == [1, 2, 3, 4]
    b = await connected(dial, engine, 4)
    await b.heartbeat()
    assert await b.ack() == 4


@pytest.mark.asyncio
async def test_bodies_have_the_wire_shapes(engine: LocalEngine, dial: Dial) -> None:
    a = await connected(dial, engine)
    sent = [
        ("finding", {"fields": {"rule": "B101", "line": 3, "tags": ["a", {"b": True}]}}),
        ("event", {"type": "t", "severity": "warn", "payload": {}, "ts": "2024-01-01T00:00:00Z"}),
        ("approval_request", {"request_id": "q1", "action": "exploit", "details": {"x": 1.5}}),
        ("done", {"status": "completed", "findings": 7, "coverage": ["a", "b"], "exit_reason": ""}),
    ]
    for seq, (kind, body) in enumerate(sent, start=1):
        await a.data(seq, kind, body)
    await a.acks_until(4)
    expected = [
        {"seq": seq, "kind": kind, "body": body_of(up_message(RUN, "c", seq, kind, body))[1]}
        for seq, (kind, body) in enumerate(sent, start=1)
    ]
    assert engine.bodies(RUN) == expected
    assert expected[0]["body"]["fields"]["line"] == 3.0  # Struct numbers come back as floats
    assert engine.done(RUN) == {
        "seq": 4,
        "status": "completed",
        "findings": 7,
        "coverage": ["a", "b"],
        "exit_reason": "",
    }


@pytest.mark.asyncio
async def test_duplicates_are_acked_and_counted_not_applied(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine)
    await a.data(1, body={"fields": {"v": "first"}})
    await a.data(2)
    assert await a.acks_until(2) == [1, 2]
    await a.data(1, body={"fields": {"v": "replayed"}})
    assert await a.ack() == 2
    await a.data(2)
    assert await a.ack() == 2
    await a.data(3)
    assert await a.ack() == 3
    assert engine.accepted(RUN) == [1, 2, 3]
    assert engine.duplicates(RUN) == 2
    assert engine.bodies(RUN)[0]["body"] == {"fields": {"v": "first"}}


@pytest.mark.asyncio
async def test_a_gap_fails_the_stream_naming_the_expected_seq(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine)
    await a.data(1)
    assert await a.ack() == 1
    await a.data(3)
    err = await a.error()
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "expected seq 2" in (err.details() or "")
    assert engine.gaps(RUN) == [(2, 3)]
    assert engine.accepted(RUN) == [1]
    # The run goes on from the expected seq on a new stream.
    b = await connected(dial, engine, 1)
    await b.data(2)
    assert await b.ack() == 2


@pytest.mark.asyncio
async def test_data_before_the_handshake_is_refused(engine: LocalEngine, dial: Dial) -> None:
    a = dial(engine.grpc_addr)
    await a.data(1)
    err = await a.error()
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "handshake" in (err.details() or "")
    assert engine.accepted(RUN) == []


# -- auth and completion ---------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("run_id", "token"),
    [(RUN, "wrong-token"), ("no-such-run", TOKEN), (RUN, None)],
    ids=["bad-token", "unknown-run", "no-token"],
)
async def test_unauthenticated(
    engine: LocalEngine,
    dial: Dial,
    caplog: pytest.LogCaptureFixture,
    run_id: str,
    token: str | None,
) -> None:
    caplog.set_level(logging.DEBUG)
    a = dial(engine.grpc_addr, run_id=run_id, token=token)
    if token is not None:
        await a.handshake()
    # Without a token the engine aborts on the metadata alone, before reading.
    # A write racing that abort can make grpc.aio replace the server's status
    # with "INTERNAL: Internal error from Core" (grpc/grpc#36066), so the
    # no-token case writes nothing and reads the engine's status.
    err = await a.error()
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    details = err.details() or ""
    assert TOKEN not in details and "wrong-token" not in details
    assert TOKEN not in caplog.text and "wrong-token" not in caplog.text


@pytest.mark.asyncio
async def test_reject_tokens_for_the_first_handshakes_after_start_and_replace() -> None:
    async with LocalEngine(reject_tokens_for_handshakes=2) as eng:
        eng.register_run(RUN, TOKEN)

        async def dial() -> pb.DownMessage | grpc.StatusCode:
            raw = Raw(eng.grpc_addr)
            try:
                await raw.handshake()
                return await raw.recv()
            except aio.AioRpcError as exc:
                return exc.code()
            finally:
                await raw.close()

        for _ in range(2):  # after start(), then after replace()
            assert await dial() == grpc.StatusCode.UNAUTHENTICATED
            assert await dial() == grpc.StatusCode.UNAUTHENTICATED
            first = await dial()  # the third is answered
            assert isinstance(first, pb.DownMessage), first
            assert first.WhichOneof("body") == "ack" and first.ack.seq == 0
            await eng.replace()


@pytest.mark.asyncio
async def test_completed_run(engine: LocalEngine, dial: Dial) -> None:
    done = {"status": "completed", "findings": 1, "coverage": [], "exit_reason": ""}
    a = await connected(dial, engine)
    await a.data(1)
    await a.data(2, "done", done)
    assert await a.acks_until(2) == [1, 2]
    # A second Done at a new seq is a protocol error.
    await a.data(3, "done", done)
    err = await a.error()
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "second Done" in (err.details() or "")
    assert engine.accepted(RUN) == [1, 2]
    # Any later handshake: "run completed".
    b = dial(engine.grpc_addr)
    await b.handshake()
    err = await b.error()
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == RUN_COMPLETED == "run completed"


@pytest.mark.asyncio
async def test_done_is_acked_at_once_whatever_the_cadence(dial: Dial) -> None:
    async with LocalEngine(ack_every=100, ack_idle_ms=5000) as eng:
        eng.register_run(RUN, TOKEN)
        a = await connected(dial, eng)
        await a.data(1)
        done = {"status": "failed", "findings": 0, "coverage": ["x"], "exit_reason": "boom"}
        await a.data(2, "done", done)
        assert await a.ack(timeout=2.0) == 2
        assert eng.done(RUN) == {"seq": 2, **done}


# -- down messages -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_stop_and_decisions_are_resent_after_every_handshake(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine)
    ask = {"request_id": "q1", "action": "deploy", "details": {}}
    await a.data(1, "approval_request", ask)
    assert await a.ack() == 1
    assert await engine.decide_approval(RUN, "q1", True, "fine")
    msg = await a.recv()
    assert msg.approval_decision == pb.ApprovalDecision(
        request_id="q1", approved=True, reason="fine"
    )
    assert await engine.send_stop(RUN, "operator")
    assert (await a.recv()).stop.reason == "operator"
    await a.close()
    for _ in range(2):
        b = await connected(dial, engine, 1)
        assert (await b.recv()).stop.reason == "operator"
        again = await b.recv()
        assert again.approval_decision.request_id == "q1"
        assert again.approval_decision.approved
        await b.close()


@pytest.mark.asyncio
async def test_repeated_approval_id_gets_the_stored_decision(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine)
    ask = {"request_id": "q7", "action": "scan-prod", "details": {"host": "h"}}
    await a.data(1, "approval_request", ask)
    assert await a.ack() == 1
    assert await engine.decide_approval(RUN, "q7", False, "no prod")
    assert (await a.recv()).approval_decision.reason == "no prod"
    # The same id at a new seq (a restarted harness) and as a duplicate.
    for seq in (2, 1):
        await a.data(seq, "approval_request", ask)
        got = [await a.recv(), await a.recv()]
        decisions = [m for m in got if m.WhichOneof("body") == "approval_decision"]
        assert [d.approval_decision.request_id for d in decisions] == ["q7"]
        assert not decisions[0].approval_decision.approved
    assert engine.accepted(RUN) == [1, 2]


@pytest.mark.asyncio
async def test_budget_update(engine: LocalEngine, dial: Dial) -> None:
    a = await connected(dial, engine)
    assert await engine.send_budget_update(RUN, "half spent", {"spent": 5, "unit": "usd"})
    msg = await a.recv()
    assert msg.budget_update.message == "half spent"
    assert struct_to_dict(msg.budget_update.details) == {"spent": 5.0, "unit": "usd"}
    with pytest.raises(ValueError, match="not registered"):
        await engine.send_budget_update("nope", "x")


# -- streams -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_newer_stream_ends_the_older(engine: LocalEngine, dial: Dial) -> None:
    a = await connected(dial, engine)
    await a.data(1)
    assert await a.ack() == 1
    b = await connected(dial, engine, 1)
    err = await a.error()
    assert err.code() == grpc.StatusCode.ABORTED
    await b.data(2)
    assert await b.ack() == 2
    # Control now goes to the newer stream.
    assert await engine.send_stop(RUN, "deadline")
    assert (await b.recv()).stop.reason == "deadline"


@pytest.mark.asyncio
async def test_end_streams_with_a_status_and_bare(engine: LocalEngine, dial: Dial) -> None:
    a = await connected(dial, engine)
    assert await engine.end_streams(RUN, grpc.StatusCode.INTERNAL)
    assert (await a.error()).code() == grpc.StatusCode.INTERNAL
    b = await connected(dial, engine)
    assert await engine.end_streams(RUN, grpc.StatusCode.OK)
    await b.eof()
    assert await b.call.code() == grpc.StatusCode.OK
    c = await connected(dial, engine)
    assert await engine.end_streams(RUN, None)
    await c.eof()
    assert not await engine.end_streams(RUN, grpc.StatusCode.INTERNAL)  # no live stream


@pytest.mark.asyncio
async def test_half_close_gets_the_pending_ack_then_a_clean_end(dial: Dial) -> None:
    async with LocalEngine(ack_every=50, ack_idle_ms=5000) as eng:
        eng.register_run(RUN, TOKEN)
        a = await connected(dial, eng)
        for seq in (1, 2, 3):
            await a.data(seq)
        await a.call.done_writing()
        assert await a.ack() == 3
        await a.eof()


# -- kill, replace, discovery ------------------------------------------------------------


@pytest.mark.asyncio
async def test_kill_then_replace_on_a_new_port_behind_discovery(
    engine: LocalEngine, dial: Dial
) -> None:
    a = await connected(dial, engine)
    await a.data(1)
    await a.data(2)
    assert await a.acks_until(2) == [1, 2]
    old = engine.grpc_addr
    async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as http:
        assert (await http.get(f"{engine.http_addr}/grpc-address")).text == old
        await engine.kill()
        assert (await a.error()).code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.CANCELLED,
        )
        dead = dial(old)
        await dead.handshake()
        assert (await dead.error()).code() == grpc.StatusCode.UNAVAILABLE
        await engine.replace()
        new = engine.grpc_addr
        assert new != old
        reply = await http.get(f"{engine.http_addr}/grpc-address")
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/plain")
        assert reply.text == new
        assert (await http.get(f"{engine.http_addr}/other")).status_code == 404
    b = await connected(dial, engine, 2)  # the same store: h survived
    await b.data(2)
    await b.data(3)
    assert await b.acks_until(3) == [2, 3]
    assert engine.accepted(RUN) == [1, 2, 3]
    assert engine.duplicates(RUN) == 1


# -- ack cadence -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_ack_every_and_ack_idle(dial: Dial) -> None:
    async with LocalEngine(ack_every=3, ack_idle_ms=300) as eng:
        eng.register_run(RUN, TOKEN)
        a = await connected(dial, eng)
        for seq in (1, 2, 3):
            await a.data(seq)
        assert await a.ack() == 3  # no ack for 1 or 2
        await a.data(4)
        sent = time.monotonic()
        assert await a.ack() == 4  # after ack_idle_ms of quiet
        assert time.monotonic() - sent >= 0.25
        for seq in (5, 6, 7):
            await a.data(seq)
        assert await a.ack() == 7
        await a.nothing_within(0.5)  # nothing unacked: the idle timer stays quiet
        await a.heartbeat()
        assert await a.ack() == 7


@pytest.mark.asyncio
async def test_ack_delay_and_unanswered_control(dial: Dial) -> None:
    async with LocalEngine(ack_delay_ms=400) as eng:
        eng.register_run(RUN, TOKEN)
        a = dial(eng.grpc_addr)
        started = time.monotonic()
        await a.handshake()
        assert await a.ack() == 0
        assert time.monotonic() - started >= 0.35
    async with LocalEngine(ack_handshakes=False, ack_heartbeats=False) as eng:
        eng.register_run(RUN, TOKEN)
        b = dial(eng.grpc_addr)
        await b.handshake()
        await b.heartbeat()
        await b.nothing_within(0.4)
        await b.data(1)
        assert await b.ack() == 1  # data is still acked


# -- two engines, one store ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_two_engines_on_one_store_apply_each_seq_once(tmp_path: Path, dial: Dial) -> None:
    store = tmp_path / "engine.sqlite3"
    n = 150
    async with LocalEngine(store) as one, LocalEngine(store) as two:
        one.register_run(RUN, TOKEN)
        streams = [await connected(dial, one), await connected(dial, two)]

        async def pump(raw: Raw) -> int:
            for seq in range(1, n + 1):
                await raw.data(seq, body={"fields": {"n": seq}})
            await raw.call.done_writing()
            # The handler drains every message before it ends the stream.
            acks: list[int] = []
            while (item := await asyncio.wait_for(raw.inbox.get(), WAIT)) is not None:
                assert isinstance(item, pb.DownMessage), item
                acks.append(item.ack.seq)
            assert acks == sorted(acks)
            return acks[-1]

        assert await asyncio.gather(*(pump(s) for s in streams)) == [n, n]
        assert one.accepted(RUN) == list(range(1, n + 1))
        assert two.duplicates(RUN) == n
        assert [b["body"]["fields"]["n"] for b in two.bodies(RUN)] == [
            float(s) for s in range(1, n + 1)
        ]
    with EngineStore(store) as reader:
        assert reader.accepted(RUN) == list(range(1, n + 1))


# -- transport knobs ------------------------------------------------------------------------


def _self_signed() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.asyncio
async def test_tls_server_credentials(dial: Dial) -> None:
    key_pem, cert_pem = _self_signed()
    creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
    async with LocalEngine(server_credentials=creds) as eng:
        eng.register_run(RUN, TOKEN)
        a = dial(
            eng.grpc_addr,
            credentials=grpc.ssl_channel_credentials(root_certificates=cert_pem),
            options=(("grpc.ssl_target_name_override", "localhost"),),
        )
        await a.handshake()
        assert await a.ack() == 0
        plain = dial(eng.grpc_addr)  # a plaintext client cannot talk to it
        await plain.handshake()
        assert (await plain.error()).code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.asyncio
async def test_strict_ping_policy_sends_goaway_too_many_pings(dial: Dial) -> None:
    async with LocalEngine(ping_policy="strict", ack_heartbeats=False) as eng:
        eng.register_run(RUN, TOKEN)
        a = dial(
            eng.grpc_addr,
            options=(
                ("grpc.keepalive_time_ms", 1000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0),
            ),
        )
        await a.handshake()
        assert await a.ack() == 0
        err = await asyncio.wait_for(a.error(), 20)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        # The GOAWAY's debug text is "too_many_pings"; the call's details say "Too many pings".
        assert "too many pings" in (err.details() or "").lower()


# -- process forms -----------------------------------------------------------------------------


async def _spawn(
    module: str, *args: str, stderr: Path, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    with stderr.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            module,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
        )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line, f"{module} printed nothing; stderr: {stderr.read_text()}"
    return proc, json.loads(line)


@pytest.mark.asyncio
async def test_engine_and_discovery_processes_survive_a_sigkill(tmp_path: Path) -> None:
    store = str(tmp_path / "shared.sqlite3")
    env = child_env(WC_TEST_RUN_TOKEN=TOKEN)
    errs = tmp_path / "stderr.txt"
    procs: list[asyncio.subprocess.Process] = []
    try:
        reg = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "walchannel.testing.engine",
            "register",
            "--store",
            store,
            "--run-id",
            RUN,
            "--token-env",
            "WC_TEST_RUN_TOKEN",
            env=env,
        )
        assert await asyncio.wait_for(reg.wait(), 30) == 0
        disc, disc_line = await _spawn(
            "walchannel.testing.discovery", "--store", store, stderr=errs, env=env
        )
        procs.append(disc)
        assert disc_line["pid"] == disc.pid
        first, first_line = await _spawn(
            "walchannel.testing.engine", "--store", store, stderr=errs, env=env
        )
        procs.append(first)
        assert first_line["pid"] == first.pid

        async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as http:
            url = f"{disc_line['http_addr']}/grpc-address"
            assert (await http.get(url)).text == first_line["grpc_addr"]

            a = Raw(first_line["grpc_addr"])
            try:
                await a.handshake()
                assert await a.ack() == 0
                for seq in (1, 2, 3):
                    await a.data(seq)
                assert await a.acks_until(3) == [1, 2, 3]
                first.send_signal(signal.SIGKILL)
                assert await asyncio.wait_for(first.wait(), WAIT) == -signal.SIGKILL
                assert (await a.error()).code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.INTERNAL,
                )
            finally:
                await a.close()

            second, second_line = await _spawn(
                "walchannel.testing.engine",
                "--store",
                store,
                "--ack-every",
                "1",
                stderr=errs,
                env=env,
            )
            procs.append(second)
            assert second_line["grpc_addr"] != first_line["grpc_addr"]
            assert (await http.get(url)).text == second_line["grpc_addr"]

            b = Raw((await http.get(url)).text)
            try:
                await b.handshake()
                assert await b.ack() == 3  # durable across the SIGKILL
                await b.data(3)
                await b.data(4)
                assert await b.acks_until(4) == [3, 4]
            finally:
                await b.close()

        for proc in (second, disc):  # SIGTERM: a clean exit
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), WAIT) == 0
        with EngineStore(store) as reader:
            assert reader.accepted(RUN) == [1, 2, 3, 4]
            assert reader.duplicates(RUN) == 1
            raw = reader.path.read_bytes() if reader.path else b""
        assert TOKEN.encode() not in raw  # only the sha256 is stored
        assert TOKEN not in errs.read_text()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_register_refuses_a_missing_token_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WC_TEST_UNSET_TOKEN", raising=False)
    store = str(tmp_path / "s.sqlite3")
    assert (
        main(["register", "--store", store, "--run-id", RUN, "--token-env", "WC_TEST_UNSET_TOKEN"])
        == 2
    )
    assert main(["--bogus"]) == 2


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("reject_tokens_for_handshakes", -1),
        ("reject_tokens_for_handshakes", True),
        ("reject_tokens_for_handshakes", "2"),
        ("max_receive_message_bytes", 0),
        ("max_receive_message_bytes", 1.5),
    ],
)
def test_a_bad_count_is_refused_naming_the_setting(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{setting} must be an int >= ") as caught:
        LocalEngine(None, **{setting: value})  # type: ignore[arg-type]
    assert repr(value) in str(caught.value)
