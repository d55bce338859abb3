"""BlockingEngineChannel from plain threads against a real LocalEngine."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from conftest import new_run
from helpers.engine_thread import EngineThread
from walchannel import (
    BlockingEngineChannel,
    ChannelClosedError,
    RunCompletedError,
    RunningLoopError,
    SyncEngineChannel,
    WalchannelError,
)
from walchannel.log import RunLog
from walchannel.testing import LocalEngine
from walchannel.testing.plugin import local_channel_config


@pytest.fixture
def engine() -> Iterator[EngineThread]:
    e = EngineThread()
    yield e
    e.close()


def blocking(e: EngineThread, tmp_path: Path, **kw: Any) -> tuple[BlockingEngineChannel, str]:
    run_id = f"run-{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(16)
    e.engine.register_run(run_id, token)
    return BlockingEngineChannel(
        local_channel_config(e.engine, tmp_path / "wal", run_id, token, **kw)
    ), run_id


def test_round_trip_without_asyncio(engine: EngineThread, tmp_path: Path) -> None:
    ch, run_id = blocking(engine, tmp_path)
    with ch:
        assert isinstance(ch, SyncEngineChannel)
        ch.handshake("1", "blocking", "1")
        assert ch.send_event("started", "info", {"k": 1}) == 1
        assert ch.send_findings([{"n": 1}, {"n": 2}], progress={"next": 2}) == [2, 3]
        assert ch.wait_acked(timeout_ms=5000)
        assert ch.last_acked_seq == 3 and ch.unacked_count == 0
        assert ch.progress() == {"next": 2}
        assert ch.stats().acked == 3
        assert ch.send_done("completed", 2, ["x"], "")
    assert engine.engine.accepted(run_id) == [1, 2, 3, 4]
    with pytest.raises(ChannelClosedError):
        ch.send_finding({"n": 3})
    ch.close()  # idempotent


def test_sends_from_many_threads_get_unique_seqs_all_delivered(
    engine: EngineThread, tmp_path: Path
) -> None:
    ch, run_id = blocking(engine, tmp_path)
    with ch:
        ch.handshake("1", "blocking", "1")

        def send(worker: int) -> list[int]:
            return [ch.send_finding({"w": worker, "i": i}) for i in range(50)]

        with ThreadPoolExecutor(8) as pool:
            seqs = [s for chunk in pool.map(send, range(8)) for s in chunk]
        assert sorted(seqs) == list(range(1, 401))
        assert ch.wait_acked(timeout_ms=10_000)
        # Every call forgot itself once it ended (none kept for close() to fail).
        assert not ch._calls
    assert engine.engine.accepted(run_id) == list(range(1, 401))


def test_callbacks_run_on_their_own_thread_and_may_call_the_channel(
    engine: EngineThread, tmp_path: Path
) -> None:
    ch, run_id = blocking(engine, tmp_path)
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def broken(reason: str) -> None:
        raise RuntimeError("callback bug")

    def on_stop(reason: str) -> None:
        seen.append((reason, threading.current_thread().name))
        seen.append(("seq", str(ch.send_event("stopping", "info", {"reason": reason}))))
        done.set()

    with ch:
        ch.on_stop(broken)
        ch.on_stop(on_stop)
        budgets: list[str] = []
        budget_seen = threading.Event()

        def on_budget(message: str, detail: object) -> None:
            budgets.append(message)
            budget_seen.set()

        ch.on_budget_update(on_budget)
        ch.handshake("1", "blocking", "1")
        engine.run(engine.engine.send_stop(run_id, "deadline"))
        engine.run(engine.engine.send_budget_update(run_id, "half", {"used": 0.5}))
        assert done.wait(10)
        # close() drops callbacks still queued (documented): wait for this one first.
        assert budget_seen.wait(10)
        assert seen[0][0] == "deadline" and "callbacks" in seen[0][1]
        assert seen[1] == ("seq", "1")
        assert ch.wait_acked(timeout_ms=5000)
    assert engine.engine.bodies(run_id)[0]["body"]["type"] == "stopping"
    assert budgets == ["half"]


def test_close_joins_its_threads(engine: EngineThread, tmp_path: Path) -> None:
    before = set(threading.enumerate())
    ch, _ = blocking(engine, tmp_path)
    ch.handshake("1", "blocking", "1")
    assert len(set(threading.enumerate()) - before) >= 2
    ch.close()
    leftover = [t for t in set(threading.enumerate()) - before if t.name.startswith("walchannel")]
    assert leftover == []


def test_constructor_errors_surface(engine: EngineThread, tmp_path: Path) -> None:
    ch, run_id = blocking(engine, tmp_path)
    token_config = ch.config
    with ch:
        ch.handshake("1", "blocking", "1")
        assert ch.send_done("completed", 0, [], "")
    with pytest.raises(RunCompletedError):
        BlockingEngineChannel(token_config)
    assert not [t for t in threading.enumerate() if t.name == f"walchannel-loop-{run_id}"]


def close_during_sends(engine: EngineThread, folder: Path, *, handshake: bool) -> list[str]:
    """Eight senders, an approval and a wait_acked in flight; close() 20 ms in.

    Returns the names of the threads still blocked 30 s later.
    """
    ch, run_id = blocking(engine, folder)
    if handshake:
        ch.handshake("1", "blocking", "1")
    seqs: list[list[int]] = [[] for _ in range(8)]
    ends: list[object] = [None] * 10
    going = threading.Barrier(11)

    def sender(i: int) -> None:
        going.wait()
        while True:
            try:
                seqs[i].append(ch.send_finding({"i": i}))
            except ChannelClosedError:
                ends[i] = "closed"
                return
            except BaseException as exc:
                ends[i] = exc
                return

    def approver() -> None:
        going.wait()
        try:
            ch.request_approval("deploy", {}, timeout_ms=60_000)
        except ChannelClosedError:
            ends[8] = "closed"
        except BaseException as exc:
            ends[8] = exc

    def waiter() -> None:
        going.wait()
        try:
            ends[9] = ch.wait_acked(10**9)
        except ChannelClosedError:
            ends[9] = "closed"
        except BaseException as exc:
            ends[9] = exc

    threads = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(8)]
    threads += [threading.Thread(target=approver, daemon=True)]
    threads += [threading.Thread(target=waiter, daemon=True)]
    for t in threads:
        t.start()
    going.wait()
    time.sleep(0.02)  # the issue's scenario: close 20 ms into the sends, not a sync
    closer = threading.Thread(target=ch.close, daemon=True)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() hung"
    for t in threads:
        t.join(30)
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        return hung
    assert ends[:9] == ["closed"] * 9, ends
    assert ends[9] in (False, "closed"), ends[9]
    # Every seq handed out is committed, once, with no gap.
    given = sorted(s for chunk in seqs for s in chunk)
    with RunLog.open(folder / "wal", run_id, correlation_id=f"corr-{run_id}") as wal:
        acked, high = wal.last_acked_seq, wal.high_water
        logged = [row.seq for row in wal.unacked(after_seq=acked)]
    assert len(set(given)) == len(given)
    assert set(given) <= set(range(1, high + 1))
    assert high - len(given) in (0, 1)  # (1: the approval request's row)
    assert logged == list(range(acked + 1, high + 1))
    return []


def test_close_while_eight_threads_send_leaves_no_caller_blocked(
    engine: EngineThread, tmp_path: Path
) -> None:
    # Issue 13 item 5: calls queued on the loop when close() stopped it used to
    # block their callers for good. Every caller gets its seq or ChannelClosedError.
    for round_ in range(40):
        hung = close_during_sends(engine, tmp_path / f"round-{round_}", handshake=bool(round_ % 2))
        assert hung == [], f"round {round_}: blocked for good: {hung}"


_ROUNDS_HARNESS = """
import os, sys
from pathlib import Path
from walchannel import BlockingEngineChannel, GrpcChannelConfig, Backoff

config = GrpcChannelConfig(
    grpc_addr=os.environ["GRPC_ADDR"], wal_dir=os.environ["WAL"], run_id=os.environ["RUN_ID"],
    correlation_id="corr", run_token=os.environ["RUN_TOKEN"],
    backoff=Backoff(initial_ms=50, multiplier=2, max_ms=500, jitter_ms=50),
)
with BlockingEngineChannel(config) as channel:
    channel.handshake("1.0", "rounds", "1")
    for n in range(int(os.environ["ROUNDS"])):
        channel.send_finding({"round": n})
        assert channel.wait_acked(timeout_ms=60_000)
        print("acked", n, flush=True)
        go = Path(os.environ["GO"] + str(n))
        while not go.exists():
            channel.wait_acked(timeout_ms=20)
    assert channel.send_done("completed", int(os.environ["ROUNDS"]), ["."], "")
"""


def test_engine_restarts_leave_no_grpc_core_line_on_stderr(tmp_path: Path) -> None:
    # An engine that stops cancels its calls with an INTERNAL_ERROR GOAWAY
    # unless it gives them a grace; gRPC's C-core then prints "Got goaway"
    # on the harness's stderr whatever the harness's logging says. The
    # local engine stops gracefully; walchannel leaves GRPC_VERBOSITY alone.
    import subprocess

    from conftest import PYTHON, child_env

    rounds = 8
    store = tmp_path / "store.sqlite3"
    script = tmp_path / "rounds.py"
    script.write_text(_ROUNDS_HARNESS)
    engine = EngineThread(store_path=store)
    run_id, token = f"run-{secrets.token_hex(4)}", "tok-" + secrets.token_urlsafe(18)
    engine.engine.register_run(run_id, token)
    port = int(engine.engine.grpc_addr.rsplit(":", 1)[1])
    env = child_env(
        GRPC_ADDR=engine.engine.grpc_addr,
        WAL=str(tmp_path / "wal"),
        RUN_ID=run_id,
        RUN_TOKEN=token,
        ROUNDS=str(rounds),
        GO=str(tmp_path / "go-"),
    )
    env.pop("GRPC_VERBOSITY", None)
    proc = subprocess.Popen(
        [PYTHON, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        for n in range(rounds):
            assert proc.stdout.readline() == f"acked {n}\n"
            if n < rounds - 1:  # the engine is replaced on the same port and store
                engine.close()
                engine = EngineThread(store_path=store, grpc_port=port)
            (tmp_path / f"go-{n}").touch()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "chttp2" not in err and "goaway" not in err.lower(), err[-3000:]
        assert engine.engine.accepted(run_id) == list(range(1, rounds + 2))
    finally:
        if proc.poll() is None:
            proc.kill()
        engine.close()


# -- a blocking call on a thread that runs an event loop (issue "The operator's day", 4) --------


@pytest.mark.asyncio
async def test_waits_on_the_engine_from_an_event_loop_raise_at_once(tmp_path: Path) -> None:
    # An engine served by this very loop: a blocking wait here would freeze
    # the loop, so the engine could never answer (a deadlock until the timeout).
    async with LocalEngine() as engine:
        run_id, token = new_run(engine, "inloop")
        config = local_channel_config(
            engine, tmp_path / "wal", run_id, token, connect_timeout_ms=10_000
        )
        ch = BlockingEngineChannel(config)  # opens the log only: no wait on the engine
        try:
            for name, call in (
                ("handshake", lambda: ch.handshake("1", "inloop", "1")),
                ("wait_acked", lambda: ch.wait_acked(timeout_ms=10_000)),
                ("send_done", lambda: ch.send_done("completed", 0, [], "")),
                ("request_approval", lambda: ch.request_approval("x", {}, timeout_ms=10_000)),
            ):
                started = time.monotonic()
                with pytest.raises(RuntimeError) as info:
                    call()
                assert time.monotonic() - started < 2.0, name  # at once, not after a timeout
                error = info.value
                assert isinstance(error, RunningLoopError), repr(error)
                assert isinstance(error, WalchannelError)
                text = str(error)
                assert f"BlockingEngineChannel.{name}()" in text, text
                assert "event loop" in text and "GrpcEngineChannel" in text, text
                assert run_id in text and token not in text, text
            # Nothing was logged or sent by the refused calls.
            assert engine.accepted(run_id) == []
            # A commit never waits on the engine: allowed on the loop's thread.
            assert ch.send_finding({"n": 1}) == 1
            # The same waits from a thread without a loop work as ever.
            await asyncio.to_thread(ch.handshake, "1", "inloop", "1")
            assert await asyncio.to_thread(ch.wait_acked, None, 10_000)
            assert await asyncio.to_thread(ch.send_done, "completed", 1, [], "")
            assert engine.accepted(run_id) == [1, 2]
        finally:
            ch.close()  # bounded by close_timeout_ms, also on the loop's thread
        assert not [t for t in threading.enumerate() if t.name == f"walchannel-loop-{run_id}"]
