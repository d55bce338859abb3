"""A public call re-entered from a signal handler: it completes, or is refused at once (issue 52).

A harness's signal handler (a ``SIGALRM`` per-item timer, a ``SIGUSR1``
status tick from another process) runs on the main thread between two
bytecodes of whatever the harness was doing — possibly inside a send's
transaction, or inside the channel's own work on the event loop. Real
processes, real signal timers, a real engine: every seq a call returned
reaches the engine, none twice, no gap, no deadlock (SPEC "Signal handlers
and the channel").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import child_env, log_on_connection, new_run
from walchannel import ReentrantCallError
from walchannel.channel.seams import open_channel
from walchannel.log import RunLog
from walchannel.testing.engine import LocalEngine
from walchannel.testing.plugin import local_channel_config

CHILD = str(Path(__file__).parent / "helpers" / "reentry_child.py")
#: How long the child scans under the signals (s), and the bound on the whole run.
SCAN_S = 2.0
BOUND_S = 90.0


async def run_child(
    engine: LocalEngine, tmp_path: Path, mode: str, interval_ms: float, usr1_every_ms: float
) -> dict[str, Any]:
    run_id, token = new_run(engine)
    env = {**os.environ, "HARNESS_TOKEN": token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        CHILD,
        mode,
        str(tmp_path / "wal"),
        run_id,
        engine.grpc_addr,
        str(SCAN_S),
        str(interval_ms),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    sender: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(BOUND_S):
            line = await proc.stdout.readline()
            assert line.strip() == b"ready", line + await proc.stderr.read()
            if usr1_every_ms:

                async def send_usr1() -> None:
                    # Another process's status ticks, as long as the scan runs.
                    loop = asyncio.get_running_loop()
                    end = loop.time() + SCAN_S
                    while loop.time() < end and proc.returncode is None:
                        os.kill(proc.pid, signal.SIGUSR1)
                        await asyncio.sleep(usr1_every_ms / 1000)

                sender = asyncio.create_task(send_usr1())
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"the {mode} harness did not end within {BOUND_S:.0f} s: a deadlock")
    finally:
        if sender is not None:
            sender.cancel()
    assert proc.returncode == 0, err.decode()[-3000:]
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    result["run_id"] = run_id
    result["stderr"] = err.decode()
    return result


def check_delivered(engine: LocalEngine, result: dict[str, Any]) -> None:
    """Every seq a call returned reached the engine; no gap, none twice; all acked."""
    returned: list[int] = result["returned"]
    accepted = engine.accepted(result["run_id"])
    assert result["acked"], result["stderr"][-3000:]
    assert len(returned) == len(set(returned)), "a seq returned twice"
    assert accepted == list(range(1, len(accepted) + 1))
    missing = sorted(set(returned) - set(accepted))
    assert not missing, f"{len(missing)} returned seqs never applied: {missing[:10]}"
    # Nothing went out that no call returned (a refused call logged nothing).
    assert set(accepted) == set(returned)
    assert "Traceback" not in result["stderr"], result["stderr"][-3000:]


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["async", "blocking"])
async def test_a_sigalrm_timer_every_2_ms_sending_beside_the_scan_loses_nothing(
    local_engine: LocalEngine, tmp_path: Path, mode: str
) -> None:
    result = await run_child(local_engine, tmp_path, mode, interval_ms=2.0, usr1_every_ms=0)
    check_delivered(local_engine, result)
    # The handler ran many times, and some of its sends landed.
    assert len(result["returned"]) > 100


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["async", "blocking"])
async def test_sigusr1_from_another_process_sending_beside_the_scan_loses_nothing(
    local_engine: LocalEngine, tmp_path: Path, mode: str
) -> None:
    result = await run_child(local_engine, tmp_path, mode, interval_ms=0, usr1_every_ms=2.0)
    check_delivered(local_engine, result)


# -- the guard itself, deterministic ---------------------------------------------------


class _ReenteringConnection(sqlite3.Connection):
    """A real connection that, once armed, runs ``inside`` before its next statement."""

    inside: Any = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        fn = self.inside
        if fn is not None and self.in_transaction:
            self.inside = None
            fn()
        return super().execute(sql, parameters)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["a send's transaction", "the channel's ack store"])
async def test_a_send_re_entered_inside_a_transaction_of_the_log_is_refused_and_logs_nothing(
    local_engine: LocalEngine, tmp_path: Path, where: str
) -> None:
    run_id, token = new_run(local_engine)
    config = local_channel_config(local_engine, tmp_path / "wal", run_id, token)
    conn, log = log_on_connection(config, _ReenteringConnection)
    async with open_channel(config, log=log) as ch:
        await ch.handshake("1", "reentry", "1")
        seen: list[BaseException] = []

        def handler() -> None:
            try:
                ch.send_event("tick", "info", {"n": 1})
            except ReentrantCallError as exc:
                seen.append(exc)

        if where == "a send's transaction":
            conn.inside = handler
            seqs = ch.send_findings([{"n": 1}, {"n": 2}], progress={"i": 2})
        else:
            seqs = ch.send_findings([{"n": 1}, {"n": 2}], progress={"i": 2})
            conn.inside = handler  # the next transaction is the received ack's store
            assert await ch.wait_acked(timeout_ms=10_000)
            await ch.close()  # (stores the last ack, if the timer did not yet)
        assert len(seen) == 1, where
        text = str(seen[0])
        assert run_id in text and "send_event" in text and "add_signal_handler" in text
        assert ch.log.high_water == len(seqs) if not ch.log.closed else True
        if not ch.log.closed:
            assert await ch.wait_acked(timeout_ms=10_000)
    # The refused event took no seq and reached nobody.
    assert local_engine.accepted(run_id) == seqs


# -- the writer's row read, interrupted at every line ------------------------------------


def _interrupt_every_line(handler: Any) -> Any:
    """A trace that runs ``handler`` before each line of RowSource's row read, as a signal
    handler on the loop's thread may (between any two bytecodes)."""
    names = {"row_bytes", "_read_ahead"}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            handler()
        return local

    def global_(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_name in names and frame.f_code.co_filename.endswith("row_source.py"):
            return local
        return None

    return global_


@pytest.mark.parametrize(
    "interrupt",
    ["replay_unacked clears the read-ahead", "a send renumbers the tail", "both, every line"],
)
def test_the_writer_reads_each_row_right_however_often_a_handler_interrupts_it(
    tmp_path: Path, interrupt: str
) -> None:
    """Every row comes back as committed, in order, none missing (no false "damaged log"),
    whatever a handler does to the tail and the read-ahead between two lines of the read."""
    from walchannel.channel.row_source import RowSource

    rows = 40
    with RunLog.open(tmp_path, "run-interrupted", correlation_id="corr") as log:
        seqs = log.append_many([("finding", {"fields": {"n": n}}) for n in range(1, rows + 1)])
        source = RowSource(log, "run-interrupted", "corr", 4 * 1024 * 1024)
        # The newest rows are in the tail; the older ones are read from disk.
        source.on_commit(seqs[-5:], [("finding", msgpack_body(log, seq)) for seq in seqs[-5:]])
        calls = 0

        def handler() -> None:
            nonlocal calls
            calls += 1
            if interrupt != "a send renumbers the tail":
                source.clear_readahead()
            if interrupt != "replay_unacked clears the read-ahead" and calls % 3 == 0:
                # on_commit of rows not following the tail: it starts again from them.
                source.on_commit([10_000 + calls], [("finding", b"\x80")])

        sys.settrace(_interrupt_every_line(handler))
        try:
            got = [source.row_bytes(seq) for seq in seqs]
        finally:
            sys.settrace(None)
        assert calls > rows  # the handler ran inside every read
        quiet = RowSource(log, "run-interrupted", "corr", 4 * 1024 * 1024)
        assert got == [quiet.row_bytes(seq) for seq in seqs]


def msgpack_body(log: RunLog, seq: int) -> bytes:
    """Row ``seq``'s committed msgpack body, as the tail holds it."""
    from walchannel.log.format import encode_body

    (row,) = log.unacked(after_seq=seq - 1, limit=1)
    return encode_body(row.kind, row.body)


@pytest.mark.asyncio
async def test_a_blocking_send_from_a_handler_inside_another_calls_wait_is_refused(
    tmp_path: Path,
) -> None:
    # A signal handler interrupts the main thread while it waits in a call of the
    # blocking channel. Its send would wait inside that wait: under a fast timer such
    # waits nested until the recursion limit (seen twice under load). It is refused,
    # nothing logged; a read from the handler is answered.
    engine = LocalEngine(ack_delay_ms=300)  # the main thread waits on acks for a while
    await engine.start()
    try:
        run_id, token = new_run(engine)
        config = local_channel_config(engine, tmp_path / "wal", run_id, token)
        code = textwrap.dedent(
            f"""
            import json, signal
            from walchannel import BlockingEngineChannel, GrpcChannelConfig
            from walchannel.errors import ReentrantCallError
            said = {{}}
            with BlockingEngineChannel(GrpcChannelConfig(**{_plain(config)!r})) as ch:
                ch.handshake("1", "nested", "1")
                def handler(signum, frame):
                    said["stats"] = ch.stats().unacked_count
                    try:
                        ch.send_event("tick", "info", {{}})
                    except ReentrantCallError as exc:
                        said["refused"] = str(exc)
                signal.signal(signal.SIGALRM, handler)
                ch.send_finding({{"n": 0}})
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                assert ch.wait_acked(timeout_ms=10_000)
                assert ch.send_finding({{"n": 1}}) == 2  # nothing of the refused send
                # close() does not wait for acks: wait, so the engine has applied it
                assert ch.wait_acked(timeout_ms=10_000)
            print(json.dumps(said))
            """
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=child_env(),
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-3000:]
        said = json.loads(out.decode().strip().splitlines()[-1])
        assert said["stats"] == 1  # the read answered
        assert "while this thread waits in another one" in said["refused"]
        assert engine.accepted(run_id) == [1, 2]
    finally:
        await engine.stop()


def _plain(config: Any) -> dict[str, Any]:
    return {
        "grpc_addr": config.grpc_addr,
        "run_id": config.run_id,
        "correlation_id": config.correlation_id,
        "run_token": config.run_token,
        "wal_dir": str(config.wal_dir),
        "connect_timeout_ms": 5_000,
    }
